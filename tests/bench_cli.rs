//! `rlx bench` through the binary, on small shapes: one JSON line per backend with the documented keys
//! (docs/kernels.md), sane values, and clear errors for bad arguments.

use std::path::PathBuf;
use std::process::Command;

mod common;
use common::{json_lines, number, rlx};

#[test]
fn bench_prints_one_json_line_per_backend() {
    for recipe in [
        "recipes/dapo.rlx",
        "recipes/darling.rlx",
        "recipes/rubicon.rlx",
    ] {
        let output = rlx(&[
            "bench",
            recipe,
            "--groups",
            "3",
            "--n",
            "4",
            "--tokens",
            "16",
            "--threads",
            "2",
            "--runs",
            "2",
        ]);
        let lines = json_lines(&output);
        assert_eq!(lines.len(), 2, "{recipe}: {lines:?}");
        assert_eq!(lines[0]["backend"], "interp");
        assert_eq!(lines[1]["backend"], "jit");
        for line in &lines {
            assert_eq!(line["recipe"], recipe);
            assert_eq!(number(line, "tokens"), (3 * 4 * 16) as f64);
            for key in [
                "kernel_ms",
                "tokens_per_s",
                "batch_bytes",
                "peak_bytes_above_batch",
                "bound_ms",
                "bound_tokens_per_s",
                "memcpy_gb_s",
            ] {
                assert!(number(line, key) > 0.0, "{recipe}: `{key}` in {line}");
            }
            let implied = number(line, "tokens") / (number(line, "kernel_ms") / 1e3);
            assert!(
                (implied / number(line, "tokens_per_s") - 1.0).abs() < 1e-9,
                "{line}"
            );
        }
        let jit = &lines[1];
        assert_eq!(number(jit, "threads"), 2.0);
        assert!(number(jit, "compile_ms") > 0.0);
        assert!(number(jit, "outputs_bytes") > 0.0);
        // The interpreter holds f64 columns, the kernel f32 token columns.
        assert!(number(jit, "batch_bytes") < number(&lines[0], "batch_bytes"));
    }
}

#[test]
fn bench_runs_one_backend_and_accepts_an_artifact_and_params() {
    let directory = std::env::temp_dir().join(format!("rlx-bench-test-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let artifact = directory.join("grpo.rlxc");
    let compiled = Command::new(env!("CARGO_BIN_EXE_rlxc"))
        .args([
            "compile",
            "recipes/grpo.rlx",
            "-o",
            artifact.to_str().unwrap(),
        ])
        .current_dir(PathBuf::from(env!("CARGO_MANIFEST_DIR")))
        .output()
        .unwrap();
    assert!(compiled.status.success());
    let output = rlx(&[
        "bench",
        artifact.to_str().unwrap(),
        "--backend",
        "jit",
        "--groups",
        "2",
        "--n",
        "2",
        "--tokens",
        "8",
        "--runs",
        "1",
    ]);
    let lines = json_lines(&output);
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["backend"], "jit");
    let output = rlx(&[
        "bench",
        "recipes/grpo.rlx",
        "--backend",
        "interp",
        "--groups",
        "2",
        "--n",
        "2",
        "--tokens",
        "8",
        "--set",
        "beta=0.5",
    ]);
    let lines = json_lines(&output);
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["backend"], "interp");
    std::fs::remove_dir_all(&directory).ok();
}

#[test]
fn bench_rejects_bad_arguments_clearly() {
    let zero = rlx(&["bench", "recipes/grpo.rlx", "--groups", "0"]);
    assert_eq!(zero.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&zero.stderr).contains("must be at least 1"));
    let unknown = rlx(&[
        "bench",
        "recipes/grpo.rlx",
        "--set",
        "betta=1",
        "--tokens",
        "4",
    ]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("unknown param `betta`"));
    let backend = rlx(&["bench", "recipes/grpo.rlx", "--backend", "gpu"]);
    assert_eq!(backend.status.code(), Some(2));
    let missing = rlx(&["bench", "recipes/missing.rlx"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("cannot read"));
}

const SMALL: [&str; 8] = ["--groups", "2", "--n", "2", "--tokens", "8", "--runs", "1"];

fn bench(recipe: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["bench", recipe];
    args.extend(SMALL);
    args.extend(extra);
    rlx(&args)
}

#[test]
fn bench_device_cpu_is_the_default_and_a_malformed_device_is_a_usage_error() {
    let lines = json_lines(&bench("recipes/grpo.rlx", &["--device", "cpu"]));
    assert_eq!(lines.len(), 2, "{lines:?}");
    for (line, backend) in lines.iter().zip(["interp", "jit"]) {
        assert_eq!(line["backend"], backend);
        assert_eq!(line["device"], "cpu");
    }
    for device in ["tpu", "cuda:x", "cuda:-1", "cuda:", "gpu:0"] {
        let output = bench("recipes/grpo.rlx", &["--device", device]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{device}: {stderr}");
        assert!(
            stderr.contains(&format!("`{device}`: expected cpu, cuda or cuda:N")),
            "{device}: {stderr}"
        );
        assert!(output.stdout.is_empty());
    }
    let interp = bench(
        "recipes/grpo.rlx",
        &["--device", "cuda", "--backend", "interp"],
    );
    assert_eq!(interp.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&interp.stderr).contains("--backend interp runs on the CPU"));
}

/// `--device cuda`: the CUDA runner's one line on a GPU; elsewhere a clear error naming what is
/// missing (the `cuda` feature, or the driver / the GPU), exit status 1 and nothing on stdout.
#[test]
fn bench_on_cuda_times_the_gpu_kernels_or_says_what_is_missing() {
    for device in ["cuda", "cuda:0"] {
        let output = bench(
            "recipes/dapo.rlx",
            &["--device", device, "--backend", "jit"],
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        if cfg!(feature = "cuda") && output.status.success() {
            let lines = json_lines(&output);
            assert_eq!(lines.len(), 1, "{lines:?}");
            let line = &lines[0];
            assert_eq!(line["backend"], "cuda");
            assert_eq!(line["device"], "cuda:0");
            assert_eq!(line["device_index"], 0);
            assert_eq!(number(line, "tokens"), (2 * 2 * 8) as f64);
            for key in [
                "kernel_ms",
                "upload_ms",
                "resident_ms",
                "end_to_end_ms",
                "tokens_per_s",
                "compile_ms",
                "batch_bytes",
                "device_bytes",
                "bound_ms",
                "memcpy_gb_s",
                "block",
            ] {
                assert!(number(line, key) > 0.0, "`{key}` in {line}");
            }
            let implied = number(line, "tokens") / (number(line, "kernel_ms") / 1e3);
            assert!(
                (implied / number(line, "tokens_per_s") - 1.0).abs() < 1e-9,
                "{line}"
            );
        } else {
            assert_eq!(output.status.code(), Some(1), "{device}: {stderr}");
            assert!(output.stdout.is_empty());
            if cfg!(feature = "cuda") {
                assert!(
                    stderr.contains("NVIDIA") || stderr.contains("GPU") || stderr.contains("CUDA"),
                    "{stderr}"
                );
            } else {
                assert!(
                    stderr.contains("built without the `cuda` feature")
                        && stderr.contains("--features cuda"),
                    "{stderr}"
                );
            }
        }
    }
}
