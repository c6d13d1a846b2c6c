//! The open-ended decompose task (`task.kind = "decompose"`, docs/experiments.md): its exact validity
//! check and partition, its config errors, the evaluation's quality and diversity metrics in a short
//! run, the same warm start whatever the recipe, and `rlx compare`'s report of runs.

use std::path::{Path, PathBuf};

use rlx_trainer::cli::{prepare, RunArgs};
use rlx_trainer::compare::{read_run, spread, write_report, MetricSpec};
use rlx_trainer::decompose::{classes, Decompose, DecomposeConfig};
use rlx_trainer::rng::Rng;
use rlx_trainer::run_dir::RecipeFile;
use rlx_trainer::task::{Prompt, Task, Tokenizer, EOS};
use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn task(op: &str, min: i64, max: i64, operand: i64, hold_out_every: usize) -> Decompose {
    Decompose::new(DecomposeConfig {
        op: op.into(),
        min_target: min,
        max_target: max,
        max_operand: operand,
        hold_out_every,
    })
    .unwrap()
}

fn error(op: &str, min: i64, max: i64, operand: i64, hold_out_every: usize) -> String {
    match Decompose::new(DecomposeConfig {
        op: op.into(),
        min_target: min,
        max_target: max,
        max_operand: operand,
        hold_out_every,
    }) {
        Ok(_) => panic!("{op} {min}..={max} operands ≤ {operand} should be refused"),
        Err(e) => e,
    }
}

/// The completion `text` followed by `<eos>`.
fn answer(text: &str) -> Vec<u32> {
    let mut ids = Tokenizer.encode(text).unwrap();
    ids.push(EOS);
    ids
}

/// The prompt of `target` among the task's evaluation prompts.
fn prompt_of(task: &Decompose, target: i64) -> Prompt {
    task.eval_prompts(0)
        .unwrap()
        .into_iter()
        .find(|p| p.text == format!("{target}="))
        .unwrap()
}

#[test]
fn validity_is_exact() {
    let sums = task("+", 3, 18, 9, 0);
    let p = prompt_of(&sums, 12);
    for valid in ["3+9", "9+3", "6+6", "4+8"] {
        assert_eq!(sums.validity(&p, &answer(valid)).unwrap(), 1.0, "{valid}");
    }
    // Wrong sum, an operand over max_operand, leading zeros, extra terms, spaces, other operators,
    // nothing, and a right answer that never stopped.
    for invalid in [
        "3+8", "12+0", "0+12", "03+9", "3+09", "3+4+5", " 3+9", "3+9 ", "3-9", "3*4", "", "+",
        "39", "6+", "+6",
    ] {
        assert_eq!(
            sums.validity(&p, &answer(invalid)).unwrap(),
            0.0,
            "{invalid:?}"
        );
    }
    assert_eq!(
        sums.validity(&p, &Tokenizer.encode("3+9").unwrap())
            .unwrap(),
        0.0,
        "no <eos>"
    );
    // Tokens after the first <eos> are not part of the answer.
    let mut after = answer("3+9");
    after.extend(Tokenizer.encode("1").unwrap());
    assert_eq!(sums.validity(&p, &after).unwrap(), 1.0);

    let products = task("*", 0, 12, 12, 0);
    let twelve = prompt_of(&products, 12);
    for (text, want) in [
        ("3*4", 1.0),
        ("1*12", 1.0),
        ("12*1", 1.0),
        ("0*12", 0.0),
        ("2*5", 0.0),
    ] {
        assert_eq!(
            products.validity(&twelve, &answer(text)).unwrap(),
            want,
            "{text}"
        );
    }
    let zero = prompt_of(&products, 0);
    for (text, want) in [("0*7", 1.0), ("7*0", 1.0), ("0*0", 1.0), ("1*1", 0.0)] {
        assert_eq!(
            products.validity(&zero, &answer(text)).unwrap(),
            want,
            "{text}"
        );
    }
    let differences = task("-", -3, 3, 5, 0);
    let minus_two = prompt_of(&differences, -2);
    assert_eq!(minus_two.text, "-2=");
    for (text, want) in [("1-3", 1.0), ("3-5", 1.0), ("3-1", 0.0), ("4-6", 0.0)] {
        assert_eq!(
            differences.validity(&minus_two, &answer(text)).unwrap(),
            want,
            "{text}"
        );
    }
    // A prompt of another task is an error, not a silent 0.
    let stranger = Prompt {
        ids: Tokenizer.encode("99=").unwrap(),
        text: "99=".into(),
        answer: None,
        key: 0,
    };
    assert_eq!(
        sums.validity(&stranger, &answer("90+9")).unwrap_err(),
        "prompt \"99=\" is not one of this task's"
    );
}

