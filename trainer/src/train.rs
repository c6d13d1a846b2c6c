//! The training behind `rlx run`: prompts → samples → signals → compiled recipe (loss and
//! ∂loss/∂logp) → backward through the policy, micro-batch by micro-batch → gradient clipping → AdamW,
//! after a supervised warm start; NaN/inf checks, checkpoints and `--resume`, per-step metrics as JSONL,
//! a PNG of the curves. Deterministic for a seed.
//!
//! This module holds the plan ([`plan`]: the recipe compiled and checked against the config — which
//! input the trainer fills with what, the sampler settings), the policy's log-probabilities of
//! completions, the loss and gradients of a batch ([`loss_and_gradients`]), the warm start and the
//! held-out evaluation; the loop itself is a [`Trainer`] (trainer.rs), which [`run_with`] steps until it
//! is done.
//!
//! The task is behind [`Task`]: the loop asks it for prompts, for the recipe inputs it fills (by name),
//! and for correctness on held-out prompts; the arithmetic task is the built-in one.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{Device, Tensor};
use serde_json::{json, Map, Value};

use rlx_compiler::hir::Recipe;
use rlx_compiler::ir::{Graph, Level, RolloutInfo, RolloutValueInfo};
use rlx_runtime::{Batch, Context, Outcome};

use crate::config::Config;
use crate::model::{KvCache, Model};
use crate::op::{Objective, RecipeOp};
use crate::optim::{AdamW, AdamWParams, Grads};
use crate::progress::Event;
use crate::rng::Rng;
use crate::sample::{generate, left_pad, Completion, Settings};
use crate::task::{Prompt, Task, TaskModels, PAD};
use crate::trainer::Trainer;

pub(crate) type Error = String;

pub(crate) fn err(e: candle_core::Error) -> Error {
    e.to_string()
}

/// Why [`loss_and_gradients`] failed: the recipe's evaluation (typed, so that a non-finite output
/// keeps the expression that made it), or anything else (a message).
#[derive(Debug)]
pub enum LossError {
    Recipe(rlx_runtime::EvalError),
    Message(String),
}

impl From<String> for LossError {
    fn from(message: String) -> LossError {
        LossError::Message(message)
    }
}

impl std::fmt::Display for LossError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LossError::Recipe(error) => write!(f, "recipe: {error}"),
            LossError::Message(message) => f.write_str(message),
        }
    }
}

/// Which recipe input the trainer fills with what.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Fill {
    /// log π_θ of each generated token (the policy input; differentiable).
    Logp,
    /// log π of each token under the sampling policy.
    OldLogp,
    /// log π_ref of each token under the frozen warm-started model.
    RefLogp,
    /// log π_teacher of each token under the config's frozen `[teacher]`.
    TeacherLogp,
    /// The entropy of π_θ at each generated token (differentiable when the input is `policy`).
    Entropy,
    /// An input the task fills, by name (`score` for the arithmetic task; a text task's signals).
    Signal(String),
    /// The number of tokens of each response.
    Length,
    /// The input's declared default.
    Default(f64),
    /// The value of the recipe's `state` `k` (index into `Graph::states`), carried across steps.
    State(usize),
}

fn filled_list(signals: &[String]) -> String {
    let mut list = vec![
        "logp (f32[tok] policy)".to_string(),
        "old_logp (f32[tok])".into(),
        "ref_logp (f32[tok])".into(),
        "teacher_logp (f32[tok], with a [teacher])".into(),
        "entropy (f32[tok], policy or not)".into(),
    ];
    list.extend(signals.iter().map(|s| format!("{s} (f32[resp])")));
    list.push("length (f32[resp])".into());
    list.join(", ")
}

/// Decide how to fill every input of `graph`; an error names an input the trainer cannot fill.
fn plan_inputs(graph: &Graph, signals: &[String], any_shape: bool) -> Result<Vec<Fill>, Error> {
    let mut fills = Vec::new();
    let filled = filled_list(signals);
    for (index, input) in graph.inputs.iter().enumerate() {
        if let Some(k) = graph.states.iter().position(|s| s.input as usize == index) {
            fills.push(Fill::State(k));
            continue;
        }
        let level = input.shape.level;
        let plain = input.shape.feature.is_none();
        let name = input.name.as_str();
        let fill = match (name, level) {
            ("logp", Level::Tok) if plain && input.differentiable => Some(Fill::Logp),
            ("old_logp", Level::Tok) if plain => Some(Fill::OldLogp),
            ("ref_logp", Level::Tok) if plain => Some(Fill::RefLogp),
            (TEACHER_LOGP, Level::Tok) if plain => Some(Fill::TeacherLogp),
            ("entropy", Level::Tok) if plain => Some(Fill::Entropy),
            (_, level)
                if signals.iter().any(|s| s == name)
                    && (any_shape || (level == Level::Resp && plain)) =>
            {
                Some(Fill::Signal(name.to_string()))
            }
            ("length", Level::Resp) if plain => Some(Fill::Length),
            _ => None,
        };
        let fill = match (fill, input.default) {
            (Some(fill), _) => fill,
            (None, Some(default)) if !input.differentiable => Fill::Default(default),
            _ => {
                return Err(format!(
                    "recipe input `{}` ({}{}{}) cannot be filled by the trainer: it fills {filled}, and inputs with a default",
                    input.name,
                    format!("{:?}", input.elem).to_lowercase(),
                    input.shape,
                    if input.differentiable { ", policy" } else { "" }
                ))
            }
        };
        fills.push(fill);
    }
    if !fills.contains(&Fill::Logp) {
        return Err(format!(
            "the recipe has no input `logp : f32[tok] policy` for the trainer to differentiate (it fills {filled})"
        ));
    }
    Ok(fills)
}

