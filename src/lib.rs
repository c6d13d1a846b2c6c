//! Shared pieces of the `rlx` and `rlxc` command lines.

pub mod diagnostics;
pub mod exit;
pub mod output;
pub mod packages;
pub mod source;

pub use rlx_compiler::files::write_output;

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

/// Every `--set NAME=VALUE` of a command line ([`parse_override`]); on the first bad one, its message on
/// standard error and the usage exit code (2) for the command to return.
pub fn parse_overrides(set: &[String]) -> Result<Vec<(String, f64)>, std::process::ExitCode> {
    overrides(set).map_err(exit::Failure::report)
}

/// Every `--set NAME=VALUE` of a command line; the first bad one is a usage error.
pub fn overrides(set: &[String]) -> Result<Vec<(String, f64)>, exit::Failure> {
    set.iter()
        .map(|s| parse_override(s))
        .collect::<Result<_, _>>()
        .map_err(exit::Failure::Usage)
}
