//! The training loop as a `Trainer`: stepped by hand it is the run `train::run` makes, step by step,
//! and a step that fails is a typed error naming the step, the stage and the checkpoint to resume from.

use std::path::{Path, PathBuf};

use rlx_trainer::cli::{prepare, Prepared, RunArgs};
use rlx_trainer::error::{TrainError, UpdateFailure};
use rlx_trainer::train::{RunOptions, TIMING_KEYS};
use rlx_trainer::Trainer;
use serde_json::{Map, Value};

const SMALL: [&str; 7] = [
    "steps=3",
    "sft.steps=20",
    "sft.batch=16",
    "train.prompts_per_step=4",
    "task.eval_questions=20",
    "train.eval_every=2",
    "train.checkpoint_every=2",
];

fn out_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rlx-trainer-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn prepared(out: &Path, sets: &[&str]) -> Prepared {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let checked = rlx_compiler::check_path(&root.join("recipes/grpo.rlx")).unwrap();
    let args = RunArgs {
        recipe_name: "grpo".into(),
        sets: sets.iter().map(|s| s.to_string()).collect(),
        out: Some(out.to_path_buf()),
        ..Default::default()
    };
    prepare(checked.recipe.as_ref().unwrap(), &args).unwrap()
}

/// metrics.jsonl without the keys that measure time.
fn metrics(out: &Path) -> Vec<Map<String, Value>> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| match serde_json::from_str(l).unwrap() {
            Value::Object(mut map) => {
                for key in TIMING_KEYS {
                    map.remove(key);
                }
                map
            }
            other => panic!("not an object: {other}"),
        })
        .collect()
}

#[test]
fn a_trainer_stepped_by_hand_makes_the_run_that_run_makes() {
    let whole = out_dir("whole");
    let p = prepared(&whole, &SMALL);
    let summary = rlx_trainer::train::run(p.plan, &p.config, &p.out, |_| {}).unwrap();

    let by_hand = out_dir("by-hand");
    let p = prepared(&by_hand, &SMALL);
    let mut infos = Vec::new();
    let mut trainer = Trainer::new(
        p.plan,
        &p.config,
        &p.out,
        &RunOptions::default(),
        &mut |event| infos.push(event.to_string()),
    )
    .unwrap();
    // The warm start is reported once, before any step.
    assert_eq!(infos.len(), 1, "{infos:?}");
    assert!(infos[0].contains("warm start: 20 steps"), "{infos:?}");
    let mut reports = Vec::new();
    while !trainer.done() {
        reports.push(trainer.step().unwrap());
        assert_eq!(trainer.steps_done(), reports.len());
    }
    assert_eq!(
        reports
            .iter()
            .map(|r| (r.step, r.steps))
            .collect::<Vec<_>>(),
        [(1, 3), (2, 3), (3, 3)]
    );
    // `train.eval_every = 2` and the last step evaluate; the others do not.
    let evaluated: Vec<bool> = reports.iter().map(|r| r.eval_accuracy.is_some()).collect();
    assert_eq!(evaluated, [false, true, true]);
    let past = trainer.step().expect_err("no step after the last");
    assert_eq!(past.to_string(), "the run has done its 3 steps");
    let finished = trainer.finish().unwrap();
    assert_eq!(finished.steps_done, 3);
    assert_eq!(finished.rewards, summary.rewards);
    assert_eq!(
        reports.iter().map(|r| r.reward).collect::<Vec<_>>(),
        summary.rewards
    );
    assert_eq!(finished.accuracy_after, summary.accuracy_after);
    assert_eq!(metrics(&by_hand), metrics(&whole));
    for file in ["summary.json", "metrics.png", "checkpoint/state.json"] {
        assert!(by_hand.join(file).is_file(), "{file}");
    }
    for out in [whole, by_hand] {
        let _ = std::fs::remove_dir_all(out);
    }
}

