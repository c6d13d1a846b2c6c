//! Golden snapshots of every recipe's compilation stages: the dataflow graph with its gradient
//! (`rlxc compile --emit ir`), the fused kernel plan (`--emit plan`), its loop IR (`--emit loops`)
//! and the generated CUDA C (`--emit cuda`), one file each under `compiler/tests/golden/` (`NAME.ir`,
//! `NAME.plan`, `NAME.loops`, `NAME.cu`).
//!
//! A change to lowering, autodiff, fusion or code generation changes these files, so it shows up in
//! review as a diff of what the compiler produces. When a change is intended, regenerate them with
//!
//! ```sh
//! RLX_BLESS=1 cargo test -p rlx-compiler --test golden
//! ```
//!
//! and review the diff like code. Without `RLX_BLESS`, a difference, a missing snapshot or a snapshot
//! of a recipe that no longer exists fails the test.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use rlx_compiler::backend::{cuda, loops, plan, Options};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// The stages of one recipe, as `rlxc compile --emit ir|plan|loops|cuda` prints them.
fn stages(path: &Path) -> Result<[(&'static str, String); 4], String> {
    let checked = rlx_compiler::check_path(path).map_err(|e| format!("cannot read: {e}"))?;
    let recipe = checked
        .recipe
        .as_ref()
        .filter(|_| checked.diagnostics.iter().all(|d| !d.is_error()))
        .ok_or_else(|| format!("does not check: {:?}", checked.diagnostics))?;
    let graph = rlx_compiler::compile_graph(recipe, &[])?;
    let plan = plan::plan(&graph, &Options::default()).map_err(|e| format!("no plan: {e}"))?;
    let lowered = loops::lower(&graph, &plan).map_err(|e| format!("no loop IR: {e}"))?;
    let cuda = cuda::generate(&graph, &plan).map_err(|e| format!("no CUDA C: {e}"))?;
    Ok([
        ("ir", rlx_compiler::ir::print::to_text(&graph)),
        ("plan", plan.to_text(&graph)),
        ("loops", lowered.to_text(&graph)),
        ("cu", cuda.source),
    ])
}

/// The first line where `expected` and `actual` differ, with its neighbours, for the failure message.
fn first_difference(expected: &str, actual: &str) -> String {
    let (e, a): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), actual.lines().collect());
    let line = e
        .iter()
        .zip(&a)
        .position(|(x, y)| x != y)
        .unwrap_or(e.len().min(a.len()));
    let show = |lines: &[&str]| {
        lines
            .iter()
            .enumerate()
            .skip(line.saturating_sub(2))
            .take(5)
            .map(|(i, l)| format!("    {:>5} | {l}", i + 1))
            .collect::<Vec<_>>()
            .join("\n")
    };
    format!(
        "first difference at line {}:\n  snapshot:\n{}\n  now:\n{}",
        line + 1,
        show(&e),
        show(&a)
    )
}

#[test]
fn every_recipe_matches_its_snapshots() {
    let bless = std::env::var_os("RLX_BLESS").is_some_and(|v| !v.is_empty() && v != "0");
    let dir = golden_dir();
    fs::create_dir_all(&dir).expect("the golden folder");
    let mut recipes: Vec<PathBuf> = fs::read_dir(root().join("recipes"))
        .expect("recipes/")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "rlx"))
        .collect();
    recipes.sort();
    assert!(
        recipes.len() >= 30,
        "recipes/ holds {} recipes",
        recipes.len()
    );

    let mut expected_files = BTreeSet::new();
    let mut failures = Vec::new();
    for path in &recipes {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let stages = match stages(path) {
            Ok(stages) => stages,
            Err(message) => {
                failures.push(format!("{}: {message}", path.display()));
                continue;
            }
        };
        for (extension, text) in stages {
            let file = dir.join(format!("{name}.{extension}"));
            expected_files.insert(file.file_name().unwrap().to_owned());
            if bless {
                fs::write(&file, &text).expect("write the snapshot");
                continue;
            }
            match fs::read_to_string(&file) {
                Err(_) => failures.push(format!("{}: no snapshot", file.display())),
                Ok(snapshot) if snapshot != text => failures.push(format!(
                    "{} differs from `rlxc compile recipes/{name}.rlx --emit {}`; {}",
                    file.display(),
                    if extension == "cu" { "cuda" } else { extension },
                    first_difference(&snapshot, &text)
                )),
                Ok(_) => {}
            }
        }
    }
    // Snapshots of recipes that no longer exist (renamed or removed) are stale.
    for entry in fs::read_dir(&dir).expect("the golden folder") {
        let entry = entry.expect("a directory entry");
        if !expected_files.contains(&entry.file_name()) {
            if bless {
                fs::remove_file(entry.path()).expect("remove a stale snapshot");
            } else {
                failures.push(format!(
                    "{}: a snapshot of no recipe",
                    entry.path().display()
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} snapshot(s) out of date; if the change is intended, run \
         `RLX_BLESS=1 cargo test -p rlx-compiler --test golden` and review the diff:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[test]
fn the_difference_report_points_at_the_first_changed_line() {
    let report = first_difference("a\nb\nc\nd\n", "a\nb\nX\nd\n");
    assert!(report.starts_with("first difference at line 3"), "{report}");
    assert!(
        report.contains("    3 | c") && report.contains("    3 | X"),
        "{report}"
    );
    // One text a prefix of the other: the first line past the shorter.
    let report = first_difference("a\nb\n", "a\nb\nc\n");
    assert!(report.starts_with("first difference at line 3"), "{report}");
}