#[test]
fn the_partition_numbers_identical_answers_alike_within_each_group() {
    let a = answer("3+9");
    let b = answer("9+3");
    let mut a_then_noise = answer("3+9");
    a_then_noise.push(Tokenizer.encode("7").unwrap()[0]);
    let unfinished = Tokenizer.encode("3+9").unwrap();
    let completions = vec![
        a.clone(),
        b.clone(),
        a_then_noise,
        unfinished.clone(),
        // The next group numbers its own classes from 0.
        b.clone(),
        b,
        a,
        unfinished,
    ];
    assert_eq!(
        classes(&completions, 4),
        vec![0.0, 1.0, 0.0, 2.0, 0.0, 0.0, 1.0, 2.0]
    );
}

#[test]
fn the_task_fills_its_signals_and_keeps_held_out_targets_out_of_training() {
    let t = task("+", 10, 29, 19, 5);
    let (train, held) = t.targets();
    assert_eq!(held, vec![14, 19, 24, 29]);
    assert_eq!(train.len(), 16);
    assert!(train.iter().all(|x| !held.contains(x)));
    // 14 = 0+14 … 14+0 (15 answers); 29 = 10+19 … 19+10 (10 answers).
    assert_eq!(t.held_out_answers(), vec![15, 20, 15, 10]);
    let mut rng = Rng::new(3);
    for p in t.prompts(&mut rng, 200).unwrap() {
        let target: i64 = p.text.trim_end_matches('=').parse().unwrap();
        assert!(train.contains(&target), "{} is held out", p.text);
    }
    let examples = t.supervised(&mut rng, 300).unwrap().unwrap();
    let mut distinct: Vec<&Vec<u32>> = Vec::new();
    for (ids, target) in &examples {
        let text = Tokenizer.decode(ids);
        let target_value: i64 = text.trim_end_matches('=').parse().unwrap();
        assert!(train.contains(&target_value));
        let key = train.iter().position(|x| *x == target_value).unwrap();
        let prompt = Prompt {
            ids: ids.clone(),
            text: text.clone(),
            answer: None,
            key: [0usize, 1, 2, 3, 5, 6, 7, 8, 10, 11, 12, 13, 15, 16, 17, 18][key],
        };
        assert_eq!(
            t.validity(&prompt, target).unwrap(),
            1.0,
            "{text} {target:?}"
        );
        if !distinct.contains(&target) {
            distinct.push(target);
        }
    }
    // The warm start imitates many answers, not one per target.
    assert!(
        distinct.len() > 100,
        "{} distinct warm-start answers",
        distinct.len()
    );

    let prompts = t.eval_prompts(0).unwrap();
    let p = &prompts[..2];
    let completions = vec![
        answer("0+14"),
        answer("0+14"),
        answer("1+1"),
        answer("9+10"),
    ];
    assert_eq!(
        t.signal("score", p, &completions, 2).unwrap(),
        vec![1.0, 1.0, 0.0, 1.0]
    );
    assert_eq!(
        t.signal("quality", p, &completions, 2).unwrap(),
        t.signal("score", p, &completions, 2).unwrap()
    );
    assert_eq!(
        t.signal("cluster", p, &completions, 2).unwrap(),
        vec![0.0, 0.0, 0.0, 1.0]
    );
    assert_eq!(
        t.signal("judge", p, &completions, 2).unwrap_err(),
        "the decompose task has no signal `judge` (it fills `score`, `quality` and `cluster`)"
    );
    assert_eq!(
        t.signal("score", p, &completions, 3).unwrap_err(),
        "4 completions for 2 prompts × 3 samples"
    );
    assert!(t.is_class("cluster") && !t.is_class("score"));
    assert_eq!(t.max_prompt_tokens(), 3);
    assert_eq!(t.max_answer_chars(), 5);
    // Nothing held out: the evaluation uses every target.
    let all = task("+", 10, 29, 19, 0);
    assert_eq!(all.targets().0, all.targets().1);
    assert_eq!(all.eval_prompts(0).unwrap().len(), 20);
}

