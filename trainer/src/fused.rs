//! Fused layers of the policy with their own backward pass: RMS norm, SwiGLU, the rotary embedding, and
//! the product with a frozen weight.
//!
//! Built from candle primitives, each of these is a chain of small ops (RMS norm alone is square, mean,
//! add, sqrt, divide, multiply), every one of which allocates an activation-sized tensor that autograd
//! keeps alive until the backward pass, and walks memory once more. Here each is one candle custom op
//! whose forward writes only its output, whose backward recomputes what it needs from the op's inputs
//! (which the graph holds anyway), and whose loops run over rows in parallel (rayon). Values are those of
//! the primitive versions up to the order of f32 operations; `trainer/tests/fused.rs` checks values and
//! gradients against them.
//!
//! The maths, per row x of size h (RMS norm with weight w), elementwise (SwiGLU), per head (rope):
//!
//! * RMS norm: r = 1/√(mean(x²) + ε), y = x·r·w. With g = ∂y ⊙ w:
//!   ∂x = r·g − x·r³·mean(g ⊙ x), ∂w = Σ_rows ∂y ⊙ x·r.
//! * SwiGLU: y = silu(a)·b, silu(a) = a·σ(a): ∂a = ∂y·b·σ(a)·(1 + a·(1 − σ(a))), ∂b = ∂y·a·σ(a).
//! * Rope (Hugging Face's non-interleaved halves x = [x₁, x₂], angle θ per pair):
//!   y₁ = x₁ cos θ − x₂ sin θ, y₂ = x₂ cos θ + x₁ sin θ; the backward is the rotation by −θ.
//! * Heads ([`to_heads`], [`from_heads`]): a projection's `[b, t, n, d]` to attention's `[b, n, t, d]`
//!   (rotated on the way for q and k) and back; the backward is the move the other way (rotated by −θ).
//! * A frozen weight (LoRA's base, any weight not trained): y = x·Wᵀ, ∂x = ∂y·W and nothing else. candle's
//!   own matrix product always computes both operands' gradients, so a frozen [out, in] weight would
//!   cost one more product of the forward's size per projection in every backward pass (a third of a
//!   LoRA step's backward and forward compute) and a weight-sized buffer each, only to be dropped.
//! * A trained weight: the same product, with ∂w = ∂yᵀ·x computed in the weight's own layout (candle's
//!   `x.matmul(&w.t())` gives the transpose of xᵀ·∂y, which the gradient store then copies). On the CPU
//!   all three products call `gemm` directly into an unfilled result (`product_f32`).
//!
//! On the CPU these are rayon loops (f32, any layout: inputs are made contiguous first). On a CUDA device
//! (the `cuda` feature) the same ops run the CUDA kernels of `device_kernels.cu` (their `cuda_fwd`, the
//! backward ops' too) on candle's stream, unless `RLX_GPU_LAYERS=plain` asks for the plain candle
//! versions ([`plain_rms_norm`], [`plain_swiglu`], [`plain_rope`]; `device_kernels::fused_layers`); on
//! any other device the plain versions run. The products ([`linear`]) are candle's on a GPU (cuBLAS).

use std::sync::Arc;

use candle_core::backend::BackendStorage;
use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Result, Shape, Storage, Tensor,
};
use rayon::prelude::*;

/// Rows per parallel task of the row-wise kernels (enough work per task to hide rayon's overhead).
const ROWS_PER_TASK: usize = 16;
/// Elements per parallel task of the elementwise kernels.
const ELEMS_PER_TASK: usize = 1 << 14;

/// The f32 data of a contiguous CPU storage (`what` names it in the error); the one reader of custom-op
/// arguments for the trainer's CPU kernels (`fused.rs`, `attention.rs`).
pub(crate) fn cpu_f32<'a>(what: &str, s: &'a CpuStorage, l: &Layout) -> Result<&'a [f32]> {
    let CpuStorage::F32(data) = s else {
        bail!("{what} must be f32, got {:?}", s.dtype())
    };
    match l.contiguous_offsets() {
        Some((start, end)) => Ok(&data[start..end]),
        None => bail!("{what} must be contiguous"),
    }
}

fn check_f32(op: &str, t: &Tensor) -> Result<()> {
    if t.dtype() != candle_core::DType::F32 {
        bail!("{op}: only f32 tensors are supported, got {:?}", t.dtype())
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// The plain candle versions: what each fused layer computes, in differentiable candle ops. They are the
// layers on devices without kernels of their own and under `RLX_GPU_LAYERS=plain` (on a GPU: candle's
// own kernels), and the references of the fused layers' tests.

/// [`rms_norm`] in candle ops: `x / √(mean(x²) + eps) · w`.
pub fn plain_rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let scale = (x.sqr()?.mean_keepdim(candle_core::D::Minus1)? + eps)?.sqrt()?;
    x.broadcast_div(&scale)?.broadcast_mul(w)
}

/// [`swiglu`] in candle ops: `gate · sigmoid(gate) · up`.
pub fn plain_swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    (gate * candle_nn::ops::sigmoid(gate)?)? * up
}

/// [`rope`] in candle ops: `x·cos + rotate_half(x)·sin` with the tables repeated over both halves.
pub fn plain_rope(x: &Tensor, tables: &RopeTables) -> Result<Tensor> {
    let (cos, sin) = tables.full(x.device())?;
    let half = x.dim(candle_core::D::Minus1)? / 2;
    let x1 = x.narrow(candle_core::D::Minus1, 0, half)?;
    let x2 = x.narrow(candle_core::D::Minus1, half, half)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], candle_core::D::Minus1)?;
    x.broadcast_mul(&cos)? + rotated.broadcast_mul(&sin)?
}

// ---------------------------------------------------------------------------------------------------
// RMS norm

/// `x / √(mean(x²) + eps) · w` over the last axis; x: [.., h], w: [h] (f32). The fused kernel on the CPU
/// and on a CUDA device, [`plain_rms_norm`] elsewhere or as `device_kernels::fused_layers` says.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    check_f32("rms_norm", x)?;
    check_f32("rms_norm", w)?;
    let h = x.dim(candle_core::D::Minus1)?;
    if w.dims() != [h] {
        bail!(
            "rms_norm: the weight has shape {:?}, the input's last axis is {h}",
            w.dims()
        )
    }
    if !(eps.is_finite() && eps >= 0.0) {
        bail!("rms_norm: eps = {eps} must be a finite number ≥ 0")
    }
    if !crate::device_kernels::fused_layers(x.device())? {
        return plain_rms_norm(x, w, eps);
    }
    x.contiguous()?
        .apply_op2(&w.contiguous()?, RmsNorm { eps: eps as f32 })
}

