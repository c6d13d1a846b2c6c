//! `rlxc fmt`: the canonical layout of `.rlx` source.
//!
//! The printer walks the AST and writes every token back in source order: parentheses as written
//! (`ExprKind::Paren`), numbers as written (`text`), nothing added or dropped. So the output parses
//! to the same tree, whatever precedence the parser applies.
//!
//! The printer reads nothing but the parsed [`Module`]: its items, and its
//! [`Trivia`](crate::syntax::trivia::Trivia) (the comments, doc lines and line breaks between the
//! tokens, which the parser keeps by position; a comment belongs to the gap between the two tokens
//! it sits between, so to the nodes that end and start there).
//!
//! A comment keeps its place when it lies between two lines of the layout: between items, between
//! the entries of a `rubric { }`, `rollout { }` or `{ let … }` block, between the operands of an
//! item's top-level `+`/`-` (or `and`/`or`) chain, or at the end of such a line. A comment inside
//! an expression (between a call's arguments, around an operator, in parentheses or an index),
//! between a function's parameters, or between a `=` and the value on the next line stays between
//! the same two tokens: it ends its line, and the code goes on at the next, 4 spaces deeper than the
//! line it started on. A comment anywhere else (inside an item's head: between a keyword and a
//! name, in a type, a criterion's attributes, a string list) moves to a line of its own just above
//! its item. No comment is dropped.
//!
//! Layout rules:
//! - one item per line; a blank line between items of different kinds (`reward`, `advantage`,
//!   `loss`, `metric` and `keep` count as one kind, "sections"), around any item that holds a
//!   `{ }` block spanning several lines, and wherever the source had one (several blank lines
//!   become one);
//! - `///` doc lines directly above their item;
//! - 4 spaces of indentation per block level; one rubric entry, rollout setting or local `let` per
//!   line;
//! - single spaces around binary operators, none after unary `-`;
//! - an item whose expression is a chain of `+`/`-` (or of `and`, or of `or`) puts each further
//!   operand on a continuation line that starts with the operator when the item is longer than
//!   [`MAX_WIDTH`], when comments sit between its operands, or when the source already put one of
//!   its operators at the start of a line (authors break lines for meaning). The continuation
//!   lines of `reward`, `advantage`, `loss`, `metric` and `let` put the operator under the `=`;
//!   the others are 4 spaces deeper than the item;
//! - the value of a `fn`, `let` or section goes on a line of its own after the `=`, 4 spaces deep,
//!   when the source put it there, or when the item is longer than [`MAX_WIDTH`] and the value is
//!   no such chain or fits on that line whole (a chain broken there keeps its operators under its
//!   first operand).
//!
//! Columns: a "block" is a run of items with no blank line between them (comment and doc lines
//! between them do not end it), or in a `{ }` list a run of entries with no blank line between
//! them.
//! - the `input`s of a block pad their names so the ` : ` lines up; its `param`s (name, then
//!   ` : TYPE`), top-level `let`s or sections (`reward`, `advantage`, `loss`, `metric NAME`; a
//!   `keep` among them takes no part) pad what is left of the ` = ` so the `=` lines up;
//! - the criteria of a rubric block pad `criterion NAME` to a common width, then the leading
//!   `weight`/`points` part, so the further attributes line up too; the local `let`s of a block
//!   in `{ }` pad `let NAME` so their `=`s line up;
//! - a run of code lines of a block (a comment or doc line of its own ends it) with two trailing
//!   comments or more starts them 2 columns after the longest code line from the first of them to
//!   the last, unless that would make one of them wider than [`MAX_WIDTH`]; any other trailing
//!   comment follows its code after one space.
//!
//! Items and entries that hold a multi-line `{ }` block take no part in aligning trailing comments
//! (such an item always stands alone in its block).

use crate::diagnostic::Diagnostic;
use crate::source::FileId;
use crate::syntax::ast::*;
use crate::syntax::parse_module;
use crate::syntax::trivia::{Piece, Trivia};

/// Width past which an item's top-level operator chain is broken over several lines.
pub const MAX_WIDTH: usize = 110;

const INDENT: usize = 4;

/// Stands, while a layout is built, for the blank between code and its trailing comment, so that
/// the comments of a block can be aligned once the block is complete. Used only when neither the
/// source nor the tree contains it; then every one left is a single space in the result.
const GAP: char = '\u{1f}';

/// Format one file canonically, or return the parser's diagnostics when it does not parse.
pub fn format_source(file: FileId, text: &str) -> Result<String, Vec<Diagnostic>> {
    let module = parse_module(file, text)?;
    Ok(format_module(&module))
}

/// Format a parsed module: its items, with the comments and blank lines its trivia keeps. (A
/// module built by hand has no trivia: then it prints without comments, one block per kind.)
pub fn format_module(module: &Module) -> String {
    let mut printer = Printer::new(&module.trivia);
    let in_comments = printer
        .trivia
        .comments()
        .iter()
        .any(|comment| comment.text.contains(GAP));
    if in_comments || module_mentions(module, GAP) {
        printer.gap = ' ';
    }
    let out = printer.module(module);
    if printer.gap == GAP {
        out.replace(GAP, " ")
    } else {
        out
    }
}

/// Whether `c` occurs in the text the tree carries over to the output (docs, paths, strings).
fn module_mentions(module: &Module, c: char) -> bool {
    module.items.iter().any(|item| {
        item.doc.iter().any(|doc| doc.contains(c))
            || match &item.kind {
                ItemKind::Import(import) => import.source.written().contains(c),
                ItemKind::Rubric(rubric) => rubric.entries.iter().any(|entry| {
                    matches!(entry, RubricEntry::Criteria(file) if file.source.written().contains(c))
                }),
                ItemKind::Rollout(entries) => entries.iter().any(|entry| match &entry.value {
                    RolloutValue::Strings(strings) => {
                        strings.iter().any(|(string, _)| string.contains(c))
                    }
                    RolloutValue::Expr(_) => false,
                }),
                _ => false,
            }
    })
}

/// One line (possibly several, for a nested block) of a braced list, with where it was in the
/// source.
struct Entry {
    start: usize,
    end: usize,
    text: String,
    /// Whether `text` holds a multi-line `{ }` block (then it takes no part in columns).
    tall: bool,
    /// `text` cut into columns, to be padded against its neighbours: for a criterion
    /// `criterion NAME`, then the leading `weight`/`points` attributes if any, then the rest; for
    /// a local `let`, `let NAME` then `= VALUE`.
    columns: Option<Vec<String>>,
    /// The comment at the end of its last line.
    trailing: Option<String>,
}

impl Entry {
    fn new(start: usize, end: usize, text: String, tall: bool) -> Entry {
        Entry {
            start,
            end,
            text,
            tall,
            columns: None,
            trailing: None,
        }
    }
}

/// A line of a braced list: an entry, or a comment on a line of its own.
enum Row {
    Entry(Entry),
    Comment(String),
}

/// What surrounds an item in the file, worked out before the item is printed.
struct Surroundings {
    /// Comment lines above the item, each with whether a blank line precedes it.
    leading: Vec<(bool, String)>,
    /// Whether a blank line precedes the item's own lines (its docs, or the item).
    head_blank: bool,
    /// The comment at the end of the item's last line.
    trailing: Option<String>,
    /// Whether a blank line separates the item from the one before (it starts a block).
    new_block: bool,
}

struct Printer<'a> {
    /// The comments, doc lines and line breaks of the module.
    trivia: &'a Trivia,
    /// Which of the trivia's comments are placed in the output so far.
    placed: Vec<bool>,
    /// Indices placed so far, in order, so a tentative layout can be undone.
    placed_log: Vec<usize>,
    /// What goes between code and a trailing comment: [`GAP`], or a space when alignment is off.
    gap: char,
}

impl<'a> Printer<'a> {
    fn new(trivia: &'a Trivia) -> Printer<'a> {
        Printer {
            trivia,
            placed: vec![false; trivia.comments().len()],
            placed_log: Vec::new(),
            gap: GAP,
        }
    }

    // -----------------------------------------------------------------------------------------
    // Source positions and comments

    fn comment_text(&self, index: usize) -> &'a str {
        &self.trivia.comments()[index].text
    }

    fn comment_span(&self, index: usize) -> (usize, usize) {
        let span = self.trivia.comments()[index].span;
        (span.start as usize, span.end as usize)
    }

    fn newlines(&self, from: usize, to: usize) -> usize {
        self.trivia.newlines(from, to)
    }

    fn has_unplaced(&self, from: usize, to: usize) -> bool {
        (self.trivia.first_comment_from(from)..self.placed.len())
            .take_while(|&index| self.comment_span(index).0 < to)
            .any(|index| !self.placed[index])
    }

    /// Take the comments starting in `[from, to)` that are not placed yet, in source order.
    fn take(&mut self, from: usize, to: usize) -> Vec<usize> {
        let mut taken = Vec::new();
        let mut index = self.trivia.first_comment_from(from);
        while index < self.placed.len() && self.comment_span(index).0 < to {
            if !self.placed[index] {
                self.mark(index);
                taken.push(index);
            }
            index += 1;
        }
        taken
    }

    fn mark(&mut self, index: usize) {
        if !self.placed[index] {
            self.placed[index] = true;
            self.placed_log.push(index);
        }
    }

    /// Undo every placement made after the log had `length` entries.
    fn unplace_since(&mut self, length: usize) {
        while self.placed_log.len() > length {
            if let Some(index) = self.placed_log.pop() {
                self.placed[index] = false;
            }
        }
    }

    /// The end of a span's last token.
    fn tight_end(&self, span: Span) -> usize {
        self.trivia.tight_end(span)
    }

    /// The comments (with their start and end) and doc lines (`None`) starting in `[from, to)`, a
    /// stretch of source that holds nothing else.
    fn trivia(&self, from: usize, to: usize) -> Vec<(Option<usize>, usize, usize)> {
        self.trivia
            .pieces(from, to)
            .into_iter()
            .map(|(piece, span)| {
                let comment = match piece {
                    Piece::Comment(index) => Some(index),
                    Piece::Doc(_) => None,
                };
                (comment, span.start as usize, span.end as usize)
            })
            .collect()
    }

    /// The offset just after the `{` that is the next token after `from`.
    fn after_open_brace(&self, from: usize) -> usize {
        self.trivia.next_token(from) + 1
    }

    // -----------------------------------------------------------------------------------------
    // The file

