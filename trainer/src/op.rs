//! The compiled recipe as a candle custom op: `logp.apply_op1(RecipeOp)` is the recipe's loss, and its
//! backward pass hands the recipe's ∂loss/∂logp and ∂loss/∂entropy (from the interpreter, the JIT
//! kernel or the CUDA kernels on a GPU) to candle, so `loss.backward()` flows into the policy's
//! parameters.

use std::sync::{Arc, Mutex};

use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor};
use rlx_compiler::ir::Graph;
use rlx_runtime::{evaluate, Batch, Context, EvalError, GpuKernel, Kernel, Options, Outcome};

/// How a compiled recipe is evaluated: the f64 reference interpreter, the cranelift kernel, or the
/// same kernel plan as CUDA C on a GPU (`rlx run --device cuda:N`, docs/gpu.md).
pub enum Objective {
    Interpreter(Box<Graph>),
    Kernel(Box<Kernel>),
    Gpu(Box<GpuKernel>),
}

impl Objective {
    /// The interpreter (always available; the oracle).
    pub fn interpreter(graph: Graph) -> Objective {
        Objective::Interpreter(Box::new(graph))
    }

    /// The JIT kernel; an error names what it does not support (callers may fall back).
    pub fn kernel(graph: &Graph) -> Result<Objective, rlx_compiler::backend::CodegenError> {
        Ok(Objective::Kernel(Box::new(Kernel::compile(
            graph,
            &Options::default(),
        )?)))
    }

    /// The kernel (options as [`Objective::kernel`]'s) on GPU `ordinal`; an error without the `cuda`
    /// feature, a driver or the GPU, or for a recipe the CUDA generator cannot express (no fallback).
    pub fn gpu(graph: &Graph, ordinal: usize) -> Result<Objective, String> {
        Ok(Objective::Gpu(Box::new(GpuKernel::new(
            graph,
            &Options::default(),
            ordinal,
        )?)))
    }

    /// The kernel for a run whose model is on `device`: on a candle CUDA device, the CUDA kernels on
    /// candle's own stream of that GPU (so that [`RecipeOp`]'s `cuda_fwd` reads the log-probabilities
    /// where the model left them, in order with its work); on the CPU, [`Objective::gpu`] of GPU
    /// `ordinal` (the recipe alone on the GPU).
    pub fn gpu_for(
        graph: &Graph,
        ordinal: usize,
        device: &candle_core::Device,
    ) -> Result<Objective, String> {
        #[cfg(feature = "cuda")]
        if let candle_core::Device::Cuda(cuda) = device {
            return Ok(Objective::Gpu(Box::new(GpuKernel::on_stream(
                graph,
                &Options::default(),
                cuda.cuda_stream(),
            )?)));
        }
        let _ = device;
        Objective::gpu(graph, ordinal)
    }

    pub fn graph(&self) -> &Graph {
        match self {
            Objective::Interpreter(graph) => graph,
            Objective::Kernel(kernel) => kernel.graph(),
            Objective::Gpu(kernel) => kernel.graph(),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Objective::Interpreter(_) => "interp",
            Objective::Kernel(_) => "jit",
            Objective::Gpu(_) => "cuda",
        }
    }

    /// Evaluate the recipe on `batch`; a non-finite output names the expression that made it, for
    /// which element (the executor's finiteness check, `rlx_runtime::NonFinite`).
    pub fn run(&self, batch: &Batch, context: &Context) -> Result<Outcome, EvalError> {
        match self {
            Objective::Interpreter(graph) => evaluate(graph, batch, context),
            Objective::Kernel(kernel) => kernel.run(batch, context),
            Objective::Gpu(kernel) => kernel.run(batch, context),
        }
    }
}

