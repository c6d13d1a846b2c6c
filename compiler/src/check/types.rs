//! Value types: an element type, a level (`batch` < `group` < `resp` < `tok`, and `pair` below `resp`
//! beside `tok`) and at most one feature axis attached at the batch, group or response level, which may
//! be a matrix of two rectangular axes (`f32[group, dim, dim]`, `f32[batch, style, style]`).

use std::fmt;

use serde::Serialize;

pub use crate::syntax::ast::ElemType as Elem;
pub use rlx_core::Level;

/// A feature axis: rubric criteria (ragged per prompt, from data), embedding dimensions, or the
/// named criteria of a declared rubric.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Feature {
    Crit,
    Dim,
    Rubric(String),
    /// A matrix: rows along the first axis, columns along the second, row-major. Both axes have a
    /// length fixed for the batch (`dim`, a rubric), never the ragged `crit` (docs/language.md,
    /// "Matrices").
    Matrix(Box<Feature>, Box<Feature>),
}

impl Feature {
    /// The axis as a type writes it (`crit`, `style`; `dim, dim` for a matrix).
    pub fn name(&self) -> &str {
        match self {
            Feature::Crit => "crit",
            Feature::Dim => "dim",
            Feature::Rubric(name) => name,
            Feature::Matrix(..) => "matrix",
        }
    }

    /// The axes as a type lists them: `crit`, or `dim, dim` for a matrix.
    pub fn axes(&self) -> String {
        match self {
            Feature::Matrix(rows, cols) => format!("{}, {}", rows.axes(), cols.axes()),
            other => other.name().to_string(),
        }
    }

    /// The row and column axes of a matrix.
    pub fn matrix(&self) -> Option<(&Feature, &Feature)> {
        match self {
            Feature::Matrix(rows, cols) => Some((rows, cols)),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Ty {
    pub elem: Elem,
    pub level: Level,
    pub feature: Option<Feature>,
}

impl Ty {
    pub fn new(elem: Elem, level: Level) -> Ty {
        Ty {
            elem,
            level,
            feature: None,
        }
    }

    pub fn scalar(elem: Elem) -> Ty {
        Ty::new(elem, Level::Batch)
    }

    pub fn with_elem(&self, elem: Elem) -> Ty {
        Ty {
            elem,
            ..self.clone()
        }
    }

    pub fn with_level(&self, level: Level) -> Ty {
        Ty {
            level,
            ..self.clone()
        }
    }

    pub fn without_feature(&self) -> Ty {
        Ty {
            feature: None,
            ..self.clone()
        }
    }

    pub fn is_numeric(&self) -> bool {
        self.elem != Elem::Bool
    }

    /// Whether a value of type `self` may stand where `target` is expected: same or coarser level
    /// (broadcast), same feature or none, and an element type that converts (bool → i32 → f32).
    pub fn fits(&self, target: &Ty) -> bool {
        let elem_ok = self.elem.widens_to(target.elem);
        let feature_ok = self.feature.is_none() || self.feature == target.feature;
        elem_ok && self.level.broadcasts_to(target.level) && feature_ok
    }
}

impl fmt::Display for Ty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.level, &self.feature) {
            (Level::Batch, None) => write!(f, "{}", self.elem.name()),
            (level, None) => write!(f, "{}[{}]", self.elem.name(), level.name()),
            (level, Some(feature)) => write!(
                f,
                "{}[{}, {}]",
                self.elem.name(),
                level.name(),
                feature.axes()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_matches_declaration_syntax() {
        assert_eq!(Ty::new(Elem::F32, Level::Tok).to_string(), "f32[tok]");
        assert_eq!(Ty::scalar(Elem::Bool).to_string(), "bool");
        let crit = Ty {
            elem: Elem::Bool,
            level: Level::Resp,
            feature: Some(Feature::Crit),
        };
        assert_eq!(crit.to_string(), "bool[resp, crit]");
        let matrix = Ty {
            elem: Elem::F32,
            level: Level::Group,
            feature: Some(Feature::Matrix(
                Box::new(Feature::Dim),
                Box::new(Feature::Rubric("style".into())),
            )),
        };
        assert_eq!(matrix.to_string(), "f32[group, dim, style]");
    }

    #[test]
    fn coarse_values_fit_fine_slots_but_not_the_reverse() {
        let group = Ty::new(Elem::F32, Level::Group);
        let resp = Ty::new(Elem::F32, Level::Resp);
        assert!(group.fits(&resp));
        assert!(!resp.fits(&group));
        assert!(Ty::new(Elem::Bool, Level::Resp).fits(&resp));
        assert!(!resp.fits(&Ty::new(Elem::Bool, Level::Resp)));
    }

    #[test]
    fn pair_and_tok_are_siblings_below_resp() {
        let pair = Ty::new(Elem::Bool, Level::Pair);
        let tok = Ty::new(Elem::F32, Level::Tok);
        assert!(Ty::new(Elem::F32, Level::Resp).fits(&Ty::new(Elem::F32, Level::Pair)));
        assert!(!pair.fits(&tok));
        assert!(!tok.fits(&Ty::new(Elem::F32, Level::Pair)));
        assert!(!pair.fits(&Ty::new(Elem::Bool, Level::Resp)));
        assert_eq!(Level::Pair.coarser(), Level::Resp);
        assert_eq!(pair.to_string(), "bool[pair]");
    }
}
