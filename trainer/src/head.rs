//! A fused LM head: the log-probability of each row's target token and the entropy of the row's softmax
//! over `hidden @ weightᵀ`, without materialising the [rows × vocab] logits or their gradient.
//!
//! The forward pass walks the vocabulary (and the rows, when there are many) in chunks whose logits have
//! at most `budget` elements, keeping an online log-sum-exp per row; the backward pass (a candle
//! [`CustomOp2`] on `hidden` and `weight`) recomputes each chunk's logits from the saved per-row
//! log-sum-exp and entropy and accumulates ∂hidden and ∂weight chunk by chunk. The per-chunk passes over
//! the logits are candle tensor ops on any device, one parallel pass each on the CPU (`head_cpu.rs`), and
//! CUDA kernels on a GPU (`device_kernels.cu`, the `gpu` module below); the chunks' products are candle's.
//!
//! The derivation, with z the logits of a row, p = softmax(z), lse = log Σ exp z, t its target:
//!
//! * logp = z_t − lse, so ∂logp/∂z_j = 1[j = t] − p_j;
//! * H = −Σ p_j log p_j = lse − Σ p_j z_j, so ∂H/∂z_j = p_j − (p_j + p_j z_j − p_j Σ_k p_k z_k)
//!   = −p_j (z_j − E_p[z]) = −p_j (log p_j + H), since log p_j = z_j − lse and E_p[z] = lse − H.
//!
//! With g1 = ∂loss/∂logp and g2 = ∂loss/∂H of the row, ∂loss/∂z_j = g1 (1[j = t] − p_j) − g2 p_j (log p_j + H),
//! and then ∂hidden = ∂z · W and ∂W = ∂zᵀ · hidden, chunk by chunk.

use candle_core::backend::BackendStorage;

use crate::head_cpu;
use candle_core::{
    bail, CpuStorage, CudaStorage, CustomOp2, DType, Layout, Shape, Storage, Tensor,
};

/// The default `budget` of [`fused_logp_entropy`]: at most 2²² elements (16 MiB in f32) in one chunk's
/// logits. The backward pass keeps about half a dozen tensors of a chunk's size alive at once, so the
/// transient memory of the head is about 6 × budget × 4 bytes (~100 MiB) on top of ∂hidden and ∂weight,
/// whatever the vocabulary; chunks this large keep the matrix products efficient.
pub const DEFAULT_BUDGET: usize = 1 << 22;

/// Below this many vocabulary entries per chunk the rows are chunked too (see [`chunk_plan`]).
const MIN_VOCAB_CHUNK: usize = 256;

/// The chunking [`fused_logp_entropy`] uses for `n` rows, a vocabulary of `v` and `budget` elements per
/// chunk: `(rows_chunk, vocab_chunk)`, with rows_chunk · vocab_chunk ≤ budget (budget ≥ 1). All rows at
/// once when that still leaves chunks of at least min(v, 256) vocabulary entries, otherwise as many rows
/// as allow that (at least one); vocab_chunk = max(1, budget / rows_chunk), at most v.
pub fn chunk_plan(n: usize, v: usize, budget: usize) -> (usize, usize) {
    let budget = budget.max(1);
    let min_vocab = v.clamp(1, MIN_VOCAB_CHUNK);
    let rows = if n.saturating_mul(min_vocab) <= budget {
        n
    } else {
        budget / min_vocab
    }
    .max(1);
    let cols = (budget / rows).clamp(1, v.max(1));
    (rows, cols)
}

