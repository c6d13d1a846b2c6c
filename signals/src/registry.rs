//! The registry: signals bound to the recipe inputs they fill, computed on a batch of completions
//! grouped by prompt, flattened in the runtime's element order (`rlx_runtime::rollouts`).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::answer::{self, parse_number};
use crate::data::Prompt;
use crate::judge::{self, format_conversation, render, Embed, YesNo};
use crate::partition::{cosine, partition};
use crate::program::Program;
use crate::spec::{Kind, SignalSpec, TextSource};
use crate::text::{measure, within};
use crate::types::{fits, AxisMap, Elem, Feature, InputDecl, Level, OutFeature, OutType};

/// A reward program and its output objects for a batch, one per response.
type ProgramOutput = (Arc<Program>, Vec<Map<String, Value>>);

/// A signal problem: which signal (if any) and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignalError {
    pub signal: Option<String>,
    pub message: String,
}

impl SignalError {
    fn at(signal: &str, message: impl Into<String>) -> SignalError {
        SignalError {
            signal: Some(signal.to_string()),
            message: message.into(),
        }
    }
}

impl fmt::Display for SignalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.signal {
            Some(s) => write!(f, "signal `{s}`: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for SignalError {}

/// One generated completion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The decoded text (without the prompt and the stop token).
    pub text: String,
    /// Generated tokens (for `length` with `unit = "tokens"`).
    pub tokens: usize,
}

/// A prompt and its completions (a group of the batch).
#[derive(Clone, Copy, Debug)]
pub struct Group<'a> {
    pub prompt: &'a Prompt,
    pub completions: &'a [Completion],
}

/// The models some signals need; `None` where the configured signals need none.
#[derive(Clone, Copy, Default)]
pub struct Models<'a> {
    pub judge: Option<&'a dyn YesNo>,
    pub embedder: Option<&'a dyn Embed>,
}

/// The values of one input, flat in the runtime's element order: `[resp]` one per packed response;
/// `[group]` one per group; `[resp, crit]` for each response its group's criteria; `[group, crit]`
/// for each group its criteria; `[resp, dim]` and `[resp, RUBRIC]` row-major. Booleans are 0/1.
#[derive(Clone, Debug, PartialEq)]
pub struct Filled {
    pub input: String,
    pub data: Vec<f64>,
}

impl Filled {
    /// The mean of the values (0 for none), e.g. for a per-signal metric.
    pub fn mean(&self) -> f64 {
        if self.data.is_empty() {
            0.0
        } else {
            self.data.iter().sum::<f64>() / self.data.len() as f64
        }
    }
}

/// The result of [`Registry::compute`].
#[derive(Clone, Debug, PartialEq)]
pub struct Computed {
    /// One entry per signal, in the registry's order (sorted by input name).
    pub values: Vec<Filled>,
    /// Criteria per group, when some signal fills a `crit` input (the batch's `crit_offsets` are the
    /// prefix sums of this); every `crit` signal agrees on it.
    pub crit_counts: Option<Vec<usize>>,
    /// Embedding dimensions, when some signal fills a `dim` input.
    pub dim: Option<usize>,
}

impl Computed {
    /// The values filling `input`.
    pub fn get(&self, input: &str) -> Option<&Filled> {
        self.values.iter().find(|f| f.input == input)
    }
}

#[derive(Clone, Debug)]
struct Bound {
    name: String,
    kind: Kind,
    out: OutType,
    input: InputDecl,
    axis: AxisMap,
}

/// Signals bound to recipe inputs. Build with [`Registry::new`], run with [`Registry::compute`].
#[derive(Clone, Debug)]
pub struct Registry {
    signals: Vec<Bound>,
}

/// Per-response values with an optional per-response criterion axis, before flattening.
enum Raw {
    /// One value per packed response.
    Resp(Vec<f64>),
    /// One row per packed response.
    RespRows(Vec<Vec<f64>>),
    /// One row per group.
    GroupRows(Vec<Vec<f64>>),
}

