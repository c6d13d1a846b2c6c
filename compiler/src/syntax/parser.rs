//! pest pairs → AST. Precedence lives in one table (`PRATT`) whose order is the one documented in
//! docs/language.md: `or` < `and` < `not` < comparisons < `+ -` < `* /` < unary `-` < `^` < `[index]`.
//! Unary minus binds looser than `^`, so `-x^2` is `-(x^2)` as in mathematics.

use std::sync::LazyLock;

use pest::iterators::{Pair, Pairs};
use pest::pratt_parser::{Assoc, Op, PrattParser};
use pest::Parser as _;

use super::ast::*;
use crate::diagnostic::Diagnostic;
use crate::source::FileId;

#[derive(pest_derive::Parser)]
#[grammar = "../grammar/rlx.pest"]
struct RlxParser;

/// Deepest bracket nesting accepted before parsing (the parser and checker recurse on nesting).
pub const MAX_NESTING: usize = 64;
/// Deepest expression tree accepted after parsing (operator chains such as `- - - x` or `a^b^c^…`).
pub const MAX_EXPR_DEPTH: usize = 256;
/// Largest source file accepted, in bytes.
pub const MAX_SOURCE_BYTES: usize = 1 << 20;

static PRATT: LazyLock<PrattParser<Rule>> = LazyLock::new(|| {
    PrattParser::new()
        .op(Op::infix(Rule::op_or, Assoc::Left))
        .op(Op::infix(Rule::op_and, Assoc::Left))
        .op(Op::prefix(Rule::op_not))
        .op(Op::infix(Rule::op_eq, Assoc::Left)
            | Op::infix(Rule::op_ne, Assoc::Left)
            | Op::infix(Rule::op_lt, Assoc::Left)
            | Op::infix(Rule::op_le, Assoc::Left)
            | Op::infix(Rule::op_gt, Assoc::Left)
            | Op::infix(Rule::op_ge, Assoc::Left))
        .op(Op::infix(Rule::op_add, Assoc::Left) | Op::infix(Rule::op_sub, Assoc::Left))
        .op(Op::infix(Rule::op_mul, Assoc::Left) | Op::infix(Rule::op_div, Assoc::Left))
        .op(Op::prefix(Rule::op_neg))
        .op(Op::infix(Rule::op_pow, Assoc::Right))
        .op(Op::postfix(Rule::index))
});

/// Stack for one parse: operator chains such as `- - - … x` or `a ^ a ^ …` recurse in the Pratt parser
/// (and their tree drops recursively) before the depth limit can reject them.
const PARSER_STACK_BYTES: usize = 256 << 20;

/// Parse one file. On failure, the diagnostics say where and what was expected.
///
/// Runs on a thread of its own with a large stack, so that no input overflows the caller's stack; a
/// tree it returns is at most `MAX_EXPR_DEPTH` deep, which any stack can then walk and drop.
pub fn parse_module(file: FileId, text: &str) -> Result<Module, Vec<Diagnostic>> {
    std::thread::scope(|scope| {
        let worker = std::thread::Builder::new()
            .name("rlx-parser".into())
            .stack_size(PARSER_STACK_BYTES)
            .spawn_scoped(scope, || parse_module_here(file, text));
        match worker {
            Ok(handle) => handle
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            // No thread to be had: parse here, as deep as this stack allows.
            Err(_) => parse_module_here(file, text),
        }
    })
}

fn parse_module_here(file: FileId, text: &str) -> Result<Module, Vec<Diagnostic>> {
    if text.len() > MAX_SOURCE_BYTES {
        return Err(vec![Diagnostic::error(
            "rlx::too_large",
            file,
            format!(
                "source file is {} bytes; the limit is {MAX_SOURCE_BYTES}",
                text.len()
            ),
        )
        .label(Span::new(0, 0), "this file")]);
    }
    if let Some(span) = too_deep_brackets(text) {
        return Err(vec![Diagnostic::error(
            "rlx::too_deep",
            file,
            format!("brackets nest more than {MAX_NESTING} deep"),
        )
        .label(span, "nesting limit reached here")
        .help("split the expression with `let` bindings")]);
    }
    let pairs =
        parse_rule(Rule::file, text).map_err(|error| vec![syntax_error(file, text, error)])?;
    let mut builder = Builder {
        file,
        errors: Vec::new(),
    };
    let mut module = builder.file(pairs);
    if builder.errors.is_empty() {
        module.trivia = super::trivia::Trivia::scan(text);
        Ok(module)
    } else {
        Err(builder.errors)
    }
}

