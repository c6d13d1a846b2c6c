//! Measures the real-model path on this machine (docs/models.md records the numbers):
//! SmolLM2-135M-Instruct load time, sampling tokens/s (16 sequences × 64 new tokens, KV cache), training
//! tokens/s (one forward + backward over 16 × (prompt + 64) tokens), the wall time of a training
//! step-equivalent (4 prompts × 4 samples × up to 64 new tokens: sample, reference log-probs,
//! forward/backward, AdamW), and the peak resident memory after each phase. Needs `scripts/fetch-assets.sh`.
//!
//! cargo run --release -p rlx-trainer --example smollm2_measure

use std::time::Instant;

use candle_core::{Device, Tensor};
use rlx_trainer::gguf::load_smollm2;
use rlx_trainer::model::Model;
use rlx_trainer::optim::{AdamW, AdamWParams, Grads};
use rlx_trainer::rng::Rng;
use rlx_trainer::sample::{generate, left_pad, Completion, Settings};

/// Peak resident set size so far (VmHWM), in GiB; 0 where /proc is not available.
fn peak_rss_gib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0 / 1024.0)
        .unwrap_or(0.0)
}

/// Prompt + completion rows (left-padded) and the index where completions start.
fn rows(
    prompts: &[Vec<u32>],
    completions: &[Completion],
    n: usize,
    pad: u32,
) -> (Vec<Vec<u32>>, usize) {
    let plen = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let clen = completions
        .iter()
        .map(|c| c.tokens.len())
        .max()
        .unwrap_or(0);
    let rows = completions
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut row = prompts[i / n].clone();
            row.extend(&c.tokens);
            // Right-pad completions to the longest (those positions are masked out of the loss).
            row.extend(std::iter::repeat_n(pad, clen - c.tokens.len()));
            row
        })
        .collect();
    (rows, plen)
}

/// Sum over real completion tokens of `weight · logp`, and the number of those tokens.
fn forward_logp(
    model: &Model,
    prompts: &[Vec<u32>],
    completions: &[Completion],
    n: usize,
    pad: u32,
) -> candle_core::Result<(Tensor, Tensor, usize)> {
    let (rows, plen) = rows(prompts, completions, n, pad);
    let (pads, ids, len) = left_pad(&rows);
    let device = Device::Cpu;
    let ids = Tensor::from_vec(ids, (rows.len(), len), &device)?;
    let logp = model.token_logp(&ids, &pads, plen)?;
    let clen = len - plen;
    let mut mask = vec![0f32; rows.len() * clen];
    let mut count = 0;
    for (i, c) in completions.iter().enumerate() {
        for j in 0..c.tokens.len() {
            mask[i * clen + j] = 1.0;
            count += 1;
        }
    }
    let mask = Tensor::from_vec(mask, (rows.len(), clen), &device)?;
    Ok((logp, mask, count))
}

/// Sequences per micro-batch in the step-equivalent (a multiple of the group size 4, dividing 16).
const MICRO: usize = 8;

