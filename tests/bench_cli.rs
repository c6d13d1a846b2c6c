//! `rlx bench` through the binary, on small shapes: one JSON line per backend with the documented keys
//! (docs/kernels.md), sane values, and clear errors for bad arguments.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn rlx(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rlx"))
        .args(args)
        .current_dir(PathBuf::from(env!("CARGO_MANIFEST_DIR")))
        .output()
        .expect("rlx runs")
}

fn json_lines(output: &std::process::Output) -> Vec<Value> {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone())
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).expect("each line is one JSON object"))
        .collect()
}

fn number(line: &Value, key: &str) -> f64 {
    line[key]
        .as_f64()
        .unwrap_or_else(|| panic!("`{key}` is not a number in {line}"))
}

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
