//! `rlx update`, `rlx fetch`, `rlxc check DIR` and `rlxc doc DIR` on the shipped example package
//! (docs/sharing.md); the resolution itself is tested in compiler/tests/packages.rs.

use std::path::Path;
use std::process::{Command, Output};

fn run(binary: &str, args: &[&str]) -> Output {
    Command::new(binary)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env(
            "RLX_CACHE",
            std::env::temp_dir().join("rlx-packages-cli-cache"),
        )
        .output()
        .expect("runs")
}

#[test]
fn the_example_package_checks_fetches_and_documents() {
    let rlxc = env!("CARGO_BIN_EXE_rlxc");
    let rlx = env!("CARGO_BIN_EXE_rlx");
    let checked = run(rlxc, &["check", "examples/packages/style_grpo"]);
    assert!(
        checked.status.success(),
        "{}",
        String::from_utf8_lossy(&checked.stderr)
    );
    let fetched = run(rlx, &["fetch", "examples/packages/style_grpo"]);
    assert!(
        fetched.status.success(),
        "{}",
        String::from_utf8_lossy(&fetched.stderr)
    );
    assert!(String::from_utf8_lossy(&fetched.stderr).contains("house_style 0.1.0"));
    let doc = run(rlxc, &["doc", "examples/packages/house_style"]);
    let text = String::from_utf8_lossy(&doc.stdout);
    assert!(doc.status.success());
    assert!(text.starts_with("# Package `house_style` 0.1.0"), "{text}");
    assert!(text.contains("| `voice` | weight 3 |"), "{text}");
    // A package with a broken lock: exit 1, the code on stderr; JSON lists the recipe's errors.
    let broken = run(rlxc, &["check", "tests/packages/modified_file"]);
    assert_eq!(broken.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&broken.stderr).contains("rlx::package_modified"));
    let json = run(
        rlxc,
        &["check", "--format", "json", "tests/packages/undeclared"],
    );
    assert_eq!(json.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&json.stdout).contains("rlx::undeclared_package"));
    // Not a package.
    let none = run(rlx, &["update", "tests/diagnostics"]);
    assert_eq!(none.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&none.stderr).contains("rlx::no_manifest"));
    assert!(!Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/diagnostics/rlx.lock")
        .exists());
}