impl Registry {
    /// Binds each signal to the input of the same name and checks that its output fits that input
    /// (same level; `bool → i32 → f32` widening; matching feature axis; named criteria equal to a
    /// rubric's criteria). Every problem is an error naming the signal.
    pub fn new(
        specs: &BTreeMap<String, SignalSpec>,
        inputs: &[InputDecl],
    ) -> Result<Registry, SignalError> {
        let mut signals = Vec::with_capacity(specs.len());
        let mut programs: Vec<Arc<Program>> = Vec::new();
        for (name, spec) in specs {
            let Some(input) = inputs.iter().find(|i| &i.name == name) else {
                let known: Vec<String> = inputs.iter().map(|i| format!("`{}`", i.name)).collect();
                return Err(SignalError::at(
                    name,
                    format!(
                        "the recipe has no input `{name}` to fill (its inputs: {})",
                        if known.is_empty() {
                            "none".to_string()
                        } else {
                            known.join(", ")
                        }
                    ),
                ));
            };
            let (kind, out) = match spec {
                SignalSpec::Program {
                    command,
                    timeout_s,
                    persistent,
                    key,
                } => bind_program(
                    name,
                    command,
                    *timeout_s,
                    *persistent,
                    key.as_deref(),
                    input,
                    &mut programs,
                )
                .map_err(|m| SignalError::at(name, format!("program: {m}")))?,
                _ => spec
                    .compile()
                    .map_err(|m| SignalError::at(name, format!("{}: {m}", spec.kind_name())))?,
            };
            if let (crate::types::OutFeature::Named(names), Feature::Rubric { .. }) =
                (&out.feature, &input.feature)
            {
                let mut seen = std::collections::HashSet::new();
                if let Some(d) = names.iter().find(|n| !seen.insert(*n)) {
                    return Err(SignalError::at(
                        name,
                        format!(
                            "criterion name `{d}` appears twice; give each check a distinct `name`"
                        ),
                    ));
                }
            }
            let axis = fits(&out, input)
                .map_err(|m| SignalError::at(name, format!("{}: {m}", spec.kind_name())))?;
            signals.push(Bound {
                name: name.clone(),
                kind,
                out,
                input: input.clone(),
                axis,
            });
        }
        Ok(Registry { signals })
    }

    /// Parses `[signals.*]` tables from TOML (see [`crate::spec::parse_toml`]) and binds them.
    pub fn from_toml(src: &str, inputs: &[InputDecl]) -> Result<Registry, SignalError> {
        let specs = crate::spec::parse_toml(src).map_err(|message| SignalError {
            signal: None,
            message: format!("signal config: {message}"),
        })?;
        Registry::new(&specs, inputs)
    }

    /// The inputs the registry fills, in its order.
    pub fn inputs(&self) -> impl Iterator<Item = &str> {
        self.signals.iter().map(|s| s.name.as_str())
    }

    /// The output type of the signal filling `input`.
    pub fn output_type(&self, input: &str) -> Option<&OutType> {
        self.signals
            .iter()
            .find(|s| s.name == input)
            .map(|s| &s.out)
    }

    /// Whether the signal filling `input` is a partition (class ids, not scores).
    pub fn is_partition(&self, input: &str) -> bool {
        self.signals
            .iter()
            .any(|s| s.name == input && matches!(s.kind, Kind::Partition { .. }))
    }

    /// Whether some signal needs a [`YesNo`] judge.
    pub fn needs_judge(&self) -> bool {
        self.signals
            .iter()
            .any(|s| matches!(s.kind, Kind::Judge { .. }))
    }

    /// Whether some signal needs an [`Embed`] model.
    pub fn needs_embedder(&self) -> bool {
        self.signals.iter().any(|s| {
            matches!(
                s.kind,
                Kind::Partition { .. } | Kind::Embedding { .. } | Kind::Similarity { .. }
            )
        })
    }

