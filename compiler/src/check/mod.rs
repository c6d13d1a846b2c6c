//! Stage `check`: names, levels, element types and differentiability → typed HIR.
//!
//! Errors are collected, not fail-fast: a node that cannot be typed becomes `None` and its parents stay
//! quiet, so each mistake is reported once.
//!
//! `Checker` lives here with its entry point (`check`, `Checker::run`); its methods are grouped by
//! concern: `scope` (names and imports), `decls` (inputs, params, rubrics), `sections` (lets and the
//! recipe's sections), `expr` (names, operators, indexing), `calls` (arguments, built-ins, inlining)
//! and `reductions` (`over` axes and axis operations).

pub mod builtins;
mod calls;
mod components;
mod decls;
mod expr;
pub mod hir;
mod order;
mod random;
mod reductions;
mod rubric;
mod scope;
mod sections;
mod state;
mod token_ops;
pub mod types;

use std::collections::{HashMap, HashSet};

use crate::diagnostic::{closest_name, Diagnostic};
use crate::resolve::Program;
use crate::source::FileId;
use crate::syntax::ast::{
    self, BinaryOp, ElemType, InputRole, ItemKind, KeepLevel, LiteralValue, Span, UnaryOp,
};
use builtins::{Func, ReduceOp};
use hir::{Axes, Expr, ExprKind, GlobalId, GlobalKind, InputId, LocalId, ParamId, RubricId};
use types::{Elem, Feature, Level, Ty};

/// Most HIR nodes a recipe may expand to (inlining can multiply a small source).
const MAX_NODES: usize = 200_000;
/// Deepest chain of nested function calls.
const MAX_CALL_DEPTH: usize = 64;

/// A function: (module index, item index).
type FnKey = (usize, usize);

/// What a name in a module's scope refers to.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Def {
    Input(InputId),
    Param(ParamId),
    /// A `let` or section of the recipe, by item index (typed on first use).
    Global(usize),
    Rubric(RubricId),
    Fn {
        module: usize,
        item: usize,
    },
}

struct Definition {
    def: Def,
    span: Span,
}

#[derive(Clone, PartialEq)]
enum GlobalState {
    Unchecked,
    InProgress,
    Done(Option<GlobalId>),
}

#[derive(Clone)]
struct LocalBinding {
    name: String,
    id: LocalId,
    ty: Ty,
    grad: bool,
}

/// Where an expression is being checked.
#[derive(Clone)]
struct Env {
    module: usize,
    locals: Vec<LocalBinding>,
    /// Inside `… over others`: `other.NAME` is allowed.
    pairwise: bool,
    /// Checking a `rollout` setting: only params and sampling-time values are known.
    rollout: bool,
}

struct CallFrame {
    file: FileId,
    span: Span,
    name: String,
    key: (usize, usize),
}

pub struct Checker<'p> {
    program: &'p Program,
    diagnostics: Vec<Diagnostic>,
    scopes: Vec<HashMap<String, Definition>>,
    root_file: FileId,
    inputs: Vec<hir::Input>,
    params: Vec<hir::Param>,
    rubrics: Vec<hir::Rubric>,
    globals: Vec<hir::Global>,
    global_state: HashMap<usize, GlobalState>,
    reward_item: Option<usize>,
    advantage_item: Option<usize>,
    next_local: u32,
    nodes: usize,
    budget_reported: bool,
    calls: Vec<CallFrame>,
    /// `std/rubric`, loaded when the recipe declares a rubric.
    rubric_module: Option<usize>,
    /// (module, name) of declarations that failed to check: their uses stay quiet, the declaration's
    /// own error is the report.
    failed_names: HashSet<(usize, String)>,
}

