//! The names of one module: every definition and every use, each use tied to its definition, read from
//! the parser's AST with the language's scoping rules (a module's items and imported functions, a
//! function's parameters, a block's `let`s, a rubric's criteria). It needs only a parse, so navigation
//! keeps working while the checker reports errors.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use lsp_types::{Location, Range, Url};
use rlx_compiler::check::builtins;
use rlx_compiler::files;
use rlx_compiler::packages;
use rlx_compiler::source::FileId;
use rlx_compiler::stdlib;
use rlx_compiler::syntax::ast::{
    self, CriterionAttr, Expr, ExprKind, ImportSource, Item, ItemKind, Module, RolloutValue,
    RubricEntry, RubricValue, Span,
};
use rlx_compiler::syntax::parse_module;
use rlx_compiler::syntax::parser::MAX_SOURCE_BYTES;

use crate::text::LineIndex;

/// The scheme of the standard library's read-only virtual documents: `rlx-std:/loss.rlx`.
pub const STD_SCHEME: &str = "rlx-std";

/// The URI of the standard-library module `std/NAME`.
pub fn std_uri(name: &str) -> Url {
    Url::parse(&format!("{STD_SCHEME}:/{name}.rlx")).expect("a valid URI")
}

/// The module name of a `rlx-std:` URI.
pub fn std_module_of(uri: &Url) -> Option<&str> {
    if uri.scheme() != STD_SCHEME {
        return None;
    }
    let name = uri.path().trim_start_matches('/').strip_suffix(".rlx")?;
    stdlib::module(name).map(|_| name)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DefKind {
    Input,
    Param,
    Let,
    Fn,
    FnParam,
    Local,
    Rubric,
    Criterion,
    Section,
    Metric,
    Module,
    Builtin,
}

/// A definition: where it is (none for built-ins), what it is, and what hover shows of it.
#[derive(Clone, Debug)]
pub struct Def {
    pub name: String,
    pub kind: DefKind,
    /// The defining name's location (a module: its first character).
    pub location: Option<Location>,
    /// The defining name's span, in the file of `location`.
    pub span: Span,
    /// One line of code: the declaration as written (or a built-in's signature).
    pub detail: String,
    /// Doc comment lines (`///`) or a built-in's description.
    pub doc: Vec<String>,
    /// For a function: its parameters, in order.
    pub params: Vec<Def>,
}

impl Def {
    pub fn same(&self, other: &Def) -> bool {
        self.kind == other.kind
            && match (&self.location, &other.location) {
                (Some(a), Some(b)) => a == b,
                (None, None) => self.name == other.name,
                _ => false,
            }
    }
}

/// A name written in the module, and what it names.
#[derive(Clone, Debug)]
pub struct Occurrence {
    pub span: Span,
    pub def: Def,
    /// The defining occurrence itself (not a use).
    pub is_def: bool,
}

/// What a module's text says about names.
#[derive(Clone, Debug, Default)]
pub struct ModuleIndex {
    pub occurrences: Vec<Occurrence>,
    /// The module's own items and its imported functions, by name.
    pub top: HashMap<String, Def>,
    /// Locals (function parameters, block `let`s) and where each is visible.
    pub locals: Vec<(Span, Def)>,
    /// Every criterion of every rubric of the module.
    pub criteria: Vec<Def>,
    /// For each import item: the module it names (a `rlx-std:` or `file:` URI) and that module's
    /// functions.
    pub imports: Vec<ImportInfo>,
}

#[derive(Clone, Debug)]
pub struct ImportInfo {
    pub source_span: Span,
    pub target: Option<Url>,
    pub functions: Vec<Def>,
}

impl ModuleIndex {
    /// The occurrence whose name contains `offset` (its end included, where a cursor after a name is).
    pub fn occurrence_at(&self, offset: usize) -> Option<&Occurrence> {
        let offset = offset as u32;
        self.occurrences
            .iter()
            .filter(|o| o.span.start <= offset && offset <= o.span.end)
            .min_by_key(|o| o.span.len())
    }

    /// The names visible at `offset`: locals whose scope contains it, then the module's names.
    pub fn names_at(&self, offset: usize) -> Vec<&Def> {
        let offset = offset as u32;
        let mut names: Vec<&Def> = self
            .locals
            .iter()
            .filter(|(scope, _)| scope.start <= offset && offset <= scope.end)
            .map(|(_, def)| def)
            .collect();
        let mut top: Vec<&Def> = self.top.values().collect();
        top.sort_by(|a, b| a.name.cmp(&b.name));
        names.extend(top);
        names
    }

    /// A function (the module's own or imported) by name.
    pub fn function(&self, name: &str) -> Option<&Def> {
        self.top
            .get(name)
            .filter(|def| matches!(def.kind, DefKind::Fn | DefKind::Rubric))
    }
}

/// Where a module's text came from: what its relative imports are resolved against.
pub struct ModuleSource<'a> {
    pub uri: &'a Url,
    pub text: &'a str,
    /// The folder of the file on disk (none for the standard library and unsaved buffers).
    pub folder: Option<&'a Path>,
}

