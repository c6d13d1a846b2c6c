//! The requests: hover, definition, references, completion, signature help, document symbols,
//! formatting, rename and code actions, each a function of one document's `Analysis` (and, for
//! references and rename, of the other open documents).

use std::collections::HashMap;

use lsp_types::{
    CodeAction, CodeActionKind, CompletionItem, CompletionItemKind, CompletionTextEdit,
    DocumentSymbol, Documentation, Hover, HoverContents, Location, MarkupContent, MarkupKind,
    ParameterInformation, ParameterLabel, Position, Range, SignatureHelp, SignatureInformation,
    SymbolKind, TextEdit, Url, WorkspaceEdit,
};
use rlx_compiler::check::builtins;
use rlx_compiler::check::types::Level;
use rlx_compiler::format::format_source;
use rlx_compiler::source::FileId;
use rlx_compiler::stdlib;
use rlx_compiler::syntax::ast::{self, ImportSource, ItemKind, RubricEntry, Span};
use rlx_compiler::syntax::parser::RESERVED_WORDS;

use crate::analysis::Analysis;
use crate::index::{self, builtin, Def, DefKind, Occurrence};

/// The words that are keywords only where the grammar expects them (grammar/rlx.pest, the `kw_`
/// rules); the reserved ones are the parser's `RESERVED_WORDS`.
const CONTEXTUAL_KEYWORDS: &[&str] = &[
    "reward",
    "advantage",
    "loss",
    "policy",
    "value",
    "criterion",
    "weight",
    "points",
    "levels",
    "veto",
    "critical",
    "saturate",
    "interact",
    "aggregate",
    "on_veto",
    "shape",
];

/// Keywords offered by completion.
fn keywords() -> impl Iterator<Item = &'static str> {
    RESERVED_WORDS.iter().chain(CONTEXTUAL_KEYWORDS).copied()
}

fn markdown(value: String) -> MarkupContent {
    MarkupContent {
        kind: MarkupKind::Markdown,
        value,
    }
}

/// `std/NAME`, line N: where a definition lives, for hover.
fn citation(def: &Def, current: &Url) -> Option<String> {
    let location = def.location.as_ref()?;
    let line = location.range.start.line + 1;
    if let Some(module) = index::std_module_of(&location.uri) {
        return Some(format!(
            "defined in `std/{module}` (stdlib/{module}.rlx:{line})"
        ));
    }
    if &location.uri == current {
        return None;
    }
    let path = location.uri.to_file_path().ok();
    let folder = current
        .to_file_path()
        .ok()
        .and_then(|p| p.parent().map(std::path::Path::to_path_buf));
    // A relative import: the path as the recipe writes it.
    let shown = match (&path, &folder) {
        (Some(path), Some(folder)) => path
            .strip_prefix(folder)
            .map(|rest| format!("./{}", rest.display()))
            .unwrap_or_else(|_| path.display().to_string()),
        (Some(path), None) => path.display().to_string(),
        (None, _) => location.uri.to_string(),
    };
    Some(format!("defined in `{shown}`:{line}"))
}

fn describe(def: &Def, current: &Url) -> String {
    let mut out = format!("```rlx\n{}\n```", def.detail);
    let doc: Vec<&str> = def.doc.iter().map(String::as_str).collect();
    if !doc.is_empty() {
        out.push_str("\n\n");
        out.push_str(&doc.join("\n"));
    }
    if let Some(citation) = citation(def, current) {
        out.push_str(&format!("\n\n*{citation}*"));
    }
    out
}

pub fn hover(analysis: &Analysis, position: Position) -> Option<Hover> {
    let offset = analysis.offset(position);
    let occurrence = analysis
        .index_current
        .then(|| analysis.index.occurrence_at(offset))
        .flatten();
    let types = analysis.types_at(offset);
    let mut parts = Vec::new();
    let mut range = None;
    if let Some((span, types)) = &types {
        let shown: Vec<String> = types.iter().map(|t| format!("`{t}`")).collect();
        // On a function's name, the smallest typed expression is its call: say what it returns.
        let call = occurrence.is_some_and(|o| {
            o.span != *span
                && matches!(o.def.kind, DefKind::Fn | DefKind::Rubric | DefKind::Builtin)
        });
        let what = if call { "returns" } else { "type" };
        parts.push(format!("{what} {}", shown.join(" or ")));
        range = Some(analysis.range(*span));
    }
    if let Some(occurrence) = occurrence {
        let def = &occurrence.def;
        if def.kind == DefKind::Let || def.kind == DefKind::Section {
            // A `let`'s value type, from its definition's expression.
            if types.is_none() {
                if let Some(ty) = global_type(analysis, &def.name) {
                    parts.push(format!("type `{ty}`"));
                }
            }
        }
        parts.push(describe(def, &analysis.uri));
        range = Some(analysis.range(occurrence.span));
    }
    if parts.is_empty() {
        return None;
    }
    Some(Hover {
        contents: HoverContents::Markup(markdown(parts.join("\n\n"))),
        range,
    })
}

