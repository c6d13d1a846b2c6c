//! A recipe whose modules and rubric file come from a package — by path or by git commit — scores
//! exactly as the same recipe with the files copied next to it (docs/sharing.md). The git package is a
//! local repository made here with the `git` command; the cache is a scratch folder (`RLX_CACHE`).

use std::path::{Path, PathBuf};
use std::process::Command;

use rlx_compiler::packages;
use rlx_runtime::synthetic::{self, Spec};

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
        .expect("the git command");
    assert!(
        output.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

fn package(dir: &Path) {
    write(
        &dir.join("rlx.toml"),
        "[package]\nname = \"style\"\nversion = \"0.1.0\"\n",
    );
    write(
        &dir.join("shaping.rlx"),
        "import \"./inner/clip.rlx\"\n\nfn bonus(x, k = 2) = clip01(k * x) - 0.1\n",
    );
    write(
        &dir.join("inner/clip.rlx"),
        "fn clip01(x) = clamp(x, 0, 1)\n",
    );
    write(
        &dir.join("criteria.json"),
        r#"{"criteria": [
  {"name": "voice", "text": "Active voice.", "weight": 3, "levels": [0, 0.5, 1]},
  {"name": "grounded", "text": "Supported claims.", "weight": 2, "saturate": {"kind": "tanh", "k": 3}},
  {"name": "flattering", "text": "Opens with praise.", "veto": true}
]}"#,
    );
}

fn recipe(packaged: bool) -> String {
    let (module, rubric) = if packaged {
        ("style/shaping", "style/criteria.json")
    } else {
        ("\"./shaping.rlx\"", "\"./criteria.json\"")
    };
    format!(
        "import std/advantage.{{group_zscore}}\nimport std/loss.{{ppo_clip}}\nimport std/agg.{{token_mean}}\nimport {module}.{{bonus}}\n\n\
         rubric style {{\n    criteria {rubric}\n    interact voice, grounded : +0.5\n    shape power(gamma = 2)\n}}\n\n\
         input logp : f32[tok] policy\ninput old_logp : f32[tok]\ninput score : f32[resp]\ninput judged : f32[resp, style]\n\n\
         let ratio = exp(logp - old_logp)\nreward = style(judged) + bonus(score)\nadvantage = group_zscore(reward)\n\
         loss = token_mean(ppo_clip(ratio, advantage, 0.2, 0.28))\nmetric voice = mean(judged[voice] over batch)\n"
    )
}

fn score(path: &Path, rollouts: Option<&str>) -> (String, serde_json::Value) {
    let checked = rlx_compiler::check_path(path).expect("read");
    let recipe = checked.recipe.as_ref().unwrap_or_else(|| {
        panic!(
            "{:?}",
            checked
                .diagnostics
                .iter()
                .map(|d| &d.message)
                .collect::<Vec<_>>()
        )
    });
    let rollouts = match rollouts {
        Some(text) => text.to_string(),
        None => {
            let graph = rlx_compiler::compile_graph(recipe, &[]).expect("graph");
            synthetic::to_jsonl(&graph, &synthetic::batch(&graph, &Spec::default()))
        }
    };
    let scored = rlx_runtime::score::score(recipe, &rollouts, &[], true).expect("scores");
    (rollouts, scored.document)
}

#[test]
fn path_and_git_packages_score_as_copied_files() {
    let root: PathBuf =
        std::env::temp_dir().join(format!("rlx-runtime-packages-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).expect("scratch");
    let root = root.canonicalize().expect("canonical");
    std::env::set_var("RLX_CACHE", root.join("cache"));
    // Copied next to the recipe.
    let copied = root.join("copied");
    package(&copied);
    std::fs::remove_file(copied.join("rlx.toml")).expect("rm");
    write(&copied.join("recipe.rlx"), &recipe(false));
    let (rollouts, expected) = score(&copied.join("recipe.rlx"), None);
    assert!(expected["loss"].is_number(), "{expected}");
    // By path.
    package(&root.join("style"));
    let app = |dir: &Path, dependency: &str| {
        write(
            &dir.join("rlx.toml"),
            &format!("[package]\nname = \"app\"\nversion = \"0.1.0\"\n[dependencies]\nstyle = {dependency}\n"),
        );
        write(&dir.join("recipe.rlx"), &recipe(true));
        let updated = packages::update(dir);
        assert!(!updated.has_errors(), "{:?}", updated.diagnostics);
    };
    app(&root.join("by-path"), "{ path = \"../style\" }");
    assert_eq!(
        score(&root.join("by-path/recipe.rlx"), Some(&rollouts)).1,
        expected
    );
    // By git commit.
    let repo = root.join("repo");
    package(&repo);
    git(&repo, &["init", "--quiet"]);
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "--quiet", "-m", "style"]);
    let rev = git(&repo, &["rev-parse", "HEAD"]);
    app(
        &root.join("by-git"),
        &format!("{{ git = \"file://{}\", rev = \"{rev}\" }}", repo.display()),
    );
    assert_eq!(
        score(&root.join("by-git/recipe.rlx"), Some(&rollouts)).1,
        expected
    );
    std::fs::remove_dir_all(&root).ok();
}