#[test]
fn a_trainer_stops_at_stop_after_and_writes_no_summary() {
    let out = out_dir("stop-after");
    let p = prepared(&out, &SMALL);
    let options = RunOptions {
        stop_after: Some(1),
        skip_evaluation: true,
        ..Default::default()
    };
    let mut trainer = Trainer::new(p.plan, &p.config, &p.out, &options, &mut |_| {}).unwrap();
    assert!(!trainer.done());
    trainer.step().unwrap();
    assert!(trainer.done());
    let summary = trainer.finish().unwrap();
    assert_eq!(summary.steps_done, 1);
    assert_eq!(metrics(&out).len(), 1);
    assert!(!out.join("summary.json").exists());
    assert!(!out.join("checkpoint").exists(), "checkpoint_every = 2");
    let _ = std::fs::remove_dir_all(out);
}

#[test]
fn a_non_finite_update_is_a_typed_error_naming_the_step_and_the_checkpoint() {
    // lr = 1e30: the first update leaves weights of ~1e30, whose activations overflow at step 1.
    let out = out_dir("nan");
    // The sets of `a_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint` (tests/train.rs).
    let mut sets = SMALL.to_vec();
    sets.extend([
        "steps=4",
        "train.micro_batch=8",
        "train.lr=1e30",
        "train.epochs=1",
        "train.checkpoint_every=1",
        "train.eval_every=0",
    ]);
    let p = prepared(&out, &sets);
    let mut trainer = Trainer::new(
        p.plan,
        &p.config,
        &p.out,
        &RunOptions::default(),
        &mut |_| {},
    )
    .unwrap();
    trainer.step().unwrap();
    let error = trainer
        .step()
        .expect_err("step 1 of a run with lr = 1e30 fails");
    let checkpoint = out.join("checkpoint");
    match &error {
        TrainError::Update {
            step: 1,
            epoch: 0,
            cause,
            last,
        } => {
            assert_eq!(last.step, Some(1));
            assert_eq!(last.dir, checkpoint);
            match cause {
                UpdateFailure::Recipe(message) => {
                    assert!(
                        message.contains("NaN") || message.contains("inf"),
                        "{message}"
                    )
                }
                UpdateFailure::NonFinite(non_finite) => assert!(!non_finite.value.is_finite()),
                UpdateFailure::NonFiniteGradient { value, .. } => assert!(!value.is_finite()),
                UpdateFailure::NonFiniteParameter { .. } => {}
            }
        }
        other => panic!("not an update error of step 1, epoch 0: {other:?}"),
    }
    assert_eq!(error.step(), Some(1));
    assert_eq!(error.checkpoint(), Some((1, checkpoint.as_path())));
    // The message `rlx run` prints.
    let message = error.to_string();
    assert!(message.starts_with("step 1 (epoch 0): "), "{message}");
    assert!(
        message.ends_with(&format!(
            "; the run stopped before the update; the last good checkpoint (after step 1) is in {}",
            checkpoint.display()
        )),
        "{message}"
    );
    let _ = std::fs::remove_dir_all(out);
}

#[test]
fn errors_before_the_first_step_are_messages_without_a_step() {
    let out = out_dir("resume-nothing");
    let p = prepared(&out, &SMALL);
    let options = RunOptions {
        resume: Some(out.join("nowhere")),
        ..Default::default()
    };
    let error = match Trainer::new(p.plan, &p.config, &p.out, &options, &mut |_| {}) {
        Ok(_) => panic!("there is no checkpoint to resume"),
        Err(error) => error,
    };
    assert!(matches!(error, TrainError::Message(_)), "{error:?}");
    assert_eq!((error.step(), error.checkpoint()), (None, None));
    assert!(
        error.to_string().starts_with("--resume ")
            && error.to_string().contains("no checkpoint there"),
        "{error}"
    );
    let _ = std::fs::remove_dir_all(out);
}
