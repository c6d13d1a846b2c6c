//! The trainer's configuration: TOML with strict validation (an unknown key is an error), an embedded
//! default (`configs/default.toml`), and `--set section.key=value` overrides.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;

use serde::{Deserialize, Serialize};

use rlx_signals::SignalSpec;

pub use crate::kinds::{ModelSection, TaskSection};
use crate::sample::SamplerConfig;

pub const DEFAULT_CONFIG: &str = include_str!("../../configs/default.toml");

/// The defaults of a run on a pretrained model where they differ from [`DEFAULT_CONFIG`] (its
/// `[lora.*]` tables apply with `[model.lora]`).
pub const PRETRAINED_DEFAULTS: &str = include_str!("../../configs/defaults-pretrained.toml");

/// The most bytes of a config file `rlx run --config` and `rlx export --config` read (untrusted input:
/// a config is a page of TOML).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    pub prompts_per_step: usize,
    pub lr: f64,
    pub weight_decay: f64,
    /// Clip the global gradient norm to this (0 = no clipping).
    pub grad_clip: f64,
    /// Optimisation epochs per batch of samples (PPO-style; `old_logp` stays fixed).
    pub epochs: usize,
    /// Responses per backward pass (0 = the whole batch); the gradient does not depend on it.
    pub micro_batch: usize,
    /// Greedy accuracy on the held-out questions every this many steps (0 = only first and last).
    pub eval_every: usize,
    /// Write a checkpoint every this many steps (0 = only at the end).
    pub checkpoint_every: usize,
    /// DAPO's dynamic sampling: when the recipe's `keep` drops groups, sample more prompts, up to this
    /// many rounds per step, until `prompts_per_step` groups are kept (1 = never resample).
    pub max_sampling_rounds: usize,
    /// Write every response of every this many steps (from the first) to `OUT/samples.jsonl`: prompt,
    /// completion, signals, reward, advantage, kept (0 = never).
    pub samples_every: usize,
    /// Sampled completions per held-out prompt for pass@k at every evaluation (k; 0 = greedy only).
    pub eval_samples: usize,
    /// Where the step runs: `"cpu"`, or `"cuda"` / `"cuda:N"` for GPU N (the model, the sampler, the
    /// reference model, the LM head, the recipe's kernels and AdamW all on the GPU; needs an rlx built
    /// with `--features cuda`, docs/gpu.md). `rlx run --device` overrides it.
    pub device: String,
    /// The dtype of the model's projections' products: `"f32"`, or `"bf16"` (inputs and weights cast to
    /// bf16 for each product, everything else f32: [`crate::model::Model::with_compute_dtype`]).
    pub dtype: String,
}

impl TrainConfig {
    /// `train.dtype` as a candle dtype.
    pub fn compute_dtype(&self) -> Result<candle_core::DType, String> {
        match self.dtype.as_str() {
            "f32" => Ok(candle_core::DType::F32),
            "bf16" => Ok(candle_core::DType::BF16),
            other => Err(format!(
                "config: train.dtype = {other:?}: use \"f32\" or \"bf16\" (the dtype of the projections' products)"
            )),
        }
    }
}

/// Where a run's step runs (`train.device`, `rlx run --device`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrainDevice {
    Cpu,
    /// GPU N.
    Cuda(usize),
}

impl TrainDevice {
    /// `cpu`, `cuda` (GPU 0) or `cuda:N`; anything else is an error naming the accepted forms.
    pub fn parse(text: &str) -> Result<TrainDevice, String> {
        match text.trim() {
            "cpu" => Ok(TrainDevice::Cpu),
            "cuda" => Ok(TrainDevice::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse::<usize>().ok())
                .map(TrainDevice::Cuda)
                .ok_or_else(|| {
                    format!(
                        "device {other:?}: use \"cpu\", \"cuda\" or \"cuda:N\" (N the GPU's index)"
                    )
                }),
        }
    }

    /// The GPU's index, `None` for the CPU.
    pub fn gpu(self) -> Option<usize> {
        match self {
            TrainDevice::Cpu => None,
            TrainDevice::Cuda(n) => Some(n),
        }
    }
}

