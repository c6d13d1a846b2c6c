//! The trainer's own CUDA kernels (`device_kernels.cu`): the recipe op's gradient columns (`op.rs`), the
//! fused layers (`fused.rs`: RMS norm, SwiGLU, rope / to_heads / from_heads and their backward) and the
//! fused LM head's per-chunk passes (`head.rs`), launched on candle's stream of a CUDA device.
//!
//! The source is compiled with NVRTC at first use (once per process and GPU architecture) and loaded as
//! a candle custom module; every kernel takes the recipe kernels' `(table, g_begin, g_end)` arguments,
//! the table (device addresses and sizes as 64-bit words) copied to the device per launch. With
//! `compiler/src/backend/cuda_host.h` in front ([`host_c`]) the same text is host C: the tests
//! (`trainer/tests/device_kernels.rs`) run every kernel on the CPU against the CPU kernels, and compile
//! it with NVRTC and ptxas where those tools are installed.
//!
//! Which layers a CUDA device runs: these kernels (`fused`, the default) or the plain candle compositions
//! (`RLX_GPU_LAYERS=plain`; [`fused_layers`]) — `scripts/gpu-check.sh` compares the two.

use std::cell::Cell;

use candle_core::{bail, Device, Result};

/// The kernels' CUDA C.
pub const SOURCE: &str = include_str!("device_kernels.cu");

/// Every kernel of [`SOURCE`].
pub const KERNELS: &[&str] = &[
    "rlx_gradient_column_f32",
    "rlx_gradient_column_f64",
    "rlx_rms_norm",
    "rlx_rms_norm_bwd_rows",
    "rlx_rms_norm_bwd_weight",
    "rlx_swiglu",
    "rlx_swiglu_bwd",
    "rlx_heads",
    "rlx_head_forward_chunk",
    "rlx_head_finish",
    "rlx_head_backward_chunk",
];

/// The largest block the row kernels take (their shared reduction arrays, `RLX_ROW_BLOCK`).
pub const MAX_ROW_BLOCK: u32 = 1024;

/// [`SOURCE`] as host C: the portability header in front (each kernel gets a host launcher
/// `rlx_host_NAME(table, g_begin, g_end, grid, block)`).
pub fn host_c() -> String {
    format!("{}\n{SOURCE}", rlx_compiler::backend::cuda::HOST_HEADER)
}

/// How the fused layers run on a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layers {
    /// The custom ops: the CPU kernels on the CPU, this module's kernels on a CUDA device.
    Fused,
    /// The plain candle compositions (`fused::plain_*`) on every device.
    Plain,
}

thread_local! {
    /// 0: unset, 1: fused, 2: plain.
    static OVERRIDE: Cell<u8> = const { Cell::new(0) };
}

/// Set (or with `None` clear) this thread's choice, which wins over `RLX_GPU_LAYERS` and applies to
/// every device, the CPU included (for comparing the two in one process: candle decides on the
/// thread that builds the graph).
pub fn set_layers(layers: Option<Layers>) {
    let code = match layers {
        None => 0,
        Some(Layers::Fused) => 1,
        Some(Layers::Plain) => 2,
    };
    OVERRIDE.with(|o| o.set(code));
}

/// Whether the fused layers' custom ops run on `device`: this thread's [`set_layers`] if any; else
/// always on the CPU, and on a CUDA device unless `RLX_GPU_LAYERS=plain` (`fused`, the default, or
/// unset: yes; any other value is an error); never on another device.
pub fn fused_layers(device: &Device) -> Result<bool> {
    match OVERRIDE.with(Cell::get) {
        1 => return Ok(device.is_cpu() || (cfg!(feature = "cuda") && device.is_cuda())),
        2 => return Ok(false),
        _ => {}
    }
    if device.is_cpu() {
        return Ok(true);
    }
    if !device.is_cuda() || !cfg!(feature = "cuda") {
        return Ok(false);
    }
    match std::env::var("RLX_GPU_LAYERS") {
        Err(_) => Ok(true),
        Ok(value) => match value.as_str() {
            "" | "fused" => Ok(true),
            "plain" => Ok(false),
            other => bail!("RLX_GPU_LAYERS={other}: expected `fused` or `plain`"),
        },
    }
}

/// Threads per block of the row kernels.
pub const ROW_BLOCK: u32 = 256;
/// Threads per block of the elementwise kernels.
pub const ELEMENT_BLOCK: u32 = 256;

/// Blocks for `n` elements of an elementwise kernel (grid-stride loops cover the rest).
pub fn element_grid(n: usize) -> u32 {
    n.div_ceil(ELEMENT_BLOCK as usize).clamp(1, 1 << 16) as u32
}

/// Blocks for `rows` rows of a row kernel.
pub fn row_grid(rows: usize) -> u32 {
    rows.clamp(1, 1 << 16) as u32
}

/// An f32 parameter as a table word.
pub fn f32_word(value: f32) -> u64 {
    u64::from(value.to_bits())
}

