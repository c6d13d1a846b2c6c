//! Rendering compiler diagnostics: miette reports for people, JSON for tools. This is the only place
//! that knows about miette; the compiler's errors are plain data.

use std::fmt;
use std::io::IsTerminal;
use std::path::Path;

use miette::{GraphicalReportHandler, GraphicalTheme, LabeledSpan, NamedSource, SourceCode};
use serde_json::{json, Value};

use rlx_compiler::{Checked, Diagnostic, Severity, SourceMap};

/// One diagnostic with its source attached, as miette wants it.
#[derive(Debug)]
struct Report {
    diagnostic: Diagnostic,
    source: NamedSource<String>,
    related: Vec<Report>,
}

impl Report {
    fn new(diagnostic: &Diagnostic, sources: &SourceMap) -> Report {
        let file = sources.get(diagnostic.file);
        Report {
            diagnostic: diagnostic.clone(),
            source: NamedSource::new(file.name.clone(), file.text.clone()),
            related: diagnostic
                .related
                .iter()
                .map(|r| Report::new(r, sources))
                .collect(),
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.diagnostic.message)
    }
}

impl std::error::Error for Report {}

impl miette::Diagnostic for Report {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        Some(Box::new(self.diagnostic.code))
    }

    fn severity(&self) -> Option<miette::Severity> {
        Some(match self.diagnostic.severity {
            Severity::Error => miette::Severity::Error,
            Severity::Warning => miette::Severity::Warning,
        })
    }

    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.diagnostic
            .help
            .as_ref()
            .map(|h| Box::new(h.clone()) as Box<dyn fmt::Display>)
    }

    fn source_code(&self) -> Option<&dyn SourceCode> {
        Some(&self.source)
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        let text_len = self.source.inner().len();
        Some(Box::new(self.diagnostic.labels.iter().enumerate().map(
            move |(i, label)| {
                let start = (label.span.start as usize).min(text_len);
                let end = (label.span.end as usize).clamp(start, text_len);
                let message = Some(label.message.clone());
                if i == 0 {
                    LabeledSpan::new_primary_with_span(message, start..end)
                } else {
                    LabeledSpan::new_with_span(message, start..end)
                }
            },
        )))
    }

    fn related<'a>(&'a self) -> Option<Box<dyn Iterator<Item = &'a dyn miette::Diagnostic> + 'a>> {
        if self.related.is_empty() {
            return None;
        }
        Some(Box::new(
            self.related.iter().map(|r| r as &dyn miette::Diagnostic),
        ))
    }
}

/// Several diagnostics of one file under one header.
#[derive(Debug)]
struct Summary {
    header: String,
    reports: Vec<Report>,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.header)
    }
}

impl std::error::Error for Summary {}

impl miette::Diagnostic for Summary {
    fn related<'a>(&'a self) -> Option<Box<dyn Iterator<Item = &'a dyn miette::Diagnostic> + 'a>> {
        Some(Box::new(
            self.reports.iter().map(|r| r as &dyn miette::Diagnostic),
        ))
    }
}

/// Render diagnostics for people. One diagnostic prints alone; several print under one header.
pub fn render_human(
    file_name: &str,
    diagnostics: &[Diagnostic],
    sources: &SourceMap,
    color: bool,
) -> String {
    let theme = if color {
        GraphicalTheme::unicode()
    } else {
        GraphicalTheme::unicode_nocolor()
    };
    let handler = GraphicalReportHandler::new_themed(theme).with_width(100);
    let mut out = String::new();
    let mut reports: Vec<Report> = diagnostics
        .iter()
        .map(|d| Report::new(d, sources))
        .collect();
    let render = |out: &mut String, diagnostic: &dyn miette::Diagnostic| {
        // Writing into a String cannot fail.
        let _ = handler.render_report(out, diagnostic);
    };
    if reports.len() == 1 {
        if let Some(report) = reports.pop() {
            render(&mut out, &report);
        }
    } else if !reports.is_empty() {
        let errors = diagnostics.iter().filter(|d| d.is_error()).count();
        let warnings = diagnostics.len() - errors;
        let mut parts = Vec::new();
        if errors > 0 {
            parts.push(format!(
                "{errors} error{}",
                if errors == 1 { "" } else { "s" }
            ));
        }
        if warnings > 0 {
            parts.push(format!(
                "{warnings} warning{}",
                if warnings == 1 { "" } else { "s" }
            ));
        }
        let summary = Summary {
            header: format!("{} in {file_name}", parts.join(" and ")),
            reports,
        };
        render(&mut out, &summary);
    }
    out
}

/// 1-based line and column (in chars) of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before
        .rsplit('\n')
        .next()
        .map(|l| l.chars().count())
        .unwrap_or(0)
        + 1;
    (line, column)
}

/// A diagnostic as JSON, with byte spans and line/column positions.
pub fn to_json(diagnostic: &Diagnostic, sources: &SourceMap) -> Value {
    let file = sources.get(diagnostic.file);
    let labels: Vec<Value> = diagnostic
        .labels
        .iter()
        .map(|label| {
            let (line, column) = line_column(&file.text, label.span.start as usize);
            json!({
                "start": label.span.start,
                "end": label.span.end,
                "line": line,
                "column": column,
                "message": label.message,
            })
        })
        .collect();
    json!({
        "code": diagnostic.code,
        "severity": diagnostic.severity,
        "message": diagnostic.message,
        "file": file.name,
        "labels": labels,
        "help": diagnostic.help,
        "related": diagnostic.related.iter().map(|r| to_json(r, sources)).collect::<Vec<_>>(),
    })
}

/// Whether reports on stderr are coloured: stderr is a terminal and `NO_COLOR` is not set.
pub fn stderr_color() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

/// Print `checked`'s diagnostics, if any, to stderr as reports for people.
pub fn report(path: &Path, checked: &Checked) {
    if !checked.diagnostics.is_empty() {
        eprint!(
            "{}",
            render_human(
                &path.display().to_string(),
                &checked.diagnostics,
                &checked.sources,
                stderr_color()
            )
        );
    }
}

/// Check the recipe at `path` and [`report`] its diagnostics; `None` (after printing why) when it
/// cannot be read. The recipe has errors when `checked.recipe` is `None`.
pub fn check_reported(path: &Path) -> Option<Checked> {
    match rlx_compiler::check_path(path) {
        Ok(checked) => {
            report(path, &checked);
            Some(checked)
        }
        Err(error) => {
            eprintln!("error: cannot read {}: {error}", path.display());
            None
        }
    }
}
