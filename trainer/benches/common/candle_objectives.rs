//! `recipes/dapo.rlx` and `recipes/darling.rlx` written as plain candle tensor ops, op by op, the way a
//! Python trainer (verl, TRL) computes them: padded `[responses, T]` tensors, a response mask, group
//! statistics through a `[groups, n]` reshape, and candle's autograd for the backward pass.
//!
//! This is a *baseline and a cross-check*, not a definition: the recipes (and `stdlib/`) define the
//! objectives. The param values are the recipes' defaults. Shared by `benches/candle_baseline.rs` and
//! `tests/op.rs` (which asserts that these give the JIT's and the interpreter's loss and gradient).

#![allow(dead_code)]

use candle_core::{DType, Device, Result, Tensor, D};

/// A batch as padded tensors: `groups × n` responses (group-major), each padded to `t` tokens.
pub struct Padded {
    pub groups: usize,
    pub n: usize,
    pub t: usize,
    /// `[R, T]`: 1 on a response's tokens, 0 on padding.
    pub response_mask: Tensor,
    /// `[R]`: tokens per response.
    pub lengths: Tensor,
}

impl Padded {
    /// From per-response token counts (`counts.len() == groups * n`).
    pub fn new(
        groups: usize,
        n: usize,
        counts: &[usize],
        dtype: DType,
        device: &Device,
    ) -> Result<Padded> {
        let t = counts.iter().copied().max().unwrap_or(0);
        let mut mask = vec![0f64; counts.len() * t];
        for (r, &count) in counts.iter().enumerate() {
            mask[r * t..r * t + count].iter_mut().for_each(|m| *m = 1.0);
        }
        let lengths: Vec<f64> = counts.iter().map(|&c| c as f64).collect();
        Ok(Padded {
            groups,
            n,
            t,
            response_mask: Tensor::from_vec(mask, (counts.len(), t), device)?.to_dtype(dtype)?,
            lengths: Tensor::from_vec(lengths, counts.len(), device)?.to_dtype(dtype)?,
        })
    }

    /// A packed token vector (responses back to back) as `[R, T]`, padding 0.
    pub fn pad(&self, packed: &[f64], dtype: DType, device: &Device) -> Result<Tensor> {
        let counts: Vec<usize> = self
            .lengths
            .to_dtype(DType::F64)?
            .to_vec1::<f64>()?
            .iter()
            .map(|&c| c as usize)
            .collect();
        let mut padded = vec![0f64; counts.len() * self.t];
        let mut start = 0;
        for (r, &count) in counts.iter().enumerate() {
            padded[r * self.t..r * self.t + count].copy_from_slice(&packed[start..start + count]);
            start += count;
        }
        Tensor::from_vec(padded, (counts.len(), self.t), device)?.to_dtype(dtype)
    }

    /// The packed elements of a `[R, T]` tensor (the inverse of `pad`).
    pub fn unpad(&self, padded: &Tensor) -> Result<Vec<f64>> {
        let rows = padded.to_dtype(DType::F64)?.to_vec2::<f64>()?;
        let counts = self.lengths.to_dtype(DType::F64)?.to_vec1::<f64>()?;
        Ok(rows
            .iter()
            .zip(counts)
            .flat_map(|(row, count)| row[..count as usize].to_vec())
            .collect())
    }
}

/// Per-group mean and sum of squared deviations of a `[R]` tensor: `[G, 1]` each.
fn group_moments(x: &Tensor, padded: &Padded) -> Result<(Tensor, Tensor, Tensor)> {
    let grouped = x.reshape((padded.groups, padded.n))?;
    let mean = grouped.mean_keepdim(1)?;
    let centred = grouped.broadcast_sub(&mean)?;
    let squares = centred.sqr()?.sum_keepdim(1)?;
    Ok((grouped, mean, squares))
}