    /// Computes every signal on `groups` (responses in packed order: groups in order, the
    /// completions of each group in order).
    pub fn compute(&self, groups: &[Group], models: &Models) -> Result<Computed, SignalError> {
        let mut values = Vec::with_capacity(self.signals.len());
        let mut crit: Option<(String, Vec<usize>)> = None;
        let mut dim: Option<(String, usize)> = None;
        let outputs = self.run_programs(groups)?;
        for s in &self.signals {
            let raw = self
                .compute_one(s, groups, models, &outputs)
                .map_err(|m| SignalError::at(&s.name, m))?;
            // Criterion counts per group, as laid out in the input.
            let counts: Option<Vec<usize>> = match (&raw, &s.input.feature) {
                (Raw::RespRows(rows), Feature::Crit) => {
                    // Every response of a group has the group's criteria.
                    let mut counts = Vec::with_capacity(groups.len());
                    let mut r = 0;
                    for g in groups {
                        counts.push(rows.get(r).map_or(0, Vec::len));
                        r += g.completions.len();
                    }
                    debug_assert_eq!(r, rows.len());
                    Some(counts)
                }
                (Raw::GroupRows(rows), Feature::Crit) => Some(rows.iter().map(Vec::len).collect()),
                _ => None,
            };
            if let Some(counts) = counts {
                match &crit {
                    None => crit = Some((s.name.clone(), counts)),
                    Some((other, prev)) => {
                        if let Some(g) = (0..groups.len()).find(|&g| prev[g] != counts[g]) {
                            return Err(SignalError::at(
                                &s.name,
                                format!(
                                    "has {} criteria for prompt `{}` but signal `{other}` has {}; every `crit` input of a batch shares one criterion list per prompt",
                                    counts[g], groups[g].prompt.id, prev[g]
                                ),
                            ));
                        }
                    }
                }
            }
            if let (Raw::RespRows(rows), Feature::Dim) = (&raw, &s.input.feature) {
                let d = rows.first().map_or(0, Vec::len);
                if let Some((other, prev)) = &dim {
                    if *prev != d {
                        return Err(SignalError::at(
                            &s.name,
                            format!("has {d} dimensions but signal `{other}` has {prev}; a batch has one `dim`"),
                        ));
                    }
                } else if !rows.is_empty() {
                    dim = Some((s.name.clone(), d));
                }
            }
            let data = match raw {
                Raw::Resp(v) => v,
                Raw::RespRows(rows) | Raw::GroupRows(rows) => match &s.axis {
                    AxisMap::Identity => rows.concat(),
                    AxisMap::Reorder(order) => rows
                        .iter()
                        .flat_map(|row| order.iter().map(move |&k| row[k]))
                        .collect(),
                },
            };
            values.push(Filled {
                input: s.name.clone(),
                data,
            });
        }
        Ok(Computed {
            values,
            crit_counts: crit.map(|(_, c)| c),
            dim: dim.map(|(_, d)| d),
        })
    }

    /// Runs each reward program once on the batch, asking for the keys of every signal it fills.
    fn run_programs(&self, groups: &[Group]) -> Result<Vec<ProgramOutput>, SignalError> {
        let mut outputs: Vec<ProgramOutput> = Vec::new();
        for s in &self.signals {
            let Kind::Program { program, .. } = &s.kind else {
                continue;
            };
            if outputs.iter().any(|(p, _)| Arc::ptr_eq(p, program)) {
                continue;
            }
            let keys: Vec<&str> = self
                .signals
                .iter()
                .filter_map(|t| match &t.kind {
                    Kind::Program { program: p, key } if Arc::ptr_eq(p, program) => {
                        Some(key.as_str())
                    }
                    _ => None,
                })
                .collect();
            let requests = program_requests(groups, &keys);
            let lines = program
                .run(&requests)
                .map_err(|m| SignalError::at(&s.name, m))?;
            outputs.push((program.clone(), lines));
        }
        Ok(outputs)
    }

