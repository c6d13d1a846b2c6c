//! The group-size limit of pairwise recipes (`over others`: n·(n − 1) pairs per group) through
//! `rlx score`: a group past `RLX_MAX_GROUP` (1024 by default) is refused at once, naming the group,
//! its size, the limit and how to raise it; a group at the limit is scored.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A rollout file for `recipes/darling.rlx`: group "small" of 3 responses, then group "big" of `big`.
fn rollouts(name: &str, big: usize) -> PathBuf {
    let mut text = String::new();
    for (group, count) in [("small", 3), ("big", big)] {
        for r in 0..count {
            text.push_str(&format!(
                "{{\"group\":\"{group}\",\"logp\":[-1.0,-0.5],\"old_logp\":[-1.0,-0.6],\
                 \"ref_logp\":[-1.1,-0.5],\"quality\":{},\"cluster\":{}}}\n",
                (r % 5) as f64 / 4.0,
                r % 3
            ));
        }
    }
    let path = std::env::temp_dir().join(format!(
        "rlx-group-limit-{name}-{}.jsonl",
        std::process::id()
    ));
    std::fs::write(&path, text).expect("the rollout file is written");
    path
}

/// `rlx score recipes/darling.rlx --rollouts FILE [extra]` with `RLX_MAX_GROUP` set to `limit` (or
/// unset), and how long it took.
fn score(file: &PathBuf, limit: Option<&str>, extra: &[&str]) -> (Output, Duration) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rlx"));
    command
        .args(["score", "recipes/darling.rlx", "--rollouts"])
        .arg(file)
        .args(extra)
        .current_dir(root())
        .env_remove("RLX_MAX_GROUP");
    if let Some(limit) = limit {
        command.env("RLX_MAX_GROUP", limit);
    }
    let start = Instant::now();
    let output = command.output().expect("rlx runs");
    (output, start.elapsed())
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).to_string()
}

#[test]
fn a_group_past_the_limit_is_refused_at_once() {
    let file = rollouts("past", 1025);
    for backend in ["jit", "interp"] {
        let (output, elapsed) = score(&file, None, &["--backend", backend]);
        let message = stderr(&output);
        assert!(
            !output.status.success(),
            "{backend}: scored a group of 1025"
        );
        assert!(
            message.contains(
                "group \"big\" has 1025 responses, more than the 1024 per group that a recipe with \
                 pairwise terms (`over others`) accepts"
            ) && message.contains("raise the limit with RLX_MAX_GROUP=1025"),
            "{backend}: {message}"
        );
        assert!(
            elapsed < Duration::from_secs(20),
            "{backend}: refusing took {elapsed:?}"
        );
    }
    let _ = std::fs::remove_file(&file);
}

#[test]
fn a_group_at_the_limit_is_scored() {
    let file = rollouts("at", 1024);
    let (output, _) = score(&file, None, &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let document: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("a JSON document");
    assert_eq!(document["responses"].as_array().map(Vec::len), Some(1027));
    let _ = std::fs::remove_file(&file);
}

#[test]
fn rlx_max_group_moves_the_limit_and_a_bad_value_is_an_error() {
    let file = rollouts("moved", 5);
    let (output, _) = score(&file, Some("4"), &[]);
    let message = stderr(&output);
    assert!(
        !output.status.success()
            && message.contains("group \"big\" has 5 responses, more than the 4 per group")
            && message.contains("RLX_MAX_GROUP=5"),
        "{message}"
    );
    let (output, _) = score(&file, Some("5"), &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    for bad in ["lots", "0", "-3", "2.5"] {
        let (output, _) = score(&file, Some(bad), &[]);
        let message = stderr(&output);
        assert!(
            !output.status.success()
                && message.contains(&format!(
                    "RLX_MAX_GROUP={bad} is not a number of responses (a whole number ≥ 1)"
                )),
            "RLX_MAX_GROUP={bad}: {message}"
        );
    }
    let _ = std::fs::remove_file(&file);
}

#[test]
fn a_recipe_without_pairwise_terms_ignores_the_limit() {
    // grpo has no pairwise term: a group of 1025 is linear work and is scored; RLX_MAX_GROUP is not
    // even read (a bad value does not matter).
    let mut text = String::new();
    for r in 0..1025 {
        text.push_str(&format!(
            "{{\"group\":\"big\",\"logp\":[-1.0],\"old_logp\":[-1.0],\"ref_logp\":[-1.1],\"score\":{}}}\n",
            r % 2
        ));
    }
    let file =
        std::env::temp_dir().join(format!("rlx-group-limit-grpo-{}.jsonl", std::process::id()));
    std::fs::write(&file, text).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_rlx"))
        .args(["score", "recipes/grpo.rlx", "--rollouts"])
        .arg(&file)
        .current_dir(root())
        .env("RLX_MAX_GROUP", "lots")
        .output()
        .expect("rlx runs");
    assert!(output.status.success(), "{}", stderr(&output));
    let _ = std::fs::remove_file(&file);
}
