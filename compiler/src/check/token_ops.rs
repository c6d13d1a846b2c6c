//! Checking the token-axis operations `shift` and `distinct_ngrams`.

use super::hir::{Expr, ExprKind};
use super::types::{Elem, Level, Ty};
use super::{Checker, Env};
use crate::diagnostic::Diagnostic;
use crate::syntax::ast::{self, Span};

/// An integer literal, possibly negated.
fn integer_literal(expr: &ast::Expr) -> Option<i64> {
    match &expr.kind {
        ast::ExprKind::Number {
            value,
            is_int: true,
            ..
        } => Some(*value as i64),
        ast::ExprKind::Unary {
            op: ast::UnaryOp::Neg,
            operand,
        } => integer_literal(operand).map(|v| -v),
        ast::ExprKind::Paren(inner) => integer_literal(inner),
        _ => None,
    }
}

impl Checker<'_> {
    pub(super) fn token_op(
        &mut self,
        env: &Env,
        func: &ast::Ident,
        args: &[ast::Arg],
        over: Option<&ast::Over>,
        span: Span,
    ) -> Option<Expr> {
        let file = self.file_of(env);
        let is_shift = func.name == "shift";
        let params: &[&str] = if is_shift {
            &["x", "offset", "fill"]
        } else {
            &["ids", "n"]
        };
        let slots = self.match_args(file, func, params, 1, args, span)?;
        let over_tok = over.is_some_and(|o| o.axes.len() == 1 && o.axes[0].name == "tok");
        if !over_tok {
            let example = if is_shift {
                "e.g. `shift(values over tok, offset = 1)`"
            } else {
                "e.g. `distinct_ngrams(ids over tok, n = 4)`"
            };
            self.error(
                Diagnostic::error(
                    "rlx::token_axis",
                    file,
                    format!("`{}` runs along the tokens of each response", func.name),
                )
                .label(over.map_or(span, |o| o.span), "expected `over tok`")
                .help(example),
            );
            return None;
        }
        let value = self.expr(env, slots[0]?)?;
        if value.ty.level != Level::Tok || !value.ty.is_numeric() {
            self.type_error(&value, "a token-level number (f32[tok] or i32[tok])", "");
            return None;
        }
        let second = slots.get(1).copied().flatten();
        if is_shift {
            let offset = match second {
                None => 1,
                Some(expr) => match integer_literal(expr) {
                    Some(v) if v.abs() <= 1 << 20 => v as i32,
                    _ => {
                        self.error(
                            Diagnostic::error(
                                "rlx::bad_named_arg",
                                file,
                                "`offset` must be an integer literal",
                            )
                            .label(expr.span, "expected e.g. 1 or -1"),
                        );
                        return None;
                    }
                },
            };
            let fill = match slots.get(2).copied().flatten() {
                Some(expr) => self.expr(env, expr)?,
                None => self.node(
                    ExprKind::Const(0.0),
                    Ty::scalar(Elem::F32),
                    false,
                    span,
                    file,
                )?,
            };
            if !fill.ty.is_numeric() || fill.ty.level > Level::Resp || fill.ty.feature.is_some() {
                self.type_error(&fill, "a number per response or coarser", "");
                return None;
            }
            let ty = value.ty.with_elem(if value.ty.elem == fill.ty.elem {
                value.ty.elem
            } else {
                Elem::F32
            });
            let grad = value.grad;
            return self.node(
                ExprKind::Shift {
                    arg: Box::new(value),
                    offset,
                    fill: Box::new(fill),
                },
                ty,
                grad,
                span,
                file,
            );
        }
        let n = match second {
            None => 4,
            Some(expr) => match integer_literal(expr) {
                Some(v) if (1..=64).contains(&v) => v as u32,
                _ => {
                    self.error(
                        Diagnostic::error(
                            "rlx::bad_named_arg",
                            file,
                            "`n` must be an integer literal from 1 to 64",
                        )
                        .label(expr.span, "expected e.g. 4"),
                    );
                    return None;
                }
            },
        };
        self.node(
            ExprKind::DistinctNgrams {
                arg: Box::new(value),
                n,
            },
            Ty::new(Elem::F32, Level::Resp),
            false,
            span,
            file,
        )
    }
}