/// One application of the recipe to a batch whose model-computed inputs come from the op's argument;
/// every other input is fixed. The argument is `[elements, columns]` (or rank 1 for one column): column
/// `c` fills the recipe input `columns[c]` (packed order) — for the trainer, log π (`logp`, which must be
/// `policy`) and the entropy (`entropy`, differentiable when the recipe marks it `policy`) — and a
/// `None` column is one the recipe does not read (its gradient is zero).
///
/// The forward pass evaluates the recipe on the tensor's values and returns the scalar loss; the
/// `Outcome` (rewards, advantages, metrics, gradients) is kept for the caller in `outcome()`.
pub struct RecipeOp {
    objective: Arc<Objective>,
    batch: Batch,
    /// The recipe input each column fills, and whether the recipe differentiates it.
    columns: Vec<Option<(usize, bool)>>,
    context: Context,
    outcome: Arc<Mutex<Option<Outcome>>>,
    /// The evaluation's error when the forward pass failed, typed (candle's error keeps only its
    /// message): `failure_handle`.
    failure: Arc<Mutex<Option<EvalError>>>,
    /// On a GPU: ∂loss/∂argument as the recipe's kernels left it, interleaved in the argument's
    /// `[elements, columns]` layout on candle's stream (`cuda_fwd`), which `bwd` hands to candle.
    #[cfg(feature = "cuda")]
    device_gradient: Arc<Mutex<Option<DeviceGradient>>>,
}

/// ∂loss/∂argument on the GPU (`RecipeOp::cuda_fwd`): `[elements, columns]` f32, row-major.
#[cfg(feature = "cuda")]
struct DeviceGradient {
    values: candle_core::cuda_backend::cudarc::driver::CudaSlice<f32>,
    device: candle_core::CudaDevice,
}

impl RecipeOp {
    /// One column: `input` names the recipe input the op's argument fills; it must be differentiable.
    pub fn new(
        objective: Arc<Objective>,
        batch: Batch,
        input: &str,
        context: Context,
    ) -> Result<RecipeOp, String> {
        RecipeOp::with_columns(objective, batch, &[Some(input)], context)
    }

    /// Several columns (see the type's doc); the first must be differentiable, the others may be
    /// plain inputs or absent from the recipe (`None`).
    pub fn with_columns(
        objective: Arc<Objective>,
        batch: Batch,
        columns: &[Option<&str>],
        context: Context,
    ) -> Result<RecipeOp, String> {
        let graph = objective.graph();
        let mut resolved = Vec::with_capacity(columns.len());
        for (c, column) in columns.iter().enumerate() {
            let Some(input) = column else {
                resolved.push(None);
                continue;
            };
            let Some(index) = graph.inputs.iter().position(|i| i.name == *input) else {
                return Err(format!("the recipe has no input `{input}`"));
            };
            let differentiable = graph.inputs[index].differentiable;
            if c == 0 && !differentiable {
                return Err(format!(
                    "recipe input `{input}` is not marked `policy`, so the recipe gives no gradient for it"
                ));
            }
            resolved.push(Some((index, differentiable)));
        }
        if resolved.first().is_none_or(Option::is_none) {
            return Err("the recipe op needs its first column to fill a `policy` input".into());
        }
        if graph.outputs.loss.is_none() {
            return Err("the recipe has no `loss` section: there is nothing to train on".into());
        }
        Ok(RecipeOp {
            objective,
            batch,
            columns: resolved,
            context,
            outcome: Arc::new(Mutex::new(None)),
            failure: Arc::new(Mutex::new(None)),
            #[cfg(feature = "cuda")]
            device_gradient: Arc::new(Mutex::new(None)),
        })
    }

    /// A handle on the outcome of the forward pass (filled once the op has run).
    pub fn outcome_handle(&self) -> Arc<Mutex<Option<Outcome>>> {
        self.outcome.clone()
    }

    /// A handle on the evaluation's error, when the forward pass failed on one.
    pub fn failure_handle(&self) -> Arc<Mutex<Option<EvalError>>> {
        self.failure.clone()
    }