struct RmsNorm {
    eps: f32,
}

/// 1/√(mean(x²) + eps) of one row (summed in f64: rows are short and this is not the hot loop).
fn inv_rms(row: &[f32], eps: f32) -> f32 {
    let ss: f64 = row.iter().map(|&v| (v as f64) * (v as f64)).sum();
    1.0 / ((ss / row.len() as f64) as f32 + eps).sqrt()
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "rlx-rms-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = cpu_f32("rms_norm: x", s1, l1)?;
        let w = cpu_f32("rms_norm: the weight", s2, l2)?;
        let h = w.len();
        let mut y = vec![0f32; x.len()];
        if h > 0 {
            y.par_chunks_mut(h * ROWS_PER_TASK)
                .zip(x.par_chunks(h * ROWS_PER_TASK))
                .for_each(|(y, x)| {
                    for (y, x) in y.chunks_mut(h).zip(x.chunks(h)) {
                        let r = inv_rms(x, self.eps);
                        for ((y, &x), &w) in y.iter_mut().zip(x).zip(w) {
                            *y = x * r * w;
                        }
                    }
                });
        }
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use crate::device_kernels::{self as k, storage_address as at};
        let h = l2.shape().elem_count();
        let n = l1.shape().elem_count();
        let rows = n / h.max(1);
        let device = s1.device();
        let (y, out) = k::zeros(device, n)?;
        if rows > 0 && h > 0 {
            let x = at(s1, l1, "rms_norm: x")?;
            let w = at(s2, l2, "rms_norm: the weight")?;
            let table = [x, w, out, rows as u64, h as u64, k::f32_word(self.eps)];
            // SAFETY: x holds rows × h f32, w h, y rows × h (`rlx_rms_norm`'s table), on this stream.
            unsafe {
                k::launch(
                    device,
                    "rlx_rms_norm",
                    k::row_grid(rows),
                    k::ROW_BLOCK,
                    &table,
                )
            }?;
        }
        Ok((k::storage(device, y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let h = w.elem_count();
        let rows = x.elem_count() / h.max(1);
        // One pass computes ∂x ([rows, h]) and ∂w (a last row), returned stacked.
        let both = x.apply_op3_no_bwd(w, &grad.contiguous()?, &RmsNormBwd { eps: self.eps })?;
        let dx = both.narrow(0, 0, rows)?.reshape(x.shape())?;
        let dw = both.narrow(0, rows, 1)?.reshape(w.shape())?;
        Ok((Some(dx), Some(dw)))
    }
}

struct RmsNormBwd {
    eps: f32,
}

impl CustomOp3 for RmsNormBwd {
    fn name(&self) -> &'static str {
        "rlx-rms-norm-bwd"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = cpu_f32("rms_norm backward: x", s1, l1)?;
        let w = cpu_f32("rms_norm backward: the weight", s2, l2)?;
        let dy = cpu_f32("rms_norm backward: the gradient", s3, l3)?;
        let h = w.len();
        if h == 0 || x.len() != dy.len() {
            bail!("rms_norm backward: the gradient's shape differs from the input's")
        }
        let mut out = vec![0f32; x.len() + h];
        let (dx, _) = out.split_at_mut(x.len());
        // ∂x row by row in parallel; each task also sums its rows' ∂w, the partial sums added after.
        let partials: Vec<Vec<f64>> = dx
            .par_chunks_mut(h * ROWS_PER_TASK)
            .zip(x.par_chunks(h * ROWS_PER_TASK))
            .zip(dy.par_chunks(h * ROWS_PER_TASK))
            .map(|((dx, x), dy)| {
                let mut dw = vec![0f64; h];
                for ((dx, x), dy) in dx.chunks_mut(h).zip(x.chunks(h)).zip(dy.chunks(h)) {
                    let r = inv_rms(x, self.eps);
                    let mut gx = 0f64;
                    for ((&x, &dy), &w) in x.iter().zip(dy).zip(w) {
                        gx += (dy * w) as f64 * x as f64;
                    }
                    let c = (gx / h as f64) as f32 * r * r * r;
                    for (k, ((dx, &x), &dy)) in dx.iter_mut().zip(x).zip(dy).enumerate() {
                        *dx = r * dy * w[k] - x * c;
                        dw[k] += (dy * x * r) as f64;
                    }
                }
                dw
            })
            .collect();
        // The partial sums of ∂w added in f64, rounded once.
        let dw = &mut out[x.len()..];
        for (k, d) in dw.iter_mut().enumerate() {
            *d = partials.iter().map(|p| p[k]).sum::<f64>() as f32;
        }
        Ok((CpuStorage::F32(out), Shape::from((x.len() / h + 1, h))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use crate::device_kernels::{self as k, storage_address as at};
        let h = l2.shape().elem_count();
        let n = l1.shape().elem_count();
        if h == 0 || n != l3.shape().elem_count() {
            bail!("rms_norm backward: the gradient's shape differs from the input's")
        }
        let rows = n / h;
        let device = s1.device();
        let (both, out) = k::zeros(device, n + h)?;
        let (inv, inv_at) = k::zeros(device, rows)?;
        let x = at(s1, l1, "rms_norm backward: x")?;
        let w = at(s2, l2, "rms_norm backward: the weight")?;
        let dy = at(s3, l3, "rms_norm backward: the gradient")?;
        if rows > 0 {
            let eps = k::f32_word(self.eps);
            let table = [x, w, dy, out, inv_at, rows as u64, h as u64, eps];
            // SAFETY: x and dy hold rows × h f32, w h, out (rows + 1) × h, inv rows; on this stream.
            unsafe {
                k::launch(
                    device,
                    "rlx_rms_norm_bwd_rows",
                    k::row_grid(rows),
                    k::ROW_BLOCK,
                    &table,
                )
            }?;
            let table = [x, dy, inv_at, out, rows as u64, h as u64];
            // SAFETY: as above; the weight's row is the last of `out`.
            unsafe {
                k::launch(
                    device,
                    "rlx_rms_norm_bwd_weight",
                    k::element_grid(h),
                    k::ELEMENT_BLOCK,
                    &table,
                )
            }?;
        }
        drop(inv);
        Ok((k::storage(device, both), Shape::from((rows + 1, h))))
    }
}

// ---------------------------------------------------------------------------------------------------
// The product with a frozen weight

/// `x · wᵀ` for x: [n, in], w: [out, in] → [n, out]. When `w` takes no gradient (neither a variable nor
/// computed from one) the backward pass computes only ∂x = ∂y·w; else both gradients, as candle's
/// matrix product. A product of at most [`MATVEC_ROWS`] f32 rows on the CPU (decoding) runs as
/// matrix–vector products ([`matvec`]) whether the weight is trained or frozen, so that a model and
/// its no-grad view decode bit for bit alike; more rows take candle's product (gemm). Any dtype and
/// device candle's product takes on the trained path; the custom ops run on the CPU (their `cuda_fwd`
/// belongs to the GPU trainer).
pub fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    if !x.device().is_cpu() {
        return x.matmul(&w.t()?);
    }
    let (n, inp) = x.dims2()?;
    let (out, w_in) = w.dims2()?;
    if inp != w_in {
        bail!(
            "linear: x {:?} and weight {:?} disagree on the input size",
            x.dims(),
            w.dims()
        )
    }
    if x.dtype() != w.dtype() {
        bail!(
            "linear: x is {:?} but the weight is {:?}",
            x.dtype(),
            w.dtype()
        )
    }
    let bmnk = (1, n, out, inp);
    if w.is_variable() || w.track_op() {
        return x
            .contiguous()?
            .apply_op2(&w.contiguous()?, TrackedLinear { bmnk });
    }
    x.contiguous()?.apply_op1(FrozenLinear {
        w: w.detach(),
        bmnk,
    })
}

/// `x · wᵀ` on the CPU: [`matvec`] for at most [`MATVEC_ROWS`] contiguous f32 rows, else candle's product.
fn cpu_product(
    x: &CpuStorage,
    xl: &Layout,
    w: &CpuStorage,
    wl: &Layout,
    bmnk: (usize, usize, usize, usize),
) -> Result<(CpuStorage, Shape)> {
    let (_, n, out, inp) = bmnk;
    let f32s = matches!((x, w), (CpuStorage::F32(_), CpuStorage::F32(_)));
    if n <= MATVEC_ROWS && f32s && xl.is_contiguous() && wl.is_contiguous() {
        let x = cpu_f32("linear: x", x, xl)?;
        let w = cpu_f32("linear: the weight", w, wl)?;
        let y = matvec(x, w, n, out, inp);
        return Ok((CpuStorage::F32(y), Shape::from((n, out))));
    }
    if f32s && xl.is_contiguous() && wl.is_contiguous() {
        let x = cpu_f32("linear: x", x, xl)?;
        let w = cpu_f32("linear: the weight", w, wl)?;
        // wᵀ: w's rows read as columns.
        let y = product_f32((n, out, inp), (x, inp, 1), (w, 1, inp));
        return Ok((CpuStorage::F32(y), Shape::from((n, out))));
    }
    // wᵀ as a strided view of w: the layout candle's own `x.matmul(&w.t())` hands the kernel.
    let y = x.matmul(w, bmnk, xl, &wl.transpose(0, 1)?)?;
    Ok((y, Shape::from((n, out))))
}

/// An f32 matrix given by its elements and its row and column strides (in elements).
type Strided<'a> = (&'a [f32], usize, usize);

/// `a · b` for a: [m, k] and b: [k, n] into a new row-major [m, n]: the `gemm` crate's product, as
/// candle calls it (the same kernels, over rayon's threads), except that the result is not first
/// filled with zeros, which gemm does not read when `read_dst` is false. candle's zeroed result cost
/// a memset of every product's output, about 2 % of a training step (docs/performance.md, item 17).
fn product_f32(
    (m, n, k): (usize, usize, usize),
    (a, a_rs, a_cs): Strided<'_>,
    (b, b_rs, b_cs): Strided<'_>,
) -> Vec<f32> {
    let reach = |rows: usize, cols: usize, rs: usize, cs: usize| {
        if rows == 0 || cols == 0 {
            0
        } else {
            (rows - 1) * rs + (cols - 1) * cs + 1
        }
    };
    assert!(
        a.len() >= reach(m, k, a_rs, a_cs) && b.len() >= reach(k, n, b_rs, b_cs),
        "product_f32: an operand is shorter than its shape and strides"
    );
    if k == 0 || m == 0 || n == 0 {
        return vec![0f32; m * n];
    }
    let threads = candle_core::utils::get_num_threads();
    let parallelism = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    let mut y: Vec<f32> = Vec::with_capacity(m * n);
    // SAFETY: the operands hold every element their shapes and strides reach (asserted above); the
    // destination has room for m·n elements, which gemm writes all of (row-major strides n, 1)
    // without reading any (`read_dst` false), so they are initialised when the length is set.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            y.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            a_cs as isize,
            a_rs as isize,
            b.as_ptr(),
            b_cs as isize,
            b_rs as isize,
            0f32,
            1f32,
            false,
            false,
            false,
            parallelism,
        );
        y.set_len(m * n);
    }
    y
}