    fn compute_one(
        &self,
        s: &Bound,
        groups: &[Group],
        models: &Models,
        outputs: &[ProgramOutput],
    ) -> Result<Raw, String> {
        let per_resp =
            |f: &dyn Fn(&Prompt, &Completion) -> Result<f64, String>| per_response(groups, f);
        let b = |x: bool| if x { 1.0 } else { 0.0 };
        Ok(match &s.kind {
            Kind::Exact {
                extract,
                pattern,
                case_sensitive,
                math_equivalence,
            } => Raw::Resp(per_resp(&|p, c| {
                let reference = reference(p)?;
                Ok(b(answer::exact_match(
                    &c.text,
                    reference,
                    *extract,
                    pattern.as_ref(),
                    *case_sensitive,
                    *math_equivalence,
                )))
            })?),
            Kind::Numeric {
                extract,
                pattern,
                abs_tol,
                rel_tol,
            } => Raw::Resp(per_resp(&|p, c| {
                let r = reference(p)?;
                let x = parse_number(r).ok_or_else(|| {
                    format!("prompt `{}`: reference answer `{r}` is not a number", p.id)
                })?;
                Ok(b(answer::numeric_match(
                    &c.text,
                    x,
                    *extract,
                    pattern.as_ref(),
                    *abs_tol,
                    *rel_tol,
                )))
            })?),
            Kind::Regex { re, count } => Raw::Resp(per_resp(&|_, c| {
                Ok(if *count {
                    re.find_iter(&c.text).count() as f64
                } else {
                    b(re.is_match(&c.text))
                })
            })?),
            Kind::Contains(check) => Raw::Resp(per_resp(&|_, c| Ok(b(check.check(&c.text))))?),
            Kind::Length { unit, bounds } => Raw::Resp(per_resp(&|_, c| {
                let v = measure(&c.text, c.tokens, *unit);
                Ok(match bounds {
                    Some((lo, hi)) => b(within(v, *lo, *hi)),
                    None => v as f64,
                })
            })?),
            Kind::Ifeval {
                checks,
                each,
                loose,
            } => {
                let mut rows = Vec::new();
                for g in groups {
                    let list: Vec<&crate::ifeval::Instruction> = match checks {
                        Some(cs) => cs.iter().map(|(_, i)| i).collect(),
                        None => {
                            if g.prompt.instructions.is_empty() && !*each {
                                return Err(format!(
                                    "prompt `{}` has no IFEval instruction to check{}",
                                    g.prompt.id,
                                    if g.prompt.unsupported.is_empty() {
                                        String::new()
                                    } else {
                                        format!(
                                            " (unsupported: {})",
                                            g.prompt.unsupported.join(", ")
                                        )
                                    }
                                ));
                            }
                            g.prompt.instructions.iter().map(|i| &i.check).collect()
                        }
                    };
                    for c in g.completions {
                        rows.push(
                            list.iter()
                                .map(|i| {
                                    b(if *loose {
                                        i.follows_loose(&c.text)
                                    } else {
                                        i.follows_strict(&c.text)
                                    })
                                })
                                .collect::<Vec<f64>>(),
                        );
                    }
                }
                if *each {
                    Raw::RespRows(rows)
                } else {
                    Raw::Resp(
                        rows.iter()
                            .map(|r| b(r.iter().all(|&x| x == 1.0)))
                            .collect(),
                    )
                }
            }
            Kind::Partition { threshold, text } => {
                let embs = embed_all(groups, *text, models)?;
                let mut out = Vec::with_capacity(embs.len());
                let mut r = 0;
                for g in groups {
                    let n = g.completions.len();
                    let ids = partition(&embs[r..r + n], *threshold)
                        .map_err(|e| format!("prompt `{}`: {e}", g.prompt.id))?;
                    out.extend(ids.into_iter().map(f64::from));
                    r += n;
                }
                Raw::Resp(out)
            }
            Kind::Similarity { threshold, text } => {
                // Per response, its pairs with the other responses of its group, in order: the
                // packed order of a pair input.
                let embs = embed_all(groups, *text, models)?;
                let mut rows = Vec::with_capacity(embs.len());
                let mut r = 0;
                for g in groups {
                    let n = g.completions.len();
                    for i in r..r + n {
                        let mut row = Vec::with_capacity(n.saturating_sub(1));
                        for j in (r..r + n).filter(|&j| j != i) {
                            let cos = cosine(&embs[i], &embs[j]).map_err(|e| {
                                format!(
                                    "prompt `{}`, responses {} and {}: {e}",
                                    g.prompt.id,
                                    i - r,
                                    j - r
                                )
                            })?;
                            row.push(match threshold {
                                Some(t) => b(cos >= *t),
                                None => cos,
                            });
                        }
                        rows.push(row);
                    }
                    r += n;
                }
                Raw::RespRows(rows)
            }
            Kind::Embedding { text } => {
                let embs = embed_all(groups, *text, models)?;
                Raw::RespRows(
                    embs.into_iter()
                        .map(|e| e.into_iter().map(f64::from).collect())
                        .collect(),
                )
            }
            Kind::Judge {
                criteria,
                template,
                verdict,
            } => {
                let judge = models
                    .judge
                    .ok_or("needs a judge model (a `YesNo` implementation), but none was given")?;
                let mut prompts = Vec::new();
                let mut shape = Vec::new();
                for g in groups {
                    let conversation = format_conversation(&g.prompt.messages);
                    let texts: Vec<&str> = match criteria {
                        Some(cs) => cs.iter().map(|(_, t)| t.as_str()).collect(),
                        None => g.prompt.rubric.iter().map(|c| c.text.as_str()).collect(),
                    };
                    for c in g.completions {
                        for t in &texts {
                            prompts.push(render(template, &conversation, &c.text, t));
                        }
                        shape.push(texts.len());
                    }
                }
                let ps = judge::ask(judge, &prompts)?;
                let mut rows = Vec::with_capacity(shape.len());
                let mut k = 0;
                for n in shape {
                    rows.push(
                        ps[k..k + n]
                            .iter()
                            .map(|&p| match verdict {
                                Some(t) => b(p >= *t),
                                None => p,
                            })
                            .collect(),
                    );
                    k += n;
                }
                Raw::RespRows(rows)
            }
            Kind::WrongScript => Raw::Resp(per_resp(&|p, c| {
                Ok(b(crate::text::wrong_script(p.last_user_text(), &c.text)))
            })?),
            Kind::Program { program, key } => {
                let lines = outputs
                    .iter()
                    .find(|(p, _)| Arc::ptr_eq(p, program))
                    .map(|(_, lines)| lines)
                    .ok_or("the reward program did not run")?;
                program_values(program, key, &s.input, groups, lines)?
            }
            Kind::Points => Raw::GroupRows(
                groups
                    .iter()
                    .map(|g| g.prompt.rubric.iter().map(|c| c.points).collect())
                    .collect(),
            ),
        })
    }
}

