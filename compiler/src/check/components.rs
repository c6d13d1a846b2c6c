//! Checking `components(same over others)` (docs/language.md, "Pair inputs and classes").

use super::hir::{Expr, ExprKind};
use super::types::{Elem, Level, Ty};
use super::{Checker, Env};
use crate::diagnostic::Diagnostic;
use crate::syntax::ast::{self, Span};

impl Checker<'_> {
    /// The classes of the equivalence closure of a pairwise verdict: `i32[resp]`, each response's
    /// class named by its smallest member's 0-based position in the group; no gradient. The verdict is
    /// read inside `over others` (so `other.NAME` may build it), at the pair level or coarser.
    pub(super) fn components_op(
        &mut self,
        env: &Env,
        func: &ast::Ident,
        args: &[ast::Arg],
        over: Option<&ast::Over>,
        span: Span,
    ) -> Option<Expr> {
        let file = self.file_of(env);
        let slots = self.match_args(file, func, &["same"], 1, args, span)?;
        let example = "e.g. `components(same over others)`, or `components(score > 0.5 over others)` for a per-pair score";
        let over_others = over.is_some_and(|o| o.axes.len() == 1 && o.axes[0].name == "others");
        if !over_others {
            self.error(
                Diagnostic::error(
                    "rlx::components_axis",
                    file,
                    "`components` joins the responses of a group along their pairs, and names that axis `over others`",
                )
                .label(over.map_or(span, |o| o.span), "expected `over others`")
                .help(example),
            );
            return None;
        }
        if env.pairwise || env.rollout {
            let message = if env.pairwise {
                "`components` cannot be used inside `over others`"
            } else {
                "rollout settings cannot use `components`"
            };
            self.error(
                Diagnostic::error("rlx::components_axis", file, message)
                    .label(span, "compute it with `let` outside")
                    .help("e.g. `let class = components(same over others)`"),
            );
            return None;
        }
        let arg_env = Env {
            pairwise: true,
            ..env.clone()
        };
        let value = self.expr(&arg_env, slots[0]?)?;
        if value.ty.elem != Elem::Bool
            || value.ty.feature.is_some()
            || !value.ty.level.broadcasts_to(Level::Pair)
        {
            let help = if value.ty.level.broadcasts_to(Level::Pair)
                && value.ty.feature.is_none()
                && value.ty.is_numeric()
            {
                "a verdict is true or false: threshold a score, e.g. `components(score > 0.5 over others)`"
            } else {
                "one verdict per pair of responses: a `bool[pair]` input, or a comparison such as `cluster == other.cluster`"
            };
            self.type_error(&value, "a condition per pair (bool[pair] or coarser)", help);
            return None;
        }
        self.node(
            ExprKind::Components {
                arg: Box::new(value),
            },
            Ty::new(Elem::I32, Level::Resp),
            false,
            span,
            file,
        )
    }
}