/// `∂x = ∂y·w` and, when `weight_grad`, `∂w = ∂yᵀ·x` of `y = x·wᵀ` (x: [n, in], w: [out, in], ∂y:
/// [n, out]): by [`product_f32`] for contiguous f32 tensors on the CPU, else candle's products.
fn linear_grads(
    x: &Tensor,
    w: &Tensor,
    dy: &Tensor,
    weight_grad: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let direct = [x, w, dy]
        .iter()
        .all(|t| t.device().is_cpu() && t.dtype() == candle_core::DType::F32 && t.is_contiguous());
    if !direct {
        let dw = if weight_grad {
            Some(dy.t()?.matmul(x)?)
        } else {
            None
        };
        return Ok((dy.matmul(w)?, dw));
    }
    let (n, inp) = x.dims2()?;
    let (out, w_in) = w.dims2()?;
    if w_in != inp || dy.dims2()? != (n, out) {
        bail!(
            "linear: the gradient {:?} does not fit x {:?} and the weight {:?}",
            dy.dims(),
            x.dims(),
            w.dims()
        )
    }
    let (xs, xl) = x.storage_and_layout();
    let (ws, wl) = w.storage_and_layout();
    let (gs, gl) = dy.storage_and_layout();
    let (Storage::Cpu(xs), Storage::Cpu(ws), Storage::Cpu(gs)) = (&*xs, &*ws, &*gs) else {
        bail!("linear: the gradient's operands are not on the CPU")
    };
    let xv = cpu_f32("linear: x", xs, xl)?;
    let wv = cpu_f32("linear: the weight", ws, wl)?;
    let gv = cpu_f32("linear: the gradient", gs, gl)?;
    let dx = product_f32((n, inp, out), (gv, out, 1), (wv, inp, 1));
    let dx = Tensor::from_vec(dx, (n, inp), x.device())?;
    let dw = if weight_grad {
        // ∂yᵀ: ∂y's columns read as rows.
        let dw = product_f32((out, inp, n), (gv, 1, out), (xv, inp, 1));
        Some(Tensor::from_vec(dw, (out, inp), w.device())?)
    } else {
        None
    };
    Ok((dx, dw))
}

