//! An NVIDIA GPU as a [`Device`], through cudarc (the driver API and NVRTC, both loaded at run time:
//! the crate builds without CUDA installed). The kernels are compiled with NVRTC at first use for the
//! GPU's compute capability and the PTX is cached on disk by the source's hash
//! (`$RLX_CUDA_CACHE`, by default `~/.cache/rlx/ptx`), so a recipe is compiled once per machine.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};

use super::{CudaSource, Device};

/// Threads per block of the token passes unless `$RLX_CUDA_BLOCK` says otherwise.
pub const DEFAULT_BLOCK: u32 = 256;

/// One GPU (a CUDA context on it and its default stream).
pub struct CudaDevice {
    context: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    functions: HashMap<String, CudaFunction>,
    block: u32,
    /// `compute_XY` of the GPU.
    arch: String,
}

/// Whether one of `names` can be loaded (cudarc panics when it cannot load a library; ask first).
fn loadable(names: &[&str]) -> bool {
    names.iter().any(|name| {
        // SAFETY: loading NVIDIA's driver or NVRTC library runs only their initialisers, which have
        // no preconditions; the handle is closed at once (cudarc loads its own).
        unsafe { libloading::Library::new(*name) }.is_ok()
    })
}

/// cudarc panics when it cannot load a CUDA library; turn what remains of that into an error.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown failure".into());
            Err(format!("{what}: {message}"))
        }
    }
}

impl CudaDevice {
    /// GPU `ordinal` (`--device cuda:N`). Needs the NVIDIA driver (libcuda.so.1) and, at first use of
    /// a recipe, NVRTC 13 (libnvrtc.so.13) on the library path (an `rlx` built in a checkout with
    /// scripts/install-cuda-toolchain.sh finds the toolkit's by its run path).
    pub fn new(ordinal: usize) -> Result<CudaDevice, String> {
        let block = match std::env::var("RLX_CUDA_BLOCK") {
            Ok(text) => text
                .parse::<u32>()
                .map_err(|_| format!("RLX_CUDA_BLOCK={text} is not a number of threads"))?,
            Err(_) => DEFAULT_BLOCK,
        };
        CudaDevice::with_block(ordinal, block)
    }

    /// GPU `ordinal`, with `block` threads per block for the token passes.
    pub fn with_block(ordinal: usize, block: u32) -> Result<CudaDevice, String> {
        if !loadable(&["libcuda.so.1", "libcuda.so"]) {
            return Err(
                "the NVIDIA driver library (libcuda.so.1) cannot be loaded: this machine has no \
                 usable NVIDIA GPU driver"
                    .into(),
            );
        }
        guarded("cannot use the CUDA driver", || {
            let count = CudaContext::device_count().map_err(|e| e.to_string())?;
            if ordinal >= count.max(0) as usize {
                return Err(format!("there is no GPU cuda:{ordinal} ({count} visible)"));
            }
            let context = CudaContext::new(ordinal).map_err(|e| e.to_string())?;
            let (major, minor) = context.compute_capability().map_err(|e| e.to_string())?;
            let stream = context.default_stream();
            Ok(CudaDevice {
                context,
                stream,
                functions: HashMap::new(),
                block,
                arch: format!("compute_{major}{minor}"),
            })
        })
    }

    /// The GPU of an existing stream (candle's, so that the recipe's kernels run in order with the
    /// model's work on the same stream: `rlx run --device cuda`), with `$RLX_CUDA_BLOCK` threads per
    /// block (256 by default). The caller has already opened the driver (it holds a stream of it).
    pub fn on_stream(stream: Arc<CudaStream>) -> Result<CudaDevice, String> {
        let block = match std::env::var("RLX_CUDA_BLOCK") {
            Ok(text) => text
                .parse::<u32>()
                .map_err(|_| format!("RLX_CUDA_BLOCK={text} is not a number of threads"))?,
            Err(_) => DEFAULT_BLOCK,
        };
        let context = stream.context().clone();
        let (major, minor) = context.compute_capability().map_err(|e| e.to_string())?;
        Ok(CudaDevice {
            context,
            stream,
            functions: HashMap::new(),
            block,
            arch: format!("compute_{major}{minor}"),
        })
    }

    /// The stream the kernels are launched on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The GPU's name.
    pub fn name(&self) -> String {
        self.context.name().unwrap_or_else(|_| "unknown GPU".into())
    }

    /// Device-to-device copy bandwidth in bytes/s (bytes read + bytes written): the best of five
    /// synchronised copies of 256 MiB, far beyond the L2 cache (`rlx bench`'s bandwidth bound).
    pub fn copy_bandwidth(&self) -> Result<f64, String> {
        let len = 256 << 20;
        let alloc = |what| {
            self.stream
                .alloc_zeros::<u8>(len)
                .map_err(|e| format!("cannot allocate {what} for the bandwidth probe: {e}"))
        };
        let source = alloc("256 MiB")?;
        let mut target = alloc("256 MiB")?;
        let mut best = f64::INFINITY;
        for _ in 0..5 {
            self.synchronize()?;
            let start = std::time::Instant::now();
            self.stream
                .memcpy_dtod(&source, &mut target)
                .map_err(|e| format!("copy on the GPU: {e}"))?;
            self.synchronize()?;
            best = best.min(start.elapsed().as_secs_f64());
        }
        Ok((2 * len) as f64 / best)
    }

