//! The trainer: the recipe op's gradient against plain candle, the model's gradients against finite
//! differences, micro-batching that does not change the gradient, a short training run that raises the
//! reward (with its metrics and plot), determinism, and a NaN that stops the run.

use std::path::Path;
use std::sync::Arc;

use candle_core::{Device, Tensor};
use rlx_runtime::{Batch, Context, Layout};
use rlx_trainer::cli::{prepare, RunArgs};
use rlx_trainer::model::{Model, ModelConfig};
use rlx_trainer::op::{Objective, RecipeOp};
use rlx_trainer::train::{completion_logp, completion_policy, loss_and_gradients};

fn recipe(path: &str) -> rlx_compiler::hir::Recipe {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let checked = rlx_compiler::check_path(&root.join(path)).expect("recipe readable");
    checked.recipe.expect("recipe checks")
}

fn tiny() -> ModelConfig {
    ModelConfig {
        vocab: 17,
        hidden: 16,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        intermediate: 24,
        rope_theta: 10000.0,
        rms_eps: 1e-5,
        max_positions: 32,
        init_std: 0.3,
        head_dim: None,
        attention_bias: false,
        qk_norm: false,
        rope_scaling: None,
    }
}

/// Two groups of prompts with ragged completions.
fn rollouts() -> (Vec<Vec<u32>>, Vec<Vec<u32>>, Vec<usize>) {
    let prompts = vec![
        vec![3, 12, 4, 15],
        vec![3, 12, 4, 15],
        vec![3, 12, 4, 15],
        vec![5, 6, 12, 7, 15],
        vec![5, 6, 12, 7, 15],
        vec![5, 6, 12, 7, 15],
    ];
    let completions = vec![
        vec![7, 1],
        vec![8, 9, 1],
        vec![2],
        vec![4, 4, 4, 1],
        vec![6, 1],
        vec![9, 9, 1],
    ];
    (prompts, completions, vec![3, 3])
}

#[test]
fn the_recipe_op_gradient_equals_the_plain_candle_objective() {
    let device = Device::Cpu;
    let model = Model::new(&tiny(), 7, &device).unwrap();
    let (prompts, completions, groups) = rollouts();
    let scores = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0];
    let hir = recipe("recipes/grpo.rlx");
    let graph = rlx_compiler::compile_graph(&hir, &[("beta".into(), 0.0)]).unwrap();
    let lengths: Vec<usize> = completions.iter().map(Vec::len).collect();
    let layout = Layout::from_counts(&groups, &lengths, &[], 0).unwrap();

    // Ratio 1: old_logp = ref_logp = the current logp.
    let logp = completion_logp(&model, &prompts, &completions, &device).unwrap();
    let values: Vec<f64> = logp
        .to_vec1::<f32>()
        .unwrap()
        .into_iter()
        .map(f64::from)
        .collect();
    let inputs = graph
        .inputs
        .iter()
        .map(|i| match i.name.as_str() {
            "score" => scores.to_vec(),
            _ => values.clone(),
        })
        .collect();
    let batch = Batch { layout, inputs };
    let objective = Arc::new(Objective::interpreter(graph));
    let op = RecipeOp::new(objective, batch, "logp", Context::default()).unwrap();
    let (loss, outcome) = op.apply(&logp).unwrap();
    let grads = loss.backward().unwrap();

    // GRPO advantages by hand: z-score within each group (Bessel, ε = 1e-6).
    let mut advantage = Vec::new();
    for group in scores.chunks(3) {
        let mean = group.iter().sum::<f64>() / 3.0;
        let std = (group.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / 2.0).sqrt();
        advantage.extend(group.iter().map(|s| (s - mean) / (std + 1e-6)));
    }
    for (a, b) in advantage.iter().zip(outcome.advantage.as_ref().unwrap()) {
        assert!((a - b).abs() < 1e-9, "advantage {a} vs the recipe's {b}");
    }
    // The same objective in plain candle: −mean over tokens of A·logp.
    let per_token: Vec<f32> = advantage
        .iter()
        .zip(&lengths)
        .flat_map(|(a, l)| std::iter::repeat_n(*a as f32, *l))
        .collect();
    let a = Tensor::new(per_token.as_slice(), &device).unwrap();
    let plain_logp = completion_logp(&model, &prompts, &completions, &device).unwrap();
    let plain = (plain_logp * a).unwrap().mean_all().unwrap().neg().unwrap();
    // At ratio 1 the surrogate's value is −mean(A) (its gradient is that of −mean(A·logp)).
    let total: usize = lengths.iter().sum();
    let expected = -per_token.iter().map(|a| *a as f64).sum::<f64>() / total as f64;
    assert!((loss.to_scalar::<f32>().unwrap() as f64 - expected).abs() < 1e-5);
    let plain_grads = plain.backward().unwrap();

    let mut compared = 0;
    for (name, var) in model.vars() {
        let ours = grads
            .get(var.as_tensor())
            .expect("gradient reaches every weight");
        let theirs = plain_grads.get(var.as_tensor()).unwrap();
        let difference = (ours - theirs)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        let scale = theirs
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(scale > 0.0, "{name} gets a zero gradient");
        assert!(
            difference <= 1e-4 * scale.max(1.0),
            "{name}: op gradient differs from plain candle by {difference} (scale {scale})"
        );
        compared += 1;
    }
    assert_eq!(compared, model.vars().len());
}

