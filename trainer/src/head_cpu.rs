//! The fused LM head on the CPU in f32 (`head.rs` calls [`forward`] and [`backward`] for f32 tensors on
//! the CPU; other dtypes and devices run the same formulas as candle ops). A chunk is `[rows, cols]`
//! logits z of the vocabulary columns `c0 .. c0 + cols`, written by gemm into a fresh buffer without a
//! zero fill (`fused::product_f32`); its elementwise work is one parallel pass over its rows each way
//! (candle's ops made half a dozen passes, the row reductions of them on one thread). The backward
//! overwrites the logits with ∂z in place and writes ∂weight's chunks one after the other into one
//! buffer and ∂hidden by gemm's accumulation, so no gradient is zero-filled, copied or added; with
//! `keep` the forward's logits serve the backward, which then skips one of the head's four products.
//!
//! Per row, the forward keeps the running max m, s = Σ exp(z − m) and u = Σ exp(z − m)·(z − m) and the
//! target's logit, as `head.rs` documents; the backward writes
//! ∂z = g1·1[j = t] − p·(g1 + g2·(log p + H)) with log p = z − lse, p = exp(log p).

use candle_core::{bail, DType, Device, Result, Storage, Tensor};
use rayon::prelude::*;

/// Whether `t` takes the CPU path: f32 on the CPU.
pub fn applies(t: &Tensor) -> bool {
    t.dtype() == DType::F32 && t.device().is_cpu()
}

/// Whether the head of `n` rows over a vocabulary of `v` on `hidden` runs here ([`forward`],
/// [`backward`]): f32 on the CPU, the fused layers not switched off, neither side empty.
pub(crate) fn takes(hidden: &Tensor, n: usize, v: usize) -> Result<bool> {
    Ok(n > 0 && v > 0 && applies(hidden) && crate::device_kernels::fused_layers(hidden.device())?)
}

/// Runs `f` on the f32 values of the rows `h` and the weight `w` (copied first where not contiguous).
pub(crate) fn with_rows_and_weight<R>(
    h: &Tensor,
    w: &Tensor,
    f: impl FnOnce(&[f32], &[f32]) -> R,
) -> Result<R> {
    let (h, w) = (h.contiguous()?, w.contiguous()?);
    with_f32(&h, "the rows", |h| with_f32(&w, "the weight", |w| f(h, w)))?
}

/// Runs `f` on the f32 values of a contiguous CPU tensor.
fn with_f32<R>(t: &Tensor, what: &str, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        bail!("fused-lm-head: {what} is not on the CPU")
    };
    let data = crate::fused::cpu_f32(&format!("fused-lm-head: {what}"), cpu, layout)?;
    Ok(f(data))
}

/// The per-row state of the forward pass over the vocabulary chunks.
#[derive(Clone, Copy, Debug)]
pub struct RowState {
    /// Running max of the logits seen (−∞ before the first chunk).
    pub m: f32,
    /// Σ exp(z − m).
    pub s: f32,
    /// Σ exp(z − m)·(z − m).
    pub u: f32,
    /// The target's logit (0 until its chunk).
    pub target_logit: f32,
}

impl Default for RowState {
    fn default() -> Self {
        RowState {
            m: f32::NEG_INFINITY,
            s: 0.0,
            u: 0.0,
            target_logit: 0.0,
        }
    }
}

/// Folds the chunk `z: [rows, cols]` (columns `c0..c0 + cols`) into the rows' states; `targets` are
/// the rows' target ids.
pub fn forward_chunk(
    z: &Tensor,
    c0: usize,
    targets: &[u32],
    states: &mut [RowState],
) -> Result<()> {
    let z = z.contiguous()?;
    let (rows, cols) = z.dims2()?;
    if rows != states.len() || rows != targets.len() {
        bail!(
            "fused-lm-head: a chunk of {rows} rows for {} states",
            states.len()
        )
    }
    with_f32(&z, "the logits", |z| {
        fold_chunk(z, cols, c0, targets, states)
    })
}

/// [`forward_chunk`] on the chunk's values, `states.len()` rows of `cols`.
fn fold_chunk(z: &[f32], cols: usize, c0: usize, targets: &[u32], states: &mut [RowState]) {
    states
        .par_iter_mut()
        .zip(z.par_chunks(cols.max(1)))
        .zip(targets.par_iter())
        .for_each(|((state, row), &target)| {
            let chunk_max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let m = state.m.max(chunk_max);
            let (mut s_c, mut u_c) = (0f32, 0f32);
            for &z in row {
                let d = z - m;
                let e = d.exp();
                s_c += e;
                u_c += e * d;
            }
            if state.m == f32::NEG_INFINITY {
                (state.s, state.u) = (s_c, u_c);
            } else {
                // Rescale by exp(m_old − m): s' = a·s, u' = a·(u + (m_old − m)·s).
                let shift = state.m - m;
                let a = shift.exp();
                state.u = (state.u + shift * state.s) * a + u_c;
                state.s = state.s * a + s_c;
            }
            state.m = m;
            let local = target as usize;
            if local >= c0 && local < c0 + cols {
                state.target_logit += row[local - c0];
            }
        });
}