impl std::fmt::Display for TrainDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TrainDevice::Cpu => write!(f, "cpu"),
            TrainDevice::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SftConfig {
    pub steps: usize,
    pub batch: usize,
    pub lr: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub seed: u64,
    pub steps: usize,
    pub out: String,
    pub backend: String,
    /// `[model]`: `kind = "tiny"` (the default; the other keys size it) or `"smollm2"`.
    pub model: ModelSection,
    /// `[task]`: `kind = "arithmetic"` (the default) or a text task (`healthbench`, `ifeval`, `prompts`).
    pub task: TaskSection,
    pub sampler: SamplerConfig,
    pub train: TrainConfig,
    pub sft: SftConfig,
    /// `[signals.NAME]` tables of a text task (docs/signals.md), each filling the recipe input `NAME`.
    #[serde(default, skip_serializing_if = "toml::Table::is_empty")]
    pub signals: toml::Table,
    /// `[teacher]`: the frozen model whose log-probabilities of the sampled tokens fill the recipe input
    /// `teacher_logp` (on-policy distillation); the keys and kinds of `[model]`, without `lora`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub teacher: Option<ModelSection>,
}

impl Config {
    /// The embedded default.
    pub fn default_config() -> Config {
        Config::parse(DEFAULT_CONFIG, &[]).expect("the embedded default config is valid")
    }

    /// Parse `text` (TOML) and apply `sets` (`section.key`, value as TOML or a bare string). Every key
    /// may be left out: it then takes its default ([`defaults_for`]); an unknown key is an error with
    /// the closest known one.
    pub fn parse(text: &str, sets: &[(String, String)]) -> Result<Config, String> {
        let user: toml::Table =
            toml::from_str(text).map_err(|e| format!("config: {}", e.message()))?;
        let kind = |section: &str, default: &str| -> Result<String, String> {
            match user
                .get(section)
                .and_then(|s| s.as_table())
                .and_then(|t| t.get("kind"))
            {
                None => Ok(default.to_string()),
                Some(toml::Value::String(k)) => Ok(k.clone()),
                Some(other) => Err(format!(
                    "config: `{section}.kind` = {other} is a {}, expected a string",
                    other.type_str()
                )),
            }
        };
        let (model_kind, task_kind) = (kind("model", "tiny")?, kind("task", "arithmetic")?);
        let lora = user
            .get("model")
            .and_then(|m| m.as_table())
            .is_some_and(|m| m.contains_key("lora"));
        let defaults = defaults_for(&model_kind, &task_kind, lora);
        check_keys(&user, &defaults)?;
        let mut user = user;
        let teacher = match user.remove("teacher") {
            None => None,
            Some(toml::Value::Table(teacher)) => Some(teacher_table(teacher)?),
            Some(other) => {
                return Err(format!(
                    "config: `teacher` = {other} is a {}, expected a table `[teacher]` (the keys of `[model]`)",
                    other.type_str()
                ))
            }
        };
        let mut value = defaults;
        merge(&mut value, user);
        if let Some(teacher) = teacher {
            value.insert("teacher".into(), teacher.into());
        }
        let config: Config = toml::Value::Table(value)
            .try_into()
            .map_err(|e: toml::de::Error| format!("config: {}", e.message()))?;
        let config = if sets.is_empty() {
            config
        } else {
            // Every key of the resolved config (the kinds' own defaults included) may be set.
            let mut table = config.to_table()?;
            for (key, raw) in sets {
                set_key(&mut table, key, raw)?;
            }
            toml::Value::Table(table)
                .try_into()
                .map_err(|e: toml::de::Error| format!("config: {}", e.message()))?
        };
        config.validate()?;
        Ok(config)
    }

    /// The resolved config as TOML (every key, defaults included): `OUT/config.toml`, the checkpoint's
    /// config and `rlx run --print-config`.
    pub fn to_toml(&self) -> Result<String, String> {
        toml::to_string(self).map_err(|e| format!("config: {e}"))
    }