/// Check a loaded program. Returns the HIR when there is no error.
pub fn check(
    program: &Program,
    sources: &crate::source::SourceMap,
) -> (Option<hir::Recipe>, Vec<Diagnostic>) {
    let root_file = program.modules[Program::ROOT].file;
    let rubric_module = program.stdlib_module(sources, "rubric");
    let mut checker = Checker {
        program,
        diagnostics: Vec::new(),
        scopes: Vec::new(),
        root_file,
        inputs: Vec::new(),
        params: Vec::new(),
        rubrics: Vec::new(),
        globals: Vec::new(),
        global_state: HashMap::new(),
        reward_item: None,
        advantage_item: None,
        next_local: 0,
        nodes: 0,
        budget_reported: false,
        calls: Vec::new(),
        rubric_module,
        failed_names: HashSet::new(),
    };
    let recipe = checker.run();
    let mut diagnostics = dedupe(checker.diagnostics);
    diagnostics.sort_by_key(|d| (d.file, d.primary_span().map(|s| s.start).unwrap_or(0)));
    if diagnostics.iter().any(Diagnostic::is_error) {
        (None, diagnostics)
    } else {
        (Some(recipe), diagnostics)
    }
}

fn dedupe(diagnostics: Vec<Diagnostic>) -> Vec<Diagnostic> {
    let mut seen = HashSet::new();
    diagnostics
        .into_iter()
        .filter(|d| seen.insert((d.code, d.file, d.primary_span(), d.message.clone())))
        .collect()
}

fn elem_of(literal: &LiteralValue) -> Elem {
    match literal {
        LiteralValue::Bool(_) => Elem::Bool,
        LiteralValue::Number { is_int: true, .. } => Elem::I32,
        LiteralValue::Number { .. } => Elem::F32,
    }
}

fn literal_number(literal: &LiteralValue) -> f64 {
    match literal {
        LiteralValue::Bool(b) => f64::from(u8::from(*b)),
        LiteralValue::Number { value, .. } => *value,
    }
}

const SECTION_NAMES: &[&str] = &["reward", "advantage", "loss"];

impl<'p> Checker<'p> {
    fn error(&mut self, diagnostic: Diagnostic) {
        // Inside an inlined call, say which call of the recipe led here.
        let diagnostic = match self.calls.first() {
            Some(frame) if diagnostic.file != frame.file || self.calls.len() > 1 => {
                let note = Diagnostic::error(
                    diagnostic.code,
                    frame.file,
                    format!("in this call to `{}`", frame.name),
                )
                .label(frame.span, "called here");
                diagnostic.with_related(note)
            }
            _ => diagnostic,
        };
        self.diagnostics.push(diagnostic);
    }

    fn fresh_local(&mut self) -> LocalId {
        self.next_local += 1;
        LocalId(self.next_local - 1)
    }

    fn node(
        &mut self,
        kind: ExprKind,
        ty: Ty,
        grad: bool,
        span: Span,
        file: FileId,
    ) -> Option<Expr> {
        self.nodes += 1;
        if self.nodes > MAX_NODES {
            if !self.budget_reported {
                self.budget_reported = true;
                self.error(
                    Diagnostic::error(
                        "rlx::too_large",
                        file,
                        format!("the recipe expands to more than {MAX_NODES} operations after inlining"),
                    )
                    .label(span, "expansion limit reached here")
                    .help("functions that call each other several times multiply; bind shared values with `let`"),
                );
            }
            return None;
        }
        Some(Expr {
            kind,
            ty,
            grad,
            span,
            file,
        })
    }

    fn module_file(&self, module: usize) -> FileId {
        self.program.modules[module].file
    }

    // -----------------------------------------------------------------------------------------
    // Scopes