/// Parse one expression on its own (used for code the compiler generates, e.g. rubric scoring).
pub fn parse_expression(file: FileId, text: &str) -> Result<Expr, Vec<Diagnostic>> {
    let mut pairs = RlxParser::parse(Rule::expr_only, text)
        .map_err(|error| vec![syntax_error(file, text, error)])?;
    let mut builder = Builder {
        file,
        errors: Vec::new(),
    };
    let expr_pair = next(&mut pairs)
        .into_inner()
        .next()
        .expect("grammar guarantees an expression");
    let expr = builder.expr(expr_pair);
    if builder.errors.is_empty() {
        Ok(expr)
    } else {
        Err(builder.errors)
    }
}

/// The span of the first bracket opened beyond `MAX_NESTING`, ignoring comments and strings.
fn too_deep_brackets(text: &str) -> Option<Span> {
    let bytes = text.as_bytes();
    let mut depth = 0usize;
    let mut index = 0;
    while index < bytes.len() {
        match bytes[index] {
            b'/' if bytes.get(index + 1) == Some(&b'/') => {
                while index < bytes.len() && bytes[index] != b'\n' {
                    index += 1;
                }
                continue;
            }
            b'"' => {
                index += 1;
                while index < bytes.len() && bytes[index] != b'"' && bytes[index] != b'\n' {
                    index += if bytes[index] == b'\\' { 2 } else { 1 };
                }
            }
            b'(' | b'[' | b'{' => {
                depth += 1;
                if depth > MAX_NESTING {
                    return Some(Span::new(index, index + 1));
                }
            }
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        index += 1;
    }
    None
}

/// Parse `text` as `rule`. On failure, parse it again with pest's token tracking on: the plain error
/// knows only the rules it tried, so a missing `:`, `=` or `)` (a literal, not a rule) would be reported
/// at the start of the enclosing declaration instead of where it is missing.
fn parse_rule(rule: Rule, text: &str) -> Result<Pairs<'_, Rule>, pest::error::Error<Rule>> {
    RlxParser::parse(rule, text).map_err(|error| {
        // The switch is process-wide: hold it for the whole detailed parse, and only on the error path.
        static DETAIL: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _guard = DETAIL
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        pest::set_error_detail(true);
        let detailed = RlxParser::parse(rule, text).err();
        pest::set_error_detail(false);
        detailed.unwrap_or(error)
    })
}

/// A reader's name for a literal token pest expected, if it is one worth naming: `at_rule_position`
/// says whether rules were expected at the same place (then only closers and commas add anything).
fn token_description(token: &str, at_rule_position: bool) -> Option<&'static str> {
    Some(match token {
        ")" => "`)`",
        "]" => "`]`",
        "}" => "`}`",
        "," => "`,`",
        _ if at_rule_position => return None,
        ":" => "`:`",
        "=" => "`=`",
        "(" => "`(`",
        "[" => "`[`",
        "{" => "`{`",
        _ => return None,
    })
}

fn syntax_error(file: FileId, text: &str, error: pest::error::Error<Rule>) -> Diagnostic {
    use pest::error::{ErrorVariant, InputLocation};
    let (mut start, mut end) = match error.location {
        InputLocation::Pos(position) => (position, position),
        InputLocation::Span((start, end)) => (start, end),
    };
    let (message, label) = match &error.variant {
        ErrorVariant::ParsingError { positives, .. } => {
            let mut names: Vec<&str> = positives
                .iter()
                .filter_map(|rule| rule_description(*rule))
                .collect();
            if let Some(attempts) = error.parse_attempts() {
                let tokens = |at_rule_position| -> Vec<&str> {
                    attempts
                        .expected_tokens()
                        .iter()
                        .filter_map(|token| token_description(&token.to_string(), at_rule_position))
                        .collect()
                };
                if attempts.max_position == start {
                    names.extend(tokens(true));
                } else if attempts.max_position > start {
                    // A literal was missing further on than any rule got.
                    let further = tokens(false);
                    if !further.is_empty() {
                        (start, end) = (attempts.max_position, attempts.max_position);
                        names = further;
                    }
                }
            }
            let found = describe_found(text, start);
            // At the end of the file, point at the last token, where the reader looks (a label on the
            // empty line after the final newline would not show).
            if start >= text.trim_end().len() {
                let at = text.trim_end().len();
                let before = text[..at].chars().next_back().map_or(0, char::len_utf8);
                (start, end) = (at - before, at);
            }
            names.sort_unstable();
            names.dedup();
            let expected = human_list(&names);
            (
                format!("syntax error: expected {expected}, found {found}"),
                format!("expected {expected}"),
            )
        }
        ErrorVariant::CustomError { message } => {
            (format!("syntax error: {message}"), message.clone())
        }
    };
    let mut diagnostic =
        Diagnostic::error("rlx::syntax", file, message).label(Span::new(start, end), label);
    if let Some(help) = syntax_help(text, start) {
        diagnostic = diagnostic.help(help);
    }
    diagnostic
}

