//! Declarations: type expressions, inputs, params, rubrics and their shapes.

use super::*;

impl<'p> Checker<'p> {
    pub(super) fn type_expr(
        &mut self,
        file: FileId,
        ty: &ast::TypeExpr,
        rubrics: Option<&HashMap<String, Definition>>,
    ) -> Option<Ty> {
        let mut axes = ty.axes.iter();
        let level = match axes.next() {
            None => Level::Batch,
            Some(axis) => match Level::from_name(&axis.name) {
                Some(level) => level,
                None => {
                    let mut d = Diagnostic::error(
                        "rlx::unknown_axis",
                        file,
                        format!("`{}` is not a level", axis.name),
                    )
                    .label(
                        axis.span,
                        "expected `tok`, `pair`, `resp`, `group` or `batch`",
                    );
                    if let Some(close) = closest_level(&axis.name) {
                        d = d.help(format!("did you mean `{close}`?"));
                    } else {
                        d = d.help("the level comes first, then an optional feature axis: `f32[resp, crit]`");
                    }
                    self.error(d);
                    return None;
                }
            },
        };
        let mut features: Vec<(Feature, Span)> = Vec::new();
        for axis in axes.by_ref().take(2) {
            let feature = match axis.name.as_str() {
                "crit" => Feature::Crit,
                "dim" => Feature::Dim,
                name => match rubrics.and_then(|scope| scope.get(name)) {
                    Some(Definition {
                        def: Def::Rubric(_),
                        ..
                    }) => Feature::Rubric(name.to_string()),
                    _ => {
                        let mut d = Diagnostic::error(
                            "rlx::unknown_axis",
                            file,
                            format!("`{name}` is not a feature axis"),
                        )
                        .label(axis.span, "expected `crit`, `dim` or a rubric name");
                        if let Some(close) = closest_name(name, ["crit", "dim"]) {
                            d = d.help(format!("did you mean `{close}`?"));
                        }
                        self.error(d);
                        return None;
                    }
                },
            };
            features.push((feature, axis.span));
        }
        if let Some(extra) = axes.next() {
            self.error(
                Diagnostic::error(
                    "rlx::type_axes",
                    file,
                    "a type has one level and at most two feature axes (a matrix)",
                )
                .label(
                    extra
                        .span
                        .to(ty.axes.last().map(|a| a.span).unwrap_or(extra.span)),
                    "extra axes",
                )
                .help("a value is a number, a vector `f32[resp, dim]` or a matrix `f32[resp, dim, dim]` per element of its level"),
            );
            return None;
        }
        if !features.is_empty() && level == Level::Tok {
            self.error(
                Diagnostic::error(
                    "rlx::feature_at_token_level",
                    file,
                    "a token-level value cannot carry a feature axis",
                )
                .label(ty.span, "feature axes attach at `group` or `resp`")
                .help("declare it per response, e.g. `f32[resp, crit]`"),
            );
            return None;
        }
        if !features.is_empty() && level == Level::Pair {
            self.error(
                Diagnostic::error(
                    "rlx::feature_at_pair_level",
                    file,
                    "a pair-level value cannot carry a feature axis",
                )
                .label(ty.span, "one number per ordered pair of responses")
                .help("declare one input per feature, e.g. `bool[pair]`"),
            );
            return None;
        }
        if features.len() == 2 {
            if let Some((_, span)) = features.iter().find(|(f, _)| *f == Feature::Crit) {
                self.error(
                    Diagnostic::error(
                        "rlx::matrix_axis",
                        file,
                        "a matrix needs axes of one length for the whole batch; `crit` differs per prompt",
                    )
                    .label(*span, "ragged axis")
                    .help("declare the criteria as a rubric (`rubric NAME { criterion … }`) and use its name as the axis, or use `dim`"),
                );
                return None;
            }
        }
        if level == Level::Batch && features.first().is_some_and(|(f, _)| *f == Feature::Crit) {
            self.error(
                Diagnostic::error(
                    "rlx::ragged_feature",
                    file,
                    "`crit` lists differ per prompt",
                )
                .label(ty.span, "a batch-level value cannot have a `crit` axis")
                .help("use `group` for per-prompt criteria: `f32[group, crit]`"),
            );
            return None;
        }
        let mut features = features.into_iter().map(|(f, _)| f);
        let feature = match (features.next(), features.next()) {
            (None, _) => None,
            (Some(one), None) => Some(one),
            (Some(rows), Some(cols)) => Some(Feature::Matrix(Box::new(rows), Box::new(cols))),
        };
        Some(Ty {
            elem: ty.elem,
            level,
            feature,
        })
    }

