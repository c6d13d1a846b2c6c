//! Shared pieces of the `rlx` and `rlxc` command lines.

pub mod diagnostics;
pub mod output;

use std::path::{Path, PathBuf};

/// Write through a temporary file and a rename, so an interrupted run never leaves half a file.
pub fn write_atomically(path: &Path, contents: &str) -> std::io::Result<()> {
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".rlx-tmp");
    let temporary = PathBuf::from(temporary);
    std::fs::write(&temporary, contents)?;
    std::fs::rename(&temporary, path)
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
