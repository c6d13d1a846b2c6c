//! `rlx bench`: a recipe on a synthetic packed batch of a given shape, per backend: kernel time
//! (median of several runs), tokens/s, peak memory above the batch, and a memory-bandwidth bound (the
//! time to read every input and write every gradient once at the measured `memcpy` bandwidth). The
//! figures are those of the criterion benches (`cargo bench -p rlx-runtime --bench jit`).
//!
//! With `Settings::gpu` (`--device cuda:N`) the CUDA runner (`crate::cuda`, the kernels of
//! `rlx score --device cuda`) is measured instead: the synchronised kernels apart from the
//! host↔device copies (`time_device`), and the bound at the GPU's device-to-device copy bandwidth.
//!
//! Peak memory is counted by [`CountingAllocator`], which a binary installs as its global allocator
//! (`rlx` does); without it the peak is reported as `null`.

use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rayon::prelude::*;
use serde_json::{json, Value};

use rlx_compiler::ir::Graph;

use crate::batch::Batch;
use crate::cuda::{Device, DeviceKernel, GpuKernel};
use crate::interp::{evaluate, Context};
use crate::kernel::{Column, Kernel, Options, PackedBatch};
use crate::synthetic::{self, Spec};

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// The system allocator, counting the bytes live and their peak (`#[global_allocator]`).
pub struct CountingAllocator;

fn grow(bytes: usize) {
    if !INSTALLED.load(Ordering::Relaxed) {
        INSTALLED.store(true, Ordering::Relaxed);
    }
    let now = CURRENT.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

fn shrink(bytes: usize) {
    CURRENT.fetch_sub(bytes, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to `System` with the same arguments; the counters only observe.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: AllocLayout) -> *mut u8 {
        let pointer = unsafe { System.alloc(layout) };
        if !pointer.is_null() {
            grow(layout.size());
        }
        pointer
    }

    unsafe fn alloc_zeroed(&self, layout: AllocLayout) -> *mut u8 {
        let pointer = unsafe { System.alloc_zeroed(layout) };
        if !pointer.is_null() {
            grow(layout.size());
        }
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: AllocLayout) {
        unsafe { System.dealloc(pointer, layout) };
        shrink(layout.size());
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: AllocLayout, new_size: usize) -> *mut u8 {
        let moved = unsafe { System.realloc(pointer, layout, new_size) };
        if !moved.is_null() {
            grow(new_size);
            shrink(layout.size());
        }
        moved
    }
}

/// Bytes live now, when the counting allocator is installed.
pub fn allocated_bytes() -> Option<usize> {
    INSTALLED
        .load(Ordering::Relaxed)
        .then(|| CURRENT.load(Ordering::Relaxed))
}

/// Run `work` and return its result and the peak of live bytes above those live before it (`None`
/// without the counting allocator). Other threads' allocations in the meantime count too.
pub fn peak_during<T>(work: impl FnOnce() -> T) -> (T, Option<usize>) {
    let before = CURRENT.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let result = work();
    let peak = PEAK.load(Ordering::Relaxed);
    let installed = INSTALLED.load(Ordering::Relaxed);
    (result, installed.then(|| peak.saturating_sub(before)))
}

/// Which engines to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    Interp,
    Jit,
    All,
}

/// What to run.
#[derive(Clone, Debug)]
pub struct Settings {
    pub groups: usize,
    /// Responses per group.
    pub n: usize,
    /// Tokens per response.
    pub tokens: usize,
    /// Threads for the JIT (and the bandwidth bound); 0 = rayon's default (all cores).
    pub threads: usize,
    /// Timed runs per backend (after one warm-up run); the median is reported.
    pub runs: usize,
    pub backend: Which,
    pub options: Options,
    pub seed: u64,
    /// `Some(N)`: measure the CUDA kernels on GPU N (`--device cuda:N`) instead of the CPU backends
    /// (`backend` must then be `Jit` or `All`; the interpreter runs only on the CPU).
    pub gpu: Option<usize>,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            groups: 64,
            n: 8,
            tokens: 1024,
            threads: 0,
            runs: 5,
            backend: Which::All,
            options: Options::default(),
            seed: 1,
            gpu: None,
        }
    }
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

