//! Fused JIT kernels against the reference interpreter and a memory-bandwidth bound, on 64 groups × 8
//! responses × 1024 tokens: `recipes/dapo.rlx` (or grpo.rlx) and `recipes/darling.rlx`. Throughput is
//! in tokens (criterion's "elements"). Run: `cargo bench -p rlx-runtime --bench jit`.
//!
//! - `interpreter`: `interp::evaluate` (f64).
//! - `jit 1 thread` / `jit all threads`: `Kernel::run_packed` on a batch packed once (f32 storage, f64
//!   accumulation), loss, metrics, advantages and gradients included, in a 1-thread rayon pool and in the
//!   global pool.
//! - `jit scalar 1 thread`: the same kernel with scalar token loops (`Kernel::compile_with(…, false)`),
//!   the code before vectorisation.
//! - `bandwidth bound`: read every input column once and write a gradient-sized f32 buffer once (what
//!   any implementation must at least do), on 1 thread and on all threads. Criterion repeats it on the
//!   same ~10 MB, so it measures the caches' bandwidth; `rlx bench`'s bound is the `memcpy` bandwidth
//!   over buffers far larger than the caches.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};

use rlx_runtime::synthetic::{self, Spec};
use rlx_runtime::{evaluate, Column, Context, Kernel, Options};

fn recipe_graph(name: &str) -> Option<rlx_compiler::ir::Graph> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../recipes")
        .join(name);
    if !path.exists() {
        return None;
    }
    let checked = rlx_compiler::check_path(&path).expect("recipe is readable");
    let recipe = checked.recipe.expect("recipe checks clean");
    Some(rlx_compiler::compile_graph(&recipe, &[]).expect("recipe compiles"))
}

fn kernels(c: &mut Criterion) {
    let spec = Spec {
        groups: 64,
        responses: 8,
        tokens: 1024,
        ragged: false,
        singleton: false,
        ..Spec::default()
    };
    let first = if recipe_graph("dapo.rlx").is_some() {
        "dapo.rlx"
    } else {
        "grpo.rlx"
    };
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a thread pool");
    for recipe in [first, "darling.rlx"] {
        let Some(graph) = recipe_graph(recipe) else {
            continue;
        };
        let batch = synthetic::batch(&graph, &spec);
        let kernel = Kernel::compile(&graph, &Options::default()).expect("the JIT supports it");
        let packed = kernel.pack(&batch).expect("a valid batch");
        let tokens = batch.layout.tokens();
        let context = Context::default();
        let input_bytes: usize = packed
            .inputs
            .iter()
            .map(|c| {
                c.len()
                    * match c {
                        Column::F32(_) => 4,
                        Column::F64(_) => 8,
                    }
            })
            .sum();
        eprintln!(
            "{recipe}: {tokens} tokens, compiled in {:.1} ms, {} token passes, inputs {:.1} MiB, kernel buffers {:.1} MiB (outputs included), {} threads",
            kernel.compile_time().as_secs_f64() * 1e3,
            kernel.plan().token_passes(),
            input_bytes as f64 / (1 << 20) as f64,
            kernel.scratch_bytes(&batch.layout) as f64 / (1 << 20) as f64,
            rayon::current_num_threads(),
        );
        let mut group = c.benchmark_group(recipe);
        group.sample_size(10);
        group.throughput(Throughput::Elements(tokens as u64));
        group.bench_function("interpreter", |b| {
            b.iter(|| evaluate(&graph, &batch, &context).expect("evaluates"))
        });
        group.bench_function("jit 1 thread", |b| {
            b.iter(|| one.install(|| kernel.run_packed(&packed, &context).expect("runs")))
        });
        group.bench_function("jit all threads", |b| {
            b.iter(|| kernel.run_packed(&packed, &context).expect("runs"))
        });
        // The same plan with scalar token loops (the code before vectorisation), for comparison.
        let scalar =
            Kernel::compile_with(&graph, &Options::default(), false).expect("the JIT supports it");
        group.bench_function("jit scalar 1 thread", |b| {
            b.iter(|| one.install(|| scalar.run_packed(&packed, &context).expect("runs")))
        });
        let mut gradient = vec![0f32; tokens];
        group.bench_function("bandwidth bound 1 thread", |b| {
            b.iter(|| {
                black_box(rlx_runtime::bench::read_inputs_write_gradient(
                    &packed,
                    &mut gradient,
                    false,
                ))
            })
        });
        group.bench_function("bandwidth bound all threads", |b| {
            b.iter(|| {
                black_box(rlx_runtime::bench::read_inputs_write_gradient(
                    &packed,
                    &mut gradient,
                    true,
                ))
            })
        });
        group.finish();
    }
}

/// Compilation of `recipes/dapo.rlx` from its source, whole and by stage: check (parse, resolve, type),
/// lower + autodiff, plan, and plan + cranelift (`Kernel::compile`).
fn compile(c: &mut Criterion) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../recipes/dapo.rlx");
    if !path.exists() {
        return;
    }
    let options = Options::default();
    let checked = || {
        rlx_compiler::check_path(&path)
            .expect("readable")
            .recipe
            .expect("checks clean")
    };
    let recipe = checked();
    let graph = rlx_compiler::compile_graph(&recipe, &[]).expect("compiles");
    let mut group = c.benchmark_group("compile dapo.rlx");
    group.sample_size(20);
    group.bench_function("check", |b| b.iter(|| black_box(checked())));
    group.bench_function("lower + autodiff", |b| {
        b.iter(|| black_box(rlx_compiler::compile_graph(&recipe, &[]).expect("compiles")))
    });
    group.bench_function("plan", |b| {
        b.iter(|| black_box(rlx_compiler::backend::plan::plan(&graph, &options).expect("plans")))
    });
    group.bench_function("plan + jit", |b| {
        b.iter(|| black_box(Kernel::compile(&graph, &options).expect("compiles")))
    });
    group.bench_function("source to kernel", |b| {
        b.iter(|| {
            let graph = rlx_compiler::compile_graph(&checked(), &[]).expect("compiles");
            black_box(Kernel::compile(&graph, &options).expect("compiles"))
        })
    });
    group.finish();
}

criterion_group!(benches, kernels, compile);
criterion_main!(benches);