/// Index a parsed module.
pub fn index_module(source: &ModuleSource, module: &Module) -> ModuleIndex {
    let mut indexer = Indexer {
        uri: source.uri,
        text: source.text,
        lines: LineIndex::new(source.text),
        index: ModuleIndex::default(),
        locals: Vec::new(),
    };
    indexer.collect_items(source, module);
    for item in &module.items {
        indexer.item(item);
    }
    indexer.index
}

/// The definitions of every function of a module's text (for imports), with their docs.
pub fn functions_of(uri: &Url, text: &str) -> Vec<Def> {
    let Ok(module) = parse_module(FileId(0), text) else {
        return Vec::new();
    };
    let indexer = Indexer {
        uri,
        text,
        lines: LineIndex::new(text),
        index: ModuleIndex::default(),
        locals: Vec::new(),
    };
    module
        .items
        .iter()
        .filter_map(|item| match &item.kind {
            ItemKind::Fn(decl) => Some(indexer.fn_def(item, decl)),
            _ => None,
        })
        .collect()
}

/// The text of an imported module and its URI, read under the compiler's import rules (standard
/// library by name; relative files inside `folder`, no `..`, no escape through links).
pub fn load_import(source: &ImportSource, folder: Option<&Path>) -> Option<(Url, String)> {
    match source {
        ImportSource::Std(name) => stdlib::module(name).map(|text| (std_uri(name), text.into())),
        ImportSource::Relative(path) => {
            let folder = folder?;
            let root = folder.canonicalize().ok()?;
            let target: PathBuf =
                files::resolve_inside(Some(&root), folder, Path::new(path)).ok()?;
            let text = files::read_text(&target, MAX_SOURCE_BYTES as u64).ok()?;
            Some((Url::from_file_path(&target).ok()?, text))
        }
        // A module of a package: the package of `folder` or one of the packages its lock pins
        // (docs/sharing.md), read under the same rules inside that package's folder. Whether the
        // import is declared is the compiler's diagnostic; here it only finds the file.
        ImportSource::Package { package, path } => {
            let workspace = packages::resolve_at(folder?, packages::Mode::Locked).workspace?;
            let dir = match workspace.find(package) {
                Some(index) => workspace.packages[index].manifest.dir.clone(),
                None if workspace.root.name == *package => workspace.root.dir.clone(),
                None => return None,
            };
            let written = Path::new(path);
            let relative = match written.extension() {
                Some(_) => written.to_path_buf(),
                None => written.with_extension("rlx"),
            };
            let target = files::resolve_inside(Some(&dir), &dir, &relative).ok()?;
            let text = files::read_text(&target, MAX_SOURCE_BYTES as u64).ok()?;
            Some((Url::from_file_path(&target).ok()?, text))
        }
    }
}

