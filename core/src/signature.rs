//! The recipe signature: the inputs a batch gives a recipe (name, element type, shape, default), its
//! params, its rubrics and what it computes; and [`Signature::validate`], the one check of a batch's
//! layout and input columns against it, which every reader of batches calls (rollout files, arrays,
//! the interpreter, the kernels) before anything is sized from the batch.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::{json_float, CoreError, Elem, Feature, Layout, Level, Shape, Sizes};

/// One input of a recipe (`input NAME : TYPE [policy|value] [= DEFAULT]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InputInfo {
    pub name: String,
    pub elem: Elem,
    pub shape: Shape,
    /// Whether the compiler derives ∂loss/∂input (a `policy` or `value` input).
    pub differentiable: bool,
    /// The value used when a batch does not give the input.
    #[serde(with = "json_float::option")]
    pub default: Option<f64>,
}

/// A declared rubric: its name and criteria, in declaration order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RubricInfo {
    pub name: String,
    pub criteria: Vec<String>,
    /// Each criterion's text when the rubric's criteria come from rubric files (docs/sharing.md):
    /// what a judge signal left without `criteria` asks. Empty when no criterion has a text.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub texts: Vec<String>,
}

/// A param: its declared default and the value it has (compiled into a graph, or overridden).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ParamInfo {
    pub name: String,
    pub elem: Elem,
    #[serde(with = "json_float")]
    pub default: f64,
    #[serde(with = "json_float")]
    pub value: f64,
}

/// One value a recipe computes: `reward` and `advantage` (per response), `loss` (per batch), or a
/// metric by its name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputInfo {
    pub name: String,
    pub shape: Shape,
}

/// What a batch must give a recipe, and what the recipe gives back.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Signature {
    /// In the recipe's input order: the order of a batch's input columns.
    pub inputs: Vec<InputInfo>,
    pub params: Vec<ParamInfo>,
    /// What [`Feature::Rubric`]'s `index` points into.
    pub rubrics: Vec<RubricInfo>,
    /// The inputs that carry a recipe's `state` across steps: set by the caller (the trainer, `rlx
    /// score --state`), never by a rollout.
    pub states: Vec<String>,
    pub outputs: Vec<OutputInfo>,
}

/// Anything that has a recipe's signature: a signature, a checked recipe, a compiled artifact.
pub trait HasSignature {
    fn signature(&self) -> Cow<'_, Signature>;
}

impl HasSignature for Signature {
    fn signature(&self) -> Cow<'_, Signature> {
        Cow::Borrowed(self)
    }
}

impl Signature {
    /// The declarations agree with each other: token and pair inputs have no feature axis and pair
    /// inputs no gradient, every rubric axis of an input names a declared rubric and has its
    /// criterion count, and a matrix has two rectangular axes (never `crit`). A checked recipe
    /// always does; a `.rlxc` artifact is checked when it is loaded.
    pub fn check(&self) -> Result<(), CoreError> {
        fn axis(signature: &Signature, input: &str, feature: &Feature) -> Result<(), CoreError> {
            match feature {
                Feature::Crit | Feature::Dim => Ok(()),
                Feature::Rubric { index, len } => match signature.rubrics.get(*index as usize) {
                    None => Err(CoreError::Declaration(format!(
                        "input `{input}` names rubric #{index}, and the recipe declares {}",
                        signature.rubrics.len()
                    ))),
                    Some(rubric) if rubric.criteria.len() != *len as usize => {
                        Err(CoreError::Declaration(format!(
                            "input `{input}` has {len} criteria of rubric `{}`, which has {}",
                            rubric.name,
                            rubric.criteria.len()
                        )))
                    }
                    Some(_) => Ok(()),
                },
                Feature::Matrix { rows, cols } => {
                    if **rows == Feature::Crit || **cols == Feature::Crit {
                        return Err(CoreError::Declaration(format!(
                            "input `{input}` is a matrix with a `crit` axis (a matrix's axes are `dim` or rubrics)"
                        )));
                    }
                    axis(signature, input, rows)?;
                    axis(signature, input, cols)
                }
            }
        }
        for input in &self.inputs {
            // A pair input (one value per ordered pair) has no feature axis, as a token input, and
            // is data, never differentiable.
            let level = input.shape.level;
            if (input.shape.feature.is_some() && matches!(level, Level::Tok | Level::Pair))
                || (level == Level::Pair && input.differentiable)
            {
                return Err(CoreError::Declaration(format!(
                    "input `{}` has a shape no batch can hold",
                    input.name
                )));
            }
            if let Some(feature) = &input.shape.feature {
                axis(self, &input.name, feature)?;
            }
        }
        Ok(())
    }

    /// A feature axis as a type writes it: `crit`, `dim`, a rubric's name, `dim, style` for a matrix
    /// (`#N` for a rubric the signature does not declare).
    pub fn axes(&self, feature: &Feature) -> String {
        match feature {
            Feature::Crit => "crit".to_string(),
            Feature::Dim => "dim".to_string(),
            Feature::Rubric { index, .. } => match self.rubrics.get(*index as usize) {
                Some(rubric) => rubric.name.clone(),
                None => format!("#{index}"),
            },
            Feature::Matrix { rows, cols } => format!("{}, {}", self.axes(rows), self.axes(cols)),
        }
    }

    /// An input's type as the recipe declares it: `f32[resp, style]`, `bool[tok]`, `f32` (per batch).
    pub fn input_type(&self, input: &InputInfo) -> String {
        match (&input.shape.level, &input.shape.feature) {
            (Level::Batch, None) => input.elem.name().to_string(),
            (level, None) => format!("{}[{level}]", input.elem),
            (level, Some(feature)) => format!("{}[{level}, {}]", input.elem, self.axes(feature)),
        }
    }

