//! Prompt files of a researcher's own task (`task.kind = "prompts"`): JSONL or Parquet (the format of
//! published RL datasets), one row per prompt, with the prompt as text (`prompt`) or as a chat
//! conversation (`messages`, or verl's and TRL's conversational `prompt` list), an optional `system`
//! message, a reference answer at a configurable key, and any other columns, kept as they are for the
//! signals and reward programs. docs/training.md, "Your own task", is the user's description.

use std::path::Path;

use serde_json::{Map, Value};

use crate::data::{DataError, Message, Prompt};

/// The most bytes of one JSONL row (untrusted input: a row is a prompt and its data, not a corpus).
pub const MAX_ROW_BYTES: usize = 64 << 20;

/// The file format of a prompts file, from its extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `.jsonl`, `.json` (one JSON object per line).
    Jsonl,
    /// `.parquet`.
    Parquet,
}

impl Format {
    /// The format of `path`'s extension; an error names the extensions accepted.
    pub fn of(path: &Path) -> Result<Format, DataError> {
        match path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            Some("jsonl" | "json" | "ndjson") => Ok(Format::Jsonl),
            Some("parquet" | "pq") => Ok(Format::Parquet),
            _ => Err(DataError {
                path: path.to_path_buf(),
                line: None,
                message: "unknown prompts file format: name it .jsonl (one JSON object per line) or .parquet".into(),
            }),
        }
    }
}

/// One row of a prompts file: its 1-based line (JSONL) or row number (Parquet) and its columns.
pub type Row = (usize, Map<String, Value>);

/// Every row of `path`, in file order (JSONL: blank lines skipped; Parquet: every row group).
pub fn read_rows(path: &Path) -> Result<Vec<Row>, DataError> {
    match Format::of(path)? {
        Format::Jsonl => read_jsonl(path),
        Format::Parquet => read_parquet(path),
    }
}

fn read_jsonl(path: &Path) -> Result<Vec<Row>, DataError> {
    use std::io::{BufRead, Read};
    let err = |line: Option<usize>, message: String| DataError {
        path: path.to_path_buf(),
        line,
        message,
    };
    let file = std::fs::File::open(path).map_err(|e| err(None, format!("cannot read: {e}")))?;
    let mut reader = std::io::BufReader::new(file);
    let mut rows = Vec::new();
    let mut buf = Vec::new();
    let mut line = 0;
    loop {
        buf.clear();
        line += 1;
        let read = (&mut reader)
            .take(MAX_ROW_BYTES as u64 + 1)
            .read_until(b'\n', &mut buf)
            .map_err(|e| err(Some(line), format!("cannot read: {e}")))?;
        if read == 0 {
            break;
        }
        if buf.len() > MAX_ROW_BYTES {
            return Err(err(
                Some(line),
                format!("a row longer than {} MiB", MAX_ROW_BYTES >> 20),
            ));
        }
        let text =
            std::str::from_utf8(&buf).map_err(|e| err(Some(line), format!("not UTF-8: {e}")))?;
        if text.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(map)) => rows.push((line, map)),
            Ok(other) => {
                return Err(err(
                    Some(line),
                    format!(
                        "a row must be a JSON object with `prompt` or `messages`, got {}",
                        kind_of(&other)
                    ),
                ))
            }
            Err(e) => return Err(err(Some(line), format!("not JSON: {e}"))),
        }
    }
    Ok(rows)
}

fn read_parquet(path: &Path) -> Result<Vec<Row>, DataError> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let err = |line: Option<usize>, message: String| DataError {
        path: path.to_path_buf(),
        line,
        message,
    };
    let file = std::fs::File::open(path).map_err(|e| err(None, format!("cannot read: {e}")))?;
    let reader = SerializedFileReader::new(file)
        .map_err(|e| err(None, format!("not a Parquet file: {e}")))?;
    let iter = reader
        .get_row_iter(None)
        .map_err(|e| err(None, format!("cannot read the rows: {e}")))?;
    let mut rows = Vec::new();
    for (i, row) in iter.enumerate() {
        let row = row.map_err(|e| err(Some(i + 1), format!("cannot read row: {e}")))?;
        match row.to_json_value() {
            Value::Object(map) => rows.push((i + 1, map)),
            other => {
                return Err(err(
                    Some(i + 1),
                    format!("row is not a record: {}", kind_of(&other)),
                ))
            }
        }
    }
    Ok(rows)
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The value at a dotted `key` of `row` (`reward_model.ground_truth` is verl's answer column).
pub fn lookup<'a>(row: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    let mut parts = key.split('.');
    let mut here = row.get(parts.next()?)?;
    for part in parts {
        here = here.as_object()?.get(part)?;
    }
    Some(here)
}