/// The type of a top-level `let` or section of the checked recipe.
fn global_type(analysis: &Analysis, name: &str) -> Option<String> {
    let recipe = analysis.checked.as_ref()?.recipe.as_ref()?;
    recipe
        .globals
        .iter()
        .find(|g| g.name == name)
        .map(|g| g.expr.ty.to_string())
}

pub fn definition(analysis: &Analysis, position: Position) -> Option<Location> {
    let offset = analysis.offset(position);
    analysis
        .index
        .occurrence_at(offset)
        .filter(|_| analysis.index_current)
        .and_then(|o| o.def.location.clone())
}

/// Every occurrence of the definition at `position`, in this document and the other open ones.
pub fn references(
    analysis: &Analysis,
    position: Position,
    documents: &HashMap<Url, Analysis>,
    include_declaration: bool,
) -> Option<Vec<Location>> {
    let offset = analysis.offset(position);
    let target = analysis
        .index
        .occurrence_at(offset)
        .filter(|_| analysis.index_current)?
        .def
        .clone();
    target.location.as_ref()?;
    let mut found: Vec<Location> = Vec::new();
    let mut visit = |doc: &Analysis| {
        if !doc.index_current {
            return;
        }
        for occurrence in &doc.index.occurrences {
            if occurrence.def.same(&target) && (include_declaration || !occurrence.is_def) {
                let location = Location::new(doc.uri.clone(), doc.range(occurrence.span));
                if !found.contains(&location) {
                    found.push(location);
                }
            }
        }
    };
    visit(analysis);
    let mut others: Vec<&Analysis> = documents
        .values()
        .filter(|d| d.uri != analysis.uri)
        .collect();
    others.sort_by(|a, b| a.uri.as_str().cmp(b.uri.as_str()));
    for doc in others {
        visit(doc);
    }
    if include_declaration {
        if let Some(location) = &target.location {
            if !found.contains(location) {
                found.insert(0, location.clone());
            }
        }
    }
    Some(found)
}

/// Rename a local name (`let`, a block's `let`, a function parameter) everywhere it is used.
pub fn rename(
    analysis: &Analysis,
    position: Position,
    new_name: &str,
    documents: &HashMap<Url, Analysis>,
) -> Result<WorkspaceEdit, String> {
    let occurrence = prepare_rename(analysis, position)?;
    if !is_identifier(new_name) {
        return Err(format!("`{new_name}` is not a name"));
    }
    let section = ["reward", "advantage", "loss"].contains(&new_name);
    if RESERVED_WORDS.contains(&new_name) || section || builtins::all_names().any(|b| b == new_name)
    {
        return Err(format!("`{new_name}` is a keyword or built-in name"));
    }
    let target = occurrence.def.clone();
    let mut changes: HashMap<Url, Vec<TextEdit>> = HashMap::new();
    let mut edit = |doc: &Analysis| {
        for o in &doc.index.occurrences {
            if o.def.same(&target) {
                changes
                    .entry(doc.uri.clone())
                    .or_default()
                    .push(TextEdit::new(doc.range(o.span), new_name.into()));
            }
        }
    };
    edit(analysis);
    for doc in documents.values().filter(|d| d.uri != analysis.uri) {
        if doc.index_current {
            edit(doc);
        }
    }
    for edits in changes.values_mut() {
        edits.sort_by_key(|e| (e.range.start.line, e.range.start.character));
        edits.dedup();
    }
    Ok(WorkspaceEdit::new(changes))
}

