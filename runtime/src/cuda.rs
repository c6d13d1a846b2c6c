//! The CUDA backend's driver: a recipe's kernels as CUDA C (`rlx_compiler::backend::cuda`), run on a
//! [`Device`] — an NVIDIA GPU through cudarc behind the `cuda` feature (`CudaDevice`), or the host-C
//! build of the same source that the tests use on machines without a GPU (tests/cuda.rs).
//!
//! Validation, the two-phase `keep` semantics, the host passes (`distinct_ngrams`, `rank`, …) and the
//! outputs are the executor's (`crate::executor`, shared with the JIT and the interpreter): nothing
//! runs on a batch it rejects. This module is a backend of it: for each phase it uploads the layout
//! tables, the inputs (or reuses a batch already on the device, `DeviceKernel::upload`) and the
//! initial buffers, launches the loop and `combine` kernels as the executor walks the plan (a block
//! per group, `block_size` threads for token passes, one thread otherwise), moves a host pass's
//! source and result between host and device, and downloads the phase's buffers. docs/gpu.md has the
//! details.

use std::time::{Duration, Instant};

use rlx_compiler::backend::abi;
use rlx_compiler::backend::cuda::{self, CudaSource, Launch, MAX_BLOCK};
use rlx_compiler::backend::plan::{BufferKind, KernelPlan, LoopPass};
use rlx_compiler::ir::Graph;
use rlx_core::Signature;

use crate::batch::{Batch, Layout};
use crate::executor::{
    run_plan_phase, sealed, Executor, PassRun, PhaseResult, PhaseRun, PlanBackend,
};
use crate::interp::{Context, EvalError, Outcome};
use crate::kernel::{Column, ColumnRef, Kernel, PackedBatch, PackedOutcome, Precision};

#[cfg(feature = "cuda")]
mod nvidia;
#[cfg(feature = "cuda")]
pub use nvidia::CudaDevice;

/// Where the kernels run: memory, copies and launches. Buffers are untyped bytes; kernels take the
/// address of a table of buffer addresses (`rlx_compiler::backend::abi`).
pub trait Device {
    type Buffer;
    /// Compile and load the kernels (called once by `DeviceKernel::new`).
    fn load(&mut self, source: &CudaSource) -> Result<(), String>;
    /// A new buffer holding `bytes` (at least 8 bytes are allocated, so empty buffers have an address).
    fn upload(&self, bytes: &[u8]) -> Result<Self::Buffer, String>;
    /// Overwrite the start of a buffer.
    fn write(&self, buffer: &mut Self::Buffer, bytes: &[u8]) -> Result<(), String>;
    /// Copy the start of a buffer into `out` (waits for the kernels launched before).
    fn download(&self, buffer: &Self::Buffer, out: &mut [u8]) -> Result<(), String>;
    /// The buffer's address as the kernels see it.
    fn address(&self, buffer: &Self::Buffer) -> u64;
    /// Launch kernel `name` on `grid` blocks of `block` threads with arguments (table address,
    /// g_begin, g_end).
    ///
    /// # Safety
    /// The generated kernels load and store through the table without checks: `table` must hold the
    /// addresses of live buffers of this device laid out as kernel `name`'s phase of the plan expects
    /// (`Tables::size` of a layout that `Kernel`'s validation accepted, in the plan's buffer order), and
    /// `g_begin..g_end` must lie within that layout's groups. `DeviceKernel`'s runner is the one caller
    /// that builds such tables.
    unsafe fn launch(
        &self,
        name: &str,
        grid: u32,
        block: u32,
        table: &Self::Buffer,
        g_begin: u64,
        g_end: u64,
    ) -> Result<(), String>;
    /// Wait for every launched kernel.
    fn synchronize(&self) -> Result<(), String>;
    /// Threads per block of the token passes (a power of two at most `MAX_BLOCK`).
    fn block_size(&self) -> u32;
}

/// A batch's inputs already on the device (`DeviceKernel::upload`): runs on it copy no inputs.
pub struct DeviceBatch<D: Device> {
    pub batch: PackedBatch,
    buffers: Vec<D::Buffer>,
}

/// ∂loss/∂input where the kernels wrote it (`DeviceKernel::run_view_keeping_gradients`).
#[derive(Debug)]
pub struct DeviceGradient<B> {
    /// The recipe input (`Graph::inputs` index) and its name.
    pub input: usize,
    pub name: String,
    /// `len` values in `precision` (inputs sharing one buffer share the `Arc`).
    pub buffer: std::sync::Arc<B>,
    pub precision: Precision,
    pub len: usize,
    /// Where each value belongs in the whole batch's input: `None` when it is the input's own order
    /// (nothing was filtered), else the element index for each of the `len` values (a `keep` filter
    /// dropped responses; the elements not listed have gradient 0).
    pub map: Option<Vec<u64>>,
}

/// A run's outcome (without its gradients) and its gradients on the device.
pub type WithDeviceGradients<B> = (PackedOutcome, Vec<DeviceGradient<B>>);

/// A recipe's kernel on a device.
pub struct DeviceKernel<D: Device> {
    kernel: Kernel,
    source: CudaSource,
    device: D,
    /// Time spent between the first and the last launch of the latest run's phases (after a
    /// synchronize on each side): the kernels alone, without copies.
    kernel_time: std::sync::Mutex<Duration>,
}

impl<D: Device> std::fmt::Debug for DeviceKernel<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceKernel")
            .field("kernel", &self.kernel)
            .finish()
    }
}

