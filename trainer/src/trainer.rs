//! The training loop of `rlx run` as a [`Trainer`]: built once from a [`Plan`] and the config
//! ([`Trainer::new`]: the run directory, the models, and a warm start or a checkpoint), then one
//! [`Trainer::step`] per RL step — sample → signals → reference → keep → update (the recipe's kernel,
//! backward, AdamW) → record — with a checkpoint when one is due, and [`Trainer::finish`] for the plot and
//! the summary. [`crate::train::run_with`] drives it; errors are [`TrainError`]s.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use candle_core::Device;
use serde_json::{json, Map, Value};

use rlx_compiler::ir::Graph;
use rlx_runtime::{Batch, Context, EvalError, Geometry, Layout, Outcome};

use crate::checkpoint::{self, BaseModel, State};
use crate::config::Config;
use crate::error::{LastCheckpoint, Saved, TrainError, UpdateFailure};
use crate::model::Model;
use crate::op::Objective;
use crate::optim::{AdamW, AdamWParams};
use crate::plot;
use crate::progress::{Event, StepReport};
use crate::rng::Rng;
use crate::run_dir::{self, RecipeFile, RunDir};
use crate::sample::{generate, Completion, Settings};
use crate::task::{Prompt, SignalBatch, Task, TaskModels};
use crate::train::{
    candle_device, completion_logp, err, evaluate, loss_and_gradients, mean, supervised, Error,
    EvalSettings, Fill, LossError, Plan, RunOptions, Summary, SAMPLES_FILE, TEACHER_SEED,
};

/// A run in progress: its recipe, models, optimizer, random streams and run directory.
pub struct Trainer {
    /// The config as the run uses it (the sampler settings the recipe's `rollout` gave resolved), and as
    /// TOML (OUT/config.toml and every checkpoint's).
    config: Config,
    resolved: String,
    options: RunOptions,
    out: PathBuf,
    /// The run directory's lock, held until the trainer is dropped.
    _dir: RunDir,
    device: Device,
    graph: Graph,
    fills: Vec<Fill>,
    objective: Arc<Objective>,
    /// The group size `n` and the sampler's settings.
    n: usize,
    settings: Settings,
    recipe_files: Vec<RecipeFile>,
    task: Box<dyn Task>,
    policy: Model,
    reference: Option<Model>,
    teacher: Option<Model>,
    /// The KL monitor (`kl` in the metrics) when the recipe reads `ref_logp`.
    kl_monitor: Option<Graph>,
    eval: Vec<Prompt>,
    eval_settings: EvalSettings,
    /// A LoRA run's base model, recorded in its checkpoints.
    base: Option<BaseModel>,
    /// Steps done.
    step: usize,
    opt: AdamW,
    streams: Streams,
    /// Mean reward of every step (those before a resume included).
    rewards: Vec<f64>,
    /// The recipe's `state` values the next step reads.
    recipe_state: Vec<f64>,
    accuracy_before: Option<f64>,
    eval_before: Map<String, Value>,
    accuracy_after: Option<f64>,
    /// Steps done at the last checkpoint written (or resumed from).
    last_checkpoint: Option<usize>,
    log: RunLog,
    totals: Totals,
    started: Instant,
}

/// The random streams of the steps: prompts and sampling (the warm start's is used up before).
#[derive(Clone)]
struct Streams {
    prompt: Rng,
    sample: Rng,
}

impl Streams {
    /// The warm start's stream and the steps' streams of a run with `seed` (forked in this order).
    fn seeded(seed: u64) -> (Rng, Streams) {
        let mut rng = Rng::new(seed);
        let sft = rng.fork();
        let sample = rng.fork();
        let prompt = rng.fork();
        (sft, Streams { prompt, sample })
    }
}

/// Tokens and seconds of sampling and training over the run, and each step's seconds.
#[derive(Default)]
struct Totals {
    sample_tokens: usize,
    sample_s: f64,
    train_tokens: usize,
    train_s: f64,
    step_s: Vec<f64>,
}

