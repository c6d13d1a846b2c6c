//! The packed layout of a batch and the sizes of shapes over it.
//!
//! A batch is packed: the tokens of all responses contiguous with offsets, responses grouped with
//! offsets, ragged per-prompt criterion lists with offsets; nothing is padded. [`Sizes`] counts the
//! elements of every level and shape over a layout (the element order: [`crate::Shape`]) with
//! overflow-checked arithmetic, so a batch whose sizes do not fit a `usize` is an error, never a
//! wrapped size or a panic.

use serde::Serialize;

use crate::{CoreError, Feature, Level, Shape};

/// Where each group, response and criterion list starts. All offsets are prefix sums (first 0, last the
/// total), so group g holds responses `group_offsets[g]..group_offsets[g+1]`, response r holds tokens
/// `token_offsets[r]..token_offsets[r+1]`, and group g's criteria are `crit_offsets[g]..crit_offsets[g+1]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Layout {
    pub group_offsets: Vec<usize>,
    pub token_offsets: Vec<usize>,
    /// Per-group criterion counts as offsets (all zero-length when the recipe has no `crit` axis).
    pub crit_offsets: Vec<usize>,
    /// Length of the `dim` axis (0 when unused).
    pub dim: usize,
}

/// Why a layout is not usable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutError(pub String);

impl std::fmt::Display for LayoutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LayoutError {}

impl Layout {
    /// Build from per-group response counts, per-response token counts and per-group criterion counts.
    pub fn from_counts(
        responses_per_group: &[usize],
        tokens_per_response: &[usize],
        crits_per_group: &[usize],
        dim: usize,
    ) -> Result<Layout, LayoutError> {
        let layout = Layout {
            group_offsets: prefix_sums("responses", responses_per_group)?,
            token_offsets: prefix_sums("tokens", tokens_per_response)?,
            crit_offsets: if crits_per_group.is_empty() {
                vec![0; responses_per_group.len() + 1]
            } else {
                prefix_sums("criteria", crits_per_group)?
            },
            dim,
        };
        layout.validate()?;
        Ok(layout)
    }

    /// Offsets are monotone, start at 0 and agree with each other.
    pub fn validate(&self) -> Result<(), LayoutError> {
        let check = |name: &str, offsets: &[usize]| -> Result<(), LayoutError> {
            if offsets.first() != Some(&0) {
                return Err(LayoutError(format!("{name} must start at 0")));
            }
            if offsets.windows(2).any(|w| w[0] > w[1]) {
                return Err(LayoutError(format!("{name} must not decrease")));
            }
            Ok(())
        };
        check("group offsets", &self.group_offsets)?;
        check("token offsets", &self.token_offsets)?;
        check("criterion offsets", &self.crit_offsets)?;
        if self.group_offsets.last() != Some(&(self.token_offsets.len() - 1)) {
            return Err(LayoutError(format!(
                "group offsets cover {} responses but token offsets describe {}",
                self.group_offsets.last().copied().unwrap_or(0),
                self.token_offsets.len() - 1
            )));
        }
        if self.crit_offsets.len() != self.group_offsets.len() {
            return Err(LayoutError(
                "criterion offsets need one entry per group plus one".into(),
            ));
        }
        Ok(())
    }

    pub fn groups(&self) -> usize {
        self.group_offsets.len() - 1
    }

    pub fn responses(&self) -> usize {
        self.token_offsets.len() - 1
    }

    pub fn tokens(&self) -> usize {
        self.token_offsets.last().copied().unwrap_or(0)
    }

    pub fn group_size(&self, group: usize) -> usize {
        self.group_offsets[group + 1] - self.group_offsets[group]
    }

    pub fn response_length(&self, response: usize) -> usize {
        self.token_offsets[response + 1] - self.token_offsets[response]
    }

    pub fn crit_count(&self, group: usize) -> usize {
        self.crit_offsets[group + 1] - self.crit_offsets[group]
    }

