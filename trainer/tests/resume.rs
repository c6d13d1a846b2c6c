//! Checkpoints and `--resume`: a run stopped after k steps (as if killed) and resumed from its last
//! checkpoint writes the same metrics, for the following steps, as an uninterrupted run.

use std::path::{Path, PathBuf};

use rlx_trainer::cli::{prepare, RunArgs};
use rlx_trainer::train::{run_with, RunOptions, TIMING_KEYS};

fn recipe() -> rlx_compiler::hir::Recipe {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let checked = rlx_compiler::check_path(&root.join("recipes/grpo.rlx")).expect("readable");
    checked.recipe.expect("recipe checks")
}

fn out_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rlx-resume-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

// Small, but with everything that carries state across steps: AdamW moments, the prompt and sampler
// RNGs, the reference model (grpo's KL term), several epochs and micro-batches.
const SETS: [&str; 11] = [
    "steps=7",
    "sft.steps=20",
    "sft.batch=16",
    "train.prompts_per_step=4",
    "task.eval_questions=20",
    "train.eval_every=3",
    "train.epochs=2",
    "train.micro_batch=12",
    "train.checkpoint_every=2",
    "train.lr=1e-3",
    "train.samples_every=2",
];

fn args(out: &Path, resume: Option<PathBuf>) -> RunArgs {
    RunArgs {
        recipe_name: "grpo".into(),
        sets: if resume.is_some() {
            Vec::new()
        } else {
            SETS.iter().map(|s| s.to_string()).collect()
        },
        out: if resume.is_some() {
            None
        } else {
            Some(out.to_path_buf())
        },
        resume,
        ..Default::default()
    }
}

fn lines(out: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            for key in TIMING_KEYS {
                v.as_object_mut().unwrap().remove(key);
            }
            v
        })
        .collect()
}

