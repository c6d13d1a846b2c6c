//! Shared pieces of the `rlx` and `rlxc` command lines.

pub mod diagnostics;
pub mod output;

use std::io::Write;
use std::process::ExitCode;

pub use rlx_compiler::files::write_output;

/// Print `text` to standard output and say how that went: a full disk or a closed pipe is an exit
/// status, never a panic (`print!` panics on a failed write). A closed pipe (`| head`) exits with
/// status 1 quietly; any other failure prints one line on stderr.
pub fn print_stdout(text: &str) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::from(1),
        Err(error) => {
            let _ = writeln!(
                std::io::stderr(),
                "error: cannot write standard output: {error}"
            );
            ExitCode::from(1)
        }
    }
}

/// Parse `--set NAME=VALUE`: a number, `true`, `false`, `inf` or `-inf`.
pub fn parse_override(text: &str) -> Result<(String, f64), String> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| format!("--set expects NAME=VALUE, got `{text}`"))?;
    let value = match value.trim() {
        "true" => 1.0,
        "false" => 0.0,
        "inf" => f64::INFINITY,
        "-inf" => f64::NEG_INFINITY,
        number => number.parse::<f64>().map_err(|_| {
            format!("--set {name}: `{number}` is not a number, `true`, `false` or `inf`")
        })?,
    };
    Ok((name.trim().to_string(), value))
}
