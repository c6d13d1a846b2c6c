//! Stage `resolve`: load the recipe and everything it imports. Standard-library modules come from the
//! binary; relative imports are files inside the recipe's own folder (no `..`, no absolute paths, no
//! symlink escapes), and import cycles are errors. `import name/module` reads a module of a package
//! (docs/sharing.md): the recipe's own package or one it declares, resolved and verified against
//! `rlx.lock` (`packages`) the first time one is imported; a package's files see only its own folder
//! and its own declared dependencies. A rubric block's `criteria "FILE"` entries are replaced here by
//! the criteria of the rubric file (`rubric_file`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::diagnostic::{closest_name, Diagnostic};
use crate::files::{self, Escape};
use crate::packages::{self, Workspace};
use crate::rubric_file;
use crate::source::{FileId, Origin, SourceMap};
use crate::stdlib;
use crate::syntax::ast::{ImportSource, ItemKind, Module, RubricEntry, Span};
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
    /// The packages the recipe's package depends on, as locked and verified, when it imported from
    /// one (artifacts record them).
    pub packages: Vec<packages::Record>,
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
    /// Which package each file read from disk belongs to, by canonical path (absent: the recipe's
    /// folder).
    contexts: HashMap<PathBuf, Context>,
    /// The recipe's package and its dependencies, once a package import asked for them (`None`
    /// inside when resolving them failed).
    workspace: Option<Option<Workspace>>,
    diagnostics: Vec<Diagnostic>,
}

/// Where a file belongs, for what it may import.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Context {
    /// The recipe's folder (relative imports stay inside it).
    Recipe,
    /// The recipe's own package (`None`) or the dependency at this index of the workspace.
    Package(Option<usize>),
}

/// Extensions of the files a rubric block's `criteria` entry reads.
const RUBRIC_FILE_EXTENSIONS: [&str; 2] = ["toml", "json"];
/// Largest rubric file read.
const MAX_RUBRIC_FILE_BYTES: u64 = 1 << 20;

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
        contexts: HashMap::new(),
        workspace: None,
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
    let packages = loader
        .workspace
        .flatten()
        .map(|workspace| {
            workspace
                .packages
                .iter()
                .map(packages::Record::from)
                .collect()
        })
        .unwrap_or_default();
    let modules = loader
        .modules
        .into_iter()
        .map(|m| m.expect("every module finished loading"))
        .collect();
    (Some(Program { modules, packages }), diagnostics)
}