    /// The group of every response.
    pub fn response_groups(&self) -> Vec<usize> {
        let mut out = Vec::with_capacity(self.responses());
        for group in 0..self.groups() {
            out.extend(std::iter::repeat_n(group, self.group_size(group)));
        }
        out
    }
}

/// The offsets of `counts` (first 0, last the total); an error when the total overflows.
fn prefix_sums(what: &str, counts: &[usize]) -> Result<Vec<usize>, LayoutError> {
    let mut offsets = Vec::with_capacity(counts.len() + 1);
    let mut total = 0usize;
    offsets.push(0);
    for count in counts {
        total = total
            .checked_add(*count)
            .ok_or_else(|| LayoutError(format!("the {what} add up to more than {}", usize::MAX)))?;
        offsets.push(total);
    }
    Ok(offsets)
}

/// The element counts of every level over a layout, and of the `crit` axis at each level: what
/// [`Sizes::size`] multiplies by the rectangular feature axes. Every count is overflow-checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sizes {
    pub groups: usize,
    pub responses: usize,
    pub tokens: usize,
    /// Ordered pairs (i, j ≠ i) of the responses of each group: Σ_g n_g·(n_g − 1).
    pub pairs: usize,
    /// Elements of `crit` at group, resp, tok and pair level: each element times its group's criteria.
    pub group_crits: usize,
    pub resp_crits: usize,
    pub tok_crits: usize,
    pub pair_crits: usize,
    /// The length of the `dim` axis.
    pub dim: usize,
}

impl Sizes {
    /// The counts of `layout`, which is validated first ([`Layout::validate`]): an invalid layout is
    /// [`CoreError::Layout`], counts past `usize` [`CoreError::Overflow`].
    pub fn new(layout: &Layout) -> Result<Sizes, CoreError> {
        layout
            .validate()
            .map_err(|error| CoreError::Layout(error.0))?;
        let (mut resp_crits, mut pairs, mut pair_crits, mut tok_crits) = (0usize, 0usize, 0, 0);
        let add = |total: usize, count: usize, width: usize| {
            count
                .checked_mul(width)
                .and_then(|x| total.checked_add(x))
                .ok_or(CoreError::Overflow)
        };
        for g in 0..layout.groups() {
            let n = layout.group_size(g);
            let crits = layout.crit_count(g);
            let group_pairs = n
                .checked_mul(n.saturating_sub(1))
                .ok_or(CoreError::Overflow)?;
            let group_tokens = layout.token_offsets[layout.group_offsets[g + 1]]
                - layout.token_offsets[layout.group_offsets[g]];
            resp_crits = add(resp_crits, n, crits)?;
            pairs = add(pairs, group_pairs, 1)?;
            pair_crits = add(pair_crits, group_pairs, crits)?;
            tok_crits = add(tok_crits, group_tokens, crits)?;
        }
        Ok(Sizes {
            groups: layout.groups(),
            responses: layout.responses(),
            tokens: layout.tokens(),
            pairs,
            group_crits: layout.crit_offsets[layout.groups()],
            resp_crits,
            tok_crits,
            pair_crits,
            dim: layout.dim,
        })
    }

    /// How many elements `level` has (without a feature axis).
    pub fn level(&self, level: Level) -> usize {
        match level {
            Level::Batch => 1,
            Level::Group => self.groups,
            Level::Resp => self.responses,
            Level::Tok => self.tokens,
            Level::Pair => self.pairs,
        }
    }

