//! Fetching a git package for `rlx fetch` and `rlx update`, with the `git` command: the one program
//! every machine that shares code already has, with the user's own credentials and proxy settings;
//! no git library is linked into rlx. A commit is cloned into a temporary folder beside its place in
//! the cache, checked out detached (symbolic links as plain files: `core.symlinks=false`), checked
//! to be that commit, stripped of `.git` and renamed into place, so the cache holds only complete
//! checkouts. The compiler itself never runs this: it reads the cache and verifies it against the lock.

use std::io::Read as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Why a fetch failed.
#[derive(Debug)]
pub enum Failure {
    /// The repository was cloned but has no such commit.
    NoCommit(String),
    /// Anything else: no `git`, the clone failed, a timeout, a file-system error.
    Other(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::NoCommit(message) | Failure::Other(message) => f.write_str(message),
        }
    }
}

/// Longest a `git` command may run: `RLX_GIT_TIMEOUT` seconds, 600 by default.
fn timeout() -> Duration {
    let seconds = std::env::var("RLX_GIT_TIMEOUT")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&s| s > 0)
        .unwrap_or(600);
    Duration::from_secs(seconds)
}

/// Run `git ARGS` (no terminal prompts, stdin closed), returning its standard output, or a message with
/// the end of its standard error.
fn git(args: &[&str], dir: Option<&Path>) -> Result<String, String> {
    let mut command = Command::new("git");
    command
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_ASKPASS", "")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(dir) = dir {
        command.current_dir(dir);
    }
    let mut child = command.spawn().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            "the `git` command was not found: install git to fetch git packages".to_string()
        } else {
            format!("cannot run `git`: {e}")
        }
    })?;
    // Drain both pipes on threads so a chatty git never blocks on a full pipe.
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let out = std::thread::spawn(move || {
        let mut text = Vec::new();
        if let Some(pipe) = stdout.as_mut() {
            let _ = pipe.take(1 << 20).read_to_end(&mut text);
        }
        text
    });
    let err = std::thread::spawn(move || {
        let mut text = Vec::new();
        if let Some(pipe) = stderr.as_mut() {
            let _ = pipe.take(1 << 20).read_to_end(&mut text);
        }
        text
    });
    let limit = timeout();
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if start.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "`git {}` ran longer than {} s (RLX_GIT_TIMEOUT)",
                    args.first().copied().unwrap_or_default(),
                    limit.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("cannot wait for `git`: {e}")),
        }
    };
    let out = String::from_utf8_lossy(&out.join().unwrap_or_default()).into_owned();
    let err = String::from_utf8_lossy(&err.join().unwrap_or_default()).into_owned();
    if status.success() {
        Ok(out)
    } else {
        let tail: Vec<&str> = err.lines().rev().take(3).collect::<Vec<_>>();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        Err(format!(
            "`git {}` failed ({status}): {}",
            args.first().copied().unwrap_or_default(),
            tail.join(" ").trim()
        ))
    }
}

/// Bring commit `rev` of `url` into `dest` (which must not exist yet).
pub fn fetch(url: &str, rev: &str, dest: &Path) -> Result<(), Failure> {
    let other = Failure::Other;
    let parent = dest
        .parent()
        .ok_or_else(|| other(format!("{} has no parent folder", dest.display())))?;
    std::fs::create_dir_all(parent)
        .map_err(|e| other(format!("cannot create {}: {e}", parent.display())))?;
    let temporary = parent.join(format!(".{rev}.{}.rlx-tmp", std::process::id()));
    let _ = std::fs::remove_dir_all(&temporary);
    let result = (|| {
        let target = temporary.to_string_lossy().into_owned();
        git(
            &[
                "-c",
                "core.symlinks=false",
                "clone",
                "--quiet",
                "--no-checkout",
                "--config",
                "core.symlinks=false",
                "--",
                url,
                &target,
            ],
            None,
        )
        .map_err(other)?;
        let commit = format!("{rev}^{{commit}}");
        if git(
            &["rev-parse", "--quiet", "--verify", &commit],
            Some(&temporary),
        )
        .is_err()
        {
            return Err(Failure::NoCommit(format!(
                "the repository {url} has no commit {rev}"
            )));
        }
        git(&["checkout", "--quiet", "--detach", rev], Some(&temporary)).map_err(other)?;
        let head = git(&["rev-parse", "HEAD"], Some(&temporary)).map_err(other)?;
        if head.trim() != rev {
            return Err(Failure::NoCommit(format!(
                "checking out {rev} of {url} gave {}",
                head.trim()
            )));
        }
        std::fs::remove_dir_all(temporary.join(".git"))
            .map_err(|e| other(format!("cannot remove the checkout's .git: {e}")))?;
        std::fs::rename(&temporary, dest).map_err(|e| {
            other(format!(
                "cannot move the checkout to {}: {e}",
                dest.display()
            ))
        })
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&temporary);
    }
    result
}
