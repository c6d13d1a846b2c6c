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
    let command = "scripts/test-setup.sh && cargo test --workspace";
    assert!(
        readme.lines().any(|l| l.trim() == command),
        "README's test command is `{command}`"
    );
    assert!(
        ci.lines().any(|l| l.trim_start().starts_with(command)),
        ".ci/run runs the README's test command"
    );
    assert!(
        ci.contains("export RLX_REQUIRE_TOOLS=1"),
        ".ci/run requires the tools"
    );
}

#[test]
fn stdlib_reference_is_generated_from_the_doc_comments() {
    let generated = rlx_compiler::docgen::stdlib_markdown();
    let committed = read("docs/stdlib.md");
    assert!(
        committed == generated,
        "docs/stdlib.md is stale: regenerate it with `cargo run --bin rlxc -- doc > docs/stdlib.md`"
    );
}

#[test]
fn every_stdlib_function_has_a_doc_comment() {
    let missing = rlx_compiler::docgen::undocumented();
    assert!(
        missing.is_empty(),
        "functions without a doc comment: {missing:?}"
    );
}
