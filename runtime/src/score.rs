//! `rlx score`: a checked recipe applied to rollouts from any trainer, as one JSON document.

use serde_json::{json, Map, Value};

use rlx_compiler::hir::{GlobalId, GlobalKind, Recipe};
use rlx_compiler::ir::{Graph, Level, Op, Shape, Value as Builtin};

use crate::batch::Layout;
use crate::geometry::Geometry;
use crate::interp::{evaluate, evaluate_showing, rubric_lens, Context, Outcome};
use crate::kernel::{Kernel, Options, Precision};
use crate::rollouts::{read_rollouts, LENGTH_KEY};

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
    score_with_backend(
        recipe,
        rollouts,
        overrides,
        with_gradients,
        Backend::Interp,
        &[],
    )
}

/// `score` on the chosen engine (`rlx score --backend`), with the values of the inputs and top-level
/// `let`s named in `show` under the document's `"show"` key (`rlx score --show`).
pub fn score_with_backend(
    recipe: &Recipe,
    rollouts: &str,
    overrides: &[(String, f64)],
    with_gradients: bool,
    backend: Backend,
    show: &[String],
) -> Result<Scored, String> {
    let graph = rlx_compiler::compile_graph(recipe, overrides)?;
    let shown_graph = shown_graph(recipe, overrides, show)?;
    score_graphs(
        &graph,
        shown_graph.as_ref(),
        recipe,
        rollouts,
        with_gradients,
        backend,
        show,
    )
}

/// The graph that keeps the top-level `let`s named in `show` (`compile_graph_showing`), for
/// `score_read`; `None` when `show` names inputs only. An unknown name is an error.
pub fn shown_graph(
    recipe: &Recipe,
    overrides: &[(String, f64)],
    show: &[String],
) -> Result<Option<Graph>, String> {
    let lets: Vec<GlobalId> = resolve_show(recipe, show, "")?
        .into_iter()
        .filter_map(|name| match name {
            Showable::Let(id) => Some(id),
            Showable::Input(_) => None,
        })
        .collect();
    Ok(match lets.is_empty() {
        true => None,
        false => Some(rlx_compiler::compile_graph_showing(
            recipe, overrides, &lets,
        )?),
    })
}

/// `score_with_backend` on a compiled graph: `declarations` is the recipe its rollouts are read
/// against (the checked recipe, or a `.rlxc` artifact's `Artifact::declarations`, which keeps no `let`,
/// so `show` may name inputs only).
pub fn score_graph(
    graph: &Graph,
    declarations: &Recipe,
    rollouts: &str,
    with_gradients: bool,
    backend: Backend,
    show: &[String],
) -> Result<Scored, String> {
    // An artifact's declarations have no `let`s.
    let hint = " (a compiled .rlxc keeps no `let` names: score the .rlx recipe to show one)";
    resolve_show(declarations, show, hint)?;
    score_graphs(
        graph,
        None,
        declarations,
        rollouts,
        with_gradients,
        backend,
        show,
    )
}

/// A name `--show` can print.
enum Showable {
    /// An input, by index.
    Input(usize),
    /// A top-level `let`.
    Let(GlobalId),
}

/// Resolve `--show` names against `recipe`: each an input or a top-level `let` (`hint` ends the error).
fn resolve_show(recipe: &Recipe, show: &[String], hint: &str) -> Result<Vec<Showable>, String> {
    let lets = || {
        recipe
            .globals
            .iter()
            .enumerate()
            .filter(|(_, g)| g.kind == GlobalKind::Let)
    };
    show.iter()
        .map(|name| {
            if let Some(index) = recipe.inputs.iter().position(|i| &i.name == name) {
                return Ok(Showable::Input(index));
            }
            if let Some((index, _)) = lets().find(|(_, g)| &g.name == name) {
                return Ok(Showable::Let(GlobalId(index as u32)));
            }
            let inputs: Vec<&str> = recipe.inputs.iter().map(|i| i.name.as_str()).collect();
            let named: Vec<&str> = lets().map(|(_, g)| g.name.as_str()).collect();
            let list = |names: &[&str]| match names.is_empty() {
                true => "none".to_string(),
                false => names.join(", "),
            };
            Err(format!(
                "--show {name}: the recipe has no input or top-level `let` of that name; inputs: {}; lets: {}{hint}",
                list(&inputs),
                list(&named)
            ))
        })
        .collect()
}