/// A built-in name's definition (functions, reductions, axis operations, values), if it is one.
pub fn builtin(name: &str) -> Option<Def> {
    let (detail, doc) = if let Some(sig) = builtins::func(name) {
        let params: Vec<String> = sig
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| {
                if i >= sig.params.len() - sig.optional {
                    format!("{p}?")
                } else {
                    p.to_string()
                }
            })
            .collect();
        let reduction = builtins::reduction(name)
            .map(|r| format!("; as a reduction `{name}(x over AXES)`: {}", r.doc))
            .unwrap_or_default();
        (
            format!("{name}({})", params.join(", ")),
            format!("built-in function: {}{reduction}", sig.doc),
        )
    } else if let Some(sig) = builtins::reduction(name) {
        (
            format!("{name}(x over AXES)"),
            format!("built-in reduction: {}", sig.doc),
        )
    } else if let Some(sig) = builtins::value(name) {
        (
            format!("{name}: {}", builtins::value_ty(sig)),
            format!("built-in value: {}", sig.doc),
        )
    } else if let Some((_, doc)) = builtins::AXIS_OPS.iter().find(|(n, _)| *n == name) {
        let signature = doc.split(':').next().unwrap_or(name).to_string();
        (
            signature,
            format!(
                "built-in axis operation: {}",
                doc.split_once(": ").map_or(*doc, |x| x.1)
            ),
        )
    } else {
        return None;
    };
    Some(Def {
        name: name.into(),
        kind: DefKind::Builtin,
        location: None,
        span: Span::default(),
        detail,
        doc: vec![doc],
        params: Vec::new(),
    })
}

struct Indexer<'a> {
    uri: &'a Url,
    text: &'a str,
    lines: LineIndex,
    index: ModuleIndex,
    /// The locals in scope while walking an expression, innermost last.
    locals: Vec<Def>,
}

