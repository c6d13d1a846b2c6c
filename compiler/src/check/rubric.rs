//! Scoring a `rubric` block: `style(judged)` becomes an expression over the functions of `std/rubric`,
//! generated as source text from the declaration and checked like user code. The formulas therefore
//! live in the standard library only; this file only arranges them in the documented order (Rubicon
//! §2.3): the veto, decided from the judgments (a flag criterion ≥ 0.5, a critical criterion's score
//! < 0.5) before anything else counts; levels → saturation → aggregate (+ interactions) → clip to
//! [0, 1] and shaping (the `shape_*` functions clip) → the veto's value for a vetoed response.

use std::fmt::Write as _;

use super::hir::{Aggregate, Expr, ExprKind, Number, RubricId, Shape};
use super::types::Elem;
use super::{Checker, Env, LocalBinding};
use crate::diagnostic::Diagnostic;
use crate::syntax::ast::{self, Span};
use crate::syntax::parser::parse_expression;

/// A literal or the name of a local bound to a param.
fn number(value: &Number, bound: &mut Vec<(String, Number)>) -> String {
    match value {
        Number::Const(v) if *v < 0.0 => format!("({v:?})"),
        Number::Const(v) => format!("{v:?}"),
        Number::Param(id) => {
            let name = format!("__param{}", id.0);
            if !bound.iter().any(|(n, _)| *n == name) {
                bound.push((name.clone(), value.clone()));
            }
            name
        }
    }
}

fn shape_args(shape: &Shape, bound: &mut Vec<(String, Number)>) -> String {
    shape
        .args
        .iter()
        .map(|(_, value)| format!(", {}", number(value, bound)))
        .collect()
}

/// Every span of a generated expression, moved to the call that produced it.
fn respan(expr: &mut ast::Expr, span: Span) {
    expr.span = span;
    match &mut expr.kind {
        ast::ExprKind::Name(ident) | ast::ExprKind::Other(ident) => ident.span = span,
        ast::ExprKind::Unary { operand, .. } => respan(operand, span),
        ast::ExprKind::Binary { lhs, rhs, .. } => {
            respan(lhs, span);
            respan(rhs, span);
        }
        ast::ExprKind::Paren(inner) => respan(inner, span),
        ast::ExprKind::Call { func, args, .. } => {
            func.span = span;
            for arg in args {
                respan(&mut arg.value, span);
            }
        }
        ast::ExprKind::Index { base, criterion } => {
            criterion.span = span;
            respan(base, span);
        }
        ast::ExprKind::Block { lets, body } => {
            for local in lets {
                local.name.span = span;
                respan(&mut local.value, span);
            }
            respan(body, span);
        }
        ast::ExprKind::Number { .. } | ast::ExprKind::Bool(_) => {}
    }
}

