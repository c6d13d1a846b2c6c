//! Rubrics as data (docs/sharing.md): a TOML or JSON file of criteria — name, text, weight or points,
//! optional ordered levels, saturation, `critical` and `veto` flags, tags — that a recipe's rubric
//! block takes in with `criteria "FILE"` and that the judge signal can ask about. The file is
//! untrusted input: every error is a diagnostic in the file, at the key (TOML spans from `toml_edit`,
//! JSON spans from the small parser below), and sizes and nesting are capped.
//!
//! ```toml
//! description = "House style"
//! [[criteria]]
//! name = "voice"
//! text = "The response uses the active voice."
//! weight = 3
//! levels = [0, 0.5, 1]
//! saturate = { kind = "tanh", k = 3 }
//! tags = ["style"]
//! ```

use crate::diagnostic::Diagnostic;
use crate::source::FileId;
use crate::syntax::ast::{
    CriterionAttr, CriterionDecl, Ident, Literal, LiteralValue, RubricValue, ShapeCall, Span,
};

/// Most criteria in one file.
pub const MAX_CRITERIA: usize = 1000;
/// Deepest nesting of arrays and tables accepted in a JSON rubric file.
const MAX_JSON_DEPTH: usize = 32;

/// The saturations a criterion may name, with their arguments (as in a rubric block).
const SATURATIONS: &[(&str, &[&str])] = &[("cap", &["kappa"]), ("tanh", &["k"]), ("exp", &["k"])];

/// One criterion of a rubric file.
#[derive(Clone, Debug, PartialEq)]
pub struct Criterion {
    pub name: String,
    /// What the judge is asked.
    pub text: String,
    pub weight: Option<f64>,
    pub points: Option<f64>,
    pub levels: Vec<f64>,
    /// `(kind, [(argument, value)])`.
    pub saturate: Option<(String, Vec<(String, f64)>)>,
    pub critical: bool,
    pub veto: bool,
    pub tags: Vec<String>,
}

/// A validated rubric file.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct RubricFile {
    pub description: Option<String>,
    pub criteria: Vec<Criterion>,
}

impl RubricFile {
    /// The criteria as rubric-block entries, every span at `at` (the `criteria` entry of the recipe).
    pub fn criterion_decls(&self, at: Span) -> Vec<CriterionDecl> {
        let number = |value: f64| {
            RubricValue::Number(Literal {
                value: LiteralValue::Number {
                    value,
                    is_int: false,
                },
                text: format!("{value:?}"),
                span: at,
            })
        };
        let ident = |name: &str| Ident {
            name: name.to_string(),
            span: at,
        };
        self.criteria
            .iter()
            .map(|criterion| {
                let mut attrs = Vec::new();
                if let Some(weight) = criterion.weight {
                    attrs.push(CriterionAttr::Weight(number(weight)));
                }
                if let Some(points) = criterion.points {
                    attrs.push(CriterionAttr::Points(number(points)));
                }
                if !criterion.levels.is_empty() {
                    let levels = criterion
                        .levels
                        .iter()
                        .map(|&value| Literal {
                            value: LiteralValue::Number {
                                value,
                                is_int: false,
                            },
                            text: format!("{value:?}"),
                            span: at,
                        })
                        .collect();
                    attrs.push(CriterionAttr::Levels(levels, at));
                }
                if criterion.veto {
                    attrs.push(CriterionAttr::Veto(at));
                }
                if criterion.critical {
                    attrs.push(CriterionAttr::Critical(at));
                }
                if let Some((kind, args)) = &criterion.saturate {
                    attrs.push(CriterionAttr::Saturate(ShapeCall {
                        name: ident(kind),
                        args: args
                            .iter()
                            .map(|(name, value)| (ident(name), number(*value)))
                            .collect(),
                        parens: true,
                        span: at,
                    }));
                }
                CriterionDecl {
                    name: ident(&criterion.name),
                    attrs,
                    span: at,
                    text: Some(criterion.text.clone()),
                }
            })
            .collect()
    }
}

/// A parsed value with the span of its text.
#[derive(Clone, Debug)]
struct Node {
    value: Value,
    span: Span,
}

#[derive(Clone, Debug)]
enum Value {
    Bool(bool),
    Number(f64),
    String(String),
    Array(Vec<Node>),
    /// Entries in order: key, the key's span, value.
    Table(Vec<(String, Span, Node)>),
    /// A TOML date or time.
    Other,
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Table(_) => "a table",
        Value::Other => "a date",
    }
}