    pub(super) fn input(&mut self, decl: &ast::InputDecl) -> Option<hir::Input> {
        let file = self.root_file;
        let rubric_scope = self.rubric_names();
        let ty = self.type_expr(file, &decl.ty, Some(&rubric_scope))?;
        if decl.role.is_some() && ty.elem != Elem::F32 {
            self.error(
                Diagnostic::error(
                    "rlx::policy_type",
                    file,
                    format!("a differentiable input must be f32, not {}", ty.elem.name()),
                )
                .label(type_span(&decl.ty), "not f32"),
            );
            return None;
        }
        if decl.role.is_some() && ty.level == Level::Pair {
            self.error(
                Diagnostic::error(
                    "rlx::policy_type",
                    file,
                    "a pair input is data (a classifier's verdicts), not a model output",
                )
                .label(type_span(&decl.ty), "per pair of responses")
                .help("differentiable inputs are per token or per response; drop `policy`/`value`"),
            );
            return None;
        }
        let default = match &decl.default {
            None => None,
            Some(literal) => {
                let elem = elem_of(&literal.value);
                if !Ty::scalar(elem).fits(&Ty::scalar(ty.elem)) {
                    self.error(
                        Diagnostic::error(
                            "rlx::type_mismatch",
                            file,
                            format!("default {} for an input of type {ty}", elem.name()),
                        )
                        .label(literal.span, format!("expected {}", ty.elem.name())),
                    );
                    return None;
                }
                Some(literal_number(&literal.value))
            }
        };
        Some(hir::Input {
            name: decl.name.name.clone(),
            ty,
            role: decl.role,
            default,
            span: decl.name.span,
        })
    }

    /// Rubric names of the recipe (inputs may name them as feature axes before the scope exists).
    pub(super) fn rubric_names(&self) -> HashMap<String, Definition> {
        self.program.modules[Program::ROOT]
            .ast
            .items
            .iter()
            .filter_map(|item| match &item.kind {
                ItemKind::Rubric(decl) => Some((
                    decl.name.name.clone(),
                    Definition {
                        def: Def::Rubric(RubricId(0)),
                        span: decl.name.span,
                    },
                )),
                _ => None,
            })
            .collect()
    }

    pub(super) fn param(&mut self, decl: &ast::ParamDecl) -> Option<hir::Param> {
        let file = self.root_file;
        let literal_elem = elem_of(&decl.value.value);
        let elem = match decl.ty {
            Some((elem, span)) => {
                let fits = match (elem, &decl.value.value) {
                    (ElemType::Bool, LiteralValue::Bool(_)) => true,
                    (ElemType::I32, LiteralValue::Number { is_int, .. }) => *is_int,
                    (ElemType::F32, LiteralValue::Number { .. }) => true,
                    _ => false,
                };
                if !fits {
                    self.error(
                        Diagnostic::error(
                            "rlx::param_type",
                            file,
                            format!(
                                "param `{}` is declared {} but its value is not",
                                decl.name.name,
                                elem.name()
                            ),
                        )
                        .label(decl.value.span, format!("not a {} literal", elem.name()))
                        .label(span, "declared here"),
                    );
                    return None;
                }
                elem
            }
            // Untyped numeric params are f32 (so `param beta = 0` is not an integer by accident).
            None if literal_elem == Elem::Bool => Elem::Bool,
            None => Elem::F32,
        };
        Some(hir::Param {
            name: decl.name.name.clone(),
            elem,
            value: literal_number(&decl.value.value),
            span: decl.name.span,
        })
    }

