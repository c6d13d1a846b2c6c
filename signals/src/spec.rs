//! Signal specifications as written in a config: `[signals.NAME]` tables with a `kind` and the
//! kind's keys. Unknown kinds and keys are errors. [`SignalSpec::compile`] validates the values and
//! yields the executable form with its output type.

use std::collections::{BTreeMap, HashSet};

use regex::Regex;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::answer::Extract;
use crate::ifeval::{IfevalError, Instruction};
use crate::judge::{validate_template, DEFAULT_TEMPLATE};
use crate::text::{compile_regex, Contains, Mode, Unit};
use crate::types::{Elem, Level, OutFeature, OutType};

/// What a `regex` signal reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RegexOutput {
    /// bool: the pattern matches somewhere.
    #[default]
    Match,
    /// i32: the number of non-overlapping matches.
    Count,
}

/// How `ifeval` reports several instructions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Combine {
    /// bool[resp]: every instruction is followed (IFEval's prompt-level verdict).
    #[default]
    All,
    /// bool[resp, crit]: one verdict per instruction (IFEval's instruction-level verdicts).
    Each,
}

/// What `judge` reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JudgeOutput {
    /// f32: P(yes).
    #[default]
    Probability,
    /// bool: P(yes) ≥ `threshold`.
    Verdict,
}

/// Which text of a completion `partition` and `embedding` embed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TextSource {
    /// The whole completion.
    #[default]
    Completion,
    /// The final answer (`extract = "auto"` of `exact_answer`).
    Answer,
}

/// One IFEval instruction in a config: its IFEval `id`, an optional `name` (to fill a rubric axis),
/// and IFEval's kwargs as further keys.
#[derive(Clone, Debug, Deserialize)]
pub struct CheckSpec {
    pub id: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(flatten)]
    pub kwargs: Map<String, Value>,
}

/// One fixed judge criterion: a `name` and the `text` put to the judge.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JudgeCriterion {
    pub name: String,
    pub text: String,
}

fn default_abs_tol() -> f64 {
    1e-6
}

/// A signal as configured. See docs/signals.md for every kind.
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum SignalSpec {
    ExactAnswer {
        #[serde(default)]
        extract: Extract,
        /// The regex of `extract = "regex"`.
        #[serde(default)]
        pattern: Option<String>,
        #[serde(default)]
        case_sensitive: bool,
        /// Numbers equal as numbers also match (`1/2` = `0.5`, `1,000` = `1000`).
        #[serde(default)]
        math_equivalence: bool,
    },
    NumericAnswer {
        #[serde(default)]
        extract: Extract,
        #[serde(default)]
        pattern: Option<String>,
        #[serde(default = "default_abs_tol")]
        abs_tol: f64,
        #[serde(default)]
        rel_tol: f64,
    },
    Regex {
        pattern: String,
        #[serde(default)]
        output: RegexOutput,
        #[serde(default)]
        case_insensitive: bool,
    },
    Contains {
        keywords: Vec<String>,
        #[serde(default)]
        mode: Mode,
        #[serde(default)]
        case_sensitive: bool,
        #[serde(default)]
        whole_word: bool,
    },
    Length {
        unit: Unit,
        #[serde(default)]
        min: Option<u64>,
        #[serde(default)]
        max: Option<u64>,
    },
    Ifeval {
        #[serde(default)]
        checks: Option<Vec<CheckSpec>>,
        #[serde(default)]
        output: Combine,
        #[serde(default)]
        loose: bool,
    },
    Partition {
        threshold: f64,
        #[serde(default)]
        text: TextSource,
    },
    Embedding {
        #[serde(default)]
        text: TextSource,
    },
    Similarity {
        #[serde(default)]
        threshold: Option<f64>,
        #[serde(default)]
        text: TextSource,
    },
    Judge {
        #[serde(default)]
        criteria: Option<Vec<JudgeCriterion>>,
        #[serde(default)]
        template: Option<String>,
        #[serde(default)]
        output: JudgeOutput,
        #[serde(default)]
        threshold: Option<f64>,
    },
    Points {},
    WrongScript {},
    /// A reward program (`program.rs`): `command` (the executable and its arguments) run once per
    /// batch, or one process for the run with `persistent`; its output objects' `key` (default: the
    /// signal's name) fills the input.
    Program {
        command: Vec<String>,
        #[serde(default = "default_timeout")]
        timeout_s: f64,
        #[serde(default)]
        persistent: bool,
        #[serde(default)]
        key: Option<String>,
    },
}

