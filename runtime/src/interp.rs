//! The reference interpreter: evaluates an IR graph over a packed batch in f64. It is the oracle every
//! backend is tested against, so it is written for clarity, not speed.
//!
//! # Filters and defined edge cases
//! - With `keep` sections, evaluation has two phases. Phase 1 computes, on the whole batch, the reward,
//!   the keep conditions and what they depend on. Responses whose group or own condition is false are
//!   dropped (a group left without responses is dropped too). Phase 2 computes everything else
//!   (advantages, loss, metrics, gradients) on the kept responses only; values computed in phase 1 are
//!   carried over, not recomputed (so a response's reward does not change because another was dropped).
//!   Dropped responses get advantage 0 and gradient 0.
//! - A reduction over no element: `sum` 0, `mean` 0, `max`/`min` 0, `count` 0, `var`/`std` 0 (also when
//!   there are no more elements than `ddof`, e.g. a group of one response with `ddof = 1`).
//! - A group of one response: `… over others` reduces over nothing (see above).
//! - A response with no token: token reductions give the empty results above.
//! - A rubric whose criteria have no positive points: the points score is 0 (see `std/rubric`).
//! - Every response filtered out: an error, not a NaN loss.
//! - A non-finite reward, advantage, loss, metric or gradient is an error naming it.

use rlx_compiler::ir::{fold, Feature, Graph, KeepLevel, Level, NodeId, Op, Shape, Value};

use crate::batch::{Batch, Layout};
use crate::geometry::Geometry;
use crate::nonfinite::{NonFinite, Output, ToBatch};

/// Training-time values a recipe can read (`step`, `progress`); both 0 when scoring.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Context {
    pub step: f64,
    pub progress: f64,
}

/// What one evaluation produced. Per-response vectors are in packed order over the whole batch.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub loss: Option<f64>,
    pub metrics: Vec<(String, f64)>,
    pub reward: Option<Vec<f64>>,
    pub advantage: Option<Vec<f64>>,
    pub kept: Vec<bool>,
    /// ∂loss/∂input for each differentiable input: (input name, values in the input's element order).
    pub gradients: Vec<(String, Vec<f64>)>,
}

/// Why an evaluation (by the interpreter, a compiled kernel or a CUDA kernel) failed.
#[derive(Clone, Debug, PartialEq)]
pub enum EvalError {
    /// The batch does not fit the recipe's signature (`rlx_core::Signature::validate`: its layout,
    /// its sizes, an input's count of values).
    Batch(rlx_core::CoreError),
    /// A group has more responses than a recipe with pairwise terms accepts: the message of
    /// `batch::check_group_sizes`.
    GroupSize(String),
    /// Input `input`'s value at `position` (in its element order) is beyond the range of the f32
    /// storage of a kernel.
    OutOfRange {
        input: String,
        position: usize,
        value: f64,
    },
    /// Input `input` is stored in `stored` precision, but the kernel reads `wanted`.
    Storage {
        input: String,
        stored: &'static str,
        wanted: &'static str,
    },
    /// Every response was filtered out by `keep` ([`ALL_FILTERED`]): not a failure of the recipe,
    /// but a batch with nothing to compute on (the trainer's dynamic sampling reads it as "no group
    /// kept").
    AllFiltered,
    /// An output is not finite; the interpreter names the expression that made it
    /// ([`crate::nonfinite`]).
    NonFinite(Box<crate::nonfinite::NonFinite>),
    /// The device (CUDA) failed, or cannot run this batch: what it said.
    Device(String),
    /// A broken invariant of an evaluator (a bug): what broke.
    Internal(String),
}

/// The error message when a recipe's `keep` filters drop every response (nothing to compute
/// advantages and the loss over), [`EvalError::AllFiltered`].
pub const ALL_FILTERED: &str =
    "every response was filtered out by `keep`: there is nothing to compute advantages and the loss over";

impl EvalError {
    /// The error of a batch whose every response the recipe's `keep` filters dropped ([`ALL_FILTERED`]).
    pub fn all_filtered() -> EvalError {
        EvalError::AllFiltered
    }

    /// Whether this is [`EvalError::AllFiltered`]: not a failure of the recipe, but a batch with
    /// nothing to compute on.
    pub fn is_all_filtered(&self) -> bool {
        matches!(self, EvalError::AllFiltered)
    }

    /// The non-finite output, when this is one.
    pub fn non_finite(&self) -> Option<&crate::nonfinite::NonFinite> {
        match self {
            EvalError::NonFinite(non_finite) => Some(non_finite),
            _ => None,
        }
    }