    /// Apply to `values` (`[elements]` for one column, else `[elements, columns]`, f32, packed element
    /// order): the scalar loss, and the outcome of the evaluation.
    pub fn apply(self, values: &Tensor) -> candle_core::Result<(Tensor, Outcome)> {
        let width = if values.rank() == 1 {
            1
        } else {
            values.dim(1)?
        };
        if width != self.columns.len() || values.rank() > 2 {
            candle_core::bail!(
                "rlx-recipe: the argument has shape {:?} for {} columns",
                values.dims(),
                self.columns.len()
            );
        }
        let handle = self.outcome_handle();
        let loss = values.contiguous()?.apply_op1(self)?;
        let outcome = handle
            .lock()
            .expect("outcome lock")
            .clone()
            .ok_or_else(|| candle_core::Error::Msg("the recipe op did not run".into()))?;
        Ok((loss, outcome))
    }

    /// The batch with the columns of `values` (row-major `[elements, columns]`) filled in.
    fn filled(&self, values: &[f32]) -> Batch {
        let mut batch = self.batch.clone();
        let width = self.columns.len();
        for (c, column) in self.columns.iter().enumerate() {
            if let Some((index, _)) = column {
                batch.inputs[*index] = values
                    .iter()
                    .skip(c)
                    .step_by(width)
                    .map(|v| *v as f64)
                    .collect();
            }
        }
        batch
    }

    /// Evaluate with the columns of `values` (row-major `[elements, columns]`).
    fn evaluate(&self, values: &[f32]) -> candle_core::Result<Outcome> {
        self.objective
            .run(&self.filled(values), &self.context)
            .map_err(|e| {
                let message = format!("recipe: {e}");
                *self.failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                candle_core::Error::Msg(message)
            })
    }

    /// Whether the GPU path needs the argument's values on the host: for a recipe with `keep`
    /// sections (the kept phase's inputs are gathered on the host, `Kernel`'s filter), for a column
    /// the kernels store in f64 (uploaded from the host), and for a column a host pass reads (`rank`,
    /// `components`, `distinct_ngrams`, `uniform`'s seed). Otherwise the kernels read the columns
    /// where candle holds them and the host column is a placeholder of the right length (the runner
    /// validates lengths, not values).
    pub fn needs_host_values(&self, kernel: &Kernel) -> bool {
        use rlx_compiler::backend::plan::{BufferKind, Pass};
        use rlx_runtime::Precision;
        let plan = kernel.plan();
        if plan.phases.len() > 1 {
            return true;
        }
        let filled: Vec<usize> = self.columns.iter().flatten().map(|(i, _)| *i).collect();
        if filled
            .iter()
            .any(|i| kernel.input_storage(*i) != Some(Precision::F32))
        {
            return true;
        }
        plan.phases.iter().any(|phase| {
            let reads_column = |b: &u32| {
                matches!(phase.buffers[*b as usize].kind,
                    BufferKind::Input(i) if filled.contains(&(i as usize)))
            };
            phase.passes.iter().any(|pass| match pass {
                Pass::Ngrams { source, .. } | Pass::Components { source, .. } => {
                    reads_column(source)
                }
                Pass::Rank { source, mask, .. } => {
                    reads_column(source) || mask.as_ref().is_some_and(reads_column)
                }
                Pass::Uniform { seed, .. } => reads_column(seed),
                Pass::Loop(_) | Pass::Combine { .. } => false,
            })
        })
    }

