//! Prompts files (`rlx_signals::dataset`): JSONL rows with `prompt` text, chat `messages`, verl's and
//! TRL's conversational `prompt` lists, a `system` column, the answer at a dotted key, extra columns
//! kept; every malformed row is an error naming its line. (Parquet files are read in
//! trainer/tests/own_task.rs, against their JSONL twin written by pyarrow.)

use std::path::PathBuf;

use rlx_signals::dataset::{load_prompts, lookup, Format};
use serde_json::json;

fn file(name: &str, lines: &[&str]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rlx-dataset-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

#[test]
fn rows_become_prompts_with_their_columns() {
    let path = file(
        "rows.jsonl",
        &[
            r#"{"prompt": "What is 2+2?", "answer": 4, "difficulty": "easy"}"#,
            "",
            r#"{"id": "chat-1", "system": "Be brief.", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Name a colour."}], "answer": "red", "tests": [1, 2]}"#,
            r#"{"prompt": [{"role": "system", "content": "verl style"}, {"role": "user", "content": "3*3?"}], "reward_model": {"ground_truth": "9", "style": "rule"}, "data_source": "gsm8k"}"#,
        ],
    );
    let prompts = load_prompts(&path, "answer").unwrap();
    assert_eq!(prompts.len(), 3);
    let p = &prompts[0];
    assert_eq!(p.id, "row 1");
    assert_eq!(p.last_user_text(), "What is 2+2?");
    assert_eq!(p.messages.len(), 1);
    assert_eq!(p.answer.as_deref(), Some("4"));
    assert_eq!(p.columns["difficulty"], "easy");
    let p = &prompts[1];
    assert_eq!(p.id, "chat-1");
    let roles: Vec<&str> = p.messages.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "user"]);
    assert_eq!(p.messages[0].content, "Be brief.");
    assert_eq!(p.last_user_text(), "Name a colour.");
    assert_eq!(p.answer.as_deref(), Some("red"));
    assert_eq!(p.columns["tests"], json!([1, 2]));
    // verl's row: the answer at a dotted key.
    let p = &prompts[2];
    assert_eq!(p.id, "row 4");
    assert_eq!(p.answer, None);
    assert_eq!(p.messages[0].role, "system");
    let verl = load_prompts(&path, "reward_model.ground_truth").unwrap();
    assert_eq!(verl[2].answer.as_deref(), Some("9"));
    assert_eq!(verl[0].answer, None);
    assert_eq!(
        lookup(&verl[2].columns, "reward_model.style"),
        Some(&json!("rule"))
    );
    assert_eq!(lookup(&verl[2].columns, "reward_model.none"), None);
}

#[test]
fn malformed_rows_name_their_line() {
    let cases = [
        (
            r#"{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}"#,
            "line 1: has both `prompt` and `messages`",
        ),
        (
            r#"{"question": "a", "answer": 1}"#,
            "line 1: has no `prompt` (text, or a list of messages) and no `messages` column (its columns: `answer`, `question`)",
        ),
        (
            r#"{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}"#,
            "line 1: the conversation ends with a `assistant` message; an RL prompt ends with the user's turn",
        ),
        (
            r#"{"system": "s", "messages": [{"role": "system", "content": "t"}, {"role": "user", "content": "q"}]}"#,
            "line 1: has a `system` column and a system message in its conversation; keep one",
        ),
        (
            r#"{"prompt": "q", "answer": [1]}"#,
            "line 1: the answer `answer` must be a string or a number, got an array",
        ),
        (
            r#"{"messages": [{"role": "user"}]}"#,
            "line 1: `messages` message 1: no `content`",
        ),
        (r#"{"messages": []}"#, "line 1: `messages` has no messages"),
        (r#"{"prompt": 3}"#, "line 1: `prompt` must be a string or a list of messages, got a number"),
        (r#"{"prompt": "  "}"#, "line 1: empty prompt"),
        (r#"["prompt"]"#, "line 1: a row must be a JSON object with `prompt` or `messages`, got an array"),
        (r#"{"prompt": "#, "line 1: not JSON"),
    ];
    for (i, (row, wanted)) in cases.iter().enumerate() {
        let path = file(&format!("bad{i}.jsonl"), &[row]);
        let message = load_prompts(&path, "answer").unwrap_err().to_string();
        assert!(message.contains(wanted), "{row}: {message}");
        assert!(
            message.starts_with(&path.display().to_string()),
            "{message}"
        );
    }
    let path = file(
        "dup.jsonl",
        &[
            r#"{"id": "a", "prompt": "x"}"#,
            r#"{"id": "a", "prompt": "y"}"#,
        ],
    );
    assert!(load_prompts(&path, "answer")
        .unwrap_err()
        .to_string()
        .ends_with("line 2: id `a` repeats row 1"));
    let path = file("empty.jsonl", &["", " "]);
    assert!(load_prompts(&path, "answer")
        .unwrap_err()
        .to_string()
        .ends_with("no prompts"));
    let path = file("rows.csv", &["prompt\nx"]);
    assert!(load_prompts(&path, "answer")
        .unwrap_err()
        .to_string()
        .contains("unknown prompts file format: name it .jsonl"));
    assert_eq!(
        Format::of(std::path::Path::new("x.parquet")).unwrap(),
        Format::Parquet
    );
    // A file that is not Parquet.
    let path = file("fake.parquet", &["not parquet"]);
    assert!(load_prompts(&path, "answer")
        .unwrap_err()
        .to_string()
        .contains("not a Parquet file"));
}