    fn module(&mut self, module: &Module) -> String {
        let items = &module.items;
        let spans: Vec<(usize, usize)> = items
            .iter()
            .map(|item| {
                let start = item.span.start as usize;
                (start, self.tight_end(item.span).max(start))
            })
            .collect();

        // Which items hold a multi-line block.
        let talls: Vec<bool> = items
            .iter()
            .zip(&spans)
            .map(|(item, &(start, end))| self.item_holds_block(item, start, end))
            .collect();

        // The comments, docs and blank lines around each item, and so the blocks.
        let mut around: Vec<Surroundings> = Vec::with_capacity(items.len());
        let mut cursor = 0;
        // (kind group, whether it holds a multi-line block) of the item before
        let mut previous: Option<(u8, bool)> = None;
        for (index, item) in items.iter().enumerate() {
            let (start, end) = spans[index];
            let mut trivia = self.trivia(cursor, start).into_iter().peekable();
            let mut last = cursor;
            if let (Some(before), Some(&(Some(comment), from, to))) =
                (around.last_mut(), trivia.peek())
            {
                if self.newlines(cursor, from) == 0 {
                    self.mark(comment);
                    before.trailing = Some(self.comment_text(comment).to_string());
                    last = to;
                    trivia.next();
                }
            }

            let mut leading: Vec<(bool, String)> = Vec::new();
            let mut pending_blank = false;
            let mut saw_doc = false;
            for (kind, trivia_start, trivia_end) in trivia {
                let blank = self.newlines(last, trivia_start) >= 2;
                match kind {
                    Some(comment) => {
                        self.mark(comment);
                        let text = self.comment_text(comment).to_string();
                        leading.push((blank || pending_blank, text));
                        pending_blank = false;
                    }
                    None => {
                        pending_blank |= blank;
                        saw_doc = true;
                    }
                }
                last = trivia_end;
            }
            let mut head_blank = if saw_doc {
                pending_blank
            } else {
                self.newlines(last, start) >= 2
            };

            let group = kind_group(&item.kind);
            let first_blank = match leading.first_mut() {
                Some((blank, _)) => blank,
                None => &mut head_blank,
            };
            match previous {
                Some((previous_group, previous_tall)) => {
                    *first_blank |= previous_group != group || previous_tall || talls[index];
                }
                None => *first_blank = false,
            }
            let new_block =
                previous.is_none() || head_blank || leading.iter().any(|(blank, _)| *blank);
            around.push(Surroundings {
                leading,
                head_blank,
                trailing: None,
                new_block,
            });
            cursor = end.max(cursor);
            previous = Some((group, talls[index]));
        }
        let mut end_trivia = self
            .trivia(cursor, self.trivia.len())
            .into_iter()
            .peekable();
        let mut last = cursor;
        if let (Some(before), Some(&(Some(comment), from, to))) =
            (around.last_mut(), end_trivia.peek())
        {
            if self.newlines(cursor, from) == 0 {
                self.mark(comment);
                before.trailing = Some(self.comment_text(comment).to_string());
                last = to;
                end_trivia.next();
            }
        }

        // Each block: its items printed with their columns, then its trailing comments aligned.
        let pads = column_pads(items, &around);
        let mut lines: Vec<(bool, String)> = Vec::new();
        let mut block_start = 0;
        while block_start < items.len() {
            let block_end = (block_start + 1..items.len())
                .find(|&index| around[index].new_block)
                .unwrap_or(items.len());
            let mut bodies = Vec::new();
            let mut moved = Vec::new();
            for index in block_start..block_end {
                let (start, end) = spans[index];
                let mut body = self.item(&items[index], end, pads[index]);
                let inside: Vec<String> = self
                    .take(start, end)
                    .into_iter()
                    .map(|comment| self.comment_text(comment).to_string())
                    .collect();
                if let Some(trailing) = &around[index].trailing {
                    body.push(self.gap);
                    body.push_str(trailing);
                }
                bodies.push(body);
                moved.push(inside);
            }
            if !talls[block_start..block_end].contains(&true) {
                // A comment or doc line of its own between two items ends a run of comments.
                let mut run: Vec<&mut String> = Vec::new();
                for (offset, body) in bodies.iter_mut().enumerate() {
                    let index = block_start + offset;
                    let own_lines = !around[index].leading.is_empty()
                        || !moved[offset].is_empty()
                        || !items[index].doc.is_empty();
                    if own_lines {
                        align_trailing(&mut run, 0);
                        run.clear();
                    }
                    run.push(body);
                }
                align_trailing(&mut run, 0);
            }
            for ((index, body), inside) in (block_start..block_end).zip(bodies).zip(moved) {
                let item = &items[index];
                let mut own: Vec<String> = inside;
                for doc in &item.doc {
                    let separator = if doc.is_empty() { "" } else { " " };
                    own.push(format!("///{separator}{doc}"));
                }
                own.push(body);
                lines.append(&mut std::mem::take(&mut around[index].leading));
                for (position, line) in own.into_iter().enumerate() {
                    lines.push((position == 0 && around[index].head_blank, line));
                }
            }
            block_start = block_end;
        }

        let mut out = String::new();
        for (index, (blank, line)) in lines.iter().enumerate() {
            if index > 0 {
                out.push('\n');
                if *blank {
                    out.push('\n');
                }
            }
            out.push_str(line);
        }

        // The comments at the end of the file.
        let mut at_start = items.is_empty();
        for (kind, trivia_start, trivia_end) in end_trivia {
            let Some(index) = kind else {
                continue;
            };
            self.mark(index);
            if !at_start {
                out.push('\n');
                if self.newlines(last, trivia_start) >= 2 {
                    out.push('\n');
                }
            }
            out.push_str(self.comment_text(index));
            at_start = false;
            last = trivia_end;
        }
        // Safety net: a comment no rule placed (only possible when `text` does not match `module`).
        for index in 0..self.placed.len() {
            if !self.placed[index] {
                self.mark(index);
                if !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(self.comment_text(index));
            }
        }
        if !out.is_empty() {
            out.push('\n');
        }
        out
    }

    // -----------------------------------------------------------------------------------------
    // Items

    /// Whether `item` (whose tokens span `[start, end)`) prints with a multi-line `{ }` block: a
    /// `{ let … }` expression, or a rubric or rollout block with entries or comments inside.
    fn item_holds_block(&self, item: &Item, start: usize, end: usize) -> bool {
        let braced = |open: usize, entries: usize| {
            let close = end.saturating_sub(1);
            entries > 0
                || self
                    .trivia
                    .comments()
                    .get(self.trivia.first_comment_from(open))
                    .is_some_and(|comment| (comment.span.start as usize) < close)
        };
        match &item.kind {
            ItemKind::Import(_) | ItemKind::Input(_) | ItemKind::Param(_) => false,
            ItemKind::Fn(function) => {
                function
                    .params
                    .iter()
                    .filter_map(|param| param.default.as_ref())
                    .any(holds_block)
                    || holds_block(&function.body)
            }
            ItemKind::Rubric(rubric) => braced(
                self.after_open_brace(rubric.name.span.end as usize),
                rubric.entries.len(),
            ),
            ItemKind::Rollout(entries) => braced(
                self.after_open_brace(start + "rollout".len()),
                entries.len(),
            ),
            ItemKind::Let(LetDecl { value, .. })
            | ItemKind::Reward(value)
            | ItemKind::Advantage(value)
            | ItemKind::Loss(value)
            | ItemKind::Metric { value, .. } => holds_block(value),
            ItemKind::State(state) => holds_block(&state.update),
            ItemKind::Keep { condition, .. } => holds_block(condition),
        }
    }

    /// One item at the left margin, without its doc lines; `end` is the end of its last token. An
    /// item with a column ([`left_side`]) pads the two parts of its left side to `pad`.
    fn item(&mut self, item: &Item, end: usize, pad: (usize, usize)) -> String {
        let left =
            left_side(&item.kind).map(|(_, name, ty)| padded(&name, pad.0) + &padded(&ty, pad.1));
        match &item.kind {
            ItemKind::Import(import) => {
                let mut line = String::from("import ");
                match &import.source {
                    ImportSource::Std(path) => {
                        line.push_str("std/");
                        line.push_str(path);
                    }
                    ImportSource::Relative(path) => line.push_str(&quoted(path)),
                    ImportSource::Package { .. } => line.push_str(&import.source.written()),
                }
                if let Some(names) = &import.names {
                    line.push_str(".{");
                    line.push_str(&join_idents(names));
                    line.push('}');
                }
                line
            }
            ItemKind::Input(input) => {
                let left = left.unwrap_or_default();
                let mut line = format!("{left} : {}", type_expr(&input.ty));
                match input.role {
                    Some(InputRole::Policy) => line.push_str(" policy"),
                    Some(InputRole::Value) => line.push_str(" value"),
                    None => {}
                }
                if let Some(default) = &input.default {
                    line.push_str(" = ");
                    line.push_str(&literal(default));
                }
                line
            }
            ItemKind::Param(param) => {
                let mut line = left.unwrap_or_default();
                line.push_str(" = ");
                line.push_str(&literal(&param.value));
                line
            }
            ItemKind::Fn(function) => {
                // Comments between the parameters (around their `,`, `:` and `=`) stay there.
                let mut head = format!("fn {}(", function.name.name);
                let mut last = self.trivia.next_token(function.name.span.end as usize) + 1;
                for (index, param) in function.params.iter().enumerate() {
                    let start = param.name.span.start as usize;
                    if index > 0 {
                        self.separator(&mut head, last, (", ", 1), start, 0);
                    } else {
                        self.inline_comments(&mut head, last, start, 0);
                    }
                    head.push_str(&param.name.name);
                    last = param.name.span.end as usize;
                    if let Some(ty) = &param.ty {
                        self.separator(&mut head, last, (": ", 1), ty.span.start as usize, 0);
                        head.push_str(&type_expr(ty));
                        last = self.tight_end(ty.span);
                    }
                    if let Some(default) = &param.default {
                        let start = default.span.start as usize;
                        self.separator(&mut head, last, (" = ", 1), start, 0);
                        head.push_str(&self.expr(default, 0));
                        last = self.tight_end(default.span);
                    }
                }
                // before the `)` (or a trailing `,`)
                let close = self.trivia.next_token(last);
                self.inline_comments(&mut head, last, close, 0);
                head.push(')');
                if let Some(ret) = &function.ret {
                    head.push_str(": ");
                    head.push_str(&type_expr(ret));
                }
                head.push_str(" = ");
                self.expr_line(head, &function.body, 0, INDENT, true)
            }
            ItemKind::Rubric(rubric) => self.rubric(rubric, end),
            ItemKind::Let(LetDecl { value, .. })
            | ItemKind::Reward(value)
            | ItemKind::Advantage(value)
            | ItemKind::Loss(value)
            | ItemKind::Metric { value, .. } => {
                // The continuation lines put their operator under the `=`.
                let left = left.unwrap_or_default();
                let continuation = left.chars().count() + 1;
                self.expr_line(format!("{left} = "), value, 0, continuation, true)
            }
            ItemKind::State(state) => {
                let ty = state
                    .ty
                    .map(|(elem, _)| format!(" : {}", elem.name()))
                    .unwrap_or_default();
                let init = match &state.init {
                    StateInit::Literal(value) => literal(value),
                    StateInit::Param(name) => name.name.clone(),
                };
                let head = format!("state {}{ty} = {init} update ", state.name.name);
                self.expr_line(head, &state.update, 0, INDENT, false)
            }
            ItemKind::Keep {
                level, condition, ..
            } => {
                let level = level.name();
                self.expr_line(format!("keep {level} when "), condition, 0, INDENT, false)
            }
            ItemKind::Rollout(entries) => {
                let open = self.after_open_brace(item.span.start as usize + "rollout".len());
                let mut lines = Vec::new();
                for entry in entries {
                    let tall = match &entry.value {
                        RolloutValue::Expr(value) => holds_block(value),
                        RolloutValue::Strings(_) => false,
                    };
                    let prefix = format!("{} = ", entry.key.name);
                    let text = match &entry.value {
                        RolloutValue::Strings(strings) => {
                            let items: Vec<String> =
                                strings.iter().map(|(string, _)| quoted(string)).collect();
                            format!("{prefix}[{}]", items.join(", "))
                        }
                        RolloutValue::Expr(value) => {
                            self.expr_line(prefix, value, INDENT, 2 * INDENT, false)
                        }
                    };
                    lines.push(Entry::new(
                        entry.key.span.start as usize,
                        self.tight_end(entry.span),
                        text,
                        tall,
                    ));
                }
                self.braced(
                    "rollout {".to_string(),
                    open,
                    end.saturating_sub(1),
                    lines,
                    0,
                )
            }
        }
    }