/// What stands at `offset`, for "found …".
fn describe_found(text: &str, offset: usize) -> String {
    let rest = text.get(offset..).unwrap_or("");
    let rest = rest.trim_start_matches([' ', '\t', '\r']);
    if rest.trim().is_empty() {
        return "end of file".to_string();
    }
    match rest.chars().next() {
        None => "end of file".to_string(),
        Some('\n') => "end of line".to_string(),
        Some(c) if c.is_alphanumeric() || c == '_' => {
            let word: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .take(40)
                .collect();
            format!("`{word}`")
        }
        Some(c) => match invisible_name(c) {
            Some(name) => format!("U+{:04X} ({name})", c as u32),
            None => format!("`{c}`"),
        },
    }
}

/// What to call a character that would be invisible between backticks.
fn invisible_name(c: char) -> Option<&'static str> {
    match c {
        '\u{feff}' => Some("a byte order mark"),
        '\u{00a0}' => Some("a no-break space"),
        '\u{00ad}'
        | '\u{180e}'
        | '\u{200b}'..='\u{200f}'
        | '\u{2028}'..='\u{202e}'
        | '\u{2060}'..='\u{2064}'
        | '\u{2066}'..='\u{2069}' => Some("an invisible character"),
        c if c.is_control() || c.is_whitespace() => Some("a control or space character"),
        _ => None,
    }
}

/// The words that can never be names (grammar/rlx.pest, `keyword`). Other keywords (`reward`,
/// `criterion`, `policy`, …) are keywords only where the grammar expects them.
pub const RESERVED_WORDS: &[&str] = &[
    "import", "input", "param", "fn", "let", "rubric", "metric", "keep", "when", "over", "others",
    "other", "rollout", "true", "false", "and", "or", "not",
];

fn syntax_help(text: &str, offset: usize) -> Option<String> {
    let rest = text.get(offset..).unwrap_or("");
    let word: String = rest
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    if RESERVED_WORDS.contains(&word.as_str()) {
        return Some(format!(
            "`{word}` is a reserved word and cannot be used as a name"
        ));
    }
    if rest.starts_with("&&") || rest.starts_with("||") {
        return Some("rlx spells the boolean operators `and`, `or` and `not`".to_string());
    }
    if rest.starts_with('!') && !rest.starts_with("!=") {
        return Some("rlx spells negation `not`".to_string());
    }
    if rest.starts_with('#') {
        return Some("comments start with `//`".to_string());
    }
    None
}

