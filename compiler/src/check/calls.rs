//! Calls: argument matching, built-in functions, rubric application and inlining of user functions.

use super::*;

impl<'p> Checker<'p> {
    /// Match positional and named arguments to parameters. `None` after reporting an error.
    pub(super) fn match_args<'a>(
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

    pub(super) fn call(
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
        if name == "components" {
            return self.components_op(env, func, args, over, span);
        }
        if name == "uniform" {
            return self.uniform_op(env, func, args, over, span);
        }
        if name == "rank" || name == "quantile" {
            return self.order_op(env, func, args, over, span);
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
        if matches!(sig.func, Func::Dot | Func::Outer) {
            return self.product_call(sig.func, checked, span, file);
        }
        self.builtin_call(sig.func, checked, span, file)
    }

    /// `dot(a, b)` and `outer(a, b)`: the products of vectors and matrices (docs/language.md,
    /// "Matrices"). Levels broadcast as in any element-wise call; the feature axes must fit.
    fn product_call(
        &mut self,
        func: Func,
        args: Vec<Expr>,
        span: Span,
        file: FileId,
    ) -> Option<Expr> {
        for arg in &args {
            if !arg.ty.is_numeric() {
                self.type_error(arg, "a number", "convert a condition with `where(c, 1, 0)`");
                return None;
            }
        }
        let name = if func == Func::Dot { "dot" } else { "outer" };
        let level = args
            .iter()
            .map(|a| a.ty.level)
            .max()
            .unwrap_or(Level::Batch);
        if level == Level::Tok {
            let token = args.iter().find(|a| a.ty.level == Level::Tok)?;
            self.error(
                Diagnostic::error(
                    "rlx::level_mismatch",
                    file,
                    format!("`{name}` takes vectors and matrices; {} has none", token.ty),
                )
                .label(token.span, format!("this is {}", token.ty))
                .help("a token-level value has no feature axis: reduce the tokens first, e.g. `mean(x over tok)`"),
            );
            return None;
        }
        let (a, b) = (&args[0], &args[1]);
        let axes_error = |checker: &mut Self, message: String, help: &str| {
            checker.error(
                Diagnostic::error("rlx::dot_axes", file, message)
                    .label(a.span, format!("this is {}", a.ty))
                    .label(b.span, format!("this is {}", b.ty))
                    .help(help.to_string()),
            );
        };
        let feature = match func {
            Func::Outer => match (&a.ty.feature, &b.ty.feature) {
                (Some(fa), Some(fb))
                    if fa.matrix().is_none()
                        && fb.matrix().is_none()
                        && *fa != Feature::Crit
                        && *fb != Feature::Crit =>
                {
                    Some(Feature::Matrix(Box::new(fa.clone()), Box::new(fb.clone())))
                }
                (Some(Feature::Crit), _) | (_, Some(Feature::Crit)) => {
                    axes_error(
                        self,
                        "a matrix needs axes of one length for the whole batch; `crit` differs per prompt".into(),
                        "declare the criteria as a rubric and use its name as the axis",
                    );
                    return None;
                }
                _ => {
                    axes_error(
                        self,
                        format!("`outer` takes two vectors; found {} and {}", a.ty, b.ty),
                        "e.g. `outer(x, y)` with `x : f32[resp, dim]`",
                    );
                    return None;
                }
            },
            _ => match (&a.ty.feature, &b.ty.feature) {
                (None, _) | (_, None) => {
                    axes_error(
                        self,
                        format!(
                            "`dot` contracts a feature axis; {} and {} do not both have one",
                            a.ty, b.ty
                        ),
                        "multiply element by element with `*`",
                    );
                    return None;
                }
                (Some(fa), Some(fb)) => match (fa.matrix(), fb.matrix()) {
                    (None, None) if fa == fb => None,
                    (None, Some((rows, cols))) if fa == rows => Some(cols.clone()),
                    (Some((rows, cols)), None) if cols == fb => Some(rows.clone()),
                    (Some(_), Some(_)) => {
                        axes_error(
                            self,
                            "`dot` of two matrices is not part of the language".into(),
                            "contract each with a vector: `dot(dot(x, a), b)`",
                        );
                        return None;
                    }
                    _ => {
                        axes_error(
                            self,
                            format!(
                                "`dot` contracts the axis the two share, and {} and {} do not fit",
                                a.ty, b.ty
                            ),
                            "vector·vector needs the same axis; vector·matrix the vector's axis as the matrix's rows (first axis); matrix·vector as its columns",
                        );
                        return None;
                    }
                },
            },
        };
        let grad = a.grad || b.grad;
        let ty = Ty {
            elem: Elem::F32,
            level,
            feature,
        };
        self.node(ExprKind::Call { func, args }, ty, grad, span, file)
    }

    pub(super) fn unexpected_over(&mut self, file: FileId, name: &str, over: &ast::Over) {
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

    pub(super) fn builtin_call(
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
            Func::Cos if args.len() == 2 => {
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
            _ => {
                // `clamp` and the primitives (their op table entry says the result and gradient).
                for arg in &args {
                    if !numeric(self, arg) {
                        return None;
                    }
                }
                let (keeps_int, gradient) = match func.primitive() {
                    Some(primitive) => (
                        primitive.result == crate::ops::Returns::KeepInt,
                        primitive.gradient,
                    ),
                    // `clamp` (max, then min): an i32 stays i32.
                    None => (true, true),
                };
                let elem = if keeps_int && args.iter().all(|a| a.ty.elem == Elem::I32) {
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
                    gradient && args.iter().any(|a| a.grad),
                )
            }
        };
        self.node(ExprKind::Call { func, args }, ty, grad, span, file)
    }

    pub(super) fn apply_rubric(
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

    pub(super) fn call_fn(
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

    pub(super) fn with_frame<T>(
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
