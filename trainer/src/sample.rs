//! Batched generation with a KV cache: temperature, top-p, a set of stop tokens, max new tokens, n samples
//! per prompt. Prompts of different lengths are left-padded and the padding is masked out of attention
//! (rotary embeddings are relative, so the shift does not change what a row computes). Each prompt is
//! run once (the prefill, longest prompts first in chunks, so that a short prompt is not computed at
//! the longest one's padded length) and its keys and values are shared by its n samples; the per-row choice of
//! the next token runs in parallel (one pre-drawn uniform per row keeps the stream seeded). Generation
//! runs on the model's [`Model::no_grad`] view: nothing is recorded for backpropagation.

use candle_core::{Device, Result, Tensor};
use serde::{Deserialize, Serialize};

use rayon::prelude::*;

use crate::model::{KvCache, Model};
use crate::rng::Rng;
use crate::task::PAD;

/// The most padded positions (rows × the chunk's longest prompt) one chunk of the prefill runs at once:
/// large enough for the matrix products to run at full speed, small enough that a short prompt is not
/// padded to a long one's length and that the chunk's activations stay small.
const PREFILL_POSITIONS: usize = 1024;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplerConfig {
    /// Samples per prompt (the group size); 0 takes the recipe's `rollout { n }`.
    pub n: usize,
    /// 0 means greedy; negative takes the recipe's `rollout { temperature }` (else 1).
    pub temperature: f64,
    /// 0 takes the recipe's `rollout { top_p }` (else 1).
    pub top_p: f64,
    pub max_new_tokens: usize,
}

/// One generated completion: its tokens (ending with the first stop token produced, which is kept;
/// nothing is generated after it) and, for each, log π(token) under the sampling model at temperature 1
/// without top-p — the `old_logp` a trainer recomputes for the same weights — and the entropy of that
/// distribution.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    pub tokens: Vec<u32>,
    pub logp: Vec<f32>,
    /// The entropy of the sampling model's distribution (temperature 1, no top-p) at each token, when
    /// [`Settings::entropy`] asks for it (else empty).
    pub entropy: Vec<f32>,
}

pub struct Settings {
    pub temperature: f64,
    pub top_p: f64,
    pub max_new_tokens: usize,
    /// The stop tokens: a row ends at the first token it produces that is one of these (kept as its
    /// last token); empty = only `max_new_tokens` ends a row.
    pub stop: Vec<u32>,
    /// Also record each token's entropy ([`Completion::entropy`]; a pass over the vocabulary per
    /// token, so only when a recipe reads `entropy`). Without it `entropy` stays empty.
    pub entropy: bool,
}

/// Left padding of each prompt to the longest, and the padded `[rows, len]` ids.
pub fn left_pad(prompts: &[Vec<u32>]) -> (Vec<usize>, Vec<u32>, usize) {
    let len = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let mut ids = Vec::with_capacity(prompts.len() * len);
    let mut pads = Vec::with_capacity(prompts.len());
    for p in prompts {
        pads.push(len - p.len());
        ids.extend(std::iter::repeat_n(PAD, len - p.len()));
        ids.extend_from_slice(p);
    }
    (pads, ids, len)
}

/// log π(token) and (when asked, else 0) the entropy of one row's softmax at temperature 1, in f64:
/// lse = max + ln Σ exp(z − max).
fn logp_and_entropy(logits: &[f32], token: u32, entropy: bool) -> (f32, f32) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&z| (z as f64 - max).exp()).sum();
    let lse = max + sum.ln();
    let logp = (logits[token as usize] as f64 - lse) as f32;
    if !entropy {
        return (logp, 0.0);
    }
    // −Σ p log p, a zero probability adding nothing.
    let h = -logits
        .iter()
        .map(|&z| {
            let l = z as f64 - lse;
            let p = l.exp();
            if p == 0.0 {
                0.0
            } else {
                p * l
            }
        })
        .sum::<f64>();
    (logp, h as f32)
}

