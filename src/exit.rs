//! How `rlx` and `rlxc` commands end: one map from what went wrong to the exit status, for every
//! subcommand of both binaries (README.md, "Exit status").
//!
//! | status | meaning |
//! |---|---|
//! | 0 | done |
//! | 1 | the command ran and failed: an input with errors (a recipe's diagnostics, rollouts, a config, an artifact), a file that cannot be read or written, a failed run, a closed stdout, `rlxc fmt --check` finding a file to reformat |
//! | 2 | usage: the command line itself is wrong (clap's own errors, a bad `--set`, options that exclude each other, an output path that is refused) |

use std::process::ExitCode;

/// The command ran and failed.
pub const FAILED: u8 = 1;
/// The command line is wrong (clap exits with 2 too).
pub const USAGE: u8 = 2;

/// Why a command stops early.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The command line is wrong: exit 2, after `error: MESSAGE`.
    Usage(String),
    /// The work failed: exit 1, after `error: MESSAGE`.
    Failed(String),
    /// The work failed and the reason is already on stderr (diagnostics): exit 1.
    Reported,
}

impl Failure {
    /// The exit status of this failure.
    pub fn code(&self) -> u8 {
        match self {
            Failure::Usage(_) => USAGE,
            Failure::Failed(_) | Failure::Reported => FAILED,
        }
    }

    /// Print the message on stderr (`error: …`, unless it was reported already) and give the
    /// command's exit status.
    pub fn report(self) -> ExitCode {
        match &self {
            Failure::Usage(message) | Failure::Failed(message) => eprintln!("error: {message}"),
            Failure::Reported => {}
        }
        ExitCode::from(self.code())
    }
}

/// A command's result as its exit status.
pub fn status(result: Result<(), Failure>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => failure.report(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_map() {
        assert_eq!(Failure::Usage("x".into()).code(), 2);
        assert_eq!(Failure::Failed("x".into()).code(), 1);
        assert_eq!(Failure::Reported.code(), 1);
    }
}
