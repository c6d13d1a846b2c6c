//! What `rlx run` does with its arguments: the config (embedded default or `--config FILE`), `--set`
//! split between config keys (`section.key`, or a top-level key) and recipe params, `--steps`/`--seed`/
//! `--out`, `--resume`, `--device`, all validated before anything trains.

use std::path::PathBuf;

use rlx_compiler::artifact::Artifact;
use rlx_compiler::hir::Recipe;

use crate::checkpoint;
use crate::config::{config_keys, Config, TrainDevice, DEFAULT_CONFIG};
use crate::progress::Event;
use crate::train::{
    plan, plan_graph, run_with, unused_rollout_settings, Plan, RunOptions, Summary,
};

/// The command line of `rlx run`, parsed by the binary.
#[derive(Clone, Debug, Default)]
pub struct RunArgs {
    pub recipe_name: String,
    pub config_text: Option<String>,
    pub sets: Vec<String>,
    pub steps: Option<usize>,
    pub seed: Option<u64>,
    pub out: Option<PathBuf>,
    /// Continue from a checkpoint (a run directory or its `checkpoint/`).
    pub resume: Option<PathBuf>,
    /// `--device`: where the step runs, overriding the config's `train.device` (`None`: the config's).
    /// On GPU N the model, sampler, reference, LM head, AdamW and the recipe's CUDA kernels all run
    /// there (whatever the config's `backend`); on the CPU the recipe runs on the config's `backend`.
    pub device: Option<TrainDevice>,
    /// The recipe file given to `rlx run` (then the files it imports from disk), recorded with its
    /// sha256 in the run directory (`run_dir::record`).
    pub recipe_files: Vec<crate::run_dir::RecipeFile>,
}

/// What `rlx run` trains: a checked recipe (`.rlx`) or a compiled one (`.rlxc`).
#[derive(Clone, Copy)]
pub enum Source<'a> {
    Recipe(&'a Recipe),
    Artifact(&'a Artifact),
}

impl<'a> From<&'a Recipe> for Source<'a> {
    fn from(recipe: &'a Recipe) -> Source<'a> {
        Source::Recipe(recipe)
    }
}

impl<'a> From<&'a Artifact> for Source<'a> {
    fn from(artifact: &'a Artifact) -> Source<'a> {
        Source::Artifact(artifact)
    }
}

impl Source<'_> {
    fn has_param(&self, name: &str) -> bool {
        match self {
            Source::Recipe(recipe) => recipe.params.iter().any(|p| p.name == name),
            Source::Artifact(artifact) => artifact.params.iter().any(|p| p.name == name),
        }
    }

    /// The message for `--set NAME=…` naming neither a config key nor a param.
    fn unknown_param(&self, name: &str) -> String {
        let message = match self {
            Source::Recipe(recipe) => {
                rlx_compiler::ir::lower::param_values(recipe, &[(name.into(), 0.0)]).err()
            }
            Source::Artifact(artifact) => artifact
                .graph_with(&[(name.into(), 0.0)])
                .err()
                .map(|e| e.message),
        };
        message.unwrap_or_else(|| format!("unknown param `{name}`"))
    }

    fn plan(&self, overrides: &[(String, f64)], config: &Config) -> Result<Plan, String> {
        match self {
            Source::Recipe(recipe) => plan(recipe, overrides, config),
            Source::Artifact(artifact) => {
                let graph = artifact.graph_with(overrides).map_err(|e| e.message)?;
                plan_graph(graph.clone(), artifact.rollout.clone(), config)
            }
        }
    }
}

/// A run ready to start.
pub struct Prepared {
    pub config: Config,
    pub plan: Plan,
    pub out: PathBuf,
    pub options: RunOptions,
    /// Notes for the user before the run starts: the recipe's rollout settings `rlx run` does not
    /// apply.
    pub notes: Vec<String>,
}

impl Prepared {
    /// The config as the run uses it (`OUT/config.toml`): the sampler settings the recipe's `rollout`
    /// gives where the config leaves them to it (`n = 0`, `temperature < 0`, `top_p = 0`).
    pub fn resolved_config(&self) -> Config {
        self.plan.resolve(&self.config)
    }

