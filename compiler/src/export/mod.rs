//! Export a recipe to other engines (`rlxc compile --emit torch`): a self-contained PyTorch module,
//! generated from the IR, for verl and TRL (see docs/scale.md).
//!
//! Params stay symbolic: the recipe is lowered with every `param` turned into a batch-level input,
//! so the module's `PARAMS` (the recipe's defaults, or the `--set` values) can be overridden at run
//! time without the folding that the interpreter's graph applies. Gradients come from torch autograd;
//! the emitted code follows the IR's subgradient conventions so that they equal rlx's ∂loss/∂input.

pub mod sha256;
pub mod torch;

use std::collections::HashMap;

use crate::check::hir::{self, Expr, ExprKind, GlobalKind, InputId};
use crate::check::types::{Level, Ty};
use crate::ir::{Graph, NodeId};

/// Why a recipe cannot be exported: the feature the exporter does not support, and a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportError {
    /// The op or feature, e.g. `a token-level value with a feature axis` (empty for a usage error such
    /// as an unknown param).
    pub feature: String,
    pub message: String,
}

impl std::fmt::Display for ExportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.feature.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(
                f,
                "the torch exporter does not support {}: {}",
                self.feature, self.message
            )
        }
    }
}

impl std::error::Error for ExportError {}

/// What names the module and its source.
#[derive(Clone, Debug, Default)]
pub struct ModuleInfo {
    /// The recipe's name, e.g. `dapo` (the file stem); the module registers itself as `rlx_<name>`.
    pub recipe: String,
    /// The source file as given on the command line.
    pub source: String,
    /// SHA-256 of the source file's text.
    pub source_sha256: String,
    /// The rlxc version that generated the module.
    pub version: String,
}

