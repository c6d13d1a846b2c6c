//! The CUDA backend's driver: a recipe's kernels as CUDA C (`rlx_compiler::backend::cuda`), run on a
//! [`Device`] — an NVIDIA GPU through cudarc behind the `cuda` feature (`CudaDevice`), or the host-C
//! build of the same source that the tests use on machines without a GPU (tests/cuda.rs).
//!
//! Validation, the two-phase `keep` semantics and the outputs are `Kernel`'s own code (the JIT's driver,
//! `crate::kernel`): nothing runs on a batch it rejects. This module only runs one phase's passes on
//! the device: it uploads the layout tables, the inputs (or reuses a batch already on the device,
//! `DeviceKernel::upload`) and the initial buffers, launches the loop and `combine` kernels in plan
//! order (a block per group, `block_size` threads for token passes, one thread otherwise), computes
//! `distinct_ngrams` on the host, and downloads the phase's buffers. docs/gpu.md has the details.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rlx_compiler::backend::cuda::{self, CudaSource, Launch, MAX_BLOCK};
use rlx_compiler::backend::plan::{BufferKind, Pass, Phase};
use rlx_compiler::ir::NodeId;

use crate::batch::{Batch, Layout};
use crate::interp::{Context, EvalError, Outcome};
use crate::kernel::{
    components, distinct_ngrams, ranks, Column, ColumnRef, Kernel, PackedBatch, PackedOutcome,
    PhaseRunner, Tables,
};

#[cfg(feature = "cuda")]
mod nvidia;
#[cfg(feature = "cuda")]
pub use nvidia::CudaDevice;

/// Where the kernels run: memory, copies and launches. Buffers are untyped bytes; kernels take the
/// address of a table of buffer addresses (`rlx_compiler::backend::jit::slot`).
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
pub fn source(kernel: &Kernel) -> Result<CudaSource, String> {
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
        let source = source(&kernel)?;
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
        };
        self.kernel.run_packed_with(batch, context, &runner)
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
        };
        self.kernel.run_view_with(layout, inputs, context, &runner)
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
        };
        self.kernel.run_packed_with(&batch.batch, context, &runner)
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

/// The values of buffer `b` on the host, for a pass that runs there (`uniform`, `rank`, n-grams): an
/// input's own column, or the phase's buffer downloaded from the device.
fn host_values<D: Device>(
    device: &D,
    phase: &Phase,
    inputs: &[ColumnRef<'_>],
    owned: &[Option<Column>],
    uploaded: &[Option<D::Buffer>],
    b: u32,
) -> Result<Vec<f64>, EvalError> {
    let missing = || EvalError::Internal("buffer missing".into());
    Ok(match phase.buffers[b as usize].kind {
        BufferKind::Input(i) => inputs[i as usize].to_f64(),
        _ => {
            let mut column = owned[b as usize].clone().ok_or_else(missing)?;
            let device_buffer = uploaded[b as usize].as_ref().ok_or_else(missing)?;
            let mut bytes = vec![0u8; byte_len(&column)];
            device
                .download(device_buffer, &mut bytes)
                .map_err(device_error)?;
            column_from_bytes(&mut column, &bytes);
            column.to_f64()
        }
    })
}

/// A host pass's result into buffer `target`: the host column (in its storage precision), then the
/// same values written to the device.
fn store_host_values<D: Device>(
    device: &D,
    owned: &mut [Option<Column>],
    uploaded: &mut [Option<D::Buffer>],
    target: u32,
    values: Vec<f64>,
) -> Result<(), EvalError> {
    let missing = || EvalError::Internal("buffer missing".into());
    let column = owned[target as usize].as_mut().ok_or_else(missing)?;
    *column = match column {
        Column::F32(_) => Column::F32(values.iter().map(|v| *v as f32).collect()),
        Column::F64(_) => Column::F64(values),
    };
    let bytes = column_bytes(column.as_column_ref());
    let device_buffer = uploaded[target as usize].as_mut().ok_or_else(missing)?;
    device.write(device_buffer, &bytes).map_err(device_error)
}

struct Runner<'a, D: Device> {
    kernel: &'a DeviceKernel<D>,
    resident: Option<&'a DeviceBatch<D>>,
    /// The host columns of a view and, for some, the address of the same values on the device
    /// (`DeviceKernel::run_view_on_device`).
    external: Option<(&'a [ColumnRef<'a>], &'a [Option<u64>])>,
}

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