    fn to_table(&self) -> Result<toml::Table, String> {
        toml::Table::try_from(self).map_err(|e| format!("config: {e}"))
    }

    pub fn validate(&self) -> Result<(), String> {
        fn positive(name: &str, value: f64) -> Result<(), String> {
            if value.is_finite() && value > 0.0 {
                Ok(())
            } else {
                Err(format!(
                    "config: {name} = {value} must be a positive number"
                ))
            }
        }
        fn non_negative(name: &str, value: f64) -> Result<(), String> {
            if value.is_finite() && value >= 0.0 {
                Ok(())
            } else {
                Err(format!("config: {name} = {value} must be ≥ 0"))
            }
        }
        if !matches!(self.backend.as_str(), "interp" | "jit") {
            return Err(format!(
                "config: backend = {:?}: use \"interp\" or \"jit\"",
                self.backend
            ));
        }
        TrainDevice::parse(&self.train.device).map_err(|e| format!("config: train.{e}"))?;
        self.train.compute_dtype()?;
        for (key, value, range) in self.ranged_sizes() {
            in_range(key, value, range)?;
        }
        positive("train.lr", self.train.lr)?;
        non_negative("train.weight_decay", self.train.weight_decay)?;
        non_negative("train.grad_clip", self.train.grad_clip)?;
        if !(self.sampler.top_p >= 0.0 && self.sampler.top_p <= 1.0) {
            return Err(format!(
                "config: sampler.top_p = {} must be in [0, 1] (0 = the recipe's)",
                self.sampler.top_p
            ));
        }
        if !self.sampler.temperature.is_finite() {
            return Err(format!(
                "config: sampler.temperature = {} must be a number (< 0 = the recipe's)",
                self.sampler.temperature
            ));
        }
        if self.sft.steps > 0 {
            positive("sft.lr", self.sft.lr)?;
        }
        let signals = self.signal_specs()?;
        self.validate_teacher()?;
        match (&self.model, &self.task) {
            (ModelSection::Tiny(_), TaskSection::Arithmetic(_) | TaskSection::Decompose(_)) => {
                if let Some(name) = signals.keys().next() {
                    return Err(format!(
                        "config: [signals.{name}]: signals feed text tasks; the {} task fills its inputs itself ({})",
                        self.task.kind(),
                        self.builtin_task()?.0.signals().join(", ")
                    ));
                }
                self.validate_builtin()
            }
            (_, TaskSection::Arithmetic(_) | TaskSection::Decompose(_)) => Err(format!(
                "config: task.kind = \"{}\" needs model.kind = \"tiny\", not \"{}\" (the built-in tasks have their own character tokenizer)",
                self.task.kind(),
                self.model.kind()
            )),
            (ModelSection::Tiny(_), text) => Err(format!(
                "config: task.kind = \"{}\" needs a pretrained model, model.kind = \"smollm2\" or \"hf\" (its prompts are written in that model's tokenizer and chat template)",
                text.kind()
            )),
            (_, text) => {
                self.model.validate()?;
                match text.text() {
                    Some((_, config)) => config.validate(),
                    None => Ok(()),
                }
            }
        }
    }

    /// The checks of `[teacher]` that need no file: a teacher's token log-probabilities must be over the
    /// policy's tokens, so a tiny teacher goes with a tiny policy (the arithmetic tokenizer) and the
    /// same vocabulary, a pretrained one with a pretrained policy (whose tokenizers
    /// [`crate::train::plan`] compares, before any weight is read).
    fn validate_teacher(&self) -> Result<(), String> {
        let Some(teacher) = &self.teacher else {
            return Ok(());
        };
        match (&self.model, teacher) {
            (ModelSection::Tiny(_), ModelSection::Tiny(_)) => {
                let (policy, model) = (self.model.model_config()?, teacher.model_config()?);
                model
                    .validate()
                    .map_err(|e| format!("config: [teacher]: {e}"))?;
                for (key, value) in [
                    ("teacher.init_std", model.init_std),
                    ("teacher.rms_eps", model.rms_eps),
                    ("teacher.rope_theta", model.rope_theta),
                ] {
                    if !(value.is_finite() && value > 0.0) {
                        return Err(format!(
                            "config: {key} = {value} must be a positive number"
                        ));
                    }
                }
                if model.vocab != policy.vocab {
                    return Err(format!(
                        "config: teacher.vocab = {} differs from model.vocab = {} (0 = the tokenizer's {}): the teacher's log-probabilities must be over the policy's tokens",
                        model.vocab,
                        policy.vocab,
                        crate::task::Tokenizer.vocab_size()
                    ));
                }
                Ok(())
            }
            (ModelSection::Tiny(_), _) | (_, ModelSection::Tiny(_)) => Err(format!(
                "config: teacher.kind = \"{}\" with model.kind = \"{}\": the teacher's tokenizer must be the policy's (its log-probabilities are of the policy's tokens), and a tiny model has the arithmetic task's character tokenizer, a pretrained one its own",
                teacher.kind(),
                self.model.kind()
            )),
            _ => Ok(()),
        }
    }