/// How a run begins: from the warm start or from a checkpoint.
struct Begun {
    step: usize,
    streams: Streams,
    reference: Option<Model>,
    rewards: Vec<f64>,
    history: Vec<Map<String, Value>>,
    accuracy_before: Option<f64>,
    eval_before: Map<String, Value>,
    /// The checkpoint's recipe `state` values, with its directory (`None` on a fresh start).
    recipe_state: Option<(PathBuf, Vec<(String, f64)>)>,
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

/// What a step trains on: its samples, how many groups the recipe's `keep` kept (when it filters), and
/// its sampling rounds.
struct Sampled {
    samples: Samples,
    kept: Option<usize>,
    rounds: Rounds,
}

/// A step's sampling rounds: how many, the tokens generated and the seconds spent sampling and scoring
/// (signals, reference log-probs, the recipe's `keep`), and whether each response sampled (every
/// round, kept or not) is exactly right.
#[derive(Default)]
struct Rounds {
    count: usize,
    generated: usize,
    sample_s: f64,
    score_s: f64,
    correct: Vec<f64>,
}

/// A step's update: the first epoch's outcome (`None` when the step was skipped), the last gradient
/// norm, the tokens trained on and the seconds it took.
struct Update {
    outcome: Option<Outcome>,
    grad_norm: f64,
    tokens: usize,
    train_s: f64,
}

/// A step's metrics line (without its timing), its mean reward and the KL it reports.
struct Recorded {
    line: Map<String, Value>,
    reward: f64,
    kl: Option<f64>,
}

impl Trainer {
    /// Take the run directory `out`, record the run in it, build the models, and begin: the warm start
    /// (and the held-out evaluation before the first step), or the checkpoint of
    /// [`RunOptions::resume`]. `progress` hears what was done.
    pub fn new(
        plan: Plan,
        config: &Config,
        out: &Path,
        options: &RunOptions,
        progress: &mut impl FnMut(&Event),
    ) -> Result<Trainer, TrainError> {
        let started = Instant::now();
        let device = candle_device(plan.gpu)?;
        let dir = take_run_dir(out, options)?;
        let config = plan.resolve(config);
        let resolved = record_run(&dir, out, &plan.recipe_files, &config)?;
        let objective = Arc::new(objective(&plan, &config, &device)?);
        let Plan {
            graph,
            task,
            fills,
            group_size: n,
            temperature,
            top_p,
            recipe_files,
            ..
        } = plan;
        let policy = config
            .model
            .build(config.seed, &device, config.train.compute_dtype()?)?;
        let base = checkpoint::base_model(&config.model)?;
        let eval = task.eval_prompts(config.seed)?;
        let uses_reference = fills.contains(&Fill::RefLogp);
        let kl_monitor = uses_reference.then(kl_monitor_graph).transpose()?;
        let mut opt = AdamW::new(policy.vars(), AdamWParams::of(&config.train));
        let eval_settings = EvalSettings {
            max_new_tokens: config.sampler.max_new_tokens,
            samples: config.train.eval_samples,
            temperature: if temperature > 0.0 { temperature } else { 1.0 },
            top_p,
            seed: config.seed ^ 0x5eed_e7a1,
        };
        let (sft_rng, streams) = Streams::seeded(config.seed);
        let start = Start {
            config: &config,
            device: &device,
            policy: &policy,
            task: task.as_ref(),
            uses_reference,
        };
        let begun = match &options.resume {
            Some(dir) => start.resume(dir, &graph.params, base.as_ref(), &mut opt, progress)?,
            None => {
                let eval = (!options.skip_evaluation).then_some((&eval[..], eval_settings));
                start.warm_start(sft_rng, streams, eval, progress)?
            }
        };
        let teacher = match &config.teacher {
            Some(section) => Some(load_teacher(
                section,
                task.as_ref(),
                &config,
                &device,
                progress,
            )?),
            None => None,
        };
        let log = RunLog::open(
            out,
            begun.history,
            options.resume.as_ref().map(|_| begun.step),
        )?;
        let settings = Settings {
            temperature,
            top_p,
            max_new_tokens: config.sampler.max_new_tokens,
            stop: task.stop_tokens(),
            // The sampler's entropies fill `entropy` for the first evaluation.
            entropy: fills.contains(&Fill::Entropy),
        };
        let recipe_state = initial_state(&graph, begun.recipe_state)?;
        Ok(Trainer {
            resolved,
            options: options.clone(),
            out: out.to_path_buf(),
            _dir: dir,
            graph,
            fills,
            objective,
            n,
            settings,
            recipe_files,
            task,
            policy,
            reference: begun.reference,
            teacher,
            kl_monitor,
            eval,
            eval_settings,
            base,
            step: begun.step,
            opt,
            streams: begun.streams,
            rewards: begun.rewards,
            recipe_state,
            accuracy_before: begun.accuracy_before,
            accuracy_after: begun.accuracy_before,
            eval_before: begun.eval_before,
            last_checkpoint: options.resume.as_ref().map(|_| begun.step),
            log,
            totals: Totals::default(),
            started,
            device,
            config,
        })
    }

    /// Whether the run is over: every step done, or stopped at [`RunOptions::stop_after`].
    pub fn done(&self) -> bool {
        self.step >= self.config.steps || self.options.stop_after == Some(self.step)
    }

    /// Steps done.
    pub fn steps_done(&self) -> usize {
        self.step
    }

    /// One RL step: sample (rounds of prompts → completions → signals → reference log-probs → the
    /// recipe's `keep`), update (the recipe's kernel → backward → AdamW, per epoch), record (the metrics
    /// line, the held-out evaluation when due, the samples), then a checkpoint when one is due.
    pub fn step(&mut self) -> Result<StepReport, TrainError> {
        if self.step >= self.config.steps {
            return Err(format!("the run has done its {} steps", self.config.steps).into());
        }
        let started = Instant::now();
        // On a GPU, the step's peak memory (`gpu/peak_bytes`); nothing on the CPU.
        crate::memory::reset_gpu_peak(&self.device)?;
        let context = Context {
            step: self.step as f64,
            progress: self.step as f64 / self.config.steps.max(1) as f64,
        };
        let sampled = self.sample(&context)?;
        let update = self.update(&sampled.samples, sampled.kept, context)?;
        let Recorded {
            mut line,
            reward,
            kl,
        } = self.record(&sampled, &update)?;
        let eval_accuracy = self.evaluate_if_due(&mut line)?;
        self.write_samples(&sampled.samples, update.outcome.as_ref())?;
        let step_s = started.elapsed().as_secs_f64();
        self.write_metrics(line, step_s)?;
        self.step += 1;
        self.checkpoint_if_due()?;
        Ok(StepReport {
            step: self.step,
            steps: self.config.steps,
            reward,
            kl,
            eval_accuracy,
            step_s,
            eta_s: mean(&self.totals.step_s) * (self.config.steps - self.step) as f64,
        })
    }

