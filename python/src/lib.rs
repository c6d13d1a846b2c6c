//! `rlx._rlx`, the extension module behind `import rlx` (python/rlx/, docs/python.md): a recipe
//! checked and compiled by the compiler, scored by the runtime's own code (`rlx score`'s reader and
//! document, `rlx_runtime::score`), and run by its JIT kernel on NumPy arrays (`rlx_runtime::arrays`,
//! `Kernel::run_view`: arrays in the kernel's layout and precision are read in place). The Python
//! package adds the torch autograd function and the verl/TRL adapters on top.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use numpy::{PyArray1, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use rlx_compiler::artifact;
use rlx_compiler::hir::Recipe as Declarations;
use rlx_compiler::ir::cut::{self, Given};
use rlx_compiler::ir::Signature;
use rlx_compiler::ir::{Elem, Graph, Level, RolloutInfo, RolloutValueInfo};
use rlx_runtime::arrays::{self, Array, ArrayBatch, ArrayError, Arrays, Defaults, Elements};
use rlx_runtime::score::{self, Backend};
use rlx_runtime::{Column, Context, GpuKernel, Kernel, Options, PackedOutcome, Precision};

/// The command line's diagnostics renderer (miette), compiled here as it is: one renderer for
/// `rlxc check` and `rlx.check`.
#[allow(dead_code)]
#[path = "../../src/diagnostics.rs"]
mod diagnostics;

pyo3::create_exception!(
    _rlx,
    RecipeError,
    PyValueError,
    "A recipe that does not check, or a compiled artifact that does not load: `str(error)` is the rendered report, `error.diagnostics` the structured diagnostics."
);
pyo3::create_exception!(
    _rlx,
    InputError,
    PyValueError,
    "Data the recipe cannot read: `error.key` names the input (or layout key), `error.row` the row of `score(rows)`."
);
pyo3::create_exception!(
    _rlx,
    ScoreError,
    PyValueError,
    "An evaluation that has no finite result (a non-finite loss, metric or gradient; every response dropped by `keep`)."
);

fn input_error(key: Option<&str>, row: Option<usize>, message: String) -> PyErr {
    Python::attach(|py| {
        let error = InputError::new_err(message);
        let value = error.value(py);
        let _ = value.setattr("key", key);
        let _ = value.setattr("row", row);
        error
    })
}

fn array_error(error: ArrayError) -> PyErr {
    let message = error.to_string();
    input_error(error.key.as_deref(), None, message)
}

/// Diagnostics as a `RecipeError` (errors) or as warnings (`None` when there are no errors).
fn diagnostics_error(
    name: &str,
    checked: &rlx_compiler::Checked,
) -> (Option<PyErr>, Vec<(String, String)>) {
    let rendered = diagnostics::render_human(name, &checked.diagnostics, &checked.sources, false);
    let json = diagnostics::to_json_all(&checked.diagnostics, &checked.sources);
    if checked.has_errors() {
        let error = Python::attach(|py| {
            let error = RecipeError::new_err(rendered.trim_end().to_string());
            let structured = json_to_py(py, &serde_json::Value::Array(json));
            if let Ok(structured) = structured {
                let _ = error.value(py).setattr("diagnostics", structured);
            }
            error
        });
        return (Some(error), Vec::new());
    }
    let warnings = checked
        .diagnostics
        .iter()
        .map(|d| {
            let one =
                diagnostics::render_human(name, std::slice::from_ref(d), &checked.sources, false);
            (d.code.to_string(), one.trim_end().to_string())
        })
        .collect();
    (None, warnings)
}

fn json_to_py<'py>(py: Python<'py>, value: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    let json = py.import("json")?;
    json.call_method1("loads", (value.to_string(),))
}