struct FrozenLinear {
    w: Tensor,
    bmnk: (usize, usize, usize, usize),
}

impl CustomOp1 for FrozenLinear {
    fn name(&self) -> &'static str {
        "frozen-linear"
    }

    fn cpu_fwd(&self, x: &CpuStorage, xl: &Layout) -> Result<(CpuStorage, Shape)> {
        let (storage, wl) = self.w.storage_and_layout();
        let Storage::Cpu(w) = &*storage else {
            bail!("linear: the weight is not on the CPU")
        };
        cpu_product(x, xl, w, wl, self.bmnk)
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(linear_grads(x, &self.w, dy, false)?.0))
    }
}

/// Rows times a trained weight: the forward [`cpu_product`] (by [`matvec`] for a few rows), the
/// backward candle's products ∂x = ∂y·w and ∂w = ∂yᵀ·x, each written in its own layout. candle's
/// `x.matmul(&w.t())` computes ∂(wᵀ) = xᵀ·∂y instead and hands back its transpose, a strided view
/// that the gradient store then copies into a contiguous weight-sized buffer: one transposing copy of
/// every trained weight per backward pass (docs/performance.md, item 17).
struct TrackedLinear {
    bmnk: (usize, usize, usize, usize),
}

impl CustomOp2 for TrackedLinear {
    fn name(&self) -> &'static str {
        "tracked-linear"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        xl: &Layout,
        w: &CpuStorage,
        wl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        cpu_product(x, xl, w, wl, self.bmnk)
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dx, dw) = linear_grads(x, w, dy, true)?;
        Ok((Some(dx), dw))
    }
}

/// Rows at or below which a product runs as matrix–vector products ([`matvec`]): decoding a batch of
/// rows, where the time is reading the weight from memory once per step. candle's product of one row is
/// gemm's matrix–vector kernel, on one thread, and of a few dozen rows its blocked kernel, which packs
/// the whole weight again at every call (with gemm's AVX-512 kernels that made 16- and 64-row decoding
/// steps slower than AVX2's: docs/performance.md, item 13); above this the blocked kernel, which reuses
/// each packed weight block for many rows, is the faster.
pub const MATVEC_ROWS: usize = 32;

/// Weight rows (outputs) per parallel task of [`matvec`]: small enough that a one-row product of a
/// few hundred outputs (k and v of a decoding step) still splits evenly over the threads.
const MATVEC_OUTPUTS_PER_TASK: usize = 16;

/// Input rows that [`matvec`] takes through one weight row at a time (one load of the weight for
/// this many products).
const MATVEC_BLOCK: usize = 4;

/// `y = x · wᵀ` for x: [n, inp] and w: [out, inp] (row-major, f32), as matrix–vector products that
/// read each weight row once (from memory) for all `n` rows, [`MATVEC_BLOCK`] rows at a time, the
/// outputs split over rayon's threads. Each output is one dot product summed in a fixed order
/// ([`dot_rows`]: the same for every row, whatever `n`, the row's place in its block and the number
/// of threads).
pub fn matvec(x: &[f32], w: &[f32], n: usize, out: usize, inp: usize) -> Vec<f32> {
    matvec_many(x, &[(w, out)], n, inp)
        .pop()
        .expect("one product per weight")
}

/// [`matvec`] of the same rows `x` ([n, inp]) with each weight `(w, out)` of `ws` ([out, inp]), all
/// in one parallel loop (a decoding step's q, k and v, or gate and up: one start of the threads
/// instead of one per weight, and the tasks of all the weights to share between them). Each product
/// is bit for bit the one [`matvec`] computes alone.
pub fn matvec_many(x: &[f32], ws: &[(&[f32], usize)], n: usize, inp: usize) -> Vec<Vec<f32>> {
    debug_assert_eq!(x.len(), n * inp);
    // Output-major (yᵀ), so that each task owns one contiguous slice; transposed at the end for n > 1.
    let mut yts: Vec<Vec<f32>> = ws.iter().map(|&(_, out)| vec![0f32; out * n]).collect();
    if inp > 0 {
        let rows: Vec<&[f32]> = x.chunks(inp).collect();
        let mut tasks: Vec<(&mut [f32], &[f32])> = Vec::new();
        for (yt, &(w, out)) in yts.iter_mut().zip(ws) {
            debug_assert_eq!(w.len(), out * inp);
            tasks.extend(
                yt.chunks_mut(MATVEC_OUTPUTS_PER_TASK * n.max(1))
                    .zip(w.chunks(MATVEC_OUTPUTS_PER_TASK * inp)),
            );
        }
        tasks.into_par_iter().for_each(|(ys, ws)| {
            for (ys, wr) in ys.chunks_mut(n).zip(ws.chunks(inp)) {
                let mut blocks = rows.chunks_exact(MATVEC_BLOCK);
                let mut ys_blocks = ys.chunks_exact_mut(MATVEC_BLOCK);
                for (xs, ys) in (&mut blocks).zip(&mut ys_blocks) {
                    let xs: &[&[f32]; MATVEC_BLOCK] = xs.try_into().expect("a full block");
                    ys.copy_from_slice(&dot_rows(xs, wr));
                }
                for (xr, y) in blocks.remainder().iter().zip(ys_blocks.into_remainder()) {
                    *y = dot_rows(&[*xr], wr)[0];
                }
            }
        });
    }
    yts.into_iter()
        .zip(ws)
        .map(|(yt, &(_, out))| {
            if n <= 1 {
                return yt;
            }
            let mut y = vec![0f32; n * out];
            for (j, ys) in yt.chunks(n).enumerate() {
                for (r, v) in ys.iter().enumerate() {
                    y[r * out + j] = *v;
                }
            }
            y
        })
        .collect()
}