    fn run(&mut self) -> hir::Recipe {
        for module in 0..self.program.modules.len() {
            let scope = self.build_scope(module);
            self.scopes.push(scope);
        }
        for module in 0..self.program.modules.len() {
            self.check_imports(module);
        }
        self.check_recursion();
        self.check_fn_names();
        let root = &self.program.modules[Program::ROOT].ast;
        let mut loss = None;
        let mut metrics = Vec::new();
        let mut keeps: Vec<hir::Keep> = Vec::new();
        let mut rollout = Vec::new();
        let mut metric_names: HashMap<String, Span> = HashMap::new();
        let mut states = Vec::new();
        for (index, item) in root.items.iter().enumerate() {
            match &item.kind {
                ItemKind::Let(_) | ItemKind::Reward(_) | ItemKind::Advantage(_) => {
                    self.global(index);
                }
                ItemKind::Loss(expr) => {
                    if loss.is_some() {
                        self.duplicate_section("loss", section_span(item.span, expr));
                        continue;
                    }
                    loss = Some(self.loss(expr));
                }
                ItemKind::Metric { name, value } => {
                    if let Some(first) = metric_names.insert(name.name.clone(), name.span) {
                        self.error(
                            Diagnostic::error(
                                "rlx::duplicate",
                                self.root_file,
                                format!("metric `{}` is defined twice", name.name),
                            )
                            .label(name.span, "defined again here")
                            .label(first, "first defined here"),
                        );
                        continue;
                    }
                    if let Some(expr) = self.metric(value) {
                        metrics.push(hir::Metric {
                            name: name.name.clone(),
                            expr,
                        });
                    }
                }
                ItemKind::Keep {
                    level,
                    level_span,
                    condition,
                } => {
                    if let Some(condition) = self.keep(*level, *level_span, condition) {
                        keeps.push(hir::Keep {
                            level: *level,
                            condition,
                        });
                    }
                }
                ItemKind::Rollout(entries) => {
                    if !rollout.is_empty() {
                        self.duplicate_section("rollout", item.span);
                        continue;
                    }
                    rollout = self.rollout(entries);
                }
                ItemKind::State(decl) => {
                    if let Some(state) = self.state(decl) {
                        states.push(state);
                    }
                }
                _ => {}
            }
        }
        let reward = self.reward_item.and_then(|item| self.global_id(item));
        let advantage = self.advantage_item.and_then(|item| self.global_id(item));
        hir::Recipe {
            inputs: std::mem::take(&mut self.inputs),
            params: std::mem::take(&mut self.params),
            rubrics: std::mem::take(&mut self.rubrics),
            globals: std::mem::take(&mut self.globals),
            reward,
            advantage,
            loss: loss.flatten(),
            metrics,
            keeps,
            rollout,
            states,
        }
    }

    fn global_id(&self, item: usize) -> Option<GlobalId> {
        match self.global_state.get(&item) {
            Some(GlobalState::Done(id)) => *id,
            _ => None,
        }
    }

    fn duplicate_section(&mut self, name: &str, span: Span) {
        self.error(
            Diagnostic::error(
                "rlx::duplicate_section",
                self.root_file,
                format!("the recipe has more than one `{name}` section"),
            )
            .label(span, "second definition")
            .help(format!("combine them into one `{name}`")),
        );
    }
}

/// A parameter without a default that follows one with a default (no call could skip the latter).
fn late_default(file: FileId, decl: &ast::FnDecl) -> Option<Diagnostic> {
    let required = decl
        .params
        .iter()
        .take_while(|p| p.default.is_none())
        .count();
    let late = decl
        .params
        .iter()
        .skip(required)
        .find(|p| p.default.is_none())?;
    Some(
        Diagnostic::error(
            "rlx::arity",
            file,
            format!(
                "parameter `{}` has no default but follows one that has",
                late.name.name
            ),
        )
        .label(late.name.span, "needs a default"),
    )
}

/// A section item's span up to the end of its expression: the parser's item span also covers the
/// whitespace and comments that follow the last token.
fn section_span(item: Span, expr: &ast::Expr) -> Span {
    Span {
        start: item.start,
        end: expr.span.end.max(item.start),
    }
}

