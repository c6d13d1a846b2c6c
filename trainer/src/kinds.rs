//! The `[model]` and `[task]` sections of the config: which policy `rlx run` trains and on what. Each
//! is a TOML table with a `kind` (default `"tiny"` / `"arithmetic"`, the built-in job) and that kind's
//! keys; a key of another kind is an error.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::{DType, Device};
use serde::{Deserialize, Serialize};

use rlx_compiler::ir::Graph;
use rlx_signals::{Registry, SignalSpec};

use crate::decompose::{Decompose, DecomposeConfig};
use crate::model::{LoraConfig, Model, ModelConfig};
use crate::task::{Arithmetic, Task, TaskConfig, Tokenizer};
use crate::text_task::{bind_signals, check_data_path, Source, TextTask, TextTaskConfig};
use crate::tokenizer::ChatTokenizer;

/// `[model]`: the policy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ModelSection {
    /// A freshly initialised tiny Llama-style model (the built-in task's), sized by the other keys.
    Tiny(ModelConfig),
    /// SmolLM2-135M-Instruct from the GGUF that `scripts/fetch-assets.sh` fetches (dequantised to f32);
    /// its tokenizer and chat template format the prompts. Every weight is trained, or LoRA adapters
    /// with `[model.lora]`.
    Smollm2 {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lora: Option<LoraConfig>,
    },
    /// A Hugging Face checkpoint folder (`hf.rs`): Llama, Qwen2 or Qwen3, with its tokenizer, chat
    /// template and generation config.
    Hf {
        path: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lora: Option<LoraConfig>,
    },
}

/// `[task]`: where prompts and signals come from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TaskSection {
    /// Generated arithmetic questions with the verifiable `score` (the built-in task).
    Arithmetic(TaskConfig),
    /// The open-ended built-in task: write a target as `a OP b` (many correct answers, an exact
    /// partition; docs/experiments.md).
    Decompose(DecomposeConfig),
    /// HealthBench conversations with per-prompt rubrics.
    Healthbench(TextTaskConfig),
    /// IFEval prompts (the rows all of whose instructions are checked).
    Ifeval(TextTaskConfig),
    /// A JSONL file of `{"prompt": …, "answer": …}`.
    Prompts(TextTaskConfig),
}

impl ModelSection {
    /// The name of the kind, as written in the config.
    pub fn kind(&self) -> &'static str {
        match self {
            ModelSection::Tiny(_) => "tiny",
            ModelSection::Smollm2 { .. } => "smollm2",
            ModelSection::Hf { .. } => "hf",
        }
    }

    /// `[model.lora]`, when set.
    pub fn lora(&self) -> Option<&LoraConfig> {
        match self {
            ModelSection::Tiny(_) => None,
            ModelSection::Smollm2 { lora } | ModelSection::Hf { lora, .. } => lora.as_ref(),
        }
    }

    /// Whether the policy is a pretrained model with its own tokenizer and chat template (the text
    /// tasks need one).
    pub fn pretrained(&self) -> bool {
        !matches!(self, ModelSection::Tiny(_))
    }

    /// The checks that need no file: the LoRA settings.
    pub fn validate(&self) -> Result<(), String> {
        match self.lora() {
            Some(lora) => lora.validate(),
            None => Ok(()),
        }
    }

    /// The policy's architecture: the tiny model's keys (`vocab = 0` = the arithmetic tokenizer's),
    /// SmolLM2's from the fetched GGUF's metadata, or a checkpoint's config.json (the weights are not
    /// read).
    pub fn model_config(&self) -> Result<ModelConfig, String> {
        match self {
            ModelSection::Tiny(config) => {
                let mut config = config.clone();
                if config.vocab == 0 {
                    config.vocab = Tokenizer.vocab_size();
                }
                Ok(config)
            }
            ModelSection::Smollm2 { .. } => crate::assets::smollm2_gguf()
                .and_then(|path| crate::gguf::Gguf::open(&path).map_err(|e| e.to_string()))
                .and_then(|gguf| gguf.llama_config().map_err(|e| e.to_string()))
                .map_err(|e| format!("model.kind = \"smollm2\": {e}")),
            ModelSection::Hf { path, .. } => crate::hf::read_config(Path::new(path))
                .map(|c| c.model)
                .map_err(|e| format!("model.kind = \"hf\": {e}")),
        }
    }

    /// The policy: a fresh tiny model (deterministic in `seed`), SmolLM2 from the fetched GGUF, or a
    /// Hugging Face checkpoint; with `[model.lora]`, the frozen base with fresh adapters (from `seed`);
    /// its projections' products in `dtype` (`train.dtype`: [`Model::with_compute_dtype`]).
    pub fn build(&self, seed: u64, device: &Device, dtype: DType) -> Result<Model, String> {
        let base = match self {
            ModelSection::Tiny(_) => {
                Model::new(&self.model_config()?, seed, device).map_err(|e| e.to_string())
            }
            ModelSection::Smollm2 { .. } => crate::gguf::load_smollm2(device)
                .map(|(model, _)| model)
                .map_err(|e| format!("model.kind = \"smollm2\": {e}")),
            ModelSection::Hf { path, .. } => crate::hf::load_model(Path::new(path), device)
                .map_err(|e| format!("model.kind = \"hf\": {e}")),
        }?;
        let model = match self.lora() {
            None => base,
            Some(lora) => base
                .with_lora(lora, seed ^ LORA_SEED)
                .map_err(|e| format!("model.lora: {e}"))?,
        };
        model
            .with_compute_dtype(dtype)
            .map_err(|e| format!("train.dtype: {e}"))
    }

    /// The pretrained model's tokenizer (with its chat template and stop tokens) and context length.
    pub fn tokenizer(&self) -> Result<(ChatTokenizer, usize), String> {
        match self {
            ModelSection::Tiny(_) => Err(
                "model.kind = \"tiny\" has no tokenizer of its own (it uses the arithmetic task's)"
                    .into(),
            ),
            ModelSection::Smollm2 { .. } => {
                let path = crate::assets::smollm2_gguf()?;
                let gguf = crate::gguf::Gguf::open(&path).map_err(|e| e.to_string())?;
                let tokenizer = gguf.tokenizer().map_err(|e| e.to_string())?;
                let positions = gguf
                    .llama_config()
                    .map_err(|e| e.to_string())?
                    .max_positions;
                Ok((tokenizer, positions))
            }
            ModelSection::Hf { path, .. } => {
                let dir = Path::new(path);
                let config =
                    crate::hf::read_config(dir).map_err(|e| format!("model.kind = \"hf\": {e}"))?;
                let tokenizer = ChatTokenizer::from_hf_dir(dir)
                    .map_err(|e| format!("model.kind = \"hf\": {e}"))?;
                Ok((tokenizer, config.model.max_positions))
            }
        }
    }
}

