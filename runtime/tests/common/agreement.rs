//! What the kernel suites share (runtime/tests/jit.rs, and tests/cuda.rs through `#[path]`): the
//! recipes and kernel cases they run, the tolerances, and the comparison of a backend's `Outcome` with
//! the interpreter's. `root` is the repository root.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use rlx_compiler::ir::{Elem, Graph};
use rlx_runtime::{Batch, Outcome};

/// f64 accumulation: |backend − interp| ≤ 1e-5 · max(|backend|, |interp|) + 1e-9.
pub const F64_TOLERANCE: (f64, f64) = (1e-5, 1e-9);
/// f32 arithmetic (registers and the kernel's buffers of values in f32; sums in f64, `plan::SUMS`):
/// 1e-3 relative + 1e-5 absolute. Measured on these batches: everything passes at 1e-4 + 1e-6 (as it
/// did when the sums were f32 too; the f32 rounding of element-wise values dominates at this size).
pub const F32_TOLERANCE: (f64, f64) = (1e-3, 1e-5);

/// Every `.rlx` in recipes/ and tests/gradients/, read now (recipes may be added while the suite
/// evolves).
pub fn recipe_files(root: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = ["recipes", "tests/gradients"]
        .iter()
        .flat_map(|folder| std::fs::read_dir(root.join(folder)).unwrap().flatten())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "rlx"))
        .collect();
    files.sort();
    files
}

pub fn graph_of(path: &Path) -> Option<Graph> {
    let checked = rlx_compiler::check_path(path).expect("readable recipe");
    // A recipe being edited concurrently may not check; the checker's own tests report it.
    let recipe = checked.recipe?;
    Some(rlx_compiler::compile_graph(&recipe, &[]).expect("lowers"))
}

/// Ops and situations the shipped recipes do not reach yet: the recipes in tests/kernels/ (`keep resp`
/// with `n`/`resp_index` and `distinct_ngrams`, pairs under filters, every element-wise function,
/// forward and reverse scans, `shift`, rubric indexing, `crit`, `dim`, batch-level feature values),
/// by name.
pub fn kernel_cases(root: &Path) -> Vec<(String, String)> {
    let dir = root.join("tests/kernels");
    let mut cases: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "rlx"))
        .map(|path| {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(&path).expect("readable"))
        })
        .collect();
    cases.sort();
    assert!(
        cases.len() >= 5,
        "expected the kernel cases in {}",
        dir.display()
    );
    cases
}

/// The batch with every `f32` input rounded to f32 (what the kernel stores).
pub fn rounded(graph: &Graph, batch: &Batch) -> Batch {
    let mut batch = batch.clone();
    for (info, values) in graph.inputs.iter().zip(&mut batch.inputs) {
        if info.elem == Elem::F32 {
            for v in values.iter_mut() {
                *v = f64::from(*v as f32);
            }
        }
    }
    batch
}

pub fn close(a: f64, b: f64, (relative, absolute): (f64, f64)) -> bool {
    if a == b || (a.is_nan() && b.is_nan()) {
        return true;
    }
    (a - b).abs() <= relative * a.abs().max(b.abs()) + absolute
}

/// Differences between the interpreter's outcome and `backend`'s (named in the messages), empty when
/// they agree: loss, metrics (and their order), rewards, advantages, kept flags, gradients.
pub fn compare(
    expected: &Outcome,
    actual: &Outcome,
    tolerance: (f64, f64),
    backend: &str,
) -> Vec<String> {
    let mut out = Vec::new();
    let scalar = |out: &mut Vec<String>, what: &str, e: f64, a: f64| {
        if !close(e, a, tolerance) {
            out.push(format!("{what}: interp {e}, {backend} {a}"));
        }
    };
    let vector = |out: &mut Vec<String>, what: &str, e: &[f64], a: &[f64]| {
        if e.len() != a.len() {
            out.push(format!("{what}: {} values vs {}", e.len(), a.len()));
        } else if let Some(i) = (0..e.len()).find(|&i| !close(e[i], a[i], tolerance)) {
            out.push(format!("{what}[{i}]: interp {}, {backend} {}", e[i], a[i]));
        }
    };
    match (expected.loss, actual.loss) {
        (Some(e), Some(a)) => scalar(&mut out, "loss", e, a),
        (None, None) => {}
        (e, a) => out.push(format!("loss: interp {e:?}, {backend} {a:?}")),
    }
    if expected.metrics.len() != actual.metrics.len() {
        out.push("metric count".into());
    }
    for ((name, e), (other, a)) in expected.metrics.iter().zip(&actual.metrics) {
        if name != other {
            out.push(format!("metric order: {name} vs {other}"));
        }
        scalar(&mut out, &format!("metric {name}"), *e, *a);
    }
    for (what, e, a) in [
        ("reward", &expected.reward, &actual.reward),
        ("advantage", &expected.advantage, &actual.advantage),
    ] {
        match (e, a) {
            (Some(e), Some(a)) => vector(&mut out, what, e, a),
            (None, None) => {}
            _ => out.push(format!("{what}: present in one outcome only")),
        }
    }
    if expected.kept != actual.kept {
        out.push(format!(
            "kept: interp {:?}, {backend} {:?}",
            expected.kept, actual.kept
        ));
    }
    if expected.gradients.len() != actual.gradients.len() {
        out.push("gradient count".into());
    }
    for ((name, e), (other, a)) in expected.gradients.iter().zip(&actual.gradients) {
        if name != other {
            out.push(format!("gradient order: {name} vs {other}"));
        }
        vector(&mut out, &format!("grad {name}"), e, a);
    }
    out
}