    /// The run's end: when every step is done, the PNG of the curves and `summary.json`; a run stopped
    /// by [`RunOptions::stop_after`] writes neither (as if killed: its checkpoint stays as it was).
    pub fn finish(self) -> Result<Summary, TrainError> {
        if self.step < self.config.steps {
            return Ok(self.summary());
        }
        let run_name = self
            .out
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let recipe_name = self
            .recipe_files
            .first()
            .and_then(|f| f.path.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "recipe".into());
        plot::write_png(
            &self.out.join("metrics.png"),
            &format!(
                "{recipe_name} - run {run_name}: {} steps, seed {}",
                self.step, self.config.seed
            ),
            &plot::metric_panels(&self.log.history, &self.eval_before),
        )?;
        let summary = self.summary();
        let document = json!({
            "steps_done": self.step,
            "accuracy_before": summary.accuracy_before,
            "accuracy_after": summary.accuracy_after,
            "wall_s": summary.wall_s,
            "sample_tokens_per_s": summary.sample_tokens_per_s,
            "train_tokens_per_s": summary.train_tokens_per_s,
            "objective": self.objective.name(),
            "group_size": self.n,
            "temperature": self.settings.temperature,
            "top_p": self.settings.top_p,
            // The held-out evaluation before the first step (metrics.jsonl has the later ones).
            "eval_before": Value::Object(self.eval_before.clone()),
        });
        let path = self.out.join("summary.json");
        std::fs::write(&path, format!("{document:#}\n"))
            .map_err(|error| TrainError::Write { path, error })?;
        Ok(summary)
    }

    fn summary(&self) -> Summary {
        let totals = &self.totals;
        Summary {
            out: self.out.clone(),
            accuracy_before: self.accuracy_before,
            accuracy_after: self.accuracy_after,
            rewards: self.rewards.clone(),
            wall_s: self.started.elapsed().as_secs_f64(),
            sample_tokens_per_s: totals.sample_tokens as f64 / totals.sample_s.max(1e-9),
            train_tokens_per_s: totals.train_tokens as f64 / totals.train_s.max(1e-9),
            steps_done: self.step,
        }
    }

    /// Whether the recipe has `keep` filters (and the step samples in rounds).
    fn filtering(&self) -> bool {
        !self.graph.outputs.keeps.is_empty()
    }

    /// The step's samples, in sampling rounds (DAPO's dynamic sampling): when the recipe's `keep` drops
    /// groups, more prompts are sampled, up to `train.max_sampling_rounds` rounds, until
    /// `prompts_per_step` groups are kept; the step trains on those (a first round that keeps every group
    /// is used as it is).
    fn sample(&mut self, context: &Context) -> Result<Sampled, TrainError> {
        let wanted = self.config.train.prompts_per_step;
        // The random streams as the step began, saved if a signal fails (`--resume` redoes the step).
        let before = self.streams.clone();
        let mut rounds = Rounds::default();
        let (mut kept_prompts, mut kept_completions) = (Vec::new(), Vec::new());
        loop {
            rounds.count += 1;
            let (prompts, completions) = self.generate(wanted, &mut rounds)?;
            let round = self.score(prompts, completions, &before, &mut rounds)?;
            if !self.filtering() {
                return Ok(Sampled {
                    samples: round,
                    kept: None,
                    rounds,
                });
            }
            let kept = self.keep(&round.batch, context, rounds.count)?;
            let count = kept.iter().filter(|k| **k).count();
            if let Some(c) = &round.correct {
                rounds.correct.extend_from_slice(c);
            }
            if count == kept.len() && rounds.count == 1 {
                return Ok(Sampled {
                    samples: round,
                    kept: Some(count),
                    rounds,
                });
            }
            // The step trains on the kept groups only, refilled as one batch (with one round too: a
            // dropped group has advantage and gradient 0 and is outside the loss's normalisations, so
            // this is the recipe's update without a forward and backward pass over its responses).
            let n = self.n;
            for (g, _) in kept.iter().enumerate().filter(|(_, k)| **k) {
                if kept_prompts.len() < wanted {
                    kept_prompts.push(round.prompts[g].clone());
                    kept_completions.extend_from_slice(&round.completions[g * n..(g + 1) * n]);
                }
            }
            if kept_prompts.len() >= wanted || rounds.count >= self.config.train.max_sampling_rounds
            {
                if kept_prompts.is_empty() {
                    return Ok(Sampled {
                        samples: round,
                        kept: Some(0),
                        rounds,
                    });
                }
                let count = kept_prompts.len();
                let samples = self.score(kept_prompts, kept_completions, &before, &mut rounds)?;
                return Ok(Sampled {
                    samples,
                    kept: Some(count),
                    rounds,
                });
            }
        }
    }

    /// Sample: `wanted` prompts from the prompt stream and `n` completions of each from the sampling
    /// stream.
    fn generate(
        &mut self,
        wanted: usize,
        rounds: &mut Rounds,
    ) -> Result<(Vec<Prompt>, Vec<Completion>), TrainError> {
        let prompts = self.task.prompts(&mut self.streams.prompt, wanted)?;
        let ids: Vec<Vec<u32>> = prompts.iter().map(|p| p.ids.clone()).collect();
        let started = Instant::now();
        let completions = generate(
            &self.policy,
            &ids,
            self.n,
            &self.settings,
            &mut self.streams.sample,
            &self.device,
        )
        .map_err(err)?;
        rounds.sample_s += started.elapsed().as_secs_f64();
        rounds.generated += completions.iter().map(|c| c.tokens.len()).sum::<usize>();
        Ok((prompts, completions))
    }

