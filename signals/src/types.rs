//! The shapes of recipe inputs and of signal outputs, and which output may fill which input.
//!
//! This crate does not depend on the compiler: the trainer maps each recipe input
//! (`rlx_compiler::check::types::Ty`) onto an [`InputDecl`].

use std::fmt;

/// Element type of a value (`bool → i32 → f32` widen, as in the language).
pub use rlx_core::Elem;
/// Level of a value: one per batch, per group (prompt), per response, per token, per pair.
pub use rlx_core::Level;

/// The feature axis of a value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Feature {
    /// No feature axis.
    None,
    /// `crit`: criteria given by the data, a possibly different count per prompt.
    Crit,
    /// `dim`: embedding dimensions, one count for the whole batch.
    Dim,
    /// A rubric declared in the recipe: its name and criteria in declaration order.
    Rubric { name: String, criteria: Vec<String> },
}

/// One input of a recipe, as the trainer describes it to the registry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputDecl {
    pub name: String,
    pub elem: Elem,
    pub level: Level,
    pub feature: Feature,
}

impl InputDecl {
    /// Convenience constructor.
    pub fn new(name: &str, elem: Elem, level: Level, feature: Feature) -> InputDecl {
        InputDecl {
            name: name.to_string(),
            elem,
            level,
            feature,
        }
    }
}

/// The feature axis a signal produces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OutFeature {
    None,
    /// The prompt's own criteria (its rubric or its IFEval instruction list): ragged.
    PromptCrit,
    /// A fixed list of named criteria given in the signal's config (same for every prompt).
    Named(Vec<String>),
    /// Embedding dimensions.
    Dim,
}

/// The type of the values a signal produces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutType {
    pub elem: Elem,
    pub level: Level,
    pub feature: OutFeature,
}

impl fmt::Display for InputDecl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.feature {
            Feature::None => write!(f, "{}[{}]", self.elem, self.level),
            Feature::Crit => write!(f, "{}[{}, crit]", self.elem, self.level),
            Feature::Dim => write!(f, "{}[{}, dim]", self.elem, self.level),
            Feature::Rubric { name, .. } => write!(f, "{}[{}, {name}]", self.elem, self.level),
        }
    }
}

impl fmt::Display for OutType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.feature {
            OutFeature::None => write!(f, "{}[{}]", self.elem, self.level),
            OutFeature::PromptCrit => write!(f, "{}[{}, crit]", self.elem, self.level),
            OutFeature::Dim => write!(f, "{}[{}, dim]", self.elem, self.level),
            OutFeature::Named(names) => {
                write!(f, "{}[{}, <{}>]", self.elem, self.level, names.join(", "))
            }
        }
    }
}

/// How a signal's named criteria map onto the input's feature axis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum AxisMap {
    /// Values are laid out as produced.
    Identity,
    /// `order[k]` is the index of the produced criterion that goes to the input's criterion `k`.
    Reorder(Vec<usize>),
}

/// Whether a value of type `out` may fill `input`; on success, how its criteria are reordered.
///
/// Rules: the levels are equal; the element type widens (`bool → i32 → f32`); the feature axes agree:
/// the prompt's criteria fill `crit`, named criteria fill `crit` (the same list for every prompt) or a
/// rubric axis with exactly the same criterion names (reordered to the rubric's order), dimensions fill
/// `dim`.
pub(crate) fn fits(out: &OutType, input: &InputDecl) -> Result<AxisMap, String> {
    let mismatch = || format!("produces {out} but input `{}` is {input}", input.name);
    if out.level != input.level {
        return Err(mismatch());
    }
    if out.elem > input.elem {
        return Err(format!(
            "{}; a {} value does not convert to {} (only bool → i32 → f32 widen)",
            mismatch(),
            out.elem,
            input.elem
        ));
    }
    match (&out.feature, &input.feature) {
        (OutFeature::None, Feature::None)
        | (OutFeature::PromptCrit, Feature::Crit)
        | (OutFeature::Named(_), Feature::Crit)
        | (OutFeature::Dim, Feature::Dim) => Ok(AxisMap::Identity),
        (OutFeature::Named(names), Feature::Rubric { name, criteria }) => {
            let mut order = Vec::with_capacity(criteria.len());
            for c in criteria {
                match names.iter().position(|n| n == c) {
                    Some(i) => order.push(i),
                    None => {
                        return Err(format!(
                            "{}; rubric `{name}` has criterion `{c}`, which the signal does not name",
                            mismatch()
                        ))
                    }
                }
            }
            if let Some(extra) = names.iter().find(|n| !criteria.contains(n)) {
                return Err(format!(
                    "{}; the signal names `{extra}`, which is not a criterion of rubric `{name}`",
                    mismatch()
                ));
            }
            Ok(AxisMap::Reorder(order))
        }
        (OutFeature::PromptCrit, Feature::Rubric { name, .. }) => Err(format!(
            "{}; the prompt's criteria have no names to match rubric `{name}`: give the signal a list of named criteria",
            mismatch()
        )),
        _ => Err(mismatch()),
    }
}