/// The CUDA C of a compiled kernel's plan.
pub fn source(kernel: &Kernel) -> Result<CudaSource, rlx_compiler::backend::CodegenError> {
    cuda::generate(kernel.graph(), kernel.plan())
}

impl<D: Device> DeviceKernel<D> {
    /// Generate `kernel`'s CUDA C and load it on `device`. An error names what the CUDA generator or
    /// the device cannot do.
    pub fn new(kernel: Kernel, mut device: D) -> Result<DeviceKernel<D>, String> {
        let block = device.block_size();
        if block == 0 || block > MAX_BLOCK || !block.is_power_of_two() {
            return Err(format!(
                "a block of {block} threads: the CUDA kernels need a power of two up to {MAX_BLOCK}"
            ));
        }
        let source = source(&kernel).map_err(|e| e.to_string())?;
        device.load(&source)?;
        Ok(DeviceKernel {
            kernel,
            source,
            device,
            kernel_time: std::sync::Mutex::new(Duration::ZERO),
        })
    }

    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }

    pub fn source(&self) -> &CudaSource {
        &self.source
    }

    pub fn device(&self) -> &D {
        &self.device
    }

    /// The kernels' time in the latest run (synchronised launches, no copies).
    pub fn kernel_time(&self) -> Duration {
        *self.kernel_time.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Evaluate every output on `batch`, like `interp::evaluate`.
    pub fn run(&self, batch: &Batch, context: &Context) -> Result<Outcome, EvalError> {
        let packed = self.kernel.pack(batch)?;
        Ok(self.run_packed(&packed, context)?.into_outcome())
    }

    /// Evaluate every output on a packed batch (validated first; its inputs are copied to the device).
    pub fn run_packed(
        &self,
        batch: &PackedBatch,
        context: &Context,
    ) -> Result<PackedOutcome, EvalError> {
        *self.kernel_time.lock().unwrap_or_else(|e| e.into_inner()) = Duration::ZERO;
        let runner = Runner {
            kernel: self,
            resident: None,
            external: None,
            device_gradients: None,
        };
        let inputs: Vec<ColumnRef<'_>> = batch.inputs.iter().map(Column::as_column_ref).collect();
        Executor::new(&runner).run(&batch.layout, &inputs, context)
    }

    /// Evaluate every output on borrowed input columns (`Kernel::run_view` on the device: validated
    /// first, then copied to the device), except those with an address in `device_inputs`: their
    /// values are read where they are (the Python binding passes a CUDA tensor's memory this way).
    ///
    /// # Safety
    ///
    /// Each `device_inputs[i]` that is `Some` is the address, on this kernel's GPU (in its primary
    /// context), of `inputs[i].len()` values in `inputs[i]`'s precision that equal `inputs[i]` (the
    /// host columns are what is validated and what a filtered `keep` phase gathers), and no other
    /// work writes them until this call returns.
    pub unsafe fn run_view_on_device(
        &self,
        layout: &Layout,
        inputs: &[ColumnRef<'_>],
        device_inputs: &[Option<u64>],
        context: &Context,
    ) -> Result<PackedOutcome, EvalError> {
        if device_inputs.len() != inputs.len() {
            return Err(EvalError::Internal(format!(
                "{} device addresses for {} inputs",
                device_inputs.len(),
                inputs.len()
            )));
        }
        *self.kernel_time.lock().unwrap_or_else(|e| e.into_inner()) = Duration::ZERO;
        let runner = Runner {
            kernel: self,
            resident: None,
            external: Some((inputs, device_inputs)),
            device_gradients: None,
        };
        Executor::new(&runner).run(layout, inputs, context)
    }

    /// [`DeviceKernel::run_view_on_device`], leaving the gradients on the device: the outcome's loss,
    /// metrics, rewards, advantages and kept flags come back as usual, its `gradients` are empty, and
    /// each ∂loss/∂input is returned as the device buffer the kernels wrote ([`DeviceGradient`]). Of
    /// the phases' other buffers only their outputs are downloaded. The gradients' finiteness is not
    /// checked here (the values are not on the host): the caller checks them where they are. A
    /// non-finite output is an `EvalError::NonFinite` without its culprit (the host column of an
    /// input read on the device may be a placeholder, as the trainer's `RecipeOp` passes): the caller
    /// explains it with the values (`EvalError::explained`).
    ///
    /// # Safety
    ///
    /// As [`DeviceKernel::run_view_on_device`].
    pub unsafe fn run_view_keeping_gradients(
        &self,
        layout: &Layout,
        inputs: &[ColumnRef<'_>],
        device_inputs: &[Option<u64>],
        context: &Context,
    ) -> Result<WithDeviceGradients<D::Buffer>, EvalError> {
        if device_inputs.len() != inputs.len() {
            return Err(EvalError::Internal(format!(
                "{} device addresses for {} inputs",
                device_inputs.len(),
                inputs.len()
            )));
        }
        *self.kernel_time.lock().unwrap_or_else(|e| e.into_inner()) = Duration::ZERO;
        let kept = std::sync::Mutex::new(Vec::new());
        let runner = Runner {
            kernel: self,
            resident: None,
            external: Some((inputs, device_inputs)),
            device_gradients: Some(&kept),
        };
        let mut outcome = Executor::new(&runner).run(layout, inputs, context)?;
        outcome.gradients.clear();
        let mut buffers: Vec<_> = kept
            .into_inner()
            .unwrap_or_else(|e| e.into_inner())
            .into_iter()
            .map(|(b, buffer, precision, len)| (b, std::sync::Arc::new(buffer), precision, len))
            .collect();
        let graph = self.kernel.graph();
        let Some(last) = self.kernel.plan().phases.last() else {
            return Ok((outcome, Vec::new()));
        };
        let filtered = !outcome.kept.iter().all(|k| *k);
        let mut gradients = Vec::new();
        for (input, b) in &last.outputs.gradients {
            let info = &graph.inputs[*input as usize];
            let Some((_, buffer, precision, len)) = buffers.iter_mut().find(|(o, ..)| o == b)
            else {
                return Err(EvalError::Internal(format!(
                    "∂loss/∂{} was not left on the device",
                    info.name
                )));
            };
            // A `keep` filter that dropped responses ran the last phase on the kept ones: the
            // buffer's elements are the kept responses' (tokens), in order.
            let map = match (filtered, info.shape.level) {
                (false, _) | (true, rlx_compiler::ir::Level::Batch) => None,
                (true, rlx_compiler::ir::Level::Tok) if info.shape.feature.is_none() => Some(
                    (0..layout.responses())
                        .filter(|r| outcome.kept[*r])
                        .flat_map(|r| layout.token_offsets[r]..layout.token_offsets[r + 1])
                        .map(|t| t as u64)
                        .collect::<Vec<u64>>(),
                ),
                (true, rlx_compiler::ir::Level::Resp) if info.shape.feature.is_none() => Some(
                    (0..layout.responses())
                        .filter(|r| outcome.kept[*r])
                        .map(|r| r as u64)
                        .collect::<Vec<u64>>(),
                ),
                (true, _) => {
                    return Err(EvalError::Unsupported(format!(
                        "∂loss/∂{} (shape {}) after a `keep` filter that dropped responses: only \
                         token- and response-level gradients can stay on the device",
                        info.name, info.shape
                    )))
                }
            };
            if let Some(map) = &map {
                if map.len() != *len {
                    return Err(EvalError::Internal(format!(
                        "∂loss/∂{} has {len} kept elements, the filter keeps {}",
                        info.name,
                        map.len()
                    )));
                }
            }
            gradients.push(DeviceGradient {
                input: *input as usize,
                name: info.name.clone(),
                buffer: buffer.clone(),
                precision: *precision,
                len: *len,
                map,
            });
        }
        Ok((outcome, gradients))
    }

    /// Validate a packed batch and copy its inputs to the device once.
    pub fn upload(&self, batch: PackedBatch) -> Result<DeviceBatch<D>, EvalError> {
        self.kernel.validate(&batch)?;
        let buffers = batch
            .inputs
            .iter()
            .map(|column| self.device.upload(&column_bytes(column.as_column_ref())))
            .collect::<Result<Vec<_>, _>>()
            .map_err(device_error)?;
        Ok(DeviceBatch { batch, buffers })
    }

    /// Evaluate every output on a batch already on the device (a filtered `keep` phase still copies
    /// its sliced inputs).
    pub fn run_resident(
        &self,
        batch: &DeviceBatch<D>,
        context: &Context,
    ) -> Result<PackedOutcome, EvalError> {
        *self.kernel_time.lock().unwrap_or_else(|e| e.into_inner()) = Duration::ZERO;
        let runner = Runner {
            kernel: self,
            resident: Some(batch),
            external: None,
            device_gradients: None,
        };
        let inputs: Vec<ColumnRef<'_>> = batch
            .batch
            .inputs
            .iter()
            .map(Column::as_column_ref)
            .collect();
        Executor::new(&runner).run(&batch.batch.layout, &inputs, context)
    }
}

fn device_error(message: String) -> EvalError {
    EvalError::Device(message)
}

/// A column's bytes in the device's (little-endian, IEEE) layout.
fn column_bytes(column: ColumnRef<'_>) -> Vec<u8> {
    match column {
        ColumnRef::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ColumnRef::F64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

fn u64_bytes(values: impl IntoIterator<Item = u64>) -> Vec<u8> {
    values.into_iter().flat_map(u64::to_le_bytes).collect()
}

fn column_from_bytes(column: &mut Column, bytes: &[u8]) {
    match column {
        Column::F32(v) => {
            for (x, chunk) in v.iter_mut().zip(bytes.chunks_exact(4)) {
                *x = f32::from_le_bytes(chunk.try_into().expect("4 bytes"));
            }
        }
        Column::F64(v) => {
            for (x, chunk) in v.iter_mut().zip(bytes.chunks_exact(8)) {
                *x = f64::from_le_bytes(chunk.try_into().expect("8 bytes"));
            }
        }
    }
}

fn byte_len(column: &Column) -> usize {
    match column {
        Column::F32(v) => v.len() * 4,
        Column::F64(v) => v.len() * 8,
    }
}

struct Runner<'a, D: Device> {
    kernel: &'a DeviceKernel<D>,
    resident: Option<&'a DeviceBatch<D>>,
    /// The host columns of a view and, for some, the address of the same values on the device
    /// (`DeviceKernel::run_view_on_device`).
    external: Option<(&'a [ColumnRef<'a>], &'a [Option<u64>])>,
    /// Where the last phase's gradient buffers go instead of being downloaded (by buffer id, with
    /// their storage precision and length), and with it: only the phase's outputs are downloaded
    /// (`DeviceKernel::run_view_keeping_gradients`).
    device_gradients: Option<&'a KeptBuffers<D>>,
}

/// The gradient buffers a run leaves on the device: (buffer id, buffer, precision, elements).
type KeptBuffers<D> = std::sync::Mutex<Vec<(u32, <D as Device>::Buffer, Precision, usize)>>;

impl<D: Device> Runner<'_, D> {
    /// The resident device copy of input `i` when `column` is that batch's own column.
    fn resident_input(&self, i: usize, column: ColumnRef<'_>) -> Option<&D::Buffer> {
        let resident = self.resident?;
        let own = resident.batch.inputs.get(i)?.as_column_ref();
        (own.const_pointer() == column.const_pointer() && own.len() == column.len())
            .then(|| resident.buffers.get(i))
            .flatten()
    }

    /// The caller's device address of input `i` when `column` is the view's own column (a filtered
    /// phase's gathered inputs are not, and are uploaded).
    fn external_input(&self, i: usize, column: ColumnRef<'_>) -> Option<u64> {
        let (columns, addresses) = self.external?;
        let own = columns.get(i)?;
        (own.const_pointer() == column.const_pointer() && own.len() == column.len())
            .then(|| addresses.get(i).copied().flatten())
            .flatten()
    }
}

/// A phase on the device: its buffers on the host (`None` for inputs) and on the device, the fixed
/// tables, the pointer table the kernels read.
struct DevicePhase<B> {
    owned: Vec<Option<Column>>,
    /// Buffers by id: `Some` for those this phase owns (uploaded by `begin`), else an input.
    uploaded: Vec<Option<B>>,
    /// The layout's tables, the context and the sizes, which `table` points to.
    _fixed: Vec<B>,
    table: B,
    groups: u32,
    /// When the first launch could start (the device synchronised after the uploads).
    start: Instant,
}

impl<D: Device> Runner<'_, D> {
    /// The device's address of input `i` (`column`): the resident or the caller's copy, else a new
    /// upload (returned with it).
    fn input_address(
        &self,
        i: usize,
        column: ColumnRef<'_>,
    ) -> Result<(Option<D::Buffer>, u64), EvalError> {
        let device = &self.kernel.device;
        Ok(
            match (
                self.resident_input(i, column),
                self.external_input(i, column),
            ) {
                (Some(resident), _) => (None, device.address(resident)),
                (None, Some(address)) => (None, address),
                (None, None) => {
                    let b = device.upload(&column_bytes(column)).map_err(device_error)?;
                    let address = device.address(&b);
                    (Some(b), address)
                }
            },
        )
    }

    /// The kernel launched for pass `pass` of the phase being run.
    fn launch_of(&self, run: &PassRun<'_>, pass: usize) -> Result<Launch, EvalError> {
        self.kernel
            .source
            .launches
            .get(run.phase)
            .and_then(|launches| launches.get(pass).cloned().flatten())
            .ok_or_else(|| {
                EvalError::Internal(format!(
                    "pass {pass} of phase {} has no CUDA kernel",
                    run.phase
                ))
            })
    }

    /// Launch pass `pass`'s kernel over every group.
    fn launch(
        &self,
        run: &PassRun<'_>,
        state: &DevicePhase<D::Buffer>,
        pass: usize,
    ) -> Result<(), EvalError> {
        let Launch {
            name,
            per_group,
            threads,
        } = self.launch_of(run, pass)?;
        let device = &self.kernel.device;
        let grid = if per_group { state.groups } else { 1 };
        if grid == 0 {
            return Ok(());
        }
        let block = if threads { device.block_size() } else { 1 };
        // SAFETY: `state.table` holds, in the plan's order, the fixed tables of `run.layout`
        // (validated by the executor before any phase runs) and this phase's buffers, each uploaded
        // at `Tables::size` for that layout or a resident or external input of the same validated
        // batch (`device_table`); 0..groups is the whole layout.
        unsafe { device.launch(&name, grid, block, &state.table, 0, u64::from(state.groups)) }
            .map_err(|e| device_error(format!("kernel {name}: {e}")))
    }
}

/// The pointer table the CUDA kernels read (`rlx_compiler::backend::abi`, as the JIT's): the
/// layout's offset tables, the context's scalars and the sizes (uploaded into `fixed`), then the
/// address of every buffer of the phase.
fn device_table<D: Device>(
    device: &D,
    run: &PassRun<'_>,
    buffers: impl IntoIterator<Item = u64>,
) -> Result<(Vec<D::Buffer>, D::Buffer), EvalError> {
    let (layout, tables, context) = (run.layout, run.tables, run.context);
    let as_u64 = |v: &[usize]| u64_bytes(v.iter().map(|&x| x as u64));
    let fixed: Vec<D::Buffer> = abi::Fixed::ALL
        .map(|fixed| match fixed {
            abi::Fixed::GroupOffsets => as_u64(&layout.group_offsets),
            abi::Fixed::TokenOffsets => as_u64(&layout.token_offsets),
            abi::Fixed::CritOffsets => as_u64(&layout.crit_offsets),
            abi::Fixed::RespCritBase => as_u64(&tables.resp_crit_base),
            abi::Fixed::PairOffsets => as_u64(&tables.pair_offsets),
            abi::Fixed::PairCritBase => as_u64(&tables.pair_crit_base),
            abi::Fixed::Scalars => abi::scalars(context.step, context.progress)
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
            abi::Fixed::Sizes => u64_bytes(abi::sizes(tables.dim as u64)),
        })
        .iter()
        .map(|bytes| device.upload(bytes))
        .collect::<Result<_, _>>()
        .map_err(device_error)?;
    let mut addresses: Vec<u64> = fixed.iter().map(|b| device.address(b)).collect();
    addresses.extend(buffers);
    let table = device.upload(&u64_bytes(addresses)).map_err(device_error)?;
    Ok((fixed, table))
}

impl<D: Device> sealed::Backend for Runner<'_, D> {
    fn graph(&self) -> &Graph {
        self.kernel.kernel.graph()
    }

    fn signature(&self) -> &Signature {
        sealed::Backend::signature(&self.kernel.kernel)
    }

    fn phases(&self) -> usize {
        self.kernel.kernel.plan().phases.len()
    }

    fn check_layout(&self, layout: &Layout) -> Result<(), EvalError> {
        self.kernel.kernel.check_tables(layout)
    }

    fn input_storage(&self, index: usize) -> Precision {
        self.kernel.kernel.storage_of(index)
    }

    fn run_phase(&self, phase: usize, run: PhaseRun<'_>) -> Result<PhaseResult, EvalError> {
        run_plan_phase(self, phase, run)
    }

    /// A run that leaves its gradients on the device may be given placeholder host columns for the
    /// values it reads there (the trainer's), which the interpreter cannot explain a non-finite
    /// output from: its caller does, with the values (`EvalError::explained`).
    fn host_inputs_hold_values(&self) -> bool {
        self.device_gradients.is_none()
    }
}