/// Check a recipe: `path` a file, or `source` text named `name`. Raises `RecipeError`; returns the
/// warnings as (code, rendered) pairs.
#[pyfunction]
#[pyo3(signature = (path=None, source=None, name="<source>"))]
fn check(
    path: Option<PathBuf>,
    source: Option<String>,
    name: &str,
) -> PyResult<Vec<(String, String)>> {
    let (checked, label) = checked(path.as_deref(), source.as_deref(), name)?;
    let (error, warnings) = diagnostics_error(&label, &checked);
    match error {
        Some(error) => Err(error),
        None => Ok(warnings),
    }
}

fn checked(
    path: Option<&Path>,
    source: Option<&str>,
    name: &str,
) -> PyResult<(rlx_compiler::Checked, String)> {
    match (path, source) {
        (Some(path), None) => {
            let checked = rlx_compiler::check_path(path).map_err(|e| {
                pyo3::exceptions::PyOSError::new_err(format!("cannot read {}: {e}", path.display()))
            })?;
            Ok((checked, path.display().to_string()))
        }
        (None, Some(text)) => Ok((rlx_compiler::check_source(name, text), name.to_string())),
        _ => Err(PyTypeError::new_err("give a recipe path or its source")),
    }
}

/// A GPU kernel's storage and accumulation precisions and its GPU.
type GpuKey = (&'static str, &'static str, usize);

/// A recipe compiled with its params: what `rlx score` runs, and its kernels.
#[pyclass(module = "rlx._rlx", frozen)]
struct Compiled {
    name: String,
    /// The checked recipe (`None` for a `.rlxc` artifact or a cut graph).
    recipe: Option<Declarations>,
    /// An artifact's graph of its top-level `let`s and rollout expressions (`Artifact::shown`).
    artifact_shown: Option<Graph>,
    /// The recipe's `rollout { … }` settings, as `rlx score` prints them (none for a cut graph).
    rollout: Vec<RolloutInfo>,
    /// What rows and arrays are read against: the recipe's signature, params at their values.
    declarations: Signature,
    overrides: Vec<(String, f64)>,
    graph: Graph,
    /// The kernel for each storage precision of `f32` inputs, compiled on first use.
    kernels: Mutex<HashMap<(&'static str, &'static str), Arc<Kernel>>>,
    /// The same on each GPU (`cuda` feature), its CUDA C compiled and loaded on first use.
    gpu_kernels: Mutex<HashMap<GpuKey, Arc<GpuKernel>>>,
    /// Defaulted inputs' filled columns, kept between calls of one batch size (`arrays::Defaults`).
    defaults: Defaults,
    warnings: Vec<(String, String)>,
    /// For a graph cut at a given value (`Compiled::cut`): its name, and the metrics it lacks.
    stage: Option<&'static str>,
    missing_metrics: Vec<(String, Vec<String>)>,
    reads_groups: bool,
}

fn precision_name(precision: Precision) -> &'static str {
    match precision {
        Precision::F32 => "f32",
        Precision::F64 => "f64",
    }
}

fn storage(name: &str) -> PyResult<Precision> {
    match name {
        "f32" | "float32" => Ok(Precision::F32),
        "f64" | "float64" => Ok(Precision::F64),
        other => Err(PyValueError::new_err(format!(
            "storage `{other}`: the kernels store f32 inputs as float32 or float64"
        ))),
    }
}

fn backend(name: &str) -> PyResult<Backend> {
    match name {
        "jit" => Ok(Backend::Jit),
        "interp" => Ok(Backend::Interp),
        other => match other.strip_prefix("cuda") {
            Some(rest) => {
                let ordinal = match rest.strip_prefix(':') {
                    None if rest.is_empty() => 0,
                    Some(n) => n.parse::<usize>().map_err(|_| {
                        PyValueError::new_err(format!("backend `{other}`: write cuda or cuda:N"))
                    })?,
                    None => {
                        return Err(PyValueError::new_err(format!(
                            "backend `{other}`: write cuda or cuda:N"
                        )))
                    }
                };
                if cfg!(feature = "cuda") {
                    Ok(Backend::Cuda(ordinal))
                } else {
                    Err(PyRuntimeError::new_err(NO_CUDA))
                }
            }
            None => Err(PyValueError::new_err(format!(
                "backend `{other}`: one of jit, interp, cuda, cuda:N"
            ))),
        },
    }
}