/// The recipe input the trainer fills with the `[teacher]`'s log-probabilities of the sampled tokens.
pub const TEACHER_LOGP: &str = "teacher_logp";

/// The config's `[teacher]` against the recipe, before any weight is loaded: a recipe that reads
/// `teacher_logp` needs one, a recipe that does not must not have one (it would be loaded and run for
/// nothing), and a pretrained teacher's tokenizer must be the pretrained policy's (its
/// log-probabilities are of the policy's tokens; [`Config::validate`] checked the tiny ones).
fn check_teacher(config: &Config, reads_teacher: bool) -> Result<(), Error> {
    let teacher = match (&config.teacher, reads_teacher) {
        (None, false) => return Ok(()),
        (None, true) => {
            return Err(format!(
                "the recipe reads `{TEACHER_LOGP} : f32[tok]`, the log-probabilities of a teacher model, and the config has no teacher: add a `[teacher]` table (the keys of `[model]`: `kind = \"hf\"` with `path`, `kind = \"smollm2\"`, or a tiny model; docs/training.md, \"Teacher\")"
            ))
        }
        (Some(teacher), false) => {
            return Err(format!(
                "the config has a `[teacher]` ({}) but the recipe does not read `{TEACHER_LOGP} : f32[tok]`: remove `[teacher]` (it would be loaded and run every step for nothing)",
                teacher.kind()
            ))
        }
        (Some(teacher), true) => teacher,
    };
    if !(config.model.pretrained() && teacher.pretrained()) {
        return Ok(());
    }
    let (policy_config, teacher_config) = (
        config.model.model_config()?,
        teacher
            .model_config()
            .map_err(|e| format!("[teacher]: {e}"))?,
    );
    if policy_config.vocab != teacher_config.vocab {
        return Err(format!(
            "config: the teacher's vocabulary ({} tokens) differs from the policy's ({}): its log-probabilities must be over the policy's tokens",
            teacher_config.vocab, policy_config.vocab
        ));
    }
    let (policy_tokenizer, _) = config.model.tokenizer()?;
    let (teacher_tokenizer, _) = teacher.tokenizer().map_err(|e| format!("[teacher]: {e}"))?;
    if policy_tokenizer.inner().get_vocab(true) != teacher_tokenizer.inner().get_vocab(true) {
        return Err(
            "config: the teacher's tokenizer differs from the policy's (another vocabulary): its log-probabilities must be over the policy's tokens"
                .into(),
        );
    }
    Ok(())
}

/// A number the recipe's `rollout { … }` block gives for `key`, if it sets it: an error when it is an
/// expression of the sampling state (`rlx run` samples a whole step with one setting) or outside
/// `valid`, which describes the values allowed.
fn rollout_number(
    rollout: &[RolloutInfo],
    key: &str,
    valid: (fn(f64) -> bool, &str),
) -> Result<Option<f64>, Error> {
    let Some(setting) = rollout.iter().find(|s| s.key == key) else {
        return Ok(None);
    };
    match &setting.value {
        RolloutValueInfo::Number(v) if valid.0(*v) => Ok(Some(*v)),
        RolloutValueInfo::Number(v) => Err(format!(
            "the recipe's `rollout {{ {key} = {v} }}` must be {}",
            valid.1
        )),
        _ => Err(format!(
            "the recipe's `rollout {{ {key} }}` is an expression; `rlx run` takes a constant or a param there (or set `sampler.{key}` in the config)"
        )),
    }
}

/// One line for each of the recipe's rollout settings that `rlx run` does not apply (it samples with
/// the config's `sampler.max_new_tokens` and the task's stop tokens, and has no RuscaRL scaffold or
/// MoDA modes).
pub fn unused_rollout_settings(rollout: &[RolloutInfo]) -> Vec<String> {
    rollout
        .iter()
        .filter_map(|setting| {
            let why = match setting.key.as_str() {
                "n" | "temperature" | "top_p" => return None,
                "max_new_tokens" => "the config's `sampler.max_new_tokens` bounds completions",
                "top_k" => "the sampler has no top-k (it samples with temperature and top-p)",
                "stop" => "the task's stop tokens end a completion",
                "scaffold" => {
                    "the trainer gives no RuscaRL scaffold (partial solutions in prompts)"
                }
                "modes" => "the trainer gives no MoDA mode lines",
                _ => "the trainer has no such setting",
            };
            Some(format!(
                "the recipe's `rollout {{ {} }}` is not applied by `rlx run`: {why}",
                setting.key
            ))
        })
        .collect()
}

