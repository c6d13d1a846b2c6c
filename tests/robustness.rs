//! A malformed recipe of any bytes gets diagnostics, never a panic, a stack overflow or a hang:
//! property tests over random bytes and mutated real recipes, then hand-made adversarial inputs.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::sample::Index;
use rlx_compiler::{check_source, Checked, Diagnostic};

/// A hang guard, not a benchmark: every input here is checked in milliseconds.
const TIME_LIMIT: Duration = Duration::from_secs(5);

/// Check `text` and assert the compiler's contract for any input; returns the result for more checks.
fn check_any(text: &str) -> Checked {
    let started = Instant::now();
    let checked = check_source("fuzz.rlx", text);
    let elapsed = started.elapsed();
    let preview: String = text.chars().take(200).collect();
    assert!(
        elapsed < TIME_LIMIT,
        "checking took {elapsed:?} (limit {TIME_LIMIT:?}) for {} bytes starting {preview:?}",
        text.len()
    );
    for diagnostic in &checked.diagnostics {
        assert_ne!(
            diagnostic.code, "rlx::internal",
            "the compiler panicked on {preview:?}: {}",
            diagnostic.message
        );
    }
    if checked.recipe.is_none() {
        assert!(
            checked.has_errors(),
            "no recipe and no error for {preview:?}: {:#?}",
            checked.diagnostics
        );
    }
    for diagnostic in &checked.diagnostics {
        assert_labels_in_bounds(&checked, diagnostic, &preview);
    }
    checked
}

/// Every label of `diagnostic` (and of its related notes) lies within its file, on char boundaries.
fn assert_labels_in_bounds(checked: &Checked, diagnostic: &Diagnostic, preview: &str) {
    let text = &checked.sources.get(diagnostic.file).text;
    for label in &diagnostic.labels {
        let (start, end) = (label.span.start as usize, label.span.end as usize);
        assert!(
            start <= end && end <= text.len(),
            "{}: label {start}..{end} outside a {}-byte file, for {preview:?}",
            diagnostic.code,
            text.len()
        );
        assert!(
            text.is_char_boundary(start) && text.is_char_boundary(end),
            "{}: label {start}..{end} splits a character, for {preview:?}",
            diagnostic.code
        );
    }
    for related in &diagnostic.related {
        assert_labels_in_bounds(checked, related, preview);
    }
}

fn codes(checked: &Checked) -> Vec<&'static str> {
    checked.diagnostics.iter().map(|d| d.code).collect()
}

/// Check `text` and expect an error with `code`.
fn expect_code(what: &str, text: &str, code: &str) -> Checked {
    let checked = check_any(text);
    assert!(
        checked.recipe.is_none() && codes(&checked).contains(&code),
        "{what}: expected {code}, got {:?}",
        codes(&checked)
    );
    checked
}

// ---------------------------------------------------------------------------------------------
// Inputs for the property tests

/// The real recipes and standard-library modules, read once at run time.
fn corpus() -> &'static [(String, Vec<u8>)] {
    static CORPUS: OnceLock<Vec<(String, Vec<u8>)>> = OnceLock::new();
    CORPUS.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let mut files = Vec::new();
        for dir in ["recipes", "stdlib"] {
            let entries =
                std::fs::read_dir(root.join(dir)).unwrap_or_else(|error| panic!("{dir}: {error}"));
            for entry in entries {
                let path = entry.expect("directory entry").path();
                if path.extension().is_some_and(|ext| ext == "rlx") {
                    let bytes = std::fs::read(&path)
                        .unwrap_or_else(|error| panic!("{}: {error}", path.display()));
                    files.push((path.display().to_string(), bytes));
                }
            }
        }
        files.sort();
        assert!(files.len() >= 4, "recipes and stdlib not found");
        files
    })
}