/// The name at `position`, if it can be renamed.
pub fn prepare_rename(analysis: &Analysis, position: Position) -> Result<&Occurrence, String> {
    if !analysis.index_current {
        return Err("the file does not parse".into());
    }
    if analysis.checked.is_none() {
        return Err("the standard library is read-only".into());
    }
    let offset = analysis.offset(position);
    let occurrence = analysis.index.occurrence_at(offset).ok_or("no name here")?;
    let local = matches!(
        occurrence.def.kind,
        DefKind::Let | DefKind::Local | DefKind::FnParam
    );
    let here = occurrence
        .def
        .location
        .as_ref()
        .is_some_and(|l| l.uri == analysis.uri);
    if !local || !here {
        return Err(format!(
            "only names local to this file can be renamed (`let`s and function parameters); `{}` is not one",
            occurrence.def.name
        ));
    }
    Ok(occurrence)
}

fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

// ---------------------------------------------------------------------------------------------
// Completion and signature help: what surrounds the cursor, read from the text (it rarely parses
// while being typed).

/// The innermost call whose parentheses are open at `offset`: (callee name, offset of `(`, commas at
/// its top level before `offset`, whether an `over` clause has started).
struct OpenCall {
    name: String,
    open: usize,
    commas: usize,
    after_over: bool,
}

/// `text` up to `offset` with comments and strings blanked out (same length, so offsets still hold).
fn code_before(text: &str, offset: usize) -> Vec<u8> {
    let mut out = text.as_bytes()[..offset.min(text.len())].to_vec();
    let mut index = 0;
    let mut in_string = false;
    while index < out.len() {
        let byte = out[index];
        if in_string {
            if byte == b'\\' && index + 1 < out.len() {
                out[index] = b' ';
                out[index + 1] = b' ';
                index += 2;
                continue;
            }
            if byte == b'"' || byte == b'\n' {
                in_string = false;
            } else {
                out[index] = b' ';
            }
        } else if byte == b'"' {
            in_string = true;
        } else if byte == b'/' && out.get(index + 1) == Some(&b'/') {
            while index < out.len() && out[index] != b'\n' {
                out[index] = b' ';
                index += 1;
            }
            continue;
        }
        index += 1;
    }
    out
}

fn is_ident_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_'
}

/// The identifier that ends at `end` in `code`.
fn ident_before(code: &[u8], end: usize) -> Option<(usize, String)> {
    let mut start = end;
    while start > 0 && is_ident_byte(code[start - 1]) {
        start -= 1;
    }
    (start < end && !code[start].is_ascii_digit()).then(|| {
        (
            start,
            String::from_utf8_lossy(&code[start..end]).into_owned(),
        )
    })
}

fn open_call(code: &[u8]) -> Option<OpenCall> {
    let mut stack: Vec<(u8, usize)> = Vec::new();
    for (index, &byte) in code.iter().enumerate() {
        match byte {
            b'(' | b'[' | b'{' => stack.push((byte, index)),
            b')' | b']' | b'}' => {
                stack.pop();
            }
            _ => {}
        }
    }
    let &(_, open) = stack.iter().rev().find(|(b, _)| *b == b'(')?;
    // Only the innermost bracket counts: `f(x[` is an index, not the call.
    if stack.last().map(|(b, _)| *b) != Some(b'(') {
        return None;
    }
    let (_, name) = ident_before(code, open)?;
    let mut depth = 0i32;
    let mut commas = 0;
    let mut after_over = false;
    let inner = &code[open + 1..];
    for (index, &byte) in inner.iter().enumerate() {
        match byte {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth -= 1,
            b',' if depth == 0 => commas += 1,
            b'o' if depth == 0
                && inner[index..].starts_with(b"over")
                && (index == 0 || !is_ident_byte(inner[index - 1]))
                && inner.get(index + 4).is_some_and(|b| !is_ident_byte(*b)) =>
            {
                after_over = true
            }
            _ => {}
        }
    }
    Some(OpenCall {
        name,
        open,
        commas,
        after_over,
    })
}

fn item(label: &str, kind: CompletionItemKind, detail: String, doc: &[String]) -> CompletionItem {
    CompletionItem {
        label: label.into(),
        kind: Some(kind),
        detail: Some(detail),
        documentation: (!doc.is_empty())
            .then(|| Documentation::MarkupContent(markdown(doc.join("\n")))),
        ..CompletionItem::default()
    }
}

