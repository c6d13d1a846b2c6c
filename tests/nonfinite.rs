//! Run-time diagnostics of non-finite values: every `tests/nonfinite/*.rlx` case is a recipe that
//! makes a NaN or an infinity on its rollouts (`NAME.jsonl`), and the error must point at the
//! expression that made it, for the batch element where it did — on the interpreter and on the
//! JIT (whose failure the interpreter explains), through `rlx score` on the recipe and on its
//! compiled artifact.
//!
//! # Annotations (whole-line comments of the case)
//!
//! ```text
//! // non_finite: TEXT                 the culprit's label covers exactly TEXT of the case file
//! // non_finite in std/NAME: TEXT     … of the standard-library module NAME
//! // call: TEXT                       the function call (in the case file) it was inlined through
//! // element: group G, response R…    the batch element, as the diagnostic names it
//! // message: SUBSTRING               what the error says is not finite
//! ```
//!
//! TEXT must occur exactly once in its file, outside `//` comments.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use rlx_compiler::{Origin, SourceMap};
use rlx_runtime::score::Backend;
use rlx_runtime::Context;

fn cases_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/nonfinite")
}

fn cases() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(cases_dir())
        .expect("tests/nonfinite exists")
        .map(|entry| entry.expect("readable entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "rlx"))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "{} cases", files.len());
    files
}

/// Where an annotated text lies: the file's display name as diagnostics show it, the byte range, and
/// its 1-based line and column.
#[derive(Debug, PartialEq)]
struct Place {
    module: Option<String>,
    start: usize,
    end: usize,
    line: usize,
    column: usize,
}

struct Case {
    path: PathBuf,
    culprit: Place,
    call: Option<Place>,
    element: String,
    message: String,
}

/// The byte range of the one occurrence of `text` in `source` outside line comments.
fn locate(source: &str, text: &str, module: Option<String>) -> Place {
    let mut found = Vec::new();
    let mut offset = 0;
    for line in source.split_inclusive('\n') {
        let code = line.split("//").next().unwrap_or("");
        let mut from = 0;
        while let Some(at) = code[from..].find(text) {
            found.push(offset + from + at);
            from += at + 1;
        }
        offset += line.len();
    }
    assert_eq!(found.len(), 1, "`{text}` must occur once: {found:?}");
    let start = found[0];
    let before = &source[..start];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |n| n + 1) + 1;
    Place {
        module,
        start,
        end: start + text.len(),
        line,
        column,
    }
}

fn read_case(path: &Path) -> Case {
    let text = std::fs::read_to_string(path).expect("readable case");
    let annotation = |key: &str| {
        text.lines()
            .filter_map(|line| line.trim().strip_prefix("// "))
            .find_map(|line| line.strip_prefix(key))
            .map(str::trim)
    };
    let culprit = match annotation("non_finite:") {
        Some(code) => locate(&text, code, None),
        None => {
            let line = annotation("non_finite in std/").expect("a `non_finite` annotation");
            let (module, code) = line
                .split_once(':')
                .expect("`non_finite in std/NAME: TEXT`");
            let source = rlx_compiler::stdlib::module(module).expect("a stdlib module");
            locate(source, code.trim(), Some(module.to_string()))
        }
    };
    Case {
        path: path.to_path_buf(),
        call: annotation("call:").map(|code| locate(&text, code, None)),
        culprit,
        element: annotation("element:").expect("an `element`").to_string(),
        message: annotation("message:").expect("a `message`").to_string(),
    }
}

fn rlx(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rlx"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("NO_COLOR", "1")
        .output()
        .expect("rlx runs")
}

/// The file a site's `FileId` names, as the case's annotations do.
fn module_of(sources: &SourceMap, file: rlx_compiler::FileId) -> Option<String> {
    match &sources.get(file).origin {
        Origin::Stdlib(name) => Some(name.clone()),
        _ => None,
    }
}