/// The rows' (log p of the target, lse, entropy) from their final states.
pub fn finish(states: &[RowState]) -> Vec<(f32, f32, f32)> {
    states
        .iter()
        .map(|st| {
            let ln_s = st.s.ln();
            let lse = st.m + ln_s;
            (st.target_logit - lse, lse, ln_s - st.u / st.s)
        })
        .collect()
}

/// ∂loss/∂z of the chunk `z: [rows, cols]` (columns `c0..`) for rows with log-sum-exp `lse`, entropy
/// `entropy`, targets `targets` and incoming gradients `g1` (of log p) and `g2` (of the entropy), as a
/// new `[rows, cols]` tensor.
#[allow(clippy::too_many_arguments)]
pub fn backward_chunk(
    z: &Tensor,
    c0: usize,
    targets: &[u32],
    lse: &[f32],
    entropy: &[f32],
    g1: &[f32],
    g2: &[f32],
    device: &Device,
) -> Result<Tensor> {
    let z = z.contiguous()?;
    let (rows, cols) = z.dims2()?;
    for (what, len) in [
        ("targets", targets.len()),
        ("lse", lse.len()),
        ("entropy", entropy.len()),
        ("g1", g1.len()),
        ("g2", g2.len()),
    ] {
        if len != rows {
            bail!("fused-lm-head: {len} {what} for a chunk of {rows} rows")
        }
    }
    let mut dz = with_f32(&z, "the logits", <[f32]>::to_vec)?;
    let per_row = PerRow {
        targets,
        lse,
        entropy,
        g1,
        g2,
    };
    gradient_in_place(&mut dz, cols, c0, &per_row);
    Tensor::from_vec(dz, (rows, cols), device)
}

/// The per-row values the backward pass reads, one element per row of the chunk or of the head: the
/// targets, the forward's lse and entropy, and the incoming gradients g1 (of log p) and g2 (of the
/// entropy).
#[derive(Clone, Copy)]
pub(crate) struct PerRow<'a> {
    pub targets: &'a [u32],
    pub lse: &'a [f32],
    pub entropy: &'a [f32],
    pub g1: &'a [f32],
    pub g2: &'a [f32],
}

impl<'a> PerRow<'a> {
    fn rows(&self, rows: std::ops::Range<usize>) -> PerRow<'a> {
        PerRow {
            targets: &self.targets[rows.clone()],
            lse: &self.lse[rows.clone()],
            entropy: &self.entropy[rows.clone()],
            g1: &self.g1[rows.clone()],
            g2: &self.g2[rows],
        }
    }
}

/// Overwrites the chunk's logits `z` (rows of `cols`, columns `c0..`) with ∂loss/∂z.
fn gradient_in_place(z: &mut [f32], cols: usize, c0: usize, per_row: &PerRow<'_>) {
    z.par_chunks_mut(cols.max(1))
        .enumerate()
        .for_each(|(i, row)| {
            let (g1, g2, lse, h) = (
                per_row.g1[i],
                per_row.g2[i],
                per_row.lse[i],
                per_row.entropy[i],
            );
            for d in row.iter_mut() {
                let log_p = *d - lse;
                let p = log_p.exp();
                *d = -(p * ((log_p + h) * g2 + g1));
            }
            let t = per_row.targets[i] as usize;
            if t >= c0 && t < c0 + cols {
                row[t - c0] += g1;
            }
        });
}

/// A block of rows or a chunk of the vocabulary: (start, length).
type Span = (usize, usize);

/// The forward's logits, chunk by chunk in [`forward`]'s order, for the backward pass.
pub(crate) type Kept = Vec<Vec<f32>>;

/// The shape of a head on the CPU: `n` rows of `hd` hidden values, a vocabulary of `v`, walked in
/// blocks of `rows` rows and chunks of `cols` vocabulary entries ([`crate::head::chunk_plan`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    pub n: usize,
    pub v: usize,
    pub hd: usize,
    pub rows: usize,
    pub cols: usize,
}

impl Plan {
    /// The blocks of rows and the chunks of the vocabulary, as (start, length).
    fn blocks(&self) -> (Vec<Span>, Vec<Span>) {
        let split = |total: usize, step: usize| -> Vec<Span> {
            (0..total)
                .step_by(step.max(1))
                .map(|s| (s, step.min(total - s)))
                .collect()
        };
        (split(self.n, self.rows), split(self.v, self.cols))
    }

