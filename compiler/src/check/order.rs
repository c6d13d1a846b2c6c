//! Checking the order statistics `rank` and `quantile` (docs/language.md, "Order statistics").

use super::hir::{Axes, Expr, ExprKind};
use super::types::{Elem, Ty};
use super::{Checker, Env};
use crate::diagnostic::Diagnostic;
use crate::syntax::ast::{self, Span};

impl Checker<'_> {
    /// `rank(x over AXES)` and `quantile(x over AXES, q = …)`: over level axes only, of a number without
    /// a feature axis; neither passes a gradient.
    pub(super) fn order_op(
        &mut self,
        env: &Env,
        func: &ast::Ident,
        args: &[ast::Arg],
        over: Option<&ast::Over>,
        span: Span,
    ) -> Option<Expr> {
        let file = self.file_of(env);
        let is_rank = func.name == "rank";
        let params: &[&str] = if is_rank {
            &["x", "mask"]
        } else {
            &["x", "q", "mask"]
        };
        let example = if is_rank {
            "e.g. `rank(score over tok, batch) < k` marks the k largest tokens of the batch"
        } else {
            "e.g. `quantile(entropy over tok, batch, q = 0.8)`"
        };
        let slots = self.match_args(file, func, params, 1, args, span)?;
        let Some(over) = over else {
            self.error(
                Diagnostic::error(
                    "rlx::missing_over",
                    file,
                    format!(
                        "`{}` orders the elements of an axis, and none is named",
                        func.name
                    ),
                )
                .label(span, "needs `over`")
                .help(example),
            );
            return None;
        };
        if env.pairwise || env.rollout {
            let (message, label) = if env.pairwise {
                (
                    format!("`{}` cannot be used inside `over others`", func.name),
                    "inside a pairwise term",
                )
            } else {
                (
                    format!("rollout settings cannot use `{}`", func.name),
                    "not available before sampling",
                )
            };
            let help = if env.pairwise {
                "compute it with `let` outside the pairwise term"
            } else {
                "rollout settings are evaluated before sampling, without inputs"
            };
            self.error(
                Diagnostic::error("rlx::order_axes", file, message)
                    .label(span, label)
                    .help(help),
            );
            return None;
        }
        let value = self.expr(env, slots[0]?)?;
        if !value.ty.is_numeric() {
            self.type_error(&value, "a number", "");
            return None;
        }
        let (axes, reduced) = self.axes(env, over, &value, &func.name)?;
        if !matches!(axes, Axes::Levels { .. }) || value.ty.feature.is_some() {
            self.error(
                Diagnostic::error(
                    "rlx::order_axes",
                    file,
                    format!(
                        "`{}` orders the elements of levels (tok, resp, group, batch), of a value without a feature axis",
                        func.name
                    ),
                )
                .label(over.span, "unsupported axes")
                .label(value.span, format!("this is {}", value.ty))
                .help(example),
            );
            return None;
        }
        let mask_slot = slots.get(if is_rank { 1 } else { 2 }).copied().flatten();
        let mask = match mask_slot {
            None => None,
            Some(expr) => {
                let mask = self.expr(env, expr)?;
                if mask.ty.elem != Elem::Bool
                    || mask.ty.feature.is_some()
                    || mask.ty.level > value.ty.level
                {
                    self.type_error(
                        &mask,
                        &format!(
                            "a condition at {} or coarser",
                            value.ty.with_elem(Elem::Bool)
                        ),
                        "`mask` says which elements are ordered, e.g. `mask = m != 0`",
                    );
                    return None;
                }
                Some(Box::new(mask))
            }
        };
        if is_rank {
            let ty = value.ty.with_elem(Elem::I32);
            return self.node(
                ExprKind::Rank {
                    axes,
                    arg: Box::new(value),
                    mask,
                },
                ty,
                false,
                span,
                file,
            );
        }
        let q = match slots[1] {
            Some(expr) => self.expr(env, expr)?,
            None => self.node(
                ExprKind::Const(0.5),
                Ty::scalar(Elem::F32),
                false,
                span,
                file,
            )?,
        };
        if !q.ty.is_numeric() || q.ty.feature.is_some() || q.ty.level > reduced.level {
            self.type_error(
                &q,
                &format!(
                    "a number at {} or coarser",
                    Ty::new(Elem::F32, reduced.level)
                ),
                "`q` is one fraction per quantile, e.g. a param",
            );
            return None;
        }
        self.node(
            ExprKind::Quantile {
                axes,
                arg: Box::new(value),
                q: Box::new(q),
                mask,
            },
            reduced.with_elem(Elem::F32),
            false,
            span,
            file,
        )
    }
}