fn def_item(def: &Def) -> CompletionItem {
    let kind = match def.kind {
        DefKind::Fn => CompletionItemKind::FUNCTION,
        DefKind::Builtin if def.detail.contains('(') => CompletionItemKind::FUNCTION,
        DefKind::Param => CompletionItemKind::CONSTANT,
        DefKind::Input => CompletionItemKind::FIELD,
        DefKind::Rubric => CompletionItemKind::STRUCT,
        DefKind::Criterion => CompletionItemKind::ENUM_MEMBER,
        DefKind::Module => CompletionItemKind::MODULE,
        _ => CompletionItemKind::VARIABLE,
    };
    item(&def.name, kind, def.detail.clone(), &def.doc)
}

fn level_items(analysis: &Analysis, with_others: bool) -> Vec<CompletionItem> {
    let mut items: Vec<CompletionItem> = [Level::Tok, Level::Resp, Level::Group, Level::Batch]
        .iter()
        .map(|level| {
            item(
                level.name(),
                CompletionItemKind::ENUM_MEMBER,
                "level".into(),
                &[],
            )
        })
        .collect();
    if !with_others {
        // A type's level (`bool[pair]`); in an `over` list, pairs reduce as `others`.
        items.insert(
            1,
            item(
                Level::Pair.name(),
                CompletionItemKind::ENUM_MEMBER,
                "level".into(),
                &[],
            ),
        );
    }
    if with_others {
        items.push(item(
            "others",
            CompletionItemKind::ENUM_MEMBER,
            "the other responses of the group (pairwise)".into(),
            &[],
        ));
    }
    for (feature, doc) in [
        ("crit", "feature axis: rubric criteria (ragged, from data)"),
        ("dim", "feature axis: embedding dimensions"),
    ] {
        items.push(item(
            feature,
            CompletionItemKind::ENUM_MEMBER,
            doc.into(),
            &[],
        ));
    }
    let mut rubrics: Vec<&Def> = analysis
        .index
        .top
        .values()
        .filter(|d| d.kind == DefKind::Rubric)
        .collect();
    rubrics.sort_by(|a, b| a.name.cmp(&b.name));
    items.extend(rubrics.into_iter().map(|d| {
        item(
            &d.name,
            CompletionItemKind::ENUM_MEMBER,
            "feature axis: the rubric's criteria".into(),
            &[],
        )
    }));
    items
}

pub fn completion(analysis: &Analysis, position: Position) -> Vec<CompletionItem> {
    let offset = analysis.offset(position);
    let code = code_before(&analysis.text, offset);
    let text = String::from_utf8_lossy(&code).into_owned();
    let line_start = text.rfind('\n').map_or(0, |n| n + 1);
    let line = &text[line_start..];
    // `import std/…` and `import std/mod.{…}`.
    if let Some(at) = text.rfind("import") {
        let tail = &text[at + "import".len()..];
        if let Some((source, names)) = tail.split_once(".{") {
            if !names.contains('}') {
                return import_name_items(analysis, source.trim(), names);
            }
        } else if !tail.contains('\n') && at >= line_start {
            let written = tail.trim_start();
            let start = offset - written.len();
            let range = Range::new(analysis.lines.position(&analysis.text, start), position);
            let mut names: Vec<&str> = stdlib::module_names().collect();
            names.sort();
            return names
                .into_iter()
                .map(|name| {
                    let full = format!("std/{name}");
                    let first_line = stdlib::module(name)
                        .and_then(|text| text.lines().next())
                        .map(|l| l.trim_start_matches('/').trim().to_string())
                        .unwrap_or_default();
                    CompletionItem {
                        text_edit: Some(CompletionTextEdit::Edit(TextEdit::new(
                            range,
                            full.clone(),
                        ))),
                        filter_text: Some(full.clone()),
                        ..item(&full, CompletionItemKind::MODULE, first_line, &[])
                    }
                })
                .collect();
        }
    }
    // `x[…`: criterion names, or in a type `f32[…`: levels and feature axes.
    let word_start = ident_before(&code, code.len()).map_or(code.len(), |(s, _)| s);
    let before_word = code[..word_start].trim_ascii_end();
    if before_word.ends_with(b"[") || (before_word.ends_with(b",") && line.contains('[')) {
        let bracket = line.rfind('[').map(|i| line_start + i);
        if let Some(bracket) = bracket.filter(|b| !text[*b..].contains(']')) {
            let head = text[..bracket].trim_end();
            if ["f32", "i32", "bool"].iter().any(|t| head.ends_with(t)) {
                return level_items(analysis, false);
            }
            let mut criteria = analysis.index.criteria.clone();
            criteria.sort_by(|a, b| a.name.cmp(&b.name));
            return criteria.iter().map(def_item).collect();
        }
    }
    // `other.NAME` (inside `… over others`): the recipe's inputs, `let`s and sections.
    if before_word.ends_with(b"other.") {
        let mut names: Vec<&Def> = analysis
            .index
            .top
            .values()
            .filter(|d| matches!(d.kind, DefKind::Input | DefKind::Let | DefKind::Section))
            .collect();
        names.sort_by(|a, b| a.name.cmp(&b.name));
        return names.into_iter().map(def_item).collect();
    }
    let call = open_call(&code);
    if let Some(call) = &call {
        if call.after_over {
            return level_items(analysis, true);
        }
    }
    // Names in scope, then the named arguments of the open call, the built-ins and the keywords.
    let mut items: Vec<CompletionItem> = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    if let Some(call) = &call {
        if let Some(def) = analysis.index.function(&call.name) {
            // Parameters not already given by position.
            for param in def.params.iter().skip(call.commas) {
                seen.push(format!("{} =", param.name));
                items.push(CompletionItem {
                    insert_text: Some(format!("{} = ", param.name)),
                    sort_text: Some(format!("0{}", param.name)),
                    ..item(
                        &format!("{} =", param.name),
                        CompletionItemKind::FIELD,
                        param.detail.clone(),
                        &[],
                    )
                });
            }
        }
    }
    for def in analysis.index.names_at(offset) {
        if !seen.contains(&def.name) {
            seen.push(def.name.clone());
            items.push(def_item(def));
        }
    }
    let builtin_names = builtins::FUNCS
        .iter()
        .map(|f| f.name)
        .chain(builtins::REDUCTIONS.iter().map(|r| r.name))
        .chain(builtins::AXIS_OPS.iter().map(|(n, _)| *n))
        .chain(builtins::VALUES.iter().map(|v| v.name));
    for name in builtin_names {
        if !seen.iter().any(|s| s == name) {
            if let Some(def) = builtin(name) {
                seen.push(name.to_string());
                items.push(def_item(&def));
            }
        }
    }
    for keyword in keywords() {
        if !seen.iter().any(|s| s == keyword) {
            items.push(item(
                keyword,
                CompletionItemKind::KEYWORD,
                "keyword".into(),
                &[],
            ));
        }
    }
    items
}

