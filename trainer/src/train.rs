//! The training loop behind `rlx run`: prompts → samples → score → compiled recipe (through the custom
//! op) → backward → gradient clipping → AdamW, with a supervised warm start, per-step metrics as JSONL,
//! deterministic for a seed.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use serde_json::{json, Map, Value};

use rlx_compiler::hir::{ExprKind, Recipe, RolloutValue};
use rlx_compiler::ir::{Graph, Level};
use rlx_runtime::batch::{Batch, Layout};
use rlx_runtime::interp::Context;

use crate::config::Config;
use crate::model::{attention_mask, log_softmax, Model};
use crate::op::{Objective, RecipeOp};
use crate::rng::Rng;
use crate::sample::{generate, left_pad, Completion, Settings};
use crate::task::{Arithmetic, Question, Tokenizer, EOS, PAD};

type Error = String;

fn err(e: candle_core::Error) -> Error {
    e.to_string()
}

/// Which recipe input the trainer fills with what.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fill {
    /// log π_θ of each generated token (the policy input; differentiable).
    Logp,
    /// log π of each token under the sampling policy.
    OldLogp,
    /// log π_ref of each token under the frozen warm-started model.
    RefLogp,
    /// The task's verifiable score per response.
    Score,
    /// The number of tokens of each response.
    Length,
    /// The input's declared default.
    Default(f64),
}

const FILLED: &str =
    "logp (f32[tok] policy), old_logp (f32[tok]), ref_logp (f32[tok]), score (f32[resp]), length (f32[resp])";

