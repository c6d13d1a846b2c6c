//! The documentation stays true to the code: every built-in is in the language reference, and the
//! README's commands name binaries and subcommands that exist.

use rlx_compiler::check::builtins;

fn read(path: &str) -> String {
    std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .expect("readable doc")
}

#[test]
fn every_builtin_is_documented() {
    let reference = read("docs/language.md");
    let missing: Vec<&str> = builtins::all_names()
        .filter(|name| {
            !reference.contains(&format!("`{name}(")) && !reference.contains(&format!("`{name}`"))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "docs/language.md does not document: {missing:?}"
    );
}

#[test]
fn readme_keeps_the_two_commands() {
    let readme = read("README.md");
    let ci = read(".ci/run");
    assert!(
        readme.contains("cargo test --workspace"),
        "README's test command"
    );
    assert!(
        ci.contains("cargo test --workspace"),
        ".ci/run runs the README's test command"
    );
}