/// The functions of the module named in `import SOURCE.{…`, less those already listed.
fn import_name_items(analysis: &Analysis, source: &str, listed: &str) -> Vec<CompletionItem> {
    let source = if let Some(name) = source.strip_prefix("std/") {
        ImportSource::Std(name.to_string())
    } else {
        ImportSource::Relative(source.trim_matches('"').to_string())
    };
    let Some((uri, text)) = index::load_import(&source, analysis.folder.as_deref()) else {
        return Vec::new();
    };
    let listed: Vec<&str> = listed.split(',').map(str::trim).collect();
    index::functions_of(&uri, &text)
        .iter()
        .filter(|f| !listed.contains(&f.name.as_str()))
        .map(|f| {
            let mut completion = def_item(f);
            completion.kind = Some(CompletionItemKind::FUNCTION);
            completion
        })
        .collect()
}

pub fn signature_help(analysis: &Analysis, position: Position) -> Option<SignatureHelp> {
    let offset = analysis.offset(position);
    let code = code_before(&analysis.text, offset);
    let call = open_call(&code)?;
    let (label, params, doc): (String, Vec<String>, Vec<String>) =
        if let Some(def) = analysis.index.function(&call.name) {
            let names = def
                .params
                .iter()
                .map(|p| {
                    p.detail
                        .split(" (parameter of")
                        .next()
                        .unwrap_or(&p.name)
                        .to_string()
                })
                .collect::<Vec<_>>();
            (
                format!("{}({})", def.name, names.join(", ")),
                names,
                def.doc.clone(),
            )
        } else if let Some(sig) = builtins::func(&call.name) {
            let names: Vec<String> = sig.params.iter().map(|p| p.to_string()).collect();
            (
                format!("{}({})", sig.name, names.join(", ")),
                names,
                vec![sig.doc.to_string()],
            )
        } else if let Some(sig) = builtins::reduction(&call.name) {
            let mut names = vec!["x over AXES".to_string()];
            if matches!(sig.name, "std" | "var") {
                names.push("ddof = 0".into());
            }
            (
                format!("{}({})", sig.name, names.join(", ")),
                names,
                vec![sig.doc.to_string()],
            )
        } else if let Some((name, doc)) = builtins::AXIS_OPS.iter().find(|(n, _)| *n == call.name) {
            let signature = doc.split("): ").next().unwrap_or(name).to_string() + ")";
            let inner = signature
                .strip_prefix(&format!("{name}("))
                .and_then(|s| s.strip_suffix(')'))
                .unwrap_or("");
            let names = inner.split(", ").map(str::to_string).collect();
            (signature, names, vec![doc.to_string()])
        } else {
            return None;
        };
    // The active parameter: a named argument by its name, else by position (the commas of an `over`
    // clause separate axes, not arguments).
    let current_arg = code[call.open + 1..]
        .rsplit(|b| *b == b',')
        .next()
        .map(|s| String::from_utf8_lossy(s).trim().to_string())
        .unwrap_or_default();
    let named = current_arg
        .split_once('=')
        .filter(|(_, rest)| !rest.starts_with('='))
        .map(|(name, _)| name.trim().to_string());
    let active = match named {
        Some(name) => params
            .iter()
            .position(|p| p.split([' ', ':', '=']).next() == Some(name.as_str())),
        None if call.after_over && !params.is_empty() => {
            let over_commas = count_over_commas(&code[call.open + 1..]);
            Some(call.commas.saturating_sub(over_commas))
        }
        None => Some(call.commas),
    };
    let parameters = params
        .iter()
        .map(|p| ParameterInformation {
            label: ParameterLabel::Simple(p.clone()),
            documentation: None,
        })
        .collect();
    Some(SignatureHelp {
        signatures: vec![SignatureInformation {
            label,
            documentation: (!doc.is_empty())
                .then(|| Documentation::MarkupContent(markdown(doc.join("\n")))),
            parameters: Some(parameters),
            active_parameter: active.map(|a| a as u32),
        }],
        active_signature: Some(0),
        active_parameter: active.map(|a| a as u32),
    })
}