/// `token_mean(x, m)`: Σ x·m / max(Σ m, 1e-8) over every token of the batch.
fn token_mean(x: &Tensor, m: &Tensor) -> Result<Tensor> {
    let denominator = m.sum_all()?.maximum(1e-8)?;
    (x * m)?.sum_all()?.div(&denominator)
}

/// std/loss `ppo_clip` with the dual clip: max(−A·r, −A·clip(r, 1 − εl, 1 + εh)), and min(·, −A·c)
/// where A < 0. `adv` is `[R, 1]`, broadcast over tokens.
fn ppo_clip(
    ratio: &Tensor,
    adv: &Tensor,
    eps_low: f64,
    eps_high: f64,
    clip_c: f64,
) -> Result<Tensor> {
    let neg_adv = adv.neg()?;
    let unclipped = ratio.broadcast_mul(&neg_adv)?;
    let clipped_ratio = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)?;
    let clipped = clipped_ratio.broadcast_mul(&neg_adv)?;
    let surrogate = unclipped.maximum(&clipped)?;
    let dual = surrogate.minimum(
        &neg_adv
            .affine(clip_c, 0.0)?
            .broadcast_as(surrogate.shape())?,
    )?;
    let negative = adv.lt(0.0)?.broadcast_as(surrogate.shape())?;
    negative.where_cond(&dual, &surrogate)
}

