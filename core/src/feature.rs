//! Feature axes and shapes: what a value holds at each element of its level.
//!
//! # Shapes and element order
//! A value of a shape is a flat array. With G groups, R responses, T tokens, P ordered pairs (i, j ≠ i)
//! of responses within each group, C_g criteria of group g and D embedding dimensions:
//!
//! | level | elements, in order |
//! |---|---|
//! | batch | 1 |
//! | group | G, groups in order |
//! | resp | R, groups in order, responses within |
//! | pair | for each group, for each response i, for each other response j of the group (in order) |
//! | tok | T, the tokens of each response in order, responses in packed order |
//!
//! A `crit` axis multiplies each group (or each response, token or pair) element by its group's C_g
//! criteria (ragged); `dim` by D and a rubric axis by its K criteria (row-major: the element, then the
//! feature index). A matrix of two rectangular axes (`dim`, rubrics) multiplies it by their product,
//! row-major: feature index f = a·cols + b for row a, column b.

use serde::{Deserialize, Serialize};

use crate::Level;

/// A feature axis: the ragged criteria of each group (`crit`, from data), embedding dimensions
/// (`dim`, one length per batch), the criteria of a declared rubric, or a matrix of two rectangular
/// axes. At most one per value, attached at the batch, group, response, token or pair level.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Feature {
    Crit,
    Dim,
    /// A declared rubric's criteria: its index in the recipe's rubrics (`Signature::rubrics`,
    /// `Graph::rubrics`) and how many criteria it has.
    Rubric {
        index: u32,
        len: u32,
    },
    /// A matrix over two rectangular axes (never `crit`): `rows × cols` values per element, row-major.
    Matrix {
        rows: Box<Feature>,
        cols: Box<Feature>,
    },
}

impl Feature {
    /// How many values the axis has when its length is fixed for the batch: `dim` is `dim`, a rubric
    /// its criteria, a matrix the product of its axes; `None` for the ragged `crit`.
    pub fn fixed_len(&self, dim: usize) -> Option<usize> {
        match self {
            Feature::Crit => None,
            Feature::Dim => Some(dim),
            Feature::Rubric { len, .. } => Some(*len as usize),
            Feature::Matrix { rows, cols } => {
                rows.fixed_len(dim)?.checked_mul(cols.fixed_len(dim)?)
            }
        }
    }

    /// The row and column axes of a matrix.
    pub fn matrix(&self) -> Option<(&Feature, &Feature)> {
        match self {
            Feature::Matrix { rows, cols } => Some((rows, cols)),
            _ => None,
        }
    }
}

impl std::fmt::Display for Feature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Feature::Crit => f.write_str("crit"),
            Feature::Dim => f.write_str("dim"),
            Feature::Rubric { index, len } => write!(f, "rubric{index}:{len}"),
            Feature::Matrix { rows, cols } => write!(f, "{rows} × {cols}"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Shape {
    pub level: Level,
    pub feature: Option<Feature>,
}

impl Shape {
    pub const BATCH: Shape = Shape {
        level: Level::Batch,
        feature: None,
    };

    pub fn new(level: Level) -> Shape {
        Shape {
            level,
            feature: None,
        }
    }

    /// Whether a value of shape `self` can be read at every element of `finer`.
    pub fn broadcasts_to(&self, finer: &Shape) -> bool {
        self.level.broadcasts_to(finer.level)
            && (self.feature.is_none() || self.feature == finer.feature)
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.feature {
            None => write!(f, "[{}]", self.level.name()),
            Some(feature) => write!(f, "[{}, {feature}]", self.level.name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_lengths_and_matrix_axes() {
        let style = Feature::Rubric { index: 1, len: 3 };
        let matrix = Feature::Matrix {
            rows: Box::new(Feature::Dim),
            cols: Box::new(style.clone()),
        };
        assert_eq!(Feature::Crit.fixed_len(4), None);
        assert_eq!(Feature::Dim.fixed_len(4), Some(4));
        assert_eq!(style.fixed_len(4), Some(3));
        assert_eq!(matrix.fixed_len(4), Some(12));
        assert_eq!(matrix.matrix(), Some((&Feature::Dim, &style)));
        assert_eq!(style.matrix(), None);
        // An overflowing product is no length, not a wrapped one.
        let huge = Feature::Matrix {
            rows: Box::new(Feature::Dim),
            cols: Box::new(Feature::Dim),
        };
        assert_eq!(huge.fixed_len(usize::MAX), None);
    }

    #[test]
    fn display_and_broadcasting() {
        let shape = Shape {
            level: Level::Resp,
            feature: Some(Feature::Rubric { index: 0, len: 2 }),
        };
        assert_eq!(shape.to_string(), "[resp, rubric0:2]");
        assert_eq!(Shape::BATCH.to_string(), "[batch]");
        assert!(Shape::new(Level::Group).broadcasts_to(&shape));
        assert!(!shape.broadcasts_to(&Shape::new(Level::Tok)));
        let tok = Shape {
            level: Level::Tok,
            feature: shape.feature.clone(),
        };
        assert!(shape.broadcasts_to(&tok));
    }

    #[test]
    fn serde_form_is_the_artifacts() {
        let matrix = Feature::Matrix {
            rows: Box::new(Feature::Dim),
            cols: Box::new(Feature::Rubric { index: 0, len: 2 }),
        };
        let json = serde_json::to_string(&matrix).expect("serializes");
        assert_eq!(
            json,
            r#"{"matrix":{"rows":"dim","cols":{"rubric":{"index":0,"len":2}}}}"#
        );
        assert_eq!(
            serde_json::from_str::<Feature>(&json).expect("parses"),
            matrix
        );
    }
}