const NO_CUDA: &str = "this rlx was built without CUDA: build it with `scripts/build-python.sh --cuda` (the `cuda` feature, docs/gpu.md), or move the tensors to the CPU";

/// A NumPy array held for the length of a call: its readonly borrow keeps the elements in place.
enum Held<'py> {
    F32(PyReadonlyArrayDyn<'py, f32>),
    F64(PyReadonlyArrayDyn<'py, f64>),
    I64(PyReadonlyArrayDyn<'py, i64>),
}

impl<'py> Held<'py> {
    fn extract(key: &str, value: &Bound<'py, PyAny>) -> PyResult<Held<'py>> {
        if let Ok(a) = value.extract::<PyReadonlyArrayDyn<'py, f32>>() {
            return Ok(Held::F32(a));
        }
        if let Ok(a) = value.extract::<PyReadonlyArrayDyn<'py, f64>>() {
            return Ok(Held::F64(a));
        }
        if let Ok(a) = value.extract::<PyReadonlyArrayDyn<'py, i64>>() {
            return Ok(Held::I64(a));
        }
        Err(input_error(
            Some(key),
            None,
            format!(
                "`{key}`: a NumPy array of float32, float64 or int64 was expected, got {}",
                value.get_type().name()?
            ),
        ))
    }

    fn array(&self, key: &str) -> PyResult<Array<'_>> {
        let not_contiguous = || {
            input_error(
                Some(key),
                None,
                format!("`{key}`: the array is not C-contiguous"),
            )
        };
        let (elements, shape) = match self {
            Held::F32(a) => (
                Elements::F32(a.as_slice().map_err(|_| not_contiguous())?),
                a.shape(),
            ),
            Held::F64(a) => (
                Elements::F64(a.as_slice().map_err(|_| not_contiguous())?),
                a.shape(),
            ),
            Held::I64(a) => (
                Elements::I64(a.as_slice().map_err(|_| not_contiguous())?),
                a.shape(),
            ),
        };
        Ok(Array {
            elements,
            shape: shape.to_vec(),
        })
    }
}

/// The arrays of a call, held.
fn hold<'py>(arrays: &Bound<'py, PyDict>) -> PyResult<Vec<(String, Held<'py>)>> {
    let mut held = Vec::with_capacity(arrays.len());
    for (key, value) in arrays.iter() {
        let key: String = key.extract()?;
        let array = Held::extract(&key, &value)?;
        held.push((key, array));
    }
    Ok(held)
}

