//! `rlxc fmt` (compiler/src/format.rs) on every `.rlx` file of the repository, and on comments in
//! every position: the shipped files are formatted (a fixed point), every file formats stably
//! (idempotent, the same tree), and no comment is dropped or moves across code.

use std::path::{Path, PathBuf};

use rlx_compiler::syntax::trivia::Trivia;
use rlx_compiler::FileId;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `.rlx` file under `folder`, recursively, sorted.
fn rlx_files(folder: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        let entries = std::fs::read_dir(dir)
            .unwrap_or_else(|error| panic!("cannot read {}: {error}", dir.display()));
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|ext| ext == "rlx") {
                found.push(path);
            }
        }
    }
    let mut found = Vec::new();
    walk(&root().join(folder), &mut found);
    found.sort();
    found
}

fn format(text: &str) -> Result<String, Vec<rlx_compiler::Diagnostic>> {
    rlx_compiler::format::format_source(FileId(0), text)
}

/// The parsed tree as JSON without positions.
fn tree(text: &str) -> serde_json::Value {
    fn strip(value: serde_json::Value) -> serde_json::Value {
        use serde_json::Value;
        match value {
            Value::Object(map) => {
                if map.len() == 2 && map.contains_key("start") && map.contains_key("end") {
                    return Value::Null;
                }
                Value::Object(
                    map.into_iter()
                        .filter(|(key, _)| key != "span" && !key.ends_with("_span"))
                        .map(|(key, value)| (key, strip(value)))
                        .collect(),
                )
            }
            Value::Array(items) => Value::Array(items.into_iter().map(strip).collect()),
            other => other,
        }
    }
    let module = rlx_compiler::syntax::parse_module(FileId(0), text).expect("parses");
    strip(serde_json::to_value(module).expect("serialises"))
}

/// The code before each comment of `text`: the text before it without blanks, commas (the
/// formatter drops trailing ones), doc lines and comments. Equal lists before and after formatting
/// mean every comment kept its place among the tokens, in order.
fn code_before_comments(text: &str) -> Vec<(String, String)> {
    let trivia = Trivia::scan(text);
    let mut skipped: Vec<std::ops::Range<usize>> = trivia
        .comments()
        .iter()
        .map(|comment| comment.span.range())
        .collect();
    skipped.extend(trivia.docs().iter().map(|doc| doc.range()));
    let code = |end: usize| -> String {
        text[..end]
            .char_indices()
            .filter(|(index, c)| {
                !c.is_whitespace()
                    && *c != ','
                    && !skipped.iter().any(|range| range.contains(index))
            })
            .map(|(_, c)| c)
            .collect()
    };
    trivia
        .comments()
        .iter()
        .map(|comment| (comment.text.clone(), code(comment.span.start as usize)))
        .collect()
}

/// Format `text` and check the promises; returns the formatted text.
fn check(text: &str) -> String {
    let formatted = format(text).unwrap_or_else(|errors| panic!("{errors:?}\n{text}"));
    assert_eq!(
        format(&formatted).expect("the output parses"),
        formatted,
        "formatting twice changes it:\n{formatted}"
    );
    assert_eq!(
        tree(text),
        tree(&formatted),
        "the tree changed:\n{formatted}"
    );
    for line in formatted.lines() {
        assert_eq!(line, line.trim_end(), "trailing blanks:\n{formatted}");
    }
    formatted
}

/// `check`, and every comment stays between the same tokens.
fn check_in_place(text: &str) -> String {
    let formatted = check(text);
    assert_eq!(
        code_before_comments(text),
        code_before_comments(&formatted),
        "a comment moved across code:\n{formatted}"
    );
    formatted
}

/// The shipped files the formatter would make worse: their authors broke argument or parameter
/// lists over several lines, which the formatter joins (it breaks only an item's top-level operator
/// chain and hangs a value after its `=`; it does not break a long argument list).
const AUTHOR_BROKEN_LISTS: &[&str] = &["recipes/clip_cov.rlx", "stdlib/loss.rlx"];

#[test]
fn every_shipped_file_is_formatted() {
    let mut count = 0;
    for folder in ["recipes", "stdlib", "examples"] {
        for path in rlx_files(folder) {
            let text = std::fs::read_to_string(&path).expect("readable");
            let formatted = check_in_place(&text);
            let name = path
                .strip_prefix(root())
                .map_or_else(|_| path.display().to_string(), |p| p.display().to_string());
            if AUTHOR_BROKEN_LISTS.contains(&name.as_str()) {
                assert_ne!(
                    formatted, text,
                    "{name} is formatted now: drop it from the list"
                );
            } else {
                assert!(
                    formatted == text,
                    "{name} is not formatted (run `rlxc fmt {name}`); the formatter writes:\n{formatted}"
                );
            }
            count += 1;
        }
    }
    assert!(count >= 50, "only {count} shipped files");
}

