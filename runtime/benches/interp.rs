//! The reference interpreter's throughput on 64 groups × 8 responses × 512 tokens: the baseline the
//! JIT must beat. Run: `cargo bench -p rlx-runtime --bench interp`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};

use rlx_runtime::synthetic::{self, Spec};
use rlx_runtime::{evaluate, Context};

fn recipe_graph(name: &str) -> rlx_compiler::ir::Graph {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../recipes")
        .join(name);
    let checked = rlx_compiler::check_path(&path).expect("recipe is readable");
    let recipe = checked.recipe.expect("recipe checks clean");
    rlx_compiler::compile_graph(&recipe, &[]).expect("recipe compiles")
}

fn interpreter(c: &mut Criterion) {
    let spec = Spec {
        groups: 64,
        responses: 8,
        tokens: 512,
        ragged: false,
        singleton: false,
        ..Spec::default()
    };
    let mut group = c.benchmark_group("interpreter");
    group.sample_size(10);
    for recipe in ["grpo.rlx", "darling.rlx"] {
        let graph = recipe_graph(recipe);
        let batch = synthetic::batch(&graph, &spec);
        group.throughput(Throughput::Elements(batch.layout.tokens() as u64));
        group.bench_function(recipe, |b| {
            b.iter(|| evaluate(&graph, &batch, &Context::default()).expect("evaluates"))
        });
    }
    group.finish();
}

criterion_group!(benches, interpreter);
criterion_main!(benches);
