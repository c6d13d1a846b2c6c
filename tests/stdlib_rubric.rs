//! Properties of `std/rubric` that no finite list of worked examples pins down: a vetoed response gets
//! exactly the veto value, whatever its other judgments, the rubric's weights, saturations,
//! interactions and shaping (a raised flag or a failed `critical` criterion). Checked through `rubric`
//! blocks (numeric and boolean judgments, the hard-zero and fixed-penalty forms) and through the
//! functions on per-prompt `crit` data; and a `rubric` block scores as the `std/rubric` functions called
//! directly in the documented order (veto, levels, saturation, aggregate, interactions, clip, shaping).

use proptest::prelude::*;
use serde_json::{json, Value};

/// Check `source` (it must be clean) and score `rollouts` with it; the rewards in input order.
fn rewards(source: &str, rollouts: &str, overrides: &[(String, f64)]) -> Vec<f64> {
    let checked = rlx_compiler::check_source("veto.rlx", source);
    assert!(
        !checked.has_errors(),
        "{source}\n{:#?}",
        checked.diagnostics
    );
    let recipe = checked.recipe.expect("a clean recipe");
    let scored = rlx_runtime::score::score(&recipe, rollouts, overrides, false)
        .unwrap_or_else(|error| panic!("scoring failed: {error}\n{source}\n{rollouts}"));
    scored.document["responses"]
        .as_array()
        .expect("responses")
        .iter()
        .map(|response| response["reward"].as_f64().expect("a reward"))
        .collect()
}

/// One JSON line per response.
fn jsonl(lines: &[Value]) -> String {
    lines.iter().map(|line| format!("{line}\n")).collect()
}

/// The rubric-level knobs a case draws: weights, saturation and shaping parameters, interaction
/// strengths, the shape form, and whether the veto is a hard zero or a fixed penalty.
#[derive(Clone, Debug)]
struct Rubric {
    weights: [f64; 3],
    tanh_k: f64,
    cap_kappa: f64,
    synergy: f64,
    antagonism: f64,
    shape: usize,
    shape_arg: f64,
    penalty: Option<f64>,
    /// Whether `grounded` is critical (a score below 0.5 vetoes).
    critical: bool,
}

fn rubric() -> impl Strategy<Value = Rubric> {
    (
        [0.1f64..5.0, 0.1f64..5.0, 0.1f64..5.0],
        0.5f64..5.0,
        0.1f64..1.0,
        -1.0f64..1.0,
        -1.0f64..1.0,
        0usize..4,
        1.1f64..3.0,
        prop::option::of(-5.0f64..5.0),
        any::<bool>(),
    )
        .prop_map(
            |(
                weights,
                tanh_k,
                cap_kappa,
                synergy,
                antagonism,
                shape,
                shape_arg,
                penalty,
                critical,
            )| Rubric {
                weights,
                tanh_k,
                cap_kappa,
                synergy,
                antagonism,
                shape,
                shape_arg,
                penalty,
                critical,
            },
        )
}

impl Rubric {
    /// A recipe scoring `judged` with this rubric; `elem` is `f32` or `bool`.
    fn source(&self, elem: &str) -> String {
        let [w_voice, w_grounded, w_structure] = self.weights;
        let shape = match self.shape {
            0 => format!("shape power(gamma = {})", self.shape_arg),
            1 => format!("shape exp(beta = {})", self.shape_arg),
            2 => format!(
                "shape piecewise(threshold = 0.5, slope = {})",
                self.shape_arg
            ),
            _ => String::new(),
        };
        let on_veto = match self.penalty {
            Some(_) => "on_veto penalty(value = veto_value)",
            None => "on_veto zero",
        };
        // A boolean is no level index, and `min` takes no boolean (so neither `saturate cap` nor an
        // `interact … min` applies to a boolean criterion): those stay plain for boolean judgments.
        let (voice, structure, coupling) = if elem == "bool" {
            (
                format!("criterion voice weight {w_voice}"),
                format!("criterion structure weight {w_structure}"),
                "",
            )
        } else {
            (
                format!("criterion voice weight {w_voice} levels [0, 0.25, 0.5, 0.75, 1]"),
                format!(
                    "criterion structure weight {w_structure} saturate cap(kappa = {})",
                    self.cap_kappa
                ),
                "min ",
            )
        };
        let critical = if self.critical { " critical" } else { "" };
        format!(
            "param veto_value = 0\n\
             rubric style {{\n\
                 {voice}\n\
                 criterion grounded weight {w_grounded} saturate tanh(k = {}){critical}\n\
                 {structure}\n\
                 criterion flattering veto\n\
                 criterion leaking veto\n\
                 interact voice, grounded : {}\n\
                 interact grounded, structure : {coupling}{}\n\
                 {on_veto}\n\
                 {shape}\n\
             }}\n\
             input judged : {elem}[resp, style]\n\
             reward = style(judged)\n",
            self.tanh_k, self.synergy, self.antagonism
        )
    }