/// The CUDA kernels run a phase's loop passes and combines on the device; the buffers are uploaded
/// when the phase begins and downloaded when it ends (and for a host pass's source).
impl<D: Device> PlanBackend for Runner<'_, D> {
    type State = DevicePhase<D::Buffer>;

    fn plan(&self) -> &KernelPlan {
        self.kernel.kernel.plan()
    }

    fn graph(&self) -> &Graph {
        self.kernel.kernel.graph()
    }

    fn begin(
        &self,
        run: &PassRun<'_>,
        owned: Vec<Option<Column>>,
    ) -> Result<Self::State, EvalError> {
        let device = &self.kernel.device;
        let phase = &self.kernel.kernel.plan().phases[run.phase];
        if self.kernel.source.launches.get(run.phase).is_none() {
            return Err(EvalError::Internal("no CUDA kernels for a phase".into()));
        }
        let mut uploaded: Vec<Option<D::Buffer>> = Vec::with_capacity(phase.buffers.len());
        let mut addresses: Vec<u64> = Vec::with_capacity(phase.buffers.len());
        for (buffer, column) in phase.buffers.iter().zip(&owned) {
            let (own, address) = match (buffer.kind, column) {
                (BufferKind::Input(i), _) => {
                    let i = i as usize;
                    let column = run
                        .inputs
                        .get(i)
                        .ok_or_else(|| EvalError::Internal("an input is missing".into()))?;
                    self.input_address(i, *column)?
                }
                (_, Some(column)) => {
                    let b = device
                        .upload(&column_bytes(column.as_column_ref()))
                        .map_err(device_error)?;
                    let address = device.address(&b);
                    (Some(b), address)
                }
                (_, None) => return Err(EvalError::Internal("a buffer was released".into())),
            };
            uploaded.push(own);
            addresses.push(address);
        }
        let (fixed, table) = device_table(device, run, addresses)?;
        let groups = u32::try_from(run.tables.groups).map_err(|_| {
            EvalError::Unsupported(format!(
                "{} groups: too many for one launch",
                run.tables.groups
            ))
        })?;
        device.synchronize().map_err(device_error)?;
        Ok(DevicePhase {
            owned,
            uploaded,
            _fixed: fixed,
            table,
            groups,
            start: Instant::now(),
        })
    }

    fn run_loop(
        &self,
        run: &PassRun<'_>,
        state: &mut Self::State,
        pass: usize,
        _loop_pass: &LoopPass,
    ) -> Result<(), EvalError> {
        self.launch(run, state, pass)
    }

    fn combine(
        &self,
        run: &PassRun<'_>,
        state: &mut Self::State,
        pass: usize,
    ) -> Result<bool, EvalError> {
        // A `combine` kernel of the generated source (the same fixed pairwise order).
        self.launch(run, state, pass).map(|()| true)
    }

    fn read(&self, state: &Self::State, b: u32) -> Result<Vec<f64>, EvalError> {
        let missing = || EvalError::Internal("buffer missing".into());
        let mut column = state.owned[b as usize].clone().ok_or_else(missing)?;
        let device_buffer = state.uploaded[b as usize].as_ref().ok_or_else(missing)?;
        let mut bytes = vec![0u8; byte_len(&column)];
        self.kernel
            .device
            .download(device_buffer, &mut bytes)
            .map_err(device_error)?;
        column_from_bytes(&mut column, &bytes);
        Ok(column.to_f64())
    }

    fn buffer_len(&self, state: &Self::State, b: u32) -> Result<usize, EvalError> {
        state.owned[b as usize]
            .as_ref()
            .map(Column::len)
            .ok_or_else(|| EvalError::Internal("buffer missing".into()))
    }

    fn write(&self, state: &mut Self::State, b: u32, values: &[f64]) -> Result<(), EvalError> {
        // The host column (in its storage precision), then the same values written to the device.
        let missing = || EvalError::Internal("buffer missing".into());
        let column = state.owned[b as usize].as_mut().ok_or_else(missing)?;
        for (i, value) in values.iter().enumerate() {
            column.set(i, *value);
        }
        let bytes = column_bytes(column.as_column_ref());
        let device_buffer = state.uploaded[b as usize].as_mut().ok_or_else(missing)?;
        self.kernel
            .device
            .write(device_buffer, &bytes)
            .map_err(device_error)
    }

    fn finish(
        &self,
        run: &PassRun<'_>,
        state: Self::State,
    ) -> Result<Vec<Option<Column>>, EvalError> {
        let device = &self.kernel.device;
        device.synchronize().map_err(device_error)?;
        *self
            .kernel
            .kernel_time
            .lock()
            .unwrap_or_else(|e| e.into_inner()) += state.start.elapsed();
        let DevicePhase {
            mut owned,
            mut uploaded,
            ..
        } = state;
        // Keeping the gradients on the device: the last phase's gradient buffers are handed over
        // (their host columns zeroed: the values are not here), and of the other buffers only the
        // phase's outputs come back (what the executor's keep filter and outputs read).
        let plan = self.kernel.kernel.plan();
        let last = run.phase + 1 == plan.phases.len();
        let outputs = &plan.phases[run.phase].outputs;
        for (b, (column, buffer)) in owned.iter_mut().zip(uploaded.iter_mut()).enumerate() {
            let b = b as u32;
            let Some(column) = column.as_mut() else {
                continue;
            };
            if let Some(kept) = self.device_gradients {
                if last && outputs.gradients.iter().any(|(_, o)| *o == b) {
                    if let Some(buffer) = buffer.take() {
                        let mut kept = kept.lock().unwrap_or_else(|e| e.into_inner());
                        kept.push((b, buffer, column.precision(), column.len()));
                    }
                    match column {
                        Column::F32(v) => v.fill(0.0),
                        Column::F64(v) => v.fill(0.0),
                    }
                    continue;
                }
                let output = outputs.loss == Some(b)
                    || outputs.reward == Some(b)
                    || outputs.advantage == Some(b)
                    || outputs.metrics.iter().any(|(_, o)| *o == b)
                    || outputs.keeps.iter().any(|(_, o)| *o == b)
                    || outputs.exports.iter().any(|(_, o)| *o == b);
                if !output {
                    continue; // an intermediate value: nothing after the phase reads it
                }
            }
            if let Some(buffer) = buffer {
                let mut bytes = vec![0u8; byte_len(column)];
                device.download(buffer, &mut bytes).map_err(device_error)?;
                column_from_bytes(column, &bytes);
            }
        }
        Ok(owned)
    }
}

