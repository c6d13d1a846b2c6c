//! Names: each module's scope (items and imports), import checks, recursion between functions,
//! unknown names with suggestions.

use super::*;

impl<'p> Checker<'p> {
    pub(super) fn build_scope(&mut self, module: usize) -> HashMap<String, Definition> {
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
                ItemKind::State(decl) if is_root => {
                    let id = InputId(self.inputs.len() as u32);
                    let Some(input) = self.state_input(decl) else {
                        self.failed_names.insert((module, decl.name.name.clone()));
                        continue;
                    };
                    self.inputs.push(input);
                    (&decl.name, Def::Input(id))
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

    pub(super) fn define(
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

    pub(super) fn check_imports(&mut self, module: usize) {
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
    pub(super) fn check_recursion(&mut self) {
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

    pub(super) fn fn_decl(&self, module: usize, item: usize) -> &'p ast::FnDecl {
        match &self.program.modules[module].ast.items[item].kind {
            ItemKind::Fn(decl) => decl,
            _ => unreachable!("Def::Fn points at a function"),
        }
    }

    /// Names and calls inside every function body resolve (types are checked where a function is used).
    pub(super) fn check_fn_names(&mut self) {
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

    pub(super) fn names_in(&mut self, module: usize, expr: &ast::Expr, bound: &mut Vec<String>) {
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

    pub(super) fn unknown_name(&mut self, module: usize, name: &ast::Ident, locals: &[String]) {
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

    pub(super) fn unknown_function(&mut self, module: usize, func: &ast::Ident) {
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
}
