//! Reward programs (`kind = "program"`): the request lines a program receives, its values typed
//! against the recipe's inputs (per response, per criterion, per rubric criterion), one run per batch
//! for every signal that names the same command, the persistent mode, and every failure mode's message.
//! The programs are small Python scripts (`python3`, which every machine of this project has).

use std::collections::BTreeMap;
use std::path::PathBuf;

use rlx_signals::{
    Completion, Elem, Feature, Group, InputDecl, Level, Models, Prompt, Registry, SignalSpec,
};
use serde_json::json;

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rlx-program-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A Python program in a fresh directory; `{dir}` in its text is that directory.
fn script(name: &str, body: &str) -> (PathBuf, String) {
    let dir = tmp(name);
    let path = dir.join("program.py");
    std::fs::write(&path, body.replace("{dir}", &dir.display().to_string())).unwrap();
    (dir, path.display().to_string())
}

fn prompt(id: &str, text: &str, answer: &str, difficulty: &str) -> Prompt {
    let mut p = Prompt::user(id, text);
    p.answer = Some(answer.into());
    p.columns = json!({"id": id, "answer": answer, "difficulty": difficulty, "tests": [1, 2]})
        .as_object()
        .unwrap()
        .clone();
    p
}

fn c(text: &str) -> Completion {
    Completion {
        text: text.into(),
        tokens: text.split_whitespace().count(),
    }
}

