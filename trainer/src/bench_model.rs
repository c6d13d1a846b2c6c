//! `rlx bench-model`: the trainer's throughput and memory on a config's model, phase by phase
//! (docs/performance.md records the numbers).
//!
//! * `sample`: the config's policy generates `rows` completions of exactly `new_tokens` tokens (stop
//!   tokens ignored, so every row has the same length) for `rows` of the task's prompts, batched with the
//!   KV cache, at the config's temperature and top-p. `tokens_per_s` counts generated tokens over the
//!   whole call; `prefill_seconds` (the `prompt_tokens` of the rows' prompts, one row per prompt) and
//!   `decode_seconds` split it, and `decode_tokens_per_s` is the rate of the decoding steps alone (the
//!   tokens after each row's first), the rate a GRPO step's n samples per prompt mostly run at.
//! * `train`: forward + backward + AdamW over those rows (prompt + completion, the log-probabilities of
//!   the completion tokens through the fused LM head, loss −mean logp, micro-batches of
//!   `train.micro_batch` rows), `runs` times; `seconds` is the median. `tokens_per_s` counts every
//!   position of the padded batch (`rows × width`), as a forward pass over the batch processes them;
//!   `completion_tokens` is given too.
//! * `step`: `steps` real steps of `rlx run` with the recipe (sampling with the task's stop tokens,
//!   reference log-probs, the signals, the fused kernel, backward, AdamW; no greedy evaluation), in a
//!   temporary run directory that is removed after; `seconds` is the median step time, `tokens_per_s` the sampled tokens per
//!   second of step; `sample_seconds`, `score_seconds` (signals and reference log-probs) and
//!   `train_seconds` (forward, backward, AdamW) are the medians of the step's parts.
//!
//! The sample and train phases also give `"cpu_seconds"`: the CPU time of the whole process over the
//! same span (the median over runs for train), which a shared machine distorts much less than the wall
//! time when one thread runs (`RAYON_NUM_THREADS=1`); with more threads it includes their waiting spins.
//!
//! Every phase line has `"phase"`, `"seconds"`, `"tokens_per_s"`, `"peak_bytes"` (the peak of live heap
//! bytes during the phase, model weights included, when the binary counts allocations; else null) and
//! `"peak_rss_bytes"` (the process's peak resident set during the phase, from /proc on Linux; else null).

use std::time::Instant;

use serde_json::{json, Value};

use crate::cli::Prepared;
use crate::optim::{AdamW, AdamWParams, Grads};
use crate::progress::Event;
use crate::rng::Rng;
use crate::sample::{generate_timed, Settings};
use crate::train::{completion_logp, err, run_with, Error, RunOptions};

/// Which phases to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Sample,
    Train,
    Step,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Sample => "sample",
            Phase::Train => "train",
            Phase::Step => "step",
        }
    }
}

/// What `rlx bench-model` measures.
#[derive(Clone, Debug)]
pub struct Options {
    pub rows: usize,
    pub new_tokens: usize,
    /// Timed repetitions of the train phase (the median is reported).
    pub runs: usize,
    /// Real steps of the step phase.
    pub steps: usize,
    pub phases: Vec<Phase>,
}

/// The most rows or new tokens `rlx bench-model` accepts.
pub const MAX_ROWS: usize = 4096;
pub const MAX_NEW_TOKENS: usize = 65_536;

/// The process's peak resident set since the last reset, in bytes (Linux; `None` elsewhere).
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kb * 1024)
}

