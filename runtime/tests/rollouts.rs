//! Reading JSONL rollout files into packed batches: good files checked element by element, malformed
//! files checked for their exact error.

use rlx_compiler::hir::Recipe;
use rlx_runtime::rollouts::{decode, read_rollouts, validate_batch, RolloutError, Rollouts};
use rlx_runtime::Batch;
use serde_json::json;

const GRPO: &str = "
import std/advantage.{group_zscore}
import std/loss.{ppo_clip}
import std/agg.{token_mean}

input logp     : f32[tok] policy
input old_logp : f32[tok]
input score    : f32[resp]

let ratio = exp(logp - old_logp)
reward    = score
advantage = group_zscore(reward)
loss      = token_mean(ppo_clip(ratio, advantage))
";

const HEALTHBENCH: &str = "
input points    : f32[group, crit]
input met       : bool[resp, crit]
input ref_score : f32[group]

reward = sum(points * met over crit) - ref_score
";

const RUBRIC: &str = "
rubric style {
    criterion voice     weight 3
    criterion grounded  weight 2
    criterion flattering veto
}
input judged : f32[resp, style]
reward = style(judged)
";

const DEFAULTS: &str = "
input logp   : f32[tok] policy
input mask   : f32[tok] = 1
input bonus  : f32[resp] = 0.5
input met    : bool[resp, crit]
input weight : f32[group, crit] = 1

reward = sum(weight * met over crit) + bonus
loss   = -mean(logp * mask over tok, batch)
";

const EMBEDDINGS: &str = "
input emb         : f32[resp, dim]
input centroid    : f32[group, dim]
input temperature : f32
input cluster     : i32[resp]

reward = sum(emb * centroid over dim) / temperature + cluster
";

const CLUSTER: &str = "
input cluster : i32[resp]
reward = cluster
";

fn recipe(source: &str) -> Recipe {
    let checked = rlx_compiler::check_source("t.rlx", source);
    let messages: Vec<String> = checked
        .diagnostics
        .iter()
        .map(|d| format!("{d:?}"))
        .collect();
    checked
        .recipe
        .unwrap_or_else(|| panic!("test recipe does not check: {messages:#?}"))
}

fn data(name: &str) -> String {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn read(name: &str, source: &str) -> Rollouts {
    let recipe = recipe(source);
    let rollouts = read_rollouts(&data(name), &recipe).unwrap_or_else(|e| panic!("{name}: {e}"));
    validate_batch(&rollouts.batch, &recipe).unwrap_or_else(|e| panic!("{name}: {e}"));
    rollouts
}

fn fail(name: &str, source: &str) -> RolloutError {
    fail_text(&data(name), source)
}

fn fail_text(text: &str, source: &str) -> RolloutError {
    match read_rollouts(text, &recipe(source)) {
        Ok(rollouts) => panic!("expected an error, got {rollouts:?}"),
        Err(error) => error,
    }
}

/// The flat vector of the input called `name`.
fn input<'b>(batch: &'b Batch, recipe_source: &str, name: &str) -> &'b [f64] {
    let recipe = recipe(recipe_source);
    let index = recipe
        .inputs
        .iter()
        .position(|i| i.name == name)
        .unwrap_or_else(|| panic!("no input {name}"));
    &batch.inputs[index]
}

fn assert_error(error: &RolloutError, line: Option<usize>, key: Option<&str>, text: &str) {
    assert_eq!(error.to_string(), text);
    assert_eq!(error.line, line, "{error}");
    assert_eq!(error.key.as_deref(), key, "{error}");
}

// -------------------------------------------------------------------------------------------------
// Good files

#[test]
fn grpo_file_packs_groups_by_first_appearance() {
    let rollouts = read("grpo.jsonl", GRPO);
    let batch = &rollouts.batch;
    // Lines (non-blank index): 0 q1, 1 q2, 2 q1, 3 q2, 4 q2 → packed q1: 0, 2; q2: 1, 3, 4.
    assert_eq!(rollouts.groups, vec![json!("q1"), json!("q2")]);
    assert_eq!(rollouts.line_of_response, vec![0, 2, 1, 3, 4]);
    assert_eq!(batch.layout.group_offsets, vec![0, 2, 5]);
    assert_eq!(batch.layout.token_offsets, vec![0, 3, 5, 6, 6, 8]);
    assert_eq!(batch.layout.crit_offsets, vec![0, 0, 0]);
    assert_eq!(batch.layout.dim, 0);
    assert_eq!(
        input(batch, GRPO, "logp"),
        [-0.5, -1.0, -0.25, -0.1, -0.2, -2.0, -0.7, -0.8]
    );
    assert_eq!(
        input(batch, GRPO, "old_logp"),
        [-0.5, -1.5, -0.25, -0.1, -0.3, -2.0, -0.6, -0.9]
    );
    assert_eq!(input(batch, GRPO, "score"), [1.0, 0.5, 0.0, 1.0, 0.0]);
    assert!(rollouts.warnings.is_empty(), "{:?}", rollouts.warnings);
}

