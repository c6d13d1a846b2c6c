//! The registry: signals bound to the recipe inputs they fill, computed on a batch of completions
//! grouped by prompt, flattened in the runtime's element order (`rlx_runtime::rollouts`).

use std::collections::BTreeMap;
use std::fmt;

use crate::answer::{self, parse_number};
use crate::data::Prompt;
use crate::judge::{self, format_conversation, render, Embed, YesNo};
use crate::partition::partition;
use crate::spec::{Kind, SignalSpec, TextSource};
use crate::text::{measure, within};
use crate::types::{fits, AxisMap, Feature, InputDecl, OutType};

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
            let (kind, out) = spec
                .compile()
                .map_err(|m| SignalError::at(name, format!("{}: {m}", spec.kind_name())))?;
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

    /// Whether some signal needs a [`YesNo`] judge.
    pub fn needs_judge(&self) -> bool {
        self.signals
            .iter()
            .any(|s| matches!(s.kind, Kind::Judge { .. }))
    }

    /// Whether some signal needs an [`Embed`] model.
    pub fn needs_embedder(&self) -> bool {
        self.signals
            .iter()
            .any(|s| matches!(s.kind, Kind::Partition { .. } | Kind::Embedding { .. }))
    }

    /// Computes every signal on `groups` (responses in packed order: groups in order, the
    /// completions of each group in order).
    pub fn compute(&self, groups: &[Group], models: &Models) -> Result<Computed, SignalError> {
        let mut values = Vec::with_capacity(self.signals.len());
        let mut crit: Option<(String, Vec<usize>)> = None;
        let mut dim: Option<(String, usize)> = None;
        for s in &self.signals {
            let raw = self
                .compute_one(s, groups, models)
                .map_err(|m| SignalError::at(&s.name, m))?;
            // Criterion counts per group, as laid out in the input.
            let counts: Option<Vec<usize>> = match (&raw, &s.input.feature) {
                (Raw::RespRows(rows), Feature::Crit) => {
                    let mut counts = Vec::with_capacity(groups.len());
                    let mut r = 0;
                    for g in groups {
                        counts.push(per_group_crit(s, g));
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

    fn compute_one(&self, s: &Bound, groups: &[Group], models: &Models) -> Result<Raw, String> {
        let per_resp =
            |f: &dyn Fn(&Prompt, &Completion) -> Result<f64, String>| per_response(groups, f);
        let b = |x: bool| if x { 1.0 } else { 0.0 };
        Ok(match &s.kind {
            Kind::Exact {
                extract,
                case_sensitive,
            } => Raw::Resp(per_resp(&|p, c| {
                let reference = reference(p)?;
                Ok(b(answer::exact_match(
                    &c.text,
                    reference,
                    *extract,
                    *case_sensitive,
                )))
            })?),
            Kind::Numeric {
                extract,
                abs_tol,
                rel_tol,
            } => Raw::Resp(per_resp(&|p, c| {
                let r = reference(p)?;
                let x = parse_number(r).ok_or_else(|| {
                    format!("prompt `{}`: reference answer `{r}` is not a number", p.id)
                })?;
                Ok(b(answer::numeric_match(
                    &c.text, x, *extract, *abs_tol, *rel_tol,
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

fn per_group_crit(s: &Bound, g: &Group) -> usize {
    match &s.kind {
        Kind::Ifeval {
            checks: Some(cs), ..
        } => cs.len(),
        Kind::Ifeval { checks: None, .. } => g.prompt.instructions.len(),
        Kind::Judge {
            criteria: Some(cs), ..
        } => cs.len(),
        Kind::Judge { criteria: None, .. } | Kind::Points => g.prompt.rubric.len(),
        _ => 0,
    }
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
