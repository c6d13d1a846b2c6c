//! Peak resident memory and time of one yes/no judge batch on SmolLM2-135M-Instruct, with the judge's
//! forward pass recording the backpropagation graph (`tracked`: what `judge::p_yes` did before it used
//! the model's no-grad view) or not (`no-grad`: `judge::p_yes` as it is). Run each mode in its own process
//! (the peak, VmHWM, is per process); docs/models.md records the numbers. Needs `scripts/fetch-assets.sh`.
//!
//! cargo run --release -p rlx-trainer --example judge_memory -- MODE BATCH TOKENS
//!
//! MODE is `tracked` or `no-grad`, BATCH the questions in the one forward pass, TOKENS the length of each
//! question in the chat template (a HealthBench rubric question is a few hundred).

use std::time::Instant;

use candle_core::{Device, Tensor};
use rlx_trainer::gguf::load_smollm2;
use rlx_trainer::judge::{self, YesNo};
use rlx_trainer::sample::left_pad;

/// A field of /proc/self/status in GiB (VmHWM: peak resident set size; VmRSS: current).
fn status_gib(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0 / 1024.0)
        .unwrap_or(0.0)
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: judge_memory tracked|no-grad BATCH TOKENS";
    let [mode, batch, tokens] = args.as_slice() else {
        return Err(usage.into());
    };
    let batch: usize = batch.parse().map_err(|_| usage.to_string())?;
    let tokens: usize = tokens.parse().map_err(|_| usage.to_string())?;
    if batch == 0 || !matches!(mode.as_str(), "tracked" | "no-grad") {
        return Err(usage.into());
    }
    let device = Device::Cpu;
    let (model, tok) = load_smollm2(&device).map_err(|e| e.to_string())?;
    // Questions of about `tokens` tokens each (chat template included), all different.
    let sentence =
        "The patient reports a mild headache, some fatigue and a slight fever since yesterday. ";
    let questions: Vec<String> = (0..batch)
        .map(|i| {
            let mut q = format!("Case {i}. ");
            while judge::judge_ids(&tok, &q).map_or(0, |ids| ids.len()) < tokens {
                q.push_str(sentence);
            }
            q.push_str("Does the response recommend seeing a doctor?");
            q
        })
        .collect();
    let lengths: Vec<usize> = questions
        .iter()
        .map(|q| judge::judge_ids(&tok, q).map(|ids| ids.len()))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let loaded = status_gib("VmHWM:");
    // Reset the peak to the current resident set ("5" > clear_refs, Linux ≥ 4.0), so that the peak read
    // after the batch is the batch's own even when loading peaked higher.
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let resident = status_gib("VmRSS:");
    let start = Instant::now();
    let p = match mode.as_str() {
        "no-grad" => {
            judge::p_yes(&model, &tok, &questions, batch, &device).map_err(|e| e.to_string())?
        }
        _ => {
            // The judge's forward as it was: on the model itself, whose weights are `Var`s.
            let prompts: Vec<Vec<u32>> = questions
                .iter()
                .map(|q| judge::judge_ids(&tok, q))
                .collect::<Result<_, _>>()
                .map_err(|e| e.to_string())?;
            let (pads, ids, len) = left_pad(&prompts);
            let run = || -> candle_core::Result<Vec<f64>> {
                let ids = Tensor::from_vec(ids, (prompts.len(), len), &device)?;
                let hidden = model.hidden(&ids, 0, &pads, None)?;
                let last = hidden.narrow(1, len - 1, 1)?.squeeze(1)?;
                let logits = model.logits(&last)?;
                assert!(logits.track_op());
                let yes_no = YesNo::new(&tok)?;
                Ok(logits
                    .to_vec2::<f32>()?
                    .iter()
                    .map(|row| yes_no.p_yes(row))
                    .collect())
            };
            run().map_err(|e| e.to_string())?
        }
    };
    let seconds = start.elapsed().as_secs_f64();
    let peak = status_gib("VmHWM:");
    if !reset {
        eprintln!("warning: could not reset VmHWM; the peak may be loading's");
    }
    println!(
        "mode {mode}: {batch} questions of {}–{} tokens; resident after loading {resident:.2} GiB (peak so far {loaded:.2}); \
         peak during the batch {peak:.2} GiB (+{:.2} GiB over the loaded model); {seconds:.1} s; P(yes) of the first {:.4}",
        lengths.iter().min().unwrap_or(&0),
        lengths.iter().max().unwrap_or(&0),
        peak - resident,
        p[0]
    );
    Ok(())
}