    /// This error, with the culprit of a non-finite output found when it has none yet (a compiled
    /// or CUDA kernel's): the f64 interpreter evaluates `graph` on `batch` again — only on this
    /// failure path — and names the first node whose value is not finite for the offending
    /// element. When the interpreter computes the outputs finite, the error says so.
    pub fn explained(self, graph: &Graph, batch: &Batch, context: &Context) -> EvalError {
        match &self {
            EvalError::NonFinite(non_finite) if non_finite.culprit.is_none() => {
                match evaluate(graph, batch, context) {
                    Err(EvalError::NonFinite(found)) if found.culprit.is_some() => {
                        EvalError::NonFinite(found)
                    }
                    Ok(_) => {
                        let mut non_finite = non_finite.clone();
                        non_finite.interpreter_finite = true;
                        EvalError::NonFinite(non_finite)
                    }
                    Err(_) => self,
                }
            }
            _ => self,
        }
    }
}

impl std::fmt::Display for EvalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EvalError::Batch(error) => write!(f, "{error}"),
            EvalError::GroupSize(message) => f.write_str(message),
            EvalError::OutOfRange {
                input,
                position,
                value,
            } => write!(
                f,
                "malformed batch: input `{input}` element {position} is {value}, beyond the range of f32"
            ),
            EvalError::Storage {
                input,
                stored,
                wanted,
            } => write!(
                f,
                "malformed batch: input `{input}` is stored as {stored}, the kernel reads {wanted}"
            ),
            EvalError::AllFiltered => f.write_str(ALL_FILTERED),
            EvalError::NonFinite(non_finite) => write!(f, "{non_finite}"),
            EvalError::Device(message) => write!(f, "CUDA device: {message}"),
            EvalError::Internal(what) => write!(f, "internal: {what}"),
        }
    }
}

impl std::error::Error for EvalError {}

pub(crate) fn rubric_lens(graph: &Graph) -> Vec<usize> {
    graph.rubrics.iter().map(|r| r.criteria.len()).collect()
}

/// Check that the batch fits the graph's signature (`rlx_core::Signature::validate`: a valid layout,
/// one vector of the right length per input), then that its groups are within the pairwise limit
/// (`batch::check_group_sizes`).
pub fn check_batch(graph: &Graph, batch: &Batch) -> Result<(), EvalError> {
    graph
        .signature()
        .validate(&batch.layout, batch.inputs.iter().map(Vec::len))
        .map_err(EvalError::Batch)?;
    crate::batch::check_group_sizes(graph, &batch.layout).map_err(EvalError::GroupSize)
}

/// Evaluate every output of `graph` on `batch`.
pub fn evaluate(graph: &Graph, batch: &Batch, context: &Context) -> Result<Outcome, EvalError> {
    evaluate_showing(graph, batch, context).map(|(outcome, _)| outcome)
}

/// A value of `Outputs::shown` over the whole batch, in its node's element order: `None` for the
/// elements of responses (and groups) a `keep` filter dropped before the value was computed.
pub type Shown = (String, Vec<Option<f64>>);