/// log π(target) and the entropy of the softmax of `hidden @ weightᵀ`, per row, without materialising
/// the [rows × vocab] logits or their gradient. hidden: [n, h] f32, weight: [v, h] f32, targets: [n] u32.
/// Returns [n, 2] (column 0 = log-prob of the target, column 1 = entropy), differentiable w.r.t. hidden
/// and weight (both may be Vars or tracked tensors).
///
/// `budget` bounds the elements of one chunk's logits ([`DEFAULT_BUDGET`] is a good default); f64 inputs
/// work too (the tests use them). Shape, dtype and device mismatches, a target outside the vocabulary and
/// a zero budget are errors.
pub fn fused_logp_entropy(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    budget: usize,
) -> candle_core::Result<Tensor> {
    let (n, v, _) = check("fused_logp_entropy", hidden, weight, targets)?;
    if budget == 0 {
        bail!("fused_logp_entropy: the chunk budget must be at least 1 element, got 0")
    }
    let (rows, cols) = chunk_plan(n, v, budget);
    let hidden_d = hidden.detach();
    let weight_d = weight.detach();
    let targets = targets.detach();
    let dtype = hidden.dtype();
    let device = hidden.device();

    let mut logp_parts = Vec::new();
    let mut lse_parts = Vec::new();
    let mut entropy_parts = Vec::new();
    for r0 in (0..n).step_by(rows) {
        let rc = rows.min(n - r0);
        let h = hidden_d.narrow(0, r0, rc)?;
        if head_cpu::applies(&h) && crate::device_kernels::fused_layers(device)? {
            // f32 on the CPU: one parallel pass per chunk (`head_cpu.rs`), the same formulas.
            if v == 0 {
                bail!("fused_logp_entropy: empty vocabulary")
            }
            let t: Vec<u32> = targets.narrow(0, r0, rc)?.to_vec1()?;
            let mut states = vec![head_cpu::RowState::default(); rc];
            for c0 in (0..v).step_by(cols) {
                let vc = cols.min(v - c0);
                let z = h.matmul(&weight_d.narrow(0, c0, vc)?.t()?)?;
                head_cpu::forward_chunk(&z, c0, &t, &mut states)?;
            }
            let done = head_cpu::finish(&states);
            let column = |k: fn(&(f32, f32, f32)) -> f32| {
                Tensor::from_vec(done.iter().map(k).collect::<Vec<f32>>(), (rc, 1), device)
            };
            logp_parts.push(column(|d| d.0)?);
            lse_parts.push(column(|d| d.1)?);
            entropy_parts.push(column(|d| d.2)?);
            continue;
        }
        #[cfg(feature = "cuda")]
        if gpu::applies(&h)? {
            // f32 on a GPU: the chunk passes of `device_kernels.cu`, the same formulas.
            if v == 0 {
                bail!("fused_logp_entropy: empty vocabulary")
            }
            let (logp, lse, entropy) =
                gpu::forward_rows(&h, &weight_d, &targets.narrow(0, r0, rc)?, cols)?;
            logp_parts.push(logp);
            lse_parts.push(lse);
            entropy_parts.push(entropy);
            continue;
        }
        let t = targets
            .narrow(0, r0, rc)?
            .unsqueeze(1)?
            .to_dtype(DType::F32)?;
        // Per row: the running max m, s = Σ exp(z − m), u = Σ exp(z − m)·(z − m) (relative to m, so
        // that the entropy ln s − u/s has no cancellation against large logits), and the target's logit.
        let mut state: Option<(Tensor, Tensor, Tensor)> = None;
        let mut z_target = Tensor::zeros((rc, 1), dtype, device)?;
        for c0 in (0..v).step_by(cols) {
            let vc = cols.min(v - c0);
            let z = h.matmul(&weight_d.narrow(0, c0, vc)?.t()?)?;
            let (column, inside) = target_in_chunk(&t, c0, vc, dtype)?;
            z_target = (z_target + (z.gather(&column, 1)? * inside)?)?;
            let chunk_max = z.max_keepdim(1)?;
            let m = match &state {
                None => chunk_max,
                Some((m, _, _)) => m.maximum(&chunk_max)?,
            };
            let d = z.broadcast_sub(&m)?;
            let e = d.exp()?;
            let s_c = e.sum_keepdim(1)?;
            let u_c = (&e * &d)?.sum_keepdim(1)?;
            state = Some(match state {
                None => (m, s_c, u_c),
                Some((m_old, s, u)) => {
                    // Rescale by exp(m_old − m): s' = a·s, u' = a·(u + (m_old − m)·s).
                    let shift = (&m_old - &m)?;
                    let a = shift.exp()?;
                    let u = ((u + (&shift * &s)?)? * &a)?;
                    let s = (s * &a)?;
                    (m, (s + s_c)?, (u + u_c)?)
                }
            });
        }
        let (m, s, u) = match state {
            Some(state) => state,
            None => bail!("fused_logp_entropy: empty vocabulary"),
        };
        let ln_s = s.log()?;
        let lse = (m + &ln_s)?;
        let entropy = (ln_s - (u / s)?)?;
        logp_parts.push((z_target - &lse)?);
        lse_parts.push(lse);
        entropy_parts.push(entropy);
    }
    let cat_rows = |parts: &[Tensor]| -> candle_core::Result<Tensor> {
        if parts.is_empty() {
            Tensor::zeros((0, 1), dtype, device)
        } else {
            Tensor::cat(parts, 0)
        }
    };
    let lse = cat_rows(&lse_parts)?;
    let entropy = cat_rows(&entropy_parts)?;
    let result = Tensor::cat(&[cat_rows(&logp_parts)?, entropy.clone()], 1)?.contiguous()?;
    hidden.apply_op2(
        weight,
        FusedHead {
            targets,
            lse,
            entropy,
            result,
            rows,
            cols,
        },
    )
}

