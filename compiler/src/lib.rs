//! The rlx compiler: `parse` → `resolve` → `check` (→ `lower` → `autodiff` → `fuse` → `codegen`).
//! Errors are data (`Diagnostic`); rendering happens only in the command-line tools.

pub mod artifact;
pub mod backend;
pub mod check;
pub mod diagnostic;
pub mod docgen;
pub mod export;
pub mod files;
pub mod format;
pub mod ir;
pub mod ops;
pub mod packages;
pub mod resolve;
pub mod rubric_file;
pub mod source;
pub mod stdlib;
pub mod syntax;

use std::path::Path;

pub use check::hir;
pub use diagnostic::{Diagnostic, Severity};
pub use source::{FileId, Origin, SourceMap};

/// The result of checking one recipe: the sources it read, what was found, and the HIR if clean.
pub struct Checked {
    pub sources: SourceMap,
    pub root: FileId,
    pub diagnostics: Vec<Diagnostic>,
    pub recipe: Option<hir::Recipe>,
    /// The packages the recipe's package depends on, as locked and verified, when it imported from
    /// one (docs/sharing.md).
    pub packages: Vec<packages::Record>,
}

impl Checked {
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }

    /// The files read from disk, the recipe first, then its imports and rubric files (the standard
    /// library is part of the compiler; package manifests and locks are described by `packages`):
    /// each canonical path with its text.
    pub fn disk_files(&self) -> Vec<(&Path, &str)> {
        let mut files = Vec::new();
        for (id, file) in self.sources.files() {
            if let Origin::Path(path) = &file.origin {
                let name = path.file_name().unwrap_or_default();
                if name == packages::MANIFEST || name == packages::LOCK {
                    continue;
                }
                let entry = (path.as_path(), file.text.as_str());
                if id == self.root {
                    files.insert(0, entry);
                } else {
                    files.push(entry);
                }
            }
        }
        files
    }
}

/// Stack for the compiler's recursive passes, so that no input can overflow it (nesting is also capped).
const COMPILER_STACK_BYTES: usize = 256 << 20;

/// Run `work` on a thread with a large stack; a panic there becomes a compiler-bug diagnostic.
fn on_compiler_stack<T: Send>(work: impl FnOnce() -> T + Send) -> std::thread::Result<T> {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("rlx-compiler".into())
            .stack_size(COMPILER_STACK_BYTES)
            .spawn_scoped(scope, work)
            .map(|handle| handle.join())
            .unwrap_or_else(|error| Err(Box::new(error.to_string())))
    })
}

/// Check a recipe file (and what it imports). The file must be a regular file of at most
/// `MAX_SOURCE_BYTES` of UTF-8 ([`files::read_text`]).
pub fn check_path(path: &Path) -> std::io::Result<Checked> {
    let text = files::read_text(path, syntax::parser::MAX_SOURCE_BYTES as u64)?;
    let canonical = path.canonicalize()?;
    let mut sources = SourceMap::new();
    let root = sources.add(path.display().to_string(), text, Origin::Path(canonical));
    Ok(check_sources(sources, root))
}

/// Check recipe text that has no file (relative imports are then unavailable).
pub fn check_source(name: &str, text: &str) -> Checked {
    let mut sources = SourceMap::new();
    let root = sources.add(name, text, Origin::Memory);
    check_sources(sources, root)
}

/// Check `root` within `sources`.
pub fn check_sources(sources: SourceMap, root: FileId) -> Checked {
    let outcome = on_compiler_stack(move || {
        let mut sources = sources;
        let (program, mut diagnostics) = resolve::load(&mut sources, root);
        let packages = program
            .as_ref()
            .map(|p| p.packages.clone())
            .unwrap_or_default();
        let recipe = program.and_then(|program| {
            let (recipe, found) = check::check(&program, &sources);
            diagnostics.extend(found);
            recipe
        });
        Checked {
            sources,
            root,
            diagnostics,
            recipe,
            packages,
        }
    });
    outcome.unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        let mut sources = SourceMap::new();
        let root = sources.add("<internal>", "", Origin::Memory);
        Checked {
            sources,
            root,
            diagnostics: vec![Diagnostic::error(
                "rlx::internal",
                root,
                format!("internal compiler error (please report it): {what}"),
            )],
            recipe: None,
            packages: Vec::new(),
        }
    })
}

/// Lower a checked recipe to IR with these param overrides, and append the loss gradient.
pub fn compile_graph(
    recipe: &hir::Recipe,
    overrides: &[(String, f64)],
) -> Result<ir::Graph, String> {
    compile_graph_showing(recipe, overrides, &[])
}

/// `compile_graph`, with the top-level `let`s `shown` (indices into `recipe.globals`) kept alive as
/// `graph.outputs.shown` for the interpreter (`rlx score --show`); such a graph is not for the planner.
pub fn compile_graph_showing(
    recipe: &hir::Recipe,
    overrides: &[(String, f64)],
    shown: &[hir::GlobalId],
) -> Result<ir::Graph, String> {
    compile_graph_showing_rollout(recipe, overrides, shown, false)
}

/// `compile_graph_showing`, also keeping (when `rollout` is set) the recipe's `rollout { … }`
/// expressions as `graph.outputs.shown` named `rollout.KEY` (`ir::lower::lower_showing_rollout`), for
/// `rlx score` to print; such a graph is not for the planner.
pub fn compile_graph_showing_rollout(
    recipe: &hir::Recipe,
    overrides: &[(String, f64)],
    shown: &[hir::GlobalId],
    rollout: bool,
) -> Result<ir::Graph, String> {
    let params = ir::lower::param_values(recipe, overrides)?;
    let graph = ir::lower::lower_showing_rollout(recipe, &params, shown, rollout);
    let mut graph = ir::autodiff::differentiate(graph);
    graph.eliminate_dead_code();
    Ok(graph)
}
