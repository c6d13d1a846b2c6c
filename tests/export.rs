//! The torch exporter (`rlxc compile --emit torch`) against the reference interpreter.
//!
//! For every recipe in `recipes/` and `tests/gradients/` (read at run time), the generated module runs
//! with CPU torch in float64 on synthetic batches (`rlx_runtime::synthetic`), padded, and must agree
//! with the interpreter within 1e-6: rewards, advantages, `keep` decisions, the loss, every metric and
//! the autograd gradient of the loss w.r.t. every differentiable input. The adapters are checked on
//! the same data: `loss` with given advantages (TRL) and `policy_loss` (verl) against the interpreter
//! on the kept responses, `advantage_estimator` (verl), `compute_score` (verl), `reward_func` (TRL) and
//! `reward_metrics`; every metric an adapter returns has the interpreter's value, and every one it does
//! not return is named in its `missing`. `every_recipe_metric_reaches_trl_and_verl` follows each metric
//! of a few recipes to TRL's and verl's loggers (tests/export/metrics.py).
//! A recipe the exporter cannot express yet is reported as unsupported with the exporter's message.
//!
//! The Python side is `tests/export/driver.py`, run once for all recipes by `$RLX_PYTHON` (default: the
//! virtual environment of `scripts/install-torch.sh`, `~/.cache/rlx/torch`). Where the build found no
//! torch (or verl) there, these tests are reported as ignored (rlx-tools); CI installs them and sets
//! `RLX_REQUIRE_TOOLS=1`, which runs them whatever the build found.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value as Json};

use rlx_compiler::export::{recipe_to_torch, ModuleInfo, SymbolicGraph};
use rlx_compiler::hir::Recipe;
use rlx_compiler::ir::{Elem, Feature, Graph, InputInfo, Level, Node, NodeId, Op, Outputs, Shape};
use rlx_runtime::synthetic::{batch as synthetic_batch, Spec};
use rlx_runtime::{evaluate, Batch, Context, Layout, Outcome};

const TOLERANCE: f64 = 1e-6;