    /// The recipe's CUDA kernels on the argument where candle holds it (`storage`, on the kernels' GPU
    /// and stream). `values` is the host copy of the argument (what the runner validates and what a
    /// `keep` filter slices) or, when [`RecipeOp::needs_host_values`] says no reader needs it, zeros of
    /// its length. Each f32-stored column the recipe reads is handed to the kernels by its device
    /// address (column 0 of a one-column argument in place, the others as a contiguous copy made on
    /// the stream). The gradients stay on the device: each differentiable column's ∂loss/∂input is
    /// written into its column of a `[elements, columns]` buffer (`rlx_gradient_column_*`,
    /// `device_kernels.cu`), kept for `bwd`; only the outputs (loss, metrics, rewards, advantages) and
    /// a finiteness flag per column come back.
    #[cfg(feature = "cuda")]
    fn evaluate_on_device(
        &self,
        gpu: &GpuKernel,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
        values: &[f32],
    ) -> candle_core::Result<(Outcome, DeviceGradient)> {
        use candle_core::backend::{BackendDevice, BackendStorage};
        use candle_core::cuda_backend::cudarc::driver::{DevicePtr, DevicePtrMut};
        use rlx_runtime::{Column, Precision};

        use crate::device_kernels;

        let packed = gpu
            .kernel()
            .pack(&self.filled(values))
            .map_err(|e| self.device_failure(e, storage, layout))?;
        let width = self.columns.len();
        let elements = values.len() / width.max(1);
        let device = storage.device();
        let stream = device.cuda_stream();
        // The contiguous device copies of the columns, alive until the kernels have run.
        let mut copies = Vec::new();
        let mut addresses: Vec<Option<u64>> = vec![None; packed.inputs.len()];
        for (c, column) in self.columns.iter().enumerate() {
            let Some((index, _)) = column else {
                continue;
            };
            if !matches!(packed.inputs[*index], Column::F32(_)) {
                continue; // f64 storage: uploaded from the host column by the runner
            }
            let address = if width == 1 {
                let slice = storage.as_cuda_slice::<f32>()?;
                let (base, _sync) = slice.device_ptr(&stream);
                base + 4 * layout.start_offset() as u64
            } else {
                let shape = Shape::from(elements);
                let mut copy = device.zeros_impl(&shape, candle_core::DType::F32)?;
                let column_layout = Layout::new(shape, vec![width], layout.start_offset() + c);
                storage.copy_strided_src(&mut copy, 0, &column_layout)?;
                let base = {
                    let (base, _sync) = copy.as_cuda_slice::<f32>()?.device_ptr(&stream);
                    base
                };
                copies.push(copy);
                base
            };
            addresses[*index] = Some(address);
        }
        let columns: Vec<_> = packed.inputs.iter().map(Column::as_column_ref).collect();
        // SAFETY: each address is, on this kernel's GPU, `elements` f32 values of the argument's
        // column; the host column at the same index holds the same values, or is a placeholder that
        // nothing but the length validation reads (`needs_host_values`). They live in `storage` or
        // `copies`, which outlive the call, and the runner's kernels run on the stream that wrote them,
        // which nothing else writes them on before the call returns.
        let (outcome, gradients) = unsafe {
            gpu.run_view_keeping_gradients(&packed.layout, &columns, &addresses, &self.context)
        }
        .map_err(|e| self.device_failure(e, storage, layout))?;
        drop(copies);

        // ∂loss/∂argument, interleaved on the device; per column the first non-finite element.
        let (interleaved, out) = device_kernels::zeros(device, elements * width)?;
        let mut first_bad = device.clone_htod(&vec![u64::MAX; width])?;
        let bad_base = first_bad.device_ptr_mut(&stream).0;
        let mut maps = Vec::new();
        for (c, column) in self.columns.iter().enumerate() {
            let Some((index, true)) = column else {
                continue;
            };
            let name = &self.objective.graph().inputs[*index].name;
            let Some(gradient) = gradients.iter().find(|g| g.input == *index) else {
                candle_core::bail!("rlx-recipe: the recipe gives no gradient for `{name}`")
            };
            let (map, has_map) = match &gradient.map {
                Some(map) => {
                    let map = device.clone_htod(map.as_slice())?;
                    let address = map.device_ptr(&stream).0;
                    maps.push(map);
                    (address, 1)
                }
                None if gradient.len == elements => (0, 0),
                None => candle_core::bail!(
                    "rlx-recipe: ∂loss/∂{name} has {} elements, the argument {elements}",
                    gradient.len
                ),
            };
            let kernel = match gradient.precision {
                Precision::F32 => "rlx_gradient_column_f32",
                Precision::F64 => "rlx_gradient_column_f64",
            };
            let source = gradient.buffer.device_ptr(&stream).0;
            let table = [
                out,
                source,
                map,
                bad_base + 8 * c as u64,
                gradient.len as u64,
                width as u64,
                c as u64,
                has_map,
            ];
            if gradient.len > 0 {
                // SAFETY: `out` holds elements × width f32, `source` the gradient's `len` values in its
                // precision, `map` (if any) `len` element indices below `elements` (the runner's
                // kept-element map of this layout), the flag one u64 of `first_bad`; all on this
                // stream's device and alive until the launch has run (stream-ordered frees).
                unsafe {
                    device_kernels::launch(
                        device,
                        kernel,
                        device_kernels::element_grid(gradient.len),
                        device_kernels::ELEMENT_BLOCK,
                        &table,
                    )
                }?;
            }
        }
        let flags = device.clone_dtoh(&first_bad)?;
        drop(maps);
        drop(gradients);
        for (c, &element) in flags.iter().enumerate() {
            if element == u64::MAX {
                continue;
            }
            let Some(Some((index, _))) = self.columns.get(c) else {
                continue;
            };
            let name = &self.objective.graph().inputs[*index].name;
            let at = element as usize * width + c;
            let value = device.clone_dtoh(&interleaved.slice(at..at + 1))?[0];
            let output = rlx_runtime::NonFiniteOutput::Gradient {
                input: name.clone(),
                element: element as usize,
            };
            let non_finite = rlx_runtime::NonFinite::new(output, f64::from(value));
            return Err(self.device_failure(
                EvalError::NonFinite(Box::new(non_finite)),
                storage,
                layout,
            ));
        }
        Ok((
            outcome.into_outcome(),
            DeviceGradient {
                values: interleaved,
                device: device.clone(),
            },
        ))
    }
}