    /// Every size key with its range (docs/training.md, "Configuration"): the range keeps each
    /// key's own allocations sane; [`crate::memory::Estimate`] then checks what they need together.
    fn ranged_sizes(&self) -> Vec<(&'static str, usize, RangeInclusive<usize>)> {
        let mut sizes = vec![
            ("steps", self.steps, 1..=1_000_000),
            (
                "train.prompts_per_step",
                self.train.prompts_per_step,
                1..=65_536,
            ),
            ("train.epochs", self.train.epochs, 1..=1_000),
            (
                "train.eval_samples",
                self.train.eval_samples,
                0..=crate::train::MAX_GROUP_SIZE,
            ),
            (
                "train.max_sampling_rounds",
                self.train.max_sampling_rounds,
                1..=1_000,
            ),
            (
                "sampler.n",
                self.sampler.n,
                0..=crate::train::MAX_GROUP_SIZE,
            ),
            (
                "sampler.max_new_tokens",
                self.sampler.max_new_tokens,
                1..=65_536,
            ),
            ("sft.steps", self.sft.steps, 0..=1_000_000),
        ];
        if self.sft.steps > 0 {
            sizes.push(("sft.batch", self.sft.batch, 1..=65_536));
        }
        if let ModelSection::Tiny(model) = &self.model {
            let names = [
                "model.vocab",
                "model.hidden",
                "model.layers",
                "model.heads",
                "model.kv_heads",
                "model.intermediate",
                "model.max_positions",
            ];
            sizes.extend(tiny_sizes(names, model));
        }
        if let Some(ModelSection::Tiny(model)) = &self.teacher {
            let names = [
                "teacher.vocab",
                "teacher.hidden",
                "teacher.layers",
                "teacher.heads",
                "teacher.kv_heads",
                "teacher.intermediate",
                "teacher.max_positions",
            ];
            sizes.extend(tiny_sizes(names, model));
        }
        if let TaskSection::Arithmetic(task) = &self.task {
            sizes.push(("task.eval_questions", task.eval_questions, 1..=1_000_000));
        }
        sizes
    }

    /// The `[signals.NAME]` tables, parsed (unknown kinds and keys are errors naming the signal).
    pub fn signal_specs(&self) -> Result<BTreeMap<String, SignalSpec>, String> {
        let mut specs = BTreeMap::new();
        for (name, value) in &self.signals {
            let spec: SignalSpec = value.clone().try_into().map_err(|e: toml::de::Error| {
                format!("config: [signals.{name}]: {}", e.message())
            })?;
            specs.insert(name.clone(), spec);
        }
        Ok(specs)
    }