/// Whether this build has the GPU device (the `cuda` cargo feature).
pub const ENABLED: bool = cfg!(feature = "cuda");

/// The error for `--device cuda:N` in a build without the `cuda` feature.
pub fn without_feature(ordinal: usize) -> String {
    format!(
        "--device cuda:{ordinal}: this rlx was built without the `cuda` feature; rebuild it with \
         `cargo build --release --features cuda` (docs/gpu.md)"
    )
}

/// A recipe's kernels on one NVIDIA GPU (`--device cuda:N`): `DeviceKernel` over `CudaDevice`, with
/// the same interface in every build. Without the `cuda` feature no value exists: [`GpuKernel::new`]
/// is the error [`without_feature`].
pub struct GpuKernel {
    #[cfg(feature = "cuda")]
    inner: DeviceKernel<CudaDevice>,
    #[cfg(not(feature = "cuda"))]
    never: std::convert::Infallible,
    ordinal: usize,
}

impl std::fmt::Debug for GpuKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuKernel")
            .field("ordinal", &self.ordinal)
            .finish()
    }
}

impl GpuKernel {
    /// Compile `graph` with `options` (the JIT's plan, as CUDA C) and load it on GPU `ordinal`. An
    /// error, never a fallback, when the recipe has no kernel plan or CUDA form, when this build has
    /// no `cuda` feature, or when there is no usable GPU.
    pub fn new(
        graph: &rlx_compiler::ir::Graph,
        options: &crate::kernel::Options,
        ordinal: usize,
    ) -> Result<GpuKernel, String> {
        if !ENABLED {
            return Err(without_feature(ordinal));
        }
        let kernel = Kernel::compile(graph, options).map_err(|e| format!("no kernel plan: {e}"))?;
        GpuKernel::from_kernel(kernel, ordinal)
    }