    /// The batch the recipe sees for `prompts` and their completions (`n` per prompt, in order): the
    /// task's signals, then the reference and teacher log-probabilities when the recipe reads them. A
    /// failure (a reward program that crashes, hangs or prints garbage; a judge) stops the run before
    /// the update, with a checkpoint of the state before this step (its random streams `before`), so
    /// that `--resume` redoes the step exactly.
    fn score(
        &self,
        prompts: Vec<Prompt>,
        completions: Vec<Completion>,
        before: &Streams,
        rounds: &mut Rounds,
    ) -> Result<Samples, TrainError> {
        let started = Instant::now();
        let samples = self
            .samples(prompts, completions)
            .map_err(|cause| self.stopped_by_signals(cause, before))?;
        rounds.score_s += started.elapsed().as_secs_f64();
        Ok(samples)
    }

    fn samples(
        &self,
        prompts: Vec<Prompt>,
        completions: Vec<Completion>,
    ) -> Result<Samples, String> {
        let n = self.n;
        let rows: Vec<Vec<u32>> = prompts
            .iter()
            .flat_map(|p| std::iter::repeat_n(p.ids.clone(), n))
            .collect();
        let tokens: Vec<Vec<u32>> = completions.iter().map(|c| c.tokens.clone()).collect();
        let filled = self.signals(&prompts, &tokens)?;
        let correct: Option<Vec<f64>> = completions
            .iter()
            .enumerate()
            .map(|(r, c)| self.task.correct(&prompts[r / n], &c.tokens))
            .collect();
        let lengths: Vec<usize> = tokens.iter().map(Vec::len).collect();
        let layout = Layout::from_counts(
            &vec![n; prompts.len()],
            &lengths,
            filled.crit_counts.as_deref().unwrap_or(&[]),
            filled.dim.unwrap_or(0),
        )
        .map_err(|e| e.to_string())?;
        let frozen = |model: Option<&Model>| {
            model
                .map(|model| frozen_logp(model, &rows, &tokens, &self.device))
                .transpose()
        };
        let ref_logp = frozen(self.reference.as_ref())?;
        let teacher_logp = frozen(self.teacher.as_ref())?;
        let old_logp: Vec<f64> = completions
            .iter()
            .flat_map(|c| c.logp.iter().map(|v| *v as f64))
            .collect();
        // The sampling policy's entropies: the values a first epoch sees (as `logp` = `old_logp`).
        let entropy: Vec<f64> = completions
            .iter()
            .flat_map(|c| c.entropy.iter().map(|v| *v as f64))
            .collect();
        let columns = Columns {
            old_logp: &old_logp,
            ref_logp: ref_logp.as_deref(),
            teacher_logp: teacher_logp.as_deref(),
            entropy: &entropy,
            signals: &filled.values,
            lengths: &lengths,
        };
        let inputs = self.inputs(&columns, &layout);
        Ok(Samples {
            prompts,
            completions,
            rows,
            tokens,
            signal_values: filled.values,
            correct,
            lengths,
            ref_logp,
            old_logp,
            batch: Batch { layout, inputs },
        })
    }

    /// The task's signals for the step's completions; an error when it did not fill one it declares.
    fn signals(&self, prompts: &[Prompt], tokens: &[Vec<u32>]) -> Result<SignalBatch, String> {
        let models = TaskModels {
            policy: &self.policy,
            reference: self.reference.as_ref(),
        };
        let filled = self.task.fill(prompts, tokens, self.n, &models)?;
        if let Some(missing) = self
            .task
            .signals()
            .iter()
            .find(|s| !filled.values.iter().any(|(n, _)| n == *s))
        {
            return Err(format!(
                "step {}: the task did not fill `{missing}`",
                self.step
            ));
        }
        Ok(filled)
    }

    /// Every input of the recipe, as the plan's fills say.
    fn inputs(&self, columns: &Columns, layout: &Layout) -> Vec<Vec<f64>> {
        self.fills
            .iter()
            .zip(&self.graph.inputs)
            .map(|(fill, input)| match fill {
                Fill::Logp | Fill::OldLogp => columns.old_logp.to_vec(),
                Fill::RefLogp => columns.ref_logp.unwrap_or_default().to_vec(),
                Fill::TeacherLogp => columns.teacher_logp.unwrap_or_default().to_vec(),
                Fill::Entropy => columns.entropy.to_vec(),
                Fill::Signal(name) => columns
                    .signals
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default(),
                Fill::Length => columns.lengths.iter().map(|l| *l as f64).collect(),
                Fill::State(k) => vec![self.recipe_state[*k]],
                Fill::Default(v) => {
                    // Any shape, feature axes included (their lengths come from the layout).
                    let rubrics = self
                        .graph
                        .rubrics
                        .iter()
                        .map(|r| r.criteria.len())
                        .collect();
                    let size = Geometry::new(layout.clone(), rubrics).size(&input.shape);
                    vec![*v; size]
                }
            })
            .collect()
    }

    /// A step stopped by its signals: the state before it saved with the streams `before`.
    fn stopped_by_signals(&self, cause: String, before: &Streams) -> TrainError {
        let saved = match self.save(before) {
            Ok(checkpoint) => Saved::Checkpoint {
                checkpoint,
                out: self.out.clone(),
            },
            Err(error) => Saved::Failed {
                error: error.to_string(),
                last: self.last_checkpoint(),
            },
        };
        TrainError::Signals {
            step: self.step,
            cause,
            saved,
        }
    }