    /// The built-in task of `[task]` (arithmetic or decompose), checked, with the longest answer it
    /// warm-starts on (in characters) and the keys that set it; an error for a text task.
    fn builtin_task(&self) -> Result<(Box<dyn crate::task::Task>, usize, String), String> {
        let fail = |e: String| format!("config: {e}");
        match &self.task {
            TaskSection::Arithmetic(config) => {
                let task = crate::task::Arithmetic::new(config.clone()).map_err(fail)?;
                let longest = task.max_answer_chars();
                let keys = format!(
                    "task.max_operand = {} with {:?}",
                    config.max_operand, config.ops
                );
                Ok((Box::new(task), longest, keys))
            }
            TaskSection::Decompose(config) => {
                let task = crate::decompose::Decompose::new(config.clone()).map_err(fail)?;
                let longest = task.max_answer_chars();
                let keys = format!(
                    "task.max_operand = {} with {:?}",
                    config.max_operand, config.op
                );
                Ok((Box::new(task), longest, keys))
            }
            other => Err(format!(
                "config: task.kind = \"{}\" is not a built-in task",
                other.kind()
            )),
        }
    }

    /// The checks of the built-in job (tiny model, arithmetic or decompose task).
    fn validate_builtin(&self) -> Result<(), String> {
        fn positive(name: &str, value: f64) -> Result<(), String> {
            if value.is_finite() && value > 0.0 {
                Ok(())
            } else {
                Err(format!(
                    "config: {name} = {value} must be a positive number"
                ))
            }
        }
        let model = self.model.model_config()?;
        model.validate().map_err(|e| format!("config: {e}"))?;
        positive("model.init_std", model.init_std)?;
        positive("model.rms_eps", model.rms_eps)?;
        positive("model.rope_theta", model.rope_theta)?;
        if model.vocab != 0 && model.vocab < crate::task::Tokenizer.vocab_size() {
            return Err(format!(
                "config: model.vocab = {} is smaller than the task's tokenizer ({} tokens; 0 = its size)",
                model.vocab,
                crate::task::Tokenizer.vocab_size()
            ));
        }
        let (task, longest, what) = self.builtin_task()?;
        let prompt = task.max_prompt_tokens();
        let warm = longest + 1;
        let needed = prompt + self.sampler.max_new_tokens.max(warm);
        if needed > model.max_positions {
            return Err(format!(
                "config: model.max_positions = {} is too small: prompts of up to {prompt} tokens plus max(sampler.max_new_tokens = {}, the longest answer and its end token = {warm}) need {needed}",
                model.max_positions, self.sampler.max_new_tokens
            ));
        }
        if self.sampler.max_new_tokens < warm {
            return Err(format!(
                "config: sampler.max_new_tokens = {} cannot hold the longest answer and its end token ({warm} tokens for {what})",
                self.sampler.max_new_tokens
            ));
        }
        Ok(())
    }
}

/// `[teacher]` checked as a `[model]` table (its keys, with the closest known one for an unknown key,
/// and their types) and completed with the defaults of its kind (a tiny teacher's left-out keys are
/// `[model]`'s defaults in configs/default.toml, not the policy's). A teacher has no `lora`: it is
/// frozen, so adapters would stay at their initial zero.
fn teacher_table(teacher: toml::Table) -> Result<toml::Table, String> {
    if teacher.contains_key("lora") {
        return Err(
            "config: `teacher.lora`: the teacher is frozen (it is never trained), so it takes no LoRA adapters; remove `[teacher.lora]`"
                .into(),
        );
    }
    let kind = match teacher.get("kind") {
        None => "tiny".to_string(),
        Some(toml::Value::String(k)) => k.clone(),
        Some(other) => {
            return Err(format!(
                "config: `teacher.kind` = {other} is a {}, expected a string",
                other.type_str()
            ))
        }
    };
    let mut defaults = match defaults_for(&kind, "arithmetic", false).remove("model") {
        Some(toml::Value::Table(model)) => model,
        _ => toml::Table::new(),
    };
    // The checks of `[model]`, the messages naming `teacher.KEY`.
    let mut wrapped = toml::Table::new();
    wrapped.insert("model".into(), teacher.clone().into());
    let mut want = toml::Table::new();
    want.insert("model".into(), defaults.clone().into());
    check_keys(&wrapped, &want).map_err(|e| {
        e.replace("`model.", "`teacher.")
            .replace("[model]", "[teacher]")
    })?;
    merge(&mut defaults, teacher);
    Ok(defaults)
}