/// A written type's span; a bare element type (`i32`) ends at its name, not at the next token.
fn type_span(ty: &ast::TypeExpr) -> Span {
    if ty.axes.is_empty() {
        Span {
            start: ty.span.start,
            end: ty.span.start + ty.elem.name().len() as u32,
        }
    } else {
        ty.span
    }
}

/// The level a mistyped level name means: a near miss (`rsep`) or a spelled-out one (`token`).
fn closest_level(name: &str) -> Option<&'static str> {
    const LEVELS: [&str; 5] = ["tok", "pair", "resp", "group", "batch"];
    closest_name(name, LEVELS).or_else(|| LEVELS.into_iter().find(|level| name.starts_with(level)))
}

/// The axis a reduction of a value of this type most likely means.
fn suggest_axis(ty: &Ty) -> &'static str {
    match (ty.level, &ty.feature) {
        (_, Some(Feature::Crit)) => "crit",
        (_, Some(Feature::Dim)) => "dim",
        (Level::Tok, _) => "tok",
        (Level::Pair, _) => "others",
        (Level::Resp, _) => "resp",
        _ => "batch",
    }
}

fn reduction_help(ty: &Ty, op: &str) -> String {
    match (&ty.feature, ty.level) {
        (Some(Feature::Matrix(..)), _) => format!(
            "this value's axes are `{}` and the matrix `{}`: contract a matrix with `dot`, e.g. `dot(x, m)` sums its rows against `x`",
            ty.level.name(),
            ty.feature.as_ref().map(|f| f.axes()).unwrap_or_default()
        ),
        (Some(feature), _) => format!(
            "this value's axes are `{}` and `{}`",
            ty.level.name(),
            feature.name()
        ),
        (None, Level::Tok) => format!(
            "e.g. `{op}(x over tok)` per response, or `{op}(x over tok, batch)` over the batch"
        ),
        (None, Level::Resp) => {
            format!("e.g. `{op}(x over resp)` per group, or `{op}(x over batch)` over the batch")
        }
        (None, Level::Group) => format!("e.g. `{op}(x over batch)`"),
        (None, Level::Batch) => "a batch-level value has no axis left".to_string(),
        (None, Level::Pair) => format!(
            "a pair value reduces over the other responses first: `{op}(x over others)` per response"
        ),
    }
}

/// How to turn a value of type `ty` into one at `target` (for section and argument errors).
fn section_help(ty: &Ty, target: Level) -> String {
    if let Some(feature) = &ty.feature {
        return match feature {
            Feature::Rubric(name) => format!("score the criteria with the rubric: `{name}(x)`"),
            Feature::Matrix(..) => {
                "contract the matrix with `dot`, e.g. `dot(dot(x, m), x)` for xᵀ·m·x".to_string()
            }
            f => format!(
                "aggregate the `{}` axis first, e.g. `sum(x over {})`",
                f.name(),
                f.name()
            ),
        };
    }
    if ty.level > target {
        return match (ty.level, target) {
            (Level::Tok, Level::Resp) => {
                "reduce the tokens, e.g. `sum(x over tok)` or `mean(x over tok)`".into()
            }
            (Level::Tok, Level::Batch) => {
                "aggregate the tokens, e.g. `mean(x over tok, batch)` (token-mean)".into()
            }
            (Level::Resp, Level::Batch) => {
                "aggregate the responses, e.g. `mean(x over batch)`".into()
            }
            (Level::Group, Level::Batch) => {
                "aggregate the groups, e.g. `mean(x over batch)`".into()
            }
            (Level::Tok, Level::Group) => "reduce it, e.g. `mean(x over tok, resp)`".into(),
            (Level::Resp, Level::Group) => "reduce it, e.g. `mean(x over resp)`".into(),
            (Level::Pair, _) => "reduce the pairs of each response, e.g. `mean(x over others)`, or take their classes with `components(x over others)`".into(),
            _ => "reduce it to a coarser level".into(),
        };
    }
    "convert it to the expected kind".into()
}