fn range_span(range: Option<std::ops::Range<usize>>) -> Span {
    range.map_or(Span::default(), |r| Span::new(r.start, r.end))
}

fn rubric_error(file: FileId, at: Span, message: impl Into<String>) -> Diagnostic {
    Diagnostic::error("rlx::rubric_file", file, message).label(at, "here")
}

/// Parse and validate a rubric file's text; `json` selects JSON, otherwise TOML.
pub fn parse(file: FileId, text: &str, json: bool) -> Result<RubricFile, Vec<Diagnostic>> {
    let root = if json {
        parse_json(text).map_err(|(at, message)| {
            vec![rubric_error(file, at, format!("invalid JSON: {message}"))]
        })?
    } else {
        let document = toml_edit::ImDocument::parse(text).map_err(|error| {
            vec![rubric_error(
                file,
                range_span(error.span()),
                format!("invalid TOML: {}", error.message().trim()),
            )]
        })?;
        Node {
            value: toml_table(document.as_table()),
            span: Span::new(0, text.len()),
        }
    };
    validate(file, &root)
}

fn toml_table(table: &toml_edit::Table) -> Value {
    Value::Table(
        table
            .iter()
            .map(|(key, item)| {
                let key_span = table
                    .get_key_value(key)
                    .and_then(|(k, _)| k.span())
                    .map_or(Span::default(), |r| Span::new(r.start, r.end));
                (key.to_string(), key_span, toml_item(item))
            })
            .collect(),
    )
}

fn toml_item(item: &toml_edit::Item) -> Node {
    let span = range_span(item.span());
    let value = match item {
        toml_edit::Item::None => Value::Other,
        toml_edit::Item::Value(value) => return toml_value(value),
        toml_edit::Item::Table(table) => toml_table(table),
        toml_edit::Item::ArrayOfTables(tables) => Value::Array(
            tables
                .iter()
                .map(|table| Node {
                    value: toml_table(table),
                    span: range_span(table.span()),
                })
                .collect(),
        ),
    };
    Node { value, span }
}

fn toml_value(value: &toml_edit::Value) -> Node {
    use toml_edit::Value as V;
    let span = range_span(value.span());
    let value = match value {
        V::String(s) => Value::String(s.value().clone()),
        V::Integer(i) => Value::Number(*i.value() as f64),
        V::Float(f) => Value::Number(*f.value()),
        V::Boolean(b) => Value::Bool(*b.value()),
        V::Datetime(_) => Value::Other,
        V::Array(array) => Value::Array(array.iter().map(toml_value).collect()),
        V::InlineTable(table) => Value::Table(
            table
                .iter()
                .map(|(key, value)| {
                    let key_span = table
                        .get_key_value(key)
                        .and_then(|(k, _)| k.span())
                        .map_or(Span::default(), |r| Span::new(r.start, r.end));
                    (key.to_string(), key_span, toml_value(value))
                })
                .collect(),
        ),
    };
    Node { value, span }
}

/// The keys a table may have; the first unknown one is an error at its key.
fn known_keys(
    file: FileId,
    entries: &[(String, Span, Node)],
    known: &[&str],
    what: &str,
    errors: &mut Vec<Diagnostic>,
) {
    for (key, key_span, _) in entries {
        if !known.contains(&key.as_str()) {
            errors.push(
                Diagnostic::error(
                    "rlx::rubric_file",
                    file,
                    format!("unknown key `{key}` in {what}"),
                )
                .label(*key_span, "unknown key")
                .help(format!("the keys are: {}", known.join(", "))),
            );
        }
    }
}

fn get<'a>(entries: &'a [(String, Span, Node)], key: &str) -> Option<(&'a Span, &'a Node)> {
    entries
        .iter()
        .find(|(k, _, _)| k == key)
        .map(|(_, span, node)| (span, node))
}

