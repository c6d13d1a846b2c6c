//! The real-model path of `rlx run`: configs/smollm2.toml (SmolLM2-135M-Instruct on IFEval prompts, DARLING
//! with `quality` and `cluster` filled by signals) for one short step, and the config errors of the
//! `[model]`/`[task]` kinds and `[signals]` tables. The step needs `scripts/fetch-assets.sh`; where the
//! build found the assets missing (rlx-tools, `rlx_assets`), `cargo test` reports it as ignored.

use std::path::{Path, PathBuf};

use rlx_trainer::cli::{prepare, RunArgs};
use rlx_trainer::config::{Config, DEFAULT_CONFIG};
use rlx_trainer::train::{run_with, RunOptions};
use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn recipe(name: &str) -> rlx_compiler::hir::Recipe {
    let checked = rlx_compiler::check_path(&root().join("recipes").join(name)).unwrap();
    assert!(checked.diagnostics.is_empty(), "{:?}", checked.diagnostics);
    checked.recipe.unwrap()
}

fn config_text(name: &str) -> String {
    std::fs::read_to_string(root().join("configs").join(name)).unwrap()
}

fn args(recipe_name: &str, config: String, sets: &[&str], out: &Path) -> RunArgs {
    RunArgs {
        recipe_name: recipe_name.into(),
        config_text: Some(config),
        sets: sets.iter().map(|s| s.to_string()).collect(),
        out: Some(out.to_path_buf()),
        ..Default::default()
    }
}