    /// Which groups of `batch` the recipe's `keep` filters keep (a group is kept when any of its
    /// responses is), from a forward evaluation with `logp` = `old_logp`, as the first epoch sees it.
    fn keep(
        &self,
        batch: &Batch,
        context: &Context,
        round: usize,
    ) -> Result<Vec<bool>, TrainError> {
        match self.objective.run(batch, context) {
            Ok(outcome) => Ok(outcome
                .kept
                .chunks(self.n)
                .map(|group| group.iter().any(|k| *k))
                .collect()),
            Err(e) if e.is_all_filtered() => Ok(vec![false; batch.layout.groups()]),
            Err(e) => Err(TrainError::Keep {
                step: self.step,
                round,
                cause: e.to_string(),
                last: self.last_checkpoint(),
            }),
        }
    }

    /// `train.epochs` updates on the step's samples (none when the recipe's `keep` dropped every
    /// group: the step is skipped).
    fn update(
        &mut self,
        samples: &Samples,
        kept: Option<usize>,
        context: Context,
    ) -> Result<Update, TrainError> {
        let epochs = if kept == Some(0) {
            0
        } else {
            self.config.train.epochs
        };
        let started = Instant::now();
        let (mut first, mut grad_norm) = (None, 0.0);
        for epoch in 0..epochs {
            let (outcome, norm) = self.epoch(samples, context, epoch)?;
            grad_norm = norm;
            first.get_or_insert(outcome);
        }
        let update = Update {
            outcome: first,
            grad_norm,
            tokens: samples.batch.layout.tokens() * epochs,
            train_s: started.elapsed().as_secs_f64(),
        };
        self.totals.train_s += update.train_s;
        self.totals.train_tokens += update.tokens;
        Ok(update)
    }

    /// One epoch: the recipe's loss and gradients (its kernel, backward through the policy), gradient
    /// clipping and AdamW; returns the outcome and the gradient norm before clipping.
    fn epoch(
        &mut self,
        samples: &Samples,
        context: Context,
        epoch: usize,
    ) -> Result<(Outcome, f64), TrainError> {
        let failed = |trainer: &Trainer, cause: UpdateFailure| TrainError::Update {
            step: trainer.step,
            epoch,
            cause,
            last: trainer.last_checkpoint(),
        };
        let (outcome, mut grads) = loss_and_gradients(
            &self.policy,
            &self.objective,
            &samples.batch,
            "logp",
            context,
            &samples.rows,
            &samples.tokens,
            self.config.train.micro_batch,
            // The first epoch's policy sampled the batch: its logp is the batch's old_logp.
            epoch == 0,
            &self.device,
        )
        .map_err(|cause| {
            let cause = match cause {
                LossError::Recipe(EvalError::NonFinite(non_finite)) => {
                    UpdateFailure::NonFinite(non_finite)
                }
                other => UpdateFailure::Recipe(other.to_string()),
            };
            failed(self, cause)
        })?;
        if let Some((parameter, value)) = grads.first_non_finite(self.policy.vars()) {
            return Err(failed(
                self,
                UpdateFailure::NonFiniteGradient { parameter, value },
            ));
        }
        let grad_norm = grads.clip(self.config.train.grad_clip);
        self.opt.step(&grads).map_err(err)?;
        if let Some((name, _)) = self.policy.vars().iter().find(|(_, v)| {
            let largest = v
                .as_tensor()
                .abs()
                .and_then(|t| t.max_all())
                .and_then(|t| t.to_scalar::<f32>());
            !matches!(largest, Ok(m) if m.is_finite())
        }) {
            let parameter = name.clone();
            return Err(failed(
                self,
                UpdateFailure::NonFiniteParameter { parameter },
            ));
        }
        Ok((outcome, grad_norm))
    }

    /// The step's metrics line (before the evaluation and the step's seconds), its mean reward, and the
    /// recipe's `state` update.
    fn record(&mut self, sampled: &Sampled, update: &Update) -> Result<Recorded, TrainError> {
        let Sampled {
            samples,
            kept,
            rounds,
        } = sampled;
        self.totals.sample_s += rounds.sample_s;
        self.totals.sample_tokens += rounds.generated;
        let outcome = update.outcome.as_ref();
        let score_mean = samples.signal_values.first().map(|(_, v)| mean(v));
        let reward = outcome
            .and_then(|o| o.reward.as_ref())
            .map(|r| mean(r))
            .or(score_mean)
            .unwrap_or(0.0);
        self.rewards.push(reward);
        let mut line = Map::new();
        line.insert("step".into(), json!(self.step));
        line.insert("reward/mean".into(), json!(reward));
        // Over every response sampled in the step (with `keep` filters, also those of dropped groups).
        let correct = match &samples.correct {
            Some(_) if self.filtering() => Some(&rounds.correct),
            other => other.as_ref(),
        };
        if let Some(correct) = correct {
            line.insert("accuracy".into(), json!(mean(correct)));
        }
        self.record_outcome(outcome, &mut line)?;
        let kl = self.record_samples(samples, &mut line)?;
        line.insert("grad_norm".into(), json!(update.grad_norm));
        if self.filtering() {
            line.insert("sampling/rounds".into(), json!(rounds.count));
            line.insert("sampling/kept_groups".into(), json!(kept));
        }
        let throughput = [
            (
                "sample_tokens_per_s",
                rounds.generated as f64 / rounds.sample_s.max(1e-9),
            ),
            (
                "train_tokens_per_s",
                update.tokens as f64 / update.train_s.max(1e-9),
            ),
            ("time/sample_s", rounds.sample_s),
            ("time/score_s", rounds.score_s),
            ("time/train_s", update.train_s),
        ];
        for (key, value) in throughput {
            line.insert(key.into(), json!(value));
        }
        let kl = kl.or_else(|| {
            outcome?
                .metrics
                .iter()
                .find(|(n, _)| n == "kl")
                .map(|(_, v)| *v)
        });
        Ok(Recorded { line, reward, kl })
    }

