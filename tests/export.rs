//! The torch exporter (`rlxc compile --emit torch`) against the reference interpreter.
//!
//! For every recipe in `recipes/` and `tests/gradients/` (read at run time), the generated module runs
//! with CPU torch in float64 on synthetic batches (`rlx_runtime::synthetic`), padded, and must agree
//! with the interpreter within 1e-6: rewards, advantages, `keep` decisions, the loss, every metric and
//! the autograd gradient of the loss w.r.t. every differentiable input. The adapters are checked on
//! the same data: `loss` with given advantages (TRL) and `policy_loss` (verl) against the interpreter
//! on the kept responses, `advantage_estimator` (verl), `compute_score` (verl) and `reward_func` (TRL).
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
use rlx_runtime::batch::{Batch, Layout};
use rlx_runtime::interp::{evaluate, Context, Outcome};
use rlx_runtime::synthetic::{batch as synthetic_batch, Spec};

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
    /// inputs repeat the group's row on each of its responses.
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
}

fn feature_len(shape: &Shape, dim: usize) -> usize {
    match &shape.feature {
        Some(Feature::Dim) => dim,
        Some(Feature::Rubric { len, .. }) => *len as usize,
        _ => 1,
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
                    Level::Pair => panic!("an input at pair level"),
                }
            })
            .collect();
        Padded {
            lengths: (0..responses).map(|r| layout.response_length(r)).collect(),
            groups,
            crits: (0..layout.groups()).map(|g| layout.crit_count(g)).collect(),
            dim: layout.dim,
            inputs,
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
                .map(|rows_of| match rows_of {
                    Rows::Batch(v) => Rows::Batch(v.clone()),
                    Rows::PerResponse(all) => {
                        Rows::PerResponse(rows.iter().map(|&r| all[r].clone()).collect())
                    }
                })
                .collect(),
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
    let manifest_path = dir.join("cases.json");
    let results_path = dir.join("results.json");
    std::fs::write(&manifest_path, json!({ "cases": manifest }).to_string()).unwrap();
    let output = Command::new(&python)
        .arg(root().join("tests/export/driver.py"))
        .arg(&manifest_path)
        .arg(&results_path)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    assert!(
        output.status.success(),
        "driver failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let results: Json =
        serde_json::from_str(&std::fs::read_to_string(&results_path).unwrap()).unwrap();
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
                    for (name, value) in &sub_outcome.metrics {
                        if let Some(got) = given["metrics"][name].as_f64() {
                            checker.number(
                                &format!("loss(advantages) metric {name}"),
                                *value,
                                Some(got),
                            );
                        }
                    }
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
            }
        }
    }
}

#[test]
#[cfg_attr(not(rlx_torch), ignore = "needs torch: run scripts/install-torch.sh")]
fn the_adapters_get_true_lengths_or_fail_loudly() {
    // tests/export/lengths.py: without `response_mask` / `response_length` (evaluate, loss), a
    // `response_length` (verl's compute_score) or `completion_ids` (TRL's reward_funcs), a recipe
    // that reads tokens raises an error naming what is missing; with them the length penalty of
    // dapo.rlx is applied.
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
            },
            Node {
                op: Op::ReduceSum,
                args: vec![NodeId(0)],
                shape: Shape::BATCH,
                elem: Elem::F32,
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