fn default_timeout() -> f64 {
    60.0
}

/// The longest `timeout_s` of a reward program (a day).
pub const MAX_TIMEOUT_S: f64 = 86_400.0;

/// The executable form of a signal.
#[derive(Clone, Debug)]
pub(crate) enum Kind {
    Exact {
        extract: Extract,
        pattern: Option<Regex>,
        case_sensitive: bool,
        math_equivalence: bool,
    },
    Numeric {
        extract: Extract,
        pattern: Option<Regex>,
        abs_tol: f64,
        rel_tol: f64,
    },
    Regex {
        re: Regex,
        count: bool,
    },
    Contains(Contains),
    Length {
        unit: Unit,
        bounds: Option<(Option<u64>, Option<u64>)>,
    },
    Ifeval {
        /// Fixed checks (name, instruction); `None`: the prompt's own instructions.
        checks: Option<Vec<(String, Instruction)>>,
        each: bool,
        loose: bool,
    },
    Partition {
        threshold: f64,
        text: TextSource,
    },
    Embedding {
        text: TextSource,
    },
    /// Per ordered pair of a group's responses, the cosine similarity of their embeddings (`None`) or
    /// whether it reaches the threshold (`Some(t)`).
    Similarity {
        threshold: Option<f64>,
        text: TextSource,
    },
    Judge {
        /// Fixed criteria (name, text); `None`: the prompt's rubric.
        criteria: Option<Vec<(String, String)>>,
        template: String,
        /// `Some(t)`: verdicts P(yes) ≥ t; `None`: probabilities.
        verdict: Option<f64>,
    },
    Points,
    WrongScript,
    /// A reward program and the key of its output objects that fills the input.
    Program {
        program: std::sync::Arc<crate::program::Program>,
        key: String,
    },
}

/// The documented names of the kinds, for messages.
pub const KINDS: [&str; 13] = [
    "exact_answer",
    "numeric_answer",
    "regex",
    "contains",
    "length",
    "ifeval",
    "partition",
    "embedding",
    "similarity",
    "judge",
    "points",
    "wrong_script",
    "program",
];

fn resp(elem: Elem) -> OutType {
    OutType {
        elem,
        level: Level::Resp,
        feature: OutFeature::None,
    }
}

fn unique(names: &[String], what: &str) -> Result<(), String> {
    let mut seen = HashSet::new();
    for n in names {
        if n.is_empty() {
            return Err(format!("{what}: a name is empty"));
        }
        if !seen.insert(n) {
            return Err(format!("{what}: name `{n}` appears twice"));
        }
    }
    Ok(())
}