#[test]
fn bad_settings_are_refused_with_the_key_to_change() {
    assert_eq!(
        error("/", 1, 9, 9, 0),
        "task.op = \"/\": use one of \"+\", \"-\", \"*\""
    );
    assert_eq!(
        error("+", 9, 1, 9, 0),
        "task.min_target = 9 is larger than task.max_target = 1"
    );
    assert_eq!(
        error("+", 0, 30, 9, 0),
        "task.min_target..=task.max_target = 0..=30 is outside 0..=18, the values of a+b with operands in 0..=task.max_operand = 9"
    );
    assert_eq!(
        error("*", 1, 20, 9, 0),
        "task: the target 11 has no answer a*b with operands in 0..=task.max_operand = 9; narrow task.min_target..=task.max_target"
    );
    assert_eq!(
        error("+", 1, 9, 1000, 0),
        "task.max_operand = 1000 must be in 0..=999"
    );
    assert_eq!(
        error("+", 0, 1500, 999, 0),
        "task.min_target..=task.max_target holds 1501 targets (at most 1000)"
    );
    assert_eq!(
        error("+", 1, 9, 9, 1),
        "task.hold_out_every = 1 holds out every target of 1..=9: nothing is left to train on"
    );
    assert_eq!(
        error("+", 1, 3, 9, 5),
        "task.hold_out_every = 5 holds out no target of 1..=3 (3 targets); set it to at most 3 or to 0 (evaluate on the training targets)"
    );
    // Through the config: an unknown key names the kind's keys; a pretrained model is refused.
    let parse = |text: &str| {
        rlx_trainer::config::Config::parse(text, &[]).and_then(|c| c.validate().map(|_| c))
    };
    let e = parse("[task]\nkind = \"decompose\"\nmax_operands = 3\n").unwrap_err();
    assert!(
        e.contains("unknown key `task.max_operands`")
            && e.contains("did you mean `task.max_operand`"),
        "{e}"
    );
    let e = parse("[task]\nkind = \"decompose\"\n[model]\nkind = \"smollm2\"\n").unwrap_err();
    assert!(
        e.contains("task.kind = \"decompose\" needs model.kind = \"tiny\""),
        "{e}"
    );
    let e = parse("[task]\nkind = \"decompose\"\n[sampler]\nmax_new_tokens = 4\n").unwrap_err();
    assert_eq!(e, "config: sampler.max_new_tokens = 4 cannot hold the longest answer and its end token (6 tokens for task.max_operand = 49 with \"+\")");
    let e = parse("[task]\nkind = \"decompose\"\n[signals.quality]\nkind = \"exact_answer\"\n")
        .unwrap_err();
    assert!(
        e.contains("the decompose task fills its inputs itself (score, quality, cluster)"),
        "{e}"
    );
}