    /// Load an already compiled kernel's CUDA form on GPU `ordinal`.
    #[cfg(feature = "cuda")]
    pub fn from_kernel(kernel: Kernel, ordinal: usize) -> Result<GpuKernel, String> {
        let device = open(ordinal)?;
        let inner = DeviceKernel::new(kernel, device)?;
        Ok(GpuKernel { inner, ordinal })
    }

    /// Compile `graph` with `options` and load it on the GPU of `stream`, its kernels launched on that
    /// stream (candle's: `rlx run --device cuda` runs the recipe in order with the model's work, and
    /// reads the model's log-probabilities where candle left them, `run_view_on_device`).
    #[cfg(feature = "cuda")]
    pub fn on_stream(
        graph: &rlx_compiler::ir::Graph,
        options: &crate::kernel::Options,
        stream: std::sync::Arc<cudarc::driver::CudaStream>,
    ) -> Result<GpuKernel, String> {
        let kernel = Kernel::compile(graph, options).map_err(|e| format!("no kernel plan: {e}"))?;
        let ordinal = stream.context().ordinal();
        let device = CudaDevice::on_stream(stream)?;
        let inner = DeviceKernel::new(kernel, device)?;
        Ok(GpuKernel { inner, ordinal })
    }

    /// Load an already compiled kernel's CUDA form on GPU `ordinal`.
    #[cfg(not(feature = "cuda"))]
    pub fn from_kernel(_kernel: Kernel, ordinal: usize) -> Result<GpuKernel, String> {
        Err(without_feature(ordinal))
    }

