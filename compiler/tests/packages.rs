//! Packages (docs/sharing.md): the data-driven cases of `tests/packages/` and the git, cache, lock,
//! sandbox and artifact behaviours that need a scratch folder.
//!
//! Each folder `tests/packages/CASE/` is a package whose `recipe.rlx` must produce exactly the errors
//! annotated in it, in the annotation format of `tests/diagnostics/` (a subset):
//! `// error: CODE [in FILE] @ TEXT [#N]` (FILE relative to the case folder; TEXT must occur once in
//! that file, or the N-th time) and `// help: SUBSTRING`. The lock files of the cases were written by
//! `rlx update` and then edited to break them as each recipe's comment says.
//!
//! The git tests make local repositories with the `git` command (no network) and share one cache
//! folder (`RLX_CACHE`, set once for this test binary).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Once;

use rlx_compiler::packages::{self, Mode};
use rlx_compiler::{check_path, Checked, Origin};

fn cases_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/packages")
        .canonicalize()
        .expect("tests/packages exists")
}

struct Expected {
    code: String,
    file: String,
    span: (usize, usize),
    helps: Vec<String>,
}

fn word(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_'
}

/// The start of the `occurrence`-th whole-word match of `needle` outside `//` comment lines.
fn locate(text: &str, needle: &str, occurrence: Option<usize>) -> Result<usize, String> {
    let bytes = text.as_bytes();
    let found: Vec<usize> = text
        .match_indices(needle)
        .map(|(start, _)| start)
        .filter(|&start| {
            let line_start = text[..start].rfind('\n').map_or(0, |n| n + 1);
            let in_comment = text[line_start..start].trim_start().starts_with("//");
            let end = start + needle.len();
            let starts = !word(needle.as_bytes()[0]) || start == 0 || !word(bytes[start - 1]);
            let ends = !word(*needle.as_bytes().last().unwrap_or(&b' '))
                || end == bytes.len()
                || !word(bytes[end]);
            !in_comment && starts && ends
        })
        .collect();
    match occurrence {
        None if found.len() == 1 => Ok(found[0]),
        None => Err(format!("`{needle}` occurs {} times", found.len())),
        Some(n) => found
            .get(n - 1)
            .copied()
            .ok_or_else(|| format!("`{needle} #{n}`: it occurs {} times", found.len())),
    }
}

fn expectations(case: &Path) -> Result<Vec<Expected>, String> {
    let recipe = std::fs::read_to_string(case.join("recipe.rlx")).map_err(|e| e.to_string())?;
    let mut expected: Vec<Expected> = Vec::new();
    for line in recipe.lines() {
        let line = line.trim_start();
        if let Some(help) = line.strip_prefix("// help:") {
            expected
                .last_mut()
                .ok_or("`// help:` before any `// error:`")?
                .helps
                .push(help.trim().to_string());
            continue;
        }
        let Some(rest) = line.strip_prefix("// error:") else {
            continue;
        };
        let (code, rest) = rest.trim().split_once(' ').ok_or("no position")?;
        let (file, rest) = match rest.trim().strip_prefix("in ") {
            Some(after) => {
                let (file, rest) = after.split_once(' ').ok_or("no position")?;
                (file.to_string(), rest.trim())
            }
            None => ("recipe.rlx".to_string(), rest.trim()),
        };
        let text = rest.strip_prefix('@').ok_or("expected `@ TEXT`")?.trim();
        let (text, occurrence) = match text.rsplit_once(" #") {
            Some((body, n)) if n.bytes().all(|b| b.is_ascii_digit()) && !n.is_empty() => (
                body.trim(),
                Some(n.parse::<usize>().map_err(|e| e.to_string())?),
            ),
            _ => (text, None),
        };
        let content =
            std::fs::read_to_string(case.join(&file)).map_err(|e| format!("{file}: {e}"))?;
        let start = locate(&content, text, occurrence).map_err(|e| format!("{file}: {e}"))?;
        expected.push(Expected {
            code: code.to_string(),
            file,
            span: (start, start + text.len()),
            helps: Vec::new(),
        });
    }
    Ok(expected)
}

