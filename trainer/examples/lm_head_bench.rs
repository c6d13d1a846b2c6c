//! The fused LM head (`rlx_trainer::head::fused_logp_entropy`, candle ops in vocabulary chunks) on a
//! device, for scripts/gpu-check.sh: one forward + backward pass of Σ logp + ½ Σ entropy over `--rows`
//! positions, hidden size `--hidden` and a vocabulary of `--vocab`, timed (median of `--runs`, each
//! synchronised) with the peak device memory above the inputs (4·(n·h + V·h + 4n) bytes), and the values that
//! scripts/torch_head_bench.py compares with PyTorch's materialised logits on the same inputs:
//!
//! cargo run --release --features cuda -p rlx-trainer --example lm_head_bench -- \
//!     --device cuda:0 --rows 4096 --vocab 151936 --hidden 896 --out head.json
//!
//! The inputs are a formula both programs evaluate in f64 and round to f32 (no file of weights to pass):
//! hidden[i, j] = sin(0.37 i + 1.31 j + 0.5), weight[v, j] = 0.08 cos(0.73 v + 2.17 j + 0.011 v j),
//! target[i] = (7919 i + 13) mod V. On the CPU (`--device cpu`, the smoke mode of gpu-check.sh) the peak
//! is the resident set's growth (VmHWM), on a GPU the memory pool's high-water mark
//! (`rlx_trainer::memory::gpu_peak_bytes`).

use rlx_trainer::head::{benchmark, BenchShape};

struct Args {
    device: String,
    rows: usize,
    vocab: usize,
    hidden: usize,
    runs: usize,
    out: Option<String>,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        device: "cpu".into(),
        rows: 4096,
        vocab: 151_936,
        hidden: 896,
        runs: 5,
        out: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{flag} {value}: expected a positive whole number"))
        };
        match flag.as_str() {
            "--device" => args.device = value.clone(),
            "--rows" => args.rows = number()?,
            "--vocab" => args.vocab = number()?,
            "--hidden" => args.hidden = number()?,
            "--runs" => args.runs = number()?,
            "--out" => args.out = Some(value.clone()),
            other => {
                return Err(format!(
                    "unknown flag {other} (--device, --rows, --vocab, --hidden, --runs, --out)"
                ))
            }
        }
    }
    Ok(args)
}

fn main() -> Result<(), String> {
    let args = parse()?;
    let chosen = rlx_trainer::config::TrainDevice::parse(&args.device)?;
    let device = rlx_trainer::train::candle_device(chosen.gpu())?;
    let shape = BenchShape {
        rows: args.rows,
        vocab: args.vocab,
        hidden: args.hidden,
        runs: args.runs,
    };
    let mut document = benchmark(&device, shape)?;
    document["device"] = chosen.to_string().into();
    println!("{document}");
    if let Some(path) = &args.out {
        std::fs::write(path, format!("{document}\n"))
            .map_err(|e| format!("cannot write {path}: {e}"))?;
    }
    Ok(())
}
