//! A researcher's own task end to end (docs/training.md, "Your own task"): the shipped chat-format
//! prompts file with extra columns (examples/own-task/prompts.jsonl, held-out rows by its `split`
//! column) and Python reward programs filling GDPO's two rewards, on a tiny random policy with
//! SmolLM2's tokenizer and chat template (a Hugging Face folder written here). The run's samples.jsonl
//! holds every completion with the program's values, the held-out `eval/…` metrics appear, the
//! TensorBoard events parse back, a Parquet twin of the file (written by pyarrow) gives the identical
//! run, and a reward program that fails stops the run with a checkpoint from which `--resume` finishes
//! it exactly as a run that never failed.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use candle_core::Device;
use serde_json::{Map, Value};

use rlx_trainer::cli::{prepare, RunArgs};
use rlx_trainer::hf::{self, TokenIds};
use rlx_trainer::model::{Model, ModelConfig};
use rlx_trainer::train::{Summary, TIMING_KEYS};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rlx-own-task-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A tiny random Llama with SmolLM2's tokenizer and chat template, as a Hugging Face folder.
fn tiny_folder() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let gguf =
            rlx_trainer::gguf::Gguf::open(&rlx_trainer::assets::smollm2_gguf().unwrap()).unwrap();
        let tokenizer = gguf.tokenizer().unwrap();
        let config = ModelConfig {
            vocab: tokenizer.vocab_size(),
            hidden: 32,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            intermediate: 64,
            rope_theta: 10000.0,
            rms_eps: 1e-5,
            max_positions: 256,
            init_std: 0.05,
            head_dim: None,
            attention_bias: false,
            qk_norm: false,
            rope_scaling: None,
        };
        let model = Model::new(&config, 3, &Device::Cpu).unwrap();
        let dir = tmp("tiny-hf");
        let _ = std::fs::remove_dir_all(&dir);
        hf::save(&model, &TokenIds::default(), &dir, Some(&tokenizer)).unwrap();
        dir
    })
}

/// A test reward program: `correct` from the completion's length in characters (so that the values can be checked
/// against each sample line) and `format` from the row's `difficulty` column (so that the row reaches
/// it); it crashes at its `crash_at`-th request batch while the file `{dir}/broken` exists.
fn test_program(dir: &Path) -> PathBuf {
    let path = dir.join("grader.py");
    let body = r#"
import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
for line in sys.stdin:
    r = json.loads(line)
    if r["index"] == 0:
        calls = os.path.join(here, "calls")
        count = int(open(calls).read()) + 1 if os.path.exists(calls) else 1
        open(calls, "w").write(str(count))
        if os.path.exists(os.path.join(here, "broken")) and count == 4:
            sys.stderr.write("grader: the judge service is down\n")
            sys.exit(7)
    print(json.dumps({
        "correct": float(len(r["completion"]) % 2),
        "format": 1.0 if r["row"]["difficulty"] == "easy" else 0.0,
    }), flush=True)
"#;
    std::fs::write(&path, body).unwrap();
    path
}

/// The config of the runs: only what it changes (every other key takes its default).
fn config(data: &Path, program: &Path, persistent: bool) -> String {
    format!(
        r#"
steps = 4

[model]
kind = "hf"
path = {model:?}

[task]
kind = "prompts"
path = {data:?}
eval_split = "test"

[sampler]
n = 4
max_new_tokens = 12

[train]
prompts_per_step = 2
lr = 1e-3
eval_every = 2
eval_samples = 3
samples_every = 1
checkpoint_every = 0

[signals.accuracy_reward]
kind = "program"
command = ["python3", {program:?}]
key = "correct"
persistent = {persistent}

[signals.format_reward]
kind = "program"
command = ["python3", {program:?}]
key = "format"
persistent = {persistent}
"#,
        model = tiny_folder().display().to_string(),
        data = data.display().to_string(),
        program = program.display().to_string(),
    )
}

fn run(config: Option<&str>, out: &Path, resume: bool) -> Result<Summary, String> {
    let checked = rlx_compiler::check_path(&root().join("recipes/gdpo.rlx")).unwrap();
    let recipe = checked.recipe.unwrap();
    let args = RunArgs {
        recipe_name: "gdpo".into(),
        config_text: config.map(str::to_string),
        out: Some(out.to_path_buf()),
        resume: resume.then(|| out.to_path_buf()),
        ..Default::default()
    };
    let prepared = prepare(&recipe, &args)?;
    prepared.run(|_| {})
}

