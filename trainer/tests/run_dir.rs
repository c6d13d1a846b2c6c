//! The run directory of `rlx run`: locked while a run holds it, never rewritten by a new run (only
//! continued by `--resume`), and a record of the recipe (its copy and sha256), the resolved config and
//! the versions.

use std::path::{Path, PathBuf};

use rlx_trainer::cli::{prepare, RunArgs};
use rlx_trainer::run_dir::{RecipeFile, RunDir};
use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn out_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rlx-run-dir-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn a_run_directory_is_locked_while_a_run_holds_it() {
    let dir = out_dir("lock");
    let held = RunDir::take(&dir, false).unwrap();
    let message = RunDir::take(&dir, false).unwrap_err();
    assert_eq!(
        message,
        format!(
            "run directory {} is in use by another rlx run (pid {}); wait for it to end or choose another --out",
            dir.display(),
            std::process::id()
        )
    );
    // Even a resume is refused while the directory is held.
    assert!(RunDir::take(&dir, true)
        .unwrap_err()
        .contains("is in use by another rlx run"));
    drop(held);
    // Released: the lock file alone does not make the directory another run's.
    let again = RunDir::take(&dir, false).unwrap();
    drop(again);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The recipe file as the binary passes it, `text` standing for its contents.
fn grpo_file(text: &str) -> RecipeFile {
    RecipeFile {
        path: root().join("recipes/grpo.rlx"),
        text: text.to_string(),
    }
}

fn args(out: &Path, resume: bool, file: RecipeFile) -> RunArgs {
    RunArgs {
        recipe_name: "grpo".into(),
        sets: if resume {
            Vec::new()
        } else {
            [
                "steps=1",
                "sft.steps=1",
                "task.eval_questions=4",
                "train.prompts_per_step=2",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect()
        },
        out: if resume {
            None
        } else {
            Some(out.to_path_buf())
        },
        resume: resume.then(|| out.to_path_buf()),
        recipe_files: vec![file],
        ..Default::default()
    }
}

fn run(args: &RunArgs) -> Result<rlx_trainer::train::Summary, String> {
    let checked = rlx_compiler::check_path(&root().join("recipes/grpo.rlx")).unwrap();
    let prepared = prepare(checked.recipe.as_ref().unwrap(), args)?;
    prepared.run(|_| {})
}

#[test]
fn a_finished_run_is_recorded_and_never_overwritten_by_a_new_run() {
    let dir = out_dir("finished");
    let text = std::fs::read_to_string(root().join("recipes/grpo.rlx")).unwrap();
    run(&args(&dir, false, grpo_file(&text))).unwrap();

    // The record: the recipe's copy and sha256, the versions, the config with the recipe's rollout
    // values (grpo.rlx: `n = 8`, `temperature = 1.0`; the default config says 0 and -1).
    assert_eq!(
        std::fs::read_to_string(dir.join("recipe.rlx")).unwrap(),
        text
    );
    let record: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("run.json")).unwrap()).unwrap();
    assert_eq!(
        record["recipe"][0]["sha256"],
        rlx_compiler::export::sha256::hex_digest(text.as_bytes())
    );
    assert_eq!(record["versions"]["rlx"], env!("CARGO_PKG_VERSION"));
    assert!(
        record["versions"]["rustc"]
            .as_str()
            .unwrap()
            .starts_with("rustc 1."),
        "{record}"
    );
    assert!(
        record["versions"]["candle"]
            .as_str()
            .unwrap()
            .starts_with("0."),
        "{record}"
    );
    let config: toml::Table =
        toml::from_str(&std::fs::read_to_string(dir.join("config.toml")).unwrap()).unwrap();
    assert_eq!(config["sampler"]["n"].as_integer(), Some(8));
    assert_eq!(config["sampler"]["temperature"].as_float(), Some(1.0));
    assert_eq!(config["sampler"]["top_p"].as_float(), Some(1.0));

    // A new run into it is refused, and nothing in it changes.
    let before: Vec<(String, Vec<u8>)> =
        ["config.toml", "metrics.jsonl", "summary.json", "run.json"]
            .iter()
            .map(|f| (f.to_string(), std::fs::read(dir.join(f)).unwrap()))
            .collect();
    let message = run(&args(&dir, false, grpo_file(&text))).unwrap_err();
    assert_eq!(
        message,
        format!(
            "run directory {} already holds files of another run (checkpoint, config.toml, metrics.jsonl, metrics.png, …): continue it with --resume {}, or choose an empty or new --out",
            dir.display(),
            dir.display()
        )
    );
    for (file, bytes) in &before {
        assert_eq!(&std::fs::read(dir.join(file)).unwrap(), bytes, "{file}");
    }

    // Resuming it with another recipe text is refused too (the same recipe resumes: tests/resume.rs).
    let edited = text.replacen("n = 8", "n = 8 ", 1);
    assert_ne!(edited, text);
    let mut resume = args(&dir, true, grpo_file(&edited));
    resume.steps = Some(2);
    let message = run(&resume).unwrap_err();
    assert!(
        message.contains("but the run started from a recipe with sha256"),
        "{message}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
