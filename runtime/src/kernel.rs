//! Kernel execution: a recipe's graph compiled to a kernel plan and native code
//! (`rlx_compiler::backend`), run over a packed batch. `Kernel` is the JIT backend of the executor
//! (`crate::executor`): validation, the two-phase `keep` semantics, the host passes and combines and
//! the outputs are the executor's, so `Kernel::run` gives the same `Outcome` as the interpreter
//! (`crate::interp::evaluate`); this module runs a phase's loop passes as native functions.
//!
//! - **Storage.** `f32` inputs are held in the plan's storage precision (f32 by default, see
//!   `Options`), `i32`/`bool` inputs in f64; token-level outputs (gradients) in the storage precision,
//!   everything else in the accumulation precision. `Kernel::pack` converts a `Batch` once;
//!   `Kernel::run_packed` runs on a `PackedBatch` (the trainer's path: no conversion per step).
//! - **Validation.** Before any kernel runs, the executor validates the layout and every input's
//!   length and storage against the signature (`Executor::validate`, without building the
//!   interpreter's O(tokens) index tables); a malformed batch is an error, never an out-of-bounds
//!   access. Groups larger than the pairwise limit (`batch::check_group_sizes`) are refused before any
//!   table is sized.
//! - **Threads.** Passes whose loop nest starts with groups are split into ranges of whole groups
//!   across the current rayon pool. Every value is computed by one thread in a fixed order and
//!   reductions to the batch go through per-group partials combined in a fixed pairwise order, so the
//!   results are bit-identical for any number of threads.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rayon::prelude::*;

use rlx_compiler::backend::abi::{self, Fixed, Scalar, Size};
use rlx_compiler::backend::jit::{self, JitKernel, PassFn};
use rlx_compiler::backend::plan::{self, BufferKind, KernelPlan, LoopPass};
use rlx_compiler::backend::CodegenError;
pub use rlx_compiler::backend::{Options, Precision};
use rlx_compiler::ir::{Elem, Graph, Shape};

use rlx_core::{Signature, Sizes};

use crate::arrays::first_where;
use crate::batch::{Batch, Layout};
use crate::executor::{
    column, run_plan_phase, sealed, Executor, PassRun, PhaseResult, PhaseRun, PlanBackend,
};
use crate::interp::{Context, EvalError, Outcome};

/// Values of one input or buffer, in their storage precision.
#[derive(Clone, Debug, PartialEq)]
pub enum Column {
    F32(Vec<f32>),
    F64(Vec<f64>),
}

