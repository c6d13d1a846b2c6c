//! Data-driven diagnostics tests: every top-level `tests/diagnostics/*.rlx` file is a small recipe that
//! must produce exactly the errors written in its comments. Helper modules that the import cases load
//! live in subfolders (`tests/diagnostics/modules/`) and are not cases themselves.
//!
//! # Annotation format
//!
//! An annotation is a whole line comment (leading spaces allowed) anywhere in a case file:
//!
//! ```text
//! // error: CODE [in FILE] @ TEXT [#N]     primary label covers exactly TEXT
//! // error: CODE [in FILE] @^ TEXT [#N]    primary label is empty, just before TEXT
//! // error: CODE [in FILE] @@ START..END   primary label is the byte range START..END
//! // error: CODE [in FILE] @@ eof          primary label is empty, at the end of the file
//! // help: SUBSTRING                       the error annotated just above has a help containing it
//! ```
//!
//! - `CODE` is the full diagnostic code, e.g. `rlx::unknown_name`.
//! - `in FILE` says the label lies in another file: a path relative to `tests/diagnostics/` (for errors
//!   reported inside a helper module) or `std/NAME` (inside a standard-library module). Without it, the
//!   label lies in the case file itself.
//! - `TEXT` runs to the end of the line (surrounding spaces trimmed). It is searched in the code of that
//!   file, skipping `//` comments, and where it starts or ends with a name character it only matches
//!   whole words (`@ a` does not match the `a` inside `ratio`). It must occur exactly once, unless a
//!   trailing `#N` picks the N-th occurrence (from 1).
//! - Several `// help:` lines may follow one error; each must be a substring of its help.
//!
//! The test checks, for every case file, that the multiset of (code, file, primary span) of the error
//! diagnostics `rlx_compiler::check_path` reports equals the annotated one (nothing missing, nothing
//! extra), and it reports every mismatch of every file in one failure. Each case must expect at least
//! one error, and the suite must hold at least `MIN_CASES` cases.
//!
//! The other tests run the `rlxc` binary: `check --format json` output, exit codes, and the human
//! rendering of a file with several errors.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use rlx_compiler::{Checked, FileId, Origin};

/// The suite must cover at least this many situations (one per case file).
const MIN_CASES: usize = 30;

fn cases_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/diagnostics")
}

/// The case files, sorted by name.
fn case_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(cases_dir())
        .expect("tests/diagnostics exists")
        .map(|entry| entry.expect("readable directory entry").path())
        .filter(|path| path.is_file() && path.extension().is_some_and(|ext| ext == "rlx"))
        .collect();
    files.sort();
    files
}

// ---------------------------------------------------------------------------------------------
// Annotations

/// Where an expected primary label lies, as written.
#[derive(Clone, Debug, PartialEq)]
enum Position {
    /// Exactly the `occurrence`-th match of the text (1-based; `None`: the text must be unique).
    Text {
        text: String,
        occurrence: Option<usize>,
    },
    /// An empty span just before the match of the text.
    Before {
        text: String,
        occurrence: Option<usize>,
    },
    Bytes(usize, usize),
    EndOfFile,
}

#[derive(Clone, Debug, PartialEq)]
struct Annotation {
    /// 1-based line of the annotation in the case file.
    line: usize,
    code: String,
    /// `None`: the case file itself.
    file: Option<String>,
    position: Position,
    helps: Vec<String>,
}

/// Parse the annotations of a case file; `Err` lists malformed ones.
fn parse_annotations(text: &str) -> Result<Vec<Annotation>, Vec<String>> {
    let mut annotations: Vec<Annotation> = Vec::new();
    let mut problems = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let trimmed = raw.trim_start();
        if let Some(rest) = trimmed.strip_prefix("// error:") {
            match parse_error_annotation(rest.trim()) {
                Ok((code, file, position)) => annotations.push(Annotation {
                    line,
                    code,
                    file,
                    position,
                    helps: Vec::new(),
                }),
                Err(problem) => problems.push(format!("line {line}: {problem}")),
            }
        } else if let Some(rest) = trimmed.strip_prefix("// help:") {
            let wanted = rest.trim();
            match annotations.last_mut() {
                Some(last) if !wanted.is_empty() => last.helps.push(wanted.to_string()),
                Some(_) => problems.push(format!("line {line}: empty `// help:`")),
                None => problems.push(format!(
                    "line {line}: `// help:` must follow an `// error:` annotation"
                )),
            }
        } else if trimmed.starts_with("// error") || trimmed.starts_with("// help") {
            problems.push(format!(
                "line {line}: looks like an annotation but is not `// error:` or `// help:`"
            ));
        }
    }
    if problems.is_empty() {
        Ok(annotations)
    } else {
        Err(problems)
    }
}