impl SignalSpec {
    /// The kind's name as written in a config.
    pub fn kind_name(&self) -> &'static str {
        match self {
            SignalSpec::ExactAnswer { .. } => "exact_answer",
            SignalSpec::NumericAnswer { .. } => "numeric_answer",
            SignalSpec::Regex { .. } => "regex",
            SignalSpec::Contains { .. } => "contains",
            SignalSpec::Length { .. } => "length",
            SignalSpec::Ifeval { .. } => "ifeval",
            SignalSpec::Partition { .. } => "partition",
            SignalSpec::Similarity { .. } => "similarity",
            SignalSpec::Embedding { .. } => "embedding",
            SignalSpec::Judge { .. } => "judge",
            SignalSpec::Points {} => "points",
            SignalSpec::WrongScript {} => "wrong_script",
            SignalSpec::Program { .. } => "program",
        }
    }

    /// Validates the values and returns the executable form and the output type.
    pub(crate) fn compile(&self) -> Result<(Kind, OutType), String> {
        Ok(match self {
            SignalSpec::ExactAnswer {
                extract,
                pattern,
                case_sensitive,
                math_equivalence,
            } => (
                Kind::Exact {
                    extract: *extract,
                    pattern: extract_pattern(*extract, pattern)?,
                    case_sensitive: *case_sensitive,
                    math_equivalence: *math_equivalence,
                },
                resp(Elem::Bool),
            ),
            SignalSpec::NumericAnswer {
                extract,
                pattern,
                abs_tol,
                rel_tol,
            } => {
                let pattern = extract_pattern(*extract, pattern)?;
                for (k, v) in [("abs_tol", abs_tol), ("rel_tol", rel_tol)] {
                    if !(v.is_finite() && *v >= 0.0) {
                        return Err(format!("`{k}` must be finite and ≥ 0, got {v}"));
                    }
                }
                (
                    Kind::Numeric {
                        extract: *extract,
                        pattern,
                        abs_tol: *abs_tol,
                        rel_tol: *rel_tol,
                    },
                    resp(Elem::Bool),
                )
            }
            SignalSpec::Regex {
                pattern,
                output,
                case_insensitive,
            } => {
                if pattern.is_empty() {
                    return Err("`pattern` is empty".into());
                }
                let re = compile_regex(pattern, *case_insensitive)?;
                let count = *output == RegexOutput::Count;
                (
                    Kind::Regex { re, count },
                    resp(if count { Elem::I32 } else { Elem::Bool }),
                )
            }
            SignalSpec::Contains {
                keywords,
                mode,
                case_sensitive,
                whole_word,
            } => (
                Kind::Contains(Contains::new(
                    keywords,
                    *mode,
                    *case_sensitive,
                    *whole_word,
                )?),
                resp(Elem::Bool),
            ),
            SignalSpec::Length { unit, min, max } => {
                if let (Some(lo), Some(hi)) = (min, max) {
                    if lo > hi {
                        return Err(format!("`min` ({lo}) is greater than `max` ({hi})"));
                    }
                }
                let bounds = (min.is_some() || max.is_some()).then_some((*min, *max));
                (
                    Kind::Length {
                        unit: *unit,
                        bounds,
                    },
                    resp(if bounds.is_some() {
                        Elem::Bool
                    } else {
                        Elem::I32
                    }),
                )
            }
            SignalSpec::Ifeval {
                checks,
                output,
                loose,
            } => {
                let each = *output == Combine::Each;
                let (checks, feature) = match checks {
                    None => (None, OutFeature::PromptCrit),
                    Some(list) => {
                        if list.is_empty() {
                            return Err("`checks` is empty (leave it out to check the prompt's own IFEval instructions)".into());
                        }
                        let mut built = Vec::with_capacity(list.len());
                        for (i, c) in list.iter().enumerate() {
                            let ins = Instruction::from_id(&c.id, &c.kwargs).map_err(|e| {
                                let e = match e {
                                    IfevalError::Unsupported(_) => format!(
                                        "{e}; supported ids: {}",
                                        crate::ifeval::SUPPORTED.join(", ")
                                    ),
                                    IfevalError::Invalid(m) => m,
                                };
                                format!("check {} (`{}`): {e}", i + 1, c.id)
                            })?;
                            built.push((c.name.clone().unwrap_or_else(|| c.id.clone()), ins));
                        }
                        let names: Vec<String> = built.iter().map(|(n, _)| n.clone()).collect();
                        (Some(built), OutFeature::Named(names))
                    }
                };
                let out = OutType {
                    elem: Elem::Bool,
                    level: Level::Resp,
                    feature: if each { feature } else { OutFeature::None },
                };
                (
                    Kind::Ifeval {
                        checks,
                        each,
                        loose: *loose,
                    },
                    out,
                )
            }
            SignalSpec::Partition { threshold, text } => {
                if !(threshold.is_finite() && (-1.0..=1.0).contains(threshold)) {
                    return Err(format!(
                        "`threshold` is a cosine similarity in [-1, 1], got {threshold}"
                    ));
                }
                (
                    Kind::Partition {
                        threshold: *threshold,
                        text: *text,
                    },
                    resp(Elem::I32),
                )
            }
            SignalSpec::Similarity { threshold, text } => {
                if let Some(t) = threshold {
                    if !(t.is_finite() && (-1.0..=1.0).contains(t)) {
                        return Err(format!(
                            "`threshold` is a cosine similarity in [-1, 1], got {t}"
                        ));
                    }
                }
                (
                    Kind::Similarity {
                        threshold: *threshold,
                        text: *text,
                    },
                    OutType {
                        elem: if threshold.is_some() {
                            Elem::Bool
                        } else {
                            Elem::F32
                        },
                        level: Level::Pair,
                        feature: OutFeature::None,
                    },
                )
            }
            SignalSpec::Embedding { text } => (
                Kind::Embedding { text: *text },
                OutType {
                    elem: Elem::F32,
                    level: Level::Resp,
                    feature: OutFeature::Dim,
                },
            ),
            SignalSpec::Judge {
                criteria,
                template,
                output,
                threshold,
            } => {
                let template = template.clone().unwrap_or_else(|| DEFAULT_TEMPLATE.into());
                validate_template(&template)?;
                let verdict = match (output, threshold) {
                    (JudgeOutput::Probability, Some(_)) => {
                        return Err("`threshold` applies only to `output = \"verdict\"`".to_string())
                    }
                    (JudgeOutput::Probability, None) => None,
                    (JudgeOutput::Verdict, t) => {
                        let t = t.unwrap_or(0.5);
                        if !(t.is_finite() && t > 0.0 && t <= 1.0) {
                            return Err(format!("`threshold` must be in (0, 1], got {t}"));
                        }
                        Some(t)
                    }
                };
                let (criteria, feature) = match criteria {
                    None => (None, OutFeature::PromptCrit),
                    Some(list) => {
                        if list.is_empty() {
                            return Err(
                                "`criteria` is empty (leave it out to judge the prompt's rubric)"
                                    .into(),
                            );
                        }
                        let names: Vec<String> = list.iter().map(|c| c.name.clone()).collect();
                        unique(&names, "`criteria`")?;
                        if let Some(c) = list.iter().find(|c| c.text.trim().is_empty()) {
                            return Err(format!("criterion `{}` has an empty `text`", c.name));
                        }
                        (
                            Some(
                                list.iter()
                                    .map(|c| (c.name.clone(), c.text.clone()))
                                    .collect(),
                            ),
                            OutFeature::Named(names),
                        )
                    }
                };
                let elem = if verdict.is_some() {
                    Elem::Bool
                } else {
                    Elem::F32
                };
                (
                    Kind::Judge {
                        criteria,
                        template,
                        verdict,
                    },
                    OutType {
                        elem,
                        level: Level::Resp,
                        feature,
                    },
                )
            }
            SignalSpec::WrongScript {} => (Kind::WrongScript, resp(Elem::Bool)),
            SignalSpec::Program { .. } => {
                return Err("a reward program takes its type from the input it fills (bound by `Registry::new`)".into())
            }
            SignalSpec::Points {} => (
                Kind::Points,
                OutType {
                    elem: Elem::F32,
                    level: Level::Group,
                    feature: OutFeature::PromptCrit,
                },
            ),
        })
    }
}

