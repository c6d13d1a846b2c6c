//! The recipe as a candle op (`rlx_trainer::op::RecipeOp`) against the same objective written in plain
//! candle ops (`benches/common/candle_objectives.rs`), for `recipes/dapo.rlx` and `recipes/darling.rlx`:
//!
//! - the candle formulas give the interpreter's loss, advantages, metrics and ∂loss/∂logp (f64, to
//!   1e-9) and the JIT's (f32 storage, to 1e-5 relative) on a ragged batch with a filtered group;
//! - a model parameter (a linear layer producing logp) receives the same gradient through
//!   `loss.backward()` via RecipeOp over the JIT, RecipeOp over the interpreter, and the plain candle
//!   objective.

#[path = "../benches/common/candle_objectives.rs"]
mod candle_objectives;

use std::path::PathBuf;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor, Var};
use candle_objectives::{Objective as CandleObjective, Padded};
use rlx_compiler::ir::Graph;
use rlx_runtime::synthetic::Rng;
use rlx_runtime::{evaluate, Batch, Context, Kernel, Layout, Options, Outcome};
use rlx_trainer::op::{Objective, RecipeOp};

const GROUPS: usize = 4;
const N: usize = 4;

fn graph(name: &str) -> Graph {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../recipes")
        .join(name);
    let checked = rlx_compiler::check_path(&path).expect("recipe readable");
    let recipe = checked.recipe.expect("recipe checks");
    rlx_compiler::compile_graph(&recipe, &[]).expect("recipe compiles")
}

/// An f32-representable value (so f32 storage loses nothing).
fn f32_exact(x: f64) -> f64 {
    f64::from(x as f32)
}

/// A ragged batch for `recipe` (`dapo` or `darling`); in DAPO the first group's scores are all equal,
/// so `keep group` drops it.
fn batch(recipe: &str, seed: u64) -> Batch {
    let mut rng = Rng::new(seed);
    let counts: Vec<usize> = (0..GROUPS * N).map(|_| rng.int(3, 12)).collect();
    let layout = Layout::from_counts(&[N; GROUPS], &counts, &[], 0).unwrap();
    let tokens = layout.tokens();
    let base: Vec<f64> = (0..tokens).map(|_| rng.range(-2.5, -0.2)).collect();
    let near = |rng: &mut Rng| -> Vec<f64> {
        base.iter()
            .map(|b| f32_exact(b + rng.range(-0.4, 0.4)))
            .collect()
    };
    let logp = near(&mut rng);
    let old_logp = near(&mut rng);
    let inputs = match recipe {
        "dapo" => {
            let score: Vec<f64> = (0..GROUPS * N)
                .map(|r| {
                    if r < N {
                        1.0
                    } else {
                        f32_exact(rng.range(-1.0, 1.0))
                    }
                })
                .collect();
            let mask: Vec<f64> = (0..tokens)
                .map(|_| if rng.uniform() < 0.8 { 1.0 } else { 0.0 })
                .collect();
            vec![logp, old_logp, score, mask]
        }
        "darling" => {
            let ref_logp = near(&mut rng);
            let quality: Vec<f64> = (0..GROUPS * N)
                .map(|_| f32_exact(rng.range(0.0, 1.0)))
                .collect();
            let cluster: Vec<f64> = (0..GROUPS * N).map(|_| rng.int(0, 2) as f64).collect();
            vec![logp, old_logp, ref_logp, quality, cluster]
        }
        other => panic!("unknown recipe {other}"),
    };
    Batch { layout, inputs }
}

fn counts(batch: &Batch) -> Vec<usize> {
    (0..batch.layout.responses())
        .map(|r| batch.layout.response_length(r))
        .collect()
}

/// The candle objective on `logp` (`[R, T]`, padded) and the batch's other inputs.
fn candle_objective(
    recipe: &str,
    logp: &Tensor,
    batch: &Batch,
    padded: &Padded,
    dtype: DType,
) -> CandleObjective {
    let device = Device::Cpu;
    let tok = |i: usize| padded.pad(&batch.inputs[i], dtype, &device).unwrap();
    let resp = |i: usize| {
        Tensor::from_vec(batch.inputs[i].clone(), batch.inputs[i].len(), &device)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
    };
    match recipe {
        "dapo" => candle_objectives::dapo(logp, &tok(1), &resp(2), &tok(3), padded).unwrap(),
        _ => {
            candle_objectives::darling(logp, &tok(1), &tok(2), &resp(3), &resp(4), padded).unwrap()
        }
    }
}

fn scalar(t: &Tensor) -> f64 {
    t.to_dtype(DType::F64).unwrap().to_scalar::<f64>().unwrap()
}