fn parse_error_annotation(rest: &str) -> Result<(String, Option<String>, Position), String> {
    let (code, rest) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    if !code.starts_with("rlx::") || code.len() <= "rlx::".len() {
        return Err(format!(
            "expected a code such as `rlx::syntax`, found `{code}`"
        ));
    }
    let mut rest = rest.trim_start();
    let mut file = None;
    if let Some(after) = rest.strip_prefix("in ") {
        let after = after.trim_start();
        let (path, tail) = after.split_once(char::is_whitespace).unwrap_or((after, ""));
        file = Some(path.to_string());
        rest = tail.trim_start();
    }
    let position = if let Some(range) = rest.strip_prefix("@@") {
        let range = range.trim();
        if range == "eof" {
            Position::EndOfFile
        } else {
            let parsed = range
                .split_once("..")
                .and_then(|(a, b)| Some((a.trim().parse().ok()?, b.trim().parse().ok()?)));
            match parsed {
                Some((start, end)) if start <= end => Position::Bytes(start, end),
                _ => {
                    return Err(format!(
                        "expected `@@ START..END` or `@@ eof`, found `@@ {range}`"
                    ))
                }
            }
        }
    } else if let Some(text) = rest.strip_prefix("@^") {
        let (text, occurrence) = split_occurrence(text)?;
        Position::Before { text, occurrence }
    } else if let Some(text) = rest.strip_prefix('@') {
        let (text, occurrence) = split_occurrence(text)?;
        Position::Text { text, occurrence }
    } else {
        return Err(format!(
            "expected `@ TEXT`, `@^ TEXT` or `@@ START..END` after the code, found `{rest}`"
        ));
    };
    Ok((code.to_string(), file, position))
}

/// `TEXT #N` → (`TEXT`, Some(N)); `TEXT` → (`TEXT`, None).
fn split_occurrence(text: &str) -> Result<(String, Option<usize>), String> {
    let text = text.trim();
    let (body, occurrence) = match text.rsplit_once(" #") {
        Some((body, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
            let n: usize = n.parse().map_err(|_| format!("bad occurrence `#{n}`"))?;
            if n == 0 {
                return Err("occurrences count from #1".to_string());
            }
            (body.trim_end(), Some(n))
        }
        _ => (text, None),
    };
    if body.is_empty() {
        return Err("the text after `@` is empty".to_string());
    }
    Ok((body.to_string(), occurrence))
}

/// Byte ranges of `//` comments (outside string literals).
fn comment_ranges(text: &str) -> Vec<(usize, usize)> {
    let bytes = text.as_bytes();
    let mut ranges = Vec::new();
    let mut index = 0;
    let mut in_string = false;
    while index < bytes.len() {
        match bytes[index] {
            b'\n' => in_string = false,
            b'\\' if in_string => index += 1,
            b'"' => in_string = !in_string,
            b'/' if !in_string && bytes.get(index + 1) == Some(&b'/') => {
                let end = text[index..].find('\n').map_or(text.len(), |n| index + n);
                ranges.push((index, end));
                index = end;
                continue;
            }
            _ => {}
        }
        index += 1;
    }
    ranges
}

fn is_name_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_'
}

/// Start offsets of the matches of `needle` in the code of `text` (whole words at name edges).
fn find_in_code(text: &str, needle: &str) -> Vec<usize> {
    let comments = comment_ranges(text);
    let bytes = text.as_bytes();
    let needle_bytes = needle.as_bytes();
    let word_start = needle_bytes.first().copied().is_some_and(is_name_byte);
    let word_end = needle_bytes.last().copied().is_some_and(is_name_byte);
    text.match_indices(needle)
        .map(|(start, _)| start)
        .filter(|&start| {
            let end = start + needle.len();
            let in_comment = comments.iter().any(|&(a, b)| start < b && end > a);
            let starts_word = !word_start || start == 0 || !is_name_byte(bytes[start - 1]);
            let ends_word = !word_end || end == bytes.len() || !is_name_byte(bytes[end]);
            !in_comment && starts_word && ends_word
        })
        .collect()
}

