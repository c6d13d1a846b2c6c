//! Sizes of IR shapes over a packed layout and the index maps between them (the element order is the
//! one documented in `rlx_compiler::ir`): broadcasting reads `value[map[e]]`, a reduction accumulates
//! `out[map[e]] += x[e]`.

use std::collections::HashMap;

use rlx_compiler::ir::{Feature, Level, Shape};

use crate::batch::Layout;

/// A layout with the per-element tables the interpreter needs.
pub struct Geometry {
    pub layout: Layout,
    pub response_group: Vec<usize>,
    pub token_response: Vec<usize>,
    /// For each ordered pair of distinct responses of a group: (i, j), in the documented order.
    pub pairs: Vec<(usize, usize)>,
    rubric_lens: Vec<usize>,
    maps: HashMap<(Shape, Shape), Vec<usize>>,
}

impl Geometry {
    pub fn new(layout: Layout, rubric_lens: Vec<usize>) -> Geometry {
        let response_group = layout.response_groups();
        let mut token_response = Vec::with_capacity(layout.tokens());
        for response in 0..layout.responses() {
            token_response.extend(std::iter::repeat_n(
                response,
                layout.response_length(response),
            ));
        }
        let mut pairs = Vec::new();
        for group in 0..layout.groups() {
            let members = layout.group_offsets[group]..layout.group_offsets[group + 1];
            for i in members.clone() {
                for j in members.clone() {
                    if i != j {
                        pairs.push((i, j));
                    }
                }
            }
        }
        Geometry {
            layout,
            response_group,
            token_response,
            pairs,
            rubric_lens,
            maps: HashMap::new(),
        }
    }

    /// How many elements a level has (without feature axis).
    pub fn level_size(&self, level: Level) -> usize {
        match level {
            Level::Batch => 1,
            Level::Group => self.layout.groups(),
            Level::Resp => self.layout.responses(),
            Level::Pair => self.pairs.len(),
            Level::Tok => self.layout.tokens(),
        }
    }

    /// The group of a base element of a level.
    fn group_of(&self, level: Level, base: usize) -> usize {
        match level {
            Level::Batch => 0,
            Level::Group => base,
            Level::Resp => self.response_group[base],
            Level::Pair => self.response_group[self.pairs[base].0],
            Level::Tok => self.response_group[self.token_response[base]],
        }
    }

    /// How many feature values base element `base` of `level` has on axis `feature`.
    pub fn feature_len(&self, feature: &Feature, level: Level, base: usize) -> usize {
        match feature {
            Feature::Crit => {
                if level == Level::Batch {
                    0
                } else {
                    self.layout.crit_count(self.group_of(level, base))
                }
            }
            Feature::Dim => self.layout.dim,
            Feature::Rubric { index, .. } => {
                self.rubric_lens.get(*index as usize).copied().unwrap_or(0)
            }
            Feature::Matrix { rows, cols } => {
                self.feature_len(rows, level, base) * self.feature_len(cols, level, base)
            }
        }
    }

    /// For each element (e, a·cols + b) of the matrix-shaped `matrix`, the element of `vector` (a
    /// vector along the matrix's rows axis when `rows`, else its columns axis, at the same or a
    /// coarser level) that it reads: (e, a) or (e, b). `SpreadRows`/`SpreadCols` read through it;
    /// `ContractCols`/`ContractRows` accumulate through it.
    pub fn matrix_map(&self, matrix: &Shape, vector: &Shape, rows: bool) -> Vec<usize> {
        let Some(Feature::Matrix { cols, .. }) = &matrix.feature else {
            return Vec::new();
        };
        let offsets = self.crit_offsets(vector);
        self.elements(matrix)
            .into_iter()
            .map(|(base, f)| {
                let width = self.feature_len(cols, matrix.level, base).max(1);
                let along = if rows { f / width } else { f % width };
                let up = self.lift(matrix.level, vector.level, base);
                self.index_of(vector, &offsets, up, along)
            })
            .collect()
    }