/// The reference for [`fused_logp_entropy`]: the full [n, v] logits, a log-softmax with a detached max,
/// the target's entry gathered and the entropy −Σ p log p, all plain (differentiable) candle ops. Same
/// inputs, result and errors, without the budget.
pub fn naive_logp_entropy(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
) -> candle_core::Result<Tensor> {
    check("naive_logp_entropy", hidden, weight, targets)?;
    let logits = hidden.matmul(&weight.t()?)?;
    let max = logits.max_keepdim(1)?.detach();
    let shifted = logits.broadcast_sub(&max)?;
    let lse = shifted.exp()?.sum_keepdim(1)?.log()?;
    let log_softmax = shifted.broadcast_sub(&lse)?;
    let logp = log_softmax.gather(&targets.unsqueeze(1)?.contiguous()?, 1)?;
    let entropy = (log_softmax.exp()? * &log_softmax)?.sum_keepdim(1)?.neg()?;
    Tensor::cat(&[logp, entropy], 1)
}

/// The checks of both functions: hidden [n, h] and weight [v, h] of one float dtype (f32 or f64), targets
/// [n] u32 below v, all on one device. Returns (n, v, h).
fn check(
    what: &str,
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
) -> candle_core::Result<(usize, usize, usize)> {
    let Ok((n, h)) = hidden.dims2() else {
        bail!(
            "{what}: hidden must be [rows, hidden size], got shape {:?}",
            hidden.dims()
        )
    };
    let Ok((v, hw)) = weight.dims2() else {
        bail!(
            "{what}: weight must be [vocab, hidden size], got shape {:?}",
            weight.dims()
        )
    };
    if hw != h {
        bail!("{what}: weight is [{v}, {hw}] but hidden is [{n}, {h}]: the hidden sizes differ")
    }
    if v == 0 {
        bail!("{what}: weight has no rows (an empty vocabulary)")
    }
    if v > 1 << 24 {
        bail!("{what}: a vocabulary of {v} is more than 2^24 (the chunks locate targets in f32)")
    }
    let Ok(nt) = targets.dims1() else {
        bail!(
            "{what}: targets must be [rows], got shape {:?}",
            targets.dims()
        )
    };
    if nt != n {
        bail!("{what}: {nt} targets for {n} rows of hidden")
    }
    if !matches!(hidden.dtype(), DType::F32 | DType::F64) {
        bail!(
            "{what}: hidden must be f32 or f64, got {:?}",
            hidden.dtype()
        )
    }
    if weight.dtype() != hidden.dtype() {
        bail!(
            "{what}: weight is {:?} but hidden is {:?}",
            weight.dtype(),
            hidden.dtype()
        )
    }
    if targets.dtype() != DType::U32 {
        bail!("{what}: targets must be u32, got {:?}", targets.dtype())
    }
    if !hidden.device().same_device(weight.device())
        || !hidden.device().same_device(targets.device())
    {
        bail!(
            "{what}: hidden, weight and targets must be on one device (got {:?}, {:?}, {:?})",
            hidden.device().location(),
            weight.device().location(),
            targets.device().location()
        )
    }
    if let Some((row, &t)) = targets
        .to_vec1::<u32>()?
        .iter()
        .enumerate()
        .find(|(_, &t)| t as usize >= v)
    {
        bail!("{what}: target {t} of row {row} is outside the vocabulary of {v} (weight's rows)")
    }
    Ok((n, v, h))
}