/// The commas of an `over` clause (between its axes) in a call's text.
fn count_over_commas(inner: &[u8]) -> usize {
    let text = String::from_utf8_lossy(inner);
    let Some(at) = text.find(" over ") else {
        return 0;
    };
    let clause = &text[at..];
    let mut count = 0;
    for part in clause.split(',').skip(1) {
        let word = part.trim();
        if word.is_empty() || word.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            count += 1;
        } else {
            break;
        }
    }
    count
}

// ---------------------------------------------------------------------------------------------
// Outline and formatting

#[allow(deprecated)] // `DocumentSymbol::deprecated` must be written out.
fn symbol(
    name: String,
    detail: Option<String>,
    kind: SymbolKind,
    range: Range,
    selection: Range,
    children: Vec<DocumentSymbol>,
) -> DocumentSymbol {
    DocumentSymbol {
        name,
        detail,
        kind,
        tags: None,
        deprecated: None,
        range,
        selection_range: selection,
        children: (!children.is_empty()).then_some(children),
    }
}

pub fn document_symbols(analysis: &Analysis) -> Vec<DocumentSymbol> {
    let Some(module) = &analysis.module else {
        return Vec::new();
    };
    let text = &analysis.text;
    let mut symbols = Vec::new();
    for item in &module.items {
        let code = index::item_code(text, item.span);
        let range = analysis.range(code);
        let head = |n: usize| Span::new(code.start as usize, code.start as usize + n);
        let first_line = |span: Span| {
            text.get(span.range())
                .and_then(|s| s.lines().next())
                .map(|l| index::strip_comment(l).trim().to_string())
        };
        let (name, kind, selection, children) = match &item.kind {
            ItemKind::Import(import) => (
                format!(
                    "import {}",
                    text.get(import.source_span.range()).unwrap_or("")
                ),
                SymbolKind::NAMESPACE,
                import.source_span,
                Vec::new(),
            ),
            ItemKind::Input(decl) => (
                decl.name.name.clone(),
                SymbolKind::FIELD,
                decl.name.span,
                Vec::new(),
            ),
            ItemKind::Param(decl) => (
                decl.name.name.clone(),
                SymbolKind::CONSTANT,
                decl.name.span,
                Vec::new(),
            ),
            ItemKind::Fn(decl) => (
                decl.name.name.clone(),
                SymbolKind::FUNCTION,
                decl.name.span,
                Vec::new(),
            ),
            ItemKind::Let(decl) => (
                decl.name.name.clone(),
                SymbolKind::VARIABLE,
                decl.name.span,
                Vec::new(),
            ),
            ItemKind::State(decl) => (
                decl.name.name.clone(),
                SymbolKind::VARIABLE,
                decl.name.span,
                Vec::new(),
            ),
            ItemKind::Rubric(decl) => {
                let children = decl
                    .entries
                    .iter()
                    .filter_map(|entry| match entry {
                        RubricEntry::Criterion(c) => Some(symbol(
                            c.name.name.clone(),
                            first_line(c.span),
                            SymbolKind::ENUM_MEMBER,
                            analysis.range(c.span),
                            analysis.range(c.name.span),
                            Vec::new(),
                        )),
                        _ => None,
                    })
                    .collect();
                (
                    decl.name.name.clone(),
                    SymbolKind::STRUCT,
                    decl.name.span,
                    children,
                )
            }
            ItemKind::Reward(_) => ("reward".into(), SymbolKind::EVENT, head(6), Vec::new()),
            ItemKind::Advantage(_) => ("advantage".into(), SymbolKind::EVENT, head(9), Vec::new()),
            ItemKind::Loss(_) => ("loss".into(), SymbolKind::EVENT, head(4), Vec::new()),
            ItemKind::Metric { name, .. } => (
                format!("metric {}", name.name),
                SymbolKind::PROPERTY,
                name.span,
                Vec::new(),
            ),
            ItemKind::Keep { level, .. } => (
                format!(
                    "keep {}",
                    match level {
                        ast::KeepLevel::Group => "group",
                        ast::KeepLevel::Resp => "resp",
                    }
                ),
                SymbolKind::OPERATOR,
                head(4),
                Vec::new(),
            ),
            ItemKind::Rollout(entries) => (
                "rollout".into(),
                SymbolKind::OBJECT,
                head(7),
                entries
                    .iter()
                    .map(|e| {
                        symbol(
                            e.key.name.clone(),
                            first_line(e.span),
                            SymbolKind::PROPERTY,
                            analysis.range(e.span),
                            analysis.range(e.key.span),
                            Vec::new(),
                        )
                    })
                    .collect(),
            ),
        };
        symbols.push(symbol(
            name,
            first_line(code),
            kind,
            range,
            analysis.range(selection),
            children,
        ));
    }
    symbols
}