    fn rubric(&mut self, rubric: &RubricDecl, end: usize) -> String {
        let open = self.after_open_brace(rubric.name.span.end as usize);
        let mut lines = Vec::new();
        for entry in &rubric.entries {
            let (start, entry_end, text) = match entry {
                RubricEntry::Criteria(file) => {
                    let path = match &file.source {
                        ImportSource::Relative(path) => quoted(path),
                        source => source.written(),
                    };
                    (
                        file.span.start,
                        self.tight_end(file.span),
                        format!("criteria {path}"),
                    )
                }
                RubricEntry::Criterion(criterion) => {
                    // Columns: the name, the leading `weight`/`points` attributes, the rest.
                    let lead = criterion
                        .attrs
                        .iter()
                        .take_while(|attr| {
                            matches!(attr, CriterionAttr::Weight(_) | CriterionAttr::Points(_))
                        })
                        .count();
                    let join = |attrs: &[CriterionAttr]| {
                        let attrs: Vec<String> = attrs.iter().map(criterion_attr).collect();
                        attrs.join(" ")
                    };
                    let mut columns = vec![format!("criterion {}", criterion.name.name)];
                    for part in [
                        join(&criterion.attrs[..lead]),
                        join(&criterion.attrs[lead..]),
                    ] {
                        if !part.is_empty() {
                            columns.push(part);
                        }
                    }
                    let mut line = Entry::new(
                        criterion.span.start as usize,
                        self.tight_end(criterion.span),
                        columns.join(" "),
                        false,
                    );
                    line.columns = Some(columns);
                    lines.push(line);
                    continue;
                }
                RubricEntry::Interact(interact) => {
                    let mode = match interact.mode {
                        Some(InteractMode::Product) => "product ",
                        Some(InteractMode::Min) => "min ",
                        None => "",
                    };
                    let text = format!(
                        "interact {}, {} : {mode}{}",
                        interact.first.name,
                        interact.second.name,
                        rubric_value(&interact.gamma)
                    );
                    (interact.span.start, self.tight_end(interact.span), text)
                }
                RubricEntry::Aggregate(name) => (
                    name.span.start,
                    name.span.end as usize,
                    format!("aggregate {}", name.name),
                ),
                RubricEntry::OnVeto(shape) => (
                    shape.name.span.start,
                    self.tight_end(shape.span),
                    format!("on_veto {}", shape_call(shape)),
                ),
                RubricEntry::Shape(shape) => (
                    shape.name.span.start,
                    self.tight_end(shape.span),
                    format!("shape {}", shape_call(shape)),
                ),
            };
            lines.push(Entry::new(start as usize, entry_end, text, false));
        }
        let head = format!("rubric {} {{", rubric.name.name);
        self.braced(head, open, end.saturating_sub(1), lines, 0)
    }

    /// `head` (ending in `{`), one entry per line at `indent + 4`, and `}` at `indent`. Comments
    /// between `open` (just after `{`) and `close` (the `}`) that are not inside an entry keep
    /// their place. Each run of entries without a blank line between them is a block for columns.
    fn braced(
        &mut self,
        head: String,
        open: usize,
        close: usize,
        entries: Vec<Entry>,
        indent: usize,
    ) -> String {
        let inner = indent + INDENT;
        let mut head = head;
        // each row with whether a blank line precedes it
        let mut rows: Vec<(bool, Row)> = Vec::new();
        let mut last = open;
        let mut first = true;
        let mut wrote = false;
        for entry in entries {
            self.braced_comments(&mut head, &mut rows, &mut last, entry.start, &mut first);
            let blank = !first && self.newlines(last, entry.start) >= 2;
            last = entry.end.max(last);
            first = false;
            wrote = true;
            rows.push((blank, Row::Entry(entry)));
        }
        wrote |= self.braced_comments(&mut head, &mut rows, &mut last, close, &mut first);

        let mut block_start = 0;
        while block_start < rows.len() {
            let block_end = (block_start + 1..rows.len())
                .find(|&index| rows[index].0)
                .unwrap_or(rows.len());
            let block = &mut rows[block_start..block_end];
            align_columns(block);
            // Trailing comments: runs of entries without a multi-line block.
            let mut run: Vec<&mut String> = Vec::new();
            for (_, row) in block.iter_mut() {
                let Row::Entry(entry) = row else {
                    align_trailing(&mut run, inner);
                    run.clear();
                    continue;
                };
                if let Some(trailing) = entry.trailing.take() {
                    entry.text.push(self.gap);
                    entry.text.push_str(&trailing);
                }
                if entry.tall {
                    align_trailing(&mut run, inner);
                    run.clear();
                } else {
                    run.push(&mut entry.text);
                }
            }
            align_trailing(&mut run, inner);
            block_start = block_end;
        }

        let mut out = head;
        for (blank, row) in rows {
            if blank {
                out.push('\n');
            }
            out.push('\n');
            push_indent(&mut out, inner);
            match row {
                Row::Entry(entry) => out.push_str(&entry.text),
                Row::Comment(comment) => out.push_str(&comment),
            }
        }
        if wrote {
            out.push('\n');
            push_indent(&mut out, indent);
        }
        out.push('}');
        out
    }

    /// The unplaced comments in `[*last, to)` of a braced list: the first one stays at the end of
    /// the line before (the head, or an entry) when it was on the same line in the source; the
    /// others become rows of their own.
    fn braced_comments(
        &mut self,
        head: &mut String,
        rows: &mut Vec<(bool, Row)>,
        last: &mut usize,
        to: usize,
        first: &mut bool,
    ) -> bool {
        let taken = self.take(*last, to);
        for (position, &index) in taken.iter().enumerate() {
            let (comment_start, comment_end) = self.comment_span(index);
            let gap = self.newlines(*last, comment_start);
            let text = self.comment_text(index).to_string();
            let same_line = position == 0 && gap == 0;
            match rows.last_mut() {
                Some((_, Row::Entry(entry))) if same_line && entry.trailing.is_none() => {
                    entry.trailing = Some(text);
                }
                None if same_line => {
                    head.push(' ');
                    head.push_str(&text);
                }
                _ => rows.push((!*first && gap >= 2, Row::Comment(text))),
            }
            *first = false;
            *last = comment_end.max(*last);
        }
        !taken.is_empty()
    }

    /// The unplaced comments in `[*last, to)`: the first one stays at the end of the current line
    /// when it was on the same line in the source; the others get lines of their own at `indent`.
    fn comment_lines(
        &mut self,
        out: &mut String,
        last: &mut usize,
        to: usize,
        indent: usize,
        first: &mut bool,
    ) -> bool {
        let taken = self.take(*last, to);
        for (position, &index) in taken.iter().enumerate() {
            let (comment_start, comment_end) = self.comment_span(index);
            let gap = self.newlines(*last, comment_start);
            if position == 0 && gap == 0 {
                out.push(self.gap);
            } else {
                if !*first && gap >= 2 {
                    out.push('\n');
                }
                out.push('\n');
                push_indent(out, indent);
            }
            out.push_str(self.comment_text(index));
            *first = false;
            *last = comment_end.max(*last);
        }
        !taken.is_empty()
    }