/// Where the rows' targets (`targets`: [rc, 1] f32, exact below 2²⁴) fall in the vocabulary chunk
/// [c0, c0 + vc): each one's column in the chunk, clamped to it ([rc, 1] u32), and 1 where the target is
/// in the chunk, 0 elsewhere ([rc, 1] of `dtype`). Only [rc, 1] tensors: no [rc, vc] one-hot.
fn target_in_chunk(
    targets: &Tensor,
    c0: usize,
    vc: usize,
    dtype: DType,
) -> candle_core::Result<(Tensor, Tensor)> {
    let local = (targets - c0 as f64)?;
    let clamped = local.clamp(0f32, (vc - 1) as f32)?;
    let inside = clamped.eq(&local)?.to_dtype(dtype)?;
    Ok((clamped.to_dtype(DType::U32)?, inside))
}

/// ∂loss/∂z of one chunk of logits, as candle ops (any dtype and device): the chunk of `h` (rows) times
/// `w` (the vocabulary columns `c0 .. c0 + vc`), its rows' targets, lse, entropy and incoming gradients
/// (`[rows, 1]` each but the targets, `[rows]`).
fn chunk_gradient(
    h: &Tensor,
    w: &Tensor,
    (c0, vc): (usize, usize),
    targets: &Tensor,
    lse: &Tensor,
    entropy: &Tensor,
    (g1, g2): (&Tensor, &Tensor),
) -> candle_core::Result<Tensor> {
    let t = targets.unsqueeze(1)?.to_dtype(DType::F32)?;
    let log_p = h.matmul(&w.t()?)?.broadcast_sub(lse)?;
    let p = log_p.exp()?;
    // ∂z = g1·(onehot − p) − g2·p·(log p + H) = g1·onehot − p·(g1 + g2·(log p + H)):
    // the second term, then g1 added in place at the targets that fall in this chunk.
    let coeff = log_p
        .broadcast_add(entropy)?
        .broadcast_mul(g2)?
        .broadcast_add(g1)?;
    let dz = (p * coeff)?.neg()?;
    let (column, inside) = target_in_chunk(&t, c0, vc, h.dtype())?;
    dz.scatter_add_set(&column, &(g1 * inside)?, 1)?;
    Ok(dz)
}

/// The autograd node of [`fused_logp_entropy`]: its forward pass hands candle the result computed
/// chunk by chunk, its backward pass recomputes the chunks' logits from the saved lse and entropy.
struct FusedHead {
    /// [n] u32, detached.
    targets: Tensor,
    /// [n, 1] per-row log-sum-exp of the logits.
    lse: Tensor,
    /// [n, 1] per-row entropy.
    entropy: Tensor,
    /// [n, 2] contiguous: the forward's result.
    result: Tensor,
    rows: usize,
    cols: usize,
}

impl FusedHead {
    fn check_inputs(&self, l1: &Layout, l2: &Layout) -> candle_core::Result<()> {
        let (n, _) = l1.shape().dims2()?;
        let (v, _) = l2.shape().dims2()?;
        if n != self.result.dim(0)? || v == 0 {
            bail!("fused-lm-head: inputs changed shape since the forward pass")
        }
        Ok(())
    }
}