#[test]
fn every_weight_gets_a_gradient_that_finite_differences_confirm() {
    let device = Device::Cpu;
    let model = Model::new(&tiny(), 3, &device).unwrap();
    let (prompts, completions, _) = rollouts();
    let objective = |m: &Model| -> f64 {
        completion_logp(m, &prompts, &completions, &device)
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap() as f64
    };
    let loss = completion_logp(&model, &prompts, &completions, &device)
        .unwrap()
        .sum_all()
        .unwrap();
    let grads = loss.backward().unwrap();
    for (name, var) in model.vars() {
        let g = grads
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("{name} gets no gradient"));
        let norm = g
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(
            norm > 0.0 && norm.is_finite(),
            "{name}: gradient norm {norm}"
        );
    }
    // Central differences on the largest-gradient element of a few weights.
    for wanted in [
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.1.input_layernorm.weight",
        "model.layers.1.mlp.down_proj.weight",
        "lm_head.weight",
    ] {
        let (_, var) = model.vars().iter().find(|(n, _)| n == wanted).unwrap();
        let g: Vec<f32> = grads
            .get(var.as_tensor())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let index = (0..g.len())
            .max_by(|a, b| g[*a].abs().total_cmp(&g[*b].abs()))
            .unwrap();
        let original = var
            .as_tensor()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let shape = var.as_tensor().shape().clone();
        let eps = 1e-2f32;
        let at = |delta: f32| {
            let mut values = original.clone();
            values[index] += delta;
            var.set(&Tensor::from_vec(values, shape.clone(), &device).unwrap())
                .unwrap();
            objective(&model)
        };
        let numeric = (at(eps) - at(-eps)) / (2.0 * eps as f64);
        at(0.0);
        let analytic = g[index] as f64;
        assert!(
            (numeric - analytic).abs() <= 0.02 * analytic.abs() + 1e-3,
            "{wanted}[{index}]: finite difference {numeric} vs gradient {analytic}"
        );
    }
}

/// Rows that share a prompt run it once (`completion_policy`'s shared prefix); the same rows
/// interleaved (no two consecutive alike) run whole. Both give the same log-probs and entropies and
/// the same gradient of every weight.
#[test]
fn the_shared_prefix_pass_equals_the_whole_rows() {
    let device = Device::Cpu;
    let mut config = tiny();
    config.qk_norm = true;
    let model = Model::new(&config, 11, &device).unwrap();
    let (prompts, completions, _) = rollouts();
    // Rows 0..3 share prompt A, rows 3..6 prompt B; interleaved: A B A B A B.
    let order = [0usize, 3, 1, 4, 2, 5];
    let interleaved_prompts: Vec<Vec<u32>> = order.iter().map(|&r| prompts[r].clone()).collect();
    let interleaved: Vec<Vec<u32>> = order.iter().map(|&r| completions[r].clone()).collect();
    let weights = |rows: &[usize]| -> Vec<f32> {
        rows.iter()
            .flat_map(|&r| {
                (0..completions[r].len()).flat_map(move |k| [0.3 + r as f32 - 0.1 * k as f32, -0.7])
            })
            .collect()
    };
    let run = |p: &[Vec<u32>], c: &[Vec<u32>], rows: &[usize]| {
        let values = completion_policy(&model, p, c, &device).unwrap();
        let w = weights(rows);
        let n = w.len() / 2;
        let loss = (&values * Tensor::from_vec(w, (n, 2), &device).unwrap())
            .unwrap()
            .sum_all()
            .unwrap();
        let grads = loss.backward().unwrap();
        let values = values.to_vec2::<f32>().unwrap();
        // Per row, its tokens' (logp, entropy).
        let mut per_row = vec![Vec::new(); rows.len()];
        let mut at = 0;
        for &r in rows {
            per_row[r] = values[at..at + completions[r].len()].to_vec();
            at += completions[r].len();
        }
        let grads: Vec<Vec<f32>> = model
            .vars()
            .iter()
            .map(|(_, v)| {
                grads
                    .get(v.as_tensor())
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap()
            })
            .collect();
        (per_row, grads)
    };
    let (shared, shared_grads) = run(&prompts, &completions, &[0, 1, 2, 3, 4, 5]);
    let (whole, whole_grads) = run(&interleaved_prompts, &interleaved, &order);
    let mut worst = 0f32;
    for (a, b) in shared.iter().flatten().zip(whole.iter().flatten()) {
        for (x, y) in a.iter().zip(b) {
            worst = worst.max((x - y).abs());
        }
    }
    assert!(worst <= 1e-5, "values differ by {worst}");
    for ((name, _), (a, b)) in model
        .vars()
        .iter()
        .zip(shared_grads.iter().zip(&whole_grads))
    {
        let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-3);
        let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(
            diff <= 1e-4 * scale,
            "{name}: gradients differ by {diff} (largest {scale})"
        );
    }
}