/// Fused against plain layers on one device: the largest relative differences of one forward and
/// backward pass of a tiny model ([`compare_layers`]).
#[derive(Clone, Debug, PartialEq)]
pub struct LayersReport {
    /// Over the LM head's log-probabilities and entropies: max |fused − plain| / max |plain|.
    pub values: f64,
    /// The worst parameter's max |fused − plain| / max |plain| of its gradient.
    pub gradients: f64,
    /// Which parameter that is.
    pub worst_parameter: String,
    pub parameters: usize,
}

/// The agreement [`LayersReport::agree`] asks for: f32 with a different order of operations.
pub const LAYERS_TOLERANCE: f64 = 1e-3;

impl LayersReport {
    pub fn agree(&self) -> bool {
        self.values <= LAYERS_TOLERANCE && self.gradients <= LAYERS_TOLERANCE
    }

    pub fn to_json(&self, device: &str) -> serde_json::Value {
        serde_json::json!({
            "device": device,
            "values_relative_difference": self.values,
            "gradients_relative_difference": self.gradients,
            "worst_parameter": self.worst_parameter,
            "parameters": self.parameters,
            "tolerance": LAYERS_TOLERANCE,
            "agree": self.agree(),
        })
    }
}

/// max |a − b| / max |b| (0 for two empty or all-zero vectors; infinite for a length mismatch or a
/// non-finite value).
pub fn relative_difference(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() || a.iter().chain(b).any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let scale = b.iter().fold(0f64, |m, v| m.max(f64::from(v.abs())));
    let worst = a
        .iter()
        .zip(b)
        .fold(0f64, |m, (x, y)| m.max(f64::from((x - y).abs())));
    if worst == 0.0 {
        0.0
    } else {
        worst / scale.max(f64::MIN_POSITIVE)
    }
}

/// One forward and backward pass of a tiny model (2 layers, q/k norms, GQA, vocabulary 97) on
/// `device`, through the LM head in small chunks (log π and entropy of 2 × 15 positions, loss
/// Σ log π + 0.1·Σ H), with the fused layers and then with the plain candle ones
/// ([`set_layers`]; the choice is restored after). `scripts/gpu-check.sh` runs it on the GPU
/// (`trainer/examples/layers_check.rs`), the tests on the CPU.
pub fn compare_layers(device: &Device) -> Result<LayersReport> {
    use candle_core::Tensor;

    let config = crate::model::ModelConfig {
        vocab: 97,
        hidden: 32,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        intermediate: 48,
        rope_theta: 10_000.0,
        rms_eps: 1e-5,
        max_positions: 64,
        init_std: 0.2,
        head_dim: None,
        attention_bias: false,
        qk_norm: true,
        rope_scaling: None,
    };
    let model = crate::model::Model::new(&config, 7, device)?;
    let (b, t) = (2usize, 16usize);
    let ids: Vec<u32> = (0..b * t)
        .map(|i| ((i * 37 + 11) % config.vocab) as u32)
        .collect();
    let ids = Tensor::from_vec(ids, (b, t), device)?;
    let pass = |layers: Layers| -> Result<(Vec<f32>, Vec<Vec<f32>>)> {
        set_layers(Some(layers));
        let hidden = model.hidden(&ids, 0, &vec![0; b], None)?;
        let rows = hidden
            .narrow(1, 0, t - 1)?
            .reshape((b * (t - 1), config.hidden))?;
        let targets = ids.narrow(1, 1, t - 1)?.flatten_all()?.contiguous()?;
        // A budget of 600 logits: chunks of the rows and of the vocabulary both ways.
        let out = crate::head::fused_logp_entropy(&rows, model.lm_head(), &targets, 600)?;
        let loss = (out.narrow(1, 0, 1)?.sum_all()? + (out.narrow(1, 1, 1)?.sum_all()? * 0.1)?)?;
        let grads = loss.backward()?;
        let mut gradients = Vec::new();
        for (name, var) in model.vars() {
            let Some(g) = grads.get(var.as_tensor()) else {
                bail!("no gradient for {name}")
            };
            gradients.push(g.flatten_all()?.to_vec1::<f32>()?);
        }
        Ok((out.flatten_all()?.to_vec1::<f32>()?, gradients))
    };
    let fused = pass(Layers::Fused);
    let plain = pass(Layers::Plain);
    set_layers(None);
    let ((fused_values, fused_grads), (plain_values, plain_grads)) = (fused?, plain?);
    let mut report = LayersReport {
        values: relative_difference(&fused_values, &plain_values),
        gradients: 0.0,
        worst_parameter: String::new(),
        parameters: model.vars().len(),
    };
    for ((name, _), (f, p)) in model
        .vars()
        .iter()
        .zip(fused_grads.iter().zip(&plain_grads))
    {
        let d = relative_difference(f, p);
        if d >= report.gradients {
            report.gradients = d;
            report.worst_parameter = name.clone();
        }
    }
    Ok(report)
}