impl CustomOp2 for FusedHead {
    fn name(&self) -> &'static str {
        "fused-lm-head"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        l1: &Layout,
        _: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        self.check_inputs(l1, l2)?;
        let flat = self.result.flatten_all()?;
        let storage = match self.result.dtype() {
            DType::F32 => CpuStorage::F32(flat.to_vec1()?),
            DType::F64 => CpuStorage::F64(flat.to_vec1()?),
            other => bail!("fused-lm-head: unsupported dtype {other:?}"),
        };
        Ok((storage, self.result.shape().clone()))
    }

    /// The result is already on the GPU: a copy of it. (Compiled with the `cuda` feature, never yet run
    /// on a GPU.)
    fn cuda_fwd(
        &self,
        _: &CudaStorage,
        l1: &Layout,
        _: &CudaStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        self.check_inputs(l1, l2)?;
        let (storage, layout) = self.result.storage_and_layout();
        match &*storage {
            Storage::Cuda(s) => Ok((s.try_clone(layout)?, layout.shape().clone())),
            _ => bail!("fused-lm-head: the forward's result is not on the GPU"),
        }
    }

    fn bwd(
        &self,
        hidden: &Tensor,
        weight: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let want_hidden = hidden.is_variable() || hidden.track_op();
        let want_weight = weight.is_variable() || weight.track_op();
        // Detached, so that the gradients' own ops record no graph (it would keep every chunk alive).
        let h_all = hidden.detach();
        let w_all = weight.detach();
        let grad = grad_res.detach();
        let (n, hd) = h_all.dims2()?;
        let v = w_all.dim(0)?;
        let (dtype, device) = (h_all.dtype(), h_all.device());
        let g1 = grad.narrow(1, 0, 1)?;
        let g2 = grad.narrow(1, 1, 1)?;
        let row_starts: Vec<usize> = (0..n).step_by(self.rows).collect();
        // f32 on the CPU: ∂z of each chunk in one parallel pass (`head_cpu.rs`) from these rows' values.
        let cpu =
            if n > 0 && head_cpu::applies(&h_all) && crate::device_kernels::fused_layers(device)? {
                Some((
                    self.targets.to_vec1::<u32>()?,
                    head_cpu::values(&self.lse)?,
                    head_cpu::values(&self.entropy)?,
                    head_cpu::values(&g1)?,
                    head_cpu::values(&g2)?,
                ))
            } else {
                None
            };
        // f32 on a GPU: ∂z of each chunk by `rlx_head_backward_chunk` from contiguous per-row columns.
        #[cfg(feature = "cuda")]
        let gpu_rows = if n > 0 && gpu::applies(&h_all)? {
            Some((
                self.lse.contiguous()?,
                self.entropy.contiguous()?,
                g1.contiguous()?,
                g2.contiguous()?,
            ))
        } else {
            None
        };
        let mut d_hidden: Vec<Option<Tensor>> = vec![None; row_starts.len()];
        // ∂weight is written chunk by chunk into one buffer (no concatenation of the whole gradient).
        let d_weight = if want_weight {
            Some(Tensor::zeros((v, hd), dtype, device)?)
        } else {
            None
        };
        for c0 in (0..v).step_by(self.cols) {
            let vc = self.cols.min(v - c0);
            let w = w_all.narrow(0, c0, vc)?;
            let mut d_w: Option<Tensor> = None;
            for (k, &r0) in row_starts.iter().enumerate() {
                let rc = self.rows.min(n - r0);
                let h = h_all.narrow(0, r0, rc)?;
                #[cfg(feature = "cuda")]
                let on_gpu = gpu_rows.as_ref();
                #[cfg(not(feature = "cuda"))]
                let on_gpu: Option<&()> = None;
                let dz = match (&cpu, on_gpu) {
                    #[cfg(feature = "cuda")]
                    (_, Some((lse, entropy, g1, g2))) => {
                        let rows = |t: &Tensor| t.narrow(0, r0, rc);
                        gpu::chunk_gradient(
                            &h.matmul(&w.t()?)?,
                            c0,
                            &self.targets.narrow(0, r0, rc)?,
                            [&rows(lse)?, &rows(entropy)?, &rows(g1)?, &rows(g2)?],
                        )?
                    }
                    (Some((targets, lse, entropy, g1, g2)), _) => {
                        let rows = r0..r0 + rc;
                        head_cpu::backward_chunk(
                            &h.matmul(&w.t()?)?,
                            c0,
                            &targets[rows.clone()],
                            &lse[rows.clone()],
                            &entropy[rows.clone()],
                            &g1[rows.clone()],
                            &g2[rows],
                            device,
                        )?
                    }
                    _ => chunk_gradient(
                        &h,
                        &w,
                        (c0, vc),
                        &self.targets.narrow(0, r0, rc)?,
                        &self.lse.narrow(0, r0, rc)?,
                        &self.entropy.narrow(0, r0, rc)?,
                        (&g1.narrow(0, r0, rc)?, &g2.narrow(0, r0, rc)?),
                    )?,
                };
                if want_hidden {
                    let part = dz.matmul(&w)?;
                    d_hidden[k] = Some(match d_hidden[k].take() {
                        None => part,
                        Some(acc) => (acc + part)?,
                    });
                }
                if want_weight {
                    let part = dz.t()?.matmul(&h)?;
                    d_w = Some(match d_w {
                        None => part,
                        Some(acc) => (acc + part)?,
                    });
                }
            }
            if let (Some(d_weight), Some(d_w)) = (&d_weight, d_w) {
                d_weight.slice_set(&d_w.contiguous()?, 0, c0)?;
            }
        }
        let d_hidden = if want_hidden {
            let parts: Vec<Tensor> = d_hidden.into_iter().flatten().collect();
            Some(if parts.is_empty() {
                Tensor::zeros((n, hd), dtype, device)?
            } else {
                Tensor::cat(&parts, 0)?
            })
        } else {
            None
        };
        Ok((d_hidden, d_weight))
    }
}

