use rlx_runtime::interp::Context;
use rlx_runtime::kernel::{Kernel, Options};
use rlx_runtime::synthetic::{self, Spec};
fn main() {
    let name = std::env::args().nth(1).unwrap_or("dapo.rlx".into());
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../recipes")
        .join(&name);
    let recipe = rlx_compiler::check_path(&path).unwrap().recipe.unwrap();
    let graph = rlx_compiler::compile_graph(&recipe, &[]).unwrap();
    let spec = Spec {
        groups: 64,
        responses: 8,
        tokens: 1024,
        ragged: false,
        singleton: false,
        ..Spec::default()
    };
    let batch = synthetic::batch(&graph, &spec);
    let kernel = Kernel::compile(&graph, &Options::default()).unwrap();
    let packed = kernel.pack(&batch).unwrap();
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let cpu = || {
        let s = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        let f: Vec<&str> = s.rsplit(')').next().unwrap().split_whitespace().collect();
        f[11].parse::<f64>().unwrap() * 10.0
    };
    for _ in 0..3 {
        let t = std::time::Instant::now();
        let c0 = cpu();
        for _ in 0..20 {
            kernel.run_packed(&packed, &Context::default()).unwrap();
        }
        eprintln!(
            "{:.2} ms/run wall, {:.2} ms/run cpu",
            t.elapsed().as_secs_f64() * 1e3 / 20.0,
            (cpu() - c0) / 20.0
        );
    }
    let _ = &one;
    if std::env::args().nth(2).is_some() {
        for c in Kernel::clif(&graph, &Options::default()).unwrap() {
            println!("{c}");
        }
    }
}