/// log π(token) and the entropy H(π) of each completion position under `model`, packed (responses in
/// order, tokens contiguous), `[total tokens, 2]` (column 0 the log-probability, column 1 the entropy).
/// Differentiable with respect to the model's parameters, through the fused LM head (`head.rs`): only
/// the completion positions go through the head, in chunks, and the `[positions × vocab]` logits are
/// never materialised.
pub fn completion_policy(
    model: &Model,
    prompts: &[Vec<u32>],
    completions: &[Vec<u32>],
    device: &Device,
) -> candle_core::Result<Tensor> {
    // Consecutive rows with the same prompt (the n samples of a group) share one pass over it, when
    // they share enough for two passes to pay: at least two rows per prompt on average (a random batch
    // with an occasional repeat, as a warm start's, runs whole).
    let mut group_of = Vec::with_capacity(prompts.len());
    let mut unique: Vec<&Vec<u32>> = Vec::new();
    for prompt in prompts {
        if unique.last() != Some(&prompt) {
            unique.push(prompt);
        }
        group_of.push((unique.len() - 1) as u32);
    }
    if 2 * unique.len() <= prompts.len() {
        let unique: Vec<Vec<u32>> = unique.into_iter().cloned().collect();
        return shared_prefix_policy(model, &unique, &group_of, completions, device);
    }
    let (pads, prompt_ids, p) = left_pad(prompts);
    let longest = completions.iter().map(Vec::len).max().unwrap_or(0).max(1);
    let rows = prompts.len();
    let width = p + longest;
    let mut ids = Vec::with_capacity(rows * width);
    for (r, completion) in completions.iter().enumerate() {
        ids.extend_from_slice(&prompt_ids[r * p..(r + 1) * p]);
        ids.extend_from_slice(completion);
        ids.extend(std::iter::repeat_n(PAD, longest - completion.len()));
    }
    let ids = Tensor::from_vec(ids, (rows, width), device)?;
    let hidden = model.hidden(&ids, 0, &pads, None)?;
    // Position p - 1 + k predicts completion token k.
    completion_head(
        model,
        &hidden.narrow(1, p - 1, longest)?,
        completions,
        device,
    )
}

/// The completion tokens' (log π, entropy) from `hidden` ([rows, longest, hidden]: position k of row
/// r predicts completion token k of row r): only the real tokens, packed, go through the fused head.
fn completion_head(
    model: &Model,
    hidden: &Tensor,
    completions: &[Vec<u32>],
    device: &Device,
) -> candle_core::Result<Tensor> {
    let (rows, longest, width) = hidden.dims3()?;
    let mut targets = Vec::new();
    let mut packed = Vec::new();
    for (r, completion) in completions.iter().enumerate() {
        targets.extend_from_slice(completion);
        packed.extend((0..completion.len()).map(|k| (r * longest + k) as u32));
    }
    let count = packed.len();
    let packed = Tensor::from_vec(packed, count, device)?;
    let hidden = hidden
        .reshape((rows * longest, width))?
        .index_select(&packed, 0)?;
    let targets = Tensor::from_vec(targets, count, device)?;
    crate::head::fused_logp_entropy(
        &hidden,
        model.lm_head(),
        &targets,
        crate::head::DEFAULT_BUDGET,
    )
}

/// [`completion_policy`] for rows that share prompts: row r continues `prompts[group_of[r]]`. Each
/// prompt is run once (left-padded, as a prefix whose keys and values keep their graph); its keys and
/// values are repeated for its rows, whose completions (right-padded) run after it at positions
/// p.., attending to the prefix and to themselves. Completion token 0 is predicted by the prompt's
/// last position, token k ≥ 1 by the completion's position k − 1. The same values as running every
/// row whole (`the_shared_prefix_pass_equals_the_whole_rows`), with fewer positions: a prompt of P
/// tokens shared by n rows costs P instead of n·P; gradients flow into the prefix from all its rows.
fn shared_prefix_policy(
    model: &Model,
    prompts: &[Vec<u32>],
    group_of: &[u32],
    completions: &[Vec<u32>],
    device: &Device,
) -> candle_core::Result<Tensor> {
    let (group_pads, prompt_ids, p) = left_pad(prompts);
    let rows = group_of.len();
    let longest = completions.iter().map(Vec::len).max().unwrap_or(0).max(1);
    let mut cache = KvCache::keeping_graph();
    let prefix_ids = Tensor::from_vec(prompt_ids, (prompts.len(), p), device)?;
    let prefix = model.hidden(&prefix_ids, 0, &group_pads, Some(&mut cache))?;
    let index = Tensor::from_vec(group_of.to_vec(), rows, device)?;
    cache.repeat_rows(&index)?;
    let pads: Vec<usize> = group_of.iter().map(|&g| group_pads[g as usize]).collect();
    let mut ids = Vec::with_capacity(rows * longest);
    for completion in completions {
        ids.extend_from_slice(completion);
        ids.extend(std::iter::repeat_n(PAD, longest - completion.len()));
    }
    // The prompt's last position, for each row: it predicts completion token 0.
    let first = prefix
        .narrow(1, p - 1, 1)?
        .squeeze(1)?
        .contiguous()?
        .index_select(&index, 0)?
        .unsqueeze(1)?;
    let hidden = if longest > 1 {
        // The completions' last token predicts nothing: it is not run.
        let ids = Tensor::from_vec(ids, (rows, longest), device)?.narrow(1, 0, longest - 1)?;
        let continued = model.hidden(&ids.contiguous()?, p, &pads, Some(&mut cache))?;
        Tensor::cat(&[&first, &continued], 1)?
    } else {
        first
    };
    completion_head(model, &hidden, completions, device)
}

