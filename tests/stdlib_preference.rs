//! Properties of `std/preference` and its recipes (dpo, simpo, sdpo, bt_reward_model) that the worked
//! examples in tests/scores/preference/ do not pin down on their own:
//! - the shipped recipes reproduce the hand-worked numbers of those cases;
//! - their gradients match finite differences on synthetic batches shaped as pairs (the shared check in
//!   tests/score.rs uses groups of four);
//! - identities of the formulas, on random pairs: flipping every label, cDPO label smoothing, rDPO's
//!   unbiasedness (its defining property), SDPO's indifference to tokens outside the segment, SimPO's
//!   invariance to length and to a constant shift, order invariance, and the mean over pairs.

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use serde_json::{json, Value};

use rlx_compiler::hir::Recipe;
use rlx_runtime::synthetic;
use rlx_runtime::{evaluate, Context};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn checked(path: &Path) -> Recipe {
    let checked = rlx_compiler::check_path(path).expect("readable recipe");
    assert!(
        !checked.has_errors(),
        "{}: {:?}",
        path.display(),
        checked.diagnostics
    );
    checked.recipe.expect("a clean recipe")
}

fn recipe_from(source: &str) -> Recipe {
    let checked = rlx_compiler::check_source("case.rlx", source);
    assert!(
        !checked.has_errors(),
        "{source}\n{:#?}",
        checked.diagnostics
    );
    checked.recipe.expect("a clean recipe")
}

fn shipped(name: &str) -> Recipe {
    checked(&root().join("recipes").join(format!("{name}.rlx")))
}

/// The `rlx score` document of `rollouts`, with gradients.
fn score(recipe: &Recipe, rollouts: &str, overrides: &[(&str, f64)]) -> Value {
    let overrides: Vec<(String, f64)> =
        overrides.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    rlx_runtime::score::score(recipe, rollouts, &overrides, true)
        .unwrap_or_else(|error| panic!("scoring failed: {error}\n{rollouts}"))
        .document
}

fn loss(document: &Value) -> f64 {
    document["loss"].as_f64().expect("a loss")
}

fn metric(document: &Value, name: &str) -> f64 {
    document["metrics"][name].as_f64().expect("a metric")
}

/// One JSON line per response.
fn jsonl(lines: &[Value]) -> String {
    lines.iter().map(|line| format!("{line}\n")).collect()
}

/// `expected` and `actual` agree within `tolerance`, numbers compared element-wise in arrays.
fn assert_close(what: &str, expected: &Value, actual: &Value, tolerance: f64) {
    match (expected, actual) {
        (Value::Array(e), Value::Array(a)) => {
            assert_eq!(e.len(), a.len(), "{what}: lengths differ");
            for (index, (e, a)) in e.iter().zip(a).enumerate() {
                assert_close(&format!("{what}[{index}]"), e, a, tolerance);
            }
        }
        (e, a) => {
            let (e, a) = (e.as_f64().expect("a number"), a.as_f64().expect("a number"));
            assert!((e - a).abs() <= tolerance, "{what}: expected {e}, got {a}");
        }
    }
}

/// The shipped recipes give the hand-worked numbers of the cases whose `.rlx` spells out their body.
#[test]
fn shipped_recipes_reproduce_the_worked_examples() {
    let cases = [
        ("dpo", "dpo_two_pairs"),
        ("dpo", "dpo_label_smoothing"),
        ("simpo", "simpo_lengths"),
        ("simpo", "simpo_mask"),
        ("sdpo", "sdpo_segment"),
        ("bt_reward_model", "bt_margin"),
        ("bt_reward_model", "bt_plain"),
    ];
    let folder = root().join("tests/scores/preference");
    for (name, case) in cases {
        let recipe = shipped(name);
        let expected: Value = serde_json::from_str(
            &std::fs::read_to_string(folder.join(format!("{case}.expected.json"))).unwrap(),
        )
        .unwrap();
        let rollouts = std::fs::read_to_string(folder.join(format!("{case}.jsonl"))).unwrap();
        let overrides: Vec<(&str, f64)> = expected
            .get("set")
            .and_then(Value::as_object)
            .map(|set| {
                set.iter()
                    .map(|(k, v)| (k.as_str(), v.as_f64().unwrap()))
                    .collect()
            })
            .unwrap_or_default();
        let document = score(&recipe, &rollouts, &overrides);
        let label = format!("recipes/{name}.rlx on {case}");
        let tolerance = expected["tolerance"].as_f64().unwrap_or(1e-9);
        assert_close(
            &format!("{label}: loss"),
            &expected["loss"],
            &document["loss"],
            tolerance,
        );
        for (input, gradient) in expected["grad"].as_object().unwrap() {
            assert_close(
                &format!("{label}: grad {input}"),
                gradient,
                &document["grad"][input],
                tolerance,
            );
        }
        if let Some(rewards) = expected.get("reward") {
            let actual: Vec<Value> = document["responses"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["reward"].clone())
                .collect();
            assert_close(
                &format!("{label}: reward"),
                rewards,
                &Value::Array(actual),
                tolerance,
            );
        }
        for (name, value) in expected
            .get("metrics")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            if let Some(actual) = document["metrics"].get(name) {
                assert_close(&format!("{label}: metric {name}"), value, actual, tolerance);
            }
        }
    }
}