/// The outputs of an objective.
pub struct Objective {
    pub loss: Tensor,
    pub advantage: Tensor,
    pub metrics: Vec<(&'static str, Tensor)>,
}

/// `recipes/dapo.rlx`: overlong-shaped reward, `keep group when std(reward) > 0`, group z-score,
/// clip-higher PPO with dual clip on verl's clamped ratio, token-mean over the kept groups' tokens.
pub fn dapo(
    logp: &Tensor,
    old_logp: &Tensor,
    score: &Tensor,
    mask: &Tensor,
    padded: &Padded,
) -> Result<Objective> {
    let (eps_low, eps_high, clip_c) = (0.2, 0.28, 10.0);
    let (max_len, buffer, factor) = (20480.0, 4096.0, 1.0);
    // reward = score + min(−(L − (L_max − L_buf))/L_buf·factor, 0)
    let exceed = padded.lengths.affine(1.0, -(max_len - buffer))?;
    let penalty = exceed.affine(-factor / buffer, 0.0)?.minimum(0.0)?;
    let reward = (score + penalty)?;
    // keep group when std(reward over resp) > 0 (population std; only its sign matters).
    let (grouped, mean, squares) = group_moments(&reward, padded)?;
    let keep_group = squares.gt(0.0)?.to_dtype(logp.dtype())?; // [G, 1]
    let keep = keep_group
        .broadcast_as((padded.groups, padded.n))?
        .reshape((padded.groups * padded.n, 1))?;
    // group_zscore: (r − mean)/(std(ddof = 1) + 1e-6).
    let std = squares
        .affine(1.0 / (padded.n as f64 - 1.0).max(1.0), 0.0)?
        .sqrt()?;
    let advantage = grouped
        .broadcast_sub(&mean)?
        .broadcast_div(&std.affine(1.0, 1e-6)?)?
        .reshape((padded.groups * padded.n, 1))?;
    let advantage = (advantage * &keep)?;
    // ratio = exp(clamp(logp − old_logp, −20, 20))
    let delta = (logp - old_logp)?.clamp(-20.0, 20.0)?;
    let ratio = delta.exp()?;
    let pg = ppo_clip(&ratio, &advantage, eps_low, eps_high, clip_c)?;
    let m = (mask * &padded.response_mask)?.broadcast_mul(&keep)?;
    let loss = token_mean(&pg, &m)?;
    // Metrics (no gradient needed; computed as a trainer would, on detached tensors).
    let (ratio_d, adv_d) = (ratio.detach(), advantage.detach());
    let neg_adv = adv_d.neg()?;
    let unclipped = ratio_d.broadcast_mul(&neg_adv)?;
    let clipped = ratio_d
        .clamp(1.0 - eps_low, 1.0 + eps_high)?
        .broadcast_mul(&neg_adv)?;
    let clipfrac = token_mean(&clipped.gt(&unclipped)?.to_dtype(logp.dtype())?, &m)?;
    let surrogate = unclipped.maximum(&clipped)?;
    let dual = surrogate
        .gt(&neg_adv
            .affine(clip_c, 0.0)?
            .broadcast_as(surrogate.shape())?)?
        .to_dtype(logp.dtype())?
        .broadcast_mul(&adv_d.lt(0.0)?.to_dtype(logp.dtype())?)?;
    let clipfrac_lower = token_mean(&dual, &m)?;
    let ppo_kl = token_mean(&delta.detach().neg()?, &m)?;
    let kept_responses = keep.sum_all()?.maximum(1e-300)?;
    let reward_mean = (reward.reshape((padded.groups * padded.n, 1))? * &keep)?
        .sum_all()?
        .div(&kept_responses)?;
    Ok(Objective {
        loss,
        advantage: advantage.squeeze(1)?,
        metrics: vec![
            ("pg_clipfrac", clipfrac),
            ("pg_clipfrac_lower", clipfrac_lower),
            ("ppo_kl", ppo_kl),
            ("reward_mean", reward_mean),
        ],
    })
}

/// `recipes/darling.rlx`: reward = quality × partition diversity, Dr.GRPO centring, PPO (dual clip at
/// the default 3) on the unclamped ratio, token-mean, plus β·token-mean of verl's clamped k3.
pub fn darling(
    logp: &Tensor,
    old_logp: &Tensor,
    ref_logp: &Tensor,
    quality: &Tensor,
    cluster: &Tensor,
    padded: &Padded,
) -> Result<Objective> {
    let (eps_low, eps_high, beta, floor) = (0.2, 0.2, 0.001, 0.1);
    let (g, n) = (padded.groups, padded.n);
    // diversity_i = max(mean_{j ≠ i} [cluster_i ≠ cluster_j], floor): a [G, n, n] comparison.
    let c = cluster.reshape((g, n))?;
    let differs = c
        .unsqueeze(2)?
        .broadcast_as((g, n, n))?
        .ne(&c.unsqueeze(1)?.broadcast_as((g, n, n))?)?
        .to_dtype(quality.dtype())?;
    let others = (n as f64 - 1.0).max(1.0);
    let diversity = differs
        .sum(D::Minus1)?
        .affine(1.0 / others, 0.0)?
        .maximum(floor)?
        .reshape(g * n)?;
    let reward = (quality * &diversity)?;
    let (grouped, mean, _) = group_moments(&reward, padded)?;
    let advantage = grouped.broadcast_sub(&mean)?.reshape((g * n, 1))?;
    let ratio = (logp - old_logp)?.exp()?;
    let pg = ppo_clip(&ratio, &advantage, eps_low, eps_high, 3.0)?;
    let log_ratio = (ref_logp - logp)?.clamp(-20.0, 20.0)?;
    let k3 = ((log_ratio.exp()? - &log_ratio)?.affine(1.0, -1.0)?).clamp(-10.0, 10.0)?;
    let m = &padded.response_mask;
    let loss = (token_mean(&pg, m)? + token_mean(&k3, m)?.affine(beta, 0.0)?)?;
    let ratio_d = ratio.detach();
    let outside = (ratio_d.lt(1.0 - eps_low)?.to_dtype(logp.dtype())?
        + ratio_d.gt(1.0 + eps_high)?.to_dtype(logp.dtype())?)?;
    let clip_frac = token_mean(&outside, m)?;
    Ok(Objective {
        loss,
        advantage: advantage.squeeze(1)?,
        metrics: vec![
            ("diversity_mean", diversity.mean_all()?),
            ("quality_mean", quality.mean_all()?),
            ("clip_frac", clip_frac),
        ],
    })
}