/// A short run of `recipe` on configs/darling.toml (a small warm start, 3 steps, an evaluation each
/// step), with its recipe file recorded as `rlx run` does.
fn short_run(recipe: &str, seed: u64) -> PathBuf {
    let out = std::env::temp_dir().join(format!(
        "rlx-decompose-{recipe}-{seed}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&out);
    let path = root().join(format!("recipes/{recipe}.rlx"));
    let checked = rlx_compiler::check_path(&path).expect("recipe readable");
    let recipe_file = RecipeFile {
        path: path.clone(),
        text: std::fs::read_to_string(&path).unwrap(),
    };
    let args = RunArgs {
        recipe_name: recipe.into(),
        config_text: Some(std::fs::read_to_string(root().join("configs/darling.toml")).unwrap()),
        sets: [
            "steps=3",
            "sft.steps=40",
            "train.eval_every=1",
            "train.eval_samples=8",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        seed: Some(seed),
        out: Some(out.clone()),
        recipe_files: vec![recipe_file],
        ..Default::default()
    };
    let prepared = prepare(&checked.recipe.expect("recipe checks"), &args).unwrap();
    rlx_trainer::train::run(prepared.plan, &prepared.config, &prepared.out, |_| {}).unwrap();
    out
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn runs_log_quality_and_diversity_from_one_warm_start_and_compare_side_by_side() {
    let grpo = short_run("grpo", 7);
    let darling = short_run("darling", 7);
    let before = |dir: &Path| json(&dir.join("summary.json"))["eval_before"].clone();
    // The warm start depends on the seed only: both recipes start from the same policy.
    assert_eq!(before(&grpo), before(&darling));
    let b = before(&grpo);
    for dir in [&grpo, &darling] {
        let text = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3);
        for line in lines.iter().chain(std::iter::once(&b)) {
            let get = |k: &str| line[k].as_f64().unwrap_or_else(|| panic!("{k} in {line}"));
            let (quality, distinct, classes) = (
                get("eval/quality"),
                get("eval/distinct"),
                get("eval/classes"),
            );
            assert!((0.0..=1.0).contains(&quality));
            // Distinct valid answers ≤ valid samples (8 per prompt), and ≤ the classes of all samples.
            assert!(
                distinct <= 8.0 * quality + 1e-12,
                "{distinct} > 8 × {quality}"
            );
            assert!(distinct <= classes && (1.0..=8.0).contains(&classes));
            assert_eq!(get("eval/mean@8/score"), quality);
            // Class ids are not scores: no mean or best of `cluster` in the evaluation.
            let keys = line.as_object().unwrap().keys();
            assert!(
                keys.filter(|k| k.starts_with("eval/"))
                    .all(|k| !k.contains("cluster")),
                "{line}"
            );
        }
    }

    let metrics = vec![
        MetricSpec::parse("quality=eval/quality").unwrap(),
        MetricSpec::parse("eval/distinct").unwrap(),
    ];
    assert_eq!(metrics[1].name, "distinct");
    let runs: Vec<_> = [&grpo, &darling]
        .iter()
        .map(|d| read_run(d, &metrics).unwrap())
        .collect();
    let report = std::env::temp_dir().join(format!("rlx-decompose-report-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&report);
    write_report(&runs, &metrics, "test", &report).unwrap();
    let results = json(&report.join("results.json"));
    let results = results.as_array().unwrap();
    assert_eq!(results.len(), 2);
    let last = |dir: &Path, key: &str| {
        let text = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
        let line: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
        line[key].as_f64().unwrap()
    };
    for (result, (recipe, dir)) in results.iter().zip([("grpo", &grpo), ("darling", &darling)]) {
        assert_eq!(result["recipe"], recipe);
        assert_eq!(result["seed"], 7);
        assert_eq!(
            result["quality"].as_f64().unwrap(),
            last(dir, "eval/quality")
        );
        assert_eq!(
            result["distinct"].as_f64().unwrap(),
            last(dir, "eval/distinct")
        );
    }
    let table = std::fs::read_to_string(report.join("table.md")).unwrap();
    assert!(table.starts_with("| recipe | seeds | quality before | quality final | distinct before | distinct final |"), "{table}");
    assert!(
        table.contains(&format!(
            "| grpo | 1 | {:.3} |",
            b["eval/quality"].as_f64().unwrap()
        )),
        "{table}"
    );
    let png = std::fs::read(report.join("curves.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");

    // Errors: an unknown metric (with the closest key), an unfinished run, a seed given twice.
    let wrong = vec![MetricSpec::parse("eval/distinctt").unwrap()];
    let e = read_run(&grpo, &wrong).unwrap_err();
    assert!(
        e.ends_with("no step logged the metric `eval/distinctt` (did you mean `eval/distinct`?)"),
        "{e}"
    );
    let missing = report.join("no-such-run");
    assert_eq!(
        read_run(&missing, &metrics).unwrap_err(),
        format!(
            "{}: not a run directory (no such directory)",
            missing.display()
        )
    );
    let e = read_run(&report, &metrics).unwrap_err();
    assert!(
        e.contains("no summary.json, so the run has not finished"),
        "{e}"
    );
    let twice = vec![runs[0].clone(), runs[0].clone()];
    assert_eq!(
        write_report(&twice, &metrics, "test", &report).unwrap_err(),
        "rlx compare: two runs of grpo have seed 7; give each seed once"
    );
    assert_eq!(
        MetricSpec::parse("=x").unwrap_err(),
        "--metric \"=x\": write NAME=KEY (e.g. quality=eval/quality) or KEY"
    );
    assert_eq!(spread(&[1.0, 2.0, 3.0]), (2.0, 1.0, 1.0, 3.0));
    assert_eq!(spread(&[4.0]), (4.0, 0.0, 4.0, 4.0));
    for dir in [grpo, darling, report] {
        let _ = std::fs::remove_dir_all(dir);
    }
}
