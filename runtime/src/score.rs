//! `rlx score`: a checked recipe applied to rollouts from any trainer, as one JSON document.

use serde_json::{json, Map, Value};

use rlx_compiler::hir::Recipe;
use rlx_compiler::ir::Level;

use crate::interp::{evaluate, Context};
use crate::kernel::{Kernel, Options, Precision};
use crate::rollouts::read_rollouts;

/// Which engine evaluates the recipe.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    /// The f64 reference interpreter.
    Interp,
    /// Compiled kernels (`crate::kernel`), with f64 storage and accumulation so the scores are those of
    /// the interpreter up to summation order; falls back to the interpreter when the recipe has no
    /// kernel form.
    #[default]
    Jit,
    /// The same kernels as CUDA C on GPU N (`crate::cuda`, feature `cuda`), f64 storage and
    /// accumulation; an error, not a fallback, when the recipe has no CUDA form.
    Cuda(usize),
}

/// The result document and the warnings met on the way.
pub struct Scored {
    pub document: Value,
    /// Warnings about the rollouts.
    pub warnings: Vec<String>,
    /// Why the JIT was not used, when `Backend::Jit` fell back to the interpreter.
    pub fallback: Option<String>,
}

/// Score `rollouts` (JSONL text) with `recipe`, params overridden by `overrides`, on the reference
/// interpreter (`score_with_backend` chooses the engine).
///
/// The document is `{"loss", "metrics": {NAME: x}, "responses": [{"group", "reward", "advantage",
/// "kept"}] (input order), "grad": {INPUT: …}}` (`grad` only when `with_gradients`); see
/// docs/formats.md.
pub fn score(
    recipe: &Recipe,
    rollouts: &str,
    overrides: &[(String, f64)],
    with_gradients: bool,
) -> Result<Scored, String> {
    score_with_backend(recipe, rollouts, overrides, with_gradients, Backend::Interp)
}

/// `score` on the chosen engine (`rlx score --backend`).
pub fn score_with_backend(
    recipe: &Recipe,
    rollouts: &str,
    overrides: &[(String, f64)],
    with_gradients: bool,
    backend: Backend,
) -> Result<Scored, String> {
    let graph = rlx_compiler::compile_graph(recipe, overrides)?;
    score_graph(&graph, recipe, rollouts, with_gradients, backend)
}

/// `score_with_backend` on a compiled graph: `declarations` is the recipe its rollouts are read
/// against (the checked recipe, or a `.rlxc` artifact's `Artifact::declarations`).
pub fn score_graph(
    graph: &rlx_compiler::ir::Graph,
    declarations: &Recipe,
    rollouts: &str,
    with_gradients: bool,
    backend: Backend,
) -> Result<Scored, String> {
    let recipe = declarations;
    let read = read_rollouts(rollouts, recipe).map_err(|e| e.to_string())?;
    crate::batch::check_group_sizes_named(graph, &read.batch.layout, |g| {
        format!("group {}", read.groups[g])
    })?;
    let context = Context::default();
    let mut fallback = None;
    let kernel = match backend {
        Backend::Interp | Backend::Cuda(_) => None,
        Backend::Jit => {
            let options = Options {
                accumulate: Precision::F64,
                storage: Precision::F64,
            };
            match Kernel::compile(graph, &options) {
                Ok(kernel) => Some(kernel),
                Err(error) => {
                    fallback = Some(format!(
                        "the JIT cannot compile this recipe ({error}); using the interpreter"
                    ));
                    None
                }
            }
        }
    };
    let outcome = match (&kernel, backend) {
        (_, Backend::Cuda(ordinal)) => {
            let options = Options {
                accumulate: Precision::F64,
                storage: Precision::F64,
            };
            crate::cuda::evaluate_on_gpu(graph, &read.batch, &context, ordinal, &options)?
        }
        (Some(kernel), _) => kernel
            .run(&read.batch, &context)
            .map_err(|e| e.to_string())?,
        (None, _) => evaluate(graph, &read.batch, &context).map_err(|e| e.to_string())?,
    };
    let layout = &read.batch.layout;
    let responses = layout.responses();
    let groups = layout.response_groups();
    // Responses in input order.
    let mut by_line: Vec<usize> = (0..responses).collect();
    by_line.sort_by_key(|&r| read.line_of_response[r]);
    let response_entries: Vec<Value> = by_line
        .iter()
        .map(|&r| {
            let mut entry = Map::new();
            entry.insert("group".into(), read.groups[groups[r]].clone());
            if let Some(reward) = &outcome.reward {
                entry.insert("reward".into(), json!(reward[r]));
            }
            if let Some(advantage) = &outcome.advantage {
                entry.insert("advantage".into(), json!(advantage[r]));
            }
            entry.insert("kept".into(), json!(outcome.kept[r]));
            Value::Object(entry)
        })
        .collect();
    let mut document = Map::new();
    document.insert(
        "loss".into(),
        outcome.loss.map_or(Value::Null, |l| json!(l)),
    );
    let metrics: Map<String, Value> = outcome
        .metrics
        .iter()
        .map(|(n, v)| (n.clone(), json!(v)))
        .collect();
    document.insert("metrics".into(), Value::Object(metrics));
    document.insert("responses".into(), Value::Array(response_entries));
    if with_gradients {
        let mut gradients = Map::new();
        for (name, values) in &outcome.gradients {
            let input = graph.inputs.iter().find(|i| &i.name == name);
            let level = input.map(|i| i.shape.level);
            let value = match level {
                Some(Level::Tok) => Value::Array(
                    by_line
                        .iter()
                        .map(|&r| {
                            json!(values[layout.token_offsets[r]..layout.token_offsets[r + 1]])
                        })
                        .collect(),
                ),
                Some(Level::Resp) if input.is_some_and(|i| i.shape.feature.is_none()) => {
                    Value::Array(by_line.iter().map(|&r| json!(values[r])).collect())
                }
                _ => json!(values),
            };
            gradients.insert(name.clone(), value);
        }
        document.insert("grad".into(), Value::Object(gradients));
    }
    Ok(Scored {
        document: Value::Object(document),
        warnings: read.warnings,
        fallback,
    })
}
