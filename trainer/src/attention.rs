//! Fused causal attention with left padding, grouped-query heads and a KV cache, and its own backward pass
//! (flash-attention style: no [t × s] matrix of scores or probabilities survives the forward pass).
//!
//! For a query row i of sequence r (absolute position offset + i) the visible keys are
//! lo = left_pad[r] ≤ j ≤ offset + i; with scale = 1/√d,
//!
//! * S_ij = scale · q_i·k_j, P_ij = exp(S_ij − lse_i) with lse_i = log Σ_j exp S_ij (the visible j only),
//! * O_i = Σ_j P_ij v_j.
//!
//! A row that sees no key (a padding position, offset + i < lo) has O_i = 0 and gets zero gradients.
//! Query head h reads key/value head h / (heads / kv_heads) directly (no repeat_kv copy).
//!
//! The backward pass is the standard flash-attention one. With dO the gradient of O and D_i = dO_i·O_i:
//!
//! * dV_j = Σ_i P_ij dO_i,
//! * dP_ij = dO_i·v_j and dS_ij = P_ij (dP_ij − D_i) (the softmax's Jacobian, since Σ_j P_ij dP_ij = D_i),
//! * dQ_i = scale Σ_j dS_ij k_j and dK_j = scale Σ_i dS_ij q_i;
//!
//! for grouped-query attention the dK and dV of a key/value head sum over the query heads that read it.
//!
//! What the backward pass keeps: nothing besides what candle's graph already holds, the (contiguous)
//! inputs q, k, v and the result O. The backward recomputes each row's scores, and from them the row's max
//! and sum (its lse) and P, block of rows by block of rows; the only buffers are per-thread scratch rows
//! (36 rows × the visible keys, plus kᵀ and vᵀ of one key/value head), never a [t × s] matrix per head.
//!
//! Both passes are candle [`CustomOp3`]s on (q, k, v) — the backward one computes ∂q, ∂k and ∂v in one
//! pass and is applied without a graph of its own — with CPU kernels only: on any other device (CUDA)
//! [`causal_attention`] is [`naive_causal_attention`], candle's own kernels, and the ops' `cuda_fwd` stays
//! candle's default (an error, "no cuda implementation for causal-attention"), never reached. The CPU kernels are f32, register-blocked (6 rows × 16 columns of accumulators,
//! the inner loops over d or over keys contiguous), compiled twice, for AVX2+FMA when the processor has
//! them (detected at run time) and for the baseline target. The forward pass parallelises over
//! (sequence, key/value head) groups, each of which loops over its query heads; the backward pass too,
//! so that each group owns its slice of ∂k and ∂v (no shared accumulation). The tasks run on rayon's pool,
//! the one candle's matrix products use.
//!
//! The forward pass has two paths. From [`SMALL_T`] query rows per head on (prefill, training), a transposed
//! copy kᵀ of the key/value head, so that the scores of 6 rows × 16 keys accumulate in registers without
//! horizontal sums, then P·v by 6 × 16 tiles. Below it (decoding: t = 1 after a long cache) the query heads
//! that share a key/value head go together: their dot products with each key row in turn (the keys are
//! read once, in order), then P·v one row at a time, 64 columns wide (v's rows read whole, in order).

use candle_core::{bail, CpuStorage, CustomOp3, DType, Layout, Shape, Storage, Tensor};
use rayon::prelude::*;

/// Below this many query rows per head the forward pass computes the scores as dot products with the key
/// rows; from it on, with a transposed copy of the keys (its cost, s·d per key/value head, is then small).
pub const SMALL_T: usize = 8;

/// Rows per register tile of the matrix products (query rows, or keys in the ∂k, ∂v accumulation): 6 rows
/// × 16 columns of accumulators are 12 of the 16 AVX2 registers.
const MR: usize = 6;

/// The depth of one packed panel of the matrix products' left operand.
const KC: usize = 256;

/// Query rows per block of the backward pass: each block's probabilities and ∂S (BLOCK_ROWS × keys) are
/// kept in scratch while its contributions to ∂k and ∂v are accumulated.
const BLOCK_ROWS: usize = 36;