/// `Model::merged_view` (LoRA adapters merged into their weights, for sampling and the reference)
/// gives the unmerged forward's values, and it is a snapshot: it does not see a later update.
#[test]
fn the_merged_view_of_a_lora_model_equals_its_unmerged_forward() {
    let device = Device::Cpu;
    let base = Model::new(&tiny(), 5, &device).unwrap();
    let lora = rlx_trainer::model::LoraConfig {
        rank: 4,
        alpha: 8.0,
        dropout: 0.0,
        targets: ["q", "k", "v", "o", "gate", "up", "down"]
            .map(String::from)
            .to_vec(),
    };
    let model = base.with_lora(&lora, 3).unwrap();
    let mut rng = rlx_trainer::rng::Rng::new(11);
    let set_adapters = |rng: &mut rlx_trainer::rng::Rng| {
        for (_, var) in model.vars() {
            let values: Vec<f32> = (0..var.elem_count())
                .map(|_| (rng.normal() * 0.2) as f32)
                .collect();
            var.set(&Tensor::from_vec(values, var.shape(), &device).unwrap())
                .unwrap();
        }
    };
    set_adapters(&mut rng);
    let (prompts, completions, _) = rollouts();
    let values = |m: &Model| -> Vec<f32> {
        completion_logp(m, &prompts, &completions, &device)
            .unwrap()
            .to_vec1()
            .unwrap()
    };
    let unmerged = values(&model.no_grad());
    let merged_view = model.merged_view().unwrap();
    let merged = values(&merged_view);
    assert!(!merged_view.tracks_gradients());
    let worst = unmerged
        .iter()
        .zip(&merged)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        worst <= 1e-4,
        "merged and unmerged log-probs differ by {worst}"
    );
    // The adapters change: the unmerged forward sees it, the view made before does not.
    set_adapters(&mut rng);
    assert_eq!(values(&merged_view), merged);
    let after = values(&model.no_grad());
    assert!(after.iter().zip(&merged).any(|(a, b)| (a - b).abs() > 1e-3));
    let remerged = values(&model.merged_view().unwrap());
    let worst = after
        .iter()
        .zip(&remerged)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(worst <= 1e-4, "after the change: {worst}");
}

fn args(sets: &[&str]) -> RunArgs {
    RunArgs {
        recipe_name: "grpo".into(),
        sets: sets.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn out_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("rlx-train-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn micro_batching_gives_the_whole_batch_gradient() {
    let device = Device::Cpu;
    let model = Model::new(&tiny(), 11, &device).unwrap();
    let (prompts, completions, groups) = rollouts();
    let scores = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0];
    let hir = recipe("recipes/grpo.rlx");
    let graph = rlx_compiler::compile_graph(&hir, &[("beta".into(), 0.1)]).unwrap();
    let lengths: Vec<usize> = completions.iter().map(Vec::len).collect();
    let layout = Layout::from_counts(&groups, &lengths, &[], 0).unwrap();
    let logp: Vec<f64> = completion_logp(&model, &prompts, &completions, &device)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .into_iter()
        .map(f64::from)
        .collect();
    // old_logp and ref_logp away from the current logp, so that ratios clip and the KL term is live.
    let inputs = graph
        .inputs
        .iter()
        .map(|i| match i.name.as_str() {
            "score" => scores.to_vec(),
            "old_logp" => logp
                .iter()
                .enumerate()
                .map(|(k, l)| l + 0.3 * (k as f64).sin())
                .collect(),
            "ref_logp" => logp.iter().map(|l| l - 0.2).collect(),
            _ => logp.clone(),
        })
        .collect();
    let batch = Batch { layout, inputs };
    let objective = Arc::new(Objective::interpreter(graph));
    let gradients = |micro: usize, current: bool| {
        let (outcome, grads) = loss_and_gradients(
            &model,
            &objective,
            &batch,
            "logp",
            Context::default(),
            &prompts,
            &completions,
            micro,
            current,
            &device,
        )
        .unwrap();
        (outcome.loss.unwrap(), grads)
    };
    let (loss_all, all) = gradients(0, false);
    assert!(all.norm() > 1e-3, "a non-trivial gradient: {}", all.norm());
    // The batch's logp input is the model's own (computed above), so skipping the forward-only pass
    // (`batch_is_current`, the first epoch) gives the same gradient too.
    for (micro, current) in [
        (1, false),
        (2, false),
        (4, false),
        (6, false),
        (2, true),
        (4, true),
    ] {
        let (loss, grads) = gradients(micro, current);
        assert!(
            (loss - loss_all).abs() < 1e-6,
            "micro-batch {micro} ({current}): loss {loss} vs {loss_all}"
        );
        for ((name, _), (a, b)) in model
            .vars()
            .iter()
            .zip(all.values.iter().zip(&grads.values))
        {
            let (a, b) = (a.as_ref().unwrap(), b.as_ref().unwrap());
            let scale = a.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
            let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(
                diff <= 1e-5 * scale.max(1.0),
                "micro-batch {micro} ({current}): {name} differs by {diff} (scale {scale})"
            );
        }
    }

    // The naive scheme — the recipe evaluated on each micro-batch (here each group) alone and the
    // gradients summed — is not the same gradient (the token mean changes), which is why the loop does
    // not do that.
    let tokens_first: usize = lengths[..3].iter().sum();
    let part = |responses: std::ops::Range<usize>, tokens: std::ops::Range<usize>| {
        let layout = Layout::from_counts(&[3], &lengths[responses.clone()], &[], 0).unwrap();
        let inputs = batch
            .inputs
            .iter()
            .zip(&objective.graph().inputs)
            .map(|(values, input)| match input.name.as_str() {
                "score" => values[responses.clone()].to_vec(),
                _ => values[tokens.clone()].to_vec(),
            })
            .collect();
        let (_, grads) = loss_and_gradients(
            &model,
            &objective,
            &Batch { layout, inputs },
            "logp",
            Context::default(),
            &prompts[responses.clone()],
            &completions[responses],
            0,
            false,
            &device,
        )
        .unwrap();
        grads
    };
    let total_tokens: usize = lengths.iter().sum();
    let mut naive = part(0..3, 0..tokens_first);
    let second = part(3..6, tokens_first..total_tokens);
    for (a, b) in naive.values.iter_mut().zip(&second.values) {
        for (x, y) in a.as_mut().unwrap().iter_mut().zip(b.as_ref().unwrap()) {
            *x += y;
        }
    }
    let mut difference = all.clone();
    for (a, b) in difference.values.iter_mut().zip(&naive.values) {
        for (x, y) in a.as_mut().unwrap().iter_mut().zip(b.as_ref().unwrap()) {
            *x -= y;
        }
    }
    assert!(
        difference.norm() > 0.1 * all.norm(),
        "the naive per-micro-batch gradient should differ: {} vs {}",
        difference.norm(),
        all.norm()
    );
}

fn small_run(name: &str, sets: &[&str]) -> (rlx_trainer::train::Summary, std::path::PathBuf) {
    let out = out_dir(name);
    let mut run_args = args(sets);
    run_args.out = Some(out.clone());
    let prepared = prepare(&recipe("recipes/grpo.rlx"), &run_args).unwrap();
    let summary =
        rlx_trainer::train::run(prepared.plan, &prepared.config, &prepared.out, |_| {}).unwrap();
    (summary, out)
}

fn metrics(out: &Path) -> Vec<serde_json::Map<String, serde_json::Value>> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| match serde_json::from_str(l).unwrap() {
            serde_json::Value::Object(map) => map,
            other => panic!("not an object: {other}"),
        })
        .collect()
}