/// One step of configs/smollm2.toml with tiny settings (1 prompt × 2 samples × 8 new tokens): the metrics
/// line has every signal's mean, the recipe's metrics and a finite loss. (Without the assets:
/// `trainer/tests/no_assets.rs`.)
#[test]
#[cfg_attr(
    not(rlx_assets),
    ignore = "needs the assets: run scripts/fetch-assets.sh"
)]
fn smollm2_darling_step_on_ifeval() {
    let out = std::env::temp_dir().join(format!("rlx-smollm2-step-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let sets = [
        "steps=2",
        "sampler.n=2",
        "sampler.max_new_tokens=8",
        "train.prompts_per_step=1",
        "train.micro_batch=0",
        "task.limit=20",
        "task.max_prompt_tokens=96",
    ];
    let prepared = prepare(
        &recipe("darling.rlx"),
        &args("darling", config_text("smollm2.toml"), &sets, &out),
    )
    .unwrap();
    // Stop after one step, as if killed (no 2 GB final checkpoint of a 135M-parameter model).
    let options = RunOptions {
        resume: None,
        stop_after: Some(1),
        skip_evaluation: false,
    };
    let summary = run_with(
        prepared.plan,
        &prepared.config,
        &prepared.out,
        &options,
        |_| {},
    )
    .unwrap();
    assert_eq!(summary.steps_done, 1);
    let metrics = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let lines: Vec<Value> = metrics
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{metrics}");
    let line = &lines[0];
    let number = |key: &str| -> f64 {
        line.get(key)
            .and_then(Value::as_f64)
            .unwrap_or_else(|| panic!("metrics line without a number `{key}`: {line}"))
    };
    assert!(number("loss").is_finite(), "{line}");
    // IFEval's prompt-level verdict: 0 or 1 per completion, so the mean of 2 is 0, 0.5 or 1.
    let quality = number("signal/quality/mean");
    assert!([0.0, 0.5, 1.0].contains(&quality), "{line}");
    // Partition ids of a group of 2 are 0 then 0 (one class) or 1 (two): the mean is 0 or 0.5.
    let cluster = number("signal/cluster/mean");
    assert!([0.0, 0.5].contains(&cluster), "{line}");
    // The recipe's own metrics agree with the signals it read.
    assert!(
        (number("recipe/quality_mean") - quality).abs() < 1e-9,
        "{line}"
    );
    let diversity = number("recipe/diversity_mean");
    assert!((0.0..=1.0).contains(&diversity), "{line}");
    // The sample accuracy of an IFEval task is the strict prompt-level verdict, i.e. `quality`.
    assert!((number("accuracy") - quality).abs() < 1e-9, "{line}");
    assert!(number("kl").is_finite(), "{line}");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn the_shipped_real_model_configs_parse() {
    for name in ["smollm2.toml", "healthbench.toml"] {
        let config = Config::parse(&config_text(name), &[]).unwrap();
        assert_eq!(config.model.kind(), "smollm2", "{name}");
        assert!(!config.signal_specs().unwrap().is_empty(), "{name}");
    }
    // The default still parses, as the tiny model on arithmetic, and round-trips through TOML.
    let config = Config::parse(DEFAULT_CONFIG, &[]).unwrap();
    assert_eq!(
        (config.model.kind(), config.task.kind()),
        ("tiny", "arithmetic")
    );
    let again = Config::parse(&toml::to_string(&config).unwrap(), &[]).unwrap();
    assert_eq!(again, config);
    let smollm2 = Config::parse(&config_text("smollm2.toml"), &[]).unwrap();
    let again = Config::parse(&toml::to_string(&smollm2).unwrap(), &[]).unwrap();
    assert_eq!(again, smollm2);
}

#[test]
fn kind_and_signal_errors() {
    let smollm2 = config_text("smollm2.toml");
    let parse = |text: &str| Config::parse(text, &[]).unwrap_err();
    let edited = |old: &str, new: &str| {
        assert!(smollm2.contains(old), "{old}");
        smollm2.replacen(old, new, 1)
    };
    assert_eq!(
        parse(&edited("kind = \"ifeval\"", "kind = \"ifevel\"")),
        "config: unknown variant `ifevel`, expected one of `arithmetic`, `decompose`, `healthbench`, `ifeval`, `prompts`"
    );
    assert_eq!(
        parse(&edited("kind = \"smollm2\"", "kind = \"smollm3\"")),
        "config: unknown variant `smollm3`, expected one of `tiny`, `smollm2`, `hf`"
    );
    assert_eq!(
        parse(&edited(
            "kind = \"smollm2\"",
            "kind = \"smollm2\"\nhidden = 64"
        )),
        "config: unknown key `model.hidden` (the keys of [model]: kind, lora)"
    );
    let message = parse(&edited("limit = 0", "limt = 0"));
    assert!(
        message.starts_with(
            "config: unknown key `task.limt` (did you mean `task.limit`? the keys of [task]: answer_key, "
        ),
        "{message}"
    );
    assert_eq!(
        parse(&edited("kind = \"smollm2\"", "kind = \"tiny\"")),
        "config: task.kind = \"ifeval\" needs a pretrained model, model.kind = \"smollm2\" or \"hf\" (its prompts are written in that model's tokenizer and chat template)"
    );
    assert_eq!(
        parse(&edited("judge = \"policy\"", "judge = \"teacher\"")),
        "config: unknown variant `teacher`, expected `policy` or `reference`"
    );
    assert_eq!(
        parse(&edited("judge_batch = 16", "judge_batch = 0")),
        "config: task.judge_batch must be at least 1"
    );
    // Left out, the judge batch is the default; `--set` changes it.
    let judge_batch = |config: &Config| config.task.text().map(|(_, c)| c.judge_batch);
    let config = Config::parse(&edited("judge_batch = 16", ""), &[]).unwrap();
    assert_eq!(
        judge_batch(&config),
        Some(rlx_trainer::judge::DEFAULT_BATCH)
    );
    let set = [("task.judge_batch".to_string(), "64".to_string())];
    let config = Config::parse(&smollm2, &set).unwrap();
    assert_eq!(judge_batch(&config), Some(64));
    assert_eq!(
        parse(&edited("threshold = 0.9", "treshold = 0.9")),
        "config: [signals.cluster]: unknown field `treshold`, expected `threshold` or `text`"
    );
    assert_eq!(
        parse(&edited("kind = \"partition\"", "kind = \"clusters\"")),
        "config: [signals.cluster]: unknown variant `clusters`, expected one of `exact_answer`, `numeric_answer`, `regex`, `contains`, `length`, `ifeval`, `partition`, `embedding`, `similarity`, `judge`, `points`, `wrong_script`, `program`"
    );

    // Kinds that do not go together.
    let tiny_text = DEFAULT_CONFIG.replacen(
        "[task]\nmax_operand = 49\nops = \"+\"\neval_questions = 500",
        "[task]\nkind = \"ifeval\"",
        1,
    );
    assert_ne!(tiny_text, DEFAULT_CONFIG);
    assert_eq!(
        parse(&tiny_text),
        "config: task.kind = \"ifeval\" needs a pretrained model, model.kind = \"smollm2\" or \"hf\" (its prompts are written in that model's tokenizer and chat template)"
    );
    let lora = |table: &str| format!("{smollm2}\n[model.lora]\n{table}\n");
    assert_eq!(
        parse(&lora("rank = 0\nalpha = 16.0")),
        "config: model.lora.rank = 0 must be in 1..=65536"
    );
    assert_eq!(
        parse(&lora("rank = 8\nalpha = 16.0\ntargets = [\"q\", \"embed\"]")),
        "config: model.lora.targets: \"embed\" is not a projection (use q, k, v, o, gate, up, down)"
    );
    assert_eq!(
        parse(&lora("rank = 8\nalpha = 16.0\ndropout = 0.1")),
        "config: model.lora.dropout = 0.1: only 0 is supported (the adapters' input is not dropped)"
    );
    assert!(parse(&lora("rank = 8\nalpha = 16.0\nranks = 2")).contains("unknown field `ranks`"));
    let arithmetic_signals =
        format!("{DEFAULT_CONFIG}\n[signals.score]\nkind = \"exact_answer\"\n");
    assert_eq!(
        parse(&arithmetic_signals),
        "config: [signals.score]: signals feed text tasks; the arithmetic task fills its inputs itself (score)"
    );
}

/// SmolLM2 with `[model.lora]`: only the adapters train and are checkpointed (a few MB instead of the
/// model's 540 MB), the checkpoint names its base by path and SHA-256, the run resumes from it, and
/// `rlx export --hf` merges the adapters into a Hugging Face folder that loads back as the trained
/// policy.
#[test]
#[cfg_attr(
    not(rlx_assets),
    ignore = "needs the assets: run scripts/fetch-assets.sh"
)]
fn smollm2_lora_run_checkpoints_only_the_adapters() {
    let out = std::env::temp_dir().join(format!("rlx-smollm2-lora-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let config = format!(
        "{}\n[model.lora]\nrank = 8\nalpha = 16.0\ntargets = [\"q\", \"v\"]\n",
        config_text("smollm2.toml")
    );
    let sets = |steps: &str| {
        [
            steps.to_string(),
            "sampler.n=2".into(),
            "sampler.max_new_tokens=6".into(),
            "train.prompts_per_step=1".into(),
            "train.lr=1e-3".into(),
            "task.limit=20".into(),
            "task.max_prompt_tokens=96".into(),
        ]
    };
    let run = |steps: &str, resume: Option<PathBuf>| {
        let sets = sets(steps);
        let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
        let mut args = args("darling", config.clone(), &sets, &out);
        if resume.is_some() {
            // A resumed run takes its config from the checkpoint; only the steps may change.
            args.config_text = None;
            args.sets.clear();
            args.steps = Some(2);
            args.resume = resume.clone();
        }
        let prepared = prepare(&recipe("darling.rlx"), &args).unwrap();
        let options = RunOptions {
            resume,
            stop_after: None,
            skip_evaluation: false,
        };
        run_with(
            prepared.plan,
            &prepared.config,
            &prepared.out,
            &options,
            |_| {},
        )
        .unwrap()
    };
    assert_eq!(run("steps=1", None).steps_done, 1);
    let checkpoint = out.join("checkpoint");
    let size = |name: &str| std::fs::metadata(checkpoint.join(name)).unwrap().len();
    // 30 layers × (q: A [8, 576] + B [576, 8], v: A [8, 576] + B [192, 8]) f32 ≈ 2.4 MB.
    assert!(
        size("model.safetensors") < 4_000_000,
        "{}",
        size("model.safetensors")
    );
    assert!(
        size("optimizer.safetensors") < 8_000_000,
        "{}",
        size("optimizer.safetensors")
    );
    let state: Value =
        serde_json::from_str(&std::fs::read_to_string(checkpoint.join("state.json")).unwrap())
            .unwrap();
    let sha = state["base"]["sha256"].as_str().unwrap();
    assert_eq!(sha.len(), 64, "{state}");
    let tensors = candle_core::safetensors::load(
        checkpoint.join("model.safetensors"),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    assert_eq!(tensors.len(), 30 * 2 * 2);
    assert!(tensors
        .keys()
        .all(|k| k.starts_with("base_model.model.model.layers.") && k.contains(".lora_")));

    // Resume for a second step from the adapters-only checkpoint.
    assert_eq!(run("steps=2", Some(out.clone())).steps_done, 2);

    // Merged export: the trained policy, loadable as a plain checkpoint, and different from the base.
    let exported = out.join("hf");
    rlx_trainer::export::export_run(&out, &exported, false).unwrap();
    let merged = rlx_trainer::hf::load_model(&exported, &candle_core::Device::Cpu).unwrap();
    let (base, tokenizer) = rlx_trainer::gguf::load_smollm2(&candle_core::Device::Cpu).unwrap();
    let ids = tokenizer.chat_ids("Name a colour.").unwrap();
    let ids = candle_core::Tensor::from_vec(ids.clone(), (1, ids.len()), &candle_core::Device::Cpu)
        .unwrap();
    let difference = (merged.forward(&ids, &[0]).unwrap() - base.forward(&ids, &[0]).unwrap())
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(difference > 0.0, "the trained adapters changed nothing");
    // A PEFT adapter needs a Hugging Face base folder.
    let error = rlx_trainer::export::export_run(&out, &out.join("adapter"), true)
        .err()
        .unwrap();
    assert!(
        error.contains("needs a Hugging Face base folder"),
        "{error}"
    );
    let _ = std::fs::remove_dir_all(&out);
}