    /// `prefix` then `value`, at `indent`. A top-level operator chain is broken over several lines,
    /// with its operators at column `continuation`, when comments sit between its operands, when
    /// the source started a line with one of its operators, or when the one-line form is too wide.
    /// With `hang` (`prefix` ends in `= `), `value` goes on a line of its own, 4 spaces deeper,
    /// when it was on a line of its own in the source, or when the one-line form is too wide and
    /// either `value` is no chain or it fits on its own line.
    fn expr_line(
        &mut self,
        prefix: String,
        value: &Expr,
        indent: usize,
        continuation: usize,
        hang: bool,
    ) -> String {
        let body_indent = indent + INDENT;
        if hang && self.starts_line(value.span.start as usize) {
            // The comments between the `=` and the value stay after the `=`.
            let start = value.span.start as usize;
            let after_equals = self
                .trivia
                .gap_before(start)
                .map_or(start, |gap| gap.start as usize);
            let mut prefix = prefix.trim_end().to_string();
            for (position, index) in self.take(after_equals, start).into_iter().enumerate() {
                if position == 0 {
                    prefix.push(' ');
                } else {
                    prefix.push('\n');
                    push_indent(&mut prefix, body_indent);
                }
                prefix.push_str(self.comment_text(index));
            }
            let body = self.expr_line(String::new(), value, body_indent, body_indent, false);
            return hung(&prefix, &body, body_indent);
        }
        let checkpoint = self.placed_log.len();
        // Whether the chain breaks, before printing places the comments inside it.
        let operands = operator_chain(value);
        let split = operands.as_ref().is_some_and(|operands| {
            operands.windows(2).any(|pair| {
                self.has_unplaced(pair[0].1.span.end as usize, pair[1].1.span.start as usize)
                    || self.operator_starts_line(pair[0].1)
            })
        });
        let one_line = format!("{prefix}{}", self.expr(value, indent));
        if !split && width(&one_line, indent) <= MAX_WIDTH {
            return one_line;
        }
        if hang && !split && !one_line.contains('\n') {
            self.unplace_since(checkpoint);
            let body = self.expr(value, body_indent);
            if operands.is_none() || width(&body, body_indent) <= MAX_WIDTH {
                return hung(&prefix, &body, body_indent);
            }
        }
        self.unplace_since(checkpoint);
        let Some(operands) = operands else {
            return format!("{prefix}{}", self.expr(value, indent));
        };
        let mut out = prefix;
        let mut last = 0;
        for (position, (op, operand)) in operands.iter().enumerate() {
            if position > 0 {
                let mut first = false;
                self.comment_lines(
                    &mut out,
                    &mut last,
                    operand.span.start as usize,
                    continuation,
                    &mut first,
                );
                out.push('\n');
                push_indent(&mut out, continuation);
                if let Some(op) = op {
                    out.push_str(op.symbol());
                    out.push(' ');
                }
            }
            let operand_indent = if position == 0 { indent } else { continuation };
            out.push_str(&self.expr(operand, operand_indent));
            last = operand.span.end as usize;
        }
        out
    }

    /// Whether only blanks precede `offset` on its line of the source.
    fn starts_line(&self, offset: usize) -> bool {
        self.trivia.starts_line(offset)
    }

    /// Whether, in the source, a line break comes between `before` and the operator after it.
    fn operator_starts_line(&self, before: &Expr) -> bool {
        self.trivia.breaks_after(self.tight_end(before.span))
    }

    // -----------------------------------------------------------------------------------------
    // Expressions

    /// The unplaced comments in `[from, to)`, a stretch inside an expression, kept where they are:
    /// each ends a line, and the expression goes on at `indent + 4` on the next. (A comment that was
    /// on a line of its own joins the end of the line before: it stays between the same tokens.)
    fn inline_comments(&mut self, out: &mut String, from: usize, to: usize, indent: usize) {
        let taken = self.take(from, to);
        if taken.is_empty() {
            return;
        }
        for (position, index) in taken.into_iter().enumerate() {
            if position > 0 {
                out.push('\n');
                push_indent(out, indent + INDENT);
            } else if !out.is_empty() && !out.ends_with(' ') {
                out.push(' ');
            }
            out.push_str(self.comment_text(index));
        }
        out.push('\n');
        push_indent(out, indent + INDENT);
    }

    /// A separator token (`written` as printed, `length` bytes in the source) that is the next
    /// token after `from`, with the comments before it and those after it (up to `to`, the start of
    /// the next part) kept on their side of it.
    fn separator(
        &mut self,
        out: &mut String,
        from: usize,
        (written, length): (&str, usize),
        to: usize,
        indent: usize,
    ) {
        let at = self.trivia.next_token(from);
        self.inline_comments(out, from, at, indent);
        if out.ends_with(' ') {
            out.push_str(written.trim_start());
        } else {
            out.push_str(written);
        }
        self.inline_comments(out, at + length, to, indent);
    }

    /// An expression starting on a line indented by `indent` (blocks inside it indent from there).
    fn expr(&mut self, expr: &Expr, indent: usize) -> String {
        match &expr.kind {
            ExprKind::Number { value, text, .. } => {
                if text.is_empty() {
                    value.to_string()
                } else {
                    text.clone()
                }
            }
            ExprKind::Bool(value) => value.to_string(),
            ExprKind::Name(name) => name.name.clone(),
            ExprKind::Other(name) => format!("other.{}", name.name),
            ExprKind::Unary { op, operand } => {
                let (mut out, written) = match op {
                    UnaryOp::Neg => (String::from("-"), "-".len()),
                    UnaryOp::Not => (String::from("not "), "not".len()),
                };
                let op_end = expr.span.start as usize + written;
                self.inline_comments(&mut out, op_end, operand.span.start as usize, indent);
                out.push_str(&self.expr(operand, indent));
                out
            }
            ExprKind::Binary { op, lhs, rhs } => {
                let mut out = self.expr(lhs, indent);
                let symbol = op.symbol();
                self.separator(
                    &mut out,
                    self.tight_end(lhs.span),
                    (&format!(" {symbol} "), symbol.len()),
                    rhs.span.start as usize,
                    indent,
                );
                out.push_str(&self.expr(rhs, indent));
                out
            }
            ExprKind::Paren(inner) => {
                let mut out = String::from("(");
                let open = expr.span.start as usize + 1;
                self.inline_comments(&mut out, open, inner.span.start as usize, indent);
                out.push_str(&self.expr(inner, indent));
                let close = self.tight_end(expr.span).saturating_sub(1);
                self.inline_comments(&mut out, self.tight_end(inner.span), close, indent);
                out.push(')');
                out
            }
            ExprKind::Call { func, args, over } => {
                let mut out = format!("{}(", func.name);
                let mut last = self.trivia.next_token(func.span.end as usize) + 1;
                for (index, arg) in args.iter().enumerate() {
                    let start = arg
                        .name
                        .as_ref()
                        .map_or(arg.value.span.start, |name| name.span.start)
                        as usize;
                    if index > 0 {
                        self.separator(&mut out, last, (", ", 1), start, indent);
                    } else {
                        self.inline_comments(&mut out, last, start, indent);
                    }
                    if let Some(name) = &arg.name {
                        out.push_str(&name.name);
                        let value = arg.value.span.start as usize;
                        self.separator(&mut out, name.span.end as usize, (" = ", 1), value, indent);
                    }
                    out.push_str(&self.expr(&arg.value, indent));
                    last = self.tight_end(arg.value.span);
                    if index == 0 {
                        if let Some(over) = over {
                            for (position, axis) in over.axes.iter().enumerate() {
                                let separator = if position == 0 {
                                    (" over ", "over".len())
                                } else {
                                    (", ", 1)
                                };
                                let start = axis.span.start as usize;
                                self.separator(&mut out, last, separator, start, indent);
                                out.push_str(&axis.name);
                                last = axis.span.end as usize;
                            }
                        }
                    }
                }
                let close = self.tight_end(expr.span).saturating_sub(1);
                self.inline_comments(&mut out, last, close, indent);
                out.push(')');
                out
            }
            ExprKind::Index { base, criterion } => {
                let mut out = self.expr(base, indent);
                let start = criterion.span.start as usize;
                self.separator(&mut out, self.tight_end(base.span), ("[", 1), start, indent);
                out.push_str(&criterion.name);
                let close = self.tight_end(expr.span).saturating_sub(1);
                self.inline_comments(&mut out, criterion.span.end as usize, close, indent);
                out.push(']');
                out
            }
            ExprKind::Block { lets, body } => {
                let inner = indent + INDENT;
                let mut entries = Vec::new();
                for binding in lets {
                    // Columns: `let NAME`, then `= VALUE`, so the `=`s of a block line up.
                    let columns = vec![
                        format!("let {}", binding.name.name),
                        format!("= {}", self.expr(&binding.value, inner)),
                    ];
                    let mut entry = Entry::new(
                        binding.name.span.start as usize,
                        binding.value.span.end as usize,
                        columns.join(" "),
                        holds_block(&binding.value),
                    );
                    entry.columns = Some(columns);
                    entries.push(entry);
                }
                let text = self.expr(body, inner);
                entries.push(Entry::new(
                    body.span.start as usize,
                    body.span.end as usize,
                    text,
                    holds_block(body),
                ));
                let open = expr.span.start as usize + 1;
                let close = (expr.span.end as usize).saturating_sub(1);
                self.braced("{".to_string(), open, close, entries, indent)
            }
        }
    }
}

/// Whether `expr` holds a `{ let … }` block (which always prints over several lines).
fn holds_block(expr: &Expr) -> bool {
    match &expr.kind {
        ExprKind::Block { .. } => true,
        ExprKind::Number { .. } | ExprKind::Bool(_) | ExprKind::Name(_) | ExprKind::Other(_) => {
            false
        }
        ExprKind::Unary { operand, .. } => holds_block(operand),
        ExprKind::Binary { lhs, rhs, .. } => holds_block(lhs) || holds_block(rhs),
        ExprKind::Paren(inner) => holds_block(inner),
        ExprKind::Call { args, .. } => args.iter().any(|arg| holds_block(&arg.value)),
        ExprKind::Index { base, .. } => holds_block(base),
    }
}

/// The operands of a left-nested chain of `+`/`-`, of `and`, or of `or`, each with the operator
/// before it.
fn operator_chain(expr: &Expr) -> Option<Vec<(Option<BinaryOp>, &Expr)>> {
    let ExprKind::Binary { op: root, .. } = &expr.kind else {
        return None;
    };
    let in_chain = |op: BinaryOp| match root {
        BinaryOp::Add | BinaryOp::Sub => matches!(op, BinaryOp::Add | BinaryOp::Sub),
        BinaryOp::And | BinaryOp::Or => op == *root,
        _ => false,
    };
    if !in_chain(*root) {
        return None;
    }
    let mut operands = Vec::new();
    let mut current = expr;
    while let ExprKind::Binary { op, lhs, rhs } = &current.kind {
        if !in_chain(*op) {
            break;
        }
        operands.push((Some(*op), &**rhs));
        current = lhs;
    }
    operands.push((None, current));
    operands.reverse();
    Some(operands)
}