/// Words and symbols of the language (and a few near misses) to splice into recipes.
const VOCABULARY: &[&str] = &[
    "import",
    "input",
    "param",
    "fn",
    "let",
    "rubric",
    "metric",
    "keep",
    "when",
    "over",
    "others",
    "other",
    "other.",
    "rollout",
    "true",
    "false",
    "and",
    "or",
    "not",
    "reward",
    "advantage",
    "loss",
    "criterion",
    "interact",
    "weight",
    "points",
    "levels",
    "veto",
    "saturate",
    "aggregate",
    "on_veto",
    "shape",
    "policy",
    "value",
    "product",
    "min",
    "group",
    "resp",
    "tok",
    "batch",
    "crit",
    "dim",
    "f32",
    "i32",
    "bool",
    "std/loss",
    "std/agg.{token_mean}",
    "\"./x.rlx\"",
    "inf",
    "-inf",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ",",
    ".",
    ":",
    "=",
    "==",
    "!=",
    "<",
    "<=",
    ">",
    ">=",
    "+",
    "-",
    "*",
    "/",
    "^",
    "//",
    "///",
    "\n",
    " ",
    "\"",
    "\\",
    "0",
    "1",
    "-1",
    "0.5",
    "1e-3",
    "1e999",
    "99999999999",
    "x",
    "logp",
    "old_logp",
    "reward",
    "mean",
    "sum",
    "std",
    "max",
    "clamp",
    "exp",
    "log",
    "where",
    "stopgrad",
    "scan",
    "cos",
    "ppo_clip",
    "group_zscore",
    "token_mean",
    "k3",
    "ratio",
    "judged",
    "style",
    "voice",
    "tanh",
    "é",
    "∂",
    "\u{0}",
    "\t",
];

#[derive(Clone, Debug)]
enum Mutation {
    Delete(Index, Index),
    Duplicate(Index, Index),
    Swap(Index, Index, Index),
    Insert(Index, Index),
    Truncate(Index),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Mutation::Delete(a, b)),
        (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Mutation::Duplicate(a, b)),
        (any::<Index>(), any::<Index>(), any::<Index>())
            .prop_map(|(a, b, c)| Mutation::Swap(a, b, c)),
        (any::<Index>(), any::<Index>()).prop_map(|(at, word)| Mutation::Insert(at, word)),
        (any::<Index>(), any::<Index>()).prop_map(|(at, word)| Mutation::Insert(at, word)),
        any::<Index>().prop_map(Mutation::Truncate),
    ]
}

/// A range of at most 64 bytes of `len`, from two indices.
fn short_range(len: usize, a: &Index, b: &Index) -> (usize, usize) {
    if len == 0 {
        return (0, 0);
    }
    let start = a.index(len);
    let end = (start + 1 + b.index(64)).min(len);
    (start, end)
}

fn apply(bytes: &mut Vec<u8>, mutation: &Mutation) {
    let len = bytes.len();
    match mutation {
        Mutation::Delete(a, b) => {
            let (start, end) = short_range(len, a, b);
            bytes.drain(start..end);
        }
        Mutation::Duplicate(a, b) => {
            let (start, end) = short_range(len, a, b);
            let copy = bytes[start..end].to_vec();
            bytes.splice(end..end, copy);
        }
        Mutation::Swap(a, b, c) => {
            // Two adjacent ranges [start, mid) and [mid, end) trade places.
            let (start, end) = short_range(len, a, b);
            if end > start {
                let mid = start + c.index(end - start);
                bytes[start..end].rotate_left(mid - start);
            }
        }
        Mutation::Insert(at, word) => {
            let at = at.index(len + 1);
            let word = VOCABULARY[word.index(VOCABULARY.len())];
            let mut insert = word.as_bytes().to_vec();
            insert.push(b' ');
            bytes.splice(at..at, insert);
        }
        Mutation::Truncate(at) => bytes.truncate(at.index(len + 1)),
    }
}

/// Random text built from the vocabulary: more often near the grammar than random bytes are.
fn token_soup() -> impl Strategy<Value = String> {
    proptest::collection::vec(any::<Index>(), 0..80).prop_map(|words| {
        words
            .iter()
            .map(|word| VOCABULARY[word.index(VOCABULARY.len())])
            .collect::<Vec<_>>()
            .join(" ")
    })
}

// Syntactically valid recipes with random expressions: these get past the parser, so the property
// tests reach name resolution, level and type checking, rubric expansion and inlining.

