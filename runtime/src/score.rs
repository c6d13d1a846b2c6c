//! `rlx score`: a checked recipe applied to rollouts from any trainer, as one JSON document.

use serde_json::{json, Map, Value};

use rlx_compiler::artifact::Artifact;
use rlx_compiler::hir::{GlobalId, GlobalKind, Recipe};
use rlx_compiler::ir::lower::ROLLOUT_SHOWN_PREFIX;
use rlx_compiler::ir::{
    Feature, Graph, Level, Op, RolloutInfo, RolloutValueInfo, Shape, Value as Builtin,
};
use rlx_core::{HasSignature, Signature};

use crate::batch::Layout;
use crate::geometry::Geometry;
use crate::interp::{evaluate, evaluate_showing, rubric_lens, Context, EvalError, Outcome};
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

/// Why scoring failed: the rollouts or the command's options (a message), or the recipe's
/// evaluation, typed (a non-finite output carries the expression that made it,
/// [`crate::nonfinite`]).
#[derive(Debug)]
pub enum ScoreError {
    Input(String),
    Eval(EvalError),
}

impl ScoreError {
    /// The non-finite output, when scoring failed on one.
    pub fn non_finite(&self) -> Option<&crate::nonfinite::NonFinite> {
        match self {
            ScoreError::Eval(error) => error.non_finite(),
            ScoreError::Input(_) => None,
        }
    }
}

impl From<String> for ScoreError {
    fn from(message: String) -> ScoreError {
        ScoreError::Input(message)
    }
}

impl From<EvalError> for ScoreError {
    fn from(error: EvalError) -> ScoreError {
        ScoreError::Eval(error)
    }
}

impl std::fmt::Display for ScoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScoreError::Input(message) => f.write_str(message),
            ScoreError::Eval(error) => write!(f, "{error}"),
        }
    }
}

impl std::error::Error for ScoreError {}

/// The result document and the warnings met on the way.
pub struct Scored {
    pub document: Value,
    /// Warnings about the rollouts.
    pub warnings: Vec<String>,
    /// Why the JIT was not used, when `Backend::Jit` fell back to the interpreter.
    pub fallback: Option<String>,
}

/// Score `rollouts` (JSONL text) with `recipe`, params overridden by `overrides`, on the reference
/// interpreter at step 0 (`score_at` chooses the engine, the step and the progress).
///
/// The document is `{"loss", "metrics": {NAME: x}, "responses": [{"group", "reward", "advantage",
/// "kept"}] (input order), "grad": {INPUT: …}}` (`grad` only when `with_gradients`); see
/// docs/formats.md.
pub fn score(
    recipe: &Recipe,
    rollouts: &str,
    overrides: &[(String, f64)],
    with_gradients: bool,
) -> Result<Scored, ScoreError> {
    score_at(
        recipe,
        rollouts,
        overrides,
        with_gradients,
        Backend::Interp,
        &[],
        &Context::default(),
    )
}

/// `score` on the chosen engine (`rlx score --backend`), with the values of the inputs and top-level
/// `let`s named in `show` under the document's `"show"` key (`rlx score --show`), as a trainer would
/// score at a point of its run: `context` gives the recipe's
/// `step` and `progress` (`rlx score --step --progress`). The document's `"rollout"` key has the
/// recipe's `rollout { … }` settings: constants and params as numbers, string lists as lists, and every
/// other expression evaluated on these rollouts at this step (one value per response for a
/// per-response setting such as RuscaRL's `scaffold`).
pub fn score_at(
    recipe: &Recipe,
    rollouts: &str,
    overrides: &[(String, f64)],
    with_gradients: bool,
    backend: Backend,
    show: &[String],
    context: &Context,
) -> Result<Scored, ScoreError> {
    score_at_with_state(
        recipe,
        rollouts,
        overrides,
        with_gradients,
        backend,
        show,
        context,
        &[],
    )
}

