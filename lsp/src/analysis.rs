//! One open document, analysed: the compiler's check (diagnostics and, when clean, the typed HIR), the
//! parse, and the name index. Rebuilt from the whole text after every change (a recipe is small: the
//! check of the largest shipped recipe takes milliseconds).

use std::path::PathBuf;

use lsp_types::{
    Diagnostic as LspDiagnostic, DiagnosticRelatedInformation, DiagnosticSeverity, Location,
    NumberOrString, Position, Range, Url,
};
use rlx_compiler::source::{FileId, Origin, SourceMap};
use rlx_compiler::syntax::ast::{ItemKind, Module, Span};
use rlx_compiler::syntax::parse_module;
use rlx_compiler::{Checked, Diagnostic, Severity};

use crate::index::{self, ModuleIndex, ModuleSource};
use crate::text::{range_in, LineIndex};

pub struct Analysis {
    pub uri: Url,
    pub text: String,
    pub lines: LineIndex,
    /// The folder that relative imports are resolved in (a `file:` document's folder).
    pub folder: Option<PathBuf>,
    /// The compiler's check of the text (none for a standard-library document).
    pub checked: Option<Checked>,
    /// The parse of the text, when it parses.
    pub module: Option<Module>,
    /// The names of the text, or of its last text that parsed while it does not.
    pub index: ModuleIndex,
    /// Whether `index` is of the current text.
    pub index_current: bool,
    /// (span, type) of every expression of the document in the checked HIR, when the check is clean.
    pub types: Vec<(Span, String)>,
}