/// log π(token) of each completion token under `model`, packed, `[total tokens]` (column 0 of
/// [`completion_policy`]). Differentiable with respect to the model's parameters.
pub fn completion_logp(
    model: &Model,
    prompts: &[Vec<u32>],
    completions: &[Vec<u32>],
    device: &Device,
) -> candle_core::Result<Tensor> {
    completion_policy(model, prompts, completions, device)?
        .narrow(1, 0, 1)?
        .squeeze(1)
}

/// `k` completions of each of `prompts` (prompt-major): greedy when `sampling` is `None`, else
/// sampled with its settings from a stream of its own (so that an evaluation never moves the
/// training's random streams).
fn eval_completions(
    model: &Model,
    task: &dyn Task,
    prompts: &[Prompt],
    k: usize,
    sampling: Option<(f64, f64, u64)>,
    max_new_tokens: usize,
    device: &Device,
) -> Result<Vec<Completion>, Error> {
    let (temperature, top_p, seed) = sampling.unwrap_or((0.0, 1.0, 0));
    let settings = Settings {
        temperature,
        top_p,
        max_new_tokens,
        stop: task.stop_tokens(),
        entropy: false,
    };
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(prompts.len() * k);
    // LoRA merged once for every chunk (`generate` finds nothing left to merge in the view).
    let model = &model.merged_view().map_err(err)?;
    for chunk in prompts.chunks((256 / k.max(1)).max(1)) {
        let ids: Vec<Vec<u32>> = chunk.iter().map(|p| p.ids.clone()).collect();
        out.extend(generate(model, &ids, k, &settings, &mut rng, device).map_err(err)?);
    }
    Ok(out)
}

/// How the held-out prompts are evaluated: greedy, and `samples` (k) sampled completions each for
/// pass@k (0 = none) at the run's temperature and top-p.
#[derive(Clone, Copy, Debug)]
pub struct EvalSettings {
    pub max_new_tokens: usize,
    pub samples: usize,
    pub temperature: f64,
    pub top_p: f64,
    pub seed: u64,
}

/// The held-out evaluation as `eval/…` metrics (docs/training.md, "Evaluation"): `eval/accuracy`
/// (greedy, verifiable tasks), `eval/greedy/NAME` (the mean of each per-response signal on the greedy
/// completions) and, with `samples` = k > 0, `eval/pass@k/NAME` (the mean over prompts of the best of
/// the k sampled values: pass@k for a 0/1 signal) and `eval/mean@k/NAME` (their mean), with
/// `eval/pass@k/accuracy` for a verifiable task. The signals are the recipe's, filled by the task as
/// in training (reward programs and judges included).
pub fn evaluate(
    task: &dyn Task,
    models: &TaskModels,
    prompts: &[Prompt],
    settings: EvalSettings,
    device: &Device,
) -> Result<Map<String, Value>, Error> {
    let mut metrics = Map::new();
    if prompts.is_empty() {
        return Ok(metrics);
    }
    let mut runs = vec![(1, None)];
    if settings.samples > 0 {
        runs.push((
            settings.samples,
            Some((settings.temperature, settings.top_p, settings.seed)),
        ));
    }
    for (k, sampling) in runs {
        let completions = eval_completions(
            models.policy,
            task,
            prompts,
            k,
            sampling,
            settings.max_new_tokens,
            device,
        )?;
        let tokens: Vec<Vec<u32>> = completions.iter().map(|c| c.tokens.clone()).collect();
        let correct: Option<Vec<f64>> = tokens
            .iter()
            .enumerate()
            .map(|(r, t)| task.correct(&prompts[r / k], t))
            .collect();
        let filled = task
            .fill(prompts, &tokens, k, models)
            .map_err(|e| format!("held-out evaluation: {e}"))?;
        if let (Some(_), Some(correct)) = (sampling, &correct) {
            if let Some(m) = diversity_metrics(task, prompts, &tokens, correct, k) {
                metrics.extend(m);
            }
        }
        let mut series: Vec<(String, Vec<f64>)> = Vec::new();
        if let Some(c) = correct {
            series.push(("accuracy".into(), c));
        }
        // Per-response scores only (a criterion or embedding axis has no single score; a partition's
        // class ids are not scores).
        series.extend(
            filled
                .values
                .into_iter()
                .filter(|(name, v)| v.len() == tokens.len() && !task.is_class(name)),
        );
        for (name, values) in series {
            if sampling.is_none() {
                let key = if name == "accuracy" {
                    "eval/accuracy".to_string()
                } else {
                    format!("eval/greedy/{name}")
                };
                metrics.insert(key, json!(mean(&values)));
            } else {
                let best: Vec<f64> = values
                    .chunks(k)
                    .map(|g| g.iter().copied().fold(f64::NEG_INFINITY, f64::max))
                    .collect();
                metrics.insert(format!("eval/pass@{k}/{name}"), json!(mean(&best)));
                if name != "accuracy" {
                    metrics.insert(format!("eval/mean@{k}/{name}"), json!(mean(&values)));
                }
            }
        }
    }
    Ok(metrics)
}