fn assert_close(what: &str, expected: &[f64], actual: &[f64], relative: f64, absolute: f64) {
    assert_eq!(expected.len(), actual.len(), "{what}: lengths");
    for (index, (e, a)) in expected.iter().zip(actual).enumerate() {
        let bound = relative * e.abs().max(a.abs()) + absolute;
        assert!(
            (e - a).abs() <= bound,
            "{what}[{index}]: expected {e}, got {a} (|Δ| = {:e} > {bound:e})",
            (e - a).abs()
        );
    }
}

/// The candle formulas vs the interpreter (f64) and the JIT (f32 storage, f64 accumulation).
fn candle_matches_the_recipe(recipe: &str) {
    let graph = graph(&format!("{recipe}.rlx"));
    let kernel = Kernel::compile(&graph, &Options::default()).unwrap();
    for seed in 1..=3 {
        let batch = batch(recipe, seed);
        let context = Context::default();
        let interp: Outcome = evaluate(&graph, &batch, &context).unwrap();
        let jit = kernel.run(&batch, &context).unwrap();
        if recipe == "dapo" {
            assert!(!interp.kept[0], "the first group is filtered");
            assert!(interp.kept[N], "the second group is kept");
        }
        let padded = Padded::new(GROUPS, N, &counts(&batch), DType::F64, &Device::Cpu).unwrap();
        let logp = Var::from_tensor(
            &padded
                .pad(&batch.inputs[0], DType::F64, &Device::Cpu)
                .unwrap(),
        )
        .unwrap();
        let objective = candle_objective(recipe, logp.as_tensor(), &batch, &padded, DType::F64);
        let loss = scalar(&objective.loss);
        let grads = objective.loss.backward().unwrap();
        let gradient = padded.unpad(grads.get(logp.as_tensor()).unwrap()).unwrap();
        let advantage = objective.advantage.to_vec1::<f64>().unwrap();
        let interp_gradient = &interp
            .gradients
            .iter()
            .find(|(n, _)| n == "logp")
            .unwrap()
            .1;
        let jit_gradient = &jit.gradients.iter().find(|(n, _)| n == "logp").unwrap().1;
        let what = format!("{recipe} seed {seed}");
        assert_close(
            &format!("{what} loss"),
            &[interp.loss.unwrap()],
            &[loss],
            1e-9,
            1e-12,
        );
        assert_close(
            &format!("{what} ∂loss/∂logp"),
            interp_gradient,
            &gradient,
            1e-9,
            1e-12,
        );
        assert_close(
            &format!("{what} advantage"),
            interp.advantage.as_ref().unwrap(),
            &advantage,
            1e-9,
            1e-12,
        );
        for (name, value) in &objective.metrics {
            let expected = interp.metrics.iter().find(|(n, _)| n == name).unwrap().1;
            assert_close(
                &format!("{what} metric {name}"),
                &[expected],
                &[scalar(value)],
                1e-9,
                1e-12,
            );
        }
        assert_close(
            &format!("{what} JIT loss"),
            &[jit.loss.unwrap()],
            &[loss],
            1e-5,
            1e-9,
        );
        assert_close(
            &format!("{what} JIT ∂loss/∂logp"),
            jit_gradient,
            &gradient,
            1e-5,
            1e-9,
        );
        assert!(
            gradient.iter().any(|g| *g != 0.0),
            "{what}: a gradient flows"
        );
    }
}

#[test]
fn candle_dapo_matches_the_interpreter_and_the_jit() {
    candle_matches_the_recipe("dapo");
}

#[test]
fn candle_darling_matches_the_interpreter_and_the_jit() {
    candle_matches_the_recipe("darling");
}

/// d(loss)/d(w) of a linear layer producing every token's logp, `logp_t = x_t · w − 1.2`, through
/// `route`: a closure from the packed logp tensor to the loss.
fn parameter_gradient(batch: &Batch, route: impl Fn(&Tensor) -> Tensor) -> (f64, Vec<f32>) {
    let device = Device::Cpu;
    let tokens = batch.layout.tokens();
    let features = 6;
    let mut rng = Rng::new(7);
    let x: Vec<f32> = (0..tokens * features)
        .map(|_| rng.range(-0.5, 0.5) as f32)
        .collect();
    let x = Tensor::from_vec(x, (tokens, features), &device).unwrap();
    let w: Vec<f32> = (0..features).map(|i| 0.1 * (i as f32 - 2.5)).collect();
    let w = Var::from_tensor(&Tensor::from_vec(w, (features, 1), &device).unwrap()).unwrap();
    let logp = x
        .matmul(w.as_tensor())
        .unwrap()
        .squeeze(1)
        .unwrap()
        .affine(1.0, -1.2)
        .unwrap();
    let loss = route(&logp);
    let grads = loss.backward().unwrap();
    let gradient = grads
        .get(w.as_tensor())
        .expect("the parameter receives a gradient")
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    (scalar(&loss), gradient)
}

