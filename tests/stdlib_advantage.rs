//! Properties of `std/advantage` that no finite list of worked examples pins down, on random batches
//! (ragged groups of 1–6 responses, continuous rewards mixed with 0/1/2 rewards so that ties,
//! zero-variance groups and singletons occur): Dr.GRPO advantages sum to zero per group, RLOO is
//! n/(n − 1)·(s − mean) for n > 1, the z-score has mean 0 and unit Bessel std in every non-degenerate
//! group, and the invariances the estimators are designed for (GDPO under rescaling a reward, OPO with
//! equal lengths, whitening, returns with γ = λ = 1). Each value is read back from `rlx score`: the
//! `advantage` section for per-response estimators, ∂loss/∂logp of `loss = Σ logp·x` for per-token ones.

use proptest::prelude::*;
use serde_json::{json, Value};

/// A group: (reward, second reward, tokens) per response.
type Group = Vec<(f64, f64, usize)>;

fn reward() -> impl Strategy<Value = f64> {
    prop_oneof![-5.0f64..5.0, (0i32..=2).prop_map(f64::from)]
}

/// 1–4 groups of `smallest`–6 responses of 1–5 tokens.
fn groups_of(smallest: usize) -> impl Strategy<Value = Vec<Group>> {
    prop::collection::vec(
        prop::collection::vec((reward(), reward(), 1usize..6), smallest..7),
        1..5,
    )
}

fn batch() -> impl Strategy<Value = Vec<Group>> {
    groups_of(1)
}

/// The rollouts of `groups`: `score`, `score2`, a `mask` of ones (it gives the lengths) and zero `logp`.
fn jsonl(groups: &[Group]) -> String {
    let mut text = String::new();
    for (g, group) in groups.iter().enumerate() {
        for &(score, score2, tokens) in group {
            let line = json!({
                "group": g,
                "score": score,
                "score2": score2,
                "mask": vec![1.0; tokens],
                "logp": vec![0.0; tokens],
            });
            text.push_str(&format!("{line}\n"));
        }
    }
    text
}

const INPUTS: &str =
    "input score  : f32[resp]\ninput score2 : f32[resp]\ninput mask   : f32[tok] = 1\n\
                      input logp   : f32[tok] policy\n";

fn scored(body: &str, groups: &[Group]) -> Value {
    let source = format!("import std/advantage\n{INPUTS}{body}\n");
    let checked = rlx_compiler::check_source("property.rlx", &source);
    assert!(
        !checked.has_errors(),
        "{source}\n{:#?}",
        checked.diagnostics
    );
    let recipe = checked.recipe.expect("a clean recipe");
    rlx_runtime::score::score(&recipe, &jsonl(groups), &[], true)
        .unwrap_or_else(|error| panic!("scoring failed: {error}\n{source}"))
        .document
}

/// The advantage of every response (input order), split by group, for `advantage = EXPR`.
fn advantages(expr: &str, groups: &[Group]) -> Vec<Vec<f64>> {
    let document = scored(&format!("advantage = {expr}"), groups);
    let flat: Vec<f64> = document["responses"]
        .as_array()
        .expect("responses")
        .iter()
        .map(|r| r["advantage"].as_f64().expect("an advantage"))
        .collect();
    let mut rest = flat.as_slice();
    groups
        .iter()
        .map(|group| {
            let (head, tail) = rest.split_at(group.len());
            rest = tail;
            head.to_vec()
        })
        .collect()
}

/// The per-token value of `EXPR` (f32[tok]) for every response, read as ∂(Σ logp·x)/∂logp.
fn token_values(expr: &str, groups: &[Group]) -> Vec<Vec<f64>> {
    let document = scored(
        &format!("loss = sum(logp * ({expr}) over tok, batch)"),
        groups,
    );
    document["grad"]["logp"]
        .as_array()
        .expect("a gradient")
        .iter()
        .map(|response| {
            response
                .as_array()
                .expect("tokens")
                .iter()
                .map(|v| v.as_f64().expect("a number"))
                .collect()
        })
        .collect()
}

fn mean(x: &[f64]) -> f64 {
    x.iter().sum::<f64>() / x.len() as f64
}

fn bessel_std(x: &[f64]) -> f64 {
    let m = mean(x);
    (x.iter().map(|v| (v - m).powi(2)).sum::<f64>() / (x.len() - 1) as f64).sqrt()
}

fn scores(group: &Group) -> Vec<f64> {
    group.iter().map(|r| r.0).collect()
}

