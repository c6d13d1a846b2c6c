//! `rlx run` on a machine without the real-model assets (`RLX_ASSETS` names a directory that does not
//! exist, for this whole test process): every config, recipe and signal check runs before an asset is
//! located, so the error is the first real one, not "the SmolLM2 GGUF not found"; a config with no
//! error then names `scripts/fetch-assets.sh`.

use std::path::{Path, PathBuf};

use rlx_trainer::cli::{prepare, RunArgs};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn smollm2() -> String {
    std::fs::read_to_string(root().join("configs/smollm2.toml")).unwrap()
}

/// configs/smollm2.toml with `old` replaced by `new` (which must be there).
fn edited(old: &str, new: &str) -> String {
    let text = smollm2();
    assert!(text.contains(old), "{old}");
    text.replacen(old, new, 1)
}

fn prepare_error(config: String) -> String {
    std::env::set_var("RLX_ASSETS", "/nonexistent/rlx-assets");
    let checked = rlx_compiler::check_path(&root().join("recipes/darling.rlx")).unwrap();
    let recipe = checked.recipe.unwrap();
    let args = RunArgs {
        recipe_name: "darling".into(),
        config_text: Some(config),
        out: Some(std::env::temp_dir().join("rlx-no-assets-never-written")),
        ..Default::default()
    };
    match prepare(&recipe, &args) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    }
}

#[test]
fn config_and_signal_errors_come_before_any_asset_is_located() {
    // A signal for an input the recipe lacks, a type that does not fit, an input left without a
    // signal, an input the trainer fills, a data file that is not there.
    let cases = [
        (
            format!("{}\n[signals.score]\nkind = \"ifeval\"\n", smollm2()),
            "config: signal `score`: the recipe has no input `score` to fill (its inputs: `logp`, `old_logp`, `ref_logp`, `quality`, `cluster`)",
        ),
        (
            edited("kind = \"partition\"\nthreshold = 0.9", "kind = \"embedding\""),
            "config: signal `cluster`: embedding: produces f32[resp, dim] but input `cluster` is i32[resp]; a f32 value does not convert to i32 (only bool → i32 → f32 widen)",
        ),
        (
            edited("[signals.quality]\nkind = \"ifeval\"\n", ""),
            "config: the recipe's input `quality` (f32[resp]) has no signal to fill it: add a `[signals.quality]` table (docs/signals.md lists the kinds)",
        ),
        (
            format!("{}\n[signals.ref_logp]\nkind = \"wrong_script\"\n", smollm2()),
            "config: [signals.ref_logp]: `ref_logp` is filled by the trainer, not by a signal",
        ),
        (
            edited("path = \"\"", "path = \"/nonexistent/prompts.jsonl\""),
            "config: task.path = \"/nonexistent/prompts.jsonl\": no such file",
        ),
        (
            edited("kind = \"ifeval\"", "kind = \"prompts\""),
            "config: task.kind = \"prompts\" needs task.path: a JSONL or Parquet file of rows with `prompt` or `messages` (docs/training.md, \"Your own task\")",
        ),
    ];
    for (config, expected) in cases {
        assert_eq!(prepare_error(config), expected);
    }
    // With nothing wrong in the config, the missing asset is the error, and it says how to fetch it.
    let message = prepare_error(smollm2());
    assert!(
        message.contains("not found at /nonexistent/rlx-assets/")
            && message.contains("run `scripts/fetch-assets.sh`"),
        "{message}"
    );
}