/// `value` of `key` must lie in `range`.
fn in_range(key: &str, value: usize, range: RangeInclusive<usize>) -> Result<(), String> {
    if range.contains(&value) {
        Ok(())
    } else {
        Err(format!(
            "config: {key} = {value} is out of range: {}..={}",
            range.start(),
            range.end()
        ))
    }
}

/// The defaults of a config whose `[model]` and `[task]` have these kinds: configs/default.toml (the
/// built-in job), its `[model]` and `[task]` replaced by the other kinds' own defaults, and for a
/// pretrained model configs/defaults-pretrained.toml over it (its `[lora]` part with `[model.lora]`).
pub fn defaults_for(model_kind: &str, task_kind: &str, lora: bool) -> toml::Table {
    let mut table: toml::Table = toml::from_str(DEFAULT_CONFIG).expect("default config parses");
    if model_kind != "tiny" {
        table.insert("model".into(), toml::Table::new().into());
        let mut pretrained: toml::Table =
            toml::from_str(PRETRAINED_DEFAULTS).expect("pretrained defaults parse");
        let with_lora = pretrained.remove("lora");
        merge(&mut table, pretrained);
        if let (true, Some(toml::Value::Table(with_lora))) = (lora, with_lora) {
            merge(&mut table, with_lora);
        }
    }
    if task_kind != "arithmetic" {
        table.insert("task".into(), toml::Table::new().into());
    }
    for (section, kind) in [("model", model_kind), ("task", task_kind)] {
        if let Some(toml::Value::Table(t)) = table.get_mut(section) {
            t.insert("kind".into(), kind.into());
        }
    }
    table
}

/// `over`'s keys put into `base`, tables merged key by key.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// The keys a section of another kind than the default's may have besides its defaults' (checked
/// further by their own types).
fn kind_keys(section: &str, kind: &str) -> Option<Vec<String>> {
    let names: &[&str] = match (section, kind) {
        ("model", "smollm2") => &["kind", "lora"],
        ("model", "hf") => &["kind", "path", "lora"],
        ("task", "decompose") => {
            let mut keys: Vec<String> =
                toml::Table::try_from(crate::decompose::DecomposeConfig::default())
                    .map(|t| t.keys().cloned().collect())
                    .unwrap_or_default();
            keys.push("kind".into());
            return Some(keys);
        }
        ("task", "healthbench" | "ifeval" | "prompts") => {
            let text: crate::text_task::TextTaskConfig =
                toml::from_str("").expect("every text task key has a default");
            let mut keys: Vec<String> = toml::Table::try_from(&text)
                .map(|t| t.keys().cloned().collect())
                .unwrap_or_default();
            keys.push("kind".into());
            return Some(keys);
        }
        // An unknown kind: its own type names the kinds.
        _ => return None,
    };
    Some(names.iter().map(|s| s.to_string()).collect())
}

/// Every `section.key` (and top-level key) of the default config, for messages.
pub fn config_keys() -> Vec<String> {
    let table: toml::Table = toml::from_str(DEFAULT_CONFIG).expect("default config parses");
    let mut keys = Vec::new();
    for (k, v) in &table {
        match v {
            toml::Value::Table(section) => {
                keys.extend(section.keys().map(|s| format!("{k}.{s}")));
            }
            _ => keys.push(k.clone()),
        }
    }
    keys
}