fn without_timings(
    mut lines: Vec<serde_json::Map<String, serde_json::Value>>,
) -> Vec<serde_json::Map<String, serde_json::Value>> {
    for line in &mut lines {
        for key in rlx_trainer::train::TIMING_KEYS {
            assert!(line.remove(key).is_some(), "{key} is in every line");
        }
    }
    lines
}

const SMALL: [&str; 8] = [
    "steps=4",
    "sft.steps=20",
    "sft.batch=16",
    "train.prompts_per_step=4",
    "task.eval_questions=20",
    "train.eval_every=2",
    "train.epochs=2",
    "train.micro_batch=8",
];

#[test]
fn two_runs_with_the_same_seed_write_the_same_metrics() {
    let (a, out_a) = small_run("same-a", &SMALL);
    let (b, out_b) = small_run("same-b", &SMALL);
    assert_eq!(a.rewards, b.rewards);
    let (ma, mb) = (
        without_timings(metrics(&out_a)),
        without_timings(metrics(&out_b)),
    );
    assert_eq!(ma.len(), 4);
    assert_eq!(ma, mb);
    // Another seed gives another run.
    let mut other = SMALL.to_vec();
    other.push("seed=1");
    let (_, out_c) = small_run("same-c", &other);
    assert_ne!(without_timings(metrics(&out_c)), ma);
    for out in [out_a, out_b, out_c] {
        let _ = std::fs::remove_dir_all(out);
    }
}

/// The fused kernel (the default backend) and the interpreter (the oracle) train alike: a short run with
/// each writes the same metrics at every step, within a relative 1e-4 (the kernel stores f32 and
/// accumulates in f64, the interpreter is f64 throughout), and the summary names the backend used.
#[test]
fn the_jit_and_the_interpreter_give_the_same_training_metrics() {
    assert_eq!(rlx_trainer::Config::default_config().backend, "jit");
    let mut interp = SMALL.to_vec();
    interp.push("backend=interp");
    let (_, out_jit) = small_run("backend-jit", &SMALL);
    let (_, out_interp) = small_run("backend-interp", &interp);
    let summary = |out: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap()
    };
    assert_eq!(summary(&out_jit)["objective"], "jit");
    assert_eq!(summary(&out_interp)["objective"], "interp");
    let (jit, interp) = (
        without_timings(metrics(&out_jit)),
        without_timings(metrics(&out_interp)),
    );
    assert_eq!(jit.len(), 4);
    for (a, b) in jit.iter().zip(&interp) {
        assert_eq!(
            a.keys().collect::<Vec<_>>(),
            b.keys().collect::<Vec<_>>(),
            "step {}",
            a["step"]
        );
        for (key, x) in a {
            let (x, y) = (x.as_f64().unwrap(), b[key].as_f64().unwrap());
            assert!(
                (x - y).abs() <= 1e-4 * x.abs().max(1.0),
                "step {}: {key} = {x} (jit) vs {y} (interp)",
                a["step"]
            );
        }
    }
    for out in [out_jit, out_interp] {
        let _ = std::fs::remove_dir_all(out);
    }
}