/// Reset the peak resident set to the current one (Linux: `5` to clear_refs resets VmHWM).
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Run `work`, returning its result, the absolute peak of live heap bytes and the peak RSS during it.
fn measured<T>(work: impl FnOnce() -> T) -> (T, Option<usize>, Option<u64>) {
    reset_peak_rss();
    let before = rlx_runtime::bench::allocated_bytes();
    let (result, above) = rlx_runtime::bench::peak_during(work);
    let peak = match (before, above) {
        (Some(b), Some(a)) => Some(b + a),
        _ => None,
    };
    (result, peak, peak_rss())
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Measure the phases of `options` on `prepared`'s config and recipe, calling `emit` with one JSON object
/// per phase.
pub fn bench_model(
    prepared: Prepared,
    options: &Options,
    mut emit: impl FnMut(&Value),
) -> Result<(), Error> {
    if options.rows == 0 || options.rows > MAX_ROWS {
        return Err(format!("--rows {} must be in 1..={MAX_ROWS}", options.rows));
    }
    if options.new_tokens == 0 || options.new_tokens > MAX_NEW_TOKENS {
        return Err(format!(
            "--new-tokens {} must be in 1..={MAX_NEW_TOKENS}",
            options.new_tokens
        ));
    }
    if options.runs == 0 || options.steps == 0 {
        return Err("--runs and --steps must be at least 1".into());
    }
    let Prepared {
        config, plan, out, ..
    } = prepared;
    let device = crate::train::candle_device(plan.gpu)?;
    let threads = candle_core::utils::get_num_threads();
    let needs_samples = options
        .phases
        .iter()
        .any(|p| matches!(p, Phase::Sample | Phase::Train));
    if needs_samples {
        let max_positions = config.model.model_config()?.max_positions;
        let policy = config
            .model
            .build(config.seed, &device, config.train.compute_dtype()?)?;
        let mut prompt_rng = Rng::new(config.seed);
        let prompts: Vec<Vec<u32>> = plan
            .task
            .prompts(&mut prompt_rng, options.rows)?
            .into_iter()
            .map(|p| p.ids)
            .collect();
        if prompts.len() != options.rows {
            return Err(format!(
                "the task gave {} prompts for {} rows",
                prompts.len(),
                options.rows
            ));
        }
        let width = prompts.iter().map(Vec::len).max().unwrap_or(0) + options.new_tokens;
        if width > max_positions {
            return Err(format!(
                "a row of {width} positions (the longest prompt + --new-tokens) exceeds the model's {max_positions}"
            ));
        }
        let settings = Settings {
            temperature: plan.temperature,
            top_p: plan.top_p,
            max_new_tokens: options.new_tokens,
            stop: Vec::new(),
            entropy: false,
        };
        let mut sample_rng = Rng::new(config.seed ^ 0x5eed);
        let start = Instant::now();
        let cpu_start = cpu_seconds();
        let (generated, peak, rss) = measured(|| {
            generate_timed(
                &policy.no_grad(),
                &prompts,
                1,
                &settings,
                &mut sample_rng,
                &device,
            )
        });
        let (completions, timing) = generated.map_err(err)?;
        let seconds = start.elapsed().as_secs_f64();
        let cpu = cpu_seconds() - cpu_start;
        let generated: usize = completions.iter().map(|c| c.tokens.len()).sum();
        // The first token of each row comes from the prefill's logits; the decoding steps make the rest.
        let decoded = generated.saturating_sub(completions.len());
        let prompt_tokens: usize = prompts.iter().map(Vec::len).sum();
        if options.phases.contains(&Phase::Sample) {
            emit(&json!({
                "phase": "sample",
                "rows": options.rows,
                "new_tokens": options.new_tokens,
                "tokens": generated,
                "seconds": seconds,
                "tokens_per_s": generated as f64 / seconds,
                "cpu_seconds": cpu,
                "prompt_tokens": prompt_tokens,
                "prefill_seconds": timing.prefill_seconds,
                "decode_seconds": timing.decode_seconds,
                "decode_tokens_per_s": decoded as f64 / timing.decode_seconds,
                "peak_bytes": peak,
                "peak_rss_bytes": rss,
                "threads": threads,
            }));
        }
        if options.phases.contains(&Phase::Train) {
            let tokens: Vec<Vec<u32>> = completions.into_iter().map(|c| c.tokens).collect();
            let micro = match config.train.micro_batch {
                0 => options.rows,
                m => m.min(options.rows),
            };
            let mut opt = AdamW::new(policy.vars(), AdamWParams::of(&config.train));
            let count: usize = tokens.iter().map(Vec::len).sum();
            let mut times = Vec::new();
            let mut cpu_times = Vec::new();
            let (result, peak, rss) = measured(|| -> Result<(), Error> {
                for _ in 0..options.runs {
                    let start = Instant::now();
                    let cpu_start = cpu_seconds();
                    let mut grads = Grads::new(policy.vars());
                    for first in (0..options.rows).step_by(micro) {
                        let last = (first + micro).min(options.rows);
                        let logp = completion_logp(
                            &policy,
                            &prompts[first..last],
                            &tokens[first..last],
                            &device,
                        )
                        .map_err(err)?;
                        let loss = (logp.sum_all().map_err(err)? / -(count as f64)).map_err(err)?;
                        let store = loss.backward().map_err(err)?;
                        grads.accumulate(policy.vars(), &store).map_err(err)?;
                    }
                    opt.step(&grads).map_err(err)?;
                    crate::train::synchronize(&device)?;
                    times.push(start.elapsed().as_secs_f64());
                    cpu_times.push(cpu_seconds() - cpu_start);
                }
                Ok(())
            });
            result?;
            let positions = options.rows * width;
            let seconds = median(&mut times);
            emit(&json!({
                "phase": "train",
                "rows": options.rows,
                "width": width,
                "completion_tokens": count,
                "micro_batch": micro,
                "trainable_parameters": policy.parameter_count(),
                "runs": times.len(),
                "seconds": seconds,
                "seconds_each": times,
                "tokens_per_s": positions as f64 / seconds,
                "cpu_seconds": median(&mut cpu_times),
                "peak_bytes": peak,
                "peak_rss_bytes": rss,
                "threads": threads,
            }));
        }
    }
    if options.phases.contains(&Phase::Step) {
        let mut config = config;
        // One step more than runs, so that none of them is the last (which evaluates and checkpoints).
        config.steps = options.steps + 1;
        config.train.eval_every = 0;
        config.train.checkpoint_every = 0;
        let group_size = plan.group_size;
        let run_options = RunOptions {
            resume: None,
            stop_after: Some(options.steps),
            skip_evaluation: true,
        };
        let mut step_times = Vec::new();
        let (summary, peak, rss) = measured(|| {
            run_with(plan, &config, &out, &run_options, |event| {
                if let Event::Step(report) = event {
                    step_times.push(report.step_s);
                }
            })
        });
        let metrics = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap_or_default();
        let _ = std::fs::remove_dir_all(&out);
        summary?;
        let rows = (config.train.prompts_per_step * group_size) as f64;
        let lines: Vec<Value> = metrics
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .collect();
        let sampled: Vec<f64> = lines
            .iter()
            .filter_map(|v| v.get("response_length/mean").and_then(Value::as_f64))
            .map(|mean| mean * rows)
            .collect();
        // The median over the steps of each part of a step (the run's `time/…` metrics).
        let part = |key: &str| {
            let mut values: Vec<f64> = lines
                .iter()
                .filter_map(|v| v.get(key).and_then(Value::as_f64))
                .collect();
            (!values.is_empty()).then(|| median(&mut values))
        };
        let seconds = median(&mut step_times.clone());
        let tokens = if sampled.is_empty() {
            None
        } else {
            Some(sampled.iter().sum::<f64>() / sampled.len() as f64)
        };
        emit(&json!({
            "phase": "step",
            "steps": step_times.len(),
            "prompts": config.train.prompts_per_step,
            "n": group_size,
            "max_new_tokens": config.sampler.max_new_tokens,
            "seconds": seconds,
            "seconds_each": step_times,
            "sample_seconds": part("time/sample_s"),
            "score_seconds": part("time/score_s"),
            "train_seconds": part("time/train_s"),
            "sampled_tokens": tokens,
            "tokens_per_s": tokens.map(|t| t / seconds),
            "peak_bytes": peak,
            "peak_rss_bytes": rss,
            "threads": threads,
        }));
    }
    Ok(())
}

/// The CPU time this process has used so far (all threads), in seconds; 0 where the clock is missing
/// (also `trainer/examples/gemm_rate.rs`'s clock).
pub fn cpu_seconds() -> f64 {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, t: *mut Timespec) -> i32;
    }
    const CLOCK_PROCESS_CPUTIME_ID: i32 = 2;
    let mut t = Timespec { sec: 0, nsec: 0 };
    // SAFETY: `t` is a valid, writable timespec of the C layout; the clock id exists on Linux and
    // elsewhere the call fails and leaves `t` at zero.
    match unsafe { clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &mut t) } {
        0 => t.sec as f64 + t.nsec as f64 * 1e-9,
        _ => 0.0,
    }
}
