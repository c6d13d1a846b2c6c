//! `rlx score` end to end: hand-worked cases (tests/scores/), finite-difference gradient checks for every
//! recipe in recipes/, and the command line's handling of bad input.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use rlx_runtime::synthetic;
use rlx_runtime::{evaluate, Context};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn check(path: &Path) -> rlx_compiler::hir::Recipe {
    let checked = rlx_compiler::check_path(path).expect("readable recipe");
    assert!(
        !checked.has_errors(),
        "{}: {:?}",
        path.display(),
        checked.diagnostics
    );
    checked.recipe.expect("clean recipe")
}

/// Compare `actual` with `expected` (numbers within `tolerance`, arrays element-wise).
fn compare(
    what: &str,
    expected: &Value,
    actual: &Value,
    tolerance: f64,
    failures: &mut Vec<String>,
) {
    match (expected, actual) {
        (Value::Number(e), Value::Number(a)) => {
            let (e, a) = (
                e.as_f64().unwrap_or(f64::NAN),
                a.as_f64().unwrap_or(f64::NAN),
            );
            if (e - a).abs() > tolerance {
                failures.push(format!("{what}: expected {e}, got {a}"));
            }
        }
        (Value::Array(e), Value::Array(a)) => {
            if e.len() != a.len() {
                failures.push(format!(
                    "{what}: expected {} values, got {}",
                    e.len(),
                    a.len()
                ));
                return;
            }
            for (index, (e, a)) in e.iter().zip(a).enumerate() {
                compare(&format!("{what}[{index}]"), e, a, tolerance, failures);
            }
        }
        (e, a) if e == a => {}
        (e, a) => failures.push(format!("{what}: expected {e}, got {a}")),
    }
}

