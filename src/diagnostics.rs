//! Rendering compiler diagnostics: miette reports for people, JSON for tools. This is the only place
//! that knows about miette; the compiler's errors are plain data.
//!
//! A report never holds a whole source file: each one carries an [`Excerpt`] of the lines its labels
//! touch, built from one line index per file, so memory does not grow with diagnostics × file size.
//! A line longer than `MAX_LINE_CHARS` shows only windows of `LABEL_CONTEXT_CHARS` characters around
//! each label boundary, joined by `…` (miette formats with widths of at most 65 535 columns and panics
//! beyond), and at most `MAX_RENDERED` diagnostics are rendered. Should miette still panic, the
//! diagnostics are printed plainly instead.

use std::cell::Cell;
use std::collections::HashMap;
use std::fmt;
use std::io::{IsTerminal, Write};
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::Once;

use miette::{
    GraphicalReportHandler, GraphicalTheme, LabeledSpan, MietteError, MietteSpanContents,
    SourceCode, SourceSpan, SpanContents,
};
use serde_json::{json, Value};

use rlx_compiler::{Checked, Diagnostic, FileId, Severity, SourceMap};

/// Diagnostics rendered for people; the rest are counted ("… and N more"). JSON has them all.
pub const MAX_RENDERED: usize = 100;
/// A source line up to this many characters is shown whole.
const MAX_LINE_CHARS: usize = 120;
/// Characters shown on each side of a label's start and end on a longer line.
const LABEL_CONTEXT_CHARS: usize = 40;
/// Lines of a multi-line label shown (its first ones).
const MAX_LABEL_LINES: usize = 8;
/// Characters of a message, label or help shown (a message may quote a 70 000-character name).
const MAX_MESSAGE_CHARS: usize = 400;

/// Where each line of a file starts: built once per file, shared by every diagnostic in it.
struct LineIndex {
    starts: Vec<usize>,
}

impl LineIndex {
    fn new(text: &str) -> LineIndex {
        let starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(at, _)| at + 1))
            .collect();
        LineIndex { starts }
    }

    /// The 0-based line of a byte offset.
    fn line_of(&self, offset: usize) -> usize {
        self.starts.partition_point(|&start| start <= offset) - 1
    }

    fn last_line(&self) -> usize {
        self.starts.len() - 1
    }

    /// A line's bytes without its line break (`\n` or `\r\n`).
    fn content(&self, text: &str, line: usize) -> (usize, usize) {
        let start = self.starts[line];
        let mut end = self
            .starts
            .get(line + 1)
            .map_or(text.len(), |&next| next - 1);
        if end > start && text.as_bytes()[end - 1] == b'\r' {
            end -= 1;
        }
        (start, end)
    }

    /// 1-based line and column (in chars) of a byte offset.
    fn line_column(&self, text: &str, offset: usize) -> (usize, usize) {
        let offset = floor_boundary(text, offset.min(text.len()));
        let line = self.line_of(offset);
        let column = text[self.starts[line]..offset].chars().count() + 1;
        (line + 1, column)
    }
}

/// The line indexes of the files one rendering touches.
struct Lines<'s> {
    sources: &'s SourceMap,
    indexes: HashMap<FileId, LineIndex>,
}