/// The evaluation's quality and diversity over k samples per prompt, when the task is verifiable and
/// has an exact partition ([`Task::answer_class`]): `eval/quality` (the fraction of valid samples),
/// `eval/distinct` (the mean over prompts of the number of distinct valid answers among the k) and
/// `eval/classes` (the mean number of partition classes among the k, valid or not).
fn diversity_metrics(
    task: &dyn Task,
    prompts: &[Prompt],
    tokens: &[Vec<u32>],
    correct: &[f64],
    k: usize,
) -> Option<Map<String, Value>> {
    let (mut distinct, mut classes) = (Vec::new(), Vec::new());
    for (g, prompt) in prompts.iter().enumerate() {
        let mut all = Vec::new();
        let mut valid = Vec::new();
        for r in g * k..(g + 1) * k {
            let class = task.answer_class(prompt, &tokens[r])?;
            if correct[r] > 0.0 {
                valid.push(class.clone());
            }
            all.push(class);
        }
        for list in [&mut all, &mut valid] {
            list.sort();
            list.dedup();
        }
        distinct.push(valid.len() as f64);
        classes.push(all.len() as f64);
    }
    let mut metrics = Map::new();
    metrics.insert("eval/quality".into(), json!(mean(correct)));
    metrics.insert("eval/distinct".into(), json!(mean(&distinct)));
    metrics.insert("eval/classes".into(), json!(mean(&classes)));
    Some(metrics)
}

/// The supervised warm start: cross-entropy on the task's targets (AdamW at `sft.lr`, no weight decay,
/// the RL gradient clipping). Returns the last loss, or `None` when the task has no supervised examples.
pub fn supervised(
    model: &Model,
    task: &dyn Task,
    config: &Config,
    rng: &mut Rng,
    device: &Device,
) -> Result<Option<f64>, Error> {
    let mut opt = AdamW::new(
        model.vars(),
        AdamWParams {
            lr: config.sft.lr,
            weight_decay: 0.0,
            ..Default::default()
        },
    );
    let mut last = None;
    for step in 0..config.sft.steps {
        let Some(examples) = task.supervised(rng, config.sft.batch)? else {
            return Ok(None);
        };
        let (prompts, targets): (Vec<Vec<u32>>, Vec<Vec<u32>>) = examples.into_iter().unzip();
        let logp = completion_logp(model, &prompts, &targets, device).map_err(err)?;
        let loss = logp.mean_all().map_err(err)?.neg().map_err(err)?;
        let value = loss.to_scalar::<f32>().map_err(err)? as f64;
        if !value.is_finite() {
            return Err(format!(
                "warm start step {step}: the supervised loss is {value}; lower sft.lr ({})",
                config.sft.lr
            ));
        }
        let store = loss.backward().map_err(err)?;
        let mut grads = Grads::from_store(model.vars(), &store).map_err(err)?;
        grads.clip(config.train.grad_clip);
        opt.step(&grads).map_err(err)?;
        last = Some(value);
    }
    Ok(last)
}

/// What a run produced.
#[derive(Clone, Debug)]
pub struct Summary {
    pub out: PathBuf,
    /// Greedy accuracy on the held-out prompts before and after training; `None` when the task has
    /// no verifiable evaluation.
    pub accuracy_before: Option<f64>,
    pub accuracy_after: Option<f64>,
    /// Mean reward of every step (those before a resume included).
    pub rewards: Vec<f64>,
    pub wall_s: f64,
    pub sample_tokens_per_s: f64,
    pub train_tokens_per_s: f64,
    /// Steps completed (less than `steps` when stopped early with `RunOptions::stop_after`).
    pub steps_done: usize,
}