/// `score_at`, with the recipe's `state`s read at the values `state` gives by name (`rlx score
/// --state FILE`; a state it does not name reads its initial value). The updated state is in the
/// document's metrics as `state.NAME`, and under its `"state"` key (see `state_document`).
#[allow(clippy::too_many_arguments)]
pub fn score_at_with_state(
    recipe: &Recipe,
    rollouts: &str,
    overrides: &[(String, f64)],
    with_gradients: bool,
    backend: Backend,
    show: &[String],
    context: &Context,
    state: &[(String, f64)],
) -> Result<Scored, ScoreError> {
    let graph = rlx_compiler::compile_graph(recipe, overrides)?;
    let rollout = rlx_compiler::ir::rollout_settings(recipe, &graph);
    let shown_graph = shown_graph(recipe, &graph, overrides, show)?;
    let signature = recipe.signature();
    score_graphs(
        &graph,
        shown_graph.as_ref(),
        &signature,
        rollouts,
        with_gradients,
        backend,
        show,
        context,
        &rollout,
        state,
    )
}

/// The graph (of `graph`'s recipe) that keeps alive, by name, the top-level `let`s named in `show` and the recipe's
/// `rollout { … }` settings given by expressions (`compile_graph_showing_rollout`), for `score_read`;
/// `None` when there are neither. An unknown name in `show` is an error.
pub fn shown_graph(
    recipe: &Recipe,
    graph: &Graph,
    overrides: &[(String, f64)],
    show: &[String],
) -> Result<Option<Graph>, String> {
    let lets = top_level_lets(recipe);
    let names: Vec<&str> = lets.iter().map(|(_, name)| *name).collect();
    let shown: Vec<GlobalId> = resolve_show(&recipe.signature(), &names, show)?
        .into_iter()
        .filter_map(|name| match name {
            Showable::Let(index) => Some(lets[index].0),
            Showable::Input(_) => None,
        })
        .collect();
    let rollout_expressions = rlx_compiler::ir::rollout_settings(recipe, graph)
        .iter()
        .any(|s| matches!(s.value, RolloutValueInfo::Expression));
    Ok(match shown.is_empty() && !rollout_expressions {
        true => None,
        false => Some(rlx_compiler::compile_graph_showing_rollout(
            recipe, overrides, &shown, true,
        )?),
    })
}

/// `score_at` on a `.rlxc` artifact (`rlx score FILE.rlxc`): its graph, with `overrides` that must
/// repeat the compiled params (`Artifact::graph_with`); rollouts read against its signature; its
/// `rollout { … }` settings under the document's `"rollout"` key; and its `shown` graph (every top-level
/// `let` and rollout expression by name), evaluated on the interpreter when `show` names a `let` or a
/// rollout setting is an expression.
pub fn score_artifact(
    artifact: &Artifact,
    overrides: &[(String, f64)],
    rollouts: &str,
    with_gradients: bool,
    backend: Backend,
    show: &[String],
    context: &Context,
) -> Result<Scored, ScoreError> {
    score_artifact_with_state(
        artifact,
        overrides,
        rollouts,
        with_gradients,
        backend,
        show,
        context,
        &[],
    )
}

/// `score_artifact`, with the recipe's `state`s at the values `state` gives (`score_at_with_state`).
#[allow(clippy::too_many_arguments)]
pub fn score_artifact_with_state(
    artifact: &Artifact,
    overrides: &[(String, f64)],
    rollouts: &str,
    with_gradients: bool,
    backend: Backend,
    show: &[String],
    context: &Context,
    state: &[(String, f64)],
) -> Result<Scored, ScoreError> {
    let graph = artifact.graph_with(overrides).map_err(|e| e.to_string())?;
    let signature = artifact.signature();
    let shown = &artifact.shown;
    let names: Vec<&str> = shown_lets(shown);
    let shows_a_let = resolve_show(&signature, &names, show)?
        .iter()
        .any(|name| matches!(name, Showable::Let(_)));
    let rollout_expressions = artifact
        .rollout
        .iter()
        .any(|s| matches!(s.value, RolloutValueInfo::Expression));
    score_graphs(
        graph,
        (shows_a_let || rollout_expressions).then_some(shown),
        &signature,
        rollouts,
        with_gradients,
        backend,
        show,
        context,
        &artifact.rollout,
        state,
    )
}

