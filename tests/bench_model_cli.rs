//! `rlx bench-model` through the binary on the embedded default's tiny model: one JSON line per phase,
//! in order, with the documented keys (docs/performance.md) and values that follow from the shapes; and
//! clear errors for bad arguments.

mod common;
use common::{json_lines, number, rlx};

#[test]
fn bench_model_prints_one_json_line_per_phase() {
    let output = rlx(&[
        "bench-model",
        "--config",
        "configs/default.toml",
        "--rows",
        "6",
        "--new-tokens",
        "3",
        "--runs",
        "2",
        "--steps",
        "2",
        "--set",
        "sft.steps=0",
    ]);
    let lines = json_lines(&output);
    let phases: Vec<&str> = lines.iter().map(|l| l["phase"].as_str().unwrap()).collect();
    assert_eq!(phases, ["sample", "train", "step"]);
    for line in &lines {
        assert!(number(line, "seconds") > 0.0, "{line}");
        assert!(number(line, "tokens_per_s") > 0.0, "{line}");
        // The heap peak includes the model's weights; the binary counts allocations.
        assert!(number(line, "peak_bytes") > 0.0, "{line}");
        assert!(line.get("peak_rss_bytes").is_some(), "{line}");
    }
    let (sample, train, step) = (&lines[0], &lines[1], &lines[2]);
    // Stop tokens are ignored: every row has exactly the new tokens asked for.
    assert_eq!(number(sample, "tokens"), 18.0);
    assert_eq!(number(train, "completion_tokens"), 18.0);
    assert_eq!(number(train, "runs"), 2.0);
    assert_eq!(train["seconds_each"].as_array().unwrap().len(), 2);
    let positions = number(train, "rows") * number(train, "width");
    let rate = positions / number(train, "seconds");
    assert!((number(train, "tokens_per_s") - rate).abs() < 1e-6 * rate);
    assert_eq!(number(step, "steps"), 2.0);
    assert_eq!(step["seconds_each"].as_array().unwrap().len(), 2);
    // The default config: 16 prompts × the recipe's 8 samples.
    assert_eq!(number(step, "prompts"), 16.0);
    assert_eq!(number(step, "n"), 8.0);
}

#[test]
fn bench_model_phases_can_be_chosen() {
    let output = rlx(&[
        "bench-model",
        "--config",
        "configs/default.toml",
        "--rows",
        "2",
        "--new-tokens",
        "2",
        "--phases",
        "train",
    ]);
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.contains("\"phase\":\"train\""), "{text}");
}

#[test]
fn bad_bench_model_arguments_are_clear_errors() {
    for (args, expected) in [
        (vec!["--rows", "0"], "--rows 0 must be in 1..=4096"),
        (
            vec!["--new-tokens", "0"],
            "--new-tokens 0 must be in 1..=65536",
        ),
        (
            vec!["--new-tokens", "100000"],
            "--new-tokens 100000 must be in",
        ),
        // The tiny model has 32 positions: a prompt plus 30 new tokens does not fit.
        (vec!["--new-tokens", "30"], "exceeds the model's"),
        (vec!["--runs", "0"], "--runs and --steps must be at least 1"),
    ] {
        let mut all = vec!["bench-model", "--config", "configs/default.toml"];
        all.extend(args);
        let output = rlx(&all);
        assert_eq!(output.status.code(), Some(1), "{all:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{all:?}: {stderr}");
    }
    let output = rlx(&["bench-model", "--config", "configs/no-such.toml"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("no-such.toml"));
}
