//! The trainer's configuration: TOML with strict validation (an unknown key is an error), an embedded
//! default (`configs/default.toml`), and `--set section.key=value` overrides.

use serde::{Deserialize, Serialize};

use crate::model::ModelConfig;
use crate::sample::SamplerConfig;
use crate::task::TaskConfig;

pub const DEFAULT_CONFIG: &str = include_str!("../../configs/default.toml");

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
    /// Greedy accuracy on the held-out questions every this many steps (0 = only first and last).
    pub eval_every: usize,
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
    pub model: ModelConfig,
    pub task: TaskConfig,
    pub sampler: SamplerConfig,
    pub train: TrainConfig,
    pub sft: SftConfig,
}

impl Config {
    /// The embedded default.
    pub fn default_config() -> Config {
        Config::parse(DEFAULT_CONFIG, &[]).expect("the embedded default config is valid")
    }

    /// Parse `text` (TOML) and apply `sets` (`section.key`, value as TOML or a bare string).
    pub fn parse(text: &str, sets: &[(String, String)]) -> Result<Config, String> {
        let mut value: toml::Table =
            toml::from_str(text).map_err(|e| format!("config: {}", e.message()))?;
        for (key, raw) in sets {
            set_key(&mut value, key, raw)?;
        }
        let config: Config = toml::Value::Table(value)
            .try_into()
            .map_err(|e: toml::de::Error| format!("config: {}", e.message()))?;
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), String> {
        if !matches!(self.backend.as_str(), "interp" | "jit") {
            return Err(format!(
                "config: backend = {:?}: use \"interp\" or \"jit\"",
                self.backend
            ));
        }
        if self.train.prompts_per_step == 0 || self.train.epochs == 0 {
            return Err("config: train.prompts_per_step and train.epochs must be positive".into());
        }
        if self.sampler.max_new_tokens == 0 {
            return Err("config: sampler.max_new_tokens must be positive".into());
        }
        if !(self.sampler.top_p > 0.0 && self.sampler.top_p <= 1.0) {
            return Err(format!(
                "config: sampler.top_p = {} must be in (0, 1]",
                self.sampler.top_p
            ));
        }
        if self.sft.steps > 0 && self.sft.batch == 0 {
            return Err("config: sft.batch must be positive".into());
        }
        Ok(())
    }
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
