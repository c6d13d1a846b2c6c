//! Peak resident memory and time of one forward + backward pass of the LM head's log-probabilities and
//! entropies on a synthetic head (hidden size 576 as SmolLM2-135M's, 2048 positions, vocabulary V), either
//! fused (`rlx_trainer::head::fused_logp_entropy` at the default budget) or materialised (the full
//! [2048 × V] logits, `naive_logp_entropy`). Run each mode and V in its own process (the peak, VmHWM, is
//! per process):
//!
//! cargo run --release --workspace --example head_memory -- MODE V
//!
//! MODE is `fused` or `naive`. The four cases (V = 49152, SmolLM2's vocabulary, and 151936, Qwen2.5's),
//! one process each:
//!
//! cargo build --release --workspace --example head_memory
//! for v in 49152 151936; do for m in fused naive; do target/release/examples/head_memory $m $v; done; done
//!
//! The inputs are the same in both modes (a fixed seed), so the printed mean entropy and |∂|² (the sum of
//! the squared gradients w.r.t. hidden and weight) of the two modes agree.
//!
//! Measured on 2 shared CPU cores (other builds running, so the times are loose): V = 49152, fused +312 MiB
//! in 10.4 s, naive +5763 MiB in 22.7 s; V = 151936, fused +739 MiB in 65.5 s, naive +17806 MiB in 124.4 s.
//! The fused peak is about two [V, 576] f32 tensors (∂weight, and candle's gradient store adding it to its
//! zeros) plus ~100 MiB of chunks; the naive one is about 15 times the [2048, V] logits. Mind the naive
//! case at V = 151936: it needs ~18 GiB.

use std::time::Instant;

use candle_core::{Device, Tensor, Var};
use rlx_trainer::head::{fused_logp_entropy, naive_logp_entropy, DEFAULT_BUDGET};
use rlx_trainer::rng::Rng;

const HIDDEN: usize = 576;
const POSITIONS: usize = 2048;

/// A field of /proc/self/status in MiB (VmHWM: peak resident set size; VmRSS: current).
fn status_mib(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: head_memory fused|naive V";
    let [mode, vocab] = args.as_slice() else {
        return Err(usage.into());
    };
    let vocab: usize = vocab.parse().map_err(|_| usage.to_string())?;
    if vocab == 0 || !matches!(mode.as_str(), "fused" | "naive") {
        return Err(usage.into());
    }
    let run = || -> candle_core::Result<(f64, f64, f64, f64, f64)> {
        let device = Device::Cpu;
        // Inputs of the scale of a trained head (logits of a few units), from a fixed seed.
        let mut rng = Rng::new(14);
        let mut normal = |len: usize, scale: f64| -> Vec<f32> {
            (0..len).map(|_| (rng.normal() * scale) as f32).collect()
        };
        let hidden = Var::from_vec(
            normal(POSITIONS * HIDDEN, 1.0),
            (POSITIONS, HIDDEN),
            &device,
        )?;
        let weight = Var::from_vec(normal(vocab * HIDDEN, 0.05), (vocab, HIDDEN), &device)?;
        let coeffs = Tensor::from_vec(normal(POSITIONS * 2, 1.0), (POSITIONS, 2), &device)?;
        let targets: Vec<u32> = (0..POSITIONS)
            .map(|_| rng.int(0, vocab - 1) as u32)
            .collect();
        let targets = Tensor::from_vec(targets, POSITIONS, &device)?;
        // Reset the peak to the current resident set ("5" > clear_refs, Linux ≥ 4.0), so that the peak
        // read after the step is the step's own.
        if std::fs::write("/proc/self/clear_refs", "5").is_err() {
            eprintln!("warning: could not reset VmHWM; the peak may include the inputs' creation");
        }
        let before = status_mib("VmRSS:");
        let start = Instant::now();
        let result = match mode.as_str() {
            "fused" => fused_logp_entropy(&hidden, &weight, &targets, DEFAULT_BUDGET)?,
            _ => naive_logp_entropy(&hidden, &weight, &targets)?,
        };
        let loss = (&result * &coeffs)?.sum_all()?;
        let grads = loss.backward()?;
        let d_hidden = grads.get(&hidden).expect("∂hidden");
        let d_weight = grads.get(&weight).expect("∂weight");
        let checksum = (d_hidden.sqr()?.sum_all()?.to_scalar::<f32>()?
            + d_weight.sqr()?.sum_all()?.to_scalar::<f32>()?) as f64;
        let seconds = start.elapsed().as_secs_f64();
        let peak = status_mib("VmHWM:");
        let mean_entropy = result.narrow(1, 1, 1)?.mean_all()?.to_scalar::<f32>()? as f64;
        Ok((before, peak, seconds, mean_entropy, checksum))
    };
    let (before, peak, seconds, mean_entropy, checksum) = run().map_err(|e| e.to_string())?;
    let weight_mib = (vocab * HIDDEN * 4) as f64 / (1024.0 * 1024.0);
    println!(
        "mode {mode} V {vocab}: peak over the step +{:.0} MiB (resident before {before:.0} MiB, peak {peak:.0} MiB; \
         one [V, {HIDDEN}] f32 tensor is {weight_mib:.0} MiB, the [{POSITIONS}, V] logits {:.0} MiB); {seconds:.1} s; \
         mean entropy {mean_entropy:.4}, |∂|² {checksum:.6e}",
        peak - before,
        (POSITIONS * vocab * 4) as f64 / (1024.0 * 1024.0)
    );
    Ok(())
}