/// Put the values of the recipe's `state`s that `state` names (by name) into the batch's inputs
/// for them. A name that is no state of the recipe, or a value that does not fit the state's type,
/// is an error naming it.
pub fn set_state(
    graph: &Graph,
    batch: &mut crate::batch::Batch,
    state: &[(String, f64)],
) -> Result<(), String> {
    // Every state reads its initial value (with the params as compiled) unless `state` gives one; a
    // rollout line never sets it.
    for info in &graph.states {
        if let Some(input) = batch.inputs.get_mut(info.input as usize) {
            *input = vec![info.init];
        }
    }
    for (name, value) in state {
        let Some(info) = graph.states.iter().find(|s| &s.name == name) else {
            let names: Vec<&str> = graph.states.iter().map(|s| s.name.as_str()).collect();
            return Err(format!(
                "the state given (`--state`) names `{name}`, which is no state of the recipe (its states: {})",
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            ));
        };
        if !info.elem.admits(*value) {
            return Err(format!(
                "the state given (`--state`) sets state `{name}`, which is {}, to {value}",
                info.elem.name()
            ));
        }
        match batch.inputs.get_mut(info.input as usize) {
            Some(input) => *input = vec![*value],
            None => return Err(format!("state `{name}`: internal error: no input for it")),
        }
    }
    Ok(())
}

/// The recipe's `state`s after a scored step, by name in declaration order: each state's update
/// (the metric `state.NAME` of `outcome`).
pub fn updated_state(graph: &Graph, metrics: &[(String, f64)]) -> Vec<(String, f64)> {
    graph
        .states
        .iter()
        .filter_map(|s| {
            let value = metrics.iter().find(|(n, _)| *n == s.metric)?.1;
            Some((s.name.clone(), value))
        })
        .collect()
}

/// A state file's JSON (`rlx score --state FILE`): an object of the states by name, each a number
/// (an integer for an `i32` state, `true`/`false` for a `bool` one) or, when not finite, the string
/// `inf`, `-inf` or `nan` (JSON has no such numbers).
pub fn state_json(graph: &Graph, state: &[(String, f64)]) -> Value {
    let elem_of = |name: &str| graph.states.iter().find(|s| s.name == name).map(|s| s.elem);
    let entries = state.iter().map(|(name, value)| {
        let value = if let (Some(rlx_compiler::ir::Elem::I32), true) =
            (elem_of(name), value.fract() == 0.0)
        {
            json!(*value as i64)
        } else if elem_of(name) == Some(rlx_compiler::ir::Elem::Bool) {
            json!(*value != 0.0)
        } else if value.is_finite() {
            json!(value)
        } else if value.is_nan() {
            json!("nan")
        } else if *value > 0.0 {
            json!("inf")
        } else {
            json!("-inf")
        };
        (name.clone(), value)
    });
    Value::Object(entries.collect())
}

/// Parse a state file's JSON (`state_json`'s form); `file` names it in errors.
pub fn parse_state(text: &str, file: &str) -> Result<Vec<(String, f64)>, String> {
    let value: Value = serde_json::from_str(text).map_err(|e| {
        format!(
            "{file}: not a JSON state file ({e}); expected an object such as {{\"coef\": 0.005}}"
        )
    })?;
    let Value::Object(entries) = value else {
        return Err(format!(
            "{file}: a state file is a JSON object of the recipe's states by name, not {}",
            match value {
                Value::Array(_) => "an array",
                Value::String(_) => "a string",
                Value::Number(_) => "a number",
                Value::Bool(_) => "a boolean",
                _ => "null",
            }
        ));
    };
    entries
        .into_iter()
        .map(|(name, value)| {
            let number = match &value {
                Value::Number(n) => n.as_f64(),
                Value::String(s) => match s.as_str() {
                    "inf" => Some(f64::INFINITY),
                    "-inf" => Some(f64::NEG_INFINITY),
                    _ => None,
                },
                Value::Bool(b) => Some(f64::from(u8::from(*b))),
                _ => None,
            };
            number.map(|v| (name.clone(), v)).ok_or_else(|| {
                format!("{file}: state `{name}` is {value}; expected a number, \"inf\" or \"-inf\"")
            })
        })
        .collect()
}

/// The top-level `let`s a graph keeps by name (its `outputs.shown`, less the rollout settings).
fn shown_lets(graph: &Graph) -> Vec<&str> {
    graph
        .outputs
        .shown
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| !n.starts_with(ROLLOUT_SHOWN_PREFIX))
        .collect()
}

