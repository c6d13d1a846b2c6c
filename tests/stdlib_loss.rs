//! Properties of the policy losses, importance correction and KL estimators of the standard library
//! (stdlib/loss.rlx, stdlib/kl.rlx, stdlib/correction.rlx), checked through `rlx score` on random batches:
//! - SAPO's gradient at ratio 1 is the unclipped PPO gradient, −A per token, for any τ;
//! - GSPO with one token per response is token-level PPO (no dual clip), in loss and gradient;
//! - TIS with cap ∞ is plain importance sampling, token and sequence level;
//! - the straight-through `+` KL variants have the base estimator's value and k2's gradient.

use proptest::prelude::*;
use serde_json::{json, Value};

use rlx_compiler::hir::Recipe;

fn recipe(text: &str) -> Recipe {
    let checked = rlx_compiler::check_source("property.rlx", text);
    assert!(!checked.has_errors(), "{:?}", checked.diagnostics);
    checked.recipe.expect("a clean recipe")
}

/// `rlx score` with gradients; panics on a scoring error (a non-finite value is one).
fn score(recipe: &Recipe, rollouts: &str, overrides: &[(&str, f64)]) -> Value {
    let overrides: Vec<(String, f64)> = overrides
        .iter()
        .map(|(name, value)| (name.to_string(), *value))
        .collect();
    match rlx_runtime::score::score(recipe, rollouts, &overrides, true) {
        Ok(scored) => scored.document,
        Err(message) => panic!("scoring failed: {message}"),
    }
}

/// One line per response of a single group: `score` and the token arrays named in `tokens`.
fn rollouts(scores: &[f64], tokens: &[(&str, Vec<Vec<f64>>)]) -> String {
    let mut text = String::new();
    for (index, score) in scores.iter().enumerate() {
        let mut line = json!({ "group": "g", "score": score });
        for (name, values) in tokens {
            line[*name] = json!(values[index]);
        }
        text.push_str(&line.to_string());
        text.push('\n');
    }
    text
}

fn number(value: &Value) -> f64 {
    value.as_f64().unwrap_or(f64::NAN)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * (1.0 + a.abs().max(b.abs()))
}

/// Token gradients of `input` as one flat list, in input order.
fn gradient(document: &Value, input: &str) -> Vec<f64> {
    document["grad"][input]
        .as_array()
        .expect("a gradient per response")
        .iter()
        .flat_map(|response| response.as_array().cloned().unwrap_or_default())
        .map(|g| number(&g))
        .collect()
}

fn assert_all_close(what: &str, left: &[f64], right: &[f64]) {
    assert_eq!(left.len(), right.len(), "{what}: lengths differ");
    for (index, (a, b)) in left.iter().zip(right).enumerate() {
        assert!(close(*a, *b), "{what}[{index}]: {a} vs {b}");
    }
}

/// Ragged token arrays: for each response, a vector of values from `values`.
fn ragged(
    responses: std::ops::Range<usize>,
    tokens: std::ops::Range<usize>,
    values: std::ops::Range<f64>,
) -> impl Strategy<Value = Vec<Vec<f64>>> {
    proptest::collection::vec(proptest::collection::vec(values, tokens), responses)
}

/// The same shape as `shape`, filled from `values`.
fn like(shape: &[Vec<f64>], values: std::ops::Range<f64>) -> impl Strategy<Value = Vec<Vec<f64>>> {
    shape
        .iter()
        .map(|response| proptest::collection::vec(values.clone(), response.len()))
        .collect::<Vec<_>>()
}

/// An advantage per response; some exactly 0, the sign that switches SAPO's τ and PPO's clip side.
fn advantages(count: usize) -> impl Strategy<Value = Vec<f64>> {
    proptest::collection::vec(prop_oneof![Just(0.0), -3.0..3.0f64], count)
}

const SAPO: &str = "
import std/loss.{ratio, sapo}
import std/agg.{token_sum}
input logp     : f32[tok] policy
input old_logp : f32[tok]
input score    : f32[resp]
param tau_pos = 1.0
param tau_neg = 1.05
advantage = score
loss      = token_sum(sapo(ratio(logp, old_logp), advantage, tau_pos, tau_neg))
";

