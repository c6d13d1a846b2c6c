//! `state` declarations (docs/language.md, "State across steps"): the input through which a step
//! reads a state, its initial value and its update.

use super::*;

/// The element type a state declares, or its initial literal's (an untyped number is `f32`, as for
/// `param`); a state initialised from a param without a type is `f32` unless the param is `bool`
/// (decided once the params exist, in `state`).
fn declared_elem(decl: &ast::StateDecl) -> Elem {
    match (&decl.ty, &decl.init) {
        (Some((elem, _)), _) => *elem,
        (None, ast::StateInit::Literal(literal)) if elem_of(&literal.value) == Elem::Bool => {
            Elem::Bool
        }
        _ => Elem::F32,
    }
}

/// Whether a literal of `value` may initialise a state of element type `elem` (the rule of typed
/// params: an `i32` state needs an integer literal, a `bool` state `true` or `false`).
fn literal_fits(elem: Elem, value: &LiteralValue) -> bool {
    match (elem, value) {
        (Elem::Bool, LiteralValue::Bool(_)) => true,
        (Elem::I32, LiteralValue::Number { is_int, .. }) => *is_int,
        (Elem::F32, LiteralValue::Number { .. }) => true,
        _ => false,
    }
}

impl Checker<'_> {
    /// The batch-level input without a gradient through which a step reads the state; its default
    /// is the initial literal (a param's value is filled in by `state`, once params are checked).
    pub(super) fn state_input(&mut self, decl: &ast::StateDecl) -> Option<hir::Input> {
        let elem = declared_elem(decl);
        let default = match &decl.init {
            ast::StateInit::Literal(literal) => {
                if !literal_fits(elem, &literal.value) {
                    let mut error = Diagnostic::error(
                        "rlx::state_type",
                        self.root_file,
                        format!(
                            "state `{}` is {} but its initial value is not",
                            decl.name.name,
                            elem.name()
                        ),
                    )
                    .label(literal.span, format!("not a {} literal", elem.name()));
                    if let Some((_, span)) = decl.ty {
                        error = error.label(span, "declared here");
                    }
                    self.error(error);
                    return None;
                }
                Some(literal_number(&literal.value))
            }
            ast::StateInit::Param(_) => None,
        };
        Some(hir::Input {
            name: decl.name.name.clone(),
            ty: Ty::scalar(elem),
            role: None,
            default,
            span: decl.name.span,
        })
    }

    /// Check a state's initial value (a param of a fitting type) and its update (a batch-level
    /// value whose element type converts to the state's).
    pub(super) fn state(&mut self, decl: &ast::StateDecl) -> Option<hir::State> {
        let file = self.root_file;
        let Some(Definition {
            def: Def::Input(input),
            ..
        }) = self.scopes[Program::ROOT].get(&decl.name.name)
        else {
            // The declaration itself failed (its error is the report) or its name is taken.
            return None;
        };
        let input = *input;
        if self.inputs[input.0 as usize].span != decl.name.span {
            return None;
        }
        let elem = self.inputs[input.0 as usize].ty.elem;
        let init = match &decl.init {
            ast::StateInit::Literal(literal) => hir::Number::Const(literal_number(&literal.value)),
            ast::StateInit::Param(name) => {
                let param = match self.scopes[Program::ROOT].get(&name.name).map(|d| d.def) {
                    Some(Def::Param(param)) => param,
                    Some(_) => {
                        self.error(
                            Diagnostic::error(
                                "rlx::state_init",
                                file,
                                format!(
                                    "the initial value of state `{}` must be a literal or a param",
                                    decl.name.name
                                ),
                            )
                            .label(name.span, "not a param")
                            .help("declare it with `param NAME = VALUE`, or write the value"),
                        );
                        return None;
                    }
                    None => {
                        self.unknown_name(Program::ROOT, name, &[]);
                        return None;
                    }
                };
                let declared = &self.params[param.0 as usize];
                let fits = match elem {
                    Elem::F32 => declared.elem != Elem::Bool,
                    other => declared.elem == other,
                };
                if !fits {
                    let message = format!(
                        "state `{}` is {} but param `{}` is {}",
                        decl.name.name,
                        elem.name(),
                        declared.name,
                        declared.elem.name()
                    );
                    self.error(
                        Diagnostic::error("rlx::state_type", file, message)
                            .label(name.span, format!("not {}", elem.name()))
                            .label(declared.span, "declared here"),
                    );
                    return None;
                }
                let value = declared.value;
                self.inputs[input.0 as usize].default = Some(value);
                hir::Number::Param(param)
            }
        };
        let env = self.root_env();
        let update = self.expr(&env, &decl.update)?;
        if update.ty.level != Level::Batch || update.ty.feature.is_some() {
            self.error(
                Diagnostic::error(
                    "rlx::state_level",
                    file,
                    format!(
                        "the update of state `{}` must be one value for the batch, found {}",
                        decl.name.name, update.ty
                    ),
                )
                .label(update.span, format!("this is {}", update.ty))
                .help(section_help(&update.ty, Level::Batch)),
            );
            return None;
        }
        if !Ty::scalar(update.ty.elem).fits(&Ty::scalar(elem)) {
            self.error(
                Diagnostic::error(
                    "rlx::state_type",
                    file,
                    format!(
                        "state `{}` is {} but its update is {}",
                        decl.name.name,
                        elem.name(),
                        update.ty.elem.name()
                    ),
                )
                .label(update.span, format!("this is {}", update.ty.elem.name()))
                .label(decl.name.span, format!("declared {}", elem.name())),
            );
            return None;
        }
        Some(hir::State {
            name: decl.name.name.clone(),
            elem,
            input,
            init,
            update,
            span: decl.name.span,
        })
    }
}
