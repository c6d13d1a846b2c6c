//! The fused layers against the plain candle layers on one device (`device_kernels::compare_layers`):
//! one forward and backward pass of a tiny model each way, the largest relative differences of the
//! LM head's values and of every parameter's gradient. `scripts/gpu-check.sh` runs it on the GPU (the
//! CUDA kernels of `device_kernels.cu` against candle's own kernels) and, in its smoke mode, on the CPU.
//!
//! ```sh
//! cargo run --release --features cuda -p rlx-trainer --example layers_check -- --device cuda:0 [--out FILE]
//! ```
//!
//! Prints one JSON line (also written to FILE); exit status 1 when the two disagree beyond
//! `LAYERS_TOLERANCE`, 2 for a usage error.

use rlx_trainer::device_kernels::compare_layers;

fn main() {
    let mut device = "cpu".to_string();
    let mut out = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--device", Some(value)) => device = value,
            ("--out", Some(value)) => out = Some(value),
            _ => {
                eprintln!("usage: layers_check [--device cpu|cuda:N] [--out FILE]");
                std::process::exit(2);
            }
        }
    }
    let candle_device = match device.as_str() {
        "cpu" => candle_core::Device::Cpu,
        other => {
            let ordinal = other
                .strip_prefix("cuda")
                .map(|rest| rest.trim_start_matches(':'))
                .and_then(|n| {
                    if n.is_empty() {
                        Some(0)
                    } else {
                        n.parse().ok()
                    }
                });
            let Some(ordinal) = ordinal else {
                eprintln!("layers_check: --device {other}: expected cpu, cuda or cuda:N");
                std::process::exit(2);
            };
            if let Err(e) = rlx_runtime::probe_gpu(ordinal) {
                eprintln!("layers_check: {e}");
                std::process::exit(1);
            }
            match candle_core::Device::new_cuda(ordinal) {
                Ok(d) => d,
                Err(e) => {
                    eprintln!("layers_check: --device {other}: {e}");
                    std::process::exit(1);
                }
            }
        }
    };
    let report = match compare_layers(&candle_device) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("layers_check: {e}");
            std::process::exit(1);
        }
    };
    let line = report.to_json(&device).to_string();
    println!("{line}");
    if let Some(path) = out {
        if let Err(e) = std::fs::write(&path, format!("{line}\n")) {
            eprintln!("layers_check: cannot write {path}: {e}");
            std::process::exit(1);
        }
    }
    if !report.agree() {
        eprintln!("layers_check: fused and plain layers disagree beyond the tolerance");
        std::process::exit(1);
    }
}