impl Indexer<'_> {
    fn location(&self, span: Span) -> Location {
        Location::new(self.uri.clone(), self.lines.range(self.text, span))
    }

    fn source(&self, span: Span) -> &str {
        self.text.get(span.range()).unwrap_or("")
    }

    fn def(&self, name: &ast::Ident, kind: DefKind, detail: String, doc: &[String]) -> Def {
        Def {
            name: name.name.clone(),
            kind,
            location: Some(self.location(name.span)),
            span: name.span,
            detail,
            doc: doc.to_vec(),
            params: Vec::new(),
        }
    }

    /// The declaration as written, on one line, without its trailing comments.
    fn declaration(&self, span: Span) -> String {
        let code: Vec<&str> = self
            .source(span)
            .lines()
            .map(|line| strip_comment(line).trim())
            .filter(|line| !line.is_empty())
            .collect();
        code.join(" ")
    }

    fn fn_def(&self, item: &Item, decl: &ast::FnDecl) -> Def {
        let params: Vec<String> = decl
            .params
            .iter()
            .map(|p| self.source(param_span(p)).to_string())
            .collect();
        let ret = decl
            .ret
            .as_ref()
            .map(|ty| format!(": {}", self.source(ty.span)))
            .unwrap_or_default();
        let mut def = self.def(
            &decl.name,
            DefKind::Fn,
            format!("fn {}({}){ret}", decl.name.name, params.join(", ")),
            &item.doc,
        );
        def.params = decl
            .params
            .iter()
            .map(|p| {
                self.def(
                    &p.name,
                    DefKind::FnParam,
                    format!(
                        "{} (parameter of `{}`)",
                        self.source(param_span(p)),
                        decl.name.name
                    ),
                    &[],
                )
            })
            .collect();
        def
    }

    /// The module's names: its items and the functions it imports.
    fn collect_items(&mut self, source: &ModuleSource, module: &Module) {
        for item in &module.items {
            let def = match &item.kind {
                ItemKind::Import(import) => {
                    let loaded = load_import(&import.source, source.folder);
                    let (target, functions) = match &loaded {
                        Some((uri, text)) => (Some(uri.clone()), functions_of(uri, text)),
                        None => (None, Vec::new()),
                    };
                    if let (Some(uri), Some((_, text))) = (&target, &loaded) {
                        let module_def = Def {
                            name: self.source(import.source_span).to_string(),
                            kind: DefKind::Module,
                            location: Some(Location::new(uri.clone(), Range::default())),
                            span: Span::default(),
                            detail: format!("import {}", self.source(import.source_span)),
                            doc: header_comment(text),
                            params: Vec::new(),
                        };
                        self.index.occurrences.push(Occurrence {
                            span: import.source_span,
                            def: module_def,
                            is_def: false,
                        });
                    }
                    let wanted: Vec<(Option<Span>, &Def)> = match &import.names {
                        Some(names) => names
                            .iter()
                            .filter_map(|n| {
                                functions
                                    .iter()
                                    .find(|f| f.name == n.name)
                                    .map(|f| (Some(n.span), f))
                            })
                            .collect(),
                        None => functions.iter().map(|f| (None, f)).collect(),
                    };
                    for (span, function) in wanted {
                        if let Some(span) = span {
                            self.index.occurrences.push(Occurrence {
                                span,
                                def: function.clone(),
                                is_def: false,
                            });
                        }
                        self.index
                            .top
                            .entry(function.name.clone())
                            .or_insert_with(|| function.clone());
                    }
                    self.index.imports.push(ImportInfo {
                        source_span: import.source_span,
                        target,
                        functions,
                    });
                    continue;
                }
                ItemKind::Input(decl) => self.def(
                    &decl.name,
                    DefKind::Input,
                    self.declaration(item_code(self.text, item.span)),
                    &item.doc,
                ),
                ItemKind::Param(decl) => self.def(
                    &decl.name,
                    DefKind::Param,
                    self.declaration(item_code(self.text, item.span)),
                    &item.doc,
                ),
                // A state reads as a batch-level input (docs/language.md, "State across steps").
                ItemKind::State(decl) => self.def(
                    &decl.name,
                    DefKind::Input,
                    shorten(&self.declaration(item_code(self.text, item.span))),
                    &item.doc,
                ),
                ItemKind::Let(_) | ItemKind::Metric { .. } => {
                    let (name, kind) = match &item.kind {
                        ItemKind::Let(decl) => (&decl.name, DefKind::Let),
                        ItemKind::Metric { name, .. } => (name, DefKind::Metric),
                        _ => continue,
                    };
                    let detail = shorten(&self.declaration(item_code(self.text, item.span)));
                    self.def(name, kind, detail, &item.doc)
                }
                ItemKind::Fn(decl) => self.fn_def(item, decl),
                ItemKind::Rubric(decl) => {
                    let def = self.def(
                        &decl.name,
                        DefKind::Rubric,
                        format!("rubric {}", decl.name.name),
                        &item.doc,
                    );
                    for entry in &decl.entries {
                        if let RubricEntry::Criterion(criterion) = entry {
                            let detail = self.declaration(criterion.span);
                            let criterion_def = Def {
                                doc: vec![format!("criterion of rubric `{}`", decl.name.name)],
                                ..self.def(&criterion.name, DefKind::Criterion, detail, &[])
                            };
                            self.index.criteria.push(criterion_def);
                        }
                    }
                    def
                }
                ItemKind::Reward(_) | ItemKind::Advantage(_) => {
                    let name = if matches!(item.kind, ItemKind::Reward(_)) {
                        "reward"
                    } else {
                        "advantage"
                    };
                    let Some(span) = keyword_span(self.text, item.span, name) else {
                        continue;
                    };
                    let ident = ast::Ident {
                        name: name.into(),
                        span,
                    };
                    self.def(&ident, DefKind::Section, format!("{name} = …"), &item.doc)
                }
                _ => continue,
            };
            self.index.occurrences.push(Occurrence {
                span: def.span,
                def: def.clone(),
                is_def: true,
            });
            // The first definition wins, as the checker reports the second as a duplicate.
            self.index.top.entry(def.name.clone()).or_insert(def);
        }
        let criteria = self.index.criteria.clone();
        for criterion in criteria {
            self.index.occurrences.push(Occurrence {
                span: criterion.span,
                def: criterion,
                is_def: true,
            });
        }
    }

    fn item(&mut self, item: &Item) {
        match &item.kind {
            ItemKind::Import(_) | ItemKind::Param(_) => {}
            ItemKind::Input(decl) => {
                // `f32[resp, style]`: the rubric that names the feature axis.
                for axis in &decl.ty.axes {
                    let rubric = self
                        .index
                        .top
                        .get(&axis.name)
                        .filter(|d| d.kind == DefKind::Rubric)
                        .cloned();
                    if let Some(def) = rubric {
                        self.index.occurrences.push(Occurrence {
                            span: axis.span,
                            def,
                            is_def: false,
                        });
                    }
                }
            }
            ItemKind::Fn(decl) => {
                let Some(def) = self.index.top.get(&decl.name.name).cloned() else {
                    return;
                };
                let params = if def.location.as_ref().map(|l| &l.uri) == Some(self.uri)
                    && def.span == decl.name.span
                {
                    def.params.clone()
                } else {
                    // A duplicate: its own parameters.
                    self.fn_def(item, decl).params
                };
                for (param, param_def) in decl.params.iter().zip(&params) {
                    self.index.occurrences.push(Occurrence {
                        span: param.name.span,
                        def: param_def.clone(),
                        is_def: true,
                    });
                    if let Some(default) = &param.default {
                        self.expr(default);
                    }
                }
                for param_def in &params {
                    self.index.locals.push((decl.body.span, param_def.clone()));
                }
                self.locals = params;
                self.expr(&decl.body);
                self.locals.clear();
            }
            ItemKind::Let(decl) => self.expr(&decl.value),
            ItemKind::Rubric(decl) => self.rubric(decl),
            ItemKind::Reward(expr) | ItemKind::Advantage(expr) | ItemKind::Loss(expr) => {
                self.expr(expr)
            }
            ItemKind::Metric { value, .. } => self.expr(value),
            ItemKind::Keep { condition, .. } => self.expr(condition),
            ItemKind::State(decl) => self.expr(&decl.update),
            ItemKind::Rollout(entries) => {
                for entry in entries {
                    if let RolloutValue::Expr(expr) = &entry.value {
                        self.expr(expr);
                    }
                }
            }
        }
    }

    fn rubric(&mut self, decl: &ast::RubricDecl) {
        let criterion = |index: &ModuleIndex, ident: &ast::Ident| -> Option<Def> {
            index
                .criteria
                .iter()
                .find(|c| {
                    c.name == ident.name && c.doc[0].contains(&format!("`{}`", decl.name.name))
                })
                .cloned()
        };
        for entry in &decl.entries {
            match entry {
                RubricEntry::Criterion(c) => {
                    for attr in &c.attrs {
                        match attr {
                            CriterionAttr::Weight(value) | CriterionAttr::Points(value) => {
                                self.rubric_value(value)
                            }
                            CriterionAttr::Saturate(shape) => self.shape(shape),
                            _ => {}
                        }
                    }
                }
                RubricEntry::Interact(interact) => {
                    for ident in [&interact.first, &interact.second] {
                        if let Some(def) = criterion(&self.index, ident) {
                            self.index.occurrences.push(Occurrence {
                                span: ident.span,
                                def,
                                is_def: false,
                            });
                        }
                    }
                    self.rubric_value(&interact.gamma);
                }
                RubricEntry::OnVeto(shape) | RubricEntry::Shape(shape) => self.shape(shape),
                // Criteria from a rubric file: their names are the file's, not the recipe's.
                RubricEntry::Aggregate(_) | RubricEntry::Criteria(_) => {}
            }
        }
    }

    fn shape(&mut self, shape: &ast::ShapeCall) {
        for (_, value) in &shape.args {
            self.rubric_value(value);
        }
    }

    fn rubric_value(&mut self, value: &RubricValue) {
        if let RubricValue::Param(ident) = value {
            self.use_name(ident);
        }
    }

    /// A name used as a value: a local, a module name, or a built-in value.
    fn use_name(&mut self, ident: &ast::Ident) {
        let def = self
            .locals
            .iter()
            .rev()
            .find(|d| d.name == ident.name)
            .or_else(|| self.index.top.get(&ident.name))
            .cloned()
            .or_else(|| builtin(&ident.name));
        if let Some(def) = def {
            self.index.occurrences.push(Occurrence {
                span: ident.span,
                def,
                is_def: false,
            });
        }
    }

    fn expr(&mut self, expr: &Expr) {
        match &expr.kind {
            ExprKind::Number { .. } | ExprKind::Bool(_) => {}
            ExprKind::Name(ident) => self.use_name(ident),
            ExprKind::Other(ident) => {
                if let Some(def) = self.index.top.get(&ident.name).cloned() {
                    self.index.occurrences.push(Occurrence {
                        span: ident.span,
                        def,
                        is_def: false,
                    });
                }
            }
            ExprKind::Unary { operand, .. } => self.expr(operand),
            ExprKind::Binary { lhs, rhs, .. } => {
                self.expr(lhs);
                self.expr(rhs);
            }
            ExprKind::Paren(inner) => self.expr(inner),
            ExprKind::Call { func, args, over } => {
                let callee = self
                    .index
                    .function(&func.name)
                    .cloned()
                    .or_else(|| builtin(&func.name));
                if let Some(def) = &callee {
                    self.index.occurrences.push(Occurrence {
                        span: func.span,
                        def: def.clone(),
                        is_def: false,
                    });
                }
                for arg in args {
                    if let (Some(name), Some(def)) = (&arg.name, &callee) {
                        if let Some(param) = def.params.iter().find(|p| p.name == name.name) {
                            self.index.occurrences.push(Occurrence {
                                span: name.span,
                                def: param.clone(),
                                is_def: false,
                            });
                        }
                    }
                    self.expr(&arg.value);
                }
                if let Some(over) = over {
                    for axis in &over.axes {
                        if let Some(def) = self
                            .index
                            .top
                            .get(&axis.name)
                            .filter(|d| d.kind == DefKind::Rubric)
                            .cloned()
                        {
                            self.index.occurrences.push(Occurrence {
                                span: axis.span,
                                def,
                                is_def: false,
                            });
                        }
                    }
                }
            }
            ExprKind::Index { base, criterion } => {
                self.expr(base);
                if let Some(def) = self
                    .index
                    .criteria
                    .iter()
                    .find(|c| c.name == criterion.name)
                    .cloned()
                {
                    self.index.occurrences.push(Occurrence {
                        span: criterion.span,
                        def,
                        is_def: false,
                    });
                }
            }
            ExprKind::Block { lets, body } => {
                let depth = self.locals.len();
                for local in lets {
                    self.expr(&local.value);
                    let def = self.def(
                        &local.name,
                        DefKind::Local,
                        format!("let {}", local.name.name),
                        &[],
                    );
                    self.index.occurrences.push(Occurrence {
                        span: local.name.span,
                        def: def.clone(),
                        is_def: true,
                    });
                    self.index.locals.push((
                        Span::new(local.value.span.end as usize, expr.span.end as usize),
                        def.clone(),
                    ));
                    self.locals.push(def);
                }
                self.expr(body);
                self.locals.truncate(depth);
            }
        }
    }
}