/// Central finite differences against autodiff, as tests/score.rs does for every recipe, on batches of
/// pairs (groups of two) with a singleton group, and on the default groups of four.
#[test]
fn preference_recipes_match_finite_differences_on_pairs() {
    for name in ["dpo", "simpo", "sdpo", "bt_reward_model"] {
        let recipe = shipped(name);
        let graph = rlx_compiler::compile_graph(&recipe, &[]).unwrap();
        // Pairs (six groups, the first a singleton), then the shared check's batches (seeds 1–3).
        let pairs = [1, 2, 3].map(|seed| synthetic::Spec {
            seed,
            responses: 2,
            groups: 6,
            ..synthetic::Spec::default()
        });
        let shared = [1, 2, 3].map(|seed| synthetic::Spec {
            seed,
            ..synthetic::Spec::default()
        });
        for spec in pairs.iter().chain(&shared) {
            let seed = spec.seed;
            let mut nonzero = 0;
            let batch = synthetic::batch(&graph, spec);
            let context = Context::default();
            let loss_at = |batch: &rlx_runtime::Batch| {
                evaluate(&graph, batch, &context).unwrap().loss.unwrap()
            };
            let outcome = evaluate(&graph, &batch, &context).unwrap();
            for (input_name, gradient) in &outcome.gradients {
                let input = graph
                    .inputs
                    .iter()
                    .position(|i| &i.name == input_name)
                    .unwrap();
                for (element, &analytic) in gradient.iter().enumerate() {
                    let h = 1e-6;
                    let mut plus = batch.clone();
                    plus.inputs[input][element] += h;
                    let mut minus = batch.clone();
                    minus.inputs[input][element] -= h;
                    let numeric = (loss_at(&plus) - loss_at(&minus)) / (2.0 * h);
                    let error =
                        (numeric - analytic).abs() / analytic.abs().max(numeric.abs()).max(1e-3);
                    assert!(
                        error < 1e-6,
                        "recipes/{name}.rlx seed {seed}: ∂loss/∂{input_name}[{element}] autodiff {analytic}, finite differences {numeric}"
                    );
                    nonzero += usize::from(analytic.abs() > 1e-9);
                }
            }
            // tests/score.rs requires a non-zero gradient on each of its batches.
            assert!(
                nonzero > 0,
                "recipes/{name}.rlx {spec:?}: the gradient is identically zero"
            );
        }
    }
}

/// A random preference pair of token log-probabilities: (chosen logp, chosen ref_logp, rejected logp,
/// rejected ref_logp), one to five tokens each.
type Pair = (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>);

fn tokens() -> impl Strategy<Value = (Vec<f64>, Vec<f64>)> {
    (1usize..6).prop_flat_map(|n| {
        (
            prop::collection::vec(-6.0f64..-0.01, n),
            prop::collection::vec(-6.0f64..-0.01, n),
        )
    })
}

fn pairs() -> impl Strategy<Value = Vec<Pair>> {
    prop::collection::vec(
        (tokens(), tokens()).prop_map(|((w, w_ref), (l, l_ref))| (w, w_ref, l, l_ref)),
        1..5,
    )
}

/// The pairs as rollouts, one group per pair; `flip` swaps which response is chosen; `chosen_first`
/// lists the chosen response of each pair first.
fn pair_rollouts(pairs: &[Pair], flip: bool, chosen_first: bool) -> String {
    let mut lines = Vec::new();
    for (index, (w, w_ref, l, l_ref)) in pairs.iter().enumerate() {
        let chosen = json!({"group": index, "chosen": !flip, "logp": w, "ref_logp": w_ref});
        let rejected = json!({"group": index, "chosen": flip, "logp": l, "ref_logp": l_ref});
        if chosen_first {
            lines.extend([chosen, rejected]);
        } else {
            lines.extend([rejected, chosen]);
        }
    }
    jsonl(&lines)
}