fn per_response(
    groups: &[Group],
    f: &dyn Fn(&Prompt, &Completion) -> Result<f64, String>,
) -> Result<Vec<f64>, String> {
    let mut out = Vec::new();
    for g in groups {
        for c in g.completions {
            out.push(f(g.prompt, c)?);
        }
    }
    Ok(out)
}

fn reference(p: &Prompt) -> Result<&str, String> {
    p.answer
        .as_deref()
        .ok_or_else(|| format!("prompt `{}` has no reference answer", p.id))
}

fn embed_all(groups: &[Group], text: TextSource, models: &Models) -> Result<Vec<Vec<f32>>, String> {
    let embedder = models
        .embedder
        .ok_or("needs an embedding model (an `Embed` implementation), but none was given")?;
    let texts: Vec<String> = groups
        .iter()
        .flat_map(|g| g.completions.iter())
        .map(|c| match text {
            TextSource::Completion => c.text.clone(),
            TextSource::Answer => answer::extract(&c.text, answer::Extract::Auto, false)
                .unwrap_or("")
                .to_string(),
        })
        .collect();
    if texts.is_empty() {
        return Ok(Vec::new());
    }
    let embs = embedder
        .embed(&texts)
        .map_err(|e| format!("embedding model failed: {e}"))?;
    if embs.len() != texts.len() {
        return Err(format!(
            "embedding model returned {} vectors for {} texts",
            embs.len(),
            texts.len()
        ));
    }
    let d = embs[0].len();
    for (i, e) in embs.iter().enumerate() {
        if e.len() != d || d == 0 {
            return Err(format!(
                "embedding model returned a vector of {} dimensions for response {i}, {d} for response 0",
                e.len()
            ));
        }
        if let Some(x) = e.iter().find(|x| !x.is_finite()) {
            return Err(format!(
                "embedding model returned a non-finite value {x} for response {i}"
            ));
        }
    }
    Ok(embs)
}

