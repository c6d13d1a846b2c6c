//! `rlx`: the rlx runtime's command line.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    },
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
        } => score(&recipe, &rollouts, &set, grad, out.as_deref()),
    }
}

fn score(
    recipe: &Path,
    rollouts: &Path,
    set: &[String],
    grad: bool,
    out: Option<&Path>,
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
    let scored = match rlx_runtime::score::score(&hir, &text, &overrides, grad) {
        Ok(scored) => scored,
        Err(message) => {
            eprintln!("error: {}: {message}", rollouts.display());
            return ExitCode::from(1);
        }
    };
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