const NAMES: &[&str] = &[
    "lp",
    "old",
    "score",
    "met",
    "cluster",
    "emb",
    "gw",
    "p",
    "q",
    "l1",
    "l2",
    "x",
    "y",
    "style",
    "voice",
    "crit",
    "tok",
    "resp",
    "group",
    "batch",
    "n",
    "step",
    "progress",
    "resp_index",
    "reward",
    "advantage",
    "undefined",
];
const FUNCS: &[&str] = &[
    "mean",
    "sum",
    "max",
    "min",
    "std",
    "var",
    "count",
    "any",
    "all",
    "logsumexp",
    "exp",
    "log",
    "log1p",
    "sqrt",
    "sigmoid",
    "logsigmoid",
    "tanh",
    "softplus",
    "abs",
    "floor",
    "pow",
    "clamp",
    "where",
    "stopgrad",
    "cos",
    "scan",
    "f1",
    "f2",
    "style",
    "ppo_clip",
    "k3",
    "token_mean",
    "group_zscore",
    "partition_diversity",
    "sat_tanh",
    "nope",
];
const AXES: &[&str] = &[
    "tok", "resp", "group", "batch", "others", "crit", "dim", "style", "reverse",
];
const BINARY: &[&str] = &[
    "or", "and", "==", "!=", "<", "<=", ">", ">=", "+", "-", "*", "/", "^",
];

fn pick(list: &'static [&'static str]) -> impl Strategy<Value = &'static str> {
    proptest::sample::select(list)
}

fn expr_text() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        4 => pick(NAMES).prop_map(str::to_string),
        2 => prop_oneof![
            Just("0"), Just("1"), Just("2"), Just("0.5"), Just("1e-6"), Just("1e30"), Just("2147483647"),
        ]
        .prop_map(str::to_string),
        1 => prop_oneof![Just("true"), Just("false")].prop_map(str::to_string),
        1 => pick(NAMES).prop_map(|name| format!("other.{name}")),
    ];
    leaf.prop_recursive(5, 48, 4, |inner| {
        prop_oneof![
            3 => (inner.clone(), pick(BINARY), inner.clone())
                .prop_map(|(lhs, op, rhs)| format!("{lhs} {op} {rhs}")),
            1 => (prop_oneof![Just("-"), Just("not ")], inner.clone())
                .prop_map(|(op, operand)| format!("{op}{operand}")),
            1 => inner.clone().prop_map(|inner| format!("({inner})")),
            1 => (inner.clone(), pick(NAMES)).prop_map(|(base, crit)| format!("({base})[{crit}]")),
            3 => (
                pick(FUNCS),
                proptest::collection::vec(inner.clone(), 0..4),
                proptest::option::of(proptest::collection::vec(pick(AXES), 1..3)),
                proptest::option::of((pick(&["ddof", "decay", "eps", "x", "k"]), inner.clone())),
            )
                .prop_map(|(func, args, over, named)| {
                    let mut args = args;
                    if let (Some(axes), Some(first)) = (&over, args.first_mut()) {
                        *first = format!("{first} over {}", axes.join(", "));
                    }
                    if let Some((name, value)) = named {
                        args.push(format!("{name} = {value}"));
                    }
                    format!("{func}({})", args.join(", "))
                }),
            1 => (pick(NAMES), inner.clone(), inner.clone())
                .prop_map(|(name, value, body)| format!("{{ let {name} = {value}  {body} }}")),
        ]
    })
}