fn human_list(names: &[&str]) -> String {
    match names {
        [] => "something else".to_string(),
        [one] => one.to_string(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// A reader's name for a rule that can be expected; `None` hides the rule from "expected …" lists.
fn rule_description(rule: Rule) -> Option<&'static str> {
    Some(match rule {
        Rule::EOI => "end of file",
        Rule::item | Rule::doc_line => {
            "a declaration (`input`, `param`, `fn`, `let`, a section, …)"
        }
        Rule::import_decl => "`import`",
        Rule::input_decl => "`input`",
        Rule::param_decl => "`param`",
        Rule::fn_decl => "`fn`",
        Rule::let_decl | Rule::local_let => "`let`",
        Rule::rubric_decl => "`rubric`",
        Rule::reward_section => "`reward`",
        Rule::advantage_section => "`advantage`",
        Rule::loss_section => "`loss`",
        Rule::metric_section => "`metric`",
        Rule::keep_section => "`keep`",
        Rule::rollout_block => "`rollout`",
        Rule::state_decl => "`state`",
        Rule::state_init => "a literal or a param name",
        Rule::std_path => "a module path such as `std/loss`",
        Rule::package_path => "a package module such as `name/module`",
        Rule::data_path => "a package file such as `name/style.toml`",
        Rule::criteria_file => "`criteria`",
        Rule::string => "a string",
        Rule::import_list => "`.{names}`",
        Rule::type_expr | Rule::elem_type => "a type such as `f32[tok]`",
        Rule::input_role => "`policy` or `value`",
        Rule::literal | Rule::signed_number | Rule::signed_inf => {
            "a literal number or `true`/`false`"
        }
        Rule::fn_param => "a parameter name",
        Rule::criterion => "`criterion`",
        Rule::interact => "`interact`",
        Rule::rubric_aggregate => "`aggregate`",
        Rule::rubric_on_veto => "`on_veto`",
        Rule::rubric_shape => "`shape`",
        Rule::attr_weight
        | Rule::attr_points
        | Rule::attr_levels
        | Rule::attr_veto
        | Rule::attr_critical
        | Rule::attr_saturate => {
            "a criterion attribute (`weight`, `points`, `levels`, `veto`, `critical`, `saturate`)"
        }
        Rule::interact_mode => "`product` or `min`",
        Rule::shape_call => "a shape such as `tanh(k = 3)`",
        Rule::shape_arg => "`name = value`",
        Rule::rubric_value => "a number or a `param` name",
        Rule::keep_level => "`group` or `resp`",
        Rule::rollout_entry => "a rollout setting `name = value`",
        Rule::string_list => "a list of strings",
        Rule::expr
        | Rule::number
        | Rule::kw_true
        | Rule::kw_false
        | Rule::paren
        | Rule::block
        | Rule::call
        | Rule::other_ref
        | Rule::op_neg
        | Rule::op_not => "an expression",
        Rule::op_or
        | Rule::op_and
        | Rule::op_eq
        | Rule::op_ne
        | Rule::op_le
        | Rule::op_ge
        | Rule::op_lt
        | Rule::op_gt
        | Rule::op_add
        | Rule::op_sub
        | Rule::op_mul
        | Rule::op_div
        | Rule::op_pow => "an operator",
        Rule::index => "`[criterion]`",
        Rule::call_arg => "an argument",
        Rule::over_clause => "`over`",
        Rule::axis => {
            "an axis (`tok`, `resp`, `group`, `batch`, `others`, `crit`, `dim` or a rubric)"
        }
        Rule::ident | Rule::call_name => "a name",
        Rule::word_import => "`import`",
        Rule::word_input => "`input`",
        Rule::word_param => "`param`",
        Rule::word_fn => "`fn`",
        Rule::word_let => "`let`",
        Rule::word_rubric => "`rubric`",
        Rule::word_metric => "`metric`",
        Rule::word_keep => "`keep`",
        Rule::word_when => "`when`",
        Rule::word_over => "`over`",
        Rule::word_other => "`other`",
        Rule::word_rollout => "`rollout`",
        Rule::word_reward => "`reward`",
        Rule::word_advantage => "`advantage`",
        Rule::word_loss => "`loss`",
        Rule::word_criterion => "`criterion`",
        Rule::word_interact => "`interact`",
        Rule::word_weight => "`weight`",
        Rule::word_points => "`points`",
        Rule::word_levels => "`levels`",
        Rule::word_veto => "`veto`",
        Rule::word_critical => "`critical`",
        Rule::word_saturate => "`saturate`",
        Rule::word_aggregate => "`aggregate`",
        Rule::word_on_veto => "`on_veto`",
        Rule::word_shape => "`shape`",
        _ => return None,
    })
}

struct Builder {
    file: FileId,
    errors: Vec<Diagnostic>,
}

/// The pair's span without trailing whitespace and comments (pest includes the trivia it skipped
/// while looking for an optional or repeated part that was not there).
fn span_of(pair: &Pair<'_, Rule>) -> Span {
    let span = pair.as_span();
    let start = span.start();
    // The last child ends last; trim it too, since it may itself end with skipped trivia.
    let Some(inner_end) = pair
        .clone()
        .into_inner()
        .last()
        .map(|p| span_of(&p).end as usize)
    else {
        return Span::new(start, span.end());
    };
    let text = pair.as_str().as_bytes();
    let mut index = inner_end - start;
    let mut last = index;
    while index < text.len() {
        if text[index..].starts_with(b"//") {
            while index < text.len() && text[index] != b'\n' {
                index += 1;
            }
        } else if text[index].is_ascii_whitespace() {
            index += 1;
        } else {
            index += 1;
            last = index;
        }
    }
    Span::new(start, start + last)
}

/// Whether the first significant character of `text` (after whitespace and comments) is `wanted`.
fn next_significant_is(text: &str, wanted: u8) -> bool {
    let bytes = text.as_bytes();
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index..].starts_with(b"//") {
            while index < bytes.len() && bytes[index] != b'\n' {
                index += 1;
            }
        } else if bytes[index].is_ascii_whitespace() {
            index += 1;
        } else {
            return bytes[index] == wanted;
        }
    }
    false
}

fn ident(pair: Pair<'_, Rule>) -> Ident {
    Ident {
        name: pair.as_str().to_string(),
        span: span_of(&pair),
    }
}

/// The next child; the grammar guarantees it exists, so a missing one is a compiler bug.
fn next<'i>(pairs: &mut Pairs<'i, Rule>) -> Pair<'i, Rule> {
    pairs.next().expect("grammar guarantees this child")
}

impl Builder {
    fn file(&mut self, mut pairs: Pairs<'_, Rule>) -> Module {
        let file = next(&mut pairs);
        let items = file
            .into_inner()
            .filter(|pair| pair.as_rule() == Rule::item)
            .map(|pair| self.item(pair))
            .collect();
        Module {
            items,
            trivia: Default::default(),
        }
    }

    fn item(&mut self, pair: Pair<'_, Rule>) -> Item {
        let mut doc = Vec::new();
        let mut kind = None;
        let mut span = span_of(&pair);
        for child in pair.into_inner() {
            if child.as_rule() == Rule::doc_line {
                let line = child.as_str().trim_start_matches("///");
                doc.push(
                    line.strip_prefix(' ')
                        .unwrap_or(line)
                        .trim_end()
                        .to_string(),
                );
            } else {
                span = span_of(&child);
                kind = Some(self.item_kind(child));
            }
        }
        Item {
            doc,
            kind: kind.expect("grammar guarantees an item body"),
            span,
        }
    }