const DPO_SMOOTHING: &str = "
import std/preference.{seq_logratio, dpo_loss, dpo_robust_loss, pair_margin}
input logp     : f32[tok] policy
input ref_logp : f32[tok]
input chosen   : bool[resp]
param beta   = 0.1
param eps    = 0
param robust : bool = false
let logratio = seq_logratio(logp, ref_logp)
loss = where(robust, dpo_robust_loss(chosen, logratio, beta, eps), dpo_loss(chosen, logratio, beta, eps))
metric margin = pair_margin(chosen, beta * logratio)
";

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// softplus(z) − softplus(−z) = z: flipping every label raises the DPO loss by (1 − 2ε)·mean(βΔ),
    /// and cDPO smoothing adds ε·mean(βΔ) to the plain loss; the order of a pair's lines is free.
    #[test]
    fn dpo_flip_and_label_smoothing_identities(pairs in pairs(), beta in 0.01f64..2.0, eps in 0.0f64..0.45) {
        let recipe = recipe_from(DPO_SMOOTHING);
        let set = [("beta", beta), ("eps", eps)];
        let straight = score(&recipe, &pair_rollouts(&pairs, false, true), &set);
        let reordered = score(&recipe, &pair_rollouts(&pairs, false, false), &set);
        let flipped = score(&recipe, &pair_rollouts(&pairs, true, true), &set);
        let plain = score(&recipe, &pair_rollouts(&pairs, false, true), &[("beta", beta)]);
        let margin = metric(&straight, "margin");
        prop_assert!((loss(&reordered) - loss(&straight)).abs() < 1e-9);
        prop_assert!((loss(&flipped) - loss(&straight) - (1.0 - 2.0 * eps) * margin).abs() < 1e-9);
        prop_assert!((loss(&straight) - loss(&plain) - eps * margin).abs() < 1e-9);
    }

    /// rDPO is unbiased: with the label flipped with probability ε, its expected loss is the plain DPO
    /// loss, (1 − ε)·L_rob(labels) + ε·L_rob(flipped) = L_DPO(labels) (Chowdhury et al. 2024); at ε = 0
    /// it is DPO.
    #[test]
    fn robust_dpo_is_unbiased(pairs in pairs(), beta in 0.01f64..2.0, eps in 0.0f64..0.45) {
        let recipe = recipe_from(DPO_SMOOTHING);
        let robust = [("beta", beta), ("eps", eps), ("robust", 1.0)];
        let straight = loss(&score(&recipe, &pair_rollouts(&pairs, false, true), &robust));
        let flipped = loss(&score(&recipe, &pair_rollouts(&pairs, true, true), &robust));
        let dpo = loss(&score(&recipe, &pair_rollouts(&pairs, false, true), &[("beta", beta)]));
        prop_assert!(((1.0 - eps) * straight + eps * flipped - dpo).abs() < 1e-9 * (1.0 + dpo.abs()));
        let robust_zero = loss(&score(&recipe, &pair_rollouts(&pairs, false, true), &[("beta", beta), ("robust", 1.0)]));
        prop_assert!((robust_zero - dpo).abs() < 1e-12);
    }

    /// SDPO with a segment over every token is the shipped DPO; tokens outside the segment change
    /// neither the loss nor get a gradient.
    #[test]
    fn sdpo_reads_only_the_segment(pairs in pairs(), outside in -6.0f64..-0.01) {
        let sdpo = shipped("sdpo");
        let dpo = shipped("dpo");
        let with_segment = |segment_of: &dyn Fn(usize) -> f64, extra: Option<f64>| {
            let mut lines = Vec::new();
            for (index, (w, w_ref, l, l_ref)) in pairs.iter().enumerate() {
                for (chosen, logp, ref_logp) in [(true, w, w_ref), (false, l, l_ref)] {
                    let mut logp = logp.clone();
                    let mut ref_logp = ref_logp.clone();
                    let mut segment: Vec<f64> = (0..logp.len()).map(segment_of).collect();
                    if let Some(value) = extra {
                        // One more token outside the segment, with an arbitrary log-ratio.
                        logp.push(value);
                        ref_logp.push(-1.0);
                        segment.push(0.0);
                    }
                    lines.push(json!({"group": index, "chosen": chosen, "logp": logp, "ref_logp": ref_logp, "segment": segment}));
                }
            }
            jsonl(&lines)
        };
        let everything = score(&sdpo, &with_segment(&|_| 1.0, None), &[]);
        let as_dpo = score(&dpo, &pair_rollouts(&pairs, false, true), &[]);
        prop_assert!((loss(&everything) - loss(&as_dpo)).abs() < 1e-12);
        let padded = score(&sdpo, &with_segment(&|_| 1.0, Some(outside)), &[]);
        prop_assert!((loss(&padded) - loss(&everything)).abs() < 1e-12);
        for response in padded["grad"]["logp"].as_array().unwrap() {
            let last = response.as_array().unwrap().last().unwrap().as_f64().unwrap();
            prop_assert!(last == 0.0);
        }
    }

    /// SimPO is length-normalised and reference-free: repeating every token of a response (twice the
    /// length, the same average) and adding one constant to every log-probability leave it unchanged.
    #[test]
    fn simpo_is_invariant_to_length_and_shift(pairs in pairs(), shift in -2.0f64..2.0) {
        let simpo = shipped("simpo");
        let rollouts = |transform: &dyn Fn(&[f64]) -> Vec<f64>| {
            let mut lines = Vec::new();
            for (index, (w, _, l, _)) in pairs.iter().enumerate() {
                lines.push(json!({"group": index, "chosen": true, "logp": transform(w)}));
                lines.push(json!({"group": index, "chosen": false, "logp": transform(l)}));
            }
            jsonl(&lines)
        };
        let base = loss(&score(&simpo, &rollouts(&|x| x.to_vec()), &[]));
        let doubled = loss(&score(&simpo, &rollouts(&|x| x.iter().flat_map(|&v| [v, v]).collect()), &[]));
        let shifted = loss(&score(&simpo, &rollouts(&|x| x.iter().map(|v| v + shift).collect()), &[]));
        prop_assert!((doubled - base).abs() < 1e-9);
        prop_assert!((shifted - base).abs() < 1e-9);
    }

    /// The reward-model losses average over pairs: scoring pairs together gives the mean of scoring
    /// each alone, and a singleton group changes nothing. Focal never exceeds BT and equals it at
    /// γ = 0; hinge is 0 exactly when every chosen score leads by at least the margin.
    #[test]
    fn reward_model_losses_average_over_pairs(scores in prop::collection::vec((-8.0f64..8.0, -8.0f64..8.0), 1..6), alone in -8.0f64..8.0) {
        let source = "
import std/preference.{bt_loss, focal_loss, hinge_loss}
input rm_score : f32[resp] policy
input chosen   : bool[resp]
param kind  : i32 = 0
param gamma = 2
loss = where(kind == 0, bt_loss(chosen, rm_score, 0.5), where(kind == 1, focal_loss(chosen, rm_score, gamma), hinge_loss(chosen, rm_score, 0.5)))
";
        let recipe = recipe_from(source);
        let pair_lines = |(index, (w, l)): (usize, &(f64, f64))| {
            [json!({"group": index, "chosen": true, "rm_score": w}), json!({"group": index, "chosen": false, "rm_score": l})]
        };
        let all: Vec<Value> = scores.iter().enumerate().flat_map(pair_lines).collect();
        let mut with_singleton = all.clone();
        with_singleton.push(json!({"group": "alone", "chosen": true, "rm_score": alone}));
        for kind in [0.0, 1.0, 2.0] {
            let together = loss(&score(&recipe, &jsonl(&all), &[("kind", kind)]));
            let separately: f64 = scores
                .iter()
                .enumerate()
                .map(|pair| loss(&score(&recipe, &jsonl(&pair_lines(pair)), &[("kind", kind)])))
                .sum::<f64>()
                / scores.len() as f64;
            prop_assert!((together - separately).abs() < 1e-9, "kind {kind}");
            let padded = loss(&score(&recipe, &jsonl(&with_singleton), &[("kind", kind)]));
            prop_assert!((padded - together).abs() < 1e-12, "kind {kind}");
        }
        let bt_plain = recipe_from(&source.replace("bt_loss(chosen, rm_score, 0.5)", "bt_loss(chosen, rm_score)"));
        let bt = loss(&score(&bt_plain, &jsonl(&all), &[]));
        let focal = loss(&score(&recipe, &jsonl(&all), &[("kind", 1.0)]));
        let focal_zero = loss(&score(&recipe, &jsonl(&all), &[("kind", 1.0), ("gamma", 0.0)]));
        prop_assert!(focal <= bt + 1e-12);
        prop_assert!((focal_zero - bt).abs() < 1e-12);
        let hinge = loss(&score(&recipe, &jsonl(&all), &[("kind", 2.0)]));
        let all_past_margin = scores.iter().all(|(w, l)| w - l >= 0.5);
        prop_assert_eq!(hinge == 0.0, all_past_margin);
    }
}
