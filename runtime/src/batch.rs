//! The packed batch: tokens of all responses contiguous with offsets, responses grouped with offsets,
//! ragged per-prompt criterion lists with offsets. Nothing is padded.

use serde::Serialize;

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
            group_offsets: prefix_sums(responses_per_group),
            token_offsets: prefix_sums(tokens_per_response),
            crit_offsets: if crits_per_group.is_empty() {
                vec![0; responses_per_group.len() + 1]
            } else {
                prefix_sums(crits_per_group)
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

fn prefix_sums(counts: &[usize]) -> Vec<usize> {
    let mut offsets = Vec::with_capacity(counts.len() + 1);
    let mut total = 0;
    offsets.push(0);
    for count in counts {
        total += count;
        offsets.push(total);
    }
    offsets
}

/// One batch: its layout and every input of the recipe, by the recipe's input order, flat in the
/// element order of the input's shape (see `rlx_compiler::ir::Shape`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Batch {
    pub layout: Layout,
    pub inputs: Vec<Vec<f64>>,
}