impl<'s> Lines<'s> {
    fn new(sources: &'s SourceMap) -> Lines<'s> {
        Lines {
            sources,
            indexes: HashMap::new(),
        }
    }

    fn get(&mut self, file: FileId) -> (&'s str, &LineIndex) {
        let text = self.sources.get(file).text.as_str();
        let index = self
            .indexes
            .entry(file)
            .or_insert_with(|| LineIndex::new(text));
        (text, index)
    }
}

fn floor_boundary(text: &str, mut offset: usize) -> usize {
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    offset
}

fn ceil_boundary(text: &str, mut offset: usize) -> usize {
    while !text.is_char_boundary(offset) {
        offset += 1;
    }
    offset
}

/// The offset `count` chars before `offset`, not before `floor`.
fn chars_back(text: &str, floor: usize, offset: usize, count: usize) -> usize {
    text[floor..offset]
        .char_indices()
        .rev()
        .nth(count.saturating_sub(1))
        .map_or(floor, |(at, _)| floor + at)
}

/// The offset `count` chars after `offset`, not after `ceiling`.
fn chars_forward(text: &str, offset: usize, ceiling: usize, count: usize) -> usize {
    text[offset..ceiling]
        .char_indices()
        .nth(count)
        .map_or(ceiling, |(at, _)| offset + at)
}

/// `text` cut to `MAX_MESSAGE_CHARS` characters, the cut marked.
fn elide(text: &str) -> String {
    match text.char_indices().nth(MAX_MESSAGE_CHARS) {
        None => text.to_string(),
        Some((at, _)) => format!(
            "{}… ({} more characters)",
            &text[..at],
            text[at..].chars().count()
        ),
    }
}

/// A run of consecutive source lines, as shown.
#[derive(Debug)]
struct Block {
    /// Where the block starts in the excerpt's offsets.
    start: usize,
    /// The 0-based line number of its first line in the file.
    first_line: usize,
    text: String,
}

/// The lines of one file that a diagnostic's labels touch, long lines elided: what miette reads
/// instead of the whole file. Offsets are the excerpt's own (blocks laid end to end).
#[derive(Debug)]
struct Excerpt {
    name: String,
    blocks: Vec<Block>,
    /// Each label start (excerpt offset) and its 0-based column in the file's line, in chars.
    columns: Vec<(usize, usize)>,
}

/// A kept piece of the file: `original` bytes, at `at` in the excerpt.
struct Piece {
    original: (usize, usize),
    at: usize,
}

impl Excerpt {
    /// The excerpt of `file` around `spans` (byte ranges in the file), and the spans in its offsets.
    fn new(
        lines: &mut Lines,
        file: FileId,
        spans: &[(usize, usize)],
    ) -> (Excerpt, Vec<(usize, usize)>) {
        let name = lines.sources.get(file).name.clone();
        let (text, index) = lines.get(file);
        // Labels within the file, on char boundaries, a multi-line one cut after MAX_LABEL_LINES.
        let spans: Vec<(usize, usize)> = spans
            .iter()
            .map(|&(start, end)| {
                let start = floor_boundary(text, start.min(text.len()));
                let mut end = ceil_boundary(text, end.clamp(start, text.len()));
                let first = index.line_of(start);
                if index.line_of(end) >= first + MAX_LABEL_LINES {
                    end = index.content(text, first + MAX_LABEL_LINES - 1).1;
                }
                (start, end)
            })
            .collect();
        // The lines to show: each label's lines and one line of context either side, merged.
        let mut ranges: Vec<(usize, usize)> = spans
            .iter()
            .map(|&(start, end)| {
                (
                    index.line_of(start).saturating_sub(1),
                    (index.line_of(end) + 1).min(index.last_line()),
                )
            })
            .collect();
        ranges.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::new();
        for (first, last) in ranges {
            match merged.last_mut() {
                Some(previous) if first <= previous.1 + 1 => previous.1 = previous.1.max(last),
                _ => merged.push((first, last)),
            }
        }
        let mut boundaries: HashMap<usize, Vec<usize>> = HashMap::new();
        for &(start, end) in &spans {
            boundaries
                .entry(index.line_of(start))
                .or_default()
                .push(start);
            boundaries.entry(index.line_of(end)).or_default().push(end);
        }
        let mut blocks = Vec::with_capacity(merged.len());
        let mut pieces: Vec<Piece> = Vec::new();
        let mut at = 0;
        for (first, last) in merged {
            let mut block = String::new();
            for line in first..=last {
                let (start, end) = index.content(text, line);
                let windows = line_windows(text, start, end, boundaries.get(&line));
                let mut shown_to = start;
                for (from, to) in windows {
                    if from > shown_to {
                        block.push('…');
                    }
                    pieces.push(Piece {
                        original: (from, to),
                        at: at + block.len(),
                    });
                    block.push_str(&text[from..to]);
                    shown_to = to;
                }
                if shown_to < end {
                    block.push('…');
                }
                if line < index.last_line() {
                    block.push('\n');
                }
            }
            let length = block.len();
            blocks.push(Block {
                start: at,
                first_line: first,
                text: block,
            });
            at += length;
        }
        // An offset lies in a kept piece (windows surround every label boundary); past a line's
        // content (its `\r`) it maps to the line's end.
        let map = |offset: usize| {
            let piece = pieces
                .iter()
                .rev()
                .find(|piece| piece.original.0 <= offset)
                .unwrap_or_else(|| &pieces[0]);
            piece.at
                + offset
                    .min(piece.original.1)
                    .saturating_sub(piece.original.0)
        };
        let mapped: Vec<(usize, usize)> = spans
            .iter()
            .map(|&(start, end)| (map(start), map(end).max(map(start))))
            .collect();
        let columns = spans
            .iter()
            .zip(&mapped)
            .map(|(&(start, _), &(mapped_start, _))| {
                (mapped_start, index.line_column(text, start).1 - 1)
            })
            .collect();
        (
            Excerpt {
                name,
                blocks,
                columns,
            },
            mapped,
        )
    }
}

/// The byte ranges of a line (`start..end`, its content) to show: all of it if short, else a window
/// around each label boundary on it (or its beginning, for a context line), merged.
fn line_windows(
    text: &str,
    start: usize,
    end: usize,
    boundaries: Option<&Vec<usize>>,
) -> Vec<(usize, usize)> {
    let line = &text[start..end];
    if line.len() <= MAX_LINE_CHARS || line.chars().nth(MAX_LINE_CHARS).is_none() {
        return vec![(start, end)];
    }
    let mut windows: Vec<(usize, usize)> = match boundaries {
        None => vec![(start, chars_forward(text, start, end, MAX_LINE_CHARS / 2))],
        Some(offsets) => offsets
            .iter()
            .map(|&offset| {
                let offset = offset.min(end);
                (
                    chars_back(text, start, offset, LABEL_CONTEXT_CHARS),
                    chars_forward(text, offset, end, LABEL_CONTEXT_CHARS),
                )
            })
            .collect(),
    };
    windows.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(windows.len());
    for (from, to) in windows {
        match merged.last_mut() {
            Some(previous) if from <= previous.1 => previous.1 = previous.1.max(to),
            _ => merged.push((from, to)),
        }
    }
    merged
}

impl SourceCode for Excerpt {
    fn read_span<'a>(
        &'a self,
        span: &SourceSpan,
        context_lines_before: usize,
        context_lines_after: usize,
    ) -> Result<Box<dyn SpanContents<'a> + 'a>, MietteError> {
        let (offset, length) = (span.offset(), span.len());
        let block = self
            .blocks
            .iter()
            .find(|block| {
                block.start <= offset && offset + length <= block.start + block.text.len()
            })
            .ok_or(MietteError::OutOfBounds)?;
        let local = SourceSpan::new((offset - block.start).into(), length);
        let contents = <[u8] as SourceCode>::read_span(
            block.text.as_bytes(),
            &local,
            context_lines_before,
            context_lines_after,
        )?;
        // The header's column: the label's column in the file, not in the elided line.
        let column = match self.columns.iter().find(|(at, _)| *at == offset) {
            Some(&(_, column)) if context_lines_before == 0 => column,
            _ => contents.column(),
        };
        Ok(Box::new(MietteSpanContents::new_named(
            self.name.clone(),
            contents.data(),
            SourceSpan::new(
                (contents.span().offset() + block.start).into(),
                contents.span().len(),
            ),
            contents.line() + block.first_line,
            column,
            contents.line_count(),
        )))
    }
}

