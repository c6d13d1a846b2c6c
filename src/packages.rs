//! `rlx update`, `rlx fetch`, `rlxc check DIR` and `rlxc doc DIR`: the command-line side of packages
//! (docs/sharing.md); the work is `rlx_compiler::packages`'s.

use std::path::Path;
use std::process::ExitCode;

use rlx_compiler::packages::{self, Outcome};

use crate::diagnostics::report_diagnostics;

fn finish(dir: &Path, outcome: &Outcome, done: impl FnOnce(&packages::Workspace)) -> ExitCode {
    report_diagnostics(
        &dir.display().to_string(),
        &outcome.diagnostics,
        &outcome.sources,
    );
    match &outcome.workspace {
        Some(workspace) if !outcome.has_errors() => {
            done(workspace);
            ExitCode::SUCCESS
        }
        _ => crate::exit::Failure::Reported.report(),
    }
}

fn summary(workspace: &packages::Workspace) -> String {
    let names: Vec<String> = workspace
        .packages
        .iter()
        .map(|p| format!("{} {}", p.manifest.name, p.manifest.version))
        .collect();
    if names.is_empty() {
        "no dependencies".into()
    } else {
        names.join(", ")
    }
}

/// `rlx update [DIR]`: resolve from the manifests, fetch git packages, write `rlx.lock`.
pub fn update(dir: &Path) -> ExitCode {
    let outcome = packages::update(dir);
    finish(dir, &outcome, |workspace| {
        eprintln!(
            "locked {} in {}: {}",
            workspace.packages.len(),
            workspace.root.dir.join(packages::LOCK).display(),
            summary(workspace)
        );
    })
}

/// `rlx fetch [DIR]`: bring the locked git packages into the cache and verify every package.
pub fn fetch(dir: &Path) -> ExitCode {
    let outcome = packages::fetch(dir);
    finish(dir, &outcome, |workspace| {
        eprintln!(
            "verified against {}: {}",
            packages::LOCK,
            summary(workspace)
        );
    })
}

/// `rlxc check DIR`: the package's dependencies (against the lock) and every `.rlx` file it
/// provides. Returns (any error, the files' check results) for the caller's output format.
pub fn check_package(
    dir: &Path,
) -> Result<(bool, Vec<(std::path::PathBuf, rlx_compiler::Checked)>), String> {
    let outcome = packages::resolve_at(dir, packages::Mode::Locked);
    let mut any_error = outcome.has_errors();
    report_diagnostics(
        &dir.display().to_string(),
        &outcome.diagnostics,
        &outcome.sources,
    );
    let Some(root) = packages::find_manifest(dir) else {
        return Ok((true, Vec::new()));
    };
    let files = packages::package_files(&root)?;
    let mut checked = Vec::new();
    for path in files.keys().filter(|p| p.ends_with(".rlx")) {
        let full = root.join(path);
        let result = rlx_compiler::check_path(&full)
            .map_err(|e| format!("cannot read {}: {e}", full.display()))?;
        any_error |= result.has_errors();
        checked.push((full, result));
    }
    Ok((any_error, checked))
}