/// `x · wᵀ` for each weight of `ws` (x: [n, in], each w: [out_i, in]), each product the one
/// [`linear`] computes. When nothing takes a gradient (a decoding step of a no-grad model) and the
/// rows are few enough for [`matvec`] (f32, contiguous, on the CPU), the products run in one parallel
/// loop ([`matvec_many`]); otherwise one [`linear`] each.
pub fn linears(x: &Tensor, ws: &[&Tensor]) -> Result<Vec<Tensor>> {
    if let Some(ys) = few_rows_untracked(x, ws)? {
        let (n, _) = x.dims2()?;
        return ys
            .into_iter()
            .map(|y| {
                let out = y.len() / n.max(1);
                Tensor::from_vec(y, (n, out), x.device())
            })
            .collect();
    }
    ws.iter().map(|w| linear(x, w)).collect()
}

/// `swiglu(x · gateᵀ, x · upᵀ)` (x: [n, in], gate and up: [out, in]): the values of [`linear`] twice
/// and [`swiglu`], the two products in one parallel loop when [`linears`] would take it, and the
/// activation computed on the way out (no separate pass).
pub fn linear_swiglu(x: &Tensor, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if let Some(ys) = few_rows_untracked(x, &[gate, up])? {
        let (n, _) = x.dims2()?;
        let [a, b]: [Vec<f32>; 2] = ys.try_into().expect("two products");
        let out = a.len() / n.max(1);
        let y: Vec<f32> = a
            .iter()
            .zip(&b)
            .map(|(&a, &b)| a * sigmoid(a) * b)
            .collect();
        return Tensor::from_vec(y, (n, out), x.device());
    }
    swiglu(&linear(x, gate)?, &linear(x, up)?)
}

/// The products of [`linears`] by [`matvec_many`] when that path applies (see there), else `None`.
fn few_rows_untracked(x: &Tensor, ws: &[&Tensor]) -> Result<Option<Vec<Vec<f32>>>> {
    let untracked = |t: &Tensor| !t.is_variable() && !t.track_op();
    let f32_cpu = |t: &Tensor| {
        t.device().is_cpu() && t.dtype() == candle_core::DType::F32 && t.is_contiguous()
    };
    let Ok((n, inp)) = x.dims2() else {
        return Ok(None);
    };
    let fits = |w: &&Tensor| matches!(w.dims2(), Ok((_, i)) if i == inp);
    if n > MATVEC_ROWS
        || !untracked(x)
        || !f32_cpu(x)
        || !ws.iter().all(|w| untracked(w) && f32_cpu(w) && fits(w))
    {
        return Ok(None);
    }
    let (xs, xl) = x.storage_and_layout();
    let Storage::Cpu(xs) = &*xs else {
        return Ok(None);
    };
    let xv = cpu_f32("linear: x", xs, xl)?;
    let guards: Vec<_> = ws.iter().map(|w| w.storage_and_layout()).collect();
    let mut weights = Vec::with_capacity(ws.len());
    for (w, (storage, layout)) in ws.iter().zip(&guards) {
        let Storage::Cpu(storage) = &**storage else {
            return Ok(None);
        };
        weights.push((cpu_f32("linear: the weight", storage, layout)?, w.dim(0)?));
    }
    Ok(Some(matvec_many(xv, &weights, n, inp)))
}

/// `Σ_k x_r[k]·w[k]` for each of the R rows `xs` (each at least as long as `w`): with AVX2 and FMA
/// (detected at run time) in two 8-wide accumulators per row, else in 16 scalar lanes. Each row's sum
/// is the same whatever R: a row's result does not depend on the rows beside it.
fn dot_rows<const R: usize>(xs: &[&[f32]; R], w: &[f32]) -> [f32; R] {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the features the function is compiled for were detected on this CPU.
            return unsafe { dot_rows_avx2(xs, w) };
        }
    }
    std::array::from_fn(|r| dot_lanes(xs[r], w))
}

/// `Σ a_k b_k` in 16 independent scalar lanes, then [`finish_dot`] (the dot product without AVX2).
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 16;
    let n = a.len().min(b.len());
    let body = n / LANES * LANES;
    let mut acc = [0f32; LANES];
    for (x, y) in a[..body]
        .chunks_exact(LANES)
        .zip(b[..body].chunks_exact(LANES))
    {
        for i in 0..LANES {
            acc[i] += x[i] * y[i];
        }
    }
    finish_dot(&mut acc, &a[body..n], &b[body..n])
}

/// The end of a dot product: the lane sums `acc` (a power of two of them) added pairwise, then the
/// remaining products `Σ a_k b_k` in order.
fn finish_dot(acc: &mut [f32], a: &[f32], b: &[f32]) -> f32 {
    let mut width = acc.len();
    while width > 1 {
        width /= 2;
        for i in 0..width {
            acc[i] += acc[i + width];
        }
    }
    let mut sum = acc[0];
    for (x, y) in a.iter().zip(b) {
        sum += x * y;
    }
    sum
}