/// Whether evaluating `graph` needs each response's token count.
pub(crate) fn reads_token_counts(graph: &Graph) -> bool {
    graph.nodes.iter().any(|node| {
        node.shape.level == Level::Tok
            || matches!(node.op, Op::Value(Builtin::Length | Builtin::TokenIndex))
    })
}

/// `score_graph`, with `shown` (when `show` names a `let`): the graph of `compile_graph_showing`,
/// evaluated by the interpreter for those values.
fn score_graphs(
    graph: &Graph,
    shown: Option<&Graph>,
    declarations: &Recipe,
    rollouts: &str,
    with_gradients: bool,
    backend: Backend,
    show: &[String],
) -> Result<Scored, String> {
    let read = read_rollouts(rollouts, declarations).map_err(|e| e.to_string())?;
    score_read(
        graph,
        shown,
        declarations,
        read,
        with_gradients,
        backend,
        show,
    )
}

/// The document of `score_graph` for a batch already read: from a rollout file, or from arrays
/// (`crate::arrays::ArrayBatch::to_rollouts`, the Python binding's `Recipe.score(**arrays)`);
/// `shown` is `compile_graph_showing`'s graph when `show` names a `let`.
pub fn score_read(
    graph: &Graph,
    shown: Option<&Graph>,
    declarations: &Recipe,
    read: crate::rollouts::Rollouts,
    with_gradients: bool,
    backend: Backend,
    show: &[String],
) -> Result<Scored, String> {
    let recipe = declarations;
    let names = resolve_show(recipe, show, "")?;
    crate::batch::check_group_sizes_named(graph, &read.batch.layout, |g| {
        format!("group {}", read.groups[g])
    })?;
    if let Some(line) = read.unknown_length {
        if reads_token_counts(graph) || shown.is_some_and(reads_token_counts) {
            return Err(format!(
                "line {line}: the recipe reads each response's token count (`length`, `token_index` or a token-level value), but the line gives no token array and no `\"{LENGTH_KEY}\"`"
            ));
        }
    }
    let context = Context::default();
    let mut fallback = None;
    let mut shown_values = None;
    let outcome = match (backend, shown) {
        (Backend::Interp, Some(shown)) => {
            // One evaluation gives both: the shown graph computes the same outputs.
            let (outcome, values) =
                evaluate_showing(shown, &read.batch, &context).map_err(|e| e.to_string())?;
            shown_values = Some(values);
            outcome
        }
        _ => run(graph, &read.batch, &context, backend, &mut fallback)?,
    };
    if let (None, Some(shown)) = (&shown_values, shown) {
        let (_, values) =
            evaluate_showing(shown, &read.batch, &context).map_err(|e| e.to_string())?;
        shown_values = Some(values);
    }
    let layout = &read.batch.layout;
    let geometry = Geometry::new(layout.clone(), rubric_lens(graph));
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
            let input = graph
                .inputs
                .iter()
                .find(|i| &i.name == name)
                .ok_or_else(|| format!("internal error: a gradient for no input `{name}`"))?;
            let values: Vec<Option<f64>> = values.iter().copied().map(Some).collect();
            let value = present(&values, &input.shape, &geometry, &by_line)
                .map_err(|e| format!("the gradient with respect to `{name}`: {e}"))?;
            gradients.insert(name.clone(), value);
        }
        document.insert("grad".into(), Value::Object(gradients));
    }
    if !show.is_empty() {
        let lets = shown_values.unwrap_or_default();
        let mut shown_map = Map::new();
        for (name, showable) in show.iter().zip(&names) {
            let (values, shape): (Vec<Option<f64>>, Shape) = match showable {
                Showable::Input(index) => {
                    let input = graph
                        .inputs
                        .get(*index)
                        .ok_or_else(|| format!("internal error: no input #{index}"))?;
                    let values = read.batch.inputs.get(*index).cloned().unwrap_or_default();
                    (values.into_iter().map(Some).collect(), input.shape.clone())
                }
                Showable::Let(_) => {
                    let (values, shape) = shown
                        .and_then(|g| {
                            let (_, id) = g.outputs.shown.iter().find(|(n, _)| n == name)?;
                            let (_, values) = lets.iter().find(|(n, _)| n == name)?;
                            Some((values.clone(), g.node(*id).shape.clone()))
                        })
                        .ok_or_else(|| format!("internal error: `{name}` was not kept"))?;
                    (values, shape)
                }
            };
            let value = present(&values, &shape, &geometry, &by_line)
                .map_err(|e| format!("--show {name}: {e}"))?;
            shown_map.insert(name.clone(), value);
        }
        document.insert("show".into(), Value::Object(shown_map));
    }
    Ok(Scored {
        document: Value::Object(document),
        warnings: read.warnings,
        fallback,
    })
}