/// Mixed into the run's seed for the adapters' initial weights (so they are not the stream that
/// draws prompts).
const LORA_SEED: u64 = 0x4c6f_5241;

impl TaskSection {
    /// The name of the kind, as written in the config.
    pub fn kind(&self) -> &'static str {
        match self {
            TaskSection::Arithmetic(_) => "arithmetic",
            TaskSection::Decompose(_) => "decompose",
            TaskSection::Healthbench(_) => "healthbench",
            TaskSection::Ifeval(_) => "ifeval",
            TaskSection::Prompts(_) => "prompts",
        }
    }

    /// The text task's source and settings (`None` for the built-in tasks).
    pub fn text(&self) -> Option<(Source, &TextTaskConfig)> {
        match self {
            TaskSection::Arithmetic(_) | TaskSection::Decompose(_) => None,
            TaskSection::Healthbench(c) => Some((Source::Healthbench, c)),
            TaskSection::Ifeval(c) => Some((Source::Ifeval, c)),
            TaskSection::Prompts(c) => Some((Source::Prompts, c)),
        }
    }

    /// The task checked against `graph` from the config alone: the arithmetic task's settings, or a
    /// text task's signals bound to the recipe's inputs (kinds, keys, types, an input left without a
    /// signal). Nothing is located, read or loaded here, so a config or recipe error is reported
    /// whether or not the assets are present; [`BoundTask::build`] loads the rest.
    pub fn bind(
        &self,
        graph: &Graph,
        signals: &BTreeMap<String, SignalSpec>,
    ) -> Result<BoundTask, String> {
        match self {
            TaskSection::Arithmetic(config) => {
                Ok(BoundTask::Arithmetic(Arithmetic::new(config.clone())?))
            }
            TaskSection::Decompose(config) => {
                Ok(BoundTask::Decompose(Decompose::new(config.clone())?))
            }
            _ => {
                let (source, config) = self.text().expect("a text task");
                config.validate()?;
                check_data_path(source, config)?;
                Ok(BoundTask::Text {
                    source,
                    config: config.clone(),
                    registry: bind_signals(graph, signals)?,
                })
            }
        }
    }
}

/// A task bound to a recipe, before any data, tokenizer or model is loaded ([`TaskSection::bind`]).
pub enum BoundTask {
    Arithmetic(Arithmetic),
    Decompose(Decompose),
    Text {
        source: Source,
        config: TextTaskConfig,
        registry: Registry,
    },
}

impl BoundTask {
    /// The recipe inputs the task fills by name ([`Task::signals`]).
    pub fn signals(&self) -> Vec<String> {
        match self {
            BoundTask::Arithmetic(task) => task.signals(),
            BoundTask::Decompose(task) => task.signals(),
            BoundTask::Text { registry, .. } => registry.inputs().map(str::to_string).collect(),
        }
    }

    /// [`Task::fills_any_shape`]: the registry checked a text task's signal types.
    pub fn fills_any_shape(&self) -> bool {
        matches!(self, BoundTask::Text { .. })
    }

    /// The task, ready to run: a text task loads its data, the model's tokenizer and, when a signal
    /// needs it, the embedder (the assets are located here).
    pub fn build(
        self,
        model: &ModelSection,
        max_new_tokens: usize,
    ) -> Result<Box<dyn Task>, String> {
        match self {
            BoundTask::Arithmetic(task) => Ok(Box::new(task)),
            BoundTask::Decompose(task) => Ok(Box::new(task)),
            BoundTask::Text {
                source,
                config,
                registry,
            } => {
                let (tokenizer, positions) = model.tokenizer()?;
                Ok(Box::new(TextTask::new(
                    source,
                    config,
                    tokenizer,
                    registry,
                    positions,
                    max_new_tokens,
                )?))
            }
        }
    }
}
