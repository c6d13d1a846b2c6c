//! Data-driven protocol tests: every `tests/cases/NAME.json` is a session an editor could have with
//! the server, and `tests/cases/NAME.expected.json` holds what the server must answer, step by step.
//! `RLX_BLESS=1 cargo test -p rlx-lsp --test protocol` rewrites the expected files (review the diff).
//!
//! # Case format
//!
//! ```text
//! { "steps": [
//!     { "open": "recipe.rlx" },                       // didOpen of tests/fixtures/recipe.rlx; records
//!                                                     // the diagnostics it publishes
//!     { "change": { "replace": "TEXT", "with": "NEW" } },  // an incremental didChange of the open
//!                                                     // document (TEXT must occur once); records the
//!                                                     // diagnostics
//!     { "request": "textDocument/hover", "at": "let ra|tio" },  // a request at the cursor `|`
//!                                                     // (the text around it must occur once)
//!     { "request": "textDocument/codeAction", "range": "TEXT" },  // a request over a range
//!     { "request": "textDocument/rename", "at": "…", "params": { "newName": "r" } }  // more params
//! ] }
//! ```
//!
//! A step's `"file"` names another open fixture than the last opened one. URIs of fixtures are
//! recorded as `file:///FIXTURES/NAME`, so the expected files do not depend on the checkout's path.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::{file_uri, fixtures, position, Client};
use serde_json::{json, Value};

fn cases() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cases");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/cases exists")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "json")
                && !p.to_string_lossy().ends_with(".expected.json")
        })
        .collect();
    cases.sort();
    cases
}

/// The byte offset of `|` in `marked` once the text around it is found (exactly once) in `text`.
fn cursor(text: &str, marked: &str) -> usize {
    let bar = marked
        .find('|')
        .unwrap_or_else(|| panic!("no `|` in {marked:?}"));
    let plain = marked.replacen('|', "", 1);
    unique(text, &plain) + bar
}

fn unique(text: &str, needle: &str) -> usize {
    let found: Vec<usize> = text.match_indices(needle).map(|(i, _)| i).collect();
    assert_eq!(
        found.len(),
        1,
        "{needle:?} must occur exactly once in the document"
    );
    found[0]
}

fn range(text: &str, start: usize, end: usize) -> Value {
    json!({ "start": position(text, start), "end": position(text, end) })
}

/// Replace the fixtures folder's URI by a stable placeholder.
fn normalise(value: Value) -> Value {
    let prefix = file_uri(&fixtures().join("x"));
    let prefix = prefix.trim_end_matches('x').to_string();
    let text = serde_json::to_string(&value).expect("serialisable");
    serde_json::from_str(&text.replace(&prefix, "file:///FIXTURES/")).expect("still JSON")
}

fn run_case(path: &Path) -> Value {
    let case: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("readable case"))
        .expect("a JSON case");
    let mut client = Client::start();
    let mut texts: BTreeMap<String, String> = BTreeMap::new();
    let mut current = String::new();
    let mut versions: BTreeMap<String, i32> = BTreeMap::new();
    let mut record = Vec::new();
    for step in case["steps"].as_array().expect("steps") {
        if let Some(name) = step.get("open").and_then(Value::as_str) {
            let file = fixtures().join(name);
            let text = std::fs::read_to_string(&file).expect("a fixture");
            let uri = file_uri(&file);
            let diagnostics = client.open(&uri, &text);
            texts.insert(uri.clone(), text);
            versions.insert(uri.clone(), 1);
            current = uri;
            record.push(json!({ "open": name, "diagnostics": diagnostics["diagnostics"] }));
            continue;
        }
        let uri = match step.get("file").and_then(Value::as_str) {
            Some(name) => file_uri(&fixtures().join(name)),
            None => current.clone(),
        };
        let text = texts.get(&uri).cloned().unwrap_or_default();
        if let Some(change) = step.get("change") {
            let old = change["replace"].as_str().expect("replace");
            let new = change["with"].as_str().expect("with");
            let start = unique(&text, old);
            let version = versions.entry(uri.clone()).or_default();
            *version += 1;
            client.notify(
                "textDocument/didChange",
                json!({
                    "textDocument": { "uri": uri, "version": *version },
                    "contentChanges": [{ "range": range(&text, start, start + old.len()), "text": new }],
                }),
            );
            let mut updated = text.clone();
            updated.replace_range(start..start + old.len(), new);
            texts.insert(uri.clone(), updated);
            let diagnostics = client.diagnostics(&uri);
            record.push(json!({ "change": change, "diagnostics": diagnostics["diagnostics"] }));
            continue;
        }
        let method = step["request"]
            .as_str()
            .expect("a step opens, changes or requests");
        let mut params = json!({ "textDocument": { "uri": uri } });
        if let Some(at) = step.get("at").and_then(Value::as_str) {
            params["position"] = position(&text, cursor(&text, at));
        }
        if let Some(within) = step.get("range").and_then(Value::as_str) {
            let start = unique(&text, within);
            params["range"] = range(&text, start, start + within.len());
            params["context"] = json!({ "diagnostics": [] });
        }
        if method == "textDocument/references" {
            params["context"] = json!({ "includeDeclaration": true });
        }
        if method == "textDocument/formatting" {
            params["options"] = json!({ "tabSize": 4, "insertSpaces": true });
        }
        if let Some(extra) = step.get("params").and_then(Value::as_object) {
            for (key, value) in extra {
                params[key] = value.clone();
            }
        }
        let response = client.respond(method, params);
        let mut entry = json!({ "request": method });
        if let Some(at) = step.get("at") {
            entry["at"] = at.clone();
        }
        match response.error {
            Some(error) => entry["error"] = json!(error.message),
            None => entry["result"] = brief(method, response.result.unwrap_or(Value::Null)),
        }
        record.push(entry);
    }
    client.shutdown();
    normalise(Value::Array(record))
}