fn main() -> candle_core::Result<()> {
    let device = Device::Cpu;
    let t = Instant::now();
    let (policy, tok) = load_smollm2(&device)?;
    println!(
        "load: {:.2} s ({} parameters), peak RSS {:.2} GiB",
        t.elapsed().as_secs_f64(),
        policy.parameter_count(),
        peak_rss_gib()
    );
    let questions = [
        "What is the capital of France?",
        "Give me three tips for staying healthy.",
        "Explain photosynthesis in one paragraph.",
        "Write a short poem about the sea.",
    ];
    let prompts: Vec<Vec<u32>> = questions
        .iter()
        .map(|q| tok.chat_ids(q))
        .collect::<candle_core::Result<_>>()?;
    let plens: Vec<usize> = prompts.iter().map(Vec::len).collect();
    println!("prompt lengths {plens:?}");

    // Sampling: 4 prompts × 4 samples = 16 sequences, exactly 64 new tokens each (no stop token).
    let settings = Settings {
        temperature: 1.0,
        top_p: 1.0,
        max_new_tokens: 64,
        stop: Vec::new(),
        entropy: false,
    };
    let mut rng = Rng::new(1);
    let t = Instant::now();
    let out = generate(&policy, &prompts, 4, &settings, &mut rng, &device)?;
    let secs = t.elapsed().as_secs_f64();
    let tokens: usize = out.iter().map(|c| c.tokens.len()).sum();
    println!(
        "sampling: {tokens} tokens (16 × 64) in {secs:.2} s = {:.1} tokens/s, peak RSS {:.2} GiB",
        tokens as f64 / secs,
        peak_rss_gib()
    );

    // Training throughput: one forward + backward over the 16 × (prompt + 64) rows (in a scope, so the
    // graph and its activations are freed before the next phase).
    {
        let t = Instant::now();
        let (logp, mask, count) = forward_logp(&policy, &prompts, &out, 4, tok.pad)?;
        let fwd = t.elapsed().as_secs_f64();
        let loss = ((logp * &mask)?.sum_all()? / count as f64)?.neg()?;
        let grads = loss.backward()?;
        let total = t.elapsed().as_secs_f64();
        let row_len = plens.iter().max().unwrap() + 64;
        println!(
        "training: forward {fwd:.2} s + backward {:.2} s over 16 × {row_len} tokens = {:.1} tokens/s, peak RSS {:.2} GiB",
        total - fwd,
        (16 * row_len) as f64 / total,
        peak_rss_gib()
    );
        drop(grads);
    }

    // A step-equivalent: sample (stop at <|im_end|>), reference log-probs, forward/backward with a
    // REINFORCE-shaped surrogate (group-centred random rewards), AdamW on every parameter.
    // Reset the peak-RSS mark (Linux: 5 → clear_refs resets VmHWM), so the step's own peak shows.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let reference = policy.frozen_copy()?;
    let mut optimizer = AdamW::new(
        policy.vars(),
        AdamWParams {
            lr: 1e-6,
            ..Default::default()
        },
    );
    for step in 0..2 {
        let t0 = Instant::now();
        let settings = Settings {
            temperature: 1.0,
            top_p: 1.0,
            max_new_tokens: 64,
            stop: tok.stop_ids().to_vec(),
            entropy: false,
        };
        let out = generate(&policy, &prompts, 4, &settings, &mut rng, &device)?;
        let t_sample = t0.elapsed().as_secs_f64();
        // Micro-batches of MICRO sequences (one prompt group of 4 = 4 sequences per micro-batch is the
        // smallest; 8 keeps the peak memory near 7 GiB), gradients accumulated, the loss normalised by
        // the total token count so the result does not depend on the micro-batch size.
        let count: usize = out.iter().map(|c| c.tokens.len()).sum();
        let rewards: Vec<f32> = (0..16).map(|_| rng.uniform() as f32).collect();
        let adv: Vec<f32> = (0..16)
            .map(|i| rewards[i] - rewards[i / 4 * 4..i / 4 * 4 + 4].iter().sum::<f32>() / 4.0)
            .collect();
        let (mut t_ref, mut t_train) = (0.0, 0.0);
        let mut grads = Grads::default();
        for m in 0..16 / MICRO {
            let groups = &prompts[m * MICRO / 4..(m + 1) * MICRO / 4];
            let rows = &out[m * MICRO..(m + 1) * MICRO];
            let t = Instant::now();
            let ref_logp = forward_logp(&reference, groups, rows, 4, tok.pad)?
                .0
                .detach();
            t_ref += t.elapsed().as_secs_f64();
            let t = Instant::now();
            let (logp, mask, _) = forward_logp(&policy, groups, rows, 4, tok.pad)?;
            let adv = Tensor::from_vec(
                adv[m * MICRO..(m + 1) * MICRO].to_vec(),
                (MICRO, 1),
                &device,
            )?;
            let kl = (&logp - &ref_logp)?;
            let objective = (logp.broadcast_mul(&adv)? - (kl * 0.04)?)?;
            let loss = ((objective * &mask)?.sum_all()? / count as f64)?.neg()?;
            let store = loss.backward()?;
            grads.accumulate(policy.vars(), &store)?;
            t_train += t.elapsed().as_secs_f64();
        }
        let t = Instant::now();
        grads.clip(1.0);
        optimizer.step(&grads)?;
        let t_opt = t.elapsed().as_secs_f64();
        let generated: usize = out.iter().map(|c| c.tokens.len()).sum();
        println!(
            "step {step}: {:.2} s total = sample {t_sample:.2} s ({generated} tokens) + reference logp \
             {t_ref:.2} s + forward/backward {t_train:.2} s (micro-batches of {MICRO}) + clip/AdamW {t_opt:.2} s, peak RSS {:.2} GiB",
            t0.elapsed().as_secs_f64(),
            peak_rss_gib()
        );
    }
    Ok(())
}
