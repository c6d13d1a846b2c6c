//! Synthetic packed batches for any recipe: used by the gradient checks, the backend agreement tests and
//! `rlx bench`. Deterministic for a seed; values follow the input naming convention (log-probabilities
//! are negative and close to each other, so ratios stay near 1).

use rlx_compiler::ir::{Elem, Feature, Graph, Level};

use crate::batch::{Batch, Layout};
use crate::geometry::Geometry;

/// SplitMix64: small, deterministic, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn range(&mut self, low: f64, high: f64) -> f64 {
        low + (high - low) * self.uniform()
    }

    /// Uniform integer in [low, high].
    pub fn int(&mut self, low: usize, high: usize) -> usize {
        low + (self.next_u64() % (high - low + 1) as u64) as usize
    }
}

/// The shape of a synthetic batch.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    pub groups: usize,
    /// Responses per group (the first group gets one response when `singleton` is set).
    pub responses: usize,
    /// Mean tokens per response; lengths vary in [tokens/2, 3·tokens/2] when `ragged`.
    pub tokens: usize,
    pub ragged: bool,
    pub singleton: bool,
    pub criteria: usize,
    pub dim: usize,
    pub seed: u64,
}

impl Default for Spec {
    fn default() -> Spec {
        Spec {
            groups: 3,
            responses: 4,
            tokens: 5,
            ragged: true,
            singleton: true,
            criteria: 3,
            dim: 4,
            seed: 1,
        }
    }
}

/// A batch with a value for every input of `graph`.
pub fn batch(graph: &Graph, spec: &Spec) -> Batch {
    let mut rng = Rng::new(spec.seed);
    let responses_per_group: Vec<usize> = (0..spec.groups)
        .map(|g| {
            if spec.singleton && g == 0 {
                1
            } else {
                spec.responses
            }
        })
        .collect();
    let total: usize = responses_per_group.iter().sum();
    let tokens: Vec<usize> = (0..total)
        .map(|_| {
            if spec.ragged {
                rng.int((spec.tokens / 2).max(1), spec.tokens + spec.tokens / 2)
            } else {
                spec.tokens
            }
        })
        .collect();
    let uses_crit = graph
        .inputs
        .iter()
        .any(|i| i.shape.feature == Some(Feature::Crit));
    let crits: Vec<usize> = if uses_crit {
        (0..spec.groups)
            .map(|_| rng.int(1, spec.criteria.max(1)))
            .collect()
    } else {
        Vec::new()
    };
    let uses_dim = graph.inputs.iter().any(|i| {
        i.shape.feature == Some(Feature::Dim)
            || i.shape
                .feature
                .as_ref()
                .and_then(|f| f.matrix())
                .is_some_and(|(rows, cols)| *rows == Feature::Dim || *cols == Feature::Dim)
    });
    let layout = Layout::from_counts(
        &responses_per_group,
        &tokens,
        &crits,
        if uses_dim { spec.dim } else { 0 },
    )
    .expect("synthetic counts form a valid layout");
    let geometry = Geometry::new(
        layout.clone(),
        graph.rubrics.iter().map(|r| r.criteria.len()).collect(),
    );
    // Shared per-token log-probability base so that logp, old_logp, ref_logp stay close.
    let base: Vec<f64> = (0..layout.tokens())
        .map(|_| rng.range(-2.5, -0.2))
        .collect();
    // Pair verdicts: the same class (three per batch, drawn per response) with a tenth of them flipped,
    // so that a verdict and its reverse sometimes disagree and classes vary in size.
    // (Drawn only for a recipe with such an input, so every other recipe's batch is unchanged.)
    let pair_verdicts = graph
        .inputs
        .iter()
        .any(|i| i.shape.level == Level::Pair && i.elem == Elem::Bool);
    let classes: Vec<usize> = if pair_verdicts {
        (0..layout.responses()).map(|_| rng.int(0, 2)).collect()
    } else {
        Vec::new()
    };
    let inputs = graph
        .inputs
        .iter()
        .map(|input| {
            let size = geometry.size(&input.shape);
            if input.shape.level == Level::Pair && input.elem == Elem::Bool {
                return geometry
                    .pairs
                    .iter()
                    .map(|&(i, j)| {
                        let same = classes[i] == classes[j];
                        f64::from(u8::from(same != (rng.uniform() < 0.1)))
                    })
                    .collect();
            }
            let log_prob = input.name.contains("logp") && input.shape.level == Level::Tok;
            (0..size)
                .map(|element| match input.elem {
                    Elem::Bool => f64::from(u8::from(rng.uniform() < 0.5)),
                    Elem::I32 => rng.int(0, 2) as f64,
                    Elem::F32 if log_prob => base[element] + rng.range(-0.15, 0.15),
                    Elem::F32 => rng.range(0.0, 1.0),
                })
                .collect()
        })
        .collect();
    Batch { layout, inputs }
}