fn lines(path: &Path) -> Vec<Map<String, Value>> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| match serde_json::from_str(l).unwrap() {
            Value::Object(m) => m,
            other => panic!("{other}"),
        })
        .collect()
}

/// metrics.jsonl without the timing keys (which no two runs share).
fn metrics(out: &Path) -> Vec<Map<String, Value>> {
    let mut all = lines(&out.join("metrics.jsonl"));
    for line in &mut all {
        for key in TIMING_KEYS {
            line.remove(key);
        }
    }
    all
}

fn difficulty_of_prompt() -> std::collections::HashMap<String, String> {
    lines(&root().join("examples/own-task/prompts.jsonl"))
        .into_iter()
        .map(|row| {
            let text = row["messages"][0]["content"].as_str().unwrap().to_string();
            (text, row["difficulty"].as_str().unwrap().to_string())
        })
        .collect()
}

#[cfg_attr(
    not(rlx_assets),
    ignore = "needs the pinned assets: run scripts/fetch-assets.sh"
)]
#[test]
fn a_chat_dataset_with_a_reward_program_trains_evaluates_and_logs() {
    let work = tmp("main");
    let program = test_program(&work);
    let data = root().join("examples/own-task/prompts.jsonl");
    let out = work.join("run");
    let summary = run(Some(&config(&data, &program, false)), &out, false).unwrap();
    assert_eq!(summary.steps_done, 4);

    // samples.jsonl: every response of every step, with the program's values for its completion.
    let samples = lines(&out.join("samples.jsonl"));
    assert_eq!(samples.len(), 4 * 2 * 4);
    let difficulty = difficulty_of_prompt();
    for s in &samples {
        let completion = s["completion"].as_str().unwrap();
        let signals = s["signals"].as_object().unwrap();
        assert_eq!(
            signals["accuracy_reward"].as_f64().unwrap(),
            (completion.chars().count() % 2) as f64,
            "{s:?}"
        );
        // The sample's prompt is the whole chat prompt, the user's question inside it.
        let prompt = s["prompt"].as_str().unwrap();
        let (_, level) = difficulty
            .iter()
            .find(|(question, _)| prompt.contains(question.as_str()))
            .unwrap_or_else(|| panic!("no row for {prompt}"));
        let easy = level == "easy";
        assert_eq!(
            signals["format_reward"].as_f64().unwrap(),
            if easy { 1.0 } else { 0.0 },
            "{s:?}"
        );
        assert!(
            s["reward"].is_number() && s["advantage"].is_number(),
            "{s:?}"
        );
    }
    // Only training rows are sampled: the `split = "test"` rows are held out.
    let test_prompts: Vec<String> = lines(&data)
        .into_iter()
        .filter(|r| r["split"] == "test")
        .map(|r| r["messages"][0]["content"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(test_prompts.len(), 8);
    assert!(samples.iter().all(|s| {
        let prompt = s["prompt"].as_str().unwrap();
        !test_prompts.iter().any(|q| prompt.contains(q.as_str()))
    }));
    let easy_held_out = lines(&data)
        .into_iter()
        .filter(|r| r["split"] == "test" && r["difficulty"] == "easy")
        .count();

    // The held-out evaluation at steps 2 and 4 (eval_every = 2), greedy and pass@3.
    let m = metrics(&out);
    assert_eq!(m.len(), 4);
    for (k, line) in m.iter().enumerate() {
        let evaluated = k == 1 || k == 3;
        for key in [
            "eval/greedy/accuracy_reward",
            "eval/greedy/format_reward",
            "eval/pass@3/accuracy_reward",
            "eval/mean@3/accuracy_reward",
            "eval/pass@3/format_reward",
        ] {
            assert_eq!(line.contains_key(key), evaluated, "step {k}: {key}");
        }
        if evaluated {
            // The format reward is the row's: the fraction of easy held-out prompts.
            assert_eq!(
                line["eval/greedy/format_reward"],
                easy_held_out as f64 / 8.0
            );
            let best = line["eval/pass@3/accuracy_reward"].as_f64().unwrap();
            let mean = line["eval/mean@3/accuracy_reward"].as_f64().unwrap();
            assert!(best >= mean && (0.0..=1.0).contains(&best), "{line:?}");
        }
        assert!(line.contains_key("signal/accuracy_reward/mean"));
        assert!(line.contains_key("recipe/format_mean"));
    }
    // The PNG: one panel per metric.
    assert!(out.join("metrics.png").is_file());
    let summary_json: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert!(summary_json.is_object());

    // TensorBoard: every numeric metric of every step.
    let events = std::fs::read_dir(out.join(rlx_trainer::tensorboard::DIR))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .contains("tfevents")
        })
        .expect("an event file");
    let scalars = rlx_trainer::tensorboard::read_scalars(&events).unwrap();
    for (k, line) in m.iter().enumerate() {
        for (key, value) in line {
            if key == "step" {
                continue;
            }
            if let Some(v) = value.as_f64() {
                let found = scalars
                    .iter()
                    .find(|(step, tag, _)| *step == k as i64 && tag == key)
                    .unwrap_or_else(|| panic!("no event for {key} at step {k}"));
                assert!(
                    (found.2 as f64 - v).abs() <= 1e-6 * v.abs().max(1.0),
                    "{key}"
                );
            }
        }
    }
}

