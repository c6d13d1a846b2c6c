//! The fused LM head's elementwise work on one chunk of logits as single parallel passes over f32
//! rows on the CPU (`head.rs` calls them for f32 tensors on the CPU; other dtypes and devices run the
//! same formulas as candle ops). A chunk is `[rows, cols]` logits z of the vocabulary columns
//! `c0 .. c0 + cols`; candle's ops made half a dozen passes over it each way (subtract, exp, sums,
//! products, a scatter), the row reductions of them on one thread.
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
    })
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
    let dz = with_f32(&z, "the logits", |z| {
        let mut dz = vec![0f32; z.len()];
        dz.par_chunks_mut(cols.max(1))
            .zip(z.par_chunks(cols.max(1)))
            .enumerate()
            .for_each(|(i, (dz, z))| {
                let (g1, g2, lse, h) = (g1[i], g2[i], lse[i], entropy[i]);
                for (d, &z) in dz.iter_mut().zip(z) {
                    let log_p = z - lse;
                    let p = log_p.exp();
                    *d = -(p * ((log_p + h) * g2 + g1));
                }
                let t = targets[i] as usize;
                if t >= c0 && t < c0 + cols {
                    dz[t - c0] += g1;
                }
            });
        dz
    })?;
    Tensor::from_vec(dz, (rows, cols), device)
}

/// The f32 values of a CPU tensor of any layout (flattened).
pub fn values(t: &Tensor) -> Result<Vec<f32>> {
    t.flatten_all()?.to_vec1::<f32>()
}
