//! Writing a command's result to stdout without panicking: `println!` panics when the reader has gone
//! (`rlx score … | head -c 1`) or the disk is full (`rlx score … > /dev/full`).
//!
//! The convention (docs/formats.md): a closed pipe (EPIPE) ends the command quietly with exit status 1,
//! as a Unix tool killed by SIGPIPE ends quietly with a nonzero status; any other write error prints one
//! line on stderr, `error: cannot write to stdout: …`, and exits 1.

use std::io::Write;
use std::process::ExitCode;

/// Write `text` to stdout and flush it; `Err` is the exit code to end the command with (the error has
/// been reported as described in the module doc).
pub fn print(text: &str) -> Result<(), ExitCode> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|error| failed(&error))
}

/// `print` as the command's exit status: success, or the code of a failed write.
pub fn print_status(text: &str) -> ExitCode {
    match print(text) {
        Ok(()) => ExitCode::SUCCESS,
        Err(code) => code,
    }
}

/// `print` of `text` and a newline.
pub fn println(text: &str) -> Result<(), ExitCode> {
    print(&format!("{text}\n"))
}

/// Report a failed write to stdout (quietly for a closed pipe) and give the exit code.
pub fn failed(error: &std::io::Error) -> ExitCode {
    if error.kind() != std::io::ErrorKind::BrokenPipe {
        eprintln!("error: cannot write to stdout: {error}");
    }
    ExitCode::from(crate::exit::FAILED)
}