    /// The recipe's state as this step read it (`state/NAME`), the loss and the recipe's metrics (its
    /// state's update is `recipe/state.NAME`, which the next step reads), or the mark of a skipped step.
    fn record_outcome(
        &mut self,
        outcome: Option<&Outcome>,
        line: &mut Map<String, Value>,
    ) -> Result<(), TrainError> {
        for (info, value) in self.graph.states.iter().zip(&self.recipe_state) {
            line.insert(format!("state/{}", info.name), json_float(*value));
        }
        match outcome {
            Some(outcome) => {
                line.insert("loss".into(), json!(outcome.loss));
                for (name, value) in &outcome.metrics {
                    line.insert(format!("recipe/{name}"), json!(value));
                }
                self.recipe_state = next_state(&self.graph, outcome)?;
            }
            None => {
                line.insert("loss".into(), Value::Null);
                line.insert(
                    "skipped".into(),
                    json!("the recipe's `keep` filtered out every group: no update"),
                );
            }
        }
        Ok(())
    }

    /// The samples' metrics: each signal's mean, the KL monitor (returned), the distinct completions
    /// per group and the mean response length.
    fn record_samples(
        &self,
        samples: &Samples,
        line: &mut Map<String, Value>,
    ) -> Result<Option<f64>, TrainError> {
        for (name, values) in &samples.signal_values {
            line.insert(format!("signal/{name}/mean"), json!(mean(values)));
        }
        // k3 estimate of KL(π_old ‖ π_ref) on the sampled tokens (std/loss `k3`, token mean).
        let kl = match (&self.kl_monitor, &samples.ref_logp) {
            (Some(monitor), Some(reference)) => Some(monitor_kl(
                monitor,
                &samples.batch.layout,
                &samples.old_logp,
                reference,
            )?),
            _ => None,
        };
        if let Some(kl) = kl {
            line.insert("kl".into(), json!(kl));
        }
        let n = self.n;
        // Distinct completions per group, as a fraction of the group size.
        let distinct: Vec<f64> = samples
            .tokens
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
            json!(samples.batch.layout.tokens() as f64 / samples.lengths.len() as f64),
        );
        Ok(kl)
    }

    /// The held-out evaluation into `line`, after the last step and every `train.eval_every` steps
    /// (never with [`RunOptions::skip_evaluation`]); returns its greedy accuracy.
    fn evaluate_if_due(
        &mut self,
        line: &mut Map<String, Value>,
    ) -> Result<Option<f64>, TrainError> {
        let last = self.step + 1 == self.config.steps;
        let every = self.config.train.eval_every;
        if self.options.skip_evaluation
            || !(last || (every > 0 && (self.step + 1).is_multiple_of(every)))
        {
            return Ok(None);
        }
        let models = TaskModels {
            policy: &self.policy,
            reference: self.reference.as_ref(),
        };
        let metrics = evaluate(
            self.task.as_ref(),
            &models,
            &self.eval,
            self.eval_settings,
            &self.device,
        )
        .map_err(|cause| TrainError::Evaluation {
            step: self.step,
            cause,
            last: self.last_checkpoint(),
        })?;
        let accuracy = metrics.get("eval/accuracy").and_then(Value::as_f64);
        if accuracy.is_some() {
            self.accuracy_after = accuracy;
        }
        line.extend(metrics);
        Ok(accuracy)
    }

    /// The step's responses into samples.jsonl, every `train.samples_every` steps.
    fn write_samples(
        &mut self,
        samples: &Samples,
        outcome: Option<&Outcome>,
    ) -> Result<(), TrainError> {
        let every = self.config.train.samples_every;
        if every == 0 || !self.step.is_multiple_of(every) {
            return Ok(());
        }
        let text = sample_lines(
            self.step,
            self.task.as_ref(),
            self.n,
            &samples.rows,
            &samples.tokens,
            &samples.signal_values,
            &samples.batch.layout,
            outcome,
        );
        self.log.write_samples(&text)
    }

    /// The step's metrics line, with its seconds and (on a GPU) its peak memory, into metrics.jsonl and
    /// the TensorBoard events.
    fn write_metrics(
        &mut self,
        mut line: Map<String, Value>,
        step_s: f64,
    ) -> Result<(), TrainError> {
        line.insert("step_time_s".into(), json!(step_s));
        if let Some(peak) = crate::memory::gpu_peak_bytes(&self.device)? {
            line.insert("gpu/peak_bytes".into(), json!(peak));
        }
        self.log.write_line(line)?;
        self.totals.step_s.push(step_s);
        Ok(())
    }

    /// A checkpoint after the last step and every `train.checkpoint_every` steps.
    fn checkpoint_if_due(&mut self) -> Result<(), TrainError> {
        let every = self.config.train.checkpoint_every;
        if self.step == self.config.steps || (every > 0 && self.step.is_multiple_of(every)) {
            self.save(&self.streams)?;
            self.last_checkpoint = Some(self.step);
        }
        Ok(())
    }

    /// Write a checkpoint of the run as it is, with the random streams `streams` (the current ones, or
    /// those the step began with); returns its directory.
    fn save(&self, streams: &Streams) -> Result<PathBuf, TrainError> {
        let state = State {
            format: checkpoint::FORMAT,
            step: self.step,
            optimizer_step: self.opt.step,
            prompt_rng: streams.prompt.state(),
            sample_rng: streams.sample.state(),
            accuracy_before: self.accuracy_before,
            eval_before: self.eval_before.clone(),
            rewards: self.rewards.clone(),
            params: self.graph.params.clone(),
            has_reference: self.reference.is_some(),
            base: self.base.clone(),
            recipe_state: self
                .graph
                .states
                .iter()
                .zip(&self.recipe_state)
                .map(|(s, v)| (s.name.clone(), *v))
                .collect(),
        };
        Ok(checkpoint::save(
            &self.out,
            &state,
            &self.resolved,
            &self.log.metrics_text,
            &self.policy,
            self.reference.as_ref(),
            &self.opt,
        )?)
    }

