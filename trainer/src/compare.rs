//! `rlx compare`: several finished runs side by side (docs/experiments.md). The runs are grouped by
//! recipe (the file name of the recipe each run recorded in `run.json`); for each chosen metric the
//! report has every run's value before the first step (`summary.json`'s `eval_before`) and at its last
//! step that logged it (`metrics.jsonl`), the mean ± standard deviation and the range over each
//! recipe's seeds, and a plot of the curves (the mean over seeds, with the range over seeds shaded).
//!
//! Written into the output folder: `results.json` (one object per run: `recipe`, `seed`, `run` and
//! the final value of each metric under its short name), `table.md` and `curves.png`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use crate::plot::{self, Panel};

/// A metric to compare: its short name (in results.json and the table) and its metrics key.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricSpec {
    pub name: String,
    pub key: String,
}

impl MetricSpec {
    /// `NAME=KEY` (`quality=eval/quality`), or a bare `KEY` (its short name is the part after the last
    /// `/`).
    pub fn parse(text: &str) -> Result<MetricSpec, String> {
        let (name, key) = match text.split_once('=') {
            Some((name, key)) => (name.trim().to_string(), key.trim().to_string()),
            None => (
                text.rsplit('/').next().unwrap_or(text).to_string(),
                text.to_string(),
            ),
        };
        if name.is_empty() || key.is_empty() {
            return Err(format!(
                "--metric {text:?}: write NAME=KEY (e.g. quality=eval/quality) or KEY"
            ));
        }
        Ok(MetricSpec { name, key })
    }
}

/// One finished run, as read from its directory.
#[derive(Clone, Debug)]
pub struct RunRecord {
    pub dir: PathBuf,
    pub recipe: String,
    pub seed: u64,
    /// (x, value) of each metric, x = 0 before the first step and step + 1 after a step.
    pub curves: Vec<Vec<(f64, f64)>>,
}

/// The largest run file `rlx compare` reads (metrics.jsonl of a long run is a few MB).
const MAX_FILE_BYTES: u64 = 256 << 20;

fn read(path: &Path) -> Result<String, String> {
    rlx_compiler::files::read_text(path, MAX_FILE_BYTES)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))
}

fn json_of(path: &Path) -> Result<Value, String> {
    serde_json::from_str(&read(path)?).map_err(|e| format!("{}: not JSON ({e})", path.display()))
}

/// Read the run in `dir`: its recipe (run.json), seed (config.toml), evaluation before the first
/// step (summary.json: the run must have finished) and metrics lines.
pub fn read_run(dir: &Path, metrics: &[MetricSpec]) -> Result<RunRecord, String> {
    if !dir.is_dir() {
        return Err(format!(
            "{}: not a run directory (no such directory)",
            dir.display()
        ));
    }
    let summary_path = dir.join("summary.json");
    if !summary_path.is_file() {
        return Err(format!(
            "{}: no summary.json, so the run has not finished (resume it with `rlx run RECIPE --resume {}`)",
            dir.display(),
            dir.display()
        ));
    }
    let record_path = dir.join(crate::run_dir::RECORD_FILE);
    let record = json_of(&record_path)?;
    let recipe = record["recipe"][0]["path"]
        .as_str()
        .map(|p| {
            Path::new(p)
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| p.to_string())
        })
        .ok_or_else(|| format!("{}: no recipe path", record_path.display()))?;
    let config_path = dir.join("config.toml");
    let config: toml::Table = toml::from_str(&read(&config_path)?)
        .map_err(|e| format!("{}: {}", config_path.display(), e.message()))?;
    let seed = config
        .get("seed")
        .and_then(toml::Value::as_integer)
        .and_then(|s| u64::try_from(s).ok())
        .ok_or_else(|| format!("{}: no `seed`", config_path.display()))?;
    let summary = json_of(&summary_path)?;
    let before = summary["eval_before"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let metrics_path = dir.join("metrics.jsonl");
    let mut lines = Vec::new();
    for (k, line) in read(&metrics_path)?.lines().enumerate() {
        match serde_json::from_str::<Value>(line) {
            Ok(Value::Object(map)) => lines.push(map),
            _ => {
                return Err(format!(
                    "{} line {}: not a JSON object",
                    metrics_path.display(),
                    k + 1
                ))
            }
        }
    }
    let value = |line: &Map<String, Value>, key: &str| {
        line.get(key)
            .and_then(Value::as_f64)
            .filter(|v| v.is_finite())
    };
    let curves = metrics
        .iter()
        .map(|m| {
            let first = value(&before, &m.key).map(|v| (0.0, v));
            let later = lines.iter().filter_map(|line| {
                let step = line.get("step")?.as_u64()? as f64;
                Some((step + 1.0, value(line, &m.key)?))
            });
            first.into_iter().chain(later).collect::<Vec<_>>()
        })
        .collect::<Vec<_>>();
    for (m, curve) in metrics.iter().zip(&curves) {
        if curve.is_empty() {
            let known: Vec<&String> = before
                .keys()
                .chain(lines.iter().flat_map(|l| l.keys()))
                .collect();
            let mut known: Vec<&str> = known.into_iter().map(String::as_str).collect();
            known.sort();
            known.dedup();
            let hint = match rlx_compiler::diagnostic::closest_name(&m.key, known.iter().copied()) {
                Some(k) => format!(" (did you mean `{k}`?)"),
                None => String::new(),
            };
            return Err(format!(
                "{}: no step logged the metric `{}`{hint}",
                dir.display(),
                m.key
            ));
        }
    }
    Ok(RunRecord {
        dir: dir.to_path_buf(),
        recipe,
        seed,
        curves,
    })
}