    /// The GPU's index (`cuda:N`).
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The runner itself (uploads, resident batches, kernel times).
    #[cfg(feature = "cuda")]
    pub fn device_kernel(&self) -> &DeviceKernel<CudaDevice> {
        &self.inner
    }

    /// The compiled kernel (plan, validation, packing).
    pub fn kernel(&self) -> &Kernel {
        #[cfg(feature = "cuda")]
        return self.inner.kernel();
        #[cfg(not(feature = "cuda"))]
        match self.never {}
    }

    pub fn graph(&self) -> &rlx_compiler::ir::Graph {
        self.kernel().graph()
    }

    /// The GPU's name.
    pub fn name(&self) -> String {
        #[cfg(feature = "cuda")]
        return self.inner.device().name();
        #[cfg(not(feature = "cuda"))]
        match self.never {}
    }

    /// Threads per block of the token passes (`$RLX_CUDA_BLOCK`, 256 by default).
    pub fn block_size(&self) -> u32 {
        #[cfg(feature = "cuda")]
        return self.inner.device().block_size();
        #[cfg(not(feature = "cuda"))]
        match self.never {}
    }

    /// Evaluate every output on `batch` on the GPU, like `interp::evaluate`.
    pub fn run(&self, batch: &Batch, context: &Context) -> Result<Outcome, EvalError> {
        #[cfg(feature = "cuda")]
        return self.inner.run(batch, context);
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (batch, context);
            match self.never {}
        }
    }

    /// [`DeviceKernel::run_view_on_device`] on this GPU.
    ///
    /// # Safety
    ///
    /// As [`DeviceKernel::run_view_on_device`]: each address in `device_inputs` holds the same values
    /// as its host column, on this GPU, unwritten until the call returns.
    pub unsafe fn run_view_on_device(
        &self,
        layout: &Layout,
        inputs: &[ColumnRef<'_>],
        device_inputs: &[Option<u64>],
        context: &Context,
    ) -> Result<PackedOutcome, EvalError> {
        #[cfg(feature = "cuda")]
        // SAFETY: the caller's contract, passed on.
        return unsafe {
            self.inner
                .run_view_on_device(layout, inputs, device_inputs, context)
        };
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (layout, inputs, device_inputs, context);
            match self.never {}
        }
    }
}

