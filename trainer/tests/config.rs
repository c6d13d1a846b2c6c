//! Config, command-line and data errors of `rlx run`: each bad case and its message.

use std::path::Path;

use rlx_trainer::cli::{prepare, RunArgs};
use rlx_trainer::config::DEFAULT_CONFIG;
use rlx_trainer::Config;

fn recipe(path: &str) -> rlx_compiler::hir::Recipe {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let checked = rlx_compiler::check_path(&root.join(path)).expect("recipe readable");
    checked.recipe.expect("recipe checks")
}

fn args(sets: &[&str]) -> RunArgs {
    RunArgs {
        recipe_name: "grpo".into(),
        sets: sets.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn prepare_error(sets: &[&str]) -> String {
    match prepare(&recipe("recipes/grpo.rlx"), &args(sets)) {
        Ok(_) => panic!("expected an error for {sets:?}"),
        Err(message) => message,
    }
}

/// The default config with `old` replaced by `new` (which must be there).
fn edited(old: &str, new: &str) -> String {
    assert!(DEFAULT_CONFIG.contains(old), "{old}");
    DEFAULT_CONFIG.replacen(old, new, 1)
}

fn parse_error(text: &str) -> String {
    Config::parse(text, &[]).expect_err("expected an error")
}

#[test]
fn the_default_parses_and_every_key_is_listed() {
    let config = Config::default_config();
    assert_eq!(config.train.micro_batch, 0);
    let keys = rlx_trainer::config::config_keys();
    for key in [
        "seed",
        "steps",
        "train.lr",
        "train.micro_batch",
        "train.checkpoint_every",
        "sft.steps",
    ] {
        assert!(keys.iter().any(|k| k == key), "{key}");
    }
}

#[test]
fn unknown_keys() {
    let message = parse_error(&edited("lr = ", "learning_rate = 1\nlr = "));
    assert_eq!(
        message,
        "config: unknown key `train.learning_rate` (the keys of [train]: checkpoint_every, device, dtype, epochs, eval_every, eval_samples, grad_clip, lr, max_sampling_rounds, micro_batch, prompts_per_step, samples_every, weight_decay)"
    );
    // A typo gets the closest key.
    let message = parse_error("[train]\nmicro_bach = 4\n");
    assert!(
        message.starts_with(
            "config: unknown key `train.micro_bach` (did you mean `train.micro_batch`? the keys of [train]: "
        ),
        "{message}"
    );
    let message = parse_error(&format!("bogus = 2\n{DEFAULT_CONFIG}"));
    assert!(
        message.starts_with(
            "config: unknown key `bogus` (the keys of the top level: backend, model, "
        ),
        "{message}"
    );
    let message = parse_error(&format!("{DEFAULT_CONFIG}\n[extra]\nx = 1\n"));
    assert!(
        message.starts_with("config: unknown key `extra` (the keys of the top level: "),
        "{message}"
    );
    // The keys of another kind's section.
    let message =
        parse_error("[task]\nkind = \"prompts\"\npath = \"x.jsonl\"\nanswer_kye = \"y\"\n");
    assert!(
        message.starts_with(
            "config: unknown key `task.answer_kye` (did you mean `task.answer_key`? the keys of [task]: answer_key, "
        ),
        "{message}"
    );
    let message = prepare_error(&["train.learning_rate=0.1"]);
    assert!(
        message
            .starts_with("unknown config key `train.learning_rate` (keys: backend, model.heads,"),
        "{message}"
    );
}

#[test]
fn wrong_types() {
    assert_eq!(
        parse_error(&edited("lr = 1e-4", "lr = \"fast\"")),
        "config: `train.lr` = \"fast\" is a string, expected a float like the default 0.0001"
    );
    assert_eq!(
        parse_error(&edited("steps = 300", "steps = 6.5")),
        "config: `steps` = 6.5 is a float, expected a integer like the default 300"
    );
    assert_eq!(
        parse_error(&format!("task = 3\n{}", edited("[task]", "[tusk]"))),
        "config: `task` = 3 is a integer, expected a table like the default { eval_questions = 500, kind = \"arithmetic\", max_operand = 49, ops = \"+\" }"
    );
    assert_eq!(
        prepare_error(&["train.lr=fast"]),
        "config key `train.lr`: \"fast\" is not a float like the default 0.0001"
    );
    // A negative number where an unsigned one is expected.
    let message = parse_error(&edited("steps = 300", "steps = -1"));
    assert!(message.starts_with("config: "), "{message}");
    assert!(message.contains("-1"), "{message}");
}

#[test]
fn out_of_range_values() {
    let cases: [(&str, &str, &str); 6] = [
        (
            "lr = 1e-4",
            "lr = -1e-4",
            "config: train.lr = -0.0001 must be a positive number",
        ),
        (
            "top_p = 0.0",
            "top_p = 1.5",
            "config: sampler.top_p = 1.5 must be in [0, 1] (0 = the recipe's)",
        ),
        (
            "grad_clip = 1.0",
            "grad_clip = -1.0",
            "config: train.grad_clip = -1 must be ≥ 0",
        ),
        (
            "backend = \"jit\"",
            "backend = \"gpu\"",
            "config: backend = \"gpu\": use \"interp\" or \"jit\"",
        ),
        (
            "heads = 4",
            "heads = 3",
            "config: model.hidden (64) must be a multiple of model.heads (3)",
        ),
        (
            "ops = \"+\"",
            "ops = \"/\"",
            "config: task.ops = \"/\": use one or more of `+`, `-`, `*`",
        ),
    ];
    for (old, new, expected) in cases {
        assert_eq!(parse_error(&edited(old, new)), expected, "{new}");
    }
    // Sizes that do not fit the task.
    assert_eq!(
        parse_error(&edited("max_positions = 32", "max_positions = 8")),
        "config: model.max_positions = 8 is too small: prompts of up to 6 tokens plus max(sampler.max_new_tokens = 5, the longest answer and its end token = 3) need 11"
    );
    assert_eq!(
        parse_error(&edited("max_new_tokens = 5", "max_new_tokens = 2")),
        "config: sampler.max_new_tokens = 2 cannot hold the longest answer and its end token (3 tokens for task.max_operand = 49 with \"+\")"
    );
    assert_eq!(
        parse_error(&edited("vocab = 0 ", "vocab = 5 ")),
        "config: model.vocab = 5 is smaller than the task's tokenizer (17 tokens; 0 = its size)"
    );
}

#[test]
fn keys_left_out_take_their_defaults() {
    // The empty config is the default.
    assert_eq!(Config::parse("", &[]).unwrap(), Config::default_config());
    // A config states only what it changes.
    let config = Config::parse("steps = 7\n[train]\nlr = 0.01\n", &[]).unwrap();
    let mut expected = Config::default_config();
    expected.steps = 7;
    expected.train.lr = 0.01;
    assert_eq!(config, expected);
    let without_sft = &DEFAULT_CONFIG[..DEFAULT_CONFIG.find("[sft]").unwrap()];
    assert_eq!(
        Config::parse(without_sft, &[]).unwrap(),
        Config::default_config()
    );
    // A pretrained model's defaults (configs/defaults-pretrained.toml), the larger LoRA rate with
    // `[model.lora]`, and a text task's own defaults.
    let text =
        "[model]\nkind = \"hf\"\npath = \"/m\"\n[task]\nkind = \"prompts\"\npath = \"/d.jsonl\"\n";
    let config: toml::Table =
        toml::from_str(&Config::parse(text, &[]).unwrap().to_toml().unwrap()).unwrap();
    assert_eq!(config["steps"].as_integer(), Some(100));
    assert_eq!(config["sampler"]["max_new_tokens"].as_integer(), Some(128));
    assert_eq!(config["train"]["lr"].as_float(), Some(1e-6));
    assert_eq!(config["train"]["micro_batch"].as_integer(), Some(4));
    assert_eq!(config["sft"]["steps"].as_integer(), Some(0));
    assert_eq!(config["task"]["answer_key"].as_str(), Some("answer"));
    assert_eq!(config["task"]["judge_batch"].as_integer(), Some(16));
    let lora = format!("{text}[model.lora]\n");
    let config: toml::Table =
        toml::from_str(&Config::parse(&lora, &[]).unwrap().to_toml().unwrap()).unwrap();
    assert_eq!(config["train"]["lr"].as_float(), Some(1e-4));
    assert_eq!(config["model"]["lora"]["rank"].as_integer(), Some(16));
    assert_eq!(config["model"]["lora"]["alpha"].as_float(), Some(32.0));
    // The resolved config parses back to itself, and every key of it may be set.
    let resolved = Config::parse(&lora, &[]).unwrap();
    assert_eq!(
        Config::parse(&resolved.to_toml().unwrap(), &[]).unwrap(),
        resolved
    );
    let set = Config::parse(&lora, &[("task.shuffle".into(), "true".into())]).unwrap();
    assert_eq!(set.to_toml().unwrap().matches("shuffle = true").count(), 1);
}

#[test]
fn bad_toml() {
    let message = parse_error("seed = \n");
    assert!(message.starts_with("config: "), "{message}");
    assert!(
        message.contains("string values must be quoted") || message.contains("expected"),
        "{message}"
    );
}

#[test]
fn bad_set_arguments() {
    assert_eq!(
        prepare_error(&["beta"]),
        "--set expects NAME=VALUE, got `beta`"
    );
    assert_eq!(
        prepare_error(&["betta=0.1"]),
        "--set betta: unknown param `betta` (did you mean `beta`?); config keys are written `section.key` (e.g. `train.lr`)"
    );
    assert_eq!(
        prepare_error(&["beta=lots"]),
        "--set beta: `lots` is not a number, `true` or `false`"
    );
    assert_eq!(
        prepare_error(&["backend=gpu"]),
        "config: backend = \"gpu\": use \"interp\" or \"jit\""
    );
    assert_eq!(
        prepare_error(&["train.lr=0"]),
        "config: train.lr = 0 must be a positive number"
    );
    assert_eq!(
        prepare_error(&["train=1"]),
        "--set train: unknown param `train` (params: eps_low, eps_high, clip_c, beta); config keys are written `section.key` (e.g. `train.lr`)"
    );
}

#[test]
fn recipe_inputs_the_trainer_cannot_fill() {
    let grpo =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../recipes/grpo.rlx"))
            .unwrap();
    let text = grpo
        .replace("input score    : f32[resp]", "input judge    : f32[resp]")
        .replace("reward    = score", "reward    = judge");
    let checked = rlx_compiler::check_source("judge.rlx", &text);
    let hir = checked.recipe.expect("the recipe checks");
    let message = match prepare(&hir, &args(&[])) {
        Ok(_) => panic!("expected an error"),
        Err(message) => message,
    };
    assert_eq!(
        message,
        "recipe input `judge` (f32[resp]) cannot be filled by the trainer: it fills logp (f32[tok] policy), old_logp (f32[tok]), ref_logp (f32[tok]), teacher_logp (f32[tok], with a [teacher]), entropy (f32[tok], policy or not), score (f32[resp]), length (f32[resp]), and inputs with a default"
    );
}

/// `recipes/grpo.rlx` with its `rollout { … }` block replaced by `rollout` (and `extra` declarations).
fn grpo_with_rollout(extra: &str, rollout: &str) -> rlx_compiler::hir::Recipe {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let text = std::fs::read_to_string(root.join("recipes/grpo.rlx")).unwrap();
    let start = text
        .find("rollout {")
        .expect("grpo.rlx has a rollout block");
    let text = format!("{extra}\n{}{rollout}\n", &text[..start]);
    let checked = rlx_compiler::check_source("grpo_variant.rlx", &text);
    assert!(!checked.has_errors(), "{:?}", checked.diagnostics);
    checked.recipe.expect("recipe checks")
}

#[test]
fn the_recipe_rollout_drives_the_sampler_unless_the_config_sets_it() {
    let recipe = grpo_with_rollout(
        "",
        "rollout {\n n = 3\n temperature = 0.5\n top_p = 0.9\n max_new_tokens = 99\n stop = [\"</a>\"]\n}",
    );
    let prepared = prepare(&recipe, &args(&[])).unwrap();
    let plan = &prepared.plan;
    assert_eq!(
        (plan.group_size, plan.temperature, plan.top_p),
        (3, 0.5, 0.9)
    );
    // What the trainer does not apply is said, not silently dropped.
    assert_eq!(prepared.notes.len(), 2, "{:?}", prepared.notes);
    assert!(prepared.notes[0].contains("`rollout { max_new_tokens }` is not applied by `rlx run`"));
    assert!(prepared.notes[1].contains("`rollout { stop }` is not applied"));
    let prepared = prepare(
        &recipe,
        &args(&[
            "sampler.n=5",
            "sampler.temperature=0.7",
            "sampler.top_p=0.8",
        ]),
    )
    .unwrap();
    let plan = &prepared.plan;
    assert_eq!(
        (plan.group_size, plan.temperature, plan.top_p),
        (5, 0.7, 0.8)
    );
    // A param follows `--set`; no rollout block means 8 samples at temperature 1 and top-p 1.
    let recipe = grpo_with_rollout("param tau = 0.3", "rollout {\n temperature = tau\n}");
    assert_eq!(prepare(&recipe, &args(&[])).unwrap().plan.temperature, 0.3);
    assert_eq!(
        prepare(&recipe, &args(&["tau=0.6"]))
            .unwrap()
            .plan
            .temperature,
        0.6
    );
    let recipe = grpo_with_rollout("", "");
    let plan = prepare(&recipe, &args(&[])).unwrap().plan;
    assert_eq!(
        (plan.group_size, plan.temperature, plan.top_p),
        (8, 1.0, 1.0)
    );
}

#[test]
fn rollout_settings_the_trainer_cannot_honour_are_errors() {
    let error = |rollout: &str| match prepare(&grpo_with_rollout("", rollout), &args(&[])) {
        Ok(_) => panic!("expected an error for {rollout}"),
        Err(message) => message,
    };
    assert_eq!(
        error("rollout {\n temperature = 1.0 - 0.5 * progress\n}"),
        "the recipe's `rollout { temperature }` is an expression; `rlx run` takes a constant or a param there (or set `sampler.temperature` in the config)"
    );
    assert_eq!(
        error("rollout {\n n = 0\n}"),
        "the recipe's `rollout { n = 0 }` must be a whole number from 1 to 4096"
    );
    assert_eq!(
        error("rollout {\n top_p = 1.5\n}"),
        "the recipe's `rollout { top_p = 1.5 }` must be in (0, 1]"
    );
    // The config's own setting makes the recipe's unnecessary.
    let recipe = grpo_with_rollout("", "rollout {\n temperature = 1.0 - 0.5 * progress\n}");
    let plan = prepare(&recipe, &args(&["sampler.temperature=1"]))
        .unwrap()
        .plan;
    assert_eq!(plan.temperature, 1.0);
}

/// Whether `message` matches `pattern`, where `*` stands for any text.
fn matches_pattern(message: &str, pattern: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let mut rest = message;
    for (k, part) in parts.iter().enumerate() {
        if k == 0 {
            match rest.strip_prefix(part) {
                Some(r) => rest = r,
                None => return false,
            }
        } else if k == parts.len() - 1 {
            return rest.ends_with(part);
        } else {
            match rest.find(part) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
    }
    rest.is_empty()
}

/// Every case of tests/data/bad_sizes.txt: sizes out of their key's range, and sizes in range whose
/// memory estimate exceeds the machine, are config errors before anything is allocated (they used to
/// abort the process with SIGABRT, or, for `model.hidden = 0`, pass).
#[test]
fn bad_sizes_are_config_errors() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/bad_sizes.txt");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut cases = 0;
    for (k, line) in text.lines().enumerate() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (sets, expected) = line
            .split_once(" => ")
            .unwrap_or_else(|| panic!("{}:{}: no ` => `", path.display(), k + 1));
        let sets: Vec<&str> = sets.split_whitespace().collect();
        let message = prepare_error(&sets);
        assert!(
            matches_pattern(&message, expected),
            "{}:{}: {sets:?}\n  got      {message}\n  expected {expected}",
            path.display(),
            k + 1
        );
        cases += 1;
    }
    assert!(cases >= 18, "{cases} cases");
}