    /// One chunk's logits h[r0..r0 + rc] · w[c0..c0 + vc]ᵀ as a new row-major [rc, vc].
    fn logits(
        &self,
        h: &[f32],
        w: &[f32],
        (r0, rc): (usize, usize),
        (c0, vc): (usize, usize),
    ) -> Vec<f32> {
        let hd = self.hd;
        crate::fused::product_f32((rc, vc, hd), (&h[r0 * hd..], hd, 1), (&w[c0 * hd..], 1, hd))
    }
}

/// The forward pass on the CPU from the rows `h` ([n, hd]) and the weight `w` ([v, hd]), both f32 and
/// row-major: each row's (log p of its target, lse, entropy), and the chunks' logits when `keep` (in
/// the order block by block, chunk by chunk), for a backward pass that then skips their products.
/// Each chunk's product writes a fresh buffer without a zero fill (`fused::product_f32`).
pub(crate) fn forward(
    plan: Plan,
    h: &[f32],
    w: &[f32],
    targets: &[u32],
    keep: bool,
) -> (Vec<(f32, f32, f32)>, Option<Kept>) {
    let (blocks, chunks) = plan.blocks();
    let mut done = Vec::with_capacity(plan.n);
    let mut kept = keep.then(|| Vec::with_capacity(blocks.len() * chunks.len()));
    for &(r0, rc) in &blocks {
        let mut states = vec![RowState::default(); rc];
        for &(c0, vc) in &chunks {
            let z = plan.logits(h, w, (r0, rc), (c0, vc));
            fold_chunk(&z, vc, c0, &targets[r0..r0 + rc], &mut states);
            if let Some(kept) = &mut kept {
                kept.push(z);
            }
        }
        done.extend(finish(&states));
    }
    (done, kept)
}

/// The backward pass on the CPU: ∂hidden ([n, hd]) when `want.0` and ∂weight ([v, hd]) when `want.1`,
/// from the rows' values `per_row`. Each chunk's logits come from `kept` (the forward's, in its order) or are recomputed, are
/// overwritten by ∂z in place, and then enter two products written where they belong: ∂weight's
/// chunk appended to one buffer, ∂hidden's block accumulated by gemm itself (no zero fills, copies or
/// additions of whole gradients).
pub(crate) fn backward(
    plan: Plan,
    h: &[f32],
    w: &[f32],
    per_row: PerRow<'_>,
    mut kept: Option<Kept>,
    want: (bool, bool),
) -> (Option<Vec<f32>>, Option<Vec<f32>>) {
    let Plan { n, v, hd, .. } = plan;
    let (blocks, chunks) = plan.blocks();
    if blocks.is_empty() {
        // No rows: nothing flows back, ∂weight is zero.
        return (want.0.then(Vec::new), want.1.then(|| vec![0f32; v * hd]));
    }
    let mut d_hidden: Vec<f32> = Vec::with_capacity(if want.0 { n * hd } else { 0 });
    let mut d_weight: Vec<f32> = Vec::with_capacity(if want.1 { v * hd } else { 0 });
    for (c, &(c0, vc)) in chunks.iter().enumerate() {
        for (k, &(r0, rc)) in blocks.iter().enumerate() {
            let mut dz = match &mut kept {
                Some(kept) => std::mem::take(&mut kept[k * chunks.len() + c]),
                None => plan.logits(h, w, (r0, rc), (c0, vc)),
            };
            gradient_in_place(&mut dz, vc, c0, &per_row.rows(r0..r0 + rc));
            let rows_h = (&h[r0 * hd..], hd, 1);
            if want.0 {
                // ∂h[block] (+)= ∂z · w[chunk]: the first chunk writes the block, the others add.
                let dims = (rc, hd, vc);
                let (a, b) = ((&dz[..], vc, 1), (&w[c0 * hd..], hd, 1));
                if c == 0 {
                    crate::fused::extend_with_product(&mut d_hidden, dims, a, b);
                } else {
                    crate::fused::add_product(&mut d_hidden[r0 * hd..(r0 + rc) * hd], dims, a, b);
                }
            }
            if want.1 {
                // ∂w[chunk] (+)= ∂zᵀ · h[block]: the first block writes the chunk, the others add.
                let dims = (vc, hd, rc);
                let a = (&dz[..], 1, vc);
                if k == 0 {
                    crate::fused::extend_with_product(&mut d_weight, dims, a, rows_h);
                } else {
                    crate::fused::add_product(
                        &mut d_weight[c0 * hd..(c0 + vc) * hd],
                        dims,
                        a,
                        rows_h,
                    );
                }
            }
        }
    }
    (want.0.then_some(d_hidden), want.1.then_some(d_weight))
}

/// The f32 values of a CPU tensor of any layout (flattened).
pub fn values(t: &Tensor) -> Result<Vec<f32>> {
    t.flatten_all()?.to_vec1::<f32>()
}