#[test]
fn integer_groups_are_kept_as_given_and_differ_from_strings() {
    let rollouts = read("grpo_int_groups.jsonl", GRPO);
    assert_eq!(rollouts.groups, vec![json!(7), json!(0), json!("7")]);
    assert_eq!(rollouts.line_of_response, vec![0, 2, 1, 3]);
    let layout = &rollouts.batch.layout;
    assert_eq!(layout.group_offsets, vec![0, 2, 3, 4]);
    assert_eq!(layout.token_offsets, vec![0, 2, 3, 4, 7]);
    assert_eq!(
        input(&rollouts.batch, GRPO, "logp"),
        [-1.0, -2.0, -4.0, -3.0, -5.0, -6.0, -7.0]
    );
    assert_eq!(input(&rollouts.batch, GRPO, "score"), [1.0, 0.0, 0.0, 1.0]);
}

#[test]
fn healthbench_criteria_are_ragged_per_group() {
    let rollouts = read("healthbench.jsonl", HEALTHBENCH);
    let batch = &rollouts.batch;
    assert_eq!(rollouts.groups, vec![json!("a"), json!("b"), json!("c")]);
    assert_eq!(rollouts.line_of_response, vec![0, 2, 1, 3]);
    assert_eq!(batch.layout.group_offsets, vec![0, 2, 3, 4]);
    assert_eq!(batch.layout.token_offsets, vec![0, 0, 0, 0, 0]);
    assert_eq!(batch.layout.crit_offsets, vec![0, 3, 5, 5]);
    assert_eq!(
        input(batch, HEALTHBENCH, "points"),
        [5.0, -2.0, 3.0, 4.0, 1.0]
    );
    assert_eq!(
        input(batch, HEALTHBENCH, "met"),
        [1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    );
    assert_eq!(input(batch, HEALTHBENCH, "ref_score"), [0.5, 0.25, 0.0]);
}

#[test]
fn rubric_axis_takes_arrays_and_objects_by_criterion() {
    let rollouts = read("rubric.jsonl", RUBRIC);
    let batch = &rollouts.batch;
    assert_eq!(batch.layout.group_offsets, vec![0, 2, 3]);
    assert_eq!(batch.layout.crit_offsets, vec![0, 0, 0]);
    // Criterion order: voice, grounded, flattering.
    assert_eq!(
        input(batch, RUBRIC, "judged"),
        [0.5, 1.0, 0.0, 0.25, 0.75, 1.0, 0.0, 0.0, 0.0]
    );
}

#[test]
fn defaults_fill_missing_inputs_at_their_length() {
    let rollouts = read("defaults.jsonl", DEFAULTS);
    let batch = &rollouts.batch;
    assert_eq!(batch.layout.group_offsets, vec![0, 2, 3]);
    assert_eq!(batch.layout.token_offsets, vec![0, 3, 4, 4]);
    assert_eq!(batch.layout.crit_offsets, vec![0, 2, 3]);
    assert_eq!(input(batch, DEFAULTS, "logp"), [-1.0, -2.0, -3.0, -4.0]);
    assert_eq!(input(batch, DEFAULTS, "mask"), [1.0, 1.0, 1.0, 0.0]);
    assert_eq!(input(batch, DEFAULTS, "bonus"), [0.5, 2.0, 0.5]);
    assert_eq!(input(batch, DEFAULTS, "met"), [1.0, 0.0, 0.0, 0.0, 1.0]);
    assert_eq!(input(batch, DEFAULTS, "weight"), [1.0, 1.0, 2.0]);
}

#[test]
fn dim_batch_level_and_i32_inputs() {
    let rollouts = read("embeddings.jsonl", EMBEDDINGS);
    let batch = &rollouts.batch;
    assert_eq!(rollouts.groups, vec![json!(1), json!(2)]);
    assert_eq!(batch.layout.dim, 3);
    assert_eq!(batch.layout.crit_offsets, vec![0, 0, 0]);
    assert_eq!(
        input(batch, EMBEDDINGS, "emb"),
        [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    );
    assert_eq!(
        input(batch, EMBEDDINGS, "centroid"),
        [0.5, 0.5, 0.0, 0.0, 0.0, 1.0]
    );
    assert_eq!(input(batch, EMBEDDINGS, "temperature"), [0.7]);
    assert_eq!(input(batch, EMBEDDINGS, "cluster"), [3.0, -1.0, 2.0]);
}

#[test]
fn unknown_keys_give_one_warning() {
    let rollouts = read("unknown_keys.jsonl", GRPO);
    assert_eq!(
        rollouts.warnings,
        vec!["ignored keys not used by the recipe: prompt, text, answer".to_string()]
    );
}

#[test]
fn every_packed_input_has_the_length_of_its_shape() {
    for (file, source) in [
        ("grpo.jsonl", GRPO),
        ("healthbench.jsonl", HEALTHBENCH),
        ("rubric.jsonl", RUBRIC),
        ("defaults.jsonl", DEFAULTS),
        ("embeddings.jsonl", EMBEDDINGS),
    ] {
        let recipe = recipe(source);
        let rollouts = read(file, source);
        // Every input's length is its shape's size over the layout (`rlx_core::Sizes`).
        validate_batch(&rollouts.batch, &recipe).unwrap_or_else(|e| panic!("{file}: {e}"));
    }
}

#[test]
fn validate_batch_rejects_wrong_lengths_and_layouts() {
    let recipe = recipe(HEALTHBENCH);
    let rollouts = read("healthbench.jsonl", HEALTHBENCH);
    let mut short = rollouts.batch.clone();
    short.inputs[1].pop();
    assert_eq!(
        validate_batch(&short, &recipe),
        Err("malformed batch: input `met` has 7 values, its shape bool[resp, crit] needs 8".into())
    );
    let mut missing = rollouts.batch.clone();
    missing.inputs.pop();
    assert_eq!(
        validate_batch(&missing, &recipe),
        Err("malformed batch: 2 input vectors for a recipe with 3 inputs".into())
    );
    let mut broken = rollouts.batch.clone();
    broken.layout.group_offsets = vec![0, 2, 1, 4];
    assert_eq!(
        validate_batch(&broken, &recipe),
        Err("malformed batch: group offsets must not decrease".into())
    );
    broken.layout.group_offsets = vec![];
    assert!(validate_batch(&broken, &recipe).is_err());
}

#[test]
fn crlf_lines_and_a_byte_order_mark_are_fine() {
    let text = "\u{feff}{\"group\": 1, \"cluster\": 4}\r\n\r\n{\"group\": 1, \"cluster\": 5}\r\n";
    let rollouts = read_rollouts(text, &recipe(CLUSTER)).unwrap();
    assert_eq!(rollouts.batch.inputs, vec![vec![4.0, 5.0]]);
    assert_eq!(rollouts.line_of_response, vec![0, 1]);
}

#[test]
fn a_recipe_without_token_inputs_gives_zero_tokens() {
    let text = "{\"group\": \"x\", \"cluster\": 1}\n{\"group\": \"y\", \"cluster\": 2}\n";
    let rollouts = read_rollouts(text, &recipe(CLUSTER)).unwrap();
    assert_eq!(rollouts.batch.layout.token_offsets, vec![0, 0, 0]);
    assert_eq!(rollouts.batch.layout.group_offsets, vec![0, 1, 2]);
}

// -------------------------------------------------------------------------------------------------
// Malformed files

#[test]
fn missing_key() {
    assert_error(
        &fail("bad/missing_key.jsonl", GRPO),
        Some(2),
        Some("score"),
        "line 2, key `score`: missing key: the recipe's input `score : f32[resp]` has no default",
    );
}

#[test]
fn wrong_type() {
    assert_error(
        &fail("bad/wrong_type.jsonl", GRPO),
        Some(1),
        Some("logp"),
        "line 1, key `logp`: expected an array of numbers, found a string",
    );
    let error = fail_text(
        r#"{"group": 1, "logp": [-1], "old_logp": [-1], "score": [1]}"#,
        GRPO,
    );
    assert_eq!(
        error.to_string(),
        "line 1, key `score`: expected a number, found an array"
    );
    let error = fail_text(
        r#"{"group": 1, "logp": [-1, "x"], "old_logp": [-1, -1], "score": 1}"#,
        GRPO,
    );
    assert_eq!(
        error.to_string(),
        "line 1, key `logp`: element 1: expected a number, found a string"
    );
    let error = fail_text(
        r#"{"group": 1, "logp": [-1], "old_logp": [-1], "score": true}"#,
        GRPO,
    );
    assert_eq!(
        error.to_string(),
        "line 1, key `score`: expected a number, found a boolean"
    );
    let error = fail_text(
        r#"{"group": "a", "points": [1], "met": [2], "ref_score": 0}"#,
        HEALTHBENCH,
    );
    assert_eq!(
        error.to_string(),
        "line 1, key `met`: element 0: expected a boolean (true/false or 0/1), found 2"
    );
}

#[test]
fn ragged_token_arrays() {
    assert_error(
        &fail("bad/ragged.jsonl", GRPO),
        Some(1),
        Some("old_logp"),
        "line 1, key `old_logp`: token arrays of one response differ in length: logp has 5, old_logp has 4",
    );
}

#[test]
fn nan() {
    assert_error(
        &fail("bad/nan.jsonl", GRPO),
        Some(3),
        Some("score"),
        "line 3, key `score`: non-finite value NaN",
    );
}

#[test]
fn infinity() {
    assert_error(
        &fail("bad/infinity.jsonl", GRPO),
        Some(1),
        Some("score"),
        "line 1, key `score`: non-finite value Infinity",
    );
    assert_error(
        &fail("bad/neg_infinity.jsonl", GRPO),
        Some(1),
        Some("logp"),
        "line 1, key `logp`: element 1: non-finite value -Infinity",
    );
}

#[test]
fn numbers_too_large_for_f64() {
    assert_error(
        &fail("bad/too_large.jsonl", GRPO),
        Some(1),
        Some("score"),
        "line 1, key `score`: number 1e400 is out of range for f64",
    );
}

#[test]
fn non_finite_values_in_ignored_keys_and_strings_are_fine() {
    let text =
        r#"{"group": "NaN", "cluster": 1, "note": NaN, "also": [Infinity, -Infinity, 1e999]}"#;
    let rollouts = read_rollouts(text, &recipe(CLUSTER)).unwrap();
    assert_eq!(rollouts.groups, vec![json!("NaN")]);
    assert_eq!(
        rollouts.warnings,
        vec!["ignored keys not used by the recipe: also, note".to_string()]
    );
}

#[test]
fn group_level_disagreement() {
    assert_error(
        &fail("bad/group_disagree.jsonl", HEALTHBENCH),
        Some(3),
        Some("ref_score"),
        "line 3, key `ref_score`: group-level input `ref_score` differs within group \"q1\": 0.5 on line 1, 0.7 on line 3",
    );
    let error = fail_text(
        "{\"group\": 4, \"points\": [1, 2], \"met\": [1, 1], \"ref_score\": 0}\n\
         {\"group\": 4, \"points\": [1, 3], \"met\": [1, 1], \"ref_score\": 0}\n",
        HEALTHBENCH,
    );
    assert_eq!(
        error.to_string(),
        "line 2, key `points`: group-level input `points` differs within group 4: [1, 2] on line 1, [1, 3] on line 2"
    );
}

#[test]
fn group_level_default_disagreeing_with_a_given_value() {
    let error = fail_text(
        "{\"group\": \"g\", \"logp\": [], \"met\": [true]}\n\
         {\"group\": \"g\", \"logp\": [], \"met\": [true], \"weight\": [2]}\n",
        DEFAULTS,
    );
    assert_eq!(
        error.to_string(),
        "line 2, key `weight`: group-level input `weight` differs within group \"g\": [1] (the default) on line 1, [2] on line 2"
    );
}

#[test]
fn batch_level_disagreement() {
    let error = fail_text(
        "{\"group\": 1, \"emb\": [1], \"centroid\": [1], \"temperature\": 0.7, \"cluster\": 0}\n\
         {\"group\": 2, \"emb\": [1], \"centroid\": [1], \"temperature\": 0.5, \"cluster\": 0}\n",
        EMBEDDINGS,
    );
    assert_error(
        &error,
        Some(2),
        Some("temperature"),
        "line 2, key `temperature`: batch-level input `temperature` differs between lines: 0.7 on line 1, 0.5 on line 2",
    );
}

#[test]
fn dim_length_mismatch() {
    let error = fail_text(
        "{\"group\": 1, \"emb\": [1, 2], \"centroid\": [1, 2], \"temperature\": 1, \"cluster\": 0}\n\
         {\"group\": 2, \"emb\": [1, 2, 3], \"centroid\": [1, 2], \"temperature\": 1, \"cluster\": 0}\n",
        EMBEDDINGS,
    );
    assert_eq!(
        error.to_string(),
        "line 2, key `emb`: the dim length differs: emb has 2 on line 1, emb has 3 on line 2"
    );
}

#[test]
fn crit_length_mismatch_within_a_group() {
    assert_error(
        &fail("bad/crit_mismatch.jsonl", HEALTHBENCH),
        Some(2),
        Some("met"),
        "line 2, key `met`: the criterion count differs within group \"q1\": points has 3 on line 1, met has 2 on line 2",
    );
}

#[test]
fn empty_file() {
    assert_error(
        &fail("bad/empty.jsonl", GRPO),
        None,
        None,
        "the rollout file has no responses",
    );
    assert_eq!(
        fail_text("", GRPO).to_string(),
        "the rollout file has no responses"
    );
}

#[test]
fn invalid_json_line() {
    // The bare NaN before the error is replaced internally; the column still points into the line as written.
    assert_error(
        &fail("bad/invalid_json.jsonl", GRPO),
        Some(2),
        None,
        "line 2: invalid JSON: expected value at column 59",
    );
    let line = data("bad/invalid_json.jsonl");
    let second = line.lines().nth(1).unwrap();
    assert_eq!(&second[58..59], "}");
}

#[test]
fn non_object_line() {
    assert_error(
        &fail("bad/not_object.jsonl", GRPO),
        Some(1),
        None,
        "line 1: expected a JSON object, found an array",
    );
    assert_eq!(
        fail_text("{\"group\": 1, \"cluster\": 1}\n\n3\n", CLUSTER).to_string(),
        "line 3: expected a JSON object, found the number 3"
    );
}

#[test]
fn missing_group() {
    assert_error(
        &fail("bad/missing_group.jsonl", GRPO),
        Some(2),
        Some("group"),
        "line 2, key `group`: missing key `group` (the prompt this response belongs to)",
    );
    assert_eq!(
        fail_text("{\"group\": 1.5, \"cluster\": 1}", CLUSTER).to_string(),
        "line 1, key `group`: expected a string or an integer, found the number 1.5"
    );
    assert_eq!(
        fail_text("{\"group\": null, \"cluster\": 1}", CLUSTER).to_string(),
        "line 1, key `group`: expected a string or an integer, found null"
    );
    assert_eq!(
        fail_text("{\"group\": NaN, \"cluster\": 1}", CLUSTER).to_string(),
        "line 1, key `group`: expected a string or an integer, found non-finite value NaN"
    );
}

#[test]
fn i32_given_a_fraction() {
    assert_error(
        &fail("bad/i32_fraction.jsonl", CLUSTER),
        Some(2),
        Some("cluster"),
        "line 2, key `cluster`: expected an integer, found 1.5",
    );
    assert_eq!(
        fail_text("{\"group\": 1, \"cluster\": 3000000000}", CLUSTER).to_string(),
        "line 1, key `cluster`: integer 3000000000 is out of range for i32"
    );
}

#[test]
fn unknown_rubric_criterion() {
    assert_error(
        &fail("bad/unknown_criterion.jsonl", RUBRIC),
        Some(1),
        Some("judged"),
        "line 1, key `judged`: unknown criterion `tone` of rubric `style` (its criteria: voice, grounded, flattering)",
    );
}

#[test]
fn rubric_shape_errors() {
    assert_eq!(
        fail_text(r#"{"group": 1, "judged": [1, 0]}"#, RUBRIC).to_string(),
        "line 1, key `judged`: expected 3 values, one per criterion of rubric `style` (voice, grounded, flattering), found 2"
    );
    assert_eq!(
        fail_text(
            r#"{"group": 1, "judged": {"voice": 1, "flattering": 0}}"#,
            RUBRIC
        )
        .to_string(),
        "line 1, key `judged`: missing criterion `grounded` of rubric `style`"
    );
    assert_eq!(
        fail_text(
            r#"{"group": 1, "judged": {"voice": 1, "grounded": NaN, "flattering": 0}}"#,
            RUBRIC
        )
        .to_string(),
        "line 1, key `judged`: criterion `grounded`: non-finite value NaN"
    );
    assert_eq!(
        fail_text(r#"{"group": 1, "judged": 1}"#, RUBRIC).to_string(),
        "line 1, key `judged`: expected an array of numbers in the criterion order of rubric `style` or an object keyed by criterion, found the number 1"
    );
}

#[test]
fn token_count_unknown_when_every_token_input_is_defaulted() {
    let source = "input mask : f32[tok] = 1\ninput bonus : f32[resp]\nreward = bonus";
    assert_error(
        &fail_text(r#"{"group": 1, "bonus": 1}"#, source),
        Some(1),
        Some("mask"),
        "line 1, key `mask`: cannot tell the response's token count: the line gives no token-level input (mask) and no `length`",
    );
}

#[test]
fn criterion_count_unknown_when_every_crit_input_is_defaulted() {
    let source = "input w : f32[resp, crit] = 1\nreward = sum(w over crit)";
    assert_error(
        &fail_text("{\"group\": 1, \"w\": [1, 2]}\n{\"group\": 2}\n", source),
        Some(2),
        Some("w"),
        "line 2, key `w`: cannot tell the criterion count of group 2: none of its lines gives a crit-axis input (w)",
    );
}

/// Untrusted data never panics: every prefix and a few corruptions of every test file give a value or an error.
#[test]
fn no_panics_on_truncated_or_corrupted_files() {
    let files = [
        ("grpo.jsonl", GRPO),
        ("grpo_int_groups.jsonl", GRPO),
        ("healthbench.jsonl", HEALTHBENCH),
        ("rubric.jsonl", RUBRIC),
        ("defaults.jsonl", DEFAULTS),
        ("embeddings.jsonl", EMBEDDINGS),
        ("bad/invalid_json.jsonl", GRPO),
        ("bad/nan.jsonl", GRPO),
        ("padded.jsonl", GRPO),
        ("bad/duplicate_key.jsonl", GRPO),
    ];
    for (file, source) in files {
        let recipe = recipe(source);
        let text = data(file);
        for end in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
            let _ = read_rollouts(&text[..end], &recipe);
        }
        for (i, _) in text.char_indices() {
            for replacement in ["\"", "\\", "-", "N", "e", "]", "\n", "9e99999"] {
                let mut corrupted = text.clone();
                corrupted.replace_range(i..i + 1, replacement);
                let _ = read_rollouts(&corrupted, &recipe);
            }
        }
    }
}

// -------------------------------------------------------------------------------------------------
// Padding, duplicate keys, encoding

const MASKED: &str = "
input logp : f32[tok] policy
input mask : f32[tok] = 1
loss = -mean(logp * mask over tok, batch)
";

/// A padded dump: `response_mask` (1s then 0s) or `length` gives each response's true token count,
/// and every token-level value of the line is cut to it.
#[test]
fn response_mask_and_length_cut_padding() {
    let rollouts = read("padded.jsonl", GRPO);
    assert_eq!(rollouts.batch.layout.token_offsets, vec![0, 2, 5, 9, 9]);
    assert_eq!(
        input(&rollouts.batch, GRPO, "logp"),
        &[-1.0, -2.0, -1.0, -2.0, -3.0, -1.0, -2.0, -3.0, -4.0]
    );
    assert_eq!(
        input(&rollouts.batch, GRPO, "old_logp"),
        input(&rollouts.batch, GRPO, "logp")
    );
    assert!(rollouts.warnings.is_empty(), "{:?}", rollouts.warnings);
    assert_eq!(rollouts.unknown_length, None);
}

/// A mask may end with 0 inside a response once `length` says so; the defaults fill the true length.
#[test]
fn length_makes_a_trailing_zero_mask_a_weight() {
    let text = "{\"group\": 1, \"logp\": [-1, -2, -3], \"mask\": [1, 1, 0], \"length\": 3}\n\
                {\"group\": 1, \"length\": 2, \"logp\": [-1, -2, -3]}\n";
    let recipe = recipe(MASKED);
    let rollouts = read_rollouts(text, &recipe).unwrap();
    assert_eq!(rollouts.batch.layout.token_offsets, vec![0, 3, 5]);
    assert_eq!(
        input(&rollouts.batch, MASKED, "mask"),
        &[1.0, 1.0, 0.0, 1.0, 1.0]
    );
}

/// Without token-level inputs, `length` is the only source of the token count; lines without it are
/// recorded so that a recipe reading `length` can refuse them.
#[test]
fn length_without_token_arrays() {
    let text = "{\"group\": 1, \"cluster\": 1, \"length\": 4}\n{\"group\": 1, \"cluster\": 2}\n";
    let rollouts = read_rollouts(text, &recipe(CLUSTER)).unwrap();
    assert_eq!(rollouts.batch.layout.token_offsets, vec![0, 4, 4]);
    assert_eq!(rollouts.unknown_length, Some(2));
}

#[test]
fn a_mask_ending_with_zero_is_refused_without_response_mask_or_length() {
    let error = fail("bad/padded_mask.jsonl", MASKED);
    assert_eq!(error.line, Some(1));
    assert_eq!(error.key.as_deref(), Some("mask"));
    let text = error.to_string();
    for part in [
        "`mask` ends with 0",
        "3 in logp",
        "\"response_mask\"",
        "\"length\": 3",
    ] {
        assert!(text.contains(part), "{text}");
    }
}

/// TRL's `completion_mask` is not a recipe input here, and still says the arrays may be padded.
#[test]
fn an_ignored_completion_mask_ending_with_zero_is_refused_too() {
    let error = fail("bad/padded_completion_mask.jsonl", GRPO);
    assert_eq!(error.line, Some(2));
    assert_eq!(error.key.as_deref(), Some("completion_mask"));
    assert!(
        error.to_string().contains("`completion_mask` ends with 0"),
        "{error}"
    );
}

#[test]
fn response_mask_and_length_errors() {
    let cases = [
        (
            "bad/response_mask_gap.jsonl",
            "response_mask",
            "element 2 is 1 after a 0 at element 1",
        ),
        (
            "bad/response_mask_width.jsonl",
            "response_mask",
            "`response_mask` has 2 values but the token arrays have 3 (logp)",
        ),
        (
            "bad/length_too_long.jsonl",
            "length",
            "`length` is 4 but the token arrays have only 3 values (logp)",
        ),
        (
            "bad/length_disagrees.jsonl",
            "length",
            "`length` is 3 but `response_mask` has 2 ones",
        ),
        (
            "bad/length_fraction.jsonl",
            "length",
            "expected the response's token count (a whole number ≥ 0), found the number 2.5",
        ),
    ];
    for (file, key, message) in cases {
        let error = fail(file, GRPO);
        assert_eq!(error.line, Some(1), "{file}: {error}");
        assert_eq!(error.key.as_deref(), Some(key), "{file}: {error}");
        assert!(error.to_string().contains(message), "{file}: {error}");
    }
    let huge = fail_text("{\"group\": 1, \"cluster\": 1, \"length\": 1e12}", CLUSTER);
    assert_eq!(huge.key.as_deref(), Some("length"), "{huge}");
    assert!(huge.to_string().contains("more than the 1048576"), "{huge}");
}

#[test]
fn reserved_keys_cannot_be_recipe_inputs() {
    for name in ["length", "response_mask"] {
        let source = format!("input {name} : f32[resp]\nreward = {name}");
        let checked = rlx_compiler::check_source("t.rlx", &source);
        let Some(recipe) = checked.recipe else {
            continue;
        };
        let error = read_rollouts("{\"group\": 1}", &recipe).unwrap_err();
        assert_eq!(error.key.as_deref(), Some(name), "{error}");
        assert!(error.to_string().contains("rename the input"), "{error}");
    }
}

#[test]
fn duplicate_keys_are_errors() {
    assert_error(
        &fail("bad/duplicate_key.jsonl", GRPO),
        Some(2),
        Some("score"),
        "line 2, key `score`: duplicate key `score`: a key may appear once per line (JSON readers disagree on which copy counts)",
    );
    assert_error(
        &fail("bad/duplicate_criterion.jsonl", RUBRIC),
        Some(1),
        Some("judged"),
        "line 1, key `judged`: duplicate key `voice` in the object of `judged`: a key may appear once per object",
    );
}

#[test]
fn invalid_utf8_names_the_line() {
    let path = format!(
        "{}/tests/data/bad/invalid_utf8.jsonl",
        env!("CARGO_MANIFEST_DIR")
    );
    let bytes = std::fs::read(&path).unwrap();
    assert_error(
        &decode(&bytes).unwrap_err(),
        Some(2),
        None,
        "line 2: invalid UTF-8 at byte 13 of the line (a rollout file is UTF-8 text)",
    );
    let message = rlx_runtime::rollouts::read_file(std::path::Path::new(&path)).unwrap_err();
    assert!(message.ends_with("invalid_utf8.jsonl: line 2: invalid UTF-8 at byte 13 of the line (a rollout file is UTF-8 text)"), "{message}");
    assert!(decode(data("grpo.jsonl").as_bytes()).is_ok());
}

// -------------------------------------------------------------------------------------------------
// Matrices (docs/language.md "Matrices"): an array of rows per line, flat row-major in the batch.

const MATRICES: &str = "
rubric style {
    criterion voice
    criterion grounded
}
input judged : f32[resp, style]
input a      : f32[batch, style, style]
input w      : f32[group, dim, style]
input m      : f32[resp, dim, dim]
input emb    : f32[resp, dim]
reward = dot(dot(judged, a), judged) + dot(dot(emb, w), judged) + dot(dot(m, emb), emb)
";

#[test]
fn matrices_are_read_row_major_with_the_files_dim() {
    let text = concat!(
        r#"{"group": 0, "judged": [1, 0], "a": [[1, 2], [3, 4]], "w": [[1, 2], [3, 4], [5, 6]], "m": [[1, 0, 0], [0, 1, 0], [0, 0, 1]], "emb": [1, 2, 3]}"#,
        "\n",
        r#"{"group": 0, "judged": [0, 1], "a": [[1, 2], [3, 4]], "w": [[1, 2], [3, 4], [5, 6]], "m": [[0, 1, 2], [3, 4, 5], [6, 7, 8]], "emb": [0, 0, 1]}"#,
        "\n"
    );
    let recipe = recipe(MATRICES);
    let rollouts = read_rollouts(text, &recipe).expect("reads");
    validate_batch(&rollouts.batch, &recipe).expect("valid");
    let batch = &rollouts.batch;
    assert_eq!(batch.layout.dim, 3);
    let named = |name: &str| {
        let index = recipe
            .inputs
            .iter()
            .position(|i| i.name == name)
            .expect("input");
        batch.inputs[index].clone()
    };
    assert_eq!(named("a"), [1.0, 2.0, 3.0, 4.0]);
    assert_eq!(named("w"), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(
        named("m"),
        [
            1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0,
            8.0
        ]
    );
}

#[test]
fn malformed_matrices_are_errors_naming_the_line_and_key() {
    let line = |a: &str, w: &str, m: &str, emb: &str| {
        format!(r#"{{"group": 0, "judged": [1, 0], "a": {a}, "w": {w}, "m": {m}, "emb": {emb}}}"#)
    };
    let (a, w, m, emb) = (
        "[[1, 2], [3, 4]]",
        "[[1, 2], [3, 4]]",
        "[[1, 0], [0, 1]]",
        "[1, 2]",
    );
    let cases = [
        (
            line("[[1, 2], [3]]", w, m, emb),
            "a",
            "row 1: expected 2 values, one per criterion of rubric `style` (voice, grounded), found 1",
        ),
        (
            line("[[1, 2]]", w, m, emb),
            "a",
            "expected 2 rows, one per criterion of rubric `style` (voice, grounded), found 1",
        ),
        (
            line(a, w, "[[1, 0, 0], [0, 1, 0]]", emb),
            "m",
            "a `dim, dim` matrix is square: 2 rows of 3 values",
        ),
        (
            line(a, "[[1, 2], [3, 4], [5]]", m, emb),
            "w",
            "row 2: expected 2 values, one per criterion of rubric `style` (voice, grounded), found 1",
        ),
        (
            line(a, w, m, "[1, 2]").replace(r#""m": [[1, 0], [0, 1]]"#, r#""m": [[1, 0, 0], [0, 1, 0], [0, 0, 1]]"#),
            "m",
            "the dim length differs: w has 2 on line 1, m has 3 on line 1",
        ),
        (line(a, w, "[1, 0, 0, 1]", emb), "m", "row 0: expected an array"),
    ];
    for (text, key, message) in cases {
        let error = fail_text(&text, MATRICES);
        assert_eq!(error.key.as_deref(), Some(key), "{error}");
        assert_eq!(error.line, Some(1), "{error}");
        assert!(
            error.to_string().contains(message),
            "{error}\nwanted: {message}"
        );
    }
}