    /// Train as prepared: `train::run_with` on its plan, config, output folder and options.
    pub fn run(self, progress: impl FnMut(&Event)) -> Result<Summary, String> {
        run_with(self.plan, &self.config, &self.out, &self.options, progress)
    }
}

fn parse_number(name: &str, value: &str) -> Result<f64, String> {
    match value.trim() {
        "true" => Ok(1.0),
        "false" => Ok(0.0),
        number => number
            .parse::<f64>()
            .map_err(|_| format!("--set {name}: `{number}` is not a number, `true` or `false`")),
    }
}

pub fn prepare<'a>(source: impl Into<Source<'a>>, args: &RunArgs) -> Result<Prepared, String> {
    let source = source.into();
    let top_level: Vec<String> = config_keys()
        .into_iter()
        .filter(|k| !k.contains('.'))
        .collect();
    let mut config_sets = Vec::new();
    let mut param_sets = Vec::new();
    for set in &args.sets {
        let (name, value) = set
            .split_once('=')
            .ok_or_else(|| format!("--set expects NAME=VALUE, got `{set}`"))?;
        let (name, value) = (name.trim(), value.trim());
        if name.contains('.') || top_level.iter().any(|k| k == name) {
            config_sets.push((name.to_string(), value.to_string()));
        } else if source.has_param(name) {
            param_sets.push((name.to_string(), parse_number(name, value)?));
        } else {
            let message = source.unknown_param(name);
            return Err(format!(
                "--set {name}: {message}; config keys are written `section.key` (e.g. `train.lr`)"
            ));
        }
    }
    let loaded = match &args.resume {
        None => None,
        Some(dir) => {
            let conflict = if args.config_text.is_some() {
                Some("--config".to_string())
            } else if args.seed.is_some() {
                Some("--seed".to_string())
            } else {
                config_sets.first().map(|(k, _)| format!("--set {k}"))
            };
            if let Some(flag) = conflict {
                return Err(format!(
                    "--resume continues with the checkpoint's config; {flag} cannot change it (only --steps and the recipe's params, which must match, may be given)"
                ));
            }
            checkpoint::locate(dir).map_err(|e| format!("--resume {e}"))?;
            Some(checkpoint::load(dir)?)
        }
    };
    if let Some(steps) = args.steps {
        config_sets.push(("steps".into(), steps.to_string()));
    }
    if let Some(seed) = args.seed {
        config_sets.push(("seed".into(), seed.to_string()));
    }
    let text = match &loaded {
        Some(loaded) => loaded.config_text.as_str(),
        None => args.config_text.as_deref().unwrap_or(DEFAULT_CONFIG),
    };
    let mut config = Config::parse(text, &config_sets)?;
    if let Some(device) = args.device {
        // Recorded in OUT/config.toml (and a checkpoint's config) as the run's device.
        config.train.device = device.to_string();
    }
    let device =
        TrainDevice::parse(&config.train.device).map_err(|e| format!("config: train.{e}"))?;
    let mut plan = source.plan(&param_sets, &config)?;
    plan.recipe_files = args.recipe_files.clone();
    if let Some(ordinal) = device.gpu() {
        // The feature, the driver and the GPU, before anything is written (the kernels themselves
        // are compiled when the run starts).
        rlx_runtime::probe_gpu(ordinal)?;
        plan.gpu = Some(ordinal);
    }
    let resumed_out = loaded
        .as_ref()
        .and_then(|l| l.dir.parent().map(|p| p.to_path_buf()));
    let out = match (&args.out, resumed_out) {
        (Some(out), _) => out.clone(),
        (None, Some(run_dir)) => run_dir,
        (None, None) if !config.out.is_empty() => PathBuf::from(&config.out),
        (None, None) => {
            let time = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            PathBuf::from(format!("runs/{}-{time}", args.recipe_name))
        }
    };
    let options = RunOptions {
        resume: loaded.map(|l| l.dir),
        stop_after: None,
        skip_evaluation: false,
    };
    let notes = unused_rollout_settings(&plan.rollout);
    Ok(Prepared {
        config,
        plan,
        out,
        options,
        notes,
    })
}
