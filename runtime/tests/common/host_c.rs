//! Host C for the suites that run CUDA C on the CPU under the portability header (tests/cuda.rs and
//! trainer/tests/device_kernels.rs, through `#[path]`): the compiler call that builds a shared library,
//! and the signature of the `rlx_host_*` launchers `RLX_HOST_LAUNCHER` defines.

#![allow(dead_code)]

use std::ffi::{c_int, c_void};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A kernel's host launcher: the pointer table, the group range, grid and block.
pub type HostLaunch = unsafe extern "C" fn(
    table: *const *mut c_void,
    g_begin: u64,
    g_end: u64,
    grid: u32,
    block: u32,
) -> c_int;

/// `text` compiled by `$CC` (else `cc`) as C11 into `dir/kernels.so`, warnings as errors except
/// `allowed` (e.g. `-Wno-unused-function`); the compiler's messages on failure.
pub fn shared_library(text: &str, dir: &Path, allowed: &[&str]) -> Result<PathBuf, String> {
    let c = dir.join("kernels.c");
    let library = dir.join("kernels.so");
    std::fs::write(&c, text).map_err(|e| e.to_string())?;
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let output = Command::new(&compiler)
        .args([
            "-std=c11", "-O1", "-shared", "-fPIC", "-pthread", "-Wall", "-Werror",
        ])
        .args(allowed)
        .arg("-o")
        .arg(&library)
        .arg(&c)
        .arg("-lm")
        .output()
        .map_err(|e| format!("cannot run {compiler}: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "{compiler} rejected {}:\n{}",
            c.display(),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(library)
}