/// Choose a token from `logits` (one row), with `u` uniform in [0, 1) (unused when greedy).
fn choose(logits: &[f32], settings: &Settings, u: f64) -> u32 {
    if settings.temperature <= 0.0 {
        return argmax(logits);
    }
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let mut probs: Vec<(u32, f64)> = logits
        .iter()
        .enumerate()
        .map(|(i, l)| (i as u32, (((l - max) as f64) / settings.temperature).exp()))
        .collect();
    let total: f64 = probs.iter().map(|p| p.1).sum();
    for p in &mut probs {
        p.1 /= total;
    }
    if settings.top_p < 1.0 {
        probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut mass = 0.0;
        let mut keep = 0;
        for p in &probs {
            keep += 1;
            mass += p.1;
            if mass >= settings.top_p {
                break;
            }
        }
        probs.truncate(keep);
    }
    let total: f64 = probs.iter().map(|p| p.1).sum();
    let mut u = u * total;
    for p in &probs {
        if u < p.1 {
            return p.0;
        }
        u -= p.1;
    }
    probs.last().map(|p| p.0).unwrap_or(0)
}

fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in values.iter().enumerate() {
        if *v > values[best] {
            best = i;
        }
    }
    best as u32
}

/// Vocabulary entries per block of [`sample_on_device`]'s two-level inverse CDF.
const CDF_BLOCK: usize = 256;

/// Bisection steps of [`top_p_mask`]'s threshold (each halves the interval of probabilities).
const TOP_P_STEPS: usize = 32;

/// The per-row choice of [`generate`] on a GPU, as candle ops on the `[rows, vocab]` logits where they
/// are: only the chosen token, its log-probability and (when asked) the entropy come back, one value
/// each per row. `uniforms[r]` is row r's draw (that of the CPU path: the sampling stream is the same).
///
/// Greedy is the arg-max. Sampling takes the softmax at the temperature, restricted by top-p to the
/// most probable tokens whose mass first reaches `top_p` ([`top_p_mask`]), and inverts its CDF in
/// vocabulary order at `u · mass` (two levels: blocks of [`CDF_BLOCK`] entries, then inside the
/// chosen block), so one uniform per row picks a token of exactly the CPU's distribution (in f32;
/// the CPU inverts in descending-probability order under top-p, so the same `u` may pick another
/// token of the same distribution). log π and the entropy are at temperature 1 without top-p, as on
/// the CPU.
pub fn sample_on_device(
    logits: &Tensor,
    uniforms: &[f64],
    settings: &Settings,
) -> Result<Vec<(u32, f32, f32)>> {
    use candle_core::{DType, D};
    let (rows, vocab) = logits.dims2()?;
    if uniforms.len() != rows {
        candle_core::bail!("{} uniforms for {rows} rows", uniforms.len());
    }
    let device = logits.device();
    let logits = logits.to_dtype(DType::F32)?;
    let max = logits.max_keepdim(D::Minus1)?;
    let shifted = logits.broadcast_sub(&max)?;
    let tokens = if settings.temperature <= 0.0 {
        logits.argmax_keepdim(D::Minus1)?
    } else {
        let weights = (&shifted / settings.temperature)?.exp()?;
        let probs = weights.broadcast_div(&weights.sum_keepdim(D::Minus1)?)?;
        let probs = if settings.top_p < 1.0 {
            (&probs * top_p_mask(&probs, settings.top_p)?)?
        } else {
            probs
        };
        let u: Vec<f32> = uniforms.iter().map(|u| *u as f32).collect();
        let u = Tensor::from_vec(u, (rows, 1), device)?;
        inverse_cdf(&probs, &u, vocab)?
    };
    // log π(token) and the entropy at temperature 1: lse = max + ln Σ exp(z − max).
    let lse = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    let chosen = shifted.gather(&tokens, D::Minus1)?;
    let logp = (chosen - &lse)?;
    let mut columns = vec![tokens.to_dtype(DType::F32)?, logp];
    if settings.entropy {
        let log_p = shifted.broadcast_sub(&lse)?;
        let entropy = (log_p.exp()? * &log_p)?.sum_keepdim(D::Minus1)?.neg()?;
        columns.push(entropy);
    }
    // One read-back: [rows, 2 or 3] (token ids below 2²⁴ are exact in f32).
    let values = Tensor::cat(&columns, 1)?.to_vec2::<f32>()?;
    Ok(values
        .into_iter()
        .map(|row| (row[0] as u32, row[1], row.get(2).copied().unwrap_or(0.0)))
        .collect())
}

