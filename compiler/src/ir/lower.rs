//! HIR → IR. Functions are already inlined by the checker (as `Let`); here every value becomes a node,
//! params become constants, `mean`/`std`/`var`/`softmax`/`logsumexp`/`cos` become primitive reductions,
//! and pairwise bodies live at the `pair` level.

use std::borrow::Cow;
use std::collections::HashMap;

use rlx_core::{HasSignature, OutputInfo, ParamInfo, Signature};

use super::{
    Builder, Elem, Feature, Graph, InputInfo, Level, NodeId, Op, Origin, RubricInfo, Shape, Site,
    StateInfo, STATE_METRIC_PREFIX,
};
use crate::check::builtins::{Func, ReduceOp};
use crate::check::hir::{self, Axes, ExprKind, LocalId};
use crate::check::types::{Feature as HirFeature, Ty};
use crate::syntax::ast::{BinaryOp, UnaryOp};

/// Lower a checked recipe with these param values (in `recipe.params` order; see `param_values`).
pub fn lower(recipe: &hir::Recipe, params: &[f64]) -> Graph {
    lower_showing(recipe, params, &[])
}

/// `lower`, keeping the values of the top-level `let`s `shown` (indices into `recipe.globals`) alive
/// as `Outputs::shown`, named as declared.
pub fn lower_showing(recipe: &hir::Recipe, params: &[f64], shown: &[hir::GlobalId]) -> Graph {
    lower_showing_rollout(recipe, params, shown, false)
}

/// The prefix of a `rollout { … }` expression's name in `Outputs::shown` (`rollout.scaffold`).
pub const ROLLOUT_SHOWN_PREFIX: &str = "rollout.";

/// `lower_showing`, also keeping (when `rollout` is set) every `rollout { … }` setting given by an
/// expression other than a constant or a param, as `Outputs::shown` named `rollout.KEY`, so that
/// `rlx score` can print what the sampler would use.
pub fn lower_showing_rollout(
    recipe: &hir::Recipe,
    params: &[f64],
    shown: &[hir::GlobalId],
    rollout: bool,
) -> Graph {
    let signature = signature(recipe, params);
    let mut lowerer = Lowerer {
        builder: Builder::new(Vec::new(), Vec::new(), signature.rubrics),
        recipe,
        params,
        locals: HashMap::new(),
        globals: Vec::new(),
    };
    let inputs = signature.inputs;
    lowerer.builder.graph.inputs = inputs;
    lowerer.builder.graph.params = recipe
        .params
        .iter()
        .zip(params)
        .map(|(p, v)| (p.name.clone(), *v))
        .collect();
    for global in &recipe.globals {
        let node = lowerer.expr(&global.expr);
        let span = Some(Site::new(global.expr.file, global.expr.span));
        let saved = lowerer.builder.at(Origin { span, call: None });
        let node = lowerer.conform(node, &global.expr.ty);
        lowerer.builder.at(saved);
        lowerer.globals.push(node);
    }
    let outputs = &mut lowerer.builder.graph.outputs;
    outputs.reward = recipe.reward.map(|id| lowerer.globals[id.0 as usize]);
    outputs.advantage = recipe.advantage.map(|id| lowerer.globals[id.0 as usize]);
    let loss = recipe.loss.as_ref().map(|e| lowerer.expr(e));
    lowerer.builder.graph.outputs.loss = loss;
    for metric in &recipe.metrics {
        let node = lowerer.expr(&metric.expr);
        lowerer
            .builder
            .graph
            .outputs
            .metrics
            .push((metric.name.clone(), node));
    }
    for state in &recipe.states {
        let node = lowerer.expr(&state.update);
        let metric = format!("{STATE_METRIC_PREFIX}{}", state.name);
        let graph = &mut lowerer.builder.graph;
        graph.outputs.metrics.push((metric.clone(), node));
        graph.states.push(StateInfo {
            name: state.name.clone(),
            elem: state.elem,
            init: state_init(state, params),
            input: state.input.0,
            metric,
        });
    }
    for keep in &recipe.keeps {
        let node = lowerer.expr(&keep.condition);
        lowerer.builder.graph.outputs.keeps.push((keep.level, node));
    }
    for id in shown {
        if let (Some(global), Some(&node)) = (
            recipe.globals.get(id.0 as usize),
            lowerer.globals.get(id.0 as usize),
        ) {
            let named = (global.name.clone(), node);
            lowerer.builder.graph.outputs.shown.push(named);
        }
    }
    if rollout {
        for setting in &recipe.rollout {
            let hir::RolloutValue::Expr(expr) = &setting.value else {
                continue;
            };
            if matches!(expr.kind, ExprKind::Const(_) | ExprKind::Param(_)) {
                continue;
            }
            let node = lowerer.expr(expr);
            let named = (format!("{ROLLOUT_SHOWN_PREFIX}{}", setting.key), node);
            lowerer.builder.graph.outputs.shown.push(named);
        }
    }
    let mut graph = lowerer.builder.graph;
    graph.eliminate_dead_code();
    graph
}