/// The shape of [`benchmark`]: `rows` positions, a vocabulary of `vocab`, hidden size `hidden`, the
/// median of `runs` passes.
#[derive(Clone, Copy, Debug)]
pub struct BenchShape {
    pub rows: usize,
    pub vocab: usize,
    pub hidden: usize,
    pub runs: usize,
}

/// The benchmark inputs' formula, shared with scripts/torch_head_bench.py (evaluated in f64, rounded to
/// f32): hidden[i, j] = sin(0.37 i + 1.31 j + 0.5).
pub fn bench_hidden(i: usize, j: usize) -> f32 {
    (0.37 * i as f64 + 1.31 * j as f64 + 0.5).sin() as f32
}

/// weight[v, j] = 0.08 cos(0.73 v + 2.17 j + 0.011 v j) (logits of a few units).
pub fn bench_weight(v: usize, j: usize) -> f32 {
    let (v, j) = (v as f64, j as f64);
    (0.08 * (0.73 * v + 2.17 * j + 0.011 * v * j).cos()) as f32
}

/// target[i] = (7919 i + 13) mod V.
pub fn bench_target(i: usize, vocab: usize) -> u32 {
    ((7919 * i + 13) % vocab) as u32
}

/// VmHWM or VmRSS of this process in bytes (0 where /proc is not there).
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// One forward + backward pass of Σ logp + ½ Σ entropy through [`fused_logp_entropy`] (default budget)
/// on `device`, on the formula inputs ([`bench_hidden`], [`bench_weight`], [`bench_target`]): the
/// median time of `runs` synchronised passes, the peak memory above the inputs (a GPU's memory-pool
/// high-water mark, `crate::memory::gpu_peak_bytes`; on the CPU the growth of VmHWM), and the four
/// values scripts/torch_head_bench.py compares with PyTorch's materialised head (Σ logp, Σ entropy,
/// |∂hidden|², |∂weight|²), as one JSON object (trainer/examples/lm_head_bench.rs,
/// scripts/gpu-check.sh).
pub fn benchmark(
    device: &candle_core::Device,
    shape: BenchShape,
) -> Result<serde_json::Value, String> {
    use candle_core::Var;
    let BenchShape {
        rows: n,
        vocab: v,
        hidden: h,
        runs,
    } = shape;
    if n == 0 || v == 0 || h == 0 || runs == 0 {
        return Err(format!(
            "the head benchmark needs positive sizes, got {shape:?}"
        ));
    }
    let fail = |e: candle_core::Error| e.to_string();
    let hidden: Vec<f32> = (0..n * h).map(|k| bench_hidden(k / h, k % h)).collect();
    let weight: Vec<f32> = (0..v * h).map(|k| bench_weight(k / h, k % h)).collect();
    let targets: Vec<u32> = (0..n).map(|i| bench_target(i, v)).collect();
    let hidden = Var::from_vec(hidden, (n, h), device).map_err(fail)?;
    let weight = Var::from_vec(weight, (v, h), device).map_err(fail)?;
    let targets = Tensor::from_vec(targets, n, device).map_err(fail)?;
    let coeffs = Tensor::from_vec(
        (0..n).flat_map(|_| [1f32, 0.5]).collect::<Vec<_>>(),
        (n, 2),
        device,
    )
    .map_err(fail)?;
    crate::memory::reset_gpu_peak(device)?;
    if device.is_cpu() && std::fs::write("/proc/self/clear_refs", "5").is_err() {
        eprintln!("warning: could not reset VmHWM; the peak may include the inputs' creation");
    }
    let rss_before = status_bytes("VmRSS:");
    let mut times = Vec::new();
    let mut values = [0f64; 4];
    let sum = |t: &Tensor| -> Result<f64, String> {
        t.to_dtype(DType::F64)
            .and_then(|t| t.sum_all())
            .and_then(|t| t.to_scalar::<f64>())
            .map_err(fail)
    };
    for _ in 0..runs {
        let start = std::time::Instant::now();
        let result =
            fused_logp_entropy(&hidden, &weight, &targets, DEFAULT_BUDGET).map_err(fail)?;
        let loss = (&result * &coeffs)
            .and_then(|t| t.sum_all())
            .map_err(fail)?;
        let grads = loss.backward().map_err(fail)?;
        device.synchronize().map_err(fail)?;
        times.push(start.elapsed().as_secs_f64());
        let squares = |t: Option<&Tensor>| -> Result<f64, String> {
            let t = t.ok_or("no gradient reached an input of the head")?;
            sum(&t.sqr().map_err(fail)?)
        };
        values = [
            sum(&result.narrow(1, 0, 1).map_err(fail)?)?,
            sum(&result.narrow(1, 1, 1).map_err(fail)?)?,
            squares(grads.get(hidden.as_tensor()))?,
            squares(grads.get(weight.as_tensor()))?,
        ];
    }
    // Above the inputs (hidden, weight, targets, coefficients), as torch's max_memory_allocated minus
    // what is allocated before the pass.
    let inputs = (4 * (n * h + v * h + n + 2 * n)) as u64;
    let (peak, kind) = match crate::memory::gpu_peak_bytes(device)? {
        Some(bytes) => (
            bytes.saturating_sub(inputs),
            "memory pool high-water mark minus the inputs",
        ),
        None => (
            status_bytes("VmHWM:").saturating_sub(rss_before),
            "VmHWM growth",
        ),
    };
    times.sort_by(f64::total_cmp);
    Ok(serde_json::json!({
        "rows": n,
        "vocab": v,
        "hidden": h,
        "runs": runs,
        "budget": DEFAULT_BUDGET,
        "seconds": times[times.len() / 2],
        "peak_bytes": peak,
        "peak_kind": kind,
        "logp_sum": values[0],
        "entropy_sum": values[1],
        "grad_hidden_sq": values[2],
        "grad_weight_sq": values[3],
    }))
}

