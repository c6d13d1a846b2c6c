//! `rlx run --device`: `cpu` trains as before, a malformed device is a usage error, and `cuda` runs the
//! recipe's kernels on the GPU (agreeing with the CPU kernel) or, without the `cuda` feature, a driver
//! or a GPU, is a clear error before anything is written.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

mod common;

/// One step after a one-step warm start on a tiny batch: about a second.
fn quick() -> Vec<&'static str> {
    let mut args = vec!["--steps", "1"];
    args.extend(common::QUICK_RUN);
    args
}

fn rlx_run(out: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rlx"))
        .args(["run", "recipes/grpo.rlx", "--out"])
        .arg(out)
        .args(args)
        .current_dir(PathBuf::from(env!("CARGO_MANIFEST_DIR")))
        .output()
        .expect("rlx runs")
}

fn out_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rlx-run-device-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("readable")).expect("JSON")
}

fn first_metrics(out: &Path) -> Value {
    let text = std::fs::read_to_string(out.join("metrics.jsonl")).expect("metrics.jsonl");
    serde_json::from_str(text.lines().next().expect("a metrics line")).expect("JSON line")
}

#[test]
fn run_device_cpu_trains_with_the_configured_backend() {
    let out = out_dir("cpu");
    let mut args = vec!["--device", "cpu"];
    args.extend(quick());
    let output = rlx_run(&out, &args);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(json(&out.join("summary.json"))["objective"], "jit");
    assert_eq!(first_metrics(&out)["step"], 0);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn run_rejects_a_malformed_device_before_anything_is_written() {
    for device in ["tpu", "cuda:x", "cuda:", "CUDA"] {
        let out = out_dir("bad");
        let mut args = vec!["--device", device];
        args.extend(quick());
        let output = rlx_run(&out, &args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{device}: {stderr}");
        assert!(
            stderr.contains(&format!("`{device}`: expected cpu, cuda or cuda:N")),
            "{device}: {stderr}"
        );
        assert!(!out.exists(), "{device}: {} was created", out.display());
    }
}

/// On a GPU (feature `cuda`): the whole step runs there, so when both runs sampled the same step-0
/// completions (the same sampling stream; float rounding may flip a draw) the first step's metrics
/// (loss, gradient norm, rewards, KL) are the CPU's within 1e-3 relative (f32 model arithmetic on two
/// devices, docs/gpu.md), the metrics carry `gpu/peak_bytes`, and the summary names the objective
/// `cuda`. Elsewhere: exit status 1, an error naming what is missing, and no output directory.
#[test]
fn run_on_cuda_matches_the_cpu_kernel_or_says_what_is_missing() {
    // A longer warm start than quick()'s so that the first step has rewards, a loss and a gradient.
    let mut args: Vec<&str> = quick();
    args.extend(["--set", "sft.steps=60", "--set", "train.prompts_per_step=4"]);
    let gpu_out = out_dir("cuda");
    let mut gpu_args = vec!["--device", "cuda"];
    gpu_args.extend(&args);
    let output = rlx_run(&gpu_out, &gpu_args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if cfg!(feature = "cuda") && output.status.success() {
        assert_eq!(json(&gpu_out.join("summary.json"))["objective"], "cuda");
        let cpu_out = out_dir("cuda-cpu");
        let mut cpu_args = vec!["--device", "cpu"];
        cpu_args.extend(&args);
        let cpu = rlx_run(&cpu_out, &cpu_args);
        assert!(
            cpu.status.success(),
            "{}",
            String::from_utf8_lossy(&cpu.stderr)
        );
        let (a, b) = (first_metrics(&cpu_out), first_metrics(&gpu_out));
        assert!(
            a["loss"].as_f64().unwrap() != 0.0,
            "a trivial first step: {a}"
        );
        assert!(b["gpu/peak_bytes"].as_u64().is_some_and(|p| p > 0), "{b}");
        let completions = |out: &Path| -> Vec<Value> {
            std::fs::read_to_string(out.join("samples.jsonl"))
                .expect("samples.jsonl")
                .lines()
                .map(|l| serde_json::from_str::<Value>(l).expect("JSON line"))
                .filter(|l| l["step"] == 0)
                .map(|l| l["completion"].clone())
                .collect()
        };
        if completions(&cpu_out) != completions(&gpu_out) {
            eprintln!("the two runs sampled different step-0 completions: metrics not compared");
            return;
        }
        for (key, x) in a.as_object().unwrap() {
            if rlx_trainer::train::TIMING_KEYS.contains(&key.as_str()) {
                continue;
            }
            let (Some(x), Some(y)) = (x.as_f64(), b[key].as_f64()) else {
                continue;
            };
            assert!(
                (x - y).abs() <= 1e-3 * x.abs().max(y.abs()) + 1e-6,
                "{key}: cpu {x}, cuda {y}"
            );
        }
        let _ = std::fs::remove_dir_all(&cpu_out);
        let _ = std::fs::remove_dir_all(&gpu_out);
    } else {
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        if cfg!(feature = "cuda") {
            assert!(
                stderr.contains("NVIDIA") || stderr.contains("GPU") || stderr.contains("CUDA"),
                "{stderr}"
            );
        } else {
            assert!(
                stderr.contains("--device cuda:0")
                    && stderr.contains("built without the `cuda` feature")
                    && stderr.contains("--features cuda"),
                "{stderr}"
            );
        }
        assert!(
            !gpu_out.exists(),
            "{} was written before the error",
            gpu_out.display()
        );
    }
}