/// The edit that formats the whole document as `rlxc fmt` does (none when already formatted).
pub fn formatting(analysis: &Analysis) -> Result<Vec<TextEdit>, String> {
    let formatted = format_source(FileId(0), &analysis.text).map_err(|errors| {
        let first = errors
            .first()
            .map(|e| e.message.clone())
            .unwrap_or_default();
        format!("cannot format: the file does not parse ({first})")
    })?;
    if formatted == analysis.text {
        return Ok(Vec::new());
    }
    let end = analysis.lines.position(&analysis.text, analysis.text.len());
    Ok(vec![TextEdit::new(
        Range::new(Position::new(0, 0), end),
        formatted,
    )])
}

// ---------------------------------------------------------------------------------------------
// Code actions: the fixes that a diagnostic's help spells out exactly.

/// The backticked snippets of a help text.
fn snippets(help: &str) -> Vec<&str> {
    help.split('`').skip(1).step_by(2).collect()
}

fn quick_fix(analysis: &Analysis, title: String, edits: Vec<TextEdit>) -> CodeAction {
    CodeAction {
        title,
        kind: Some(CodeActionKind::QUICKFIX),
        edit: Some(WorkspaceEdit::new(HashMap::from([(
            analysis.uri.clone(),
            edits,
        )]))),
        ..CodeAction::default()
    }
}

