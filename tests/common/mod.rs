//! Shared by the root package's integration tests: the `rlx` binary run from the repository root, its
//! JSON-lines output, and the settings of a quick `rlx run`. (Each test crate uses a part of it.)
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

/// `rlx ARGS…` run from the repository root.
pub fn rlx(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rlx"))
        .args(args)
        .current_dir(PathBuf::from(env!("CARGO_MANIFEST_DIR")))
        .output()
        .expect("rlx runs")
}

/// The JSON objects of a successful run's stdout, one per line.
pub fn json_lines(output: &Output) -> Vec<Value> {
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

/// `line[key]` as a number (a panic naming the key otherwise).
pub fn number(line: &Value, key: &str) -> f64 {
    line[key]
        .as_f64()
        .unwrap_or_else(|| panic!("`{key}` is not a number in {line}"))
}

/// `rlx run` settings for a test run of about a second: a one-step warm start, a tiny batch, no
/// held-out evaluation between steps, the JIT backend (add `--steps N`).
pub const QUICK_RUN: [&str; 10] = [
    "--set",
    "sft.steps=1",
    "--set",
    "task.eval_questions=4",
    "--set",
    "train.prompts_per_step=2",
    "--set",
    "train.eval_every=0",
    "--set",
    "backend=jit",
];