impl GpuKernel {
    /// [`DeviceKernel::run_view_keeping_gradients`] on this GPU: the gradients stay in device memory
    /// of this kernel's stream (`rlx run --device cuda`'s recipe op hands them to candle).
    ///
    /// # Safety
    ///
    /// As [`DeviceKernel::run_view_on_device`].
    #[cfg(feature = "cuda")]
    pub unsafe fn run_view_keeping_gradients(
        &self,
        layout: &Layout,
        inputs: &[ColumnRef<'_>],
        device_inputs: &[Option<u64>],
        context: &Context,
    ) -> Result<WithDeviceGradients<cudarc::driver::CudaSlice<u8>>, EvalError> {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            self.inner
                .run_view_keeping_gradients(layout, inputs, device_inputs, context)
        }
    }
}

/// GPU `ordinal`, an error naming the `--device` it was asked for.
#[cfg(feature = "cuda")]
fn open(ordinal: usize) -> Result<CudaDevice, String> {
    CudaDevice::new(ordinal).map_err(|e| {
        if e.contains(&format!("cuda:{ordinal}")) {
            e
        } else {
            format!("--device cuda:{ordinal}: {e}")
        }
    })
}

/// Check that GPU `ordinal` is usable (this build's `cuda` feature, the driver, the device) without
/// compiling anything, and return its name: `rlx run --device cuda` asks before it writes anything.
pub fn probe(ordinal: usize) -> Result<String, String> {
    #[cfg(feature = "cuda")]
    return open(ordinal).map(|device| device.name());
    #[cfg(not(feature = "cuda"))]
    Err(without_feature(ordinal))
}