pub fn code_actions(analysis: &Analysis, range: Range) -> Vec<CodeAction> {
    let span = analysis.lines.span(&analysis.text, range);
    let mut actions = Vec::new();
    for diagnostic in analysis.diagnostics_in(span) {
        let Some(primary) = diagnostic.primary_span() else {
            continue;
        };
        let written = analysis.text.get(primary.range()).unwrap_or("");
        let help = diagnostic.help.as_deref().unwrap_or("");
        let replace = |title: String, new_text: String| {
            quick_fix(
                analysis,
                title,
                vec![TextEdit::new(analysis.range(primary), new_text)],
            )
        };
        // "did you mean `NAME`?"
        if let Some(rest) = help.strip_prefix("did you mean `") {
            if let Some(name) = rest.strip_suffix("`?") {
                actions.push(replace(
                    format!("Replace `{written}` with `{name}`"),
                    name.into(),
                ));
            }
        }
        for snippet in snippets(help) {
            // "write `over tok, batch`": the reduction's axes.
            if snippet.starts_with("over ") && written.starts_with("over") {
                actions.push(replace(format!("Write `{snippet}`"), snippet.into()));
            }
            // "e.g. `mean(x over tok)`", "`rubric(x)`": wrap the expression.
            if let Some(wrapped) = wrap(snippet, written) {
                actions.push(replace(format!("Wrap in `{snippet}`"), wrapped));
            }
            // "`input logp : f32[tok] policy`": mark the input.
            if let Some(decl) = snippet.strip_prefix("input ") {
                if let Some(action) = mark_policy(analysis, decl) {
                    actions.push(action);
                }
            }
        }
        if diagnostic.code == "rlx::unknown_function" || diagnostic.code == "rlx::unknown_name" {
            actions.extend(import_actions(analysis, written));
        }
    }
    actions
}

/// `op(x …)` with the expression in place of `x`.
fn wrap(snippet: &str, expression: &str) -> Option<String> {
    let (head, rest) = snippet.split_once("(x")?;
    let tail = rest.strip_suffix(')')?;
    let valid_head = !head.is_empty() && is_identifier(head);
    let valid_tail = tail.is_empty()
        || tail.strip_prefix(" over ").is_some_and(|axes| {
            axes.split(", ")
                .all(|a| !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        });
    (valid_head && valid_tail && !expression.is_empty())
        .then(|| format!("{head}({expression}{tail})"))
}

fn mark_policy(analysis: &Analysis, decl: &str) -> Option<CodeAction> {
    let name = decl.split(':').next()?.trim();
    let module = analysis.module.as_ref()?;
    let input = module.items.iter().find_map(|item| match &item.kind {
        ItemKind::Input(input) if input.name.name == name => Some(input),
        _ => None,
    })?;
    if input.role.is_some() {
        return None;
    }
    let at = analysis.range(Span::new(
        input.ty.span.end as usize,
        input.ty.span.end as usize,
    ));
    Some(quick_fix(
        analysis,
        format!("Mark `{name}` as the policy's log-probabilities"),
        vec![TextEdit::new(at, " policy".into())],
    ))
}

/// Import `name` from each standard-library module that defines it.
fn import_actions(analysis: &Analysis, name: &str) -> Vec<CodeAction> {
    if !is_identifier(name) {
        return Vec::new();
    }
    let mut modules: Vec<&str> = stdlib::module_names()
        .filter(|module| {
            let uri = index::std_uri(module);
            stdlib::module(module).is_some_and(|text| {
                index::functions_of(&uri, text)
                    .iter()
                    .any(|f| f.name == name)
            })
        })
        .collect();
    modules.sort();
    let imports = analysis.import_items();
    modules
        .into_iter()
        .filter_map(|module| {
            let existing = imports
                .iter()
                .find(|(import, _)| import.source == ImportSource::Std(module.into()));
            let edit = match existing {
                // `import std/m` imports everything already.
                Some((import, _)) => {
                    let last = import.names.as_ref()?.last()?;
                    TextEdit::new(
                        analysis.range(Span::new(last.span.end as usize, last.span.end as usize)),
                        format!(", {name}"),
                    )
                }
                None => {
                    let at = match imports.last() {
                        Some((_, span)) => {
                            let end = span.end as usize;
                            let line_end = analysis.text[end..]
                                .find('\n')
                                .map_or(analysis.text.len(), |n| end + n + 1);
                            Span::new(line_end, line_end)
                        }
                        None => analysis
                            .module
                            .as_ref()
                            .and_then(|m| m.items.first())
                            .map(|item| {
                                let code = index::item_code(&analysis.text, item.span);
                                Span::new(code.start as usize, code.start as usize)
                            })
                            .unwrap_or_default(),
                    };
                    let newline = if at.start as usize == analysis.text.len()
                        && !analysis.text.ends_with('\n')
                        && !analysis.text.is_empty()
                    {
                        "\n"
                    } else {
                        ""
                    };
                    TextEdit::new(
                        analysis.range(at),
                        format!("{newline}import std/{module}.{{{name}}}\n"),
                    )
                }
            };
            Some(quick_fix(
                analysis,
                format!("Import `{name}` from `std/{module}`"),
                vec![edit],
            ))
        })
        .collect()
}