/// The column kind (`input`, `param`, `let`, section) of an item that has one, and the text left of
/// its ` : ` (inputs) or ` = ` (the others), which pads to line that up within a block: the name
/// part, and a param's ` : TYPE` (empty for the others), padded separately.
fn left_side(kind: &ItemKind) -> Option<(u8, String, String)> {
    let (kind, name) = match kind {
        ItemKind::Input(input) => (0, format!("input {}", input.name.name)),
        ItemKind::Param(param) => {
            let ty = param
                .ty
                .map(|(elem, _)| format!(" : {}", elem.name()))
                .unwrap_or_default();
            return Some((1, format!("param {}", param.name.name), ty));
        }
        ItemKind::Let(binding) => (2, format!("let {}", binding.name.name)),
        ItemKind::Reward(_) => (3, "reward".to_string()),
        ItemKind::Advantage(_) => (3, "advantage".to_string()),
        ItemKind::Loss(_) => (3, "loss".to_string()),
        ItemKind::Metric { name, .. } => (3, format!("metric {}", name.name)),
        _ => return None,
    };
    Some((kind, name, String::new()))
}

/// The widths each item pads the parts of its left side to: the widest among the items of the
/// same column kind in its block ((0, 0) for an item without a column). A `keep` among sections
/// takes no part, and does not interrupt them.
fn column_pads(items: &[Item], around: &[Surroundings]) -> Vec<(usize, usize)> {
    let sides: Vec<Option<(u8, usize, usize)>> = items
        .iter()
        .map(|item| {
            left_side(&item.kind)
                .map(|(kind, name, ty)| (kind, name.chars().count(), ty.chars().count()))
        })
        .collect();
    let mut pads = vec![(0, 0); items.len()];
    let mut start = 0;
    while start < items.len() {
        let end = (start + 1..items.len())
            .find(|&index| around[index].new_block)
            .unwrap_or(items.len());
        for index in start..end {
            let Some((kind, _, _)) = sides[index] else {
                continue;
            };
            pads[index] = sides[start..end]
                .iter()
                .flatten()
                .filter(|side| side.0 == kind)
                .fold((0, 0), |(name, ty), side| {
                    (name.max(side.1), ty.max(side.2))
                });
        }
        start = end;
    }
    pads
}

/// `prefix` without its last blank, then `body` on the next line at column `indent`.
fn hung(prefix: &str, body: &str, indent: usize) -> String {
    let mut out = prefix.trim_end().to_string();
    out.push('\n');
    push_indent(&mut out, indent);
    out.push_str(body);
    out
}

/// `text` followed by blanks up to `width` characters.
fn padded(text: &str, width: usize) -> String {
    let mut out = text.to_string();
    push_indent(&mut out, width.saturating_sub(text.chars().count()));
    out
}

/// Rewrite the entries with columns among `rows` (one block of a braced list): each column but the
/// last of an entry pads to the widest such column of the block.
fn align_columns(rows: &mut [(bool, Row)]) {
    let mut criteria: Vec<&mut Entry> = rows
        .iter_mut()
        .filter_map(|(_, row)| match row {
            Row::Entry(entry) if entry.columns.is_some() => Some(entry),
            _ => None,
        })
        .collect();
    let mut widths: Vec<usize> = Vec::new();
    for entry in &criteria {
        let columns = entry.columns.as_deref().unwrap_or_default();
        for (index, column) in columns
            .iter()
            .enumerate()
            .take(columns.len().saturating_sub(1))
        {
            if widths.len() <= index {
                widths.push(0);
            }
            widths[index] = widths[index].max(column.chars().count());
        }
    }
    for entry in &mut criteria {
        let columns = entry.columns.as_deref().unwrap_or_default();
        let mut text = String::new();
        for (index, column) in columns.iter().enumerate() {
            if index + 1 < columns.len() {
                text.push_str(&padded(column, widths[index]));
                text.push(' ');
            } else {
                text.push_str(column);
            }
        }
        entry.text = text;
    }
}

/// Align the trailing comments of one block: `units` are its items or entries, printed, whose first
/// lines start at column `indent` and whose later lines carry their own indentation; [`GAP`] marks
/// where a trailing comment starts. A run of code lines (a comment on a line of its own ends it)
/// with two trailing comments or more puts them 2 columns after the longest code line from its
/// first trailing comment to its last, when they all fit in [`MAX_WIDTH`] there. The [`GAP`]s left
/// become single spaces later.
fn align_trailing(units: &mut [&mut String], indent: usize) {
    // (code width, comment width) of each line; `None` for a comment on a line of its own
    let mut lines: Vec<Option<(usize, Option<usize>)>> = Vec::new();
    for unit in units.iter() {
        for (index, line) in unit.split('\n').enumerate() {
            let (code, comment) = match line.split_once(GAP) {
                Some((code, comment)) => (code, Some(comment.chars().count())),
                None => (line, None),
            };
            let start = if index == 0 { indent } else { 0 };
            lines.push(
                (!code.trim_start().starts_with("//"))
                    .then(|| (start + code.chars().count(), comment)),
            );
        }
    }
    // the column of each line's comment, where aligned
    let mut columns: Vec<Option<usize>> = vec![None; lines.len()];
    let mut start = 0;
    while start < lines.len() {
        let end = (start..lines.len())
            .find(|&index| lines[index].is_none())
            .unwrap_or(lines.len());
        // The stretch of the run from its first trailing comment to its last.
        let commented = |index: &usize| matches!(lines[*index], Some((_, Some(_))));
        let first = (start..end).find(commented);
        let last = (start..end).rev().find(commented);
        if let (Some(first), Some(last)) = (first, last) {
            let stretch = &lines[first..=last];
            let comments: Vec<usize> = stretch.iter().flatten().filter_map(|line| line.1).collect();
            let column = stretch
                .iter()
                .flatten()
                .map(|line| line.0)
                .max()
                .unwrap_or(0)
                + 2;
            if comments.len() >= 2 && comments.iter().all(|width| column + width <= MAX_WIDTH) {
                columns[first..=last].fill(Some(column));
            }
        }
        start = end + 1;
    }
    let mut columns = columns.into_iter().zip(lines);
    for unit in units.iter_mut() {
        let mut out = String::with_capacity(unit.len());
        for (index, line) in unit.split('\n').enumerate() {
            if index > 0 {
                out.push('\n');
            }
            match (columns.next(), line.split_once(GAP)) {
                (Some((Some(column), Some((width, _)))), Some((code, comment))) => {
                    out.push_str(code);
                    push_indent(&mut out, column - width);
                    out.push_str(comment);
                }
                _ => out.push_str(line),
            }
        }
        **unit = out;
    }
}

/// Items of one group sit together; a change of group gets a blank line.
fn kind_group(kind: &ItemKind) -> u8 {
    match kind {
        ItemKind::Import(_) => 0,
        ItemKind::Input(_) => 1,
        ItemKind::Param(_) => 2,
        ItemKind::Fn(_) => 3,
        ItemKind::Let(_) => 4,
        ItemKind::Rubric(_) => 5,
        ItemKind::Reward(_)
        | ItemKind::Advantage(_)
        | ItemKind::Loss(_)
        | ItemKind::Metric { .. }
        | ItemKind::Keep { .. } => 6,
        ItemKind::Rollout(_) => 7,
        ItemKind::State(_) => 8,
    }
}

fn type_expr(ty: &TypeExpr) -> String {
    if ty.axes.is_empty() {
        ty.elem.name().to_string()
    } else {
        format!("{}[{}]", ty.elem.name(), join_idents(&ty.axes))
    }
}

fn literal(literal: &Literal) -> String {
    if !literal.text.is_empty() {
        return literal.text.clone();
    }
    match &literal.value {
        LiteralValue::Number { value, .. } => value.to_string(),
        LiteralValue::Bool(value) => value.to_string(),
    }
}

fn rubric_value(value: &RubricValue) -> String {
    match value {
        RubricValue::Number(number) => literal(number),
        RubricValue::Param(name) => name.name.clone(),
    }
}

fn shape_call(shape: &ShapeCall) -> String {
    let mut out = shape.name.name.clone();
    if shape.parens || !shape.args.is_empty() {
        let args: Vec<String> = shape
            .args
            .iter()
            .map(|(name, value)| format!("{} = {}", name.name, rubric_value(value)))
            .collect();
        out.push('(');
        out.push_str(&args.join(", "));
        out.push(')');
    }
    out
}

fn criterion_attr(attr: &CriterionAttr) -> String {
    match attr {
        CriterionAttr::Weight(value) => format!("weight {}", rubric_value(value)),
        CriterionAttr::Points(value) => format!("points {}", rubric_value(value)),
        CriterionAttr::Levels(levels, _) => {
            let levels: Vec<String> = levels.iter().map(literal).collect();
            format!("levels [{}]", levels.join(", "))
        }
        CriterionAttr::Veto(_) => "veto".to_string(),
        CriterionAttr::Critical(_) => "critical".to_string(),
        CriterionAttr::Saturate(shape) => format!("saturate {}", shape_call(shape)),
    }
}

fn join_idents(names: &[Ident]) -> String {
    let names: Vec<&str> = names.iter().map(|name| name.name.as_str()).collect();
    names.join(", ")
}