/// The recipe's top-level `let`s, in declaration order.
fn top_level_lets(recipe: &Recipe) -> Vec<(GlobalId, &str)> {
    recipe
        .globals
        .iter()
        .enumerate()
        .filter(|(_, g)| g.kind == GlobalKind::Let)
        .map(|(index, g)| (GlobalId(index as u32), g.name.as_str()))
        .collect()
}

/// A name `--show` can print.
enum Showable {
    /// An input, by index.
    Input(usize),
    /// A top-level `let`, by index into the names `resolve_show` was given.
    Let(usize),
}

/// Resolve `--show` names: each an input of `recipe` or one of the top-level `let`s named in `lets`.
fn resolve_show(
    recipe: &Signature,
    lets: &[&str],
    show: &[String],
) -> Result<Vec<Showable>, String> {
    show.iter()
        .map(|name| {
            if let Some(index) = recipe.inputs.iter().position(|i| &i.name == name) {
                return Ok(Showable::Input(index));
            }
            if let Some(index) = lets.iter().position(|l| l == name) {
                return Ok(Showable::Let(index));
            }
            let inputs: Vec<&str> = recipe.inputs.iter().map(|i| i.name.as_str()).collect();
            let list = |names: &[&str]| match names.is_empty() {
                true => "none".to_string(),
                false => names.join(", "),
            };
            Err(format!(
                "--show {name}: the recipe has no input or top-level `let` of that name; inputs: {}; lets: {}",
                list(&inputs),
                list(lets)
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
#[allow(clippy::too_many_arguments)]
fn score_graphs(
    graph: &Graph,
    shown: Option<&Graph>,
    signature: &Signature,
    rollouts: &str,
    with_gradients: bool,
    backend: Backend,
    show: &[String],
    context: &Context,
    rollout: &[RolloutInfo],
    state: &[(String, f64)],
) -> Result<Scored, ScoreError> {
    let mut read = read_rollouts(rollouts, signature).map_err(|e| e.to_string())?;
    set_state(graph, &mut read.batch, state)?;
    score_read(
        graph,
        shown,
        signature,
        read,
        with_gradients,
        backend,
        show,
        context,
        rollout,
    )
}

/// The document of `score_graph` for a batch already read: from a rollout file, or from arrays
/// (`crate::arrays::ArrayBatch::to_rollouts`, the Python binding's `Recipe.score(**arrays)`);
/// `shown` is [`shown_graph`]'s graph (or an artifact's `shown`) when `show` names a `let` or a rollout
/// setting is an expression; `context` the step and progress; `rollout` the recipe's settings
/// (`rlx_compiler::ir::rollout_settings`, or an artifact's `rollout`).
#[allow(clippy::too_many_arguments)]
pub fn score_read(
    graph: &Graph,
    shown: Option<&Graph>,
    signature: &Signature,
    read: crate::rollouts::Rollouts,
    with_gradients: bool,
    backend: Backend,
    show: &[String],
    context: &Context,
    rollout: &[RolloutInfo],
) -> Result<Scored, ScoreError> {
    let lets: Vec<&str> = shown.map(shown_lets).unwrap_or_default();
    let names = resolve_show(signature, &lets, show)?;
    crate::batch::check_group_sizes_named(graph, &read.batch.layout, |g| {
        format!("group {}", read.groups[g])
    })?;
    if let Some(line) = read.unknown_length {
        if reads_token_counts(graph) || shown.is_some_and(reads_token_counts) {
            return Err(format!(
                "line {line}: the recipe reads each response's token count (`length`, `token_index` or a token-level value), but the line gives no token array and no `\"{LENGTH_KEY}\"`"
            ).into());
        }
    }
    let mut fallback = None;
    let mut shown_values = None;
    let outcome = match (backend, shown) {
        (Backend::Interp, Some(shown)) => {
            // One evaluation gives both: the shown graph computes the same outputs.
            let (outcome, values) = evaluate_showing(shown, &read.batch, context)?;
            shown_values = Some(values);
            outcome
        }
        _ => run(graph, &read.batch, context, backend, &mut fallback)?,
    };
    if let (None, Some(shown)) = (&shown_values, shown) {
        let (_, values) = evaluate_showing(shown, &read.batch, context)?;
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
    if !graph.states.is_empty() {
        document.insert(
            "state".into(),
            state_json(graph, &updated_state(graph, &outcome.metrics)),
        );
    }
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
    let no_values = Vec::new();
    let shown_values = shown_values.as_ref().unwrap_or(&no_values);
    let shown_value = |name: &str| -> Option<(Vec<Option<f64>>, Shape)> {
        let g = shown?;
        let (_, id) = g.outputs.shown.iter().find(|(n, _)| n == name)?;
        let (_, values) = shown_values.iter().find(|(n, _)| n == name)?;
        Some((values.clone(), g.node(*id).shape.clone()))
    };
    if !rollout.is_empty() {
        let mut settings = Map::new();
        for setting in rollout {
            let value = match &setting.value {
                RolloutValueInfo::Number(v) => json!(v),
                RolloutValueInfo::Strings(strings) => json!(strings),
                RolloutValueInfo::Expression => {
                    match shown_value(&format!("{ROLLOUT_SHOWN_PREFIX}{}", setting.key)) {
                        Some((values, shape)) => present(&values, &shape, &geometry, &by_line)
                            .map_err(|e| format!("the rollout setting `{}`: {e}", setting.key))?,
                        None => json!("expression"),
                    }
                }
            };
            settings.insert(setting.key.clone(), value);
        }
        document.insert("rollout".into(), Value::Object(settings));
    }
    if !show.is_empty() {
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
                Showable::Let(_) => shown_value(name)
                    .ok_or_else(|| format!("internal error: `{name}` was not kept"))?,
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

/// Evaluate `graph` on the chosen engine (the JIT falls back to the interpreter, saying why); a
/// non-finite output is explained by the interpreter on every engine (the executor's finiteness
/// check).
fn run(
    graph: &Graph,
    batch: &crate::batch::Batch,
    context: &Context,
    backend: Backend,
    fallback: &mut Option<String>,
) -> Result<Outcome, ScoreError> {
    let options = Options {
        accumulate: Precision::F64,
        storage: Precision::F64,
    };
    match backend {
        Backend::Interp => Ok(evaluate(graph, batch, context)?),
        Backend::Cuda(ordinal) => Ok(crate::cuda::evaluate_on_gpu(
            graph, batch, context, ordinal, &options,
        )?),
        Backend::Jit => match Kernel::compile(graph, &options) {
            Ok(kernel) => Ok(kernel.run(batch, context)?),
            Err(error) => {
                *fallback = Some(format!(
                    "the JIT cannot compile this recipe ({error}); using the interpreter"
                ));
                Ok(evaluate(graph, batch, context)?)
            }
        },
    }
}

/// A value over the whole batch (`values` in the IR element order of `shape`; `None` where a `keep`
/// filter dropped the element) as `rlx score` prints it (docs/formats.md), responses in input order
/// (`by_line`: the packed responses by line): a batch-level value is one number; a group-level value
/// one entry per group, groups in order of first appearance; a response-level value one entry per
/// response; a token-level value one array per response, one entry per token; a pair-level value one
/// array per response, one entry per other response of its group (in order). With a feature axis
/// (`crit`, `dim`, a rubric), each entry is the array of that element's feature values; with a matrix,
/// the array of its rows.
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
                let entry = match feature {
                    // A matrix: its rows, each an array (as a rollout line gives one).
                    Feature::Matrix { cols, .. } => {
                        let cols = geometry.feature_len(cols, level, base).max(1);
                        row.chunks(cols)
                            .map(|r| Value::Array(r.iter().map(number).collect()))
                            .collect()
                    }
                    _ => row.iter().map(number).collect(),
                };
                entries.push(Value::Array(entry));
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
        // As a rollout line gives a pair input: per response, its pairs with the others of its group.
        Level::Pair => {
            let mut first_pair = Vec::with_capacity(layout.groups());
            let mut pairs = 0usize;
            for g in 0..layout.groups() {
                first_pair.push(pairs);
                let n = layout.group_size(g);
                pairs += n * n.saturating_sub(1);
            }
            let groups = layout.response_groups();
            Value::Array(
                by_line
                    .iter()
                    .map(|&r| {
                        let g = groups[r];
                        let n = layout.group_size(g);
                        let start = first_pair[g] + (r - layout.group_offsets[g]) * (n - 1);
                        Value::Array(entries.get(start..start + n - 1).unwrap_or(&[]).to_vec())
                    })
                    .collect(),
            )
        }
    })
}