/// Every key of `table` must be a key of `defaults` (or of its section's kind) with the default's
/// type (an integer where a float is expected is fine); checked here so that each message names the
/// key and the closest known one. `[signals]` and the tables inside `[model]` are checked by their own
/// types.
fn check_keys(table: &toml::Table, defaults: &toml::Table) -> Result<(), String> {
    fn walk(
        prefix: &str,
        have: &toml::Table,
        want: &toml::Table,
        extra: &[String],
    ) -> Result<(), String> {
        for (key, value) in have {
            let path = format!("{prefix}{key}");
            let Some(expected) = want.get(key) else {
                if extra.contains(key) {
                    continue;
                }
                let mut known: Vec<String> = want.keys().cloned().collect();
                known.extend(extra.iter().cloned());
                known.sort();
                known.dedup();
                let hint = match rlx_compiler::diagnostic::closest_name(
                    key,
                    known.iter().map(String::as_str),
                ) {
                    Some(k) => format!("did you mean `{prefix}{k}`? "),
                    None => String::new(),
                };
                let section = if prefix.is_empty() {
                    "the top level".to_string()
                } else {
                    format!("[{}]", prefix.trim_end_matches('.'))
                };
                return Err(format!(
                    "config: unknown key `{path}` ({hint}the keys of {section}: {})",
                    known.join(", ")
                ));
            };
            match (expected, value) {
                (toml::Value::Table(want), toml::Value::Table(have)) => {
                    walk(&format!("{path}."), have, want, &[])?
                }
                (toml::Value::Float(_), toml::Value::Integer(_)) => {}
                (expected, value)
                    if std::mem::discriminant(expected) != std::mem::discriminant(value) =>
                {
                    return Err(format!(
                        "config: `{path}` = {value} is a {}, expected a {} like the default {expected}",
                        value.type_str(),
                        expected.type_str()
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }
    let mut have = table.clone();
    have.remove("signals");
    // `[teacher]` is checked by `teacher_table`.
    have.remove("teacher");
    let mut want = defaults.clone();
    want.insert("signals".into(), toml::Table::new().into());
    // The sections whose kind is not the default's: their own keys, then their types.
    for section in ["model", "task"] {
        if let Some(toml::Value::Table(t)) = have.get(section) {
            let kind = t.get("kind").and_then(|k| k.as_str()).unwrap_or("");
            let default_kind = if section == "model" {
                "tiny"
            } else {
                "arithmetic"
            };
            if !kind.is_empty() && kind != default_kind {
                if let Some(keys) = kind_keys(section, kind) {
                    let mut inner = t.clone();
                    if section == "model" {
                        inner.remove("lora");
                    }
                    walk(&format!("{section}."), &inner, &toml::Table::new(), &keys)?;
                }
                have.remove(section);
            }
        }
    }
    walk("", &have, &want, &[])
}

fn set_key(table: &mut toml::Table, key: &str, raw: &str) -> Result<(), String> {
    let unknown = || {
        format!(
            "unknown config key `{key}` (keys: {})",
            config_keys().join(", ")
        )
    };
    let mut parts: Vec<&str> = key.split('.').collect();
    let last = parts.pop().ok_or_else(unknown)?;
    let mut here = table;
    for part in parts {
        here = match here.get_mut(part) {
            Some(toml::Value::Table(t)) => t,
            _ => return Err(unknown()),
        };
    }
    let Some(old) = here.get(last) else {
        return Err(unknown());
    };
    let parsed = toml::from_str::<toml::Table>(&format!("v = {raw}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()));
    // An integer where a float is expected is fine.
    let parsed = match (old, parsed) {
        (toml::Value::Float(_), toml::Value::Integer(i)) => toml::Value::Float(i as f64),
        (_, p) => p,
    };
    if std::mem::discriminant(old) != std::mem::discriminant(&parsed) {
        return Err(format!(
            "config key `{key}`: {raw:?} is not a {} like the default {old}",
            old.type_str()
        ));
    }
    here.insert(last.to_string(), parsed);
    Ok(())
}

/// A tiny model's sizes with their allowed ranges (the one table of them, for `[model]` and
/// `[teacher]`), named `names`: vocab, hidden, layers, heads, kv_heads, intermediate, max_positions.
fn tiny_sizes(
    names: [&'static str; 7],
    model: &crate::model::ModelConfig,
) -> [(&'static str, usize, RangeInclusive<usize>); 7] {
    let [vocab, hidden, layers, heads, kv_heads, intermediate, max_positions] = names;
    [
        (vocab, model.vocab, 0..=1_048_576),
        (hidden, model.hidden, 1..=65_536),
        (layers, model.layers, 1..=1_024),
        (heads, model.heads, 1..=1_024),
        (kv_heads, model.kv_heads, 1..=1_024),
        (intermediate, model.intermediate, 1..=1_048_576),
        (max_positions, model.max_positions, 1..=1_048_576),
    ]
}