    /// The same score written with the `std/rubric` functions called directly, over the judgments as
    /// separate f32[resp] inputs `voice` (a level index), `grounded`, `structure`, `flattering`, `leaking`.
    fn function_form(&self) -> String {
        let [w_voice, w_grounded, w_structure] = self.weights;
        let shaped = match self.shape {
            0 => format!("shape_power(score, {})", self.shape_arg),
            1 => format!("shape_exp(score, {})", self.shape_arg),
            2 => format!("shape_piecewise(score, 0.5, {})", self.shape_arg),
            _ => "score".to_string(),
        };
        let vetoed = if self.critical {
            "flattering >= 0.5 or leaking >= 0.5 or grounded < 0.5"
        } else {
            "flattering >= 0.5 or leaking >= 0.5"
        };
        let veto = match self.penalty {
            Some(_) => "veto_penalty(shaped, vetoed, veto_value)",
            None => "veto_zero(shaped, vetoed)",
        };
        format!(
            "import std/rubric\n\
             param veto_value = 0\n\
             input voice : f32[resp]\n\
             input grounded : f32[resp]\n\
             input structure : f32[resp]\n\
             input flattering : f32[resp]\n\
             input leaking : f32[resp]\n\
             let vetoed = {vetoed}\n\
             let x_voice = level_linear(voice, 0, 4)\n\
             let x_grounded = sat_tanh(grounded, {tanh_k})\n\
             let x_structure = sat_cap(structure, {cap_kappa})\n\
             let score = normalize_total({w_voice} * x_voice + {w_grounded} * x_grounded + {w_structure} * x_structure, \
                 {w_voice} + {w_grounded} + {w_structure})\n\
                 + interact_product(x_voice, x_grounded, {synergy})\n\
                 + interact_min(x_grounded, x_structure, {antagonism})\n\
             let shaped = {shaped}\n\
             reward = {veto}\n",
            tanh_k = self.tanh_k,
            cap_kappa = self.cap_kappa,
            synergy = self.synergy,
            antagonism = self.antagonism,
        )
    }

    /// Whether a numeric judgment (voice, grounded, structure, flattering, leaking) is vetoed.
    fn vetoes(&self, judgment: &[f64; 5]) -> bool {
        judgment[3] >= 0.5 || judgment[4] >= 0.5 || (self.critical && judgment[1] < 0.5)
    }

    /// The value a vetoed response must get.
    fn veto_value(&self) -> f64 {
        self.penalty.unwrap_or(0.0)
    }

    fn overrides(&self) -> Vec<(String, f64)> {
        vec![("veto_value".to_string(), self.veto_value())]
    }
}