    fn last_checkpoint(&self) -> LastCheckpoint {
        LastCheckpoint {
            step: self.last_checkpoint,
            dir: self.out.join("checkpoint"),
        }
    }
}

/// The per-token and per-response values a batch's inputs are filled from.
struct Columns<'a> {
    old_logp: &'a [f64],
    ref_logp: Option<&'a [f64]>,
    teacher_logp: Option<&'a [f64]>,
    entropy: &'a [f64],
    signals: &'a [(String, Vec<f64>)],
    lengths: &'a [usize],
}

/// How the run evaluates its recipe: the CUDA kernels on the plan's GPU, else the config's `backend`
/// (the JIT kernel, or the interpreter).
fn objective(plan: &Plan, config: &Config, device: &Device) -> Result<Objective, String> {
    Ok(match (plan.gpu, config.backend.as_str()) {
        (Some(ordinal), _) => Objective::gpu_for(&plan.graph, ordinal, device)?,
        (None, "jit") => Objective::kernel(&plan.graph).map_err(|e| e.to_string())?,
        (None, _) => Objective::interpreter(plan.graph.clone()),
    })
}

/// The run directory `out`, held until the run ends: refused while another run holds it, or when it has
/// files of another run and this one does not resume the checkpoint in it.
fn take_run_dir(out: &Path, options: &RunOptions) -> Result<RunDir, TrainError> {
    let resumed_here = match &options.resume {
        Some(dir) => {
            let checkpoint = checkpoint::locate(dir).map_err(|e| format!("--resume {e}"))?;
            same_directory(checkpoint.parent(), out)
        }
        None => false,
    };
    Ok(RunDir::take(out, resumed_here)?)
}

/// Record the run in its directory (or check, on a resume, that the recipe is the recorded one) and
/// write OUT/config.toml; returns the config as TOML.
fn record_run(
    dir: &RunDir,
    out: &Path,
    recipe_files: &[RecipeFile],
    config: &Config,
) -> Result<String, TrainError> {
    if out.join(run_dir::RECORD_FILE).is_file() {
        run_dir::check_resumed_recipe(dir, recipe_files)?;
    } else {
        run_dir::record(dir, recipe_files)?;
    }
    let resolved = config.to_toml()?;
    let path = out.join("config.toml");
    std::fs::write(&path, &resolved).map_err(|error| TrainError::Write { path, error })?;
    Ok(resolved)
}

/// What the warm start and a resume work on.
struct Start<'a> {
    config: &'a Config,
    device: &'a Device,
    policy: &'a Model,
    task: &'a dyn Task,
    /// The recipe reads `ref_logp` (a frozen copy of the warm-started policy).
    uses_reference: bool,
}

impl Start<'_> {
    /// A fresh start: the supervised warm start (from `sft_rng`), the frozen reference, and the
    /// held-out evaluation before the first step (unless `eval` is `None`).
    fn warm_start(
        &self,
        mut sft_rng: Rng,
        streams: Streams,
        eval: Option<(&[Prompt], EvalSettings)>,
        progress: &mut impl FnMut(&Event),
    ) -> Result<Begun, TrainError> {
        let (config, policy) = (self.config, self.policy);
        let started = Instant::now();
        let sft_loss = supervised(policy, self.task, config, &mut sft_rng, self.device)?;
        let reference = if self.uses_reference {
            Some(policy.frozen_copy().map_err(err)?)
        } else {
            None
        };
        let before = match eval {
            None => Map::new(),
            Some((prompts, settings)) => {
                let models = TaskModels {
                    policy,
                    reference: reference.as_ref(),
                };
                evaluate(self.task, &models, prompts, settings, self.device)
                    .map_err(|e| format!("before the first step: {e}"))?
            }
        };
        progress(&Event::Info(format!(
            "{}; {} parameters; warm start: {} steps in {:.1}s{}; held-out {}",
            self.task.name(),
            policy.parameter_count(),
            config.sft.steps,
            started.elapsed().as_secs_f64(),
            sft_loss
                .map(|l| format!(", loss {l:.4}"))
                .unwrap_or_default(),
            describe_eval(&before)
        )));
        Ok(Begun {
            step: 0,
            streams,
            reference,
            rewards: Vec::new(),
            history: Vec::new(),
            accuracy_before: before.get("eval/accuracy").and_then(Value::as_f64),
            eval_before: before,
            recipe_state: None,
        })
    }

    /// Continue from the checkpoint `dir` names: the weights, the reference, AdamW's moments (into
    /// `opt`), the random streams, the rewards and metrics lines so far. The checkpoint must be of the
    /// same recipe params (`params`), base model (`base`) and at most `steps` steps.
    fn resume(
        &self,
        dir: &Path,
        params: &[(String, f64)],
        base: Option<&BaseModel>,
        opt: &mut AdamW,
        progress: &mut impl FnMut(&Event),
    ) -> Result<Begun, TrainError> {
        let (config, policy) = (self.config, self.policy);
        let loaded = checkpoint::load(dir)?;
        let state = &loaded.state;
        if state.params != params {
            return Err(format!(
                "--resume {}: the recipe's params {params:?} differ from the checkpoint's {:?} (pass the same --set NAME=VALUE)",
                dir.display(),
                state.params
            )
            .into());
        }
        if state.step > config.steps {
            return Err(format!(
                "--resume {}: the checkpoint is at step {}, past steps = {}",
                dir.display(),
                state.step,
                config.steps
            )
            .into());
        }
        if state.base.as_ref() != base {
            return Err(format!(
                "--resume {}: the checkpoint's base model {} differs from this run's {} (a LoRA checkpoint holds only the adapters; resume with the base it was trained on)",
                dir.display(),
                describe_base(state.base.as_ref()),
                describe_base(base)
            )
            .into());
        }
        checkpoint::restore_weights(policy, &loaded.dir, "model.safetensors")?;
        let reference = if state.has_reference {
            let reference = policy.frozen_copy().map_err(err)?;
            checkpoint::restore_weights(&reference, &loaded.dir, "reference.safetensors")?;
            Some(reference)
        } else if self.uses_reference {
            return Err(format!(
                "--resume {}: the checkpoint has no reference model but the recipe reads ref_logp",
                dir.display()
            )
            .into());
        } else {
            None
        };
        let moments = checkpoint::read_tensors(&loaded.dir, "optimizer.safetensors")?;
        opt.load_state(&moments, state.optimizer_step)
            .map_err(|e| format!("checkpoint {}: {e}", loaded.dir.display()))?;
        let mut history = Vec::new();
        for (k, line) in loaded.metrics_text.lines().enumerate() {
            match serde_json::from_str::<Value>(line) {
                Ok(Value::Object(map)) => history.push(map),
                _ => {
                    return Err(format!(
                        "checkpoint {}: metrics.jsonl line {} is not a JSON object",
                        loaded.dir.display(),
                        k + 1
                    )
                    .into())
                }
            }
        }
        progress(&Event::Info(format!(
            "resumed from {} at step {}/{}",
            loaded.dir.display(),
            state.step,
            config.steps
        )));
        Ok(Begun {
            step: state.step,
            streams: Streams {
                prompt: Rng::from_state(state.prompt_rng),
                sample: Rng::from_state(state.sample_rng),
            },
            reference,
            rewards: state.rewards.clone(),
            history,
            accuracy_before: state.accuracy_before,
            eval_before: state.eval_before.clone(),
            recipe_state: Some((loaded.dir.clone(), state.recipe_state.clone())),
        })
    }
}

