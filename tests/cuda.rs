//! The CUDA backend (rlx_compiler::backend::cuda, rlx_runtime::cuda) without a GPU. docs/gpu.md.
//!
//! - **Host C.** Every recipe's generated CUDA C, with the portability header `cuda_host.h` in front,
//!   is compiled by the system C compiler (`cc`, or `$CC`) into a shared library whose kernels run on
//!   POSIX threads (a block's threads really run concurrently and meet at `__syncthreads`). It is driven
//!   by the same runner the GPU uses (`DeviceKernel`: the kernel's validation and keep filters, upload,
//!   launches in plan order, combine kernels, download) and checked against the f64 interpreter on
//!   random ragged packed batches (singleton groups, so `keep group` filters drop groups): loss,
//!   metrics, rewards, advantages, kept flags and gradients within `F64_TOLERANCE` with f64
//!   accumulation and `F32_TOLERANCE` with f32 accumulation, for blocks of 1, 4 and 32 threads. Results
//!   are deterministic for a block size, and malformed batches are rejected before any launch.
//! - **NVRTC and ptxas.** With the tools of `scripts/install-cuda-tools.sh` (in `$RLX_CUDA_TOOLS`, by
//!   default ~/.cache/rlx/cuda), every recipe's source compiles to PTX through libnvrtc.so.12's C API
//!   for compute_80 and compute_90, and `ptxas` assembles it for sm_80 and sm_90 with no error. Where
//!   the build found no tools there, the test is reported as ignored (rlx-tools, `rlx_nvrtc`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rlx_compiler::backend::cuda::{self, CudaSource};
use rlx_compiler::ir::Graph;
use rlx_runtime::synthetic::{self, Spec};
use rlx_runtime::{
    evaluate, Column, ColumnRef, Context, Device, DeviceKernel, Kernel, Options, Outcome, Precision,
};

#[path = "../runtime/tests/common/agreement.rs"]
mod agreement;
#[path = "../runtime/tests/common/host_c.rs"]
mod host_c;
#[path = "../runtime/tests/common/nvrtc.rs"]
mod nvrtc;

use agreement::{close, graph_of, rounded, F32_TOLERANCE, F64_TOLERANCE};
use host_c::HostLaunch;
use nvrtc::Nvrtc;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn recipe_files() -> Vec<PathBuf> {
    agreement::recipe_files(&root())
}

fn name_of(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// A scratch folder of this test binary.
fn scratch(label: &str) -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "rlx-cuda-test-{}-{}-{label}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

// ---------------------------------------------------------------------------------------------------
// The host-C device.

/// Host memory, 8-byte aligned, that the C kernels write through raw pointers.
struct HostBuffer {
    words: *mut u64,
    len: usize,
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // SAFETY: `words` came from `Box::into_raw` of a boxed slice of `len` words.
        unsafe {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.words, self.len,
            )))
        };
    }
}

impl HostBuffer {
    fn bytes(&self) -> *mut u8 {
        self.words.cast()
    }
}

/// The generated source compiled for the CPU (see the module docs).
struct HostDevice {
    block: u32,
    library: Option<Arc<libloading::Library>>,
    launches: AtomicUsize,
}

impl HostDevice {
    fn new(block: u32) -> HostDevice {
        HostDevice {
            block,
            library: None,
            launches: AtomicUsize::new(0),
        }
    }
}

/// Compile host C into a shared library (once per source: block sizes share it); the compiler's
/// messages on failure.
fn compile_host(source: &CudaSource) -> Result<Arc<libloading::Library>, String> {
    type Built = Vec<(String, Arc<libloading::Library>)>;
    static BUILT: std::sync::Mutex<Built> = std::sync::Mutex::new(Vec::new());
    let text = source.host_c();
    if let Some((_, library)) = BUILT.lock().unwrap().iter().find(|(t, _)| *t == text) {
        return Ok(library.clone());
    }
    let dir = scratch("host");
    let path = host_c::shared_library(
        &text,
        &dir,
        &[
            "-Wno-unused-function",
            "-Wno-unused-variable",
            "-Wno-unused-but-set-variable",
        ],
    );
    // SAFETY: the library is our own generated C; its initialisers do nothing.
    let library =
        path.and_then(|path| unsafe { libloading::Library::new(&path) }.map_err(|e| e.to_string()));
    // A loaded library stays mapped; its files are no longer needed (kept when something failed).
    let library = Arc::new(library?);
    let _ = std::fs::remove_dir_all(&dir);
    BUILT.lock().unwrap().push((text, library.clone()));
    Ok(library)
}