/// A batch as a rollout file (docs/formats.md): one JSON line per response, the inverse of
/// `rollouts::read_rollouts`. Groups are named by their index; every line gives its `length`. The
/// recipe's `state`s are no rollout values (`rlx score --state` gives them) and are left out.
pub fn to_jsonl(graph: &Graph, batch: &Batch) -> String {
    use serde_json::{Map, Value};
    let mut geometry = Geometry::new(
        batch.layout.clone(),
        graph.rubrics.iter().map(|r| r.criteria.len()).collect(),
    );
    let groups = batch.layout.response_groups();
    let value = |elem: Elem, x: f64| match elem {
        Elem::Bool => Value::Bool(x != 0.0),
        Elem::I32 => Value::from(x as i64),
        Elem::F32 => Value::from(x),
    };
    // For each input: the base element (at the input's level) of each of its elements.
    let bases: Vec<Vec<usize>> = graph
        .inputs
        .iter()
        .map(|input| {
            geometry
                .map(
                    &input.shape,
                    &rlx_compiler::ir::Shape::new(input.shape.level),
                )
                .to_vec()
        })
        .collect();
    let mut out = String::new();
    for (response, &group) in groups.iter().enumerate() {
        let mut line = Map::new();
        line.insert("group".into(), Value::from(group));
        // The token count, said outright: a generated mask may end with 0 (docs/formats.md).
        line.insert(
            crate::rollouts::LENGTH_KEY.into(),
            Value::from(batch.layout.response_length(response)),
        );
        for (index, ((input, values), bases)) in graph
            .inputs
            .iter()
            .zip(&batch.inputs)
            .zip(&bases)
            .enumerate()
        {
            if graph.states.iter().any(|s| s.input as usize == index) {
                continue;
            }
            let mine: Vec<Value> = match input.shape.level {
                // This response's pairs (response, j), in order.
                Level::Pair => geometry
                    .pairs
                    .iter()
                    .zip(values)
                    .filter(|((i, _), _)| *i == response)
                    .map(|(_, x)| value(input.elem, *x))
                    .collect(),
                Level::Tok => {
                    let tokens = batch.layout.token_offsets[response]
                        ..batch.layout.token_offsets[response + 1];
                    tokens.map(|t| value(input.elem, values[t])).collect()
                }
                level => {
                    let base = match level {
                        Level::Batch => 0,
                        Level::Group => group,
                        _ => response,
                    };
                    bases
                        .iter()
                        .zip(values)
                        .filter(|(b, _)| **b == base)
                        .map(|(_, x)| value(input.elem, *x))
                        .collect()
                }
            };
            let matrix_cols = input
                .shape
                .feature
                .as_ref()
                .and_then(|f| f.matrix())
                .and_then(|(_, cols)| cols.fixed_len(batch.layout.dim));
            let entry = if let Some(cols) = matrix_cols {
                // A matrix: its rows, each an array.
                Value::Array(
                    mine.chunks(cols.max(1))
                        .map(|row| Value::Array(row.to_vec()))
                        .collect(),
                )
            } else if matches!(input.shape.level, Level::Tok | Level::Pair)
                || input.shape.feature.is_some()
            {
                Value::Array(mine)
            } else {
                mine.into_iter().next().unwrap_or(Value::Null)
            };
            line.insert(input.name.clone(), entry);
        }
        out.push_str(&Value::Object(line).to_string());
        out.push('\n');
    }
    out
}