/// `softmax(q·kᵀ/√d + mask)·v` per head, causal with left padding.
///
/// q: [b, heads, t, d]; k, v: [b, kv_heads, s, d] with s = offset + t (the keys of a KV cache, then the
/// new ones); heads a multiple of kv_heads (query head h reads kv head h / (heads / kv_heads): GQA, no
/// repeat_kv copy). Query i of row r (absolute position offset + i) sees key j iff j ≤ offset + i and
/// j ≥ left_pad[r]. A query that sees no key (a padding position) outputs zeros and gets zero gradients.
/// Returns [b, heads, t, d] (f32, contiguous), differentiable in q, k and v (the backward pass recomputes
/// the probabilities, see the module documentation).
///
/// The inputs may be non-contiguous (they are made contiguous first). Errors: a dtype other than f32,
/// inputs of another rank or on different devices, mismatched b or d, heads not a multiple of kv_heads,
/// s ≠ offset + t, left_pad.len() ≠ b or a left_pad beyond s. The fused kernel runs on the CPU; on any
/// other device (CUDA) this is [`naive_causal_attention`], candle's own kernels.
pub fn causal_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    left_pad: &[usize],
    offset: usize,
) -> candle_core::Result<Tensor> {
    for (name, x) in [("q", q), ("k", k), ("v", v)] {
        if x.dtype() != DType::F32 {
            bail!("causal_attention: {name} must be f32, got {:?}", x.dtype())
        }
        if !x.device().same_device(q.device()) {
            bail!(
                "causal_attention: q, k and v must be on one device (q is on {:?}, {name} on {:?})",
                q.device().location(),
                x.device().location()
            )
        }
    }
    Dims::check(q.dims(), k.dims(), v.dims(), left_pad, offset)?;
    if !q.device().is_cpu() {
        return naive_causal_attention(q, k, v, left_pad, offset);
    }
    let op = CausalAttention {
        left_pad: left_pad.to_vec(),
        offset,
    };
    // Without gradients, keys and values may be the first positions of a longer buffer (a KV cache
    // with room to grow, `model::KvCache`): read where they are, each head's positions contiguous. (The
    // backward pass takes contiguous ones.)
    let tracked = q.track_op() || k.track_op() || v.track_op();
    let keys = |x: &Tensor| -> candle_core::Result<Tensor> {
        if !tracked && head_stride(x.layout()).is_some() {
            Ok(x.clone())
        } else {
            x.contiguous()
        }
    };
    q.contiguous()?.apply_op3(&keys(k)?, &keys(v)?, op)
}

/// For k or v `[b, kv_heads, s, d]` laid out as the first `s` positions of a contiguous `[b, kv_heads,
/// capacity, d]` buffer (contiguous itself when capacity = s): the elements from one head's first
/// position to the next head's (capacity · d). `None` for any other layout.
fn head_stride(layout: &Layout) -> Option<usize> {
    let (&[b, h, s, d], &[sb, sh, ss, sd]) = (layout.dims(), layout.stride()) else {
        return None;
    };
    let plain = sd == 1 && ss == d && sh >= s * d && sb == h * sh;
    // A dimension of size 1 may carry any stride (candle gives it one that is never used).
    (plain || (b * h <= 1 && sd == 1 && ss == d)).then_some(if b * h <= 1 { s * d } else { sh })
}

/// The f32 data of k or v: `(values, head stride)`, the values running from the first head's first
/// position to the last head's last one ([`head_stride`] apart).
fn cpu_heads<'a>(
    what: &str,
    storage: &'a CpuStorage,
    layout: &Layout,
) -> candle_core::Result<(&'a [f32], usize)> {
    let CpuStorage::F32(data) = storage else {
        bail!("causal-attention: {what} must be f32")
    };
    let Some(stride) = head_stride(layout) else {
        bail!("causal-attention: {what} must be contiguous or the first positions of a KV cache")
    };
    let &[b, h, s, d] = layout.dims() else {
        bail!("causal-attention: {what} must have 4 dimensions")
    };
    let start = layout.start_offset();
    let len = if b * h == 0 {
        0
    } else {
        (b * h - 1) * stride + s * d
    };
    match data.get(start..start + len) {
        Some(values) => Ok((values, stride)),
        None => bail!("causal-attention: {what} reaches past its storage"),
    }
}

/// The reference for [`causal_attention`] in plain (differentiable) candle ops: the kv heads repeated, the
/// full [t × s] scores plus an additive mask (−1e9 where a key is not visible), a softmax, times v, and the
/// rows that see no key set to zero (a 0/1 factor, so that their gradients are zero too). Same inputs,
/// result and shape errors; any float dtype.
pub fn naive_causal_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    left_pad: &[usize],
    offset: usize,
) -> candle_core::Result<Tensor> {
    let dims = Dims::check(q.dims(), k.dims(), v.dims(), left_pad, offset)?;
    let Dims {
        b,
        heads,
        kv_heads,
        t,
        s,
        d,
        ..
    } = dims;
    let rep = heads / kv_heads;
    let repeat = |x: &Tensor| -> candle_core::Result<Tensor> {
        x.unsqueeze(2)?
            .broadcast_as((b, kv_heads, rep, s, d))?
            .reshape((b, heads, s, d))
    };
    let (k, v) = (repeat(k)?, repeat(v)?);
    let mut mask = vec![0f32; b * t * s];
    let mut seen = vec![0f32; b * t];
    for (r, &lo) in left_pad.iter().enumerate() {
        for i in 0..t {
            for j in 0..s {
                if j < lo || j > offset + i {
                    mask[(r * t + i) * s + j] = -1e9;
                } else {
                    seen[r * t + i] = 1.0;
                }
            }
        }
    }
    let device = q.device();
    let mask = Tensor::from_vec(mask, (b, 1, t, s), device)?.to_dtype(q.dtype())?;
    let seen = Tensor::from_vec(seen, (b, 1, t, 1), device)?.to_dtype(q.dtype())?;
    let scores = (q.contiguous()?.matmul(&k.t()?)? / (d as f64).sqrt())?.broadcast_add(&mask)?;
    let max = scores.max_keepdim(3)?.detach();
    let e = scores.broadcast_sub(&max)?.exp()?;
    let p = e.broadcast_div(&e.sum_keepdim(3)?)?;
    p.matmul(&v)?.broadcast_mul(&seen)
}