const PPO_UNCLIPPED: &str = "
import std/loss.{ratio}
import std/agg.{token_sum}
input logp     : f32[tok] policy
input old_logp : f32[tok]
input score    : f32[resp]
advantage = score
loss      = token_sum(-advantage * ratio(logp, old_logp))
";

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// SAPO (seed part 1 §3.4): f′(1) = 1, so at r = 1 the gradient of −f(r)·A in logp is −A whatever
    /// τ_pos and τ_neg are: the unclipped PPO gradient.
    #[test]
    fn sapo_gradient_at_ratio_one_is_the_ppo_gradient(
        (old_logp, scores) in ragged(1..6, 1..5, -5.0..-0.01)
            .prop_flat_map(|old| { let n = old.len(); (Just(old), advantages(n)) }),
        tau_pos in 0.05..20.0f64,
        tau_neg in 0.05..20.0f64,
    ) {
        let text = rollouts(&scores, &[("logp", old_logp.clone()), ("old_logp", old_logp.clone())]);
        let sapo = score(&recipe(SAPO), &text, &[("tau_pos", tau_pos), ("tau_neg", tau_neg)]);
        let ppo = score(&recipe(PPO_UNCLIPPED), &text, &[]);
        let expected: Vec<f64> = old_logp
            .iter()
            .zip(&scores)
            .flat_map(|(tokens, a)| vec![-a; tokens.len()])
            .collect();
        assert_all_close("SAPO gradient", &gradient(&sapo, "logp"), &expected);
        assert_all_close("PPO gradient", &gradient(&ppo, "logp"), &expected);
    }
}

const GSPO: &str = "
import std/loss.{gspo}
import std/agg.{seq_mean_token_mean}
input logp     : f32[tok] policy
input old_logp : f32[tok]
input score    : f32[resp]
param eps_low  = 0.2
param eps_high = 0.2
advantage = score
loss      = seq_mean_token_mean(gspo(logp, old_logp, advantage, eps_low, eps_high))
";

const PPO_TOKEN: &str = "
import std/loss.{ratio, clipped_surrogate, ppo_clip}
import std/agg.{token_mean}
input logp     : f32[tok] policy
input old_logp : f32[tok]
input score    : f32[resp]
param eps_low  = 0.2
param eps_high = 0.2
param clip_c   = 3.0
advantage = score
loss      = token_mean(clipped_surrogate(ratio(logp, old_logp), advantage, eps_low, eps_high))
metric dual_clip_off = token_mean(ppo_clip(ratio(logp, old_logp), advantage, eps_low, eps_high, clip_c))
";

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// With one token per response, GSPO's sequence ratio is the token ratio and `seq_mean_token_mean`
    /// is the token mean: GSPO is token-level PPO without dual clip (and `ppo_clip` with clip_c = ∞ is
    /// that too). |Δ| < 2 keeps verl's 20-clamp and GSPO's cap at 10 out of the way.
    #[test]
    fn gspo_with_one_token_per_response_is_token_level_ppo(
        (old_logp, delta, scores) in ragged(1..8, 1..2, -5.0..-0.01).prop_flat_map(|old| {
            let n = old.len();
            (Just(old.clone()), like(&old, -2.0..2.0), advantages(n))
        }),
        eps_low in 0.01..0.5f64,
        eps_high in 0.01..0.5f64,
    ) {
        let logp: Vec<Vec<f64>> = old_logp
            .iter()
            .zip(&delta)
            .map(|(old, d)| old.iter().zip(d).map(|(o, d)| o + d).collect())
            .collect();
        let text = rollouts(&scores, &[("logp", logp), ("old_logp", old_logp)]);
        let eps = [("eps_low", eps_low), ("eps_high", eps_high)];
        let gspo = score(&recipe(GSPO), &text, &eps);
        let ppo = score(
            &recipe(PPO_TOKEN),
            &text,
            &[eps[0], eps[1], ("clip_c", f64::INFINITY)],
        );
        prop_assert!(close(number(&gspo["loss"]), number(&ppo["loss"])),
            "loss {} vs {}", gspo["loss"], ppo["loss"]);
        prop_assert!(close(number(&ppo["metrics"]["dual_clip_off"]), number(&ppo["loss"])));
        assert_all_close("gradient", &gradient(&gspo, "logp"), &gradient(&ppo, "logp"));
    }
}

const TIS: &str = "
import std/loss.{ratio, ppo_clip}
import std/agg.{token_mean}
import std/correction.{token_is_weight, seq_is_weight, tis}
input logp         : f32[tok] policy
input old_logp     : f32[tok]
input sampler_logp : f32[tok]
input score        : f32[resp]
param tis_cap = 2.0
advantage = score
loss = token_mean(ppo_clip(ratio(logp, old_logp), advantage)
    * tis(token_is_weight(old_logp, sampler_logp), tis_cap))
metric sequence = token_mean(ppo_clip(ratio(logp, old_logp), advantage)
    * tis(seq_is_weight(old_logp, sampler_logp), tis_cap))
";

const PLAIN_IS: &str = "
import std/loss.{ratio, ppo_clip}
import std/agg.{token_mean}
import std/correction.{token_is_weight, seq_is_weight}
input logp         : f32[tok] policy
input old_logp     : f32[tok]
input sampler_logp : f32[tok]
input score        : f32[resp]
advantage = score
loss = token_mean(ppo_clip(ratio(logp, old_logp), advantage) * token_is_weight(old_logp, sampler_logp))
metric sequence = token_mean(ppo_clip(ratio(logp, old_logp), advantage)
    * seq_is_weight(old_logp, sampler_logp))