/// Mean, sample standard deviation (0 for one value), min and max.
pub fn spread(values: &[f64]) -> (f64, f64, f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = if values.len() > 1 {
        values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (mean, var.sqrt(), min, max)
}

/// The report of `runs` (each read with `metrics`) into `out`: results.json, table.md, curves.png.
/// Recipes keep the order in which their first run is given.
pub fn write_report(
    runs: &[RunRecord],
    metrics: &[MetricSpec],
    title: &str,
    out: &Path,
) -> Result<(), String> {
    if runs.is_empty() {
        return Err("rlx compare: no runs".into());
    }
    std::fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let write = |name: &str, text: &str| {
        let path = out.join(name);
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
    };
    let mut order: Vec<&str> = Vec::new();
    let mut by_recipe: BTreeMap<&str, Vec<&RunRecord>> = BTreeMap::new();
    for run in runs {
        if !order.contains(&run.recipe.as_str()) {
            order.push(&run.recipe);
        }
        by_recipe.entry(&run.recipe).or_default().push(run);
    }
    for (recipe, group) in &by_recipe {
        let mut seeds: Vec<u64> = group.iter().map(|r| r.seed).collect();
        seeds.sort();
        if let Some(w) = seeds.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!(
                "rlx compare: two runs of {recipe} have seed {}; give each seed once",
                w[0]
            ));
        }
    }

    // results.json: one object per run.
    let results: Vec<Value> = runs
        .iter()
        .map(|run| {
            let mut object = Map::new();
            object.insert("recipe".into(), json!(run.recipe));
            object.insert("seed".into(), json!(run.seed));
            for (m, curve) in metrics.iter().zip(&run.curves) {
                object.insert(m.name.clone(), json!(curve.last().map(|p| p.1)));
            }
            object.insert("run".into(), json!(run.dir.display().to_string()));
            Value::Object(object)
        })
        .collect();
    write("results.json", &format!("{:#}\n", Value::Array(results)))?;

    // table.md: per recipe, before and final (mean ± sd [min, max] over seeds), then every run.
    let number = |v: f64| format!("{v:.3}");
    let mut table = String::new();
    table.push_str("| recipe | seeds |");
    for m in metrics {
        table.push_str(&format!(" {} before | {} final |", m.name, m.name));
    }
    table.push_str("\n|---|---|");
    for _ in metrics {
        table.push_str("---|---|");
    }
    table.push('\n');
    for recipe in &order {
        let group = &by_recipe[recipe];
        table.push_str(&format!("| {recipe} | {} |", group.len()));
        for k in 0..metrics.len() {
            for pick in [first_point, last_point] {
                let values: Vec<f64> = group.iter().filter_map(|r| pick(&r.curves[k])).collect();
                if values.is_empty() {
                    table.push_str(" — |");
                    continue;
                }
                let (mean, sd, min, max) = spread(&values);
                if values.len() > 1 {
                    table.push_str(&format!(
                        " {} ± {} [{}, {}] |",
                        number(mean),
                        number(sd),
                        number(min),
                        number(max)
                    ));
                } else {
                    table.push_str(&format!(" {} |", number(mean)));
                }
            }
        }
        table.push('\n');
    }
    table.push_str("\nEvery run (the value before the first step → at the last evaluation):\n\n| recipe | seed |");
    for m in metrics {
        table.push_str(&format!(" {} |", m.name));
    }
    table.push_str(" run |\n|---|---|");
    for _ in metrics {
        table.push_str("---|");
    }
    table.push_str("---|\n");
    for run in runs {
        table.push_str(&format!("| {} | {} |", run.recipe, run.seed));
        for curve in &run.curves {
            let show = |p: Option<f64>| p.map(number).unwrap_or_else(|| "—".into());
            table.push_str(&format!(
                " {} → {} |",
                show(first_point(curve)),
                show(last_point(curve))
            ));
        }
        table.push_str(&format!(" {} |\n", run.dir.display()));
    }
    write("table.md", &table)?;

    // curves.png: one panel per metric; per recipe the mean over its seeds at each x every seed
    // logged, with the range over seeds shaded.
    let panels: Vec<Panel> = metrics
        .iter()
        .enumerate()
        .map(|(k, m)| {
            let mut series = Vec::new();
            let mut bands = Vec::new();
            for (c, recipe) in order.iter().enumerate() {
                let color = plot::COLORS[c % plot::COLORS.len()];
                let group = &by_recipe[recipe];
                let mut xs: Vec<f64> = group[0].curves[k].iter().map(|p| p.0).collect();
                xs.retain(|x| group.iter().all(|r| r.curves[k].iter().any(|p| p.0 == *x)));
                let stats: Vec<(f64, (f64, f64, f64, f64))> = xs
                    .iter()
                    .map(|&x| {
                        let values: Vec<f64> = group
                            .iter()
                            .filter_map(|r| r.curves[k].iter().find(|p| p.0 == x).map(|p| p.1))
                            .collect();
                        (x, spread(&values))
                    })
                    .collect();
                let name = if group.len() > 1 {
                    format!("{recipe} ({} seeds)", group.len())
                } else {
                    recipe.to_string()
                };
                series.push((name, color, stats.iter().map(|(x, s)| (*x, s.0)).collect()));
                if group.len() > 1 {
                    bands.push((color, stats.iter().map(|(x, s)| (*x, s.2, s.3)).collect()));
                }
            }
            Panel {
                title: format!("{} ({})", m.name, m.key),
                series,
                bands,
            }
        })
        .collect();
    plot::write_png(&out.join("curves.png"), title, &panels)
}

fn first_point(curve: &[(f64, f64)]) -> Option<f64> {
    curve.first().filter(|p| p.0 == 0.0).map(|p| p.1)
}

fn last_point(curve: &[(f64, f64)]) -> Option<f64> {
    curve.last().map(|p| p.1)
}