fn validate(file: FileId, root: &Node) -> Result<RubricFile, Vec<Diagnostic>> {
    let mut errors = Vec::new();
    let Value::Table(entries) = &root.value else {
        return Err(vec![rubric_error(
            file,
            root.span,
            format!("a rubric file is a table, not {}", kind(&root.value)),
        )]);
    };
    known_keys(
        file,
        entries,
        &["description", "criteria"],
        "a rubric file",
        &mut errors,
    );
    let mut rubric = RubricFile::default();
    if let Some((_, node)) = get(entries, "description") {
        match &node.value {
            Value::String(s) => rubric.description = Some(s.clone()),
            other => errors.push(rubric_error(
                file,
                node.span,
                format!("`description` is a string, not {}", kind(other)),
            )),
        }
    }
    let list = match get(entries, "criteria") {
        None => {
            errors.push(
                rubric_error(file, Span::new(0, 0), "a rubric file has no `criteria`").help(
                    "list them as `[[criteria]]` tables (TOML) or a `\"criteria\"` array (JSON)",
                ),
            );
            return Err(errors);
        }
        Some((
            _,
            Node {
                value: Value::Array(list),
                ..
            },
        )) => list,
        Some((_, node)) => {
            errors.push(rubric_error(
                file,
                node.span,
                format!(
                    "`criteria` is an array of tables, not {}",
                    kind(&node.value)
                ),
            ));
            return Err(errors);
        }
    };
    if list.is_empty() {
        errors.push(rubric_error(file, root.span, "`criteria` is empty"));
    }
    if list.len() > MAX_CRITERIA {
        errors.push(rubric_error(
            file,
            root.span,
            format!("more than {MAX_CRITERIA} criteria"),
        ));
        return Err(errors);
    }
    let mut names: Vec<(String, Span)> = Vec::new();
    for node in list {
        let Value::Table(fields) = &node.value else {
            errors.push(rubric_error(
                file,
                node.span,
                format!("a criterion is a table, not {}", kind(&node.value)),
            ));
            continue;
        };
        if let Some(criterion) = criterion(file, node.span, fields, &mut names, &mut errors) {
            rubric.criteria.push(criterion);
        }
    }
    if errors.is_empty() {
        Ok(rubric)
    } else {
        Err(errors)
    }
}

const CRITERION_KEYS: [&str; 9] = [
    "name", "text", "weight", "points", "levels", "saturate", "critical", "veto", "tags",
];