/// Resolve a text position to a byte offset of its start.
fn locate(text: &str, needle: &str, occurrence: Option<usize>) -> Result<usize, String> {
    let found = find_in_code(text, needle);
    match occurrence {
        None if found.len() == 1 => Ok(found[0]),
        None if found.is_empty() => Err(format!("`{needle}` does not occur in the code")),
        None => Err(format!(
            "`{needle}` occurs {} times in the code; add `#N` to pick one",
            found.len()
        )),
        Some(n) => found.get(n - 1).copied().ok_or_else(|| {
            format!(
                "`{needle} #{n}` asked for, but it occurs {} time(s) in the code",
                found.len()
            )
        }),
    }
}

// ---------------------------------------------------------------------------------------------
// Comparing

/// A diagnostic reduced to what the annotations pin.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    code: String,
    /// Display name: relative to tests/diagnostics/, `std/NAME`, or the source's own name.
    file: String,
    span: Option<(usize, usize)>,
}

/// How a file of the source map is named in annotations.
fn display_name(checked: &Checked, file: FileId, root: &Path) -> String {
    let source = checked.sources.get(file);
    match &source.origin {
        Origin::Path(path) => path
            .strip_prefix(root)
            .map(|relative| relative.to_string_lossy().replace('\\', "/"))
            .unwrap_or_else(|_| path.display().to_string()),
        Origin::Stdlib(name) => format!("std/{name}"),
        Origin::Memory => source.name.clone(),
    }
}

/// The text of a file named as in annotations: from the source map if it was loaded, else from disk.
fn file_text(checked: &Checked, name: &str, root: &Path) -> Option<String> {
    checked
        .sources
        .files()
        .find(|(id, _)| display_name(checked, *id, root) == name)
        .map(|(_, source)| source.text.clone())
        .or_else(|| std::fs::read_to_string(root.join(name)).ok())
}

/// 1-based line and column of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

fn describe(key: &Key, text: Option<&str>) -> String {
    match (key.span, text) {
        (Some((start, end)), Some(text)) if end <= text.len() => {
            let (line, column) = line_column(text, start);
            format!(
                "{} at {}:{line}:{column} (bytes {start}..{end}) `{}`",
                key.code,
                key.file,
                text.get(start..end).unwrap_or("<not on a char boundary>")
            )
        }
        (Some((start, end)), _) => {
            format!("{} at {} bytes {start}..{end}", key.code, key.file)
        }
        (None, _) => format!("{} in {} (no label)", key.code, key.file),
    }
}