/// 1 for the tokens top-p keeps, 0 elsewhere (`probs`: `[rows, vocab]`, rows summing to 1): those of
/// probability at least τ, the largest threshold whose tokens still hold `top_p` of the mass, which are
/// the most probable tokens whose mass first reaches `top_p` (the CPU's sorted prefix; tokens tied at
/// the threshold are all kept). τ is found by bisection between 0 and the row's largest probability.
pub fn top_p_mask(probs: &Tensor, top_p: f64) -> Result<Tensor> {
    use candle_core::{DType, D};
    let (rows, _) = probs.dims2()?;
    let mut lo = Tensor::zeros((rows, 1), DType::F32, probs.device())?;
    let mut hi = probs.max_keepdim(D::Minus1)?;
    let target = Tensor::full(top_p as f32, (rows, 1), probs.device())?;
    for _ in 0..TOP_P_STEPS {
        let mid = ((&lo + &hi)? * 0.5)?;
        let kept = probs.broadcast_ge(&mid)?.to_dtype(DType::F32)?;
        let mass = (kept * probs)?.sum_keepdim(D::Minus1)?;
        // mass(p ≥ mid) ≥ top_p: the threshold may rise to mid, else it is below mid.
        let enough = mass.ge(&target)?;
        lo = enough.where_cond(&mid, &lo)?;
        hi = enough.where_cond(&hi, &mid)?;
    }
    probs.broadcast_ge(&lo)?.to_dtype(DType::F32)
}

/// Per row, the first index whose cumulative weight exceeds `u · Σ weights` (`weights`: `[rows, n]`,
/// non-negative; `u`: `[rows, 1]` in [0, 1)), clamped to the last index of positive weight; as
/// `[rows, 1]` u32. Two levels of blocks so that no `[n, n]` cumulative-sum matrix is made.
fn inverse_cdf(weights: &Tensor, u: &Tensor, n: usize) -> Result<Tensor> {
    use candle_core::{DType, D};
    let (rows, _) = weights.dims2()?;
    let device = weights.device();
    let blocks = n.div_ceil(CDF_BLOCK);
    let padded = if blocks * CDF_BLOCK > n {
        let pad = Tensor::zeros((rows, blocks * CDF_BLOCK - n), DType::F32, device)?;
        Tensor::cat(&[weights, &pad], 1)?
    } else {
        weights.clone()
    };
    let blocked = padded.reshape((rows, blocks, CDF_BLOCK))?;
    let sums = blocked.sum(D::Minus1)?;
    let target = u.broadcast_mul(&sums.sum_keepdim(D::Minus1)?)?;
    let block = first_above(&sums, &target)?;
    let before = (sums.cumsum(D::Minus1)? - &sums)?.gather(&block, D::Minus1)?;
    let inner = blocked
        .gather(
            &block
                .unsqueeze(2)?
                .broadcast_as((rows, 1, CDF_BLOCK))?
                .contiguous()?,
            1,
        )?
        .squeeze(1)?;
    let offset = first_above(&inner, &(target - before)?)?;
    let index =
        ((block.to_dtype(DType::F32)? * CDF_BLOCK as f64)? + offset.to_dtype(DType::F32)?)?;
    index.to_dtype(DType::U32)
}

/// Per row of `weights` (`[rows, n]`, non-negative), the number of leading entries whose cumulative
/// sum is at most `target` (`[rows, 1]`): the index of the entry the target falls in, clamped to the
/// last entry of positive weight (a target at or past the total, by rounding, takes that one); u32.
fn first_above(weights: &Tensor, target: &Tensor) -> Result<Tensor> {
    use candle_core::{DType, D};
    let (_, n) = weights.dims2()?;
    let cumulative = weights.cumsum(D::Minus1)?;
    let count = cumulative
        .broadcast_le(target)?
        .to_dtype(DType::F32)?
        .sum_keepdim(D::Minus1)?;
    let positions = Tensor::arange(0f32, n as f32, weights.device())?.unsqueeze(0)?;
    let last_positive = weights
        .gt(0.0)?
        .to_dtype(DType::F32)?
        .broadcast_mul(&positions)?
        .max_keepdim(D::Minus1)?;
    count.minimum(&last_positive)?.to_dtype(DType::U32)
}