/// Everything a run needs, checked: the graph, how its inputs are filled, the sampler settings.
pub struct Plan {
    pub graph: Graph,
    /// The task built from the config given to [`plan`] (loaded once: a text task reads and
    /// tokenizes its prompts); [`run`] must be given the same config.
    pub task: Box<dyn Task>,
    /// `Some(N)`: the step runs on GPU N (`train.device = "cuda:N"`, `rlx run --device cuda:N`): the
    /// model, sampler, reference, LM head and AdamW as candle CUDA tensors, the recipe as the CUDA
    /// kernels on the same stream, whatever the config's `backend`.
    pub gpu: Option<usize>,
    pub(crate) fills: Vec<Fill>,
    pub group_size: usize,
    pub temperature: f64,
    pub top_p: f64,
    /// The recipe's `rollout { … }` settings ([`unused_rollout_settings`] names those not applied).
    pub rollout: Vec<RolloutInfo>,
    /// The recipe file(s) `rlx run` was given, recorded in the run directory (`run_dir::record`);
    /// empty when the recipe came from elsewhere (a test's in-memory recipe).
    pub recipe_files: Vec<crate::run_dir::RecipeFile>,
}

impl Plan {
    /// `config` with the sampler settings this plan uses where the config leaves them to the recipe's
    /// `rollout` (`n = 0`, `temperature < 0`, `top_p = 0`).
    pub fn resolve(&self, config: &Config) -> Config {
        let mut config = config.clone();
        config.sampler.n = self.group_size;
        config.sampler.temperature = self.temperature;
        config.sampler.top_p = self.top_p;
        config
    }
}

/// Compile the recipe with its param overrides and check that the trainer can feed it.
pub fn plan(recipe: &Recipe, overrides: &[(String, f64)], config: &Config) -> Result<Plan, Error> {
    let graph = rlx_compiler::compile_graph(recipe, overrides)?;
    let rollout = rlx_compiler::ir::rollout_settings(recipe, &graph);
    plan_graph(graph, rollout, config)
}

/// [`plan`] for a compiled recipe: its graph and rollout settings (a `.rlxc` artifact's `graph` and
/// `rollout`).
pub fn plan_graph(graph: Graph, rollout: Vec<RolloutInfo>, config: &Config) -> Result<Plan, Error> {
    if graph.outputs.loss.is_none() {
        return Err("the recipe has no `loss` section: there is nothing to train".into());
    }
    // Every check of the config and the recipe comes before the task locates or loads an asset.
    let bound = config.task.bind(&graph, &config.signal_specs()?)?;
    let fills = plan_inputs(&graph, &bound.signals(), bound.fills_any_shape())?;
    check_teacher(config, fills.contains(&Fill::TeacherLogp))?;
    let group_size = if config.sampler.n > 0 {
        config.sampler.n
    } else {
        let whole = |n: f64| n.fract() == 0.0 && (1.0..=MAX_GROUP_SIZE as f64).contains(&n);
        rollout_number(&rollout, "n", (whole, "a whole number from 1 to 4096"))?
            .map_or(8, |n| n as usize)
    };
    let temperature = if config.sampler.temperature >= 0.0 {
        config.sampler.temperature
    } else {
        let valid = |t: f64| t.is_finite() && t >= 0.0;
        rollout_number(&rollout, "temperature", (valid, "a finite number ≥ 0"))?.unwrap_or(1.0)
    };
    let top_p = if config.sampler.top_p > 0.0 {
        config.sampler.top_p
    } else {
        let valid = |p: f64| p > 0.0 && p <= 1.0;
        rollout_number(&rollout, "top_p", (valid, "in (0, 1]"))?.unwrap_or(1.0)
    };
    let task = bound.build(&config.model, config.sampler.max_new_tokens)?;
    if let Some(teacher) = &config.teacher {
        let positions = teacher
            .model_config()
            .map_err(|e| format!("[teacher]: {e}"))?
            .max_positions;
        let needed = task.max_prompt_tokens() + config.sampler.max_new_tokens;
        if positions < needed {
            return Err(format!(
                "config: the teacher's context ({positions} positions) is shorter than a prompt and its completion ({needed} tokens: the task's longest prompt plus sampler.max_new_tokens = {})",
                config.sampler.max_new_tokens
            ));
        }
    }
    // The memory the sizes need, before anything of that size is allocated.
    let (limit, source) = crate::memory::available();
    crate::memory::Estimate::new(
        &config.model.model_config()?,
        config,
        group_size,
        task.max_prompt_tokens() + config.sampler.max_new_tokens,
    )
    .check(limit, source)?;
    Ok(Plan {
        graph,
        rollout,
        task,
        gpu: None,
        fills,
        group_size,
        temperature,
        top_p,
        recipe_files: Vec::new(),
    })
}

/// The largest group a recipe's `rollout { n }` or the config's `sampler.n` may ask for.
pub const MAX_GROUP_SIZE: usize = 4096;