/// Completion lists are recorded as label, kind, detail and the text inserted (their documentation is
/// the hover's, tested there).
fn brief(method: &str, result: Value) -> Value {
    if method != "textDocument/completion" {
        return result;
    }
    let items = result.as_array().cloned().unwrap_or_default();
    Value::Array(
        items
            .into_iter()
            .map(|item| {
                let mut out = json!({ "label": item["label"], "kind": item["kind"], "detail": item["detail"] });
                if let Some(insert) = item.get("insertText") {
                    out["insertText"] = insert.clone();
                }
                if let Some(edit) = item.get("textEdit") {
                    out["textEdit"] = edit.clone();
                }
                out
            })
            .collect(),
    )
}

#[test]
fn every_case_answers_as_recorded() {
    let cases = cases();
    assert!(
        cases.len() >= 6,
        "the protocol suite has {} cases",
        cases.len()
    );
    let bless = std::env::var_os("RLX_BLESS").is_some();
    let mut failures = Vec::new();
    for case in &cases {
        let got = run_case(case);
        let expected_path = case.with_extension("expected.json");
        let pretty = serde_json::to_string_pretty(&got).expect("serialisable") + "\n";
        if bless {
            std::fs::write(&expected_path, &pretty).expect("writable expected file");
            continue;
        }
        let expected: Value = match std::fs::read_to_string(&expected_path) {
            Ok(text) => serde_json::from_str(&text).expect("expected file is JSON"),
            Err(_) => {
                failures.push(format!(
                    "{}: no expected file (RLX_BLESS=1 writes it)",
                    case.display()
                ));
                continue;
            }
        };
        if got != expected {
            let expected_steps = expected.as_array().cloned().unwrap_or_default();
            let got_steps = got.as_array().cloned().unwrap_or_default();
            for (index, got_step) in got_steps.iter().enumerate() {
                if expected_steps.get(index) != Some(got_step) {
                    failures.push(format!(
                        "{} step {index}:\n  expected {}\n  got      {}",
                        case.display(),
                        expected_steps
                            .get(index)
                            .map_or("nothing".into(), |s| s.to_string()),
                        got_step
                    ));
                }
            }
            if expected_steps.len() != got_steps.len() {
                failures.push(format!(
                    "{}: {} steps recorded, {} expected",
                    case.display(),
                    got_steps.len(),
                    expected_steps.len()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A panic inside a request is answered with an error, and the server goes on answering.
#[test]
fn a_panic_in_a_request_is_answered_and_the_server_stays_up() {
    let mut client = Client::start();
    let response = client.respond("rlx/internal/panic", Value::Null);
    let error = response.error.expect("an error response");
    assert!(
        error.message.contains("internal error"),
        "{}",
        error.message
    );
    let file = fixtures().join("recipe.rlx");
    let uri = file_uri(&file);
    let text = std::fs::read_to_string(&file).expect("fixture");
    let diagnostics = client.open(&uri, &text);
    assert_eq!(diagnostics["diagnostics"], json!([]));
    let symbols = client.request(
        "textDocument/documentSymbol",
        json!({ "textDocument": { "uri": uri } }),
    );
    assert!(symbols.as_array().is_some_and(|s| !s.is_empty()));
    client.shutdown();
}

/// Requests about a document that is not open, unknown methods and malformed params are errors,
/// not crashes.
#[test]
fn bad_requests_get_errors() {
    let mut client = Client::start();
    let missing = client.respond(
        "textDocument/hover",
        json!({ "textDocument": { "uri": "file:///nowhere.rlx" }, "position": { "line": 0, "character": 0 } }),
    );
    assert!(missing
        .error
        .expect("an error")
        .message
        .contains("not open"));
    let unknown = client.respond("textDocument/unknownThing", json!({}));
    assert_eq!(
        unknown.error.expect("an error").code,
        lsp_server::ErrorCode::MethodNotFound as i32
    );
    let malformed = client.respond("textDocument/hover", json!({ "textDocument": 3 }));
    assert_eq!(
        malformed.error.expect("an error").code,
        lsp_server::ErrorCode::InvalidParams as i32
    );
    client.shutdown();
}

/// The standard library is served as read-only virtual documents: its source on request, and
/// navigation inside it.
#[test]
fn stdlib_documents_are_served() {
    let mut client = Client::start();
    let source = client.request("rlx/stdlibSource", json!({ "uri": "rlx-std:/loss.rlx" }));
    assert_eq!(
        source["text"].as_str(),
        rlx_compiler::stdlib::module("loss"),
        "the embedded source"
    );
    let bad = client.respond("rlx/stdlibSource", json!({ "uri": "rlx-std:/nope.rlx" }));
    assert!(bad.error.is_some());
    // Go to definition inside a stdlib document, without opening it first: `token_mean` in
    // `std/loss` is imported from `std/agg`.
    let text = rlx_compiler::stdlib::module("loss").expect("std/loss");
    let at = text
        .find("token_mean")
        .expect("std/loss imports token_mean");
    let location = client.request(
        "textDocument/definition",
        json!({ "textDocument": { "uri": "rlx-std:/loss.rlx" }, "position": position(text, at) }),
    );
    assert_eq!(location["uri"], "rlx-std:/agg.rlx");
    // Formatting a read-only document changes nothing.
    let edits = client.request(
        "textDocument/formatting",
        json!({ "textDocument": { "uri": "rlx-std:/loss.rlx" }, "options": { "tabSize": 4, "insertSpaces": true } }),
    );
    assert_eq!(edits, json!([]));
    client.shutdown();
}