impl<D: Device> PhaseRunner for Runner<'_, D> {
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
        let device = &self.kernel.device;
        let fail = device_error;
        let phase = &kernel.plan().phases[phase_index];
        let launches = self
            .kernel
            .source
            .launches
            .get(phase_index)
            .ok_or_else(|| EvalError::Internal("no CUDA kernels for a phase".into()))?;
        let mut owned = kernel.phase_buffers(phase_index, tables, carried)?;
        let as_u64 = |v: &[usize]| u64_bytes(v.iter().map(|&x| x as u64));
        let fixed = [
            as_u64(&layout.group_offsets),
            as_u64(&layout.token_offsets),
            as_u64(&layout.crit_offsets),
            as_u64(&tables.resp_crit_base),
            as_u64(&tables.pair_offsets),
            as_u64(&tables.pair_crit_base),
            [context.step, context.progress]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
            u64_bytes([tables.dim as u64]),
        ];
        let fixed: Vec<D::Buffer> = fixed
            .iter()
            .map(|bytes| device.upload(bytes))
            .collect::<Result<_, _>>()
            .map_err(fail)?;
        // Buffers by id: `Some` for those this phase owns (uploaded now), else a resident input.
        let mut uploaded: Vec<Option<D::Buffer>> = Vec::with_capacity(phase.buffers.len());
        let mut addresses: Vec<u64> = fixed.iter().map(|b| device.address(b)).collect();
        for (buffer, column) in phase.buffers.iter().zip(&owned) {
            let (own, address) = match (buffer.kind, column) {
                (BufferKind::Input(i), _) => {
                    let i = i as usize;
                    let column = inputs
                        .get(i)
                        .ok_or_else(|| EvalError::Internal("an input is missing".into()))?;
                    match (
                        self.resident_input(i, *column),
                        self.external_input(i, *column),
                    ) {
                        (Some(resident), _) => (None, device.address(resident)),
                        (None, Some(address)) => (None, address),
                        (None, None) => {
                            let b = device.upload(&column_bytes(*column)).map_err(fail)?;
                            let address = device.address(&b);
                            (Some(b), address)
                        }
                    }
                }
                (_, Some(column)) => {
                    let b = device
                        .upload(&column_bytes(column.as_column_ref()))
                        .map_err(fail)?;
                    let address = device.address(&b);
                    (Some(b), address)
                }
                (_, None) => return Err(EvalError::Internal("a buffer was released".into())),
            };
            uploaded.push(own);
            addresses.push(address);
        }
        let table = device.upload(&u64_bytes(addresses)).map_err(fail)?;
        let groups = u32::try_from(tables.groups).map_err(|_| {
            EvalError::Device(format!("{} groups: too many for one launch", tables.groups))
        })?;
        device.synchronize().map_err(fail)?;
        let start = Instant::now();
        for (pass_index, pass) in phase.passes.iter().enumerate() {
            match (pass, launches.get(pass_index).cloned().flatten()) {
                (
                    Pass::Loop(_) | Pass::Combine { .. },
                    Some(Launch {
                        name,
                        per_group,
                        threads,
                    }),
                ) => {
                    let grid = if per_group { groups } else { 1 };
                    if grid == 0 {
                        continue;
                    }
                    let block = if threads { device.block_size() } else { 1 };
                    // SAFETY: `table` holds, in the plan's order, the fixed tables of `layout`
                    // (validated by `Kernel::run_packed` before any phase runs) and this phase's
                    // buffers, each uploaded at `Tables::size` for that layout or a resident or
                    // external input of the same validated batch; 0..groups is the whole layout.
                    unsafe { device.launch(&name, grid, block, &table, 0, u64::from(groups)) }
                        .map_err(|e| fail(format!("kernel {name}: {e}")))?;
                }
                (Pass::Uniform { seed, target, .. }, None) => {
                    // On the host: the interpreter's function, then one upload.
                    let seed = host_values(device, phase, inputs, &owned, &uploaded, *seed)?
                        .first()
                        .copied()
                        .unwrap_or(0.0);
                    let len = owned[*target as usize].as_ref().map_or(0, Column::len);
                    let values = (0..len)
                        .map(|i| rlx_compiler::ir::uniform(seed, i as u64))
                        .collect();
                    store_host_values(device, &mut owned, &mut uploaded, *target, values)?;
                }
                (
                    Pass::Rank {
                        node,
                        within,
                        source,
                        mask,
                        target,
                        ..
                    },
                    None,
                ) => {
                    // On the host: it sorts.
                    let read = |b: u32| host_values(device, phase, inputs, &owned, &uploaded, b);
                    let source_column = read(*source)?;
                    let mask_column = mask.map(read).transpose()?;
                    let level = kernel.graph().node(*node).shape.level;
                    let values = ranks(
                        &source_column,
                        mask_column.as_deref(),
                        layout,
                        level,
                        *within,
                    );
                    store_host_values(device, &mut owned, &mut uploaded, *target, values)?;
                }
                (Pass::Components { source, target, .. }, None) => {
                    // On the host: union-find (the JIT's function).
                    let verdicts = host_values(device, phase, inputs, &owned, &uploaded, *source)?;
                    let values = components(&verdicts, layout);
                    store_host_values(device, &mut owned, &mut uploaded, *target, values)?;
                }
                (
                    Pass::Ngrams {
                        n, source, target, ..
                    },
                    None,
                ) => {
                    // On the host: it needs a set.
                    let source_column =
                        host_values(device, phase, inputs, &owned, &uploaded, *source)?;
                    let n = *n as usize;
                    let values = (0..layout.responses())
                        .map(|r| {
                            let tokens = &source_column
                                [layout.token_offsets[r]..layout.token_offsets[r + 1]];
                            distinct_ngrams(tokens, n)
                        })
                        .collect();
                    store_host_values(device, &mut owned, &mut uploaded, *target, values)?;
                }
                _ => {
                    return Err(EvalError::Internal(format!(
                        "pass {pass_index} of phase {phase_index} has no CUDA kernel"
                    )))
                }
            }
        }
        device.synchronize().map_err(fail)?;
        *self
            .kernel
            .kernel_time
            .lock()
            .unwrap_or_else(|e| e.into_inner()) += start.elapsed();
        for (column, buffer) in owned.iter_mut().zip(&uploaded) {
            if let (Some(column), Some(buffer)) = (column.as_mut(), buffer) {
                let mut bytes = vec![0u8; byte_len(column)];
                device.download(buffer, &mut bytes).map_err(fail)?;
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
}
