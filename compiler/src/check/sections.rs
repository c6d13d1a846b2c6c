//! Recipe sections: globals (`let`), reward/advantage/loss/metric/keep sections, the rollout block.

use super::*;

impl<'p> Checker<'p> {
    /// Type a `let`, `reward` or `advantage` of the recipe (once; on demand from its users).
    pub(super) fn global(&mut self, item: usize) -> Option<GlobalId> {
        match self
            .global_state
            .get(&item)
            .cloned()
            .unwrap_or(GlobalState::Unchecked)
        {
            GlobalState::Done(id) => return id,
            GlobalState::InProgress => return None,
            GlobalState::Unchecked => {}
        }
        self.global_state.insert(item, GlobalState::InProgress);
        let root = &self.program.modules[Program::ROOT].ast;
        let env = Env {
            module: Program::ROOT,
            locals: Vec::new(),
            pairwise: false,
            rollout: false,
        };
        // Calls from a function body into a global (impossible: modules have no globals) aside, a
        // global is always checked outside any call frame.
        let saved_calls = std::mem::take(&mut self.calls);
        let (name, kind, expr) = match &root.items[item].kind {
            ItemKind::Let(decl) => (
                decl.name.name.clone(),
                GlobalKind::Let,
                self.expr(&env, &decl.value),
            ),
            ItemKind::Reward(expr) => {
                let checked = self.expr(&env, expr);
                let typed = checked.and_then(|e| self.response_section("reward", e));
                ("reward".to_string(), GlobalKind::Reward, typed)
            }
            ItemKind::Advantage(expr) => {
                let checked = self.expr(&env, expr);
                let typed = checked.and_then(|e| self.response_section("advantage", e));
                ("advantage".to_string(), GlobalKind::Advantage, typed)
            }
            _ => unreachable!("globals are lets and sections"),
        };
        self.calls = saved_calls;
        let id = expr.map(|expr| {
            let id = GlobalId(self.globals.len() as u32);
            self.globals.push(hir::Global { name, kind, expr });
            id
        });
        self.global_state.insert(item, GlobalState::Done(id));
        id
    }

    /// `reward` and `advantage` are f32[resp]; coarser values broadcast, bool and i32 convert.
    pub(super) fn response_section(&mut self, section: &str, expr: Expr) -> Option<Expr> {
        let target = Ty::new(Elem::F32, Level::Resp);
        if expr.ty.fits(&target) {
            if expr.ty == target {
                return Some(expr);
            }
            let (span, file, grad) = (expr.span, expr.file, expr.grad);
            return self.node(
                ExprKind::Broadcast(Box::new(expr)),
                target,
                grad,
                span,
                file,
            );
        }
        let help = section_help(&expr.ty, Level::Resp);
        self.error(
            Diagnostic::error(
                "rlx::section_type",
                expr.file,
                format!("`{section}` must be f32[resp], found {}", expr.ty),
            )
            .label(expr.span, format!("this is {}", expr.ty))
            .help(help),
        );
        None
    }

    pub(super) fn loss(&mut self, expr: &ast::Expr) -> Option<Expr> {
        let env = self.root_env();
        let checked = self.expr(&env, expr)?;
        if checked.ty.level != Level::Batch
            || checked.ty.feature.is_some()
            || !checked.ty.is_numeric()
        {
            self.error(
                Diagnostic::error(
                    "rlx::section_type",
                    self.root_file,
                    format!("`loss` must be a scalar f32, found {}", checked.ty),
                )
                .label(checked.span, format!("this is {}", checked.ty))
                .help(section_help(&checked.ty, Level::Batch)),
            );
            return None;
        }
        if !checked.grad {
            let policy = self
                .inputs
                .iter()
                .find(|i| i.role == Some(InputRole::Policy))
                .map(|i| i.name.clone());
            let help = match policy {
                Some(name) => format!(
                    "the loss does not depend on `{name}` through differentiable operations (is it inside `stopgrad`?)"
                ),
                None => {
                    let candidate = self
                        .inputs
                        .iter()
                        .find(|i| i.ty.elem == Elem::F32 && i.ty.level == Level::Tok)
                        .map(|i| i.name.clone())
                        .unwrap_or_else(|| "logp".to_string());
                    format!("mark the policy's log-probabilities: `input {candidate} : f32[tok] policy`")
                }
            };
            self.error(
                Diagnostic::error(
                    "rlx::not_differentiable",
                    self.root_file,
                    "the loss does not depend on a `policy` input",
                )
                .label(checked.span, "no gradient flows from here to the policy")
                .help(help),
            );
            return None;
        }
        Some(checked)
    }

    pub(super) fn root_env(&self) -> Env {
        Env {
            module: Program::ROOT,
            locals: Vec::new(),
            pairwise: false,
            rollout: false,
        }
    }

    pub(super) fn metric(&mut self, expr: &ast::Expr) -> Option<Expr> {
        let env = self.root_env();
        let checked = self.expr(&env, expr)?;
        if checked.ty.level != Level::Batch || checked.ty.feature.is_some() {
            self.error(
                Diagnostic::error(
                    "rlx::section_type",
                    self.root_file,
                    format!("a metric must be a scalar, found {}", checked.ty),
                )
                .label(checked.span, format!("this is {}", checked.ty))
                .help(section_help(&checked.ty, Level::Batch)),
            );
            return None;
        }
        Some(checked)
    }

