//! The recipes' objectives computed op by op with candle (`common/candle_objectives.rs`: padded
//! `[responses, T]` tensors, masks, group statistics by reshape, forward + backward through candle's
//! autograd, the way a Python trainer computes them) next to the interpreter, the JIT on 1 thread and
//! on all threads, and a memory-bandwidth bound, on 64 groups × 8 responses × 1024 tokens.
//! Throughput is in tokens (criterion's "elements"). Run:
//! `cargo bench -p rlx-trainer --bench candle_baseline`.
//!
//! Before the criterion groups, each engine's peak memory above its batch is printed (one run, counted
//! by `rlx_runtime::bench::CountingAllocator`, installed here as the global allocator).

#[path = "common/candle_objectives.rs"]
mod candle_objectives;

use std::hint::black_box;
use std::time::Duration;

use candle_core::{DType, Device, Tensor, Var};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

use candle_objectives::Padded;
use rlx_runtime::bench::{peak_during, CountingAllocator};
use rlx_runtime::synthetic::{self, Spec};
use rlx_runtime::{evaluate, Context, Kernel, Options};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const GROUPS: usize = 64;
const N: usize = 8;
const TOKENS: usize = 1024;

fn recipe_graph(name: &str) -> rlx_compiler::ir::Graph {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../recipes")
        .join(name);
    let checked = rlx_compiler::check_path(&path).expect("recipe is readable");
    let recipe = checked.recipe.expect("recipe checks clean");
    rlx_compiler::compile_graph(&recipe, &[]).expect("recipe compiles")
}

/// The candle inputs: every token input as `[R, T]` f32, every response input as `[R]` f32.
struct CandleInputs {
    padded: Padded,
    tok: Vec<Option<Tensor>>,
    resp: Vec<Option<Tensor>>,
}

fn candle_inputs(graph: &rlx_compiler::ir::Graph, batch: &rlx_runtime::Batch) -> CandleInputs {
    let device = Device::Cpu;
    let counts: Vec<usize> = (0..batch.layout.responses())
        .map(|r| batch.layout.response_length(r))
        .collect();
    let padded = Padded::new(GROUPS, N, &counts, DType::F32, &device).unwrap();
    let mut tok = Vec::new();
    let mut resp = Vec::new();
    for (input, values) in graph.inputs.iter().zip(&batch.inputs) {
        let is_tok = input.shape.level == rlx_compiler::ir::Level::Tok;
        tok.push(is_tok.then(|| padded.pad(values, DType::F32, &device).unwrap()));
        resp.push((!is_tok).then(|| {
            Tensor::from_vec(values.clone(), values.len(), &device)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap()
        }));
    }
    CandleInputs { padded, tok, resp }
}

/// Forward and backward, op by op: the loss and ∂loss/∂logp as `[R, T]`.
fn candle_step(recipe: &str, inputs: &CandleInputs) -> (Tensor, Tensor) {
    let logp = Var::from_tensor(inputs.tok[0].as_ref().unwrap()).unwrap();
    let t = |i: usize| inputs.tok[i].as_ref().unwrap();
    let r = |i: usize| inputs.resp[i].as_ref().unwrap();
    let objective = match recipe {
        "dapo.rlx" => candle_objectives::dapo(logp.as_tensor(), t(1), r(2), t(3), &inputs.padded),
        _ => candle_objectives::darling(logp.as_tensor(), t(1), t(2), r(3), r(4), &inputs.padded),
    }
    .unwrap();
    // The metrics are part of the work a trainer does per step.
    for (_, metric) in &objective.metrics {
        black_box(
            metric
                .to_dtype(DType::F32)
                .unwrap()
                .to_scalar::<f32>()
                .unwrap(),
        );
    }
    let grads = objective.loss.backward().unwrap();
    let gradient = grads.get(logp.as_tensor()).unwrap().clone();
    (objective.loss, gradient)
}

fn baseline(c: &mut Criterion) {
    let spec = Spec {
        groups: GROUPS,
        responses: N,
        tokens: TOKENS,
        ragged: false,
        singleton: false,
        criteria: 4,
        dim: 8,
        seed: 1,
    };
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let context = Context::default();
    for recipe in ["dapo.rlx", "darling.rlx"] {
        let graph = recipe_graph(recipe);
        let batch = synthetic::batch(&graph, &spec);
        let tokens = batch.layout.tokens();
        let kernel = Kernel::compile(&graph, &Options::default()).unwrap();
        let packed = kernel.pack(&batch).unwrap();
        let inputs = candle_inputs(&graph, &batch);
        // One run each, for the peak memory above the batch.
        let (_, interp_peak) = peak_during(|| evaluate(&graph, &batch, &context).unwrap());
        let (_, candle_peak) = peak_during(|| one.install(|| candle_step(recipe, &inputs)));
        let (_, jit_peak) =
            peak_during(|| one.install(|| kernel.run_packed(&packed, &context).unwrap()));
        let mib = |b: Option<usize>| b.unwrap_or(0) as f64 / (1 << 20) as f64;
        eprintln!(
            "{recipe}: peak memory above the batch: interpreter {:.1} MiB, candle op-by-op {:.1} MiB, JIT {:.1} MiB (the f32 gradient alone: {:.1} MiB)",
            mib(interp_peak),
            mib(candle_peak),
            mib(jit_peak),
            (tokens * 4) as f64 / (1 << 20) as f64
        );
        let mut group = c.benchmark_group(format!("candle_baseline/{recipe}"));
        group.throughput(Throughput::Elements(tokens as u64));
        group.sample_size(10);
        group.warm_up_time(Duration::from_secs(1));
        group.measurement_time(Duration::from_secs(4));
        group.bench_function("interpreter", |b| {
            b.iter(|| black_box(evaluate(&graph, &batch, &context).unwrap()))
        });
        group.bench_function("candle op-by-op, 1 thread", |b| {
            b.iter(|| one.install(|| black_box(candle_step(recipe, &inputs))))
        });
        group.bench_function("candle op-by-op, all threads", |b| {
            b.iter(|| black_box(candle_step(recipe, &inputs)))
        });
        group.bench_function("jit 1 thread", |b| {
            b.iter(|| one.install(|| black_box(kernel.run_packed(&packed, &context).unwrap())))
        });
        group.bench_function("jit all threads", |b| {
            b.iter(|| black_box(kernel.run_packed(&packed, &context).unwrap()))
        });
        let mut gradient = vec![0f32; tokens];
        group.bench_function("bandwidth bound, 1 thread", |b| {
            b.iter(|| {
                black_box(rlx_runtime::bench::read_inputs_write_gradient(
                    &packed,
                    &mut gradient,
                    false,
                ))
            })
        });
        group.bench_function("bandwidth bound, all threads", |b| {
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

criterion_group!(benches, baseline);
criterion_main!(benches);
