//! Running `rlxc` and `rlx` as child processes with a deadline, for tests of inputs that used to hang
//! (a FIFO) or blow up (a huge file). Each test binary uses a part of this module.
#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Longer than any of these commands takes on a loaded machine, short enough to fail a hang quickly.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// A fresh scratch folder for one test.
pub fn scratch(name: &str) -> PathBuf {
    let directory =
        std::env::temp_dir().join(format!("rlx-child-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&directory);
    std::fs::create_dir_all(&directory).unwrap();
    directory
}

/// Run `command` (stdin closed, stdout and stderr captured) and kill it if it outlives `DEADLINE`:
/// a hang fails the test instead of stalling it.
pub fn run_bounded(command: &mut Command) -> Output {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    // Drain both pipes on threads, so a chatty child cannot block on a full pipe.
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stdout.read_to_end(&mut bytes);
        bytes
    });
    let err = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stderr.read_to_end(&mut bytes);
        bytes
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{command:?} still running after {DEADLINE:?}: it hangs");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

pub fn rlxc() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rlxc"));
    command.env("NO_COLOR", "1");
    command
}

pub fn rlx() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rlx"));
    command.env("NO_COLOR", "1");
    command
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The largest resident set of any child this test process has waited for, in bytes.
#[cfg(unix)]
pub fn peak_child_rss() -> u64 {
    // SAFETY: getrusage writes one `rusage` into the zeroed struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage);
        usage
    };
    // Linux reports kilobytes.
    usage.ru_maxrss as u64 * 1024
}

/// Make a FIFO at `path`.
#[cfg(unix)]
pub fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo runs");
    assert!(status.success(), "mkfifo {}", path.display());
}

/// A sparse file of `len` bytes starting with `head`.
pub fn sparse_file(path: &Path, head: &[u8], len: u64) {
    std::fs::write(path, head).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}
