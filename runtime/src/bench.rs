//! `rlx bench`: a recipe on a synthetic packed batch of a given shape, per backend: kernel time
//! (median of several runs), tokens/s, peak memory above the batch, and a memory-bandwidth bound (the
//! time to read every input and write every gradient once at the measured `memcpy` bandwidth). The
//! figures are those of the criterion benches (`cargo bench -p rlx-runtime --bench jit`).
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

fn pool(threads: usize) -> Result<rayon::ThreadPool, String> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| format!("cannot start {threads} threads: {e}"))
}

/// Measure `graph` per the settings: one JSON object per backend (`rlx bench` prints each on a line).
pub fn run(graph: &Graph, recipe: &str, settings: &Settings) -> Result<Vec<Value>, String> {
    if settings.groups == 0 || settings.n == 0 || settings.tokens == 0 || settings.runs == 0 {
        return Err("--groups, --n, --tokens and --runs must be at least 1".into());
    }
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
    let bandwidth = memcpy_bandwidth(&pool);
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
    let bound = |input_bytes: usize, gradient_bytes: usize| {
        let bytes = (input_bytes + gradient_bytes) as f64;
        let seconds = bytes / bandwidth;
        json!({
            "bound_bytes": bytes,
            "bound_ms": seconds * 1e3,
            "bound_tokens_per_s": tokens_total as f64 / seconds,
            "memcpy_gb_s": bandwidth / 1e9,
        })
    };
    let mut lines = Vec::new();
    if matches!(settings.backend, Which::Interp | Which::All) {
        evaluate(graph, &batch, &context).map_err(|e| format!("interpreter: {}", e.0))?;
        let mut times = Vec::with_capacity(settings.runs);
        let mut peak = None;
        for _ in 0..settings.runs {
            let start = Instant::now();
            let (outcome, bytes) = peak_during(|| evaluate(graph, &batch, &context));
            times.push(start.elapsed());
            std::hint::black_box(outcome.map_err(|e| e.0)?);
            peak = peak.max(bytes);
        }
        let time = median(times);
        let mut fields = json!({
            "backend": "interp",
            "threads": 1,
            "kernel_ms": ms(time),
            "tokens_per_s": tokens_total as f64 / time.as_secs_f64(),
            "batch_bytes": batch_bytes(&batch),
            "peak_bytes_above_batch": peak,
        });
        let bound = bound(batch_bytes(&batch), gradient_elems * 8);
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
        let packed = kernel.pack(&batch).map_err(|e| e.0)?;
        pool.install(|| kernel.run_packed(&packed, &context))
            .map_err(|e| e.0)?;
        let mut times = Vec::with_capacity(settings.runs);
        let mut peak = None;
        for _ in 0..settings.runs {
            let start = Instant::now();
            let (outcome, bytes) =
                peak_during(|| pool.install(|| kernel.run_packed(&packed, &context)));
            times.push(start.elapsed());
            std::hint::black_box(outcome.map_err(|e| e.0)?);
            peak = peak.max(bytes);
        }
        let time = median(times);
        let storage = settings.options.storage.bytes();
        let mut fields = json!({
            "backend": "jit",
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
        let bound = bound(packed_bytes(&packed), gradient_elems * storage);
        fields
            .as_object_mut()
            .unwrap()
            .extend(bound.as_object().cloned().unwrap_or_default());
        lines.push(line(fields));
    }
    Ok(lines)
}