#[test]
fn a_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint() {
    // lr = 1e30: the first update leaves weights of ~1e30, whose activations overflow at step 1.
    let out = out_dir("nan");
    let mut sets = SMALL.to_vec();
    sets.extend([
        "train.lr=1e30",
        "train.epochs=1",
        "train.checkpoint_every=1",
        "train.eval_every=0",
    ]);
    let mut run_args = args(&sets);
    run_args.out = Some(out.clone());
    let prepared = prepare(&recipe("recipes/grpo.rlx"), &run_args).unwrap();
    let message =
        match rlx_trainer::train::run(prepared.plan, &prepared.config, &prepared.out, |_| {}) {
            Ok(_) => panic!("a run with lr = 1e30 should stop"),
            Err(message) => message,
        };
    let expected_tail = format!(
        "; the run stopped before the update; the last good checkpoint (after step 1) is in {}",
        out.join("checkpoint").display()
    );
    assert!(message.starts_with("step 1 (epoch 0): "), "{message}");
    assert!(message.ends_with(&expected_tail), "{message}");
    assert!(
        message.contains("NaN") || message.contains("inf"),
        "{message}"
    );
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("checkpoint/state.json")).unwrap())
            .unwrap();
    assert_eq!(state["step"], 1);
    assert_eq!(metrics(&out).len(), 1);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_short_grpo_run_on_arithmetic_raises_the_reward() {
    // The default config for 40 steps (seed 0). Measured here (test profile, 2 cores): mean reward
    // 0.2992 over steps 0–9 → 0.3547 over steps 30–39 (+0.055); greedy accuracy on 200 held-out
    // questions 0.385 after the warm start → 0.595 after 40 steps (+0.21). The margins are about half
    // of that, for float differences between machines.
    const REWARD_MARGIN: f64 = 0.025;
    const ACCURACY_MARGIN: f64 = 0.10;
    let (summary, out) = small_run("ci", &["steps=40", "task.eval_questions=200"]);
    let first: f64 = summary.rewards[..10].iter().sum::<f64>() / 10.0;
    let last: f64 = summary.rewards[30..].iter().sum::<f64>() / 10.0;
    let before = summary
        .accuracy_before
        .expect("the arithmetic task is verifiable");
    let after = summary
        .accuracy_after
        .expect("the arithmetic task is verifiable");
    eprintln!("reward {first:.4} → {last:.4}; greedy accuracy {before:.4} → {after:.4}");
    assert!(
        last - first > REWARD_MARGIN,
        "reward {first:.3} → {last:.3}"
    );
    assert!(
        after - before > ACCURACY_MARGIN,
        "greedy accuracy {before:.3} → {after:.3}"
    );
    let lines = metrics(&out);
    assert_eq!(lines.len(), 40);
    for (k, line) in lines.iter().enumerate() {
        assert_eq!(line["step"], k);
        for key in [
            "reward/mean",
            "accuracy",
            "loss",
            "recipe/clip_frac",
            "recipe/kl",
            "recipe/reward_mean",
            "signal/score/mean",
            "kl",
            "diversity/distinct",
            "response_length/mean",
            "grad_norm",
        ]
        .into_iter()
        .chain(rlx_trainer::train::TIMING_KEYS)
        {
            let value = line.get(key).and_then(|v| v.as_f64());
            assert!(
                value.is_some_and(f64::is_finite),
                "step {k}: {key} = {value:?}"
            );
        }
    }
    assert!(lines[24].contains_key("eval/accuracy") && !lines[23].contains_key("eval/accuracy"));
    // samples.jsonl: every response of steps 0, 10, 20 and 30 (train.samples_every = 10 by default),
    // with its texts, the task's signal and the recipe's per-response values.
    let samples: Vec<serde_json::Value> = std::fs::read_to_string(out.join("samples.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut steps: Vec<u64> = samples
        .iter()
        .map(|s| s["step"].as_u64().unwrap())
        .collect();
    steps.dedup();
    assert_eq!(steps, [0, 10, 20, 30]);
    assert_eq!(samples.len() % 4, 0);
    let per_step = samples.len() / 4;
    let n = samples
        .iter()
        .filter(|s| s["step"] == 0 && s["group"] == 0)
        .count();
    assert_eq!(n, 8, "recipes/grpo.rlx samples 8 responses per prompt");
    for (k, sample) in samples.iter().enumerate() {
        assert_eq!(
            sample["group"].as_u64().unwrap() as usize,
            (k % per_step) / n,
            "{sample}"
        );
        assert_eq!(
            sample["index"].as_u64().unwrap() as usize,
            (k % per_step) % n,
            "{sample}"
        );
        assert!(!sample["prompt"].as_str().unwrap().is_empty(), "{sample}");
        assert!(sample["completion"].is_string(), "{sample}");
        assert!(sample["tokens"].as_u64().unwrap() >= 1, "{sample}");
        let score = sample["signals"]["score"].as_f64().unwrap();
        assert!(score == 0.0 || score == 1.0, "{sample}");
        assert!(sample["reward"].as_f64().unwrap().is_finite(), "{sample}");
        assert!(
            sample["advantage"].as_f64().unwrap().is_finite(),
            "{sample}"
        );
        assert_eq!(sample["kept"], true, "{sample}");
    }
    // The curves: a PNG with a panel per metric (every numeric key of the metrics lines), its height
    // the rows of panels.
    let history: Vec<serde_json::Map<String, serde_json::Value>> =
        std::fs::read_to_string(out.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
    let panels = rlx_trainer::plot::metric_panels(&history, &serde_json::Map::new());
    assert!(panels.iter().any(|p| p.title == "reward/mean"));
    assert!(panels.iter().any(|p| p.title == "eval/greedy/score"));
    let png = std::fs::read(out.join("metrics.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let width = u32::from_be_bytes(png[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(png[20..24].try_into().unwrap());
    assert_eq!(
        (width, height),
        (
            rlx_trainer::plot::WIDTH,
            rlx_trainer::plot::height(panels.len())
        )
    );
    // The final checkpoint.
    for file in [
        "model.safetensors",
        "reference.safetensors",
        "optimizer.safetensors",
        "state.json",
        "config.toml",
        "metrics.jsonl",
    ] {
        assert!(out.join("checkpoint").join(file).is_file(), "{file}");
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// DAPO's dynamic sampling drops groups whose responses all score the same; when that drops every
/// group (an untrained policy scores 0 everywhere) the step makes no update and says so, and the run
/// goes on, where the recipe alone would have no loss to give.
#[test]
fn a_step_whose_groups_keep_filters_out_entirely_is_skipped() {
    let out = out_dir("all-filtered");
    let mut run_args = args(&[
        "sft.steps=0",
        "task.eval_questions=4",
        "train.prompts_per_step=2",
        "sampler.n=4",
        "steps=2",
        "backend=jit",
    ]);
    run_args.out = Some(out.clone());
    let prepared = prepare(&recipe("recipes/dapo.rlx"), &run_args).unwrap();
    let summary =
        rlx_trainer::train::run(prepared.plan, &prepared.config, &prepared.out, |_| {}).unwrap();
    assert_eq!(summary.steps_done, 2);
    let lines = metrics(&out);
    assert_eq!(lines.len(), 2);
    for line in &lines {
        assert_eq!(line["reward/mean"], serde_json::json!(0.0), "{line:?}");
        assert_eq!(
            line["skipped"],
            "the recipe's `keep` filtered out every group: no update"
        );
        assert!(line["loss"].is_null());
        assert_eq!(line["grad_norm"], serde_json::json!(0.0));
        assert!(!line.contains_key("recipe/pg_clipfrac"));
        // Every sampling round (the default config allows 4) came back uniform.
        assert_eq!(line["sampling/rounds"], serde_json::json!(4));
        assert_eq!(line["sampling/kept_groups"], serde_json::json!(0));
    }
    assert!(out.join("checkpoint").exists());
    let _ = std::fs::remove_dir_all(&out);
}

/// DAPO's dynamic sampling proper: when `keep` drops groups, the step samples more prompts (up to
/// `train.max_sampling_rounds` rounds) until `prompts_per_step` groups are kept, and trains on exactly
/// those; with one round it trains on what the first round kept.
#[test]
fn dynamic_sampling_refills_the_batch_with_kept_groups() {
    let run = |name: &str, rounds: &str| {
        let out = out_dir(name);
        let mut run_args = args(&[
            "sft.steps=40",
            "task.eval_questions=4",
            "train.prompts_per_step=4",
            "train.eval_every=0",
            "sampler.n=4",
            "steps=4",
            "backend=jit",
            &format!("train.max_sampling_rounds={rounds}"),
        ]);
        run_args.out = Some(out.clone());
        let prepared = prepare(&recipe("recipes/dapo.rlx"), &run_args).unwrap();
        rlx_trainer::train::run(prepared.plan, &prepared.config, &prepared.out, |_| {}).unwrap();
        let lines = metrics(&out);
        let _ = std::fs::remove_dir_all(&out);
        lines
    };
    let number = |line: &serde_json::Map<String, serde_json::Value>, key: &str| {
        line[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{key}: {line:?}"))
    };
    let refilled = run("refill", "8");
    let mut resampled = 0;
    for line in &refilled {
        let rounds = number(line, "sampling/rounds");
        let kept = number(line, "sampling/kept_groups");
        assert!((1..=8).contains(&rounds) && kept <= 4, "{line:?}");
        if rounds < 8 {
            assert_eq!(kept, 4, "stopped early without a full batch: {line:?}");
        }
        if rounds > 1 {
            resampled += 1;
            // Every round's samples count in `accuracy`, and a kept group has both right and wrong
            // answers.
            let accuracy = line["accuracy"].as_f64().unwrap();
            assert!(accuracy > 0.0 && accuracy < 1.0, "{line:?}");
        }
    }
    assert!(resampled > 0, "no step needed a second round: {refilled:?}");
    // One round: the step trains on the groups that round kept (only on them: a dropped group is
    // outside the loss and its normalisations, so no forward or backward pass runs over it).
    let once = run("once", "1");
    let mut dropped = 0;
    for line in &once {
        assert_eq!(number(line, "sampling/rounds"), 1, "{line:?}");
        let kept = number(line, "sampling/kept_groups");
        assert!(kept <= 4, "{line:?}");
        dropped += 4 - kept;
        if kept > 0 {
            assert!(line["loss"].is_number(), "{line:?}");
        }
    }
    assert!(dropped > 0, "no step dropped a group: {once:?}");
}

/// `input entropy : f32[tok] policy` trains for real: the entropy bonus's share of the gradient (the
/// gradient at `entropy_coeff = c` minus the one at 0) equals the gradient of −c·mean(H) computed with
/// plain candle ops on the full logits, and micro-batching gives the whole batch's gradient.
#[test]
fn the_entropy_input_is_differentiated_through_the_head() {
    let device = Device::Cpu;
    let model = Model::new(&tiny(), 13, &device).unwrap();
    let (prompts, completions, groups) = rollouts();
    let scores = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0];
    let hir = recipe("trainer/tests/data/grpo_entropy.rlx");
    let lengths: Vec<usize> = completions.iter().map(Vec::len).collect();
    let total: usize = lengths.iter().sum();
    let values = completion_policy(&model, &prompts, &completions, &device)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    let gradients = |coeff: f64, micro: usize| {
        let graph = rlx_compiler::compile_graph(&hir, &[("entropy_coeff".into(), coeff)]).unwrap();
        let layout = Layout::from_counts(&groups, &lengths, &[], 0).unwrap();
        let inputs = graph
            .inputs
            .iter()
            .map(|i| match i.name.as_str() {
                "score" => scores.to_vec(),
                "entropy" => values.iter().map(|v| f64::from(v[1])).collect(),
                _ => values.iter().map(|v| f64::from(v[0])).collect(),
            })
            .collect();
        let objective = Arc::new(Objective::interpreter(graph));
        let (_, grads) = loss_and_gradients(
            &model,
            &objective,
            &Batch { layout, inputs },
            "logp",
            Context::default(),
            &prompts,
            &completions,
            micro,
            false,
            &device,
        )
        .unwrap();
        grads
    };
    let c = 0.5;
    let with = gradients(c, 0);
    let without = gradients(0.0, 0);
    let micro = gradients(c, 2);

    // −c·mean(H) with the full logits: H = −Σ p log p at every completion position.
    let (pads, ids, p) = rlx_trainer::sample::left_pad(&prompts);
    let longest = *lengths.iter().max().unwrap();
    let mut rows = Vec::new();
    for (r, completion) in completions.iter().enumerate() {
        let mut row = ids[r * p..(r + 1) * p].to_vec();
        row.extend_from_slice(completion);
        row.resize(p + longest, 0);
        rows.extend(row);
    }
    let ids = Tensor::from_vec(rows, (prompts.len(), p + longest), &device).unwrap();
    let logits = model.forward(&ids, &pads).unwrap();
    let logp = rlx_trainer::model::log_softmax(&logits).unwrap();
    let entropy = (logp.exp().unwrap() * &logp)
        .unwrap()
        .sum(2)
        .unwrap()
        .neg()
        .unwrap();
    let mut mask = vec![0f32; prompts.len() * (p + longest)];
    for (r, l) in lengths.iter().enumerate() {
        for k in 0..*l {
            mask[r * (p + longest) + p - 1 + k] = 1.0;
        }
    }
    let mask = Tensor::from_vec(mask, (prompts.len(), p + longest), &device).unwrap();
    let plain = ((entropy * mask).unwrap().sum_all().unwrap() * (-c / total as f64)).unwrap();
    let plain = plain.backward().unwrap();

    for (k, (name, var)) in model.vars().iter().enumerate() {
        let theirs: Vec<f32> = plain
            .get(var.as_tensor())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let (a, b) = (
            with.values[k].as_ref().unwrap(),
            without.values[k].as_ref().unwrap(),
        );
        let scale = theirs.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(scale > 0.0, "{name}: the entropy term does not reach it");
        for (i, t) in theirs.iter().enumerate() {
            let ours = a[i] - b[i];
            assert!(
                (ours - t).abs() <= 1e-4 * scale.max(1e-3),
                "{name}[{i}]: entropy gradient {ours} vs plain candle {t} (scale {scale})"
            );
        }
        let m = micro.values[k].as_ref().unwrap();
        let diff = a.iter().zip(m).fold(0f32, |d, (x, y)| d.max((x - y).abs()));
        let full = a.iter().fold(0f32, |d, x| d.max(x.abs()));
        assert!(
            diff <= 1e-5 * full.max(1.0),
            "{name}: micro-batch differs by {diff}"
        );
    }
}

/// A run of a recipe that reads `entropy`: the sampler records the entropies (Settings::entropy is
/// set from the recipe's inputs), so the first evaluation sees them, and every step's entropy metric
/// is a positive, finite number.
#[test]
fn a_run_fills_the_entropy_input() {
    let out = out_dir("entropy");
    let mut run_args = args(&["steps=3", "sft.steps=5", "task.eval_questions=8"]);
    run_args.out = Some(out.clone());
    let prepared = prepare(&recipe("trainer/tests/data/grpo_entropy.rlx"), &run_args).unwrap();
    rlx_trainer::train::run(prepared.plan, &prepared.config, &prepared.out, |_| {}).unwrap();
    let lines = metrics(&out);
    assert_eq!(lines.len(), 3);
    for line in &lines {
        let h = line["recipe/entropy_mean"].as_f64().unwrap();
        assert!(h.is_finite() && h > 0.0, "{line:?}");
    }
}

/// `recipes/opd.rlx` prepared as `rlx run` prepares it, with `config` (TOML) and `sets`.
fn prepare_opd(
    recipe_path: &str,
    config: &str,
    sets: &[&str],
    out: &Path,
) -> Result<rlx_trainer::cli::Prepared, String> {
    let mut run_args = args(sets);
    run_args.recipe_name = "opd".into();
    run_args.config_text = Some(config.into());
    run_args.out = Some(out.to_path_buf());
    prepare(&recipe(recipe_path), &run_args)
}

#[test]
fn an_opd_run_fills_teacher_logp_with_the_teachers_log_probabilities() {
    // No warm start: the policy is the fresh tiny model of the run's seed and the teacher (another
    // size) the fresh one of seed ^ TEACHER_SEED, so both can be rebuilt here.
    let out = out_dir("opd-teacher");
    let teacher_toml = "hidden = 32\nintermediate = 64\n";
    let prepared = prepare_opd(
        "recipes/opd.rlx",
        &format!("[teacher]\n{teacher_toml}"),
        &[
            "steps=1",
            // The sampled tokens are re-encoded from samples.jsonl's text, which drops a `<pad>` a
            // fresh model may sample (seeds 0, 1, 3, 4 sample one); seed 2's completions have none.
            "seed=2",
            "sft.steps=0",
            "train.prompts_per_step=2",
            "task.eval_questions=4",
            "train.eval_every=0",
            "train.samples_every=1",
        ],
        &out,
    )
    .unwrap();
    let (seed, policy_config) = (
        prepared.config.seed,
        prepared.config.model.model_config().unwrap(),
    );
    let teacher_config = prepared
        .config
        .teacher
        .as_ref()
        .expect("[teacher] is parsed")
        .model_config()
        .unwrap();
    assert_eq!(
        (teacher_config.hidden, teacher_config.vocab),
        (32, policy_config.vocab)
    );
    rlx_trainer::train::run(prepared.plan, &prepared.config, &prepared.out, |_| {}).unwrap();
    let reported = metrics(&out)[0]["recipe/reverse_kl"].as_f64().unwrap();

    // The step's samples, re-encoded (each completion ends with the end token the decode drops).
    let device = Device::Cpu;
    let tokenizer = rlx_trainer::task::Tokenizer;
    let (mut rows, mut tokens) = (Vec::new(), Vec::new());
    for line in std::fs::read_to_string(out.join("samples.jsonl"))
        .unwrap()
        .lines()
    {
        let line: serde_json::Value = serde_json::from_str(line).unwrap();
        rows.push(tokenizer.encode(line["prompt"].as_str().unwrap()).unwrap());
        let mut completion = tokenizer
            .encode(line["completion"].as_str().unwrap())
            .unwrap();
        let count = line["tokens"].as_u64().unwrap() as usize;
        if completion.len() + 1 == count {
            completion.push(rlx_trainer::task::EOS);
        }
        assert_eq!(completion.len(), count, "{line}");
        tokens.push(completion);
    }
    assert_eq!(rows.len(), 2 * 4, "2 prompts × the recipe's rollout n = 4");
    let logp = |model: &Model| -> Vec<f32> {
        completion_logp(model, &rows, &tokens, &device)
            .unwrap()
            .to_vec1()
            .unwrap()
    };
    let policy = logp(&Model::new(&policy_config, seed, &device).unwrap());
    let teacher = logp(
        &Model::new(
            &teacher_config,
            seed ^ rlx_trainer::train::TEACHER_SEED,
            &device,
        )
        .unwrap(),
    );
    // metric reverse_kl = token_mean(old_logp − teacher_logp): Σ over tokens / their count.
    let expected = policy
        .iter()
        .zip(&teacher)
        .map(|(p, t)| (p - t) as f64)
        .sum::<f64>()
        / policy.len() as f64;
    assert!(expected.abs() > 1e-3, "the teacher differs from the policy");
    assert!(
        (reported - expected).abs() <= 1e-4 * (1.0 + expected.abs()),
        "reverse_kl {reported} vs {expected} recomputed"
    );
}

#[test]
fn an_opd_run_without_a_teacher_names_the_table_to_add() {
    let out = out_dir("opd-no-teacher");
    let err = prepare_opd("recipes/opd.rlx", "", &[], &out).err().unwrap();
    assert!(
        err.contains("`teacher_logp : f32[tok]`") && err.contains("add a `[teacher]` table"),
        "{err}"
    );
}

#[test]
fn a_teacher_the_recipe_does_not_read_is_an_error() {
    let out = out_dir("grpo-teacher");
    let err = prepare_opd("recipes/grpo.rlx", "[teacher]\n", &[], &out)
        .err()
        .unwrap();
    assert!(
        err.contains("`[teacher]` (tiny)") && err.contains("does not read `teacher_logp"),
        "{err}"
    );
}

#[test]
fn a_teacher_over_other_tokens_is_a_config_error() {
    let out = out_dir("opd-bad-teacher");
    let cases = [
        (
            "[teacher]\nvocab = 40\n",
            "teacher.vocab = 40 differs from model.vocab",
        ),
        (
            "[teacher]\nkind = \"smollm2\"\n",
            "teacher.kind = \"smollm2\" with model.kind = \"tiny\"",
        ),
        ("[teacher]\nhiden = 32\n", "did you mean `teacher.hidden`?"),
        (
            "[teacher.lora]\nrank = 4\n",
            "`teacher.lora`: the teacher is frozen",
        ),
        ("teacher = 3\n", "expected a table `[teacher]`"),
    ];
    for (config, message) in cases {
        let err = prepare_opd("recipes/opd.rlx", config, &[], &out)
            .err()
            .unwrap_or_else(|| panic!("{config} is accepted"));
        assert!(err.contains(message), "{config}: {err}");
    }
}