/// `evaluate`, also giving the value of every `graph.outputs.shown` node (`rlx score --show`).
pub fn evaluate_showing(
    graph: &Graph,
    batch: &Batch,
    context: &Context,
) -> Result<(Outcome, Vec<Shown>), EvalError> {
    check_batch(graph, batch)?;
    let layout = &batch.layout;
    let responses = layout.responses();
    let outputs = &graph.outputs;
    let mut full = Evaluator::new(
        graph,
        Geometry::new(layout.clone(), rubric_lens(graph)),
        &batch.inputs,
        context,
    );

    if outputs.keeps.is_empty() {
        full.run_all()?;
        let reward = outputs
            .reward
            .map(|id| full.at_shape(id, &Shape::new(Level::Resp)));
        let advantage = outputs
            .advantage
            .map(|id| full.at_shape(id, &Shape::new(Level::Resp)));
        let gradients = outputs
            .gradients
            .iter()
            .map(|(input, id)| {
                let shape = graph.inputs[*input as usize].shape.clone();
                (
                    graph.inputs[*input as usize].name.clone(),
                    full.at_shape(*id, &shape),
                )
            })
            .collect();
        let outcome = Outcome {
            loss: outputs.loss.map(|id| full.scalar(id)),
            metrics: outputs
                .metrics
                .iter()
                .map(|(name, id)| (name.clone(), full.scalar(*id)))
                .collect(),
            reward,
            advantage,
            kept: vec![true; responses],
            gradients,
        };
        let shown = outputs
            .shown
            .iter()
            .map(|(name, id)| {
                (
                    name.clone(),
                    full.value(*id).iter().copied().map(Some).collect(),
                )
            })
            .collect();
        let outcome = finite(outcome).map_err(|error| {
            explain(error, |output, value_position| {
                let (node, shape) = output_node(graph, output)?;
                let element = match value_position {
                    Some(position) => {
                        let node_shape = graph.node(node).shape.clone();
                        *full.geometry.map(&shape, &node_shape).get(position)?
                    }
                    None => 0,
                };
                full.culprit(node, Some(element), &ToBatch { kept: None })
            })
        })?;
        return Ok((outcome, shown));
    }

    // Phase 1: rewards and filters on the whole batch.
    let mut phase_one_roots: Vec<NodeId> = outputs.keeps.iter().map(|(_, id)| *id).collect();
    phase_one_roots.extend(outputs.reward);
    let phase_one = graph.cone(&phase_one_roots);
    full.run(&phase_one)?;
    let mut group_kept = vec![true; layout.groups()];
    let mut response_kept = vec![true; responses];
    for (level, id) in &outputs.keeps {
        match level {
            KeepLevel::Group => {
                let values = full.at_shape(*id, &Shape::new(Level::Group));
                for (kept, value) in group_kept.iter_mut().zip(values) {
                    *kept &= value != 0.0;
                }
            }
            KeepLevel::Resp => {
                let values = full.at_shape(*id, &Shape::new(Level::Resp));
                for (kept, value) in response_kept.iter_mut().zip(values) {
                    *kept &= value != 0.0;
                }
            }
        }
    }
    let response_group = layout.response_groups();
    let kept: Vec<bool> = (0..responses)
        .map(|r| group_kept[response_group[r]] && response_kept[r])
        .collect();
    if !kept.iter().any(|k| *k) {
        return Err(EvalError::all_filtered());
    }
    let reward = outputs
        .reward
        .map(|id| full.at_shape(id, &Shape::new(Level::Resp)));

    // Phase 2: the kept responses.
    let selection = Selection::new(layout, &kept);
    let sub_layout = selection.layout.clone();
    let mut sub_geometry = Geometry::new(sub_layout, rubric_lens(graph));
    let sub_inputs: Vec<Vec<f64>> = graph
        .inputs
        .iter()
        .zip(&batch.inputs)
        .map(|(input, values)| {
            selection.slice(&mut full.geometry, &mut sub_geometry, &input.shape, values)
        })
        .collect();
    let mut sub = Evaluator::new(graph, sub_geometry, &sub_inputs, context);
    for (index, live) in phase_one.iter().enumerate() {
        if *live {
            if let Some(values) = &full.values[index] {
                let shape = &graph.nodes[index].shape;
                let sliced = selection.slice(&mut full.geometry, &mut sub.geometry, shape, values);
                sub.values[index] = Some(sliced);
            }
        }
    }
    sub.run_all()?;
    let advantage = outputs.advantage.map(|id| {
        let kept_values = sub.at_shape(id, &Shape::new(Level::Resp));
        selection.scatter_responses(&kept_values, responses)
    });
    let gradients = outputs
        .gradients
        .iter()
        .map(|(input, id)| {
            let info = &graph.inputs[*input as usize];
            let kept_values = sub.at_shape(*id, &info.shape);
            let full_values = selection.scatter(
                &mut full.geometry,
                &mut sub.geometry,
                &info.shape,
                &kept_values,
            );
            (info.name.clone(), full_values)
        })
        .collect();
    let outcome = Outcome {
        loss: outputs.loss.map(|id| sub.scalar(id)),
        metrics: outputs
            .metrics
            .iter()
            .map(|(name, id)| (name.clone(), sub.scalar(*id)))
            .collect(),
        reward,
        advantage,
        kept,
        gradients,
    };
    let shown = outputs
        .shown
        .iter()
        .map(|(name, id)| {
            let values = if phase_one[id.0 as usize] {
                full.value(*id).iter().copied().map(Some).collect()
            } else {
                let shape = graph.node(*id).shape.clone();
                let kept_values = sub.value(*id).to_vec();
                selection.scatter_kept(&mut full.geometry, &mut sub.geometry, &shape, &kept_values)
            };
            (name.clone(), values)
        })
        .collect();
    let outcome = finite(outcome).map_err(|error| {
        explain(error, |output, _| {
            let (node, _) = output_node(graph, output)?;
            if matches!(output, Output::Reward { .. }) {
                // Rewards are computed on the whole batch (phase 1).
                return full.culprit(node, None, &ToBatch { kept: None });
            }
            let kept = Some((selection.kept_responses.as_slice(), layout));
            sub.culprit(node, None, &ToBatch { kept })
        })
    })?;
    Ok((outcome, shown))
}

