//! `rlxc fmt` on every shipped file: idempotent, and the formatted recipe checks to the same HIR
//! (modules: the same AST), spans aside.

use std::path::PathBuf;

use serde_json::Value;

fn files(folder: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> =
        std::fs::read_dir(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(folder))
            .expect("folder exists")
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "rlx"))
            .collect();
    found.sort();
    found
}

/// A serialised tree without positions: spans, span-like keys and file ids.
fn strip(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(key, _)| key != "span" && !key.ends_with("_span") && key != "file")
                .map(|(key, value)| (key, strip(value)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(strip).collect()),
        other => other,
    }
}

fn format(text: &str) -> String {
    rlx_compiler::format::format_source(rlx_compiler::FileId(0), text).expect("shipped files parse")
}

#[test]
fn formatting_is_idempotent_and_keeps_the_meaning_of_every_recipe() {
    let recipes = files("recipes");
    assert!(recipes.len() >= 3);
    for path in recipes {
        let text = std::fs::read_to_string(&path).unwrap();
        let formatted = format(&text);
        assert_eq!(
            format(&formatted),
            formatted,
            "{}: formatting twice changes it",
            path.display()
        );
        let before = rlx_compiler::check_source("before.rlx", &text);
        let after = rlx_compiler::check_source("after.rlx", &formatted);
        assert!(
            !after.has_errors(),
            "{}: formatted recipe does not check: {:?}",
            path.display(),
            after.diagnostics
        );
        let before =
            strip(serde_json::to_value(before.recipe.expect("shipped recipes check")).unwrap());
        let after = strip(serde_json::to_value(after.recipe.unwrap()).unwrap());
        assert_eq!(
            before,
            after,
            "{}: formatting changed the checked recipe",
            path.display()
        );
    }
}

#[test]
fn formatting_is_idempotent_and_keeps_the_syntax_of_every_module() {
    for path in files("stdlib") {
        let text = std::fs::read_to_string(&path).unwrap();
        let formatted = format(&text);
        assert_eq!(
            format(&formatted),
            formatted,
            "{}: formatting twice changes it",
            path.display()
        );
        let parse = |t: &str| {
            strip(
                serde_json::to_value(
                    rlx_compiler::syntax::parse_module(rlx_compiler::FileId(0), t).unwrap(),
                )
                .unwrap(),
            )
        };
        assert_eq!(
            parse(&text),
            parse(&formatted),
            "{}: formatting changed the syntax tree",
            path.display()
        );
        let checked = rlx_compiler::check_source("module.rlx", &formatted);
        assert!(
            !checked.has_errors(),
            "{}: {:?}",
            path.display(),
            checked.diagnostics
        );
    }
}

#[test]
fn a_leading_byte_order_mark_is_dropped() {
    let text = "input score : f32[resp]\n// a comment\nreward = score\n";
    assert_eq!(format(&format!("\u{feff}{text}")), format(text));
}
