//! Stage `check`: names, levels, element types and differentiability → typed HIR.
//!
//! Errors are collected, not fail-fast: a node that cannot be typed becomes `None` and its parents stay
//! quiet, so each mistake is reported once.

pub mod builtins;
pub mod hir;
mod rubric;
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

    fn build_scope(&mut self, module: usize) -> HashMap<String, Definition> {
        let loaded = &self.program.modules[module];
        let file = loaded.file;
        let mut scope: HashMap<String, Definition> = HashMap::new();
        let is_root = module == Program::ROOT;
        for (index, item) in loaded.ast.items.iter().enumerate() {
            let (name, def) = match &item.kind {
                ItemKind::Input(decl) if is_root => {
                    let id = InputId(self.inputs.len() as u32);
                    let Some(input) = self.input(decl) else {
                        self.failed_names.insert((module, decl.name.name.clone()));
                        continue;
                    };
                    self.inputs.push(input);
                    (&decl.name, Def::Input(id))
                }
                ItemKind::Param(decl) if is_root => {
                    let id = ParamId(self.params.len() as u32);
                    let Some(param) = self.param(decl) else {
                        self.failed_names.insert((module, decl.name.name.clone()));
                        continue;
                    };
                    self.params.push(param);
                    (&decl.name, Def::Param(id))
                }
                ItemKind::Let(decl) if is_root => (&decl.name, Def::Global(index)),
                ItemKind::Fn(decl) => (
                    &decl.name,
                    Def::Fn {
                        module,
                        item: index,
                    },
                ),
                ItemKind::Rubric(decl) if is_root => {
                    let id = RubricId(self.rubrics.len() as u32);
                    // Rubrics are checked after the scope exists (their weights may name params).
                    (&decl.name, Def::Rubric(id))
                }
                ItemKind::Reward(expr) if is_root => {
                    if self.reward_item.is_some() {
                        self.duplicate_section("reward", section_span(item.span, expr));
                        continue;
                    }
                    self.reward_item = Some(index);
                    continue;
                }
                ItemKind::Advantage(expr) if is_root => {
                    if self.advantage_item.is_some() {
                        self.duplicate_section("advantage", section_span(item.span, expr));
                        continue;
                    }
                    self.advantage_item = Some(index);
                    continue;
                }
                _ => continue,
            };
            if let ItemKind::Rubric(decl) = &item.kind {
                // Reserve the id now; the body is checked below.
                self.rubrics.push(hir::Rubric {
                    name: decl.name.name.clone(),
                    criteria: Vec::new(),
                    interactions: Vec::new(),
                    aggregate: hir::Aggregate::Mean,
                    on_veto: hir::Shape {
                        name: "zero".into(),
                        args: Vec::new(),
                    },
                    shape: None,
                    span: decl.name.span,
                });
            }
            self.define(&mut scope, file, name, def);
        }
        if is_root {
            for item in &loaded.ast.items {
                if let ItemKind::Rubric(decl) = &item.kind {
                    if let Some(Definition {
                        def: Def::Rubric(id),
                        ..
                    }) = scope.get(&decl.name.name)
                    {
                        let id = *id;
                        let rubric = self.rubric(decl, &scope);
                        self.rubrics[id.0 as usize] = rubric;
                    }
                }
            }
        }
        scope
    }

    fn define(
        &mut self,
        scope: &mut HashMap<String, Definition>,
        file: FileId,
        name: &ast::Ident,
        def: Def,
    ) {
        if builtins::all_names().any(|builtin| builtin == name.name) {
            self.error(
                Diagnostic::error(
                    "rlx::shadows_builtin",
                    file,
                    format!("`{}` is a built-in name and cannot be redefined", name.name),
                )
                .label(name.span, "redefines a built-in")
                .help("choose another name"),
            );
            return;
        }
        if SECTION_NAMES.contains(&name.name.as_str()) {
            self.error(
                Diagnostic::error(
                    "rlx::reserved_name",
                    file,
                    format!("`{}` names a section of the recipe", name.name),
                )
                .label(name.span, "cannot be defined here")
                .help(format!("write the section as `{} = …`", name.name)),
            );
            return;
        }
        if let Some(first) = scope.get(&name.name) {
            let first_span = first.span;
            self.error(
                Diagnostic::error(
                    "rlx::duplicate",
                    file,
                    format!("`{}` is defined twice", name.name),
                )
                .label(name.span, "defined again here")
                .label(first_span, "first defined here")
                .help("rename one of them"),
            );
            return;
        }
        scope.insert(
            name.name.clone(),
            Definition {
                def,
                span: name.span,
            },
        );
    }

    fn check_imports(&mut self, module: usize) {
        let loaded = &self.program.modules[module];
        let file = loaded.file;
        for (index, item) in loaded.ast.items.iter().enumerate() {
            let ItemKind::Import(import) = &item.kind else {
                continue;
            };
            let Some(&target) = loaded.imports.get(&index) else {
                continue;
            };
            let target_functions: Vec<(String, usize, Span)> = self.program.modules[target]
                .ast
                .items
                .iter()
                .enumerate()
                .filter_map(|(i, item)| match &item.kind {
                    ItemKind::Fn(decl) => Some((decl.name.name.clone(), i, decl.name.span)),
                    _ => None,
                })
                .collect();
            let wanted: Vec<ast::Ident> = match &import.names {
                Some(names) => names.clone(),
                None => target_functions
                    .iter()
                    .map(|(name, _, _)| ast::Ident {
                        name: name.clone(),
                        span: import.source_span,
                    })
                    .collect(),
            };
            for name in wanted {
                match target_functions.iter().find(|(f, _, _)| *f == name.name) {
                    Some((_, item, _)) => {
                        let mut scope = std::mem::take(&mut self.scopes[module]);
                        self.define(
                            &mut scope,
                            file,
                            &name,
                            Def::Fn {
                                module: target,
                                item: *item,
                            },
                        );
                        self.scopes[module] = scope;
                    }
                    None => {
                        self.failed_names.insert((module, name.name.clone()));
                        let mut diagnostic = Diagnostic::error(
                            "rlx::unknown_import",
                            file,
                            format!("the imported module has no function `{}`", name.name),
                        )
                        .label(name.span, "not found in the module");
                        if let Some(close) = closest_name(
                            &name.name,
                            target_functions.iter().map(|(f, _, _)| f.as_str()),
                        ) {
                            diagnostic = diagnostic.help(format!("did you mean `{close}`?"));
                        }
                        self.error(diagnostic);
                    }
                }
            }
        }
    }

    /// A function that calls itself, directly or through others, is an error: recipes are total.
    fn check_recursion(&mut self) {
        let mut edges: HashMap<FnKey, Vec<(FnKey, Span)>> = HashMap::new();
        for (module, loaded) in self.program.modules.iter().enumerate() {
            for (index, item) in loaded.ast.items.iter().enumerate() {
                let ItemKind::Fn(decl) = &item.kind else {
                    continue;
                };
                let mut calls = Vec::new();
                let mut stack: Vec<&ast::Expr> = vec![&decl.body];
                stack.extend(decl.params.iter().filter_map(|p| p.default.as_ref()));
                while let Some(expr) = stack.pop() {
                    if let ast::ExprKind::Call { func, .. } = &expr.kind {
                        if let Some(Definition {
                            def: Def::Fn { module: m, item: i },
                            ..
                        }) = self.scopes[module].get(&func.name)
                        {
                            calls.push(((*m, *i), func.span));
                        }
                    }
                    stack.extend(crate::syntax::parser::children(expr));
                }
                edges.insert((module, index), calls);
            }
        }
        // Depth-first search with colours; report each back edge once.
        let mut colour: HashMap<(usize, usize), u8> = HashMap::new();
        let mut keys: Vec<(usize, usize)> = edges.keys().copied().collect();
        keys.sort();
        for start in keys {
            if colour.get(&start).copied().unwrap_or(0) != 0 {
                continue;
            }
            let mut stack: Vec<((usize, usize), usize)> = vec![(start, 0)];
            colour.insert(start, 1);
            while let Some((node, next_edge)) = stack.pop() {
                let out = &edges[&node];
                if next_edge < out.len() {
                    stack.push((node, next_edge + 1));
                    let (target, span) = out[next_edge];
                    match colour.get(&target).copied().unwrap_or(0) {
                        0 => {
                            colour.insert(target, 1);
                            stack.push((target, 0));
                        }
                        1 => {
                            let file = self.program.modules[node.0].file;
                            let name = self.fn_decl(target.0, target.1).name.name.clone();
                            self.error(
                                Diagnostic::error(
                                    "rlx::recursion",
                                    file,
                                    format!("`{name}` is called recursively"),
                                )
                                .label(span, "this call closes a cycle")
                                .help("recipes are total: functions cannot call themselves, directly or indirectly"),
                            );
                        }
                        _ => {}
                    }
                } else {
                    colour.insert(node, 2);
                }
            }
        }
    }

    fn fn_decl(&self, module: usize, item: usize) -> &'p ast::FnDecl {
        match &self.program.modules[module].ast.items[item].kind {
            ItemKind::Fn(decl) => decl,
            _ => unreachable!("Def::Fn points at a function"),
        }
    }

    /// Names and calls inside every function body resolve (types are checked where a function is used).
    fn check_fn_names(&mut self) {
        for (module, loaded) in self.program.modules.iter().enumerate() {
            let file = loaded.file;
            for item in &loaded.ast.items {
                let ItemKind::Fn(decl) = &item.kind else {
                    continue;
                };
                let mut seen: HashMap<&str, Span> = HashMap::new();
                for param in &decl.params {
                    if let Some(first) = seen.insert(&param.name.name, param.name.span) {
                        self.error(
                            Diagnostic::error(
                                "rlx::duplicate",
                                file,
                                format!("parameter `{}` is declared twice", param.name.name),
                            )
                            .label(param.name.span, "declared again here")
                            .label(first, "first declared here"),
                        );
                    }
                }
                // Declaration errors are reported even when the function is never called.
                if let Some(diagnostic) = late_default(file, decl) {
                    self.error(diagnostic);
                }
                let rubrics = self.rubric_names();
                for ty in decl
                    .params
                    .iter()
                    .filter_map(|p| p.ty.as_ref())
                    .chain(&decl.ret)
                {
                    self.type_expr(file, ty, Some(&rubrics));
                }
                let mut bound: Vec<String> =
                    decl.params.iter().map(|p| p.name.name.clone()).collect();
                self.names_in(module, &decl.body, &mut bound);
            }
        }
    }

    fn names_in(&mut self, module: usize, expr: &ast::Expr, bound: &mut Vec<String>) {
        match &expr.kind {
            ast::ExprKind::Name(name) | ast::ExprKind::Other(name) => {
                if !bound.contains(&name.name)
                    && !self.scopes[module].contains_key(&name.name)
                    && builtins::value(&name.name).is_none()
                {
                    let candidates: Vec<String> = bound.clone();
                    self.unknown_name(module, name, &candidates);
                }
            }
            ast::ExprKind::Block { lets, body } => {
                let depth = bound.len();
                for local in lets {
                    self.names_in(module, &local.value, bound);
                    bound.push(local.name.name.clone());
                }
                self.names_in(module, body, bound);
                bound.truncate(depth);
            }
            ast::ExprKind::Call { func, args, .. } => {
                if !self.scopes[module].contains_key(&func.name)
                    && builtins::func(&func.name).is_none()
                    && builtins::reduction(&func.name).is_none()
                    && !builtins::AXIS_OPS.iter().any(|(n, _)| *n == func.name)
                {
                    self.unknown_function(module, func);
                }
                for arg in args {
                    self.names_in(module, &arg.value, bound);
                }
            }
            _ => {
                for child in crate::syntax::parser::children(expr) {
                    self.names_in(module, child, bound);
                }
            }
        }
    }

    fn unknown_name(&mut self, module: usize, name: &ast::Ident, locals: &[String]) {
        if self.failed_names.contains(&(module, name.name.clone())) {
            return;
        }
        let file = self.module_file(module);
        if name.name == "loss" {
            self.error(
                Diagnostic::error(
                    "rlx::unknown_name",
                    file,
                    "`loss` cannot be used in an expression",
                )
                .label(name.span, "the loss is the recipe's output")
                .help("bind the shared part with `let` and use it in both places"),
            );
            return;
        }
        if (name.name == "reward" || name.name == "advantage") && module == Program::ROOT {
            self.error(
                Diagnostic::error(
                    "rlx::unknown_name",
                    file,
                    format!(
                        "`{}` is used but the recipe has no `{}` section",
                        name.name, name.name
                    ),
                )
                .label(name.span, "not defined")
                .help(format!("add `{} = …`", name.name)),
            );
            return;
        }
        let scope_names: Vec<&str> = self.scopes[module].keys().map(String::as_str).collect();
        let candidates = scope_names
            .into_iter()
            .chain(locals.iter().map(String::as_str))
            .chain(builtins::VALUES.iter().map(|v| v.name));
        let mut diagnostic = Diagnostic::error(
            "rlx::unknown_name",
            file,
            format!("unknown name `{}`", name.name),
        )
        .label(name.span, "not defined");
        if let Some(close) = closest_name(&name.name, candidates) {
            diagnostic = diagnostic.help(format!("did you mean `{close}`?"));
        } else if module != Program::ROOT {
            diagnostic = diagnostic
                .help("functions of an imported module see only their parameters and functions");
        }
        self.error(diagnostic);
    }

    fn unknown_function(&mut self, module: usize, func: &ast::Ident) {
        if self.failed_names.contains(&(module, func.name.clone())) {
            return;
        }
        let file = self.module_file(module);
        let functions: Vec<String> = self.scopes[module]
            .iter()
            .filter(|(_, d)| matches!(d.def, Def::Fn { .. } | Def::Rubric(_)))
            .map(|(n, _)| n.clone())
            .collect();
        let candidates = functions
            .iter()
            .map(String::as_str)
            .chain(builtins::FUNCS.iter().map(|f| f.name))
            .chain(builtins::REDUCTIONS.iter().map(|f| f.name))
            .chain(builtins::AXIS_OPS.iter().map(|(n, _)| *n));
        let mut diagnostic = Diagnostic::error(
            "rlx::unknown_function",
            file,
            format!("unknown function `{}`", func.name),
        )
        .label(func.span, "not defined");
        if let Some(close) = closest_name(&func.name, candidates) {
            diagnostic = diagnostic.help(format!("did you mean `{close}`?"));
        } else {
            diagnostic = diagnostic
                .help("import it, e.g. `import std/loss.{ppo_clip}`, or define it with `fn`");
        }
        self.error(diagnostic);
    }

    // -----------------------------------------------------------------------------------------
    // Declarations

    fn type_expr(
        &mut self,
        file: FileId,
        ty: &ast::TypeExpr,
        rubrics: Option<&HashMap<String, Definition>>,
    ) -> Option<Ty> {
        let mut axes = ty.axes.iter();
        let level = match axes.next() {
            None => Level::Batch,
            Some(axis) => match Level::from_name(&axis.name) {
                Some(level) => level,
                None => {
                    let mut d = Diagnostic::error(
                        "rlx::unknown_axis",
                        file,
                        format!("`{}` is not a level", axis.name),
                    )
                    .label(axis.span, "expected `tok`, `resp`, `group` or `batch`");
                    if let Some(close) = closest_level(&axis.name) {
                        d = d.help(format!("did you mean `{close}`?"));
                    } else {
                        d = d.help("the level comes first, then an optional feature axis: `f32[resp, crit]`");
                    }
                    self.error(d);
                    return None;
                }
            },
        };
        let feature = match axes.next() {
            None => None,
            Some(axis) => {
                let feature = match axis.name.as_str() {
                    "crit" => Feature::Crit,
                    "dim" => Feature::Dim,
                    name => match rubrics.and_then(|scope| scope.get(name)) {
                        Some(Definition {
                            def: Def::Rubric(_),
                            ..
                        }) => Feature::Rubric(name.to_string()),
                        _ => {
                            let mut d = Diagnostic::error(
                                "rlx::unknown_axis",
                                file,
                                format!("`{name}` is not a feature axis"),
                            )
                            .label(axis.span, "expected `crit`, `dim` or a rubric name");
                            if let Some(close) = closest_name(name, ["crit", "dim"]) {
                                d = d.help(format!("did you mean `{close}`?"));
                            }
                            self.error(d);
                            return None;
                        }
                    },
                };
                if level == Level::Tok {
                    self.error(
                        Diagnostic::error(
                            "rlx::feature_at_token_level",
                            file,
                            "a token-level value cannot carry a feature axis",
                        )
                        .label(ty.span, "feature axes attach at `group` or `resp`")
                        .help("declare it per response, e.g. `f32[resp, crit]`"),
                    );
                    return None;
                }
                if level == Level::Batch && feature == Feature::Crit {
                    self.error(
                        Diagnostic::error(
                            "rlx::ragged_feature",
                            file,
                            "`crit` lists differ per prompt",
                        )
                        .label(ty.span, "a batch-level value cannot have a `crit` axis")
                        .help("use `group` for per-prompt criteria: `f32[group, crit]`"),
                    );
                    return None;
                }
                Some(feature)
            }
        };
        if let Some(extra) = axes.next() {
            self.error(
                Diagnostic::error(
                    "rlx::type_axes",
                    file,
                    "a type has one level and at most one feature axis",
                )
                .label(
                    extra
                        .span
                        .to(ty.axes.last().map(|a| a.span).unwrap_or(extra.span)),
                    "extra axes",
                )
                .help("packed batches are ragged along one feature axis at most"),
            );
            return None;
        }
        Some(Ty {
            elem: ty.elem,
            level,
            feature,
        })
    }

    fn input(&mut self, decl: &ast::InputDecl) -> Option<hir::Input> {
        let file = self.root_file;
        let rubric_scope = self.rubric_names();
        let ty = self.type_expr(file, &decl.ty, Some(&rubric_scope))?;
        if decl.role.is_some() && ty.elem != Elem::F32 {
            self.error(
                Diagnostic::error(
                    "rlx::policy_type",
                    file,
                    format!("a differentiable input must be f32, not {}", ty.elem.name()),
                )
                .label(type_span(&decl.ty), "not f32"),
            );
            return None;
        }
        let default = match &decl.default {
            None => None,
            Some(literal) => {
                let elem = elem_of(&literal.value);
                if !Ty::scalar(elem).fits(&Ty::scalar(ty.elem)) {
                    self.error(
                        Diagnostic::error(
                            "rlx::type_mismatch",
                            file,
                            format!("default {} for an input of type {ty}", elem.name()),
                        )
                        .label(literal.span, format!("expected {}", ty.elem.name())),
                    );
                    return None;
                }
                Some(literal_number(&literal.value))
            }
        };
        Some(hir::Input {
            name: decl.name.name.clone(),
            ty,
            role: decl.role,
            default,
            span: decl.name.span,
        })
    }

    /// Rubric names of the recipe (inputs may name them as feature axes before the scope exists).
    fn rubric_names(&self) -> HashMap<String, Definition> {
        self.program.modules[Program::ROOT]
            .ast
            .items
            .iter()
            .filter_map(|item| match &item.kind {
                ItemKind::Rubric(decl) => Some((
                    decl.name.name.clone(),
                    Definition {
                        def: Def::Rubric(RubricId(0)),
                        span: decl.name.span,
                    },
                )),
                _ => None,
            })
            .collect()
    }

    fn param(&mut self, decl: &ast::ParamDecl) -> Option<hir::Param> {
        let file = self.root_file;
        let literal_elem = elem_of(&decl.value.value);
        let elem = match decl.ty {
            Some((elem, span)) => {
                let fits = match (elem, &decl.value.value) {
                    (ElemType::Bool, LiteralValue::Bool(_)) => true,
                    (ElemType::I32, LiteralValue::Number { is_int, .. }) => *is_int,
                    (ElemType::F32, LiteralValue::Number { .. }) => true,
                    _ => false,
                };
                if !fits {
                    self.error(
                        Diagnostic::error(
                            "rlx::param_type",
                            file,
                            format!(
                                "param `{}` is declared {} but its value is not",
                                decl.name.name,
                                elem.name()
                            ),
                        )
                        .label(decl.value.span, format!("not a {} literal", elem.name()))
                        .label(span, "declared here"),
                    );
                    return None;
                }
                elem
            }
            // Untyped numeric params are f32 (so `param beta = 0` is not an integer by accident).
            None if literal_elem == Elem::Bool => Elem::Bool,
            None => Elem::F32,
        };
        Some(hir::Param {
            name: decl.name.name.clone(),
            elem,
            value: literal_number(&decl.value.value),
            span: decl.name.span,
        })
    }

    fn rubric_number(
        &mut self,
        value: &ast::RubricValue,
        scope: &HashMap<String, Definition>,
    ) -> Option<hir::Number> {
        match value {
            ast::RubricValue::Number(literal) => {
                Some(hir::Number::Const(literal_number(&literal.value)))
            }
            ast::RubricValue::Param(name) => match scope.get(&name.name) {
                Some(Definition {
                    def: Def::Param(id),
                    ..
                }) => Some(hir::Number::Param(*id)),
                _ => {
                    self.error(
                        Diagnostic::error(
                            "rlx::rubric",
                            self.root_file,
                            format!("`{}` is not a `param`", name.name),
                        )
                        .label(name.span, "rubric attributes take numbers or params")
                        .help(format!("declare it: `param {} = …`", name.name)),
                    );
                    None
                }
            },
        }
    }

    fn shape(
        &mut self,
        call: &ast::ShapeCall,
        allowed: &[(&str, &[&str])],
        what: &str,
        scope: &HashMap<String, Definition>,
    ) -> Option<hir::Shape> {
        let file = self.root_file;
        let Some((_, params)) = allowed.iter().find(|(name, _)| *name == call.name.name) else {
            let names: Vec<&str> = allowed.iter().map(|(n, _)| *n).collect();
            let mut d = Diagnostic::error(
                "rlx::rubric",
                file,
                format!("unknown {what} `{}`", call.name.name),
            )
            .label(
                call.name.span,
                format!("expected one of {}", names.join(", ")),
            );
            if let Some(close) = closest_name(&call.name.name, names.iter().copied()) {
                d = d.help(format!("did you mean `{close}`?"));
            }
            self.error(d);
            return None;
        };
        let mut args = Vec::new();
        for (key, value) in &call.args {
            if !params.contains(&key.name.as_str()) {
                self.error(
                    Diagnostic::error(
                        "rlx::bad_named_arg",
                        file,
                        format!("`{}` takes no argument `{}`", call.name.name, key.name),
                    )
                    .label(key.span, format!("expected {}", params.join(", ")))
                    .help(format!(
                        "write `{}({} = …)`",
                        call.name.name,
                        params.join(" = …, ")
                    )),
                );
                return None;
            }
            args.push((key.name.clone(), self.rubric_number(value, scope)?));
        }
        for param in *params {
            if !args.iter().any(|(k, _)| k == param) {
                self.error(
                    Diagnostic::error(
                        "rlx::arity",
                        file,
                        format!("`{}` needs its argument `{param}`", call.name.name),
                    )
                    .label(
                        if call.parens {
                            call.span
                        } else {
                            call.name.span
                        },
                        format!("missing `{param} = …`"),
                    ),
                );
                return None;
            }
        }
        Some(hir::Shape {
            name: call.name.name.clone(),
            args,
        })
    }

    fn rubric(
        &mut self,
        decl: &ast::RubricDecl,
        scope: &HashMap<String, Definition>,
    ) -> hir::Rubric {
        const SATURATIONS: &[(&str, &[&str])] =
            &[("cap", &["kappa"]), ("tanh", &["k"]), ("exp", &["k"])];
        const VETOES: &[(&str, &[&str])] = &[
            ("zero", &[]),
            ("penalty", &["value"]),
            ("scale", &["factor"]),
        ];
        const SHAPES: &[(&str, &[&str])] = &[
            ("power", &["gamma"]),
            ("exp", &["beta"]),
            ("piecewise", &["threshold", "slope"]),
        ];
        let file = self.root_file;
        let mut rubric = hir::Rubric {
            name: decl.name.name.clone(),
            criteria: Vec::new(),
            interactions: Vec::new(),
            aggregate: hir::Aggregate::Mean,
            on_veto: hir::Shape {
                name: "zero".into(),
                args: Vec::new(),
            },
            shape: None,
            span: decl.name.span,
        };
        let mut criterion_spans: Vec<Span> = Vec::new();
        let mut aggregate: Option<(hir::Aggregate, Span)> = None;
        for entry in &decl.entries {
            let ast::RubricEntry::Criterion(criterion) = entry else {
                continue;
            };
            if let Some(index) = rubric
                .criteria
                .iter()
                .position(|c| c.name == criterion.name.name)
            {
                self.error(
                    Diagnostic::error(
                        "rlx::duplicate",
                        file,
                        format!("criterion `{}` is listed twice", criterion.name.name),
                    )
                    .label(criterion.name.span, "listed again here")
                    .label(criterion_spans[index], "first listed here"),
                );
                continue;
            }
            let mut checked = hir::Criterion {
                name: criterion.name.name.clone(),
                weight: hir::Number::Const(1.0),
                points: None,
                levels: Vec::new(),
                veto: false,
                saturate: None,
            };
            let mut has_weight = false;
            for attr in &criterion.attrs {
                match attr {
                    ast::CriterionAttr::Weight(value) => {
                        has_weight = true;
                        if let Some(n) = self.rubric_number(value, scope) {
                            checked.weight = n;
                        }
                    }
                    ast::CriterionAttr::Points(value) => {
                        checked.points = self.rubric_number(value, scope)
                    }
                    ast::CriterionAttr::Levels(levels, _) => {
                        checked.levels = levels.iter().map(|l| literal_number(&l.value)).collect()
                    }
                    ast::CriterionAttr::Veto(_) => checked.veto = true,
                    ast::CriterionAttr::Saturate(call) => {
                        checked.saturate = self.shape(call, SATURATIONS, "saturation", scope)
                    }
                }
            }
            if has_weight && checked.points.is_some() {
                self.error(
                    Diagnostic::error(
                        "rlx::rubric",
                        file,
                        format!("criterion `{}` has both a weight and points", criterion.name.name),
                    )
                    .label(criterion.span, "choose one")
                    .help("`weight` feeds a weighted mean; `points` feed a HealthBench-style points score"),
                );
            }
            if checked.veto && criterion.attrs.len() > 1 {
                self.error(
                    Diagnostic::error(
                        "rlx::rubric",
                        file,
                        format!(
                            "veto criterion `{}` takes no other attribute",
                            criterion.name.name
                        ),
                    )
                    .label(criterion.span, "a veto criterion only flags a response")
                    .help("what a veto does is set once per rubric with `on_veto`"),
                );
            }
            criterion_spans.push(criterion.name.span);
            rubric.criteria.push(checked);
        }
        for entry in &decl.entries {
            match entry {
                ast::RubricEntry::Criterion(_) => {}
                ast::RubricEntry::Interact(interact) => {
                    let find = |checker: &mut Self, name: &ast::Ident| -> Option<usize> {
                        let found = rubric.criteria.iter().position(|c| c.name == name.name);
                        match found {
                            Some(index) if rubric.criteria[index].veto => {
                                checker.error(
                                    Diagnostic::error(
                                        "rlx::rubric",
                                        file,
                                        format!("veto criterion `{}` cannot interact", name.name),
                                    )
                                    .label(name.span, "a veto criterion only flags a response"),
                                );
                                None
                            }
                            Some(index) => Some(index),
                            None => {
                                let mut d = Diagnostic::error(
                                    "rlx::unknown_criterion",
                                    file,
                                    format!(
                                        "rubric `{}` has no criterion `{}`",
                                        decl.name.name, name.name
                                    ),
                                )
                                .label(name.span, "not a criterion of this rubric");
                                if let Some(close) = closest_name(
                                    &name.name,
                                    rubric.criteria.iter().map(|c| c.name.as_str()),
                                ) {
                                    d = d.help(format!("did you mean `{close}`?"));
                                }
                                checker.error(d);
                                None
                            }
                        }
                    };
                    let first = find(self, &interact.first);
                    let second = find(self, &interact.second);
                    let gamma = self.rubric_number(&interact.gamma, scope);
                    if let (Some(first), Some(second), Some(gamma)) = (first, second, gamma) {
                        if first == second {
                            self.error(
                                Diagnostic::error(
                                    "rlx::rubric",
                                    file,
                                    "a criterion cannot interact with itself",
                                )
                                .label(interact.span, "name two different criteria"),
                            );
                            continue;
                        }
                        rubric.interactions.push(hir::Interaction {
                            first,
                            second,
                            mode: interact.mode.unwrap_or(ast::InteractMode::Product),
                            gamma,
                        });
                    }
                }
                ast::RubricEntry::Aggregate(name) => {
                    let value = match name.name.as_str() {
                        "mean" => hir::Aggregate::Mean,
                        "sum" => hir::Aggregate::Sum,
                        "points" => hir::Aggregate::Points,
                        other => {
                            let mut d = Diagnostic::error(
                                "rlx::rubric",
                                file,
                                format!("unknown aggregation `{other}`"),
                            )
                            .label(name.span, "expected `mean`, `sum` or `points`");
                            if let Some(close) = closest_name(other, ["mean", "sum", "points"]) {
                                d = d.help(format!("did you mean `{close}`?"));
                            }
                            self.error(d);
                            continue;
                        }
                    };
                    aggregate = Some((value, name.span));
                }
                ast::RubricEntry::OnVeto(call) => {
                    if let Some(shape) = self.shape(call, VETOES, "veto action", scope) {
                        rubric.on_veto = shape;
                    }
                }
                ast::RubricEntry::Shape(call) => {
                    rubric.shape = self.shape(call, SHAPES, "shaping", scope)
                }
            }
        }
        let scored: Vec<usize> = (0..rubric.criteria.len())
            .filter(|&i| !rubric.criteria[i].veto)
            .collect();
        if scored.is_empty() {
            self.error(
                Diagnostic::error(
                    "rlx::rubric",
                    file,
                    format!("rubric `{}` has no scoring criterion", decl.name.name),
                )
                .label(
                    decl.name.span,
                    "needs at least one criterion that is not a veto",
                )
                .help("add `criterion NAME weight W`"),
            );
        }
        let with_points = scored
            .iter()
            .filter(|&&i| rubric.criteria[i].points.is_some())
            .count();
        rubric.aggregate = match aggregate {
            Some((hir::Aggregate::Points, span)) if with_points != scored.len() => {
                self.error(
                    Diagnostic::error(
                        "rlx::rubric",
                        file,
                        "`aggregate points` needs points on every criterion",
                    )
                    .label(span, "some criteria have no `points`"),
                );
                hir::Aggregate::Points
            }
            Some((value, span)) if value != hir::Aggregate::Points && with_points > 0 => {
                self.error(
                    Diagnostic::error(
                        "rlx::rubric",
                        file,
                        "criteria with points need `aggregate points`",
                    )
                    .label(span, "points are ignored by this aggregation"),
                );
                value
            }
            Some((value, _)) => value,
            None if with_points == 0 => hir::Aggregate::Mean,
            None if with_points == scored.len() => hir::Aggregate::Points,
            None => {
                self.error(
                    Diagnostic::error(
                        "rlx::rubric",
                        file,
                        format!("rubric `{}` mixes criteria with points and without", decl.name.name),
                    )
                    .label(decl.name.span, "give every scoring criterion `points`, or none")
                    .help("HealthBench-style rubrics give points (possibly negative) to every criterion"),
                );
                hir::Aggregate::Points
            }
        };
        rubric
    }

    // -----------------------------------------------------------------------------------------
    // Sections

    /// Type a `let`, `reward` or `advantage` of the recipe (once; on demand from its users).
    fn global(&mut self, item: usize) -> Option<GlobalId> {
        match self
            .global_state
            .get(&item)
            .cloned()
            .unwrap_or(GlobalState::Unchecked)
        {
            GlobalState::Done(id) => return id,
            GlobalState::InProgress => return None,
            GlobalState::Unchecked => {}
        }
        self.global_state.insert(item, GlobalState::InProgress);
        let root = &self.program.modules[Program::ROOT].ast;
        let env = Env {
            module: Program::ROOT,
            locals: Vec::new(),
            pairwise: false,
            rollout: false,
        };
        // Calls from a function body into a global (impossible: modules have no globals) aside, a
        // global is always checked outside any call frame.
        let saved_calls = std::mem::take(&mut self.calls);
        let (name, kind, expr) = match &root.items[item].kind {
            ItemKind::Let(decl) => (
                decl.name.name.clone(),
                GlobalKind::Let,
                self.expr(&env, &decl.value),
            ),
            ItemKind::Reward(expr) => {
                let checked = self.expr(&env, expr);
                let typed = checked.and_then(|e| self.response_section("reward", e));
                ("reward".to_string(), GlobalKind::Reward, typed)
            }
            ItemKind::Advantage(expr) => {
                let checked = self.expr(&env, expr);
                let typed = checked.and_then(|e| self.response_section("advantage", e));
                ("advantage".to_string(), GlobalKind::Advantage, typed)
            }
            _ => unreachable!("globals are lets and sections"),
        };
        self.calls = saved_calls;
        let id = expr.map(|expr| {
            let id = GlobalId(self.globals.len() as u32);
            self.globals.push(hir::Global { name, kind, expr });
            id
        });
        self.global_state.insert(item, GlobalState::Done(id));
        id
    }

    /// `reward` and `advantage` are f32[resp]; coarser values broadcast, bool and i32 convert.
    fn response_section(&mut self, section: &str, expr: Expr) -> Option<Expr> {
        let target = Ty::new(Elem::F32, Level::Resp);
        if expr.ty.fits(&target) {
            if expr.ty == target {
                return Some(expr);
            }
            let (span, file, grad) = (expr.span, expr.file, expr.grad);
            return self.node(
                ExprKind::Broadcast(Box::new(expr)),
                target,
                grad,
                span,
                file,
            );
        }
        let help = section_help(&expr.ty, Level::Resp);
        self.error(
            Diagnostic::error(
                "rlx::section_type",
                expr.file,
                format!("`{section}` must be f32[resp], found {}", expr.ty),
            )
            .label(expr.span, format!("this is {}", expr.ty))
            .help(help),
        );
        None
    }

    fn loss(&mut self, expr: &ast::Expr) -> Option<Expr> {
        let env = self.root_env();
        let checked = self.expr(&env, expr)?;
        if checked.ty.level != Level::Batch
            || checked.ty.feature.is_some()
            || !checked.ty.is_numeric()
        {
            self.error(
                Diagnostic::error(
                    "rlx::section_type",
                    self.root_file,
                    format!("`loss` must be a scalar f32, found {}", checked.ty),
                )
                .label(checked.span, format!("this is {}", checked.ty))
                .help(section_help(&checked.ty, Level::Batch)),
            );
            return None;
        }
        if !checked.grad {
            let policy = self
                .inputs
                .iter()
                .find(|i| i.role == Some(InputRole::Policy))
                .map(|i| i.name.clone());
            let help = match policy {
                Some(name) => format!(
                    "the loss does not depend on `{name}` through differentiable operations (is it inside `stopgrad`?)"
                ),
                None => {
                    let candidate = self
                        .inputs
                        .iter()
                        .find(|i| i.ty.elem == Elem::F32 && i.ty.level == Level::Tok)
                        .map(|i| i.name.clone())
                        .unwrap_or_else(|| "logp".to_string());
                    format!("mark the policy's log-probabilities: `input {candidate} : f32[tok] policy`")
                }
            };
            self.error(
                Diagnostic::error(
                    "rlx::not_differentiable",
                    self.root_file,
                    "the loss does not depend on a `policy` input",
                )
                .label(checked.span, "no gradient flows from here to the policy")
                .help(help),
            );
            return None;
        }
        Some(checked)
    }

    fn root_env(&self) -> Env {
        Env {
            module: Program::ROOT,
            locals: Vec::new(),
            pairwise: false,
            rollout: false,
        }
    }

    fn metric(&mut self, expr: &ast::Expr) -> Option<Expr> {
        let env = self.root_env();
        let checked = self.expr(&env, expr)?;
        if checked.ty.level != Level::Batch || checked.ty.feature.is_some() {
            self.error(
                Diagnostic::error(
                    "rlx::section_type",
                    self.root_file,
                    format!("a metric must be a scalar, found {}", checked.ty),
                )
                .label(checked.span, format!("this is {}", checked.ty))
                .help(section_help(&checked.ty, Level::Batch)),
            );
            return None;
        }
        Some(checked)
    }

    fn keep(&mut self, level: KeepLevel, level_span: Span, expr: &ast::Expr) -> Option<Expr> {
        let env = self.root_env();
        let checked = self.expr(&env, expr)?;
        let target_level = match level {
            KeepLevel::Group => Level::Group,
            KeepLevel::Resp => Level::Resp,
        };
        if checked.ty.elem != Elem::Bool
            || checked.ty.level > target_level
            || checked.ty.feature.is_some()
        {
            let mut d = Diagnostic::error(
                "rlx::section_type",
                self.root_file,
                format!(
                    "`keep {}` needs a bool[{}] condition, found {}",
                    target_level.name(),
                    target_level.name(),
                    checked.ty
                ),
            )
            .label(checked.span, format!("this is {}", checked.ty))
            .label(level_span, "filters at this level");
            d = d.help(if checked.ty.elem != Elem::Bool {
                "compare it, e.g. `std(reward over resp) > 0`".to_string()
            } else {
                section_help(&checked.ty, target_level)
            });
            self.error(d);
            return None;
        }
        if let Some(advantage) = self.advantage_item.and_then(|item| self.global_id(item)) {
            if self.uses_global(&checked, advantage) {
                self.error(
                    Diagnostic::error(
                        "rlx::keep_after_advantage",
                        self.root_file,
                        "a `keep` filter cannot depend on the advantage",
                    )
                    .label(checked.span, "uses `advantage`")
                    .help(
                        "filters run before advantages are computed; filter on the reward instead",
                    ),
                );
                return None;
            }
        }
        Some(checked)
    }

    fn uses_global(&self, expr: &Expr, target: GlobalId) -> bool {
        let mut stack = vec![expr];
        while let Some(e) = stack.pop() {
            if let ExprKind::Global(id) = e.kind {
                if id == target {
                    return true;
                }
                stack.push(&self.globals[id.0 as usize].expr);
            }
            stack.extend(e.children());
        }
        false
    }

    fn rollout(&mut self, entries: &[ast::RolloutEntry]) -> Vec<hir::RolloutSetting> {
        // (key, element type, finest level, takes strings)
        const KEYS: &[(&str, Elem, Level, bool)] = &[
            ("n", Elem::I32, Level::Batch, false),
            ("temperature", Elem::F32, Level::Batch, false),
            ("top_p", Elem::F32, Level::Batch, false),
            ("top_k", Elem::I32, Level::Batch, false),
            ("max_new_tokens", Elem::I32, Level::Batch, false),
            ("scaffold", Elem::F32, Level::Resp, false),
            ("stop", Elem::F32, Level::Batch, true),
            ("modes", Elem::F32, Level::Batch, true),
        ];
        let file = self.root_file;
        let mut settings: Vec<hir::RolloutSetting> = Vec::new();
        let mut seen: HashMap<String, Span> = HashMap::new();
        for entry in entries {
            let Some(&(key, elem, level, strings)) =
                KEYS.iter().find(|(k, ..)| *k == entry.key.name)
            else {
                let mut d = Diagnostic::error(
                    "rlx::rollout_key",
                    file,
                    format!("unknown rollout setting `{}`", entry.key.name),
                )
                .label(entry.key.span, "not a rollout setting");
                d = match closest_name(&entry.key.name, KEYS.iter().map(|(k, ..)| *k)) {
                    Some(close) => d.help(format!("did you mean `{close}`?")),
                    None => d.help(format!(
                        "settings: {}",
                        KEYS.iter().map(|(k, ..)| *k).collect::<Vec<_>>().join(", ")
                    )),
                };
                self.error(d);
                continue;
            };
            if let Some(first) = seen.insert(key.to_string(), entry.key.span) {
                self.error(
                    Diagnostic::error(
                        "rlx::duplicate",
                        file,
                        format!("rollout setting `{key}` is given twice"),
                    )
                    .label(entry.key.span, "given again here")
                    .label(first, "first given here"),
                );
                continue;
            }
            let value = match (&entry.value, strings) {
                (ast::RolloutValue::Strings(list), true) => {
                    hir::RolloutValue::Strings(list.iter().map(|(s, _)| s.clone()).collect())
                }
                (ast::RolloutValue::Expr(expr), false) => {
                    let env = Env {
                        rollout: true,
                        ..self.root_env()
                    };
                    let Some(checked) = self.expr(&env, expr) else {
                        continue;
                    };
                    let target = Ty::new(elem, level);
                    if !checked.ty.fits(&target)
                        || (elem == Elem::I32 && checked.ty.elem == Elem::F32)
                    {
                        self.error(
                            Diagnostic::error(
                                "rlx::type_mismatch",
                                file,
                                format!(
                                    "rollout setting `{key}` must be {target}, found {}",
                                    checked.ty
                                ),
                            )
                            .label(checked.span, format!("this is {}", checked.ty)),
                        );
                        continue;
                    }
                    hir::RolloutValue::Expr(checked)
                }
                (value, _) => {
                    let span = match value {
                        ast::RolloutValue::Expr(e) => e.span,
                        ast::RolloutValue::Strings(list) => {
                            list.first().map(|(_, s)| *s).unwrap_or(entry.span)
                        }
                    };
                    self.error(
                        Diagnostic::error(
                            "rlx::type_mismatch",
                            file,
                            if strings {
                                format!("rollout setting `{key}` takes a list of strings")
                            } else {
                                format!("rollout setting `{key}` takes a number")
                            },
                        )
                        .label(span, "wrong kind of value"),
                    );
                    continue;
                }
            };
            settings.push(hir::RolloutSetting {
                key: key.to_string(),
                value,
            });
        }
        settings
    }

    // -----------------------------------------------------------------------------------------
    // Expressions

    fn file_of(&self, env: &Env) -> FileId {
        self.module_file(env.module)
    }

    fn expr(&mut self, env: &Env, expr: &ast::Expr) -> Option<Expr> {
        let file = self.file_of(env);
        let span = expr.span;
        match &expr.kind {
            ast::ExprKind::Number { value, is_int, .. } => {
                let elem = if *is_int { Elem::I32 } else { Elem::F32 };
                self.node(ExprKind::Const(*value), Ty::scalar(elem), false, span, file)
            }
            ast::ExprKind::Bool(value) => self.node(
                ExprKind::Const(f64::from(u8::from(*value))),
                Ty::scalar(Elem::Bool),
                false,
                span,
                file,
            ),
            ast::ExprKind::Name(name) => self.name(env, name),
            ast::ExprKind::Other(name) => self.other(env, name, span),
            ast::ExprKind::Paren(inner) => self.expr(env, inner),
            ast::ExprKind::Unary { op, operand } => {
                let operand = self.expr(env, operand)?;
                match op {
                    UnaryOp::Neg => {
                        if !operand.ty.is_numeric() {
                            self.type_error(
                                &operand,
                                "a number",
                                "use `not` to negate a condition",
                            );
                            return None;
                        }
                        let ty = operand.ty.clone();
                        let grad = operand.grad;
                        self.node(
                            ExprKind::Unary {
                                op: *op,
                                operand: Box::new(operand),
                            },
                            ty,
                            grad,
                            span,
                            file,
                        )
                    }
                    UnaryOp::Not => {
                        if operand.ty.elem != Elem::Bool {
                            self.type_error(&operand, "bool", "compare it first, e.g. `x > 0`");
                            return None;
                        }
                        let ty = operand.ty.clone();
                        self.node(
                            ExprKind::Unary {
                                op: *op,
                                operand: Box::new(operand),
                            },
                            ty,
                            false,
                            span,
                            file,
                        )
                    }
                }
            }
            ast::ExprKind::Binary { op, lhs, rhs } => {
                let lhs = self.expr(env, lhs);
                let rhs = self.expr(env, rhs);
                let (lhs, rhs) = (lhs?, rhs?);
                self.binary(*op, lhs, rhs, span, file)
            }
            ast::ExprKind::Index { base, criterion } => {
                let base = self.expr(env, base)?;
                self.index(base, criterion, span, file)
            }
            ast::ExprKind::Block { lets, body } => {
                let mut inner = env.clone();
                let mut bindings = Vec::new();
                let mut failed = false;
                for local in lets {
                    match self.expr(&inner, &local.value) {
                        Some(value) => {
                            let id = self.fresh_local();
                            inner.locals.push(LocalBinding {
                                name: local.name.name.clone(),
                                id,
                                ty: value.ty.clone(),
                                grad: value.grad,
                            });
                            bindings.push((id, value));
                        }
                        None => {
                            failed = true;
                            // Keep checking the rest with the name known, typed loosely.
                            inner.locals.push(LocalBinding {
                                name: local.name.name.clone(),
                                id: LocalId(u32::MAX),
                                ty: Ty::scalar(Elem::F32),
                                grad: false,
                            });
                        }
                    }
                }
                let body = self.expr(&inner, body);
                if failed {
                    return None;
                }
                let body = body?;
                let (ty, grad) = (body.ty.clone(), body.grad);
                self.node(
                    ExprKind::Let {
                        bindings,
                        body: Box::new(body),
                        function: None,
                    },
                    ty,
                    grad,
                    span,
                    file,
                )
            }
            ast::ExprKind::Call { func, args, over } => {
                self.call(env, func, args, over.as_ref(), span)
            }
        }
    }

    fn type_error(&mut self, expr: &Expr, expected: &str, help: &str) {
        let mut d = Diagnostic::error(
            "rlx::type_mismatch",
            expr.file,
            format!("expected {expected}, found {}", expr.ty),
        )
        .label(expr.span, format!("this is {}", expr.ty));
        if !help.is_empty() {
            d = d.help(help);
        }
        self.error(d);
    }

    fn lookup(&self, env: &Env, name: &str) -> Option<Def> {
        self.scopes[env.module].get(name).map(|d| d.def)
    }

    fn name(&mut self, env: &Env, name: &ast::Ident) -> Option<Expr> {
        let file = self.file_of(env);
        let span = name.span;
        if let Some(local) = env.locals.iter().rev().find(|l| l.name == name.name) {
            if local.id.0 == u32::MAX {
                return None;
            }
            let (id, ty, grad) = (local.id, local.ty.clone(), local.grad);
            return self.node(ExprKind::Local(id), ty, grad, span, file);
        }
        if env.module == Program::ROOT {
            let section = match name.name.as_str() {
                "reward" => Some(self.reward_item),
                "advantage" => Some(self.advantage_item),
                _ => None,
            };
            if let Some(Some(item)) = section {
                return self.global_ref(env, item, name);
            }
        }
        match self.lookup(env, &name.name) {
            Some(Def::Input(id)) => {
                if env.rollout {
                    return self.rollout_name(name, "an input");
                }
                let input = &self.inputs[id.0 as usize];
                let ty = input.ty.clone();
                let grad = input.role.is_some();
                self.node(ExprKind::Input(id), ty, grad, span, file)
            }
            Some(Def::Param(id)) => {
                let ty = Ty::scalar(self.params[id.0 as usize].elem);
                self.node(ExprKind::Param(id), ty, false, span, file)
            }
            Some(Def::Global(item)) => self.global_ref(env, item, name),
            Some(Def::Fn { .. }) | Some(Def::Rubric(_)) => {
                self.error(
                    Diagnostic::error(
                        "rlx::not_a_value",
                        file,
                        format!("`{}` is a function, not a value", name.name),
                    )
                    .label(span, "used as a value")
                    .help(format!("call it: `{}(…)`", name.name)),
                );
                None
            }
            None => match builtins::value(&name.name) {
                Some(sig) => {
                    if env.rollout
                        && !matches!(
                            sig.value,
                            builtins::Value::Step
                                | builtins::Value::Progress
                                | builtins::Value::N
                                | builtins::Value::RespIndex
                                | builtins::Value::Inf
                                | builtins::Value::Pi
                        )
                    {
                        return self.rollout_name(name, "a property of the sampled response");
                    }
                    let kind = match sig.value {
                        builtins::Value::Inf => ExprKind::Const(f64::INFINITY),
                        builtins::Value::Pi => ExprKind::Const(std::f64::consts::PI),
                        value => ExprKind::Value(value),
                    };
                    self.node(kind, builtins::value_ty(sig), false, span, file)
                }
                None => {
                    // Reported once by the name pass for function bodies; report here for the recipe.
                    let locals: Vec<String> = env.locals.iter().map(|l| l.name.clone()).collect();
                    self.unknown_name(env.module, name, &locals);
                    None
                }
            },
        }
    }

    fn rollout_name(&mut self, name: &ast::Ident, what: &str) -> Option<Expr> {
        self.error(
            Diagnostic::error(
                "rlx::rollout_input",
                self.root_file,
                format!("`{}` is {what}, unknown before sampling", name.name),
            )
            .label(name.span, "not available when the rollout is configured")
            .help("rollout settings may use params, `step`, `progress`, `n` and `resp_index`"),
        );
        None
    }

    fn global_ref(&mut self, env: &Env, item: usize, name: &ast::Ident) -> Option<Expr> {
        let file = self.file_of(env);
        if env.rollout {
            return self.rollout_name(name, "computed from the rollouts");
        }
        if self.global_state.get(&item) == Some(&GlobalState::InProgress) {
            self.error(
                Diagnostic::error(
                    "rlx::cycle",
                    file,
                    format!("`{}` depends on itself", name.name),
                )
                .label(name.span, "used while it is being defined")
                .help("definitions must form a chain without cycles"),
            );
            return None;
        }
        // Check the referenced global outside of whatever is being checked now.
        let saved = std::mem::take(&mut self.calls);
        let id = self.global(item);
        self.calls = saved;
        let id = id?;
        let global = &self.globals[id.0 as usize];
        let (ty, grad) = (global.expr.ty.clone(), global.expr.grad);
        self.node(ExprKind::Global(id), ty, grad, name.span, file)
    }

    fn other(&mut self, env: &Env, name: &ast::Ident, span: Span) -> Option<Expr> {
        let file = self.file_of(env);
        if !env.pairwise {
            self.error(
                Diagnostic::error(
                    "rlx::other_outside_pairwise",
                    file,
                    format!(
                        "`other.{}` is only meaningful inside `… over others`",
                        name.name
                    ),
                )
                .label(span, "no other response is in scope here")
                .help(format!(
                    "e.g. `mean({} != other.{} over others)`",
                    name.name, name.name
                )),
            );
            return None;
        }
        let inner_env = Env {
            pairwise: false,
            ..env.clone()
        };
        let value = self.name(&inner_env, name)?;
        if value.ty.level == Level::Tok {
            self.error(
                Diagnostic::error(
                    "rlx::pairwise_level",
                    file,
                    format!("`other.{}` reads a token-level value", name.name),
                )
                .label(span, format!("this is {}", value.ty))
                .help(format!("pairwise terms compare responses: reduce first, e.g. `let s = mean({} over tok)`", name.name)),
            );
            return None;
        }
        let (ty, grad) = (
            value.ty.with_level(value.ty.level.max(Level::Resp)),
            value.grad,
        );
        self.node(ExprKind::Other(Box::new(value)), ty, grad, span, file)
    }

    /// Broadcast level and feature of operands; `None` (after an error) when they cannot combine.
    fn combine(
        &mut self,
        parts: &[&Expr],
        span: Span,
        file: FileId,
    ) -> Option<(Level, Option<Feature>)> {
        let level = parts
            .iter()
            .map(|p| p.ty.level)
            .max()
            .unwrap_or(Level::Batch);
        let mut feature: Option<(&Feature, &Expr)> = None;
        for part in parts {
            if let Some(f) = &part.ty.feature {
                match feature {
                    Some((existing, first)) if existing != f => {
                        self.error(
                            Diagnostic::error(
                                "rlx::feature_mismatch",
                                file,
                                format!("cannot combine {} with {}", first.ty, part.ty),
                            )
                            .label(first.span, format!("this is {}", first.ty))
                            .label(part.span, format!("this is {}", part.ty))
                            .help("their feature axes differ; reduce one of them first"),
                        );
                        return None;
                    }
                    None => feature = Some((f, part)),
                    _ => {}
                }
            }
        }
        if let Some((f, with_feature)) = feature {
            if level == Level::Tok {
                let token = parts.iter().find(|p| p.ty.level == Level::Tok).copied();
                let mut d = Diagnostic::error(
                    "rlx::level_mismatch",
                    file,
                    format!(
                        "cannot combine {} with {}",
                        token.map(|t| t.ty.to_string()).unwrap_or_default(),
                        with_feature.ty
                    ),
                )
                .label(with_feature.span, format!("this is {}", with_feature.ty));
                if let Some(token) = token {
                    d = d.label(token.span, format!("this is {}", token.ty));
                }
                d = d.help(format!(
                    "a token-level value has no `{}` axis: reduce it first, e.g. `sum(x over {})`, or reduce the tokens with `mean(… over tok)`",
                    f.name(),
                    f.name()
                ));
                self.error(d);
                let _ = span;
                return None;
            }
        }
        Some((level, feature.map(|(f, _)| f.clone())))
    }

    fn binary(
        &mut self,
        op: BinaryOp,
        lhs: Expr,
        rhs: Expr,
        span: Span,
        file: FileId,
    ) -> Option<Expr> {
        let (level, feature) = self.combine(&[&lhs, &rhs], span, file)?;
        let (elem, grad) = if op.is_logical() {
            for side in [&lhs, &rhs] {
                if side.ty.elem != Elem::Bool {
                    self.type_error(
                        side,
                        "bool",
                        &format!(
                            "`{}` joins conditions; compare first, e.g. `x > 0`",
                            op.symbol()
                        ),
                    );
                    return None;
                }
            }
            (Elem::Bool, false)
        } else if op.is_comparison() {
            let both_bool = lhs.ty.elem == Elem::Bool && rhs.ty.elem == Elem::Bool;
            let equality = matches!(op, BinaryOp::Eq | BinaryOp::Ne);
            let comparable =
                (lhs.ty.is_numeric() && rhs.ty.is_numeric()) || (both_bool && equality);
            if !comparable {
                let odd = if lhs.ty.is_numeric() { &rhs } else { &lhs };
                self.type_error(odd, "a number", "");
                return None;
            }
            (Elem::Bool, false)
        } else {
            let elem = match op {
                BinaryOp::Div | BinaryOp::Pow => Elem::F32,
                _ if lhs.ty.elem == Elem::I32 && rhs.ty.elem == Elem::I32 => Elem::I32,
                _ => Elem::F32,
            };
            (elem, lhs.grad || rhs.grad)
        };
        let ty = Ty {
            elem,
            level,
            feature,
        };
        self.node(
            ExprKind::Binary {
                op,
                lhs: Box::new(lhs),
                rhs: Box::new(rhs),
            },
            ty,
            grad,
            span,
            file,
        )
    }

    fn index(
        &mut self,
        base: Expr,
        criterion: &ast::Ident,
        span: Span,
        file: FileId,
    ) -> Option<Expr> {
        let Some(Feature::Rubric(rubric_name)) = &base.ty.feature else {
            self.error(
                Diagnostic::error(
                    "rlx::index_not_rubric",
                    file,
                    format!(
                        "only values with a rubric axis can be indexed by criterion; this is {}",
                        base.ty
                    ),
                )
                .label(base.span, format!("this is {}", base.ty))
                .help("declare the input against a rubric, e.g. `input judged : f32[resp, style]`"),
            );
            return None;
        };
        let rubric = self.rubrics.iter().find(|r| &r.name == rubric_name)?;
        let Some(position) = rubric
            .criteria
            .iter()
            .position(|c| c.name == criterion.name)
        else {
            let mut d = Diagnostic::error(
                "rlx::unknown_criterion",
                file,
                format!(
                    "rubric `{rubric_name}` has no criterion `{}`",
                    criterion.name
                ),
            )
            .label(criterion.span, "not a criterion of this rubric");
            if let Some(close) = closest_name(
                &criterion.name,
                rubric.criteria.iter().map(|c| c.name.as_str()),
            ) {
                d = d.help(format!("did you mean `{close}`?"));
            }
            self.error(d);
            return None;
        };
        let (ty, grad) = (base.ty.without_feature(), base.grad);
        self.node(
            ExprKind::Index {
                base: Box::new(base),
                criterion: position,
            },
            ty,
            grad,
            span,
            file,
        )
    }

    /// Match positional and named arguments to parameters. `None` after reporting an error.
    fn match_args<'a>(
        &mut self,
        file: FileId,
        callee: &ast::Ident,
        params: &[&str],
        required: usize,
        args: &'a [ast::Arg],
        call_span: Span,
    ) -> Option<Vec<Option<&'a ast::Expr>>> {
        let mut slots: Vec<Option<&ast::Expr>> = vec![None; params.len()];
        let mut seen_named = false;
        let mut ok = true;
        for (position, arg) in args.iter().enumerate() {
            match &arg.name {
                None => {
                    if seen_named {
                        self.error(
                            Diagnostic::error(
                                "rlx::positional_after_named",
                                file,
                                "a positional argument follows a named one",
                            )
                            .label(arg.value.span, "positional argument")
                            .help("put positional arguments first"),
                        );
                        ok = false;
                        continue;
                    }
                    if position >= params.len() {
                        self.error(
                            Diagnostic::error(
                                "rlx::arity",
                                file,
                                format!(
                                    "`{}` takes {} argument{}, found {}",
                                    callee.name,
                                    params.len(),
                                    if params.len() == 1 { "" } else { "s" },
                                    args.len()
                                ),
                            )
                            .label(arg.value.span, "extra argument")
                            .help(format!(
                                "`{}({})`",
                                callee.name,
                                params.join(", ")
                            )),
                        );
                        return None;
                    }
                    slots[position] = Some(&arg.value);
                }
                Some(name) => {
                    seen_named = true;
                    match params.iter().position(|p| *p == name.name) {
                        None => {
                            let mut d = Diagnostic::error(
                                "rlx::bad_named_arg",
                                file,
                                format!("`{}` has no parameter `{}`", callee.name, name.name),
                            )
                            .label(name.span, "unknown parameter");
                            d = match closest_name(&name.name, params.iter().copied()) {
                                Some(close) => d.help(format!("did you mean `{close}`?")),
                                None => d.help(format!("`{}({})`", callee.name, params.join(", "))),
                            };
                            self.error(d);
                            ok = false;
                        }
                        Some(index) if slots[index].is_some() => {
                            self.error(
                                Diagnostic::error(
                                    "rlx::duplicate_arg",
                                    file,
                                    format!("argument `{}` is given twice", name.name),
                                )
                                .label(name.span, "given again here"),
                            );
                            ok = false;
                        }
                        Some(index) => slots[index] = Some(&arg.value),
                    }
                }
            }
        }
        if !ok {
            return None;
        }
        if let Some(missing) = (0..required).find(|&i| slots[i].is_none()) {
            self.error(
                Diagnostic::error(
                    "rlx::arity",
                    file,
                    format!(
                        "`{}` is missing its argument `{}`",
                        callee.name, params[missing]
                    ),
                )
                .label(call_span, format!("needs `{}`", params[missing]))
                .help(format!("`{}({})`", callee.name, params.join(", "))),
            );
            return None;
        }
        Some(slots)
    }

    fn call(
        &mut self,
        env: &Env,
        func: &ast::Ident,
        args: &[ast::Arg],
        over: Option<&ast::Over>,
        span: Span,
    ) -> Option<Expr> {
        let file = self.file_of(env);
        let def = if env.locals.iter().any(|l| l.name == func.name) {
            None
        } else {
            self.lookup(env, &func.name)
        };
        match def {
            Some(Def::Fn { module, item }) => {
                if let Some(over) = over {
                    self.unexpected_over(file, &func.name, over);
                    return None;
                }
                return self.call_fn(env, func, module, item, args, span);
            }
            Some(Def::Rubric(id)) => {
                if let Some(over) = over {
                    self.unexpected_over(file, &func.name, over);
                    return None;
                }
                return self.apply_rubric(env, func, id, args, span);
            }
            Some(_) => {
                self.error(
                    Diagnostic::error(
                        "rlx::not_callable",
                        file,
                        format!("`{}` is a value, not a function", func.name),
                    )
                    .label(func.span, "called here")
                    .help("only `fn`s, rubrics and built-in functions can be called"),
                );
                return None;
            }
            None => {}
        }
        if env.locals.iter().any(|l| l.name == func.name) {
            self.error(
                Diagnostic::error(
                    "rlx::not_callable",
                    file,
                    format!("`{}` is a value, not a function", func.name),
                )
                .label(func.span, "called here"),
            );
            return None;
        }
        let name = func.name.as_str();
        if name == "shift" || name == "distinct_ngrams" {
            return self.token_op(env, func, args, over, span);
        }
        if name == "softmax" || name == "scan" {
            return self.axis_op(env, func, args, over, span);
        }
        let is_elementwise_minmax = (name == "min" || name == "max") && over.is_none();
        if let Some(sig) = builtins::reduction(name) {
            if !is_elementwise_minmax {
                return self.reduce(env, func, sig.op, args, over, span);
            }
        }
        let Some(sig) = builtins::func(name) else {
            self.unknown_function(env.module, func);
            return None;
        };
        if let Some(over) = over {
            self.unexpected_over(file, name, over);
            return None;
        }
        let slots = self.match_args(
            file,
            func,
            sig.params,
            sig.params.len() - sig.optional,
            args,
            span,
        )?;
        let mut checked = Vec::new();
        let mut failed = false;
        for slot in slots.into_iter().flatten() {
            match self.expr(env, slot) {
                Some(e) => checked.push(e),
                None => failed = true,
            }
        }
        if failed {
            return None;
        }
        self.builtin_call(sig.func, checked, span, file)
    }

    fn unexpected_over(&mut self, file: FileId, name: &str, over: &ast::Over) {
        self.error(
            Diagnostic::error(
                "rlx::unexpected_over",
                file,
                format!("`{name}` is not a reduction"),
            )
            .label(over.span, "`over` only follows the argument of a reduction")
            .help("reductions: sum, mean, max, min, std, var, count, any, all, logsumexp"),
        );
    }

    fn builtin_call(
        &mut self,
        func: Func,
        args: Vec<Expr>,
        span: Span,
        file: FileId,
    ) -> Option<Expr> {
        let parts: Vec<&Expr> = args.iter().collect();
        let (level, feature) = self.combine(&parts, span, file)?;
        let numeric = |checker: &mut Self, e: &Expr| -> bool {
            if e.ty.is_numeric() {
                true
            } else {
                checker.type_error(e, "a number", "convert a condition with `where(c, 1, 0)`");
                false
            }
        };
        let (ty, grad) = match func {
            Func::Where => {
                if args[0].ty.elem != Elem::Bool {
                    self.type_error(
                        &args[0],
                        "bool",
                        "the condition of `where` is compared, e.g. `x > 0`",
                    );
                    return None;
                }
                let elem = if args[1].ty.elem == args[2].ty.elem {
                    args[1].ty.elem
                } else if args[1].ty.elem == Elem::Bool || args[2].ty.elem == Elem::Bool {
                    let odd = if args[1].ty.elem == Elem::Bool {
                        &args[1]
                    } else {
                        &args[2]
                    };
                    self.type_error(
                        odd,
                        "a number like the other branch",
                        "both branches have the same kind",
                    );
                    return None;
                } else {
                    Elem::F32
                };
                (
                    Ty {
                        elem,
                        level,
                        feature,
                    },
                    args[1].grad || args[2].grad,
                )
            }
            Func::Stopgrad => (args[0].ty.clone(), false),
            Func::Cos if args.len() == 1 => {
                if !numeric(self, &args[0]) {
                    return None;
                }
                (
                    Ty {
                        elem: Elem::F32,
                        level,
                        feature,
                    },
                    args[0].grad,
                )
            }
            Func::Sign | Func::Lgamma => {
                if !numeric(self, &args[0]) {
                    return None;
                }
                (
                    Ty {
                        elem: Elem::F32,
                        level,
                        feature,
                    },
                    false,
                )
            }
            Func::Cos => {
                for arg in &args {
                    if !numeric(self, arg) {
                        return None;
                    }
                }
                if feature.is_none() {
                    self.type_error(
                        &args[0],
                        "a vector (a value with a `dim` axis)",
                        "e.g. `input emb : f32[resp, dim]`",
                    );
                    return None;
                }
                (Ty::new(Elem::F32, level), args.iter().any(|a| a.grad))
            }
            Func::Min | Func::Max | Func::Clamp | Func::Abs => {
                for arg in &args {
                    if !numeric(self, arg) {
                        return None;
                    }
                }
                let elem = if args.iter().all(|a| a.ty.elem == Elem::I32) {
                    Elem::I32
                } else {
                    Elem::F32
                };
                (
                    Ty {
                        elem,
                        level,
                        feature,
                    },
                    args.iter().any(|a| a.grad),
                )
            }
            Func::Floor => {
                if !numeric(self, &args[0]) {
                    return None;
                }
                (
                    Ty {
                        elem: Elem::F32,
                        level,
                        feature,
                    },
                    false,
                )
            }
            _ => {
                for arg in &args {
                    if !numeric(self, arg) {
                        return None;
                    }
                }
                (
                    Ty {
                        elem: Elem::F32,
                        level,
                        feature,
                    },
                    args.iter().any(|a| a.grad),
                )
            }
        };
        self.node(ExprKind::Call { func, args }, ty, grad, span, file)
    }

    /// Interpret `over …` for a value of type `ty`.
    fn axes(
        &mut self,
        env: &Env,
        over: &ast::Over,
        value: &Expr,
        op_name: &str,
    ) -> Option<(Axes, Ty)> {
        let file = self.file_of(env);
        let mut levels: Vec<(Level, Span)> = Vec::new();
        let mut batch = false;
        let mut special: Option<(Axes, Span)> = None;
        for axis in &over.axes {
            let name = axis.name.as_str();
            if let Some(level) = Level::from_name(name) {
                if level == Level::Batch {
                    batch = true;
                } else {
                    levels.push((level, axis.span));
                }
                continue;
            }
            let parsed = match name {
                "others" => Some(Axes::Others),
                "crit" => Some(Axes::Feature(Feature::Crit)),
                "dim" => Some(Axes::Feature(Feature::Dim)),
                _ => match self.lookup(env, name) {
                    Some(Def::Rubric(_)) => Some(Axes::Feature(Feature::Rubric(name.to_string()))),
                    _ => None,
                },
            };
            match parsed {
                Some(parsed) => special = Some((parsed, axis.span)),
                None => {
                    let mut d = Diagnostic::error(
                        "rlx::unknown_axis",
                        file,
                        format!("unknown axis `{name}`"),
                    )
                    .label(axis.span, "not an axis");
                    if let Some(close) = closest_name(
                        name,
                        ["tok", "resp", "group", "batch", "others", "crit", "dim"],
                    )
                    .or_else(|| closest_level(name))
                    {
                        d = d.help(format!("did you mean `{close}`?"));
                    } else {
                        d = d.help(
                            "axes: tok, resp, group, batch, others, crit, dim, or a rubric name",
                        );
                    }
                    self.error(d);
                    return None;
                }
            }
        }
        if let Some((axes, axis_span)) = special {
            if over.axes.len() > 1 {
                let (code, message, help) = if axes == Axes::Others {
                    (
                        "rlx::pairwise_axes",
                        "`others` ranges over the other responses of one group; it cannot be combined with other axes"
                            .to_string(),
                        "nest the reductions, e.g. `mean(mean(x != other.x over others) over batch)`",
                    )
                } else {
                    (
                        "rlx::mixed_axes",
                        "a feature axis is reduced on its own, not together with levels"
                            .to_string(),
                        "nest the reductions, e.g. `mean(sum(x over crit) over resp)`",
                    )
                };
                self.error(
                    Diagnostic::error(code, file, message)
                        .label(over.span, "reduce one kind of axis at a time")
                        .help(help),
                );
                return None;
            }
            return match &axes {
                Axes::Others => Some((axes, value.ty.with_level(Level::Resp))),
                Axes::Feature(feature) => {
                    if value.ty.feature.as_ref() != Some(feature) {
                        self.error(
                            Diagnostic::error(
                                "rlx::reduce_missing_axis",
                                file,
                                format!("{} has no `{}` axis to reduce", value.ty, feature.name()),
                            )
                            .label(value.span, format!("this is {}", value.ty))
                            .label(axis_span, "reduced here")
                            .help(reduction_help(&value.ty, op_name)),
                        );
                        return None;
                    }
                    Some((axes, value.ty.without_feature()))
                }
                Axes::Levels { .. } => unreachable!("levels are handled below"),
            };
        }
        let own = value.ty.level;
        if own == Level::Batch {
            self.error(
                Diagnostic::error(
                    "rlx::reduce_missing_axis",
                    file,
                    format!("{} is a single value; there is nothing to reduce", value.ty),
                )
                .label(value.span, format!("this is {}", value.ty))
                .label(over.span, "reduced here")
                .help("drop the reduction"),
            );
            return None;
        }
        for (level, axis_span) in &levels {
            if *level > own {
                self.error(
                    Diagnostic::error(
                        "rlx::reduce_missing_axis",
                        file,
                        format!("{} has no `{}` axis to reduce", value.ty, level.name()),
                    )
                    .label(value.span, format!("this is {}", value.ty))
                    .label(*axis_span, "reduced here")
                    .help(reduction_help(&value.ty, op_name)),
                );
                return None;
            }
        }
        // The axes must be contiguous from the value's own level upward.
        let mut named: Vec<Level> = levels.iter().map(|(l, _)| *l).collect();
        named.sort();
        named.dedup();
        let finest_named = named.last().copied();
        let to = if batch {
            Level::Group
        } else {
            match named.first() {
                Some(coarsest) => *coarsest,
                None => unreachable!("an over clause names at least one axis"),
            }
        };
        if finest_named.is_some_and(|finest| finest != own)
            || (batch && named.is_empty() && own == Level::Tok)
        {
            let axis = if own == Level::Tok { "tok" } else { own.name() };
            let mut wanted: Vec<&str> = vec![axis];
            let mut level = own.coarser();
            while level > to.coarser() && level != Level::Batch {
                wanted.push(level.name());
                level = level.coarser();
            }
            if batch {
                wanted = vec![axis, "batch"];
            }
            self.error(
                Diagnostic::error(
                    "rlx::reduce_skips_level",
                    file,
                    format!(
                        "{} varies over `{axis}` first; a reduction must include it",
                        value.ty
                    ),
                )
                .label(over.span, "skips a finer axis")
                .label(value.span, format!("this is {}", value.ty))
                .help(format!("write `over {}`", wanted.join(", "))),
            );
            return None;
        }
        // Contiguity between named levels (e.g. `over tok, group` skips `resp`).
        let mut expected = own;
        for level in named.iter().rev() {
            if *level != expected {
                self.error(
                    Diagnostic::error(
                        "rlx::reduce_skips_level",
                        file,
                        format!("`over` skips the `{}` axis", expected.name()),
                    )
                    .label(over.span, "axes must be contiguous")
                    .help(format!(
                        "include `{}`, or write `batch` for every axis up to the whole batch",
                        expected.name()
                    )),
                );
                return None;
            }
            expected = expected.coarser();
        }
        if value.ty.feature == Some(Feature::Crit) && to == Level::Group {
            self.error(
                Diagnostic::error(
                    "rlx::ragged_feature",
                    file,
                    format!("{} has a different criterion list per prompt", value.ty),
                )
                .label(
                    over.span,
                    "cannot reduce across groups while keeping `crit`",
                )
                .help("reduce the criteria first, e.g. `sum(x over crit)`"),
            );
            return None;
        }
        Some((
            Axes::Levels { from: own, to },
            value.ty.with_level(to.coarser()),
        ))
    }

    fn reduce(
        &mut self,
        env: &Env,
        func: &ast::Ident,
        op: ReduceOp,
        args: &[ast::Arg],
        over: Option<&ast::Over>,
        span: Span,
    ) -> Option<Expr> {
        let file = self.file_of(env);
        let params: &[&str] = match op {
            ReduceOp::Std | ReduceOp::Var => &["x", "ddof"],
            _ => &["x"],
        };
        let slots = self.match_args(file, func, params, 1, args, span)?;
        let Some(over) = over else {
            let value = self.expr(env, slots[0]?);
            let hint = value.as_ref().map(|v| suggest_axis(&v.ty)).unwrap_or("tok");
            self.error(
                Diagnostic::error(
                    "rlx::missing_over",
                    file,
                    format!("`{}` reduces over an axis, and none is named", func.name),
                )
                .label(span, "needs `over`")
                .help(format!("e.g. `{}(x over {hint})`", func.name)),
            );
            return None;
        };
        let pairwise = over.axes.iter().any(|a| a.name == "others");
        if pairwise && env.pairwise {
            self.error(
                Diagnostic::error(
                    "rlx::nested_pairwise",
                    file,
                    "pairwise reductions cannot nest",
                )
                .label(over.span, "already inside `over others`")
                .help("compute the inner pairwise term with `let` first"),
            );
            return None;
        }
        if pairwise && env.rollout {
            self.error(
                Diagnostic::error(
                    "rlx::rollout_input",
                    file,
                    "rollout settings cannot compare responses",
                )
                .label(over.span, "not available before sampling"),
            );
            return None;
        }
        let arg_env = Env {
            pairwise: pairwise || env.pairwise,
            ..env.clone()
        };
        let value = self.expr(&arg_env, slots[0]?)?;
        let ddof = match slots.get(1).copied().flatten() {
            None => 0,
            Some(expr) => match &expr.kind {
                ast::ExprKind::Number {
                    value,
                    is_int: true,
                    ..
                } if *value >= 0.0 && *value <= 1.0 => *value as u32,
                _ => {
                    self.error(
                        Diagnostic::error(
                            "rlx::bad_named_arg",
                            file,
                            "`ddof` must be the literal 0 or 1",
                        )
                        .label(expr.span, "expected 0 or 1"),
                    );
                    return None;
                }
            },
        };
        let (axes, ty) = self.axes(env, over, &value, &func.name)?;
        if axes == Axes::Others {
            if value.ty.level == Level::Tok {
                self.error(
                    Diagnostic::error(
                        "rlx::pairwise_level",
                        file,
                        format!("a pairwise term must be per response; this is {}", value.ty),
                    )
                    .label(value.span, format!("this is {}", value.ty))
                    .help("reduce the tokens first, e.g. `mean(x over tok)`"),
                );
                return None;
            }
            if value.ty.feature.is_some() {
                self.error(
                    Diagnostic::error(
                        "rlx::pairwise_level",
                        file,
                        format!(
                            "a pairwise term must be one number per pair; this is {}",
                            value.ty
                        ),
                    )
                    .label(value.span, format!("this is {}", value.ty))
                    .help("compare vectors with `cos(emb, other.emb)` or reduce the feature axis"),
                );
                return None;
            }
        }
        let elem = match op {
            ReduceOp::Sum
            | ReduceOp::Mean
            | ReduceOp::Std
            | ReduceOp::Var
            | ReduceOp::LogSumExp => {
                if value.ty.elem == Elem::I32 && op == ReduceOp::Sum {
                    Elem::I32
                } else {
                    Elem::F32
                }
            }
            ReduceOp::Max | ReduceOp::Min => {
                if !value.ty.is_numeric() {
                    self.type_error(&value, "a number", "use `any`/`all` for conditions");
                    return None;
                }
                value.ty.elem
            }
            ReduceOp::Count | ReduceOp::Any | ReduceOp::All => {
                if value.ty.elem != Elem::Bool {
                    self.type_error(
                        &value,
                        "bool",
                        "count/any/all take conditions, e.g. `count(x > 0 over tok)`",
                    );
                    return None;
                }
                if op == ReduceOp::Count {
                    Elem::I32
                } else {
                    Elem::Bool
                }
            }
        };
        let grad = value.grad && !matches!(op, ReduceOp::Count | ReduceOp::Any | ReduceOp::All);
        let ty = Ty { elem, ..ty };
        self.node(
            ExprKind::Reduce {
                op,
                axes,
                arg: Box::new(value),
                ddof,
            },
            ty,
            grad,
            span,
            file,
        )
    }

    fn axis_op(
        &mut self,
        env: &Env,
        func: &ast::Ident,
        args: &[ast::Arg],
        over: Option<&ast::Over>,
        span: Span,
    ) -> Option<Expr> {
        let file = self.file_of(env);
        let is_scan = func.name == "scan";
        let params: &[&str] = if is_scan {
            &["x", "decay", "reverse"]
        } else {
            &["x", "temperature"]
        };
        let slots = self.match_args(file, func, params, 1, args, span)?;
        let Some(over) = over else {
            self.error(
                Diagnostic::error(
                    "rlx::missing_over",
                    file,
                    format!("`{}` runs along an axis, and none is named", func.name),
                )
                .label(span, "needs `over`")
                .help(if is_scan {
                    "e.g. `scan(x over tok, decay = 0.99)`"
                } else {
                    "e.g. `softmax(x over crit)`"
                }),
            );
            return None;
        };
        let value = self.expr(env, slots[0]?)?;
        if !value.ty.is_numeric() {
            self.type_error(&value, "a number", "");
            return None;
        }
        let value_ty = value.ty.with_elem(Elem::F32);
        if is_scan {
            if over.axes.len() != 1 || over.axes[0].name != "tok" || value.ty.level != Level::Tok {
                self.error(
                    Diagnostic::error(
                        "rlx::scan_axis",
                        file,
                        "`scan` runs along the tokens of each response",
                    )
                    .label(over.span, "expected `over tok`")
                    .label(value.span, format!("this is {}", value.ty))
                    .help("`scan(x over tok, decay = γλ, reverse = true)` for returns and GAE"),
                );
                return None;
            }
            let decay = match slots[1] {
                Some(expr) => self.expr(env, expr)?,
                None => self.node(
                    ExprKind::Const(1.0),
                    Ty::scalar(Elem::F32),
                    false,
                    span,
                    file,
                )?,
            };
            if !decay.ty.is_numeric() || decay.ty.level == Level::Tok || decay.ty.feature.is_some()
            {
                self.type_error(
                    &decay,
                    "f32[resp] or coarser",
                    "the decay may differ per response, not per token",
                );
                return None;
            }
            let reverse = match slots[2] {
                None => false,
                Some(expr) => match &expr.kind {
                    ast::ExprKind::Bool(b) => *b,
                    _ => {
                        self.error(
                            Diagnostic::error(
                                "rlx::bad_named_arg",
                                file,
                                "`reverse` must be `true` or `false`",
                            )
                            .label(expr.span, "expected a literal"),
                        );
                        return None;
                    }
                },
            };
            let grad = value.grad || decay.grad;
            return self.node(
                ExprKind::Scan {
                    arg: Box::new(value),
                    decay: Box::new(decay),
                    reverse,
                },
                value_ty,
                grad,
                span,
                file,
            );
        }
        let (axes, _) = self.axes(env, over, &value, "softmax")?;
        let along_feature = matches!(axes, Axes::Feature(_));
        let along_resp = matches!(
            axes,
            Axes::Levels {
                from: Level::Resp,
                to: Level::Resp
            }
        );
        if !(along_feature || along_resp) {
            self.error(
                Diagnostic::error(
                    "rlx::softmax_axis",
                    file,
                    "`softmax` runs along a feature axis or `resp`",
                )
                .label(over.span, "unsupported axis")
                .help("e.g. `softmax(gate over crit, temperature = 0.5)`"),
            );
            return None;
        }
        let temperature = match slots[1] {
            Some(expr) => self.expr(env, expr)?,
            None => self.node(
                ExprKind::Const(1.0),
                Ty::scalar(Elem::F32),
                false,
                span,
                file,
            )?,
        };
        if !temperature.ty.is_numeric()
            || temperature.ty.level > Level::Group
            || temperature.ty.feature.is_some()
        {
            self.type_error(&temperature, "f32[group] or coarser", "");
            return None;
        }
        let grad = value.grad || temperature.grad;
        self.node(
            ExprKind::Softmax {
                axes,
                arg: Box::new(value),
                temperature: Box::new(temperature),
            },
            value_ty,
            grad,
            span,
            file,
        )
    }

    fn apply_rubric(
        &mut self,
        env: &Env,
        func: &ast::Ident,
        id: RubricId,
        args: &[ast::Arg],
        span: Span,
    ) -> Option<Expr> {
        let file = self.file_of(env);
        let slots = self.match_args(file, func, &["judgments"], 1, args, span)?;
        let value = self.expr(env, slots[0]?)?;
        let expected = Feature::Rubric(func.name.clone());
        if value.ty.feature.as_ref() != Some(&expected) {
            self.error(
                Diagnostic::error(
                    "rlx::type_mismatch",
                    file,
                    format!(
                        "rubric `{}` scores values with a `{}` axis; found {}",
                        func.name, func.name, value.ty
                    ),
                )
                .label(value.span, format!("this is {}", value.ty))
                .help(format!(
                    "declare the judgments as `input judged : f32[resp, {}]`",
                    func.name
                )),
            );
            return None;
        }
        self.score_rubric(env, id, value, span)
    }

    fn call_fn(
        &mut self,
        env: &Env,
        func: &ast::Ident,
        module: usize,
        item: usize,
        args: &[ast::Arg],
        span: Span,
    ) -> Option<Expr> {
        let file = self.file_of(env);
        let decl = self.fn_decl(module, item);
        if self.calls.iter().any(|frame| frame.key == (module, item)) {
            // Reported by the recursion pass.
            return None;
        }
        if self.calls.len() >= MAX_CALL_DEPTH {
            self.error(
                Diagnostic::error(
                    "rlx::too_deep",
                    file,
                    format!("calls nest more than {MAX_CALL_DEPTH} deep"),
                )
                .label(func.span, "nesting limit reached here"),
            );
            return None;
        }
        let names: Vec<&str> = decl.params.iter().map(|p| p.name.name.as_str()).collect();
        let required = decl
            .params
            .iter()
            .take_while(|p| p.default.is_none())
            .count();
        if let Some(diagnostic) = late_default(self.module_file(module), decl) {
            self.error(diagnostic);
            return None;
        }
        let slots = self.match_args(file, func, &names, required, args, span)?;
        // Arguments are checked in the caller's environment.
        let mut bindings = Vec::new();
        let mut callee_env = Env {
            module,
            locals: Vec::new(),
            pairwise: env.pairwise,
            rollout: env.rollout,
        };
        let mut failed = false;
        for (param, slot) in decl.params.iter().zip(slots) {
            let value = match slot {
                Some(arg) => self.expr(env, arg),
                None => {
                    let default = param
                        .default
                        .as_ref()
                        .expect("required parameters were matched");
                    self.with_frame(file, func, module, item, |checker| {
                        checker.expr(&callee_env, default)
                    })
                }
            };
            let Some(value) = value else {
                failed = true;
                continue;
            };
            if let Some(annotation) = &param.ty {
                let callee_file = self.module_file(module);
                let scope_rubrics = self.rubric_names();
                if let Some(expected) =
                    self.type_expr(callee_file, annotation, Some(&scope_rubrics))
                {
                    if !value.ty.fits(&expected) {
                        self.error(
                            Diagnostic::error(
                                "rlx::fn_arg_type",
                                value.file,
                                format!(
                                    "argument `{}` of `{}` must be {expected}, found {}",
                                    param.name.name, func.name, value.ty
                                ),
                            )
                            .label(value.span, format!("this is {}", value.ty))
                            .help(section_help(&value.ty, expected.level)),
                        );
                        failed = true;
                        continue;
                    }
                }
            }
            let id = self.fresh_local();
            callee_env.locals.push(LocalBinding {
                name: param.name.name.clone(),
                id,
                ty: value.ty.clone(),
                grad: value.grad,
            });
            bindings.push((id, value));
        }
        if failed {
            return None;
        }
        let body = self.with_frame(file, func, module, item, |checker| {
            checker.expr(&callee_env, &decl.body)
        })?;
        if let Some(ret) = &decl.ret {
            let callee_file = self.module_file(module);
            let scope_rubrics = self.rubric_names();
            if let Some(expected) = self.type_expr(callee_file, ret, Some(&scope_rubrics)) {
                if !body.ty.fits(&expected) {
                    self.with_frame(file, func, module, item, |checker| {
                        checker.error(
                            Diagnostic::error(
                                "rlx::fn_arg_type",
                                callee_file,
                                format!(
                                    "`{}` returns {}, but is declared to return {expected}",
                                    func.name, body.ty
                                ),
                            )
                            .label(body.span, format!("this is {}", body.ty))
                            .label(type_span(ret), "declared here"),
                        );
                    });
                    return None;
                }
            }
        }
        let (ty, grad) = (body.ty.clone(), body.grad);
        self.node(
            ExprKind::Let {
                bindings,
                body: Box::new(body),
                function: Some(func.name.clone()),
            },
            ty,
            grad,
            span,
            file,
        )
    }

    fn with_frame<T>(
        &mut self,
        file: FileId,
        func: &ast::Ident,
        module: usize,
        item: usize,
        body: impl FnOnce(&mut Self) -> T,
    ) -> T {
        self.calls.push(CallFrame {
            file,
            span: func.span,
            name: func.name.clone(),
            key: (module, item),
        });
        let result = body(self);
        self.calls.pop();
        result
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
    const LEVELS: [&str; 4] = ["tok", "resp", "group", "batch"];
    closest_name(name, LEVELS).or_else(|| LEVELS.into_iter().find(|level| name.starts_with(level)))
}

/// The axis a reduction of a value of this type most likely means.
fn suggest_axis(ty: &Ty) -> &'static str {
    match (ty.level, &ty.feature) {
        (_, Some(Feature::Crit)) => "crit",
        (_, Some(Feature::Dim)) => "dim",
        (Level::Tok, _) => "tok",
        (Level::Resp, _) => "resp",
        _ => "batch",
    }
}

fn reduction_help(ty: &Ty, op: &str) -> String {
    match (&ty.feature, ty.level) {
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
    }
}

/// How to turn a value of type `ty` into one at `target` (for section and argument errors).
fn section_help(ty: &Ty, target: Level) -> String {
    if let Some(feature) = &ty.feature {
        return match feature {
            Feature::Rubric(name) => format!("score the criteria with the rubric: `{name}(x)`"),
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
            _ => "reduce it to a coarser level".into(),
        };
    }
    "convert it to the expected kind".into()
}
