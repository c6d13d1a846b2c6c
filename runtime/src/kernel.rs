//! Kernel execution: a recipe's graph compiled to a kernel plan and native code
//! (`rlx_compiler::backend`), run over a packed batch. `Kernel::run` gives the same `Outcome` as the
//! interpreter (`crate::interp::evaluate`), including its two-phase `keep` semantics, non-finite
//! outputs as errors, and 0 advantage and gradient for filtered responses.
//!
//! - **Storage.** `f32` inputs are held in the plan's storage precision (f32 by default, see
//!   `Options`), `i32`/`bool` inputs in f64; token-level outputs (gradients) in the storage precision,
//!   everything else in the accumulation precision. `Kernel::pack` converts a `Batch` once;
//!   `Kernel::run_packed` runs on a `PackedBatch` (the trainer's path: no conversion per step).
//! - **Validation.** Before any kernel runs, the layout is validated and every input's length checked
//!   against its shape (`interp::check_batch`'s rules, without building the interpreter's O(tokens)
//!   index tables); a malformed batch is an error, never an out-of-bounds access. Groups larger than
//!   the pairwise limit (`batch::check_group_sizes`) are refused before any table is sized.
//! - **Threads.** Passes whose loop nest starts with groups are split into ranges of whole groups
//!   across the current rayon pool. Every value is computed by one thread in a fixed order and
//!   reductions to the batch go through per-group partials combined in a fixed pairwise order, so the
//!   results are bit-identical for any number of threads.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rayon::prelude::*;

use rlx_compiler::backend::jit::{self, slot, JitKernel, PassFn};
use rlx_compiler::backend::plan::{self, BufferKind, Init, KernelPlan, Pass, Reduction};
pub use rlx_compiler::backend::{Options, Precision};
use rlx_compiler::ir::{Elem, Graph, KeepLevel, Level, NodeId, Shape};

use rlx_core::{CoreError, Signature, Sizes};

use crate::arrays::first_where;
use crate::batch::{Batch, Layout};
use crate::geometry::Geometry;
use crate::interp::{finite, rubric_lens, Context, EvalError, Outcome, Selection};

/// Values of one input or buffer, in their storage precision.
#[derive(Clone, Debug, PartialEq)]
pub enum Column {
    F32(Vec<f32>),
    F64(Vec<f64>),
}