/// The compiled `pattern` of `extract = "regex"` (required there, and only there).
fn extract_pattern(extract: Extract, pattern: &Option<String>) -> Result<Option<Regex>, String> {
    match (extract, pattern) {
        (Extract::Regex, None) => Err(
            "`extract = \"regex\"` needs a `pattern` (its first capture group is the answer)"
                .into(),
        ),
        (Extract::Regex, Some(p)) if p.is_empty() => Err("`pattern` is empty".into()),
        (Extract::Regex, Some(p)) => compile_regex(p, false).map(Some),
        (_, Some(_)) => Err("`pattern` applies only to `extract = \"regex\"`".into()),
        (_, None) => Ok(None),
    }
}

/// A `judge` left without `criteria` whose input is indexed by a recipe rubric with criterion texts
/// (from a rubric file, docs/sharing.md) asks about those texts. `rubric_texts` maps an input's name
/// to its rubric's `(criterion, text)` list; a rubric with an empty text is left alone (the judge then
/// needs `criteria`, as before).
pub fn judge_rubric_texts(
    specs: &mut BTreeMap<String, SignalSpec>,
    rubric_texts: &BTreeMap<String, Vec<(String, String)>>,
) {
    for (name, spec) in specs.iter_mut() {
        let SignalSpec::Judge { criteria, .. } = spec else {
            continue;
        };
        let Some(list) = rubric_texts.get(name) else {
            continue;
        };
        if criteria.is_none() && !list.is_empty() && list.iter().all(|(_, t)| !t.trim().is_empty())
        {
            *criteria = Some(
                list.iter()
                    .map(|(name, text)| JudgeCriterion {
                        name: name.clone(),
                        text: text.clone(),
                    })
                    .collect(),
            );
        }
    }
}

/// Parses signal specs from TOML: a document whose only table is `[signals]` (as in
/// `[signals.correct] kind = "exact_answer"`). Errors carry TOML's location and serde's message.
pub fn parse_toml(src: &str) -> Result<BTreeMap<String, SignalSpec>, String> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Doc {
        #[serde(default)]
        signals: BTreeMap<String, SignalSpec>,
    }
    let doc: Doc = toml::from_str(src).map_err(|e| e.to_string())?;
    Ok(doc.signals)
}