/// Check one case file; returns its problems (empty when it passes).
fn check_case(path: &Path, root: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) => return vec![format!("cannot read: {error}")],
    };
    let annotations = match parse_annotations(&text) {
        Ok(annotations) => annotations,
        Err(errors) => return errors,
    };
    if annotations.is_empty() {
        problems.push("expects no error: every case must annotate at least one `// error:`".into());
    }
    let checked = match rlx_compiler::check_path(path) {
        Ok(checked) => checked,
        Err(error) => return vec![format!("check_path failed: {error}")],
    };
    let case_name = display_name(&checked, checked.root, root);

    // Expected keys, resolved against the file each annotation names.
    let mut expected: Vec<(Key, &Annotation)> = Vec::new();
    for annotation in &annotations {
        let file = annotation.file.clone().unwrap_or_else(|| case_name.clone());
        let Some(target) = file_text(&checked, &file, root) else {
            problems.push(format!(
                "line {}: `in {file}`: no such file among the sources or on disk",
                annotation.line
            ));
            continue;
        };
        let span = match &annotation.position {
            Position::Text { text, occurrence } => {
                locate(&target, text, *occurrence).map(|start| (start, start + text.len()))
            }
            Position::Before { text, occurrence } => {
                locate(&target, text, *occurrence).map(|start| (start, start))
            }
            Position::Bytes(start, end) if *end <= target.len() => Ok((*start, *end)),
            Position::Bytes(_, end) => Err(format!(
                "byte {end} is past the end of {file} ({} bytes)",
                target.len()
            )),
            Position::EndOfFile => Ok((target.len(), target.len())),
        };
        match span {
            Ok(span) => expected.push((
                Key {
                    code: annotation.code.clone(),
                    file,
                    span: Some(span),
                },
                annotation,
            )),
            Err(problem) => problems.push(format!("line {}: {problem}", annotation.line)),
        }
    }

    let actual: Vec<(Key, &rlx_compiler::Diagnostic)> = checked
        .diagnostics
        .iter()
        .filter(|d| d.is_error())
        .map(|d| {
            let span = d.primary_span().map(|s| (s.start as usize, s.end as usize));
            let key = Key {
                code: d.code.to_string(),
                file: display_name(&checked, d.file, root),
                span,
            };
            (key, d)
        })
        .collect();

    // Multiset difference in both directions.
    let mut unmatched: BTreeMap<&Key, Vec<&rlx_compiler::Diagnostic>> = BTreeMap::new();
    for (key, diagnostic) in &actual {
        unmatched.entry(key).or_default().push(diagnostic);
    }
    for (key, annotation) in &expected {
        let text = file_text(&checked, &key.file, root);
        match unmatched.get_mut(key).and_then(|list| list.pop()) {
            Some(diagnostic) => {
                for wanted in &annotation.helps {
                    let help = diagnostic.help.as_deref().unwrap_or("");
                    if !help.contains(wanted.as_str()) {
                        problems.push(format!(
                            "line {}: the help of {} does not contain `{wanted}`; it is {:?}",
                            annotation.line,
                            describe(key, text.as_deref()),
                            diagnostic.help
                        ));
                    }
                }
            }
            None => problems.push(format!(
                "line {}: missing {}",
                annotation.line,
                describe(key, text.as_deref())
            )),
        }
    }
    for (key, diagnostics) in unmatched {
        let text = file_text(&checked, &key.file, root);
        for diagnostic in diagnostics {
            problems.push(format!(
                "unexpected {}: {}",
                describe(key, text.as_deref()),
                diagnostic.message
            ));
        }
    }
    problems
}

#[test]
fn diagnostics_match_annotations() {
    let root = cases_dir()
        .canonicalize()
        .expect("tests/diagnostics exists");
    let files = case_files();
    let mut report = String::new();
    let mut failing = 0;
    for path in &files {
        let problems = check_case(path, &root);
        if !problems.is_empty() {
            failing += 1;
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            let _ = writeln!(report, "\n{name}:");
            for problem in problems {
                let _ = writeln!(report, "    {problem}");
            }
        }
    }
    assert!(
        files.len() >= MIN_CASES,
        "the suite has {} case files; it must cover at least {MIN_CASES} situations",
        files.len()
    );
    assert!(
        report.is_empty(),
        "{failing} of {} diagnostics case(s) failed:\n{report}",
        files.len()
    );
}

#[test]
fn annotation_parser_understands_the_documented_forms() {
    let text = "\
let a = 1 // an a in a comment is skipped
let ab = a + a
// error: rlx::cycle @ a #2
// help: depends
// help: itself
// error: rlx::syntax in std/loss @^ ab
// error: rlx::syntax @@ 3..7
// error: rlx::syntax @@ eof
";
    let annotations = parse_annotations(text).expect("well-formed");
    assert_eq!(annotations.len(), 4);
    assert_eq!(annotations[0].code, "rlx::cycle");
    assert_eq!(annotations[0].helps, vec!["depends", "itself"]);
    assert_eq!(
        annotations[0].position,
        Position::Text {
            text: "a".into(),
            occurrence: Some(2)
        }
    );
    assert_eq!(annotations[1].file.as_deref(), Some("std/loss"));
    assert_eq!(
        annotations[1].position,
        Position::Before {
            text: "ab".into(),
            occurrence: None
        }
    );
    assert_eq!(annotations[2].position, Position::Bytes(3, 7));
    assert_eq!(annotations[3].position, Position::EndOfFile);
    // Whole words only, comments and annotation lines skipped.
    assert_eq!(find_in_code(text, "a"), vec![4, 51, 55]);
    assert_eq!(locate(text, "a", Some(2)), Ok(51));
    assert!(locate(text, "a", None).is_err());
    assert_eq!(locate(text, "ab", None), Ok(46));

    assert!(parse_annotations("// error: unknown_name @ x").is_err());
    assert!(parse_annotations("// help: orphan").is_err());
    assert!(parse_annotations("// error: rlx::syntax x").is_err());
    assert!(parse_annotations("// errors: rlx::syntax @ x").is_err());
}