/// Validates a `program` signal and binds it to `input`: the program's values take the input's type
/// (per response: a value, or one per criterion of `crit`, of a named rubric or of `dim`). Signals with
/// the same command, timeout and mode share one program (one run per batch).
fn bind_program(
    name: &str,
    command: &[String],
    timeout_s: f64,
    persistent: bool,
    key: Option<&str>,
    input: &InputDecl,
    programs: &mut Vec<Arc<Program>>,
) -> Result<(Kind, OutType), String> {
    if command.first().is_none_or(|c| c.trim().is_empty()) {
        return Err("`command` is empty: give the program and its arguments, e.g. [\"python3\", \"reward.py\"]".into());
    }
    if !(timeout_s.is_finite() && timeout_s > 0.0 && timeout_s <= crate::spec::MAX_TIMEOUT_S) {
        return Err(format!(
            "`timeout_s` must be in (0, {}] seconds, got {timeout_s}",
            crate::spec::MAX_TIMEOUT_S
        ));
    }
    let key = key.unwrap_or(name);
    if key.is_empty() {
        return Err("`key` is empty".into());
    }
    if input.level != Level::Resp {
        return Err(format!(
            "a reward program gives per-response values, but input `{}` is {input}; declare it at the `resp` level (a group's value is then the recipe's reduction)",
            input.name
        ));
    }
    let feature = match &input.feature {
        Feature::None => OutFeature::None,
        Feature::Crit => OutFeature::PromptCrit,
        Feature::Dim => OutFeature::Dim,
        Feature::Rubric { criteria, .. } => OutFeature::Named(criteria.clone()),
    };
    let timeout = Duration::from_secs_f64(timeout_s);
    let program = match programs
        .iter()
        .find(|p| p.command == command && p.timeout == timeout && p.persistent == persistent)
    {
        Some(p) => p.clone(),
        None => {
            let p = Arc::new(Program::new(command.to_vec(), timeout, persistent));
            programs.push(p.clone());
            p
        }
    };
    Ok((
        Kind::Program {
            program,
            key: key.to_string(),
        },
        OutType {
            elem: input.elem,
            level: Level::Resp,
            feature,
        },
    ))
}

/// One JSON request per response, in packed order (docs/signals.md, `program`).
fn program_requests(groups: &[Group], keys: &[&str]) -> Vec<Value> {
    let mut out = Vec::new();
    for (g, group) in groups.iter().enumerate() {
        let p = group.prompt;
        let messages: Vec<Value> = p
            .messages
            .iter()
            .map(|m| json!({"role": m.role, "content": m.content}))
            .collect();
        for (i, c) in group.completions.iter().enumerate() {
            out.push(json!({
                "index": out.len(),
                "group": g,
                "sample": i,
                "id": p.id,
                "prompt": p.last_user_text(),
                "messages": messages,
                "completion": c.text,
                "tokens": c.tokens,
                "answer": p.answer,
                "row": p.columns,
                "keys": keys,
            }));
        }
    }
    out
}

/// One value of a program's output, checked against the input's element type.
fn program_scalar(v: &Value, elem: Elem) -> Result<f64, String> {
    let b = |x: bool| if x { 1.0 } else { 0.0 };
    match (v, elem) {
        (Value::Bool(x), _) => Ok(b(*x)),
        (Value::Number(n), Elem::I32) => match n.as_i64() {
            Some(i) if i32::try_from(i).is_ok() => Ok(i as f64),
            _ => Err(format!("must be an integer (i32), got {n}")),
        },
        (Value::Number(n), Elem::F32) => match n.as_f64() {
            Some(x) if x.is_finite() && x.abs() <= f32::MAX as f64 => Ok(x),
            _ => Err(format!("must be a finite f32 number, got {n}")),
        },
        (other, Elem::Bool) => Err(format!("must be true or false, got {other}")),
        (Value::Null, _) => Err("is null; a reward must be a number".into()),
        (other, _) => Err(format!("must be a number, got {other}")),
    }
}