fn model_gradients_agree(recipe: &str) {
    let graph = graph(&format!("{recipe}.rlx"));
    let batch = batch(recipe, 11);
    let context = Context::default();
    let through_op = |objective: Arc<Objective>| {
        parameter_gradient(&batch, |logp| {
            let op = RecipeOp::new(objective.clone(), batch.clone(), "logp", context).unwrap();
            op.apply(logp).unwrap().0
        })
    };
    let jit = through_op(Arc::new(Objective::kernel(&graph).unwrap()));
    let interp = through_op(Arc::new(Objective::interpreter(graph.clone())));
    let counts = counts(&batch);
    let padded = Padded::new(GROUPS, N, &counts, DType::F32, &Device::Cpu).unwrap();
    let plain = parameter_gradient(&batch, |logp| {
        // Packed → padded inside the graph, so the gradient flows back through the padding.
        let t = padded.t;
        let mut index = vec![batch.layout.tokens() as u32; counts.len() * t];
        let mut start = 0;
        for (r, &count) in counts.iter().enumerate() {
            for k in 0..count {
                index[r * t + k] = (start + k) as u32;
            }
            start += count;
        }
        let index = Tensor::from_vec(index, counts.len() * t, &Device::Cpu).unwrap();
        let zero = Tensor::zeros(1, DType::F32, &Device::Cpu).unwrap();
        let padded_logp = Tensor::cat(&[logp, &zero], 0)
            .unwrap()
            .index_select(&index, 0)
            .unwrap()
            .reshape((counts.len(), t))
            .unwrap();
        candle_objective(recipe, &padded_logp, &batch, &padded, DType::F32).loss
    });
    let as_f64 = |g: &[f32]| g.iter().map(|x| f64::from(*x)).collect::<Vec<_>>();
    let scale = as_f64(&interp.1).iter().fold(0f64, |m, g| m.max(g.abs()));
    assert!(
        scale > 0.0,
        "{recipe}: the parameter's gradient is not zero"
    );
    assert_close(
        &format!("{recipe} loss jit/interp"),
        &[interp.0],
        &[jit.0],
        1e-5,
        1e-7,
    );
    assert_close(
        &format!("{recipe} loss candle/interp"),
        &[interp.0],
        &[plain.0],
        1e-5,
        1e-7,
    );
    assert_close(
        &format!("{recipe} ∂loss/∂w jit vs interp"),
        &as_f64(&interp.1),
        &as_f64(&jit.1),
        1e-5,
        1e-6 * scale,
    );
    assert_close(
        &format!("{recipe} ∂loss/∂w candle vs interp"),
        &as_f64(&interp.1),
        &as_f64(&plain.1),
        1e-4,
        1e-5 * scale,
    );
}

#[test]
fn a_model_parameter_gets_the_same_gradient_through_every_route_dapo() {
    model_gradients_agree("dapo");
}

#[test]
fn a_model_parameter_gets_the_same_gradient_through_every_route_darling() {
    model_gradients_agree("darling");
}

/// On a GPU the op reads the argument where candle holds it, and copies it to the host only for a
/// recipe that reads it there (`RecipeOp::needs_host_values`): a `keep` recipe (its kept phase is
/// gathered on the host) or f64 storage (uploaded from the host column); not GRPO in f32.
#[test]
fn the_gpu_path_copies_the_argument_to_the_host_only_for_recipes_that_read_it_there() {
    use rlx_runtime::synthetic::{self, Spec};
    use rlx_runtime::Precision;
    let f32_storage = Options::default();
    let f64_storage = Options {
        storage: Precision::F64,
        accumulate: Precision::F64,
    };
    for (name, options, expected) in [
        ("grpo.rlx", &f32_storage, false),
        ("dapo.rlx", &f32_storage, true),
        ("grpo.rlx", &f64_storage, true),
    ] {
        let graph = graph(name);
        let kernel = Kernel::compile(&graph, options).unwrap();
        let batch = synthetic::batch(&graph, &Spec::default());
        let objective = Arc::new(Objective::interpreter(graph.clone()));
        let op = RecipeOp::new(objective, batch, "logp", Context::default()).unwrap();
        assert_eq!(
            op.needs_host_values(&kernel),
            expected,
            "{name}, {:?} storage",
            options.storage
        );
    }
}