";

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// TIS truncates the IS weight at tis_cap (seed part 2 §6.2); with tis_cap = ∞ it is plain IS, in
    /// loss and gradient, for the token weight and for the sequence weight. Sampler log-probabilities
    /// up to 3 nats away make weights far above any finite cap.
    #[test]
    fn tis_with_infinite_cap_is_plain_importance_sampling(
        (logp, old_logp, sampler_logp, scores) in ragged(1..6, 1..5, -5.0..-0.01).prop_flat_map(|logp| {
            let n = logp.len();
            (Just(logp.clone()), like(&logp, -5.0..-0.01), like(&logp, -8.0..-0.01), advantages(n))
        }),
    ) {
        let text = rollouts(
            &scores,
            &[("logp", logp), ("old_logp", old_logp), ("sampler_logp", sampler_logp)],
        );
        let truncated = score(&recipe(TIS), &text, &[("tis_cap", f64::INFINITY)]);
        let plain = score(&recipe(PLAIN_IS), &text, &[]);
        prop_assert!(close(number(&truncated["loss"]), number(&plain["loss"])),
            "loss {} vs {}", truncated["loss"], plain["loss"]);
        prop_assert!(close(
            number(&truncated["metrics"]["sequence"]),
            number(&plain["metrics"]["sequence"])
        ));
        assert_all_close("gradient", &gradient(&truncated, "logp"), &gradient(&plain, "logp"));
    }
}

/// Three copies of the policy log-probabilities, one per straight-through variant.
const KL_PLUS: &str = "
import std/kl.{k1_plus, kl_abs_plus, k3_plus}
import std/agg.{token_sum}
input lp1      : f32[tok] policy
input lp2      : f32[tok] policy
input lp3      : f32[tok] policy
input ref_logp : f32[tok]
loss = token_sum(k1_plus(lp1, ref_logp)) + token_sum(kl_abs_plus(lp2, ref_logp))
     + token_sum(k3_plus(lp3, ref_logp))
metric k1  = token_sum(k1_plus(lp1, ref_logp))
metric abs = token_sum(kl_abs_plus(lp2, ref_logp))
metric k3  = token_sum(k3_plus(lp3, ref_logp))
";

const KL_BASE: &str = "
import std/loss.{k3}
import std/kl.{k1, kl_abs}
import std/agg.{token_sum}
input lp1      : f32[tok] policy
input lp2      : f32[tok] policy
input lp3      : f32[tok] policy
input ref_logp : f32[tok]
loss = token_sum(k1(lp1, ref_logp)) + token_sum(kl_abs(lp2, ref_logp)) + token_sum(k3(lp3, ref_logp))
metric k1  = token_sum(k1(lp1, ref_logp))
metric abs = token_sum(kl_abs(lp2, ref_logp))
metric k3  = token_sum(k3(lp3, ref_logp))
";

const KL_K2: &str = "
import std/kl.{k2}
import std/agg.{token_sum}
input lp1      : f32[tok] policy
input lp2      : f32[tok] policy
input lp3      : f32[tok] policy
input ref_logp : f32[tok]
loss = token_sum(k2(lp1, ref_logp)) + token_sum(k2(lp2, ref_logp)) + token_sum(k2(lp3, ref_logp))
";

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// verl's `k1+`, `abs+`, `k3+` (peer-trainers §2.4): the forward value of the base estimator and the
    /// gradient of k2 = ½Δ², also where k3's clamps are active (|Δ| up to 30).
    #[test]
    fn straight_through_kl_has_the_base_value_and_the_k2_gradient(
        (logp, ref_logp) in ragged(1..6, 1..5, -40.0..-0.01)
            .prop_flat_map(|logp| (Just(logp.clone()), like(&logp, -40.0..-0.01))),
    ) {
        let text = rollouts(
            &vec![0.0; logp.len()],
            &[("lp1", logp.clone()), ("lp2", logp.clone()), ("lp3", logp), ("ref_logp", ref_logp)],
        );
        let plus = score(&recipe(KL_PLUS), &text, &[]);
        let base = score(&recipe(KL_BASE), &text, &[]);
        let k2 = score(&recipe(KL_K2), &text, &[]);
        for metric in ["k1", "abs", "k3"] {
            prop_assert!(close(number(&plus["metrics"][metric]), number(&base["metrics"][metric])),
                "{metric}: {} vs {}", plus["metrics"][metric], base["metrics"][metric]);
        }
        prop_assert!(close(number(&plus["loss"]), number(&base["loss"])));
        for input in ["lp1", "lp2", "lp3"] {
            assert_all_close(input, &gradient(&plus, input), &gradient(&k2, input));
        }
    }
}