/// The values of `key` in a program's output lines, laid out as `input` needs them.
fn program_values(
    program: &Program,
    key: &str,
    input: &InputDecl,
    groups: &[Group],
    lines: &[Map<String, Value>],
) -> Result<Raw, String> {
    let label = program.label();
    let mut scalars = Vec::new();
    let mut rows: Vec<Vec<f64>> = Vec::new();
    let mut r = 0;
    for group in groups {
        let mut group_width: Option<usize> = None;
        for i in 0..group.completions.len() {
            let at = || {
                format!(
                    "reward program `{label}`: output line {} (prompt `{}`, sample {i}): `{key}`",
                    r + 1,
                    group.prompt.id
                )
            };
            let line = &lines[r];
            let Some(v) = line.get(key) else {
                let keys: Vec<String> = line.keys().map(|k| format!("`{k}`")).collect();
                return Err(format!(
                    "{} is missing (the line's keys: {})",
                    at(),
                    if keys.is_empty() {
                        "none".into()
                    } else {
                        keys.join(", ")
                    }
                ));
            };
            let typed = |v: &Value| {
                program_scalar(v, input.elem)
                    .map_err(|m| format!("{} {m} (input `{}` is {input})", at(), input.name))
            };
            match &input.feature {
                Feature::None => scalars.push(typed(v)?),
                Feature::Crit | Feature::Dim => {
                    let Value::Array(items) = v else {
                        return Err(format!(
                            "{} must be a list of values, one per criterion (input `{}` is {input})",
                            at(),
                            input.name
                        ));
                    };
                    let row: Vec<f64> = items.iter().map(typed).collect::<Result<_, _>>()?;
                    let width = match input.feature {
                        Feature::Dim => rows.first().map(Vec::len),
                        _ => group_width,
                    };
                    if let Some(w) = width {
                        if w != row.len() {
                            return Err(format!(
                                "{} has {} values but an earlier response {} {w} (every response of a {} has the same number)",
                                at(),
                                row.len(),
                                if input.feature == Feature::Dim { "of the batch has" } else { "of the prompt has" },
                                if input.feature == Feature::Dim { "batch" } else { "prompt" },
                            ));
                        }
                    }
                    if input.feature == Feature::Dim && row.is_empty() {
                        return Err(format!(
                            "{} is an empty list (input `{}` is {input})",
                            at(),
                            input.name
                        ));
                    }
                    group_width = Some(row.len());
                    rows.push(row);
                }
                Feature::Rubric { name, criteria } => {
                    let row: Vec<f64> = match v {
                        Value::Object(map) => {
                            if let Some(extra) = map.keys().find(|k| !criteria.contains(k)) {
                                return Err(format!(
                                    "{} names `{extra}`, which is not a criterion of rubric `{name}` ({})",
                                    at(),
                                    criteria.join(", ")
                                ));
                            }
                            criteria
                                .iter()
                                .map(|c| match map.get(c) {
                                    Some(x) => typed(x),
                                    None => Err(format!("{} has no value for criterion `{c}` of rubric `{name}`", at())),
                                })
                                .collect::<Result<_, _>>()?
                        }
                        Value::Array(items) if items.len() == criteria.len() => {
                            items.iter().map(typed).collect::<Result<_, _>>()?
                        }
                        _ => {
                            return Err(format!(
                                "{} must be an object {{criterion: value}} or a list of {} values in rubric `{name}`'s order ({})",
                                at(),
                                criteria.len(),
                                criteria.join(", ")
                            ))
                        }
                    };
                    rows.push(row);
                }
            }
            r += 1;
        }
    }
    Ok(match input.feature {
        Feature::None => Raw::Resp(scalars),
        _ => Raw::RespRows(rows),
    })
}