/// Param values: the declared defaults with `overrides` (by name) applied.
pub fn param_values(recipe: &hir::Recipe, overrides: &[(String, f64)]) -> Result<Vec<f64>, String> {
    let mut values: Vec<f64> = recipe.params.iter().map(|p| p.value).collect();
    for (name, value) in overrides {
        let Some(index) = recipe.params.iter().position(|p| &p.name == name) else {
            let known: Vec<&str> = recipe.params.iter().map(|p| p.name.as_str()).collect();
            let hint = match crate::diagnostic::closest_name(name, known.iter().copied()) {
                Some(close) => format!(" (did you mean `{close}`?)"),
                None if known.is_empty() => " (the recipe declares no params)".to_string(),
                None => format!(" (params: {})", known.join(", ")),
            };
            return Err(format!("unknown param `{name}`{hint}"));
        };
        let param = &recipe.params[index];
        if !param.elem.admits(*value) {
            return Err(format!(
                "param `{name}` is {}, and {value} is not",
                param.elem.name()
            ));
        }
        values[index] = *value;
    }
    Ok(values)
}

/// The signature of `recipe` with its params at `params` (by index): its inputs (a `state`'s
/// default is its initial value), params, rubrics, states and outputs, as its graph has them.
pub fn signature(recipe: &hir::Recipe, params: &[f64]) -> Signature {
    let rubrics = recipe
        .rubrics
        .iter()
        .map(|r| RubricInfo {
            name: r.name.clone(),
            criteria: r.criteria.iter().map(|c| c.name.clone()).collect(),
            texts: if r.criteria.iter().any(|c| c.text.is_some()) {
                r.criteria
                    .iter()
                    .map(|c| c.text.clone().unwrap_or_default())
                    .collect()
            } else {
                Vec::new()
            },
        })
        .collect();
    let mut inputs: Vec<InputInfo> = recipe
        .inputs
        .iter()
        .map(|input| InputInfo {
            name: input.name.clone(),
            elem: input.ty.elem,
            shape: shape_of(recipe, &input.ty),
            differentiable: input.role.is_some(),
            default: input.default,
        })
        .collect();
    for state in &recipe.states {
        inputs[state.input.0 as usize].default = Some(state_init(state, params));
    }
    let params = recipe
        .params
        .iter()
        .zip(params)
        .map(|(p, value)| ParamInfo {
            name: p.name.clone(),
            elem: p.elem,
            default: p.value,
            value: *value,
        })
        .collect();
    let output = |name: &str, level: Level| OutputInfo {
        name: name.to_string(),
        shape: Shape::new(level),
    };
    let outputs = [
        recipe.reward.map(|_| output("reward", Level::Resp)),
        recipe.advantage.map(|_| output("advantage", Level::Resp)),
        recipe.loss.as_ref().map(|_| output("loss", Level::Batch)),
    ]
    .into_iter()
    .flatten()
    .chain(recipe.metrics.iter().map(|m| OutputInfo {
        name: m.name.clone(),
        shape: shape_of(recipe, &m.expr.ty),
    }))
    .collect();
    Signature {
        states: recipe
            .states
            .iter()
            .map(|s| inputs[s.input.0 as usize].name.clone())
            .collect(),
        inputs,
        params,
        rubrics,
        outputs,
    }
}