fn column_bytes(column: &Column) -> usize {
    match column {
        Column::F32(v) => v.len() * 4,
        Column::F64(v) => v.len() * 8,
    }
}

fn batch_bytes(batch: &Batch) -> usize {
    let layout = &batch.layout;
    let offsets =
        layout.group_offsets.len() + layout.token_offsets.len() + layout.crit_offsets.len();
    batch.inputs.iter().map(|v| v.len() * 8).sum::<usize>() + offsets * 8
}

fn packed_bytes(batch: &PackedBatch) -> usize {
    let layout = &batch.layout;
    let offsets =
        layout.group_offsets.len() + layout.token_offsets.len() + layout.crit_offsets.len();
    batch.inputs.iter().map(column_bytes).sum::<usize>() + offsets * 8
}

/// `memcpy` bandwidth in bytes/s (bytes read + bytes written), on `pool`'s threads, over buffers far
/// larger than the caches: the best of five copies.
pub fn memcpy_bandwidth(pool: &rayon::ThreadPool) -> f64 {
    let len = 16 << 20; // 64 MiB of f32
    let source = vec![1.0f32; len];
    let mut target = vec![0.0f32; len];
    let threads = pool.current_num_threads().max(1);
    let chunk = len.div_ceil(threads);
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let start = Instant::now();
        pool.install(|| {
            target
                .par_chunks_mut(chunk)
                .zip(source.par_chunks(chunk))
                .for_each(|(t, s)| t.copy_from_slice(s));
        });
        best = best.min(start.elapsed().as_secs_f64());
        std::hint::black_box(&target);
    }
    (2 * len * 4) as f64 / best
}

/// The criterion benches' bandwidth bound: read every input column of `batch` once and write one
/// gradient-sized buffer once (on rayon's threads with `parallel`). The columns are folded into a
/// wrapping integer sum of their bit patterns, which the compiler vectorises, so the loop streams
/// memory instead of waiting on a chain of dependent float additions (a serial `f64` sum is
/// latency-bound: ~4 cycles per element, about twice the time of the memory traffic on the
/// development machine). Returns the fold, so the work cannot be optimised away.
pub fn read_inputs_write_gradient(
    batch: &PackedBatch,
    gradient: &mut [f32],
    parallel: bool,
) -> u64 {
    fn fold32(values: &[f32]) -> u64 {
        let lanes = values.chunks_exact(8).fold([0u32; 8], |mut acc, c| {
            for (a, x) in acc.iter_mut().zip(c) {
                *a = a.wrapping_add(x.to_bits());
            }
            acc
        });
        let tail = values.chunks_exact(8).remainder();
        lanes
            .into_iter()
            .chain(tail.iter().map(|x| x.to_bits()))
            .fold(0u64, |s, x| s.wrapping_add(u64::from(x)))
    }
    fn fold64(values: &[f64]) -> u64 {
        values.iter().fold(0u64, |s, x| s.wrapping_add(x.to_bits()))
    }
    let chunk = 1 << 14;
    let mut total = 0u64;
    for column in &batch.inputs {
        total = total.wrapping_add(match column {
            Column::F32(values) if parallel => values
                .par_chunks(chunk)
                .map(fold32)
                .reduce(|| 0, u64::wrapping_add),
            Column::F32(values) => fold32(values),
            Column::F64(values) => fold64(values),
        });
    }
    let value = f32::from_bits(total as u32 & 0x3f7f_ffff); // a finite f32 that depends on the fold
    if parallel {
        gradient.par_chunks_mut(chunk).for_each(|c| c.fill(value));
    } else {
        gradient.fill(value);
    }
    total
}

fn pool(threads: usize) -> Result<rayon::ThreadPool, String> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| format!("cannot start {threads} threads: {e}"))
}