/// The run directory's per-step files: metrics.jsonl (and its text so far, which every checkpoint
/// holds), the same lines as TensorBoard events, and samples.jsonl.
struct RunLog {
    history: Vec<Map<String, Value>>,
    metrics_text: String,
    metrics_path: PathBuf,
    metrics: File,
    events: crate::tensorboard::EventWriter,
    samples_path: PathBuf,
    samples: File,
}

impl RunLog {
    /// Open the files of `out` with the lines `history` of the steps done. On a resume at step
    /// `resumed_at`, samples.jsonl keeps the lines of the steps before it (those of later steps, from
    /// the run that stopped, are written again by the steps that redo them); the TensorBoard events are
    /// rewritten from `history`.
    fn open(
        out: &Path,
        history: Vec<Map<String, Value>>,
        resumed_at: Option<usize>,
    ) -> Result<RunLog, TrainError> {
        let metrics_path = out.join("metrics.jsonl");
        let metrics_text: String = history
            .iter()
            .map(|line| format!("{}\n", Value::Object(line.clone())))
            .collect();
        let metrics = rewrite(&metrics_path, &metrics_text)?;
        let events = crate::tensorboard::EventWriter::create(out, &history)?;
        let samples_path = out.join(SAMPLES_FILE);
        let kept_samples = match resumed_at {
            Some(step) => samples_before(&samples_path, step)?,
            None => String::new(),
        };
        let samples = rewrite(&samples_path, &kept_samples)?;
        Ok(RunLog {
            history,
            metrics_text,
            metrics_path,
            metrics,
            events,
            samples_path,
            samples,
        })
    }

    /// A step's metrics line.
    fn write_line(&mut self, line: Map<String, Value>) -> Result<(), TrainError> {
        let text = format!("{}\n", Value::Object(line.clone()));
        self.metrics
            .write_all(text.as_bytes())
            .map_err(|error| TrainError::Write {
                path: self.metrics_path.clone(),
                error,
            })?;
        self.metrics_text.push_str(&text);
        self.events.write_line(&line)?;
        self.history.push(line);
        Ok(())
    }

    /// A step's sample lines.
    fn write_samples(&mut self, text: &str) -> Result<(), TrainError> {
        self.samples
            .write_all(text.as_bytes())
            .map_err(|error| TrainError::Write {
                path: self.samples_path.clone(),
                error,
            })
    }
}

/// `path` with the content `text`, open for appending.
fn rewrite(path: &Path, text: &str) -> Result<File, TrainError> {
    let failed = |error| TrainError::Write {
        path: path.to_path_buf(),
        error,
    };
    std::fs::write(path, text).map_err(failed)?;
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .map_err(failed)
}

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
    let outcome = rlx_runtime::evaluate(graph, &batch, &context).map_err(|e| e.to_string())?;
    outcome
        .metrics
        .iter()
        .find(|(name, _)| name == "kl")
        .map(|(_, value)| *value)
        .ok_or_else(|| "the KL monitor has no `kl` metric".to_string())
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

fn describe_base(base: Option<&checkpoint::BaseModel>) -> String {
    match base {
        None => "(none: every weight trained)".into(),
        Some(b) => format!("{} (sha256 {})", b.path, b.sha256),
    }
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