impl ModuleInfo {
    pub fn new(recipe: &str, source: &str, text: &str) -> ModuleInfo {
        ModuleInfo {
            recipe: recipe.to_string(),
            source: source.to_string(),
            source_sha256: sha256::hex_digest(text.as_bytes()),
            version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }
}

/// The IR of a recipe with its params as inputs, and names for its nodes.
pub struct SymbolicGraph {
    pub graph: Graph,
    /// How many of `graph.inputs` are the recipe's own inputs; the rest are its params, in order.
    pub recipe_inputs: usize,
    /// The `let` (and `reward`/`advantage`) names of nodes, where the recipe named them.
    pub names: HashMap<NodeId, String>,
}

/// A checked recipe as a PyTorch module, with `overrides` applied to the params' defaults.
pub fn recipe_to_torch(
    recipe: &hir::Recipe,
    overrides: &[(String, f64)],
    info: &ModuleInfo,
) -> Result<String, ExportError> {
    let symbolic = symbolic_graph(recipe, overrides)?;
    torch::emit(&symbolic, info)
}

/// Lower `recipe` with every param turned into a batch-level input whose default is the param's value.
pub fn symbolic_graph(
    recipe: &hir::Recipe,
    overrides: &[(String, f64)],
) -> Result<SymbolicGraph, ExportError> {
    let values =
        crate::ir::lower::param_values(recipe, overrides).map_err(|message| ExportError {
            feature: String::new(),
            message,
        })?;
    let mut symbolic = recipe.clone();
    let base = symbolic.inputs.len() as u32;
    for (param, value) in recipe.params.iter().zip(&values) {
        symbolic.inputs.push(hir::Input {
            name: param.name.clone(),
            ty: Ty::new(param.elem, Level::Batch),
            role: None,
            default: Some(*value),
            span: param.span,
        });
    }
    for global in &mut symbolic.globals {
        params_to_inputs(&mut global.expr, base);
    }
    if let Some(loss) = &mut symbolic.loss {
        params_to_inputs(loss, base);
    }
    for metric in &mut symbolic.metrics {
        params_to_inputs(&mut metric.expr, base);
    }
    for keep in &mut symbolic.keeps {
        params_to_inputs(&mut keep.condition, base);
    }
    for state in &mut symbolic.states {
        params_to_inputs(&mut state.update, base);
    }
    // Name the nodes of `let`s: lower each global as an extra metric, note its node, drop it again.
    let real_metrics = symbolic.metrics.len();
    for (index, global) in recipe.globals.iter().enumerate() {
        let name = match global.kind {
            GlobalKind::Let => global.name.clone(),
            GlobalKind::Reward => "reward".to_string(),
            GlobalKind::Advantage => "advantage".to_string(),
        };
        symbolic.metrics.push(hir::Metric {
            name,
            expr: Expr {
                kind: ExprKind::Global(hir::GlobalId(index as u32)),
                ty: global.expr.ty.clone(),
                grad: global.expr.grad,
                span: global.expr.span,
                file: global.expr.file,
            },
        });
    }
    let mut graph = crate::ir::lower::lower(&symbolic, &values);
    // The state updates come after every metric (`lower`); keep them, drop the names.
    let updates = graph.outputs.metrics.len() - recipe.states.len();
    let updates: Vec<(String, NodeId)> = graph.outputs.metrics.split_off(updates);
    let named: Vec<(String, NodeId)> = graph.outputs.metrics.split_off(real_metrics);
    graph.outputs.metrics.extend(updates);
    let live = graph.cone(&graph.output_nodes());
    let mut renumber = vec![None; graph.nodes.len()];
    let mut next = 0u32;
    for (index, alive) in live.iter().enumerate() {
        if *alive {
            renumber[index] = Some(NodeId(next));
            next += 1;
        }
    }
    let mut names = HashMap::new();
    for (name, node) in named {
        if let Some(id) = renumber[node.0 as usize] {
            names.entry(id).or_insert(name);
        }
    }
    graph.eliminate_dead_code();
    Ok(SymbolicGraph {
        graph,
        recipe_inputs: base as usize,
        names,
    })
}

/// Replace every `param` reference by the input that stands for it.
fn params_to_inputs(expr: &mut Expr, base: u32) {
    if let ExprKind::Param(id) = expr.kind {
        expr.kind = ExprKind::Input(InputId(base + id.0));
        return;
    }
    match &mut expr.kind {
        ExprKind::Const(_)
        | ExprKind::Input(_)
        | ExprKind::Param(_)
        | ExprKind::Value(_)
        | ExprKind::Global(_)
        | ExprKind::Local(_) => {}
        ExprKind::Other(inner) | ExprKind::Broadcast(inner) => params_to_inputs(inner, base),
        ExprKind::Unary { operand, .. } => params_to_inputs(operand, base),
        ExprKind::Binary { lhs, rhs, .. } => {
            params_to_inputs(lhs, base);
            params_to_inputs(rhs, base);
        }
        ExprKind::Call { args, .. } => args.iter_mut().for_each(|a| params_to_inputs(a, base)),
        ExprKind::Reduce { arg, .. } | ExprKind::DistinctNgrams { arg, .. } => {
            params_to_inputs(arg, base)
        }
        ExprKind::Uniform { seed } => params_to_inputs(seed, base),
        ExprKind::Components { arg } => params_to_inputs(arg, base),
        ExprKind::Rank { arg, mask, .. } => {
            params_to_inputs(arg, base);
            mask.iter_mut().for_each(|m| params_to_inputs(m, base));
        }
        ExprKind::Quantile { arg, q, mask, .. } => {
            params_to_inputs(arg, base);
            params_to_inputs(q, base);
            mask.iter_mut().for_each(|m| params_to_inputs(m, base));
        }
        ExprKind::Softmax {
            arg, temperature, ..
        } => {
            params_to_inputs(arg, base);
            params_to_inputs(temperature, base);
        }
        ExprKind::Scan { arg, decay, .. } => {
            params_to_inputs(arg, base);
            params_to_inputs(decay, base);
        }
        ExprKind::Index { base: inner, .. } => params_to_inputs(inner, base),
        ExprKind::Shift { arg, fill, .. } => {
            params_to_inputs(arg, base);
            params_to_inputs(fill, base);
        }
        ExprKind::Let { bindings, body, .. } => {
            for (_, value) in bindings {
                params_to_inputs(value, base);
            }
            params_to_inputs(body, base);
        }
    }
}