/// How a run starts and stops beyond its config.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Continue from this checkpoint (a run directory or its `checkpoint/`).
    pub resume: Option<PathBuf>,
    /// Stop once this many steps are done, as if killed there (no final checkpoint, plot or summary);
    /// for tests of `resume` and `rlx bench-model`.
    pub stop_after: Option<usize>,
    /// Skip the greedy held-out evaluations (before the first step and every `eval_every` steps), as
    /// `rlx bench-model` does to time steps alone.
    pub skip_evaluation: bool,
}

/// The loss of the recipe on the whole batch and the gradient of every parameter, backpropagated
/// `micro_batch` responses at a time (0 = all at once).
///
/// The recipe is always evaluated once on the whole batch — its normalisations (token means, group
/// statistics) are over the whole batch — giving the loss and ∂loss/∂logp. With one micro-batch the
/// loss is the recipe's custom op and `backward` runs through it. With several, the loop first computes
/// the current logp of every micro-batch (forward only), evaluates the recipe on the whole batch, then
/// for each micro-batch backpropagates Σ logp·(∂loss/∂logp) with those fixed gradients and sums the
/// parameter gradients: exactly the whole-batch gradient, whatever the micro-batch size.
///
/// `batch_is_current`: the batch's `logp` (and `entropy`) inputs already hold the policy's values —
/// the first epoch on the policy that sampled the batch, whose log-probs are the sampler's `old_logp`
/// (equal to a forward pass's up to float rounding) — so with several micro-batches the forward-only
/// pass is skipped and the recipe is evaluated on the batch as it is (an on-policy ratio of exactly 1).
/// One micro-batch always runs the recipe on the forward pass's own values.
#[allow(clippy::too_many_arguments)]
pub fn loss_and_gradients(
    policy: &Model,
    objective: &Arc<Objective>,
    batch: &Batch,
    logp_input: &str,
    context: Context,
    rows: &[Vec<u32>],
    tokens: &[Vec<u32>],
    micro_batch: usize,
    batch_is_current: bool,
    device: &Device,
) -> Result<(Outcome, Grads), LossError> {
    // Column 0 of the model's values is log π, column 1 the entropy (filled when the recipe reads it).
    let graph = objective.graph();
    let entropy = graph
        .inputs
        .iter()
        .find(|i| i.name == ENTROPY)
        .map(|i| (i.name.as_str(), i.differentiable));
    let columns = [Some(logp_input), entropy.map(|(n, _)| n)];
    let responses = rows.len();
    let size = if micro_batch == 0 || micro_batch >= responses {
        responses
    } else {
        micro_batch
    };
    if size == responses {
        let values = completion_policy(policy, rows, tokens, device).map_err(err)?;
        let op = RecipeOp::with_columns(objective.clone(), batch.clone(), &columns, context)?;
        let failure = op.failure_handle();
        let (loss, outcome) = op.apply(&values).map_err(|e| {
            match failure.lock().unwrap_or_else(|e| e.into_inner()).take() {
                Some(error) => LossError::Recipe(error),
                None => LossError::Message(err(e)),
            }
        })?;
        check_outcome(&outcome, &columns)?;
        let store = loss.backward().map_err(err)?;
        let grads = Grads::from_store(policy.vars(), &store).map_err(err)?;
        return Ok((outcome, grads));
    }
    let index = |name: &str| {
        graph
            .inputs
            .iter()
            .position(|i| i.name == name)
            .ok_or_else(|| format!("the recipe has no input `{name}`"))
    };
    let logp_index = index(logp_input)?;
    let entropy_index = entropy.map(|(n, _)| index(n)).transpose()?;
    let mut whole = batch.clone();
    if !batch_is_current {
        let (mut logp_values, mut entropy_values) = (Vec::new(), Vec::new());
        // Forward only: the view records no backpropagation graph (the same values, bit for bit).
        let view = policy.no_grad();
        for (r, t) in rows.chunks(size).zip(tokens.chunks(size)) {
            let values = completion_policy(&view, r, t, device)
                .and_then(|v| v.to_vec2::<f32>())
                .map_err(err)?;
            for row in values {
                logp_values.push(f64::from(row[0]));
                entropy_values.push(f64::from(row[1]));
            }
        }
        whole.inputs[logp_index] = logp_values;
        if let Some(e) = entropy_index {
            whole.inputs[e] = entropy_values;
        }
    }
    let outcome = objective.run(&whole, &context).map_err(LossError::Recipe)?;
    check_outcome(&outcome, &columns)?;
    let gradient_of = |name: &str| -> Result<Vec<f32>, Error> {
        outcome
            .gradients
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, g)| g.iter().map(|v| *v as f32).collect())
            .ok_or_else(|| format!("the recipe gives no gradient for `{name}`"))
    };
    let logp_gradient = gradient_of(logp_input)?;
    let entropy_gradient = match entropy {
        Some((name, true)) => Some(gradient_of(name)?),
        _ => None,
    };
    let mut grads = Grads::new(policy.vars());
    let mut offset = 0;
    for (r, t) in rows.chunks(size).zip(tokens.chunks(size)) {
        let values = completion_policy(policy, r, t, device).map_err(err)?;
        let count = values.dim(0).map_err(err)?;
        // Σ logp·∂loss/∂logp + H·∂loss/∂H over the micro-batch, with the whole batch's gradients.
        let mut weights = vec![0f32; 2 * count];
        for k in 0..count {
            weights[2 * k] = logp_gradient[offset + k];
            if let Some(g) = &entropy_gradient {
                weights[2 * k + 1] = g[offset + k];
            }
        }
        offset += count;
        let weights = Tensor::from_vec(weights, (count, 2), device).map_err(err)?;
        let surrogate = (values * weights).and_then(|x| x.sum_all()).map_err(err)?;
        let store = surrogate.backward().map_err(err)?;
        grads.accumulate(policy.vars(), &store).map_err(err)?;
    }
    Ok((outcome, grads))
}