fn criterion(
    file: FileId,
    at: Span,
    fields: &[(String, Span, Node)],
    names: &mut Vec<(String, Span)>,
    errors: &mut Vec<Diagnostic>,
) -> Option<Criterion> {
    let before = errors.len();
    known_keys(file, fields, &CRITERION_KEYS, "a criterion", errors);
    let string = |key: &str, errors: &mut Vec<Diagnostic>| -> Option<(String, Span)> {
        let (_, node) = get(fields, key)?;
        match &node.value {
            Value::String(s) => Some((s.clone(), node.span)),
            other => {
                errors.push(rubric_error(
                    file,
                    node.span,
                    format!("`{key}` is a string, not {}", kind(other)),
                ));
                None
            }
        }
    };
    let number = |key: &str, errors: &mut Vec<Diagnostic>| -> Option<(f64, Span)> {
        let (_, node) = get(fields, key)?;
        match &node.value {
            Value::Number(n) if n.is_finite() => Some((*n, node.span)),
            other => {
                errors.push(rubric_error(
                    file,
                    node.span,
                    format!("`{key}` is a finite number, not {}", kind(other)),
                ));
                None
            }
        }
    };
    let flag = |key: &str, errors: &mut Vec<Diagnostic>| -> bool {
        match get(fields, key) {
            None => false,
            Some((_, node)) => match &node.value {
                Value::Bool(b) => *b,
                other => {
                    errors.push(rubric_error(
                        file,
                        node.span,
                        format!("`{key}` is true or false, not {}", kind(other)),
                    ));
                    false
                }
            },
        }
    };
    let name = string("name", errors);
    let Some((name, name_span)) = name else {
        if get(fields, "name").is_none() {
            errors.push(rubric_error(file, at, "a criterion has no `name`"));
        }
        return None;
    };
    if !crate::packages::valid_name(&name) {
        errors.push(
            rubric_error(file, name_span, format!("`{name}` is not a criterion name")).help(
                "a criterion name is an identifier (letters, digits, `_`), as in a rubric block",
            ),
        );
    } else if let Some((_, first)) = names.iter().find(|(n, _)| *n == name) {
        errors.push(
            Diagnostic::error(
                "rlx::rubric_file",
                file,
                format!("criterion `{name}` is listed twice"),
            )
            .label(name_span, "listed again here")
            .label(*first, "first listed here"),
        );
    } else {
        names.push((name.clone(), name_span));
    }
    let text = match string("text", errors) {
        Some((text, span)) if text.trim().is_empty() => {
            errors.push(rubric_error(file, span, "`text` is empty"));
            String::new()
        }
        Some((text, _)) => text,
        None => {
            if get(fields, "text").is_none() {
                errors.push(
                    rubric_error(file, name_span, format!("criterion `{name}` has no `text`"))
                        .help("`text` is what a judge is asked about the response"),
                );
            }
            String::new()
        }
    };
    let weight = number("weight", errors);
    if let Some((w, span)) = weight {
        if w <= 0.0 {
            errors.push(
                rubric_error(file, span, format!("weight {w} is not positive"))
                    .help("a weight is a positive number; use `points` for a criterion that costs"),
            );
        }
    }
    let points = number("points", errors);
    if let (Some(_), Some((_, span))) = (weight, points) {
        errors.push(
            rubric_error(
                file,
                span,
                format!("criterion `{name}` has both a weight and points"),
            )
            .help("`weight` feeds a weighted mean; `points` a HealthBench-style points score"),
        );
    }
    let mut levels = Vec::new();
    if let Some((_, node)) = get(fields, "levels") {
        match &node.value {
            Value::Array(items) if !items.is_empty() => {
                for item in items {
                    match item.value {
                        Value::Number(n) if n.is_finite() => levels.push(n),
                        ref other => errors.push(rubric_error(
                            file,
                            item.span,
                            format!("a level is a finite number, not {}", kind(other)),
                        )),
                    }
                }
            }
            other => errors.push(rubric_error(
                file,
                node.span,
                format!(
                    "`levels` is a non-empty array of numbers, not {}",
                    kind(other)
                ),
            )),
        }
    }
    let mut saturate = None;
    if let Some((_, node)) = get(fields, "saturate") {
        saturate = saturation(file, node, errors);
    }
    let critical = flag("critical", errors);
    let veto = flag("veto", errors);
    if veto {
        let others: Vec<&str> = ["weight", "points", "levels", "saturate"]
            .into_iter()
            .filter(|key| get(fields, key).is_some())
            .chain(critical.then_some("critical"))
            .collect();
        if let Some(first) = others.first() {
            let (key_span, _) = get(fields, first).map_or((&at, &fields[0].2), |x| x);
            errors.push(
                rubric_error(file, *key_span, format!("veto criterion `{name}` takes no `{first}`"))
                    .help("a veto criterion only flags a response; what a veto does is the rubric's `on_veto`"),
            );
        }
    }
    let mut tags = Vec::new();
    if let Some((_, node)) = get(fields, "tags") {
        match &node.value {
            Value::Array(items) => {
                for item in items {
                    match &item.value {
                        Value::String(s) => tags.push(s.clone()),
                        other => errors.push(rubric_error(
                            file,
                            item.span,
                            format!("a tag is a string, not {}", kind(other)),
                        )),
                    }
                }
            }
            other => errors.push(rubric_error(
                file,
                node.span,
                format!("`tags` is an array of strings, not {}", kind(other)),
            )),
        }
    }
    if errors.len() > before {
        return None;
    }
    Some(Criterion {
        name,
        text,
        weight: weight.map(|(w, _)| w),
        points: points.map(|(p, _)| p),
        levels,
        saturate,
        critical,
        veto,
        tags,
    })
}

fn saturation(
    file: FileId,
    node: &Node,
    errors: &mut Vec<Diagnostic>,
) -> Option<(String, Vec<(String, f64)>)> {
    let help = "`saturate = { kind = \"cap\", kappa = 2 }`, `{ kind = \"tanh\", k = 3 }` or `{ kind = \"exp\", k = 3 }`";
    let Value::Table(fields) = &node.value else {
        errors.push(
            rubric_error(
                file,
                node.span,
                format!("`saturate` is a table, not {}", kind(&node.value)),
            )
            .help(help),
        );
        return None;
    };
    let kind_name = match get(fields, "kind") {
        Some((
            _,
            Node {
                value: Value::String(s),
                span,
            },
        )) => match SATURATIONS.iter().find(|(name, _)| name == s) {
            Some(found) => found,
            None => {
                errors.push(
                    rubric_error(file, *span, format!("unknown saturation `{s}`")).help(help),
                );
                return None;
            }
        },
        _ => {
            errors.push(rubric_error(file, node.span, "`saturate` needs a `kind`").help(help));
            return None;
        }
    };
    let mut args = Vec::new();
    for (key, key_span, value) in fields {
        if key == "kind" {
            continue;
        }
        if !kind_name.1.contains(&key.as_str()) {
            errors.push(
                rubric_error(
                    file,
                    *key_span,
                    format!("saturation `{}` takes no `{key}`", kind_name.0),
                )
                .help(help),
            );
            continue;
        }
        match value.value {
            Value::Number(n) if n.is_finite() && n > 0.0 => args.push((key.clone(), n)),
            _ => errors.push(rubric_error(
                file,
                value.span,
                format!("`{key}` is a positive number"),
            )),
        }
    }
    Some((kind_name.0.to_string(), args))
}