    fn item_kind(&mut self, pair: Pair<'_, Rule>) -> ItemKind {
        let rule = pair.as_rule();
        let mut inner = pair.into_inner();
        match rule {
            Rule::import_decl => {
                let source = next(&mut inner);
                let source_span = span_of(&source);
                let source = match source.as_rule() {
                    Rule::std_path => {
                        ImportSource::Std(source.as_str().trim_start_matches("std/").to_string())
                    }
                    Rule::package_path => package_source(source.as_str()),
                    _ => ImportSource::Relative(self.string(source)),
                };
                let names = inner
                    .next()
                    .map(|list| list.into_inner().map(ident).collect());
                ItemKind::Import(Import {
                    source,
                    source_span,
                    names,
                })
            }
            Rule::input_decl => {
                let name = ident(next(&mut inner));
                let ty = self.type_expr(next(&mut inner));
                let mut role = None;
                let mut default = None;
                for child in inner {
                    match child.as_rule() {
                        Rule::input_role => {
                            role = Some(if child.as_str() == "policy" {
                                InputRole::Policy
                            } else {
                                InputRole::Value
                            })
                        }
                        _ => default = Some(self.literal(child)),
                    }
                }
                ItemKind::Input(InputDecl {
                    name,
                    ty,
                    role,
                    default,
                })
            }
            Rule::param_decl => {
                let name = ident(next(&mut inner));
                let mut ty = None;
                let mut value = None;
                for child in inner {
                    match child.as_rule() {
                        Rule::elem_type => ty = Some((elem_type(child.as_str()), span_of(&child))),
                        _ => value = Some(self.literal(child)),
                    }
                }
                ItemKind::Param(ParamDecl {
                    name,
                    ty,
                    value: value.expect("grammar guarantees a param value"),
                })
            }
            Rule::fn_decl => {
                let name = ident(next(&mut inner));
                let mut params = Vec::new();
                let mut ret = None;
                let mut body = None;
                for child in inner {
                    match child.as_rule() {
                        Rule::fn_param => params.push(self.fn_param(child)),
                        Rule::type_expr => ret = Some(self.type_expr(child)),
                        _ => body = Some(self.expr(child)),
                    }
                }
                ItemKind::Fn(FnDecl {
                    name,
                    params,
                    ret,
                    body: body.expect("grammar guarantees a body"),
                })
            }
            Rule::let_decl => {
                let name = ident(next(&mut inner));
                let value = self.expr(next(&mut inner));
                ItemKind::Let(LetDecl { name, value })
            }
            Rule::state_decl => {
                let name = ident(next(&mut inner));
                let mut child = next(&mut inner);
                let mut ty = None;
                if child.as_rule() == Rule::elem_type {
                    ty = Some((elem_type(child.as_str()), span_of(&child)));
                    child = next(&mut inner);
                }
                let init = child
                    .into_inner()
                    .next()
                    .expect("grammar guarantees a state's initial value");
                let init = match init.as_rule() {
                    Rule::ident => StateInit::Param(ident(init)),
                    _ => StateInit::Literal(self.literal(init)),
                };
                let update = self.expr(next(&mut inner));
                ItemKind::State(StateDecl {
                    name,
                    ty,
                    init,
                    update,
                })
            }
            Rule::rubric_decl => {
                let name = ident(next(&mut inner));
                let entries = inner.map(|entry| self.rubric_entry(entry)).collect();
                ItemKind::Rubric(RubricDecl { name, entries })
            }
            Rule::reward_section => ItemKind::Reward(self.expr(next(&mut inner))),
            Rule::advantage_section => ItemKind::Advantage(self.expr(next(&mut inner))),
            Rule::loss_section => ItemKind::Loss(self.expr(next(&mut inner))),
            Rule::metric_section => {
                let name = ident(next(&mut inner));
                let value = self.expr(next(&mut inner));
                ItemKind::Metric { name, value }
            }
            Rule::keep_section => {
                let level_pair = next(&mut inner);
                let level = if level_pair.as_str() == "group" {
                    KeepLevel::Group
                } else {
                    KeepLevel::Resp
                };
                let level_span = span_of(&level_pair);
                let condition = self.expr(next(&mut inner));
                ItemKind::Keep {
                    level,
                    level_span,
                    condition,
                }
            }
            Rule::rollout_block => {
                let entries = inner
                    .map(|entry| {
                        let span = span_of(&entry);
                        let mut parts = entry.into_inner();
                        let key = ident(next(&mut parts));
                        let value_pair = next(&mut parts);
                        let value = match value_pair.as_rule() {
                            Rule::string_list => RolloutValue::Strings(
                                value_pair
                                    .into_inner()
                                    .map(|s| {
                                        let span = span_of(&s);
                                        (self.string(s), span)
                                    })
                                    .collect(),
                            ),
                            _ => RolloutValue::Expr(self.expr(value_pair)),
                        };
                        RolloutEntry { key, value, span }
                    })
                    .collect();
                ItemKind::Rollout(entries)
            }
            rule => unreachable!("item rule {rule:?}"),
        }
    }