fn close(a: f64, b: f64, tolerance: f64) -> bool {
    (a - b).abs() <= tolerance * (1.0 + a.abs().max(b.abs()))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Dr.GRPO (Liu et al. 2025): centred advantages sum to zero in every group, in both conventions
    /// (verl keeps a singleton's reward, so only groups of two or more for `group_center_verl`).
    #[test]
    fn dr_grpo_advantages_sum_to_zero_per_group(groups in batch()) {
        for (group, adv) in groups.iter().zip(advantages("group_center(score)", &groups)) {
            prop_assert!(adv.iter().sum::<f64>().abs() < 1e-9, "{group:?} → {adv:?}");
        }
        for (group, adv) in groups.iter().zip(advantages("group_center_verl(score)", &groups)) {
            if group.len() > 1 {
                prop_assert!(adv.iter().sum::<f64>().abs() < 1e-9, "{group:?} → {adv:?}");
            } else {
                prop_assert!(close(adv[0], group[0].0, 1e-12));
            }
        }
    }

    /// RLOO: s_i − mean_{j≠i} s_j = n/(n − 1)·(s_i − mean_g s) for n > 1; a singleton keeps its reward
    /// (verl `rloo`) or gets 0 (verl `rloo_vectorized`).
    #[test]
    fn rloo_is_the_rescaled_centred_reward(groups in batch()) {
        let rloo = advantages("rloo(score)", &groups);
        let vectorized = advantages("rloo_vectorized(score)", &groups);
        for ((group, adv), adv_vec) in groups.iter().zip(rloo).zip(vectorized) {
            let s = scores(group);
            let n = s.len() as f64;
            for i in 0..s.len() {
                if s.len() > 1 {
                    let expected = n / (n - 1.0) * (s[i] - mean(&s));
                    prop_assert!(close(adv[i], expected, 1e-9), "{s:?}: {} vs {expected}", adv[i]);
                    prop_assert!(close(adv_vec[i], expected, 1e-9));
                } else {
                    prop_assert!(close(adv[i], s[i], 1e-12));
                    prop_assert!(adv_vec[i].abs() < 1e-12);
                }
            }
        }
    }

    /// GRPO z-score: in every group of two or more with a non-zero spread, mean 0 and Bessel std 1 (up to
    /// eps = 1e-6 against std ≥ 0.01); a zero-variance group and a singleton get 0 everywhere.
    #[test]
    fn zscore_has_mean_zero_and_unit_bessel_std(groups in batch()) {
        for (group, adv) in groups.iter().zip(advantages("group_zscore(score)", &groups)) {
            let s = scores(group);
            let degenerate = s.len() < 2 || bessel_std(&s) < 1e-12;
            if degenerate {
                prop_assert!(adv.iter().all(|a| a.abs() < 1e-9), "{s:?} → {adv:?}");
            } else if bessel_std(&s) > 0.01 {
                prop_assert!(mean(&adv).abs() < 1e-9, "{s:?} → {adv:?}");
                prop_assert!((bessel_std(&adv) - 1.0).abs() < 2e-4, "{s:?} → {adv:?}");
            }
        }
    }

    /// GDPO normalises each reward before summing, so rescaling one reward (a length in tokens instead
    /// of thousands of tokens) leaves the advantages unchanged, up to eps. Groups of two or more: verl's
    /// singleton keeps its raw reward, which is not scale-free; rewards whose spread is comparable to eps
    /// are excluded too.
    #[test]
    fn gdpo_is_invariant_to_rescaling_a_reward(groups in groups_of(2), scale in 0.5f64..200.0) {
        prop_assume!(groups.iter().all(|group| {
            let spread = bessel_std(&group.iter().map(|r| r.1).collect::<Vec<_>>());
            spread == 0.0 || spread > 0.01
        }));
        // The summed z-scores must vary over the batch: whitening a (nearly) constant sum amplifies eps.
        let z = |x: Vec<f64>| -> Vec<f64> {
            let (m, sd) = (mean(&x), bessel_std(&x));
            x.iter().map(|v| if sd > 0.0 { (v - m) / sd } else { 0.0 }).collect()
        };
        let summed: Vec<f64> = groups
            .iter()
            .flat_map(|g| {
                let z1 = z(g.iter().map(|r| r.0).collect());
                let z2 = z(g.iter().map(|r| r.1).collect());
                z1.into_iter().zip(z2).map(|(a, b)| a + b).collect::<Vec<_>>()
            })
            .collect();
        prop_assume!(summed.len() > 1 && bessel_std(&summed) > 0.1);
        let base = advantages("gdpo2_verl(score, score2, mask = mask)", &groups);
        let scaled_expr = format!("gdpo2_verl(score, {scale} * score2, mask = mask)");
        let scaled = advantages(&scaled_expr, &groups);
        for (a, b) in base.iter().flatten().zip(scaled.iter().flatten()) {
            prop_assert!(close(*a, *b, 1e-3), "{a} vs {b}");
        }
    }

    /// OPO's length-weighted baseline is the plain group mean when every response has the same length.
    #[test]
    fn opo_with_equal_lengths_is_group_centring(groups in batch(), tokens in 1usize..5) {
        let groups: Vec<Group> = groups
            .into_iter()
            .map(|g| g.into_iter().map(|(s, s2, _)| (s, s2, tokens)).collect())
            .collect();
        let opo = advantages("opo(score, sum(mask over tok))", &groups);
        let centred = advantages("group_center_verl(score)", &groups);
        for (a, b) in opo.iter().flatten().zip(centred.iter().flatten()) {
            prop_assert!(close(*a, *b, 1e-9), "{a} vs {b}");
        }
    }

    /// verl `masked_whiten` of a per-response value: token-weighted mean 0 and Bessel variance
    /// σ²/(σ² + 1e-8) over all tokens of the batch.
    #[test]
    fn whitening_gives_token_weighted_mean_zero_and_unit_variance(groups in batch()) {
        let whitened = advantages("masked_whiten(score, mask)", &groups);
        let mut tokens = Vec::new();
        let mut raw = Vec::new();
        for (group, adv) in groups.iter().zip(&whitened) {
            for (response, a) in group.iter().zip(adv) {
                tokens.extend(std::iter::repeat_n(*a, response.2));
                raw.extend(std::iter::repeat_n(response.0, response.2));
            }
        }
        prop_assume!(raw.len() > 1 && bessel_std(&raw) > 0.1);
        prop_assert!(mean(&tokens).abs() < 1e-7, "{}", mean(&tokens));
        prop_assert!((bessel_std(&tokens) - 1.0).abs() < 1e-5, "{}", bessel_std(&tokens));
    }

    /// With γ = λ = 1, GAE plus the critic's values is the Monte-Carlo return whatever the values
    /// (decoupled GAE's λ_critic = 1), and `discounted_returns` with γ = 1 is the reverse cumulative sum.
    #[test]
    fn gae_with_unit_lambda_returns_the_monte_carlo_return(groups in batch()) {
        let mc = token_values("gae_returns(score2 * token_index - score, score * length - token_index, 1.0, 1.0)", &groups);
        let sums = token_values("discounted_returns(score2 * token_index - score, 1.0)", &groups);
        for ((response, gae), returns) in groups.iter().flatten().zip(&mc).zip(&sums) {
            let (score, score2, tokens) = *response;
            for t in 0..tokens {
                let expected: f64 = (t..tokens).map(|u| score2 * u as f64 - score).sum();
                prop_assert!(close(gae[t], expected, 1e-9), "t = {t}: {} vs {expected}", gae[t]);
                prop_assert!(close(returns[t], expected, 1e-9));
            }
        }
    }

    /// Pass@k: at most one response per group gets a non-zero advantage, the best one, and it gets its
    /// margin over the runner-up divided by the group's Bessel std + 1e-6.
    #[test]
    fn passk_rewards_only_a_unique_best_response(groups in batch()) {
        for (group, adv) in groups.iter().zip(advantages("grpo_passk(score)", &groups)) {
            let s = scores(group);
            let nonzero: Vec<usize> = (0..s.len()).filter(|&i| adv[i] != 0.0).collect();
            prop_assert!(nonzero.len() <= 1, "{s:?} → {adv:?}");
            let best = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            if let Some(&i) = nonzero.first() {
                let runner_up = s.iter().enumerate().filter(|&(j, _)| j != i).map(|(_, v)| *v).fold(f64::NEG_INFINITY, f64::max);
                prop_assert_eq!(s[i], best);
                prop_assert!(close(adv[i], (best - runner_up) / (bessel_std(&s) + 1e-6), 1e-9));
            } else if s.len() > 1 {
                prop_assert!(s.iter().filter(|&&v| v == best).count() > 1 || bessel_std(&s) == 0.0);
            }
        }
    }
}