fn recipe_text() -> impl Strategy<Value = String> {
    (
        proptest::collection::vec(expr_text(), 9),
        proptest::collection::vec(any::<bool>(), 8),
        pick(&["f32[tok]", "f32[resp]", "f32[group]", "bool[resp]", "i32[resp]", "f32", "f32[resp, dim]"]),
        pick(&["f32[resp, style]", "bool[resp, style]", "f32[group, crit]", "f32[resp, crit]"]),
    )
        .prop_map(|(exprs, include, ty, rubric_ty)| {
            let mut text = String::new();
            if include[0] {
                text.push_str("import std/loss.{ppo_clip, k3}\nimport std/agg\n");
            }
            if include[1] {
                text.push_str("import std/advantage\nimport std/diversity\nimport std/rubric\n");
            }
            text.push_str(&format!(
                "input lp : f32[tok] policy\ninput old : f32[tok]\ninput score : {ty}\n\
                 input met : {rubric_ty}\ninput cluster : i32[resp] = 0\ninput emb : f32[resp, dim]\n\
                 input gw : f32[group] value\nparam p = 0.5\nparam q : i32 = -3\n"
            ));
            if include[2] {
                text.push_str(
                    "rubric style {\n  criterion voice weight 2 levels [0, 0.5, 1] saturate tanh(k = 3)\n  \
                     criterion grounded weight p veto\n  interact voice, grounded : min 0.5\n  \
                     shape power(gamma = 2)\n  on_veto penalty(value = -1)\n}\n",
                );
            }
            text.push_str(&format!("fn f1(x, y = 1) = {}\n", exprs[0]));
            text.push_str(&format!("fn f2(x: f32[resp]): f32[resp] = {}\n", exprs[1]));
            text.push_str(&format!("let l1 = {}\nlet l2 = {}\n", exprs[2], exprs[3]));
            if include[3] {
                text.push_str(&format!("reward = {}\n", exprs[4]));
            }
            if include[4] {
                text.push_str(&format!("advantage = {}\n", exprs[5]));
            }
            if include[5] {
                text.push_str(&format!("loss = {}\n", exprs[6]));
            }
            if include[6] {
                text.push_str(&format!("metric m = {}\n", exprs[7]));
            }
            if include[7] {
                text.push_str(&format!("keep group when {}\n", exprs[8]));
            }
            text
        })
}

/// A recipe that checks cleanly, one declaration a line.
const BASE_RECIPE: &[&str] = &[
    "import std/loss.{ppo_clip, k3}",
    "import std/advantage.{group_zscore}",
    "import std/agg.{token_mean}",
    "input logp : f32[tok] policy",
    "input old_logp : f32[tok]",
    "input score : f32[resp]",
    "input met : f32[resp, style]",
    "rubric style { criterion voice weight 1 criterion flag veto }",
    "let ratio = exp(logp - old_logp)",
    "reward = score + style(met)",
    "advantage = group_zscore(reward)",
    "loss = token_mean(ppo_clip(ratio, advantage))",
    "metric m = mean(reward over batch)",
];

