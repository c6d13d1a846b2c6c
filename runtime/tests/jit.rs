//! The JIT backend against the f64 reference interpreter.
//!
//! - **Agreement.** Every recipe in recipes/ and tests/gradients/ (read at run time), a few inline
//!   recipes covering the remaining ops, and every hand-worked scoring case of tests/scores/: on random
//!   ragged synthetic batches with singleton groups (and so filtered groups, for recipes with `keep`),
//!   loss, metrics, rewards, advantages, kept flags and gradients agree with the interpreter within
//!   `F64_TOLERANCE` (relative, with an absolute floor for values that cancel to ~0) with f64
//!   accumulation, and within `F32_TOLERANCE` with f32 accumulation. The interpreter sees the same
//!   f32-rounded inputs as the kernel, which stores them as f32.
//! - **Vectorised token loops.** The f64×2 / f32×4 code gives the scalar code's results (up to the
//!   order of additions), and its inline `exp` is within 1 ulp of libm in every lane and in the
//!   scalar tail.
//! - **Determinism.** Results are bit-identical on 1 and 4 threads.
//! - **Validation.** Malformed batches are rejected before any kernel runs.

use std::path::PathBuf;

use rlx_compiler::ir::{Elem, Graph};
use rlx_runtime::synthetic::{self, Spec};
use rlx_runtime::{
    evaluate, Batch, Column, Context, Kernel, Layout, Options, Outcome, PackedBatch, Precision,
};

mod common;

use common::agreement::{graph_of, kernel_cases, rounded, F32_TOLERANCE, F64_TOLERANCE};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn recipe_files() -> Vec<PathBuf> {
    common::agreement::recipe_files(&root())
}

fn extra_recipes() -> Vec<(String, String)> {
    kernel_cases(&root())
}

/// Differences between the interpreter's and the JIT's outcomes.
fn compare(expected: &Outcome, actual: &Outcome, tolerance: (f64, f64)) -> Vec<String> {
    common::agreement::compare(expected, actual, tolerance, "jit")
}

fn graph_of_source(name: &str, text: &str) -> Graph {
    let checked = rlx_compiler::check_source(name, text);
    let recipe = checked
        .recipe
        .unwrap_or_else(|| panic!("{name} does not check: {:?}", checked.diagnostics));
    rlx_compiler::compile_graph(&recipe, &[]).expect("lowers")
}

fn worst(e: &Outcome, a: &Outcome) -> f64 {
    let mut pairs: Vec<(f64, f64)> = Vec::new();
    pairs.extend(e.loss.zip(a.loss));
    pairs.extend(e.metrics.iter().zip(&a.metrics).map(|(x, y)| (x.1, y.1)));
    for (x, y) in [(&e.reward, &a.reward), (&e.advantage, &a.advantage)] {
        if let (Some(x), Some(y)) = (x, y) {
            pairs.extend(x.iter().copied().zip(y.iter().copied()));
        }
    }
    for (x, y) in e.gradients.iter().zip(&a.gradients) {
        pairs.extend(x.1.iter().copied().zip(y.1.iter().copied()));
    }
    pairs
        .iter()
        .map(|(x, y)| (x - y).abs() / x.abs().max(y.abs()).max(1e-300))
        .filter(|r| r.is_finite())
        .fold(0.0, f64::max)
}