/// The sizes of one attention call.
#[derive(Clone, Copy, Debug)]
struct Dims {
    b: usize,
    heads: usize,
    kv_heads: usize,
    t: usize,
    s: usize,
    d: usize,
    offset: usize,
}

impl Dims {
    /// The shape rules of [`causal_attention`] (q [b, heads, t, d], k and v [b, kv_heads, offset + t, d],
    /// heads a positive multiple of kv_heads, d ≥ 1, one left_pad ≤ s per row).
    fn check(
        q: &[usize],
        k: &[usize],
        v: &[usize],
        left_pad: &[usize],
        offset: usize,
    ) -> candle_core::Result<Dims> {
        let &[b, heads, t, d] = q else {
            bail!("causal_attention: q must be [batch, heads, t, head dim], got shape {q:?}")
        };
        let &[kb, kv_heads, s, kd] = k else {
            bail!("causal_attention: k must be [batch, kv heads, s, head dim], got shape {k:?}")
        };
        if v != k {
            bail!("causal_attention: v has shape {v:?} but k has {k:?}: they must be the same")
        }
        if kb != b {
            bail!("causal_attention: q has a batch of {b} but k and v have {kb}")
        }
        if kd != d {
            bail!("causal_attention: q has a head dim of {d} but k and v have {kd}")
        }
        if d == 0 {
            bail!("causal_attention: the head dim is 0")
        }
        if kv_heads == 0 || heads % kv_heads != 0 {
            bail!(
                "causal_attention: {heads} query heads are not a positive multiple of {kv_heads} kv heads"
            )
        }
        if s != offset + t {
            bail!(
                "causal_attention: k and v have {s} positions but offset + t = {offset} + {t} = {} \
                 (the cached keys, then one per query)",
                offset + t
            )
        }
        if left_pad.len() != b {
            bail!(
                "causal_attention: {} left_pad entries for a batch of {b}",
                left_pad.len()
            )
        }
        if let Some((r, &pad)) = left_pad.iter().enumerate().find(|(_, &pad)| pad > s) {
            bail!("causal_attention: left_pad[{r}] = {pad} is beyond the {s} key positions")
        }
        Ok(Dims {
            b,
            heads,
            kv_heads,
            t,
            s,
            d,
            offset,
        })
    }

    fn group(&self) -> usize {
        self.heads / self.kv_heads
    }

    fn scale(&self) -> f32 {
        1.0 / (self.d as f32).sqrt()
    }
}

/// The f32 data of a contiguous CPU tensor argument.
fn cpu_f32<'a>(
    what: &str,
    storage: &'a CpuStorage,
    layout: &Layout,
) -> candle_core::Result<&'a [f32]> {
    crate::fused::cpu_f32(&format!("causal-attention: {what}"), storage, layout)
}

/// The forward op (its backward is [`CausalAttentionBackward`]).
struct CausalAttention {
    left_pad: Vec<usize>,
    offset: usize,
}

impl CustomOp3 for CausalAttention {
    fn name(&self) -> &'static str {
        "causal-attention"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let dims = Dims::check(l1.dims(), l2.dims(), l3.dims(), &self.left_pad, self.offset)?;
        let q = cpu_f32("q", s1, l1)?;
        let (k, k_stride) = cpu_heads("k", s2, l2)?;
        let (v, v_stride) = cpu_heads("v", s3, l3)?;
        let mut out = vec![0f32; q.len()];
        forward(
            &dims,
            &self.left_pad,
            q,
            [k, v],
            [k_stride, v_stride],
            &mut out,
        );
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let op = CausalAttentionBackward {
            out: res.detach(),
            grad: grad_res.detach().contiguous()?,
            left_pad: self.left_pad.clone(),
            offset: self.offset,
        };
        let flat = q.detach().apply_op3_no_bwd(&k.detach(), &v.detach(), &op)?;
        let (nq, nk) = (q.elem_count(), k.elem_count());
        let dq = flat.narrow(0, 0, nq)?.reshape(q.shape())?;
        let dk = flat.narrow(0, nq, nk)?.reshape(k.shape())?;
        let dv = flat.narrow(0, nq + nk, nk)?.reshape(v.shape())?;
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}

/// The backward op of [`CausalAttention`], on (q, k, v) with the forward's result O and its gradient dO:
/// ∂q, ∂k and ∂v flattened one after the other into one [q.len + 2·k.len] tensor.
struct CausalAttentionBackward {
    /// The forward's result, [b, heads, t, d] contiguous.
    out: Tensor,
    /// The gradient of the result, [b, heads, t, d] contiguous.
    grad: Tensor,
    left_pad: Vec<usize>,
    offset: usize,
}

