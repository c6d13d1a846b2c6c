//! The run directory `OUT` of `rlx run`: one run at a time, never a mix of two runs, and a record of what
//! produced it.
//!
//! [`RunDir::take`] creates `OUT`, takes an exclusive lock on `OUT/rlx-run.lock` (`File::try_lock`, an
//! advisory lock the operating system drops when the process ends, however it ends) with the holder's pid
//! written inside, and holds it until the run ends; a second `rlx run` into the same `OUT` is refused
//! with that pid. A directory with files of an earlier run is refused unless the run resumes the
//! checkpoint in it (`--resume OUT`): a rerun would otherwise rewrite `config.toml` and `metrics.jsonl`
//! next to the old checkpoint, `summary.json` and `metrics.png`.
//!
//! [`record`] writes `OUT/run.json` (the recipe files given to `rlx run` with their sha256, the versions
//! of rlx, rustc and candle) and a copy of the recipe file; `OUT/config.toml` is the resolved config.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

/// The lock file inside a run directory.
pub const LOCK_FILE: &str = "rlx-run.lock";

/// The record of a run, inside its directory.
pub const RECORD_FILE: &str = "run.json";

/// The versions a run records: rlx, the rustc that built it, candle (from Cargo.lock at build time).
pub fn versions() -> Value {
    json!({
        "rlx": env!("CARGO_PKG_VERSION"),
        "rustc": env!("RLX_RUSTC_VERSION"),
        "candle": env!("RLX_CANDLE_VERSION"),
    })
}

/// A recipe file given to `rlx run` (the recipe, or a compiled `.rlxc`; then the files it imported
/// from disk), with its text.
#[derive(Clone, Debug, PartialEq)]
pub struct RecipeFile {
    pub path: PathBuf,
    pub text: String,
}

impl RecipeFile {
    pub fn sha256(&self) -> String {
        rlx_compiler::export::sha256::hex_digest(self.text.as_bytes())
    }
}

/// A run directory held by this process (the lock is released on drop).
#[derive(Debug)]
pub struct RunDir {
    path: PathBuf,
    _lock: File,
}

impl RunDir {
    /// Take `out` for a run: create it, lock it, and refuse it when it holds files other than the lock
    /// unless `resuming` (the run continues from the checkpoint in `out`).
    pub fn take(out: &Path, resuming: bool) -> Result<RunDir, String> {
        std::fs::create_dir_all(out)
            .map_err(|e| format!("cannot create run directory {}: {e}", out.display()))?;
        let lock_path = out.join(LOCK_FILE);
        let io = |e: std::io::Error| format!("run directory {}: {e}", lock_path.display());
        // Not truncated before the lock is held: the file holds the pid of the run that has it.
        let mut lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(io)?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = lock.read_to_string(&mut holder);
                let pid = match holder.trim() {
                    "" => "unknown".to_string(),
                    pid => pid.to_string(),
                };
                return Err(format!(
                    "run directory {} is in use by another rlx run (pid {pid}); wait for it to end or choose another --out",
                    out.display()
                ));
            }
            Err(TryLockError::Error(e)) => return Err(io(e)),
        }
        lock.set_len(0).map_err(io)?;
        lock.seek(SeekFrom::Start(0)).map_err(io)?;
        write!(lock, "{}", std::process::id()).map_err(io)?;
        lock.flush().map_err(io)?;
        if !resuming {
            let mut others: Vec<String> = std::fs::read_dir(out)
                .map_err(|e| format!("cannot read run directory {}: {e}", out.display()))?
                .filter_map(|entry| entry.ok())
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .filter(|name| name != LOCK_FILE)
                .collect();
            if !others.is_empty() {
                others.sort();
                let has_checkpoint = crate::checkpoint::locate(out).is_ok();
                let shown = others.len().min(4);
                return Err(format!(
                    "run directory {} already holds files of another run ({}{}): {}",
                    out.display(),
                    others[..shown].join(", "),
                    if others.len() > shown { ", …" } else { "" },
                    if has_checkpoint {
                        format!(
                            "continue it with --resume {}, or choose an empty or new --out",
                            out.display()
                        )
                    } else {
                        "choose an empty or new --out (or remove it)".to_string()
                    }
                ));
            }
        }
        Ok(RunDir {
            path: out.to_path_buf(),
            _lock: lock,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The name of the copy of the recipe file in the run directory: `recipe.rlx`, or `recipe.rlxc` for a
/// compiled recipe.
fn copy_name(file: &RecipeFile) -> String {
    match file.path.extension().and_then(|e| e.to_str()) {
        Some("rlxc") => "recipe.rlxc".into(),
        _ => "recipe.rlx".into(),
    }
}

/// Write `OUT/run.json` and the copy of the recipe file.
pub fn record(dir: &RunDir, recipe: &[RecipeFile]) -> Result<(), String> {
    let write = |path: PathBuf, text: &str| {
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
    };
    let files: Vec<Value> = recipe
        .iter()
        .map(|f| json!({"path": f.path.display().to_string(), "sha256": f.sha256()}))
        .collect();
    let mut document = json!({
        "recipe": files,
        "versions": versions(),
    });
    if let Some(first) = recipe.first() {
        let name = copy_name(first);
        write(dir.path().join(&name), &first.text)?;
        document["recipe_copy"] = json!(name);
    }
    write(dir.path().join(RECORD_FILE), &format!("{document:#}\n"))
}

/// On `--resume`: the recipe file must be the one the run started with (when both are known), so a
/// run is never continued with another objective under the same params.
pub fn check_resumed_recipe(dir: &RunDir, recipe: &[RecipeFile]) -> Result<(), String> {
    let path = dir.path().join(RECORD_FILE);
    let (Some(first), Ok(text)) = (recipe.first(), std::fs::read_to_string(&path)) else {
        return Ok(());
    };
    let recorded: Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: not JSON ({e})", path.display()))?;
    match recorded["recipe"][0]["sha256"].as_str() {
        Some(sha) if sha != first.sha256() => Err(format!(
            "--resume {}: {} has sha256 {}, but the run started from a recipe with sha256 {sha} (recorded in {}); resume with the same recipe",
            dir.path().display(),
            first.path.display(),
            first.sha256(),
            path.display()
        )),
        _ => Ok(()),
    }
}