impl Column {
    pub(crate) fn filled(precision: Precision, len: usize, value: f64) -> Column {
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

    /// The values as f64 (an f64 column's own vector, without a copy).
    pub fn into_f64(self) -> Vec<f64> {
        match self {
            Column::F32(v) => v.iter().map(|x| f64::from(*x)).collect(),
            Column::F64(v) => v,
        }
    }

    pub(crate) fn set(&mut self, index: usize, value: f64) {
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
    pub(crate) fn all_finite(&self) -> bool {
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
    pub(crate) fn gather(&self, indices: &[usize]) -> Column {
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
                .map(|(name, column)| (name, column.into_f64()))
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

impl Tables {
    /// For a validated layout.
    pub(crate) fn new(layout: &Layout) -> Result<Tables, EvalError> {
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

impl Kernel {
    /// Plan and compile `graph` (from `rlx_compiler::compile_graph`). An error names what the plan or
    /// the code generator does not support; callers fall back to the interpreter.
    pub fn compile(graph: &Graph, options: &Options) -> Result<Kernel, CodegenError> {
        Kernel::compile_with(graph, options, true)
    }

    /// `compile`, choosing whether token loops are vectorised (`jit::Codegen::simd`; the scalar
    /// code is kept for comparison: benchmarks and tests).
    pub fn compile_with(
        graph: &Graph,
        options: &Options,
        simd: bool,
    ) -> Result<Kernel, CodegenError> {
        let start = Instant::now();
        let plan = plan::plan(graph, options)?;
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
    pub fn clif(graph: &Graph, options: &Options) -> Result<Vec<String>, CodegenError> {
        let plan = plan::plan(graph, options)?;
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

    /// Validate a batch and convert it to the kernel's storage.
    pub fn pack(&self, batch: &Batch) -> Result<PackedBatch, EvalError> {
        Executor::new(self).check_layout(&batch.layout, batch.inputs.iter().map(Vec::len))?;
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
        Executor::new(self).validate(layout, inputs)
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
        let inputs: Vec<ColumnRef<'_>> = batch.inputs.iter().map(Column::as_column_ref).collect();
        self.run_view(&batch.layout, &inputs, context)
    }

    /// Evaluate every output on borrowed input columns (validated first, as `run_packed`): memory the
    /// caller owns is read in place, without a copy.
    pub fn run_view(
        &self,
        layout: &Layout,
        inputs: &[ColumnRef<'_>],
        context: &Context,
    ) -> Result<PackedOutcome, EvalError> {
        Executor::new(self).run(layout, inputs, context)
    }

    /// The checks of `Executor::check_layout` beyond the signature: the kernel's tables fit.
    pub(crate) fn check_tables(&self, layout: &Layout) -> Result<(), EvalError> {
        self.tables(layout).map(|_| ())
    }

    /// `input_storage` of an input the signature has.
    pub(crate) fn storage_of(&self, index: usize) -> Precision {
        self.input_storage(index).unwrap_or(Precision::F64)
    }

    /// Call a compiled pass over every group, split across the rayon pool when it loops over groups.
    fn call(&self, function: PassFn, table: &SharedTable, parallel: bool, layout: &Layout) {
        self.launches.fetch_add(1, Ordering::Relaxed);
        let groups = layout.groups();
        let threads = rayon::current_num_threads();
        let pointer = table.0.as_ptr();
        if !parallel || threads <= 1 || groups <= 1 {
            // SAFETY: `table` was built by `pointer_table` from a layout validated by the executor
            // (`Executor::validate`, before any phase runs) and buffers sized by `Tables::size` for
            // their shapes, which is the generated code's contract (see `rlx_compiler::backend::jit`);
            // `0..groups` is the whole layout. No other code touches the buffers during the call.
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

/// The pointer table a JIT pass reads (`rlx_compiler::backend::abi`): the layout's offset tables, the
/// context's scalars, the sizes, then every buffer of the phase (inputs where they are). `scalars` and
/// `sizes` must outlive the table's use.
fn pointer_table(
    run: &PassRun<'_>,
    buffers: &mut [Option<Column>],
    phase: &rlx_compiler::backend::plan::Phase,
    scalars: &[f64; Scalar::COUNT],
    sizes: &[u64; Size::COUNT],
) -> Result<Vec<*mut u8>, EvalError> {
    let (layout, tables) = (run.layout, run.tables);
    let mut pointers: Vec<*mut u8> = Vec::with_capacity(phase.buffers.len());
    for (buffer, column) in phase.buffers.iter().zip(buffers.iter_mut()) {
        pointers.push(match (buffer.kind, column) {
            (BufferKind::Input(i), _) => run.inputs[i as usize].const_pointer(),
            (_, Some(column)) => column.pointer(),
            (_, None) => return Err(EvalError::Internal("a buffer was released".into())),
        });
    }
    let usizes = |v: &[usize]| -> *mut u8 { v.as_ptr().cast_mut().cast() };
    Ok(abi::table(
        |fixed| match fixed {
            Fixed::GroupOffsets => usizes(&layout.group_offsets),
            Fixed::TokenOffsets => usizes(&layout.token_offsets),
            Fixed::CritOffsets => usizes(&layout.crit_offsets),
            Fixed::RespCritBase => usizes(&tables.resp_crit_base),
            Fixed::PairOffsets => usizes(&tables.pair_offsets),
            Fixed::PairCritBase => usizes(&tables.pair_crit_base),
            Fixed::Scalars => scalars.as_ptr().cast_mut().cast(),
            Fixed::Sizes => sizes.as_ptr().cast_mut().cast(),
        },
        pointers,
    ))
}

impl sealed::Backend for Kernel {
    fn graph(&self) -> &Graph {
        &self.graph
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn phases(&self) -> usize {
        self.plan.phases.len()
    }

    fn check_layout(&self, layout: &Layout) -> Result<(), EvalError> {
        self.check_tables(layout)
    }

    fn input_storage(&self, index: usize) -> Precision {
        self.storage_of(index)
    }

    fn run_phase(&self, phase: usize, run: PhaseRun<'_>) -> Result<PhaseResult, EvalError> {
        run_plan_phase(self, phase, run)
    }
}

/// The JIT runs a phase's loop passes as native functions on host buffers.
impl PlanBackend for Kernel {
    type State = Vec<Option<Column>>;

    fn plan(&self) -> &KernelPlan {
        &self.plan
    }

    fn graph(&self) -> &Graph {
        &self.graph
    }

    fn begin(
        &self,
        _run: &PassRun<'_>,
        buffers: Vec<Option<Column>>,
    ) -> Result<Self::State, EvalError> {
        Ok(buffers)
    }

    fn run_loop(
        &self,
        run: &PassRun<'_>,
        buffers: &mut Self::State,
        pass: usize,
        loop_pass: &LoopPass,
    ) -> Result<(), EvalError> {
        let function = self
            .jit
            .functions
            .get(run.phase)
            .and_then(|functions| functions.get(pass).copied().flatten())
            .ok_or_else(|| EvalError::Internal("a loop pass was not compiled".into()))?;
        let scalars = abi::scalars(run.context.step, run.context.progress);
        let sizes = abi::sizes(run.tables.dim as u64);
        let phase = &self.plan.phases[run.phase];
        let table = pointer_table(run, buffers, phase, &scalars, &sizes)?;
        self.call(
            function,
            &SharedTable(table),
            loop_pass.parallel(),
            run.layout,
        );
        Ok(())
    }

    fn combine(
        &self,
        _run: &PassRun<'_>,
        _buffers: &mut Self::State,
        _pass: usize,
    ) -> Result<bool, EvalError> {
        // On the host, by the executor.
        Ok(false)
    }

    fn read(&self, buffers: &Self::State, b: u32) -> Result<Vec<f64>, EvalError> {
        column(buffers, b).map(Column::to_f64)
    }

    fn buffer_len(&self, buffers: &Self::State, b: u32) -> Result<usize, EvalError> {
        column(buffers, b).map(Column::len)
    }

    fn write(&self, buffers: &mut Self::State, b: u32, values: &[f64]) -> Result<(), EvalError> {
        let column = buffers
            .get_mut(b as usize)
            .and_then(Option::as_mut)
            .ok_or_else(|| EvalError::Internal(format!("buffer b{b} missing")))?;
        for (i, value) in values.iter().enumerate() {
            column.set(i, *value);
        }
        Ok(())
    }

    fn finish(
        &self,
        _run: &PassRun<'_>,
        buffers: Self::State,
    ) -> Result<Vec<Option<Column>>, EvalError> {
        Ok(buffers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::Geometry;
    use rlx_compiler::ir::{Feature, Level};

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
