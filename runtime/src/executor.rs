//! The executor: the one driver of every backend. [`Executor`] validates a batch against the recipe's
//! signature, runs the recipe's phases on a [`Backend`] — the f64 interpreter
//! (`crate::interp::Interpreter`), the JIT kernel (`crate::kernel::Kernel`) or the CUDA kernels
//! (`crate::cuda::DeviceKernel`) — with the two-phase `keep` semantics between them, and checks the
//! outputs (a non-finite one is explained by the f64 interpreter, `crate::nonfinite::explain`); for the backends that run a kernel plan it also walks each phase's passes, running the
//! host passes (`uniform`, `rank`, `components`, `distinct_ngrams`) and the host combines of
//! per-group partials itself. A backend only runs a phase (the interpreter) or a loop pass (the
//! kernels).
//!
//! # The two phases of `keep`
//! With `keep` sections a recipe has two phases. Phase 1 computes, on the whole batch, the reward, the
//! keep conditions and what they depend on. Responses whose group or own condition is false are
//! dropped (a group left without responses is dropped too); when none is left, the run is the error
//! [`EvalError::all_filtered`]. Phase 2 runs on the kept responses only, with the inputs and the values
//! phase 1 exports sliced to them (so a response's reward does not change because another was
//! dropped); its advantages and gradients are scattered back to the whole batch, 0 for dropped
//! responses. When nothing is dropped phase 2 runs on the batch itself (a kernel's inputs stay where
//! they are, on the device for the CUDA backend).
//!
//! The backend trait is sealed (its methods are on a supertrait in a private module): the executor's
//! checks are what makes the generated code's unchecked loads and stores sound, so no backend outside
//! this crate can be driven by it.

use std::collections::HashMap;

use rayon::prelude::*;

use rlx_compiler::backend::plan::{BufferKind, Init, KernelPlan, LoopPass, Pass, Phase, Reduction};
use rlx_compiler::ir::{Graph, KeepLevel, Level, NodeId, Shape};
use rlx_core::Signature;

use crate::batch::Layout;
use crate::geometry::Geometry;
use crate::interp::{rubric_lens, Context, EvalError, Shown};
use crate::kernel::{Column, ColumnRef, PackedOutcome, Precision, Tables};
use crate::nonfinite::{first_non_finite, NonFinite};

/// A backend the [`Executor`] drives: the interpreter, the JIT kernel or a CUDA device kernel. The
/// trait is sealed: its methods are crate-private.
pub trait Backend: sealed::Backend {}

impl<T: sealed::Backend> Backend for T {}

pub(crate) mod sealed {
    use super::*;

    /// What a backend does for the executor.
    pub trait Backend {
        /// The recipe's graph.
        fn graph(&self) -> &Graph;
        /// The graph's signature, what every batch is validated against.
        fn signature(&self) -> &Signature;
        /// 1, or 2 when the recipe has `keep` sections.
        fn phases(&self) -> usize;
        /// Checks of a layout beyond the signature's (a kernel sizes its tables; an overflow is an
        /// error).
        fn check_layout(&self, layout: &Layout) -> Result<(), EvalError>;
        /// The storage precision input `index` is read in.
        fn input_storage(&self, index: usize) -> Precision;
        /// Run phase `phase` (0-based) on a validated batch.
        fn run_phase(&self, phase: usize, run: PhaseRun<'_>) -> Result<PhaseResult, EvalError>;
        /// Whether the host columns a run is given hold the inputs' values, so that the f64
        /// interpreter can evaluate them again to explain a non-finite output
        /// (`crate::nonfinite::explain`). Not so for a CUDA run whose host columns may be
        /// placeholders of values it reads on the device (`DeviceKernel::run_view_keeping_gradients`).
        fn host_inputs_hold_values(&self) -> bool {
            true
        }
    }
}

/// What a phase runs on: a validated layout (phase 2: the kept responses'), its inputs, and the values
/// phase 1 exported (sliced to the layout).
pub struct PhaseRun<'a> {
    pub layout: &'a Layout,
    pub inputs: &'a [ColumnRef<'a>],
    pub carried: HashMap<NodeId, Column>,
    pub context: &'a Context,
}