/// Every `*.expected.json` under `folder`, recursively.
fn expected_files(folder: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![folder.to_path_buf()];
    while let Some(directory) = stack.pop() {
        for entry in std::fs::read_dir(&directory)
            .expect("readable folder")
            .flatten()
        {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.to_string_lossy().ends_with(".expected.json") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// The hand-worked cases of tests/scores/ (and its subfolders, one per stdlib area): see its README.
#[test]
fn hand_worked_cases_match() {
    let mut failures = Vec::new();
    let entries = expected_files(&root().join("tests/scores"));
    let count = entries.len();
    for expected_path in entries {
        let cases = expected_path
            .parent()
            .expect("a file has a folder")
            .to_path_buf();
        let name = expected_path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .replace(".expected.json", "");
        let label = expected_path
            .strip_prefix(root())
            .unwrap_or(&expected_path)
            .display()
            .to_string();
        let expected: Value =
            match serde_json::from_str(&std::fs::read_to_string(&expected_path).unwrap()) {
                Ok(value) => value,
                Err(error) => {
                    failures.push(format!("{label}: invalid JSON: {error}"));
                    continue;
                }
            };
        let recipe_path = match expected.get("recipe").and_then(Value::as_str) {
            Some(relative) => root().join(relative),
            None => cases.join(format!("{name}.rlx")),
        };
        let checked = rlx_compiler::check_path(&recipe_path).expect("readable recipe");
        let Some(recipe) = checked.recipe else {
            failures.push(format!(
                "{label}: the recipe does not check: {:?}",
                checked.diagnostics
            ));
            continue;
        };
        let rollouts =
            std::fs::read_to_string(cases.join(format!("{name}.jsonl"))).unwrap_or_default();
        let overrides: Vec<(String, f64)> = match expected.get("set") {
            Some(Value::Object(set)) => set
                .iter()
                .map(|(k, v)| (k.clone(), v.as_f64().unwrap_or(f64::NAN)))
                .collect(),
            _ => Vec::new(),
        };
        let show: Vec<String> = match expected.get("show") {
            Some(Value::Object(show)) => show.keys().cloned().collect(),
            _ => Vec::new(),
        };
        // `rlx score --step --progress`.
        let context = rlx_runtime::Context {
            step: expected.get("step").and_then(Value::as_f64).unwrap_or(0.0),
            progress: expected
                .get("progress")
                .and_then(Value::as_f64)
                .unwrap_or(0.0),
        };
        // Both the interpreter (the oracle) and the kernels must give the hand-worked values.
        for backend in [
            rlx_runtime::score::Backend::Interp,
            rlx_runtime::score::Backend::Jit,
        ] {
            let scored = match rlx_runtime::score::score_at(
                &recipe, &rollouts, &overrides, true, backend, &show, &context,
            ) {
                Ok(scored) => scored.document,
                Err(message) => {
                    match expected.get("error").and_then(Value::as_str) {
                        Some(wanted) if message.to_string().contains(wanted) => {}
                        _ => failures.push(format!("{label} ({backend:?}): {message}")),
                    }
                    continue;
                }
            };
            if let Some(wanted) = expected.get("error") {
                failures.push(format!(
                    "{label} ({backend:?}): expected the error {wanted}, but scoring succeeded"
                ));
                continue;
            }
            let tolerance = expected
                .get("tolerance")
                .and_then(Value::as_f64)
                .unwrap_or(1e-9);
            let responses = scored["responses"].as_array().cloned().unwrap_or_default();
            for key in ["reward", "advantage", "kept"] {
                if let Some(values) = expected.get(key) {
                    let actual = Value::Array(responses.iter().map(|r| r[key].clone()).collect());
                    compare(
                        &format!("{label} ({backend:?}): {key}"),
                        values,
                        &actual,
                        tolerance,
                        &mut failures,
                    );
                }
            }
            if let Some(loss) = expected.get("loss") {
                compare(
                    &format!("{label} ({backend:?}): loss"),
                    loss,
                    &scored["loss"],
                    tolerance,
                    &mut failures,
                );
            }
            // Named values: each expected name against the document's value of that name.
            for (key, word) in [
                ("metrics", "metric"),
                ("show", "show"),
                ("grad", "grad"),
                ("rollout", "rollout setting"),
            ] {
                if let Some(Value::Object(named)) = expected.get(key) {
                    for (name, values) in named {
                        compare(
                            &format!("{label} ({backend:?}): {word} {name}"),
                            values,
                            &scored[key][name],
                            tolerance,
                            &mut failures,
                        );
                    }
                }
            }
        }
    }
    assert!(count >= 6, "expected at least 6 cases, found {count}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Central finite differences of the interpreter's loss against the autodiff gradient, for every
/// differentiable input of every shipped recipe and of the gradient test recipes (tests/gradients/:
/// the policy inside group, pairwise, feature-axis and scan operations), on random ragged batches with a
/// singleton group.
#[test]
fn gradients_match_finite_differences_for_every_recipe() {
    let mut recipes: Vec<PathBuf> = ["recipes", "tests/gradients"]
        .iter()
        .flat_map(|folder| std::fs::read_dir(root().join(folder)).unwrap().flatten())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "rlx"))
        .collect();
    recipes.sort();
    assert!(recipes.len() >= 7);
    let mut report = Vec::new();
    for path in &recipes {
        let recipe = check(path);
        let graph = rlx_compiler::compile_graph(&recipe, &[]).unwrap();
        if graph.outputs.loss.is_none() {
            continue;
        }
        for seed in 1..=3 {
            let spec = synthetic::Spec {
                seed,
                ..synthetic::Spec::default()
            };
            let batch = synthetic::batch(&graph, &spec);
            let context = Context::default();
            let outcome = evaluate(&graph, &batch, &context)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let loss_at = |batch: &rlx_runtime::Batch| {
                evaluate(&graph, batch, &context).unwrap().loss.unwrap()
            };
            let base = outcome.loss.unwrap();
            let mut checked = 0;
            let largest = outcome
                .gradients
                .iter()
                .flat_map(|(_, g)| g.iter())
                .fold(0.0f64, |m, g| m.max(g.abs()));
            assert!(
                largest > 1e-6,
                "{}: the gradient is identically zero",
                path.display()
            );
            for (name, gradient) in &outcome.gradients {
                let input = graph.inputs.iter().position(|i| &i.name == name).unwrap();
                for (element, &analytic) in gradient.iter().enumerate() {
                    let h = 1e-6;
                    let mut plus = batch.clone();
                    plus.inputs[input][element] += h;
                    let mut minus = batch.clone();
                    minus.inputs[input][element] -= h;
                    let (f_plus, f_minus) = (loss_at(&plus), loss_at(&minus));
                    // Skip kinks (clip boundaries, max/min switches): one-sided slopes disagree there.
                    let (right, left) = ((f_plus - base) / h, (base - f_minus) / h);
                    if (right - left).abs() > 1e-4 * (1.0 + right.abs().max(left.abs())) {
                        continue;
                    }
                    let numeric = (f_plus - f_minus) / (2.0 * h);
                    let error =
                        (numeric - analytic).abs() / analytic.abs().max(numeric.abs()).max(1e-3);
                    assert!(
                        error < 1e-6,
                        "{} seed {seed}: ∂loss/∂{name}[{element}] autodiff {analytic}, finite differences {numeric}",
                        path.display()
                    );
                    checked += 1;
                }
            }
            assert!(
                checked > 0,
                "{}: no gradient element was checked",
                path.display()
            );
            report.push(format!("{}: {checked} elements", path.display()));
        }
    }
    eprintln!("{}", report.join("\n"));
}

fn rlx(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rlx"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("rlx runs")
}

#[test]
fn score_command_prints_the_documented_document() {
    let output = rlx(&[
        "score",
        "recipes/grpo.rlx",
        "--rollouts",
        "tests/data/grpo_fixture.jsonl",
        "--grad",
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let document: Value = serde_json::from_slice(&output.stdout).expect("JSON on stdout");
    for key in ["loss", "metrics", "responses", "grad"] {
        assert!(document.get(key).is_some(), "missing {key}");
    }
    let first = &document["responses"][0];
    assert_eq!(first["group"], "A");
    assert!(first["kept"].as_bool().unwrap());
    assert_eq!(document["grad"]["logp"].as_array().unwrap().len(), 8);
    assert!(document["metrics"]["kl"].as_f64().unwrap() > 0.0);
}

/// `rlx score --step N --progress P` scores as the trainer would at that step, and prints the rollout
/// settings evaluated there; a progress outside [0, 1] is a usage error.
#[test]
fn step_and_progress_reach_the_recipe_and_its_rollout_settings() {
    let run = |extra: &[&str]| {
        let mut args = vec![
            "score",
            "tests/scores/rollouts/schedule.rlx",
            "--rollouts",
            "tests/scores/rollouts/schedule.jsonl",
        ];
        args.extend_from_slice(extra);
        rlx(&args)
    };
    let at = run(&["--step", "40", "--progress", "0.2"]);
    assert!(
        at.status.success(),
        "{}",
        String::from_utf8_lossy(&at.stderr)
    );
    let document: Value = serde_json::from_slice(&at.stdout).expect("JSON on stdout");
    assert_eq!(document["metrics"]["at_step"].as_f64(), Some(40.0));
    assert_eq!(document["rollout"]["stop"][0], "</answer>");
    let scaffold = document["rollout"]["scaffold"]
        .as_array()
        .expect("one value per response");
    assert!(
        (scaffold[1].as_f64().unwrap() - 0.25).abs() < 1e-12,
        "{scaffold:?}"
    );
    // Without the flags: step 0 and progress 0, so the scaffold has not decayed (σ(25) ≈ 1).
    let start: Value = serde_json::from_slice(&run(&[]).stdout).expect("JSON on stdout");
    assert_eq!(start["metrics"]["at_step"].as_f64(), Some(0.0));
    assert!(start["rollout"]["scaffold"][0].as_f64().unwrap() > 0.999);
    let bad = run(&["--progress", "1.5"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("from 0 to 1"));
}

#[test]
fn set_overrides_a_param_and_rejects_unknown_ones() {
    let run = |set: &str| {
        rlx(&[
            "score",
            "recipes/grpo.rlx",
            "--rollouts",
            "tests/data/grpo_fixture.jsonl",
            "--set",
            set,
        ])
    };
    let base: Value = serde_json::from_slice(&run("beta=0.001").stdout).unwrap();
    let zero: Value = serde_json::from_slice(&run("beta=0").stdout).unwrap();
    let difference = base["loss"].as_f64().unwrap() - zero["loss"].as_f64().unwrap();
    // β·k3 with k3 = 0.148721 on every token (peer-trainers.md §2.4).
    assert!((difference - 0.001 * 0.148721).abs() < 1e-7, "{difference}");
    let unknown = run("betta=1");
    assert_eq!(unknown.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&unknown.stderr)
        .contains("unknown param `betta` (did you mean `beta`?)"));
}

#[test]
fn bad_rollouts_exit_1_and_write_nothing() {
    let directory = std::env::temp_dir().join(format!("rlx-score-test-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let cases = [
        ("missing.jsonl", "{\"group\": 1, \"logp\": [-1], \"old_logp\": [-1], \"ref_logp\": [-1]}\n", "score"),
        ("nan.jsonl", "{\"group\": 1, \"score\": NaN, \"logp\": [-1], \"old_logp\": [-1], \"ref_logp\": [-1]}\n", "non-finite"),
        ("empty.jsonl", "\n", "no responses"),
        (
            "ragged.jsonl",
            "{\"group\": 1, \"score\": 1, \"logp\": [-1, -2], \"old_logp\": [-1], \"ref_logp\": [-1, -2]}\n",
            "differ in length",
        ),
    ];
    for (name, text, message) in cases {
        let rollouts = directory.join(name);
        std::fs::write(&rollouts, text).unwrap();
        let out = directory.join(format!("{name}.out.json"));
        let output = rlx(&[
            "score",
            "recipes/grpo.rlx",
            "--rollouts",
            rollouts.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{name}: {stderr}");
        assert!(stderr.contains(message), "{name}: {stderr}");
        assert!(
            stderr.contains("line 1") || name == "empty.jsonl",
            "{name}: {stderr}"
        );
        assert!(!out.exists(), "{name}: --out was written on error");
    }
    std::fs::remove_dir_all(&directory).ok();
}

/// Every shipped recipe scores a generated rollout file (written from a random batch, read back by the
/// rollout reader): the file round-trips to the same batch, and scoring it gives the interpreter's result.
#[test]
fn every_recipe_scores_a_generated_rollout_file() {
    let mut recipes: Vec<PathBuf> = std::fs::read_dir(root().join("recipes"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "rlx"))
        .collect();
    recipes.sort();
    for path in recipes {
        let recipe = check(&path);
        let graph = rlx_compiler::compile_graph(&recipe, &[]).unwrap();
        let mut batch = synthetic::batch(&graph, &synthetic::Spec::default());
        // A `state` is no rollout value: the file leaves it out and it reads its initial value.
        for state in &graph.states {
            batch.inputs[state.input as usize] = vec![state.init];
        }
        let text = synthetic::to_jsonl(&graph, &batch);
        let read = rlx_runtime::rollouts::read_rollouts(&text, &recipe).unwrap_or_else(|e| {
            panic!(
                "{}: generated rollouts do not read back: {e}",
                path.display()
            )
        });
        // Every line says its `length`, so even a recipe without token-level inputs round-trips.
        assert_eq!(
            read.batch,
            batch,
            "{}: rollout file round trip",
            path.display()
        );
        let scored = rlx_runtime::score::score(&recipe, &text, &[], true)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .document;
        let direct = evaluate(&graph, &read.batch, &Context::default()).unwrap();
        if let Some(loss) = direct.loss {
            assert_eq!(scored["loss"].as_f64(), Some(loss), "{}", path.display());
        }
    }
}

/// A write to stdout that fails never panics: a closed pipe (`rlx score … | head -c 1`) ends quietly
/// with status 1, a full disk with status 1 and one line on stderr (docs/formats.md).
#[test]
fn a_closed_or_full_stdout_is_an_error_not_a_panic() {
    let args = [
        "score",
        "recipes/grpo.rlx",
        "--rollouts",
        "tests/data/grpo_fixture.jsonl",
        "--grad",
    ];
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let closed = Command::new(env!("CARGO_BIN_EXE_rlx"))
        .args(args)
        .current_dir(root())
        .stdout(writer)
        .output()
        .expect("rlx runs");
    let stderr = String::from_utf8_lossy(&closed.stderr);
    assert_eq!(closed.status.code(), Some(1), "{stderr}");
    assert!(stderr.is_empty(), "a closed pipe is quiet: {stderr}");
    if let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") {
        let output = Command::new(env!("CARGO_BIN_EXE_rlx"))
            .args(args)
            .current_dir(root())
            .stdout(full)
            .output()
            .expect("rlx runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with("error: cannot write to stdout:"),
            "{stderr}"
        );
    }
}

/// `--show` prints named values in input order, the same on both backends; a comma list and a
/// repeated flag are the same thing; an unknown name is an error that lists the names there are.
#[test]
fn show_prints_named_values_and_lists_the_names_on_a_typo() {
    let run = |backend: &str, show: &[&str]| {
        let mut args = vec![
            "score",
            "tests/scores/rollouts/show_keep.rlx",
            "--rollouts",
            "tests/scores/rollouts/show_keep.jsonl",
            "--grad",
            "--backend",
            backend,
        ];
        for name in show {
            args.extend(["--show", *name]);
        }
        rlx(&args)
    };
    let document = |output: std::process::Output| -> Value {
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).expect("JSON on stdout")
    };
    let jit = document(run("jit", &["centred,weighted", "score"]));
    let interp = document(run("interp", &["centred", "weighted,score"]));
    assert_eq!(jit["show"], interp["show"]);
    assert_eq!(jit["grad"], interp["grad"]);
    assert_eq!(
        jit["show"]["centred"],
        serde_json::json!([null, 1.0, null, -1.0])
    );
    assert_eq!(
        jit["show"]["score"],
        serde_json::json!([1.0, 1.0, 1.0, 0.0])
    );
    assert!(document(run("jit", &[])).get("show").is_none());

    let typo = run("jit", &["centered"]);
    let stderr = String::from_utf8_lossy(&typo.stderr);
    assert_eq!(typo.status.code(), Some(1), "{stderr}");
    assert!(typo.stdout.is_empty());
    assert!(
        stderr.contains(
            "--show centered: the recipe has no input or top-level `let` of that name; inputs: logp, score; lets: doubled, group_mean, centred, weighted"
        ),
        "{stderr}"
    );
}

/// A recipe that reads `length` with no token-level input needs `"length"` on every line.
#[test]
fn length_without_token_arrays_is_required_when_the_recipe_reads_it() {
    let directory = std::env::temp_dir().join(format!("rlx-score-length-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let recipe = directory.join("length.rlx");
    std::fs::write(
        &recipe,
        "input score : f32[resp]\nreward = score - 0.01 * length\n",
    )
    .unwrap();
    let score = |text: &str| {
        let rollouts = directory.join("r.jsonl");
        std::fs::write(&rollouts, text).unwrap();
        rlx(&[
            "score",
            recipe.to_str().unwrap(),
            "--rollouts",
            rollouts.to_str().unwrap(),
        ])
    };
    let given = score("{\"group\": 1, \"score\": 1, \"length\": 100}\n{\"group\": 1, \"score\": 1, \"length\": 0}\n");
    assert!(
        given.status.success(),
        "{}",
        String::from_utf8_lossy(&given.stderr)
    );
    let document: Value = serde_json::from_slice(&given.stdout).unwrap();
    let reward = |r: usize| document["responses"][r]["reward"].as_f64().unwrap();
    assert!(
        reward(0).abs() < 1e-12 && (reward(1) - 1.0).abs() < 1e-12,
        "{document}"
    );
    let missing =
        score("{\"group\": 1, \"score\": 1, \"length\": 3}\n{\"group\": 1, \"score\": 1}\n");
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert_eq!(missing.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("line 2: the recipe reads each response's token count"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&directory).ok();
}

/// A rollout file that is not UTF-8 is an error naming its line, not "stream did not contain valid UTF-8".
#[test]
fn invalid_utf8_rollouts_name_the_line() {
    let output = rlx(&[
        "score",
        "recipes/grpo.rlx",
        "--rollouts",
        "runtime/tests/data/bad/invalid_utf8.jsonl",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("invalid_utf8.jsonl: line 2: invalid UTF-8 at byte 13"),
        "{stderr}"
    );
}

/// Thousands of metrics over one loop (issue 13: the JIT's compile time was superlinear in them: 2,000
/// metrics 3.9 s, 4,000 21.6 s; at 20,000 cranelift panicked): the plan splits the loop into passes of
/// at most `MAX_PASS_ACTIONS` actions, each compiled as its own function, so the JIT compiles the
/// recipe (no fallback) and gives the interpreter's numbers. (The compile time itself is a benchmark,
/// not a test: docs/kernels.md.)
#[test]
fn thousands_of_metrics_compile_in_passes_of_bounded_size() {
    let metrics = 2_000;
    let mut text = String::from(
        "input logp : f32[tok] policy\ninput score : f32[resp]\n\nloss = mean(logp * score over tok, batch)\n",
    );
    for m in 0..metrics {
        text.push_str(&format!(
            "metric m{m} = mean(logp * {} over tok, batch)\n",
            m + 1
        ));
    }
    let checked = rlx_compiler::check_source("many_metrics.rlx", &text);
    let recipe = checked.recipe.expect("the recipe checks");
    let graph = rlx_compiler::compile_graph(&recipe, &[]).unwrap();
    let plan = rlx_compiler::backend::plan::plan(&graph, &Default::default()).unwrap();
    let limit = rlx_compiler::backend::plan::MAX_PASS_ACTIONS;
    let mut loops = 0;
    for phase in &plan.phases {
        for pass in &phase.passes {
            if let rlx_compiler::backend::plan::Pass::Loop(pass) = pass {
                loops += 1;
                assert!(
                    pass.actions.len() <= limit,
                    "{} actions",
                    pass.actions.len()
                );
            }
        }
    }
    assert!(loops >= metrics / limit, "{loops} loop passes");
    let rollouts = "{\"group\": \"a\", \"logp\": [-1, -2], \"score\": 1}\n{\"group\": \"a\", \"logp\": [-1], \"score\": 0}\n";
    let score = |backend| {
        rlx_runtime::score::score_at(
            &recipe,
            rollouts,
            &[],
            true,
            backend,
            &[],
            &Context::default(),
        )
        .expect("scored")
    };
    let jit = score(rlx_runtime::score::Backend::Jit);
    assert!(jit.fallback.is_none(), "{:?}", jit.fallback);
    let interp = score(rlx_runtime::score::Backend::Interp);
    assert_eq!(jit.document["metrics"].as_object().unwrap().len(), metrics);
    for m in [0, 63, 64, 65, 1_000, metrics - 1] {
        let key = format!("m{m}");
        let (a, b) = (
            jit.document["metrics"][&key].as_f64().unwrap(),
            interp.document["metrics"][&key].as_f64().unwrap(),
        );
        // mean over the batch's 3 tokens of logp·(m+1): −4/3·(m+1).
        assert!(
            (a - b).abs() < 1e-9 && (a + 4.0 / 3.0 * (m + 1) as f64).abs() < 1e-9,
            "{key}: {a} vs {b}"
        );
    }
    assert_eq!(jit.document["grad"], interp.document["grad"]);
}

/// A rollout file past `RLX_MAX_ROLLOUT_BYTES` is refused before it is read whole (the bound and the
/// variable named); at the bound it is scored; a bad value of the variable is an error, not a guess.
#[test]
fn rollout_files_are_read_up_to_a_bound() {
    let file = "tests/data/grpo_fixture.jsonl";
    let size = std::fs::metadata(root().join(file)).unwrap().len();
    let score = |bound: &str| {
        Command::new(env!("CARGO_BIN_EXE_rlx"))
            .args(["score", "recipes/grpo.rlx", "--rollouts", file])
            .env("RLX_MAX_ROLLOUT_BYTES", bound)
            .current_dir(root())
            .output()
            .expect("rlx runs")
    };
    let over = score(&(size - 1).to_string());
    let stderr = String::from_utf8_lossy(&over.stderr);
    assert_eq!(over.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("larger than {} bytes", size - 1))
            && stderr.contains("RLX_MAX_ROLLOUT_BYTES"),
        "{stderr}"
    );
    let at = score(&size.to_string());
    assert!(
        at.status.success(),
        "{}",
        String::from_utf8_lossy(&at.stderr)
    );
    let bad = score("lots");
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("RLX_MAX_ROLLOUT_BYTES = \"lots\" is not a positive number"),
        "{stderr}"
    );
}

/// `rlx score --state FILE` (docs/formats.md): the recipe's `state`s start at their initial values when
/// FILE does not exist, the document and FILE get the updated values, the next call reads them back
/// (the advantage subtracts the carried baseline), and a bad state file is an error naming the file
/// and the entry that writes nothing.
#[test]
fn state_files_carry_a_recipes_state_from_call_to_call() {
    let dir = std::env::temp_dir().join(format!("rlx-score-state-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("state.json");
    let file_arg = file.to_str().unwrap();
    let score = |state: &str| {
        rlx(&[
            "score",
            "tests/data/state_ema.rlx",
            "--rollouts",
            "tests/data/state_ema.jsonl",
            "--state",
            state,
        ])
    };
    // Mean score 0.75 each call: baseline 0 → 0.375 → 0.5625 → 0.65625.
    let mut baselines = Vec::new();
    for call in 0..3 {
        let output = score(file_arg);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let document: Value = serde_json::from_slice(&output.stdout).unwrap();
        let read = baselines.last().copied().unwrap_or(0.0);
        assert_eq!(
            document["responses"][1]["advantage"],
            serde_json::json!(0.0 - read),
            "call {call}"
        );
        let written: Value =
            serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        assert_eq!(written, document["state"], "call {call}");
        assert_eq!(written["calls"], serde_json::json!(call + 1));
        assert_eq!(written["best"], serde_json::json!(0.75));
        assert_eq!(
            document["metrics"]["state.calls"].as_f64(),
            Some(call as f64 + 1.0)
        );
        baselines.push(written["baseline"].as_f64().unwrap());
    }
    assert_eq!(baselines, vec![0.375, 0.5625, 0.65625]);
    // A non-finite value is written and read as a string.
    std::fs::write(&file, r#"{"best": "-inf", "baseline": 1}"#).unwrap();
    let output = score(file_arg);
    assert!(output.status.success());
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(
        written,
        serde_json::json!({"baseline": 0.875, "calls": 1, "best": 0.75})
    );

    let bad = dir.join("bad.json");
    let bad_arg = bad.to_str().unwrap();
    for (text, message) in [
        (
            "[1, 2]",
            "is a JSON object of the recipe's states by name, not an array",
        ),
        ("{\"baseline\": ", "not a JSON state file"),
        (
            "{\"baseline\": \"high\"}",
            "state `baseline` is \"high\"; expected a number",
        ),
        (
            "{\"basline\": 1}",
            "names `basline`, which is no state of the recipe (its states: baseline, calls, best)",
        ),
        (
            "{\"calls\": 1.5}",
            "sets state `calls`, which is i32, to 1.5",
        ),
    ] {
        std::fs::write(&bad, text).unwrap();
        let output = score(bad_arg);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{text}: {stderr}");
        assert!(stderr.contains(message), "{text}: {stderr}");
        assert_eq!(
            std::fs::read_to_string(&bad).unwrap(),
            text,
            "{text}: rewritten"
        );
        assert!(output.stdout.is_empty(), "{text}");
    }
    // A recipe without state: an error, and no file is created.
    let absent = dir.join("absent.json");
    let output = rlx(&[
        "score",
        "recipes/grpo.rlx",
        "--rollouts",
        "tests/data/grpo_fixture.jsonl",
        "--state",
        absent.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("declares no `state`"));
    assert!(!absent.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A rollout line that gives a value under a state's name is an error naming the line and the key
/// (the state comes from `--state`, never from the rollouts).
#[test]
fn a_rollout_line_cannot_set_a_state() {
    let dir = std::env::temp_dir().join(format!("rlx-score-state-line-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rollouts = dir.join("rollouts.jsonl");
    std::fs::write(
        &rollouts,
        "{\"group\": \"a\", \"score\": 1}\n{\"group\": \"a\", \"score\": 0, \"baseline\": 3}\n",
    )
    .unwrap();
    let output = rlx(&[
        "score",
        "tests/data/state_ema.rlx",
        "--rollouts",
        rollouts.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("line 2"), "{stderr}");
    assert!(
        stderr.contains("`baseline` is the recipe's `state`, carried across steps"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