// ---------------------------------------------------------------------------------------------
// The command-line tool

fn rlxc() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rlxc"));
    command.env("NO_COLOR", "1");
    command
}

#[test]
fn rlxc_check_json_reports_codes_spans_and_positions() {
    let cases = ["three_errors.rlx", "unknown_name_suggestion.rlx"];
    let paths: Vec<PathBuf> = cases.iter().map(|name| cases_dir().join(name)).collect();
    let output = rlxc()
        .arg("check")
        .arg("--format")
        .arg("json")
        .args(&paths)
        .output()
        .expect("rlxc runs");
    assert_eq!(
        output.status.code(),
        Some(1),
        "files with errors exit 1; stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let document: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("stdout is one JSON document");
    let files = document["files"].as_array().expect("a `files` array");
    assert_eq!(files.len(), paths.len());
    for (file, path) in files.iter().zip(&paths) {
        assert_eq!(file["ok"], serde_json::Value::Bool(false));
        let diagnostics = file["diagnostics"]
            .as_array()
            .expect("a `diagnostics` array");
        assert!(!diagnostics.is_empty(), "{} has errors", path.display());
        // The same findings as the library reports, with the same byte spans.
        let checked = rlx_compiler::check_path(path).expect("readable");
        assert_eq!(diagnostics.len(), checked.diagnostics.len());
        for (json, diagnostic) in diagnostics.iter().zip(&checked.diagnostics) {
            let code = json["code"].as_str().expect("a string `code`");
            assert_eq!(code, diagnostic.code);
            assert_eq!(json["severity"], "error");
            assert!(json["message"].as_str().is_some_and(|m| !m.is_empty()));
            let label = &json["labels"][0];
            let start = label["start"].as_u64().expect("a byte `start`");
            let end = label["end"].as_u64().expect("a byte `end`");
            let span = diagnostic.primary_span().expect("a primary label");
            assert_eq!((start, end), (u64::from(span.start), u64::from(span.end)));
            let text = &checked.sources.get(diagnostic.file).text;
            let (line, column) = line_column(text, start as usize);
            assert_eq!(label["line"].as_u64(), Some(line as u64), "{code}: line");
            assert_eq!(
                label["column"].as_u64(),
                Some(column as u64),
                "{code}: column"
            );
        }
    }
}

#[test]
fn rlxc_check_exit_codes() {
    let grpo = Path::new(env!("CARGO_MANIFEST_DIR")).join("recipes/grpo.rlx");
    let clean = rlxc().arg("check").arg(&grpo).output().expect("rlxc runs");
    assert_eq!(
        clean.status.code(),
        Some(0),
        "a clean recipe exits 0; stderr: {}",
        String::from_utf8_lossy(&clean.stderr)
    );
    let missing = cases_dir().join("no_such_recipe_anywhere.rlx");
    let io_error = rlxc()
        .arg("check")
        .arg(&missing)
        .output()
        .expect("rlxc runs");
    // an unreadable input is a failure, as in every command (src/exit.rs); 2 is for usage errors
    assert_eq!(
        io_error.status.code(),
        Some(1),
        "an unreadable file exits 1"
    );
    assert!(String::from_utf8_lossy(&io_error.stderr).contains("cannot read"));
}

#[test]
fn rlxc_check_human_output_has_one_header_and_every_code() {
    let path = cases_dir().join("three_errors.rlx");
    let annotations =
        parse_annotations(&std::fs::read_to_string(&path).expect("readable")).expect("well-formed");
    assert_eq!(
        annotations.len(),
        3,
        "three_errors.rlx annotates three errors"
    );
    let output = rlxc().arg("check").arg(&path).output().expect("rlxc runs");
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty(), "human reports go to stderr");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let headers: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains("3 errors in"))
        .collect();
    assert_eq!(headers.len(), 1, "one summary header in:\n{stderr}");
    assert!(headers[0].contains("three_errors.rlx"), "{}", headers[0]);
    for annotation in &annotations {
        assert!(
            stderr.contains(&annotation.code),
            "`{}` missing from:\n{stderr}",
            annotation.code
        );
    }
}