/// Evaluate `graph` on `batch` on GPU `ordinal` (`rlx score --device cuda:N`), with `options`' storage
/// and accumulation. An error, never a fallback, when the recipe has no CUDA form or there is no GPU
/// (or no `cuda` feature: [`without_feature`]).
pub fn evaluate_on_gpu(
    graph: &rlx_compiler::ir::Graph,
    batch: &Batch,
    context: &Context,
    ordinal: usize,
    options: &crate::kernel::Options,
) -> Result<Outcome, String> {
    GpuKernel::new(graph, options, ordinal)?
        .run(batch, context)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::kernel::Options;
    use crate::synthetic::{self, Spec};

    /// Host memory whose launches compute nothing and record the buffer table they were given (the
    /// addresses the kernels would read); tests/cuda.rs runs the kernels themselves on the host-C build.
    #[derive(Default)]
    struct Recording {
        tables: Mutex<Vec<Vec<u64>>>,
        /// Bytes copied device → host.
        downloaded: Mutex<usize>,
    }

    impl Device for Recording {
        type Buffer = Vec<u8>;
        fn load(&mut self, _source: &CudaSource) -> Result<(), String> {
            Ok(())
        }
        fn upload(&self, bytes: &[u8]) -> Result<Vec<u8>, String> {
            let mut buffer = bytes.to_vec();
            buffer.resize(bytes.len().max(8), 0);
            Ok(buffer)
        }
        fn write(&self, buffer: &mut Vec<u8>, bytes: &[u8]) -> Result<(), String> {
            buffer[..bytes.len()].copy_from_slice(bytes);
            Ok(())
        }
        fn download(&self, buffer: &Vec<u8>, out: &mut [u8]) -> Result<(), String> {
            out.copy_from_slice(&buffer[..out.len()]);
            *self.downloaded.lock().unwrap() += out.len();
            Ok(())
        }
        fn address(&self, buffer: &Vec<u8>) -> u64 {
            buffer.as_ptr() as u64
        }
        unsafe fn launch(
            &self,
            _name: &str,
            _grid: u32,
            _block: u32,
            table: &Vec<u8>,
            _g_begin: u64,
            _g_end: u64,
        ) -> Result<(), String> {
            let addresses = table
                .chunks_exact(8)
                .map(|word| u64::from_le_bytes(word.try_into().expect("8 bytes")))
                .collect();
            self.tables.lock().unwrap().push(addresses);
            Ok(())
        }
        fn synchronize(&self) -> Result<(), String> {
            Ok(())
        }
        fn block_size(&self) -> u32 {
            32
        }
    }

    #[test]
    fn inputs_with_a_device_address_are_read_there_instead_of_uploaded() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../recipes/grpo.rlx");
        let checked = rlx_compiler::check_path(std::path::Path::new(path)).expect("readable");
        let graph = rlx_compiler::compile_graph(&checked.recipe.expect("grpo checks"), &[])
            .expect("it lowers");
        let logp = graph.inputs.iter().position(|i| i.name == "logp").unwrap();
        let kernel = Kernel::compile(&graph, &Options::default()).expect("compiles");
        let device = DeviceKernel::new(kernel, Recording::default()).expect("loads");
        let batch = synthetic::batch(&graph, &Spec::default());
        let packed = device.kernel().pack(&batch).expect("packs");
        let columns: Vec<ColumnRef<'_>> = packed.inputs.iter().map(Column::as_column_ref).collect();
        // Never dereferenced: the recording device runs nothing.
        let address = 0x7e57_0000_0000u64;
        let run = |addresses: &[Option<u64>]| {
            device.device().tables.lock().unwrap().clear();
            // SAFETY: the recording device reads no address.
            let result = unsafe {
                device.run_view_on_device(&packed.layout, &columns, addresses, &Context::default())
            };
            (result, device.device().tables.lock().unwrap().clone())
        };
        let mut addresses = vec![None; columns.len()];
        addresses[logp] = Some(address);
        let (_, tables) = run(&addresses);
        assert!(!tables.is_empty(), "nothing was launched");
        assert!(
            tables.iter().any(|table| table.contains(&address)),
            "no launch reads logp at its device address"
        );
        let (_, tables) = run(&vec![None; columns.len()]);
        assert!(!tables.is_empty() && tables.iter().all(|table| !table.contains(&address)));
        let (result, tables) = run(&addresses[1..]);
        assert!(result
            .unwrap_err()
            .to_string()
            .contains("device addresses for"));
        assert!(
            tables.is_empty(),
            "a run with a wrong address count launched"
        );
    }

    #[test]
    fn kept_gradients_stay_on_the_device_and_only_outputs_come_back() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../recipes/grpo.rlx");
        let checked = rlx_compiler::check_path(std::path::Path::new(path)).expect("readable");
        let graph = rlx_compiler::compile_graph(&checked.recipe.expect("grpo checks"), &[])
            .expect("it lowers");
        let logp = graph.inputs.iter().position(|i| i.name == "logp").unwrap();
        let kernel = Kernel::compile(&graph, &Options::default()).expect("compiles");
        let device = DeviceKernel::new(kernel, Recording::default()).expect("loads");
        let batch = synthetic::batch(&graph, &Spec::default());
        let packed = device.kernel().pack(&batch).expect("packs");
        let tokens = packed.layout.tokens();
        let columns: Vec<ColumnRef<'_>> = packed.inputs.iter().map(Column::as_column_ref).collect();
        let addresses = vec![None; columns.len()];
        let downloaded = || std::mem::take(&mut *device.device().downloaded.lock().unwrap());
        // SAFETY: the recording device reads no address.
        let full = unsafe {
            device.run_view_on_device(&packed.layout, &columns, &addresses, &Context::default())
        }
        .expect("runs");
        let everything = downloaded();
        assert_eq!(full.gradients.len(), 1);
        // SAFETY: as above.
        let (outcome, gradients) = unsafe {
            device.run_view_keeping_gradients(
                &packed.layout,
                &columns,
                &addresses,
                &Context::default(),
            )
        }
        .expect("runs");
        let outputs_only = downloaded();
        assert!(
            outcome.gradients.is_empty(),
            "the gradients are not on the host"
        );
        assert_eq!(outcome.loss, full.loss);
        assert_eq!(gradients.len(), 1);
        let gradient = &gradients[0];
        assert_eq!((gradient.input, gradient.name.as_str()), (logp, "logp"));
        assert_eq!((gradient.len, gradient.precision), (tokens, Precision::F32));
        assert!(gradient.map.is_none(), "nothing was filtered");
        assert!(gradient.buffer.len() >= 4 * tokens);
        assert!(
            outputs_only + 4 * tokens <= everything,
            "kept: {outputs_only} bytes downloaded, all: {everything}, tokens {tokens}"
        );
        let mut wrong = addresses.clone();
        wrong.pop();
        // SAFETY: as above.
        let error = unsafe {
            device.run_view_keeping_gradients(&packed.layout, &columns, &wrong, &Context::default())
        }
        .unwrap_err();
        assert!(error.to_string().contains("device addresses for"));
    }
}