    /// The one check of a batch against the recipe, before anything is sized from it: the layout is
    /// valid, its sizes fit a `usize`, there is one column per input, and each has exactly as many
    /// values as the input's shape has elements over the layout (`lengths`, in input order). Gives
    /// the layout's [`Sizes`].
    pub fn validate(
        &self,
        layout: &Layout,
        lengths: impl ExactSizeIterator<Item = usize>,
    ) -> Result<Sizes, CoreError> {
        let sizes = Sizes::new(layout)?;
        if lengths.len() != self.inputs.len() {
            return Err(CoreError::InputCount {
                given: lengths.len(),
                expected: self.inputs.len(),
            });
        }
        for (input, given) in self.inputs.iter().zip(lengths) {
            let expected = sizes.size(&input.shape)?;
            if given != expected {
                return Err(CoreError::InputLength {
                    input: input.name.clone(),
                    ty: self.input_type(input),
                    given,
                    expected,
                });
            }
        }
        Ok(sizes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(name: &str, elem: Elem, level: Level, feature: Option<Feature>) -> InputInfo {
        InputInfo {
            name: name.into(),
            elem,
            shape: Shape { level, feature },
            differentiable: false,
            default: None,
        }
    }

    fn signature() -> Signature {
        Signature {
            inputs: vec![
                input("logp", Elem::F32, Level::Tok, None),
                input("met", Elem::Bool, Level::Resp, Some(Feature::Crit)),
                input(
                    "judged",
                    Elem::F32,
                    Level::Group,
                    Some(Feature::Rubric { index: 0, len: 2 }),
                ),
                input("beta", Elem::F32, Level::Batch, None),
            ],
            rubrics: vec![RubricInfo {
                name: "style".into(),
                criteria: vec!["clear".into(), "short".into()],
                texts: Vec::new(),
            }],
            ..Signature::default()
        }
    }

    #[test]
    fn a_batch_of_the_right_sizes_validates() {
        // Groups of 2 and 1 responses with 3, 1 and 2 tokens; 2 and 4 criteria.
        let layout = Layout::from_counts(&[2, 1], &[3, 1, 2], &[2, 4], 0).expect("valid");
        let sizes = signature()
            .validate(&layout, [6, 2 * 2 + 4, 2 * 2, 1].into_iter())
            .expect("fits");
        assert_eq!(sizes.tokens, 6);
    }

    #[test]
    fn each_mismatch_names_the_input_and_its_type() {
        let layout = Layout::from_counts(&[2, 1], &[3, 1, 2], &[2, 4], 0).expect("valid");
        let signature = signature();
        let error = signature
            .validate(&layout, [6, 7, 4, 1].into_iter())
            .expect_err("short");
        assert_eq!(
            error.to_string(),
            "malformed batch: input `met` has 7 values, its shape bool[resp, crit] needs 8"
        );
        let error = signature
            .validate(&layout, [6, 8, 4].into_iter())
            .expect_err("missing");
        assert_eq!(
            error.to_string(),
            "malformed batch: 3 input vectors for a recipe with 4 inputs"
        );
        let error = signature
            .validate(&layout, [6, 8, 3, 1].into_iter())
            .expect_err("judged");
        assert!(error
            .to_string()
            .contains("its shape f32[group, style] needs 4"));
        let mut broken = layout.clone();
        broken.group_offsets = vec![0, 2, 1, 3];
        assert_eq!(
            signature
                .validate(&broken, [6, 8, 4, 1].into_iter())
                .expect_err("broken")
                .to_string(),
            "malformed batch: group offsets must not decrease"
        );
    }

    #[test]
    fn types_print_as_declared() {
        let signature = signature();
        let types: Vec<String> = signature
            .inputs
            .iter()
            .map(|i| signature.input_type(i))
            .collect();
        assert_eq!(
            types,
            ["f32[tok]", "bool[resp, crit]", "f32[group, style]", "f32"]
        );
        let matrix = Feature::Matrix {
            rows: Box::new(Feature::Dim),
            cols: Box::new(Feature::Rubric { index: 0, len: 2 }),
        };
        assert_eq!(signature.axes(&matrix), "dim, style");
    }

    #[test]
    fn check_refuses_rubric_axes_that_do_not_match_the_rubrics() {
        let mut signature = signature();
        assert_eq!(signature.check(), Ok(()));
        signature.inputs[2].shape.feature = Some(Feature::Rubric { index: 1, len: 2 });
        assert_eq!(
            signature.check().expect_err("no rubric #1").to_string(),
            "input `judged` names rubric #1, and the recipe declares 1"
        );
        signature.inputs[2].shape.feature = Some(Feature::Rubric { index: 0, len: 3 });
        assert_eq!(
            signature.check().expect_err("wrong length").to_string(),
            "input `judged` has 3 criteria of rubric `style`, which has 2"
        );
        signature.inputs[2].shape.feature = Some(Feature::Matrix {
            rows: Box::new(Feature::Crit),
            cols: Box::new(Feature::Dim),
        });
        assert!(signature.check().is_err());
        signature.inputs[2].shape = Shape {
            level: Level::Tok,
            feature: Some(Feature::Dim),
        };
        assert_eq!(
            signature.check().expect_err("tok, dim").to_string(),
            "input `judged` has a shape no batch can hold"
        );
    }
}
