//! The compiled recipe as a candle custom op: `logp.apply_op1(RecipeOp)` is the recipe's loss, and its
//! backward pass hands the recipe's ∂loss/∂logp and ∂loss/∂entropy (from the interpreter, the JIT
//! kernel or the CUDA kernels on a GPU) to candle, so `loss.backward()` flows into the policy's
//! parameters.

use std::sync::{Arc, Mutex};

use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor};
use rlx_compiler::ir::Graph;
use rlx_runtime::batch::Batch;
use rlx_runtime::cuda::GpuKernel;
use rlx_runtime::interp::{evaluate, Context, EvalError, Outcome};
use rlx_runtime::kernel::{Kernel, Options};

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
    pub fn kernel(graph: &Graph) -> Result<Objective, String> {
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

    /// Evaluate the recipe on `batch`; a kernel's non-finite output is explained by the interpreter
    /// (`EvalError::explained`: the expression that made it, for which element).
    pub fn run(&self, batch: &Batch, context: &Context) -> Result<Outcome, EvalError> {
        let explain = |e: EvalError| e.explained(self.graph(), batch, context);
        match self {
            Objective::Interpreter(graph) => evaluate(graph, batch, context),
            Objective::Kernel(kernel) => kernel.run(batch, context).map_err(explain),
            Objective::Gpu(kernel) => kernel.run(batch, context).map_err(explain),
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

    /// The recipe's CUDA kernels on the argument where candle holds it (`storage`, on the kernels' GPU
    /// and stream): the host copy of the values is what the runner validates (and what a `keep` filter
    /// slices), while each f32-stored column the recipe reads is handed to the kernels by its device
    /// address (column 0 of a one-column argument in place, the others as a contiguous copy made on
    /// the stream), so the log-probabilities are not uploaded again.
    #[cfg(feature = "cuda")]
    fn evaluate_on_device(
        &self,
        gpu: &GpuKernel,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
        values: &[f32],
    ) -> candle_core::Result<Outcome> {
        use candle_core::backend::{BackendDevice, BackendStorage};
        use candle_core::cuda_backend::cudarc::driver::DevicePtr;
        use rlx_runtime::kernel::Column;

        let recipe = |e: String| candle_core::Error::Msg(format!("recipe: {e}"));
        let packed = gpu
            .kernel()
            .pack(&self.filled(values))
            .map_err(|e| recipe(e.to_string()))?;
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
        // SAFETY: each address is, on this kernel's GPU, `elements` f32 values equal to the host
        // column at the same index (both are the argument's column, the host one downloaded from it and
        // packed in f32, exactly); they live in `storage` or `copies`, which outlive the call, and the
        // runner's kernels run on the stream that wrote them, which nothing else writes them on before
        // the call returns (it synchronises before reading its results).
        let outcome =
            unsafe { gpu.run_view_on_device(&packed.layout, &columns, &addresses, &self.context) }
                .map_err(|e| recipe(e.to_string()))?;
        drop(copies);
        Ok(outcome.into_outcome())
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
    /// the same GPU; [`Objective::gpu_for`]), any other objective evaluates a host copy; the scalar
    /// loss is returned on the device.
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
        let host = storage.to_cpu_storage()?;
        let values = &host.as_slice::<f32>()?[start..end];
        let outcome = match &*self.objective {
            Objective::Gpu(gpu)
                if matches!(storage.device().location(),
                    candle_core::DeviceLocation::Cuda { gpu_id } if gpu_id == gpu.ordinal()) =>
            {
                self.evaluate_on_device(gpu, storage, layout, values)?
            }
            _ => self.evaluate(values)?,
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