/// Reject non-finite outputs, naming the first one (without its culprit: `Evaluator::culprit` finds
/// it).
pub(crate) fn finite(outcome: Outcome) -> Result<Outcome, EvalError> {
    match first_non_finite(&outcome) {
        Some(non_finite) => Err(EvalError::NonFinite(Box::new(non_finite))),
        None => Ok(outcome),
    }
}

/// `error` with the culprit `find` gives for its non-finite output (`find` receives the output and,
/// for a per-response output or a gradient, the position of the non-finite value in the output's
/// order).
fn explain(
    error: EvalError,
    find: impl FnOnce(&Output, Option<usize>) -> Option<crate::nonfinite::Culprit>,
) -> EvalError {
    match error {
        EvalError::NonFinite(mut non_finite) => {
            let position = match &non_finite.output {
                Output::Loss | Output::Metric(_) => None,
                Output::Reward { response } | Output::Advantage { response } => Some(*response),
                Output::Gradient { element, .. } => Some(*element),
            };
            non_finite.culprit = find(&non_finite.output, position);
            EvalError::NonFinite(non_finite)
        }
        other => other,
    }
}

/// The node of an output, and the shape the outcome reads it at.
fn output_node(graph: &Graph, output: &Output) -> Option<(NodeId, Shape)> {
    let outputs = &graph.outputs;
    let resp = Shape::new(Level::Resp);
    match output {
        Output::Loss => Some((outputs.loss?, Shape::BATCH)),
        Output::Metric(name) => {
            let (_, id) = outputs.metrics.iter().find(|(n, _)| n == name)?;
            Some((*id, Shape::BATCH))
        }
        Output::Reward { .. } => Some((outputs.reward?, resp)),
        Output::Advantage { .. } => Some((outputs.advantage?, resp)),
        Output::Gradient { input, .. } => {
            let (index, id) = outputs.gradients.iter().find(|(i, _)| {
                graph
                    .inputs
                    .get(*i as usize)
                    .is_some_and(|x| &x.name == input)
            })?;
            Some((*id, graph.inputs[*index as usize].shape.clone()))
        }
    }
}

/// The first non-finite output of `outcome`: the loss, a metric, a reward, an advantage, a gradient.
fn first_non_finite(outcome: &Outcome) -> Option<NonFinite> {
    if let Some(loss) = outcome.loss.filter(|l| !l.is_finite()) {
        return Some(NonFinite::new(Output::Loss, loss));
    }
    for (name, value) in &outcome.metrics {
        if !value.is_finite() {
            return Some(NonFinite::new(Output::Metric(name.clone()), *value));
        }
    }
    for (advantage, values) in [(false, &outcome.reward), (true, &outcome.advantage)] {
        let Some(values) = values else { continue };
        if let Some(response) = values.iter().position(|v| !v.is_finite()) {
            let output = if advantage {
                Output::Advantage { response }
            } else {
                Output::Reward { response }
            };
            return Some(NonFinite::new(output, values[response]));
        }
    }
    for (name, values) in &outcome.gradients {
        if let Some(element) = values.iter().position(|v| !v.is_finite()) {
            let output = Output::Gradient {
                input: name.clone(),
                element,
            };
            return Some(NonFinite::new(output, values[element]));
        }
    }
    None
}

/// Which responses (and so groups, tokens, criteria, pairs) survive the filters.
pub(crate) struct Selection {
    pub(crate) layout: Layout,
    pub(crate) kept_responses: Vec<usize>,
    kept_groups: Vec<usize>,
}