/// Evaluate `graph` on the chosen engine (the JIT falls back to the interpreter, saying why).
fn run(
    graph: &Graph,
    batch: &crate::batch::Batch,
    context: &Context,
    backend: Backend,
    fallback: &mut Option<String>,
) -> Result<Outcome, String> {
    let options = Options {
        accumulate: Precision::F64,
        storage: Precision::F64,
    };
    match backend {
        Backend::Interp => evaluate(graph, batch, context).map_err(|e| e.to_string()),
        Backend::Cuda(ordinal) => {
            crate::cuda::evaluate_on_gpu(graph, batch, context, ordinal, &options)
        }
        Backend::Jit => match Kernel::compile(graph, &options) {
            Ok(kernel) => kernel.run(batch, context).map_err(|e| e.to_string()),
            Err(error) => {
                *fallback = Some(format!(
                    "the JIT cannot compile this recipe ({error}); using the interpreter"
                ));
                evaluate(graph, batch, context).map_err(|e| e.to_string())
            }
        },
    }
}

/// A value over the whole batch (`values` in the IR element order of `shape`; `None` where a `keep`
/// filter dropped the element) as `rlx score` prints it (docs/formats.md), responses in input order
/// (`by_line`: the packed responses by line): a batch-level value is one number; a group-level value
/// one entry per group, groups in order of first appearance; a response-level value one entry per
/// response; a token-level value one array per response, one entry per token. With a feature axis
/// (`crit`, `dim`, a rubric), each entry is the array of that element's feature values.
fn present(
    values: &[Option<f64>],
    shape: &Shape,
    geometry: &Geometry,
    by_line: &[usize],
) -> Result<Value, String> {
    let expected = geometry.size(shape);
    if values.len() != expected {
        return Err(format!(
            "internal error: {} values for shape {shape}, which has {expected}",
            values.len()
        ));
    }
    let number = |x: &Option<f64>| x.map_or(Value::Null, |x| json!(x));
    // The entries of each base element of the level, in element order.
    let level = shape.level;
    let bases = geometry.level_size(level);
    let mut entries: Vec<Value> = Vec::with_capacity(bases);
    let mut at = 0usize;
    for base in 0..bases {
        match &shape.feature {
            None => {
                entries.push(values.get(at).map_or(Value::Null, number));
                at += 1;
            }
            Some(feature) => {
                let width = geometry.feature_len(feature, level, base);
                let row = values.get(at..at + width).unwrap_or(&[]);
                entries.push(Value::Array(row.iter().map(number).collect()));
                at += width;
            }
        }
    }
    let layout: &Layout = &geometry.layout;
    Ok(match level {
        Level::Batch => entries.into_iter().next().unwrap_or(Value::Null),
        Level::Group => Value::Array(entries),
        Level::Resp => Value::Array(
            by_line
                .iter()
                .map(|&r| entries.get(r).cloned().unwrap_or(Value::Null))
                .collect(),
        ),
        Level::Tok => Value::Array(
            by_line
                .iter()
                .map(|&r| {
                    let tokens = layout.token_offsets[r]..layout.token_offsets[r + 1];
                    Value::Array(entries.get(tokens).unwrap_or(&[]).to_vec())
                })
                .collect(),
        ),
        Level::Pair => return Err("a value per pair of responses has no printed form".into()),
    })
}