impl Device for HostDevice {
    type Buffer = HostBuffer;

    fn load(&mut self, source: &CudaSource) -> Result<(), String> {
        let library = compile_host(source)?;
        self.library = Some(library);
        Ok(())
    }

    fn upload(&self, bytes: &[u8]) -> Result<HostBuffer, String> {
        let len = bytes.len().div_ceil(8).max(1);
        let words = Box::into_raw(vec![0u64; len].into_boxed_slice()).cast::<u64>();
        let buffer = HostBuffer { words, len };
        // SAFETY: the allocation holds `len * 8 >= bytes.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buffer.bytes(), bytes.len()) };
        Ok(buffer)
    }

    fn write(&self, buffer: &mut HostBuffer, bytes: &[u8]) -> Result<(), String> {
        if bytes.len() > buffer.len * 8 {
            return Err("write past a buffer".into());
        }
        // SAFETY: checked above.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buffer.bytes(), bytes.len()) };
        Ok(())
    }

    fn download(&self, buffer: &HostBuffer, out: &mut [u8]) -> Result<(), String> {
        if out.len() > buffer.len * 8 {
            return Err("read past a buffer".into());
        }
        // SAFETY: checked above.
        unsafe { std::ptr::copy_nonoverlapping(buffer.bytes(), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    fn address(&self, buffer: &HostBuffer) -> u64 {
        buffer.words as u64
    }

    unsafe fn launch(
        &self,
        name: &str,
        grid: u32,
        block: u32,
        table: &HostBuffer,
        g_begin: u64,
        g_end: u64,
    ) -> Result<(), String> {
        let library = self.library.as_ref().ok_or("not loaded")?;
        let symbol = format!("rlx_host_{name}");
        // SAFETY: RLX_HOST_LAUNCHER defines every rlx_host_* with the `HostLaunch` signature.
        let launch: libloading::Symbol<HostLaunch> =
            unsafe { library.get(symbol.as_bytes()) }.map_err(|e| e.to_string())?;
        self.launches.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract (`Device::launch`): `table` is laid out for a validated layout.
        let status = unsafe { launch(table.words.cast(), g_begin, g_end, grid, block) };
        if status != 0 {
            return Err(format!("host launch of {name} failed with status {status}"));
        }
        Ok(())
    }

    fn synchronize(&self) -> Result<(), String> {
        Ok(())
    }

    fn block_size(&self) -> u32 {
        self.block
    }
}

// ---------------------------------------------------------------------------------------------------
// Agreement.

/// Differences between the interpreter's and the CUDA kernels' outcomes.
fn compare(e: &Outcome, a: &Outcome, tolerance: (f64, f64)) -> Vec<String> {
    agreement::compare(e, a, tolerance, "cuda")
}

fn specs() -> Vec<Spec> {
    let mut specs: Vec<Spec> = (1..=3)
        .map(|seed| Spec {
            seed,
            ..Spec::default()
        })
        .collect();
    specs.push(Spec {
        groups: 5,
        responses: 5,
        tokens: 40,
        seed: 11,
        ..Spec::default()
    });
    specs.push(Spec {
        groups: 4,
        responses: 2,
        tokens: 3,
        singleton: false,
        ragged: false,
        seed: 12,
        ..Spec::default()
    });
    specs
}

fn context() -> Context {
    Context {
        step: 3.0,
        progress: 0.25,
    }
}

fn check(precision: Precision, tolerance: (f64, f64), blocks: &[u32]) {
    check_on(precision, tolerance, blocks, &|block| {
        Ok(HostDevice::new(block))
    });
}

/// Every recipe on devices from `make` (by block size) against the interpreter.
fn check_on<D: Device>(
    precision: Precision,
    tolerance: (f64, f64),
    blocks: &[u32],
    make: &dyn Fn(u32) -> Result<D, String>,
) {
    let mut failures = Vec::new();
    let mut checked = 0;
    for path in recipe_files() {
        let Some(graph) = graph_of(&path) else {
            continue;
        };
        let name = name_of(&path);
        let options = Options {
            accumulate: precision,
            storage: Precision::F32,
        };
        for &block in blocks {
            let kernel = match Kernel::compile(&graph, &options) {
                Ok(kernel) => kernel,
                Err(e) => panic!("{name}: no kernel plan: {e}"),
            };
            let device = match make(block).and_then(|device| DeviceKernel::new(kernel, device)) {
                Ok(device) => device,
                Err(e) => {
                    failures.push(format!("{name}: {e}"));
                    continue;
                }
            };
            for spec in specs() {
                let batch = rounded(&graph, &synthetic::batch(&graph, &spec));
                let label = format!("{name} seed {} block {block}", spec.seed);
                let expected = evaluate(&graph, &batch, &context());
                let actual = device.run(&batch, &context());
                match (expected, actual) {
                    (Ok(e), Ok(a)) => {
                        for difference in compare(&e, &a, tolerance) {
                            failures.push(format!("{label}: {difference}"));
                        }
                    }
                    (Err(e), Err(a)) => {
                        if e != a {
                            failures.push(format!("{label}: interp `{e}`, cuda `{a}`"));
                        }
                    }
                    (Ok(_), Err(a)) => failures.push(format!("{label}: only cuda fails: {a}")),
                    (Err(e), Ok(_)) => {
                        failures.push(format!("{label}: only the interpreter fails: {e}"))
                    }
                }
            }
        }
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} recipes found");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn host_c_kernels_agree_with_the_interpreter_in_f64() {
    check(Precision::F64, F64_TOLERANCE, &[1, 4, 32]);
}

#[test]
fn host_c_kernels_agree_with_the_interpreter_in_f32_accumulation() {
    check(Precision::F32, F32_TOLERANCE, &[4]);
}

/// `DeviceKernel::run_view_keeping_gradients` (the trainer's GPU path: ∂loss/∂input left on the
/// device) on the recipes with `keep` sections: the outputs are those of an ordinary run, and each
/// gradient buffer, put in place by its kept-element map, is the downloaded gradient bit for bit,
/// including filtered batches (singleton groups that `keep group` drops).
#[test]
fn gradients_left_on_the_device_are_the_downloaded_ones_under_keep_filters() {
    let (mut runs, mut filtered) = (0, 0);
    for path in recipe_files() {
        let Some(graph) = graph_of(&path) else {
            continue;
        };
        let name = name_of(&path);
        let kernel = Kernel::compile(&graph, &Options::default()).unwrap();
        if kernel.plan().phases.len() < 2 {
            continue;
        }
        let device = DeviceKernel::new(kernel, HostDevice::new(4)).unwrap();
        for spec in specs() {
            let batch = rounded(&graph, &synthetic::batch(&graph, &spec));
            let packed = device.kernel().pack(&batch).unwrap();
            let Ok(full) = device.run_packed(&packed, &context()) else {
                continue; // everything filtered, or a non-finite output: not this test's subject
            };
            let columns: Vec<ColumnRef<'_>> =
                packed.inputs.iter().map(Column::as_column_ref).collect();
            let none = vec![None; columns.len()];
            // SAFETY: no device addresses are given.
            let (outcome, gradients) = unsafe {
                device.run_view_keeping_gradients(&packed.layout, &columns, &none, &context())
            }
            .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(
                (outcome.loss, &outcome.kept),
                (full.loss, &full.kept),
                "{name}"
            );
            assert_eq!(outcome.metrics, full.metrics, "{name}");
            assert!(outcome.gradients.is_empty());
            assert_eq!(gradients.len(), full.gradients.len(), "{name}");
            for gradient in &gradients {
                let (_, expected) = full
                    .gradients
                    .iter()
                    .find(|(n, _)| *n == gradient.name)
                    .unwrap_or_else(|| panic!("{name}: no ∂{}", gradient.name));
                let width = match gradient.precision {
                    Precision::F32 => 4,
                    Precision::F64 => 8,
                };
                let mut bytes = vec![0u8; gradient.len * width];
                device
                    .device()
                    .download(&gradient.buffer, &mut bytes)
                    .unwrap();
                let values: Vec<f64> = bytes
                    .chunks_exact(width)
                    .map(|b| match gradient.precision {
                        Precision::F32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
                        Precision::F64 => f64::from_le_bytes(b.try_into().unwrap()),
                    })
                    .collect();
                let mut placed = vec![0.0; expected.len()];
                for (k, value) in values.iter().enumerate() {
                    let at = gradient.map.as_ref().map_or(k, |map| map[k] as usize);
                    placed[at] = *value;
                }
                assert_eq!(placed, expected.to_f64(), "{name}: ∂{}", gradient.name);
                filtered += usize::from(gradient.map.is_some());
            }
            runs += 1;
        }
    }
    assert!(runs >= 5, "only {runs} runs of recipes with keep sections");
    assert!(filtered > 0, "no run dropped responses");
}

fn extra_recipes() -> Vec<(String, String)> {
    agreement::kernel_cases(&root())
}

#[test]
fn inline_recipes_cover_the_remaining_ops() {
    let mut failures = Vec::new();
    for (name, text) in &extra_recipes() {
        let checked = rlx_compiler::check_source(name, text);
        let recipe = checked
            .recipe
            .unwrap_or_else(|| panic!("{name} does not check: {:?}", checked.diagnostics));
        let graph = rlx_compiler::compile_graph(&recipe, &[]).expect("lowers");
        for (options, tolerance) in [
            (Options::default(), F64_TOLERANCE),
            (
                Options {
                    accumulate: Precision::F64,
                    storage: Precision::F64,
                },
                (1e-9, 1e-12),
            ),
            (
                Options {
                    accumulate: Precision::F32,
                    storage: Precision::F32,
                },
                F32_TOLERANCE,
            ),
        ] {
            let kernel =
                Kernel::compile(&graph, &options).unwrap_or_else(|e| panic!("{name}: {e}"));
            let device = DeviceKernel::new(kernel, HostDevice::new(4))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            for spec in specs() {
                let batch = rounded(&graph, &synthetic::batch(&graph, &spec));
                let label = format!(
                    "{name} seed {} storage {} accumulate {}",
                    spec.seed,
                    options.storage.name(),
                    options.accumulate.name()
                );
                match (
                    evaluate(&graph, &batch, &context()),
                    device.run(&batch, &context()),
                ) {
                    (Ok(e), Ok(a)) => {
                        for difference in compare(&e, &a, tolerance) {
                            failures.push(format!("{label}: {difference}"));
                        }
                    }
                    (Err(e), Err(a)) => {
                        if e != a {
                            failures.push(format!("{label}: interp `{e}`, cuda `{a}`"));
                        }
                    }
                    (e, a) => {
                        failures.push(format!("{label}: interp {:?}, cuda {:?}", e.err(), a.err()))
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn dapo() -> Graph {
    graph_of(&root().join("recipes/dapo.rlx")).expect("dapo checks")
}

#[test]
fn results_are_deterministic_for_a_block_size() {
    let graph = dapo();
    let kernel = Kernel::compile(&graph, &Options::default()).unwrap();
    let device = DeviceKernel::new(kernel, HostDevice::new(8)).unwrap();
    let spec = Spec {
        groups: 6,
        responses: 4,
        tokens: 60,
        seed: 5,
        ..Spec::default()
    };
    let batch = synthetic::batch(&graph, &spec);
    let first = device.run(&batch, &context()).unwrap();
    for _ in 0..3 {
        assert_eq!(device.run(&batch, &context()).unwrap(), first);
    }
}

#[test]
fn malformed_batches_are_rejected_before_any_launch() {
    let graph = dapo();
    let kernel = Kernel::compile(&graph, &Options::default()).unwrap();
    let device = DeviceKernel::new(kernel, HostDevice::new(4)).unwrap();
    let good = synthetic::batch(&graph, &Spec::default());
    // Token offsets that run past the token columns, a missing input, a short column.
    let mut past = good.clone();
    let last = past.layout.token_offsets.len() - 1;
    past.layout.token_offsets[last] += 1000;
    let mut missing = good.clone();
    missing.inputs.pop();
    let mut short = good.clone();
    short.inputs[0].pop();
    for (what, batch) in [("past", past), ("missing", missing), ("short", short)] {
        let error = device
            .run(&batch, &context())
            .expect_err("a malformed batch runs");
        assert!(
            error.to_string().contains("malformed batch"),
            "{what}: {error}"
        );
    }
    assert_eq!(device.device().launches.load(Ordering::Relaxed), 0);
    device.run(&good, &context()).unwrap();
    assert!(device.device().launches.load(Ordering::Relaxed) > 0);
}

/// A non-finite output of the CUDA kernels is explained like the interpreter's (the executor's
/// finiteness check): the node that made it, its recipe expression and the batch element. A run that
/// leaves its gradients on the device is not (its host columns may be placeholders); its caller
/// explains the error with the values (`EvalError::explained`).
#[test]
fn a_non_finite_output_of_the_cuda_kernels_names_its_expression() {
    let text = "input logp : f32[tok] policy\ninput score : f32[resp]\nreward = log(score)\nadvantage = reward - mean(reward over resp)\nloss = mean(-advantage * logp over tok, batch)\n";
    let rollouts = "{\"group\": \"a\", \"score\": 1, \"logp\": [-1, -2]}\n{\"group\": \"a\", \"score\": 0, \"logp\": [-1]}\n";
    let checked = rlx_compiler::check_source("log.rlx", text);
    let recipe = checked.recipe.expect("checks");
    let graph = rlx_compiler::compile_graph(&recipe, &[]).expect("lowers");
    let batch = rlx_runtime::rollouts::read_rollouts(rollouts, &recipe)
        .expect("rollouts")
        .batch;
    let kernel = Kernel::compile(&graph, &Options::default()).unwrap();
    let device = DeviceKernel::new(kernel, HostDevice::new(4)).unwrap();
    let expression = |error: &rlx_runtime::EvalError| {
        let non_finite = error.non_finite().expect("a non-finite output");
        let culprit = non_finite.culprit.as_ref()?;
        let site = culprit.span.expect("a span");
        Some((
            text[site.start as usize..site.end as usize].to_string(),
            culprit.element.to_string(),
        ))
    };
    let interpreted = evaluate(&graph, &batch, &context()).unwrap_err();
    let error = device.run(&batch, &context()).unwrap_err();
    assert_eq!(
        expression(&error),
        Some(("log(score)".to_string(), "group 0, response 1".to_string()))
    );
    assert_eq!(error, interpreted);

    let packed = device.kernel().pack(&batch).unwrap();
    let columns: Vec<ColumnRef<'_>> = packed.inputs.iter().map(Column::as_column_ref).collect();
    let none = vec![None; columns.len()];
    // SAFETY: no device addresses are given.
    let kept = match unsafe {
        device.run_view_keeping_gradients(&packed.layout, &columns, &none, &context())
    } {
        Ok(_) => panic!("a NaN loss came back"),
        Err(error) => error,
    };
    assert_eq!(expression(&kept), None, "{kept}");
    let explained = kept.explained(&graph, &batch, &context());
    assert_eq!(explained, interpreted);
}

#[test]
fn every_pass_is_one_kernel_and_token_passes_use_the_block() {
    let graph = dapo();
    let kernel = Kernel::compile(&graph, &Options::default()).unwrap();
    let source = cuda::generate(&graph, kernel.plan()).unwrap();
    let launches: Vec<_> = source.launches.iter().flatten().flatten().collect();
    assert_eq!(
        source.source.matches("\nRLX_KERNEL void ").count(),
        launches.len(),
        "one kernel per loop or combine pass"
    );
    assert!(source
        .source
        .contains("#define RLX_KERNEL extern \"C\" __global__"));
    // DAPO's two token passes are block-parallel and reduce across the block.
    assert_eq!(launches.iter().filter(|l| l.threads).count(), 2);
    assert!(source.source.contains("rlx_block_reduce("));
}

#[test]
fn rlx_score_on_cuda_is_a_clear_error_without_a_gpu_or_the_feature() {
    let graph = dapo();
    let batch = synthetic::batch(&graph, &Spec::default());
    let dir = scratch("score");
    let rollouts = dir.join("rollouts.jsonl");
    std::fs::write(&rollouts, synthetic::to_jsonl(&graph, &batch)).unwrap();
    let run = |device: &str| {
        Command::new(env!("CARGO_BIN_EXE_rlx"))
            .arg("score")
            .arg(root().join("recipes/dapo.rlx"))
            .arg("--rollouts")
            .arg(&rollouts)
            .args(["--device", device])
            .output()
            .expect("rlx runs")
    };
    let cpu = run("cpu");
    assert!(
        cpu.status.success(),
        "{}",
        String::from_utf8_lossy(&cpu.stderr)
    );
    let bad = run("gpu");
    assert_eq!(bad.status.code(), Some(2), "a usage error");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("expected cpu, cuda or cuda:N"));
    let cuda = run("cuda:0");
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&cuda.stderr);
    if cfg!(feature = "cuda") && cuda.status.success() {
        // A GPU is present: the scores must be the CPU's (f64 storage and accumulation on both).
        let a: serde_json::Value = serde_json::from_slice(&cpu.stdout).unwrap();
        let b: serde_json::Value = serde_json::from_slice(&cuda.stdout).unwrap();
        let (x, y) = (a["loss"].as_f64().unwrap(), b["loss"].as_f64().unwrap());
        assert!(close(x, y, (1e-12, 1e-14)), "cpu {x}, cuda {y}");
    } else {
        assert_eq!(cuda.status.code(), Some(1), "{stderr}");
        if cfg!(feature = "cuda") {
            assert!(
                stderr.contains("CUDA") || stderr.contains("GPU"),
                "{stderr}"
            );
        } else {
            assert!(
                stderr.contains("built without the `cuda` feature"),
                "{stderr}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// NVRTC and ptxas.

#[test]
#[cfg_attr(
    not(rlx_nvrtc),
    ignore = "needs NVRTC and ptxas: run scripts/install-cuda-tools.sh"
)]
fn nvrtc_compiles_every_recipe_and_ptxas_assembles_it() {
    let nvrtc = Nvrtc::load(&rlx_tools::nvrtc_library());
    let ptxas = rlx_tools::ptxas();
    let work = scratch("ptx");
    let mut graphs: Vec<(String, Graph)> = recipe_files()
        .iter()
        .filter_map(|path| Some((name_of(path), graph_of(path)?)))
        .collect();
    for (name, text) in &extra_recipes() {
        let recipe = rlx_compiler::check_source(name, text)
            .recipe
            .expect("checks");
        graphs.push((
            name.to_string(),
            rlx_compiler::compile_graph(&recipe, &[]).unwrap(),
        ));
    }
    let checked = graphs.len();
    // NVRTC and ptxas take about a second per recipe: spread the recipes over the cores.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let next = AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some((name, graph)) = graphs.get(index) else {
                    break;
                };
                let found = compile_and_assemble(&nvrtc, &ptxas, &work, index, name, graph);
                failures.lock().unwrap().extend(found);
            });
        }
    });
    let _ = std::fs::remove_dir_all(&work);
    let failures = failures.into_inner().unwrap();
    assert!(checked >= 25, "only {checked} recipes found");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    println!(
        "NVRTC + ptxas: {checked} recipes × (f64, f32) × (sm_80, sm_90) compiled and assembled"
    );
}

/// One recipe's CUDA C through NVRTC (compute_80, compute_90) and ptxas (sm_80, sm_90): the failures.
fn compile_and_assemble(
    nvrtc: &Nvrtc,
    ptxas: &Path,
    work: &Path,
    index: usize,
    name: &str,
    graph: &Graph,
) -> Vec<String> {
    let mut failures = Vec::new();
    for accumulate in [Precision::F64, Precision::F32] {
        let options = Options {
            accumulate,
            storage: Precision::F32,
        };
        let kernel = Kernel::compile(graph, &options).unwrap();
        let source = cuda::generate(graph, kernel.plan()).unwrap();
        for sm in ["80", "90"] {
            let label = format!("{name} ({}, sm_{sm})", accumulate.name());
            let ptx = match nvrtc.compile(&source.source, "rlx.cu", &format!("compute_{sm}")) {
                Ok((ptx, _)) => ptx,
                Err(log) => {
                    failures.push(format!("{label}: {log}"));
                    continue;
                }
            };
            for launch in source.launches.iter().flatten().flatten() {
                if !ptx.contains(&format!(".entry {}(", launch.name)) {
                    failures.push(format!("{label}: no entry {} in the PTX", launch.name));
                }
            }
            let file = work.join(format!("k{index}-{}-{sm}.ptx", accumulate.name()));
            std::fs::write(&file, &ptx).unwrap();
            let output = Command::new(ptxas)
                .arg(format!("-arch=sm_{sm}"))
                .arg(&file)
                .arg("-o")
                .arg(file.with_extension("cubin"))
                .output()
                .expect("ptxas runs");
            let messages = String::from_utf8_lossy(&output.stderr).into_owned();
            if !output.status.success() || messages.contains("error") {
                failures.push(format!("{label}: ptxas: {messages}"));
            }
        }
    }
    failures
}

// ---------------------------------------------------------------------------------------------------
// On a GPU (feature `cuda`; scripts/gpu-check.sh runs these).

#[cfg(feature = "cuda")]
mod gpu {
    use super::*;
    use rlx_runtime::CudaDevice;
    use std::time::{Duration, Instant};

    fn ordinal() -> usize {
        std::env::var("RLX_CUDA_DEVICE")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }

    fn gpu(block: u32) -> Result<CudaDevice, String> {
        CudaDevice::with_block(ordinal(), block)
    }

    /// Says which GPU; fails where there is none (the build found the driver: `cfg(rlx_gpu)`).
    fn require_gpu() {
        match CudaDevice::new(ordinal()) {
            Ok(device) => println!("GPU: {}", device.name()),
            Err(e) => panic!("no usable GPU: {e}"),
        }
    }

    #[test]
    #[cfg_attr(not(rlx_gpu), ignore = "needs a GPU: an NVIDIA driver")]
    fn gpu_kernels_agree_with_the_interpreter_in_f64() {
        require_gpu();
        check_on(Precision::F64, F64_TOLERANCE, &[32, 256], &gpu);
    }

    #[test]
    #[cfg_attr(not(rlx_gpu), ignore = "needs a GPU: an NVIDIA driver")]
    fn gpu_kernels_agree_with_the_interpreter_in_f32_accumulation() {
        require_gpu();
        check_on(Precision::F32, F32_TOLERANCE, &[256], &gpu);
    }

    fn median(mut times: Vec<Duration>) -> Duration {
        times.sort();
        times[times.len() / 2]
    }

    /// 64 groups × 8 responses × 4096 tokens on DAPO and DARLING: the fused kernels' time (kernels
    /// only, inputs resident on the GPU; and end to end, with the copies), the bytes a run must read
    /// and write, and the inputs and outputs for scripts/torch_eager_bench.py, in $RLX_BENCH_OUT.
    #[test]
    #[ignore = "a benchmark: scripts/gpu-check.sh runs it"]
    fn gpu_benchmark() {
        require_gpu();
        let out = PathBuf::from(
            std::env::var("RLX_BENCH_OUT").unwrap_or_else(|_| "target/gpu-bench".into()),
        );
        std::fs::create_dir_all(&out).unwrap();
        let spec = Spec {
            groups: 64,
            responses: 8,
            tokens: 4096,
            ragged: false,
            singleton: false,
            seed: 7,
            ..Spec::default()
        };
        let mut report = Vec::new();
        for recipe in ["dapo", "darling"] {
            let graph = graph_of(&root().join(format!("recipes/{recipe}.rlx"))).unwrap();
            let batch = synthetic::batch(&graph, &spec);
            for (info, values) in graph.inputs.iter().zip(&batch.inputs) {
                let bytes: Vec<u8> = values
                    .iter()
                    .flat_map(|v| (*v as f32).to_le_bytes())
                    .collect();
                std::fs::write(out.join(format!("{recipe}.{}.f32", info.name)), bytes).unwrap();
            }
            for accumulate in [Precision::F32, Precision::F64] {
                let options = Options {
                    accumulate,
                    storage: Precision::F32,
                };
                let kernel = Kernel::compile(&graph, &options).unwrap();
                let packed = kernel.pack(&batch).unwrap();
                let scratch = kernel.scratch_bytes(&packed.layout);
                let input_bytes: usize = packed
                    .inputs
                    .iter()
                    .map(|c| c.len() * c.precision().bytes())
                    .sum();
                let started = Instant::now();
                let device = DeviceKernel::new(kernel, gpu(256).unwrap()).unwrap();
                let compile = started.elapsed();
                let resident = device.upload(packed.clone()).unwrap();
                let mut kernels = Vec::new();
                let mut whole = Vec::new();
                let mut outcome = None;
                for rep in 0..25 {
                    let start = Instant::now();
                    let result = device.run_resident(&resident, &context()).unwrap();
                    if rep >= 5 {
                        whole.push(start.elapsed());
                        kernels.push(device.kernel_time());
                    }
                    outcome = Some(result);
                }
                let outcome = outcome.unwrap();
                let gradient_bytes: usize = outcome
                    .gradients
                    .iter()
                    .map(|(_, c)| c.len() * c.precision().bytes())
                    .sum();
                // The least a fused run must move: every input read once, every gradient written once.
                let bytes = input_bytes + gradient_bytes;
                let kernel_time = median(kernels);
                let end_to_end = median(whole);
                println!(
                    "rlx {recipe} (accumulate {}): kernels {:.3} ms, end to end {:.3} ms (with copies), {:.1} MB moved, NVRTC+load {:.0} ms, loss {:.9}",
                    accumulate.name(),
                    kernel_time.as_secs_f64() * 1e3,
                    end_to_end.as_secs_f64() * 1e3,
                    bytes as f64 / 1e6,
                    compile.as_secs_f64() * 1e3,
                    outcome.loss.unwrap_or(f64::NAN)
                );
                report.push(format!(
                    "{{\"recipe\": \"{recipe}\", \"accumulate\": \"{}\", \"kernel_ms\": {}, \"end_to_end_ms\": {}, \"bytes\": {bytes}, \"device_bytes\": {}, \"loss\": {}, \"metrics\": {{{}}}}}",
                    accumulate.name(),
                    kernel_time.as_secs_f64() * 1e3,
                    end_to_end.as_secs_f64() * 1e3,
                    input_bytes + scratch,
                    outcome.loss.unwrap_or(f64::NAN),
                    outcome
                        .metrics
                        .iter()
                        .map(|(n, v)| format!("\"{n}\": {v}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
        std::fs::write(
            out.join("rlx.json"),
            format!(
                "{{\"groups\": {}, \"responses\": {}, \"tokens\": {}, \"runs\": [{}]}}\n",
                spec.groups,
                spec.responses,
                spec.tokens,
                report.join(", ")
            ),
        )
        .unwrap();
    }
}