    pub(super) fn rubric_number(
        &mut self,
        value: &ast::RubricValue,
        scope: &HashMap<String, Definition>,
    ) -> Option<hir::Number> {
        match value {
            ast::RubricValue::Number(literal) => {
                Some(hir::Number::Const(literal_number(&literal.value)))
            }
            ast::RubricValue::Param(name) => match scope.get(&name.name) {
                Some(Definition {
                    def: Def::Param(id),
                    ..
                }) => Some(hir::Number::Param(*id)),
                _ => {
                    self.error(
                        Diagnostic::error(
                            "rlx::rubric",
                            self.root_file,
                            format!("`{}` is not a `param`", name.name),
                        )
                        .label(name.span, "rubric attributes take numbers or params")
                        .help(format!("declare it: `param {} = …`", name.name)),
                    );
                    None
                }
            },
        }
    }

    pub(super) fn shape(
        &mut self,
        call: &ast::ShapeCall,
        allowed: &[(&str, &[&str])],
        what: &str,
        scope: &HashMap<String, Definition>,
    ) -> Option<hir::Shape> {
        let file = self.root_file;
        let Some((_, params)) = allowed.iter().find(|(name, _)| *name == call.name.name) else {
            let names: Vec<&str> = allowed.iter().map(|(n, _)| *n).collect();
            let mut d = Diagnostic::error(
                "rlx::rubric",
                file,
                format!("unknown {what} `{}`", call.name.name),
            )
            .label(
                call.name.span,
                format!("expected one of {}", names.join(", ")),
            );
            if let Some(close) = closest_name(&call.name.name, names.iter().copied()) {
                d = d.help(format!("did you mean `{close}`?"));
            }
            self.error(d);
            return None;
        };
        let mut args = Vec::new();
        for (key, value) in &call.args {
            if !params.contains(&key.name.as_str()) {
                self.error(
                    Diagnostic::error(
                        "rlx::bad_named_arg",
                        file,
                        format!("`{}` takes no argument `{}`", call.name.name, key.name),
                    )
                    .label(key.span, format!("expected {}", params.join(", ")))
                    .help(format!(
                        "write `{}({} = …)`",
                        call.name.name,
                        params.join(" = …, ")
                    )),
                );
                return None;
            }
            args.push((key.name.clone(), self.rubric_number(value, scope)?));
        }
        for param in *params {
            if !args.iter().any(|(k, _)| k == param) {
                self.error(
                    Diagnostic::error(
                        "rlx::arity",
                        file,
                        format!("`{}` needs its argument `{param}`", call.name.name),
                    )
                    .label(
                        if call.parens {
                            call.span
                        } else {
                            call.name.span
                        },
                        format!("missing `{param} = …`"),
                    ),
                );
                return None;
            }
        }
        Some(hir::Shape {
            name: call.name.name.clone(),
            args,
        })
    }