    fn string(&mut self, pair: Pair<'_, Rule>) -> String {
        let raw = pair
            .into_inner()
            .next()
            .map(|inner| inner.as_str())
            .unwrap_or("");
        let mut out = String::with_capacity(raw.len());
        let mut chars = raw.chars();
        while let Some(c) = chars.next() {
            if c == '\\' {
                match chars.next() {
                    Some('n') => out.push('\n'),
                    Some('t') => out.push('\t'),
                    Some(other) => out.push(other),
                    None => {}
                }
            } else {
                out.push(c);
            }
        }
        out
    }

    fn type_expr(&mut self, pair: Pair<'_, Rule>) -> TypeExpr {
        let span = span_of(&pair);
        let mut inner = pair.into_inner();
        let elem = elem_type(next(&mut inner).as_str());
        TypeExpr {
            elem,
            axes: inner.map(ident).collect(),
            span,
        }
    }

    fn fn_param(&mut self, pair: Pair<'_, Rule>) -> FnParam {
        let mut inner = pair.into_inner();
        let name = ident(next(&mut inner));
        let mut ty = None;
        let mut default = None;
        for child in inner {
            match child.as_rule() {
                Rule::type_expr => ty = Some(self.type_expr(child)),
                _ => default = Some(self.expr(child)),
            }
        }
        FnParam { name, ty, default }
    }

    fn literal(&mut self, pair: Pair<'_, Rule>) -> Literal {
        let span = span_of(&pair);
        let text = pair.as_str().to_string();
        let inner = pair
            .into_inner()
            .next()
            .expect("grammar guarantees a literal");
        let value = match inner.as_rule() {
            Rule::kw_true => LiteralValue::Bool(true),
            Rule::kw_false => LiteralValue::Bool(false),
            Rule::signed_inf => LiteralValue::Number {
                value: if text.starts_with('-') {
                    f64::NEG_INFINITY
                } else {
                    f64::INFINITY
                },
                is_int: false,
            },
            _ => self.number(&text, span),
        };
        Literal { value, text, span }
    }

    fn signed_literal(&mut self, pair: Pair<'_, Rule>) -> Literal {
        let span = span_of(&pair);
        let text = pair.as_str().to_string();
        let value = self.number(&text, span);
        Literal { value, text, span }
    }

    fn number(&mut self, text: &str, span: Span) -> LiteralValue {
        let is_int = !text.contains(['.', 'e', 'E']);
        match text.parse::<f64>() {
            Ok(value) if value.is_finite() && (!is_int || value.abs() <= i32::MAX as f64) => {
                LiteralValue::Number { value, is_int }
            }
            _ => {
                self.errors.push(
                    Diagnostic::error(
                        "rlx::bad_number",
                        self.file,
                        format!("number `{text}` is out of range"),
                    )
                    .label(
                        span,
                        if is_int {
                            "does not fit in i32"
                        } else {
                            "does not fit in f32/f64"
                        },
                    ),
                );
                LiteralValue::Number { value: 0.0, is_int }
            }
        }
    }

    fn rubric_value(&mut self, pair: Pair<'_, Rule>) -> RubricValue {
        let child = pair
            .into_inner()
            .next()
            .expect("grammar guarantees a value");
        match child.as_rule() {
            Rule::ident => RubricValue::Param(ident(child)),
            _ => RubricValue::Number(self.signed_literal(child)),
        }
    }

    fn shape_call(&mut self, pair: Pair<'_, Rule>) -> ShapeCall {
        let span = span_of(&pair);
        let text = pair.as_str();
        let mut inner = pair.into_inner();
        let name = ident(next(&mut inner));
        let after_name = text
            .get((name.span.end - span.start) as usize..)
            .unwrap_or("");
        let parens = next_significant_is(after_name, b'(');
        let args = inner
            .map(|arg| {
                let mut parts = arg.into_inner();
                let key = ident(next(&mut parts));
                let value = self.rubric_value(next(&mut parts));
                (key, value)
            })
            .collect();
        ShapeCall {
            name,
            args,
            parens,
            span,
        }
    }