/// The file of a run directory that holds the sampled responses of every `train.samples_every` steps.
pub const SAMPLES_FILE: &str = "samples.jsonl";

/// The name of the recipe input the trainer fills with the policy's per-token entropy.
pub const ENTROPY: &str = "entropy";

/// The loss and the gradients of the model's inputs must be finite; an error says which is not.
fn check_outcome(outcome: &Outcome, columns: &[Option<&str>]) -> Result<(), Error> {
    if let Some(loss) = outcome.loss {
        if !loss.is_finite() {
            return Err(format!("the loss is {loss}"));
        }
    }
    for name in columns.iter().flatten() {
        if let Some((_, g)) = outcome.gradients.iter().find(|(n, _)| n == name) {
            if let Some((k, v)) = g.iter().enumerate().find(|(_, v)| !v.is_finite()) {
                return Err(format!("∂loss/∂{name} is {v} at token {k}"));
            }
        }
    }
    Ok(())
}

pub(crate) fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values.iter().sum::<f64>() / values.len() as f64
    }
}

/// Keys of a metrics line that measure time (they differ between otherwise identical runs).
pub const TIMING_KEYS: [&str; 6] = [
    "sample_tokens_per_s",
    "train_tokens_per_s",
    "time/sample_s",
    "time/score_s",
    "time/train_s",
    "step_time_s",
];

/// Mixed into the run's seed for a tiny teacher's initial weights and warm-start batches (so it is
/// another model than the policy, and its batches are not the policy's).
pub const TEACHER_SEED: u64 = 0x7eac_4e55;

/// The candle device of a run whose plan says `gpu` (`Plan::gpu`): the CPU, or GPU N with candle's CUDA
/// backend. Asking for a GPU is an error, never a crash, without the `cuda` feature, the NVIDIA driver or
/// GPU N (the runtime's probe comes first: cudarc panics when it cannot load the driver).
pub fn candle_device(gpu: Option<usize>) -> Result<Device, Error> {
    let Some(ordinal) = gpu else {
        return Ok(Device::Cpu);
    };
    rlx_runtime::probe_gpu(ordinal)?;
    match std::panic::catch_unwind(|| Device::new_cuda(ordinal)) {
        Ok(Ok(device)) => Ok(device),
        Ok(Err(e)) => Err(format!(
            "--device cuda:{ordinal}: candle cannot use the GPU: {e}"
        )),
        Err(_) => Err(format!(
            "--device cuda:{ordinal}: candle's CUDA backend failed to start (a CUDA library is missing: cuBLAS, cuRAND and NVRTC 13 come with scripts/install-cuda-toolchain.sh, docs/gpu.md)"
        )),
    }
}

/// Wait for the work queued on `device` (a no-op on the CPU), so that a timing covers it.
pub fn synchronize(device: &Device) -> Result<(), Error> {
    device.synchronize().map_err(err)
}

/// Run the whole job: warm start, then `config.steps` RL steps; metrics go to `out/metrics.jsonl`.
pub fn run(
    plan: Plan,
    config: &Config,
    out: &Path,
    progress: impl FnMut(&Event),
) -> Result<Summary, Error> {
    run_with(plan, config, out, &RunOptions::default(), progress)
}

/// [`run`] with a resume point and an early stop: a [`Trainer`] stepped until it is done. Errors are
/// the [`crate::error::TrainError`]s' messages ([`run_trainer`] gives them typed).
pub fn run_with(
    plan: Plan,
    config: &Config,
    out: &Path,
    options: &RunOptions,
    progress: impl FnMut(&Event),
) -> Result<Summary, Error> {
    run_trainer(plan, config, out, options, progress).map_err(String::from)
}

/// [`run_with`], its errors typed (`rlx run` shows a non-finite output's expression,
/// [`crate::error::TrainError::non_finite`]).
pub fn run_trainer(
    plan: Plan,
    config: &Config,
    out: &Path,
    options: &RunOptions,
    mut progress: impl FnMut(&Event),
) -> Result<Summary, crate::error::TrainError> {
    let mut trainer = Trainer::new(plan, config, out, options, &mut progress)?;
    while !trainer.done() {
        let report = trainer.step()?;
        progress(&Event::Step(report));
    }
    trainer.finish()
}