fn specs() -> Vec<Spec> {
    let mut specs = Vec::new();
    for seed in 1..=4 {
        specs.push(Spec {
            seed,
            ..Spec::default()
        });
    }
    specs.push(Spec {
        groups: 6,
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

/// Run both backends on `batch` and report disagreements.
fn agree(
    label: &str,
    graph: &Graph,
    kernel: &Kernel,
    batch: &Batch,
    tolerance: (f64, f64),
    failures: &mut Vec<String>,
) {
    let batch = rounded(graph, batch);
    let context = Context {
        step: 3.0,
        progress: 0.25,
    };
    let expected = evaluate(graph, &batch, &context);
    let actual = kernel.run(&batch, &context);
    match (expected, actual) {
        (Ok(e), Ok(a)) => {
            if std::env::var_os("RLX_DEBUG_AGREE").is_some() {
                let worst = worst(&e, &a);
                eprintln!(
                    "{label}: ok, kept {}/{}, worst relative {worst:.2e}",
                    e.kept.iter().filter(|k| **k).count(),
                    e.kept.len()
                );
            }
            for difference in compare(&e, &a, tolerance) {
                failures.push(format!("{label}: {difference}"));
            }
        }
        (Err(e), Err(a)) => {
            if std::env::var_os("RLX_DEBUG_AGREE").is_some() {
                eprintln!("{label}: both fail: {e}");
            }
            // A kernel's non-finite output is explained by the interpreter in the executor's
            // finiteness check: then it is the interpreter's error, culprit included.
            if e != a {
                failures.push(format!(
                    "{label}: different errors: interp `{e}`, jit `{a}`"
                ));
            }
        }
        (Ok(_), Err(a)) => failures.push(format!("{label}: only the jit fails: {a}")),
        (Err(e), Ok(_)) => failures.push(format!("{label}: only the interpreter fails: {e}")),
    }
}

fn check_recipes(options: &Options, tolerance: (f64, f64)) {
    let mut failures = Vec::new();
    let mut checked = 0;
    for path in recipe_files() {
        let Some(graph) = graph_of(&path) else {
            continue;
        };
        let name = path
            .strip_prefix(root())
            .unwrap_or(&path)
            .display()
            .to_string();
        let kernel = Kernel::compile(&graph, options)
            .unwrap_or_else(|e| panic!("{name}: the JIT does not support it: {e}"));
        for spec in specs() {
            let batch = synthetic::batch(&graph, &spec);
            agree(
                &format!("{name} seed {}", spec.seed),
                &graph,
                &kernel,
                &batch,
                tolerance,
                &mut failures,
            );
        }
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} recipes found");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_recipe_agrees_with_the_interpreter_in_f64() {
    check_recipes(&Options::default(), F64_TOLERANCE);
}

#[test]
fn every_recipe_agrees_with_the_interpreter_in_f32_accumulation() {
    check_recipes(
        &Options {
            accumulate: Precision::F32,
            storage: Precision::F32,
        },
        F32_TOLERANCE,
    );
}

/// f32 arithmetic still sums in f64 (`plan::SUMS`): on a million tokens whose per-group sums
/// cancel, as a policy loss's do, the f32 kernel's loss and metric stay within 1e-6 of the f64
/// interpreter's. Sums accumulated in f32 lanes (the kernel before the change) were off by ~1e-5 here.
#[test]
fn f32_arithmetic_sums_a_million_tokens_in_f64() {
    let text = "input logp : f32[tok] policy\ninput score : f32[resp]\nreward = score\n\
                advantage = reward - mean(reward over resp)\n\
                loss = -mean(advantage * logp over tok, batch)\n\
                metric logp_sum = sum(logp over tok, batch)\n";
    let graph = graph_of_source("cancelling_sums", text);
    let (groups, n, tokens) = (64, 8, 2048);
    let layout = Layout::from_counts(
        &vec![n; groups],
        &vec![tokens; groups * n],
        &vec![0; groups],
        0,
    )
    .unwrap();
    let mut rng = synthetic::Rng::new(11);
    let logp: Vec<f64> = (0..groups * n * tokens)
        .map(|_| rng.range(-2.5, -0.2))
        .collect();
    let score: Vec<f64> = (0..groups * n)
        .map(|_| if rng.uniform() < 0.5 { 1.0 } else { -1.0 })
        .collect();
    let batch = rounded(
        &graph,
        &Batch {
            layout,
            inputs: vec![logp, score],
        },
    );
    let context = Context::default();
    let expected = evaluate(&graph, &batch, &context).unwrap();
    let kernel = Kernel::compile(
        &graph,
        &Options {
            accumulate: Precision::F32,
            storage: Precision::F32,
        },
    )
    .unwrap();
    let actual = kernel.run(&batch, &context).unwrap();
    let relative = |e: f64, a: f64| (e - a).abs() / e.abs();
    let (e, a) = (expected.loss.unwrap(), actual.loss.unwrap());
    assert!(
        relative(e, a) < 1e-6,
        "loss: interpreter {e}, f32 kernel {a}"
    );
    let (e, a) = (expected.metrics[0].1, actual.metrics[0].1);
    assert!(
        relative(e, a) < 1e-6,
        "metric: interpreter {e}, f32 kernel {a}"
    );
}

/// Every recipe of recipes/ and tests/gradients/, and every kernel case, by name.
fn all_sources() -> Vec<(String, Graph)> {
    let mut sources: Vec<(String, Graph)> = recipe_files()
        .iter()
        .filter_map(|p| graph_of(p).map(|g| (p.display().to_string(), g)))
        .collect();
    for (name, text) in &extra_recipes() {
        sources.push((name.to_string(), graph_of_source(name, text)));
    }
    sources
}

#[test]
fn inline_recipes_cover_the_remaining_ops() {
    let mut failures = Vec::new();
    for (name, text) in &extra_recipes() {
        let graph = graph_of_source(name, text);
        for (options, tolerance) in [
            (Options::default(), F64_TOLERANCE),
            (
                Options {
                    accumulate: Precision::F64,
                    storage: Precision::F64,
                },
                (1e-12, 1e-14),
            ),
        ] {
            let kernel =
                Kernel::compile(&graph, &options).unwrap_or_else(|e| panic!("{name}: {e}"));
            for spec in specs() {
                let batch = synthetic::batch(&graph, &spec);
                agree(
                    &format!(
                        "{name} seed {} storage {}",
                        spec.seed,
                        options.storage.name()
                    ),
                    &graph,
                    &kernel,
                    &batch,
                    tolerance,
                    &mut failures,
                );
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn filters_drop_responses_and_groups_like_the_interpreter() {
    for (name, text) in extra_recipes()
        .iter()
        .filter(|(name, _)| name.starts_with("keep_"))
    {
        filters_agree(name, text);
    }
}

fn filters_agree(name: &str, text: &str) {
    let graph = graph_of_source(name, text);
    let kernel = Kernel::compile(&graph, &Options::default()).unwrap();
    let mut partial = 0;
    for seed in 1..=12 {
        let spec = Spec {
            groups: 5,
            responses: 4,
            tokens: 6,
            seed,
            ..Spec::default()
        };
        let batch = rounded(&graph, &synthetic::batch(&graph, &spec));
        let expected = evaluate(&graph, &batch, &Context::default());
        let actual = kernel.run(&batch, &Context::default());
        match (expected, actual) {
            (Ok(e), Ok(a)) => {
                let differences = compare(&e, &a, F64_TOLERANCE);
                assert!(
                    differences.is_empty(),
                    "{name} seed {seed}: {differences:?}"
                );
                if e.kept.iter().any(|k| !k) {
                    partial += 1;
                }
            }
            (Err(e), Err(a)) => assert_eq!(e, a),
            (e, a) => panic!("{name} seed {seed}: interp {e:?}, jit {a:?}"),
        }
    }
    assert!(
        partial >= 3,
        "{name}: too few batches with dropped responses"
    );
}

/// Empty responses (no tokens) and zero-variance groups: the empty reductions and edge cases of the
/// interpreter's documentation.
#[test]
fn empty_responses_and_edge_cases_agree() {
    let cases = extra_recipes();
    let (_, text) = cases
        .iter()
        .find(|(name, _)| name == "keep_resp")
        .expect("the keep_resp case");
    let graph = graph_of_source("keep_resp", text);
    let kernel = Kernel::compile(&graph, &Options::default()).unwrap();
    let layout = Layout::from_counts(&[1, 3, 2], &[0, 2, 0, 3, 1, 0], &[], 0).unwrap();
    let tokens = layout.tokens();
    let batch = Batch {
        layout,
        inputs: vec![
            (0..tokens).map(|t| -0.5 - 0.1 * t as f64).collect(),
            vec![0.9, 0.2, 0.9, 0.4, 0.8, 0.8],
            (0..tokens).map(|t| (t % 2) as f64).collect(),
        ],
    };
    let batch = rounded(&graph, &batch);
    let expected = evaluate(&graph, &batch, &Context::default()).unwrap();
    let actual = kernel.run(&batch, &Context::default()).unwrap();
    let differences = compare(&expected, &actual, F64_TOLERANCE);
    assert!(differences.is_empty(), "{differences:?}");
    for path in recipe_files() {
        let Some(graph) = graph_of(&path) else {
            continue;
        };
        let kernel = Kernel::compile(&graph, &Options::default()).unwrap();
        // Lengths of 1: a single token per response.
        let spec = Spec {
            tokens: 1,
            ..Spec::default()
        };
        let batch = rounded(&graph, &synthetic::batch(&graph, &spec));
        let e = evaluate(&graph, &batch, &Context::default());
        let a = kernel.run(&batch, &Context::default());
        match (e, a) {
            (Ok(e), Ok(a)) => {
                let differences = compare(&e, &a, F64_TOLERANCE);
                assert!(
                    differences.is_empty(),
                    "{}: {differences:?}",
                    path.display()
                );
            }
            (Err(e), Err(a)) => assert_eq!(e, a, "{}", path.display()),
            (e, a) => panic!("{}: interp {e:?}, jit {a:?}", path.display()),
        }
    }
}

/// A batch over `layout` with values for every input of `graph` (as `synthetic::batch` fills them).
fn batch_for(graph: &Graph, layout: Layout, seed: u64) -> Batch {
    let geometry = rlx_runtime::Geometry::new(
        layout.clone(),
        graph.rubrics.iter().map(|r| r.criteria.len()).collect(),
    );
    let mut rng = synthetic::Rng::new(seed);
    let inputs = graph
        .inputs
        .iter()
        .map(|input| {
            (0..geometry.size(&input.shape))
                .map(|_| match input.elem {
                    Elem::Bool => f64::from(u8::from(rng.uniform() < 0.5)),
                    Elem::I32 => rng.int(0, 2) as f64,
                    Elem::F32 if input.name.contains("logp") => rng.range(-2.5, -0.2),
                    Elem::F32 => rng.range(0.0, 1.0),
                })
                .collect()
        })
        .collect();
    Batch { layout, inputs }
}

/// Empty groups, empty responses, singleton groups and a group without criteria, for every recipe.
#[test]
fn degenerate_layouts_agree() {
    let layouts = [
        Layout::from_counts(&[2, 0, 1, 3], &[0, 3, 2, 0, 4, 1], &[2, 0, 1, 3], 3).unwrap(),
        Layout::from_counts(&[1], &[0], &[1], 2).unwrap(),
        Layout::from_counts(&[0, 2], &[1, 1], &[0, 2], 1).unwrap(),
    ];
    let sources = all_sources();
    let mut failures = Vec::new();
    for (name, graph) in &sources {
        let kernel = Kernel::compile(graph, &Options::default()).unwrap();
        for (index, layout) in layouts.iter().enumerate() {
            let batch = batch_for(graph, layout.clone(), index as u64 + 1);
            agree(
                &format!("{name} layout {index}"),
                graph,
                &kernel,
                &batch,
                F64_TOLERANCE,
                &mut failures,
            );
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every hand-worked scoring case (tests/scores/), through the rollout reader: exact storage, so the
/// JIT must match the interpreter to rounding.
#[test]
fn scoring_cases_agree() {
    let mut failures = Vec::new();
    let mut stack = vec![root().join("tests/scores")];
    let mut count = 0;
    while let Some(folder) = stack.pop() {
        for entry in std::fs::read_dir(&folder).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let Some(name) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".expected.json"))
            else {
                continue;
            };
            let expected: serde_json::Value =
                match serde_json::from_str(&std::fs::read_to_string(&path).unwrap()) {
                    Ok(v) => v,
                    Err(_) => continue,
                };
            let recipe_path = match expected.get("recipe").and_then(|r| r.as_str()) {
                Some(relative) => root().join(relative),
                None => folder.join(format!("{name}.rlx")),
            };
            let Ok(checked) = rlx_compiler::check_path(&recipe_path) else {
                continue;
            };
            let Some(recipe) = checked.recipe else {
                continue;
            };
            let overrides: Vec<(String, f64)> = match expected.get("set") {
                Some(serde_json::Value::Object(set)) => set
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_f64().unwrap_or(f64::NAN)))
                    .collect(),
                _ => Vec::new(),
            };
            let Ok(graph) = rlx_compiler::compile_graph(&recipe, &overrides) else {
                continue;
            };
            let text =
                std::fs::read_to_string(folder.join(format!("{name}.jsonl"))).unwrap_or_default();
            let Ok(read) = rlx_runtime::rollouts::read_rollouts(&text, &recipe) else {
                continue;
            };
            let options = Options {
                accumulate: Precision::F64,
                storage: Precision::F64,
            };
            let kernel = match Kernel::compile(&graph, &options) {
                Ok(kernel) => kernel,
                Err(e) => {
                    failures.push(format!("{name}: no kernel: {e}"));
                    continue;
                }
            };
            let e = evaluate(&graph, &read.batch, &Context::default());
            let a = kernel.run(&read.batch, &Context::default());
            match (e, a) {
                (Ok(e), Ok(a)) => {
                    for d in compare(&e, &a, (1e-12, 1e-13)) {
                        failures.push(format!("{name}: {d}"));
                    }
                }
                (Err(e), Err(a)) => {
                    if e != a {
                        failures.push(format!("{name}: interp `{e}`, jit `{a}`"));
                    }
                }
                (e, a) => failures.push(format!("{name}: interp {e:?}, jit {a:?}")),
            }
            count += 1;
        }
    }
    assert!(count >= 6, "only {count} scoring cases");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn bits(outcome: &Outcome) -> Vec<u64> {
    let mut out: Vec<u64> = outcome.loss.iter().map(|l| l.to_bits()).collect();
    out.extend(outcome.metrics.iter().map(|(_, v)| v.to_bits()));
    for values in [&outcome.reward, &outcome.advantage].into_iter().flatten() {
        out.extend(values.iter().map(|v| v.to_bits()));
    }
    for (_, values) in &outcome.gradients {
        out.extend(values.iter().map(|v| v.to_bits()));
    }
    out
}

#[test]
fn results_are_bit_identical_for_one_and_four_threads() {
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let four = rayon::ThreadPoolBuilder::new()
        .num_threads(4)
        .build()
        .unwrap();
    let sources = all_sources();
    for accumulate in [Precision::F64, Precision::F32] {
        let options = Options {
            accumulate,
            storage: Precision::F32,
        };
        for (name, graph) in &sources {
            let kernel = Kernel::compile(graph, &options).unwrap();
            let spec = Spec {
                groups: 37,
                responses: 6,
                tokens: 30,
                seed: 5,
                ..Spec::default()
            };
            let batch = synthetic::batch(graph, &spec);
            let context = Context::default();
            let a = one.install(|| kernel.run(&batch, &context));
            let b = four.install(|| kernel.run(&batch, &context));
            match (a, b) {
                (Ok(a), Ok(b)) => {
                    assert_eq!(a.kept, b.kept, "{name}");
                    assert!(
                        bits(&a) == bits(&b),
                        "{name}: results differ across threads"
                    );
                }
                (Err(a), Err(b)) => assert_eq!(a, b),
                (a, b) => panic!("{name}: {a:?} vs {b:?}"),
            }
        }
    }
}

#[test]
fn malformed_batches_are_rejected_before_any_kernel_runs() {
    let path = root().join("recipes/grpo.rlx");
    let graph = graph_of(&path).expect("grpo checks");
    let kernel = Kernel::compile(&graph, &Options::default()).unwrap();
    let good = synthetic::batch(&graph, &Spec::default());
    assert!(kernel.run(&good, &Context::default()).is_ok());
    let launched = kernel.launches();
    let mut cases: Vec<(&str, Batch)> = Vec::new();
    let mut short = good.clone();
    short.inputs[0].pop();
    cases.push(("values, its shape", short));
    let mut long = good.clone();
    long.inputs[3].push(1.0);
    cases.push(("values, its shape", long));
    let mut missing = good.clone();
    missing.inputs.pop();
    cases.push(("input vectors", missing));
    let mut inconsistent = good.clone();
    *inconsistent.layout.group_offsets.last_mut().unwrap() += 1;
    cases.push(("group offsets cover", inconsistent));
    let mut decreasing = good.clone();
    decreasing.layout.token_offsets.swap(1, 2);
    cases.push(("must not decrease", decreasing));
    let mut past_end = good.clone();
    *past_end.layout.token_offsets.last_mut().unwrap() += 1000;
    cases.push(("values, its shape", past_end));
    let mut no_start = good.clone();
    no_start.layout.group_offsets[0] = 1;
    cases.push(("must start at 0", no_start));
    let mut crit = good.clone();
    crit.layout.crit_offsets.push(0);
    cases.push(("criterion offsets", crit));
    let mut empty = good.clone();
    empty.layout.token_offsets.clear();
    cases.push(("must start at 0", empty));
    let mut huge = good.clone();
    huge.inputs[0][0] = 1e300;
    cases.push(("beyond the range of f32", huge));
    for (wanted, batch) in cases {
        let error = kernel
            .run(&batch, &Context::default())
            .expect_err("malformed batch accepted");
        assert!(
            error.to_string().contains(wanted),
            "expected `{wanted}`: {error}"
        );
        assert!(error.to_string().starts_with("malformed batch"), "{error}");
    }
    // A packed batch in the wrong precision.
    let mut packed = kernel.pack(&good).unwrap();
    packed.inputs[0] = Column::F64(good.inputs[0].clone());
    let error = kernel.run_packed(&packed, &Context::default()).unwrap_err();
    assert!(error.to_string().contains("stored as f64"), "{error}");
    let packed = PackedBatch {
        layout: Layout {
            group_offsets: vec![0, 5],
            ..good.layout.clone()
        },
        inputs: kernel.pack(&good).unwrap().inputs,
    };
    assert!(kernel.run_packed(&packed, &Context::default()).is_err());
    assert_eq!(
        kernel.launches(),
        launched,
        "a kernel ran on a malformed batch"
    );
}

#[test]
fn non_finite_outputs_are_errors_like_the_interpreter() {
    let graph = graph_of_source(
        "nan",
        "input logp : f32[tok] policy
         input score : f32[resp]
         reward = log(score - 0.5)
         advantage = reward
         loss = mean(logp * score over tok, batch)",
    );
    let kernel = Kernel::compile(&graph, &Options::default()).unwrap();
    let batch = synthetic::batch(&graph, &Spec::default());
    let batch = rounded(&graph, &batch);
    let e = evaluate(&graph, &batch, &Context::default()).unwrap_err();
    let a = kernel.run(&batch, &Context::default()).unwrap_err();
    // The same output is not finite, and both errors name the node that made it: the executor's
    // finiteness check has the interpreter explain the kernel's.
    let (Some(interpreted), Some(compiled)) = (e.non_finite(), a.non_finite()) else {
        panic!("not both non-finite outputs: {e} / {a}");
    };
    assert!(interpreted.culprit.is_some() && compiled.culprit.is_some());
    assert_eq!(e, a);
}

#[test]
fn typical_recipes_compile_quickly() {
    for name in ["dapo.rlx", "grpo.rlx", "darling.rlx"] {
        let path = root().join("recipes").join(name);
        let Some(graph) = graph_of(&path) else {
            continue;
        };
        let kernel = Kernel::compile(&graph, &Options::default()).unwrap();
        // Reported, not asserted (timings depend on the machine and the build profile).
        eprintln!(
            "{name}: planned and compiled in {:.1} ms, {} token passes",
            kernel.compile_time().as_secs_f64() * 1e3,
            kernel.plan().token_passes()
        );
    }
}

/// The inline `exp` (fdlibm's algorithm, no call) against `f64::exp`: within 1 ulp over the whole range,
/// with the edge cases (overflow, underflow, subnormals, ±∞, NaN) of the libm function.
#[test]
fn inline_exp_matches_libm() {
    let graph = graph_of_source("exp", "input x : f32[resp]\nreward = exp(x)");
    let options = Options {
        accumulate: Precision::F64,
        storage: Precision::F64,
    };
    let kernel = Kernel::compile(&graph, &options).unwrap();
    let mut xs: Vec<f64> = vec![
        0.0,
        -0.0,
        1e-300,
        -1e-300,
        0.5,
        1.0,
        -1.0,
        709.78,
        709.782_712_893_384,
        709.782_712_893_385,
        710.0,
        1e10,
        -700.0,
        -708.4,
        -720.0,
        -745.0,
        -745.133_219_101_941_1,
        -746.0,
        -1e10,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
    ];
    let mut rng = synthetic::Rng::new(7);
    xs.extend((0..20_000).map(|_| rng.range(-750.0, 712.0)));
    xs.extend((0..20_000).map(|_| rng.range(-3.0, 3.0)));
    // A non-finite reward is an error (as in the interpreter): check those one by one.
    for x in xs.iter().filter(|x| !x.exp().is_finite()) {
        let single = Batch {
            layout: Layout::from_counts(&[1], &[0], &[], 0).unwrap(),
            inputs: vec![vec![*x]],
        };
        let error = kernel.run(&single, &Context::default()).unwrap_err();
        assert!(error.to_string().contains("reward"), "exp({x}): {error}");
    }
    let finite: Vec<f64> = xs.iter().copied().filter(|x| x.exp().is_finite()).collect();
    let layout = Layout::from_counts(&[finite.len()], &vec![0; finite.len()], &[], 0).unwrap();
    let batch = Batch {
        layout,
        inputs: vec![finite.clone()],
    };
    let outcome = kernel.run(&batch, &Context::default()).unwrap();
    let reward = outcome.reward.unwrap();
    for (x, got) in finite.iter().zip(&reward) {
        let expected = x.exp();
        let ulp = if expected == 0.0 {
            f64::from_bits(1)
        } else {
            (f64::from_bits(expected.abs().to_bits() + 1) - expected.abs()).abs()
        };
        assert!(
            (got - expected).abs() <= ulp,
            "exp({x}): {got} vs libm {expected}"
        );
    }
}

/// `exp` of token values goes through the vectorised loop (lanes) and its scalar tail: responses of 11
/// tokens (one step of four f64×2 or two f32×4 vectors, then a tail of 3). `loss = Σ exp(x)` has the gradient
/// exp(x) per token, stored in f64 (or f32) storage. Values are packed into batches whose sum stays
/// finite; a value whose exp overflows is an error.
#[test]
fn inline_exp_matches_libm_in_vector_lanes() {
    exp_in_vector_lanes(
        "input x : f32[tok] policy\nloss = sum(exp(x) over tok, batch)",
        1e300,
        (120, 2),
    );
}

/// The same where the argument is clamped to [−700, 700] by constants: the code then takes the table
/// form without range handling (`jit::range`, `Gen::exp_table`), within 1 ulp of libm inside the clamp
/// and nearly always equal to it (an error below 0.51 ulp; measured: 12 of 11,770 differ).
#[test]
fn inline_exp_of_a_clamped_argument_matches_libm() {
    exp_in_vector_lanes(
        "input x : f32[tok] policy\nloss = sum(exp(clamp(x, -700, 700)) over tok, batch)",
        700.0,
        (5, 2),
    );
}

/// Clamped to [−80, 80] (std/loss's `ratio` clamps to [−20, 20]): in f32 arithmetic the exp is then
/// computed in f32 (`Gen::exp_f32`: no f64 halves), within 1 ulp of `expf` but not correctly
/// rounded — measured: 630 of 6,676 values differ from glibc's `expf` by 1 ulp (as a float32 `exp`
/// of torch's vectorised kernels may); f64 takes the table form (7 of 6,676 differ).
#[test]
fn inline_exp_in_f32_arithmetic_matches_libm() {
    exp_in_vector_lanes(
        "input x : f32[tok] policy\nloss = sum(exp(clamp(x, -80, 80)) over tok, batch)",
        80.0,
        (5, 150),
    );
}

/// Check exp of token values `|x| ≤ within` (and the non-finite specials when unbounded): within 1 ulp
/// of libm, and at most `per_mille` (f64, f32) of them not equal to it.
fn exp_in_vector_lanes(source: &str, within: f64, per_mille: (usize, usize)) {
    let graph = graph_of_source("exp_tok", source);
    let mut rng = synthetic::Rng::new(9);
    let mut xs: Vec<f64> = vec![
        0.0,
        -0.0,
        1e-300,
        0.5,
        1.0,
        -1.0,
        709.78,
        -700.0,
        -708.4,
        -720.0,
        -745.0,
        -746.0,
        -1e10,
        f64::NEG_INFINITY,
    ];
    xs.extend((0..6_000).map(|_| rng.range(-750.0, 709.7)));
    xs.extend((0..6_000).map(|_| rng.range(-3.0, 3.0)));
    xs.retain(|x| x.abs() <= within);
    for accumulate in [Precision::F64, Precision::F32] {
        let storage = accumulate;
        let options = Options {
            accumulate,
            storage,
        };
        let kernel = Kernel::compile(&graph, &options).unwrap();
        let clif = Kernel::clif(&graph, &options).unwrap().join("\n");
        let lanes = if accumulate == Precision::F64 {
            "f64x2"
        } else {
            "f32x4"
        };
        assert!(clif.contains(lanes), "the token loop is not vectorised");
        let xs: Vec<f64> = match accumulate {
            Precision::F64 => xs.clone(),
            Precision::F32 => xs
                .iter()
                .map(|x| f64::from(*x as f32))
                .filter(|x| (*x as f32).exp().is_finite())
                .collect(),
        };
        // Batches whose Σ exp stays finite.
        let limit = if accumulate == Precision::F64 {
            1e307
        } else {
            1e37
        };
        let mut batches: Vec<Vec<f64>> = vec![Vec::new()];
        let mut total = 0.0;
        for x in &xs {
            let e = x.exp();
            if total + e > limit {
                batches.push(Vec::new());
                total = 0.0;
            }
            total += e;
            batches.last_mut().unwrap().push(*x);
        }
        let mut checked = 0;
        let mut differing = 0;
        for values in batches.iter().filter(|b| !b.is_empty()) {
            let lengths: Vec<usize> = values.chunks(11).map(|c| c.len()).collect();
            let layout = Layout::from_counts(&[lengths.len()], &lengths, &[], 0).unwrap();
            let batch = Batch {
                layout,
                inputs: vec![values.clone()],
            };
            let outcome = kernel.run(&batch, &Context::default()).unwrap();
            let (_, gradient) = &outcome.gradients[0];
            for (x, got) in values.iter().zip(gradient) {
                let (expected, ulp) = match accumulate {
                    Precision::F64 => {
                        let e = x.exp();
                        let ulp = if e == 0.0 {
                            f64::from_bits(1)
                        } else {
                            f64::from_bits(e.to_bits() + 1) - e
                        };
                        (e, ulp)
                    }
                    Precision::F32 => {
                        let e = (*x as f32).exp();
                        let ulp = if e == 0.0 {
                            f32::from_bits(1)
                        } else {
                            f32::from_bits(e.to_bits() + 1) - e
                        };
                        (f64::from(e), f64::from(ulp))
                    }
                };
                assert!(
                    (got - expected).abs() <= ulp,
                    "{accumulate:?}: exp({x}): {got} vs libm {expected}"
                );
                if *got != expected {
                    differing += 1;
                }
                checked += 1;
            }
        }
        assert_eq!(checked, xs.len());
        // Within 1 ulp always. f64: equal to libm's (glibc: correctly rounded in practice) in about
        // 90% of cases; measured: 1133 of 12013 differ (the Taylor/Estrin polynomial); fdlibm's
        // rational form, the code before it, differed in 1144 — the same accuracy. f32 (an f64
        // reduction and the polynomial to r⁸, rounded to f32): correctly rounded but for the rare
        // value within 0.004 ulp of a rounding boundary; measured: 5 of 9518 differ. One term less
        // (to r⁷, an error up to 0.09 ulp) misrounds 46 of 9518 and fails here (tried). The table form
        // (a clamped argument, `Gen::exp_table`): an error below 0.51 ulp; measured: 12 of 11770
        // differ in f64, 5 of 9309 in f32 (polynomial to r³).
        if std::env::var_os("RLX_DEBUG_AGREE").is_some() {
            eprintln!("{accumulate:?}: {differing} of {checked} differ from libm by 1 ulp");
        }
        let per_mille = if accumulate == Precision::F64 {
            per_mille.0
        } else {
            per_mille.1
        };
        assert!(
            differing * 1000 <= checked * per_mille,
            "{accumulate:?}: {differing} of {checked} differ from libm"
        );
    }
}

/// The vectorised token loops against the scalar code, on every recipe and kernel case: the same
/// results up to the order of additions (lanes are summed separately, then added in lane order).
#[test]
fn vectorised_and_scalar_code_agree() {
    let sources = all_sources();
    let mut failures = Vec::new();
    let mut scalar_only: Vec<String> = Vec::new();
    for (accumulate, tolerance) in [
        (Precision::F64, (1e-12, 1e-13)),
        (Precision::F32, (1e-5, 1e-6)),
    ] {
        let options = Options {
            accumulate,
            storage: Precision::F32,
        };
        for (name, graph) in &sources {
            let simd = Kernel::compile_with(graph, &options, true).unwrap();
            let scalar = Kernel::compile_with(graph, &options, false).unwrap();
            let lanes = if accumulate == Precision::F64 {
                "f64x2"
            } else {
                "f32x4"
            };
            if !Kernel::clif(graph, &options)
                .unwrap()
                .join("\n")
                .contains(lanes)
            {
                scalar_only.push(format!("{accumulate:?} {name}"));
            }
            for spec in specs() {
                let batch = synthetic::batch(graph, &spec);
                let context = Context::default();
                let label = format!("{name} {accumulate:?} seed {}", spec.seed);
                match (scalar.run(&batch, &context), simd.run(&batch, &context)) {
                    (Ok(e), Ok(a)) => {
                        for difference in compare(&e, &a, tolerance) {
                            failures.push(format!("{label}: {difference}"));
                        }
                    }
                    (Err(e), Err(a)) => assert_eq!(e, a, "{label}"),
                    (e, a) => failures.push(format!("{label}: scalar {e:?}, vector {a:?}")),
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Every kernel with a token loop vectorises except where all its token loops scan or `shift`:
    // the two recipes without token values, and the scan/shift cases.
    scalar_only.sort();
    let names: Vec<&str> = scalar_only
        .iter()
        .map(|n| n.rsplit(['/', ' ']).next().unwrap_or(n))
        .collect();
    assert_eq!(
        names,
        [
            "bt_reward_model.rlx",
            "healthbench.rlx",
            "scans",
            "bt_reward_model.rlx",
            "healthbench.rlx",
            "scans"
        ],
        "{scalar_only:?}"
    );
}

/// A random element-wise expression over token values (depth ≤ `depth`), as rlx source.
fn random_expression(rng: &mut synthetic::Rng, depth: usize) -> String {
    let leaf = |rng: &mut synthetic::Rng| -> String {
        match rng.int(0, 7) {
            0 => "x".into(),
            1 => "logp".into(),
            2 => "old_logp".into(),
            3 => "score".into(),
            4 => "token_index / 7".into(),
            _ => {
                let constants = ["0", "1", "-1", "0.5", "2", "20", "-20", "0.001", "3.5"];
                constants[rng.int(0, constants.len() - 1)].into()
            }
        }
    };
    if depth == 0 || rng.int(0, 5) == 0 {
        return leaf(rng);
    }
    let mut sub = || random_expression(rng, depth - 1);
    let (a, b) = (sub(), sub());
    let condition = |rng: &mut synthetic::Rng, a: &str, b: &str| -> String {
        let ops = ["<", ">", "<=", ">=", "==", "!="];
        let c = format!("({a} {} {b})", ops[rng.int(0, ops.len() - 1)]);
        match rng.int(0, 4) {
            0 => format!("(not {c})"),
            1 => format!("({c} and {a} > 0)"),
            2 => format!("({c} or {b} < 0)"),
            _ => c,
        }
    };
    match rng.int(0, 21) {
        0 => format!("({a} + {b})"),
        1 => format!("({a} - {b})"),
        2 => format!("({a} * {b})"),
        3 => format!("({a} / (abs({b}) + 0.5))"),
        4 => format!("min({a}, {b})"),
        5 => format!("max({a}, {b})"),
        6 => format!("clamp({a}, -3, 4)"),
        7 => {
            let c = condition(rng, &a, &b);
            format!("where({c}, {a}, {b})")
        }
        8 => format!("abs({a})"),
        9 => format!("sqrt(abs({a}))"),
        10 => format!("log(abs({a}) + 0.001)"),
        11 => format!("sigmoid({a})"),
        12 => format!("tanh({a})"),
        13 => format!("exp(clamp({a}, -20, 20))"),
        14 => format!("exp(min({a}, 5))"),
        15 => format!("({a}) ^ 2"),
        16 => format!("sign({a})"),
        17 => format!("floor({a})"),
        18 => format!("softplus({a})"),
        19 => format!("-({a})"),
        20 => format!("max({a}, 0.01) - min({b}, -0.01)"),
        _ => format!("exp(clamp({a}, -700, 700)) * 0.001"),
    }
}

/// Random element-wise token expressions (every op the vectoriser handles, NaN-ignoring min/max,
/// conditions with `and`/`or`/`not`, shims called lane by lane, outer values splatted): the
/// vectorised code agrees with the scalar code and with the interpreter, for loss, gradient and
/// sum/max/min/count reductions, on ragged batches (tails of every length).
#[test]
fn random_elementwise_expressions_agree() {
    let mut rng = synthetic::Rng::new(2026);
    let mut compiled = 0;
    let mut failures = Vec::new();
    for case in 0..60 {
        // `+ 0 * x` makes a constant or response-level expression a token value.
        let e = format!("{} + 0 * x", random_expression(&mut rng, 4));
        let f = format!("{} + 0 * x", random_expression(&mut rng, 3));
        let source = format!(
            "input logp : f32[tok] policy\ninput old_logp : f32[tok]\ninput score : f32[resp]\n\
             let x = logp - old_logp\n\
             loss = mean(({e}) * logp over tok, batch)\n\
             metric s = mean({f} over tok, batch)\n\
             metric hi = max({f} over tok, batch)\n\
             metric lo = min({e} over tok, batch)\n\
             metric c = mean(count({f} > 0 over tok) over batch)\n"
        );
        let checked = rlx_compiler::check_source("random", &source);
        let Some(recipe) = checked.recipe else {
            panic!(
                "case {case} does not check: {:?}\n{source}",
                checked.diagnostics
            );
        };
        let graph = rlx_compiler::compile_graph(&recipe, &[]).expect("lowers");
        compiled += 1;
        for accumulate in [Precision::F64, Precision::F32] {
            let options = Options {
                accumulate,
                storage: Precision::F32,
            };
            let simd = Kernel::compile_with(&graph, &options, true).unwrap();
            let scalar = Kernel::compile_with(&graph, &options, false).unwrap();
            let (interp_tolerance, scalar_tolerance) = match accumulate {
                Precision::F64 => (F64_TOLERANCE, (1e-12, 1e-13)),
                Precision::F32 => (F32_TOLERANCE, (1e-5, 1e-6)),
            };
            for spec in specs() {
                let batch = synthetic::batch(&graph, &spec);
                let label = format!("case {case} {accumulate:?} seed {}", spec.seed);
                let context = Context::default();
                match (scalar.run(&batch, &context), simd.run(&batch, &context)) {
                    (Ok(e), Ok(a)) => {
                        for difference in compare(&e, &a, scalar_tolerance) {
                            failures.push(format!("{label} (vs scalar): {difference}\n{source}"));
                        }
                    }
                    (Err(e), Err(a)) => {
                        if e != a {
                            failures.push(format!("{label}: scalar `{e}`, vector `{a}`"));
                        }
                    }
                    (e, a) => failures.push(format!(
                        "{label}: scalar {:?}, vector {:?}\n{source}",
                        e.err(),
                        a.err()
                    )),
                }
                if accumulate == Precision::F64 {
                    agree(
                        &label,
                        &graph,
                        &simd,
                        &batch,
                        interp_tolerance,
                        &mut failures,
                    );
                }
            }
        }
    }
    assert_eq!(compiled, 60);
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures[..failures.len().min(5)].join("\n")
    );
}

/// Recipe `state` (docs/language.md, "State across steps") on both backends: a state is a batch-level
/// input and its update the metric `state.NAME`, so each backend takes the state in and gives the
/// updated state out. Carried over six steps (each backend carrying its own values, as the trainer
/// does), an f32 EMA, an i32 counter and a bool flag agree with the interpreter at every step, and
/// the values move (the test would catch a state read as its initial value).
#[test]
fn state_is_carried_alike_by_the_interpreter_and_the_jit() {
    let source = r#"
input logp  : f32[tok] policy
input score : f32[resp]
param decay = 0.9
state baseline = 0.5 update decay * baseline + (1 - decay) * mean(score over batch)
state seen : i32 = 0 update seen + count(score > baseline over batch)
state high : bool = false update mean(score over batch) > baseline or high
advantage = score - baseline
loss = mean(-logp * advantage over tok, batch) + 0.01 * mean(logp over tok, batch) * where(high, 1, 0)
metric baseline_used = baseline
"#;
    let graph = graph_of_source("state.rlx", source);
    assert_eq!(graph.states.len(), 3);
    // f64 storage, as `rlx score` runs (with f32 storage a kernel reads an f32 state rounded to f32,
    // as every f32 input, and carried values drift apart by that rounding).
    let options = Options {
        accumulate: Precision::F64,
        storage: Precision::F64,
    };
    let kernel = Kernel::compile(&graph, &options).expect("compiles");
    let context = Context {
        step: 0.0,
        progress: 0.0,
    };
    let mut interp_state: Vec<f64> = graph.states.iter().map(|s| s.init).collect();
    let mut jit_state = interp_state.clone();
    assert_eq!(interp_state, vec![0.5, 0.0, 0.0]);
    let update = |outcome: &Outcome| -> Vec<f64> {
        graph
            .states
            .iter()
            .map(|s| {
                outcome
                    .metrics
                    .iter()
                    .find(|(n, _)| *n == s.metric)
                    .expect("update")
                    .1
            })
            .collect()
    };
    let mut seen_values = Vec::new();
    for step in 0..6u64 {
        let spec = Spec {
            seed: 40 + step,
            ..Spec::default()
        };
        let base = rounded(&graph, &synthetic::batch(&graph, &spec));
        let with_state = |values: &[f64]| {
            let mut batch = base.clone();
            for (info, value) in graph.states.iter().zip(values) {
                batch.inputs[info.input as usize] = vec![*value];
            }
            batch
        };
        let expected = evaluate(&graph, &with_state(&interp_state), &context).expect("interp");
        let actual = kernel.run(&with_state(&jit_state), &context).expect("jit");
        let differences = compare(&expected, &actual, F64_TOLERANCE);
        assert!(differences.is_empty(), "step {step}: {differences:?}");
        let used = expected
            .metrics
            .iter()
            .find(|(n, _)| n == "baseline_used")
            .expect("metric")
            .1;
        assert_eq!(
            used, interp_state[0],
            "step {step}: the step read its state"
        );
        interp_state = update(&expected);
        jit_state = update(&actual);
        for (a, b) in interp_state.iter().zip(&jit_state) {
            assert!(
                (a - b).abs() <= 1e-12 * a.abs().max(1.0),
                "step {step}: {interp_state:?} vs {jit_state:?}"
            );
        }
        seen_values.push(interp_state.clone());
    }
    assert!(
        seen_values.windows(2).all(|w| w[0][0] != w[1][0]),
        "the EMA moves: {seen_values:?}"
    );
    assert!(
        seen_values.last().expect("steps")[1] > 0.0,
        "the counter counts: {seen_values:?}"
    );
}