fn program_spec(command: &[&str], extra: &str) -> String {
    format!(
        "kind = \"program\"\ncommand = [{}]\n{extra}",
        command
            .iter()
            .map(|c| format!("{c:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

fn registry(signals: &[(&str, String)], inputs: &[InputDecl]) -> Result<Registry, String> {
    let mut specs = BTreeMap::new();
    for (name, body) in signals {
        let spec: SignalSpec = toml::from_str(body).map_err(|e| e.to_string())?;
        specs.insert(name.to_string(), spec);
    }
    Registry::new(&specs, inputs).map_err(|e| e.to_string())
}

fn resp(name: &str, elem: Elem) -> InputDecl {
    InputDecl::new(name, elem, Level::Resp, Feature::None)
}

fn batch() -> (Vec<Prompt>, Vec<Vec<Completion>>) {
    (
        vec![
            prompt("p1", "What is 2+2?", "4", "easy"),
            prompt("p2", "What is 6*7?", "42", "hard"),
        ],
        vec![
            vec![c("<answer>4</answer>"), c("it is 5")],
            vec![c("<answer>42</answer> yes"), c("<answer>41</answer>")],
        ],
    )
}

fn compute(registry: &Registry) -> Result<rlx_signals::Computed, String> {
    let (prompts, completions) = batch();
    let groups: Vec<Group> = prompts
        .iter()
        .zip(&completions)
        .map(|(p, cs)| Group {
            prompt: p,
            completions: cs,
        })
        .collect();
    registry
        .compute(&groups, &Models::default())
        .map_err(|e| e.to_string())
}

/// A grader: `correct` (f32) from the `<answer>` tag against `answer`, `format` (bool), `hard` (the
/// row's `difficulty` column), `words` (i32), and a per-criterion list; every request is recorded in
/// `requests.jsonl` next to it.
const GRADER: &str = r#"
import json, re, sys
log = open("{dir}/requests.jsonl", "a")
for line in sys.stdin:
    r = json.loads(line)
    log.write(line); log.flush()
    tags = re.findall(r"<answer>(.*?)</answer>", r["completion"])
    print(json.dumps({
        "correct": 1.0 if tags and tags[-1] == r["answer"] else 0.0,
        "format": bool(tags),
        "hard": r["row"]["difficulty"] == "hard",
        "words": len(r["completion"].split()),
        "checks": [bool(tags), "yes" in r["completion"], r["sample"] == 0],
        "named": {"tagged": bool(tags), "short": len(r["completion"]) < 12},
    }), flush=True)
"#;

#[test]
fn a_program_fills_each_input_with_its_type_from_one_run_per_batch() {
    let (dir, path) = script("grader", GRADER);
    let spec = |key: &str| program_spec(&["python3", &path], &format!("key = {key:?}"));
    let inputs = vec![
        resp("correct", Elem::F32),
        resp("format", Elem::Bool),
        resp("hard", Elem::F32),
        resp("words", Elem::I32),
        InputDecl::new("checks", Elem::Bool, Level::Resp, Feature::Crit),
        InputDecl::new(
            "named",
            Elem::F32,
            Level::Resp,
            Feature::Rubric {
                name: "style".into(),
                criteria: vec!["short".into(), "tagged".into()],
            },
        ),
    ];
    let signals: Vec<(&str, String)> = ["correct", "format", "hard", "words", "checks", "named"]
        .iter()
        .map(|k| (*k, spec(k)))
        .collect();
    let registry = registry(&signals, &inputs).unwrap();
    let computed = compute(&registry).unwrap();
    let get = |name: &str| computed.get(name).unwrap().data.clone();
    assert_eq!(get("correct"), vec![1.0, 0.0, 1.0, 0.0]);
    assert_eq!(get("format"), vec![1.0, 0.0, 1.0, 1.0]);
    // The row's columns reach the program.
    assert_eq!(get("hard"), vec![0.0, 0.0, 1.0, 1.0]);
    assert_eq!(get("words"), vec![1.0, 3.0, 2.0, 1.0]);
    // Three criteria per response, flat response by response.
    assert_eq!(
        get("checks"),
        vec![1., 0., 1., 0., 0., 0., 1., 1., 1., 1., 0., 0.]
    );
    assert_eq!(computed.crit_counts, Some(vec![3, 3]));
    // The rubric's order (short, tagged), whatever the object's.
    assert_eq!(get("named"), vec![0., 1., 1., 0., 0., 1., 0., 1.]);
    // Six signals, one command: one run, four requests.
    let requests: Vec<serde_json::Value> = std::fs::read_to_string(dir.join("requests.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(requests.len(), 4);
    let r = &requests[2];
    assert_eq!(r["index"], 2);
    assert_eq!(r["group"], 1);
    assert_eq!(r["sample"], 0);
    assert_eq!(r["id"], "p2");
    assert_eq!(r["prompt"], "What is 6*7?");
    assert_eq!(
        r["messages"],
        json!([{"role": "user", "content": "What is 6*7?"}])
    );
    assert_eq!(r["completion"], "<answer>42</answer> yes");
    assert_eq!(r["answer"], "42");
    assert_eq!(r["row"]["tests"], json!([1, 2]));
    assert_eq!(r["tokens"], 2);
    let mut keys: Vec<String> = serde_json::from_value(r["keys"].clone()).unwrap();
    keys.sort();
    assert_eq!(
        keys,
        ["checks", "correct", "format", "hard", "named", "words"]
    );
}

#[test]
fn a_persistent_program_starts_once_and_answers_every_batch() {
    let (dir, path) = script(
        "persistent",
        r#"
import json, os, sys
open("{dir}/starts", "a").write(str(os.getpid()) + "\n")
n = 0
for line in sys.stdin:
    n += 1
    print(json.dumps({"score": n}), flush=True)
"#,
    );
    let registry = registry(
        &[(
            "score",
            program_spec(&["python3", &path], "persistent = true"),
        )],
        &[resp("score", Elem::F32)],
    )
    .unwrap();
    assert_eq!(
        compute(&registry).unwrap().get("score").unwrap().data,
        vec![1.0, 2.0, 3.0, 4.0]
    );
    // The same process: its count goes on.
    assert_eq!(
        compute(&registry).unwrap().get("score").unwrap().data,
        vec![5.0, 6.0, 7.0, 8.0]
    );
    let starts = std::fs::read_to_string(dir.join("starts")).unwrap();
    assert_eq!(starts.lines().count(), 1, "{starts}");
    // Without `persistent`, a process per batch.
    let registry = registry_for(&path, "");
    compute(&registry).unwrap();
    compute(&registry).unwrap();
    let starts = std::fs::read_to_string(dir.join("starts")).unwrap();
    assert_eq!(starts.lines().count(), 3, "{starts}");
}

fn registry_for(path: &str, extra: &str) -> Registry {
    registry(
        &[("score", program_spec(&["python3", path], extra))],
        &[resp("score", Elem::F32)],
    )
    .unwrap()
}

fn failure(name: &str, body: &str, extra: &str) -> String {
    let (_, path) = script(name, body);
    match compute(&registry_for(&path, extra)) {
        Ok(c) => panic!("{name}: expected an error, got {c:?}"),
        Err(e) => e,
    }
}

#[test]
fn every_failure_of_a_program_is_a_clear_error() {
    let answer = r#"
import json, sys
for line in sys.stdin:
    print(json.dumps({"score": 1.0}), flush=True)
"#;
    let cases: Vec<(&str, String, &str, Vec<&str>)> = vec![
        (
            "crash",
            "import sys\nsys.stdin.readline()\nsys.stderr.write('Traceback: grader exploded\\n')\nsys.exit(3)\n".into(),
            "",
            vec!["its output ended after 0 of 4 lines", "exit status: 3", "grader exploded"],
        ),
        (
            "crash-after-answering",
            format!("{answer}\nimport sys\nsys.stderr.write('late failure\\n')\nsys.exit(2)\n"),
            "",
            vec!["exited with exit status: 2 after printing its 4 lines", "late failure"],
        ),
        (
            "hang",
            "import time, sys\nsys.stdin.readline()\ntime.sleep(60)\n".into(),
            "timeout_s = 0.5",
            vec!["gave no answer within 0.5 s (timeout_s): 0 of 4 output lines read; it was stopped"],
        ),
        (
            "hang-persistent",
            "import time, sys\nsys.stdin.readline()\nprint('{\"score\": 1}', flush=True)\ntime.sleep(60)\n".into(),
            "timeout_s = 0.5\npersistent = true",
            vec!["gave no answer within 0.5 s (timeout_s): 1 of 4 output lines read"],
        ),
        (
            "garbage",
            "import sys\nfor line in sys.stdin:\n    print('score: high', flush=True)\n".into(),
            "",
            vec!["output line 1 is not JSON", "score: high"],
        ),
        (
            "not-an-object",
            "import sys\nfor line in sys.stdin:\n    print('[1, 2]', flush=True)\n".into(),
            "",
            vec!["output line 1 is not a JSON object: [1, 2]"],
        ),
        (
            "nan",
            "import json, sys\nfor line in sys.stdin:\n    print(json.dumps({'score': float('nan')}), flush=True)\n".into(),
            "",
            vec!["output line 1 holds a non-finite number (NaN or Infinity)", "{\"score\": NaN}"],
        ),
        (
            "missing-key",
            "import json, sys\nfor line in sys.stdin:\n    print(json.dumps({'reward': 1}), flush=True)\n".into(),
            "",
            vec!["output line 1 (prompt `p1`, sample 0): `score` is missing (the line's keys: `reward`)"],
        ),
        (
            "wrong-type",
            "import json, sys\nfor line in sys.stdin:\n    print(json.dumps({'score': 'high'}), flush=True)\n".into(),
            "",
            vec!["output line 1 (prompt `p1`, sample 0): `score` must be a number, got \"high\" (input `score` is f32[resp])"],
        ),
        (
            "too-many-lines",
            "import sys\nfor line in sys.stdin:\n    print('{\"score\": 1}')\n    print('{\"score\": 2}')\n".into(),
            "",
            vec!["printed more than 4 lines"],
        ),
    ];
    for (name, body, extra, wanted) in cases {
        let message = failure(name, &body, extra);
        assert!(
            message.starts_with("signal `score`: reward program `python3 "),
            "{name}: {message}"
        );
        for w in wanted {
            assert!(message.contains(w), "{name}: `{w}` not in: {message}");
        }
    }
    // A program that cannot start.
    let message = compute(&registry_for("/nonexistent/grader.py", "")).unwrap_err();
    assert!(
        message.contains("cannot start") || message.contains("No such file"),
        "{message}"
    );
    let registry = registry(
        &[("score", program_spec(&["/nonexistent/grader"], ""))],
        &[resp("score", Elem::F32)],
    )
    .unwrap();
    let message = compute(&registry).unwrap_err();
    assert!(
        message.contains("reward program `/nonexistent/grader`: cannot start it: No such file"),
        "{message}"
    );
}

#[test]
fn a_program_after_a_failure_starts_again() {
    // A persistent program that crashed is started afresh at the next batch.
    let (dir, path) = script(
        "restart",
        r#"
import json, os, sys
first = not os.path.exists("{dir}/started")
open("{dir}/started", "a").write("x")
for line in sys.stdin:
    if first:
        sys.exit(1)
    print(json.dumps({"score": 2.5}), flush=True)
"#,
    );
    let registry = registry_for(&path, "persistent = true");
    assert!(compute(&registry).is_err());
    assert_eq!(
        compute(&registry).unwrap().get("score").unwrap().data,
        vec![2.5; 4]
    );
    assert_eq!(std::fs::read_to_string(dir.join("started")).unwrap(), "xx");
}

#[test]
fn program_configs_are_checked_when_bound() {
    let bad = |body: String, input: InputDecl| registry(&[("score", body)], &[input]).unwrap_err();
    assert_eq!(
        bad(program_spec(&[], ""), resp("score", Elem::F32)),
        "signal `score`: program: `command` is empty: give the program and its arguments, e.g. [\"python3\", \"reward.py\"]"
    );
    assert_eq!(
        bad(
            program_spec(&["python3"], "timeout_s = 0"),
            resp("score", Elem::F32)
        ),
        "signal `score`: program: `timeout_s` must be in (0, 86400] seconds, got 0"
    );
    assert!(bad(
        program_spec(&["python3"], ""),
        InputDecl::new("score", Elem::F32, Level::Group, Feature::None)
    )
    .contains("a reward program gives per-response values, but input `score` is f32[group]"));
    assert!(bad(
        program_spec(&["python3"], "timeout = 3"),
        resp("score", Elem::F32)
    )
    .contains("unknown field `timeout`"));
}