impl Analysis {
    /// Analyse `text` as the document `uri`. `previous` supplies the last index when the text does not
    /// parse (completion keeps offering the names the document had).
    pub fn new(uri: Url, text: String, previous: Option<&Analysis>) -> Analysis {
        let lines = LineIndex::new(&text);
        let path = (uri.scheme() == "file")
            .then(|| uri.to_file_path().ok())
            .flatten();
        let folder = path
            .as_ref()
            .and_then(|p| p.parent().map(PathBuf::from))
            .filter(|folder| folder.is_dir());
        let is_std = index::std_module_of(&uri).is_some();
        let checked = (!is_std).then(|| {
            let mut sources = SourceMap::new();
            let name = path
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| uri.to_string());
            // A saved file is checked at its path, so that its relative imports resolve as for
            // `rlxc check`; the text is the editor's.
            let origin = match path.as_ref().and_then(|p| p.canonicalize().ok()) {
                Some(canonical) => Origin::Path(canonical),
                None => Origin::Memory,
            };
            let root = sources.add(name, text.clone(), origin);
            rlx_compiler::check_sources(sources, root)
        });
        let module = parse_module(FileId(0), &text).ok();
        let (index, index_current) = match &module {
            Some(module) => (
                index::index_module(
                    &ModuleSource {
                        uri: &uri,
                        text: &text,
                        folder: folder.as_deref(),
                    },
                    module,
                ),
                true,
            ),
            None => (previous.map(|p| p.index.clone()).unwrap_or_default(), false),
        };
        let mut types = Vec::new();
        if let Some(Checked {
            recipe: Some(recipe),
            root,
            ..
        }) = &checked
        {
            recipe.for_each_expr(|expr| {
                if expr.file == *root && !expr.span.is_empty() {
                    types.push((expr.span, expr.ty.to_string()));
                }
            });
            for input in &recipe.inputs {
                types.push((input.span, input.ty.to_string()));
            }
        }
        Analysis {
            uri,
            text,
            lines,
            folder,
            checked,
            module,
            index,
            index_current,
            types,
        }
    }

    /// A document whose analysis failed: its text, and nothing known about it.
    pub fn text_only(uri: Url, text: String) -> Analysis {
        Analysis {
            uri,
            lines: LineIndex::new(&text),
            text,
            folder: None,
            checked: None,
            module: None,
            index: ModuleIndex::default(),
            index_current: false,
            types: Vec::new(),
        }
    }

    pub fn offset(&self, position: Position) -> usize {
        self.lines.offset(&self.text, position)
    }

    pub fn range(&self, span: Span) -> Range {
        self.lines.range(&self.text, span)
    }

    /// The distinct types of the smallest expressions that contain `offset` (a function body's node
    /// has one type per call).
    pub fn types_at(&self, offset: usize) -> Option<(Span, Vec<String>)> {
        let offset = offset as u32;
        let containing = self
            .types
            .iter()
            .filter(|(span, _)| span.start <= offset && offset <= span.end);
        let smallest = containing.clone().map(|(span, _)| span.len()).min()?;
        let mut span = Span::default();
        let mut found: Vec<String> = Vec::new();
        for (s, ty) in containing.filter(|(s, _)| s.len() == smallest) {
            span = *s;
            if !found.contains(ty) {
                found.push(ty.clone());
            }
        }
        Some((span, found))
    }

    /// The compiler's diagnostics as LSP diagnostics of this document.
    pub fn diagnostics(&self) -> Vec<LspDiagnostic> {
        let Some(checked) = &self.checked else {
            return Vec::new();
        };
        checked
            .diagnostics
            .iter()
            .map(|d| self.to_lsp(checked, d))
            .collect()
    }

    /// Where a diagnostic's span lies, as an LSP location (another file: its own URI).
    fn location(&self, checked: &Checked, file: FileId, span: Span) -> Option<Location> {
        if file == checked.root {
            return Some(Location::new(self.uri.clone(), self.range(span)));
        }
        let source = checked.sources.files().find(|(id, _)| *id == file)?.1;
        let uri = match &source.origin {
            Origin::Path(path) => Url::from_file_path(path).ok()?,
            Origin::Stdlib(name) => index::std_uri(name),
            Origin::Memory => return None,
        };
        Some(Location::new(uri, range_in(&source.text, span)))
    }

    /// The range in this document that a diagnostic of another file is shown at: the import that
    /// brings that file in (the start of the document if none does, e.g. a bundled `std/rubric`).
    fn import_range(&self, checked: &Checked, file: FileId) -> Range {
        let target = checked
            .sources
            .files()
            .find(|(id, _)| *id == file)
            .map(|(_, f)| &f.origin);
        let wanted = match target {
            Some(Origin::Path(path)) => Url::from_file_path(path).ok(),
            Some(Origin::Stdlib(name)) => Some(index::std_uri(name)),
            _ => None,
        };
        self.index
            .imports
            .iter()
            .find(|import| import.target.is_some() && import.target == wanted)
            .filter(|_| self.index_current)
            .map(|import| self.range(import.source_span))
            .unwrap_or_default()
    }

    fn to_lsp(&self, checked: &Checked, diagnostic: &Diagnostic) -> LspDiagnostic {
        let primary = diagnostic.labels.first();
        let here = diagnostic.file == checked.root;
        let range = match (here, primary) {
            (true, Some(label)) => self.range(label.span),
            (true, None) => Range::default(),
            (false, _) => self.import_range(checked, diagnostic.file),
        };
        let mut message = diagnostic.message.clone();
        if let Some(label) = primary.filter(|l| !l.message.is_empty()) {
            if !message.contains(&label.message) {
                message.push_str(&format!(" ({})", label.message));
            }
        }
        if !here {
            let source = checked.sources.get(diagnostic.file);
            let name = match (&source.origin, &self.folder) {
                (Origin::Path(path), Some(folder)) => folder
                    .canonicalize()
                    .ok()
                    .and_then(|folder| path.strip_prefix(folder).ok())
                    .map(|rest| format!("./{}", rest.display()))
                    .unwrap_or_else(|| source.name.clone()),
                _ => source.name.clone(),
            };
            message = format!("in {name}: {message}");
        }
        if let Some(help) = &diagnostic.help {
            message.push_str(&format!("\nhelp: {help}"));
        }
        let mut related = Vec::new();
        let secondary = if here {
            diagnostic.labels.iter().skip(1).collect::<Vec<_>>()
        } else {
            diagnostic.labels.iter().collect()
        };
        for label in secondary {
            if let Some(location) = self.location(checked, diagnostic.file, label.span) {
                related.push(DiagnosticRelatedInformation {
                    location,
                    message: label.message.clone(),
                });
            }
        }
        for inner in &diagnostic.related {
            let span = inner.primary_span().unwrap_or_default();
            if let Some(location) = self.location(checked, inner.file, span) {
                let mut text = inner.message.clone();
                if let Some(label) = inner.labels.first().filter(|l| !l.message.is_empty()) {
                    text.push_str(&format!(" ({})", label.message));
                }
                related.push(DiagnosticRelatedInformation {
                    location,
                    message: text,
                });
            }
        }
        LspDiagnostic {
            range,
            severity: Some(match diagnostic.severity {
                Severity::Error => DiagnosticSeverity::ERROR,
                Severity::Warning => DiagnosticSeverity::WARNING,
            }),
            code: Some(NumberOrString::String(diagnostic.code.to_string())),
            code_description: None,
            source: Some("rlx".into()),
            message,
            related_information: (!related.is_empty()).then_some(related),
            tags: None,
            data: Some(serde_json::json!({ "help": diagnostic.help })),
        }
    }

    /// The compiler diagnostics of this document whose primary span is `span`-overlapping.
    pub fn diagnostics_in(&self, span: Span) -> Vec<&Diagnostic> {
        let Some(checked) = &self.checked else {
            return Vec::new();
        };
        checked
            .diagnostics
            .iter()
            .filter(|d| d.file == checked.root)
            .filter(|d| {
                d.primary_span()
                    .is_some_and(|s| s.start <= span.end && span.start <= s.end)
            })
            .collect()
    }

    /// The import items of the parse: (std module name or path as written, span of the whole item,
    /// the names list if written).
    pub fn import_items(&self) -> Vec<(&rlx_compiler::syntax::ast::Import, Span)> {
        let Some(module) = &self.module else {
            return Vec::new();
        };
        module
            .items
            .iter()
            .filter_map(|item| match &item.kind {
                ItemKind::Import(import) => Some((import, index::item_code(&self.text, item.span))),
                _ => None,
            })
            .collect()
    }
}