/// One diagnostic with its excerpt, as miette wants it.
#[derive(Debug)]
struct Report {
    code: &'static str,
    severity: Severity,
    message: String,
    help: Option<String>,
    excerpt: Excerpt,
    /// Spans in the excerpt's offsets, and messages; the first is the primary one.
    labels: Vec<((usize, usize), String)>,
    related: Vec<Report>,
}

impl Report {
    fn new(diagnostic: &Diagnostic, lines: &mut Lines) -> Report {
        let spans: Vec<(usize, usize)> = diagnostic
            .labels
            .iter()
            .map(|label| (label.span.start as usize, label.span.end as usize))
            .collect();
        let (excerpt, spans) = Excerpt::new(lines, diagnostic.file, &spans);
        Report {
            code: diagnostic.code,
            severity: diagnostic.severity,
            message: elide(&diagnostic.message),
            help: diagnostic.help.as_deref().map(elide),
            excerpt,
            labels: spans
                .into_iter()
                .zip(&diagnostic.labels)
                .map(|(span, label)| (span, elide(&label.message)))
                .collect(),
            related: diagnostic
                .related
                .iter()
                .map(|r| Report::new(r, lines))
                .collect(),
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Report {}

impl miette::Diagnostic for Report {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        Some(Box::new(self.code))
    }

    fn severity(&self) -> Option<miette::Severity> {
        Some(match self.severity {
            Severity::Error => miette::Severity::Error,
            Severity::Warning => miette::Severity::Warning,
        })
    }

    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.help
            .as_ref()
            .map(|h| Box::new(h.as_str()) as Box<dyn fmt::Display>)
    }

    fn source_code(&self) -> Option<&dyn SourceCode> {
        Some(&self.excerpt)
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        Some(Box::new(self.labels.iter().enumerate().map(
            |(i, ((start, end), message))| {
                let message = Some(message.clone());
                if i == 0 {
                    LabeledSpan::new_primary_with_span(message, *start..*end)
                } else {
                    LabeledSpan::new_with_span(message, *start..*end)
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
struct Summary<'r> {
    header: String,
    reports: &'r [Report],
}

impl fmt::Display for Summary<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.header)
    }
}

impl std::error::Error for Summary<'_> {}

impl miette::Diagnostic for Summary<'_> {
    fn related<'a>(&'a self) -> Option<Box<dyn Iterator<Item = &'a dyn miette::Diagnostic> + 'a>> {
        Some(Box::new(
            self.reports.iter().map(|r| r as &dyn miette::Diagnostic),
        ))
    }
}

/// "2 errors and 1 warning".
fn counts(diagnostics: &[Diagnostic]) -> String {
    let errors = diagnostics.iter().filter(|d| d.is_error()).count();
    let warnings = diagnostics.len() - errors;
    let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    let mut parts = Vec::new();
    if errors > 0 {
        parts.push(plural(errors, "error"));
    }
    if warnings > 0 {
        parts.push(plural(warnings, "warning"));
    }
    parts.join(" and ")
}

/// Render diagnostics for people. One diagnostic prints alone; several print under one header, at
/// most `MAX_RENDERED` of them.
pub fn render_human(
    file_name: &str,
    diagnostics: &[Diagnostic],
    sources: &SourceMap,
    color: bool,
) -> String {
    if diagnostics.is_empty() {
        return String::new();
    }
    let mut lines = Lines::new(sources);
    let shown = &diagnostics[..diagnostics.len().min(MAX_RENDERED)];
    let reports: Vec<Report> = shown.iter().map(|d| Report::new(d, &mut lines)).collect();
    let theme = if color {
        GraphicalTheme::unicode()
    } else {
        GraphicalTheme::unicode_nocolor()
    };
    let handler = GraphicalReportHandler::new_themed(theme).with_width(100);
    let rendered = without_panic_message(AssertUnwindSafe(|| {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = if let [report] = reports.as_slice() {
            handler.render_report(&mut out, report)
        } else {
            let summary = Summary {
                header: format!("{} in {file_name}", counts(diagnostics)),
                reports: &reports,
            };
            handler.render_report(&mut out, &summary)
        };
        out
    }));
    let mut out = match rendered {
        Ok(text) => text,
        Err(_) => {
            let mut out = String::new();
            if diagnostics.len() > 1 {
                out.push_str(&format!("{} in {file_name}\n", counts(diagnostics)));
            }
            for report in &reports {
                render_plain(&mut out, report, "");
            }
            out
        }
    };
    if diagnostics.len() > shown.len() {
        out.push_str(&format!(
            "… and {} more (`rlxc check --format json` lists them all)\n",
            diagnostics.len() - shown.len()
        ));
    }
    out
}

/// The last resort when miette panics: one line per diagnostic and per label.
fn render_plain(out: &mut String, report: &Report, indent: &str) {
    let severity = match report.severity {
        Severity::Error => "error",
        Severity::Warning => "warning",
    };
    out.push_str(&format!(
        "{indent}{severity}[{}]: {}\n",
        report.code, report.message
    ));
    for ((start, _), message) in &report.labels {
        let place = report
            .excerpt
            .read_span(&SourceSpan::new((*start).into(), 0), 0, 0)
            .map(|contents| {
                format!(
                    "{}:{}:{}",
                    report.excerpt.name,
                    contents.line() + 1,
                    contents.column() + 1
                )
            })
            .unwrap_or_else(|_| report.excerpt.name.clone());
        out.push_str(&format!("{indent}  --> {place}: {message}\n"));
    }
    if let Some(help) = &report.help {
        out.push_str(&format!("{indent}  help: {help}\n"));
    }
    for related in &report.related {
        render_plain(out, related, &format!("{indent}  "));
    }
}

/// `catch_unwind`, without the panic hook printing the panic on stderr meanwhile.
fn without_panic_message<T>(
    work: impl FnOnce() -> T + std::panic::UnwindSafe,
) -> std::thread::Result<T> {
    thread_local! {
        static QUIET: Cell<bool> = const { Cell::new(false) };
    }
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(Cell::get) {
                previous(info);
            }
        }));
    });
    QUIET.with(|quiet| quiet.set(true));
    let result = std::panic::catch_unwind(work);
    QUIET.with(|quiet| quiet.set(false));
    result
}