/// `BASE_RECIPE` with one right-hand side replaced by a random expression.
fn nearly_valid_recipe() -> impl Strategy<Value = String> {
    (any::<Index>(), expr_text()).prop_map(|(slot, expr)| {
        let mut lines: Vec<String> = BASE_RECIPE.iter().map(|line| line.to_string()).collect();
        // Replace the right-hand side of one of the `=` lines with the random expression.
        let candidates: Vec<usize> = (0..lines.len())
            .filter(|&i| lines[i].contains(" = "))
            .collect();
        let target = candidates[slot.index(candidates.len())];
        let (lhs, _) = lines[target].split_once(" = ").expect("an = line");
        lines[target] = format!("{lhs} = {expr}");
        lines.join("\n")
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_get_diagnostics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let text = String::from_utf8_lossy(&bytes);
        check_any(&text);
    }

    #[test]
    fn arbitrary_token_sequences_get_diagnostics(text in token_soup()) {
        check_any(&text);
    }

    #[test]
    fn random_well_formed_recipes_get_diagnostics(text in recipe_text()) {
        check_any(&text);
    }

    #[test]
    fn nearly_valid_recipes_get_diagnostics(text in nearly_valid_recipe()) {
        check_any(&text);
    }

    #[test]
    fn mutated_recipes_get_diagnostics(
        file in any::<Index>(),
        mutations in proptest::collection::vec(mutation(), 1..6),
    ) {
        let corpus = corpus();
        let (_, original) = &corpus[file.index(corpus.len())];
        let mut bytes = original.clone();
        for mutation in &mutations {
            apply(&mut bytes, mutation);
        }
        let text = String::from_utf8_lossy(&bytes);
        check_any(&text);
    }

    #[test]
    fn recipes_with_a_token_spliced_in_get_diagnostics(
        file in any::<Index>(),
        inserts in proptest::collection::vec((any::<Index>(), any::<Index>()), 1..4),
    ) {
        let corpus = corpus();
        let (_, original) = &corpus[file.index(corpus.len())];
        let mut bytes = original.clone();
        for (at, word) in inserts {
            apply(&mut bytes, &Mutation::Insert(at, word));
        }
        let text = String::from_utf8_lossy(&bytes);
        check_any(&text);
    }
}

#[test]
fn the_base_recipe_checks_cleanly() {
    let checked = check_any(&BASE_RECIPE.join("\n"));
    assert!(checked.recipe.is_some(), "{:#?}", checked.diagnostics);
}

#[test]
fn the_unmutated_corpus_is_handled() {
    for (path, bytes) in corpus() {
        let text = std::str::from_utf8(bytes).expect("UTF-8 source");
        let checked = check_any(text);
        if path.contains("recipes") {
            assert!(
                checked.recipe.is_some(),
                "{path}: {:#?}",
                checked.diagnostics
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Adversarial inputs

#[test]
fn nested_parentheses_100k() {
    let n = 100_000;
    let text = format!("reward = {}1{}\n", "(".repeat(n), ")".repeat(n));
    expect_code("100k parentheses", &text, "rlx::too_deep");
    let unclosed = format!("reward = {}1\n", "(".repeat(n));
    expect_code("100k unclosed parentheses", &unclosed, "rlx::too_deep");
    let mixed = format!("reward = {}\n", "([{".repeat(n / 3));
    expect_code("100k mixed brackets", &mixed, "rlx::too_deep");
    let calls = format!("reward = {}x{}\n", "f(".repeat(n), ")".repeat(n));
    expect_code("100k nested calls", &calls, "rlx::too_deep");
}

#[test]
fn prefix_minus_200k() {
    let text = format!("input x : f32[resp]\nreward = {}x\n", "-".repeat(200_000));
    expect_code("200k minus signs", &text, "rlx::too_deep");
    let spaced = format!("input x : f32[resp]\nreward = {}x\n", "- ".repeat(200_000));
    expect_code("200k spaced minus signs", &spaced, "rlx::too_deep");
    let nots = format!(
        "input x : bool[resp]\nreward = {}x\n",
        "not ".repeat(100_000)
    );
    expect_code("100k nots", &nots, "rlx::too_deep");
}

#[test]
fn power_tower_100k() {
    let text = format!("reward = 2{}\n", "^2".repeat(100_000));
    expect_code("2^2^…", &text, "rlx::too_deep");
    let left = format!(
        "input x : f32[resp]\nreward = x{}\n",
        " + x".repeat(100_000)
    );
    expect_code("x + x + …", &left, "rlx::too_deep");
    let indexed = format!("reward = x{}\n", "[c]".repeat(100_000));
    expect_code("x[c][c]…", &indexed, "rlx::too_deep");
}

#[test]
fn two_megabyte_file() {
    let line = "param p = 1 // padding padding padding padding padding padding\n";
    let text = line.repeat((2 << 20) / line.len() + 1);
    assert!(text.len() > 2 << 20);
    expect_code("2 MB file", &text, "rlx::too_large");
    // Just under the limit, and mostly comment: parsed, then diagnosed for what it lacks.
    let comment = format!("// {}\nreward = 1\n", "x".repeat((1 << 20) - 100));
    check_any(&comment);
    // A quarter of the limit in short declarations, then a syntax error at the very end (the error
    // path parses twice). A debug build parses about 0.5 MB/s, so this stays well inside the guard.
    let line = "let v = p + 2 * (1 - p)\n";
    let mut text = line.repeat((1 << 18) / line.len());
    check_any(&text);
    text.push_str("reward = (p +");
    let checked = expect_code("256 KiB then a syntax error", &text, "rlx::syntax");
    let span = checked.diagnostics[0].primary_span().expect("a span");
    // At the end of the file, labelled on the last character.
    assert_eq!(span.end as usize, text.len());
}

#[test]
fn huge_number_literals() {
    let digits = "9".repeat(100_000);
    expect_code(
        "100k-digit integer",
        &format!("reward = {digits}\n"),
        "rlx::bad_number",
    );
    expect_code(
        "100k-digit float",
        &format!("reward = {digits}.5\n"),
        "rlx::bad_number",
    );
    expect_code("1e999", "reward = 1e999\n", "rlx::bad_number");
    expect_code(
        "param",
        &format!("param p = {digits}\nreward = p\n"),
        "rlx::bad_number",
    );
    expect_code(
        "levels",
        &format!("rubric r {{ criterion c levels [{digits}] }}\n"),
        "rlx::bad_number",
    );
    expect_code(
        "exponent",
        &format!("reward = 1e{digits}\n"),
        "rlx::bad_number",
    );
    // Tiny and long but representable: no error from the literal itself.
    let small = format!("reward = 0.{}1\n", "0".repeat(100_000));
    let checked = check_any(&small);
    assert!(!codes(&checked).contains(&"rlx::bad_number"));
}

#[test]
fn exponential_inlining() {
    let mut text = String::from("input score : f32[resp]\nfn f0(x) = x + x\n");
    for k in 1..=30 {
        text.push_str(&format!("fn f{k}(x) = f{}(x) + f{}(x)\n", k - 1, k - 1));
    }
    text.push_str("reward = f30(score)\n");
    expect_code("2^30 inlined calls", &text, "rlx::too_large");

    // The same shape through a block and a default argument.
    let mut text = String::from("input score : f32[resp]\nfn g0(x, y = 1) = x * y\n");
    for k in 1..=30 {
        text.push_str(&format!(
            "fn g{k}(x, y = 1) = {{ let a = g{p}(x, y)  g{p}(a, g{p}(x)) }}\n",
            p = k - 1
        ));
    }
    text.push_str("reward = g30(score)\n");
    expect_code("3^30 inlined calls", &text, "rlx::too_large");
}

#[test]
fn deep_call_chains_and_many_items() {
    // 10 000 functions each calling the previous once: deeper than the call limit, linear in size.
    let mut text = String::from("input score : f32[resp]\nfn h0(x) = x\n");
    for k in 1..10_000 {
        text.push_str(&format!("fn h{k}(x) = h{}(x) + 1\n", k - 1));
    }
    text.push_str("reward = h9999(score)\n");
    expect_code("10k-deep call chain", &text, "rlx::too_deep");

    // 20 000 lets each using the previous: a chain of globals.
    let mut text = String::from("input score : f32[resp]\nlet v0 = score\n");
    for k in 1..20_000 {
        text.push_str(&format!("let v{k} = v{} + 1\n", k - 1));
    }
    text.push_str("reward = v19999\nadvantage = reward\nloss = 0\n");
    check_any(&text);

    // 50 000 declarations of the same name.
    let text = "param p = 1\n".repeat(50_000);
    check_any(&text);
}

// ---------------------------------------------------------------------------------------------
// Rendering for people: `rlxc check` and `rlx score` on inputs whose labels sit far to the right or
// that have thousands of diagnostics (src/diagnostics.rs).

mod child;

/// Run `rlxc check` (human reports) and `rlx score` on `text` and expect a clean error exit with
/// `code` on stderr: no panic, and no huge line echoed.
fn expect_rendered(what: &str, text: &str, code: &str) -> String {
    let directory = child::scratch(&format!("render-{}", what.replace(' ', "-")));
    let recipe = directory.join("recipe.rlx");
    std::fs::write(&recipe, text).unwrap();
    let check = child::run_bounded(child::rlxc().arg("check").arg(&recipe));
    let score = child::run_bounded(
        child::rlx()
            .arg("score")
            .arg(&recipe)
            .args(["--rollouts", "none.jsonl"]),
    );
    for output in [&check, &score] {
        let stderr = child::stderr(output);
        assert_eq!(output.status.code(), Some(1), "{what}: {stderr}");
        assert!(!stderr.contains("panicked"), "{what}: {stderr}");
        assert!(stderr.contains(code), "{what}: no {code} in {stderr}");
        assert!(
            stderr.lines().all(|line| line.chars().count() < 1000),
            "{what}: a line of over 1000 characters on stderr"
        );
    }
    std::fs::remove_dir_all(&directory).ok();
    child::stderr(&check)
}

#[test]
fn labels_past_column_65535_render() {
    // 16.6 kB of tabs (66 400 display columns) before an unknown name.
    let tabs = format!(
        "input score : f32[resp]\nreward = {}nope\n",
        "\t".repeat(16_600)
    );
    let stderr = expect_rendered("tabs", &tabs, "rlx::unknown_name");
    assert!(stderr.contains('…'), "the line is elided: {stderr}");
    assert!(
        stderr.contains("recipe.rlx:2:16610"),
        "the column is the file's: {stderr}"
    );
    // A 70 000-character name, then a second unknown name after it.
    let long_name = format!("reward = {} + nope\n", "a".repeat(70_000));
    let stderr = expect_rendered("long name", &long_name, "rlx::unknown_name");
    assert!(
        stderr.contains("more characters"),
        "the message is elided: {stderr}"
    );
    // 33 000 CJK characters (66 000 columns) in a string, a syntax error after it.
    let cjk = format!("import \"./{}.rlx\" oops\n", "漢".repeat(33_000));
    expect_rendered("cjk", &cjk, "rlx::syntax");
    // One diagnostic with two labels 70 000 columns apart.
    let apart = format!("param p = 1{}param p = 2\nreward = p\n", " ".repeat(70_000));
    let stderr = expect_rendered("two labels", &apart, "rlx::duplicate");
    assert!(stderr.matches('…').count() >= 1, "{stderr}");
}

#[test]
fn thousands_of_diagnostics_render_the_first_hundred_in_bounded_memory() {
    // 4 000 duplicate imports and a 200 kB comment: each report used to hold a copy of the file.
    let mut text = format!("// {}\n", "x".repeat(200_000));
    text.push_str(&"import std/loss.{k3}\n".repeat(4_001));
    text.push_str("input score : f32[resp]\nreward = score\n");
    let directory = child::scratch("many-diagnostics");
    let recipe = directory.join("recipe.rlx");
    std::fs::write(&recipe, &text).unwrap();
    let output = child::run_bounded(child::rlxc().arg("check").arg(&recipe));
    let stderr = child::stderr(&output);
    assert_eq!(
        output.status.code(),
        Some(1),
        "{}",
        &stderr[..stderr.len().min(2000)]
    );
    assert!(
        stderr.contains("4000 errors in"),
        "{}",
        &stderr[..stderr.len().min(2000)]
    );
    assert!(
        stderr.contains("… and 3900 more"),
        "{}",
        &stderr[stderr.len().saturating_sub(2000)..]
    );
    assert!(stderr.len() < 200_000, "{} bytes of stderr", stderr.len());
    // JSON still lists every diagnostic.
    let json = child::run_bounded(
        child::rlxc()
            .args(["check", "--format", "json"])
            .arg(&recipe),
    );
    let document: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(
        document["files"][0]["diagnostics"]
            .as_array()
            .unwrap()
            .len(),
        4000
    );
    #[cfg(unix)]
    assert!(
        child::peak_child_rss() < 400 << 20,
        "peak child memory {} bytes (it was 1.2 GB)",
        child::peak_child_rss()
    );
    std::fs::remove_dir_all(&directory).ok();
}

#[test]
fn a_byte_order_mark_starts_a_recipe_or_is_named() {
    let checked = check_any(&format!("\u{feff}{}", BASE_RECIPE.join("\n")));
    assert!(checked.recipe.is_some(), "{:#?}", checked.diagnostics);
    let checked = expect_code(
        "a BOM inside",
        "input score : f32[resp]\nreward = score \u{feff}+ 1\n",
        "rlx::syntax",
    );
    assert!(
        checked.diagnostics[0]
            .message
            .contains("U+FEFF (a byte order mark)"),
        "{}",
        checked.diagnostics[0].message
    );
}