/// Where a [`generate_timed`] call spent its time: the prefill (the prompts' forward pass and the first
/// tokens' logits, the cache repeated for the samples) and the decoding steps after it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Timing {
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
}

/// Generate `n` completions for each prompt; the result is prompt-major (all samples of prompt 0, then
/// prompt 1, …), which is the packed order of groups and responses.
pub fn generate(
    model: &Model,
    prompts: &[Vec<u32>],
    n: usize,
    settings: &Settings,
    rng: &mut Rng,
    device: &Device,
) -> Result<Vec<Completion>> {
    generate_timed(model, prompts, n, settings, rng, device).map(|(completions, _)| completions)
}

/// [`generate`], and how long its prefill and its decoding took.
pub fn generate_timed(
    model: &Model,
    prompts: &[Vec<u32>],
    n: usize,
    settings: &Settings,
    rng: &mut Rng,
    device: &Device,
) -> Result<(Vec<Completion>, Timing)> {
    let start = std::time::Instant::now();
    let vocab = model.config.vocab;
    if let Some(bad) = settings.stop.iter().find(|id| **id as usize >= vocab) {
        candle_core::bail!("stop token {bad} is outside the model's vocabulary of {vocab}");
    }
    if let Some(i) = prompts.iter().position(Vec::is_empty) {
        candle_core::bail!(
            "prompt {i} is empty: generation needs at least one token to condition on"
        );
    }
    // LoRA adapters merged into their weights: one product per projection in every decoding step.
    let model = &model.merged_view()?;
    // The whole generation runs as one job on rayon's pool, so that the parallel loops inside each
    // decoding step (a dozen per layer) start from a pool thread that takes part in them, instead of
    // each handing its work to the pool from outside and sleeping until it is done: two thread
    // wake-ups fewer per loop, which is a measurable part of a one-row step (docs/performance.md).
    rayon::scope(|_| generate_in_pool(model, prompts, n, settings, rng, device, start))
}