#[cfg(feature = "cuda")]
pub use gpu::*;

#[cfg(feature = "cuda")]
mod gpu {
    use std::sync::{Arc, Mutex};

    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{
        CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg,
    };
    use candle_core::cuda_backend::cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{bail, CudaDevice, CudaStorage, DType, Layout, Result, Storage, Tensor};

    use super::SOURCE;

    /// The module name under which candle keeps the loaded kernels.
    const MODULE: &str = "rlx_trainer_kernels";

    /// The PTX of [`SOURCE`] by architecture (`compute_XY`), compiled once per process.
    fn ptx(device: &CudaDevice) -> Result<Arc<String>> {
        static CACHE: Mutex<Vec<(String, Arc<String>)>> = Mutex::new(Vec::new());
        let context = device.cuda_stream().context().clone();
        let (major, minor) = context.compute_capability().w()?;
        let arch = format!("compute_{major}{minor}");
        let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, ptx)) = cache.iter().find(|(a, _)| *a == arch) {
            return Ok(ptx.clone());
        }
        let options = CompileOptions {
            options: vec![format!("--gpu-architecture={arch}")],
            ..Default::default()
        };
        let ptx = compile_ptx_with_opts(SOURCE, options).map_err(|e| {
            candle_core::Error::Msg(format!("NVRTC rejected the trainer's kernels: {e}"))
        })?;
        let ptx = Arc::new(ptx.to_src());
        cache.push((arch, ptx.clone()));
        Ok(ptx)
    }

    /// Launch kernel `name` on `grid` blocks of `block` threads with `table` (copied to the device) on
    /// candle's stream of `device`.
    ///
    /// # Safety
    ///
    /// `table` is laid out as kernel `name` documents in `device_kernels.cu`: every address is live
    /// memory of `device` of at least the size the table's sizes imply, written only through the
    /// kernel's outputs until the launch has run (candle's stream orders it after their writers).
    pub unsafe fn launch(
        device: &CudaDevice,
        name: &str,
        grid: u32,
        block: u32,
        table: &[u64],
    ) -> Result<()> {
        let ptx = ptx(device)?;
        let function = device.get_or_load_custom_func(name, MODULE, &ptx)?;
        let table: CudaSlice<u64> = device.clone_htod(table)?;
        let stream = device.cuda_stream();
        let (address, _sync) = table.device_ptr(&stream);
        let zero = 0u64;
        let mut builder = function.builder();
        builder.arg(&address).arg(&zero).arg(&zero);
        let config = LaunchConfig {
            grid_dim: (grid, 1, 1),
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the kernels take (void* const*, u64, u64); the table's contents are the caller's
        // contract.
        unsafe { builder.launch(config) }.w()?;
        Ok(())
    }

    /// The device address of a contiguous CUDA tensor's first element, and the storage guard that
    /// keeps it alive while the launch is queued. `what` names it in errors.
    pub fn address_of<'a>(
        t: &'a Tensor,
        dtype: DType,
        what: &str,
    ) -> Result<(u64, impl std::ops::Deref<Target = Storage> + 'a)> {
        if t.dtype() != dtype {
            bail!("{what} must be {dtype:?}, got {:?}", t.dtype())
        }
        let (storage, layout) = t.storage_and_layout();
        let address = match &*storage {
            Storage::Cuda(s) => storage_address(s, layout, what)?,
            _ => bail!("{what} is not on a CUDA device"),
        };
        Ok((address, storage))
    }

    /// The device address of a contiguous CUDA storage's first element under `layout`.
    pub fn storage_address(s: &CudaStorage, layout: &Layout, what: &str) -> Result<u64> {
        let Some((start, _)) = layout.contiguous_offsets() else {
            bail!("{what} must be contiguous")
        };
        let stream = s.device().cuda_stream();
        let (base, size) = match s.dtype() {
            DType::F32 => (s.as_cuda_slice::<f32>()?.device_ptr(&stream).0, 4),
            DType::U32 => (s.as_cuda_slice::<u32>()?.device_ptr(&stream).0, 4),
            DType::F64 => (s.as_cuda_slice::<f64>()?.device_ptr(&stream).0, 8),
            other => bail!("{what}: unsupported dtype {other:?}"),
        };
        Ok(base + (size * start) as u64)
    }

    /// A zeroed f32 buffer of `len` elements on `device` and its address.
    pub fn zeros(device: &CudaDevice, len: usize) -> Result<(CudaSlice<f32>, u64)> {
        let mut slice = device.alloc_zeros::<f32>(len.max(1))?;
        let stream = device.cuda_stream();
        let address = slice.device_ptr_mut(&stream).0;
        Ok((slice, address))
    }

    /// A buffer of [`zeros`] as candle storage.
    pub fn storage(device: &CudaDevice, slice: CudaSlice<f32>) -> CudaStorage {
        CudaStorage::wrap_cuda_slice(slice, device.clone())
    }
}