impl CustomOp3 for CausalAttentionBackward {
    fn name(&self) -> &'static str {
        "causal-attention-backward"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let dims = Dims::check(l1.dims(), l2.dims(), l3.dims(), &self.left_pad, self.offset)?;
        let q = cpu_f32("q", s1, l1)?;
        let k = cpu_f32("k", s2, l2)?;
        let v = cpu_f32("v", s3, l3)?;
        for (name, x) in [("result", &self.out), ("its gradient", &self.grad)] {
            if x.dims() != l1.dims() {
                bail!(
                    "causal-attention-backward: the {name} has shape {:?}, q has {:?}",
                    x.dims(),
                    l1.dims()
                )
            }
        }
        let (out_storage, out_layout) = self.out.storage_and_layout();
        let (grad_storage, grad_layout) = self.grad.storage_and_layout();
        let (Storage::Cpu(out_storage), Storage::Cpu(grad_storage)) =
            (&*out_storage, &*grad_storage)
        else {
            bail!("causal-attention-backward: the result and its gradient must be on the CPU")
        };
        let o = cpu_f32("the result", out_storage, out_layout)?;
        let grad = cpu_f32("its gradient", grad_storage, grad_layout)?;
        let mut flat = vec![0f32; q.len() + 2 * k.len()];
        let (dq, dkv) = flat.split_at_mut(q.len());
        let (dk, dv) = dkv.split_at_mut(k.len());
        backward(&dims, &self.left_pad, [q, k, v, o, grad], [dq, dk, dv]);
        let len = flat.len();
        Ok((CpuStorage::F32(flat), Shape::from(len)))
    }
}

/// The geometry of one (sequence, key/value head) group: its `g` query heads, `t` rows each, against `s`
/// keys of dimension `d`, the first `lo` of which are padding.
#[derive(Clone, Copy)]
struct Geometry {
    g: usize,
    t: usize,
    s: usize,
    d: usize,
    offset: usize,
    lo: usize,
    scale: f32,
}

impl Geometry {
    fn new(dims: &Dims, lo: usize) -> Geometry {
        Geometry {
            g: dims.group(),
            t: dims.t,
            s: dims.s,
            d: dims.d,
            offset: dims.offset,
            lo,
            scale: dims.scale(),
        }
    }

    /// The first query row that sees a key (t when none does).
    fn first_row(&self) -> usize {
        self.lo.saturating_sub(self.offset).min(self.t)
    }

    /// How many keys, from lo on, query row i sees (i ≥ first_row).
    fn visible(&self, i: usize) -> usize {
        self.offset + i + 1 - self.lo
    }
}

/// Per-thread scratch buffers, grown as needed and reused from task to task.
#[derive(Default)]
struct Scratch {
    /// The packed left operand of [`ab`] (KC × MR).
    panel: Vec<f32>,
    kt: Vec<f32>,
    vt: Vec<f32>,
    p: Vec<f32>,
    ds: Vec<f32>,
}

/// `buffer` with at least `len` elements (its contents are left as they are).
fn grown(buffer: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buffer.len() < len {
        buffer.resize(len, 0.0);
    }
    &mut buffer[..len]
}

/// The forward pass into `out` (zeros on entry), one task per (sequence, key/value head).
/// `kv = [k, v]` hold each key/value head's `s` positions at `strides` elements from the previous
/// head's (`s · d` when contiguous; more when they are the first positions of a KV cache's buffer).
fn forward(
    dims: &Dims,
    left_pad: &[usize],
    q: &[f32],
    kv: [&[f32]; 2],
    strides: [usize; 2],
    out: &mut [f32],
) {
    let (g, t, s, d) = (dims.group(), dims.t, dims.s, dims.d);
    if out.is_empty() || s == 0 {
        return;
    }
    let (q_group, kv_len) = (g * t * d, s * d);
    let [k, v] = kv;
    let tasks: Vec<_> = out
        .chunks_mut(q_group)
        .zip(q.chunks(q_group))
        .enumerate()
        .map(|(n, (o, q))| {
            let [ks, vs] = strides;
            (n, (o, q, &k[n * ks..][..kv_len], &v[n * vs..][..kv_len]))
        })
        .collect();
    let fast = fma_available();
    parallel(tasks, |(n, (o, q, k, v)), scratch| {
        let geo = Geometry::new(dims, left_pad[n / dims.kv_heads]);
        forward_group_dispatch(fast, &geo, [q, k, v], o, scratch);
    });
}

/// The backward pass: `inputs` = [q, k, v, o, dO], `grads` = [dq, dk, dv] (zeros on entry), one task per
/// (sequence, key/value head), which owns its slices of all three gradients.
fn backward(dims: &Dims, left_pad: &[usize], inputs: [&[f32]; 5], grads: [&mut [f32]; 3]) {
    let (g, t, s, d) = (dims.group(), dims.t, dims.s, dims.d);
    if inputs[0].is_empty() || s == 0 {
        return;
    }
    let (q_group, kv_len) = (g * t * d, s * d);
    let [q, k, v, o, grad] = inputs;
    let [dq, dk, dv] = grads;
    let tasks: Vec<_> = q
        .chunks(q_group)
        .zip(o.chunks(q_group).zip(grad.chunks(q_group)))
        .zip(k.chunks(kv_len).zip(v.chunks(kv_len)))
        .zip(
            dq.chunks_mut(q_group)
                .zip(dk.chunks_mut(kv_len).zip(dv.chunks_mut(kv_len))),
        )
        .enumerate()
        .collect();
    let fast = fma_available();
    parallel(
        tasks,
        |(n, (((q, (o, grad)), (k, v)), (dq, (dk, dv)))), scratch| {
            let geo = Geometry::new(dims, left_pad[n / dims.kv_heads]);
            backward_group_dispatch(fast, &geo, [q, k, v, o, grad], [dq, dk, dv], scratch);
        },
    );
}