fn messages(value: &Value, column: &str) -> Result<Vec<Message>, String> {
    let Value::Array(items) = value else {
        return Err(format!(
            "`{column}` must be a list of {{\"role\": …, \"content\": …}} messages, got {}",
            kind_of(value)
        ));
    };
    if items.is_empty() {
        return Err(format!("`{column}` has no messages"));
    }
    items
        .iter()
        .enumerate()
        .map(|(k, m)| {
            let field = |name: &str| match m.get(name) {
                Some(Value::String(s)) => Ok(s.clone()),
                Some(other) => Err(format!(
                    "`{column}` message {}: `{name}` must be a string, got {}",
                    k + 1,
                    kind_of(other)
                )),
                None => Err(format!(
                    "`{column}` message {}: no `{name}` (a message is {{\"role\": …, \"content\": …}})",
                    k + 1
                )),
            };
            Ok(Message {
                role: field("role")?,
                content: field("content")?,
            })
        })
        .collect()
}

/// A row of a prompts file as a [`Prompt`]: `prompt` (text, or a list of messages) or `messages` (a
/// list of messages), exactly one of them; `system` (text) prepended as the system message; the
/// reference answer at `answer_key` (a string or a number; absent or null: none); `id` (a string or a
/// number; else `row N`). Every column is kept in [`Prompt::columns`]. The conversation must end with
/// a user turn (the completion answers it).
pub fn prompt_from_row(
    number: usize,
    row: Map<String, Value>,
    answer_key: &str,
) -> Result<Prompt, String> {
    let mut conversation = match (row.get("prompt"), row.get("messages")) {
        (Some(_), Some(_)) => {
            return Err(
                "has both `prompt` and `messages`; give the prompt in one of them".to_string(),
            )
        }
        (None, None) => {
            return Err(format!(
                "has no `prompt` (text, or a list of messages) and no `messages` column (its columns: {})",
                row.keys().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")
            ))
        }
        (Some(Value::String(text)), None) => vec![Message {
            role: "user".into(),
            content: text.clone(),
        }],
        (Some(list @ Value::Array(_)), None) => messages(list, "prompt")?,
        (Some(other), None) => {
            return Err(format!(
                "`prompt` must be a string or a list of messages, got {}",
                kind_of(other)
            ))
        }
        (None, Some(list)) => messages(list, "messages")?,
    };
    match row.get("system") {
        None | Some(Value::Null) => {}
        Some(Value::String(system)) => {
            if conversation.iter().any(|m| m.role == "system") {
                return Err(
                    "has a `system` column and a system message in its conversation; keep one"
                        .into(),
                );
            }
            conversation.insert(
                0,
                Message {
                    role: "system".into(),
                    content: system.clone(),
                },
            );
        }
        Some(other) => return Err(format!("`system` must be a string, got {}", kind_of(other))),
    }
    let last = conversation.last().expect("a conversation has a message");
    if last.role != "user" {
        return Err(format!(
            "the conversation ends with a `{}` message; an RL prompt ends with the user's turn (the completion answers it): drop the later turns, or keep a reference answer in `{answer_key}`",
            last.role
        ));
    }
    if conversation.iter().all(|m| m.content.trim().is_empty()) {
        return Err("empty prompt".into());
    }
    let answer = match lookup(&row, answer_key) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        Some(other) => {
            return Err(format!(
                "the answer `{answer_key}` must be a string or a number, got {}",
                kind_of(other)
            ))
        }
    };
    let id = match row.get("id") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => format!("row {number}"),
    };
    Ok(Prompt {
        id,
        messages: conversation,
        answer,
        columns: row,
        ..Prompt::default()
    })
}

/// Every row of a prompts file as a [`Prompt`] ([`read_rows`], [`prompt_from_row`]); an error names
/// the line or row. Ids must be unique.
pub fn load_prompts(path: &Path, answer_key: &str) -> Result<Vec<Prompt>, DataError> {
    let rows = read_rows(path)?;
    if rows.is_empty() {
        return Err(DataError {
            path: path.to_path_buf(),
            line: None,
            message: "no prompts".into(),
        });
    }
    let mut seen = std::collections::HashMap::new();
    let mut out = Vec::with_capacity(rows.len());
    for (number, row) in rows {
        let prompt = prompt_from_row(number, row, answer_key).map_err(|message| DataError {
            path: path.to_path_buf(),
            line: Some(number),
            message,
        })?;
        if let Some(first) = seen.insert(prompt.id.clone(), number) {
            return Err(DataError {
                path: path.to_path_buf(),
                line: Some(number),
                message: format!("id `{}` repeats row {first}", prompt.id),
            });
        }
        out.push(prompt);
    }
    Ok(out)
}
