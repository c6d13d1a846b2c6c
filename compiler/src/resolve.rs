//! Stage `resolve`: load the recipe and everything it imports. Standard-library modules come from the
//! binary; relative imports are files inside the recipe's own folder (no `..`, no absolute paths, no
//! symlink escapes), and import cycles are errors.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::diagnostic::{closest_name, Diagnostic};
use crate::files::{self, Escape};
use crate::source::{FileId, Origin, SourceMap};
use crate::stdlib;
use crate::syntax::ast::{ImportSource, ItemKind, Module, Span};
use crate::syntax::parse_module;
use crate::syntax::parser::MAX_SOURCE_BYTES;

/// Deepest chain of imports accepted.
const MAX_IMPORT_DEPTH: usize = 32;

pub struct LoadedModule {
    pub file: FileId,
    pub ast: Module,
    /// For each item of `ast` that is an import: the index of the imported module, once loaded.
    pub imports: HashMap<usize, usize>,
}

/// The recipe (module 0) and the modules it imports, each parsed once.
pub struct Program {
    pub modules: Vec<LoadedModule>,
}

impl Program {
    pub const ROOT: usize = 0;

    /// The loaded module of `std/NAME`, if any.
    pub fn stdlib_module(&self, sources: &SourceMap, name: &str) -> Option<usize> {
        self.modules
            .iter()
            .position(|m| sources.get(m.file).origin == Origin::Stdlib(name.to_string()))
    }
}

struct Loader<'s> {
    sources: &'s mut SourceMap,
    modules: Vec<Option<LoadedModule>>,
    by_file: HashMap<FileId, usize>,
    /// Modules being loaded (for cycle detection), innermost last.
    stack: Vec<usize>,
    /// The canonical folder of the recipe; relative imports must stay inside it.
    root_dir: Option<PathBuf>,
    diagnostics: Vec<Diagnostic>,
}

/// Load the recipe in `root` (already in `sources`) and its imports.
pub fn load(sources: &mut SourceMap, root: FileId) -> (Option<Program>, Vec<Diagnostic>) {
    let root_dir = match &sources.get(root).origin {
        Origin::Path(path) => path
            .canonicalize()
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf)),
        _ => None,
    };
    let mut loader = Loader {
        sources,
        modules: Vec::new(),
        by_file: HashMap::new(),
        stack: Vec::new(),
        root_dir,
        diagnostics: Vec::new(),
    };
    let loaded = loader.load_module(root, 0);
    // A `rubric` block is scored by functions of `std/rubric`, loaded even when not imported.
    let declares_rubric = loader
        .modules
        .first()
        .and_then(|m| m.as_ref())
        .is_some_and(|m| {
            m.ast
                .items
                .iter()
                .any(|item| matches!(item.kind, ItemKind::Rubric(_)))
        });
    if loaded.is_some() && declares_rubric {
        loader.stack.push(Program::ROOT);
        loader.import(
            root,
            &ImportSource::Std("rubric".into()),
            Span::default(),
            0,
        );
        loader.stack.pop();
    }
    let diagnostics = loader.diagnostics;
    if loaded.is_none() || diagnostics.iter().any(Diagnostic::is_error) {
        return (None, diagnostics);
    }
    let modules = loader
        .modules
        .into_iter()
        .map(|m| m.expect("every module finished loading"))
        .collect();
    (Some(Program { modules }), diagnostics)
}