/// The head's chunk passes on a GPU (`device_kernels.cu`: `rlx_head_forward_chunk`, `rlx_head_finish`,
/// `rlx_head_backward_chunk`), for f32 tensors on a CUDA device whose fused layers are on
/// (`device_kernels::fused_layers`; `RLX_GPU_LAYERS=plain` takes the candle-op path instead).
#[cfg(feature = "cuda")]
mod gpu {
    use candle_core::{bail, DType, Device, Result, Tensor};

    use crate::device_kernels::{self as k, address_of};

    pub fn applies(t: &Tensor) -> Result<bool> {
        Ok(t.dtype() == DType::F32 && t.device().is_cuda() && k::fused_layers(t.device())?)
    }

    fn cuda(device: &Device) -> Result<&candle_core::CudaDevice> {
        match device {
            Device::Cuda(cuda) => Ok(cuda),
            _ => bail!("fused-lm-head: not a CUDA device"),
        }
    }

    /// The rows `h: [rc, hd]` against every chunk of `weight` (`cols` columns at a time): their
    /// ([rc, 1] each) log p of the target, lse and entropy. The chunks' logits are candle's products
    /// (cuBLAS); the per-row state (m, s, u, target logit) stays on the device.
    pub fn forward_rows(
        h: &Tensor,
        weight: &Tensor,
        targets: &Tensor,
        cols: usize,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let rc = h.dim(0)?;
        let v = weight.dim(0)?;
        let device = h.device();
        let gpu = cuda(device)?;
        let targets = targets.contiguous()?;
        let initial: Vec<f32> = (0..rc)
            .flat_map(|_| [f32::NEG_INFINITY, 0.0, 0.0, 0.0])
            .collect();
        // Written in place by the kernels: fresh tensors no other tensor shares.
        let state = Tensor::from_vec(initial, (rc, 4), device)?;
        let out = Tensor::zeros((rc, 3), DType::F32, device)?;
        if rc > 0 {
            for c0 in (0..v).step_by(cols.max(1)) {
                let vc = cols.min(v - c0);
                let z = h.matmul(&weight.narrow(0, c0, vc)?.t()?)?.contiguous()?;
                let (z_at, _z) = address_of(&z, DType::F32, "fused-lm-head: the logits")?;
                let (t_at, _t) = address_of(&targets, DType::U32, "fused-lm-head: the targets")?;
                let (s_at, _s) = address_of(&state, DType::F32, "fused-lm-head: the state")?;
                let table = [z_at, t_at, s_at, rc as u64, vc as u64, c0 as u64];
                // SAFETY: z holds rc × vc f32, the targets rc u32, the state rc × 4 f32; on this
                // stream, alive (the guards and tensors) until the launch is queued.
                unsafe {
                    k::launch(
                        gpu,
                        "rlx_head_forward_chunk",
                        k::row_grid(rc),
                        k::ROW_BLOCK,
                        &table,
                    )
                }?;
            }
            let (s_at, _s) = address_of(&state, DType::F32, "fused-lm-head: the state")?;
            let (o_at, _o) = address_of(&out, DType::F32, "fused-lm-head: the result")?;
            let table = [s_at, o_at, rc as u64];
            // SAFETY: the state holds rc × 4 f32, the result rc × 3; on this stream.
            unsafe {
                k::launch(
                    gpu,
                    "rlx_head_finish",
                    k::element_grid(rc),
                    k::ELEMENT_BLOCK,
                    &table,
                )
            }?;
        }
        Ok((
            out.narrow(1, 0, 1)?,
            out.narrow(1, 1, 1)?,
            out.narrow(1, 2, 1)?,
        ))
    }