/// [`dot_rows`] with AVX2 and FMA: 16 products of each row per iteration into two independent
/// accumulators of that row, the 8 lanes of the weight loaded once for all R rows, then
/// [`finish_dot`] on each row's two accumulators added. With R = 4 the eight accumulators and the
/// weight's two vectors fit the sixteen registers, and the loop reads 2 + 2R vectors per 2R
/// multiply–adds instead of two per one.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_rows_avx2<const R: usize>(xs: &[&[f32]; R], w: &[f32]) -> [f32; R] {
    use std::arch::x86_64::*;
    const STEP: usize = 16;
    let n = w.len();
    assert!(
        xs.iter().all(|x| x.len() >= n),
        "dot_rows: a row shorter than the weight"
    );
    let body = n / STEP * STEP;
    let pw = w.as_ptr();
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    let mut k = 0;
    while k < body {
        // SAFETY: k + 16 <= body <= n, within `w` and (asserted above) within every row; unaligned loads.
        let (w0, w1) = unsafe { (_mm256_loadu_ps(pw.add(k)), _mm256_loadu_ps(pw.add(k + 8))) };
        for (acc, x) in acc.iter_mut().zip(xs) {
            let px = x.as_ptr();
            // SAFETY: as above.
            let (x0, x1) = unsafe { (_mm256_loadu_ps(px.add(k)), _mm256_loadu_ps(px.add(k + 8))) };
            acc[0] = _mm256_fmadd_ps(x0, w0, acc[0]);
            acc[1] = _mm256_fmadd_ps(x1, w1, acc[1]);
        }
        k += STEP;
    }
    std::array::from_fn(|r| {
        let mut lanes = [0f32; 8];
        // SAFETY: `lanes` holds 8 f32.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), _mm256_add_ps(acc[r][0], acc[r][1])) };
        finish_dot(&mut lanes, &xs[r][body..n], &w[body..n])
    })
}

// ---------------------------------------------------------------------------------------------------
// SwiGLU

/// `silu(gate) · up` elementwise (same shapes, f32). The fused kernel on the CPU and on a CUDA
/// device, [`plain_swiglu`] elsewhere or as `device_kernels::fused_layers` says.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    check_f32("swiglu", gate)?;
    check_f32("swiglu", up)?;
    if gate.shape() != up.shape() {
        bail!(
            "swiglu: gate {:?} and up {:?} differ in shape",
            gate.dims(),
            up.dims()
        )
    }
    if !crate::device_kernels::fused_layers(gate.device())? {
        return plain_swiglu(gate, up);
    }
    gate.contiguous()?.apply_op2(&up.contiguous()?, SwiGlu)
}

struct SwiGlu;

fn sigmoid(a: f32) -> f32 {
    1.0 / (1.0 + (-a).exp())
}