/// The CUDA runner's times on one packed batch: medians of `runs` timed runs after a warm-up run.
#[derive(Clone, Debug)]
pub struct DeviceTimes {
    /// The kernels alone: the launches of every phase between two device synchronisations, no
    /// copies (`DeviceKernel::kernel_time`; a `distinct_ngrams` pass's host round trip included).
    pub kernel: Duration,
    /// Validating the batch and copying its inputs host → device (`DeviceKernel::upload`).
    pub upload: Duration,
    /// A run on the resident batch (`DeviceKernel::run_resident`): the kernels, the per-phase
    /// tables and buffers copied host → device, every phase buffer (the gradient included) copied
    /// device → host, and the outputs gathered on the host.
    pub resident: Duration,
    /// A run from host memory (`DeviceKernel::run_packed`): everything in `resident` plus the
    /// inputs' upload.
    pub end_to_end: Duration,
    /// Peak host bytes above those live before, during the end-to-end runs (`None` without the
    /// counting allocator).
    pub host_peak: Option<usize>,
}

/// Time `kernel` on `batch` (already packed for it): each of `runs` rounds runs it end to end from
/// host memory, then uploads the batch and runs it resident. Any run's error is returned.
pub fn time_device<D: Device>(
    kernel: &DeviceKernel<D>,
    batch: &PackedBatch,
    context: &Context,
    runs: usize,
) -> Result<DeviceTimes, String> {
    let runs = runs.max(1);
    std::hint::black_box(
        kernel
            .run_packed(batch, context)
            .map_err(|e| e.to_string())?,
    );
    let (mut kernels, mut uploads, mut residents, mut whole) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut host_peak = None;
    for _ in 0..runs {
        let start = Instant::now();
        let (outcome, bytes) = peak_during(|| kernel.run_packed(batch, context));
        whole.push(start.elapsed());
        std::hint::black_box(outcome.map_err(|e| e.to_string())?);
        kernels.push(kernel.kernel_time());
        host_peak = host_peak.max(bytes);

        let copy = batch.clone();
        let start = Instant::now();
        let resident = kernel.upload(copy).map_err(|e| e.to_string())?;
        uploads.push(start.elapsed());
        let start = Instant::now();
        let outcome = kernel.run_resident(&resident, context);
        residents.push(start.elapsed());
        std::hint::black_box(outcome.map_err(|e| e.to_string())?);
        kernels.push(kernel.kernel_time());
    }
    Ok(DeviceTimes {
        kernel: median(kernels),
        upload: median(uploads),
        resident: median(residents),
        end_to_end: median(whole),
        host_peak,
    })
}

/// The times of `gpu` on `batch` and the GPU's device-to-device copy bandwidth (bytes/s).
#[cfg(feature = "cuda")]
fn measure_gpu(
    gpu: &GpuKernel,
    batch: &PackedBatch,
    context: &Context,
    runs: usize,
) -> Result<(DeviceTimes, f64), String> {
    let times = time_device(gpu.device_kernel(), batch, context, runs)?;
    let bandwidth = gpu.device_kernel().device().copy_bandwidth()?;
    Ok((times, bandwidth))
}

#[cfg(not(feature = "cuda"))]
fn measure_gpu(
    gpu: &GpuKernel,
    _batch: &PackedBatch,
    _context: &Context,
    _runs: usize,
) -> Result<(DeviceTimes, f64), String> {
    Err(crate::cuda::without_feature(gpu.ordinal()))
}

