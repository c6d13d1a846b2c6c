//! The reference interpreter: evaluates an IR graph over a packed batch in f64. It is the oracle every
//! backend is tested against, so it is written for clarity, not speed.
//!
//! # Filters and defined edge cases
//! - With `keep` sections, evaluation has two phases. Phase 1 computes, on the whole batch, the reward,
//!   the keep conditions and what they depend on. Responses whose group or own condition is false are
//!   dropped (a group left without responses is dropped too). Phase 2 computes everything else
//!   (advantages, loss, metrics, gradients) on the kept responses only; values computed in phase 1 are
//!   carried over, not recomputed (so a response's reward does not change because another was dropped).
//!   Dropped responses get advantage 0 and gradient 0. The phases, the selection and the outputs are
//!   the executor's (`crate::executor`, shared with the kernels); the interpreter evaluates one phase's
//!   nodes (`Interpreter`).
//! - A reduction over no element: `sum` 0, `mean` 0, `max`/`min` 0, `count` 0, `var`/`std` 0 (also when
//!   there are no more elements than `ddof`, e.g. a group of one response with `ddof = 1`).
//! - A group of one response: `… over others` reduces over nothing (see above).
//! - A response with no token: token reductions give the empty results above.
//! - A rubric whose criteria have no positive points: the points score is 0 (see `std/rubric`).
//! - Every response filtered out: an error, not a NaN loss.
//! - A non-finite reward, advantage, loss, metric or gradient is an error naming it.

use rlx_compiler::ir::{fold, Feature, Graph, KeepLevel, Level, NodeId, Op, Shape, Value};

use rlx_core::Signature;

use crate::batch::{Batch, Layout};
use crate::executor::{sealed, Executor, PhaseResult, PhaseRun};
use crate::geometry::Geometry;
use crate::kernel::{Column, ColumnRef, Precision};
use crate::nonfinite::NonFinite;

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
    /// An output is not finite; the executor's finiteness check has the f64 interpreter name the
    /// expression that made it (`crate::nonfinite`).
    NonFinite(Box<NonFinite>),
    /// The device (CUDA) failed: what it said.
    Device(String),
    /// A batch the backend cannot run as asked (too many groups for one launch, a gradient that
    /// cannot stay on the device after a `keep` filter): why.
    Unsupported(String),
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
    pub fn non_finite(&self) -> Option<&NonFinite> {
        match self {
            EvalError::NonFinite(non_finite) => Some(non_finite),
            _ => None,
        }
    }

    /// This error, with the culprit of a non-finite output found when it has none yet: the f64
    /// interpreter evaluates `graph` on `batch` again (`nonfinite::explain`, what the executor's
    /// finiteness check does) and names the first node whose value is not finite for the offending
    /// element. For a caller whose run could not be explained where it failed: a run that left its
    /// gradients on the device, whose host columns may be placeholders
    /// (`DeviceKernel::run_view_keeping_gradients`), or a non-finite value found outside the
    /// executor (a gradient checked on the device).
    pub fn explained(self, graph: &Graph, batch: &Batch, context: &Context) -> EvalError {
        match self {
            EvalError::NonFinite(non_finite)
                if non_finite.culprit.is_none() && !non_finite.interpreter_finite =>
            {
                let inputs: Vec<ColumnRef<'_>> =
                    batch.inputs.iter().map(|v| ColumnRef::F64(v)).collect();
                EvalError::NonFinite(Box::new(crate::nonfinite::explain(
                    graph,
                    &batch.layout,
                    &inputs,
                    context,
                    *non_finite,
                )))
            }
            other => other,
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
            EvalError::Unsupported(message) => f.write_str(message),
            EvalError::Internal(what) => write!(f, "internal: {what}"),
        }
    }
}

impl std::error::Error for EvalError {}

pub(crate) fn rubric_lens(graph: &Graph) -> Vec<usize> {
    graph.rubrics.iter().map(|r| r.criteria.len()).collect()
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
    let inputs: Vec<ColumnRef<'_>> = batch.inputs.iter().map(|v| ColumnRef::F64(v)).collect();
    let (outcome, shown) =
        Executor::new(&Interpreter::new(graph)).run_showing(&batch.layout, &inputs, context)?;
    Ok((outcome.into_outcome(), shown))
}

/// The interpreter as a backend of the executor (`crate::executor`): it evaluates the graph's nodes in
/// order, every input in f64. With `keep` sections, phase 1 is the cone of the conditions and the
/// reward, and exports every value it computed; phase 2 evaluates the rest on the kept responses.
pub struct Interpreter<'g> {
    graph: &'g Graph,
    signature: Signature,
    /// When set, each phase's run leaves the value of every node it computed here, with its layout
    /// (`Interpreter::recording`).
    record: Option<std::sync::Mutex<Vec<PhaseValues>>>,
}

/// The value of every node one phase computed (`None` where not computed), over the phase's layout
/// (phase 2 of a filtered run: the kept responses').
pub(crate) struct PhaseValues {
    pub(crate) phase: usize,
    pub(crate) layout: Layout,
    pub(crate) values: Vec<Option<Vec<f64>>>,
}