/// What a phase produced: each output the phase has (`None`/empty for the others).
#[derive(Default)]
pub struct PhaseResult {
    /// The `keep` conditions (phase 1 of two): a group-level or response-level value.
    pub keeps: Vec<(KeepLevel, Column)>,
    pub reward: Option<Vec<f64>>,
    /// Values phase 2 reads (phase 1 of two), at their node's shape.
    pub exports: Vec<(NodeId, Column)>,
    pub loss: Option<f64>,
    pub metrics: Vec<(String, f64)>,
    pub advantage: Option<Vec<f64>>,
    /// By input index, at the input's shape.
    pub gradients: Vec<(u32, Column)>,
    /// The values of `graph.outputs.shown` this phase computed (the interpreter's), by position.
    pub shown: Vec<Option<Vec<f64>>>,
}

/// Runs a recipe on a [`Backend`]: validation, the phases with `keep` between them, the outputs.
pub struct Executor<'b, B: Backend> {
    backend: &'b B,
}

impl<'b, B: Backend> Executor<'b, B> {
    pub fn new(backend: &'b B) -> Executor<'b, B> {
        Executor { backend }
    }

    /// Check a layout and the input lengths against the recipe's signature
    /// (`rlx_core::Signature::validate`), the group sizes (`batch::check_group_sizes`) and the
    /// backend's own limits.
    pub fn check_layout(
        &self,
        layout: &Layout,
        lengths: impl ExactSizeIterator<Item = usize>,
    ) -> Result<(), EvalError> {
        let backend = self.backend;
        backend
            .signature()
            .validate(layout, lengths)
            .map_err(EvalError::Batch)?;
        crate::batch::check_group_sizes(backend.graph(), layout).map_err(EvalError::GroupSize)?;
        backend.check_layout(layout)
    }

    /// Check a batch: its layout and lengths (`check_layout`), and each input's storage precision.
    /// Nothing runs on a batch that fails.
    pub fn validate(&self, layout: &Layout, inputs: &[ColumnRef<'_>]) -> Result<(), EvalError> {
        self.check_layout(layout, inputs.iter().map(ColumnRef::len))?;
        for (index, (info, column)) in self.backend.graph().inputs.iter().zip(inputs).enumerate() {
            let wanted = self.backend.input_storage(index);
            if column.precision() != wanted {
                return Err(EvalError::Storage {
                    input: info.name.clone(),
                    stored: column.precision().name(),
                    wanted: wanted.name(),
                });
            }
        }
        Ok(())
    }

    /// Evaluate every output on a batch (validated first).
    pub fn run(
        &self,
        layout: &Layout,
        inputs: &[ColumnRef<'_>],
        context: &Context,
    ) -> Result<PackedOutcome, EvalError> {
        self.run_showing(layout, inputs, context)
            .map(|(outcome, _)| outcome)
    }

    /// `run`, also giving the value of every `graph.outputs.shown` node the backend computes (the
    /// interpreter's: `rlx score --show`), `None` at the elements a `keep` filter dropped before it
    /// was computed.
    ///
    /// A non-finite output is an [`EvalError::NonFinite`] naming it; when the backend's host
    /// columns hold the inputs, the f64 interpreter evaluates the batch again — only on this
    /// failure path — and the error names the node that made the first non-finite value, for
    /// which batch element, with its recipe expression (`crate::nonfinite::explain`).
    pub fn run_showing(
        &self,
        layout: &Layout,
        inputs: &[ColumnRef<'_>],
        context: &Context,
    ) -> Result<(PackedOutcome, Vec<Shown>), EvalError> {
        let (outcome, shown) = self.run_unchecked(layout, inputs, context)?;
        match check_finite(outcome) {
            Ok(outcome) => Ok((outcome, shown)),
            Err(non_finite) if self.backend.host_inputs_hold_values() => {
                let graph = self.backend.graph();
                let explained =
                    crate::nonfinite::explain(graph, layout, inputs, context, *non_finite);
                Err(EvalError::NonFinite(Box::new(explained)))
            }
            Err(non_finite) => Err(EvalError::NonFinite(non_finite)),
        }
    }

    /// `run_showing` without the finiteness check of the outputs.
    pub(crate) fn run_unchecked(
        &self,
        layout: &Layout,
        inputs: &[ColumnRef<'_>],
        context: &Context,
    ) -> Result<(PackedOutcome, Vec<Shown>), EvalError> {
        self.validate(layout, inputs)?;
        let backend = self.backend;
        let graph = backend.graph();
        let responses = layout.responses();
        let run = |phase: usize, layout: &Layout, inputs: &[ColumnRef<'_>], carried| {
            backend.run_phase(
                phase,
                PhaseRun {
                    layout,
                    inputs,
                    carried,
                    context,
                },
            )
        };
        let mut first = run(0, layout, inputs, HashMap::new())?;
        if backend.phases() == 1 {
            let mut values = std::mem::take(&mut first.shown).into_iter();
            let shown = shown_names(graph)
                .map(|name| {
                    let values = values.next().flatten().unwrap_or_default();
                    (name, values.into_iter().map(Some).collect())
                })
                .collect();
            let outcome = self.outcome(first, None, vec![true; responses]);
            return Ok((outcome, shown));
        }

        // Phase 1 ran on the whole batch: which responses it keeps.
        let PhaseResult {
            keeps,
            reward,
            exports,
            shown: first_shown,
            ..
        } = first;
        let mut group_kept = vec![true; layout.groups()];
        let mut response_kept = vec![true; responses];
        for (level, values) in &keeps {
            let kept = match level {
                KeepLevel::Group => &mut group_kept,
                KeepLevel::Resp => &mut response_kept,
            };
            for (position, flag) in kept.iter_mut().enumerate() {
                *flag &= values.get(position) != 0.0;
            }
        }
        let response_group = layout.response_groups();
        let kept: Vec<bool> = (0..responses)
            .map(|r| group_kept[response_group[r]] && response_kept[r])
            .collect();
        if !kept.iter().any(|k| *k) {
            return Err(EvalError::all_filtered());
        }
        let exports: HashMap<NodeId, Column> = exports.into_iter().collect();
        let nothing_dropped =
            kept.iter().all(|k| *k) && (0..layout.groups()).all(|g| layout.group_size(g) > 0);
        if nothing_dropped {
            // The kept batch is the batch (the selection also drops groups without responses, so
            // this holds only when there are none).
            let second = run(1, layout, inputs, exports)?;
            let shown = shown_names(graph)
                .enumerate()
                .map(|(position, name)| {
                    let values = first_shown
                        .get(position)
                        .cloned()
                        .flatten()
                        .or_else(|| second.shown.get(position).cloned().flatten())
                        .unwrap_or_default();
                    (name, values.into_iter().map(Some).collect())
                })
                .collect();
            let outcome = self.outcome(second, reward, kept);
            return Ok((outcome, shown));
        }

        // Phase 2 on the kept responses.
        let selection = Selection::new(layout, &kept);
        let mut full = Geometry::new(layout.clone(), rubric_lens(graph));
        let mut sub = Geometry::new(selection.layout.clone(), rubric_lens(graph));
        let sub_inputs: Vec<Column> = graph
            .inputs
            .iter()
            .zip(inputs)
            .map(|(info, column)| selection.slice(&mut full, &mut sub, &info.shape, *column))
            .collect();
        let carried: HashMap<NodeId, Column> = exports
            .into_iter()
            .map(|(node, column)| {
                let shape = &graph.node(node).shape;
                let sliced = selection.slice(&mut full, &mut sub, shape, column.as_column_ref());
                (node, sliced)
            })
            .collect();
        let sub_layout = selection.layout.clone();
        let sub_refs: Vec<ColumnRef<'_>> = sub_inputs.iter().map(Column::as_column_ref).collect();
        let mut second = run(1, &sub_layout, &sub_refs, carried)?;
        // Back to the whole batch: dropped responses get advantage 0 and gradient 0.
        for (input, values) in &mut second.gradients {
            let shape = &graph.inputs[*input as usize].shape;
            *values = selection.scatter(&mut full, &mut sub, shape, values);
        }
        let shown = shown_names(graph)
            .enumerate()
            .map(|(position, name)| {
                let values = match first_shown.get(position).cloned().flatten() {
                    Some(values) => values.into_iter().map(Some).collect(),
                    None => {
                        let id = graph.outputs.shown[position].1;
                        let kept_values = second.shown.get(position).cloned().flatten();
                        selection.scatter_kept(
                            &mut full,
                            &mut sub,
                            &graph.node(id).shape,
                            &kept_values.unwrap_or_default(),
                        )
                    }
                };
                (name, values)
            })
            .collect();
        let mut outcome = self.outcome(second, reward, kept);
        if let Some(advantage) = &mut outcome.advantage {
            *advantage = selection.scatter_responses(advantage, responses);
        }
        Ok((outcome, shown))
    }

    /// A phase's outputs as the run's outcome (`reward`: phase 1's, when there were two).
    fn outcome(
        &self,
        result: PhaseResult,
        reward: Option<Vec<f64>>,
        kept: Vec<bool>,
    ) -> PackedOutcome {
        let inputs = &self.backend.graph().inputs;
        PackedOutcome {
            loss: result.loss,
            metrics: result.metrics,
            reward: reward.or(result.reward),
            advantage: result.advantage,
            kept,
            gradients: result
                .gradients
                .into_iter()
                .map(|(input, column)| (inputs[input as usize].name.clone(), column))
                .collect(),
        }
    }
}

fn shown_names(graph: &Graph) -> impl Iterator<Item = String> + '_ {
    graph.outputs.shown.iter().map(|(name, _)| name.clone())
}

/// The finiteness check of a run's outputs: the first non-finite one (the loss, a metric, a reward,
/// an advantage, a gradient: `nonfinite::first_non_finite`), without its culprit yet.
fn check_finite(outcome: PackedOutcome) -> Result<PackedOutcome, Box<NonFinite>> {
    let scalars_ok = outcome.loss.is_none_or(f64::is_finite)
        && outcome.metrics.iter().all(|(_, v)| v.is_finite());
    let vectors_ok = [&outcome.reward, &outcome.advantage]
        .iter()
        .all(|v| v.as_ref().is_none_or(|v| v.iter().all(|x| x.is_finite())));
    let gradients_ok = outcome.gradients.iter().all(|(_, c)| c.all_finite());
    if scalars_ok && vectors_ok && gradients_ok {
        return Ok(outcome);
    }
    match first_non_finite(&outcome.clone().into_outcome()) {
        Some(non_finite) => Err(Box::new(non_finite)),
        None => Ok(outcome),
    }
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
            Some(_) => {
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

    /// A value of `shape` over the full batch, restricted to the kept elements (an element past the
    /// end of `values` reads as 0; a batch-level scalar stays itself).
    pub(crate) fn slice(
        &self,
        full: &mut Geometry,
        sub: &mut Geometry,
        shape: &Shape,
        values: ColumnRef<'_>,
    ) -> Column {
        if shape.level == Level::Batch && shape.feature.is_none() && values.len() == 1 {
            return values.gather(&[0]);
        }
        let map = self.element_map(full, sub, shape);
        values.gather(&map)
    }

    /// A value of `shape` over the kept batch, put back at its elements of the full batch (0
    /// elsewhere); a batch-level value stays as it is.
    pub(crate) fn scatter(
        &self,
        full: &mut Geometry,
        sub: &mut Geometry,
        shape: &Shape,
        kept_values: &Column,
    ) -> Column {
        if shape.level == Level::Batch {
            return kept_values.clone();
        }
        let mut out = Column::filled(kept_values.precision(), full.size(shape), 0.0);
        let map = self.element_map(full, sub, shape);
        for (element, target) in map.into_iter().enumerate().take(kept_values.len()) {
            out.set(target, kept_values.get(element));
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

// ---------------------------------------------------------------------------------------------
// Backends that run a kernel plan (the JIT, CUDA): the executor walks a phase's passes.

/// A phase of a kernel plan in progress: what its passes run on.
pub struct PassRun<'a> {
    pub phase: usize,
    pub layout: &'a Layout,
    pub tables: &'a Tables,
    pub inputs: &'a [ColumnRef<'a>],
    pub context: &'a Context,
}

/// A backend that runs a kernel plan's loop passes; the executor runs the rest of each phase
/// ([`run_plan_phase`]).
pub trait PlanBackend {
    /// A phase's buffers while its passes run.
    type State;
    fn plan(&self) -> &KernelPlan;
    fn graph(&self) -> &Graph;
    /// Take a phase's initial buffers (`None` for inputs; carried values; the others filled with
    /// their initial value).
    fn begin(
        &self,
        run: &PassRun<'_>,
        buffers: Vec<Option<Column>>,
    ) -> Result<Self::State, EvalError>;
    /// Run loop pass `pass` over every group.
    fn run_loop(
        &self,
        run: &PassRun<'_>,
        state: &mut Self::State,
        pass: usize,
        loop_pass: &LoopPass,
    ) -> Result<(), EvalError>;
    /// Run combine pass `pass` on the backend: `false` when the backend has no combine of its own, and
    /// the executor combines on the host.
    fn combine(
        &self,
        run: &PassRun<'_>,
        state: &mut Self::State,
        pass: usize,
    ) -> Result<bool, EvalError>;
    /// The values of buffer `b` (not an input) on the host.
    fn read(&self, state: &Self::State, b: u32) -> Result<Vec<f64>, EvalError>;
    /// The element count of buffer `b` (not an input).
    fn buffer_len(&self, state: &Self::State, b: u32) -> Result<usize, EvalError>;
    /// Overwrite the first `values.len()` elements of buffer `b` (not an input).
    fn write(&self, state: &mut Self::State, b: u32, values: &[f64]) -> Result<(), EvalError>;
    /// The phase's buffers after its last pass, on the host.
    fn finish(
        &self,
        run: &PassRun<'_>,
        state: Self::State,
    ) -> Result<Vec<Option<Column>>, EvalError>;
}

/// Run phase `phase` of a plan backend: its initial buffers, its passes in plan order (loop passes
/// and a backend's own combines on the backend, host passes and host combines here), its outputs.
pub(crate) fn run_plan_phase<P: PlanBackend>(
    backend: &P,
    phase: usize,
    run: PhaseRun<'_>,
) -> Result<PhaseResult, EvalError> {
    let plan = backend.plan();
    let plan_phase = plan
        .phases
        .get(phase)
        .ok_or_else(|| EvalError::Internal(format!("the plan has no phase {phase}")))?;
    let tables = Tables::new(run.layout)?;
    let buffers = phase_buffers(plan_phase, &tables, run.carried)?;
    let pass_run = PassRun {
        phase,
        layout: run.layout,
        tables: &tables,
        inputs: run.inputs,
        context: run.context,
    };
    let mut state = backend.begin(&pass_run, buffers)?;
    let read = |state: &P::State, b: u32| -> Result<Vec<f64>, EvalError> {
        match plan_phase.buffers.get(b as usize).map(|buffer| buffer.kind) {
            Some(BufferKind::Input(i)) => run
                .inputs
                .get(i as usize)
                .map(ColumnRef::to_f64)
                .ok_or_else(|| EvalError::Internal("an input is missing".into())),
            _ => backend.read(state, b),
        }
    };
    let layout = run.layout;
    for (pass_index, pass) in plan_phase.passes.iter().enumerate() {
        match pass {
            Pass::Loop(loop_pass) => {
                backend.run_loop(&pass_run, &mut state, pass_index, loop_pass)?
            }
            Pass::Combine {
                op,
                partial,
                partial_count,
                value,
                count,
                ..
            } => {
                if backend.combine(&pass_run, &mut state, pass_index)? {
                    continue;
                }
                let partials = read(&state, *partial)?;
                let partial_counts = partial_count.map(|b| read(&state, b)).transpose()?;
                let width = backend.buffer_len(&state, *value)?;
                let (values, counts) = combine(
                    *op,
                    &partials,
                    partial_counts.as_deref(),
                    tables.groups,
                    width,
                );
                backend.write(&mut state, *value, &values)?;
                if let (Some(counts), Some(count)) = (counts, count) {
                    backend.write(&mut state, *count, &counts)?;
                }
            }
            Pass::Uniform { seed, target, .. } => {
                let seed = read(&state, *seed)?.first().copied().unwrap_or(0.0);
                let len = backend.buffer_len(&state, *target)?;
                let values: Vec<f64> = (0..len)
                    .map(|i| rlx_compiler::ir::uniform(seed, i as u64))
                    .collect();
                backend.write(&mut state, *target, &values)?;
            }
            Pass::Rank {
                node,
                within,
                source,
                mask,
                target,
                ..
            } => {
                let values = read(&state, *source)?;
                let mask = mask.map(|b| read(&state, b)).transpose()?;
                let level = backend.graph().node(*node).shape.level;
                let ranks = ranks(&values, mask.as_deref(), layout, level, *within);
                backend.write(&mut state, *target, &ranks)?;
            }
            Pass::Components { source, target, .. } => {
                let verdicts = read(&state, *source)?;
                let classes = components(&verdicts, layout);
                backend.write(&mut state, *target, &classes)?;
            }
            Pass::Ngrams {
                n, source, target, ..
            } => {
                let ids = read(&state, *source)?;
                let n = *n as usize;
                let values: Vec<f64> = (0..layout.responses())
                    .into_par_iter()
                    .map(|r| {
                        let tokens = &ids[layout.token_offsets[r]..layout.token_offsets[r + 1]];
                        distinct_ngrams(tokens, n)
                    })
                    .collect();
                backend.write(&mut state, *target, &values)?;
            }
        }
    }
    let mut buffers = backend.finish(&pass_run, state)?;
    collect(plan_phase, &mut buffers)
}

/// A phase's buffers before its first pass: `None` for inputs, the carried values, the others filled
/// with their initial value.
fn phase_buffers(
    phase: &Phase,
    tables: &Tables,
    mut carried: HashMap<NodeId, Column>,
) -> Result<Vec<Option<Column>>, EvalError> {
    let mut owned: Vec<Option<Column>> = Vec::with_capacity(phase.buffers.len());
    for buffer in &phase.buffers {
        owned.push(match buffer.kind {
            BufferKind::Input(_) => None,
            BufferKind::Carried(node) => {
                let column = carried.remove(&node).ok_or_else(|| {
                    EvalError::Internal(format!("carried value %{} missing", node.0))
                })?;
                if column.len() != tables.size(&buffer.shape)? {
                    return Err(EvalError::Internal(format!(
                        "carried value %{} has the wrong size",
                        node.0
                    )));
                }
                Some(column)
            }
            _ => {
                let mut len = tables.size(&buffer.shape)?;
                if buffer.per_group {
                    len = len
                        .checked_mul(tables.groups)
                        .ok_or(EvalError::Batch(rlx_core::CoreError::Overflow))?;
                }
                let init = if buffer.init == Init::Nan {
                    f64::NAN
                } else {
                    0.0
                };
                Some(Column::filled(buffer.storage, len, init))
            }
        });
    }
    Ok(owned)
}

/// A phase's outputs from its buffers.
fn collect(phase: &Phase, buffers: &mut [Option<Column>]) -> Result<PhaseResult, EvalError> {
    let outputs = &phase.outputs;
    let scalar = |buffers: &[Option<Column>], b: u32| -> Result<f64, EvalError> {
        let column = column(buffers, b)?;
        Ok(if column.is_empty() {
            0.0
        } else {
            column.get(0)
        })
    };
    let mut result = PhaseResult::default();
    for (level, b) in &outputs.keeps {
        result.keeps.push((*level, column(buffers, *b)?.clone()));
    }
    result.reward = outputs
        .reward
        .map(|b| column(buffers, b).map(Column::to_f64))
        .transpose()?;
    for (node, b) in &outputs.exports {
        result.exports.push((*node, column(buffers, *b)?.clone()));
    }
    result.loss = outputs.loss.map(|b| scalar(buffers, b)).transpose()?;
    for (name, b) in &outputs.metrics {
        result.metrics.push((name.clone(), scalar(buffers, *b)?));
    }
    result.advantage = outputs
        .advantage
        .map(|b| column(buffers, b).map(Column::to_f64))
        .transpose()?;
    for (input, b) in &outputs.gradients {
        let shared = outputs.gradients.iter().filter(|(_, o)| o == b).count() > 1;
        let column = if shared {
            column(buffers, *b)?.clone()
        } else {
            // The only reader: move the (token-sized) buffer out instead of copying it.
            buffers
                .get_mut(*b as usize)
                .and_then(Option::take)
                .ok_or_else(|| EvalError::Internal(format!("output buffer b{b} missing")))?
        };
        result.gradients.push((*input, column));
    }
    Ok(result)
}

/// Buffer `b` of a phase's buffers (an error when it is missing or was moved out).
pub(crate) fn column(buffers: &[Option<Column>], b: u32) -> Result<&Column, EvalError> {
    buffers
        .get(b as usize)
        .and_then(Option::as_ref)
        .ok_or_else(|| EvalError::Internal(format!("buffer b{b} missing")))
}

// ---------------------------------------------------------------------------------------------
// The host passes and combines.

/// Combine per-group partials (`groups` rows of `width`) in a fixed pairwise order: the values and,
/// when `counts` are given, their summed counts.
fn combine(
    op: Reduction,
    partials: &[f64],
    counts: Option<&[f64]>,
    groups: usize,
    width: usize,
) -> (Vec<f64>, Option<Vec<f64>>) {
    let combine: &dyn Fn(f64, f64) -> f64 = match op {
        Reduction::Max => &f64::max,
        Reduction::Min => &f64::min,
        _ => &|a, b| a + b,
    };
    let identity = if matches!(op, Reduction::Max | Reduction::Min) {
        f64::NAN
    } else {
        0.0
    };
    let mut values = Vec::with_capacity(width);
    let mut totals = counts.map(|_| Vec::with_capacity(width));
    let mut lane = Vec::with_capacity(groups);
    for f in 0..width {
        lane.clear();
        lane.extend((0..groups).map(|g| partials[g * width + f]));
        values.push(tree(&lane, combine, identity));
        if let (Some(counts), Some(totals)) = (counts, totals.as_mut()) {
            lane.clear();
            lane.extend((0..groups).map(|g| counts[g * width + f]));
            totals.push(tree(&lane, &|a, b| a + b, 0.0));
        }
    }
    (values, totals)
}

/// `f64::max`/`min`-style combination in a fixed pairwise order.
fn tree(values: &[f64], combine: &dyn Fn(f64, f64) -> f64, identity: f64) -> f64 {
    match values.len() {
        0 => identity,
        1 => values[0],
        n => {
            let (left, right) = values.split_at(n / 2);
            combine(
                tree(left, combine, identity),
                tree(right, combine, identity),
            )
        }
    }
}

/// `components` on the host: union-find over each group's pairs (`verdicts` in the pair order of
/// `rlx_compiler::ir`: for each response i, each other response j of its group), joining i and j where
/// the verdict is non-zero; each response's class is its smallest member's 0-based position in the
/// group. Groups are independent and run in parallel.
pub(crate) fn components(verdicts: &[f64], layout: &Layout) -> Vec<f64> {
    let mut pair_starts = Vec::with_capacity(layout.groups() + 1);
    let mut pairs = 0usize;
    for g in 0..layout.groups() {
        pair_starts.push(pairs);
        let n = layout.group_size(g);
        pairs += n * n.saturating_sub(1);
    }
    let per_group: Vec<Vec<f64>> = (0..layout.groups())
        .into_par_iter()
        .map(|g| {
            let n = layout.group_size(g);
            let base = pair_starts[g];
            let mut parent: Vec<usize> = (0..n).collect();
            fn root(parent: &mut [usize], mut x: usize) -> usize {
                while parent[x] != x {
                    parent[x] = parent[parent[x]];
                    x = parent[x];
                }
                x
            }
            for i in 0..n {
                for k in 0..n.saturating_sub(1) {
                    if verdicts[base + i * (n - 1) + k] == 0.0 {
                        continue;
                    }
                    let j = if k < i { k } else { k + 1 };
                    let (a, b) = (root(&mut parent, i), root(&mut parent, j));
                    // The smaller root stays the root: a class's root is its smallest member.
                    if a < b {
                        parent[b] = a;
                    } else if b < a {
                        parent[a] = b;
                    }
                }
            }
            (0..n).map(|i| root(&mut parent, i) as f64).collect()
        })
        .collect();
    per_group.into_iter().flatten().collect()
}

/// The order `rank` sorts by: descending, NaN above every number, `-0` equal to `0` (as IEEE
/// comparison, so that two elements a recipe sees as equal are a tie).
pub fn rank_order(a: f64, b: f64) -> std::cmp::Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => std::cmp::Ordering::Equal,
        (true, false) => std::cmp::Ordering::Less,
        (false, true) => std::cmp::Ordering::Greater,
        (false, false) => b.partial_cmp(&a).unwrap_or(std::cmp::Ordering::Equal),
    }
}

/// The runs of packed elements of `level` that map to one element of `within`: the sets a `rank`
/// pass orders, as boundaries (each set is contiguous in the packed layout).
fn rank_bounds(layout: &Layout, level: Level, within: Level) -> Vec<usize> {
    let total = match level {
        Level::Tok => layout.tokens(),
        Level::Resp => layout.responses(),
        Level::Group => layout.groups(),
        Level::Batch | Level::Pair => 1,
    };
    match (level, within) {
        (Level::Tok, Level::Resp) => layout.token_offsets.clone(),
        (Level::Tok, Level::Group) => layout
            .group_offsets
            .iter()
            .map(|&r| layout.token_offsets[r])
            .collect(),
        (Level::Resp, Level::Group) => layout.group_offsets.clone(),
        _ => vec![0, total],
    }
}

/// `rank` on the host: each element's descending position within its set, ties by packed position,
/// the elements where `mask` is 0 after the others; the sets are sorted in parallel, and each large
/// set by a parallel sort.
pub(crate) fn ranks(
    values: &[f64],
    mask: Option<&[f64]>,
    layout: &Layout,
    level: Level,
    within: Level,
) -> Vec<f64> {
    let excluded = |i: usize| mask.is_some_and(|m| m[i] == 0.0);
    let bounds = rank_bounds(layout, level, within);
    let mut out = vec![0.0; values.len()];
    let sets: Vec<(usize, Vec<f64>)> = bounds
        .par_windows(2)
        .map(|w| {
            let mut order: Vec<usize> = (w[0]..w[1]).collect();
            // A total order (positions break ties), so an unstable parallel sort gives the same ranks
            // for any number of threads; a batch-wide set is one large sort.
            order.par_sort_unstable_by(|&a, &b| {
                excluded(a)
                    .cmp(&excluded(b))
                    .then(rank_order(values[a], values[b]))
                    .then(a.cmp(&b))
            });
            let mut ranks = vec![0.0; order.len()];
            for (position, &i) in order.iter().enumerate() {
                ranks[i - w[0]] = position as f64;
            }
            (w[0], ranks)
        })
        .collect();
    for (start, ranks) in sets {
        out[start..start + ranks.len()].copy_from_slice(&ranks);
    }
    out
}

/// The interpreter's `distinct_ngrams` of one response.
pub(crate) fn distinct_ngrams(tokens: &[f64], n: usize) -> f64 {
    if tokens.len() < n {
        return 1.0;
    }
    let bits: Vec<u64> = tokens.iter().map(|v| v.to_bits()).collect();
    let grams = bits.windows(n).count();
    let distinct: std::collections::HashSet<&[u64]> = bits.windows(n).collect();
    distinct.len() as f64 / grams as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_is_pairwise_and_ignores_nan_for_max() {
        assert_eq!(tree(&[1.0, 2.0, 3.0], &|a, b| a + b, 0.0), 6.0);
        assert_eq!(tree(&[], &|a, b| a + b, 0.0), 0.0);
        assert_eq!(tree(&[f64::NAN, 2.0, f64::NAN], &f64::max, f64::NAN), 2.0);
    }

    #[test]
    fn combine_reduces_each_lane_over_the_groups() {
        // Three groups of two lanes; counts summed alongside.
        let partials = [1.0, 10.0, 2.0, f64::NAN, 3.0, 30.0];
        let counts = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let (sums, totals) = combine(Reduction::Sum, &partials, Some(&counts), 3, 2);
        assert_eq!(sums[0], 6.0);
        assert!(sums[1].is_nan());
        assert_eq!(totals, Some(vec![9.0, 12.0]));
        let (maxima, none) = combine(Reduction::Max, &partials, None, 3, 2);
        assert_eq!(maxima, vec![3.0, 30.0]);
        assert_eq!(none, None);
        let (empty, _) = combine(Reduction::Min, &[], None, 0, 1);
        assert!(empty[0].is_nan(), "an empty max/min is the NaN identity");
    }

    #[test]
    fn slicing_then_scattering_keeps_the_kept_elements_and_zeroes_the_rest() {
        // Groups of 2, 1 and 2 responses; response 1 and the whole second group are dropped.
        let layout = Layout::from_counts(&[2, 1, 2], &[2, 1, 3, 2, 1], &[], 0).expect("valid");
        let kept = [true, false, false, true, true];
        let selection = Selection::new(&layout, &kept);
        assert_eq!(selection.kept_responses, vec![0, 3, 4]);
        assert_eq!(selection.layout.groups(), 2);
        let mut full = Geometry::new(layout.clone(), vec![]);
        let mut sub = Geometry::new(selection.layout.clone(), vec![]);
        let tokens: Vec<f32> = (0..layout.tokens()).map(|t| t as f32 + 1.0).collect();
        let shape = Shape::new(Level::Tok);
        let sliced = selection.slice(&mut full, &mut sub, &shape, ColumnRef::F32(&tokens));
        // Response 0's tokens (1, 2), response 3's (7, 8), response 4's (9).
        assert_eq!(sliced, Column::F32(vec![1.0, 2.0, 7.0, 8.0, 9.0]));
        let back = selection.scatter(&mut full, &mut sub, &shape, &sliced);
        assert_eq!(
            back,
            Column::F32(vec![1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 7.0, 8.0, 9.0])
        );
        // A batch-level scalar is itself on both sides.
        let scalar = Shape::new(Level::Batch);
        let one = selection.slice(&mut full, &mut sub, &scalar, ColumnRef::F64(&[4.5]));
        assert_eq!(one, Column::F64(vec![4.5]));
        assert_eq!(
            selection.scatter_responses(&[1.0, 2.0, 3.0], 5),
            vec![1.0, 0.0, 0.0, 2.0, 3.0]
        );
    }
}
