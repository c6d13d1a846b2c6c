//! Checking `uniform(seed over LEVEL)` (docs/language.md, "Pseudo-random numbers").

use super::hir::{Expr, ExprKind};
use super::types::{Elem, Level, Ty};
use super::{Checker, Env};
use crate::diagnostic::Diagnostic;
use crate::syntax::ast::{self, Span};

impl Checker<'_> {
    /// One pseudo-random number per element of the named level, keyed by a batch-level seed; no
    /// gradient.
    pub(super) fn uniform_op(
        &mut self,
        env: &Env,
        func: &ast::Ident,
        args: &[ast::Arg],
        over: Option<&ast::Over>,
        span: Span,
    ) -> Option<Expr> {
        let file = self.file_of(env);
        let slots = self.match_args(file, func, &["seed"], 1, args, span)?;
        let level = over.and_then(|o| match o.axes.as_slice() {
            [axis] => Level::from_name(&axis.name).filter(|l| *l != Level::Pair),
            _ => None,
        });
        let Some(level) = level else {
            self.error(
                Diagnostic::error(
                    "rlx::random_level",
                    file,
                    "`uniform` draws one number per element of a level, and names it with `over`",
                )
                .label(
                    over.map_or(span, |o| o.span),
                    "expected `over tok`, `resp`, `group` or `batch`",
                )
                .help("e.g. `uniform(seed + step over tok)`"),
            );
            return None;
        };
        if env.pairwise || env.rollout {
            self.error(
                Diagnostic::error(
                    "rlx::random_level",
                    file,
                    "`uniform` cannot be used inside `over others` or a rollout setting",
                )
                .label(span, "draw it with `let` outside")
                .help("e.g. `let u = uniform(seed over resp)`"),
            );
            return None;
        }
        let seed = self.expr(env, slots[0]?)?;
        if !seed.ty.is_numeric() || seed.ty.level != Level::Batch || seed.ty.feature.is_some() {
            self.type_error(
                &seed,
                "one number for the batch (a param, `step`, …)",
                "the seed keys the whole batch's draws, e.g. `uniform(seed + step over tok)`",
            );
            return None;
        }
        self.node(
            ExprKind::Uniform {
                seed: Box::new(seed),
            },
            Ty::new(Elem::F32, level),
            false,
            span,
            file,
        )
    }
}