impl<'g> Interpreter<'g> {
    pub fn new(graph: &'g Graph) -> Interpreter<'g> {
        Interpreter {
            graph,
            signature: graph.signature(),
            record: None,
        }
    }

    /// An interpreter that keeps every phase's node values (`Interpreter::recorded`): the culprit
    /// search of a non-finite output (`crate::nonfinite::explain`) reads them.
    pub(crate) fn recording(graph: &'g Graph) -> Interpreter<'g> {
        Interpreter {
            record: Some(std::sync::Mutex::new(Vec::new())),
            ..Interpreter::new(graph)
        }
    }

    /// The node values of the phases run so far (a `recording` interpreter's), in run order.
    pub(crate) fn recorded(self) -> Vec<PhaseValues> {
        match self.record {
            Some(record) => record.into_inner().unwrap_or_else(|e| e.into_inner()),
            None => Vec::new(),
        }
    }

    fn keep_values(&self, phase: usize, layout: &Layout, values: Vec<Option<Vec<f64>>>) {
        if let Some(record) = &self.record {
            record
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(PhaseValues {
                    phase,
                    layout: layout.clone(),
                    values,
                });
        }
    }

    /// The nodes phase 1 of two evaluates: what the `keep` conditions and the reward depend on.
    fn phase_one(&self) -> Vec<bool> {
        let outputs = &self.graph.outputs;
        let mut roots: Vec<NodeId> = outputs.keeps.iter().map(|(_, id)| *id).collect();
        roots.extend(outputs.reward);
        self.graph.cone(&roots)
    }
}

impl sealed::Backend for Interpreter<'_> {
    fn graph(&self) -> &Graph {
        self.graph
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn phases(&self) -> usize {
        if self.graph.outputs.keeps.is_empty() {
            1
        } else {
            2
        }
    }

    fn check_layout(&self, _layout: &Layout) -> Result<(), EvalError> {
        Ok(())
    }

    fn input_storage(&self, _index: usize) -> Precision {
        Precision::F64
    }

    fn run_phase(&self, phase: usize, run: PhaseRun<'_>) -> Result<PhaseResult, EvalError> {
        let graph = self.graph;
        let outputs = &graph.outputs;
        let geometry = Geometry::new(run.layout.clone(), rubric_lens(graph));
        let mut evaluator = Evaluator::new(graph, geometry, run.inputs, run.context);
        let mut result = PhaseResult::default();
        let shown_at = |evaluator: &Evaluator<'_>, id: NodeId| Some(evaluator.value(id).to_vec());
        if phase == 0 && sealed::Backend::phases(self) == 2 {
            // The conditions, the reward and what they depend on, on the whole batch.
            let phase_one = self.phase_one();
            evaluator.run(&phase_one)?;
            for (keep, id) in &outputs.keeps {
                let level = match keep {
                    KeepLevel::Group => Level::Group,
                    KeepLevel::Resp => Level::Resp,
                };
                let values = evaluator.at_shape(*id, &Shape::new(level));
                result.keeps.push((*keep, Column::F64(values)));
            }
            result.reward = outputs
                .reward
                .map(|id| evaluator.at_shape(id, &Shape::new(Level::Resp)));
            result.shown = outputs
                .shown
                .iter()
                .map(|(_, id)| {
                    phase_one[id.0 as usize]
                        .then(|| shown_at(&evaluator, *id))
                        .flatten()
                })
                .collect();
            if self.record.is_some() {
                self.keep_values(phase, run.layout, evaluator.values.clone());
            }
            for (index, live) in phase_one.iter().enumerate() {
                if let (true, Some(values)) = (*live, evaluator.values[index].take()) {
                    result
                        .exports
                        .push((NodeId(index as u32), Column::F64(values)));
                }
            }
            return Ok(result);
        }
        // Everything (phase 2: on the kept responses, with phase 1's values carried over).
        for (node, column) in run.carried {
            evaluator.values[node.0 as usize] = Some(column.into_f64());
        }
        evaluator.run_all()?;
        if phase == 0 {
            result.reward = outputs
                .reward
                .map(|id| evaluator.at_shape(id, &Shape::new(Level::Resp)));
        }
        result.advantage = outputs
            .advantage
            .map(|id| evaluator.at_shape(id, &Shape::new(Level::Resp)));
        result.loss = outputs.loss.map(|id| evaluator.scalar(id));
        result.metrics = outputs
            .metrics
            .iter()
            .map(|(name, id)| (name.clone(), evaluator.scalar(*id)))
            .collect();
        for (input, id) in &outputs.gradients {
            let shape = graph.inputs[*input as usize].shape.clone();
            result
                .gradients
                .push((*input, Column::F64(evaluator.at_shape(*id, &shape))));
        }
        result.shown = outputs
            .shown
            .iter()
            .map(|(_, id)| shown_at(&evaluator, *id))
            .collect();
        self.keep_values(phase, run.layout, evaluator.values);
        Ok(result)
    }
}

struct Evaluator<'g> {
    graph: &'g Graph,
    geometry: Geometry,
    inputs: &'g [ColumnRef<'g>],
    context: Context,
    values: Vec<Option<Vec<f64>>>,
}

impl<'g> Evaluator<'g> {
    fn new(
        graph: &'g Graph,
        geometry: Geometry,
        inputs: &'g [ColumnRef<'g>],
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
            Op::Input(i) => self.inputs[*i as usize].to_f64(),
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
                            .then(crate::executor::rank_order(at(a), at(b)))
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