impl Loader<'_> {
    fn load_module(&mut self, file: FileId, depth: usize) -> Option<usize> {
        let text = self.sources.get(file).text.clone();
        let ast = match parse_module(file, &text) {
            Ok(ast) => ast,
            Err(errors) => {
                self.diagnostics.extend(errors);
                return None;
            }
        };
        let index = self.modules.len();
        self.modules.push(None);
        self.by_file.insert(file, index);
        self.stack.push(index);
        let is_root = index == Program::ROOT;
        let mut imports = HashMap::new();
        for (item_index, item) in ast.items.iter().enumerate() {
            match &item.kind {
                ItemKind::Import(import) => {
                    if depth >= MAX_IMPORT_DEPTH {
                        self.diagnostics.push(
                            Diagnostic::error(
                                "rlx::import_depth",
                                file,
                                format!("imports nest more than {MAX_IMPORT_DEPTH} deep"),
                            )
                            .label(import.source_span, "this import is too deep"),
                        );
                        continue;
                    }
                    if let Some(target) =
                        self.import(file, &import.source, import.source_span, depth)
                    {
                        imports.insert(item_index, target);
                    }
                }
                ItemKind::Fn(_) => {}
                _ if !is_root => {
                    self.diagnostics.push(
                        Diagnostic::error(
                            "rlx::module_item",
                            file,
                            "an imported module may only define functions and import others",
                        )
                        .label(trim_item_span(&text, item.span), "not allowed in an imported module")
                        .help("inputs, params, rubrics, `let`s and sections belong in the recipe itself"),
                    );
                }
                _ => {}
            }
        }
        self.stack.pop();
        self.modules[index] = Some(LoadedModule { file, ast, imports });
        Some(index)
    }

    fn import(
        &mut self,
        from: FileId,
        source: &ImportSource,
        span: Span,
        depth: usize,
    ) -> Option<usize> {
        let origin = match source {
            ImportSource::Std(name) => {
                if stdlib::module(name).is_none() {
                    let mut diagnostic = Diagnostic::error(
                        "rlx::unknown_module",
                        from,
                        format!("the standard library has no module `std/{name}`"),
                    )
                    .label(span, "unknown module");
                    diagnostic = match closest_name(name, stdlib::module_names()) {
                        Some(close) => diagnostic.help(format!("did you mean `std/{close}`?")),
                        None => diagnostic.help(format!(
                            "modules: {}",
                            stdlib::module_names()
                                .map(|m| format!("std/{m}"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        )),
                    };
                    self.diagnostics.push(diagnostic);
                    return None;
                }
                Origin::Stdlib(name.clone())
            }
            ImportSource::Relative(path) => Origin::Path(self.relative_path(from, path, span)?),
        };
        if let Some(existing) = self.sources.find(&origin) {
            if let Some(&index) = self.by_file.get(&existing) {
                if self.stack.contains(&index) {
                    let chain: Vec<String> = self.stack
                        [self.stack.iter().position(|&m| m == index).unwrap_or(0)..]
                        .iter()
                        .map(|&m| self.module_name(m))
                        .chain([self.module_name(index)])
                        .collect();
                    self.diagnostics.push(
                        Diagnostic::error(
                            "rlx::import_cycle",
                            from,
                            format!("import cycle: {}", chain.join(" → ")),
                        )
                        .label(span, "this import closes the cycle")
                        .help("move the shared functions into a module that both can import"),
                    );
                    return None;
                }
                return Some(index);
            }
        }
        let file = match &origin {
            Origin::Stdlib(name) => self.sources.add(
                format!("std/{name}"),
                stdlib::module(name).unwrap_or_default(),
                origin.clone(),
            ),
            Origin::Path(path) => match files::read_text(path, MAX_SOURCE_BYTES as u64) {
                Ok(text) => self
                    .sources
                    .add(path.display().to_string(), text, origin.clone()),
                Err(error) => {
                    let code = if error.kind() == std::io::ErrorKind::FileTooLarge {
                        "rlx::too_large"
                    } else {
                        "rlx::import_not_found"
                    };
                    self.diagnostics.push(
                        Diagnostic::error(
                            code,
                            from,
                            format!("cannot read `{}`: {error}", path.display()),
                        )
                        .label(span, "imported here"),
                    );
                    return None;
                }
            },
            Origin::Memory => return None,
        };
        self.load_module(file, depth + 1)
    }

    fn module_name(&self, index: usize) -> String {
        let file = self
            .modules
            .get(index)
            .and_then(|m| m.as_ref())
            .map(|m| m.file);
        let file = file.or_else(|| {
            self.by_file
                .iter()
                .find(|(_, &m)| m == index)
                .map(|(f, _)| *f)
        });
        file.map(|f| self.sources.get(f).name.clone())
            .unwrap_or_default()
    }

    /// Where a relative import points, if it is allowed.
    fn relative_path(&mut self, from: FileId, path: &str, span: Span) -> Option<PathBuf> {
        let written = Path::new(path);
        let error = |code, message: String, help: &str| {
            Diagnostic::error(code, from, message)
                .label(span, "imported here")
                .help(help)
        };
        let base = match &self.sources.get(from).origin {
            Origin::Path(file) => file.parent().map(Path::to_path_buf).unwrap_or_default(),
            Origin::Stdlib(_) => {
                self.diagnostics.push(error(
                    "rlx::import_escape",
                    "standard-library modules can only import `std/…` modules".to_string(),
                    "use `import std/NAME`",
                ));
                return None;
            }
            Origin::Memory => {
                self.diagnostics.push(error(
                    "rlx::import_not_found",
                    format!("cannot import `{path}`: this recipe has no folder"),
                    "save the recipe to a file to use relative imports",
                ));
                return None;
            }
        };
        match files::resolve_inside(self.root_dir.as_deref(), &base, written) {
            Ok(canonical) => Some(canonical),
            Err(escape) => {
                let (code, message, help) = match escape {
                    Escape::Absolute => (
                        "rlx::import_absolute",
                        format!("`{path}` is an absolute path"),
                        "import files relative to the recipe, e.g. `import \"./mine.rlx\"`",
                    ),
                    Escape::Parent => (
                        "rlx::import_escape",
                        format!("`{path}` leaves the recipe's folder"),
                        "a recipe may only import files in its own folder or below it, so it stays shareable",
                    ),
                    Escape::NotRlx => (
                        "rlx::import_extension",
                        format!("`{path}` is not a `.rlx` file"),
                        "a relative import names a module file ending in `.rlx`",
                    ),
                    Escape::Missing(target) => (
                        "rlx::import_not_found",
                        format!("`{path}` does not exist (looked for `{}`)", target.display()),
                        "the path is relative to the importing file",
                    ),
                    Escape::Outside => (
                        "rlx::import_escape",
                        format!("`{path}` resolves outside the recipe's folder"),
                        "a recipe may only import files in its own folder or below it (symbolic links included)",
                    ),
                };
                self.diagnostics.push(error(code, message, help));
                None
            }
        }
    }
}

/// `span` without the whitespace and `//` comments that the parser's item span runs on into.
fn trim_item_span(text: &str, span: Span) -> Span {
    let start = span.start as usize;
    let Some(mut item) = text.get(start..span.end as usize) else {
        return span;
    };
    loop {
        item = item.trim_end();
        let line_start = item.rfind('\n').map_or(0, |n| n + 1);
        let mut in_string = false;
        let mut comment = None;
        let line = item.as_bytes();
        for index in line_start..line.len() {
            match line[index] {
                b'"' => in_string = !in_string,
                b'/' if !in_string && line.get(index + 1) == Some(&b'/') => {
                    comment = Some(index);
                    break;
                }
                _ => {}
            }
        }
        match comment {
            Some(index) => item = &item[..index],
            None => break,
        }
    }
    Span::new(start, start + item.len())
}