/// Runs `work` on every task on rayon's pool (the one candle's matrix products use), with scratch buffers
/// per split of the tasks (rayon splits them adaptively, into about as many parts as it has threads
/// unless some steal work, so that the buffers are reused from task to task).
fn parallel<T: Send>(tasks: Vec<T>, work: impl Fn(T, &mut Scratch) + Sync + Send) {
    tasks
        .into_par_iter()
        .for_each_init(Scratch::default, |scratch, task| work(task, scratch));
}

/// Whether the AVX2+FMA versions of the kernels can run here.
fn fma_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the baseline target fuses multiply-adds in hardware (`f32::mul_add` is one instruction).
const BASELINE_FMA: bool = cfg!(any(target_feature = "fma", target_arch = "aarch64"));

fn forward_group_dispatch(
    fast: bool,
    geo: &Geometry,
    inputs: [&[f32]; 3],
    out: &mut [f32],
    scratch: &mut Scratch,
) {
    #[cfg(target_arch = "x86_64")]
    if fast {
        // SAFETY: `fast` is `fma_available()`: this processor has AVX2 and FMA.
        return unsafe { forward_group_avx2(geo, inputs, out, scratch) };
    }
    let _ = fast;
    forward_group::<BASELINE_FMA>(geo, inputs, out, scratch)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn forward_group_avx2(geo: &Geometry, inputs: [&[f32]; 3], out: &mut [f32], scratch: &mut Scratch) {
    forward_group::<true>(geo, inputs, out, scratch)
}

fn backward_group_dispatch(
    fast: bool,
    geo: &Geometry,
    inputs: [&[f32]; 5],
    grads: [&mut [f32]; 3],
    scratch: &mut Scratch,
) {
    #[cfg(target_arch = "x86_64")]
    if fast {
        // SAFETY: `fast` is `fma_available()`: this processor has AVX2 and FMA.
        return unsafe { backward_group_avx2(geo, inputs, grads, scratch) };
    }
    let _ = fast;
    backward_group::<BASELINE_FMA>(geo, inputs, grads, scratch)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn backward_group_avx2(
    geo: &Geometry,
    inputs: [&[f32]; 5],
    grads: [&mut [f32]; 3],
    scratch: &mut Scratch,
) {
    backward_group::<true>(geo, inputs, grads, scratch)
}

/// The forward pass of one group: `q` and `out` [g, t, d], `k` and `v` [s, d].
#[inline(always)]
fn forward_group<const F: bool>(
    geo: &Geometry,
    [q, k, v]: [&[f32]; 3],
    out: &mut [f32],
    scratch: &mut Scratch,
) {
    let Geometry { g, t, s, d, lo, .. } = *geo;
    let first = geo.first_row();
    if first == t {
        return;
    }
    // Only the keys lo..s are ever visible: key indices below are relative to lo.
    let keys = s - lo;
    let (k, v) = (&k[lo * d..], &v[lo * d..]);
    let p = grown(&mut scratch.p, MR * keys);
    let panel = grown(&mut scratch.panel, KC * MR);
    if t < SMALL_T {
        // One position at a time, the query heads of the group (rows t·d apart, seeing the same keys)
        // tiled together.
        for i in first..t {
            let nk = geo.visible(i);
            for h0 in (0..g).step_by(MR) {
                let m = MR.min(g - h0);
                let row = (h0 * t + i) * d;
                dots::<F>(m, nk, d, Strided::rows(&q[row..], t * d), k, p, keys);
                for mi in 0..m {
                    softmax_row::<F>(&mut p[mi * keys..][..nk], nk, geo.scale);
                }
                for mi in 0..m {
                    let o = Out::add(&mut out[row + mi * t * d..], d);
                    let a = Strided::rows(&p[mi * keys..], keys);
                    ab::<F>(panel, 1, nk, d, a, Rows::new(v, d), o);
                }
            }
        }
        return;
    }
    let kt = grown(&mut scratch.kt, keys * d);
    transpose(k, keys, d, kt);
    for (qh, oh) in q.chunks(t * d).zip(out.chunks_mut(t * d)) {
        for r0 in (first..t).step_by(MR) {
            let m = MR.min(t - r0);
            let nk = geo.visible(r0 + m - 1);
            let a = Strided::rows(&qh[r0 * d..], d);
            ab::<F>(panel, m, d, nk, a, Rows::new(kt, keys), Out::set(p, keys));
            for mi in 0..m {
                softmax_row::<F>(&mut p[mi * keys..][..nk], geo.visible(r0 + mi), geo.scale);
            }
            let o = Out::add(&mut oh[r0 * d..], d);
            ab::<F>(panel, m, nk, d, Strided::rows(p, keys), Rows::new(v, d), o);
        }
    }
}

/// The backward pass of one group: `q`, `o`, `grad` and `dq` [g, t, d], `k`, `v`, `dk` and `dv` [s, d].
#[inline(always)]
fn backward_group<const F: bool>(
    geo: &Geometry,
    [q, k, v, o, grad]: [&[f32]; 5],
    [dq, dk, dv]: [&mut [f32]; 3],
    scratch: &mut Scratch,
) {
    let Geometry {
        t,
        s,
        d,
        lo,
        offset,
        ..
    } = *geo;
    let first = geo.first_row();
    if first == t {
        return;
    }
    let keys = s - lo;
    let (k, v) = (&k[lo * d..], &v[lo * d..]);
    let (dk, dv) = (&mut dk[lo * d..], &mut dv[lo * d..]);
    let kt = grown(&mut scratch.kt, keys * d);
    transpose(k, keys, d, kt);
    let vt = grown(&mut scratch.vt, keys * d);
    transpose(v, keys, d, vt);
    let p = grown(&mut scratch.p, BLOCK_ROWS * keys);
    let ds = grown(&mut scratch.ds, BLOCK_ROWS * keys);
    let panel = grown(&mut scratch.panel, KC * MR);
    let head = t * d;
    let heads = q.chunks(head).zip(o.chunks(head));
    for ((qh, oh), (gh, dqh)) in heads.zip(grad.chunks(head).zip(dq.chunks_mut(head))) {
        for b0 in (first..t).step_by(BLOCK_ROWS) {
            let b1 = (b0 + BLOCK_ROWS).min(t);
            // The keys of the block's last row: each scratch row is defined up to there (zeros past the
            // row's own keys).
            let block_keys = geo.visible(b1 - 1);
            for r0 in (b0..b1).step_by(MR) {
                let m = MR.min(b1 - r0);
                let nk = geo.visible(r0 + m - 1);
                let (pr, dsr) = (&mut p[(r0 - b0) * keys..], &mut ds[(r0 - b0) * keys..]);
                // S = q·kᵀ (unscaled), then P in place; dP = dO·vᵀ into ∂S's rows, then scale·∂S.
                let (qa, ga) = (
                    Strided::rows(&qh[r0 * d..], d),
                    Strided::rows(&gh[r0 * d..], d),
                );
                ab::<F>(panel, m, d, nk, qa, Rows::new(kt, keys), Out::set(pr, keys));
                ab::<F>(
                    panel,
                    m,
                    d,
                    nk,
                    ga,
                    Rows::new(vt, keys),
                    Out::set(dsr, keys),
                );
                for mi in 0..m {
                    let r = r0 + mi;
                    let seen = geo.visible(r);
                    let prow = &mut pr[mi * keys..][..block_keys];
                    softmax_row::<F>(&mut prow[..nk], seen, geo.scale);
                    prow[nk..].fill(0.0);
                    let dd = dot::<F>(&gh[r * d..][..d], &oh[r * d..][..d]);
                    let dsrow = &mut dsr[mi * keys..][..block_keys];
                    for (x, &pv) in dsrow[..seen].iter_mut().zip(&prow[..seen]) {
                        *x = geo.scale * pv * (*x - dd);
                    }
                    dsrow[seen..].fill(0.0);
                }
                // ∂q = scale·∂S·k.
                let dqo = Out::add(&mut dqh[r0 * d..], d);
                ab::<F>(
                    panel,
                    m,
                    nk,
                    d,
                    Strided::rows(dsr, keys),
                    Rows::new(k, d),
                    dqo,
                );
            }
            // ∂v += Pᵀ·dO and ∂k += scale·∂Sᵀ·q, tile of keys by tile of keys, over the block's rows that
            // see the tile's first key.
            for j0 in (0..block_keys).step_by(MR) {
                let m = MR.min(block_keys - j0);
                let r_first = b0.max((lo + j0).saturating_sub(offset));
                let (rows, at) = (b1 - r_first, (r_first - b0) * keys + j0);
                let (pa, dsa) = (
                    Strided::columns(&p[at..], keys),
                    Strided::columns(&ds[at..], keys),
                );
                let (gb, qb) = (
                    Rows::new(&gh[r_first * d..], d),
                    Rows::new(&qh[r_first * d..], d),
                );
                ab::<F>(panel, m, rows, d, pa, gb, Out::add(&mut dv[j0 * d..], d));
                ab::<F>(panel, m, rows, d, dsa, qb, Out::add(&mut dk[j0 * d..], d));
            }
        }
    }
}

/// A matrix read element by element: A(i, kk) = data[i·row + kk·k].
#[derive(Clone, Copy)]
struct Strided<'a> {
    data: &'a [f32],
    row: usize,
    k: usize,
}

impl<'a> Strided<'a> {
    /// Row-major, rows `ld` apart.
    fn rows(data: &'a [f32], ld: usize) -> Strided<'a> {
        Strided {
            data,
            row: ld,
            k: 1,
        }
    }

    /// The transpose of a row-major matrix with rows `ld` apart.
    fn columns(data: &'a [f32], ld: usize) -> Strided<'a> {
        Strided {
            data,
            row: 1,
            k: ld,
        }
    }
}

/// A row-major matrix read by rows: B(kk, n) = data[kk·ld + n].
#[derive(Clone, Copy)]
struct Rows<'a> {
    data: &'a [f32],
    ld: usize,
}

impl<'a> Rows<'a> {
    fn new(data: &'a [f32], ld: usize) -> Rows<'a> {
        Rows { data, ld }
    }
}

/// The result of [`ab`]: row i at data[i·ld..], overwritten or accumulated into.
struct Out<'a> {
    data: &'a mut [f32],
    ld: usize,
    accumulate: bool,
}

impl<'a> Out<'a> {
    fn set(data: &'a mut [f32], ld: usize) -> Out<'a> {
        Out {
            data,
            ld,
            accumulate: false,
        }
    }

    fn add(data: &'a mut [f32], ld: usize) -> Out<'a> {
        Out {
            data,
            ld,
            accumulate: true,
        }
    }
}

/// C = A·B (or C += A·B) for A m × kn, B kn × width, C m × width, in tiles of up to MR rows; `panel`
/// (KC × MR elements) is scratch.
#[inline(always)]
fn ab<const F: bool>(
    panel: &mut [f32],
    m: usize,
    kn: usize,
    width: usize,
    a: Strided,
    b: Rows,
    c: Out,
) {
    let mut i = 0;
    while i < m {
        let rows = MR.min(m - i);
        let a = Strided {
            data: &a.data[i * a.row..],
            ..a
        };
        let c = Out {
            data: &mut c.data[i * c.ld..],
            ..c
        };
        match rows {
            6 => ab_rows::<6, F>(&mut *panel, kn, width, a, b, c),
            5 => ab_rows::<5, F>(&mut *panel, kn, width, a, b, c),
            4 => ab_rows::<4, F>(&mut *panel, kn, width, a, b, c),
            3 => ab_rows::<3, F>(&mut *panel, kn, width, a, b, c),
            2 => ab_rows::<2, F>(&mut *panel, kn, width, a, b, c),
            _ => ab_rows::<1, F>(&mut *panel, kn, width, a, b, c),
        }
        i += rows;
    }
}

/// M rows of C = A·B: A packed KC columns at a time into a contiguous [kc × M] panel (so that the inner
/// loop reads it and B's rows without index arithmetic), then the panel times B tile by tile of C.
#[inline(always)]
fn ab_rows<const M: usize, const F: bool>(
    panel: &mut [f32],
    kn: usize,
    width: usize,
    a: Strided,
    b: Rows,
    c: Out,
) {
    let mut k0 = 0;
    while k0 < kn {
        let kc = KC.min(kn - k0);
        for (kk, packed) in panel.chunks_exact_mut(M).take(kc).enumerate() {
            for (i, x) in packed.iter_mut().enumerate() {
                *x = a.data[i * a.row + (k0 + kk) * a.k];
            }
        }
        let panel = &panel[..kc * M];
        let accumulate = c.accumulate || k0 > 0;
        let tile = Tile {
            panel,
            b: &b.data[k0 * b.ld..],
            ldb: b.ld,
            ldc: c.ld,
            accumulate,
        };
        let mut n = 0;
        // A single row takes 64 columns at a time (8 accumulators): B's rows are then read whole, in
        // order (the decoding path's probabilities · v streams v from memory).
        while M == 1 && n + 64 <= width {
            ab_tile::<M, 64, F>(&tile, n, c.data);
            n += 64;
        }
        while n + 16 <= width {
            ab_tile::<M, 16, F>(&tile, n, c.data);
            n += 16;
        }
        if n + 8 <= width {
            ab_tile::<M, 8, F>(&tile, n, c.data);
            n += 8;
        }
        while n < width {
            ab_tile::<M, 1, F>(&tile, n, c.data);
            n += 1;
        }
        k0 += kc;
    }
    if kn == 0 && !c.accumulate {
        for i in 0..M {
            c.data[i * c.ld..][..width].fill(0.0);
        }
    }
}

/// What the tiles of one panel share: the packed A ([kc × M]), B from the panel's first row, C's stride.
struct Tile<'a> {
    panel: &'a [f32],
    b: &'a [f32],
    ldb: usize,
    ldc: usize,
    accumulate: bool,
}

/// The M × W tile of C at column n0 (+)= panel · B[.., n0..n0 + W], its accumulators in registers.
#[inline(always)]
fn ab_tile<const M: usize, const W: usize, const F: bool>(tile: &Tile, n0: usize, c: &mut [f32]) {
    let ldc = tile.ldc;
    let mut acc = [[0f32; W]; M];
    if tile.accumulate {
        for (i, row) in acc.iter_mut().enumerate() {
            row.copy_from_slice(&c[i * ldc + n0..][..W]);
        }
    }
    for (xs, brow) in tile
        .panel
        .chunks_exact(M)
        .zip(tile.b[n0..].chunks(tile.ldb))
    {
        let brow: &[f32; W] = brow[..W].try_into().expect("a tile row of W columns");
        for (row, &x) in acc.iter_mut().zip(xs) {
            for (r, &y) in row.iter_mut().zip(brow) {
                *r = fma::<F>(x, y, *r);
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        c[i * ldc + n0..][..W].copy_from_slice(row);
    }
}

/// c[i·ldc + j] = a_i · b_j for the m rows a_i of `a` (row-major: a.k = 1) and the n rows
/// b_j = b[j·d..][..d]: one dot product at a time (consecutive ones are independent, so the processor
/// overlaps them), key by key so that each key row is read once for all the rows.
#[inline(always)]
fn dots<const F: bool>(
    m: usize,
    n: usize,
    d: usize,
    a: Strided,
    b: &[f32],
    c: &mut [f32],
    ldc: usize,
) {
    for (j, key) in b.chunks_exact(d).take(n).enumerate() {
        for i in 0..m {
            c[i * ldc + j] = dot::<F>(&a.data[i * a.row..][..d], key);
        }
    }
}

/// x·y, eight lanes of partial sums (added in lane order at the end: with that reduction, unlike a
/// pairwise one, LLVM keeps the lanes in one vector register).
#[inline(always)]
fn dot<const F: bool>(x: &[f32], y: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (xc, yc) = (x.chunks_exact(8), y.chunks_exact(8));
    let tail: f32 = xc
        .remainder()
        .iter()
        .zip(yc.remainder())
        .map(|(a, b)| a * b)
        .sum();
    for (xs, ys) in xc.zip(yc) {
        for ((r, &a), &b) in acc.iter_mut().zip(xs).zip(ys) {
            *r = fma::<F>(a, b, *r);
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `row[..visible]` (raw scores q·k) replaced by softmax(scale · scores), `row[visible..]` by zeros
/// (visible ≥ 1).
#[inline(always)]
fn softmax_row<const F: bool>(row: &mut [f32], visible: usize, scale: f32) {
    let (seen, rest) = row.split_at_mut(visible);
    let mut lane_max = [f32::NEG_INFINITY; 8];
    let chunks = seen.chunks_exact(8);
    let mut max = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
    for chunk in chunks {
        for (m, &x) in lane_max.iter_mut().zip(chunk) {
            *m = if x > *m { x } else { *m };
        }
    }
    for m in lane_max {
        max = if m > max { m } else { max };
    }
    for x in seen.iter_mut() {
        *x = exp_nonpositive::<F>((*x - max) * scale);
    }
    let mut lane_sum = [0f32; 8];
    let chunks = seen.chunks_exact(8);
    let tail: f32 = chunks.remainder().iter().sum();
    for chunk in chunks {
        for (s, &x) in lane_sum.iter_mut().zip(chunk) {
            *s += x;
        }
    }
    let inv = 1.0 / (lane_sum.iter().sum::<f32>() + tail);
    for x in seen.iter_mut() {
        *x *= inv;
    }
    rest.fill(0.0);
}

/// exp(x) for x ≤ 0 (Cephes' expf: x = n·ln 2 + r, |r| ≤ ln 2 / 2, a degree-7 polynomial in r, times 2ⁿ;
/// about 1 ulp), branch-free so that the loops over a row vectorise. Below −87 it returns exp(−87)
/// (≈ 1.6e−38, negligible next to the row's maximum, exp(0) = 1); NaN stays NaN.
#[inline(always)]
fn exp_nonpositive<const F: bool>(x: f32) -> f32 {
    // Adding 1.5·2²³ rounds to an integer, which then sits in the low bits of the mantissa.
    const ROUND: f32 = 12_582_912.0;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = if x < -87.0 { -87.0 } else { x };
    let shifted = fma::<F>(x, std::f32::consts::LOG2_E, ROUND);
    let n = shifted - ROUND;
    let r = fma::<F>(-n, LN2_LO, fma::<F>(-n, LN2_HI, x));
    let mut y = 1.987_569_2e-4;
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ] {
        y = fma::<F>(y, r, c);
    }
    let y = fma::<F>(y, r * r, r) + 1.0;
    let exponent = (shifted.to_bits() as i32 - ROUND.to_bits() as i32 + 127) << 23;
    y * f32::from_bits(exponent as u32)
}

/// a·b + c, fused when F (one instruction on targets with FMA).
#[inline(always)]
fn fma<const F: bool>(a: f32, b: f32, c: f32) -> f32 {
    if F {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// dst [d, n] = srcᵀ for src [n, d] (n rows of d), in blocks of 16 rows.
#[inline(always)]
fn transpose(src: &[f32], n: usize, d: usize, dst: &mut [f32]) {
    for j0 in (0..n).step_by(16) {
        let j1 = (j0 + 16).min(n);
        for c in 0..d {
            let out = &mut dst[c * n + j0..c * n + j1];
            for (jj, x) in out.iter_mut().enumerate() {
                *x = src[(j0 + jj) * d + c];
            }
        }
    }
}