impl HasSignature for hir::Recipe {
    /// [`signature`] with every param at its declared value.
    fn signature(&self) -> Cow<'_, Signature> {
        let defaults: Vec<f64> = self.params.iter().map(|p| p.value).collect();
        Cow::Owned(signature(self, &defaults))
    }
}

/// A `state`'s initial value with the params at `params`.
fn state_init(state: &hir::State, params: &[f64]) -> f64 {
    match state.init {
        hir::Number::Const(value) => value,
        hir::Number::Param(id) => params[id.0 as usize],
    }
}

/// The IR shape of a checked type: a rubric axis by its index among the recipe's rubrics.
fn shape_of(recipe: &hir::Recipe, ty: &Ty) -> Shape {
    Shape {
        level: ty.level,
        feature: ty.feature.as_ref().map(|f| feature_of(recipe, f)),
    }
}

fn feature_of(recipe: &hir::Recipe, feature: &HirFeature) -> Feature {
    match feature {
        HirFeature::Crit => Feature::Crit,
        HirFeature::Dim => Feature::Dim,
        HirFeature::Rubric(name) => {
            let index = recipe
                .rubrics
                .iter()
                .position(|r| &r.name == name)
                .unwrap_or(0);
            let len = recipe
                .rubrics
                .get(index)
                .map(|r| r.criteria.len())
                .unwrap_or(0);
            Feature::Rubric {
                index: index as u32,
                len: len as u32,
            }
        }
        HirFeature::Matrix(rows, cols) => Feature::Matrix {
            rows: Box::new(feature_of(recipe, rows)),
            cols: Box::new(feature_of(recipe, cols)),
        },
    }
}

struct Lowerer<'r> {
    builder: Builder,
    recipe: &'r hir::Recipe,
    params: &'r [f64],
    locals: HashMap<LocalId, NodeId>,
    globals: Vec<NodeId>,
}

/// The finer of two shapes that broadcast to each other (the checker guarantees one exists).
fn join(a: &Shape, b: &Shape) -> Shape {
    let level = if a.level.broadcasts_to(b.level) {
        b.level
    } else {
        a.level
    };
    Shape {
        level,
        feature: a.feature.clone().or_else(|| b.feature.clone()),
    }
}