/// A string literal, escaped as the grammar reads it back.
fn quoted(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn push_indent(out: &mut String, indent: usize) {
    out.extend(std::iter::repeat_n(' ', indent));
}

/// The widest line of `text`, whose first line starts at column `indent`.
fn width(text: &str, indent: usize) -> usize {
    text.lines()
        .enumerate()
        .map(|(index, line)| line.chars().count() + if index == 0 { indent } else { 0 })
        .max()
        .unwrap_or(indent)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::Value;

    use super::*;

    const FILE: FileId = FileId(0);

    /// Every construct of the grammar, with comments in many positions.
    const EVERYTHING: &str = r#"// Header comment.
// Second header line.

import std/loss.{ppo_clip, k3}   // trailing on import
import std/rubric
import "./mine.rlx".{helper,}
import "./dir/other \"q\" \\ \t.rlx"

/// The policy log-probs.
/// Second doc line.
input logp : f32[tok] policy
input value_est:f32[resp]value // critic
input mask : bool[tok] = true
input quality : f32[resp] = -1.5
input met : bool[resp, crit]
input points : f32[group,crit] = 0

param eps_low = 0.2
param eps_high : f32 = 0.28
param cap = inf
param floor = -inf
param top = +inf
param neg = -3
param big : f32 = +1e-3
param flag : bool = false
param steps : i32 = 10

fn clip_higher(r, a) = max(-a * r, -a * clamp(r, 1 - eps_low, 1 + eps_high))
fn typed(x : f32[tok], y : f32 = 2.5, z = -1,) : f32[tok] = x * y + z
fn nothing() = 1
fn blocky(x) = {
    let a = x ^ 2 // squared
    // the body
    let b = -a
    a + b
}

let centred = quality - mean(quality over resp)
let prec = -x ^ 2 + (a - b) - c + a - (b - c) + 2 ^ 3 ^ 2 + (-x) ^ 2 + -x[voice] + not a == b
let logic = not a and (b or c) or d != e
let calls = f(a, b, name = c,) + mean(x over tok, batch, k = 2) + g() + other.cluster + 1e-3 + .5 + 3.

rubric style {
  criterion voice weight 3 levels [0, 0.25, 0.5, 0.75, 1,]
  criterion grounded weight w points -2 saturate tanh(k = 3)
  criterion flattering veto // veto
  criterion plain
  interact voice, grounded : +0.5
  interact voice, plain : min -0.3
  interact grounded, plain : product gamma
  aggregate mean
  on_veto penalty(value = -1, scale = s,)
  shape power(gamma = 2)
  shape zero
  shape capped()
}

reward = quality * max(mean(cluster != other.cluster over others), 0.1)
advantage = reward - mean(reward over resp)
loss = mean(clip_higher(exp(logp - old_logp), advantage) over tok, batch) + beta * mean(k3(logp, ref_logp) over tok, batch)
metric clip_frac = mean(abs(exp(logp - old_logp) - 1) > eps_high over tok, batch)
keep group when std(reward over resp) > 0 and not done or x <= 1
keep resp when met[voice] == true and len != 0 and a >= b and c < d and e / f > 1

rollout {
  n = 8,
  temperature = 1.0
  modes = ["think", "no_think // not a comment"], hints = [],
  decay = 1 - progress
}
// footer comment
"#;

    /// Comments in every position the layout knows, and some it does not.
    const COMMENTS: &str = r#"// c0 file header

// c1 before doc
/// Doc for a.
// c2 between doc and item
input a : f32[tok] // c3 trailing
input b // c4 inside item
  : f32[resp]

// c5 before param group

param p = 1 // c6



param q = 2
reward = a // c7 after first operand
  + b // c8 after second
  - c
loss = mean(a // c9 inside call
  over tok)
rubric r { // c10 after brace
  // c11 leading entry
  criterion x weight 1 // c12 trailing entry

  // c13 after blank
  criterion // c14 inside criterion
    y veto
  // c15 before close
} // c16 after close
fn f(x) = { // c17 block open
  let a = x // c18 let trailing
  // c19 before body
  a // c20 body trailing
  // c21 before block close
} // c22 after block
rollout { n = 8, // c23
  // c24
  m = ["a // not a comment", "b"] }
// c25 end
"#;

    const COMMENTS_FORMATTED: &str = r#"// c0 file header

// c1 before doc
// c2 between doc and item
/// Doc for a.
input a : f32[tok] // c3 trailing
// c4 inside item
input b : f32[resp]

// c5 before param group

param p = 1 // c6

param q = 2

reward = a  // c7 after first operand
       + b  // c8 after second
       - c
loss   = mean(a // c9 inside call
    over tok)

// c14 inside criterion
rubric r { // c10 after brace
    // c11 leading entry
    criterion x weight 1 // c12 trailing entry

    // c13 after blank
    criterion y veto
    // c15 before close
} // c16 after close

fn f(x) = { // c17 block open
    let a = x // c18 let trailing
    // c19 before body
    a // c20 body trailing
    // c21 before block close
} // c22 after block

rollout {
    n = 8 // c23
    // c24
    m = ["a // not a comment", "b"]
}
// c25 end
"#;

    fn parse(text: &str) -> Module {
        parse_module(FILE, text)
            .unwrap_or_else(|errors| panic!("does not parse: {errors:?}\n{text}"))
    }

    /// The module as JSON without any span: keys `span` and `*_span`, and bare `{start, end}`
    /// objects (the spans inside tuples such as `Levels(_, Span)`).
    fn without_spans(module: &Module) -> Value {
        fn is_span(value: &Value) -> bool {
            let Value::Object(map) = value else {
                return false;
            };
            map.len() == 2 && map.contains_key("start") && map.contains_key("end")
        }
        fn strip(value: &mut Value) {
            if let Value::Object(map) = value {
                map.retain(|key, _| key != "span" && !key.ends_with("_span"));
            }
            let children: Vec<&mut Value> = match value {
                Value::Object(map) => map.values_mut().collect(),
                Value::Array(items) => items.iter_mut().collect(),
                _ => Vec::new(),
            };
            for child in children {
                if is_span(child) {
                    *child = Value::Null;
                } else {
                    strip(child);
                }
            }
        }
        let mut value = serde_json::to_value(module).expect("the AST serialises");
        strip(&mut value);
        value
    }

    fn comment_texts(text: &str) -> Vec<String> {
        let mut texts: Vec<String> = Trivia::scan(text)
            .comments()
            .iter()
            .map(|comment| comment.text.clone())
            .collect();
        texts.sort();
        texts
    }

    /// Format `text` and check the formatter's promises; returns the formatted text.
    fn check(text: &str) -> String {
        let module = parse(text);
        let formatted = format_source(FILE, text).expect("parses");
        let reparsed = parse(&formatted);
        assert_eq!(
            without_spans(&module),
            without_spans(&reparsed),
            "formatting changed the tree:\n{formatted}"
        );
        let again = format_module(&reparsed);
        assert_eq!(again, formatted, "formatting is not idempotent");
        assert_eq!(
            comment_texts(text),
            comment_texts(&formatted),
            "comments changed:\n{formatted}"
        );
        formatted
    }

    #[test]
    fn everything_round_trips() {
        let formatted = check(EVERYTHING);
        for line in formatted.lines() {
            assert!(line.chars().count() <= MAX_WIDTH, "line too long: {line}");
            assert_eq!(line, line.trim_end(), "trailing blanks");
        }
        assert!(formatted.contains("import \"./mine.rlx\".{helper}\n"));
        assert!(formatted.contains("input value_est : f32[resp] value // critic\n"));
        assert!(formatted.contains("input points    : f32[group, crit] = 0\n"));
        assert!(formatted.contains("param eps_low         = 0.2\n"));
        assert!(formatted.contains("param big      : f32  = +1e-3\n"));
        assert!(formatted.contains("param flag     : bool = false\n"));
        assert!(formatted
            .contains("fn typed(x: f32[tok], y: f32 = 2.5, z = -1): f32[tok] = x * y + z\n"));
        assert!(formatted.contains(
            "let prec    = -x ^ 2 + (a - b) - c + a - (b - c) + 2 ^ 3 ^ 2 + (-x) ^ 2 + -x[voice] + not a == b\n"
        ));
        assert!(formatted
            .contains("calls   = f(a, b, name = c) + mean(x over tok, batch, k = 2) + g()"));
        assert!(formatted.contains(
            "    criterion voice      weight 3           levels [0, 0.25, 0.5, 0.75, 1]\n"
        ));
        assert!(formatted
            .contains("    criterion grounded   weight w points -2 saturate tanh(k = 3)\n"));
        assert!(formatted.contains("    criterion flattering veto "));
        assert!(formatted.contains("    criterion plain\n"));
        assert!(formatted.contains("    interact voice, plain : min -0.3\n"));
        assert!(formatted.contains("    on_veto penalty(value = -1, scale = s)\n"));
        assert!(formatted.contains("    shape zero\n    shape capped()\n}"));
        assert!(formatted.contains(
            "loss             = mean(clip_higher(exp(logp - old_logp), advantage) over tok, batch)\n                 \
             + beta * mean("
        ));
        assert!(formatted.contains("\nkeep group when std(reward over resp) > 0"));
        assert!(formatted
            .contains("    modes = [\"think\", \"no_think // not a comment\"]\n    hints = []\n"));
        assert!(formatted.ends_with("    decay = 1 - progress\n}\n// footer comment\n"));
    }

    #[test]
    fn comments_keep_their_place() {
        let formatted = check(COMMENTS);
        assert_eq!(formatted, COMMENTS_FORMATTED);
    }

    #[test]
    fn layout() {
        let text =
            "import std/loss.{k3}\ninput x:f32[tok]policy\ninput y : f32\nparam beta=0.1\n\n\n\
                    param gamma = 1\nreward=x+y\nadvantage = reward-mean(reward over resp)\n\
                    fn f(a)=a*2\nfn g(a)={let b=a let c=b b+c}\nloss=mean(-x^2 over tok,batch)\n";
        let expected = "import std/loss.{k3}\n\ninput x : f32[tok] policy\ninput y : f32\n\nparam beta = 0.1\n\n\
                        param gamma = 1\n\nreward    = x + y\nadvantage = reward - mean(reward over resp)\n\n\
                        fn f(a) = a * 2\n\nfn g(a) = {\n    let b = a\n    let c = b\n    b + c\n}\n\n\
                        loss = mean(-x ^ 2 over tok, batch)\n";
        assert_eq!(check(text), expected);
    }

    #[test]
    fn precedence_and_parentheses_are_kept() {
        for (text, expected) in [
            ("reward = -x^2", "reward = -x ^ 2\n"),
            ("reward = (a-b)-c", "reward = (a - b) - c\n"),
            ("reward = a-(b-c)", "reward = a - (b - c)\n"),
            ("reward = 2^3^2", "reward = 2 ^ 3 ^ 2\n"),
            ("reward = (2^3)^2", "reward = (2 ^ 3) ^ 2\n"),
            ("reward = ((a))", "reward = ((a))\n"),
            ("reward = - -a", "reward = --a\n"),
            ("reward = not not a", "reward = not not a\n"),
            ("reward = 1.50 + 1E3 + 007", "reward = 1.50 + 1E3 + 007\n"),
        ] {
            assert_eq!(check(text), expected);
        }
    }

    #[test]
    fn long_chains_break_at_the_outer_operator() {
        let long = "a_long_operand_name";
        let text = format!(
            "loss = {long} + {long} * 2 - mean({long} - {long} over tok) + {long} - ({long} + {long} + {long})\n"
        );
        let expected = format!(
            "loss = {long}\n     + {long} * 2\n     - mean({long} - {long} over tok)\n     + {long}\n     \
             - ({long} + {long} + {long})\n"
        );
        assert_eq!(check(&text), expected);

        let text = format!(
            "keep group when {long} > 0 and {long} < 1 and not {long} and {long} or {long} == 2\n"
        );
        let text = text.replace(" or ", " and ");
        let formatted = check(&text);
        assert!(formatted.starts_with(&format!(
            "keep group when {long} > 0\n    and {long} < 1\n    and not"
        )));

        let text = format!(
            "rollout {{ x = {long} + {long} + {long} + {long} + {long} + {long} + {long} }}\n"
        );
        let formatted = check(&text);
        assert!(formatted.contains(&format!("\n    x = {long}\n        + {long}\n")));
    }

    #[test]
    fn inputs_align_their_colons() {
        let text = "input logp : f32[tok] policy // log-probs\ninput old_logp:f32[tok]\n\
                    input x : f32[resp] = 1 // a default\n\ninput lone : f32 // alone\n";
        let expected = "input logp     : f32[tok] policy  // log-probs\n\
                        input old_logp : f32[tok]\n\
                        input x        : f32[resp] = 1    // a default\n\
                        \n\
                        input lone : f32 // alone\n";
        assert_eq!(check(text), expected);
    }

    #[test]
    fn params_and_lets_align_their_equals() {
        let text = "param eps_low = 0.2\nparam eps_high : f32 = 0.28\nparam flag : bool = false\n\
                    \n\
                    let ratio = exp(logp - old_logp)\nlet diversity = d\nlet total = a\n  + b\n";
        let expected = "param eps_low         = 0.2\n\
                        param eps_high : f32  = 0.28\n\
                        param flag     : bool = false\n\
                        \n\
                        let ratio     = exp(logp - old_logp)\n\
                        let diversity = d\n\
                        let total     = a\n\
                        \x20             + b\n";
        assert_eq!(check(text), expected);
    }

    /// The shipped recipes' style: sections line up their `=`, and a chain the author broke keeps
    /// one operand per line with the operators under the `=`.
    #[test]
    fn sections_align_and_keep_authored_breaks() {
        let text = "reward = score\nadvantage = group_zscore(reward)\nloss = token_mean(ppo)\n\
                    \x20 + beta * token_mean(kl) - 0 // KL\n\
                    \n\
                    metric kl = token_mean(kl)\nmetric clip_frac = x\nmetric joined = a +\n  b\n\
                    keep group when a > 0\n  and b\n";
        let expected = "reward    = score\n\
                         advantage = group_zscore(reward)\n\
                         loss      = token_mean(ppo)\n\
                         \x20         + beta * token_mean(kl)\n\
                         \x20         - 0 // KL\n\
                         \n\
                         metric kl        = token_mean(kl)\n\
                         metric clip_frac = x\n\
                         metric joined    = a + b\n\
                         keep group when a > 0\n\
                         \x20   and b\n";
        assert_eq!(check(text), expected);

        // A `keep` among sections neither takes part nor interrupts them.
        let text = "reward = score\nkeep group when a > 0 // filter\nadvantage = r\n";
        let expected = "reward    = score\nkeep group when a > 0 // filter\nadvantage = r\n";
        assert_eq!(check(text), expected);

        // Joined again only when no operator starts a line.
        let text = "loss = a +\n  b\nfn f(x) = x\n  - 1\n";
        assert_eq!(check(text), "loss = a + b\n\nfn f(x) = x\n    - 1\n");
    }

    #[test]
    fn rubric_criteria_form_columns() {
        let text = "rubric style {\n\
                    criterion voice weight 3 levels [0, 1] // v\n\
                    criterion grounded weight 2 saturate tanh(k = 3) // g\n\
                    criterion structure weight 10\n\
                    criterion flattering veto // hacking\n\
                    interact voice, grounded : +0.5\n\
                    \n\
                    criterion apart points -2 veto\n\
                    criterion b weight 1 // b\n\
                    criterion unadorned_long_name\n\
                    aggregate mean\n\
                    }\n";
        let expected = "rubric style {\n\
            \x20   criterion voice      weight 3 levels [0, 1]         // v\n\
            \x20   criterion grounded   weight 2 saturate tanh(k = 3)  // g\n\
            \x20   criterion structure  weight 10\n\
            \x20   criterion flattering veto                           // hacking\n\
            \x20   interact voice, grounded : +0.5\n\
            \n\
            \x20   criterion apart points -2 veto\n\
            \x20   criterion b     weight 1 // b\n\
            \x20   criterion unadorned_long_name\n\
            \x20   aggregate mean\n\
            }\n";
        assert_eq!(check(text), expected);
    }

    #[test]
    fn trailing_comments_align_per_run() {
        // A comment line of its own ends a run; one comment alone keeps a single space.
        let text = "param a = 1 // one\nparam bbb = 2 // two\n// own line\nparam c = 3 // three\n";
        let expected =
            "param a   = 1  // one\nparam bbb = 2  // two\n// own line\nparam c   = 3 // three\n";
        assert_eq!(check(text), expected);

        // Aligned comments that would pass the width limit keep a single space.
        let long = format!("// {}", "x".repeat(95));
        let text = format!("param a = 1 {long}\nparam bbbbbbbbbbbbbbbbbbbb = 2 // b\n");
        let expected =
            format!("param a                    = 1 {long}\nparam bbbbbbbbbbbbbbbbbbbb = 2 // b\n");
        assert_eq!(check(&text), expected);

        // Comments between the operands of a broken chain line up too.
        let text = "reward = a // first\n  + bbbbbb // second\n";
        assert_eq!(
            check(text),
            "reward = a       // first\n       + bbbbbb  // second\n"
        );
    }

    #[test]
    fn local_lets_align_their_equals() {
        let text = "fn f(z, s = 0) = {\n  let right = -g(z) // right\n  let flipped = -g(-z) // flipped\n\
                    \x20 (1 - s) * right + s * flipped + a_long_body_line_that_is_not_commented\n}\n";
        let expected = "fn f(z, s = 0) = {\n\
                        \x20   let right   = -g(z)   // right\n\
                        \x20   let flipped = -g(-z)  // flipped\n\
                        \x20   (1 - s) * right + s * flipped + a_long_body_line_that_is_not_commented\n\
                        }\n";
        assert_eq!(check(text), expected);
    }

    #[test]
    fn bodies_hang_after_the_equals() {
        // Kept on a line of its own when the author put it there, even if it would fit.
        let text = "fn f(a, b) =\n  a + b\nlet x = // why\n  1\n";
        assert_eq!(
            check(text),
            "fn f(a, b) =\n    a + b\n\nlet x = // why\n    1\n"
        );

        // Too wide: a call goes on a line of its own; so does a chain that fits there.
        let args = "first_argument, second_argument, third_argument, fourth_argument";
        let text = format!("fn g(first_argument, second_argument) = where({args}, {args})\n");
        assert_eq!(
            check(&text),
            format!("fn g(first_argument, second_argument) =\n    where({args}, {args})\n")
        );
        let args = "first_argument, second_argument, third_argument";
        let body = format!("mean(f({args}) over tok) + mean(another_argument over tok)");
        let text = format!("fn h(first_argument) = {body}\n");
        assert_eq!(
            check(&text),
            format!("fn h(first_argument) =\n    {body}\n")
        );

        // A hung chain the author broke keeps its operators under its first operand.
        let text = "loss =\n  a\n  + b\n";
        assert_eq!(check(text), "loss =\n    a\n    + b\n");
    }

    /// The character that marks trailing comments while a layout is built may occur in the source;
    /// then comments are not aligned, and nothing else changes.
    #[test]
    fn the_gap_marker_in_the_source() {
        let text = "param a = 1 // x\u{1f}\nparam bb = 2 // y\n";
        assert_eq!(check(text), "param a  = 1 // x\u{1f}\nparam bb = 2 // y\n");
        let text = "rollout { modes = [\"a\u{1f}b\"] }\nparam a = 1 // x\nparam bb = 2 // y\n";
        assert_eq!(
            check(text),
            "rollout {\n    modes = [\"a\u{1f}b\"]\n}\n\nparam a  = 1 // x\nparam bb = 2 // y\n"
        );
        let text = "param a = 1 // x\nparam bb = 2 // y\n";
        assert_eq!(check(text), "param a  = 1  // x\nparam bb = 2  // y\n");
    }

    /// The shipped recipes and standard library: formatting keeps their tree and comments and is
    /// idempotent.
    #[test]
    fn shipped_files_format_stably() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut formatted_files = 0;
        for dir in ["recipes", "stdlib"] {
            let entries = std::fs::read_dir(root.join(dir))
                .unwrap_or_else(|error| panic!("cannot read {dir}: {error}"));
            let mut paths: Vec<std::path::PathBuf> = entries
                .filter_map(|entry| entry.ok().map(|entry| entry.path()))
                .filter(|path| path.extension().is_some_and(|ext| ext == "rlx"))
                .collect();
            paths.sort();
            for path in paths {
                let text = std::fs::read_to_string(&path)
                    .unwrap_or_else(|error| panic!("cannot read {}: {error}", path.display()));
                let formatted = check(&text);
                for line in formatted.lines() {
                    assert_eq!(
                        line,
                        line.trim_end(),
                        "trailing blanks in {}",
                        path.display()
                    );
                }
                formatted_files += 1;
            }
        }
        assert!(formatted_files >= 3, "only {formatted_files} files found");
    }

    #[test]
    fn empty_and_comment_only_files() {
        assert_eq!(check(""), "");
        assert_eq!(check("\n\n  \n"), "");
        assert_eq!(check("\n\n// a\n\n\n// b  \n\n"), "// a\n\n// b\n");
        assert_eq!(
            check("rubric r {}\nrollout {\n}\n"),
            "rubric r {}\n\nrollout {}\n"
        );
        assert_eq!(
            check("//// four\nreward = 1 ////x\n"),
            "//// four\nreward = 1 ////x\n"
        );
        assert_eq!(
            check("///\n///   indented\nreward = 1"),
            "///\n///   indented\nreward = 1\n"
        );
    }

    #[test]
    fn windows_line_endings() {
        let formatted = check("// a\r\ninput x : f32 // b\r\n\r\n\r\nreward = x\r\n");
        assert_eq!(formatted, "// a\ninput x : f32 // b\n\nreward = x\n");
    }

    #[test]
    fn the_deepest_parseable_expressions_format() {
        let negations = format!("reward = {}x\n", "-".repeat(250));
        let powers = format!("reward = {}x\n", "x ^ ".repeat(250));
        let parens = format!("reward = {}x{}\n", "(".repeat(60), ")".repeat(60));
        let blocks = format!(
            "reward = {}x{}\n",
            "{ let a = 1 ".repeat(30),
            " }".repeat(30)
        );
        for text in [negations, powers, parens, blocks] {
            check(&text);
        }
    }

    #[test]
    fn syntax_errors_are_returned() {
        let errors = format_source(FILE, "reward = ").expect_err("does not parse");
        assert!(!errors.is_empty());
    }

    /// A module built without trivia (no comments, no line breaks known) still formats to the
    /// same tree.
    #[test]
    fn a_module_without_trivia_formats() {
        for text in [EVERYTHING, COMMENTS] {
            let mut module = parse(text);
            module.trivia = Trivia::default();
            let formatted = format_module(&module);
            assert!(
                Trivia::scan(&formatted).comments().is_empty(),
                "{formatted}"
            );
            assert_eq!(without_spans(&parse(&formatted)), without_spans(&module));
        }
    }

    /// A comment inserted at every position of the rich snippets: wherever the result still parses,
    /// the formatter keeps the comment, the tree and idempotence.
    #[test]
    fn a_comment_anywhere_is_kept() {
        let mut checked = 0;
        for text in [EVERYTHING, COMMENTS] {
            let word = |at: usize| {
                text.as_bytes()
                    .get(at)
                    .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
            };
            // Inside a word the insertion cannot parse; skip those positions to keep the test fast.
            let positions = (0..=text.len())
                .filter(|&at| text.is_char_boundary(at) && !(at > 0 && word(at - 1) && word(at)));
            for at in positions {
                let variants = [" // z\n", "\n// z\n", "\n\n// z\n\n"];
                {
                    let comment = variants[at % variants.len()];
                    let mutated = format!("{}{comment}{}", &text[..at], &text[at..]);
                    if parse_module(FILE, &mutated).is_ok() {
                        check(&mutated);
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 1000, "only {checked} positions parse");
    }

    // ---------------------------------------------------------------------------------------------
    // Generated expressions

    const NAMES: &[&str] = &["a", "b", "logp", "reward", "x1"];
    const FUNCS: &[&str] = &["f", "mean", "clamp"];
    const AXES: &[&str] = &["tok", "resp", "group", "batch", "others", "crit"];
    const NUMBERS: &[&str] = &["0", "1", "2.5", "1e-3", ".5", "3.", "10", "0.001"];
    const BINARY: &[BinaryOp] = &[
        BinaryOp::Or,
        BinaryOp::And,
        BinaryOp::Eq,
        BinaryOp::Ne,
        BinaryOp::Lt,
        BinaryOp::Le,
        BinaryOp::Gt,
        BinaryOp::Ge,
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
    ];

    fn ident(name: &str) -> Ident {
        Ident {
            name: name.to_string(),
            span: Span::default(),
        }
    }

    fn node(kind: ExprKind) -> Expr {
        Expr {
            kind,
            span: Span::default(),
        }
    }

    fn number(text: &str) -> Expr {
        node(ExprKind::Number {
            value: text.parse().expect("a valid number"),
            is_int: !text.contains(['.', 'e', 'E']),
            text: text.to_string(),
        })
    }

    fn paren(expr: Expr) -> Expr {
        node(ExprKind::Paren(Box::new(expr)))
    }

    fn unary_precedence(op: UnaryOp) -> u8 {
        match op {
            UnaryOp::Not => 3,
            UnaryOp::Neg => 7,
        }
    }

    /// Whether `expr`, printed and followed by an operator of precedence `next`, would take that
    /// operator into its right-most operand (so it needs parentheses to stay as it is).
    fn absorbs(expr: &Expr, next: u8) -> bool {
        match &expr.kind {
            ExprKind::Binary { op, rhs, .. } => {
                let precedence = op.precedence();
                next > precedence
                    || (next == precedence && *op == BinaryOp::Pow)
                    || absorbs(rhs, next)
            }
            ExprKind::Unary { op, operand } => {
                next > unary_precedence(*op) || absorbs(operand, next)
            }
            _ => false,
        }
    }

    fn leftmost_is_open(expr: &Expr) -> bool {
        match &expr.kind {
            ExprKind::Unary {
                op: UnaryOp::Neg, ..
            }
            | ExprKind::Paren(_) => true,
            ExprKind::Binary { lhs, .. } => leftmost_is_open(lhs),
            ExprKind::Index { base, .. } => leftmost_is_open(base),
            _ => false,
        }
    }

    /// Add the parentheses without which the parser would build a different tree, so that the tree
    /// is one the parser can produce.
    fn fix(expr: Expr) -> Expr {
        let kind = match expr.kind {
            ExprKind::Unary { op, operand } => {
                let mut operand = fix(*operand);
                if let ExprKind::Binary { op: inner, .. } = &operand.kind {
                    if inner.precedence() < unary_precedence(op) {
                        operand = paren(operand);
                    }
                }
                ExprKind::Unary {
                    op,
                    operand: Box::new(operand),
                }
            }
            ExprKind::Binary { op, lhs, rhs } => {
                let mut lhs = fix(*lhs);
                let mut rhs = fix(*rhs);
                let lhs_compares = match &lhs.kind {
                    ExprKind::Binary { op: inner, .. } => inner.is_comparison(),
                    _ => false,
                };
                let chained = op.is_comparison() && lhs_compares;
                if chained || absorbs(&lhs, op.precedence()) {
                    lhs = paren(lhs);
                }
                if let ExprKind::Binary { op: inner, .. } = &rhs.kind {
                    let binds_tighter = inner.precedence() > op.precedence()
                        || (op == BinaryOp::Pow && *inner == BinaryOp::Pow);
                    if !binds_tighter {
                        rhs = paren(rhs);
                    }
                }
                ExprKind::Binary {
                    op,
                    lhs: Box::new(lhs),
                    rhs: Box::new(rhs),
                }
            }
            ExprKind::Paren(inner) => ExprKind::Paren(Box::new(fix(*inner))),
            ExprKind::Call { func, args, over } => ExprKind::Call {
                func,
                args: args
                    .into_iter()
                    .map(|arg| Arg {
                        name: arg.name,
                        value: fix(arg.value),
                    })
                    .collect(),
                over,
            },
            ExprKind::Index { base, criterion } => {
                let mut base = fix(*base);
                if matches!(base.kind, ExprKind::Unary { .. } | ExprKind::Binary { .. }) {
                    base = paren(base);
                }
                ExprKind::Index {
                    base: Box::new(base),
                    criterion,
                }
            }
            ExprKind::Block { lets, body } => {
                let lets: Vec<LocalLet> = lets
                    .into_iter()
                    .map(|binding| LocalLet {
                        name: binding.name,
                        value: fix(binding.value),
                    })
                    .collect();
                let mut body = fix(*body);
                // After a `let`, a leading `-` or `(` would continue the let's value.
                if !lets.is_empty() && leftmost_is_open(&body) {
                    body = node(ExprKind::Name(ident("x1")));
                }
                ExprKind::Block {
                    lets,
                    body: Box::new(body),
                }
            }
            kind => kind,
        };
        Expr {
            kind,
            span: expr.span,
        }
    }

    fn select(names: &'static [&'static str]) -> impl Strategy<Value = &'static str> + Clone {
        proptest::sample::select(names)
    }

    fn arb_expr() -> impl Strategy<Value = Expr> {
        let leaf = prop_oneof![
            select(NUMBERS).prop_map(number),
            any::<bool>().prop_map(|value| node(ExprKind::Bool(value))),
            select(NAMES).prop_map(|name| node(ExprKind::Name(ident(name)))),
            select(NAMES).prop_map(|name| node(ExprKind::Other(ident(name)))),
        ];
        leaf.prop_recursive(6, 64, 4, |inner| {
            prop_oneof![
                (any::<bool>(), inner.clone()).prop_map(|(neg, operand)| node(ExprKind::Unary {
                    op: if neg { UnaryOp::Neg } else { UnaryOp::Not },
                    operand: Box::new(operand),
                })),
                (
                    proptest::sample::select(BINARY),
                    inner.clone(),
                    inner.clone()
                )
                    .prop_map(|(op, lhs, rhs)| node(ExprKind::Binary {
                        op,
                        lhs: Box::new(lhs),
                        rhs: Box::new(rhs),
                    })),
                inner.clone().prop_map(paren),
                (
                    select(FUNCS),
                    proptest::collection::vec(inner.clone(), 0..3),
                    proptest::option::of(proptest::collection::vec(select(AXES), 1..3)),
                    proptest::collection::vec((select(NAMES), inner.clone()), 0..2),
                )
                    .prop_map(|(func, positional, axes, named)| {
                        let over = axes.filter(|_| !positional.is_empty());
                        let positional_count = if over.is_some() { 1 } else { positional.len() };
                        let mut args: Vec<Arg> = positional
                            .into_iter()
                            .take(positional_count)
                            .map(|value| Arg { name: None, value })
                            .collect();
                        args.extend(named.into_iter().map(|(name, value)| Arg {
                            name: Some(ident(name)),
                            value,
                        }));
                        node(ExprKind::Call {
                            func: ident(func),
                            args,
                            over: over.map(|axes| Over {
                                axes: axes.into_iter().map(ident).collect(),
                                span: Span::default(),
                            }),
                        })
                    }),
                (inner.clone(), select(NAMES)).prop_map(|(base, criterion)| node(
                    ExprKind::Index {
                        base: Box::new(base),
                        criterion: ident(criterion),
                    }
                )),
                (
                    proptest::collection::vec((select(NAMES), inner.clone()), 0..3),
                    inner.clone()
                )
                    .prop_map(|(lets, body)| node(ExprKind::Block {
                        lets: lets
                            .into_iter()
                            .map(|(name, value)| LocalLet {
                                name: ident(name),
                                value,
                            })
                            .collect(),
                        body: Box::new(body),
                    })),
            ]
        })
        .prop_map(fix)
    }

    proptest! {
        #[test]
        fn generated_expressions_round_trip(expr in arb_expr()) {
            let module = Module {
                items: vec![Item {
                    doc: Vec::new(),
                    kind: ItemKind::Reward(expr),
                    span: Span::default(),
                }],
                trivia: Trivia::default(),
            };
            let formatted = format_module(&module);
            let reparsed = parse_module(FILE, &formatted);
            prop_assert!(reparsed.is_ok(), "does not parse: {:?}\n{}", reparsed.err(), formatted);
            let reparsed = reparsed.unwrap_or_else(|_| unreachable!());
            prop_assert_eq!(without_spans(&module), without_spans(&reparsed), "{}", formatted);
            let again = format_source(FILE, &formatted);
            prop_assert_eq!(again.ok(), Some(formatted));
        }

    }
}