    fn cache_path(&self, source: &CudaSource) -> Option<PathBuf> {
        let dir = std::env::var_os("RLX_CUDA_CACHE")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rlx/ptx"))
            })?;
        Some(dir.join(format!("{:016x}-{}.ptx", source.hash(), self.arch)))
    }

    fn ptx(&self, source: &CudaSource) -> Result<String, String> {
        let cache = self.cache_path(source);
        if let Some(text) = cache.as_ref().and_then(|p| std::fs::read_to_string(p).ok()) {
            return Ok(text);
        }
        let options = CompileOptions {
            options: vec![format!("--gpu-architecture={}", self.arch)],
            ..Default::default()
        };
        if !loadable(&["libnvrtc.so.13", "libnvrtc.so"]) {
            return Err(
                "NVRTC 13 (libnvrtc.so.13) cannot be loaded: install the CUDA 13 toolkit or run \
                 scripts/install-cuda-toolchain.sh and add ~/.cache/rlx/cuda13/nvidia/cu13/lib to \
                 LD_LIBRARY_PATH (docs/gpu.md)"
                    .into(),
            );
        }
        let ptx = guarded("cannot use NVRTC (libnvrtc.so.13)", || {
            compile_ptx_with_opts(&source.source, options)
                .map_err(|e| format!("NVRTC rejected the generated kernels: {e}"))
        })?;
        let text = ptx.to_src();
        if let Some(path) = cache {
            // A cache that cannot be written only costs a recompilation next time.
            if let Some(dir) = path.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            let _ = std::fs::write(&path, &text);
        }
        Ok(text)
    }
}

impl Device for CudaDevice {
    type Buffer = CudaSlice<u8>;

    fn load(&mut self, source: &CudaSource) -> Result<(), String> {
        let text = self.ptx(source)?;
        let module = self
            .context
            .load_module(Ptx::from_src(text))
            .map_err(|e| format!("cannot load the PTX: {e}"))?;
        for launch in source.launches.iter().flatten().flatten() {
            let function = module
                .load_function(&launch.name)
                .map_err(|e| format!("kernel {}: {e}", launch.name))?;
            self.functions.insert(launch.name.clone(), function);
        }
        Ok(())
    }

    fn upload(&self, bytes: &[u8]) -> Result<CudaSlice<u8>, String> {
        let mut padded = bytes.to_vec();
        padded.resize(bytes.len().max(8), 0);
        self.stream
            .clone_htod(&padded)
            .map_err(|e| format!("copy to the GPU: {e}"))
    }

    fn write(&self, buffer: &mut CudaSlice<u8>, bytes: &[u8]) -> Result<(), String> {
        if bytes.len() > buffer.len() {
            return Err("internal: a write past a device buffer".into());
        }
        let mut view = buffer.slice_mut(..bytes.len());
        self.stream
            .memcpy_htod(bytes, &mut view)
            .map_err(|e| format!("copy to the GPU: {e}"))
    }

    fn download(&self, buffer: &CudaSlice<u8>, out: &mut [u8]) -> Result<(), String> {
        if out.len() > buffer.len() {
            return Err("internal: a read past a device buffer".into());
        }
        let view = buffer.slice(..out.len());
        self.stream
            .memcpy_dtoh(&view, out)
            .map_err(|e| format!("copy from the GPU: {e}"))?;
        // `out` is ordinary (pageable) memory: make sure the copy has landed before it is read.
        self.synchronize()
    }

    fn address(&self, buffer: &CudaSlice<u8>) -> u64 {
        let (pointer, _sync) = buffer.device_ptr(&self.stream);
        pointer
    }

    unsafe fn launch(
        &self,
        name: &str,
        grid: u32,
        block: u32,
        table: &CudaSlice<u8>,
        g_begin: u64,
        g_end: u64,
    ) -> Result<(), String> {
        let function = self
            .functions
            .get(name)
            .ok_or_else(|| format!("internal: kernel {name} was not loaded"))?;
        let table = self.address(table);
        let config = LaunchConfig {
            grid_dim: (grid, 1, 1),
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut builder = self.stream.launch_builder(function);
        builder.arg(&table).arg(&g_begin).arg(&g_end);
        // SAFETY: the kernel's parameters are (void* const*, u64, u64), matching the three 8-byte
        // arguments; the table holds the addresses of live device buffers sized for the validated
        // layout: the caller's contract (`Device::launch`), which is the generated code's.
        unsafe { builder.launch(config) }
            .map(|_| ())
            .map_err(|e| format!("launch: {e}"))
    }

    fn synchronize(&self) -> Result<(), String> {
        self.stream
            .synchronize()
            .map_err(|e| format!("the GPU reported an error: {e}"))
    }

    fn block_size(&self) -> u32 {
        self.block
    }
}
