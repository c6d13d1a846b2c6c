//! The recipe a command line names: recipe text (`.rlx`, checked here, its diagnostics reported)
//! or a compiled artifact (`.rlxc`, loaded and validated; docs/formats.md). `rlx score`, `rlx
//! bench`, `rlx run` and `rlx bench-model` take either through [`load`]; `rlxc` compiles recipes
//! through [`check`].

use std::path::{Path, PathBuf};

use rlx_compiler::artifact::{self, Artifact};
use rlx_compiler::hir::Recipe;
use rlx_compiler::ir::Graph;
use rlx_compiler::Checked;

use crate::diagnostics::report;
use crate::exit::Failure;

/// A loaded recipe: checked source, or an artifact.
pub enum Source {
    /// A `.rlx` recipe that checked without errors (`checked.recipe` is `Some`).
    Recipe(Box<Checked>),
    /// A `.rlxc` artifact, with the path it was read from.
    Artifact(Box<Artifact>, PathBuf),
}

/// Check the recipe at `path`, reporting its diagnostics on stderr; a recipe with errors is
/// [`Failure::Reported`], one that cannot be read [`Failure::Failed`].
pub fn check(path: &Path) -> Result<Checked, Failure> {
    let checked = rlx_compiler::check_path(path)
        .map_err(|error| Failure::Failed(format!("cannot read {}: {error}", path.display())))?;
    report(path, &checked);
    if checked.recipe.is_none() {
        return Err(Failure::Reported);
    }
    Ok(checked)
}

/// The recipe or artifact at `path` (an artifact by its `.rlxc` extension).
pub fn load(path: &Path) -> Result<Source, Failure> {
    if artifact::is_artifact_path(path) {
        let loaded = artifact::load(path).map_err(|error| Failure::Failed(error.to_string()))?;
        Ok(Source::Artifact(Box::new(loaded), path.to_path_buf()))
    } else {
        Ok(Source::Recipe(Box::new(check(path)?)))
    }
}

impl Source {
    /// The checked recipe, for a `.rlx`.
    pub fn recipe(&self) -> Option<&Recipe> {
        match self {
            Source::Recipe(checked) => checked.recipe.as_ref(),
            Source::Artifact(..) => None,
        }
    }

    /// The artifact, for a `.rlxc`.
    pub fn artifact(&self) -> Option<&Artifact> {
        match self {
            Source::Recipe(_) => None,
            Source::Artifact(artifact, _) => Some(artifact),
        }
    }

    /// The artifact's own errors that come before any data is read: an override that does not
    /// repeat a compiled param. (A checked recipe has none; an artifact's declarations are checked
    /// when it is loaded, `rlx_core::Signature::check`.)
    pub fn validate(&self, overrides: &[(String, f64)]) -> Result<(), Failure> {
        if let Some(artifact) = self.artifact() {
            artifact
                .graph_with(overrides)
                .map_err(|error| Failure::Failed(error.to_string()))?;
        }
        Ok(())
    }

    /// The dataflow graph with `overrides` applied: the artifact's (which refuses an override of a
    /// param it compiled in with another value), or the recipe's, compiled now.
    pub fn graph(&self, overrides: &[(String, f64)], name: &Path) -> Result<Graph, Failure> {
        match self {
            Source::Artifact(artifact, _) => artifact
                .graph_with(overrides)
                .cloned()
                .map_err(|error| Failure::Failed(error.to_string())),
            Source::Recipe(checked) => {
                let recipe = checked.recipe.as_ref().ok_or(Failure::Reported)?;
                rlx_compiler::compile_graph(recipe, overrides)
                    .map_err(|message| Failure::Failed(format!("{}: {message}", name.display())))
            }
        }
    }

    /// The sources the graph's node spans point into (`rlx_compiler::ir::Site`): the checked
    /// recipe's, or those an artifact can still show (`Artifact::span_sources`).
    pub fn span_sources(&self) -> std::borrow::Cow<'_, rlx_compiler::SourceMap> {
        match self {
            Source::Recipe(checked) => std::borrow::Cow::Borrowed(&checked.sources),
            Source::Artifact(artifact, _) => std::borrow::Cow::Owned(artifact.span_sources()),
        }
    }

    /// Print a non-finite output's diagnostic (a label on the recipe expression that made it,
    /// `rlx_runtime::NonFinite`) on stderr; `false` when it has none to print (no culprit, or
    /// sources that no longer hold its span), and the caller prints the plain message.
    pub fn report_non_finite(&self, non_finite: &rlx_runtime::NonFinite) -> bool {
        let sources = self.span_sources();
        match non_finite.diagnostic(&sources) {
            Some(diagnostic) => {
                let name = sources.get(diagnostic.file).name.clone();
                crate::diagnostics::report_diagnostics(&name, &[diagnostic], &sources);
                true
            }
            None => false,
        }
    }

    /// The trainer's view of it.
    pub fn for_trainer(&self) -> Result<rlx_trainer::cli::Source<'_>, Failure> {
        match self {
            Source::Artifact(artifact, _) => Ok((&**artifact).into()),
            Source::Recipe(checked) => Ok(checked.recipe.as_ref().ok_or(Failure::Reported)?.into()),
        }
    }

    /// The files a run directory records, with their text: the file given, then the recipe's
    /// imports (an artifact is read again, through the untrusted reader at the size `load` allows).
    pub fn recorded_files(&self) -> Result<Vec<rlx_trainer::run_dir::RecipeFile>, Failure> {
        match self {
            Source::Artifact(_, path) => {
                let text = rlx_compiler::files::read_text(path, artifact::MAX_ARTIFACT_BYTES)
                    .map_err(|error| {
                        Failure::Failed(format!("cannot read {}: {error}", path.display()))
                    })?;
                Ok(vec![rlx_trainer::run_dir::RecipeFile {
                    path: path.clone(),
                    text,
                }])
            }
            Source::Recipe(checked) => Ok(checked
                .disk_files()
                .into_iter()
                .map(|(path, text)| rlx_trainer::run_dir::RecipeFile {
                    path: path.to_path_buf(),
                    text: text.to_string(),
                })
                .collect()),
        }
    }
}