impl Lowerer<'_> {
    /// `dot(a, b)` and `outer(a, b)` (docs/language.md, "Matrices"): a matrix product is an
    /// element-wise product on the matrix's elements, the vector spread along the other axis, summed
    /// over the contracted axis (`SpreadRows`/`SpreadCols`, `ContractRows`/`ContractCols`).
    fn product(&mut self, func: Func, args: Vec<NodeId>, expr: &hir::Expr) -> NodeId {
        let types: Vec<Ty> = match &expr.kind {
            ExprKind::Call { args, .. } => args.iter().map(|a| a.ty.clone()).collect(),
            _ => Vec::new(),
        };
        let a = match types.first() {
            Some(ty) => self.conform(args[0], ty),
            None => args[0],
        };
        let b = match types.get(1) {
            Some(ty) => self.conform(args[1], ty),
            None => args[1],
        };
        let (fa, fb) = (self.shape(a).feature, self.shape(b).feature);
        if func == Func::Outer {
            let matrix = self.shape_of(&expr.ty).feature;
            let rows = self.spread(Op::SpreadRows, a, matrix.clone());
            let cols = self.spread(Op::SpreadCols, b, matrix);
            return self.binary(Op::Mul, rows, cols);
        }
        let a_matrix = fa.as_ref().is_some_and(|f| f.matrix().is_some());
        let b_matrix = fb.as_ref().is_some_and(|f| f.matrix().is_some());
        match (a_matrix, b_matrix) {
            (false, true) => {
                let rows = self.spread(Op::SpreadRows, a, fb);
                let product = self.binary(Op::Mul, rows, b);
                self.contract(Op::ContractRows, product)
            }
            (true, false) => {
                let cols = self.spread(Op::SpreadCols, b, fa);
                let product = self.binary(Op::Mul, a, cols);
                self.contract(Op::ContractCols, product)
            }
            _ => {
                let product = self.binary(Op::Mul, a, b);
                self.drop_feature(Op::ReduceSum, product)
            }
        }
    }

    /// A vector spread over the rows or columns of `matrix`, at its own level.
    fn spread(&mut self, op: Op, x: NodeId, matrix: Option<Feature>) -> NodeId {
        let level = self.shape(x).level;
        self.builder.add(
            op,
            vec![x],
            Shape {
                level,
                feature: matrix,
            },
            Elem::F32,
        )
    }

    /// A matrix summed over its rows (`ContractRows`) or columns (`ContractCols`), at its own level.
    fn contract(&mut self, op: Op, m: NodeId) -> NodeId {
        let shape = self.shape(m);
        let feature = shape
            .feature
            .as_ref()
            .and_then(|f| f.matrix())
            .map(|(rows, cols)| {
                if op == Op::ContractRows {
                    cols.clone()
                } else {
                    rows.clone()
                }
            });
        self.builder.add(
            op,
            vec![m],
            Shape {
                level: shape.level,
                feature,
            },
            Elem::F32,
        )
    }

    fn shape_of(&self, ty: &Ty) -> Shape {
        shape_of(self.recipe, ty)
    }

    fn shape(&self, id: NodeId) -> Shape {
        self.builder.shape(id).clone()
    }

    fn constant(&mut self, value: f64) -> NodeId {
        self.builder.constant(value, Elem::F32)
    }

    /// An element-wise node over `args`, at their joined shape.
    fn map(&mut self, op: Op, args: Vec<NodeId>, elem: Elem) -> NodeId {
        let mut shape = Shape::BATCH;
        for arg in &args {
            shape = join(&shape, self.builder.shape(*arg));
        }
        self.builder.add(op, args, shape, elem)
    }

    fn unary(&mut self, op: Op, a: NodeId) -> NodeId {
        self.map(op, vec![a], Elem::F32)
    }

    fn binary(&mut self, op: Op, a: NodeId, b: NodeId) -> NodeId {
        self.map(op, vec![a, b], Elem::F32)
    }

    fn copy_to(&mut self, id: NodeId, shape: Shape) -> NodeId {
        let elem = self.builder.elem(id);
        self.builder.add(Op::Copy, vec![id], shape, elem)
    }

    /// Raise a node to the HIR type's shape if folding left it coarser (a reduction must see its axis).
    fn conform(&mut self, id: NodeId, ty: &Ty) -> NodeId {
        let target = self.shape_of(ty);
        let current = self.shape(id);
        if current != target && current.broadcasts_to(&target) {
            self.copy_to(id, target)
        } else {
            id
        }
    }

    fn reduce(&mut self, op: Op, arg: NodeId, out: Shape) -> NodeId {
        let elem = match (op.clone(), self.builder.elem(arg)) {
            (Op::Count, _) | (Op::ReduceSum, Elem::Bool) => Elem::I32,
            (_, elem) => elem,
        };
        self.builder.add(op, vec![arg], out, elem)
    }

    /// Reduce a value over its feature axis, keeping its level.
    fn drop_feature(&mut self, op: Op, arg: NodeId) -> NodeId {
        let level = self.shape(arg).level;
        self.reduce(
            op,
            arg,
            Shape {
                level,
                feature: None,
            },
        )
    }

    /// Σ x / max(count, 1): the mean, 0 over no element.
    fn mean(&mut self, arg: NodeId, out: Shape) -> NodeId {
        let sum = self.reduce(Op::ReduceSum, arg, out.clone());
        let count = self.reduce(Op::Count, arg, out);
        let one = self.constant(1.0);
        let denominator = self.binary(Op::Max, count, one);
        self.binary(Op::Div, sum, denominator)
    }

    /// Σ (x − mean)² / max(count − ddof, 1): 0 when there are no more elements than `ddof`.
    fn variance(&mut self, arg: NodeId, out: Shape, ddof: u32) -> NodeId {
        let mean = self.mean(arg, out.clone());
        let centred = self.binary(Op::Sub, arg, mean);
        let squared = self.binary(Op::Mul, centred, centred);
        let sum = self.reduce(Op::ReduceSum, squared, out.clone());
        let count = self.reduce(Op::Count, arg, out);
        let ddof = self.constant(f64::from(ddof));
        let dof = self.binary(Op::Sub, count, ddof);
        let one = self.constant(1.0);
        let denominator = self.binary(Op::Max, dof, one);
        self.binary(Op::Div, sum, denominator)
    }

    /// Descending ranks of `value` among the elements that map to the same element of `within`.
    /// (At the operand's declared `level`: a constant operand stays coarser, and all its elements tie.)
    /// With a `mask`, the elements where it holds come first, in their order, then the others; a
    /// constant true mask is no mask.
    fn rank(&mut self, value: NodeId, mask: Option<NodeId>, level: Level, within: Level) -> NodeId {
        let shape = Shape::new(level);
        let mut args = vec![value];
        if let Some(mask) = mask {
            match self.builder.constant_value(mask) {
                Some(m) if m != 0.0 => {}
                _ => args.push(self.copy_to(mask, shape.clone())),
            }
        }
        self.builder
            .add(Op::Rank { within }, args, shape, Elem::I32)
    }

    /// The q-quantile of the elements of `value` that map to each element of `out`, as
    /// `torch.quantile` computes it (linear interpolation): with the n elements sorted ascending
    /// (v₀ ≤ … ≤ vₙ₋₁), q clamped to [0, 1], p = q·(n − 1), lo = ⌊p⌋, hi = min(lo + 1, n − 1):
    /// v_lo + (p − lo)·(v_hi − v_lo). The order statistics are picked by rank (one element per rank, so
    /// each sum below has one term); 0 over no element, as every reduction.
    fn quantile(
        &mut self,
        value: NodeId,
        mask: Option<NodeId>,
        level: Level,
        q: NodeId,
        out: Shape,
    ) -> NodeId {
        let zero = self.constant(0.0);
        let one = self.constant(1.0);
        let mask = match mask.map(|m| (m, self.builder.constant_value(m))) {
            Some((_, Some(v))) if v != 0.0 => None,
            other => other.map(|(m, _)| m),
        };
        let count = match mask {
            // A constant false mask: nothing is included.
            Some(mask) if self.builder.constant_value(mask).is_some() => zero,
            // Included elements: the mask, summed at the value's level (a coarser mask counts once
            // per element of the value).
            Some(mask) => {
                let shape = Shape::new(level);
                let mask = self.copy_to(mask, shape.clone());
                let ones = self
                    .builder
                    .add(Op::Select, vec![mask, one, zero], shape, Elem::F32);
                self.reduce(Op::ReduceSum, ones, out.clone())
            }
            None => self.reduce(Op::Count, value, out.clone()),
        };
        let last = self.binary(Op::Sub, count, one);
        let q = self.binary(Op::Max, q, zero);
        let q = self.binary(Op::Min, q, one);
        let position = self.binary(Op::Mul, q, last);
        let low = self.unary(Op::Floor, position);
        let low = self.binary(Op::Max, low, zero);
        let fraction = self.binary(Op::Sub, position, low);
        let next = self.binary(Op::Add, low, one);
        let high = self.binary(Op::Min, next, last);
        let descending = self.rank(value, mask, level, out.level);
        let ascending = self.binary(Op::Sub, last, descending);
        // A threshold: no gradient flows into the elements.
        let value = self.stopgrad(value);
        let pick = |this: &mut Self, at: NodeId| {
            let hit = this.map(Op::Eq, vec![ascending, at], Elem::Bool);
            let chosen = this.map(Op::Select, vec![hit, value, zero], Elem::F32);
            this.reduce(Op::ReduceSum, chosen, out.clone())
        };
        let below = pick(self, low);
        let above = pick(self, high);
        let gap = self.binary(Op::Sub, above, below);
        let step = self.binary(Op::Mul, fraction, gap);
        let between = self.binary(Op::Add, below, step);
        // An exact order statistic is itself (no 0·∞ when the next one is infinite).
        let inside = self.map(Op::Gt, vec![fraction, zero], Elem::Bool);
        self.map(Op::Select, vec![inside, between, below], Elem::F32)
    }

    fn stopgrad(&mut self, id: NodeId) -> NodeId {
        let (shape, elem) = (self.shape(id), self.builder.elem(id));
        self.builder.add(Op::StopGrad, vec![id], shape, elem)
    }

    /// The reduced shape and the operand (raised to the pair level for `others`).
    fn reduction_target(&mut self, axes: &Axes, arg: NodeId, result: &Ty) -> (NodeId, Shape) {
        match axes {
            Axes::Others => {
                let arg_shape = self.shape(arg);
                let arg = if arg_shape.level == Level::Pair {
                    arg
                } else {
                    self.copy_to(
                        arg,
                        Shape {
                            level: Level::Pair,
                            feature: arg_shape.feature.clone(),
                        },
                    )
                };
                (
                    arg,
                    Shape {
                        level: Level::Resp,
                        feature: self.shape(arg).feature,
                    },
                )
            }
            Axes::Feature(_) => {
                let level = self.shape(arg).level;
                (
                    arg,
                    Shape {
                        level,
                        feature: None,
                    },
                )
            }
            Axes::Levels { .. } => {
                let feature = self.shape(arg).feature;
                (
                    arg,
                    Shape {
                        level: result.level,
                        feature,
                    },
                )
            }
        }
    }

    /// Lower `expr`: the nodes it adds get its span, and, inside an inlined function's body, the
    /// outermost call (`Node::call`).
    fn expr(&mut self, expr: &hir::Expr) -> NodeId {
        let span = Some(Site::new(expr.file, expr.span));
        let outer = self.builder.origin();
        let call = match (&expr.kind, outer.call) {
            (
                ExprKind::Let {
                    function: Some(_), ..
                },
                None,
            ) => span,
            (_, call) => call,
        };
        let saved = self.builder.at(Origin { span, call });
        let node = self.expr_here(expr);
        self.builder.at(saved);
        node
    }

    fn expr_here(&mut self, expr: &hir::Expr) -> NodeId {
        match &expr.kind {
            ExprKind::Const(value) => self.builder.constant(*value, expr.ty.elem),
            ExprKind::Input(id) => {
                let shape = self.builder.graph.inputs[id.0 as usize].shape.clone();
                self.builder
                    .add(Op::Input(id.0), Vec::new(), shape, expr.ty.elem)
            }
            ExprKind::Param(id) => self
                .builder
                .constant(self.params[id.0 as usize], expr.ty.elem),
            ExprKind::Value(value) => {
                let shape = self.shape_of(&expr.ty);
                self.builder
                    .add(Op::Value(*value), Vec::new(), shape, expr.ty.elem)
            }
            ExprKind::Global(id) => self.globals[id.0 as usize],
            ExprKind::Local(id) => self.locals[id],
            ExprKind::Broadcast(inner) => {
                let node = self.expr(inner);
                let shape = self.shape_of(&expr.ty);
                self.copy_to(node, shape)
            }
            ExprKind::Other(inner) => {
                let node = self.expr(inner);
                let shape = self.shape(node);
                let pair = Shape {
                    level: Level::Pair,
                    feature: shape.feature.clone(),
                };
                if shape.level == Level::Resp {
                    let elem = self.builder.elem(node);
                    self.builder.add(Op::Other, vec![node], pair, elem)
                } else {
                    // A group-level value is the same for both responses of a pair.
                    self.copy_to(node, pair)
                }
            }
            ExprKind::Unary { op, operand } => {
                let a = self.expr(operand);
                match op {
                    UnaryOp::Neg => self.map(Op::Neg, vec![a], expr.ty.elem),
                    UnaryOp::Not => self.map(Op::Not, vec![a], Elem::Bool),
                }
            }
            ExprKind::Binary { op, lhs, rhs } => {
                let a = self.expr(lhs);
                let b = self.expr(rhs);
                let ir_op = match op {
                    BinaryOp::Or => Op::Or,
                    BinaryOp::And => Op::And,
                    BinaryOp::Eq => Op::Eq,
                    BinaryOp::Ne => Op::Ne,
                    BinaryOp::Lt => Op::Lt,
                    BinaryOp::Le => Op::Le,
                    BinaryOp::Gt => Op::Gt,
                    BinaryOp::Ge => Op::Ge,
                    BinaryOp::Add => Op::Add,
                    BinaryOp::Sub => Op::Sub,
                    BinaryOp::Mul => Op::Mul,
                    BinaryOp::Div => Op::Div,
                    BinaryOp::Pow => Op::Pow,
                };
                self.map(ir_op, vec![a, b], expr.ty.elem)
            }
            ExprKind::Call { func, args } => {
                let nodes: Vec<NodeId> = args.iter().map(|a| self.expr(a)).collect();
                self.call(*func, nodes, expr)
            }
            ExprKind::Reduce {
                op,
                axes,
                arg,
                ddof,
            } => {
                let value = self.expr(arg);
                let value = if matches!(axes, Axes::Levels { .. }) {
                    self.conform(value, &arg.ty)
                } else {
                    value
                };
                let (value, out) = self.reduction_target(axes, value, &expr.ty);
                match op {
                    ReduceOp::Sum | ReduceOp::Count => self.reduce(Op::ReduceSum, value, out),
                    ReduceOp::Mean => self.mean(value, out),
                    ReduceOp::Max | ReduceOp::Any => self.reduce(Op::ReduceMax, value, out),
                    ReduceOp::Min | ReduceOp::All => self.reduce(Op::ReduceMin, value, out),
                    ReduceOp::Var => self.variance(value, out, *ddof),
                    ReduceOp::Std => {
                        let variance = self.variance(value, out, *ddof);
                        self.unary(Op::Sqrt, variance)
                    }
                    ReduceOp::LogSumExp => {
                        let max = self.reduce(Op::ReduceMax, value, out.clone());
                        let max = self.stopgrad(max);
                        let shifted = self.binary(Op::Sub, value, max);
                        let exps = self.unary(Op::Exp, shifted);
                        let sum = self.reduce(Op::ReduceSum, exps, out);
                        let log = self.unary(Op::Log, sum);
                        self.binary(Op::Add, log, max)
                    }
                }
            }
            ExprKind::Softmax {
                axes,
                arg,
                temperature,
            } => {
                let value = self.expr(arg);
                let value = self.conform(value, &arg.ty);
                let temperature = self.expr(temperature);
                let scaled = self.binary(Op::Div, value, temperature);
                let (scaled, out) = self.reduction_target(
                    axes,
                    scaled,
                    &expr.ty.with_level(match axes {
                        Axes::Levels { to, .. } => to.coarser(),
                        _ => expr.ty.level,
                    }),
                );
                let max = self.reduce(Op::ReduceMax, scaled, out.clone());
                let max = self.stopgrad(max);
                let shifted = self.binary(Op::Sub, scaled, max);
                let exps = self.unary(Op::Exp, shifted);
                let sum = self.reduce(Op::ReduceSum, exps, out);
                self.binary(Op::Div, exps, sum)
            }
            ExprKind::Scan {
                arg,
                decay,
                reverse,
            } => {
                let value = self.expr(arg);
                let value = self.conform(value, &arg.ty);
                let decay = self.expr(decay);
                let shape = self.shape(value);
                self.builder.add(
                    Op::Scan { reverse: *reverse },
                    vec![value, decay],
                    shape,
                    Elem::F32,
                )
            }
            ExprKind::Index { base, criterion } => {
                let value = self.expr(base);
                let value = self.conform(value, &base.ty);
                let shape = Shape {
                    level: self.shape(value).level,
                    feature: None,
                };
                let elem = self.builder.elem(value);
                self.builder
                    .add(Op::Index(*criterion as u32), vec![value], shape, elem)
            }
            ExprKind::Shift { arg, offset, fill } => {
                let value = self.expr(arg);
                let value = self.conform(value, &arg.ty);
                let fill = self.expr(fill);
                let shape = self.shape(value);
                self.builder.add(
                    Op::Shift { offset: *offset },
                    vec![value, fill],
                    shape,
                    expr.ty.elem,
                )
            }
            ExprKind::DistinctNgrams { arg, n } => {
                let value = self.expr(arg);
                let value = self.conform(value, &arg.ty);
                self.builder.add(
                    Op::DistinctNgrams { n: *n },
                    vec![value],
                    Shape::new(Level::Resp),
                    Elem::F32,
                )
            }
            ExprKind::Components { arg } => {
                // The verdict at every pair (a coarser one, e.g. a folded constant, raised to it).
                let value = self.expr(arg);
                let shape = self.shape(value);
                let value = if shape.level == Level::Pair {
                    value
                } else {
                    self.copy_to(value, Shape::new(Level::Pair))
                };
                self.builder.add(
                    Op::Components,
                    vec![value],
                    Shape::new(Level::Resp),
                    Elem::I32,
                )
            }
            ExprKind::Uniform { seed } => {
                let seed = self.expr(seed);
                let shape = self.shape_of(&expr.ty);
                self.builder.add(Op::Uniform, vec![seed], shape, Elem::F32)
            }
            ExprKind::Rank { axes, arg, mask } => {
                let value = self.expr(arg);
                let value = self.conform(value, &arg.ty);
                let within = match axes {
                    Axes::Levels { to, .. } => to.coarser(),
                    // The checker orders levels only.
                    _ => Level::Batch,
                };
                let mask = mask.as_ref().map(|m| self.expr(m));
                self.rank(value, mask, arg.ty.level, within)
            }
            ExprKind::Quantile { axes, arg, q, mask } => {
                let value = self.expr(arg);
                let value = self.conform(value, &arg.ty);
                let (value, out) = self.reduction_target(axes, value, &expr.ty);
                let q = self.expr(q);
                let q = self.stopgrad(q);
                let mask = mask.as_ref().map(|m| self.expr(m));
                self.quantile(value, mask, arg.ty.level, q, out)
            }
            ExprKind::Let { bindings, body, .. } => {
                for (local, value) in bindings {
                    let node = self.expr(value);
                    self.locals.insert(*local, node);
                }
                self.expr(body)
            }
        }
    }

    fn call(&mut self, func: Func, args: Vec<NodeId>, expr: &hir::Expr) -> NodeId {
        let elem = expr.ty.elem;
        // A primitive is its op (`cos` with one argument; with two, the form below).
        if let Some(primitive) = func.primitive() {
            if !(func == Func::Cos && args.len() == 2) {
                return self.map(primitive.op.clone(), args, elem);
            }
        }
        match func {
            Func::Dot | Func::Outer => self.product(func, args, expr),
            Func::Clamp => {
                let low = self.map(Op::Max, vec![args[0], args[1]], elem);
                self.map(Op::Min, vec![low, args[2]], elem)
            }
            Func::Where => self.map(Op::Select, args, elem),
            Func::Stopgrad => self.stopgrad(args[0]),
            // `cos(a, b)` (every other primitive returned above): dot / max(|a|·|b|, tiny), along the
            // shared feature axis.
            _ => {
                let product = self.binary(Op::Mul, args[0], args[1]);
                let dot = self.drop_feature(Op::ReduceSum, product);
                let a2 = self.binary(Op::Mul, args[0], args[0]);
                let b2 = self.binary(Op::Mul, args[1], args[1]);
                let na = self.drop_feature(Op::ReduceSum, a2);
                let nb = self.drop_feature(Op::ReduceSum, b2);
                let norms = self.binary(Op::Mul, na, nb);
                let norms = self.unary(Op::Sqrt, norms);
                let tiny = self.constant(1e-12);
                let denominator = self.binary(Op::Max, norms, tiny);
                self.binary(Op::Div, dot, denominator)
            }
        }
    }
}