    fn rubric_entry(&mut self, pair: Pair<'_, Rule>) -> RubricEntry {
        let span = span_of(&pair);
        let rule = pair.as_rule();
        let mut inner = pair.into_inner();
        match rule {
            Rule::criteria_file => {
                let source = next(&mut inner);
                let source_span = span_of(&source);
                let source = match source.as_rule() {
                    Rule::data_path => package_source(source.as_str()),
                    _ => ImportSource::Relative(self.string(source)),
                };
                RubricEntry::Criteria(CriteriaFile {
                    source,
                    source_span,
                    span,
                })
            }
            Rule::criterion => {
                let name = ident(next(&mut inner));
                let attrs = inner
                    .map(|attr| {
                        let attr_span = span_of(&attr);
                        let attr_rule = attr.as_rule();
                        let mut parts = attr.into_inner();
                        match attr_rule {
                            Rule::attr_weight => {
                                CriterionAttr::Weight(self.rubric_value(next(&mut parts)))
                            }
                            Rule::attr_points => {
                                CriterionAttr::Points(self.rubric_value(next(&mut parts)))
                            }
                            Rule::attr_levels => CriterionAttr::Levels(
                                parts.map(|level| self.signed_literal(level)).collect(),
                                attr_span,
                            ),
                            Rule::attr_veto => CriterionAttr::Veto(attr_span),
                            Rule::attr_critical => CriterionAttr::Critical(attr_span),
                            Rule::attr_saturate => {
                                CriterionAttr::Saturate(self.shape_call(next(&mut parts)))
                            }
                            rule => unreachable!("criterion attribute {rule:?}"),
                        }
                    })
                    .collect();
                RubricEntry::Criterion(CriterionDecl {
                    name,
                    attrs,
                    span,
                    text: None,
                })
            }
            Rule::interact => {
                let first = ident(next(&mut inner));
                let second = ident(next(&mut inner));
                let mut mode = None;
                let mut gamma = None;
                for child in inner {
                    match child.as_rule() {
                        Rule::interact_mode => {
                            mode = Some(if child.as_str() == "min" {
                                InteractMode::Min
                            } else {
                                InteractMode::Product
                            })
                        }
                        _ => gamma = Some(self.rubric_value(child)),
                    }
                }
                RubricEntry::Interact(InteractDecl {
                    first,
                    second,
                    mode,
                    gamma: gamma.expect("grammar guarantees a coefficient"),
                    span,
                })
            }
            Rule::rubric_aggregate => RubricEntry::Aggregate(ident(next(&mut inner))),
            Rule::rubric_on_veto => RubricEntry::OnVeto(self.shape_call(next(&mut inner))),
            Rule::rubric_shape => RubricEntry::Shape(self.shape_call(next(&mut inner))),
            rule => unreachable!("rubric entry {rule:?}"),
        }
    }

    fn expr(&mut self, pair: Pair<'_, Rule>) -> Expr {
        debug_assert_eq!(pair.as_rule(), Rule::expr);
        let expr = self.pratt(pair.into_inner());
        if let Some(span) = too_deep_expr(&expr) {
            self.errors.push(
                Diagnostic::error(
                    "rlx::too_deep",
                    self.file,
                    format!("expression nests more than {MAX_EXPR_DEPTH} operators deep"),
                )
                .label(span, "nesting limit reached here")
                .help("split the expression with `let` bindings"),
            );
        }
        expr
    }

    fn pratt(&mut self, pairs: Pairs<'_, Rule>) -> Expr {
        // The closures need `&mut self`; the Pratt parser calls them one at a time, so a RefCell is enough.
        let this = std::cell::RefCell::new(self);
        let expr = PRATT
            .map_primary(|primary| this.borrow_mut().primary(primary))
            .map_prefix(|op, operand| {
                let op_kind = if op.as_rule() == Rule::op_neg {
                    UnaryOp::Neg
                } else {
                    UnaryOp::Not
                };
                Expr {
                    span: span_of(&op).to(operand.span),
                    kind: ExprKind::Unary {
                        op: op_kind,
                        operand: Box::new(operand),
                    },
                }
            })
            .map_postfix(|base, op| {
                let span = base.span.to(span_of(&op));
                let criterion = ident(op.into_inner().next().expect("grammar guarantees an index name"));
                Expr {
                    span,
                    kind: ExprKind::Index {
                        base: Box::new(base),
                        criterion,
                    },
                }
            })
            .map_infix(|lhs, op, rhs| {
                let op_kind = match op.as_rule() {
                    Rule::op_or => BinaryOp::Or,
                    Rule::op_and => BinaryOp::And,
                    Rule::op_eq => BinaryOp::Eq,
                    Rule::op_ne => BinaryOp::Ne,
                    Rule::op_lt => BinaryOp::Lt,
                    Rule::op_le => BinaryOp::Le,
                    Rule::op_gt => BinaryOp::Gt,
                    Rule::op_ge => BinaryOp::Ge,
                    Rule::op_add => BinaryOp::Add,
                    Rule::op_sub => BinaryOp::Sub,
                    Rule::op_mul => BinaryOp::Mul,
                    Rule::op_div => BinaryOp::Div,
                    Rule::op_pow => BinaryOp::Pow,
                    rule => unreachable!("infix {rule:?}"),
                };
                if op_kind.is_comparison() {
                    if let ExprKind::Binary { op: inner, .. } = &lhs.kind {
                        if inner.is_comparison() {
                            let mut this = this.borrow_mut();
                            let file = this.file;
                            this.errors.push(
                                Diagnostic::error(
                                    "rlx::comparison_chain",
                                    file,
                                    "comparisons cannot be chained",
                                )
                                .label(lhs.span.to(rhs.span), "this reads as two comparisons")
                                .help("write `a < b and b < c`, or add parentheses if you mean to compare a boolean"),
                            );
                        }
                    }
                }
                Expr {
                    span: lhs.span.to(rhs.span),
                    kind: ExprKind::Binary {
                        op: op_kind,
                        lhs: Box::new(lhs),
                        rhs: Box::new(rhs),
                    },
                }
            })
            .parse(pairs);
        expr
    }