fn display_name(checked: &Checked, file: rlx_compiler::FileId, case: &Path) -> String {
    match &checked.sources.get(file).origin {
        Origin::Path(path) => path
            .strip_prefix(case)
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|_| path.display().to_string()),
        Origin::Stdlib(name) => format!("std/{name}"),
        Origin::Memory => checked.sources.get(file).name.clone(),
    }
}

#[test]
fn every_package_case_gives_exactly_its_annotated_errors() {
    let mut cases: Vec<PathBuf> = std::fs::read_dir(cases_dir())
        .expect("readable")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.join("recipe.rlx").is_file())
        .collect();
    cases.sort();
    assert!(cases.len() >= 8, "the package cases are missing: {cases:?}");
    let mut failures = Vec::new();
    for case in &cases {
        let name = case
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let expected = match expectations(case) {
            Ok(expected) if !expected.is_empty() => expected,
            Ok(_) => {
                failures.push(format!("{name}: no `// error:` annotation"));
                continue;
            }
            Err(problem) => {
                failures.push(format!("{name}: {problem}"));
                continue;
            }
        };
        let checked = check_path(&case.join("recipe.rlx")).expect("readable recipe");
        let mut found: Vec<(String, String, (usize, usize), String)> = checked
            .diagnostics
            .iter()
            .filter(|d| d.is_error())
            .map(|d| {
                let span = d
                    .labels
                    .first()
                    .map_or((0, 0), |l| (l.span.start as usize, l.span.end as usize));
                (
                    d.code.to_string(),
                    display_name(&checked, d.file, case),
                    span,
                    d.help.clone().unwrap_or_default(),
                )
            })
            .collect();
        for want in &expected {
            let at = found.iter().position(|(code, file, span, _)| {
                *code == want.code && *file == want.file && *span == want.span
            });
            match at {
                Some(index) => {
                    let (_, _, _, help) = found.remove(index);
                    for wanted in &want.helps {
                        if !help.contains(wanted.as_str()) {
                            failures.push(format!(
                                "{name}: {} in {}: help `{help}` lacks `{wanted}`",
                                want.code, want.file
                            ));
                        }
                    }
                }
                None => failures.push(format!(
                    "{name}: missing {} in {} at {:?}",
                    want.code, want.file, want.span
                )),
            }
        }
        for (code, file, span, _) in found {
            failures.push(format!("{name}: unexpected {code} in {file} at {span:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// Scratch packages and git repositories

static CACHE: Once = Once::new();

/// A fresh scratch folder, with `RLX_CACHE` pointing every test of this binary at one shared cache.
fn scratch(name: &str) -> PathBuf {
    let base = std::env::temp_dir().join(format!("rlx-packages-{}", std::process::id()));
    CACHE.call_once(|| {
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("cache")).expect("scratch");
        // Set before any test reads it (every test starts here), never changed afterwards.
        std::env::set_var("RLX_CACHE", base.join("cache"));
    });
    let dir = base.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch");
    dir.canonicalize().expect("canonical")
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("folder");
    std::fs::write(path, text).expect("write");
}

fn git(dir: &Path, args: &[&str]) -> String {
    let output = Command::new("git")
        .args([
            "-c",
            "user.name=rlx",
            "-c",
            "user.email=rlx@localhost",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the git command (the package tests need it)");
    assert!(
        output.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

const STYLE_MANIFEST: &str =
    "[package]\nname = \"style\"\nversion = \"0.1.0\"\ndescription = \"d\"\nlicense = \"MIT\"\n";
const VOICE: &str =
    "import \"./inner/scale.rlx\"\n\n/// Scaled and clipped.\nfn bonus(x, k = 2) = clip01(k * x)\n";
const SCALE: &str = "fn clip01(x) = clamp(x, 0, 1)\n";
const RUBRIC: &str = "[[criteria]]\nname = \"voice\"\ntext = \"Active voice.\"\npoints = 2\n\n[[criteria]]\nname = \"grounded\"\ntext = \"Supported claims.\"\npoints = 3\n";

/// The same recipe three ways: with its modules copied next to it, and importing them from a
/// package (`style/…`).
fn recipe(packaged: bool) -> String {
    let (module, rubric) = if packaged {
        ("style/voice", "style/criteria.toml")
    } else {
        ("\"./voice.rlx\"", "\"./criteria.toml\"")
    };
    format!(
        "import std/advantage.{{group_zscore}}\nimport std/agg.{{token_mean}}\nimport {module}.{{bonus}}\n\nrubric judge {{\n    criteria {rubric}\n    aggregate points\n}}\n\ninput score : f32[resp]\ninput judged : f32[resp, judge]\ninput logp : f32[tok] policy\n\nreward = bonus(score) + judge(judged)\nadvantage = group_zscore(reward)\nloss = token_mean(-advantage * logp)\n"
    )
}

fn style_package(dir: &Path) {
    write(&dir.join("rlx.toml"), STYLE_MANIFEST);
    write(&dir.join("voice.rlx"), VOICE);
    write(&dir.join("inner/scale.rlx"), SCALE);
    write(&dir.join("criteria.toml"), RUBRIC);
}

fn app(dir: &Path, dependency: &str) {
    write(
        &dir.join("rlx.toml"),
        &format!("[package]\nname = \"app\"\nversion = \"0.1.0\"\n\n[dependencies]\nstyle = {dependency}\n"),
    );
    write(&dir.join("recipe.rlx"), &recipe(true));
}

fn errors(checked: &Checked) -> Vec<String> {
    checked
        .diagnostics
        .iter()
        .filter(|d| d.is_error())
        .map(|d| format!("{}: {}", d.code, d.message))
        .collect()
}

/// The recipe's graph as JSON, without the nodes' spans (which point into the files it was read
/// from, and are no part of what a node computes).
fn graph_json(checked: &Checked) -> String {
    let recipe = checked
        .recipe
        .as_ref()
        .unwrap_or_else(|| panic!("{:?}", errors(checked)));
    let mut graph = rlx_compiler::compile_graph(recipe, &[]).expect("graph");
    for node in &mut graph.nodes {
        node.span = None;
        node.call = None;
    }
    serde_json::to_string(&graph).expect("json")
}

/// A git repository holding the style package; returns (its file:// URL, the commit).
fn style_repository(dir: &Path) -> (String, String) {
    style_package(dir);
    git(dir, &["init", "--quiet"]);
    git(dir, &["add", "."]);
    git(dir, &["commit", "--quiet", "-m", "style 0.1.0"]);
    let rev = git(dir, &["rev-parse", "HEAD"]);
    (format!("file://{}", dir.display()), rev)
}

#[test]
fn path_and_git_packages_compile_to_the_graph_of_copied_modules() {
    let root = scratch("same-graph");
    // Copied: the modules and the rubric file next to the recipe.
    let copied = root.join("copied");
    style_package(&copied);
    std::fs::remove_file(copied.join("rlx.toml")).expect("rm");
    write(&copied.join("recipe.rlx"), &recipe(false));
    let copied = check_path(&copied.join("recipe.rlx")).expect("read");
    let expected = graph_json(&copied);
    // A path dependency.
    style_package(&root.join("style"));
    let by_path = root.join("by-path");
    app(&by_path, "{ path = \"../style\" }");
    let before = check_path(&by_path.join("recipe.rlx")).expect("read");
    assert!(
        errors(&before)
            .iter()
            .any(|e| e.starts_with("rlx::lock_missing")),
        "{:?}",
        errors(&before)
    );
    let updated = packages::update(&by_path);
    assert!(!updated.has_errors(), "{:?}", updated.diagnostics);
    let checked = check_path(&by_path.join("recipe.rlx")).expect("read");
    assert_eq!(graph_json(&checked), expected);
    // The criteria's texts travel with the rubric, for a judge signal to ask.
    let graph =
        rlx_compiler::compile_graph(checked.recipe.as_ref().expect("clean"), &[]).expect("graph");
    assert_eq!(graph.rubrics[0].criteria, ["voice", "grounded"]);
    assert_eq!(
        graph.rubrics[0].texts,
        ["Active voice.", "Supported claims."]
    );
    assert_eq!(checked.packages.len(), 1);
    assert_eq!(checked.packages[0].source, "path+../style");
    assert_eq!(
        checked.packages[0].files.keys().collect::<Vec<_>>(),
        ["criteria.toml", "inner/scale.rlx", "rlx.toml", "voice.rlx"]
    );
    // A git dependency.
    let (url, rev) = style_repository(&root.join("style-repo"));
    let by_git = root.join("by-git");
    app(&by_git, &format!("{{ git = \"{url}\", rev = \"{rev}\" }}"));
    let updated = packages::update(&by_git);
    assert!(!updated.has_errors(), "{:?}", updated.diagnostics);
    let checked = check_path(&by_git.join("recipe.rlx")).expect("read");
    assert_eq!(graph_json(&checked), expected);
    assert_eq!(checked.packages[0].source, format!("git+{url}#{rev}"));
    // The artifact records the packages, hashes as locked.
    let artifact = rlx_compiler::artifact::Artifact::build(
        &checked,
        "recipe",
        &[],
        &rlx_compiler::backend::Options::default(),
    )
    .expect("artifact");
    assert_eq!(artifact.packages, checked.packages);
    assert_eq!(
        artifact.sources.len(),
        1,
        "package files are not sources: {:?}",
        artifact.sources
    );
    let lock = std::fs::read_to_string(by_git.join("rlx.lock")).expect("lock");
    for hash in artifact.packages[0].files.values() {
        assert!(lock.contains(hash.as_str()));
    }
}

#[test]
fn a_fetched_git_package_works_offline_and_is_verified() {
    let root = scratch("offline");
    let repo = root.join("style-repo");
    let (url, rev) = style_repository(&repo);
    let app_dir = root.join("app");
    app(&app_dir, &format!("{{ git = \"{url}\", rev = \"{rev}\" }}"));
    assert!(!packages::update(&app_dir).has_errors());
    // The repository is gone: fetching and compiling work from the cache.
    std::fs::remove_dir_all(&repo).expect("rm");
    let fetched = packages::fetch(&app_dir);
    assert!(!fetched.has_errors(), "{:?}", fetched.diagnostics);
    let checked = check_path(&app_dir.join("recipe.rlx")).expect("read");
    assert!(checked.recipe.is_some(), "{:?}", errors(&checked));
    // A file of the cached checkout changes: compiling and fetching refuse it.
    let cache = packages::cache_dir().expect("RLX_CACHE");
    let checkout = packages::git_checkout_dir(&cache, &url, &rev);
    write(
        &checkout.join("voice.rlx"),
        &VOICE.replace("k = 2", "k = 3"),
    );
    let checked = check_path(&app_dir.join("recipe.rlx")).expect("read");
    let found = errors(&checked);
    assert!(
        found.len() == 1
            && found[0].contains("rlx::package_modified")
            && found[0].contains("`voice.rlx` has changed"),
        "{found:?}"
    );
    assert!(packages::fetch(&app_dir).has_errors());
    // Once the checkout is removed, compiling says to fetch; fetching needs the repository.
    std::fs::remove_dir_all(&checkout).expect("rm");
    let checked = check_path(&app_dir.join("recipe.rlx")).expect("read");
    assert!(
        errors(&checked)[0].starts_with("rlx::not_fetched"),
        "{:?}",
        errors(&checked)
    );
    let fetched = packages::fetch(&app_dir);
    let codes: Vec<&str> = fetched.diagnostics.iter().map(|d| d.code).collect();
    assert_eq!(codes, ["rlx::fetch"]);
}

#[test]
fn a_wrong_rev_is_an_error_at_the_rev() {
    let root = scratch("wrong-rev");
    let (url, _) = style_repository(&root.join("style-repo"));
    let app_dir = root.join("app");
    let missing = "0123456789abcdef0123456789abcdef01234567";
    app(
        &app_dir,
        &format!("{{ git = \"{url}\", rev = \"{missing}\" }}"),
    );
    let outcome = packages::update(&app_dir);
    let diagnostic = outcome
        .diagnostics
        .iter()
        .find(|d| d.is_error())
        .expect("an error");
    assert_eq!(diagnostic.code, "rlx::bad_rev");
    let text = &outcome.sources.get(diagnostic.file).text;
    let span = diagnostic.labels[0].span;
    assert_eq!(
        &text[span.start as usize..span.end as usize],
        format!("\"{missing}\"")
    );
    assert!(!app_dir.join("rlx.lock").exists());
    // A rev that is not a full commit id is refused before anything runs.
    app(&app_dir, &format!("{{ git = \"{url}\", rev = \"main\" }}"));
    let outcome = packages::update(&app_dir);
    assert_eq!(outcome.diagnostics[0].code, "rlx::manifest");
    assert!(outcome.diagnostics[0]
        .message
        .contains("not a full commit id"));
}

#[test]
fn two_versions_and_cycles_are_refused_by_update() {
    let root = scratch("graph");
    style_package(&root.join("style"));
    write(
        &root.join("style2/rlx.toml"),
        &STYLE_MANIFEST.replace("0.1.0", "0.2.0"),
    );
    write(
        &root.join("zeta/rlx.toml"),
        "[package]\nname = \"zeta\"\nversion = \"1.0.0\"\n[dependencies]\nstyle = { path = \"../style2\" }\n",
    );
    let app_dir = root.join("app");
    write(
        &app_dir.join("rlx.toml"),
        "[package]\nname = \"app\"\nversion = \"0.1.0\"\n[dependencies]\nstyle = { path = \"../style\" }\nzeta = { path = \"../zeta\" }\n",
    );
    let codes: Vec<&str> = packages::update(&app_dir)
        .diagnostics
        .iter()
        .map(|d| d.code)
        .collect();
    assert_eq!(codes, ["rlx::package_conflict"]);
    // zeta → app: a cycle through the recipe's own package.
    write(
        &root.join("zeta/rlx.toml"),
        "[package]\nname = \"zeta\"\nversion = \"1.0.0\"\n[dependencies]\napp = { path = \"../app\" }\n",
    );
    let outcome = packages::update(&app_dir);
    let codes: Vec<&str> = outcome.diagnostics.iter().map(|d| d.code).collect();
    assert_eq!(codes, ["rlx::package_cycle"]);
    assert!(outcome.diagnostics[0].message.contains("app → zeta → app"));
}

#[cfg(unix)]
#[test]
fn a_symbolic_link_out_of_a_package_is_refused() {
    let root = scratch("symlink");
    style_package(&root.join("style"));
    write(&root.join("secret.rlx"), "fn secret(x) = x\n");
    let app_dir = root.join("app");
    app(&app_dir, "{ path = \"../style\" }");
    assert!(!packages::update(&app_dir).has_errors());
    // A link inside the package that leads out of it: the package no longer verifies, and an
    // import through it would resolve outside the package.
    std::os::unix::fs::symlink("../secret.rlx", root.join("style/leak.rlx")).expect("symlink");
    write(
        &app_dir.join("recipe.rlx"),
        &format!("{}import style/leak.{{secret}}\n", recipe(true)),
    );
    let checked = check_path(&app_dir.join("recipe.rlx")).expect("read");
    let found = errors(&checked);
    assert!(
        found.iter().any(|e| e.starts_with("rlx::package_files") && e.contains("leads outside the package")),
        "{found:?}"
    );
    assert!(packages::update(&app_dir).has_errors());
    // A link from the recipe's folder into the package is the recipe's own folder rule's business.
    std::fs::remove_file(root.join("style/leak.rlx")).expect("rm");
    std::os::unix::fs::symlink("../style/voice.rlx", app_dir.join("voice.rlx")).expect("symlink");
    write(
        &app_dir.join("recipe.rlx"),
        &recipe(false).replace("\"./criteria.toml\"", "style/criteria.toml"),
    );
    let found = errors(&check_path(&app_dir.join("recipe.rlx")).expect("read"));
    assert!(
        found.iter().any(|e| e.starts_with("rlx::import_escape")),
        "{found:?}"
    );
}

#[test]
fn a_recipe_in_no_package_cannot_import_from_one() {
    let root = scratch("no-manifest");
    write(&root.join("recipe.rlx"), &recipe(true));
    let checked = check_path(&root.join("recipe.rlx")).expect("read");
    let found = errors(&checked);
    assert!(found[0].starts_with("rlx::no_manifest"), "{found:?}");
    let checked = rlx_compiler::check_source("memory.rlx", &recipe(true));
    assert!(checked.has_errors());
    // The lock of a package without dependencies is empty, and its modules import as `own/module`.
    let own = scratch("own");
    style_package(&own);
    write(&own.join("recipes/r.rlx"), &recipe(true));
    assert!(!packages::update(&own).has_errors());
    let checked = check_path(&own.join("recipes/r.rlx")).expect("read");
    assert!(checked.recipe.is_some(), "{:?}", errors(&checked));
    assert!(checked.packages.is_empty());
    assert_eq!(
        packages::resolve_at(&own, Mode::Locked)
            .workspace
            .map(|w| w.packages.len()),
        Some(0)
    );
}

#[test]
fn the_example_package_checks_clean_and_documents_itself() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/packages");
    let checked = check_path(&examples.join("style_grpo/grpo_style.rlx")).expect("read");
    assert!(checked.recipe.is_some(), "{:?}", errors(&checked));
    assert_eq!(checked.packages.len(), 1);
    assert_eq!(checked.packages[0].name, "house_style");
    let locked = packages::resolve_at(&examples.join("style_grpo"), Mode::Locked);
    assert!(!locked.has_errors(), "{:?}", locked.diagnostics);
    let doc = rlx_compiler::docgen::package_markdown(&examples.join("house_style")).expect("doc");
    assert!(doc.contains("### `house_style/shaping` (module)"), "{doc}");
    assert!(
        doc.contains("| `flattering` |  | veto #reward-hacking |"),
        "{doc}"
    );
}

#[test]
fn package_imports_and_criteria_entries_format_and_parse_back() {
    let messy = "import   house_style/shaping.{ bonus }\nrubric style {\n  criteria   house_style/criteria/style.toml\n    criteria \"./local.json\"\n  criterion extra weight 2\n}\n";
    let formatted =
        rlx_compiler::format::format_source(rlx_compiler::FileId(0), messy).expect("parses");
    assert_eq!(
        formatted,
        "import house_style/shaping.{bonus}\n\nrubric style {\n    criteria house_style/criteria/style.toml\n    criteria \"./local.json\"\n    criterion extra weight 2\n}\n"
    );
    let again =
        rlx_compiler::format::format_source(rlx_compiler::FileId(0), &formatted).expect("parses");
    assert_eq!(again, formatted);
    // `..` cannot be written in a module path; `std` is never a package.
    assert!(
        rlx_compiler::syntax::parse_module(rlx_compiler::FileId(0), "import a/../b\n").is_err()
    );
    let checked = rlx_compiler::check_source(
        "m.rlx",
        "import stdx/loss\ninput s : f32[resp]\nreward = s\n",
    );
    assert!(checked.has_errors());
}

#[test]
fn an_artifact_records_and_checks_its_rubric_files() {
    let root = scratch("artifact");
    style_package(&root);
    std::fs::remove_file(root.join("rlx.toml")).expect("rm");
    write(&root.join("recipe.rlx"), &recipe(false));
    let checked = check_path(&root.join("recipe.rlx")).expect("read");
    let artifact = rlx_compiler::artifact::Artifact::build(
        &checked,
        "recipe",
        &[],
        &rlx_compiler::backend::Options::default(),
    )
    .expect("artifact");
    let recorded: Vec<String> = artifact
        .sources
        .iter()
        .map(|s| {
            s.path
                .strip_prefix(&root)
                .expect("inside")
                .display()
                .to_string()
        })
        .collect();
    assert_eq!(
        recorded,
        [
            "recipe.rlx",
            "criteria.toml",
            "voice.rlx",
            "inner/scale.rlx"
        ]
    );
    assert!(artifact.packages.is_empty());
    let path = root.join("recipe.rlxc");
    artifact.save(&path).expect("save");
    assert!(rlx_compiler::artifact::load(&path).is_ok());
    write(
        &root.join("criteria.toml"),
        &RUBRIC.replace("points = 3", "points = 4"),
    );
    let error = rlx_compiler::artifact::load(&path).expect_err("stale");
    assert!(
        error.to_string().contains("criteria.toml has changed"),
        "{error}"
    );
}