/// A diagnostic as JSON, with byte spans and line/column positions.
fn to_json(diagnostic: &Diagnostic, lines: &mut Lines) -> Value {
    let sources = lines.sources;
    let file = sources.get(diagnostic.file);
    let (text, index) = lines.get(diagnostic.file);
    let labels: Vec<Value> = diagnostic
        .labels
        .iter()
        .map(|label| {
            let (line, column) = index.line_column(text, label.span.start as usize);
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
        "related": diagnostic.related.iter().map(|r| to_json(r, lines)).collect::<Vec<_>>(),
    })
}

/// Diagnostics as JSON (all of them), each file's lines indexed once.
pub fn to_json_all(diagnostics: &[Diagnostic], sources: &SourceMap) -> Vec<Value> {
    let mut lines = Lines::new(sources);
    diagnostics.iter().map(|d| to_json(d, &mut lines)).collect()
}

/// Whether reports on stderr are coloured: stderr is a terminal and `NO_COLOR` is not set.
pub fn stderr_color() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

/// Print diagnostics of `file_name` to stderr as reports for people (a failed write is ignored).
pub fn report_diagnostics(file_name: &str, diagnostics: &[Diagnostic], sources: &SourceMap) {
    if !diagnostics.is_empty() {
        let text = render_human(file_name, diagnostics, sources, stderr_color());
        let _ = std::io::stderr().lock().write_all(text.as_bytes());
    }
}

/// Print `checked`'s diagnostics, if any, to stderr as reports for people.
pub fn report(path: &Path, checked: &Checked) {
    report_diagnostics(
        &path.display().to_string(),
        &checked.diagnostics,
        &checked.sources,
    );
}
