//! No test of the workspace reports a skip by printing and passing, which `cargo test` counts as
//! passed: a test that cannot run without a tool or an asset carries `#[cfg_attr(not(rlx_…), ignore =
//! "needs …")]` (tools/src/lib.rs), so that the summary counts it as ignored.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Where a test says it skipped: a string that starts with "skip " or "skipped" and goes on (the
/// JSON key `"skipped"` of a metrics line is no skip).
fn says_skipped(line: &str) -> bool {
    let line = line.to_lowercase();
    line.match_indices("\"skip").any(|(at, _)| {
        let rest = &line[at + "\"skip".len()..];
        rest.starts_with(' ') || (rest.starts_with("ped") && !rest.starts_with("ped\""))
    })
}

#[test]
fn a_skip_is_never_printed_and_passed() {
    assert!(says_skipped(r#"eprintln!("SKIPPED: {what}: {why}");"#));
    assert!(says_skipped(
        r#"println!("skipped: NVRTC is not installed");"#
    ));
    assert!(says_skipped(r#"print(f"SKIP verl is not importable")"#));
    assert!(!says_skipped(r#"assert_eq!(line["skipped"], true);"#));

    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for dir in [
        "tests",
        "compiler/tests",
        "runtime/tests",
        "trainer/tests",
        "signals/tests",
    ] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() > 20, "only {} test files found", files.len());
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (number, line) in text.lines().enumerate() {
            if says_skipped(line) {
                found.push(format!(
                    "{}:{}: {}",
                    file.display(),
                    number + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(
        found.is_empty(),
        "tests that print a skip and pass (gate them with #[cfg_attr(not(rlx_…), ignore = \"needs …\")] \
         instead, tools/src/lib.rs):\n{}",
        found.join("\n")
    );
}
