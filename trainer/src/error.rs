//! The errors of the training loop ([`crate::trainer::Trainer`]): which step stopped, at which stage,
//! why, and where the run can be continued from — as values, so that a caller decides on them (resume
//! from the checkpoint the error names, report the step) without reading the message. Each error's
//! message ([`std::fmt::Display`]) is the one `rlx run` prints.

use std::fmt;
use std::path::{Path, PathBuf};

/// Why a run stopped.
#[derive(Debug)]
pub enum TrainError {
    /// The config, the recipe, a model, a task, the run directory or a checkpoint: the message says what
    /// and where (the trainer's modules report these as messages).
    Message(String),
    /// A file of the run directory could not be written.
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
    /// Step `step`'s signals (a reward program that crashed, hung or printed garbage; a judge) or its
    /// reference or teacher log-probabilities failed: nothing of the step was applied, and the state
    /// before it was saved (or saving failed, [`Saved`]).
    Signals {
        step: usize,
        cause: String,
        saved: Saved,
    },
    /// The recipe failed on sampling round `round` (1-based) of step `step`, evaluated for its `keep`
    /// filters: nothing of the step was applied.
    Keep {
        step: usize,
        round: usize,
        cause: String,
        last: LastCheckpoint,
    },
    /// Epoch `epoch` of step `step`'s update failed (the parameters hold the earlier epochs' updates,
    /// and this one's when a parameter became non-finite): the run continues from the last checkpoint.
    Update {
        step: usize,
        epoch: usize,
        cause: UpdateFailure,
        last: LastCheckpoint,
    },
    /// The held-out evaluation after step `step`'s update failed.
    Evaluation {
        step: usize,
        cause: String,
        last: LastCheckpoint,
    },
}

/// What went wrong in an epoch of the update.
#[derive(Clone, Debug, PartialEq)]
pub enum UpdateFailure {
    /// The recipe's evaluation, or the backward pass through it, failed (a non-finite loss or
    /// ∂loss/∂logp; its message says which).
    Recipe(String),
    /// An output of the recipe (its loss, ∂loss/∂logp, …) is not finite: which, and the recipe
    /// expression that made it (`rlx_runtime::NonFinite`), which `rlx run` shows.
    NonFinite(Box<rlx_runtime::NonFinite>),
    /// The gradient of a parameter is not finite.
    NonFiniteGradient { parameter: String, value: f32 },
    /// A parameter is not finite after AdamW's step.
    NonFiniteParameter { parameter: String },
}

/// The checkpoint a step that failed before its update wrote of the state before it.
#[derive(Debug)]
pub enum Saved {
    /// Saved in `checkpoint` (in the run directory `out`): `--resume out` redoes the step exactly.
    Checkpoint { checkpoint: PathBuf, out: PathBuf },
    /// Saving failed with `error`; `last` is what is left.
    Failed { error: String, last: LastCheckpoint },
}

/// The last checkpoint the run wrote: after step `step` in `dir`, or none yet.
#[derive(Clone, Debug, PartialEq)]
pub struct LastCheckpoint {
    pub step: Option<usize>,
    /// The run directory's `checkpoint/`.
    pub dir: PathBuf,
}

impl TrainError {
    /// The step that failed, for an error of a step.
    pub fn step(&self) -> Option<usize> {
        match self {
            TrainError::Message(_) | TrainError::Write { .. } => None,
            TrainError::Signals { step, .. }
            | TrainError::Keep { step, .. }
            | TrainError::Update { step, .. }
            | TrainError::Evaluation { step, .. } => Some(*step),
        }
    }

    /// The checkpoint the run can be continued from after this error (`--resume` of its run directory),
    /// with the number of steps it holds: the state before the failed step when a signal failed, else
    /// the last checkpoint written; `None` when there is none or the error is not a step's.
    pub fn checkpoint(&self) -> Option<(usize, &Path)> {
        let last = match self {
            TrainError::Message(_) | TrainError::Write { .. } => return None,
            TrainError::Signals {
                step,
                saved: Saved::Checkpoint { checkpoint, .. },
                ..
            } => return Some((*step, checkpoint)),
            TrainError::Signals {
                saved: Saved::Failed { last, .. },
                ..
            }
            | TrainError::Keep { last, .. }
            | TrainError::Update { last, .. }
            | TrainError::Evaluation { last, .. } => last,
        };
        Some((last.step?, &last.dir))
    }
}

impl fmt::Display for TrainError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrainError::Message(message) => f.write_str(message),
            TrainError::Write { path, error } => {
                write!(f, "cannot write {}: {error}", path.display())
            }
            TrainError::Signals {
                step,
                cause,
                saved: Saved::Checkpoint { checkpoint, out },
            } => write!(
                f,
                "step {step}: {cause}\nthe run stopped before the step's update; the state before step {step} is saved in {}: fix the cause, then continue with `--resume {}`",
                checkpoint.display(),
                out.display()
            ),
            TrainError::Signals {
                step,
                cause,
                saved: Saved::Failed { error, last },
            } => write!(
                f,
                "step {step}: {cause}\nthe run stopped before the step's update, and saving a checkpoint failed ({error}); {last}"
            ),
            TrainError::Keep {
                step,
                round,
                cause,
                last,
            } => write!(
                f,
                "step {step} (sampling round {round}): recipe: {cause}; the run stopped before the update; {last}"
            ),
            TrainError::Update {
                step,
                epoch,
                cause,
                last,
            } => write!(
                f,
                "step {step} (epoch {epoch}): {cause}; the run stopped before the update; {last}"
            ),
            TrainError::Evaluation { step, cause, last } => write!(
                f,
                "step {step}: {cause}; the run stopped after the step's update; {last}"
            ),
        }
    }
}

impl fmt::Display for UpdateFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UpdateFailure::Recipe(message) => f.write_str(message),
            UpdateFailure::NonFinite(non_finite) => write!(f, "recipe: {non_finite}"),
            UpdateFailure::NonFiniteGradient { parameter, value } => {
                write!(f, "the gradient of parameter `{parameter}` has {value}")
            }
            UpdateFailure::NonFiniteParameter { parameter } => {
                write!(
                    f,
                    "parameter `{parameter}` became non-finite after the update"
                )
            }
        }
    }
}

impl fmt::Display for LastCheckpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.step {
            Some(step) => write!(
                f,
                "the last good checkpoint (after step {step}) is in {}",
                self.dir.display()
            ),
            None => f.write_str("no checkpoint was written yet"),
        }
    }
}

impl TrainError {
    /// The recipe's non-finite output that stopped the run, when that is why it stopped.
    pub fn non_finite(&self) -> Option<&rlx_runtime::NonFinite> {
        match self {
            TrainError::Update {
                cause: UpdateFailure::NonFinite(non_finite),
                ..
            } => Some(non_finite),
            _ => None,
        }
    }
}

impl std::error::Error for TrainError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TrainError::Write { error, .. } => Some(error),
            _ => None,
        }
    }
}

impl From<String> for TrainError {
    fn from(message: String) -> TrainError {
        TrainError::Message(message)
    }
}

/// The message, for the callers of [`crate::train::run_with`] (which reports errors as text).
impl From<TrainError> for String {
    fn from(error: TrainError) -> String {
        error.to_string()
    }
}