#[cfg_attr(
    not(rlx_assets),
    ignore = "needs the pinned assets: run scripts/fetch-assets.sh"
)]
#[test]
fn a_failing_reward_program_stops_with_a_checkpoint_that_resumes_exactly() {
    let work = tmp("failure");
    let program = test_program(&work);
    let data = root().join("examples/own-task/prompts.jsonl");
    let text = config(&data, &program, false);
    // The uninterrupted run.
    let whole = work.join("whole");
    run(Some(&text), &whole, false).unwrap();
    std::fs::remove_file(work.join("calls")).unwrap();
    // The program's 4th batch is step 1's (the evaluation before the first step asks for two: greedy
    // and pass@k; step 0 one): it crashes there.
    std::fs::write(work.join("broken"), "").unwrap();
    let out = work.join("broken-run");
    let message = run(Some(&text), &out, false).unwrap_err();
    for wanted in [
        "step 1: signal `accuracy_reward`: reward program `python3 ",
        "exit status: 7",
        "grader: the judge service is down",
        "the run stopped before the step's update; the state before step 1 is saved in",
        "fix the cause, then continue with `--resume",
    ] {
        assert!(message.contains(wanted), "`{wanted}` not in: {message}");
    }
    let state: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("checkpoint/state.json")).unwrap())
            .unwrap();
    assert_eq!(state["step"], 1);
    // Fixed, resumed: the same run as the one that never failed.
    std::fs::remove_file(work.join("broken")).unwrap();
    run(None, &out, true).unwrap();
    assert_eq!(metrics(&out), metrics(&whole));
    assert_eq!(
        std::fs::read_to_string(out.join("samples.jsonl")).unwrap(),
        std::fs::read_to_string(whole.join("samples.jsonl")).unwrap()
    );
}

#[cfg_attr(
    not(all(rlx_assets, rlx_torch)),
    ignore = "needs the pinned assets and pyarrow: run scripts/fetch-assets.sh and scripts/install-torch.sh"
)]
#[test]
fn a_parquet_file_and_its_jsonl_twin_give_identical_runs() {
    let work = tmp("parquet");
    let jsonl = root().join("examples/own-task/prompts.jsonl");
    let parquet = work.join("prompts.parquet");
    // pyarrow writes the twin (as `datasets` and pandas do: snappy-compressed row groups).
    let python = rlx_tools::python();
    let status = std::process::Command::new(python)
        .args([
            "-c",
            "import json, sys, pyarrow as pa, pyarrow.parquet as pq\n\
             rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]\n\
             pq.write_table(pa.Table.from_pylist(rows), sys.argv[2], row_group_size=16)\n",
        ])
        .arg(&jsonl)
        .arg(&parquet)
        .status()
        .unwrap();
    assert!(status.success());
    // The shipped grader, as one persistent process.
    let program = root().join("examples/own-task/reward.py");
    let a = work.join("jsonl");
    let b = work.join("parquet-run");
    run(Some(&config(&jsonl, &program, true)), &a, false).unwrap();
    run(Some(&config(&parquet, &program, true)), &b, false).unwrap();
    assert_eq!(metrics(&a), metrics(&b));
    assert_eq!(
        std::fs::read_to_string(a.join("samples.jsonl")).unwrap(),
        std::fs::read_to_string(b.join("samples.jsonl")).unwrap()
    );
    // The rows as read: the same prompts, answers and columns.
    let from_jsonl = rlx_signals::dataset::load_prompts(&jsonl, "answer").unwrap();
    let from_parquet = rlx_signals::dataset::load_prompts(&parquet, "answer").unwrap();
    assert_eq!(from_jsonl.len(), from_parquet.len());
    for (x, y) in from_jsonl.iter().zip(&from_parquet) {
        assert_eq!(x.id, y.id);
        assert_eq!(x.messages, y.messages);
        assert_eq!(x.answer, y.answer);
        assert_eq!(x.columns, y.columns);
    }
}