/// Decide how to fill every input of `graph`; an error names an input the trainer cannot fill.
fn plan_inputs(graph: &Graph) -> Result<Vec<Fill>, Error> {
    let mut fills = Vec::new();
    for input in &graph.inputs {
        let level = input.shape.level;
        let plain = input.shape.feature.is_none();
        let fill = match (input.name.as_str(), level) {
            ("logp", Level::Tok) if plain && input.differentiable => Some(Fill::Logp),
            ("old_logp", Level::Tok) if plain => Some(Fill::OldLogp),
            ("ref_logp", Level::Tok) if plain => Some(Fill::RefLogp),
            ("score", Level::Resp) if plain => Some(Fill::Score),
            ("length", Level::Resp) if plain => Some(Fill::Length),
            _ => None,
        };
        let fill = match (fill, input.default) {
            (Some(fill), _) => fill,
            (None, Some(default)) if !input.differentiable => Fill::Default(default),
            _ => {
                return Err(format!(
                    "recipe input `{}` ({}{}{}) cannot be filled by the trainer: it fills {FILLED}, and inputs with a default",
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
            "the recipe has no input `logp : f32[tok] policy` for the trainer to differentiate (it fills {FILLED})"
        ));
    }
    Ok(fills)
}

/// The settings the recipe's `rollout { … }` block gives, as numbers.
fn rollout_setting(recipe: &Recipe, graph: &Graph, key: &str) -> Option<f64> {
    let setting = recipe.rollout.iter().find(|s| s.key == key)?;
    let RolloutValue::Expr(expr) = &setting.value else {
        return None;
    };
    match &expr.kind {
        ExprKind::Const(v) => Some(*v),
        ExprKind::Param(id) => {
            let name = &recipe.params.get(id.0 as usize)?.name;
            graph
                .params
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| *v)
        }
        _ => None,
    }
}

/// log π(token) of each completion token under `model`, packed (responses in order, tokens contiguous),
/// `[total tokens]`. Differentiable with respect to the model's parameters.
pub fn completion_logp(
    model: &Model,
    prompts: &[Vec<u32>],
    completions: &[Vec<u32>],
    device: &Device,
) -> candle_core::Result<Tensor> {
    let (pads, prompt_ids, p) = left_pad(prompts);
    let longest = completions.iter().map(Vec::len).max().unwrap_or(0).max(1);
    let rows = prompts.len();
    let width = p + longest;
    let mut ids = Vec::with_capacity(rows * width);
    let mut targets = Vec::with_capacity(rows * longest);
    let mut packed = Vec::new();
    for (r, completion) in completions.iter().enumerate() {
        ids.extend_from_slice(&prompt_ids[r * p..(r + 1) * p]);
        ids.extend_from_slice(completion);
        ids.extend(std::iter::repeat_n(PAD, longest - completion.len()));
        targets.extend_from_slice(completion);
        targets.extend(std::iter::repeat_n(PAD, longest - completion.len()));
        packed.extend((0..completion.len()).map(|k| (r * longest + k) as u32));
    }
    let ids = Tensor::from_vec(ids, (rows, width), device)?;
    let mask = attention_mask(&pads, 0, width, device)?;
    let hidden = model.hidden(&ids, 0, &mask, None)?;
    // Position p - 1 + k predicts completion token k.
    let logits = model.logits(&hidden.narrow(1, p - 1, longest)?)?;
    let logp = log_softmax(&logits)?;
    let targets = Tensor::from_vec(targets, (rows, longest, 1), device)?;
    let chosen = logp.gather(&targets, 2)?.flatten_all()?;
    let packed = Tensor::from_vec(packed.clone(), packed.len(), device)?;
    chosen.index_select(&packed, 0)
}

/// Clip the global gradient norm of `model`'s parameters to `max_norm` (0 = no clipping); returns the
/// norm before clipping.
pub fn clip_gradients(
    model: &Model,
    grads: &mut GradStore,
    max_norm: f64,
) -> candle_core::Result<f64> {
    let mut total = 0.0f64;
    for (_, var) in model.vars() {
        if let Some(g) = grads.get(var.as_tensor()) {
            total += g.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
        }
    }
    let norm = total.sqrt();
    if max_norm > 0.0 && norm > max_norm {
        let scale = max_norm / (norm + 1e-6);
        for (_, var) in model.vars() {
            if let Some(g) = grads.get(var.as_tensor()) {
                let scaled = (g * scale)?;
                grads.insert(var.as_tensor(), scaled);
            }
        }
    }
    Ok(norm)
}

fn encode_all(questions: &[Question]) -> Result<Vec<Vec<u32>>, Error> {
    questions
        .iter()
        .map(|q| Tokenizer.encode(&q.prompt))
        .collect()
}

/// Greedy accuracy of `model` on `questions`.
pub fn accuracy(
    model: &Model,
    task: &Arithmetic,
    questions: &[Question],
    max_new_tokens: usize,
    device: &Device,
) -> Result<f64, Error> {
    if questions.is_empty() {
        return Ok(0.0);
    }
    let prompts = encode_all(questions)?;
    let settings = Settings {
        temperature: 0.0,
        top_p: 1.0,
        max_new_tokens,
        stop: Some(EOS),
    };
    let mut rng = Rng::new(0);
    let mut correct = 0.0;
    for (chunk_q, chunk_p) in questions.chunks(256).zip(prompts.chunks(256)) {
        let completions = generate(model, chunk_p, 1, &settings, &mut rng, device).map_err(err)?;
        for (q, c) in chunk_q.iter().zip(&completions) {
            correct += task.score(q, &c.tokens);
        }
    }
    Ok(correct / questions.len() as f64)
}

/// The supervised warm start: cross-entropy on `answer<eos>` after each prompt. Returns the last loss.
pub fn supervised(
    model: &Model,
    task: &Arithmetic,
    config: &Config,
    rng: &mut Rng,
    device: &Device,
) -> Result<f64, Error> {
    let mut opt = AdamW::new(
        model.vars().iter().map(|(_, v)| v.clone()).collect(),
        ParamsAdamW {
            lr: config.sft.lr,
            weight_decay: 0.0,
            ..Default::default()
        },
    )
    .map_err(err)?;
    let mut last = f64::NAN;
    for _ in 0..config.sft.steps {
        let questions: Vec<Question> = (0..config.sft.batch).map(|_| task.question(rng)).collect();
        let prompts = encode_all(&questions)?;
        let targets: Vec<Vec<u32>> = questions
            .iter()
            .map(|q| {
                let mut t = Tokenizer.encode(&q.answer)?;
                t.push(EOS);
                Ok(t)
            })
            .collect::<Result<_, Error>>()?;
        let logp = completion_logp(model, &prompts, &targets, device).map_err(err)?;
        let loss = logp.mean_all().map_err(err)?.neg().map_err(err)?;
        let mut grads = loss.backward().map_err(err)?;
        clip_gradients(model, &mut grads, config.train.grad_clip).map_err(err)?;
        opt.step(&grads).map_err(err)?;
        last = loss.to_scalar::<f32>().map_err(err)? as f64;
    }
    Ok(last)
}

/// What a run produced.
#[derive(Clone, Debug)]
pub struct Summary {
    pub out: PathBuf,
    pub accuracy_before: f64,
    pub accuracy_after: f64,
    pub rewards: Vec<f64>,
    pub wall_s: f64,
    pub sample_tokens_per_s: f64,
    pub train_tokens_per_s: f64,
}

/// Everything a run needs, checked: the graph, how its inputs are filled, the sampler settings.
pub struct Plan {
    pub graph: Graph,
    fills: Vec<Fill>,
    pub group_size: usize,
    pub temperature: f64,
}

/// Compile the recipe with its param overrides and check that the trainer can feed it.
pub fn plan(recipe: &Recipe, overrides: &[(String, f64)], config: &Config) -> Result<Plan, Error> {
    let graph = rlx_compiler::compile_graph(recipe, overrides)?;
    if graph.outputs.loss.is_none() {
        return Err("the recipe has no `loss` section: there is nothing to train".into());
    }
    let fills = plan_inputs(&graph)?;
    let group_size = if config.sampler.n > 0 {
        config.sampler.n
    } else {
        rollout_setting(recipe, &graph, "n").map_or(8, |n| n.max(1.0) as usize)
    };
    let temperature = if config.sampler.temperature >= 0.0 {
        config.sampler.temperature
    } else {
        rollout_setting(recipe, &graph, "temperature").unwrap_or(1.0)
    };
    Ok(Plan {
        graph,
        fills,
        group_size,
        temperature,
    })
}

/// Run the whole job: warm start, then `config.steps` RL steps; metrics go to `out/metrics.jsonl`.
pub fn run(
    plan: Plan,
    config: &Config,
    out: &Path,
    mut progress: impl FnMut(&str),
) -> Result<Summary, Error> {
    let start = Instant::now();
    let device = Device::Cpu;
    std::fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let resolved = toml::to_string(config).map_err(|e| e.to_string())?;
    std::fs::write(out.join("config.toml"), resolved)
        .map_err(|e| format!("cannot write {}: {e}", out.join("config.toml").display()))?;
    let metrics_path = out.join("metrics.jsonl");
    let mut metrics_file = std::fs::File::create(&metrics_path)
        .map_err(|e| format!("cannot write {}: {e}", metrics_path.display()))?;

    let objective = Arc::new(match config.backend.as_str() {
        "jit" => Objective::kernel(&plan.graph)?,
        _ => Objective::interpreter(plan.graph.clone()),
    });
    let task = Arithmetic::new(config.task.clone())?;
    let mut model_config = config.model.clone();
    if model_config.vocab == 0 {
        model_config.vocab = Tokenizer.vocab_size();
    }
    let mut rng = Rng::new(config.seed);
    let policy = Model::new(&model_config, config.seed, &device).map_err(err)?;
    let eval = task.eval_set(config.seed);
    let max_new = config.sampler.max_new_tokens;

    let sft_start = Instant::now();
    let sft_loss = supervised(&policy, &task, config, &mut rng.fork(), &device)?;
    let accuracy_before = accuracy(&policy, &task, &eval, max_new, &device)?;
    progress(&format!(
        "warm start: {} steps in {:.1}s, loss {sft_loss:.4}; {} parameters; greedy accuracy {:.3}",
        config.sft.steps,
        sft_start.elapsed().as_secs_f64(),
        policy.parameter_count(),
        accuracy_before
    ));
    let reference = if plan.fills.contains(&Fill::RefLogp) {
        Some(policy.frozen_copy().map_err(err)?)
    } else {
        None
    };
    let mut opt = AdamW::new(
        policy.vars().iter().map(|(_, v)| v.clone()).collect(),
        ParamsAdamW {
            lr: config.train.lr,
            weight_decay: config.train.weight_decay,
            ..Default::default()
        },
    )
    .map_err(err)?;
    let settings = Settings {
        temperature: plan.temperature,
        top_p: config.sampler.top_p,
        max_new_tokens: max_new,
        stop: Some(EOS),
    };
    let n = plan.group_size;
    let (mut sample_tokens, mut sample_time) = (0usize, 0f64);
    let (mut train_tokens, mut train_time) = (0usize, 0f64);
    let mut rewards = Vec::new();
    let mut accuracy_after = accuracy_before;
    let mut sample_rng = rng.fork();
    let mut prompt_rng = rng.fork();

    for step in 0..config.steps {
        let step_start = Instant::now();
        let questions: Vec<Question> = (0..config.train.prompts_per_step)
            .map(|_| task.question(&mut prompt_rng))
            .collect();
        let prompts = encode_all(&questions)?;
        let t0 = Instant::now();
        let completions: Vec<Completion> =
            generate(&policy, &prompts, n, &settings, &mut sample_rng, &device).map_err(err)?;
        let generated: usize = completions.iter().map(|c| c.tokens.len()).sum();
        sample_time += t0.elapsed().as_secs_f64();
        sample_tokens += generated;

        let rows: Vec<Vec<u32>> = prompts
            .iter()
            .flat_map(|p| std::iter::repeat_n(p.clone(), n))
            .collect();
        let tokens: Vec<Vec<u32>> = completions.iter().map(|c| c.tokens.clone()).collect();
        let scores: Vec<f64> = completions
            .iter()
            .enumerate()
            .map(|(r, c)| task.score(&questions[r / n], &c.tokens))
            .collect();
        let lengths: Vec<usize> = tokens.iter().map(Vec::len).collect();
        let layout = Layout::from_counts(&vec![n; questions.len()], &lengths, &[], 0)
            .map_err(|e| e.to_string())?;
        let ref_logp: Option<Vec<f64>> = match &reference {
            Some(reference) => Some(
                completion_logp(reference, &rows, &tokens, &device)
                    .and_then(|t| t.to_vec1::<f32>())
                    .map_err(err)?
                    .into_iter()
                    .map(f64::from)
                    .collect(),
            ),
            None => None,
        };
        let old_logp: Vec<f64> = completions
            .iter()
            .flat_map(|c| c.logp.iter().map(|v| *v as f64))
            .collect();
        let total_tokens = layout.tokens();
        let inputs: Vec<Vec<f64>> = plan
            .fills
            .iter()
            .zip(&plan.graph.inputs)
            .map(|(fill, input)| match fill {
                Fill::Logp | Fill::OldLogp => old_logp.clone(),
                Fill::RefLogp => ref_logp.clone().unwrap_or_default(),
                Fill::Score => scores.clone(),
                Fill::Length => lengths.iter().map(|l| *l as f64).collect(),
                Fill::Default(v) => {
                    let size = match input.shape.level {
                        Level::Batch => 1,
                        Level::Group => layout.groups(),
                        Level::Resp => layout.responses(),
                        Level::Tok => total_tokens,
                        Level::Pair => 0,
                    };
                    vec![*v; size]
                }
            })
            .collect();
        let batch = Batch { layout, inputs };
        let context = Context {
            step: step as f64,
            progress: step as f64 / config.steps.max(1) as f64,
        };

        let t1 = Instant::now();
        let mut first = None;
        let mut grad_norm = 0.0;
        for _ in 0..config.train.epochs {
            let logp = completion_logp(&policy, &rows, &tokens, &device).map_err(err)?;
            let op = RecipeOp::new(objective.clone(), batch.clone(), "logp", context)?;
            let (loss, outcome) = op.apply(&logp).map_err(err)?;
            let mut grads = loss.backward().map_err(err)?;
            grad_norm = clip_gradients(&policy, &mut grads, config.train.grad_clip).map_err(err)?;
            opt.step(&grads).map_err(err)?;
            first.get_or_insert(outcome);
        }
        train_time += t1.elapsed().as_secs_f64();
        train_tokens += total_tokens * config.train.epochs;
        let outcome = first.expect("at least one epoch");

        let reward_mean = outcome.reward.as_ref().map_or(mean(&scores), |r| mean(r));
        rewards.push(reward_mean);
        let mut line = Map::new();
        line.insert("step".into(), json!(step));
        line.insert("reward/mean".into(), json!(reward_mean));
        line.insert("accuracy".into(), json!(mean(&scores)));
        line.insert("loss".into(), json!(outcome.loss));
        for (name, value) in &outcome.metrics {
            line.insert(format!("recipe/{name}"), json!(value));
        }
        line.insert(
            "response_length/mean".into(),
            json!(total_tokens as f64 / lengths.len() as f64),
        );
        line.insert("grad_norm".into(), json!(grad_norm));
        line.insert(
            "sample_tokens_per_s".into(),
            json!(generated as f64 / t0.elapsed().as_secs_f64().max(1e-9)),
        );
        line.insert(
            "train_tokens_per_s".into(),
            json!(
                (total_tokens * config.train.epochs) as f64 / t1.elapsed().as_secs_f64().max(1e-9)
            ),
        );
        let last = step + 1 == config.steps;
        let every = config.train.eval_every;
        if last || (every > 0 && (step + 1) % every == 0) {
            accuracy_after = accuracy(&policy, &task, &eval, max_new, &device)?;
            line.insert("eval/accuracy".into(), json!(accuracy_after));
        }
        line.insert(
            "step_time_s".into(),
            json!(step_start.elapsed().as_secs_f64()),
        );
        writeln!(metrics_file, "{}", Value::Object(line.clone()))
            .map_err(|e| format!("cannot write {}: {e}", metrics_path.display()))?;
        let kl = outcome
            .metrics
            .iter()
            .find(|(n, _)| n == "kl")
            .map(|(_, v)| format!(" kl {v:.4}"))
            .unwrap_or_default();
        let eval_text = line
            .get("eval/accuracy")
            .map(|v| format!(" eval accuracy {:.3}", v.as_f64().unwrap_or(0.0)))
            .unwrap_or_default();
        progress(&format!(
            "step {}/{} reward {reward_mean:.3}{kl}{eval_text} ({:.2}s)",
            step + 1,
            config.steps,
            step_start.elapsed().as_secs_f64()
        ));
    }
    let summary = Summary {
        out: out.to_path_buf(),
        accuracy_before,
        accuracy_after,
        rewards,
        wall_s: start.elapsed().as_secs_f64(),
        sample_tokens_per_s: sample_tokens as f64 / sample_time.max(1e-9),
        train_tokens_per_s: train_tokens as f64 / train_time.max(1e-9),
    };
    let document = json!({
        "accuracy_before": summary.accuracy_before,
        "accuracy_after": summary.accuracy_after,
        "wall_s": summary.wall_s,
        "sample_tokens_per_s": summary.sample_tokens_per_s,
        "train_tokens_per_s": summary.train_tokens_per_s,
        "objective": objective.name(),
        "group_size": n,
        "temperature": plan.temperature,
    });
    std::fs::write(out.join("summary.json"), format!("{document:#}\n"))
        .map_err(|e| format!("cannot write {}: {e}", out.join("summary.json").display()))?;
    Ok(summary)
}

fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values.iter().sum::<f64>() / values.len() as f64
    }
}