    /// Base element and feature index of every element of a shape.
    pub fn elements(&self, shape: &Shape) -> Vec<(usize, usize)> {
        let bases = self.level_size(shape.level);
        match &shape.feature {
            None => (0..bases).map(|b| (b, 0)).collect(),
            Some(feature) => {
                let mut out = Vec::new();
                for base in 0..bases {
                    for f in 0..self.feature_len(feature, shape.level, base) {
                        out.push((base, f));
                    }
                }
                out
            }
        }
    }

    pub fn size(&self, shape: &Shape) -> usize {
        match &shape.feature {
            None => self.level_size(shape.level),
            Some(Feature::Crit) => (0..self.level_size(shape.level))
                .map(|b| self.feature_len(&Feature::Crit, shape.level, b))
                .sum(),
            Some(feature) => {
                self.level_size(shape.level) * self.feature_len(feature, shape.level, 0)
            }
        }
    }

    /// The base element of `to` above base element `base` of `from` (`to` coarser or equal).
    fn lift(&self, from: Level, to: Level, base: usize) -> usize {
        if from == to {
            return base;
        }
        let response = match from {
            Level::Tok => self.token_response[base],
            Level::Pair => self.pairs[base].0,
            Level::Resp => base,
            Level::Group => return if to == Level::Batch { 0 } else { base },
            Level::Batch => return 0,
        };
        match to {
            Level::Resp => response,
            Level::Group => self.response_group[response],
            _ => 0,
        }
    }

    /// Index of element (base, f) in a shape.
    fn index_of(&self, shape: &Shape, offsets: &[usize], base: usize, f: usize) -> usize {
        match &shape.feature {
            None => base,
            Some(Feature::Crit) => offsets[base] + f,
            Some(feature) => base * self.feature_len(feature, shape.level, 0) + f,
        }
    }

    /// Start of each base element's features (for the ragged `crit` axis).
    fn crit_offsets(&self, shape: &Shape) -> Vec<usize> {
        if shape.feature != Some(Feature::Crit) {
            return Vec::new();
        }
        let mut offsets = Vec::with_capacity(self.level_size(shape.level) + 1);
        let mut total = 0;
        for base in 0..self.level_size(shape.level) {
            offsets.push(total);
            total += self.feature_len(&Feature::Crit, shape.level, base);
        }
        offsets.push(total);
        offsets
    }

    /// For each element of `fine`, the element of `coarse` above it.
    pub fn map(&mut self, fine: &Shape, coarse: &Shape) -> &[usize] {
        let key = (fine.clone(), coarse.clone());
        if !self.maps.contains_key(&key) {
            let offsets = self.crit_offsets(coarse);
            let map: Vec<usize> = self
                .elements(fine)
                .into_iter()
                .map(|(base, f)| {
                    let up = self.lift(fine.level, coarse.level, base);
                    let f = if coarse.feature.is_some() { f } else { 0 };
                    self.index_of(coarse, &offsets, up, f)
                })
                .collect();
            self.maps.insert(key.clone(), map);
        }
        &self.maps[&key]
    }

    /// For each pair-level element (p, f), the element of the `Resp`-level shape at response j.
    pub fn other_map(&mut self, pair: &Shape, resp: &Shape) -> Vec<usize> {
        let offsets = self.crit_offsets(resp);
        self.elements(pair)
            .into_iter()
            .map(|(p, f)| {
                self.index_of(
                    resp,
                    &offsets,
                    self.pairs[p].1,
                    if resp.feature.is_some() { f } else { 0 },
                )
            })
            .collect()
    }

    /// Position of every token within its response, of every response within its group.
    pub fn token_index(&self) -> Vec<f64> {
        (0..self.layout.tokens())
            .map(|t| (t - self.layout.token_offsets[self.token_response[t]]) as f64)
            .collect()
    }

    pub fn response_index(&self) -> Vec<f64> {
        (0..self.layout.responses())
            .map(|r| (r - self.layout.group_offsets[self.response_group[r]]) as f64)
            .collect()
    }
}
