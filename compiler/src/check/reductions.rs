//! Reductions and axis operations: `over` axes, sum/mean/… and group/scan operations.

use super::*;

impl<'p> Checker<'p> {
    /// Interpret `over …` for a value of type `ty`.
    pub(super) fn axes(
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
        let pair_named = levels.iter().find(|(l, _)| *l == Level::Pair);
        if own == Level::Pair || pair_named.is_some() {
            let mut d = Diagnostic::error(
                "rlx::pair_axis",
                file,
                if own == Level::Pair {
                    format!(
                        "{} varies over the other responses of its group; `over others` reduces that axis",
                        value.ty
                    )
                } else {
                    "`pair` is a level of values, not an axis to reduce".to_string()
                },
            )
            .label(over.span, "reduce a pair value over `others`")
            .label(value.span, format!("this is {}", value.ty));
            d = d.help(format!(
                "`{op_name}(x over others)` gives one value per response (over its pairs with the others); nest for coarser levels, e.g. `mean({op_name}(x over others) over batch)`"
            ));
            self.error(d);
            return None;
        }
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

    pub(super) fn reduce(
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
        // The body is a number, a vector or a matrix per response, never per token.
        if axes == Axes::Others && value.ty.level == Level::Tok {
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

    pub(super) fn axis_op(
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
            if !decay.ty.is_numeric() || decay.ty.level > Level::Resp || decay.ty.feature.is_some()
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
}