impl Loader<'_> {
    fn load_module(&mut self, file: FileId, depth: usize) -> Option<usize> {
        let text = self.sources.get(file).text.clone();
        let mut ast = match parse_module(file, &text) {
            Ok(ast) => ast,
            Err(errors) => {
                self.diagnostics.extend(errors);
                return None;
            }
        };
        if self.modules.is_empty() {
            self.expand_rubric_files(file, &mut ast);
        }
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
            ImportSource::Relative(path) => {
                let (path, context) = self.relative_path(from, Path::new(path), span, &["rlx"])?;
                self.contexts.entry(path.clone()).or_insert(context);
                Origin::Path(path)
            }
            ImportSource::Package { package, path } => {
                let written = format!("{path}.rlx");
                let (path, context) =
                    self.package_path(from, package, Path::new(&written), span, &["rlx"])?;
                self.contexts.entry(path.clone()).or_insert(context);
                Origin::Path(path)
            }
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
            Origin::Path(path) => {
                self.read_file(path, MAX_SOURCE_BYTES as u64, (from, span, "imported here"))?
            }
            Origin::Memory => return None,
        };
        self.load_module(file, depth + 1)
    }

    /// Read `path` (at most `limit` bytes, through `files::read_text`) into the source map; a file that
    /// cannot be read is a diagnostic at `at` (the file, span and label of what named it).
    fn read_file(&mut self, path: &Path, limit: u64, at: (FileId, Span, &str)) -> Option<FileId> {
        let (from, span, label) = at;
        match files::read_text(path, limit) {
            Ok(text) => Some(self.sources.add(
                path.display().to_string(),
                text,
                Origin::Path(path.to_path_buf()),
            )),
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
                    .label(span, label),
                );
                None
            }
        }
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

    /// The package context of a loaded file.
    fn context_of(&self, file: FileId) -> Context {
        match &self.sources.get(file).origin {
            Origin::Path(path) => self.contexts.get(path).copied().unwrap_or(Context::Recipe),
            _ => Context::Recipe,
        }
    }

    /// The folder a file's relative imports must stay inside, and what to call it.
    fn context_root(&self, context: Context) -> (Option<PathBuf>, String) {
        let workspace = self.workspace.as_ref().and_then(Option::as_ref);
        match (context, workspace) {
            (Context::Package(None), Some(w)) => (
                Some(w.root.dir.clone()),
                format!("package `{}`", w.root.name),
            ),
            (Context::Package(Some(index)), Some(w)) => (
                Some(w.packages[index].manifest.dir.clone()),
                format!("package `{}`", w.packages[index].manifest.name),
            ),
            _ => (self.root_dir.clone(), "the recipe's folder".to_string()),
        }
    }

    /// Where a relative import (or rubric file) points, if it is allowed, and its package context.
    fn relative_path(
        &mut self,
        from: FileId,
        written: &Path,
        span: Span,
        extensions: &[&str],
    ) -> Option<(PathBuf, Context)> {
        let path = written.display().to_string();
        let base = match &self.sources.get(from).origin {
            Origin::Path(file) => file.parent().map(Path::to_path_buf).unwrap_or_default(),
            Origin::Stdlib(_) => {
                self.diagnostics.push(
                    Diagnostic::error(
                        "rlx::import_escape",
                        from,
                        "standard-library modules can only import `std/…` modules",
                    )
                    .label(span, "imported here")
                    .help("use `import std/NAME`"),
                );
                return None;
            }
            Origin::Memory => {
                self.diagnostics.push(
                    Diagnostic::error(
                        "rlx::import_not_found",
                        from,
                        format!("cannot import `{path}`: this recipe has no folder"),
                    )
                    .label(span, "imported here")
                    .help("save the recipe to a file to use relative imports"),
                );
                return None;
            }
        };
        let context = self.context_of(from);
        let (root, scope) = self.context_root(context);
        let canonical = self.inside(
            from,
            root.as_deref(),
            &base,
            written,
            span,
            extensions,
            &scope,
        )?;
        Some((canonical, context))
    }

    /// [`files::resolve_inside_with`] with its refusals as diagnostics.
    #[allow(clippy::too_many_arguments)]
    fn inside(
        &mut self,
        from: FileId,
        root: Option<&Path>,
        base: &Path,
        written: &Path,
        span: Span,
        extensions: &[&str],
        scope: &str,
    ) -> Option<PathBuf> {
        let path = written.display().to_string();
        match files::resolve_inside_with(root, base, written, extensions) {
            Ok(canonical) => Some(canonical),
            Err(escape) => {
                let wanted = extensions
                    .iter()
                    .map(|e| format!("`.{e}`"))
                    .collect::<Vec<_>>()
                    .join(" or ");
                let (code, message, help) = match escape {
                    Escape::Absolute => (
                        "rlx::import_absolute",
                        format!("`{path}` is an absolute path"),
                        "import files relative to the recipe, e.g. `import \"./mine.rlx\"`".to_string(),
                    ),
                    Escape::Parent => (
                        "rlx::import_escape",
                        format!("`{path}` leaves {scope}"),
                        format!("a file may only import files in {scope} or below it, so it stays shareable; to use another package, declare it in rlx.toml and `import NAME/module`"),
                    ),
                    Escape::NotRlx => (
                        "rlx::import_extension",
                        format!("`{path}` is not a {wanted} file"),
                        format!("this names a file ending in {wanted}"),
                    ),
                    Escape::Missing(target) => (
                        "rlx::import_not_found",
                        format!("`{path}` does not exist (looked for `{}`)", target.display()),
                        "the path is relative to the importing file".to_string(),
                    ),
                    Escape::Outside => (
                        "rlx::import_escape",
                        format!("`{path}` resolves outside {scope}"),
                        format!("a file may only import files in {scope} or below it (symbolic links included)"),
                    ),
                };
                self.diagnostics.push(
                    Diagnostic::error(code, from, message)
                        .label(span, "imported here")
                        .help(help),
                );
                None
            }
        }
    }

    /// The recipe's package and its dependencies, resolved and verified on first use.
    fn workspace(&mut self, from: FileId, span: Span) -> Option<&Workspace> {
        if self.workspace.is_none() {
            let found = self.root_dir.as_deref().and_then(packages::find_manifest);
            let resolved = match found {
                None => {
                    self.diagnostics.push(
                        Diagnostic::error(
                            "rlx::no_manifest",
                            from,
                            format!(
                                "this imports from a package, but the recipe is in no package (no {} in its folder or above)",
                                packages::MANIFEST
                            ),
                        )
                        .label(span, "a package import")
                        .help("create an rlx.toml that declares the dependency (docs/sharing.md), then run `rlx update`"),
                    );
                    None
                }
                Some(dir) => {
                    let (workspace, found) =
                        packages::resolve(self.sources, &dir, packages::Mode::Locked);
                    self.diagnostics.extend(found);
                    workspace
                }
            };
            self.workspace = Some(resolved);
        }
        self.workspace.as_ref().and_then(Option::as_ref)
    }

    /// Where `package/written` points, seen from `from`, and the package it belongs to.
    fn package_path(
        &mut self,
        from: FileId,
        package: &str,
        written: &Path,
        span: Span,
        extensions: &[&str],
    ) -> Option<(PathBuf, Context)> {
        if matches!(self.sources.get(from).origin, Origin::Stdlib(_)) {
            self.diagnostics.push(
                Diagnostic::error(
                    "rlx::import_escape",
                    from,
                    "standard-library modules can only import `std/…` modules",
                )
                .label(span, "imported here"),
            );
            return None;
        }
        let context = self.context_of(from);
        let workspace = self.workspace(from, span)?;
        let declaring = match context {
            Context::Package(Some(index)) => &workspace.packages[index].manifest,
            _ => &workspace.root,
        };
        let target = if declaring.name == package {
            match context {
                Context::Recipe => Context::Package(None),
                other => other,
            }
        } else if declaring.dependency(package).is_some() {
            match workspace.find(package) {
                Some(index) => Context::Package(Some(index)),
                None => return None,
            }
        } else {
            let declared: Vec<&str> = declaring
                .dependencies
                .iter()
                .map(|d| d.name.as_str())
                .collect();
            let mut diagnostic = Diagnostic::error(
                "rlx::undeclared_package",
                from,
                format!(
                    "package `{}` does not declare a dependency `{package}`",
                    declaring.name
                ),
            )
            .label(span, "not a declared package");
            diagnostic = match closest_name(package, declared.iter().copied()) {
                Some(close) => diagnostic.help(format!("did you mean `{close}`?")),
                None if declared.is_empty() => diagnostic.help(format!(
                    "add it to `[dependencies]` in {}, then run `rlx update`",
                    declaring.dir.join(packages::MANIFEST).display()
                )),
                None => diagnostic.help(format!(
                    "declared: {}; add it to `[dependencies]`, then run `rlx update`",
                    declared.join(", ")
                )),
            };
            self.diagnostics.push(diagnostic);
            return None;
        };
        let (root, scope) = self.context_root(target);
        let root = root?;
        let canonical = self.inside(from, Some(&root), &root, written, span, extensions, &scope)?;
        Some((canonical, target))
    }

    /// Replace each `criteria "FILE"` entry of the recipe's rubric blocks by the file's criteria.
    fn expand_rubric_files(&mut self, file: FileId, ast: &mut Module) {
        for item in &mut ast.items {
            let ItemKind::Rubric(rubric) = &mut item.kind else {
                continue;
            };
            if !rubric
                .entries
                .iter()
                .any(|e| matches!(e, RubricEntry::Criteria(_)))
            {
                continue;
            }
            let entries = std::mem::take(&mut rubric.entries);
            for entry in entries {
                match entry {
                    RubricEntry::Criteria(criteria) => {
                        if let Some(loaded) =
                            self.rubric_file(file, &criteria.source, criteria.source_span)
                        {
                            rubric.entries.extend(
                                loaded
                                    .criterion_decls(criteria.span)
                                    .into_iter()
                                    .map(RubricEntry::Criterion),
                            );
                        }
                    }
                    other => rubric.entries.push(other),
                }
            }
        }
    }

    /// Read and validate the rubric file a `criteria` entry names.
    fn rubric_file(
        &mut self,
        from: FileId,
        source: &ImportSource,
        span: Span,
    ) -> Option<rubric_file::RubricFile> {
        let (path, context) = match source {
            ImportSource::Relative(path) => {
                self.relative_path(from, Path::new(path), span, &RUBRIC_FILE_EXTENSIONS)?
            }
            ImportSource::Package { package, path } => self.package_path(
                from,
                package,
                Path::new(path),
                span,
                &RUBRIC_FILE_EXTENSIONS,
            )?,
            ImportSource::Std(_) => return None,
        };
        self.contexts.entry(path.clone()).or_insert(context);
        let origin = Origin::Path(path.clone());
        let file = match self.sources.find(&origin) {
            Some(file) => file,
            None => self.read_file(&path, MAX_RUBRIC_FILE_BYTES, (from, span, "named here"))?,
        };
        let text = self.sources.get(file).text.clone();
        let json = path.extension().is_some_and(|e| e == "json");
        match rubric_file::parse(file, &text, json) {
            Ok(rubric) => Some(rubric),
            Err(errors) => {
                self.diagnostics.extend(errors);
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