/// Judgments of one response: a level index for `voice`, scores in [0, 1] for the other criteria, and
/// the two veto flags as numbers (a flag fires at ≥ 0.5).
fn numeric_judgment() -> impl Strategy<Value = [f64; 5]> {
    (
        0u8..5,
        0.0f64..=1.0,
        0.0f64..=1.0,
        0.0f64..=1.0,
        0.0f64..=1.0,
    )
        .prop_map(|(level, a, b, c, d)| [f64::from(level), a, b, c, d])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Numeric judgments: a response with a flag ≥ 0.5 gets exactly 0 (hard zero) or exactly the
    /// penalty value, whatever its other criteria; the others are scored as usual (and differ from
    /// the veto value in general, which this does not need).
    #[test]
    fn a_numeric_veto_gives_exactly_the_veto_value(
        rubric in rubric(),
        judgments in prop::collection::vec(numeric_judgment(), 1..8),
    ) {
        let lines: Vec<Value> = judgments
            .iter()
            .map(|j| json!({"group": "p", "judged": j.to_vec()}))
            .collect();
        let got = rewards(&rubric.source("f32"), &jsonl(&lines), &rubric.overrides());
        prop_assert_eq!(got.len(), judgments.len());
        for (judgment, reward) in judgments.iter().zip(&got) {
            prop_assert!(reward.is_finite());
            if rubric.vetoes(judgment) {
                // Exactly: not within a tolerance.
                prop_assert_eq!(reward.to_bits(), rubric.veto_value().to_bits(), "judgment {:?}", judgment);
            }
        }
    }

    /// A `rubric` block gives what the `std/rubric` functions give when called directly in the
    /// documented order: the block adds no formula of its own (levels as a table, the clip before
    /// shaping, a critical criterion's veto). Judgments range beyond [0, 1] (a judge may overshoot) so
    /// the clip matters, and the shaped score exceeds 1 for strong synergies.
    #[test]
    fn a_rubric_block_scores_as_its_functions(
        rubric in rubric(),
        judgments in prop::collection::vec(
            (0u8..5, -0.5f64..=1.5, -0.5f64..=1.5, 0.0f64..=1.0, 0.0f64..=1.0)
                .prop_map(|(level, a, b, c, d)| [f64::from(level), a, b, c, d]),
            1..8,
        ),
    ) {
        let block: Vec<Value> = judgments
            .iter()
            .map(|j| json!({"group": "p", "judged": j.to_vec()}))
            .collect();
        let separate: Vec<Value> = judgments
            .iter()
            .map(|j| json!({
                "group": "p", "voice": j[0], "grounded": j[1], "structure": j[2],
                "flattering": j[3], "leaking": j[4],
            }))
            .collect();
        let by_block = rewards(&rubric.source("f32"), &jsonl(&block), &rubric.overrides());
        let by_functions = rewards(&rubric.function_form(), &jsonl(&separate), &rubric.overrides());
        for ((judgment, a), b) in judgments.iter().zip(&by_block).zip(&by_functions) {
            prop_assert!((a - b).abs() <= 1e-12 * a.abs().max(1.0), "{:?}: block {} functions {}", judgment, a, b);
            if rubric.shape < 3 && !rubric.vetoes(judgment) {
                // Shaping maps the clipped score: never a power or exponential of a score above 1.
                let cap = if rubric.shape == 2 { 0.5 + 0.5 * rubric.shape_arg } else { 1.0 };
                prop_assert!((0.0..=cap + 1e-12).contains(a), "{:?}: shaped {}", judgment, a);
            }
        }
    }

    /// Boolean judgments (met / not met): a true flag vetoes.
    #[test]
    fn a_boolean_veto_gives_exactly_the_veto_value(
        rubric in rubric(),
        judgments in prop::collection::vec(prop::array::uniform5(any::<bool>()), 1..8),
    ) {
        let lines: Vec<Value> = judgments
            .iter()
            .map(|j| json!({"group": "p", "judged": j.to_vec()}))
            .collect();
        let got = rewards(&rubric.source("bool"), &jsonl(&lines), &rubric.overrides());
        for (judgment, reward) in judgments.iter().zip(&got) {
            prop_assert!(reward.is_finite());
            if judgment[3] || judgment[4] || (rubric.critical && !judgment[1]) {
                prop_assert_eq!(reward.to_bits(), rubric.veto_value().to_bits(), "judgment {:?}", judgment);
            }
        }
    }

    /// The function forms on per-prompt criterion lists: `veto_zero` and `veto_penalty` over the
    /// HealthBench points score, with a random rubric (signed points, ragged across prompts, possibly
    /// without positive points) and random verdicts.
    #[test]
    fn the_veto_functions_give_exactly_the_veto_value_on_points_scores(
        prompts in prop::collection::vec(
            (
                prop::collection::vec(-10i32..=10, 0..6),
                prop::collection::vec((prop::collection::vec(any::<bool>(), 6), any::<bool>()), 1..5),
            ),
            1..4,
        ),
        penalty in -5.0f64..5.0,
    ) {
        let source = "import std/rubric.{points_score, veto_zero, veto_penalty}\n\
                      param veto_value = 0\n\
                      input met    : bool[resp, crit]\n\
                      input points : f32[group, crit]\n\
                      input vetoed : bool[resp]\n\
                      let score = points_score(met, points)\n\
                      reward    = veto_penalty(score, vetoed, veto_value)\n\
                      advantage = veto_zero(score, vetoed)\n";
        let mut lines = Vec::new();
        let mut flags = Vec::new();
        for (index, (points, responses)) in prompts.iter().enumerate() {
            for (met, vetoed) in responses {
                lines.push(json!({
                    "group": index,
                    "points": points,
                    "met": met[..points.len()].to_vec(),
                    "vetoed": vetoed,
                }));
                flags.push(*vetoed);
            }
        }
        let checked = rlx_compiler::check_source("functions.rlx", source);
        prop_assert!(!checked.has_errors(), "{:#?}", checked.diagnostics);
        let recipe = checked.recipe.expect("a clean recipe");
        let overrides = [("veto_value".to_string(), penalty)];
        let scored = rlx_runtime::score::score(&recipe, &jsonl(&lines), &overrides, false)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let responses = scored.document["responses"].as_array().expect("responses").clone();
        for (response, vetoed) in responses.iter().zip(&flags) {
            let reward = response["reward"].as_f64().expect("a reward");
            let advantage = response["advantage"].as_f64().expect("an advantage");
            if *vetoed {
                prop_assert_eq!(reward.to_bits(), penalty.to_bits());
                prop_assert_eq!(advantage.to_bits(), 0f64.to_bits());
            } else {
                prop_assert_eq!(reward.to_bits(), advantage.to_bits());
            }
        }
    }
}