impl Checker<'_> {
    /// The generated source of a rubric's score over the local `__judged`.
    fn rubric_source(&self, id: RubricId, bound: &mut Vec<(String, Number)>) -> String {
        let rubric = &self.rubrics[id.0 as usize];
        let mut out = String::from("{\n");
        let scored: Vec<usize> = (0..rubric.criteria.len())
            .filter(|&i| !rubric.criteria[i].veto)
            .collect();
        for &index in &scored {
            let criterion = &rubric.criteria[index];
            let mut value = format!("__judged[{}]", criterion.name);
            if !criterion.levels.is_empty() {
                // Level index → score, the index rounded and clamped into the list.
                let last = criterion.levels.len() - 1;
                let mut table = number(&Number::Const(criterion.levels[last]), bound);
                for level in (0..last).rev() {
                    table = format!(
                        "where({value} < {}, {}, {table})",
                        level as f64 + 0.5,
                        number(&Number::Const(criterion.levels[level]), bound)
                    );
                }
                value = table;
            }
            let _ = writeln!(out, "let __l{index} = {value}");
            let mut value = format!("__l{index}");
            if let Some(saturate) = &criterion.saturate {
                value = format!(
                    "sat_{}({value}{})",
                    saturate.name,
                    shape_args(saturate, bound)
                );
            }
            let _ = writeln!(out, "let __x{index} = {value}");
        }
        let weight_of = |index: usize, bound: &mut Vec<(String, Number)>| {
            let criterion = &rubric.criteria[index];
            match rubric.aggregate {
                Aggregate::Points => number(
                    criterion.points.as_ref().unwrap_or(&Number::Const(0.0)),
                    bound,
                ),
                _ => number(&criterion.weight, bound),
            }
        };
        let weighted: Vec<String> = scored
            .iter()
            .map(|&index| format!("{} * __x{index}", weight_of(index, bound)))
            .collect();
        let numerator = format!("({})", weighted.join(" + "));
        let aggregate = match rubric.aggregate {
            Aggregate::Sum => numerator,
            Aggregate::Mean => {
                let weights: Vec<String> = scored
                    .iter()
                    .map(|&index| weight_of(index, bound))
                    .collect();
                format!("normalize_total({numerator}, {})", weights.join(" + "))
            }
            Aggregate::Points => {
                let positive: Vec<String> = scored
                    .iter()
                    .map(|&index| format!("max({}, 0)", weight_of(index, bound)))
                    .collect();
                format!("normalize_total({numerator}, {})", positive.join(" + "))
            }
        };
        let mut score = aggregate;
        for interaction in &rubric.interactions {
            let gamma = number(&interaction.gamma, bound);
            let (a, b) = (interaction.first, interaction.second);
            let function = match interaction.mode {
                ast::InteractMode::Product => "interact_product",
                ast::InteractMode::Min => "interact_min",
            };
            score = format!("{score} + {function}(__x{a}, __x{b}, {gamma})");
        }
        let _ = writeln!(out, "let __score = {score}");
        let mut result = "__score".to_string();
        if let Some(shape) = &rubric.shape {
            result = format!("shape_{}({result}{})", shape.name, shape_args(shape, bound));
        }
        // A flag criterion vetoes when raised, a critical one when failed (its score, after levels).
        let vetoes: Vec<String> = rubric
            .criteria
            .iter()
            .enumerate()
            .filter_map(|(index, c)| {
                if c.veto {
                    Some(format!("__judged[{}] >= 0.5", c.name))
                } else if c.critical {
                    Some(format!("__l{index} < 0.5"))
                } else {
                    None
                }
            })
            .collect();
        if !vetoes.is_empty() {
            result = format!(
                "veto_{}({result}, {}{})",
                rubric.on_veto.name,
                vetoes.join(" or "),
                shape_args(&rubric.on_veto, bound)
            );
        }
        out.push_str(&result);
        out.push_str("\n}");
        out
    }

    /// `rubric(judged)`, as a `Let` over the std/rubric functions.
    pub(super) fn score_rubric(
        &mut self,
        env: &Env,
        id: RubricId,
        judged: Expr,
        span: Span,
    ) -> Option<Expr> {
        let file = self.file_of(env);
        let Some(module) = self.rubric_module else {
            self.error(
                Diagnostic::error("rlx::internal", file, "std/rubric is not loaded")
                    .label(span, "while scoring this rubric"),
            );
            return None;
        };
        // Boolean judgments count as 0/1, so every shape and interaction applies to them.
        let judged = if judged.ty.elem == Elem::Bool {
            let (ty, judged_span, judged_file) =
                (judged.ty.with_elem(Elem::F32), judged.span, judged.file);
            let scalar = super::types::Ty::scalar(Elem::F32);
            let one = self.node(ExprKind::Const(1.0), scalar.clone(), false, span, file)?;
            let zero = self.node(ExprKind::Const(0.0), scalar, false, span, file)?;
            self.node(
                ExprKind::Call {
                    func: super::builtins::Func::Where,
                    args: vec![judged, one, zero],
                },
                ty,
                false,
                judged_span,
                judged_file,
            )?
        } else {
            judged
        };
        let mut bound = Vec::new();
        let source = self.rubric_source(id, &mut bound);
        let rubric_file = self.module_file(module);
        let mut generated = match parse_expression(rubric_file, &source) {
            Ok(expr) => expr,
            Err(_) => {
                self.error(
                    Diagnostic::error(
                        "rlx::internal",
                        file,
                        "the generated rubric score does not parse",
                    )
                    .label(span, "while scoring this rubric"),
                );
                return None;
            }
        };
        respan(&mut generated, span);
        let judged_id = self.fresh_local();
        let mut locals = vec![LocalBinding {
            name: "__judged".into(),
            id: judged_id,
            ty: judged.ty.clone(),
            grad: judged.grad,
        }];
        let mut bindings = vec![(judged_id, judged)];
        for (name, value) in bound {
            let Number::Param(param) = value else {
                continue;
            };
            let local = self.fresh_local();
            let ty = super::types::Ty::scalar(self.params[param.0 as usize].elem);
            let expr = self.node(ExprKind::Param(param), ty.clone(), false, span, file)?;
            locals.push(LocalBinding {
                name,
                id: local,
                ty,
                grad: false,
            });
            bindings.push((local, expr));
        }
        let rubric_env = Env {
            module,
            locals,
            pairwise: env.pairwise,
            rollout: env.rollout,
        };
        let body = self.expr(&rubric_env, &generated)?;
        let (ty, grad) = (body.ty.with_elem(Elem::F32), body.grad);
        let name = self.rubrics[id.0 as usize].name.clone();
        self.node(
            ExprKind::Let {
                bindings,
                body: Box::new(body),
                function: Some(name),
            },
            ty,
            grad,
            span,
            file,
        )
    }
}