impl Column {
    fn filled(precision: Precision, len: usize, value: f64) -> Column {
        match precision {
            Precision::F32 => Column::F32(vec![value as f32; len]),
            Precision::F64 => Column::F64(vec![value; len]),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Column::F32(v) => v.len(),
            Column::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn precision(&self) -> Precision {
        match self {
            Column::F32(_) => Precision::F32,
            Column::F64(_) => Precision::F64,
        }
    }

    pub fn get(&self, index: usize) -> f64 {
        match self {
            Column::F32(v) => f64::from(v[index]),
            Column::F64(v) => v[index],
        }
    }

    pub fn to_f64(&self) -> Vec<f64> {
        match self {
            Column::F32(v) => v.iter().map(|x| f64::from(*x)).collect(),
            Column::F64(v) => v.clone(),
        }
    }

    fn set(&mut self, index: usize, value: f64) {
        match self {
            Column::F32(v) => v[index] = value as f32,
            Column::F64(v) => v[index] = value,
        }
    }

    fn pointer(&mut self) -> *mut u8 {
        match self {
            Column::F32(v) => v.as_mut_ptr().cast(),
            Column::F64(v) => v.as_mut_ptr().cast(),
        }
    }

    /// Whether every value is finite (`arrays::first_where`'s branch-free blocks: a gradient is
    /// batch-sized, and `Iterator::all` stops at each element to test it).
    fn all_finite(&self) -> bool {
        match self {
            Column::F32(v) => first_where(v, |x: f32| !x.is_finite()).is_none(),
            Column::F64(v) => first_where(v, |x: f64| !x.is_finite()).is_none(),
        }
    }
}

/// Borrowed values of one input, in a kernel's storage precision: a [`Column`]'s, or memory the caller
/// owns (the Python binding passes NumPy arrays and torch tensors this way, without copying them).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ColumnRef<'a> {
    F32(&'a [f32]),
    F64(&'a [f64]),
}

impl<'a> ColumnRef<'a> {
    pub fn len(&self) -> usize {
        match self {
            ColumnRef::F32(v) => v.len(),
            ColumnRef::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn precision(&self) -> Precision {
        match self {
            ColumnRef::F32(_) => Precision::F32,
            ColumnRef::F64(_) => Precision::F64,
        }
    }

    pub fn to_f64(&self) -> Vec<f64> {
        match self {
            ColumnRef::F32(v) => v.iter().map(|x| f64::from(*x)).collect(),
            ColumnRef::F64(v) => v.to_vec(),
        }
    }

    /// The elements at `indices` (an index past the end reads as 0, as the interpreter's slicing).
    fn gather(&self, indices: &[usize]) -> Column {
        match self {
            ColumnRef::F32(v) => Column::F32(
                indices
                    .iter()
                    .map(|&i| v.get(i).copied().unwrap_or(0.0))
                    .collect(),
            ),
            ColumnRef::F64(v) => Column::F64(
                indices
                    .iter()
                    .map(|&i| v.get(i).copied().unwrap_or(0.0))
                    .collect(),
            ),
        }
    }

    /// The address of the first element (the generated code only reads inputs).
    pub(crate) fn const_pointer(&self) -> *mut u8 {
        match self {
            ColumnRef::F32(v) => v.as_ptr().cast_mut().cast(),
            ColumnRef::F64(v) => v.as_ptr().cast_mut().cast(),
        }
    }
}

impl Column {
    /// The column's values, borrowed.
    pub fn as_column_ref(&self) -> ColumnRef<'_> {
        match self {
            Column::F32(v) => ColumnRef::F32(v),
            Column::F64(v) => ColumnRef::F64(v),
        }
    }
}

/// A batch in a kernel's storage: the layout and one column per input, in the recipe's input order.
#[derive(Clone, Debug, PartialEq)]
pub struct PackedBatch {
    pub layout: Layout,
    pub inputs: Vec<Column>,
}

/// What a kernel run produced; like `interp::Outcome`, with gradients in the storage precision.
#[derive(Clone, Debug, PartialEq)]
pub struct PackedOutcome {
    pub loss: Option<f64>,
    pub metrics: Vec<(String, f64)>,
    pub reward: Option<Vec<f64>>,
    pub advantage: Option<Vec<f64>>,
    pub kept: Vec<bool>,
    pub gradients: Vec<(String, Column)>,
}

impl PackedOutcome {
    pub fn into_outcome(self) -> Outcome {
        Outcome {
            loss: self.loss,
            metrics: self.metrics,
            reward: self.reward,
            advantage: self.advantage,
            kept: self.kept,
            gradients: self
                .gradients
                .into_iter()
                .map(|(name, column)| (name, column.to_f64()))
                .collect(),
        }
    }
}

/// A recipe's graph compiled to native kernels.
pub struct Kernel {
    graph: Graph,
    /// `graph`'s signature, what every batch is validated against.
    signature: Signature,
    plan: KernelPlan,
    jit: JitKernel,
    compile_time: Duration,
    launches: AtomicUsize,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel")
            .field("phases", &self.plan.phases.len())
            .field("compile_time", &self.compile_time)
            .finish()
    }
}

/// The layout's sizes and the per-group offset tables the generated code reads.
pub(crate) struct Tables {
    /// Every level's and shape's element count (checked: a batch whose sizes overflow is an error).
    sizes: Sizes,
    pub(crate) groups: usize,
    pub(crate) dim: usize,
    pub(crate) resp_crit_base: Vec<usize>,
    pub(crate) pair_offsets: Vec<usize>,
    pub(crate) pair_crit_base: Vec<usize>,
}

fn too_large() -> EvalError {
    EvalError::Batch(CoreError::Overflow)
}

impl Tables {
    /// For a validated layout.
    fn new(layout: &Layout) -> Result<Tables, EvalError> {
        // The totals are checked here, so no prefix sum below them overflows.
        let sizes = Sizes::new(layout).map_err(EvalError::Batch)?;
        let groups = layout.groups();
        let mut resp_crit_base = Vec::with_capacity(groups + 1);
        let mut pair_offsets = Vec::with_capacity(groups + 1);
        let mut pair_crit_base = Vec::with_capacity(groups + 1);
        let (mut resp_crits, mut pairs, mut pair_crits) = (0usize, 0usize, 0usize);
        for g in 0..groups {
            resp_crit_base.push(resp_crits);
            pair_offsets.push(pairs);
            pair_crit_base.push(pair_crits);
            let n = layout.group_size(g);
            let group_pairs = n * n.saturating_sub(1);
            resp_crits += n * layout.crit_count(g);
            pairs += group_pairs;
            pair_crits += group_pairs * layout.crit_count(g);
        }
        resp_crit_base.push(resp_crits);
        pair_offsets.push(pairs);
        pair_crit_base.push(pair_crits);
        Ok(Tables {
            groups,
            dim: sizes.dim,
            sizes,
            resp_crit_base,
            pair_offsets,
            pair_crit_base,
        })
    }

    /// Elements of a shape (as `Geometry::size`).
    pub(crate) fn size(&self, shape: &Shape) -> Result<usize, EvalError> {
        self.sizes.size(shape).map_err(EvalError::Batch)
    }
}

/// Runs one phase's passes (the JIT's native functions here; the CUDA kernels in `crate::cuda`), on
/// buffers from `Kernel::phase_buffers`. Validation, `keep` filters and the outputs stay in `Kernel`,
/// shared by every backend.
pub(crate) trait PhaseRunner {
    #[allow(clippy::too_many_arguments)]
    fn run_phase(
        &self,
        kernel: &Kernel,
        phase_index: usize,
        layout: &Layout,
        tables: &Tables,
        inputs: &[ColumnRef<'_>],
        carried: HashMap<NodeId, Column>,
        context: &Context,
    ) -> Result<Vec<Option<Column>>, EvalError>;
}

/// The JIT's runner.
struct Native;

impl PhaseRunner for Native {
    fn run_phase(
        &self,
        kernel: &Kernel,
        phase_index: usize,
        layout: &Layout,
        tables: &Tables,
        inputs: &[ColumnRef<'_>],
        carried: HashMap<NodeId, Column>,
        context: &Context,
    ) -> Result<Vec<Option<Column>>, EvalError> {
        kernel.run_phase(phase_index, layout, tables, inputs, carried, context)
    }
}

/// A pointer table shared by the threads of one pass.
struct SharedTable(Vec<*mut u8>);

// SAFETY: the table is only read. The buffers it points to are written by the generated code at
// elements of the groups each call is given (stores and accumulators are group-local; batch
// reductions go to per-group partials), and the group ranges handed to concurrent calls are
// disjoint, so no element is written by two threads or read while another thread writes it.
unsafe impl Sync for SharedTable {}

/// Group ranges of roughly equal work (tokens plus responses), about four per thread.
fn group_ranges(layout: &Layout, threads: usize) -> Vec<(usize, usize)> {
    let groups = layout.groups();
    let work = |g: usize| {
        let (first, end) = (layout.group_offsets[g], layout.group_offsets[g + 1]);
        (layout.token_offsets[end] - layout.token_offsets[first]) + (end - first) + 1
    };
    let total: usize = (0..groups).map(work).sum();
    let chunks = (threads * 4).max(1);
    let target = total.div_ceil(chunks).max(1);
    let mut ranges = Vec::new();
    let (mut start, mut load) = (0, 0);
    for g in 0..groups {
        load += work(g);
        if load >= target {
            ranges.push((start, g + 1));
            start = g + 1;
            load = 0;
        }
    }
    if start < groups {
        ranges.push((start, groups));
    }
    ranges
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

impl Kernel {
    /// Plan and compile `graph` (from `rlx_compiler::compile_graph`). An error names what the plan or
    /// the code generator does not support; callers fall back to the interpreter.
    pub fn compile(graph: &Graph, options: &Options) -> Result<Kernel, String> {
        Kernel::compile_with(graph, options, true)
    }

    /// `compile`, choosing whether token loops are vectorised (`jit::Codegen::simd`; the scalar
    /// code is kept for comparison: benchmarks and tests).
    pub fn compile_with(graph: &Graph, options: &Options, simd: bool) -> Result<Kernel, String> {
        let start = Instant::now();
        let plan = plan::plan(graph, options).map_err(|e| e.to_string())?;
        let codegen = jit::Codegen {
            keep_clif: false,
            simd,
        };
        let jit = jit::compile_with(graph, &plan, codegen)?;
        Ok(Kernel {
            graph: graph.clone(),
            signature: graph.signature(),
            plan,
            jit,
            compile_time: start.elapsed(),
            launches: AtomicUsize::new(0),
        })
    }

    /// The CLIF text of every loop pass of `graph`'s kernel (for inspection).
    pub fn clif(graph: &Graph, options: &Options) -> Result<Vec<String>, String> {
        let plan = plan::plan(graph, options).map_err(|e| e.to_string())?;
        Ok(jit::compile(graph, &plan, true)?.clif.clone())
    }

    pub fn plan(&self) -> &KernelPlan {
        &self.plan
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// How many compiled passes have been launched (each launch may run on several threads).
    pub fn launches(&self) -> usize {
        self.launches.load(Ordering::Relaxed)
    }

    /// Bytes a run allocates for one phase's buffers at most (outputs included, inputs not): on a
    /// typical recipe, the token-level gradients plus O(groups + responses).
    pub fn scratch_bytes(&self, layout: &Layout) -> usize {
        let Ok(tables) = self.tables(layout) else {
            return 0;
        };
        self.plan
            .phases
            .iter()
            .map(|phase| {
                phase
                    .buffers
                    .iter()
                    .filter(|b| !matches!(b.kind, BufferKind::Input(_)))
                    .map(|b| {
                        let copies = if b.per_group { tables.groups } else { 1 };
                        tables.size(&b.shape).unwrap_or(0) * copies * b.storage.bytes()
                    })
                    .sum::<usize>()
            })
            .max()
            .unwrap_or(0)
    }

    /// Planning and code generation time.
    pub fn compile_time(&self) -> Duration {
        self.compile_time
    }

    fn input_precision(&self, elem: Elem) -> Precision {
        if elem == Elem::F32 {
            self.plan.options.storage
        } else {
            Precision::F64
        }
    }

    fn tables(&self, layout: &Layout) -> Result<Tables, EvalError> {
        Tables::new(layout)
    }

    /// Check a layout and the input lengths against the recipe's signature
    /// (`rlx_core::Signature::validate`, as `interp::check_batch`), then the group sizes.
    fn check_lengths(
        &self,
        layout: &Layout,
        lengths: impl ExactSizeIterator<Item = usize>,
    ) -> Result<Tables, EvalError> {
        self.signature
            .validate(layout, lengths)
            .map_err(EvalError::Batch)?;
        crate::batch::check_group_sizes(&self.graph, layout).map_err(EvalError::GroupSize)?;
        self.tables(layout)
    }

    /// Validate a batch and convert it to the kernel's storage.
    pub fn pack(&self, batch: &Batch) -> Result<PackedBatch, EvalError> {
        self.check_lengths(&batch.layout, batch.inputs.iter().map(Vec::len))?;
        let mut inputs = Vec::with_capacity(batch.inputs.len());
        for (info, values) in self.graph.inputs.iter().zip(&batch.inputs) {
            inputs.push(match self.input_precision(info.elem) {
                Precision::F64 => Column::F64(values.clone()),
                Precision::F32 => {
                    let mut out = Vec::with_capacity(values.len());
                    for (position, value) in values.iter().enumerate() {
                        let narrow = *value as f32;
                        if value.is_finite() && !narrow.is_finite() {
                            return Err(EvalError::OutOfRange {
                                input: info.name.clone(),
                                position,
                                value: *value,
                            });
                        }
                        out.push(narrow);
                    }
                    Column::F32(out)
                }
            });
        }
        Ok(PackedBatch {
            layout: batch.layout.clone(),
            inputs,
        })
    }

    /// Check a packed batch against the plan: valid layout, one column per input, each of the right
    /// length and precision. Nothing runs on a batch that fails.
    pub fn validate(&self, batch: &PackedBatch) -> Result<(), EvalError> {
        let inputs: Vec<ColumnRef<'_>> = batch.inputs.iter().map(Column::as_column_ref).collect();
        self.validate_view(&batch.layout, &inputs)
    }

    /// [`Kernel::validate`] on borrowed input columns.
    pub fn validate_view(
        &self,
        layout: &Layout,
        inputs: &[ColumnRef<'_>],
    ) -> Result<(), EvalError> {
        self.check_lengths(layout, inputs.iter().map(ColumnRef::len))?;
        for (info, column) in self.graph.inputs.iter().zip(inputs) {
            let wanted = self.input_precision(info.elem);
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

    /// The storage precision this kernel reads input `index` in (`f32` inputs: the plan's storage;
    /// `i32`/`bool` inputs: f64); `None` past the last input.
    pub fn input_storage(&self, index: usize) -> Option<Precision> {
        let info = self.graph.inputs.get(index)?;
        Some(self.input_precision(info.elem))
    }

    /// Evaluate every output on `batch`, like `interp::evaluate`.
    pub fn run(&self, batch: &Batch, context: &Context) -> Result<Outcome, EvalError> {
        let packed = self.pack(batch)?;
        Ok(self.run_packed(&packed, context)?.into_outcome())
    }

    /// Evaluate every output on a packed batch.
    pub fn run_packed(
        &self,
        batch: &PackedBatch,
        context: &Context,
    ) -> Result<PackedOutcome, EvalError> {
        self.run_packed_with(batch, context, &Native)
    }

    /// Evaluate every output on borrowed input columns (validated first, as `run_packed`): memory the
    /// caller owns is read in place, without a copy.
    pub fn run_view(
        &self,
        layout: &Layout,
        inputs: &[ColumnRef<'_>],
        context: &Context,
    ) -> Result<PackedOutcome, EvalError> {
        self.run_view_with(layout, inputs, context, &Native)
    }

    /// `run_packed` with another backend's phase runner: the batch is validated before anything runs.
    pub(crate) fn run_packed_with(
        &self,
        batch: &PackedBatch,
        context: &Context,
        runner: &dyn PhaseRunner,
    ) -> Result<PackedOutcome, EvalError> {
        let inputs: Vec<ColumnRef<'_>> = batch.inputs.iter().map(Column::as_column_ref).collect();
        self.run_view_with(&batch.layout, &inputs, context, runner)
    }

    /// `run_view` with another backend's phase runner.
    pub(crate) fn run_view_with(
        &self,
        layout: &Layout,
        inputs: &[ColumnRef<'_>],
        context: &Context,
        runner: &dyn PhaseRunner,
    ) -> Result<PackedOutcome, EvalError> {
        self.validate_view(layout, inputs)?;
        let tables = self.tables(layout)?;
        let responses = layout.responses();
        let outcome = if self.plan.phases.len() == 1 {
            let mut buffers =
                runner.run_phase(self, 0, layout, &tables, inputs, HashMap::new(), context)?;
            self.collect(0, &mut buffers, vec![true; responses], None)?
        } else {
            self.run_filtered(layout, &tables, inputs, context, runner)?
        };
        check_finite(outcome)
    }

    fn run_filtered(
        &self,
        layout: &Layout,
        tables: &Tables,
        inputs: &[ColumnRef<'_>],
        context: &Context,
        runner: &dyn PhaseRunner,
    ) -> Result<PackedOutcome, EvalError> {
        let responses = layout.responses();
        let mut first =
            runner.run_phase(self, 0, layout, tables, inputs, HashMap::new(), context)?;
        let outputs = &self.plan.phases[0].outputs;
        let mut group_kept = vec![true; layout.groups()];
        let mut response_kept = vec![true; responses];
        for (level, buffer) in &outputs.keeps {
            let values = take(&mut first, *buffer)?;
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
        let reward = match outputs.reward {
            Some(b) => Some(take(&mut first, b)?.to_f64()),
            None => None,
        };
        let mut exports: HashMap<NodeId, Column> = HashMap::new();
        for (node, buffer) in &outputs.exports {
            exports.insert(*node, take(&mut first, *buffer)?);
        }
        drop(first);
        let nothing_dropped =
            kept.iter().all(|k| *k) && (0..layout.groups()).all(|g| layout.group_size(g) > 0);
        if nothing_dropped {
            // The kept batch is the batch (the selection also drops groups without responses, so
            // this holds only when there are none).
            let mut second = runner.run_phase(self, 1, layout, tables, inputs, exports, context)?;
            return self.collect(1, &mut second, kept, reward);
        }
        let selection = Selection::new(layout, &kept);
        let graph = &self.graph;
        let mut full = Geometry::new(layout.clone(), rubric_lens(graph));
        let mut sub = Geometry::new(selection.layout.clone(), rubric_lens(graph));
        let mut slice = |shape: &Shape, column: ColumnRef<'_>| -> Column {
            if shape.level == Level::Batch && shape.feature.is_none() && column.len() == 1 {
                return column.gather(&[0]);
            }
            let map = selection.element_map(&mut full, &mut sub, shape);
            column.gather(&map)
        };
        let sub_inputs: Vec<Column> = graph
            .inputs
            .iter()
            .zip(inputs)
            .map(|(info, column)| slice(&info.shape, *column))
            .collect();
        let carried: HashMap<NodeId, Column> = exports
            .into_iter()
            .map(|(node, column)| {
                let shape = graph.node(node).shape.clone();
                (node, slice(&shape, column.as_column_ref()))
            })
            .collect();
        let sub_layout = selection.layout.clone();
        let sub_tables = self.tables(&sub_layout)?;
        let sub_refs: Vec<ColumnRef<'_>> = sub_inputs.iter().map(Column::as_column_ref).collect();
        let mut second = runner.run_phase(
            self,
            1,
            &sub_layout,
            &sub_tables,
            &sub_refs,
            carried,
            context,
        )?;
        let mut outcome = self.collect(1, &mut second, kept, reward)?;
        // Back to the whole batch: dropped responses get advantage 0 and gradient 0.
        if let Some(advantage) = &mut outcome.advantage {
            let mut out = vec![0.0; responses];
            for (value, &r) in advantage.iter().zip(&selection.kept_responses) {
                out[r] = *value;
            }
            *advantage = out;
        }
        for (position, (input, _)) in self.plan.phases[1].outputs.gradients.iter().enumerate() {
            let shape = graph.inputs[*input as usize].shape.clone();
            let kept_values = &outcome.gradients[position].1;
            if shape.level == Level::Batch {
                continue;
            }
            let map = selection.element_map(&mut full, &mut sub, &shape);
            let mut values = Column::filled(kept_values.precision(), tables.size(&shape)?, 0.0);
            for (element, target) in map.iter().enumerate() {
                values.set(*target, kept_values.get(element));
            }
            outcome.gradients[position].1 = values;
        }
        Ok(outcome)
    }

    /// Gather a phase's outputs.
    fn collect(
        &self,
        phase: usize,
        buffers: &mut [Option<Column>],
        kept: Vec<bool>,
        reward: Option<Vec<f64>>,
    ) -> Result<PackedOutcome, EvalError> {
        let outputs = &self.plan.phases[phase].outputs;
        let scalar = |buffers: &mut [Option<Column>], b: u32| -> Result<f64, EvalError> {
            let column = buffers
                .get(b as usize)
                .and_then(Option::as_ref)
                .ok_or_else(|| EvalError::Internal(format!("output buffer b{b} missing")))?;
            Ok(if column.is_empty() {
                0.0
            } else {
                column.get(0)
            })
        };
        let loss = match outputs.loss {
            Some(b) => Some(scalar(buffers, b)?),
            None => None,
        };
        let mut metrics = Vec::new();
        for (name, b) in &outputs.metrics {
            metrics.push((name.clone(), scalar(buffers, *b)?));
        }
        let reward = match (reward, outputs.reward) {
            (Some(reward), _) => Some(reward),
            (None, Some(b)) => Some(take(buffers, b)?.to_f64()),
            (None, None) => None,
        };
        let advantage = match outputs.advantage {
            Some(b) => Some(take(buffers, b)?.to_f64()),
            None => None,
        };
        let mut gradients = Vec::new();
        for (input, b) in &outputs.gradients {
            let name = self.graph.inputs[*input as usize].name.clone();
            let shared = outputs.gradients.iter().filter(|(_, o)| o == b).count() > 1;
            let column = if shared {
                take(buffers, *b)?
            } else {
                // The only reader: move the (token-sized) buffer out instead of copying it.
                buffers
                    .get_mut(*b as usize)
                    .and_then(Option::take)
                    .ok_or_else(|| EvalError::Internal(format!("output buffer b{b} missing")))?
            };
            gradients.push((name, column));
        }
        Ok(PackedOutcome {
            loss,
            metrics,
            reward,
            advantage,
            kept,
            gradients,
        })
    }

    /// A phase's buffers before its first pass: `None` for inputs, the carried values, the others
    /// filled with their initial value.
    pub(crate) fn phase_buffers(
        &self,
        phase_index: usize,
        tables: &Tables,
        mut carried: HashMap<NodeId, Column>,
    ) -> Result<Vec<Option<Column>>, EvalError> {
        let phase = &self.plan.phases[phase_index];
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
                        len = len.checked_mul(tables.groups).ok_or_else(too_large)?;
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

    /// Run one phase's passes; returns its buffers (`None` for inputs and carried values).
    fn run_phase(
        &self,
        phase_index: usize,
        layout: &Layout,
        tables: &Tables,
        inputs: &[ColumnRef<'_>],
        carried: HashMap<NodeId, Column>,
        context: &Context,
    ) -> Result<Vec<Option<Column>>, EvalError> {
        let phase = &self.plan.phases[phase_index];
        let mut owned = self.phase_buffers(phase_index, tables, carried)?;
        let scalars = [context.step, context.progress];
        let sizes = [tables.dim];
        for (pass_index, pass) in phase.passes.iter().enumerate() {
            match pass {
                Pass::Loop(loop_pass) => {
                    let function =
                        self.jit.functions[phase_index][pass_index].ok_or_else(|| {
                            EvalError::Internal("a loop pass was not compiled".into())
                        })?;
                    let mut table: Vec<*mut u8> = vec![
                        layout.group_offsets.as_ptr().cast_mut().cast(),
                        layout.token_offsets.as_ptr().cast_mut().cast(),
                        layout.crit_offsets.as_ptr().cast_mut().cast(),
                        tables.resp_crit_base.as_ptr().cast_mut().cast(),
                        tables.pair_offsets.as_ptr().cast_mut().cast(),
                        tables.pair_crit_base.as_ptr().cast_mut().cast(),
                        scalars.as_ptr().cast_mut().cast(),
                        sizes.as_ptr().cast_mut().cast(),
                    ];
                    debug_assert_eq!(table.len(), slot::FIRST_BUFFER);
                    for (buffer, column) in phase.buffers.iter().zip(owned.iter_mut()) {
                        table.push(match (buffer.kind, column) {
                            (BufferKind::Input(i), _) => inputs[i as usize].const_pointer(),
                            (_, Some(column)) => column.pointer(),
                            (_, None) => {
                                return Err(EvalError::Internal("a buffer was released".into()))
                            }
                        });
                    }
                    self.call(function, &SharedTable(table), loop_pass.parallel(), layout);
                }
                Pass::Combine {
                    op,
                    partial,
                    partial_count,
                    value,
                    count,
                    ..
                } => {
                    let groups = tables.groups;
                    let partials = column(&owned, *partial)?.to_f64();
                    let partial_counts = match partial_count {
                        Some(b) => Some(column(&owned, *b)?.to_f64()),
                        None => None,
                    };
                    let width = column(&owned, *value)?.len();
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
                    let mut lane = Vec::with_capacity(groups);
                    for f in 0..width {
                        lane.clear();
                        lane.extend((0..groups).map(|g| partials[g * width + f]));
                        let combined = tree(&lane, combine, identity);
                        column_mut(&mut owned, *value)?.set(f, combined);
                        if let (Some(counts), Some(count)) = (&partial_counts, count) {
                            lane.clear();
                            lane.extend((0..groups).map(|g| counts[g * width + f]));
                            let total = tree(&lane, &|a, b| a + b, 0.0);
                            column_mut(&mut owned, *count)?.set(f, total);
                        }
                    }
                }
                Pass::Uniform { seed, target, .. } => {
                    let seed = match phase.buffers[*seed as usize].kind {
                        BufferKind::Input(i) => inputs[i as usize].to_f64(),
                        _ => column(&owned, *seed)?.to_f64(),
                    };
                    let seed = seed.first().copied().unwrap_or(0.0);
                    let target = column_mut(&mut owned, *target)?;
                    for i in 0..target.len() {
                        target.set(i, rlx_compiler::ir::uniform(seed, i as u64));
                    }
                }
                Pass::Rank {
                    node,
                    within,
                    source,
                    mask,
                    target,
                    ..
                } => {
                    let read = |b: u32| match phase.buffers[b as usize].kind {
                        BufferKind::Input(i) => Ok(inputs[i as usize].to_f64()),
                        _ => column(&owned, b).map(Column::to_f64),
                    };
                    let values = read(*source)?;
                    let mask = mask.map(read).transpose()?;
                    let level = self.graph.node(*node).shape.level;
                    let ranks = ranks(&values, mask.as_deref(), layout, level, *within);
                    let target = column_mut(&mut owned, *target)?;
                    for (i, rank) in ranks.into_iter().enumerate() {
                        target.set(i, rank);
                    }
                }
                Pass::Components { source, target, .. } => {
                    let verdicts = match phase.buffers[*source as usize].kind {
                        BufferKind::Input(i) => inputs[i as usize].to_f64(),
                        _ => column(&owned, *source)?.to_f64(),
                    };
                    let classes = components(&verdicts, layout);
                    let target = column_mut(&mut owned, *target)?;
                    for (r, class) in classes.into_iter().enumerate() {
                        target.set(r, class);
                    }
                }
                Pass::Ngrams {
                    n, source, target, ..
                } => {
                    let ids = match phase.buffers[*source as usize].kind {
                        BufferKind::Input(i) => inputs[i as usize].to_f64(),
                        _ => column(&owned, *source)?.to_f64(),
                    };
                    let n = *n as usize;
                    let values: Vec<f64> = (0..layout.responses())
                        .into_par_iter()
                        .map(|r| {
                            let tokens = &ids[layout.token_offsets[r]..layout.token_offsets[r + 1]];
                            distinct_ngrams(tokens, n)
                        })
                        .collect();
                    let target = column_mut(&mut owned, *target)?;
                    for (r, value) in values.into_iter().enumerate() {
                        target.set(r, value);
                    }
                }
            }
        }
        Ok(owned)
    }

    /// Call a compiled pass over every group, split across the rayon pool when it loops over groups.
    fn call(&self, function: PassFn, table: &SharedTable, parallel: bool, layout: &Layout) {
        self.launches.fetch_add(1, Ordering::Relaxed);
        let groups = layout.groups();
        let threads = rayon::current_num_threads();
        let pointer = table.0.as_ptr();
        if !parallel || threads <= 1 || groups <= 1 {
            // SAFETY: `table` was built by `run_phase` from a layout validated by `validate` (via
            // `run_packed`) and buffers sized by `Tables::size` for their shapes, which is the
            // generated code's contract (see `rlx_compiler::backend::jit`); `0..groups` is the whole
            // layout. No other code touches the buffers during the call.
            unsafe { function(pointer, 0, groups) };
            return;
        }
        let ranges = group_ranges(layout, threads);
        ranges.par_iter().for_each(|&(begin, end)| {
            let pointer = table.0.as_ptr();
            // SAFETY: as above, for a sub-range of the groups; concurrent calls get disjoint ranges
            // and write only their own groups' elements (see `SharedTable`).
            unsafe { function(pointer, begin, end) };
        });
    }
}

/// `components` on the host (the JIT's and the CUDA runtime's pass): union-find over each group's
/// pairs (`verdicts` in the pair order of `rlx_compiler::ir`: for each response i, each other response j
/// of its group), joining i and j where the verdict is non-zero; each response's class is its smallest
/// member's 0-based position in the group. Groups are independent and run in parallel.
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

/// `rank` on the host (the JIT's and the CUDA runtime's pass): each element's descending position
/// within its set, ties by packed position, the elements where `mask` is 0 after the others; the sets
/// are sorted in parallel, and each large set by a parallel sort.
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

fn column(buffers: &[Option<Column>], b: u32) -> Result<&Column, EvalError> {
    buffers
        .get(b as usize)
        .and_then(Option::as_ref)
        .ok_or_else(|| EvalError::Internal(format!("buffer b{b} missing")))
}

fn column_mut(buffers: &mut [Option<Column>], b: u32) -> Result<&mut Column, EvalError> {
    buffers
        .get_mut(b as usize)
        .and_then(Option::as_mut)
        .ok_or_else(|| EvalError::Internal(format!("buffer b{b} missing")))
}

/// A copy of a buffer (outputs may share one).
fn take(buffers: &mut [Option<Column>], b: u32) -> Result<Column, EvalError> {
    column(buffers, b).cloned()
}

/// Non-finite outputs are errors, with the interpreter's messages.
fn check_finite(outcome: PackedOutcome) -> Result<PackedOutcome, EvalError> {
    let scalars_ok = outcome.loss.is_none_or(f64::is_finite)
        && outcome.metrics.iter().all(|(_, v)| v.is_finite());
    let vectors_ok = [&outcome.reward, &outcome.advantage]
        .iter()
        .all(|v| v.as_ref().is_none_or(|v| v.iter().all(|x| x.is_finite())));
    let gradients_ok = outcome.gradients.iter().all(|(_, c)| c.all_finite());
    if scalars_ok && vectors_ok && gradients_ok {
        return Ok(outcome);
    }
    match finite(outcome.clone().into_outcome()) {
        Err(error) => Err(error),
        Ok(_) => Ok(outcome),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlx_compiler::ir::Feature;

    #[test]
    fn sizes_agree_with_the_geometry() {
        let layout = Layout::from_counts(&[1, 3, 0, 2], &[2, 0, 4, 1, 3, 5], &[2, 0, 3, 1], 4)
            .expect("valid");
        let tables = Tables::new(&layout).expect("small");
        let geometry = Geometry::new(layout.clone(), vec![3]);
        let features = [
            None,
            Some(Feature::Crit),
            Some(Feature::Dim),
            Some(Feature::Rubric { index: 0, len: 3 }),
        ];
        for level in [
            Level::Batch,
            Level::Group,
            Level::Resp,
            Level::Pair,
            Level::Tok,
        ] {
            for feature in &features {
                let shape = Shape {
                    level,
                    feature: feature.clone(),
                };
                assert_eq!(
                    tables.size(&shape).unwrap(),
                    geometry.size(&shape),
                    "{shape}"
                );
            }
        }
    }

    #[test]
    fn tree_is_pairwise_and_ignores_nan_for_max() {
        assert_eq!(tree(&[1.0, 2.0, 3.0], &|a, b| a + b, 0.0), 6.0);
        assert_eq!(tree(&[], &|a, b| a + b, 0.0), 0.0);
        assert_eq!(tree(&[f64::NAN, 2.0, f64::NAN], &f64::max, f64::NAN), 2.0);
    }

    #[test]
    fn ranges_cover_every_group_once() {
        let layout = Layout::from_counts(&[1, 3, 0, 2, 5], &[2; 11], &[], 0).expect("valid");
        for threads in 1..6 {
            let ranges = group_ranges(&layout, threads);
            let mut next = 0;
            for (begin, end) in ranges {
                assert_eq!(begin, next);
                assert!(end > begin);
                next = end;
            }
            assert_eq!(next, layout.groups());
        }
    }
}
