//! The training loop behind `rlx run`: prompts → samples → signals → compiled recipe (loss and
//! ∂loss/∂logp) → backward through the policy, micro-batch by micro-batch → gradient clipping → AdamW,
//! after a supervised warm start; NaN/inf checks, checkpoints and `--resume`, per-step metrics as JSONL,
//! a PNG of the curves. Deterministic for a seed.
//!
//! The task is behind [`Task`]: the loop asks it for prompts, for the recipe inputs it fills (by name),
//! and for correctness on held-out prompts; the arithmetic task is the built-in one.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use candle_core::{Device, Tensor};
use serde_json::{json, Map, Value};

use rlx_compiler::hir::Recipe;
use rlx_compiler::ir::{Graph, Level, RolloutInfo, RolloutValueInfo};
use rlx_runtime::batch::{Batch, Layout};
use rlx_runtime::geometry::Geometry;
use rlx_runtime::interp::{Context, Outcome, ALL_FILTERED};

use crate::checkpoint::{self, State};
use crate::config::Config;
use crate::model::{KvCache, Model};
use crate::op::{Objective, RecipeOp};
use crate::optim::{AdamW, AdamWParams, Grads};
use crate::plot;
use crate::progress::{Event, StepReport};
use crate::rng::Rng;
use crate::run_dir::{self, RunDir};
use crate::sample::{generate, left_pad, Completion, Settings};
use crate::task::{Prompt, Task, TaskModels, PAD};

pub(crate) type Error = String;

/// The trainer's own KL monitor (the `kl` metric and plot), written in rlx so the estimator has one
/// home: std/loss `k3` of the sampled tokens' old and reference log-probabilities, token mean.
const KL_MONITOR: &str = "import std/loss.{k3}
input old_logp : f32[tok]
input ref_logp : f32[tok]
metric kl = mean(k3(old_logp, ref_logp) over tok, batch)
";

fn kl_monitor_graph() -> Result<Graph, Error> {
    let checked = rlx_compiler::check_source("kl_monitor", KL_MONITOR);
    let recipe = checked
        .recipe
        .ok_or_else(|| format!("the KL monitor does not check: {:?}", checked.diagnostics))?;
    rlx_compiler::compile_graph(&recipe, &[])
}

fn monitor_kl(
    graph: &Graph,
    layout: &Layout,
    old: &[f64],
    reference: &[f64],
) -> Result<f64, Error> {
    let batch = Batch {
        layout: layout.clone(),
        inputs: vec![old.to_vec(), reference.to_vec()],
    };
    let context = Context {
        step: 0.0,
        progress: 0.0,
    };
    let outcome =
        rlx_runtime::interp::evaluate(graph, &batch, &context).map_err(|e| e.to_string())?;
    outcome
        .metrics
        .iter()
        .find(|(name, _)| name == "kl")
        .map(|(_, value)| *value)
        .ok_or_else(|| "the KL monitor has no `kl` metric".to_string())
}

pub(crate) fn err(e: candle_core::Error) -> Error {
    e.to_string()
}