/// The `//` comment lines that open a module (what it is for), without the slashes.
fn header_comment(text: &str) -> Vec<String> {
    text.lines()
        .take_while(|line| line.starts_with("//"))
        .map(|line| line.trim_start_matches('/').trim().to_string())
        .collect()
}

/// A declaration shown on hover, cut to a readable length.
fn shorten(code: &str) -> String {
    const MAX_CHARS: usize = 160;
    if code.chars().count() <= MAX_CHARS {
        return code.to_string();
    }
    let cut: String = code.chars().take(MAX_CHARS).collect();
    format!("{cut} …")
}

/// A parameter as written: its name, type and default.
fn param_span(param: &ast::FnParam) -> Span {
    let mut span = param.name.span;
    if let Some(ty) = &param.ty {
        span = span.to(ty.span);
    }
    if let Some(default) = &param.default {
        span = span.to(default.span);
    }
    span
}

/// `line` without a trailing `//` comment (outside strings).
pub fn strip_comment(line: &str) -> &str {
    let mut in_string = false;
    let bytes = line.as_bytes();
    for index in 0..bytes.len() {
        match bytes[index] {
            b'"' => in_string = !in_string,
            b'/' if !in_string && bytes.get(index + 1) == Some(&b'/') => return &line[..index],
            _ => {}
        }
    }
    line
}

/// An item's span without its doc lines (the parser's item span starts at the first `///`).
pub fn item_code(text: &str, span: Span) -> Span {
    let mut start = span.start as usize;
    while let Some(rest) = text.get(start..span.end as usize) {
        let trimmed = rest.trim_start();
        if trimmed.starts_with("//") {
            let line_end = rest.find('\n').map_or(rest.len(), |n| n + 1);
            start += line_end;
        } else {
            start += rest.len() - trimmed.len();
            break;
        }
    }
    Span::new(start.min(span.end as usize), span.end as usize)
}

/// The span of `keyword` at the start of an item's code.
fn keyword_span(text: &str, item: Span, keyword: &str) -> Option<Span> {
    let code = item_code(text, item);
    let found = text.get(code.range())?;
    found
        .starts_with(keyword)
        .then(|| Span::new(code.start as usize, code.start as usize + keyword.len()))
}
