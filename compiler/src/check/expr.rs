//! Expressions: names, operators, indexing and the level/element-type rules that combine operands.

use super::*;

impl<'p> Checker<'p> {
    pub(super) fn file_of(&self, env: &Env) -> FileId {
        self.module_file(env.module)
    }

    pub(super) fn expr(&mut self, env: &Env, expr: &ast::Expr) -> Option<Expr> {
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

    pub(super) fn type_error(&mut self, expr: &Expr, expected: &str, help: &str) {
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

    pub(super) fn lookup(&self, env: &Env, name: &str) -> Option<Def> {
        self.scopes[env.module].get(name).map(|d| d.def)
    }

    pub(super) fn name(&mut self, env: &Env, name: &ast::Ident) -> Option<Expr> {
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

    pub(super) fn rollout_name(&mut self, name: &ast::Ident, what: &str) -> Option<Expr> {
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

    pub(super) fn global_ref(&mut self, env: &Env, item: usize, name: &ast::Ident) -> Option<Expr> {
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

    pub(super) fn other(&mut self, env: &Env, name: &ast::Ident, span: Span) -> Option<Expr> {
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
        if value.ty.level == Level::Pair {
            self.error(
                Diagnostic::error(
                    "rlx::pairwise_level",
                    file,
                    format!("`other.{}` reads a pair value", name.name),
                )
                .label(span, format!("this is {}", value.ty))
                .help(format!(
                    "a pair value already belongs to the pair (this response, the other): write `{}`",
                    name.name
                )),
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
    pub(super) fn combine(
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
        // `tok` and `pair` are siblings below `resp`: neither broadcasts to the other, and a pair
        // value has no feature axis (its pairwise term is one number per pair).
        if level == Level::Pair {
            let pair = parts.iter().find(|p| p.ty.level == Level::Pair).copied();
            let other = parts
                .iter()
                .find(|p| p.ty.level == Level::Tok || p.ty.feature.is_some())
                .copied();
            if let (Some(pair), Some(other)) = (pair, other) {
                let help = if other.ty.level == Level::Tok {
                    "a pair of responses has no tokens: reduce them first, e.g. `mean(x over tok)`"
                } else {
                    "a pair value is one number per pair: reduce the feature axis first"
                };
                self.error(
                    Diagnostic::error(
                        "rlx::level_mismatch",
                        file,
                        format!("cannot combine {} with {}", pair.ty, other.ty),
                    )
                    .label(pair.span, format!("this is {}", pair.ty))
                    .label(other.span, format!("this is {}", other.ty))
                    .help(help),
                );
                return None;
            }
        }
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
                            .help(if existing.matrix().is_some() || f.matrix().is_some() {
                                "a matrix combines with a vector through `dot`: `dot(x, m)` sums over its rows, `dot(m, x)` over its columns"
                            } else {
                                "their feature axes differ; reduce one of them first"
                            }),
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

    pub(super) fn binary(
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

    pub(super) fn index(
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
}