#[test]
fn a_killed_run_resumed_from_its_checkpoint_matches_an_uninterrupted_run() {
    let hir = recipe();
    let whole = out_dir("whole");
    let prepared = prepare(&hir, &args(&whole, None)).unwrap();
    let uninterrupted = prepared.run(|_| {}).unwrap();
    assert_eq!(uninterrupted.steps_done, 7);

    // Killed after 5 steps: the last checkpoint is after step 4; metrics.jsonl has 5 lines.
    let killed = out_dir("killed");
    let prepared = prepare(&hir, &args(&killed, None)).unwrap();
    let options = RunOptions {
        resume: None,
        stop_after: Some(5),
        skip_evaluation: false,
    };
    let stopped = run_with(
        prepared.plan,
        &prepared.config,
        &prepared.out,
        &options,
        |_| {},
    )
    .unwrap();
    assert_eq!(stopped.steps_done, 5);
    assert_eq!(lines(&killed).len(), 5);
    assert!(!killed.join("metrics.png").exists());
    let state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(killed.join("checkpoint/state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(state["step"], 4);

    // Resume (the run directory; the output defaults to it).
    let mut events = Vec::new();
    let prepared = prepare(&hir, &args(&killed, Some(killed.clone()))).unwrap();
    assert_eq!(prepared.out, killed);
    let resumed = prepared.run(|e| events.push(e.to_string())).unwrap();
    assert!(events[0].starts_with("resumed from "), "{events:?}");
    assert!(events[0].ends_with("at step 4/7"), "{events:?}");
    assert_eq!(resumed.steps_done, 7);
    assert_eq!(resumed.rewards, uninterrupted.rewards);
    assert_eq!(resumed.accuracy_after, uninterrupted.accuracy_after);
    assert_eq!(lines(&killed), lines(&whole));
    // samples.jsonl: the killed run wrote steps 0, 2 and 4; the resumed one kept those (before the
    // checkpoint's step 5) and wrote step 6: the same file as the uninterrupted run's.
    let samples = |out: &Path| std::fs::read_to_string(out.join("samples.jsonl")).unwrap();
    assert!(!samples(&whole).is_empty());
    assert_eq!(samples(&killed), samples(&whole));
    assert!(killed.join("metrics.png").is_file());
    for out in [whole, killed] {
        let _ = std::fs::remove_dir_all(out);
    }
}

#[test]
fn resume_errors_are_explained() {
    let hir = recipe();
    let nowhere = out_dir("nowhere");
    let message = prepare(&hir, &args(&nowhere, Some(nowhere.clone())))
        .err()
        .unwrap();
    assert_eq!(
        message,
        format!(
            "--resume {}: no checkpoint there (expected {}; `rlx run` writes one every train.checkpoint_every steps and at the end)",
            nowhere.display(),
            nowhere.join("checkpoint/state.json").display()
        )
    );

    // A checkpoint to misuse: a 1-step run.
    let run = out_dir("one");
    let mut one = args(&run, None);
    one.sets = vec![
        "steps=1".into(),
        "sft.steps=2".into(),
        "task.eval_questions=4".into(),
        "train.prompts_per_step=2".into(),
    ];
    let prepared = prepare(&hir, &one).unwrap();
    rlx_trainer::train::run(prepared.plan, &prepared.config, &prepared.out, |_| {}).unwrap();

    let mut with_set = args(&run, Some(run.clone()));
    with_set.sets = vec!["train.lr=1".into()];
    assert_eq!(
        prepare(&hir, &with_set).err().unwrap(),
        "--resume continues with the checkpoint's config; --set train.lr cannot change it (only --steps and the recipe's params, which must match, may be given)"
    );
    let mut with_config = args(&run, Some(run.clone()));
    with_config.config_text = Some(rlx_trainer::config::DEFAULT_CONFIG.into());
    assert!(prepare(&hir, &with_config)
        .err()
        .unwrap()
        .contains("--config cannot change it"));

    // Other recipe params than the checkpoint's.
    let mut other_param = args(&run, Some(run.clone()));
    other_param.sets = vec!["beta=0.5".into()];
    other_param.steps = Some(2);
    let prepared = prepare(&hir, &other_param).unwrap();
    let message = prepared.run(|_| {}).err().unwrap();
    assert!(
        message.contains("differ from the checkpoint's") && message.contains("(\"beta\", 0.5)"),
        "{message}"
    );

    // A damaged checkpoint.
    std::fs::write(run.join("checkpoint/state.json"), "{\"format\": 9}").unwrap();
    let message = prepare(&hir, &args(&run, Some(run.clone()))).err().unwrap();
    assert!(
        message.starts_with(&format!(
            "checkpoint: {}: missing field",
            run.join("checkpoint/state.json").display()
        )),
        "{message}"
    );
    let _ = std::fs::remove_dir_all(&run);
}

/// A recipe with `state` (recipes/adaptive_entropy.rlx: Skywork-OR1's adaptive entropy coefficient
/// and the last step's entropy): the trainer carries the state from step to step, logs it
/// (`state/NAME` as the step read it, `recipe/state.NAME` its update), checkpoints it, and a run
/// killed and resumed from its checkpoint continues bit for bit.
#[test]
fn a_stateful_recipe_is_carried_checkpointed_and_resumed_bit_exact() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let checked =
        rlx_compiler::check_path(&root.join("recipes/adaptive_entropy.rlx")).expect("readable");
    let hir = checked.recipe.expect("recipe checks");
    // A target above any entropy, so that the coefficient grows every step and the bonus applies
    // from the second step on.
    const PARAMS: [&str; 2] = ["entropy_target=100", "entropy_coef_delta=0.01"];
    let run_args = |out: &Path, resume: Option<PathBuf>| {
        let mut sets: Vec<String> = PARAMS.iter().map(|s| s.to_string()).collect();
        if resume.is_none() {
            sets.extend(
                [
                    "steps=5",
                    "sft.steps=10",
                    "sft.batch=16",
                    "train.prompts_per_step=4",
                    "task.eval_questions=10",
                    "train.eval_every=0",
                    "train.micro_batch=12",
                    "train.checkpoint_every=2",
                ]
                .iter()
                .map(|s| s.to_string()),
            );
        }
        RunArgs {
            recipe_name: "adaptive_entropy".into(),
            sets,
            out: resume.is_none().then(|| out.to_path_buf()),
            resume,
            ..Default::default()
        }
    };
    let whole = out_dir("state-whole");
    let prepared = prepare(&hir, &run_args(&whole, None)).unwrap();
    prepared.run(|_| {}).unwrap();
    let uninterrupted = lines(&whole);
    assert_eq!(uninterrupted.len(), 5);
    for (step, line) in uninterrupted.iter().enumerate() {
        // c starts at entropy_coef = 0 and grows by Δ = 0.01 after every step; each step reads
        // exactly the previous step's update (the trainer's f32-storage kernels then read it as f32,
        // as every f32 input, hence the tolerance on the sums).
        let read = line["state/coef"].as_f64().expect("state/coef");
        assert!(
            (read - 0.01 * step as f64).abs() < 1e-6,
            "step {step}: {line}"
        );
        if step > 0 {
            assert_eq!(
                line["state/coef"],
                uninterrupted[step - 1]["recipe/state.coef"]
            );
        }
        let next = line["recipe/state.coef"].as_f64().expect("update");
        assert!(
            (next - 0.01 * (step + 1) as f64).abs() < 1e-6,
            "step {step}: {line}"
        );
        // The last entropy read is the previous step's entropy (+∞, written "inf", before the first).
        let expected_last = match step {
            0 => serde_json::json!("inf"),
            _ => uninterrupted[step - 1]["recipe/entropy_mean"].clone(),
        };
        assert_eq!(line["state/last_entropy"], expected_last, "step {step}");
    }

    let killed = out_dir("state-killed");
    let prepared = prepare(&hir, &run_args(&killed, None)).unwrap();
    let options = RunOptions {
        resume: None,
        stop_after: Some(3),
        skip_evaluation: false,
    };
    run_with(
        prepared.plan,
        &prepared.config,
        &prepared.out,
        &options,
        |_| {},
    )
    .unwrap();
    let state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(killed.join("checkpoint/state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(state["step"], 2);
    assert_eq!(
        state["recipe_state"],
        serde_json::json!([
            ["coef", uninterrupted[1]["recipe/state.coef"]],
            [
                "last_entropy",
                uninterrupted[1]["recipe/state.last_entropy"]
            ]
        ])
    );
    let prepared = prepare(&hir, &run_args(&killed, Some(killed.clone()))).unwrap();
    prepared.run(|_| {}).unwrap();
    assert_eq!(lines(&killed), uninterrupted);
    for out in [whole, killed] {
        let _ = std::fs::remove_dir_all(out);
    }
}