/// The test inputs are written in many layouts (some on purpose): every one that parses formats
/// stably, keeps its tree, and keeps its comments in place.
#[test]
fn every_test_file_formats_stably() {
    let mut count = 0;
    for path in rlx_files("tests") {
        let text = std::fs::read_to_string(&path).expect("readable");
        if format(&text).is_err() {
            continue;
        }
        check_in_place(&text);
        count += 1;
    }
    assert!(count >= 150, "only {count} test files parse");
}

#[test]
fn comments_before_and_after_declarations() {
    let text = "// file header\n\n// about x\ninput x : f32[resp] // trailing\n\
                input y : f32[resp]\n\n\n// before the params, after blank lines\n\
                param a = 1\n// between params\nparam bb = 2 // b\n";
    let expected = "// file header\n\n// about x\ninput x : f32[resp] // trailing\n\
                    input y : f32[resp]\n\n// before the params, after blank lines\n\
                    param a  = 1\n// between params\nparam bb = 2 // b\n";
    assert_eq!(check_in_place(text), expected);
}

#[test]
fn trailing_comments_align_in_a_run() {
    let text = "param a = 1 // one\nparam bbb = 2 // two\n";
    assert_eq!(
        check_in_place(text),
        "param a   = 1  // one\nparam bbb = 2  // two\n"
    );
}

#[test]
fn comments_inside_expressions_spanning_lines() {
    // between a call's arguments, before `over`, around operators, in parentheses, in an index
    let text = "input x : f32[tok]\n\
                loss = mean(x // the values\n  over tok)\n\
                metric m = clamp(x, // low\n  0, hi = // the top\n  1)\n\
                metric p = (x // inner\n) * // times\n  2\n\
                metric i = x[ // which\n  voice]\n";
    let expected = "input x : f32[tok]\n\n\
                    loss     = mean(x // the values\n    over tok)\n\
                    metric m = clamp(x, // low\n    0, hi = // the top\n    1)\n\
                    metric p = (x // inner\n    ) * // times\n    2\n\
                    metric i = x[ // which\n    voice]\n";
    assert_eq!(check_in_place(text), expected);

    // between the operands of a chain: one operand per line, the comments after theirs
    let text = "reward = a // first\n  + b // second\n  - c\n";
    assert_eq!(
        check_in_place(text),
        "reward = a  // first\n       + b  // second\n       - c\n"
    );

    // between a function's parameters
    let text = "fn f(a, // the first\n  b = 2 // the second\n  ) = a + b\n";
    assert_eq!(
        check_in_place(text),
        "fn f(a, // the first\n    b = 2 // the second\n    ) = a + b\n"
    );

    // between the `=` and a value on the next line
    let text = "let x = // why\n  1\n";
    assert_eq!(check_in_place(text), "let x = // why\n    1\n");
}

#[test]
fn comments_inside_rubric_and_rollout_blocks() {
    let text = "rubric r { // after the brace\n  // leading\n  criterion x weight 1 // trailing\n\n\
                // after a blank line\n  criterion y veto\n  // before the close\n} // after the close\n\
                rollout { n = 8, // eight\n  // own line\n  temperature = 1.0 }\n";
    let expected = "rubric r { // after the brace\n    // leading\n    criterion x weight 1 // trailing\n\n    \
                    // after a blank line\n    criterion y veto\n    // before the close\n} // after the close\n\n\
                    rollout {\n    n = 8 // eight\n    // own line\n    temperature = 1.0\n}\n";
    assert_eq!(check_in_place(text), expected);

    // in a `{ let … }` block
    let text = "fn f(x) = { // open\n  let a = x // a\n  // before the body\n  a\n  // before the close\n}\n";
    let expected =
        "fn f(x) = { // open\n    let a = x // a\n    // before the body\n    a\n    // before the close\n}\n";
    assert_eq!(check_in_place(text), expected);
}

#[test]
fn comments_at_the_end_of_the_file() {
    assert_eq!(
        check_in_place("reward = 1 // last code\n// end\n\n\n// very end"),
        "reward = 1 // last code\n// end\n\n// very end\n"
    );
    assert_eq!(check_in_place("// only a comment"), "// only a comment\n");
}

/// The one place a comment moves: inside an item's head it goes to a line of its own just above
/// its item (never past another item), and it is kept.
#[test]
fn a_comment_in_an_item_head_goes_above_its_item() {
    let text = "input a : f32[resp]\ninput b // in the head\n  : f32[resp]\n";
    let formatted = check(text);
    assert_eq!(
        formatted,
        "input a : f32[resp]\n// in the head\ninput b : f32[resp]\n"
    );
}