    /// How many elements a value of `shape` has: its level's elements times the feature axis's
    /// length (each group's own criteria for `crit`, which has none at batch level; the fixed length
    /// of `dim`, a rubric or a matrix otherwise). [`CoreError::Overflow`] past `usize`.
    pub fn size(&self, shape: &Shape) -> Result<usize, CoreError> {
        let base = self.level(shape.level);
        match &shape.feature {
            None => Ok(base),
            Some(Feature::Crit) => Ok(match shape.level {
                Level::Batch => 0,
                Level::Group => self.group_crits,
                Level::Resp => self.resp_crits,
                Level::Tok => self.tok_crits,
                Level::Pair => self.pair_crits,
            }),
            Some(feature) => feature
                .fixed_len(self.dim)
                .and_then(|width| base.checked_mul(width))
                .ok_or(CoreError::Overflow),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(level: Level, feature: Option<Feature>) -> Shape {
        Shape { level, feature }
    }

    #[test]
    fn sizes_of_every_level_and_axis() {
        // Two groups of 2 and 3 responses with 1..=5 tokens, 2 and 1 criteria, dim 4.
        let layout = Layout::from_counts(&[2, 3], &[1, 2, 3, 4, 5], &[2, 1], 4).expect("valid");
        let sizes = Sizes::new(&layout).expect("small");
        assert_eq!((sizes.groups, sizes.responses, sizes.tokens), (2, 5, 15));
        assert_eq!(sizes.pairs, 2 + 6);
        assert_eq!(sizes.size(&shape(Level::Batch, None)), Ok(1));
        assert_eq!(sizes.size(&shape(Level::Pair, None)), Ok(8));
        let crit = Some(Feature::Crit);
        assert_eq!(sizes.size(&shape(Level::Batch, crit.clone())), Ok(0));
        assert_eq!(sizes.size(&shape(Level::Group, crit.clone())), Ok(3));
        assert_eq!(sizes.size(&shape(Level::Resp, crit.clone())), Ok(2 * 2 + 3));
        assert_eq!(sizes.size(&shape(Level::Tok, crit.clone())), Ok(3 * 2 + 12));
        assert_eq!(sizes.size(&shape(Level::Pair, crit)), Ok(2 * 2 + 6));
        assert_eq!(sizes.size(&shape(Level::Resp, Some(Feature::Dim))), Ok(20));
        let rubric = Feature::Rubric { index: 0, len: 3 };
        assert_eq!(
            sizes.size(&shape(Level::Group, Some(rubric.clone()))),
            Ok(6)
        );
        let matrix = Feature::Matrix {
            rows: Box::new(Feature::Dim),
            cols: Box::new(rubric),
        };
        assert_eq!(sizes.size(&shape(Level::Batch, Some(matrix))), Ok(12));
    }

    #[test]
    fn overflowing_sizes_are_errors_not_panics() {
        let layout = Layout::from_counts(&[1], &[1], &[], usize::MAX / 2).expect("valid");
        let sizes = Sizes::new(&layout).expect("the counts fit");
        let dim = |level| shape(level, Some(Feature::Dim));
        assert_eq!(sizes.size(&dim(Level::Resp)), Ok(usize::MAX / 2));
        let matrix = Feature::Matrix {
            rows: Box::new(Feature::Dim),
            cols: Box::new(Feature::Dim),
        };
        assert_eq!(
            sizes.size(&shape(Level::Resp, Some(matrix))),
            Err(CoreError::Overflow)
        );
        let two = Layout::from_counts(&[2], &[1, 1], &[], usize::MAX / 2 + 1).expect("valid");
        let sizes = Sizes::new(&two).expect("the counts fit");
        assert_eq!(sizes.size(&dim(Level::Resp)), Err(CoreError::Overflow));
        assert_eq!(
            Layout::from_counts(&[usize::MAX, 1], &[], &[], 0),
            Err(LayoutError(format!(
                "the responses add up to more than {}",
                usize::MAX
            )))
        );
    }

    #[test]
    fn broken_layouts_are_errors() {
        let mut layout = Layout::from_counts(&[2], &[1, 1], &[], 0).expect("valid");
        layout.group_offsets = vec![0, 3];
        assert_eq!(
            Sizes::new(&layout),
            Err(CoreError::Layout(
                "group offsets cover 3 responses but token offsets describe 2".into()
            ))
        );
        layout.group_offsets.clear();
        assert!(Sizes::new(&layout).is_err());
        layout.token_offsets.clear();
        assert!(Sizes::new(&layout).is_err());
    }
}