    pub(super) fn rubric(
        &mut self,
        decl: &ast::RubricDecl,
        scope: &HashMap<String, Definition>,
    ) -> hir::Rubric {
        const SATURATIONS: &[(&str, &[&str])] =
            &[("cap", &["kappa"]), ("tanh", &["k"]), ("exp", &["k"])];
        const VETOES: &[(&str, &[&str])] = &[
            ("zero", &[]),
            ("penalty", &["value"]),
            ("scale", &["factor"]),
        ];
        const SHAPES: &[(&str, &[&str])] = &[
            ("power", &["gamma"]),
            ("exp", &["beta"]),
            ("piecewise", &["threshold", "slope"]),
        ];
        let file = self.root_file;
        let mut rubric = hir::Rubric {
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
        };
        let mut criterion_spans: Vec<Span> = Vec::new();
        let mut aggregate: Option<(hir::Aggregate, Span)> = None;
        for entry in &decl.entries {
            let ast::RubricEntry::Criterion(criterion) = entry else {
                continue;
            };
            if let Some(index) = rubric
                .criteria
                .iter()
                .position(|c| c.name == criterion.name.name)
            {
                self.error(
                    Diagnostic::error(
                        "rlx::duplicate",
                        file,
                        format!("criterion `{}` is listed twice", criterion.name.name),
                    )
                    .label(criterion.name.span, "listed again here")
                    .label(criterion_spans[index], "first listed here"),
                );
                continue;
            }
            let mut checked = hir::Criterion {
                name: criterion.name.name.clone(),
                weight: hir::Number::Const(1.0),
                points: None,
                levels: Vec::new(),
                veto: false,
                critical: false,
                saturate: None,
                text: criterion.text.clone(),
            };
            let mut has_weight = false;
            for attr in &criterion.attrs {
                match attr {
                    ast::CriterionAttr::Weight(value) => {
                        has_weight = true;
                        if let Some(n) = self.rubric_number(value, scope) {
                            checked.weight = n;
                        }
                    }
                    ast::CriterionAttr::Points(value) => {
                        checked.points = self.rubric_number(value, scope)
                    }
                    ast::CriterionAttr::Levels(levels, _) => {
                        checked.levels = levels.iter().map(|l| literal_number(&l.value)).collect()
                    }
                    ast::CriterionAttr::Veto(_) => checked.veto = true,
                    ast::CriterionAttr::Critical(_) => checked.critical = true,
                    ast::CriterionAttr::Saturate(call) => {
                        checked.saturate = self.shape(call, SATURATIONS, "saturation", scope)
                    }
                }
            }
            if has_weight && checked.points.is_some() {
                self.error(
                    Diagnostic::error(
                        "rlx::rubric",
                        file,
                        format!("criterion `{}` has both a weight and points", criterion.name.name),
                    )
                    .label(criterion.span, "choose one")
                    .help("`weight` feeds a weighted mean; `points` feed a HealthBench-style points score"),
                );
            }
            if checked.veto && criterion.attrs.len() > 1 {
                self.error(
                    Diagnostic::error(
                        "rlx::rubric",
                        file,
                        format!(
                            "veto criterion `{}` takes no other attribute",
                            criterion.name.name
                        ),
                    )
                    .label(criterion.span, "a veto criterion only flags a response")
                    .help("what a veto does is set once per rubric with `on_veto`"),
                );
            }
            criterion_spans.push(criterion.name.span);
            rubric.criteria.push(checked);
        }
        for entry in &decl.entries {
            match entry {
                ast::RubricEntry::Criterion(_) | ast::RubricEntry::Criteria(_) => {}
                ast::RubricEntry::Interact(interact) => {
                    let find = |checker: &mut Self, name: &ast::Ident| -> Option<usize> {
                        let found = rubric.criteria.iter().position(|c| c.name == name.name);
                        match found {
                            Some(index) if rubric.criteria[index].veto => {
                                checker.error(
                                    Diagnostic::error(
                                        "rlx::rubric",
                                        file,
                                        format!("veto criterion `{}` cannot interact", name.name),
                                    )
                                    .label(name.span, "a veto criterion only flags a response"),
                                );
                                None
                            }
                            Some(index) => Some(index),
                            None => {
                                let mut d = Diagnostic::error(
                                    "rlx::unknown_criterion",
                                    file,
                                    format!(
                                        "rubric `{}` has no criterion `{}`",
                                        decl.name.name, name.name
                                    ),
                                )
                                .label(name.span, "not a criterion of this rubric");
                                if let Some(close) = closest_name(
                                    &name.name,
                                    rubric.criteria.iter().map(|c| c.name.as_str()),
                                ) {
                                    d = d.help(format!("did you mean `{close}`?"));
                                }
                                checker.error(d);
                                None
                            }
                        }
                    };
                    let first = find(self, &interact.first);
                    let second = find(self, &interact.second);
                    let gamma = self.rubric_number(&interact.gamma, scope);
                    if let (Some(first), Some(second), Some(gamma)) = (first, second, gamma) {
                        if first == second {
                            self.error(
                                Diagnostic::error(
                                    "rlx::rubric",
                                    file,
                                    "a criterion cannot interact with itself",
                                )
                                .label(interact.span, "name two different criteria"),
                            );
                            continue;
                        }
                        rubric.interactions.push(hir::Interaction {
                            first,
                            second,
                            mode: interact.mode.unwrap_or(ast::InteractMode::Product),
                            gamma,
                        });
                    }
                }
                ast::RubricEntry::Aggregate(name) => {
                    let value = match name.name.as_str() {
                        "mean" => hir::Aggregate::Mean,
                        "sum" => hir::Aggregate::Sum,
                        "points" => hir::Aggregate::Points,
                        other => {
                            let mut d = Diagnostic::error(
                                "rlx::rubric",
                                file,
                                format!("unknown aggregation `{other}`"),
                            )
                            .label(name.span, "expected `mean`, `sum` or `points`");
                            if let Some(close) = closest_name(other, ["mean", "sum", "points"]) {
                                d = d.help(format!("did you mean `{close}`?"));
                            }
                            self.error(d);
                            continue;
                        }
                    };
                    aggregate = Some((value, name.span));
                }
                ast::RubricEntry::OnVeto(call) => {
                    if let Some(shape) = self.shape(call, VETOES, "veto action", scope) {
                        rubric.on_veto = shape;
                    }
                }
                ast::RubricEntry::Shape(call) => {
                    rubric.shape = self.shape(call, SHAPES, "shaping", scope)
                }
            }
        }
        let scored: Vec<usize> = (0..rubric.criteria.len())
            .filter(|&i| !rubric.criteria[i].veto)
            .collect();
        if scored.is_empty() {
            self.error(
                Diagnostic::error(
                    "rlx::rubric",
                    file,
                    format!("rubric `{}` has no scoring criterion", decl.name.name),
                )
                .label(
                    decl.name.span,
                    "needs at least one criterion that is not a veto",
                )
                .help("add `criterion NAME weight W`"),
            );
        }
        let with_points = scored
            .iter()
            .filter(|&&i| rubric.criteria[i].points.is_some())
            .count();
        rubric.aggregate = match aggregate {
            Some((hir::Aggregate::Points, span)) if with_points != scored.len() => {
                self.error(
                    Diagnostic::error(
                        "rlx::rubric",
                        file,
                        "`aggregate points` needs points on every criterion",
                    )
                    .label(span, "some criteria have no `points`"),
                );
                hir::Aggregate::Points
            }
            Some((value, span)) if value != hir::Aggregate::Points && with_points > 0 => {
                self.error(
                    Diagnostic::error(
                        "rlx::rubric",
                        file,
                        "criteria with points need `aggregate points`",
                    )
                    .label(span, "points are ignored by this aggregation"),
                );
                value
            }
            Some((value, _)) => value,
            None if with_points == 0 => hir::Aggregate::Mean,
            None if with_points == scored.len() => hir::Aggregate::Points,
            None => {
                self.error(
                    Diagnostic::error(
                        "rlx::rubric",
                        file,
                        format!("rubric `{}` mixes criteria with points and without", decl.name.name),
                    )
                    .label(decl.name.span, "give every scoring criterion `points`, or none")
                    .help("HealthBench-style rubrics give points (possibly negative) to every criterion"),
                );
                hir::Aggregate::Points
            }
        };
        rubric
    }

    // -----------------------------------------------------------------------------------------
    // Sections
}