/// Measure `graph` per the settings: one JSON object per backend (`rlx bench` prints each on a line).
pub fn run(graph: &Graph, recipe: &str, settings: &Settings) -> Result<Vec<Value>, String> {
    if settings.groups == 0 || settings.n == 0 || settings.tokens == 0 || settings.runs == 0 {
        return Err("--groups, --n, --tokens and --runs must be at least 1".into());
    }
    // The GPU first: no feature, driver or device is an error before any work.
    let gpu = match settings.gpu {
        None => None,
        Some(ordinal) => {
            if settings.backend == Which::Interp {
                return Err(format!(
                    "--backend interp runs on the CPU; drop --device cuda:{ordinal} or use --backend jit"
                ));
            }
            let start = Instant::now();
            let gpu = GpuKernel::new(graph, &settings.options, ordinal)?;
            Some((gpu, start.elapsed()))
        }
    };
    let tokens_total = settings
        .groups
        .checked_mul(settings.n)
        .and_then(|r| r.checked_mul(settings.tokens))
        .ok_or("the batch is too large")?;
    let spec = Spec {
        groups: settings.groups,
        responses: settings.n,
        tokens: settings.tokens,
        ragged: false,
        singleton: false,
        criteria: 4,
        dim: 8,
        seed: settings.seed,
    };
    let batch = synthetic::batch(graph, &spec);
    let context = Context::default();
    let threads = if settings.threads == 0 {
        rayon::current_num_threads()
    } else {
        settings.threads
    };
    let pool = pool(threads)?;
    let shape = json!({
        "recipe": recipe,
        "groups": settings.groups,
        "n": settings.n,
        "tokens_per_response": settings.tokens,
        "tokens": tokens_total,
        "runs": settings.runs,
    });
    let line = |fields: Value| {
        let mut object = shape.as_object().cloned().unwrap_or_default();
        object.extend(fields.as_object().cloned().unwrap_or_default());
        Value::Object(object)
    };
    // The bound: every input read once and every gradient written once, in the storage the backend
    // uses, at the memcpy bandwidth.
    let gradient_elems: usize = graph
        .outputs
        .gradients
        .iter()
        .filter_map(|(input, _)| batch.inputs.get(*input as usize).map(Vec::len))
        .sum();
    let bound = |input_bytes: usize, gradient_bytes: usize, bandwidth: f64| {
        let bytes = (input_bytes + gradient_bytes) as f64;
        let seconds = bytes / bandwidth;
        json!({
            "bound_bytes": bytes,
            "bound_ms": seconds * 1e3,
            "bound_tokens_per_s": tokens_total as f64 / seconds,
            "memcpy_gb_s": bandwidth / 1e9,
        })
    };
    if let Some((gpu, compile)) = gpu {
        let packed = gpu.kernel().pack(&batch).map_err(|e| e.to_string())?;
        let (times, bandwidth) = measure_gpu(&gpu, &packed, &context, settings.runs)?;
        let storage = settings.options.storage.bytes();
        let ordinal = gpu.ordinal();
        let mut fields = json!({
            "backend": "cuda",
            "device": format!("cuda:{ordinal}"),
            "device_index": ordinal,
            "gpu": gpu.name(),
            "block": gpu.block_size(),
            "accumulate": settings.options.accumulate.name(),
            "storage": settings.options.storage.name(),
            "compile_ms": ms(compile),
            "kernel_ms": ms(times.kernel),
            "tokens_per_s": tokens_total as f64 / times.kernel.as_secs_f64(),
            "upload_ms": ms(times.upload),
            "resident_ms": ms(times.resident),
            "end_to_end_ms": ms(times.end_to_end),
            "end_to_end_tokens_per_s": tokens_total as f64 / times.end_to_end.as_secs_f64(),
            "batch_bytes": packed_bytes(&packed),
            "device_bytes": packed_bytes(&packed) + gpu.kernel().scratch_bytes(&packed.layout),
            "peak_bytes_above_batch": times.host_peak,
            "outputs_bytes": gradient_elems * storage,
        });
        let bound = bound(packed_bytes(&packed), gradient_elems * storage, bandwidth);
        fields
            .as_object_mut()
            .unwrap()
            .extend(bound.as_object().cloned().unwrap_or_default());
        return Ok(vec![line(fields)]);
    }
    let bandwidth = memcpy_bandwidth(&pool);
    let mut lines = Vec::new();
    if matches!(settings.backend, Which::Interp | Which::All) {
        evaluate(graph, &batch, &context).map_err(|e| format!("interpreter: {e}"))?;
        let mut times = Vec::with_capacity(settings.runs);
        let mut peak = None;
        for _ in 0..settings.runs {
            let start = Instant::now();
            let (outcome, bytes) = peak_during(|| evaluate(graph, &batch, &context));
            times.push(start.elapsed());
            std::hint::black_box(outcome.map_err(|e| e.to_string())?);
            peak = peak.max(bytes);
        }
        let time = median(times);
        let mut fields = json!({
            "backend": "interp",
            "device": "cpu",
            "threads": 1,
            "kernel_ms": ms(time),
            "tokens_per_s": tokens_total as f64 / time.as_secs_f64(),
            "batch_bytes": batch_bytes(&batch),
            "peak_bytes_above_batch": peak,
        });
        let bound = bound(batch_bytes(&batch), gradient_elems * 8, bandwidth);
        fields
            .as_object_mut()
            .unwrap()
            .extend(bound.as_object().cloned().unwrap_or_default());
        lines.push(line(fields));
    }
    if matches!(settings.backend, Which::Jit | Which::All) {
        let start = Instant::now();
        let kernel = Kernel::compile(graph, &settings.options)
            .map_err(|e| format!("the JIT cannot compile this recipe: {e}"))?;
        let compile = start.elapsed();
        let packed = kernel.pack(&batch).map_err(|e| e.to_string())?;
        pool.install(|| kernel.run_packed(&packed, &context))
            .map_err(|e| e.to_string())?;
        let mut times = Vec::with_capacity(settings.runs);
        let mut peak = None;
        for _ in 0..settings.runs {
            let start = Instant::now();
            let (outcome, bytes) =
                peak_during(|| pool.install(|| kernel.run_packed(&packed, &context)));
            times.push(start.elapsed());
            std::hint::black_box(outcome.map_err(|e| e.to_string())?);
            peak = peak.max(bytes);
        }
        let time = median(times);
        let storage = settings.options.storage.bytes();
        let mut fields = json!({
            "backend": "jit",
            "device": "cpu",
            "threads": threads,
            "accumulate": settings.options.accumulate.name(),
            "storage": settings.options.storage.name(),
            "compile_ms": ms(compile),
            "kernel_ms": ms(time),
            "tokens_per_s": tokens_total as f64 / time.as_secs_f64(),
            "batch_bytes": packed_bytes(&packed),
            "peak_bytes_above_batch": peak,
            "outputs_bytes": gradient_elems * storage,
        });
        let bound = bound(packed_bytes(&packed), gradient_elems * storage, bandwidth);
        fields
            .as_object_mut()
            .unwrap()
            .extend(bound.as_object().cloned().unwrap_or_default());
        lines.push(line(fields));
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlx_compiler::backend::cuda::CudaSource;

    /// Host memory whose launches do nothing: exercises the runner's copies and `time_device`'s
    /// rounds, not the kernels (tests/cuda.rs checks those on the host-C build).
    #[derive(Default)]
    struct Idle {
        launches: AtomicUsize,
    }

    impl Device for Idle {
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
            _table: &Vec<u8>,
            _g_begin: u64,
            _g_end: u64,
        ) -> Result<(), String> {
            self.launches.fetch_add(1, Ordering::Relaxed);
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
    fn time_device_runs_a_warm_up_then_an_end_to_end_and_a_resident_run_per_round() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../recipes/grpo.rlx");
        let checked = rlx_compiler::check_path(&path).expect("readable recipe");
        let recipe = checked.recipe.expect("a clean recipe");
        let graph = rlx_compiler::compile_graph(&recipe, &[]).expect("lowers");
        let batch = synthetic::batch(&graph, &Spec::default());
        let kernel = Kernel::compile(&graph, &Options::default()).unwrap();
        let packed = kernel.pack(&batch).unwrap();
        let device = DeviceKernel::new(kernel, Idle::default()).unwrap();
        device.run_packed(&packed, &Context::default()).unwrap();
        let per_run = device.device().launches.swap(0, Ordering::Relaxed);
        assert!(per_run > 0);
        let times = time_device(&device, &packed, &Context::default(), 3).unwrap();
        assert_eq!(
            device.device().launches.load(Ordering::Relaxed),
            (1 + 2 * 3) * per_run
        );
        for time in [times.kernel, times.upload, times.resident, times.end_to_end] {
            assert!(time.as_secs_f64().is_finite());
        }
        // A batch the kernel rejects is an error, not a panic.
        let mut broken = packed.clone();
        broken.layout.token_offsets.pop();
        assert!(time_device(&device, &broken, &Context::default(), 1).is_err());
    }
}