    fn primary(&mut self, pair: Pair<'_, Rule>) -> Expr {
        let span = span_of(&pair);
        let kind = match pair.as_rule() {
            Rule::number => {
                let text = pair.as_str().to_string();
                match self.number(&text, span) {
                    LiteralValue::Number { value, is_int } => ExprKind::Number {
                        value,
                        is_int,
                        text,
                    },
                    LiteralValue::Bool(_) => unreachable!("number literal"),
                }
            }
            Rule::kw_true => ExprKind::Bool(true),
            Rule::kw_false => ExprKind::Bool(false),
            Rule::ident => ExprKind::Name(ident(pair)),
            Rule::other_ref => ExprKind::Other(ident(next(&mut pair.into_inner()))),
            Rule::paren => ExprKind::Paren(Box::new(self.expr(next(&mut pair.into_inner())))),
            Rule::block => {
                let mut lets = Vec::new();
                let mut body = None;
                for child in pair.into_inner() {
                    match child.as_rule() {
                        Rule::local_let => {
                            let mut parts = child.into_inner();
                            let name = ident(next(&mut parts));
                            let value = self.expr(next(&mut parts));
                            lets.push(LocalLet { name, value });
                        }
                        _ => body = Some(self.expr(child)),
                    }
                }
                ExprKind::Block {
                    lets,
                    body: Box::new(body.expect("grammar guarantees a block body")),
                }
            }
            Rule::call => {
                let mut inner = pair.into_inner();
                let func = ident(next(&mut inner));
                let mut args = Vec::new();
                let mut over = None;
                for child in inner {
                    match child.as_rule() {
                        Rule::call_arg => {
                            let mut parts: Vec<Pair<'_, Rule>> = child.into_inner().collect();
                            let value =
                                self.expr(parts.pop().expect("grammar guarantees an argument"));
                            let name = parts.pop().map(ident);
                            args.push(Arg { name, value });
                        }
                        Rule::over_clause => {
                            let over_span = span_of(&child);
                            over = Some(Over {
                                axes: child.into_inner().map(ident).collect(),
                                span: over_span,
                            });
                        }
                        rule => unreachable!("call child {rule:?}"),
                    }
                }
                ExprKind::Call { func, args, over }
            }
            rule => unreachable!("primary {rule:?}"),
        };
        Expr { kind, span }
    }
}

fn elem_type(text: &str) -> ElemType {
    match text {
        "f32" => ElemType::F32,
        "i32" => ElemType::I32,
        _ => ElemType::Bool,
    }
}

/// The span of a node deeper than `MAX_EXPR_DEPTH`, found without recursion.
fn too_deep_expr(root: &Expr) -> Option<Span> {
    let mut stack = vec![(root, 1usize)];
    while let Some((expr, depth)) = stack.pop() {
        if depth > MAX_EXPR_DEPTH {
            return Some(expr.span);
        }
        for child in children(expr) {
            stack.push((child, depth + 1));
        }
    }
    None
}

/// The direct sub-expressions of an expression.
pub fn children(expr: &Expr) -> Vec<&Expr> {
    match &expr.kind {
        ExprKind::Number { .. } | ExprKind::Bool(_) | ExprKind::Name(_) | ExprKind::Other(_) => {
            Vec::new()
        }
        ExprKind::Unary { operand, .. } => vec![operand],
        ExprKind::Binary { lhs, rhs, .. } => vec![lhs, rhs],
        ExprKind::Paren(inner) => vec![inner],
        ExprKind::Call { args, .. } => args.iter().map(|arg| &arg.value).collect(),
        ExprKind::Index { base, .. } => vec![base],
        ExprKind::Block { lets, body } => lets.iter().map(|l| &l.value).chain([&**body]).collect(),
    }
}

/// `name/rest` → the package `name` and the path `rest` inside it.
fn package_source(written: &str) -> ImportSource {
    let (package, path) = written.split_once('/').unwrap_or((written, ""));
    ImportSource::Package {
        package: package.to_string(),
        path: path.to_string(),
    }
}