impl CustomOp2 for SwiGlu {
    fn name(&self) -> &'static str {
        "rlx-swiglu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let a = cpu_f32("swiglu: gate", s1, l1)?;
        let b = cpu_f32("swiglu: up", s2, l2)?;
        let mut y = vec![0f32; a.len()];
        y.par_chunks_mut(ELEMS_PER_TASK)
            .zip(
                a.par_chunks(ELEMS_PER_TASK)
                    .zip(b.par_chunks(ELEMS_PER_TASK)),
            )
            .for_each(|(y, (a, b))| {
                for ((y, &a), &b) in y.iter_mut().zip(a).zip(b) {
                    *y = a * sigmoid(a) * b;
                }
            });
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use crate::device_kernels::{self as k, storage_address as at};
        let n = l1.shape().elem_count();
        if l2.shape().elem_count() != n {
            bail!("swiglu: gate and up differ in size")
        }
        let device = s1.device();
        let (y, out) = k::zeros(device, n)?;
        if n > 0 {
            let table = [
                at(s1, l1, "swiglu: gate")?,
                at(s2, l2, "swiglu: up")?,
                out,
                n as u64,
            ];
            // SAFETY: the three buffers hold n f32 each, on this stream.
            unsafe {
                k::launch(
                    device,
                    "rlx_swiglu",
                    k::element_grid(n),
                    k::ELEMENT_BLOCK,
                    &table,
                )
            }?;
        }
        Ok((k::storage(device, y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        gate: &Tensor,
        up: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let n = gate.elem_count();
        let both = gate.apply_op3_no_bwd(up, &grad.contiguous()?, &SwiGluBwd)?;
        let da = both.narrow(0, 0, n)?.reshape(gate.shape())?;
        let db = both.narrow(0, n, n)?.reshape(up.shape())?;
        Ok((Some(da), Some(db)))
    }
}

struct SwiGluBwd;

impl CustomOp3 for SwiGluBwd {
    fn name(&self) -> &'static str {
        "rlx-swiglu-bwd"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let a = cpu_f32("swiglu backward: gate", s1, l1)?;
        let b = cpu_f32("swiglu backward: up", s2, l2)?;
        let dy = cpu_f32("swiglu backward: the gradient", s3, l3)?;
        let n = a.len();
        if dy.len() != n {
            bail!("swiglu backward: the gradient's shape differs from the input's")
        }
        let mut out = vec![0f32; 2 * n];
        let (da, db) = out.split_at_mut(n);
        da.par_chunks_mut(ELEMS_PER_TASK)
            .zip(db.par_chunks_mut(ELEMS_PER_TASK))
            .zip(a.par_chunks(ELEMS_PER_TASK))
            .zip(
                b.par_chunks(ELEMS_PER_TASK)
                    .zip(dy.par_chunks(ELEMS_PER_TASK)),
            )
            .for_each(|(((da, db), a), (b, dy))| {
                for k in 0..a.len() {
                    let s = sigmoid(a[k]);
                    da[k] = dy[k] * b[k] * s * (1.0 + a[k] * (1.0 - s));
                    db[k] = dy[k] * a[k] * s;
                }
            });
        Ok((CpuStorage::F32(out), Shape::from(2 * n)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use crate::device_kernels::{self as k, storage_address as at};
        let n = l1.shape().elem_count();
        if l3.shape().elem_count() != n || l2.shape().elem_count() != n {
            bail!("swiglu backward: the gradient's shape differs from the input's")
        }
        let device = s1.device();
        let (both, out) = k::zeros(device, 2 * n)?;
        if n > 0 {
            let table = [
                at(s1, l1, "swiglu backward: gate")?,
                at(s2, l2, "swiglu backward: up")?,
                at(s3, l3, "swiglu backward: the gradient")?,
                out,
                n as u64,
            ];
            // SAFETY: gate, up and the gradient hold n f32, out 2n; on this stream.
            unsafe {
                k::launch(
                    device,
                    "rlx_swiglu_bwd",
                    k::element_grid(n),
                    k::ELEMENT_BLOCK,
                    &table,
                )
            }?;
        }
        Ok((k::storage(device, both), Shape::from(2 * n)))
    }
}

// ---------------------------------------------------------------------------------------------------
// Rotary embedding

/// Rotary tables for positions `offset..offset + t`: cos and sin of `p · inv_freq[i]`, `[t, d/2]` each
/// (computed in f64, stored in f32).
#[derive(Clone)]
pub struct RopeTables {
    cos: Arc<Vec<f32>>,
    sin: Arc<Vec<f32>>,
    t: usize,
    half: usize,
}

impl RopeTables {
    pub fn new(inv_freq: &[f64], offset: usize, t: usize) -> RopeTables {
        let half = inv_freq.len();
        let mut cos = Vec::with_capacity(t * half);
        let mut sin = Vec::with_capacity(t * half);
        for p in offset..offset + t {
            for freq in inv_freq {
                let angle = p as f64 * freq;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        RopeTables {
            cos: Arc::new(cos),
            sin: Arc::new(sin),
            t,
            half,
        }
    }

    /// cos θ of position `p` (from the tables' first), pair `i`: `[t, half]` row-major.
    pub fn cos(&self) -> &[f32] {
        &self.cos
    }

    /// sin θ, as [`RopeTables::cos`].
    pub fn sin(&self) -> &[f32] {
        &self.sin
    }

    /// Positions and pairs per row: the tables are `[t, half]`.
    pub fn dims(&self) -> (usize, usize) {
        (self.t, self.half)
    }

    /// `y` = the row `x` of d = 2·half values at position `p` rotated by `sign`·θ (the halves
    /// [x₁, x₂]: y₁ = x₁ cos − x₂ sin, y₂ = x₂ cos + x₁ sin).
    fn rotate(&self, y: &mut [f32], x: &[f32], p: usize, sign: f32) {
        let half = self.half;
        let cos = &self.cos[p * half..(p + 1) * half];
        let sin = &self.sin[p * half..(p + 1) * half];
        let (x1, x2) = x.split_at(half);
        let (y1, y2) = y.split_at_mut(half);
        for i in 0..half {
            let s = sign * sin[i];
            y1[i] = x1[i] * cos[i] - x2[i] * s;
            y2[i] = x2[i] * cos[i] + x1[i] * s;
        }
    }

    /// The tables as `[t, d]` tensors with the halves repeated (the layout of the primitive version:
    /// `x·cos + rotate_half(x)·sin`), for tests and references.
    pub fn full(&self, device: &candle_core::Device) -> Result<(Tensor, Tensor)> {
        let widen = |v: &[f32]| -> Vec<f32> {
            v.chunks(self.half.max(1))
                .flat_map(|row| row.iter().chain(row.iter()).copied())
                .collect()
        };
        Ok((
            Tensor::from_vec(widen(&self.cos), (self.t, 2 * self.half), device)?,
            Tensor::from_vec(widen(&self.sin), (self.t, 2 * self.half), device)?,
        ))
    }
}

/// The rotary embedding of `x: [.., t, d]` (d = 2 · the tables' half, t their positions), f32. The fused
/// kernel on the CPU and on a CUDA device, [`plain_rope`] elsewhere or as
/// `device_kernels::fused_layers` says.
pub fn rope(x: &Tensor, tables: &RopeTables) -> Result<Tensor> {
    check_f32("rope", x)?;
    let dims = x.dims();
    if dims.len() < 2 || dims[dims.len() - 1] != 2 * tables.half || dims[dims.len() - 2] != tables.t
    {
        bail!(
            "rope: the input has shape {dims:?}, the tables are for [.., {}, {}]",
            tables.t,
            2 * tables.half
        )
    }
    if !crate::device_kernels::fused_layers(x.device())? {
        return plain_rope(x, tables);
    }
    x.contiguous()?.apply_op1(Rope {
        tables: tables.clone(),
        inverse: false,
    })
}

struct Rope {
    tables: RopeTables,
    /// Rotate by −θ (the backward pass).
    inverse: bool,
}

impl CustomOp1 for Rope {
    fn name(&self) -> &'static str {
        "rlx-rope"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = cpu_f32("rope: input", s, l)?;
        let (t, half) = (self.tables.t, self.tables.half);
        let d = 2 * half;
        let sign = if self.inverse { -1f32 } else { 1f32 };
        let mut y = vec![0f32; x.len()];
        if d > 0 && t > 0 {
            // One task per [t, d] block (a head of a row).
            y.par_chunks_mut(t * d)
                .zip(x.par_chunks(t * d))
                .for_each(|(y, x)| {
                    for p in 0..t {
                        let rows = p * d..(p + 1) * d;
                        self.tables.rotate(&mut y[rows.clone()], &x[rows], p, sign);
                    }
                });
        }
        Ok((CpuStorage::F32(y), l.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (t, half) = (self.tables.t, self.tables.half);
        let rows = l.shape().elem_count() / (t * 2 * half).max(1);
        let y = gpu_heads(
            s,
            l,
            (rows, t, 1, 2 * half),
            Some(&self.tables),
            0,
            self.inverse,
        )?;
        Ok((y, l.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let dx = grad.contiguous()?.apply_op1_no_bwd(&Rope {
            tables: self.tables.clone(),
            inverse: !self.inverse,
        })?;
        Ok(Some(dx))
    }
}

// ---------------------------------------------------------------------------------------------------
// Heads: a projection's positions to per-head blocks and back, with the rotary embedding on the way

/// `x: [b, t, n, d]` (a projection's output: n heads per position) → `[b, n, t, d]` (the per-head blocks
/// attention reads), each head's positions rotated by `tables` when given: the split into heads and the
/// rotary embedding as one parallel pass, where `x.transpose(1, 2).contiguous()` then [`rope`] made two
/// (the first a strided copy on one thread). Values are exactly those of the two ops. Where the layers are plain:
/// those two ops.
pub fn to_heads(x: &Tensor, tables: Option<&RopeTables>) -> Result<Tensor> {
    heads_op(x, tables, true)
}

/// `x: [b, n, t, d]` (attention's per-head output) → `[b, t, n, d]`, back to positions: one parallel pass
/// instead of `x.transpose(1, 2).contiguous()`. Where the layers are plain: that.
pub fn from_heads(x: &Tensor) -> Result<Tensor> {
    heads_op(x, None, false)
}

fn heads_op(x: &Tensor, tables: Option<&RopeTables>, to_heads: bool) -> Result<Tensor> {
    let what = if to_heads { "to_heads" } else { "from_heads" };
    check_f32(what, x)?;
    let (b, t1, t2, d) = x.dims4()?;
    // Positions are axis 1 going to heads, axis 2 coming back.
    let (t, n) = if to_heads { (t1, t2) } else { (t2, t1) };
    if let Some(tables) = tables {
        if d != 2 * tables.half || t != tables.t {
            bail!(
                "{what}: the input has shape {:?}, the tables are for {} positions of {}",
                x.dims(),
                tables.t,
                2 * tables.half
            )
        }
    }
    if !crate::device_kernels::fused_layers(x.device())? {
        let y = x.transpose(1, 2)?.contiguous()?;
        return match tables {
            Some(tables) => plain_rope(&y, tables),
            None => Ok(y),
        };
    }
    x.contiguous()?.apply_op1(Heads {
        dims: (b, t, n, d),
        tables: tables.cloned(),
        inverse: false,
        to_heads,
    })
}

/// [`to_heads`] / [`from_heads`]; the backward pass is the other direction with the inverse rotation.
struct Heads {
    /// Batch rows, positions, heads, head size.
    dims: (usize, usize, usize, usize),
    tables: Option<RopeTables>,
    /// Rotate by −θ (the backward pass of a rotation).
    inverse: bool,
    /// `[b, t, n, d]` → `[b, n, t, d]`; else the reverse.
    to_heads: bool,
}

impl CustomOp1 for Heads {
    fn name(&self) -> &'static str {
        "rlx-heads"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = cpu_f32("heads: input", s, l)?;
        let (b, t, n, d) = self.dims;
        let sign = if self.inverse { -1f32 } else { 1f32 };
        // One row of d values, rotated as at position p when there are tables.
        let put = |y: &mut [f32], x: &[f32], p: usize| match &self.tables {
            Some(tables) => tables.rotate(y, x, p, sign),
            None => y.copy_from_slice(x),
        };
        let mut y = vec![0f32; x.len()];
        if d > 0 && t > 0 && n > 0 {
            if self.to_heads {
                // One task per output block [t, d] (a head of a batch row): reads strided, writes whole.
                y.par_chunks_mut(t * d).enumerate().for_each(|(k, y)| {
                    let (row, head) = (k / n, k % n);
                    for p in 0..t {
                        let src = ((row * t + p) * n + head) * d;
                        put(&mut y[p * d..(p + 1) * d], &x[src..src + d], p);
                    }
                });
            } else {
                // One task per output block [n, d] (a position of a batch row).
                y.par_chunks_mut(n * d).enumerate().for_each(|(k, y)| {
                    let (row, p) = (k / t, k % t);
                    for head in 0..n {
                        let src = ((row * n + head) * t + p) * d;
                        put(&mut y[head * d..(head + 1) * d], &x[src..src + d], p);
                    }
                });
            }
        }
        let shape = if self.to_heads {
            Shape::from((b, n, t, d))
        } else {
            Shape::from((b, t, n, d))
        };
        Ok((CpuStorage::F32(y), shape))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (b, t, n, d) = self.dims;
        let mode = if self.to_heads { 1 } else { 2 };
        let y = gpu_heads(s, l, self.dims, self.tables.as_ref(), mode, self.inverse)?;
        let shape = if self.to_heads {
            Shape::from((b, n, t, d))
        } else {
            Shape::from((b, t, n, d))
        };
        Ok((y, shape))
    }

    fn bwd(&self, _x: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let dx = grad.contiguous()?.apply_op1_no_bwd(&Heads {
            dims: self.dims,
            tables: self.tables.clone(),
            inverse: !self.inverse,
            to_heads: !self.to_heads,
        })?;
        Ok(Some(dx))
    }
}

/// `rlx_heads` (`device_kernels.cu`) on a CUDA storage: `dims` = (b, t, n, d) of the move (`mode` 0:
/// rope on [b, t, d] rows with n = 1; 1: to_heads; 2: from_heads), rotated by the tables (by −θ when
/// `inverse`) if any.
#[cfg(feature = "cuda")]
fn gpu_heads(
    s: &candle_core::CudaStorage,
    l: &Layout,
    (b, t, n, d): (usize, usize, usize, usize),
    tables: Option<&RopeTables>,
    mode: u64,
    inverse: bool,
) -> Result<candle_core::CudaStorage> {
    use crate::device_kernels::{self as k, storage_address as at};
    let total = l.shape().elem_count();
    if b * t * n * d != total {
        bail!("heads: {total} values for [{b}, {t}, {n}, {d}]")
    }
    let device = s.device();
    let (y, out) = k::zeros(device, total)?;
    if total == 0 {
        return Ok(k::storage(device, y));
    }
    // The tables on the device for this launch (t × d/2 values each).
    let uploaded = match tables {
        Some(tables) => Some((
            device.clone_htod(tables.cos.as_slice())?,
            device.clone_htod(tables.sin.as_slice())?,
        )),
        None => None,
    };
    let stream = device.cuda_stream();
    let (cos, sin) = match &uploaded {
        Some((cos, sin)) => {
            use candle_core::cuda_backend::cudarc::driver::DevicePtr;
            (cos.device_ptr(&stream).0, sin.device_ptr(&stream).0)
        }
        None => (0, 0),
    };
    let sign = if inverse { -1f32 } else { 1f32 };
    let table = [
        at(s, l, "heads: input")?,
        out,
        cos,
        sin,
        b as u64,
        t as u64,
        n as u64,
        d as u64,
        mode,
        k::f32_word(sign),
    ];
    // SAFETY: the input and `y` hold b·t·n·d f32, the tables t × d/2 each (checked by the callers
    // against the tables' dims); on this stream, the tables freed after the launch in stream order.
    unsafe {
        k::launch(
            device,
            "rlx_heads",
            k::element_grid(total),
            k::ELEMENT_BLOCK,
            &table,
        )
    }?;
    drop(uploaded);
    Ok(k::storage(device, y))
}