/// [`generate_timed`]'s work, on a thread of rayon's pool.
fn generate_in_pool(
    model: &Model,
    prompts: &[Vec<u32>],
    n: usize,
    settings: &Settings,
    rng: &mut Rng,
    device: &Device,
    start: std::time::Instant,
) -> Result<(Vec<Completion>, Timing)> {
    let mut timing = Timing::default();
    let batch = prompts.len() * n;
    let mut out: Vec<Completion> = (0..batch)
        .map(|_| Completion {
            tokens: Vec::new(),
            logp: Vec::new(),
            entropy: Vec::new(),
        })
        .collect();
    if batch == 0 || settings.max_new_tokens == 0 {
        return Ok((out, timing));
    }
    // The prefill: each prompt is run once, and its keys and values then repeated for the n rows of
    // each (row r continues prompt r / n). The prompts go longest first, in chunks of at most
    // PREFILL_POSITIONS padded positions, so that a short prompt is not padded to the longest of the
    // whole batch: a chunk whose longest prompt has lc tokens runs after a prefix of len − lc zero
    // positions (a zero-prefix cache its rows' padding covers), which puts each of its tokens at the
    // position it has in the batch left-padded to `len` (rope angles included). The chunks' caches and
    // first-token logits are then joined and put back in row order.
    let (prompt_pads, _, len) = left_pad(prompts);
    let pads: Vec<usize> = prompt_pads
        .iter()
        .flat_map(|&p| std::iter::repeat_n(p, n))
        .collect();
    let mut order: Vec<usize> = (0..prompts.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(prompts[i].len()));
    let mut caches = Vec::new();
    let mut first_logits = Vec::new();
    let mut begin = 0;
    while begin < order.len() {
        let lc = prompts[order[begin]].len();
        let chunk = &order[begin..(begin + (PREFILL_POSITIONS / lc).max(1)).min(order.len())];
        let chunk_prompts: Vec<Vec<u32>> = chunk.iter().map(|&i| prompts[i].clone()).collect();
        let (_, ids, _) = left_pad(&chunk_prompts);
        let chunk_pads: Vec<usize> = chunk.iter().map(|&i| prompt_pads[i]).collect();
        let mut cache = KvCache::zero_prefix(&model.config, chunk.len(), len - lc, device)?;
        let input = Tensor::from_vec(ids, (chunk.len(), lc), device)?;
        let hidden = model.hidden(&input, len - lc, &chunk_pads, Some(&mut cache))?;
        let last = hidden.narrow(1, lc - 1, 1)?.squeeze(1)?;
        first_logits.push(model.logits(&last)?);
        caches.push(cache);
        begin += chunk.len();
    }
    let mut rank = vec![0u32; prompts.len()];
    for (position, &i) in order.iter().enumerate() {
        rank[i] = position as u32;
    }
    let rows_of_chunks: Vec<u32> = (0..batch).map(|r| rank[r / n]).collect();
    let rows_of_chunks = Tensor::from_vec(rows_of_chunks, batch, device)?;
    let mut cache = KvCache::concat_rows(&caches)?;
    drop(caches);
    cache.repeat_rows(&rows_of_chunks)?;
    // Room for every position the decoding steps add: the buffers are made once, at the first step.
    cache.reserve(len + settings.max_new_tokens);
    let mut logits = Tensor::cat(&first_logits, 0)?.index_select(&rows_of_chunks, 0)?;
    let mut done = vec![false; batch];
    let mut offset = len;
    timing.prefill_seconds = start.elapsed().as_secs_f64();
    for step in 0..settings.max_new_tokens {
        // One uniform per live row, drawn in row order (the sampling stream does not depend on the
        // parallel split below, nor on the device); greedy decoding draws none.
        let uniforms: Vec<Option<f64>> = done
            .iter()
            .map(|d| (!d && settings.temperature > 0.0).then(|| rng.uniform()))
            .collect();
        let picks: Vec<Option<(u32, f32, f32)>> = if device.is_cpu() {
            let rows = logits.to_vec2::<f32>()?;
            rows.par_iter()
                .zip(uniforms.par_iter())
                .zip(done.par_iter())
                .map(|((row, u), done)| {
                    if *done {
                        return None;
                    }
                    let token = choose(row, settings, u.unwrap_or(0.0));
                    let (logp, entropy) = logp_and_entropy(row, token, settings.entropy);
                    Some((token, logp, entropy))
                })
                .collect()
        } else {
            // On the GPU the logits stay there: only each row's token, log π and entropy come back.
            let draws: Vec<f64> = uniforms.iter().map(|u| u.unwrap_or(0.0)).collect();
            sample_on_device(&logits, &draws, settings)?
                .into_iter()
                .zip(&done)
                .map(|(pick, done)| (!done).then_some(pick))
                .collect()
        };
        let mut next = vec![PAD; batch];
        for (r, pick) in picks.into_iter().enumerate() {
            let Some((token, logp, h)) = pick else {
                continue;
            };
            out[r].tokens.push(token);
            out[r].logp.push(logp);
            if settings.entropy {
                out[r].entropy.push(h);
            }
            next[r] = token;
            if settings.stop.contains(&token) {
                done[r] = true;
            }
        }
        if done.iter().all(|d| *d) || step + 1 == settings.max_new_tokens {
            break;
        }
        let input = Tensor::from_vec(next, (batch, 1), device)?;
        let hidden = model.hidden(&input, offset, &pads, Some(&mut cache))?;
        logits = model.logits(&hidden.squeeze(1)?)?;
        offset += 1;
    }
    timing.decode_seconds = start.elapsed().as_secs_f64() - timing.prefill_seconds;
    Ok((out, timing))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(temperature: f64, top_p: f64, entropy: bool) -> Settings {
        Settings {
            temperature,
            top_p,
            max_new_tokens: 1,
            stop: Vec::new(),
            entropy,
        }
    }

    /// Random `[rows, vocab]` logits (a vocabulary that is not a multiple of the CDF block).
    fn logits(rows: usize, vocab: usize, seed: u64) -> Vec<Vec<f32>> {
        let mut rng = Rng::new(seed);
        (0..rows)
            .map(|_| (0..vocab).map(|_| (2.5 * rng.normal()) as f32).collect())
            .collect()
    }

    /// The GPU path's choice, run on CPU tensors, against the CPU path's: the same tokens for greedy
    /// decoding and for sampling without top-p at the same uniforms (the same inverse CDF in
    /// vocabulary order, f32 against f64 sums), and the same log π and entropy.
    #[test]
    fn the_device_choice_agrees_with_the_host_choice() {
        let (rows, vocab) = (48, 1000);
        let values = logits(rows, vocab, 3);
        let flat: Vec<f32> = values.iter().flatten().copied().collect();
        let tensor = Tensor::from_vec(flat, (rows, vocab), &Device::Cpu).unwrap();
        let mut rng = Rng::new(8);
        let uniforms: Vec<f64> = (0..rows).map(|_| rng.uniform()).collect();
        for s in [
            settings(0.0, 1.0, true),
            settings(1.0, 1.0, true),
            settings(0.7, 1.0, false),
        ] {
            let picks = sample_on_device(&tensor, &uniforms, &s).unwrap();
            for (r, (token, logp, entropy)) in picks.into_iter().enumerate() {
                let expected = choose(&values[r], &s, uniforms[r]);
                assert_eq!(token, expected, "row {r}, temperature {}", s.temperature);
                let (want_logp, want_entropy) = logp_and_entropy(&values[r], token, s.entropy);
                assert!((logp - want_logp).abs() < 1e-4, "{logp} vs {want_logp}");
                assert!(
                    (entropy - want_entropy).abs() < 1e-4,
                    "{entropy} vs {want_entropy}"
                );
            }
        }
    }

    /// Top-p on the device keeps exactly the CPU's set (the most probable tokens whose mass first
    /// reaches top_p), and every sampled token is in it.
    #[test]
    fn the_device_top_p_keeps_the_hosts_set() {
        let (rows, vocab) = (16, 700);
        let values = logits(rows, vocab, 5);
        let flat: Vec<f32> = values.iter().flatten().copied().collect();
        let tensor = Tensor::from_vec(flat, (rows, vocab), &Device::Cpu).unwrap();
        let probs = candle_nn::ops::softmax_last_dim(&tensor).unwrap();
        for top_p in [0.1, 0.5, 0.9, 0.999] {
            let mask = top_p_mask(&probs, top_p).unwrap().to_vec2::<f32>().unwrap();
            let p = probs.to_vec2::<f32>().unwrap();
            for r in 0..rows {
                let mut order: Vec<usize> = (0..vocab).collect();
                order.sort_by(|&a, &b| p[r][b].total_cmp(&p[r][a]));
                let (mut mass, mut kept) = (0f64, vec![0f32; vocab]);
                for &j in &order {
                    kept[j] = 1.0;
                    mass += p[r][j] as f64;
                    if mass >= top_p {
                        break;
                    }
                }
                assert_eq!(mask[r], kept, "row {r}, top_p {top_p}");
            }
            let mut rng = Rng::new(2);
            let uniforms: Vec<f64> = (0..rows).map(|_| rng.uniform()).collect();
            let picks = sample_on_device(&tensor, &uniforms, &settings(1.0, top_p, false)).unwrap();
            for (r, (token, _, _)) in picks.iter().enumerate() {
                assert_eq!(
                    mask[r][*token as usize], 1.0,
                    "row {r}: token {token} outside top-p"
                );
            }
        }
    }

    /// The inverse CDF at the edges: u = 0 takes the first token of positive weight, u just below 1
    /// the last, and zero-weight padding is never chosen.
    #[test]
    fn the_inverse_cdf_stays_on_positive_weights() {
        let mut w = vec![0f32; 600];
        w[3] = 0.25;
        w[300] = 0.5;
        w[512] = 0.25;
        let weights = Tensor::from_vec([w.clone(), w].concat(), (2, 600), &Device::Cpu).unwrap();
        let u = Tensor::from_vec(vec![0f32, 0.999_999_9], (2, 1), &Device::Cpu).unwrap();
        let picks = inverse_cdf(&weights, &u, 600)
            .unwrap()
            .to_vec2::<u32>()
            .unwrap();
        assert_eq!(picks, vec![vec![3], vec![512]]);
    }
}
