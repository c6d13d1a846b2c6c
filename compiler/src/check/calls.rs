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
        self.builtin_call(sig.func, checked, span, file)
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