// ---------------------------------------------------------------------------------------------
// JSON with spans

struct JsonParser<'t> {
    text: &'t [u8],
    at: usize,
}

type JsonResult<T> = Result<T, (Span, String)>;

fn parse_json(text: &str) -> JsonResult<Node> {
    let mut parser = JsonParser {
        text: text.as_bytes(),
        at: 0,
    };
    let node = parser.value(0)?;
    parser.space();
    if parser.at < parser.text.len() {
        return Err((
            Span::new(parser.at, parser.at + 1),
            "unexpected text after the document".into(),
        ));
    }
    Ok(node)
}

impl JsonParser<'_> {
    fn space(&mut self) {
        while self
            .text
            .get(self.at)
            .is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        {
            self.at += 1;
        }
    }

    fn fail<T>(&self, message: &str) -> JsonResult<T> {
        let end = (self.at + 1).min(self.text.len());
        Err((Span::new(self.at, end), message.to_string()))
    }

    fn expect(&mut self, byte: u8, message: &str) -> JsonResult<()> {
        self.space();
        if self.text.get(self.at) == Some(&byte) {
            self.at += 1;
            Ok(())
        } else {
            self.fail(message)
        }
    }

    fn value(&mut self, depth: usize) -> JsonResult<Node> {
        if depth > MAX_JSON_DEPTH {
            return self.fail(&format!("nested more than {MAX_JSON_DEPTH} deep"));
        }
        self.space();
        let start = self.at;
        let value = match self.text.get(self.at) {
            None => return self.fail("unexpected end of the document"),
            Some(b'{') => {
                self.at += 1;
                let mut entries: Vec<(String, Span, Node)> = Vec::new();
                self.space();
                if self.text.get(self.at) == Some(&b'}') {
                    self.at += 1;
                } else {
                    loop {
                        self.space();
                        let key_start = self.at;
                        if self.text.get(self.at) != Some(&b'"') {
                            return self.fail("expected a key in double quotes");
                        }
                        let key = self.string()?;
                        let key_span = Span::new(key_start, self.at);
                        if entries.iter().any(|(k, _, _)| *k == key) {
                            return Err((key_span, format!("duplicate key `{key}`")));
                        }
                        self.expect(b':', "expected `:`")?;
                        let value = self.value(depth + 1)?;
                        entries.push((key, key_span, value));
                        self.space();
                        match self.text.get(self.at) {
                            Some(b',') => self.at += 1,
                            Some(b'}') => {
                                self.at += 1;
                                break;
                            }
                            _ => return self.fail("expected `,` or `}`"),
                        }
                    }
                }
                Value::Table(entries)
            }
            Some(b'[') => {
                self.at += 1;
                let mut items = Vec::new();
                self.space();
                if self.text.get(self.at) == Some(&b']') {
                    self.at += 1;
                } else {
                    loop {
                        items.push(self.value(depth + 1)?);
                        self.space();
                        match self.text.get(self.at) {
                            Some(b',') => self.at += 1,
                            Some(b']') => {
                                self.at += 1;
                                break;
                            }
                            _ => return self.fail("expected `,` or `]`"),
                        }
                    }
                }
                Value::Array(items)
            }
            Some(b'"') => Value::String(self.string()?),
            Some(b't') if self.text[self.at..].starts_with(b"true") => {
                self.at += 4;
                Value::Bool(true)
            }
            Some(b'f') if self.text[self.at..].starts_with(b"false") => {
                self.at += 5;
                Value::Bool(false)
            }
            Some(b'n') if self.text[self.at..].starts_with(b"null") => {
                return Err((
                    Span::new(start, start + 4),
                    "`null` is not allowed here".into(),
                ))
            }
            Some(b'-' | b'0'..=b'9') => {
                while self
                    .text
                    .get(self.at)
                    .is_some_and(|b| matches!(b, b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'))
                {
                    self.at += 1;
                }
                let written = std::str::from_utf8(&self.text[start..self.at]).unwrap_or_default();
                match serde_json::from_str::<f64>(written) {
                    Ok(n) => Value::Number(n),
                    Err(_) => {
                        return Err((
                            Span::new(start, self.at),
                            format!("`{written}` is not a number"),
                        ))
                    }
                }
            }
            Some(_) => return self.fail("expected a value"),
        };
        Ok(Node {
            value,
            span: Span::new(start, self.at),
        })
    }

    /// A string starting at `self.at` (a `"`); JSON escapes decoded by serde_json.
    fn string(&mut self) -> JsonResult<String> {
        let start = self.at;
        self.at += 1;
        loop {
            match self.text.get(self.at) {
                None => {
                    return Err((
                        Span::new(start, self.text.len()),
                        "unterminated string".into(),
                    ))
                }
                Some(b'\\') => self.at += 2,
                Some(b'"') => {
                    self.at += 1;
                    break;
                }
                Some(_) => self.at += 1,
            }
        }
        let end = self.at.min(self.text.len());
        let written = std::str::from_utf8(&self.text[start..end]).unwrap_or_default();
        serde_json::from_str::<String>(written)
            .map_err(|e| (Span::new(start, end), format!("invalid string: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(text: &str, json: bool) -> Vec<(String, String)> {
        match parse(FileId(0), text, json) {
            Ok(_) => Vec::new(),
            Err(found) => found
                .into_iter()
                .map(|d| {
                    let span = d.labels[0].span;
                    (
                        d.message,
                        text[span.start as usize..span.end as usize].to_string(),
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn toml_and_json_give_the_same_rubric() {
        let toml = r#"
description = "d"
[[criteria]]
name = "voice"
text = "Active voice."
weight = 3
levels = [0, 0.5, 1]
saturate = { kind = "tanh", k = 3 }
tags = ["style"]
[[criteria]]
name = "rude"
text = "Is rude."
veto = true
"#;
        let json = r#"{"description": "d", "criteria": [
  {"name": "voice", "text": "Active voice.", "weight": 3, "levels": [0, 0.5, 1],
   "saturate": {"kind": "tanh", "k": 3}, "tags": ["style"]},
  {"name": "rude", "text": "Is rude.", "veto": true}]}"#;
        let a = parse(FileId(0), toml, false).unwrap_or_else(|e| panic!("{e:?}"));
        let b = parse(FileId(0), json, true).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(a, b);
        assert_eq!(a.criteria[0].weight, Some(3.0));
        assert_eq!(
            a.criteria[0].saturate,
            Some(("tanh".into(), vec![("k".into(), 3.0)]))
        );
        assert!(a.criteria[1].veto);
    }

    #[test]
    fn errors_point_at_the_key() {
        let toml = "[[criteria]]\nname = \"a\"\ntext = \"t\"\nweight = -1\ncolour = 2\n";
        let found = errors(toml, false);
        assert!(
            found.contains(&(
                "unknown key `colour` in a criterion".into(),
                "colour".into()
            )),
            "{found:?}"
        );
        assert!(
            found.contains(&("weight -1 is not positive".into(), "-1".into())),
            "{found:?}"
        );
        let json = r#"{"criteria": [{"name": "a", "text": "t"}, {"name": "a", "text": "u", "weight": "x"}]}"#;
        let found = errors(json, true);
        assert!(
            found.contains(&("criterion `a` is listed twice".into(), "\"a\"".into())),
            "{found:?}"
        );
        assert!(
            found.contains(&(
                "`weight` is a finite number, not a string".into(),
                "\"x\"".into()
            )),
            "{found:?}"
        );
        assert_eq!(errors("[[[", false).len(), 1);
        assert_eq!(errors("{\"criteria\": [", true).len(), 1);
        assert_eq!(errors("{\"criteria\": \"\\", true).len(), 1);
        let deep = "[".repeat(100_000);
        assert_eq!(errors(&deep, true).len(), 1);
    }
}