/// The library: `rlx_runtime::score` names the culprit's node span and the element, on both engines.
#[test]
fn the_culprit_is_the_annotated_expression() {
    let mut failures = Vec::new();
    for path in cases() {
        let case = read_case(&path);
        let checked = rlx_compiler::check_path(&path).expect("readable");
        let recipe = checked.recipe.as_ref().expect("the case checks");
        let rollouts = std::fs::read_to_string(path.with_extension("jsonl")).expect("rollouts");
        for backend in [Backend::Interp, Backend::Jit] {
            let label = format!("{} ({backend:?})", path.display());
            let error = match rlx_runtime::score::score_at(
                recipe,
                &rollouts,
                &[],
                true,
                backend,
                &[],
                &Context::default(),
            ) {
                Ok(_) => {
                    failures.push(format!("{label}: scored without an error"));
                    continue;
                }
                Err(error) => error,
            };
            let Some(non_finite) = error.non_finite() else {
                failures.push(format!("{label}: not a non-finite error: {error}"));
                continue;
            };
            if !error.to_string().contains(&case.message) {
                failures.push(format!("{label}: `{error}` lacks `{}`", case.message));
            }
            let Some(culprit) = &non_finite.culprit else {
                failures.push(format!("{label}: no culprit: {error}"));
                continue;
            };
            let found = culprit.span.map(|site| {
                (
                    module_of(&checked.sources, site.file_id()),
                    site.start as usize,
                    site.end as usize,
                )
            });
            let wanted = (
                case.culprit.module.clone(),
                case.culprit.start,
                case.culprit.end,
            );
            if found.as_ref() != Some(&wanted) {
                failures.push(format!(
                    "{label}: culprit `{}` at {found:?}, annotated at {wanted:?}",
                    culprit.op
                ));
            }
            if culprit.element.to_string() != case.element {
                failures.push(format!(
                    "{label}: element `{}`, annotated `{}`",
                    culprit.element, case.element
                ));
            }
            let call = culprit
                .call
                .filter(|call| Some(call.file) != culprit.span.map(|s| s.file))
                .map(|site| (site.start as usize, site.end as usize));
            let wanted_call = case.call.as_ref().map(|c| (c.start, c.end));
            if call != wanted_call {
                failures.push(format!("{label}: call {call:?}, annotated {wanted_call:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// What `rlx score` must print for a case: the code, the message, the culprit's file:line:column,
/// the element and, for an inlined function, the call's position.
fn check_rendered(case: &Case, stderr: &str, label: &str, failures: &mut Vec<String>) {
    let file = match &case.culprit.module {
        Some(module) => format!("std/{module}"),
        None => format!(
            "tests/nonfinite/{}",
            case.path.file_name().unwrap().to_string_lossy()
        ),
    };
    let position = format!("{file}:{}:{}", case.culprit.line, case.culprit.column);
    let mut wanted = vec![
        "rlx::non_finite".to_string(),
        case.message.clone(),
        position,
        format!("for {}", case.element),
    ];
    if let Some(call) = &case.call {
        wanted.push(format!(
            "tests/nonfinite/{}:{}:{}",
            case.path.file_name().unwrap().to_string_lossy(),
            call.line,
            call.column
        ));
    }
    for text in wanted {
        if !stderr.contains(&text) {
            failures.push(format!("{label}: stderr lacks `{text}`:\n{stderr}"));
        }
    }
}

/// The CLI: `rlx score` prints the diagnostic and exits with 1, on both engines.
#[test]
fn rlx_score_prints_the_diagnostic() {
    let mut failures = Vec::new();
    for path in cases() {
        let case = read_case(&path);
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let recipe = format!("tests/nonfinite/{name}");
        let rollouts = recipe.replace(".rlx", ".jsonl");
        for backend in ["interp", "jit"] {
            let label = format!("{recipe} (--backend {backend})");
            let output = rlx(&[
                "score",
                &recipe,
                "--rollouts",
                &rollouts,
                "--backend",
                backend,
            ]);
            if output.status.code() != Some(1) {
                failures.push(format!("{label}: exit status {:?}", output.status.code()));
            }
            let stderr = String::from_utf8_lossy(&output.stderr);
            check_rendered(&case, &stderr, &label, &mut failures);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A compiled artifact keeps the spans: `rlx score FILE.rlxc` prints the same diagnostic, and once
/// the recipe changes (the artifact is stale for compiling, but its spans no longer fit) the
/// message alone.
#[test]
fn an_artifact_keeps_the_spans() {
    let dir = std::env::temp_dir().join(format!("rlx-nonfinite-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut failures = Vec::new();
    for name in ["log_zero", "inlined"] {
        let source = cases_dir().join(format!("{name}.rlx"));
        let case = read_case(&source);
        let recipe = dir.join(format!("{name}.rlx"));
        std::fs::copy(&source, &recipe).unwrap();
        let rollouts = cases_dir().join(format!("{name}.jsonl"));
        let artifact = dir.join(format!("{name}.rlxc"));
        let compile = Command::new(env!("CARGO_BIN_EXE_rlxc"))
            .args([
                "compile",
                recipe.to_str().unwrap(),
                "-o",
                artifact.to_str().unwrap(),
            ])
            .output()
            .expect("rlxc runs");
        assert!(
            compile.status.success(),
            "{}",
            String::from_utf8_lossy(&compile.stderr)
        );
        let output = rlx(&[
            "score",
            artifact.to_str().unwrap(),
            "--rollouts",
            rollouts.to_str().unwrap(),
        ]);
        assert_eq!(output.status.code(), Some(1), "{name}");
        let stderr = String::from_utf8_lossy(&output.stderr).to_string();
        let shown = match &case.culprit.module {
            Some(module) => format!("std/{module}:{}", case.culprit.line),
            None => format!("{}:{}", recipe.display(), case.culprit.line),
        };
        for text in ["rlx::non_finite", shown.as_str(), case.element.as_str()] {
            if !stderr.contains(text) {
                failures.push(format!("{name}.rlxc: stderr lacks `{text}`:\n{stderr}"));
            }
        }
    }
    // A recipe edited after compiling: the artifact is refused as stale.
    let recipe = dir.join("log_zero.rlx");
    let mut text = std::fs::read_to_string(&recipe).unwrap();
    text.insert_str(0, "// edited\n");
    std::fs::write(&recipe, text).unwrap();
    let output = rlx(&[
        "score",
        dir.join("log_zero.rlxc").to_str().unwrap(),
        "--rollouts",
        cases_dir().join("log_zero.jsonl").to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("changed"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `rlx run` stops on the first update of a recipe whose loss is never finite: the diagnostic on the
/// expression, then the run's own message (the step, the checkpoint), exit status 1.
#[test]
fn rlx_run_prints_the_diagnostic_before_its_message() {
    let recipe = "tests/nonfinite/run/log_of_score.rlx";
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(recipe)).unwrap();
    let place = locate(&text, "log(score - 1)", None);
    let out = std::env::temp_dir().join(format!("rlx-nonfinite-run-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let mut args = vec![
        "run",
        recipe,
        "--out",
        out.to_str().unwrap(),
        "--steps",
        "1",
    ];
    args.extend(common::QUICK_RUN);
    let output = rlx(&args);
    let _ = std::fs::remove_dir_all(&out);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let diagnostic = stderr.find("rlx::non_finite").expect("the diagnostic");
    let message = stderr.find("error: step").expect("the run's message");
    assert!(diagnostic < message, "{stderr}");
    for wanted in [
        format!("{recipe}:{}:{}", place.line, place.column),
        "`log(score - 1)` is".to_string(),
        "for group ".to_string(),
        "the run stopped before the update".to_string(),
    ] {
        assert!(
            stderr.contains(&wanted),
            "stderr lacks `{wanted}`:\n{stderr}"
        );
    }
}