fn arrays_of<'a>(held: &'a [(String, Held<'_>)]) -> PyResult<Arrays<'a>> {
    let mut arrays = Arrays::default();
    for (key, array) in held {
        let array = array.array(key)?;
        match key.as_str() {
            "index" => arrays.index = Some(array),
            "group_sizes" => arrays.group_sizes = Some(array),
            "lengths" => arrays.lengths = Some(array),
            "response_mask" => arrays.response_mask = Some(array),
            "crit_counts" => arrays.crit_counts = Some(array),
            _ => arrays.inputs.push((key.clone(), array)),
        }
    }
    Ok(arrays)
}

fn score_error(message: String) -> PyErr {
    ScoreError::new_err(message)
}

impl Compiled {
    /// Refuse `what` on a cut recipe (its graph no longer matches the recipe's declarations).
    fn whole(&self, what: &str) -> PyResult<()> {
        match self.stage {
            None => Ok(()),
            Some(stage) => Err(PyValueError::new_err(format!(
                "{what} takes the whole recipe, and this is its {stage}"
            ))),
        }
    }

    /// The kernel on GPU `ordinal` (the `cuda` feature), compiled and loaded on its first call there.
    fn gpu_kernel(
        &self,
        precision: Precision,
        accumulate: Precision,
        ordinal: usize,
    ) -> PyResult<Arc<GpuKernel>> {
        let key = (
            precision_name(precision),
            precision_name(accumulate),
            ordinal,
        );
        let mut kernels = self.gpu_kernels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(kernel) = kernels.get(&key) {
            return Ok(kernel.clone());
        }
        let options = Options {
            accumulate,
            storage: precision,
        };
        let kernel = GpuKernel::new(&self.graph, &options, ordinal).map_err(|e| {
            PyRuntimeError::new_err(format!("recipe `{}` on cuda:{ordinal}: {e}", self.name))
        })?;
        let kernel = Arc::new(kernel);
        kernels.insert(key, kernel.clone());
        Ok(kernel)
    }

    fn kernel(&self, precision: Precision, accumulate: Precision) -> PyResult<Arc<Kernel>> {
        let mut kernels = self.kernels.lock().unwrap_or_else(|e| e.into_inner());
        let key = (precision_name(precision), precision_name(accumulate));
        if let Some(kernel) = kernels.get(&key) {
            return Ok(kernel.clone());
        }
        let options = Options {
            accumulate,
            storage: precision,
        };
        let kernel = Kernel::compile(&self.graph, &options).map_err(|e| {
            PyRuntimeError::new_err(format!(
                "the JIT cannot compile recipe `{}`: {e}",
                self.name
            ))
        })?;
        let kernel = Arc::new(kernel);
        kernels.insert(key, kernel.clone());
        Ok(kernel)
    }

    /// The graph `score_read` evaluates for `show` and the rollout expressions, as `rlx score` does.
    fn shown(&self, show: &[String]) -> PyResult<Option<Graph>> {
        let expressions = self
            .rollout
            .iter()
            .any(|s| matches!(s.value, RolloutValueInfo::Expression));
        match (&self.recipe, &self.artifact_shown) {
            (Some(recipe), _) => score::shown_graph(recipe, &self.graph, &self.overrides, show)
                .map_err(|e| input_error(Some("show"), None, e)),
            (None, Some(shown)) if expressions || !show.is_empty() => Ok(Some(shown.clone())),
            _ => Ok(None),
        }
    }

    /// `rlx score`'s document on rows already read (`score::score_read`, without the GIL), with the
    /// graph of `shown` values ([`Compiled::shown`]).
    fn score_document(
        &self,
        py: Python<'_>,
        read: rlx_runtime::rollouts::Rollouts,
        grad: bool,
        backend: Backend,
        show: &[String],
        shown: Option<Graph>,
    ) -> PyResult<Py<PyAny>> {
        let graph = &self.graph;
        let declarations = &self.declarations;
        let rollout = &self.rollout;
        let scored = py
            .detach(|| {
                score::score_read(
                    graph,
                    shown.as_ref(),
                    declarations,
                    read,
                    grad,
                    backend,
                    show,
                    &Context::default(),
                    rollout,
                )
            })
            .map_err(|e| score_error(e.to_string()))?;
        self.document(py, scored)
    }

    fn document(&self, py: Python<'_>, scored: score::Scored) -> PyResult<Py<PyAny>> {
        let document = json_to_py(py, &scored.document)?;
        let warnings: Vec<String> = scored.fallback.into_iter().chain(scored.warnings).collect();
        Ok(
            PyList::new(py, [document, warnings.into_pyobject(py)?.into_any()])?
                .into_any()
                .unbind(),
        )
    }
}

#[pymethods]
impl Compiled {
    /// `path` (a `.rlx` recipe or a `.rlxc` artifact) or `source` text named `name`; `params` override
    /// the recipe's param defaults.
    #[new]
    #[pyo3(signature = (path=None, source=None, name="<source>", params=Vec::new()))]
    fn new(
        path: Option<PathBuf>,
        source: Option<String>,
        name: &str,
        params: Vec<(String, f64)>,
    ) -> PyResult<Compiled> {
        if let (Some(path), None) = (&path, &source) {
            if artifact::is_artifact_path(path) {
                let loaded =
                    artifact::load(path).map_err(|e| RecipeError::new_err(e.to_string()))?;
                let graph = loaded
                    .graph_with(&params)
                    .map_err(|e| RecipeError::new_err(e.to_string()))?
                    .clone();
                let declarations = loaded.signature();
                return Ok(Compiled {
                    name: loaded.recipe.clone(),
                    recipe: None,
                    artifact_shown: Some(loaded.shown.clone()),
                    rollout: loaded.rollout.clone(),
                    declarations,
                    overrides: params,
                    graph,
                    kernels: Mutex::new(HashMap::new()),
                    gpu_kernels: Mutex::new(HashMap::new()),
                    defaults: Defaults::default(),
                    warnings: Vec::new(),
                    stage: None,
                    missing_metrics: Vec::new(),
                    reads_groups: true,
                });
            }
        }
        let (checked, label) = checked(path.as_deref(), source.as_deref(), name)?;
        let (error, warnings) = diagnostics_error(&label, &checked);
        if let Some(error) = error {
            return Err(error);
        }
        let recipe = checked
            .recipe
            .ok_or_else(|| RecipeError::new_err(format!("{label}: the recipe does not check")))?;
        let graph = rlx_compiler::compile_graph(&recipe, &params)
            .map_err(|e| PyValueError::new_err(format!("{label}: {e}")))?;
        let name = match &path {
            Some(path) => path
                .file_stem()
                .map(|s| s.to_string_lossy().to_string())
                .unwrap_or_default(),
            None => name.to_string(),
        };
        let rollout = rlx_compiler::ir::rollout_settings(&recipe, &graph);
        Ok(Compiled {
            name,
            declarations: rlx_compiler::ir::lower::param_values(&recipe, &params)
                .map(|values| rlx_compiler::ir::lower::signature(&recipe, &values))
                .map_err(|e| PyValueError::new_err(format!("{label}: {e}")))?,
            recipe: Some(recipe),
            artifact_shown: None,
            rollout,
            overrides: params,
            graph,
            kernels: Mutex::new(HashMap::new()),
            gpu_kernels: Mutex::new(HashMap::new()),
            defaults: Defaults::default(),
            warnings,
            stage: None,
            missing_metrics: Vec::new(),
            reads_groups: true,
        })
    }

    /// The recipe cut where a trainer gives `given` ("advantage": the loss from the trainer's
    /// advantages; "reward": the advantage from its rewards), reading only inputs with a default and
    /// those named in `available` (`rlx_compiler::ir::cut`).
    fn cut(&self, given: &str, available: Vec<String>) -> PyResult<Compiled> {
        let (given, stage) = match given {
            "advantage" => (Given::Advantage, "loss given advantage"),
            "reward" => (Given::Reward, "advantage given reward"),
            other => {
                return Err(PyValueError::new_err(format!(
                    "cut at `{other}`: the given value is \"advantage\" or \"reward\""
                )))
            }
        };
        let available: Vec<&str> = available.iter().map(String::as_str).collect();
        let cut = cut::cut(&self.graph, given, &available)
            .map_err(|e| PyValueError::new_err(format!("recipe `{}`: {e}", self.name)))?;
        Ok(Compiled {
            name: self.name.clone(),
            recipe: None,
            artifact_shown: None,
            rollout: Vec::new(),
            declarations: self.declarations.clone(),
            overrides: self.overrides.clone(),
            graph: cut.graph,
            kernels: Mutex::new(HashMap::new()),
            gpu_kernels: Mutex::new(HashMap::new()),
            defaults: Defaults::default(),
            warnings: Vec::new(),
            stage: Some(stage),
            missing_metrics: cut.missing_metrics,
            reads_groups: cut.reads_groups,
        })
    }

    /// Synthetic rollouts for this recipe (`rlx_runtime::synthetic`, the batches of rlx's own tests and
    /// `rlx bench`) as JSON lines: `groups` groups of `responses` (the first a singleton when
    /// `singleton`), about `tokens` tokens each (ragged when `ragged`).
    #[pyo3(signature = (groups=3, responses=4, tokens=5, seed=1, ragged=true, singleton=false))]
    fn synthetic_rows(
        &self,
        groups: usize,
        responses: usize,
        tokens: usize,
        seed: u64,
        ragged: bool,
        singleton: bool,
    ) -> PyResult<String> {
        self.whole("synthetic_rows")?;
        if groups == 0
            || responses == 0
            || groups
                .saturating_mul(responses)
                .saturating_mul(tokens.max(1))
                > 1 << 26
        {
            return Err(PyValueError::new_err(
                "synthetic_rows: at least one group and response, at most 2^26 tokens",
            ));
        }
        let spec = rlx_runtime::synthetic::Spec {
            groups,
            responses,
            tokens,
            ragged,
            singleton,
            criteria: 3,
            dim: 4,
            seed,
        };
        let batch = rlx_runtime::synthetic::batch(&self.graph, &spec);
        Ok(rlx_runtime::synthetic::to_jsonl(&self.graph, &batch))
    }

    /// For a cut recipe, the metrics it cannot compute and the inputs each lacks.
    #[getter]
    fn missing_metrics(&self) -> Vec<(String, Vec<String>)> {
        self.missing_metrics.clone()
    }

    /// Whether the (cut) recipe reads the group structure (always true for a whole recipe).
    #[getter]
    fn reads_groups(&self) -> bool {
        self.reads_groups
    }

    /// For a cut recipe, which stage it is ("loss given advantage", "advantage given reward").
    #[getter]
    fn stage(&self) -> Option<&'static str> {
        self.stage
    }

    #[getter]
    fn name(&self) -> String {
        self.name.clone()
    }

    /// The checker's warnings, as (code, rendered) pairs.
    #[getter]
    fn warnings(&self) -> Vec<(String, String)> {
        self.warnings.clone()
    }

    /// The inputs in order: (name, type, elem, level, feature, differentiable, default).
    #[getter]
    #[allow(clippy::type_complexity)]
    fn inputs(
        &self,
    ) -> Vec<(
        String,
        String,
        &'static str,
        &'static str,
        Option<String>,
        bool,
        Option<f64>,
    )> {
        self.graph
            .inputs
            .iter()
            .map(|input| {
                let feature = input
                    .shape
                    .feature
                    .as_ref()
                    .map(|f| rlx_compiler::ir::print::feature_text(&self.graph, f));
                let ty = match &feature {
                    None => format!("{}[{}]", input.elem.name(), input.shape.level.name()),
                    Some(f) => format!("{}[{}, {f}]", input.elem.name(), input.shape.level.name()),
                };
                let ty = match input.shape.level {
                    Level::Batch if feature.is_none() => input.elem.name().to_string(),
                    _ => ty,
                };
                (
                    input.name.clone(),
                    ty,
                    input.elem.name(),
                    input.shape.level.name(),
                    feature,
                    input.differentiable,
                    input.default,
                )
            })
            .collect()
    }

    /// The params: (name, elem, declared default, value compiled in).
    #[getter]
    fn params(&self) -> Vec<(String, &'static str, f64, f64)> {
        self.declarations
            .params
            .iter()
            .map(|p| (p.name.clone(), elem_name(p.elem), p.default, p.value))
            .collect()
    }

    /// Which sections the recipe has: (reward, advantage, loss).
    #[getter]
    fn sections(&self) -> (bool, bool, bool) {
        let o = &self.graph.outputs;
        (o.reward.is_some(), o.advantage.is_some(), o.loss.is_some())
    }

    /// The metrics' names, in order.
    #[getter]
    fn metrics(&self) -> Vec<String> {
        self.graph
            .outputs
            .metrics
            .iter()
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// `rlx score` on rows given as JSON lines (one row per line): [document, warnings]. An error in
    /// the rows raises `InputError` naming the row (0-based) and key.
    #[pyo3(signature = (jsonl, grad=false, show=Vec::new(), backend_name="jit"))]
    fn score_rows(
        &self,
        py: Python<'_>,
        jsonl: &str,
        grad: bool,
        show: Vec<String>,
        backend_name: &str,
    ) -> PyResult<Py<PyAny>> {
        let backend = backend(backend_name)?;
        self.whole("score(rows)")?;
        let shown = self.shown(&show)?;
        let mut read =
            rlx_runtime::rollouts::read_rollouts(jsonl, &self.declarations).map_err(|e| {
                let row = e.line.map(|l| l - 1);
                let place = match (row, &e.key) {
                    (Some(row), Some(key)) => format!("rows[{row}], key `{key}`: "),
                    (Some(row), None) => format!("rows[{row}]: "),
                    (None, Some(key)) => format!("key `{key}`: "),
                    (None, None) => String::new(),
                };
                input_error(e.key.as_deref(), row, format!("{place}{}", e.message))
            })?;
        // The recipe's `state`s read their initial values (with the params as compiled), as in `rlx score`.
        score::set_state(&self.graph, &mut read.batch, &[]).map_err(score_error)?;
        self.score_document(py, read, grad, backend, &show, shown)
    }

    /// `rlx score` on arrays (`rlx_runtime::arrays`): [document, warnings].
    #[pyo3(signature = (arrays, grad=false, show=Vec::new(), backend_name="jit"))]
    fn score_arrays(
        &self,
        py: Python<'_>,
        arrays: &Bound<'_, PyDict>,
        grad: bool,
        show: Vec<String>,
        backend_name: &str,
    ) -> PyResult<Py<PyAny>> {
        let backend = backend(backend_name)?;
        if !show.is_empty() {
            self.whole("show")?;
        }
        let shown = self.shown(&show)?;
        let held = hold(arrays)?;
        let arrays = arrays_of(&held)?;
        let batch =
            arrays::from_arrays(&self.graph, &arrays, Precision::F64).map_err(array_error)?;
        let read = batch.to_rollouts();
        drop(batch);
        self.score_document(py, read, grad, backend, &show, shown)
    }

    /// Run the kernel on arrays (the torch path): `f32` inputs stored in `storage` ("f32"/"f64"),
    /// element-wise arithmetic in `accumulate` ("f64", the default, or "f32": faster, less exact; sums
    /// are f64 either way, docs/kernels.md); an array already in the kernel's layout and storage is read in place. Returns a dict: `loss`,
    /// `metrics` (name → value), `reward`, `advantage` (per response, or None), `kept` (bool per
    /// response), `grad` (input name → gradient laid out like the input's array, in `storage`).
    ///
    /// `device`: run on GPU `device` (the `cuda` feature) instead, the arrays being the host copies of
    /// the caller's CUDA tensors; `device_addresses` maps an input's name to its tensor's address on
    /// that GPU, read there in place of a copy when its array is in the kernel's layout and storage
    /// (the same values as the array: the binding passes `tensor.data_ptr()` of the tensor it copied).
    #[pyo3(signature = (arrays, storage_name="f32", step=0.0, progress=0.0, device=None, accumulate_name="f64", device_addresses=None))]
    #[allow(clippy::too_many_arguments)]
    fn run<'py>(
        &self,
        py: Python<'py>,
        arrays: &Bound<'py, PyDict>,
        storage_name: &str,
        step: f64,
        progress: f64,
        device: Option<usize>,
        accumulate_name: &str,
        device_addresses: Option<HashMap<String, u64>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let precision = storage(storage_name)?;
        let accumulate = storage(accumulate_name)?;
        if device.is_some() && !cfg!(feature = "cuda") {
            return Err(PyRuntimeError::new_err(NO_CUDA));
        }
        let held = hold(arrays)?;
        let arrays = arrays_of(&held)?;
        let (graph, defaults) = (&self.graph, &self.defaults);
        // The layout and the checks (every value read) without the GIL, as the kernel.
        let batch = py
            .detach(|| arrays::from_arrays_with(graph, &arrays, precision, defaults))
            .map_err(array_error)?;
        let context = Context { step, progress };
        let columns = batch.columns();
        let layout = &batch.layout;
        let outcome = match device {
            None => {
                let kernel = self.kernel(precision, accumulate)?;
                py.detach(|| kernel.run_view(layout, &columns, &context))
                    .map_err(|e| score_error(e.to_string()))?
            }
            Some(ordinal) => {
                let kernel = self.gpu_kernel(precision, accumulate, ordinal)?;
                // A device address stands for an input only where the array is read in place (its
                // values are the kernel's column as they are); others are copied from the host.
                let addresses: Vec<Option<u64>> = self
                    .graph
                    .inputs
                    .iter()
                    .zip(&batch.inputs)
                    .map(|(info, input)| match input {
                        arrays::Input::Borrowed(_) => device_addresses
                            .as_ref()
                            .and_then(|a| a.get(&info.name).copied()),
                        _ => None,
                    })
                    .collect();
                // SAFETY: each address is the `data_ptr()` of the CUDA tensor whose host copy is
                // the borrowed array (python/rlx/_torch.py passes them so), on GPU `ordinal`, and
                // the caller holds the tensors for the call.
                py.detach(|| unsafe {
                    kernel.run_view_on_device(layout, &columns, &addresses, &context)
                })
                .map_err(|e| score_error(e.to_string()))?
            }
        };
        drop(columns);
        self.outcome_dict(py, &batch, outcome)
    }
}

impl Compiled {
    fn outcome_dict<'py>(
        &self,
        py: Python<'py>,
        batch: &ArrayBatch<'_>,
        outcome: PackedOutcome,
    ) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        out.set_item("loss", outcome.loss)?;
        let metrics = PyDict::new(py);
        for (name, value) in &outcome.metrics {
            metrics.set_item(name, value)?;
        }
        out.set_item("metrics", metrics)?;
        out.set_item("reward", outcome.reward.map(|r| PyArray1::from_vec(py, r)))?;
        out.set_item(
            "advantage",
            outcome.advantage.map(|a| PyArray1::from_vec(py, a)),
        )?;
        out.set_item("kept", PyArray1::from_vec(py, outcome.kept))?;
        let grads = PyDict::new(py);
        for (name, column) in outcome.gradients {
            let index = self
                .graph
                .inputs
                .iter()
                .position(|i| i.name == name)
                .ok_or_else(|| PyRuntimeError::new_err(format!("internal: no input `{name}`")))?;
            let column = batch
                .spread(index, column.as_column_ref())
                .unwrap_or(column);
            let shape: Vec<usize> = batch
                .shape(index)
                .map(<[usize]>::to_vec)
                .unwrap_or_else(|| vec![column.len()]);
            let array = match column {
                Column::F32(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
                Column::F64(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
            };
            grads.set_item(name, array)?;
        }
        out.set_item("grad", grads)?;
        Ok(out)
    }
}

fn elem_name(elem: Elem) -> &'static str {
    elem.name()
}

/// Whether this build has the CUDA backend.
#[pyfunction]
fn has_cuda() -> bool {
    cfg!(feature = "cuda")
}

#[pymodule]
fn _rlx(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(check, m)?)?;
    m.add_function(wrap_pyfunction!(has_cuda, m)?)?;
    m.add_class::<Compiled>()?;
    m.add("RecipeError", m.py().get_type::<RecipeError>())?;
    m.add("InputError", m.py().get_type::<InputError>())?;
    m.add("ScoreError", m.py().get_type::<ScoreError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("NO_CUDA", NO_CUDA)?;
    Ok(())
}