impl Selection {
    pub(crate) fn new(layout: &Layout, kept: &[bool]) -> Selection {
        let mut responses_per_group = Vec::new();
        let mut tokens = Vec::new();
        let mut crits = Vec::new();
        let mut kept_responses = Vec::new();
        let mut kept_groups = Vec::new();
        for group in 0..layout.groups() {
            let members: Vec<usize> = (layout.group_offsets[group]
                ..layout.group_offsets[group + 1])
                .filter(|&r| kept[r])
                .collect();
            if members.is_empty() {
                continue;
            }
            kept_groups.push(group);
            responses_per_group.push(members.len());
            crits.push(layout.crit_count(group));
            for r in members {
                tokens.push(layout.response_length(r));
                kept_responses.push(r);
            }
        }
        let layout = Layout::from_counts(&responses_per_group, &tokens, &crits, layout.dim)
            .expect("a sub-layout of a valid layout is valid");
        Selection {
            layout,
            kept_responses,
            kept_groups,
        }
    }

    /// For each element of `shape` over the kept batch, its element over the full batch.
    pub(crate) fn element_map(
        &self,
        full: &mut Geometry,
        sub: &mut Geometry,
        shape: &Shape,
    ) -> Vec<usize> {
        // Map the base elements, then the features, through the positions of kept responses/groups.
        let base_map: Vec<usize> = match shape.level {
            Level::Batch => vec![0],
            Level::Group => self.kept_groups.clone(),
            Level::Resp => self.kept_responses.clone(),
            Level::Tok => self
                .kept_responses
                .iter()
                .flat_map(|&r| full.layout.token_offsets[r]..full.layout.token_offsets[r + 1])
                .collect(),
            Level::Pair => {
                // Pair (i, j) of group g is at g's first pair + (i − first)·(n − 1) + (j − first),
                // less one when j is after i (no pair (i, i)).
                let layout = &full.layout;
                let mut first_pair = Vec::with_capacity(layout.groups());
                let mut pairs = 0;
                for g in 0..layout.groups() {
                    first_pair.push(pairs);
                    let n = layout.group_size(g);
                    pairs += n * n.saturating_sub(1);
                }
                sub.pairs
                    .iter()
                    .map(|&(i, j)| {
                        let (i, j) = (self.kept_responses[i], self.kept_responses[j]);
                        let g = full.response_group[i];
                        let first = layout.group_offsets[g];
                        let n = layout.group_size(g);
                        let (a, b) = (i - first, j - first);
                        first_pair[g] + a * (n - 1) + b - usize::from(b > a)
                    })
                    .collect()
            }
        };
        match &shape.feature {
            None => base_map,
            Some(feature) => {
                let full_level = Shape::new(shape.level);
                let full_map = full.map(shape, &full_level).to_vec();
                let sub_map = sub.map(shape, &full_level).to_vec();
                // Elements of each full base element, in order.
                let mut starts = vec![usize::MAX; full.level_size(shape.level)];
                for (element, base) in full_map.iter().enumerate() {
                    if starts[*base] == usize::MAX {
                        starts[*base] = element;
                    }
                }
                let mut previous_base = usize::MAX;
                let mut f = 0;
                let _ = feature;
                sub_map
                    .iter()
                    .map(|&sub_base| {
                        if sub_base == previous_base {
                            f += 1;
                        } else {
                            previous_base = sub_base;
                            f = 0;
                        }
                        starts[base_map[sub_base]] + f
                    })
                    .collect()
            }
        }
    }

    pub(crate) fn slice(
        &self,
        full: &mut Geometry,
        sub: &mut Geometry,
        shape: &Shape,
        values: &[f64],
    ) -> Vec<f64> {
        if values.len() == 1 && shape.level == Level::Batch && shape.feature.is_none() {
            return values.to_vec();
        }
        let map = self.element_map(full, sub, shape);
        map.iter()
            .map(|&e| values.get(e).copied().unwrap_or(0.0))
            .collect()
    }

    pub(crate) fn scatter(
        &self,
        full: &mut Geometry,
        sub: &mut Geometry,
        shape: &Shape,
        kept_values: &[f64],
    ) -> Vec<f64> {
        let mut out = vec![0.0; full.size(shape)];
        if shape.level == Level::Batch {
            return kept_values.to_vec();
        }
        let map = self.element_map(full, sub, shape);
        for (value, element) in kept_values.iter().zip(map) {
            out[element] = *value;
        }
        out
    }

    /// `scatter` with `None`, not 0, at the elements of dropped responses and groups.
    pub(crate) fn scatter_kept(
        &self,
        full: &mut Geometry,
        sub: &mut Geometry,
        shape: &Shape,
        kept_values: &[f64],
    ) -> Vec<Option<f64>> {
        if shape.level == Level::Batch {
            return kept_values.iter().copied().map(Some).collect();
        }
        let mut out = vec![None; full.size(shape)];
        for (value, element) in kept_values.iter().zip(self.element_map(full, sub, shape)) {
            if let Some(slot) = out.get_mut(element) {
                *slot = Some(*value);
            }
        }
        out
    }