    pub(super) fn keep(
        &mut self,
        level: KeepLevel,
        level_span: Span,
        expr: &ast::Expr,
    ) -> Option<Expr> {
        let env = self.root_env();
        let checked = self.expr(&env, expr)?;
        let target_level = level.level();
        if checked.ty.elem != Elem::Bool
            || checked.ty.level > target_level
            || checked.ty.feature.is_some()
        {
            let mut d = Diagnostic::error(
                "rlx::section_type",
                self.root_file,
                format!(
                    "`keep {}` needs a bool[{}] condition, found {}",
                    target_level.name(),
                    target_level.name(),
                    checked.ty
                ),
            )
            .label(checked.span, format!("this is {}", checked.ty))
            .label(level_span, "filters at this level");
            d = d.help(if checked.ty.elem != Elem::Bool {
                "compare it, e.g. `std(reward over resp) > 0`".to_string()
            } else {
                section_help(&checked.ty, target_level)
            });
            self.error(d);
            return None;
        }
        if let Some(advantage) = self.advantage_item.and_then(|item| self.global_id(item)) {
            if self.uses_global(&checked, advantage) {
                self.error(
                    Diagnostic::error(
                        "rlx::keep_after_advantage",
                        self.root_file,
                        "a `keep` filter cannot depend on the advantage",
                    )
                    .label(checked.span, "uses `advantage`")
                    .help(
                        "filters run before advantages are computed; filter on the reward instead",
                    ),
                );
                return None;
            }
        }
        Some(checked)
    }

    pub(super) fn uses_global(&self, expr: &Expr, target: GlobalId) -> bool {
        let mut stack = vec![expr];
        while let Some(e) = stack.pop() {
            if let ExprKind::Global(id) = e.kind {
                if id == target {
                    return true;
                }
                stack.push(&self.globals[id.0 as usize].expr);
            }
            stack.extend(e.children());
        }
        false
    }

    pub(super) fn rollout(&mut self, entries: &[ast::RolloutEntry]) -> Vec<hir::RolloutSetting> {
        // (key, element type, finest level, takes strings)
        const KEYS: &[(&str, Elem, Level, bool)] = &[
            ("n", Elem::I32, Level::Batch, false),
            ("temperature", Elem::F32, Level::Batch, false),
            ("top_p", Elem::F32, Level::Batch, false),
            ("top_k", Elem::I32, Level::Batch, false),
            ("max_new_tokens", Elem::I32, Level::Batch, false),
            ("scaffold", Elem::F32, Level::Resp, false),
            ("stop", Elem::F32, Level::Batch, true),
            ("modes", Elem::F32, Level::Batch, true),
        ];
        let file = self.root_file;
        let mut settings: Vec<hir::RolloutSetting> = Vec::new();
        let mut seen: HashMap<String, Span> = HashMap::new();
        for entry in entries {
            let Some(&(key, elem, level, strings)) =
                KEYS.iter().find(|(k, ..)| *k == entry.key.name)
            else {
                let mut d = Diagnostic::error(
                    "rlx::rollout_key",
                    file,
                    format!("unknown rollout setting `{}`", entry.key.name),
                )
                .label(entry.key.span, "not a rollout setting");
                d = match closest_name(&entry.key.name, KEYS.iter().map(|(k, ..)| *k)) {
                    Some(close) => d.help(format!("did you mean `{close}`?")),
                    None => d.help(format!(
                        "settings: {}",
                        KEYS.iter().map(|(k, ..)| *k).collect::<Vec<_>>().join(", ")
                    )),
                };
                self.error(d);
                continue;
            };
            if let Some(first) = seen.insert(key.to_string(), entry.key.span) {
                self.error(
                    Diagnostic::error(
                        "rlx::duplicate",
                        file,
                        format!("rollout setting `{key}` is given twice"),
                    )
                    .label(entry.key.span, "given again here")
                    .label(first, "first given here"),
                );
                continue;
            }
            let value = match (&entry.value, strings) {
                (ast::RolloutValue::Strings(list), true) => {
                    hir::RolloutValue::Strings(list.iter().map(|(s, _)| s.clone()).collect())
                }
                (ast::RolloutValue::Expr(expr), false) => {
                    let env = Env {
                        rollout: true,
                        ..self.root_env()
                    };
                    let Some(checked) = self.expr(&env, expr) else {
                        continue;
                    };
                    let target = Ty::new(elem, level);
                    if !checked.ty.fits(&target)
                        || (elem == Elem::I32 && checked.ty.elem == Elem::F32)
                    {
                        self.error(
                            Diagnostic::error(
                                "rlx::type_mismatch",
                                file,
                                format!(
                                    "rollout setting `{key}` must be {target}, found {}",
                                    checked.ty
                                ),
                            )
                            .label(checked.span, format!("this is {}", checked.ty)),
                        );
                        continue;
                    }
                    hir::RolloutValue::Expr(checked)
                }
                (value, _) => {
                    let span = match value {
                        ast::RolloutValue::Expr(e) => e.span,
                        ast::RolloutValue::Strings(list) => {
                            list.first().map(|(_, s)| *s).unwrap_or(entry.span)
                        }
                    };
                    self.error(
                        Diagnostic::error(
                            "rlx::type_mismatch",
                            file,
                            if strings {
                                format!("rollout setting `{key}` takes a list of strings")
                            } else {
                                format!("rollout setting `{key}` takes a number")
                            },
                        )
                        .label(span, "wrong kind of value"),
                    );
                    continue;
                }
            };
            settings.push(hir::RolloutSetting {
                key: key.to_string(),
                value,
            });
        }
        settings
    }

    // -----------------------------------------------------------------------------------------
    // Expressions
}
