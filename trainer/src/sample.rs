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
    let mut timing = Timing::default();
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
    let mut logits = Tensor::cat(&first_logits, 0)?.index_select(&rows_of_chunks, 0)?;
    let mut done = vec![false; batch];
    let mut offset = len;
    timing.prefill_seconds = start.elapsed().as_secs_f64();
    for step in 0..settings.max_new_tokens {
        let rows = logits.to_vec2::<f32>()?;
        // One uniform per live row, drawn in row order (the sampling stream does not depend on the
        // parallel split below); greedy decoding draws none.
        let uniforms: Vec<Option<f64>> = done
            .iter()
            .map(|d| (!d && settings.temperature > 0.0).then(|| rng.uniform()))
            .collect();
        let picks: Vec<Option<(u32, f32, f32)>> = rows
            .par_iter()
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
            .collect();
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