/// Which recipe input the trainer fills with what.
#[derive(Clone, Debug, PartialEq)]
enum Fill {
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
    fills: Vec<Fill>,
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

/// A step's samples and the batch the recipe sees for them.
struct Samples {
    prompts: Vec<Prompt>,
    completions: Vec<Completion>,
    rows: Vec<Vec<u32>>,
    tokens: Vec<Vec<u32>>,
    signal_values: Vec<(String, Vec<f64>)>,
    correct: Option<Vec<f64>>,
    lengths: Vec<usize>,
    ref_logp: Option<Vec<f64>>,
    old_logp: Vec<f64>,
    batch: Batch,
}

/// log π(token) of every completion token (flat, response by response) under a frozen `model` (the
/// reference or the teacher): no gradient reaches it, and LoRA adapters are merged into the view.
fn frozen_logp(
    model: &Model,
    rows: &[Vec<u32>],
    tokens: &[Vec<u32>],
    device: &Device,
) -> Result<Vec<f64>, Error> {
    Ok(model
        .merged_view()
        .and_then(|view| completion_logp(&view, rows, tokens, device))
        .and_then(|t| t.to_vec1::<f32>())
        .map_err(err)?
        .into_iter()
        .map(f64::from)
        .collect())
}

/// The batch the recipe sees at `step` for `prompts` and their completions (`n` per prompt, in
/// order): the task's signals, `old_logp`, the reference and `teacher` log-probs when the recipe reads
/// them, and every input of `graph` (as `fills` says).
#[allow(clippy::too_many_arguments)]
fn build_samples(
    task: &dyn Task,
    models: &TaskModels,
    teacher: Option<&Model>,
    (graph, fills): (&Graph, &[Fill]),
    n: usize,
    device: &Device,
    step: usize,
    prompts: Vec<Prompt>,
    completions: Vec<Completion>,
    states: &[f64],
) -> Result<Samples, Error> {
    let rows: Vec<Vec<u32>> = prompts
        .iter()
        .flat_map(|p| std::iter::repeat_n(p.ids.clone(), n))
        .collect();
    let tokens: Vec<Vec<u32>> = completions.iter().map(|c| c.tokens.clone()).collect();
    let filled = task.fill(&prompts, &tokens, n, models)?;
    if let Some(missing) = task
        .signals()
        .iter()
        .find(|s| !filled.values.iter().any(|(n, _)| n == *s))
    {
        return Err(format!("step {step}: the task did not fill `{missing}`"));
    }
    let signal_values = filled.values;
    let correct: Option<Vec<f64>> = completions
        .iter()
        .enumerate()
        .map(|(r, c)| task.correct(&prompts[r / n], &c.tokens))
        .collect();
    let lengths: Vec<usize> = tokens.iter().map(Vec::len).collect();
    let layout = Layout::from_counts(
        &vec![n; prompts.len()],
        &lengths,
        filled.crit_counts.as_deref().unwrap_or(&[]),
        filled.dim.unwrap_or(0),
    )
    .map_err(|e| e.to_string())?;
    let ref_logp: Option<Vec<f64>> = match models.reference {
        Some(reference) => Some(frozen_logp(reference, &rows, &tokens, device)?),
        None => None,
    };
    let teacher_logp: Option<Vec<f64>> = match teacher {
        Some(teacher) => Some(frozen_logp(teacher, &rows, &tokens, device)?),
        None => None,
    };
    let old_logp: Vec<f64> = completions
        .iter()
        .flat_map(|c| c.logp.iter().map(|v| *v as f64))
        .collect();
    // The sampling policy's entropies: the values a first epoch sees (as `logp` = `old_logp`).
    let entropy: Vec<f64> = completions
        .iter()
        .flat_map(|c| c.entropy.iter().map(|v| *v as f64))
        .collect();
    let inputs: Vec<Vec<f64>> = fills
        .iter()
        .zip(&graph.inputs)
        .map(|(fill, input)| match fill {
            Fill::Logp | Fill::OldLogp => old_logp.clone(),
            Fill::RefLogp => ref_logp.clone().unwrap_or_default(),
            Fill::TeacherLogp => teacher_logp.clone().unwrap_or_default(),
            Fill::Entropy => entropy.clone(),
            Fill::Signal(name) => signal_values
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
                .unwrap_or_default(),
            Fill::Length => lengths.iter().map(|l| *l as f64).collect(),
            Fill::State(k) => vec![states[*k]],
            Fill::Default(v) => {
                // Any shape, feature axes included (their lengths come from the layout).
                let rubrics = graph.rubrics.iter().map(|r| r.criteria.len()).collect();
                let size = Geometry::new(layout.clone(), rubrics).size(&input.shape);
                vec![*v; size]
            }
        })
        .collect();
    Ok(Samples {
        prompts,
        completions,
        rows,
        tokens,
        signal_values,
        correct,
        lengths,
        ref_logp,
        old_logp,
        batch: Batch { layout, inputs },
    })
}

/// Which groups of `batch` (`n` responses each) the recipe's `keep` filters keep (a group is kept
/// when any of its responses is), from a forward evaluation with `logp` = `old_logp`, as the first
/// epoch sees it.
fn kept_groups(
    objective: &Objective,
    batch: &Batch,
    context: &Context,
    n: usize,
) -> Result<Vec<bool>, String> {
    match objective.run(batch, context) {
        Ok(outcome) => Ok(outcome
            .kept
            .chunks(n)
            .map(|group| group.iter().any(|k| *k))
            .collect()),
        Err(e) if e.0 == ALL_FILTERED => Ok(vec![false; batch.layout.groups()]),
        Err(e) => Err(e.to_string()),
    }
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
) -> Result<(Outcome, Grads), Error> {
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
        let (loss, outcome) = op.apply(&values).map_err(err)?;
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
    let outcome = objective
        .run(&whole, &context)
        .map_err(|e| format!("recipe: {e}"))?;
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

/// The values of the recipe's `state`s at the first step: their initial values, or (resuming) the
/// checkpoint's, which must name exactly the recipe's states.
fn initial_state(
    graph: &Graph,
    resumed: Option<(PathBuf, Vec<(String, f64)>)>,
) -> Result<Vec<f64>, Error> {
    let Some((dir, saved)) = resumed else {
        return Ok(graph.states.iter().map(|s| s.init).collect());
    };
    let names = |list: Vec<&str>| match list.is_empty() {
        true => "none".to_string(),
        false => list.join(", "),
    };
    let declared: Vec<&str> = graph.states.iter().map(|s| s.name.as_str()).collect();
    let held: Vec<&str> = saved.iter().map(|(n, _)| n.as_str()).collect();
    if declared != held {
        return Err(format!(
            "checkpoint {}: it holds the recipe state {} but the recipe declares {}",
            dir.display(),
            names(held),
            names(declared)
        ));
    }
    Ok(saved.into_iter().map(|(_, v)| v).collect())
}

/// The recipe's `state`s after a step: each state's update, the metric `state.NAME` of the step's
/// outcome.
fn next_state(graph: &Graph, outcome: &Outcome) -> Result<Vec<f64>, Error> {
    graph
        .states
        .iter()
        .map(|state| {
            outcome
                .metrics
                .iter()
                .find(|(name, _)| *name == state.metric)
                .map(|(_, value)| *value)
                .ok_or_else(|| format!("the recipe computed no update for state `{}`", state.name))
        })
        .collect()
}

/// A number in a metrics line: non-finite values (a state's initial `inf`) as the strings `inf`,
/// `-inf` and `nan`, as in the graph's JSON, since JSON has no such numbers.
fn json_float(value: f64) -> Value {
    if value.is_finite() {
        json!(value)
    } else if value.is_nan() {
        json!("nan")
    } else if value > 0.0 {
        json!("inf")
    } else {
        json!("-inf")
    }
}

/// The file of a run directory that holds the sampled responses of every `train.samples_every` steps.
pub const SAMPLES_FILE: &str = "samples.jsonl";

/// The lines of `path` (a previous run's samples.jsonl) of the steps before `first_step`; a missing file
/// is empty, a line that is not a JSON object with a `step` number an error naming it.
fn samples_before(path: &Path, first_step: usize) -> Result<String, Error> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(String::new()),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let mut kept = String::new();
    for (k, line) in text.lines().enumerate() {
        let step = serde_json::from_str::<Value>(line)
            .ok()
            .and_then(|v| v.get("step").and_then(Value::as_u64));
        match step {
            Some(step) if (step as usize) < first_step => {
                kept.push_str(line);
                kept.push('\n');
            }
            Some(_) => {}
            None => {
                return Err(format!(
                    "{} line {}: not a JSON object with a `step` number (the samples of the run being resumed)",
                    path.display(),
                    k + 1
                ))
            }
        }
    }
    Ok(kept)
}

/// One JSON line per response of a step: its group and index in the group, the prompt and completion
/// as text, its token count, each signal (a number when the signal has one value per response, else
/// the response's values: per criterion, or a fixed number per response), and the recipe's `reward`,
/// `advantage` (a number, or per token) and `kept` when the recipe has them (first epoch).
#[allow(clippy::too_many_arguments)]
fn sample_lines(
    step: usize,
    task: &dyn Task,
    n: usize,
    rows: &[Vec<u32>],
    tokens: &[Vec<u32>],
    signals: &[(String, Vec<f64>)],
    layout: &Layout,
    outcome: Option<&Outcome>,
) -> String {
    let responses = tokens.len();
    let groups = layout.response_groups();
    // Per-criterion values: response r has the criteria of its group.
    let crit_offsets: Vec<usize> = std::iter::once(0)
        .chain(groups.iter().scan(0, |sum, &g| {
            *sum += layout.crit_count(g);
            Some(*sum)
        }))
        .collect();
    let per_token_offsets: Vec<usize> = std::iter::once(0)
        .chain(tokens.iter().scan(0, |sum, t| {
            *sum += t.len();
            Some(*sum)
        }))
        .collect();
    let of_response = |values: &[f64], r: usize| -> Option<Value> {
        if values.len() == responses {
            Some(json!(values[r]))
        } else if values.len() == crit_offsets[responses] {
            Some(json!(values[crit_offsets[r]..crit_offsets[r + 1]]))
        } else if values.len() == per_token_offsets[responses] {
            Some(json!(
                values[per_token_offsets[r]..per_token_offsets[r + 1]]
            ))
        } else if responses > 0 && values.len().is_multiple_of(responses) {
            let k = values.len() / responses;
            Some(json!(values[r * k..(r + 1) * k]))
        } else {
            None
        }
    };
    let mut text = String::new();
    for r in 0..responses {
        let mut line = Map::new();
        line.insert("step".into(), json!(step));
        line.insert("group".into(), json!(r / n.max(1)));
        line.insert("index".into(), json!(r % n.max(1)));
        line.insert("prompt".into(), json!(task.decode(&rows[r])));
        line.insert("completion".into(), json!(task.decode(&tokens[r])));
        line.insert("tokens".into(), json!(tokens[r].len()));
        let mut values = Map::new();
        for (name, v) in signals {
            if let Some(value) = of_response(v, r) {
                values.insert(name.clone(), value);
            }
        }
        line.insert("signals".into(), Value::Object(values));
        if let Some(outcome) = outcome {
            if let Some(value) = outcome.reward.as_deref().and_then(|v| of_response(v, r)) {
                line.insert("reward".into(), value);
            }
            if let Some(value) = outcome.advantage.as_deref().and_then(|v| of_response(v, r)) {
                line.insert("advantage".into(), value);
            }
            if outcome.kept.len() == responses {
                line.insert("kept".into(), json!(outcome.kept[r]));
            }
        }
        text.push_str(&Value::Object(line).to_string());
        text.push('\n');
    }
    text
}

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

fn mean(values: &[f64]) -> f64 {
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

/// The config's `[teacher]`, frozen: a pretrained one as loaded; a tiny one fresh from the run's seed
/// mixed with [`TEACHER_SEED`] and warm-started by the run's `[sft]` phase as the policy is (a fresh
/// tiny model knows nothing). It is rebuilt the same on a `--resume`, so no checkpoint holds it.
fn load_teacher(
    section: &crate::config::ModelSection,
    task: &dyn Task,
    config: &Config,
    device: &Device,
    progress: &mut impl FnMut(&Event),
) -> Result<Model, Error> {
    let seed = config.seed ^ TEACHER_SEED;
    let teacher = section
        .build(seed, device, config.train.compute_dtype()?)
        .map_err(|e| format!("[teacher]: {e}"))?;
    if !section.pretrained() {
        let start = Instant::now();
        let loss = supervised(&teacher, task, config, &mut Rng::new(seed), device)
            .map_err(|e| format!("[teacher]: {e}"))?;
        progress(&Event::Info(format!(
            "teacher: tiny, {} parameters; warm start: {} steps in {:.1}s{}",
            teacher.parameter_count(),
            config.sft.steps,
            start.elapsed().as_secs_f64(),
            loss.map(|l| format!(", loss {l:.4}")).unwrap_or_default()
        )));
    }
    Ok(teacher)
}

/// Run the whole job: warm start, then `config.steps` RL steps; metrics go to `out/metrics.jsonl`.
fn describe_base(base: Option<&checkpoint::BaseModel>) -> String {
    match base {
        None => "(none: every weight trained)".into(),
        Some(b) => format!("{} (sha256 {})", b.path, b.sha256),
    }
}

/// The candle device of a run whose plan says `gpu` (`Plan::gpu`): the CPU, or GPU N with candle's CUDA
/// backend. Asking for a GPU is an error, never a crash, without the `cuda` feature, the NVIDIA driver or
/// GPU N (the runtime's probe comes first: cudarc panics when it cannot load the driver).
pub fn candle_device(gpu: Option<usize>) -> Result<Device, Error> {
    let Some(ordinal) = gpu else {
        return Ok(Device::Cpu);
    };
    rlx_runtime::cuda::probe(ordinal)?;
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

pub fn run(
    plan: Plan,
    config: &Config,
    out: &Path,
    progress: impl FnMut(&Event),
) -> Result<Summary, Error> {
    run_with(plan, config, out, &RunOptions::default(), progress)
}

/// [`run`] with a resume point and an early stop.
pub fn run_with(
    plan: Plan,
    config: &Config,
    out: &Path,
    options: &RunOptions,
    mut progress: impl FnMut(&Event),
) -> Result<Summary, Error> {
    let start = Instant::now();
    let device = candle_device(plan.gpu)?;
    let write_err =
        |path: &Path, e: std::io::Error| format!("cannot write {}: {e}", path.display());
    // The run directory, held until the run ends: refused while another run holds it, or when it has
    // files of another run and this one does not resume the checkpoint in it.
    let resumed_here = match &options.resume {
        Some(dir) => {
            let checkpoint = checkpoint::locate(dir).map_err(|e| format!("--resume {e}"))?;
            same_directory(checkpoint.parent(), out)
        }
        None => false,
    };
    let held = RunDir::take(out, resumed_here)?;
    // The config as the run uses it (OUT/config.toml and the checkpoint's): the sampler settings the
    // recipe's `rollout` gave where the config leaves them to it (`n = 0`, `temperature < 0`,
    // `top_p = 0`).
    let config = &plan.resolve(config);
    if out.join(run_dir::RECORD_FILE).is_file() {
        run_dir::check_resumed_recipe(&held, &plan.recipe_files)?;
    } else {
        run_dir::record(&held, &plan.recipe_files)?;
    }
    let resolved = config.to_toml()?;
    let config_path = out.join("config.toml");
    std::fs::write(&config_path, &resolved).map_err(|e| write_err(&config_path, e))?;

    let objective = Arc::new(match (plan.gpu, config.backend.as_str()) {
        (Some(ordinal), _) => Objective::gpu_for(&plan.graph, ordinal, &device)?,
        (None, "jit") => Objective::kernel(&plan.graph)?,
        (None, _) => Objective::interpreter(plan.graph.clone()),
    });
    let task = plan.task;
    let max_new = config.sampler.max_new_tokens;
    let policy = config
        .model
        .build(config.seed, &device, config.train.compute_dtype()?)?;
    let base = checkpoint::base_model(&config.model)?;
    let eval = task.eval_prompts(config.seed)?;
    let uses_reference = plan.fills.contains(&Fill::RefLogp);
    let kl_monitor = if uses_reference {
        Some(kl_monitor_graph()?)
    } else {
        None
    };
    let params = plan.graph.params.clone();

    // Fresh start (warm start, reference copy, new optimizer, seeded streams) or a checkpoint.
    let mut rng = Rng::new(config.seed);
    let mut sft_rng = rng.fork();
    let mut sample_rng = rng.fork();
    let mut prompt_rng = rng.fork();
    let mut opt = AdamW::new(
        policy.vars(),
        AdamWParams {
            lr: config.train.lr,
            weight_decay: config.train.weight_decay,
            ..Default::default()
        },
    );
    let mut history: Vec<Map<String, Value>> = Vec::new();
    let mut rewards = Vec::new();
    let eval_settings = EvalSettings {
        max_new_tokens: max_new,
        samples: config.train.eval_samples,
        temperature: if plan.temperature > 0.0 {
            plan.temperature
        } else {
            1.0
        },
        top_p: plan.top_p,
        seed: config.seed ^ 0x5eed_e7a1,
    };
    // The recipe's `state` values as the checkpoint holds them (a fresh run starts from the initial values).
    let mut resumed_state: Option<(PathBuf, Vec<(String, f64)>)> = None;
    let (first_step, accuracy_before, eval_before, reference) = match &options.resume {
        Some(dir) => {
            let loaded = checkpoint::load(dir)?;
            let state = &loaded.state;
            resumed_state = Some((loaded.dir.clone(), state.recipe_state.clone()));
            if state.params != params {
                return Err(format!(
                    "--resume {}: the recipe's params {params:?} differ from the checkpoint's {:?} (pass the same --set NAME=VALUE)",
                    dir.display(),
                    state.params
                ));
            }
            if state.step > config.steps {
                return Err(format!(
                    "--resume {}: the checkpoint is at step {}, past steps = {}",
                    dir.display(),
                    state.step,
                    config.steps
                ));
            }
            if state.base != base {
                return Err(format!(
                    "--resume {}: the checkpoint's base model {} differs from this run's {} (a LoRA checkpoint holds only the adapters; resume with the base it was trained on)",
                    dir.display(),
                    describe_base(state.base.as_ref()),
                    describe_base(base.as_ref())
                ));
            }
            checkpoint::restore_weights(&policy, &loaded.dir, "model.safetensors")?;
            let reference = if state.has_reference {
                let reference = policy.frozen_copy().map_err(err)?;
                checkpoint::restore_weights(&reference, &loaded.dir, "reference.safetensors")?;
                Some(reference)
            } else if uses_reference {
                return Err(format!(
                    "--resume {}: the checkpoint has no reference model but the recipe reads ref_logp",
                    dir.display()
                ));
            } else {
                None
            };
            let moments = checkpoint::read_tensors(&loaded.dir, "optimizer.safetensors")?;
            opt.load_state(&moments, state.optimizer_step)
                .map_err(|e| format!("checkpoint {}: {e}", loaded.dir.display()))?;
            sample_rng = Rng::from_state(state.sample_rng);
            prompt_rng = Rng::from_state(state.prompt_rng);
            rewards = state.rewards.clone();
            for (k, line) in loaded.metrics_text.lines().enumerate() {
                match serde_json::from_str::<Value>(line) {
                    Ok(Value::Object(map)) => history.push(map),
                    _ => {
                        return Err(format!(
                            "checkpoint {}: metrics.jsonl line {} is not a JSON object",
                            loaded.dir.display(),
                            k + 1
                        ))
                    }
                }
            }
            progress(&Event::Info(format!(
                "resumed from {} at step {}/{}",
                loaded.dir.display(),
                state.step,
                config.steps
            )));
            (
                state.step,
                state.accuracy_before,
                state.eval_before.clone(),
                reference,
            )
        }
        None => {
            let sft_start = Instant::now();
            let sft_loss = supervised(&policy, task.as_ref(), config, &mut sft_rng, &device)?;
            let reference = if uses_reference {
                Some(policy.frozen_copy().map_err(err)?)
            } else {
                None
            };
            let before = if options.skip_evaluation {
                Map::new()
            } else {
                let models = TaskModels {
                    policy: &policy,
                    reference: reference.as_ref(),
                };
                evaluate(task.as_ref(), &models, &eval, eval_settings, &device)
                    .map_err(|e| format!("before the first step: {e}"))?
            };
            let accuracy = before.get("eval/accuracy").and_then(Value::as_f64);
            progress(&Event::Info(format!(
                "{}; {} parameters; warm start: {} steps in {:.1}s{}; held-out {}",
                task.name(),
                policy.parameter_count(),
                config.sft.steps,
                sft_start.elapsed().as_secs_f64(),
                sft_loss
                    .map(|l| format!(", loss {l:.4}"))
                    .unwrap_or_default(),
                describe_eval(&before)
            )));
            (0, accuracy, before, reference)
        }
    };
    let teacher = match &config.teacher {
        Some(section) => Some(load_teacher(
            section,
            task.as_ref(),
            config,
            &device,
            &mut progress,
        )?),
        None => None,
    };

    let metrics_path = out.join("metrics.jsonl");
    let mut metrics_text: String = history
        .iter()
        .map(|line| format!("{}\n", Value::Object(line.clone())))
        .collect();
    std::fs::write(&metrics_path, &metrics_text).map_err(|e| write_err(&metrics_path, e))?;
    let mut metrics_file = std::fs::OpenOptions::new()
        .append(true)
        .open(&metrics_path)
        .map_err(|e| write_err(&metrics_path, e))?;
    // OUT/tensorboard: the same metrics as TensorBoard event files (rewritten from the kept lines on a
    // resume).
    let mut events = crate::tensorboard::EventWriter::create(out, &history)?;

    // OUT/samples.jsonl: on a resume, the lines of the steps before the checkpoint's are kept (those
    // of later steps, from the run that stopped, are written again by the steps that redo them).
    let samples_path = out.join(SAMPLES_FILE);
    let kept_samples = if options.resume.is_some() {
        samples_before(&samples_path, first_step)?
    } else {
        String::new()
    };
    std::fs::write(&samples_path, &kept_samples).map_err(|e| write_err(&samples_path, e))?;
    let mut samples_file = std::fs::OpenOptions::new()
        .append(true)
        .open(&samples_path)
        .map_err(|e| write_err(&samples_path, e))?;

    let settings = Settings {
        temperature: plan.temperature,
        top_p: plan.top_p,
        max_new_tokens: max_new,
        stop: task.stop_tokens(),
        // The sampler's entropies fill `entropy` for the first evaluation.
        entropy: plan.fills.contains(&Fill::Entropy),
    };
    let n = plan.group_size;
    let mut recipe_state = initial_state(&plan.graph, resumed_state)?;
    let (mut sample_tokens, mut sample_time) = (0usize, 0f64);
    let (mut train_tokens, mut train_time) = (0usize, 0f64);
    let mut accuracy_after = accuracy_before;
    let mut last_checkpoint: Option<usize> = options.resume.as_ref().map(|_| first_step);
    let mut step_times = Vec::new();

    let save = |step: usize,
                metrics_text: &str,
                rewards: &[f64],
                opt: &AdamW,
                prompt_rng: &Rng,
                sample_rng: &Rng,
                recipe_state: &[f64]|
     -> Result<PathBuf, Error> {
        let state = State {
            format: checkpoint::FORMAT,
            step,
            optimizer_step: opt.step,
            prompt_rng: prompt_rng.state(),
            sample_rng: sample_rng.state(),
            accuracy_before,
            eval_before: eval_before.clone(),
            rewards: rewards.to_vec(),
            params: params.clone(),
            has_reference: reference.is_some(),
            base: base.clone(),
            recipe_state: plan
                .graph
                .states
                .iter()
                .zip(recipe_state)
                .map(|(s, v)| (s.name.clone(), *v))
                .collect(),
        };
        checkpoint::save(
            out,
            &state,
            &resolved,
            metrics_text,
            &policy,
            reference.as_ref(),
            opt,
        )
    };
    let no_checkpoint = |out: &Path, last: Option<usize>| match last {
        Some(step) => format!(
            "the last good checkpoint (after step {step}) is in {}",
            out.join("checkpoint").display()
        ),
        None => "no checkpoint was written yet".to_string(),
    };

    let mut step = first_step;
    while step < config.steps {
        if options.stop_after == Some(step) {
            break;
        }
        let step_start = Instant::now();
        // On a GPU, the step's peak memory (`gpu/peak_bytes`); nothing on the CPU.
        crate::memory::reset_gpu_peak(&device)?;
        let context = Context {
            step: step as f64,
            progress: step as f64 / config.steps.max(1) as f64,
        };
        // The batch the recipe sees, from prompts and their completions (n per prompt, in order).
        let models = TaskModels {
            policy: &policy,
            reference: reference.as_ref(),
        };
        let build = |prompts: Vec<Prompt>, completions: Vec<Completion>| {
            build_samples(
                task.as_ref(),
                &models,
                teacher.as_ref(),
                (&plan.graph, &plan.fills),
                n,
                &device,
                step,
                prompts,
                completions,
                &recipe_state,
            )
        };
        // Sampling rounds (DAPO's dynamic sampling): when the recipe's `keep` drops groups, sample
        // more prompts, up to `train.max_sampling_rounds` rounds, until `prompts_per_step` groups are
        // kept; the step trains on those (a first round that keeps every group is used as it is).
        let wanted = config.train.prompts_per_step;
        let filtering = !plan.graph.outputs.keeps.is_empty();
        // A signal that fails (a reward program that crashes, hangs or prints garbage; a judge) stops
        // the run before the update, with a checkpoint of the state before this step (its random
        // streams as they were when it began), so that `--resume` redoes the step exactly.
        let (step_prompt_rng, step_sample_rng) = (prompt_rng.clone(), sample_rng.clone());
        let signals_failed = |e: String| -> Error {
            let saved = save(
                step,
                &metrics_text,
                &rewards,
                &opt,
                &step_prompt_rng,
                &step_sample_rng,
                &recipe_state,
            );
            match saved {
                Ok(dir) => format!(
                    "step {step}: {e}\nthe run stopped before the step's update; the state before step {step} is saved in {}: fix the cause, then continue with `--resume {}`",
                    dir.display(),
                    out.display()
                ),
                Err(save_error) => format!(
                    "step {step}: {e}\nthe run stopped before the step's update, and saving a checkpoint failed ({save_error}); {}",
                    no_checkpoint(out, last_checkpoint)
                ),
            }
        };
        let (mut generated, mut sample_s, mut rounds) = (0usize, 0f64, 0usize);
        // The samples' signals and reference log-probs (and the recipe's `keep`), over all rounds.
        let mut score_s = 0f64;
        // Whether each response sampled in this step (every round, kept or not) is exactly right.
        let mut sampled_correct: Vec<f64> = Vec::new();
        let mut kept_prompts: Vec<Prompt> = Vec::new();
        let mut kept_completions: Vec<Completion> = Vec::new();
        // The samples and, when the recipe filters, how many of their groups it keeps.
        let (samples, kept_count) = loop {
            rounds += 1;
            let prompts = task.prompts(&mut prompt_rng, wanted)?;
            let ids: Vec<Vec<u32>> = prompts.iter().map(|p| p.ids.clone()).collect();
            let t0 = Instant::now();
            let completions: Vec<Completion> =
                generate(&policy, &ids, n, &settings, &mut sample_rng, &device).map_err(err)?;
            sample_s += t0.elapsed().as_secs_f64();
            generated += completions.iter().map(|c| c.tokens.len()).sum::<usize>();
            let t_score = Instant::now();
            let round = build(prompts, completions).map_err(signals_failed)?;
            score_s += t_score.elapsed().as_secs_f64();
            if !filtering {
                break (round, None);
            }
            let kept = kept_groups(&objective, &round.batch, &context, n).map_err(|e| {
                format!(
                    "step {step} (sampling round {rounds}): recipe: {e}; the run stopped before the update; {}",
                    no_checkpoint(out, last_checkpoint)
                )
            })?;
            let count = kept.iter().filter(|k| **k).count();
            if let Some(c) = &round.correct {
                sampled_correct.extend_from_slice(c);
            }
            if count == kept.len() && rounds == 1 {
                break (round, Some(count));
            }
            // The step trains on the kept groups only, refilled as one batch (with one round too: a
            // dropped group has advantage and gradient 0 and is outside the loss's normalisations, so
            // this is the recipe's update without a forward and backward pass over its responses).
            for (g, _) in kept.iter().enumerate().filter(|(_, k)| **k) {
                if kept_prompts.len() < wanted {
                    kept_prompts.push(round.prompts[g].clone());
                    kept_completions.extend_from_slice(&round.completions[g * n..(g + 1) * n]);
                }
            }
            if kept_prompts.len() >= wanted || rounds >= config.train.max_sampling_rounds {
                if kept_prompts.is_empty() {
                    break (round, Some(0));
                }
                let count = kept_prompts.len();
                let t_score = Instant::now();
                let kept = build(
                    std::mem::take(&mut kept_prompts),
                    std::mem::take(&mut kept_completions),
                )
                .map_err(signals_failed)?;
                score_s += t_score.elapsed().as_secs_f64();
                break (kept, Some(count));
            }
        };
        sample_time += sample_s;
        sample_tokens += generated;
        let Samples {
            rows,
            tokens,
            signal_values,
            correct,
            lengths,
            ref_logp,
            old_logp,
            batch,
            ..
        } = samples;
        let total_tokens = batch.layout.tokens();

        // When the recipe's `keep` dropped every group (even after resampling) there is no signal:
        // no update, and the step is logged as skipped.
        let epochs = if kept_count == Some(0) {
            0
        } else {
            config.train.epochs
        };
        let t1 = Instant::now();
        let mut first = None;
        let mut grad_norm = 0.0;
        for epoch in 0..epochs {
            let fail = |what: String| {
                format!(
                    "step {step} (epoch {epoch}): {what}; the run stopped before the update; {}",
                    no_checkpoint(out, last_checkpoint)
                )
            };
            let (outcome, mut grads) = loss_and_gradients(
                &policy,
                &objective,
                &batch,
                "logp",
                context,
                &rows,
                &tokens,
                config.train.micro_batch,
                // The first epoch's policy sampled the batch: its logp is the batch's old_logp.
                epoch == 0,
                &device,
            )
            .map_err(fail)?;
            if let Some((name, value)) = grads.first_non_finite(policy.vars()) {
                return Err(fail(format!(
                    "the gradient of parameter `{name}` has {value}"
                )));
            }
            grad_norm = grads.clip(config.train.grad_clip);
            opt.step(&grads).map_err(err)?;
            if let Some((name, _)) = policy.vars().iter().find(|(_, v)| {
                let largest = v
                    .as_tensor()
                    .abs()
                    .and_then(|t| t.max_all())
                    .and_then(|t| t.to_scalar::<f32>());
                !matches!(largest, Ok(m) if m.is_finite())
            }) {
                return Err(fail(format!(
                    "parameter `{name}` became non-finite after the update"
                )));
            }
            first.get_or_insert(outcome);
        }
        let train_s = t1.elapsed().as_secs_f64();
        let trained_tokens = total_tokens * epochs;
        train_time += train_s;
        train_tokens += trained_tokens;
        let outcome: Option<Outcome> = first;

        let score_mean = signal_values.first().map(|(_, v)| mean(v));
        let reward_mean = outcome
            .as_ref()
            .and_then(|o| o.reward.as_ref())
            .map(|r| mean(r))
            .or(score_mean)
            .unwrap_or(0.0);
        rewards.push(reward_mean);
        let mut line = Map::new();
        line.insert("step".into(), json!(step));
        line.insert("reward/mean".into(), json!(reward_mean));
        // Over every response sampled in the step (with `keep` filters, also those of dropped groups).
        let correct = match correct {
            Some(_) if filtering => Some(sampled_correct),
            other => other,
        };
        if let Some(correct) = &correct {
            line.insert("accuracy".into(), json!(mean(correct)));
        }
        // The recipe's state as this step read it (`state/NAME`); its update is `recipe/state.NAME`.
        for (info, value) in plan.graph.states.iter().zip(&recipe_state) {
            line.insert(format!("state/{}", info.name), json_float(*value));
        }
        match &outcome {
            Some(outcome) => {
                line.insert("loss".into(), json!(outcome.loss));
                for (name, value) in &outcome.metrics {
                    line.insert(format!("recipe/{name}"), json!(value));
                }
                recipe_state = next_state(&plan.graph, outcome)?;
            }
            None => {
                line.insert("loss".into(), Value::Null);
                line.insert(
                    "skipped".into(),
                    json!("the recipe's `keep` filtered out every group: no update"),
                );
            }
        }
        for (name, values) in &signal_values {
            line.insert(format!("signal/{name}/mean"), json!(mean(values)));
        }
        // k3 estimate of KL(π_old ‖ π_ref) on the sampled tokens (std/loss `k3`, token mean).
        let kl = match (&kl_monitor, &ref_logp) {
            (Some(monitor), Some(reference)) => {
                Some(monitor_kl(monitor, &batch.layout, &old_logp, reference)?)
            }
            _ => None,
        };
        if let Some(kl) = kl {
            line.insert("kl".into(), json!(kl));
        }
        // Distinct completions per group, as a fraction of the group size.
        let distinct: Vec<f64> = tokens
            .chunks(n)
            .map(|group| {
                let mut seen: Vec<&Vec<u32>> = group.iter().collect();
                seen.sort();
                seen.dedup();
                seen.len() as f64 / n as f64
            })
            .collect();
        line.insert("diversity/distinct".into(), json!(mean(&distinct)));
        line.insert(
            "response_length/mean".into(),
            json!(total_tokens as f64 / lengths.len() as f64),
        );
        line.insert("grad_norm".into(), json!(grad_norm));
        if filtering {
            line.insert("sampling/rounds".into(), json!(rounds));
            line.insert("sampling/kept_groups".into(), json!(kept_count));
        }
        line.insert(
            "sample_tokens_per_s".into(),
            json!(generated as f64 / sample_s.max(1e-9)),
        );
        line.insert(
            "train_tokens_per_s".into(),
            json!(trained_tokens as f64 / train_s.max(1e-9)),
        );
        line.insert("time/sample_s".into(), json!(sample_s));
        line.insert("time/score_s".into(), json!(score_s));
        line.insert("time/train_s".into(), json!(train_s));
        let last = step + 1 == config.steps;
        let every = config.train.eval_every;
        let mut eval_accuracy = None;
        if !options.skip_evaluation && (last || (every > 0 && (step + 1) % every == 0)) {
            let models = TaskModels {
                policy: &policy,
                reference: reference.as_ref(),
            };
            let metrics =
                evaluate(task.as_ref(), &models, &eval, eval_settings, &device).map_err(|e| {
                    format!(
                        "step {step}: {e}; the run stopped after the step's update; {}",
                        no_checkpoint(out, last_checkpoint)
                    )
                })?;
            eval_accuracy = metrics.get("eval/accuracy").and_then(Value::as_f64);
            if eval_accuracy.is_some() {
                accuracy_after = eval_accuracy;
            }
            line.extend(metrics);
        }
        let every = config.train.samples_every;
        if every > 0 && step % every == 0 {
            let text = sample_lines(
                step,
                task.as_ref(),
                n,
                &rows,
                &tokens,
                &signal_values,
                &batch.layout,
                outcome.as_ref(),
            );
            samples_file
                .write_all(text.as_bytes())
                .map_err(|e| write_err(&samples_path, e))?;
        }
        let step_s = step_start.elapsed().as_secs_f64();
        line.insert("step_time_s".into(), json!(step_s));
        if let Some(peak) = crate::memory::gpu_peak_bytes(&device)? {
            line.insert("gpu/peak_bytes".into(), json!(peak));
        }
        let text = format!("{}\n", Value::Object(line.clone()));
        metrics_file
            .write_all(text.as_bytes())
            .map_err(|e| write_err(&metrics_path, e))?;
        metrics_text.push_str(&text);
        events.write_line(&line)?;
        history.push(line);
        step_times.push(step_s);
        step += 1;

        let every = config.train.checkpoint_every;
        if last || (every > 0 && step % every == 0) {
            save(
                step,
                &metrics_text,
                &rewards,
                &opt,
                &prompt_rng,
                &sample_rng,
                &recipe_state,
            )?;
            last_checkpoint = Some(step);
        }
        progress(&Event::Step(StepReport {
            step,
            steps: config.steps,
            reward: reward_mean,
            kl: kl.or_else(|| {
                outcome
                    .as_ref()?
                    .metrics
                    .iter()
                    .find(|(n, _)| n == "kl")
                    .map(|(_, v)| *v)
            }),
            eval_accuracy,
            step_s,
            eta_s: mean(&step_times) * (config.steps - step) as f64,
        }));
    }

    if step < config.steps {
        // Stopped by `stop_after`, as if killed: no plot, no summary, the checkpoint stays as it was.
        return Ok(Summary {
            out: out.to_path_buf(),
            accuracy_before,
            accuracy_after,
            rewards,
            wall_s: start.elapsed().as_secs_f64(),
            sample_tokens_per_s: sample_tokens as f64 / sample_time.max(1e-9),
            train_tokens_per_s: train_tokens as f64 / train_time.max(1e-9),
            steps_done: step,
        });
    }
    let plot_path = out.join("metrics.png");
    let run_name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let recipe_name = plan
        .recipe_files
        .first()
        .and_then(|f| f.path.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "recipe".into());
    plot::write_png(
        &plot_path,
        &format!(
            "{recipe_name} - run {run_name}: {} steps, seed {}",
            step, config.seed
        ),
        &plot::metric_panels(&history, &eval_before),
    )?;
    let summary = Summary {
        out: out.to_path_buf(),
        accuracy_before,
        accuracy_after,
        rewards,
        wall_s: start.elapsed().as_secs_f64(),
        sample_tokens_per_s: sample_tokens as f64 / sample_time.max(1e-9),
        train_tokens_per_s: train_tokens as f64 / train_time.max(1e-9),
        steps_done: step,
    };
    let document = json!({
        "steps_done": step,
        "accuracy_before": accuracy_before,
        "accuracy_after": accuracy_after,
        "wall_s": summary.wall_s,
        "sample_tokens_per_s": summary.sample_tokens_per_s,
        "train_tokens_per_s": summary.train_tokens_per_s,
        "objective": objective.name(),
        "group_size": n,
        "temperature": plan.temperature,
        "top_p": plan.top_p,
        // The held-out evaluation before the first step (metrics.jsonl has the later ones).
        "eval_before": Value::Object(eval_before.clone()),
    });
    let summary_path = out.join("summary.json");
    std::fs::write(&summary_path, format!("{document:#}\n"))
        .map_err(|e| write_err(&summary_path, e))?;
    Ok(summary)
}

/// The held-out evaluation for the progress line: accuracy when the task is verifiable, else its
/// first metric, else "n/a".
fn describe_eval(metrics: &Map<String, Value>) -> String {
    if let Some(a) = metrics.get("eval/accuracy").and_then(Value::as_f64) {
        return format!("greedy accuracy {a:.3}");
    }
    match metrics.iter().find_map(|(k, v)| Some((k, v.as_f64()?))) {
        Some((k, v)) => format!("{k} {v:.3}"),
        None => "evaluation n/a".into(),
    }
}

/// Whether `a` (a directory that exists) and `b` name the same directory.
fn same_directory(a: Option<&Path>, b: &Path) -> bool {
    match (a.and_then(|a| a.canonicalize().ok()), b.canonicalize().ok()) {
        (Some(a), Some(b)) => a == b,
        _ => false,
    }
}