impl RecipeOp {
    /// A failure of the GPU path, kept for `failure_handle`; a non-finite output is explained first
    /// (`EvalError::explained`: the interpreter on the argument's values, copied to the host only on
    /// this failure path, since the run may have had placeholders for them). The candle error carries
    /// its message.
    #[cfg(feature = "cuda")]
    fn device_failure(
        &self,
        error: EvalError,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> candle_core::Error {
        use candle_core::backend::BackendStorage;
        let values = match (&error, layout.contiguous_offsets()) {
            (EvalError::NonFinite(_), Some((start, end))) => storage
                .to_cpu_storage()
                .ok()
                .and_then(|host| Some(host.as_slice::<f32>().ok()?[start..end].to_vec())),
            _ => None,
        };
        let error = match values {
            Some(values) => {
                error.explained(self.objective.graph(), &self.filled(&values), &self.context)
            }
            None => error,
        };
        let message = format!("recipe: {error}");
        *self.failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
        candle_core::Error::Msg(message)
    }
}

impl CustomOp1 for RecipeOp {
    fn name(&self) -> &'static str {
        "rlx-recipe"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let slice = storage.as_slice::<f32>()?;
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("rlx-recipe: the input must be contiguous")
        };
        let outcome = self.evaluate(&slice[start..end])?;
        let loss = outcome.loss.unwrap_or(0.0) as f32;
        *self.outcome.lock().expect("outcome lock") = Some(outcome);
        Ok((CpuStorage::F32(vec![loss]), Shape::from(())))
    }

    /// On a GPU: the recipe's CUDA kernels read the argument on the device (an [`Objective::Gpu`] on
    /// the same GPU; [`Objective::gpu_for`]) and leave ∂loss/∂argument there for `bwd`; the argument
    /// is copied to the host only when a reader there needs it ([`RecipeOp::needs_host_values`]). Any
    /// other objective evaluates a host copy. The scalar loss is returned on the device.
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::backend::{BackendDevice, BackendStorage};
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("rlx-recipe: the input must be contiguous")
        };
        *self.device_gradient.lock().expect("gradient lock") = None;
        let outcome = match &*self.objective {
            Objective::Gpu(gpu)
                if matches!(storage.device().location(),
                    candle_core::DeviceLocation::Cuda { gpu_id } if gpu_id == gpu.ordinal()) =>
            {
                let (outcome, gradient) = if self.needs_host_values(gpu.kernel()) {
                    let host = storage.to_cpu_storage()?;
                    let values = &host.as_slice::<f32>()?[start..end];
                    self.evaluate_on_device(gpu, storage, layout, values)?
                } else {
                    let placeholder = vec![0f32; end - start];
                    self.evaluate_on_device(gpu, storage, layout, &placeholder)?
                };
                *self.device_gradient.lock().expect("gradient lock") = Some(gradient);
                outcome
            }
            _ => {
                let host = storage.to_cpu_storage()?;
                self.evaluate(&host.as_slice::<f32>()?[start..end])?
            }
        };
        let loss = outcome.loss.unwrap_or(0.0) as f32;
        *self.outcome.lock().expect("outcome lock") = Some(outcome);
        let result = storage.device().storage_from_slice(&[loss])?;
        Ok((result, Shape::from(())))
    }

    fn bwd(
        &self,
        arg: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        #[cfg(feature = "cuda")]
        if arg.device().is_cuda() {
            if let Some(gradient) = self.device_gradient.lock().expect("gradient lock").as_ref() {
                // ∂loss/∂argument never left the device: a copy of it becomes the tensor.
                let copy = {
                    use candle_core::cuda_backend::WrapErr;
                    gradient.values.try_clone().w()?
                };
                let gradient = arg.apply_op1_no_bwd(&StoredGradient {
                    values: Mutex::new(Some((copy, gradient.device.clone()))),
                })?;
                return Ok(Some(gradient.broadcast_mul(grad_res)?));
            }
        }
        let cached = self.outcome.lock().expect("outcome lock").clone();
        let outcome = match cached {
            Some(outcome) => outcome,
            None => self.evaluate(&arg.flatten_all()?.to_vec1::<f32>()?)?,
        };
        let width = self.columns.len();
        let elements = arg.elem_count() / width;
        let mut gradient = vec![0f32; elements * width];
        for (c, column) in self.columns.iter().enumerate() {
            let Some((index, true)) = column else {
                continue;
            };
            let name = &self.objective.graph().inputs[*index].name;
            let Some((_, g)) = outcome.gradients.iter().find(|(n, _)| n == name) else {
                candle_core::bail!("rlx-recipe: the recipe gives no gradient for `{name}`")
            };
            if g.len() != elements {
                candle_core::bail!(
                    "rlx-recipe: ∂loss/∂{name} has {} elements, the argument {elements}",
                    g.len()
                );
            }
            for (k, v) in g.iter().enumerate() {
                gradient[k * width + c] = *v as f32;
            }
        }
        let gradient = Tensor::from_vec(gradient, arg.shape(), arg.device())?;
        Ok(Some(gradient.broadcast_mul(grad_res)?))
    }
}

/// The tensor of a gradient already on the GPU (`RecipeOp::bwd`): applied to the argument, it returns
/// the stored `[elements, columns]` buffer as its storage.
#[cfg(feature = "cuda")]
struct StoredGradient {
    values: Mutex<
        Option<(
            candle_core::cuda_backend::cudarc::driver::CudaSlice<f32>,
            candle_core::CudaDevice,
        )>,
    >,
}

#[cfg(feature = "cuda")]
impl CustomOp1 for StoredGradient {
    fn name(&self) -> &'static str {
        "rlx-recipe-gradient"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("rlx-recipe-gradient: the gradient is on a GPU, the argument is not")
    }

    fn cuda_fwd(
        &self,
        _: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let Some((values, device)) = self.values.lock().expect("gradient lock").take() else {
            candle_core::bail!("rlx-recipe-gradient: applied twice")
        };
        if values.len() < layout.shape().elem_count() {
            candle_core::bail!(
                "rlx-recipe-gradient: {} values for an argument of shape {:?}",
                values.len(),
                layout.shape().dims()
            )
        }
        Ok((
            crate::device_kernels::storage(&device, values),
            layout.shape().clone(),
        ))
    }
}