    pub(crate) fn scatter_responses(&self, kept_values: &[f64], responses: usize) -> Vec<f64> {
        let mut out = vec![0.0; responses];
        for (value, &r) in kept_values.iter().zip(&self.kept_responses) {
            out[r] = *value;
        }
        out
    }
}

struct Evaluator<'g> {
    graph: &'g Graph,
    geometry: Geometry,
    inputs: &'g [Vec<f64>],
    context: Context,
    values: Vec<Option<Vec<f64>>>,
}

impl<'g> Evaluator<'g> {
    fn new(
        graph: &'g Graph,
        geometry: Geometry,
        inputs: &'g [Vec<f64>],
        context: &Context,
    ) -> Evaluator<'g> {
        Evaluator {
            graph,
            geometry,
            inputs,
            context: *context,
            values: vec![None; graph.nodes.len()],
        }
    }

    fn run_all(&mut self) -> Result<(), EvalError> {
        let all = vec![true; self.graph.nodes.len()];
        self.run(&all)
    }

    /// Evaluate the nodes in `mask` (in order; nodes already evaluated are kept).
    fn run(&mut self, mask: &[bool]) -> Result<(), EvalError> {
        for (index, wanted) in mask.iter().enumerate() {
            if *wanted && self.values[index].is_none() {
                let value = self.node(index)?;
                self.values[index] = Some(value);
            }
        }
        Ok(())
    }

    /// The culprit of a non-finite value of `node` at `element` (its first non-finite element when
    /// `None`), from the values computed so far.
    fn culprit(
        &mut self,
        node: NodeId,
        element: Option<usize>,
        to_batch: &ToBatch<'_>,
    ) -> Option<crate::nonfinite::Culprit> {
        let element = match element {
            Some(element) => element,
            None => self.values[node.0 as usize]
                .as_ref()?
                .iter()
                .position(|v| !v.is_finite())?,
        };
        crate::nonfinite::culprit(
            self.graph,
            &self.values,
            &mut self.geometry,
            node,
            element,
            to_batch,
        )
    }

    fn value(&self, id: NodeId) -> &[f64] {
        self.values[id.0 as usize]
            .as_deref()
            .expect("operands are evaluated first")
    }

    /// A node's value broadcast to `shape` (outputs may have been folded to coarser shapes).
    fn at_shape(&mut self, id: NodeId, shape: &Shape) -> Vec<f64> {
        let node_shape = self.graph.node(id).shape.clone();
        let values = self.value(id).to_vec();
        if &node_shape == shape {
            return values;
        }
        let map = self.geometry.map(shape, &node_shape).to_vec();
        map.iter().map(|&e| values[e]).collect()
    }

    fn scalar(&self, id: NodeId) -> f64 {
        self.value(id).first().copied().unwrap_or(0.0)
    }

    fn node(&mut self, index: usize) -> Result<Vec<f64>, EvalError> {
        let node = &self.graph.nodes[index];
        let size = self.geometry.size(&node.shape);
        Ok(match &node.op {
            Op::Const(value) => vec![*value],
            Op::Input(i) => self.inputs[*i as usize].clone(),
            Op::Value(value) => match value {
                Value::Step => vec![self.context.step],
                Value::Progress => vec![self.context.progress],
                Value::N => (0..self.geometry.layout.groups())
                    .map(|g| self.geometry.layout.group_size(g) as f64)
                    .collect(),
                Value::RespIndex => self.geometry.response_index(),
                Value::Length => (0..self.geometry.layout.responses())
                    .map(|r| self.geometry.layout.response_length(r) as f64)
                    .collect(),
                Value::TokenIndex => self.geometry.token_index(),
                Value::Inf => vec![f64::INFINITY],
                Value::Pi => vec![std::f64::consts::PI],
            },
            op if op.is_elementwise() => {
                let shape = node.shape.clone();
                let mut operands: Vec<(Vec<usize>, &[f64])> = Vec::new();
                let maps: Vec<Vec<usize>> = node
                    .args
                    .iter()
                    .map(|arg| {
                        let arg_shape = &self.graph.node(*arg).shape;
                        if *arg_shape == shape {
                            Vec::new()
                        } else {
                            self.geometry.map(&shape, arg_shape).to_vec()
                        }
                    })
                    .collect();
                for (arg, map) in node.args.iter().zip(maps) {
                    operands.push((map, self.value(*arg)));
                }
                let mut out = Vec::with_capacity(size);
                let mut scratch = [0.0f64; 3];
                for element in 0..size {
                    for (k, (map, values)) in operands.iter().enumerate() {
                        scratch[k] = if map.is_empty() {
                            values[element]
                        } else {
                            values[map[element]]
                        };
                    }
                    out.push(fold(op, &scratch[..operands.len()]).unwrap_or(f64::NAN));
                }
                out
            }
            Op::ReduceSum | Op::ReduceMax | Op::ReduceMin | Op::Count => {
                let arg = node.args[0];
                let arg_shape = self.graph.node(arg).shape.clone();
                let map = self.geometry.map(&arg_shape, &node.shape).to_vec();
                let values = self.value(arg);
                let mut out = vec![0.0; size];
                let mut seen = vec![false; size];
                for (element, &target) in map.iter().enumerate() {
                    let x = values.get(element).copied().unwrap_or(values[0]);
                    match node.op {
                        Op::ReduceSum => out[target] += x,
                        Op::Count => out[target] += 1.0,
                        Op::ReduceMax => {
                            out[target] = if seen[target] { out[target].max(x) } else { x }
                        }
                        _ => out[target] = if seen[target] { out[target].min(x) } else { x },
                    }
                    seen[target] = true;
                }
                out
            }
            Op::Index(k) => {
                let values = self.value(node.args[0]);
                let len = self.rubric_len(&self.graph.node(node.args[0]).shape);
                (0..size).map(|b| values[b * len + *k as usize]).collect()
            }
            Op::Unindex(k) => {
                let len = self.rubric_len(&node.shape);
                let values = self.value(node.args[0]);
                let mut out = vec![0.0; size];
                for (b, value) in values.iter().enumerate() {
                    out[b * len + *k as usize] = *value;
                }
                out
            }
            Op::SpreadRows | Op::SpreadCols => {
                let arg_shape = self.graph.node(node.args[0]).shape.clone();
                let map =
                    self.geometry
                        .matrix_map(&node.shape, &arg_shape, node.op == Op::SpreadRows);
                let values = self.value(node.args[0]);
                map.iter()
                    .map(|&e| values.get(e).copied().unwrap_or(f64::NAN))
                    .collect()
            }
            Op::ContractRows | Op::ContractCols => {
                let arg_shape = self.graph.node(node.args[0]).shape.clone();
                let map =
                    self.geometry
                        .matrix_map(&arg_shape, &node.shape, node.op == Op::ContractCols);
                let values = self.value(node.args[0]);
                let mut out = vec![0.0; size];
                for (element, &target) in map.iter().enumerate() {
                    out[target] += values.get(element).copied().unwrap_or(values[0]);
                }
                out
            }
            Op::Other => {
                let arg_shape = self.graph.node(node.args[0]).shape.clone();
                let map = self.geometry.other_map(&node.shape, &arg_shape);
                let values = self.value(node.args[0]);
                map.iter().map(|&e| values[e]).collect()
            }
            Op::SumByOther => {
                let arg_shape = self.graph.node(node.args[0]).shape.clone();
                let map = self.geometry.other_map(&arg_shape, &node.shape);
                let values = self.value(node.args[0]);
                let mut out = vec![0.0; size];
                for (element, &target) in map.iter().enumerate() {
                    out[target] += values[element];
                }
                out
            }
            Op::Scan { reverse } => {
                let decay_shape = self.graph.node(node.args[1]).shape.clone();
                let decay_map = self.geometry.map(&node.shape, &decay_shape).to_vec();
                let x = self.value(node.args[0]);
                let decay = self.value(node.args[1]);
                let layout = &self.geometry.layout;
                let mut out = vec![0.0; size];
                for response in 0..layout.responses() {
                    let tokens: Vec<usize> = (layout.token_offsets[response]
                        ..layout.token_offsets[response + 1])
                        .collect();
                    let mut carry = 0.0;
                    let order: Box<dyn Iterator<Item = &usize>> = if *reverse {
                        Box::new(tokens.iter().rev())
                    } else {
                        Box::new(tokens.iter())
                    };
                    for &t in order {
                        carry = x[t] + scan_carry(decay[decay_map[t]], carry);
                        out[t] = carry;
                    }
                }
                out
            }
            Op::Shift { offset } => {
                let fill_shape = self.graph.node(node.args[1]).shape.clone();
                let fill_map = self.geometry.map(&node.shape, &fill_shape).to_vec();
                let x = self.value(node.args[0]);
                let fill = self.value(node.args[1]);
                let layout = &self.geometry.layout;
                let mut out = vec![0.0; size];
                for response in 0..layout.responses() {
                    let (first, end) = (
                        layout.token_offsets[response],
                        layout.token_offsets[response + 1],
                    );
                    for (t, slot) in out.iter_mut().enumerate().take(end).skip(first) {
                        let source = t as i64 + i64::from(*offset);
                        *slot = if source >= first as i64 && source < end as i64 {
                            x[source as usize]
                        } else {
                            fill[fill_map[t]]
                        };
                    }
                }
                out
            }
            Op::Uniform => {
                let seed = self.value(node.args[0])[0];
                (0..size)
                    .map(|i| rlx_compiler::ir::uniform(seed, i as u64))
                    .collect()
            }
            Op::Rank { within } => {
                // Each element's descending position among the elements above the same `within`
                // element: those that order before it, plus the equal ones earlier in the batch.
                let sets = self
                    .geometry
                    .map(&node.shape, &Shape::new(*within))
                    .to_vec();
                let x = self.value(node.args[0]);
                let mask = node.args.get(1).map(|m| self.value(*m));
                let excluded =
                    |i: usize| mask.is_some_and(|m| m.get(i).copied().unwrap_or(m[0]) == 0.0);
                let mut members: Vec<Vec<usize>> =
                    vec![Vec::new(); sets.iter().max().map_or(0, |m| m + 1)];
                for (i, &set) in sets.iter().enumerate() {
                    members[set].push(i);
                }
                let mut out = vec![0.0; size];
                for mut set in members {
                    set.sort_by(|&a, &b| {
                        let at = |i: usize| x.get(i).copied().unwrap_or(x[0]);
                        excluded(a)
                            .cmp(&excluded(b))
                            .then(crate::kernel::rank_order(at(a), at(b)))
                            .then(a.cmp(&b))
                    });
                    for (position, i) in set.into_iter().enumerate() {
                        out[i] = position as f64;
                    }
                }
                out
            }
            Op::Components => {
                // Labels start at each response's position in its group; every pair whose verdict
                // holds lowers both ends to the smaller label, until nothing changes: each response
                // ends with the smallest position reachable from it.
                let verdicts = self.value(node.args[0]);
                let layout = &self.geometry.layout;
                let mut label: Vec<f64> = (0..layout.responses())
                    .map(|r| (r - layout.group_offsets[self.geometry.response_group[r]]) as f64)
                    .collect();
                let mut changed = true;
                while changed {
                    changed = false;
                    for (pair, &(i, j)) in self.geometry.pairs.iter().enumerate() {
                        if verdicts[pair] != 0.0 && label[i] != label[j] {
                            let low = label[i].min(label[j]);
                            label[i] = low;
                            label[j] = low;
                            changed = true;
                        }
                    }
                }
                label
            }
            Op::DistinctNgrams { n } => {
                let ids = self.value(node.args[0]);
                let layout = &self.geometry.layout;
                let n = *n as usize;
                (0..layout.responses())
                    .map(|response| {
                        let tokens = &ids
                            [layout.token_offsets[response]..layout.token_offsets[response + 1]];
                        if tokens.len() < n {
                            return 1.0;
                        }
                        let grams: Vec<Vec<u64>> = tokens
                            .windows(n)
                            .map(|w| w.iter().map(|v| v.to_bits()).collect())
                            .collect();
                        let distinct: std::collections::HashSet<&Vec<u64>> = grams.iter().collect();
                        distinct.len() as f64 / grams.len() as f64
                    })
                    .collect()
            }
            op => {
                return Err(EvalError::Internal(format!(
                    "the interpreter cannot evaluate {}",
                    op.name()
                )))
            }
        })
    }

    fn rubric_len(&self, shape: &Shape) -> usize {
        match &shape.feature {
            Some(Feature::Rubric { len, .. }) => *len as usize,
            _ => 1,
        }
    }
}

/// `decay · carry` of a scan step, 0 when the carry is 0: the first step has no carry, and a zero
/// adjoint stays zero through the adjoint scan, whatever the decay (an infinite decay in a branch
/// `where` discards gives 0, not inf · 0 = NaN). The JIT and the CUDA kernels do the same.
pub fn scan_carry(decay: f64, carry: f64) -> f64 {
    if carry == 0.0 {
        0.0
    } else {
        decay * carry
    }
}
