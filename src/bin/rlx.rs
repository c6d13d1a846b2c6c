//! `rlx`: the rlx runtime's command line.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use rlx::diagnostics::render_human;

/// The rlx runtime: apply compiled recipes to rollouts.
#[derive(Parser)]
#[command(name = "rlx", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Score rollouts from any trainer with a recipe: rewards, advantages, loss, metrics, gradients.
    ///
    /// The rollout file has one JSON object per line, one per response: `"group"` names its prompt and
    /// every other key is a recipe input (see docs/formats.md). Exit status: 0 on success, 1 when the
    /// recipe or the rollouts have an error (nothing is written to --out then), 2 on a usage error.
    Score {
        /// The recipe (.rlx).
        recipe: PathBuf,
        /// The rollouts (JSON lines).
        #[arg(long)]
        rollouts: PathBuf,
        /// Override a param: `--set beta=0.01` (repeatable).
        #[arg(long = "set", value_name = "NAME=VALUE")]
        set: Vec<String>,
        /// Also output ∂loss/∂input for every `policy`/`value` input.
        #[arg(long)]
        grad: bool,
        /// Write the JSON document here instead of stdout.
        #[arg(long)]
        out: Option<PathBuf>,
        /// `jit` (compiled kernels; falls back to the interpreter, with a warning, for a recipe they do
        /// not support) or `interp` (the reference interpreter).
        #[arg(long, value_enum, default_value_t = BackendArg::Jit)]
        backend: BackendArg,
    },
    /// Train a policy with a recipe: sample, score, apply the compiled recipe, backpropagate, step.
    ///
    /// With no --config, the embedded default (configs/default.toml) trains a tiny Llama-style policy on
    /// a generated arithmetic task, after a short supervised warm start. Metrics go to
    /// OUT/metrics.jsonl, one line per step (see docs/training.md).
    Run {
        /// The recipe (.rlx).
        recipe: PathBuf,
        /// A TOML config replacing the embedded default (every key required, unknown keys are errors).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Override a recipe param (`--set beta=0.01`) or a config key (`--set train.lr=1e-3`).
        #[arg(long = "set", value_name = "NAME=VALUE")]
        set: Vec<String>,
        /// Number of RL steps.
        #[arg(long)]
        steps: Option<usize>,
        /// Seed for weights, prompts and sampling.
        #[arg(long)]
        seed: Option<u64>,
        /// Output directory (default runs/<recipe>-<unix time>).
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BackendArg {
    Interp,
    Jit,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Score {
            recipe,
            rollouts,
            set,
            grad,
            out,
            backend,
        } => {
            let backend = match backend {
                BackendArg::Interp => rlx_runtime::score::Backend::Interp,
                BackendArg::Jit => rlx_runtime::score::Backend::Jit,
            };
            score(&recipe, &rollouts, &set, grad, out.as_deref(), backend)
        }
        Command::Run {
            recipe,
            config,
            set,
            steps,
            seed,
            out,
        } => run(&recipe, config.as_deref(), set, steps, seed, out),
    }
}

/// Check the recipe, printing its diagnostics; `None` when it has errors or cannot be read.
fn checked_recipe(recipe: &Path) -> Option<rlx_compiler::hir::Recipe> {
    let checked = match rlx_compiler::check_path(recipe) {
        Ok(checked) => checked,
        Err(error) => {
            eprintln!("error: cannot read {}: {error}", recipe.display());
            return None;
        }
    };
    if !checked.diagnostics.is_empty() {
        let color = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        eprint!(
            "{}",
            render_human(
                &recipe.display().to_string(),
                &checked.diagnostics,
                &checked.sources,
                color
            )
        );
    }
    checked.recipe
}

fn run(
    recipe: &Path,
    config: Option<&Path>,
    sets: Vec<String>,
    steps: Option<usize>,
    seed: Option<u64>,
    out: Option<PathBuf>,
) -> ExitCode {
    let Some(hir) = checked_recipe(recipe) else {
        return ExitCode::from(1);
    };
    let config_text = match config {
        None => None,
        Some(path) => match std::fs::read_to_string(path) {
            Ok(text) => Some(text),
            Err(error) => {
                eprintln!("error: cannot read {}: {error}", path.display());
                return ExitCode::from(1);
            }
        },
    };
    let args = rlx_trainer::cli::RunArgs {
        recipe_name: recipe
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "run".into()),
        config_text,
        sets,
        steps,
        seed,
        out,
    };
    let prepared = match rlx_trainer::cli::prepare(&hir, &args) {
        Ok(prepared) => prepared,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(1);
        }
    };
    eprintln!("rlx run: writing {}", prepared.out.display());
    match rlx_trainer::train::run(prepared.plan, &prepared.config, &prepared.out, |line| {
        eprintln!("{line}")
    }) {
        Ok(summary) => {
            eprintln!(
                "done in {:.1}s: greedy accuracy {:.3} -> {:.3}; sampling {:.0} tokens/s, training {:.0} tokens/s; metrics in {}",
                summary.wall_s,
                summary.accuracy_before,
                summary.accuracy_after,
                summary.sample_tokens_per_s,
                summary.train_tokens_per_s,
                summary.out.join("metrics.jsonl").display()
            );
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(1)
        }
    }
}

fn score(
    recipe: &Path,
    rollouts: &Path,
    set: &[String],
    grad: bool,
    out: Option<&Path>,
    backend: rlx_runtime::score::Backend,
) -> ExitCode {
    let overrides: Vec<(String, f64)> = match set.iter().map(|s| rlx::parse_override(s)).collect() {
        Ok(overrides) => overrides,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(2);
        }
    };
    let checked = match rlx_compiler::check_path(recipe) {
        Ok(checked) => checked,
        Err(error) => {
            eprintln!("error: cannot read {}: {error}", recipe.display());
            return ExitCode::from(1);
        }
    };
    if !checked.diagnostics.is_empty() {
        let color = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        eprint!(
            "{}",
            render_human(
                &recipe.display().to_string(),
                &checked.diagnostics,
                &checked.sources,
                color
            )
        );
    }
    let Some(hir) = checked.recipe else {
        return ExitCode::from(1);
    };
    let text = match std::fs::read_to_string(rollouts) {
        Ok(text) => text,
        Err(error) => {
            eprintln!("error: cannot read {}: {error}", rollouts.display());
            return ExitCode::from(1);
        }
    };
    let scored =
        match rlx_runtime::score::score_with_backend(&hir, &text, &overrides, grad, backend) {
            Ok(scored) => scored,
            Err(message) => {
                eprintln!("error: {}: {message}", rollouts.display());
                return ExitCode::from(1);
            }
        };
    if let Some(fallback) = &scored.fallback {
        eprintln!("warning: {}: {fallback}", recipe.display());
    }
    for warning in &scored.warnings {
        eprintln!("warning: {}: {warning}", rollouts.display());
    }
    let document = scored.document.to_string();
    match out {
        None => println!("{document}"),
        Some(path) => {
            if let Err(error) = rlx::write_atomically(path, &(document + "\n")) {
                eprintln!("error: cannot write {}: {error}", path.display());
                return ExitCode::from(1);
            }
        }
    }
    ExitCode::SUCCESS
}