/// Recipes whose stage functions are also run through `torch.compile(fullgraph=True)` (one of each
/// kind of op: keep filters, pairs, scans, shifts, feature axes), compared with eager execution.
const COMPILE_CHECKED: &[&str] = &[
    "recipes/dapo.rlx",
    "tests/gradients/pairwise.rlx",
    "tests/gradients/scan.rlx",
    "tests/gradients/token_ops.rlx",
    "tests/gradients/features.rlx",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Python of the torch tests (`$RLX_PYTHON`, else scripts/install-torch.sh's): the tests that use
/// it are ignored where the build found no torch there (rlx-tools, `rlx_torch`/`rlx_verl`).
fn python() -> PathBuf {
    rlx_tools::python()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rlx-export-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

/// Every recipe: `recipes/*.rlx` and `tests/gradients/*.rlx`, read now (recipes are added often).
fn recipe_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for dir in ["recipes", "tests/gradients"] {
        if let Ok(entries) = std::fs::read_dir(root().join(dir)) {
            for entry in entries.flatten() {
                let path = entry.path();
                if path.extension().is_some_and(|e| e == "rlx") {
                    files.push(path);
                }
            }
        }
    }
    files.sort();
    files
}

fn label(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// Export a recipe file to `dir`: the module's path, or why not.
fn export(path: &Path, dir: &Path) -> Result<(Recipe, PathBuf), String> {
    let checked = rlx_compiler::check_path(path).map_err(|e| format!("cannot read: {e}"))?;
    let Some(recipe) = checked.recipe else {
        let first = checked
            .diagnostics
            .first()
            .map(|d| d.message.clone())
            .unwrap_or_default();
        return Err(format!("does not check: {first}"));
    };
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let stem = path.file_stem().unwrap().to_string_lossy().to_string();
    let info = ModuleInfo::new(&stem, &label(path), &text);
    let module = recipe_to_torch(&recipe, &[], &info).map_err(|e| format!("UNSUPPORTED: {e}"))?;
    let file = dir.join(format!(
        "rlx_{}_{}.py",
        path.parent()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default(),
        stem
    ));
    std::fs::write(&file, module).map_err(|e| e.to_string())?;
    Ok((recipe, file))
}

// ---------------------------------------------------------------------------------------------------
// A batch as rows per response (the padded view), and back.

#[derive(Clone, Debug)]
enum Rows {
    /// A batch-level input: its value (or feature vector).
    Batch(Vec<f64>),
    /// One row per response: its tokens, its criteria, its feature vector or its value; group-level
    /// inputs repeat the group's row on each of its responses; a pair input's row is the response's
    /// pairs with the other responses of its group, in order (as a rollout line gives it).
    PerResponse(Vec<Vec<f64>>),
}

#[derive(Clone, Debug)]
struct Padded {
    lengths: Vec<usize>,
    /// The group of each response (groups contiguous, in order).
    groups: Vec<usize>,
    /// Criteria per group.
    crits: Vec<usize>,
    dim: usize,
    inputs: Vec<Rows>,
    /// Which inputs are at the pair level.
    pair: Vec<bool>,
}

fn feature_len(shape: &Shape, dim: usize) -> usize {
    match &shape.feature {
        Some(feature) => feature.fixed_len(dim).unwrap_or(1),
        None => 1,
    }
}

impl Padded {
    fn from_batch(graph: &Graph, batch: &Batch) -> Padded {
        let layout = &batch.layout;
        let groups = layout.response_groups();
        let responses = layout.responses();
        let inputs = graph
            .inputs
            .iter()
            .zip(&batch.inputs)
            .map(|(input, values)| {
                let shape = &input.shape;
                let width = feature_len(shape, layout.dim);
                match shape.level {
                    Level::Batch => Rows::Batch(values.clone()),
                    Level::Tok => Rows::PerResponse(
                        (0..responses)
                            .map(|r| {
                                values[layout.token_offsets[r]..layout.token_offsets[r + 1]]
                                    .to_vec()
                            })
                            .collect(),
                    ),
                    Level::Group => Rows::PerResponse(
                        (0..responses)
                            .map(|r| {
                                let g = groups[r];
                                match shape.feature {
                                    Some(Feature::Crit) => values
                                        [layout.crit_offsets[g]..layout.crit_offsets[g + 1]]
                                        .to_vec(),
                                    _ => values[g * width..(g + 1) * width].to_vec(),
                                }
                            })
                            .collect(),
                    ),
                    Level::Resp => {
                        let mut offset = 0;
                        Rows::PerResponse(
                            (0..responses)
                                .map(|r| {
                                    let len = match shape.feature {
                                        Some(Feature::Crit) => layout.crit_count(groups[r]),
                                        _ => width,
                                    };
                                    offset += len;
                                    values[offset - len..offset].to_vec()
                                })
                                .collect(),
                        )
                    }
                    Level::Pair => Rows::PerResponse(
                        (0..responses)
                            .map(|r| {
                                let g = groups[r];
                                let first = layout.group_offsets[g];
                                let n = layout.group_size(g);
                                let before: usize = (0..g)
                                    .map(|h| layout.group_size(h) * (layout.group_size(h) - 1))
                                    .sum();
                                let start = before + (r - first) * (n - 1);
                                values[start..start + n - 1].to_vec()
                            })
                            .collect(),
                    ),
                }
            })
            .collect();
        Padded {
            lengths: (0..responses).map(|r| layout.response_length(r)).collect(),
            groups,
            crits: (0..layout.groups()).map(|g| layout.crit_count(g)).collect(),
            dim: layout.dim,
            inputs,
            pair: graph
                .inputs
                .iter()
                .map(|i| i.shape.level == Level::Pair)
                .collect(),
        }
    }

    /// The responses `rows` alone (in order), their groups renumbered.
    fn select(&self, rows: &[usize]) -> Padded {
        let mut renumber = BTreeMap::new();
        for &r in rows {
            let next = renumber.len();
            renumber.entry(self.groups[r]).or_insert(next);
        }
        Padded {
            lengths: rows.iter().map(|&r| self.lengths[r]).collect(),
            groups: rows.iter().map(|&r| renumber[&self.groups[r]]).collect(),
            crits: renumber.keys().map(|&g| self.crits[g]).collect(),
            dim: self.dim,
            inputs: self
                .inputs
                .iter()
                .zip(&self.pair)
                .map(|(rows_of, &pair)| match rows_of {
                    Rows::Batch(v) => Rows::Batch(v.clone()),
                    // A pair row keeps its pairs with the responses kept.
                    Rows::PerResponse(all) if pair => Rows::PerResponse(
                        rows.iter()
                            .map(|&r| {
                                let others = (0..self.groups.len())
                                    .filter(|&j| j != r && self.groups[j] == self.groups[r]);
                                others
                                    .zip(&all[r])
                                    .filter(|(j, _)| rows.contains(j))
                                    .map(|(_, v)| *v)
                                    .collect()
                            })
                            .collect(),
                    ),
                    Rows::PerResponse(all) => {
                        Rows::PerResponse(rows.iter().map(|&r| all[r].clone()).collect())
                    }
                })
                .collect(),
            pair: self.pair.clone(),
        }
    }

    fn to_batch(&self, graph: &Graph) -> Batch {
        let group_count = self.crits.len();
        let mut per_group = vec![0; group_count];
        let mut first = vec![usize::MAX; group_count];
        for (r, &g) in self.groups.iter().enumerate() {
            per_group[g] += 1;
            first[g] = first[g].min(r);
        }
        let layout = Layout::from_counts(&per_group, &self.lengths, &self.crits, self.dim)
            .expect("a valid layout");
        let inputs = graph
            .inputs
            .iter()
            .zip(&self.inputs)
            .map(|(input, rows)| match rows {
                Rows::Batch(v) => v.clone(),
                Rows::PerResponse(rows) if input.shape.level == Level::Group => {
                    first.iter().flat_map(|&r| rows[r].clone()).collect()
                }
                Rows::PerResponse(rows) => rows.iter().flatten().copied().collect(),
            })
            .collect();
        Batch { layout, inputs }
    }

    /// The same batch with response `r`'s tokens removed.
    fn without_tokens(&self, graph: &Graph, r: usize) -> Padded {
        let mut padded = self.clone();
        padded.lengths[r] = 0;
        for (input, rows) in graph.inputs.iter().zip(&mut padded.inputs) {
            if let (Level::Tok, Rows::PerResponse(rows)) = (input.shape.level, rows) {
                rows[r].clear();
            }
        }
        padded
    }

    /// The same batch with every input that has a default set to it, except `keep` (what verl's
    /// PolicyLossFn sees: it passes the log-probabilities, and the module fills in defaults).
    fn with_defaults(&self, graph: &Graph, keep: &[&str]) -> Padded {
        let mut padded = self.clone();
        for (input, rows) in graph.inputs.iter().zip(&mut padded.inputs) {
            let Some(default) = input.default else {
                continue;
            };
            if keep.contains(&input.name.as_str()) {
                continue;
            }
            match rows {
                Rows::Batch(values) => values.iter_mut().for_each(|v| *v = default),
                Rows::PerResponse(rows) => rows
                    .iter_mut()
                    .flat_map(|row| row.iter_mut())
                    .for_each(|v| *v = default),
            }
        }
        padded
    }

    fn to_json(&self, graph: &Graph) -> Json {
        let mut inputs = serde_json::Map::new();
        for (input, rows) in graph.inputs.iter().zip(&self.inputs) {
            let value = match rows {
                Rows::Batch(v) if input.shape.feature.is_none() => json!(v[0]),
                Rows::Batch(v) => json!(v),
                Rows::PerResponse(rows) => json!(rows),
            };
            inputs.insert(input.name.clone(), value);
        }
        json!({
            "lengths": self.lengths,
            "groups": self.groups,
            "crits": self.groups.iter().map(|&g| self.crits[g]).collect::<Vec<_>>(),
            "inputs": inputs,
        })
    }

    /// Gradient rows from the driver, flattened in the interpreter's element order.
    fn flatten(&self, input: &InputInfo, rows: &Json) -> Vec<f64> {
        let rows: Vec<Vec<f64>> = match rows {
            Json::Array(items) if items.iter().all(|i| i.is_number()) => {
                vec![items.iter().filter_map(Json::as_f64).collect()]
            }
            Json::Array(items) => items
                .iter()
                .map(|row| {
                    row.as_array()
                        .map(|r| r.iter().filter_map(Json::as_f64).collect())
                        .unwrap_or_default()
                })
                .collect(),
            _ => Vec::new(),
        };
        if input.shape.level == Level::Group {
            let mut sums: Vec<Vec<f64>> = vec![Vec::new(); self.crits.len()];
            for (r, row) in rows.iter().enumerate() {
                let sum = &mut sums[self.groups[r]];
                if sum.is_empty() {
                    sum.resize(row.len(), 0.0);
                }
                for (s, x) in sum.iter_mut().zip(row) {
                    *s += x;
                }
            }
            return sums.into_iter().flatten().collect();
        }
        rows.into_iter().flatten().collect()
    }
}

// ---------------------------------------------------------------------------------------------------
// Comparisons

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= TOLERANCE * 1f64.max(a.abs()).max(b.abs())
}

struct Checker {
    failures: Vec<String>,
}

impl Checker {
    fn number(&mut self, what: &str, expected: f64, got: Option<f64>) {
        match got {
            Some(got) if close(expected, got) => {}
            got => self
                .failures
                .push(format!("{what}: rlx {expected}, torch {got:?}")),
        }
    }

    fn vector(&mut self, what: &str, expected: &[f64], got: Option<Vec<f64>>) {
        let Some(got) = got else {
            self.failures.push(format!("{what}: missing"));
            return;
        };
        if got.len() != expected.len() {
            self.failures.push(format!(
                "{what}: rlx has {} values, torch {}",
                expected.len(),
                got.len()
            ));
            return;
        }
        if let Some(i) = (0..got.len()).find(|&i| !close(expected[i], got[i])) {
            self.failures.push(format!(
                "{what}[{i}]: rlx {}, torch {} (rlx {:?}, torch {:?})",
                expected[i], got[i], expected, got
            ));
        }
    }

    /// A metrics dict (`Metrics`) against the interpreter's: each metric is there with the
    /// interpreter's value (under `prefix`), or named in `missing` with a reason; none is dropped
    /// silently, and none is there that the recipe does not have.
    fn metrics(
        &mut self,
        what: &str,
        expected: &[(String, f64)],
        got: &Json,
        missing: &Json,
        prefix: &str,
    ) {
        for (name, value) in expected {
            match got[format!("{prefix}{name}")].as_f64() {
                Some(value_got) => {
                    self.number(&format!("{what} metric {name}"), *value, Some(value_got))
                }
                None if missing[name].as_str().is_some_and(|why| why.contains(name)) => {}
                None => self.failures.push(format!(
                    "{what}: metric `{name}` neither returned nor named in `missing` ({got}, missing {missing})"
                )),
            }
        }
        if let Some(keys) = got.as_object() {
            for key in keys.keys() {
                let known = key
                    .strip_prefix(prefix)
                    .is_some_and(|name| expected.iter().any(|(n, _)| n == name));
                if !known {
                    self.failures
                        .push(format!("{what}: `{key}` is not a metric of the recipe"));
                }
            }
        }
    }

    /// A reward side's metrics (`entry["metrics"]`, `entry["missing"]`) against the interpreter on
    /// the whole batch: exactly the reward-side metrics, each there or (unless `every`) in `missing`.
    fn reward_side(
        &mut self,
        what: &str,
        outcome: &Outcome,
        names: &[String],
        entry: &Json,
        every: bool,
    ) {
        let expected: Vec<(String, f64)> = outcome
            .metrics
            .iter()
            .filter(|(name, _)| names.contains(name))
            .cloned()
            .collect();
        if expected.len() != names.len() {
            self.failures.push(format!(
                "{what}: REWARD_SIDE_METRICS {names:?} are not all metrics of the recipe"
            ));
        }
        self.metrics(what, &expected, &entry["metrics"], &entry["missing"], "");
        let missing = entry["missing"].as_object().map_or(0, |m| m.len());
        if every && missing > 0 {
            self.failures.push(format!(
                "{what}: with every input given, {} not computed",
                entry["missing"]
            ));
        }
    }

    fn gradients(
        &mut self,
        what: &str,
        graph: &Graph,
        padded: &Padded,
        expected: &[(String, Vec<f64>)],
        got: &Json,
        only: Option<&str>,
    ) {
        for (name, values) in expected {
            if only.is_some_and(|o| o != name) {
                continue;
            }
            let input = graph.inputs.iter().find(|i| &i.name == name).unwrap();
            let rows = &got[name];
            let got = (!rows.is_null()).then(|| padded.flatten(input, rows));
            self.vector(&format!("{what} ∂loss/∂{name}"), values, got);
        }
    }
}

fn floats(value: &Json) -> Option<Vec<f64>> {
    value.as_array().map(|items| {
        items
            .iter()
            .map(|v| v.as_f64().unwrap_or(f64::NAN))
            .collect()
    })
}

/// One run of a module: its batch, and what the interpreter computed there.
struct Case {
    recipe: String,
    spec: String,
    graph: Graph,
    padded: Padded,
    outcome: Outcome,
    /// The kept responses alone, when the interpreter keeps all of them there (for the adapters
    /// that take a trainer's advantages).
    subset: Option<(Padded, Outcome)>,
    /// The same, with defaulted inputs at their defaults (what verl's policy loss sees).
    verl: Option<(Padded, Outcome)>,
    /// The whole batch with defaulted inputs at their defaults (what verl's advantage estimator
    /// sees: rewards, the mask and the groups).
    estimator: Option<Outcome>,
}

fn specs() -> Vec<(&'static str, Spec)> {
    vec![
        ("default", Spec::default()),
        (
            "4x3",
            Spec {
                groups: 4,
                responses: 3,
                tokens: 7,
                ragged: true,
                singleton: false,
                criteria: 4,
                dim: 3,
                seed: 7,
            },
        ),
        (
            "2x5 even",
            Spec {
                groups: 2,
                responses: 5,
                tokens: 4,
                ragged: false,
                singleton: false,
                criteria: 2,
                dim: 2,
                seed: 11,
            },
        ),
    ]
}

/// One batch to compare on: a synthetic spec, param overrides (passed to the module as its config),
/// and whether response 1 loses its tokens.
struct Run {
    label: String,
    overrides: Vec<(String, f64)>,
    spec: Spec,
    empty: bool,
}

/// A param override for the config test: the first finite `f32` param, nudged.
fn nudged_param(recipe: &Recipe) -> Option<(String, f64)> {
    recipe
        .params
        .iter()
        .find(|p| p.elem == Elem::F32 && p.value.is_finite() && p.value != 0.0)
        .map(|p| (p.name.clone(), p.value * 1.25))
}

#[test]
#[cfg_attr(not(rlx_torch), ignore = "needs torch: run scripts/install-torch.sh")]
fn exported_modules_match_the_interpreter() {
    let python = python();
    let dir = scratch("modules");
    let mut cases: Vec<Case> = Vec::new();
    let mut manifest = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    let mut unsupported = Vec::new();
    for path in recipe_files() {
        let name = label(&path);
        let (recipe, module) = match export(&path, &dir) {
            Ok(exported) => exported,
            Err(why) if why.starts_with("UNSUPPORTED") => {
                eprintln!("{name}: {why}");
                unsupported.push(name);
                continue;
            }
            Err(why) => {
                notes.push(format!("{name}: skipped, {why}"));
                continue;
            }
        };
        let mut runs: Vec<Run> = specs()
            .into_iter()
            .map(|(label, spec)| Run {
                label: label.to_string(),
                overrides: Vec::new(),
                spec,
                empty: false,
            })
            .collect();
        runs.push(Run {
            label: "default, response 1 empty".into(),
            overrides: Vec::new(),
            spec: Spec::default(),
            empty: true,
        });
        if let Some(param) = nudged_param(&recipe) {
            runs.push(Run {
                label: format!("default, config {}={}", param.0, param.1),
                overrides: vec![param],
                spec: Spec::default(),
                empty: false,
            });
        }
        let mut compared = 0;
        for Run {
            label: spec_label,
            overrides,
            spec,
            empty,
        } in runs
        {
            let graph = match rlx_compiler::compile_graph(&recipe, &overrides) {
                Ok(graph) => graph,
                Err(e) => {
                    notes.push(format!("{name} [{spec_label}]: {e}"));
                    continue;
                }
            };
            let mut batch = synthetic_batch(&graph, &spec);
            if empty {
                batch = Padded::from_batch(&graph, &batch)
                    .without_tokens(&graph, 1)
                    .to_batch(&graph);
            }
            let outcome = match evaluate(&graph, &batch, &Context::default()) {
                Ok(outcome) => outcome,
                Err(e) => {
                    notes.push(format!("{name} [{spec_label}]: the interpreter fails: {e}"));
                    continue;
                }
            };
            let padded = Padded::from_batch(&graph, &batch);
            let rows: Vec<usize> = (0..outcome.kept.len())
                .filter(|&r| outcome.kept[r])
                .collect();
            let sub = padded.select(&rows);
            let all_kept = |padded: Padded| match evaluate(
                &graph,
                &padded.to_batch(&graph),
                &Context::default(),
            ) {
                Ok(outcome) if outcome.kept.iter().all(|k| *k) => Some((padded, outcome)),
                _ => None,
            };
            let policy = graph
                .inputs
                .iter()
                .find(|i| i.differentiable && i.shape == Shape::new(Level::Tok))
                .map(|i| i.name.clone())
                .unwrap_or_default();
            let verl = all_kept(sub.with_defaults(&graph, &[&policy, "old_logp"]));
            let estimator = evaluate(
                &graph,
                &padded.with_defaults(&graph, &[]).to_batch(&graph),
                &Context::default(),
            )
            .ok();
            let subset = all_kept(sub);
            let mut case = json!({
                "module": module.display().to_string(),
                "batch": padded.to_json(&graph),
                "differentiable": graph.inputs.iter().filter(|i| i.differentiable).map(|i| i.name.clone()).collect::<Vec<_>>(),
                "reward": estimator.as_ref().and_then(|o| o.reward.clone()),
            });
            if compared == 0 && COMPILE_CHECKED.contains(&name.as_str()) {
                case["compile"] = json!(true);
            }
            if !overrides.is_empty() {
                let params: serde_json::Map<String, Json> = overrides
                    .iter()
                    .map(|(n, v)| (n.clone(), json!(v)))
                    .collect();
                case["config"] = json!({ "rlx": params });
            }
            if let Some((_, sub_outcome)) = &subset {
                if let Some(advantage) = &sub_outcome.advantage {
                    case["subset"] = json!({ "rows": rows, "advantage": advantage });
                }
            }
            if let Some((_, verl_outcome)) = &verl {
                if let Some(advantage) = &verl_outcome.advantage {
                    case["verl"] = json!({ "rows": rows, "advantage": advantage });
                }
            }
            manifest.push(case);
            cases.push(Case {
                recipe: name.clone(),
                spec: spec_label,
                graph,
                padded,
                outcome,
                subset,
                verl,
                estimator,
            });
            compared += 1;
        }
        if compared == 0 {
            notes.push(format!(
                "{name}: no batch the interpreter accepts, nothing compared"
            ));
        }
    }
    let results = run_driver(
        &python,
        "tests/export/driver.py",
        &dir,
        json!({ "cases": manifest }),
    );
    let mut checker = Checker {
        failures: Vec::new(),
    };
    let mut paths_seen: BTreeMap<String, usize> = BTreeMap::new();
    for (case, result) in cases.iter().zip(results["results"].as_array().unwrap()) {
        let before = checker.failures.len();
        check_case(case, result, &mut checker, &mut paths_seen);
        for failure in &mut checker.failures[before..] {
            *failure = format!("{} [{}]: {failure}", case.recipe, case.spec);
        }
    }
    for note in &notes {
        eprintln!("note: {note}");
    }
    eprintln!(
        "torch {}: {} cases over {} recipes compared; adapter checks: {:?}; unsupported: {:?}",
        results["torch"],
        cases.len(),
        cases
            .iter()
            .map(|c| &c.recipe)
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        paths_seen,
        unsupported
    );
    assert!(
        checker.failures.is_empty(),
        "{} mismatches:\n{}",
        checker.failures.len(),
        checker.failures.join("\n")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn error_of(value: &Json) -> Option<String> {
    value["error"].as_str().map(|e| {
        let trace = value["trace"].as_str().unwrap_or("");
        format!("{e}\n{trace}")
    })
}

fn check_case(
    case: &Case,
    result: &Json,
    checker: &mut Checker,
    seen: &mut BTreeMap<String, usize>,
) {
    if let Some(load) = result["load"].as_str() {
        checker.failures.push(format!(
            "the module does not load: {load}\n{}",
            result["trace"].as_str().unwrap_or("")
        ));
        return;
    }
    let outcome = &case.outcome;
    let full = &result["full"];
    if let Some(error) = error_of(full) {
        checker.failures.push(format!("evaluate: {error}"));
        return;
    }
    *seen.entry("evaluate".into()).or_default() += 1;
    if let Some(reward) = &outcome.reward {
        checker.vector("reward", reward, floats(&full["reward"]));
    }
    if let Some(advantage) = &outcome.advantage {
        checker.vector("advantage", advantage, floats(&full["advantage"]));
        checker.vector(
            "compute_rewards advantage",
            advantage,
            floats(&full["compute_rewards_advantage"]),
        );
    }
    let kept: Option<Vec<bool>> = full["kept"]
        .as_array()
        .map(|k| k.iter().map(|b| b.as_bool().unwrap_or(false)).collect());
    if kept.as_ref() != Some(&outcome.kept) {
        checker
            .failures
            .push(format!("kept: rlx {:?}, torch {kept:?}", outcome.kept));
    }
    if let Some(loss) = outcome.loss {
        checker.number("loss", loss, full["loss"].as_f64());
    }
    for (name, value) in &outcome.metrics {
        checker.number(
            &format!("metric {name}"),
            *value,
            full["metrics"][name].as_f64(),
        );
    }
    checker.gradients(
        "evaluate",
        &case.graph,
        &case.padded,
        &outcome.gradients,
        &full["grad"],
        None,
    );
    // The reward-side metrics (REWARD_SIDE_METRICS) on the whole batch, as rlx computes them.
    let side = &result["reward_metrics"];
    let reward_side: Vec<String> = names_of(&side["names"]);
    match error_of(side) {
        Some(error) => checker.failures.push(format!("reward_metrics: {error}")),
        None => {
            *seen.entry("reward_metrics".into()).or_default() += 1;
            checker.reward_side("reward_metrics", outcome, &reward_side, side, true);
        }
    }

    if let Some((sub, sub_outcome)) = &case.subset {
        let given = &result["loss_given_advantage"];
        if !given.is_null() {
            match error_of(given) {
                Some(error) if error.starts_with("NotImplementedError") => {}
                Some(error) => checker
                    .failures
                    .push(format!("loss with given advantages: {error}")),
                None => {
                    *seen.entry("loss(advantages)".into()).or_default() += 1;
                    if let Some(loss) = sub_outcome.loss {
                        checker.number("loss(advantages)", loss, given["loss"].as_f64());
                    }
                    checker.metrics(
                        "loss(advantages)",
                        &sub_outcome.metrics,
                        &given["metrics"],
                        &given["missing"],
                        "",
                    );
                    checker.gradients(
                        "loss(advantages)",
                        &case.graph,
                        sub,
                        &sub_outcome.gradients,
                        &given["grad"],
                        None,
                    );
                }
            }
        }
    }
    if let Some((verl_batch, verl_outcome)) = &case.verl {
        let verl = &result["policy_loss"];
        if !verl.is_null() {
            match error_of(verl) {
                Some(error) => checker.failures.push(format!("policy_loss: {error}")),
                None => {
                    *seen.entry("policy_loss".into()).or_default() += 1;
                    if let Some(loss) = verl_outcome.loss {
                        checker.number("policy_loss", loss, verl["loss"].as_f64());
                        checker.number(
                            "policy_loss (global batch info)",
                            loss,
                            verl["scaled_loss"].as_f64(),
                        );
                    }
                    checker.metrics(
                        "policy_loss",
                        &verl_outcome.metrics,
                        &verl["metrics"],
                        &verl["missing"],
                        "actor/",
                    );
                    // The same names: a JSON object's keys come back sorted, the list in declaration order.
                    let returned: Vec<String> = verl["metrics"]
                        .as_object()
                        .map(|m| m.keys().cloned().collect())
                        .unwrap_or_default();
                    let mut declared: Vec<String> = verl["returns"]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|n| n.as_str().map(|n| format!("actor/{n}")))
                                .collect()
                        })
                        .unwrap_or_default();
                    declared.sort();
                    if returned != declared {
                        checker.failures.push(format!(
                            "policy_loss returns {returned:?}, POLICY_LOSS_METRICS says {declared:?}"
                        ));
                    }
                    let policy = case
                        .graph
                        .inputs
                        .iter()
                        .find(|i| i.differentiable && i.shape == Shape::new(Level::Tok))
                        .map(|i| i.name.clone());
                    checker.gradients(
                        "policy_loss",
                        &case.graph,
                        verl_batch,
                        &verl_outcome.gradients,
                        &verl["grad"],
                        policy.as_deref(),
                    );
                }
            }
        }
    }

    let compiled = &result["compile"];
    if !compiled.is_null() {
        match error_of(compiled) {
            Some(error) => checker
                .failures
                .push(format!("torch.compile(fullgraph=True): {error}")),
            None => {
                *seen.entry("torch.compile".into()).or_default() += 1;
                checker.number(
                    "torch.compile vs eager (max difference)",
                    0.0,
                    compiled["max_difference"].as_f64(),
                );
            }
        }
    }
    let estimator = &result["advantage_estimator"];
    if !estimator.is_null() {
        match error_of(estimator) {
            Some(error) => checker
                .failures
                .push(format!("advantage_estimator: {error}")),
            None => {
                *seen.entry("advantage_estimator".into()).or_default() += 1;
                let expected = case.estimator.as_ref().and_then(|o| o.advantage.as_ref());
                if let Some(advantage) = expected {
                    let got: Vec<Json> = estimator["advantage"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    for (r, expected) in advantage.iter().enumerate() {
                        if let Some(value) = got.get(r).and_then(Json::as_f64) {
                            checker.number(
                                &format!("advantage_estimator[{r}]"),
                                *expected,
                                Some(value),
                            );
                        }
                    }
                }
            }
        }
    }
    let advantage_func = &result["reward_func_advantage"];
    if !advantage_func.is_null() {
        match error_of(advantage_func) {
            Some(error) => checker
                .failures
                .push(format!("reward_func(output=\"advantage\"): {error}")),
            None => {
                *seen.entry("reward_func(advantage)".into()).or_default() += 1;
                if let Some(advantage) = &outcome.advantage {
                    checker.vector(
                        "reward_func(advantage)",
                        advantage,
                        floats(&advantage_func["advantage"]),
                    );
                }
                if let Some(reward) = &outcome.reward {
                    checker.vector(
                        "reward_func(advantage).reward_func (the companion reward)",
                        reward,
                        floats(&advantage_func["reward"]),
                    );
                }
                checker.reward_side(
                    "reward_func(advantage).metrics",
                    outcome,
                    &reward_side,
                    advantage_func,
                    true,
                );
            }
        }
    }
    for (key, what) in [
        ("compute_score", "compute_score"),
        ("reward_func", "reward_func"),
    ] {
        let adapter = &result[key];
        if adapter.is_null() {
            continue;
        }
        match error_of(adapter) {
            Some(error) => checker.failures.push(format!("{what}: {error}")),
            None => {
                *seen.entry(what.into()).or_default() += 1;
                if let Some(reward) = &outcome.reward {
                    checker.vector(what, reward, floats(&adapter["reward"]));
                }
                if key == "reward_func" {
                    checker.reward_side(
                        "reward_func.metrics",
                        outcome,
                        &reward_side,
                        adapter,
                        false,
                    );
                }
            }
        }
    }
}

/// The recipes whose metrics are followed to TRL's and verl's loggers: GRPO, DAPO (`keep` filters),
/// DARLING (a group term), RubricRL (criteria) and Rubicon (a rubric block).
const METRIC_RECIPES: &[&str] = &[
    "recipes/grpo.rlx",
    "recipes/dapo.rlx",
    "recipes/darling.rlx",
    "recipes/rubricrl.rlx",
    "recipes/rubicon.rlx",
];

/// Relative tolerance of the metric checks (TRL keeps rewards in float32).
const METRIC_RTOL: f64 = 1e-5;

fn near(expected: f64, got: Option<f64>) -> bool {
    got.is_some_and(|got| {
        (expected - got).abs() <= METRIC_RTOL * expected.abs().max(got.abs()) + 1e-6
    })
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// The sample standard deviation (TRL's `nanstd`, with Bessel's correction).
fn sample_std(values: &[f64]) -> f64 {
    let m = mean(values);
    let n = values.len() as f64;
    (values.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (n - 1.0)).sqrt()
}

fn names_of(value: &Json) -> Vec<String> {
    value
        .as_array()
        .map(|names| {
            names
                .iter()
                .filter_map(|n| n.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Every metric the rlx interpreter reports for a batch reaches a TRL or verl user, with the same
/// value: `loss` on the whole batch returns them all; under TRL (tests/export/metrics.py emulates
/// GRPOTrainer's reward logging) the reward-side metrics come from the reward function through
/// `log_metric` and the others from `loss(trl_batch(...))`, each exactly once, and the advantage
/// function's companion keeps the reward logged as `rewards/rlx_<recipe>/mean`; under verl
/// `policy_loss` returns the others as `actor/NAME` and `reward_metrics` the reward-side ones.
#[test]
#[cfg_attr(not(rlx_torch), ignore = "needs torch: run scripts/install-torch.sh")]
fn every_recipe_metric_reaches_trl_and_verl() {
    struct MetricCase {
        label: String,
        outcome: Outcome,
        trl: Outcome,
        verl: Outcome,
    }
    let python = python();
    let dir = scratch("metrics");
    let specs = [
        (
            "4x4",
            Spec {
                groups: 4,
                responses: 4,
                tokens: 6,
                ragged: true,
                singleton: false,
                criteria: 3,
                dim: 3,
                seed: 5,
            },
        ),
        (
            "3x6 even",
            Spec {
                groups: 3,
                responses: 6,
                tokens: 4,
                ragged: false,
                singleton: false,
                criteria: 4,
                dim: 2,
                seed: 13,
            },
        ),
    ];
    let mut cases = Vec::new();
    let mut manifest = Vec::new();
    for file in METRIC_RECIPES {
        let (recipe, module) = export(&root().join(file), &dir).expect("the recipe exports");
        let graph = rlx_compiler::compile_graph(&recipe, &[]).expect("the recipe compiles");
        let policy = graph
            .inputs
            .iter()
            .find(|i| i.differentiable && i.shape == Shape::new(Level::Tok))
            .map(|i| i.name.clone())
            .expect("a policy input");
        let mut runs: Vec<(String, Padded)> = specs
            .iter()
            .map(|(label, spec)| {
                let batch = synthetic_batch(&graph, spec);
                (label.to_string(), Padded::from_batch(&graph, &batch))
            })
            .collect();
        if *file == "recipes/dapo.rlx" {
            // Group 0 all correct: DAPO's `keep` drops it, so the metrics are over the others.
            let mut padded = runs[0].1.clone();
            let score = graph.inputs.iter().position(|i| i.name == "score").unwrap();
            if let Rows::PerResponse(rows) = &mut padded.inputs[score] {
                for (r, row) in rows.iter_mut().enumerate() {
                    if padded.groups[r] == 0 {
                        row[0] = 1.0;
                    }
                }
            }
            runs.push(("4x4, group 0 uniform (dropped by keep)".into(), padded));
        }
        for (label, padded) in runs {
            let outcome = evaluate(&graph, &padded.to_batch(&graph), &Context::default())
                .unwrap_or_else(|e| panic!("{file} [{label}]: the interpreter fails: {e}"));
            let rows: Vec<usize> = (0..outcome.kept.len())
                .filter(|&r| outcome.kept[r])
                .collect();
            if label.contains("dropped") {
                assert!(
                    rows.len() < outcome.kept.len(),
                    "{file} [{label}]: nothing dropped"
                );
            }
            let sub = padded.select(&rows);
            let on = |batch: Padded| {
                let outcome = evaluate(&graph, &batch.to_batch(&graph), &Context::default())
                    .unwrap_or_else(|e| panic!("{file} [{label}]: the interpreter fails: {e}"));
                assert!(outcome.kept.iter().all(|k| *k), "{file} [{label}]");
                outcome
            };
            // What TRL's loss inputs carry (log-probabilities), and what verl's PolicyLossFn does.
            let trl =
                on(sub.with_defaults(&graph, &[&policy, "old_logp", "ref_logp", "sampler_logp"]));
            let verl = on(sub.with_defaults(&graph, &[&policy, "old_logp"]));
            manifest.push(json!({
                "module": module.display().to_string(),
                "batch": padded.to_json(&graph),
                "differentiable": graph.inputs.iter().filter(|i| i.differentiable).map(|i| i.name.clone()).collect::<Vec<_>>(),
                "rows": rows,
                "trl": { "advantage": trl.advantage },
                "verl": { "advantage": verl.advantage },
            }));
            cases.push(MetricCase {
                label: format!("{file} [{label}]"),
                outcome,
                trl,
                verl,
            });
        }
    }
    let results = run_driver(
        &python,
        "tests/export/metrics.py",
        &dir,
        json!({ "cases": manifest }),
    );
    let mut failures: Vec<String> = Vec::new();
    let mut fail = |case: &MetricCase, message: String| {
        failures.push(format!("{}: {message}", case.label));
    };
    let mut via_verl = 0;
    for (case, result) in cases.iter().zip(results["results"].as_array().unwrap()) {
        if let Some(load) = result["load"].as_str() {
            fail(case, format!("the module does not load: {load}"));
            continue;
        }
        for key in ["loss", "trl_rewards", "trl_loss", "verl"] {
            if let Some(error) = error_of(&result[key]) {
                fail(case, format!("{key}: {error}"));
            }
        }
        let name = result["NAME"].as_str().unwrap_or_default().to_string();
        let side = names_of(&result["REWARD_SIDE_METRICS"]);
        let all: Vec<String> = case
            .outcome
            .metrics
            .iter()
            .map(|(n, _)| n.clone())
            .collect();
        if names_of(&result["METRICS"]) != all {
            fail(
                case,
                format!("METRICS {} are not rlx's {all:?}", result["METRICS"]),
            );
        }

        // loss on the whole batch: every metric.
        for (metric, value) in &case.outcome.metrics {
            let got = result["loss"]["metrics"][metric].as_f64();
            if !near(*value, got) {
                fail(
                    case,
                    format!("loss(batch) metric {metric}: rlx {value}, torch {got:?}"),
                );
            }
        }
        if result["loss"]["missing"]
            .as_object()
            .is_none_or(|m| !m.is_empty())
        {
            fail(
                case,
                format!("loss(batch) misses {}", result["loss"]["missing"]),
            );
        }

        // TRL: the reward phase's logs, then the loss's.
        let rewards = &result["trl_rewards"];
        let logged = &rewards["logged"];
        let reward = case.outcome.reward.as_deref().unwrap_or_default();
        let advantage = case.outcome.advantage.as_deref().unwrap_or_default();
        for (key, expected) in [
            (format!("rewards/{name}/mean"), mean(reward)),
            (format!("rewards/{name}/std"), sample_std(reward)),
            (format!("rewards/{name}_advantage/mean"), mean(advantage)),
            ("reward".to_string(), mean(advantage)),
        ] {
            if !near(expected, logged[&key].as_f64()) {
                fail(
                    case,
                    format!("TRL logs {key} = {}, rlx's is {expected}", logged[&key]),
                );
            }
        }
        if rewards["inputs_fn_calls"] != json!(1) {
            fail(case, format!(
                "inputs_fn ran {} times for one batch (the companion must reuse the advantage function's rewards)",
                rewards["inputs_fn_calls"]
            ));
        }
        let trl_advantage = floats(&rewards["advantages"]).unwrap_or_default();
        if trl_advantage.len() != advantage.len()
            || advantage
                .iter()
                .zip(&trl_advantage)
                .any(|(a, b)| !near(*a, Some(*b)))
        {
            fail(
                case,
                format!("TRL's advantages {trl_advantage:?} are not the recipe's {advantage:?}"),
            );
        }
        let loss_logged = &result["trl_loss"]["logged"];
        for (metric, value) in &case.outcome.metrics {
            let key = format!("rlx/{metric}");
            let from_reward = logged[&key].as_f64();
            let from_loss = loss_logged[&key].as_f64();
            let (expected, got, source) = if side.contains(metric) {
                let attribute = rewards["metrics_attribute"][metric].as_f64();
                if attribute != from_reward {
                    fail(
                        case,
                        format!("f.metrics[{metric}] = {attribute:?}, logged {from_reward:?}"),
                    );
                }
                (*value, from_reward, "the reward function's log_metric")
            } else {
                let expected = case
                    .trl
                    .metrics
                    .iter()
                    .find(|(n, _)| n == metric)
                    .unwrap()
                    .1;
                (expected, from_loss, "loss(trl_batch(...))")
            };
            if from_reward.is_some() && from_loss.is_some() {
                fail(
                    case,
                    format!("{key} is logged twice, by the reward function and the loss"),
                );
            }
            if !near(expected, got) {
                fail(
                    case,
                    format!("TRL: {key} from {source} is {got:?}, rlx's is {expected}"),
                );
            }
        }

        // verl: policy_loss's actor/ metrics, and reward_metrics for the reward side.
        let verl = &result["verl"];
        for metric in &side {
            let value = case
                .outcome
                .metrics
                .iter()
                .find(|(n, _)| n == metric)
                .unwrap()
                .1;
            let got = verl["reward_metrics"][metric].as_f64();
            if !near(value, got) {
                fail(
                    case,
                    format!("reward_metrics {metric}: rlx {value}, torch {got:?}"),
                );
            }
        }
        let returns = names_of(&verl["returns"]);
        if verl["policy_loss_why"].is_null() {
            via_verl += 1;
            let keys: Vec<String> = verl["policy_loss"]
                .as_object()
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default();
            // A JSON object's keys come back sorted; `returns` is in declaration order.
            let mut expected_keys: Vec<String> =
                returns.iter().map(|n| format!("actor/{n}")).collect();
            expected_keys.sort();
            if keys != expected_keys {
                fail(
                    case,
                    format!("policy_loss returns {keys:?}, POLICY_LOSS_METRICS {expected_keys:?}"),
                );
            }
            for (metric, value) in &case.verl.metrics {
                let got = verl["policy_loss"][format!("actor/{metric}")].as_f64();
                let why = verl["policy_missing"][metric].as_str();
                match (got, why) {
                    (Some(_), _) if near(*value, got) => {}
                    (None, Some(why)) if side.contains(metric) && why.contains("reward-side") => {}
                    _ => fail(case, format!("policy_loss actor/{metric}: rlx {value}, torch {got:?}, missing {why:?}")),
                }
            }
            // Every metric reaches a verl user: from the policy loss or from reward_metrics.
            for metric in &all {
                if !returns.contains(metric) && !side.contains(metric) {
                    fail(case, format!("verl gets metric `{metric}` from neither policy_loss nor reward_metrics"));
                }
            }
        } else {
            let why = verl["policy_loss_why"].as_str().unwrap_or_default();
            if !returns.is_empty() || all.iter().any(|m| verl["why"][m].as_str() != Some(why)) {
                fail(
                    case,
                    format!(
                        "without policy_loss, POLICY_LOSS_METRICS {returns:?} and its reasons {}",
                        verl["why"]
                    ),
                );
            }
        }
    }
    eprintln!(
        "metrics: {} cases over {} recipes, {via_verl} with verl's policy loss",
        cases.len(),
        METRIC_RECIPES.len()
    );
    assert!(via_verl > 0, "no case went through verl's policy loss");
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[cfg_attr(not(rlx_torch), ignore = "needs torch: run scripts/install-torch.sh")]
fn the_adapters_get_true_lengths_or_fail_loudly() {
    // tests/export/lengths.py: without `response_mask` / `response_length` (evaluate, loss), a
    // `response_length` (verl's compute_score) or `completion_ids` (TRL's reward_funcs), a recipe
    // that reads tokens raises an error naming what is missing; with them the length penalty of
    // dapo.rlx is applied. When `keep` drops every response, the reward function computes and logs no
    // metric (as rlx logs none for the step it skips).
    let python = python();
    let dir = scratch("lengths");
    let path = root().join("recipes/dapo.rlx");
    let recipe = rlx_compiler::check_path(&path)
        .expect("readable")
        .recipe
        .expect("dapo checks");
    let text = std::fs::read_to_string(&path).unwrap();
    let overrides = [
        ("max_len".to_string(), 10.0),
        ("len_buffer".to_string(), 4.0),
    ];
    let module = recipe_to_torch(
        &recipe,
        &overrides,
        &ModuleInfo::new("dapo", "recipes/dapo.rlx", &text),
    )
    .expect("dapo exports");
    let file = dir.join("rlx_dapo.py");
    std::fs::write(&file, module).unwrap();
    let output = Command::new(&python)
        .arg(root().join("tests/export/lengths.py"))
        .arg(&file)
        .output()
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("OK"),
        "tests/export/lengths.py failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// recipes/adaptive_entropy.rlx (Skywork-OR1's adaptive entropy coefficient, recipe `state`) against
/// TRL itself: tests/export/adaptive_entropy.py runs TRL 1.16's `GRPOTrainer._compute_loss`
/// (`use_adaptive_entropy=True`, loss_type "dapo") and the exported module's `loss` on the same
/// batches over eight optimizer steps whose entropies cross the target both ways and reach the
/// coefficient's cap and floor: the losses, their gradients and the state after every step agree (the
/// module's `STATE` buffers against TRL's `entropy_coef` and `_last_world_entropy`); `state_dict`
/// round-trips and `STATE.eval()` freezes the state.
#[test]
#[cfg_attr(not(rlx_torch), ignore = "needs torch: run scripts/install-torch.sh")]
fn adaptive_entropy_state_follows_trl_step_by_step() {
    let dir = scratch("adaptive-entropy");
    let (_, file) = export(&root().join("recipes/adaptive_entropy.rlx"), &dir).expect("exports");
    let output = Command::new(python())
        .arg(root().join("tests/export/adaptive_entropy.py"))
        .arg(&file)
        .output()
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "tests/export/adaptive_entropy.py failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Json = serde_json::from_str(stdout.lines().last().unwrap_or("")).expect("JSON");
    assert_eq!(report["problems"], serde_json::json!([]), "{report}");
    let coefficients: Vec<f64> = report["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| s["coef"].as_f64().expect("coef"))
        .collect();
    // TRL's controller moved both ways and hit both bounds (0.025 and 0): the test exercised every
    // branch of `adaptive_entropy_coef`.
    assert_eq!(coefficients.len(), 8);
    assert!(
        coefficients.iter().any(|c| (c - 0.025).abs() < 1e-12),
        "{coefficients:?}"
    );
    assert!(coefficients.contains(&0.0), "{coefficients:?}");
    assert_eq!(
        report["state_dict_keys"],
        serde_json::json!(["coef", "last_entropy"])
    );
    assert_eq!(report["eval_frozen"], serde_json::json!(true));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[cfg_attr(
    not(rlx_verl),
    ignore = "needs verl: run scripts/install-torch.sh --with-verl"
)]
fn verl_registry_serves_the_exported_loss() {
    let python = python();
    let dir = scratch("verl");
    let (_, module) = export(&root().join("recipes/dapo.rlx"), &dir).expect("dapo exports");
    let script = r#"
import importlib.util, sys
from verl.trainer.ppo import core_algos
import torch
spec = importlib.util.spec_from_file_location("rlx_dapo", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
assert module.VERL_REGISTERED
loss_fn = core_algos.get_policy_loss_fn("rlx_dapo")
assert loss_fn is module.policy_loss, loss_fn
assert core_algos.get_adv_estimator_fn("rlx_dapo") is module.advantage_estimator

class Config(dict):
    """What verl's vanilla loss reads from its ActorConfig."""
    def __getattr__(self, name):
        return self[name]

torch.manual_seed(0)
B, T = 6, 9
mask = torch.zeros(B, T)
for i, n in enumerate([9, 4, 7, 1, 8, 5]):
    mask[i, :n] = 1
old = -torch.rand(B, T, dtype=torch.float64) * 2
log_prob = (old + 0.3 * torch.randn(B, T, dtype=torch.float64)).requires_grad_()
advantages = torch.randn(B, 1, dtype=torch.float64).expand(B, T) * mask
info = {"dp_size": 2, "batch_num_tokens": int(mask.sum()) * 3, "global_batch_size": B * 3}
config = Config(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=10.0, global_batch_info=info)
ours, metrics = loss_fn(old_log_prob=old, log_prob=log_prob, advantages=advantages, response_mask=mask,
                        loss_agg_mode="token-mean", config=config, rollout_is_weights=None)
(ours_grad,) = torch.autograd.grad(ours, log_prob)
theirs, their_metrics = core_algos.get_policy_loss_fn("vanilla")(old, log_prob, advantages, mask, "token-mean", config, None)
(their_grad,) = torch.autograd.grad(theirs, log_prob)
assert torch.allclose(ours, theirs, rtol=1e-9, atol=1e-12), (float(ours), float(theirs))
assert torch.allclose(ours_grad, their_grad, rtol=1e-9, atol=1e-12)
for key in ("pg_clipfrac", "ppo_kl", "pg_clipfrac_lower"):
    # verl computes its clip fractions in float32
    assert abs(metrics[f"actor/{key}"] - their_metrics[f"actor/{key}"]) < 1e-6, key
print("OK", float(ours), float(theirs))
"#;
    let output = Command::new(&python)
        .arg("-c")
        .arg(script)
        .arg(&module)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("OK"),
        "verl registry check failed:\n{stdout}\n{stderr}"
    );
    eprintln!("verl: {}", stdout.trim());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The GMPO and DPPO-TV recipes against verl's own losses (`geo_mean`, `dppo_tv`): the exported
/// `policy_loss` (the recipe's loss with verl's advantages) and verl's `core_algos` function on the same
/// padded batch, with verl's config set to the recipe's params: loss, gradient and clip metrics. The
/// DPPO recipe optimises the potential of verl's gradient, so its verl value is its `pg_loss_verl` metric.
#[test]
#[cfg_attr(
    not(rlx_verl),
    ignore = "needs verl: run scripts/install-torch.sh --with-verl"
)]
fn gmpo_and_dppo_tv_match_verls_losses() {
    let python = python();
    let dir = scratch("verl-objectives");
    let (_, gmpo) = export(&root().join("recipes/gmpo.rlx"), &dir).expect("gmpo exports");
    let (_, dppo) = export(&root().join("recipes/dppo_tv.rlx"), &dir).expect("dppo_tv exports");
    let script = r#"
import importlib.util, sys
import torch
from verl.trainer.ppo import core_algos

def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

class Config(dict):
    """What verl's losses read from its ActorConfig."""
    def __getattr__(self, name):
        return self[name]

torch.manual_seed(1)
B, T = 8, 7
mask = torch.zeros(B, T, dtype=torch.float64)
for i, n in enumerate([7, 3, 5, 1, 6, 2, 7, 4]):
    mask[i, :n] = 1
old = -torch.rand(B, T, dtype=torch.float64) * 3 - 0.05
# per-response advantages of both signs and one zero, the ratio spread over the clip ranges
adv_rows = torch.tensor([1.3, -0.7, 0.0, 2.0, -1.5, 0.4, -0.2, 0.9], dtype=torch.float64)
advantages = adv_rows[:, None].expand(B, T) * mask

cases = [
    (sys.argv[1], "geo_mean", Config(clip_ratio=0.4, clip_ratio_low=0.4, clip_ratio_high=0.4, clip_ratio_c=3.0,
                                     global_batch_info={}), "token-mean", 0.6, None),
    (sys.argv[2], "dppo_tv", Config(clip_ratio=0.15, clip_ratio_low=0.15, clip_ratio_high=0.15, clip_ratio_c=10000.0,
                                    global_batch_info={"loss_scale_factor": 8192}), "seq-mean-token-sum-norm", 0.8,
     "actor/pg_loss_verl"),
]
for path, mode, config, agg, spread, value_metric in cases:
    module = load(path, "rlx_" + mode)
    base = (old + spread * torch.randn(B, T, dtype=torch.float64)).clamp(max=-1e-3)
    log_prob = base.clone().requires_grad_()
    ours, metrics = module.policy_loss(old, log_prob, advantages, mask, agg, config, None)
    (ours_grad,) = torch.autograd.grad(ours, log_prob)
    log_prob2 = base.clone().requires_grad_()
    theirs, their_metrics = core_algos.get_policy_loss_fn(mode)(old, log_prob2, advantages, mask, agg, config, None)
    (their_grad,) = torch.autograd.grad(theirs, log_prob2)
    value = float(ours) if value_metric is None else float(metrics[value_metric])
    assert abs(value - float(theirs)) <= 1e-9 * abs(float(theirs)) + 1e-12, (mode, value, float(theirs))
    assert torch.allclose(ours_grad * mask, their_grad * mask, rtol=1e-9, atol=1e-12), (mode, ours_grad, their_grad)
    for key in ("pg_clipfrac", "ppo_kl", "pg_clipfrac_lower"):
        assert abs(metrics[f"actor/{key}"] - their_metrics[f"actor/{key}"]) < 1e-6, (mode, key, metrics, their_metrics)
    nonzero = float(their_metrics["actor/pg_clipfrac"]) + float(their_metrics["actor/pg_clipfrac_lower"])
    print("OK", mode, value, float(theirs), "clip fractions", nonzero)
"#;
    let output = Command::new(&python)
        .arg("-c")
        .arg(script)
        .arg(&gmpo)
        .arg(&dppo)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.matches("OK").count() == 2,
        "verl comparison failed:\n{stdout}\n{stderr}"
    );
    eprintln!("verl: {}", stdout.trim());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unsupported_feature_is_a_clear_error() {
    // A token-level value with a feature axis (the checker rejects it in recipes; the exporter must
    // not emit code for it if the IR ever has one).
    let shape = Shape {
        level: Level::Tok,
        feature: Some(Feature::Dim),
    };
    let graph = Graph {
        nodes: vec![
            Node {
                op: Op::Input(0),
                args: Vec::new(),
                shape: shape.clone(),
                elem: Elem::F32,
                span: None,
                call: None,
            },
            Node {
                op: Op::ReduceSum,
                args: vec![NodeId(0)],
                shape: Shape::BATCH,
                elem: Elem::F32,
                span: None,
                call: None,
            },
        ],
        inputs: vec![InputInfo {
            name: "x".into(),
            elem: Elem::F32,
            shape,
            differentiable: true,
            default: None,
        }],
        params: Vec::new(),
        rubrics: Vec::new(),
        outputs: Outputs {
            loss: Some(NodeId(1)),
            ..Outputs::default()
        },
        states: Vec::new(),
    };
    let symbolic = SymbolicGraph {
        graph,
        recipe_inputs: 1,
        names: Default::default(),
    };
    let error = rlx_compiler::export::torch::emit(&symbolic, &ModuleInfo::default())
        .expect_err("no module for a token-level feature axis");
    let message = error.to_string();
    assert!(
        message.contains("the torch exporter does not support")
            && message.contains("a token-level value with a feature axis ([tok, dim])"),
        "{message}"
    );
}

#[test]
fn rlxc_writes_a_module_with_a_header() {
    let dir = scratch("cli");
    let out = dir.join("rlx_dapo.py");
    let status = Command::new(env!("CARGO_BIN_EXE_rlxc"))
        .args([
            "compile",
            "recipes/dapo.rlx",
            "--emit",
            "torch",
            "--set",
            "eps_high=0.3",
            "-o",
        ])
        .arg(&out)
        .current_dir(root())
        .status()
        .expect("rlxc runs");
    assert!(status.success());
    let module = std::fs::read_to_string(&out).expect("the module was written");
    let text = std::fs::read_to_string(root().join("recipes/dapo.rlx")).unwrap();
    let digest = rlx_compiler::export::sha256::hex_digest(text.as_bytes());
    assert!(module.contains("from recipes/dapo.rlx"), "{module}");
    assert!(module.contains(&format!("SOURCE_SHA256 = \"{digest}\"")));
    assert!(
        module.contains("\"eps_high\": 0.3"),
        "the --set value is the default"
    );
    assert!(module.contains("def _loss(L, x, v):"));
    assert!(module.contains("def policy_loss("));
    assert!(!module.contains("for t in") && !module.contains("for r in range"));
    // An unknown param is an error, not a silently different module.
    let output = Command::new(env!("CARGO_BIN_EXE_rlxc"))
        .args([
            "compile",
            "recipes/dapo.rlx",
            "--emit",
            "torch",
            "--set",
            "eps_hihg=0.3",
        ])
        .current_dir(root())
        .output()
        .expect("rlxc runs");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("eps_hihg"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs the Python `script` on `manifest` (written to `dir/cases.json`) and returns what it wrote to
/// `dir/results.json`; a failing script fails the test with its stderr.
fn run_driver(python: &Path, script: &str, dir: &Path, manifest: Json) -> Json {
    let manifest_path = dir.join("cases.json");
    let results_path = dir.join("results.json");
    std::fs::write(&manifest_path, manifest.to_string()).unwrap();
    let output = Command::new(python)
        .arg(root().join(script))
        .arg(&manifest_path)
        .arg(&results_path)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    assert!(
        output.status.success(),
        "{script} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(&results_path).unwrap()).unwrap()
}