    /// ∂loss/∂z of one chunk `z: [rc, vc]` (columns `c0..`), from the rows' targets and contiguous
    /// `[rc, 1]` lse, entropy, g1 and g2.
    pub fn chunk_gradient(
        z: &Tensor,
        c0: usize,
        targets: &Tensor,
        rows: [&Tensor; 4],
    ) -> Result<Tensor> {
        let z = z.contiguous()?;
        let (rc, vc) = z.dims2()?;
        let device = z.device();
        let gpu = cuda(device)?;
        let dz = Tensor::zeros((rc, vc), DType::F32, device)?;
        if rc * vc == 0 {
            return Ok(dz);
        }
        let targets = targets.contiguous()?;
        let mut guards = Vec::new();
        let mut addresses = Vec::new();
        for (t, dtype, what) in [
            (&z, DType::F32, "the logits"),
            (&targets, DType::U32, "the targets"),
            (rows[0], DType::F32, "lse"),
            (rows[1], DType::F32, "the entropy"),
            (rows[2], DType::F32, "g1"),
            (rows[3], DType::F32, "g2"),
            (&dz, DType::F32, "∂z"),
        ] {
            if t.dim(0)? != rc {
                bail!(
                    "fused-lm-head: {what} has {} rows, the chunk {rc}",
                    t.dim(0)?
                )
            }
            let (address, guard) = address_of(t, dtype, &format!("fused-lm-head: {what}"))?;
            addresses.push(address);
            guards.push(guard);
        }
        addresses.extend([rc as u64, vc as u64, c0 as u64]);
        // SAFETY: z and dz hold rc × vc f32, the others rc values (checked above); on this stream,
        // alive while the guards are.
        unsafe {
            k::launch(
                gpu,
                "rlx_head_backward_chunk",
                k::element_grid(rc * vc),
                k::ELEMENT_BLOCK,
                &addresses,
            )
        }?;
        drop(guards);
        Ok(dz)
    }
}
