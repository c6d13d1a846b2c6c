//! The typed HIR: every name resolved, every expression typed, user functions inlined as `Let`
//! bindings, sections ordered by their dependencies. This is what the IR lowering consumes.

use serde::Serialize;

use super::builtins::{Func, ReduceOp, Value};
use super::types::{Elem, Feature, Level, Ty};
use crate::source::FileId;
use crate::syntax::ast::{BinaryOp, InputRole, InteractMode, KeepLevel, Span, UnaryOp};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct InputId(pub u32);
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct ParamId(pub u32);
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct GlobalId(pub u32);
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct LocalId(pub u32);
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct RubricId(pub u32);

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Recipe {
    pub inputs: Vec<Input>,
    pub params: Vec<Param>,
    pub rubrics: Vec<Rubric>,
    /// `let`s and the `reward`/`advantage` sections, in an order where each comes after what it uses.
    pub globals: Vec<Global>,
    pub reward: Option<GlobalId>,
    pub advantage: Option<GlobalId>,
    pub loss: Option<Expr>,
    pub metrics: Vec<Metric>,
    pub keeps: Vec<Keep>,
    pub rollout: Vec<RolloutSetting>,
    /// `state` declarations: each is read through its input (`input`, a batch-level input without a
    /// gradient whose default is the initial value) and updated after each step by `update`.
    pub states: Vec<State>,
}

impl Recipe {
    /// Every expression of the recipe, each before its sub-expressions: the `let`s and sections, the
    /// loss, the metrics, the `keep` conditions and the rollout settings. Functions are inlined, so a
    /// function body's nodes appear once per call, each with the types of that call. Editors read the
    /// type at a position from it (`rlxc lsp`'s hover).
    pub fn for_each_expr(&self, mut visit: impl FnMut(&Expr)) {
        fn walk(expr: &Expr, visit: &mut dyn FnMut(&Expr)) {
            visit(expr);
            for child in expr.children() {
                walk(child, visit);
            }
        }
        let roots = self
            .globals
            .iter()
            .map(|global| &global.expr)
            .chain(&self.loss)
            .chain(self.metrics.iter().map(|metric| &metric.expr))
            .chain(self.keeps.iter().map(|keep| &keep.condition))
            .chain(self.states.iter().map(|state| &state.update))
            .chain(
                self.rollout
                    .iter()
                    .filter_map(|setting| match &setting.value {
                        RolloutValue::Expr(expr) => Some(expr),
                        RolloutValue::Strings(_) => None,
                    }),
            );
        for root in roots {
            walk(root, &mut visit);
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Input {
    pub name: String,
    pub ty: Ty,
    pub role: Option<InputRole>,
    pub default: Option<f64>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Param {
    pub name: String,
    pub elem: Elem,
    pub value: f64,
    pub span: Span,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GlobalKind {
    Let,
    Reward,
    Advantage,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Global {
    pub name: String,
    pub kind: GlobalKind,
    pub expr: Expr,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Metric {
    pub name: String,
    pub expr: Expr,
}

/// `state NAME : ELEM = INIT update EXPR` (docs/language.md, "State across steps").
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct State {
    pub name: String,
    pub elem: Elem,
    /// The input through which the step reads the state.
    pub input: InputId,
    /// The initial value: a constant or a param (so `--set` can change it).
    pub init: Number,
    /// The next step's value: a batch-level expression of this step's values and the old state.
    pub update: Expr,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Keep {
    pub level: KeepLevel,
    pub condition: Expr,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum RolloutValue {
    Expr(Expr),
    Strings(Vec<String>),
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RolloutSetting {
    pub key: String,
    pub value: RolloutValue,
}

/// A constant or a `param` (kept symbolic so `--set` can change it).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum Number {
    Const(f64),
    Param(ParamId),
}

/// Rubric shapes (Rubicon §2.3); the formulas live in `stdlib/rubric.rlx`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Shape {
    pub name: String,
    pub args: Vec<(String, Number)>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Criterion {
    pub name: String,
    pub weight: Number,
    pub points: Option<Number>,
    pub levels: Vec<f64>,
    pub veto: bool,
    /// A scoring criterion whose failure (a score below 0.5, after `levels`) vetoes the response.
    pub critical: bool,
    pub saturate: Option<Shape>,
    /// What a judge is asked, from a rubric file (docs/sharing.md).
    pub text: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Interaction {
    pub first: usize,
    pub second: usize,
    pub mode: InteractMode,
    pub gamma: Number,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Aggregate {
    /// Σ w·x / Σ w over non-veto criteria (the default).
    Mean,
    /// Σ w·x.
    Sum,
    /// Σ points·x / Σ positive points (HealthBench, RuscaRL).
    Points,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Rubric {
    pub name: String,
    pub criteria: Vec<Criterion>,
    pub interactions: Vec<Interaction>,
    pub aggregate: Aggregate,
    pub on_veto: Shape,
    pub shape: Option<Shape>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Expr {
    pub kind: ExprKind,
    pub ty: Ty,
    /// Depends on a `policy`/`value` input through differentiable operations.
    pub grad: bool,
    pub span: Span,
    pub file: FileId,
}

/// Which axes a reduction removes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Axes {
    /// Contiguous level axes, from the value's own level up to (and including) `to`'s axis.
    /// The result is at `to.coarser()`.
    Levels { from: Level, to: Level },
    /// The feature axis.
    Feature(Feature),
    /// The other responses of the same group.
    Others,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum ExprKind {
    Const(f64),
    Input(InputId),
    Param(ParamId),
    Value(Value),
    Global(GlobalId),
    Local(LocalId),
    /// The inner value, read at another response of the group (inside `… over others`).
    Other(Box<Expr>),
    Unary {
        op: UnaryOp,
        operand: Box<Expr>,
    },
    Binary {
        op: BinaryOp,
        lhs: Box<Expr>,
        rhs: Box<Expr>,
    },
    Call {
        func: Func,
        args: Vec<Expr>,
    },
    Reduce {
        op: ReduceOp,
        axes: Axes,
        arg: Box<Expr>,
        ddof: u32,
    },
    Softmax {
        axes: Axes,
        arg: Box<Expr>,
        temperature: Box<Expr>,
    },
    Scan {
        arg: Box<Expr>,
        decay: Box<Expr>,
        reverse: bool,
    },
    Index {
        base: Box<Expr>,
        criterion: usize,
    },
    /// `shift(x over tok, offset, fill)`: x at token t + offset of the same response, else `fill`.
    Shift {
        arg: Box<Expr>,
        offset: i32,
        fill: Box<Expr>,
    },
    /// `distinct_ngrams(ids over tok, n)`: distinct n-grams / n-grams of each response.
    DistinctNgrams {
        arg: Box<Expr>,
        n: u32,
    },
    /// `rank(x over AXES)`: each element's 0-based position in descending order among the elements
    /// reduced together (ties: the earlier element first).
    Rank {
        axes: Axes,
        arg: Box<Expr>,
        /// `mask = c`: only the elements where `c` holds are ordered; the others come after them.
        mask: Option<Box<Expr>>,
    },
    /// `quantile(x over AXES, q)`: the q-quantile of the elements reduced together (linear
    /// interpolation between order statistics, as `torch.quantile`).
    Quantile {
        axes: Axes,
        arg: Box<Expr>,
        q: Box<Expr>,
        /// `mask = c`: the quantile of the elements where `c` holds.
        mask: Option<Box<Expr>>,
    },
    /// `uniform(seed over LEVEL)`: a pseudo-random number in [0, 1) per element of the level.
    Uniform {
        seed: Box<Expr>,
    },
    /// `components(same over others)`: per response, the smallest 0-based position in its group of a
    /// response joined to it by the closure of the verdict `arg` (read at each pair).
    Components {
        arg: Box<Expr>,
    },
    /// Local bindings: a block, an inlined call of `function`, or a rubric's scoring (`function` is then
    /// the rubric's name).
    Let {
        bindings: Vec<(LocalId, Expr)>,
        body: Box<Expr>,
        function: Option<String>,
    },
    /// The value, broadcast to the (finer) type of this node.
    Broadcast(Box<Expr>),
}

impl Expr {
    pub fn level(&self) -> Level {
        self.ty.level
    }

    /// Direct sub-expressions.
    pub fn children(&self) -> Vec<&Expr> {
        match &self.kind {
            ExprKind::Const(_)
            | ExprKind::Input(_)
            | ExprKind::Param(_)
            | ExprKind::Value(_)
            | ExprKind::Global(_)
            | ExprKind::Local(_) => Vec::new(),
            ExprKind::Other(inner) | ExprKind::Broadcast(inner) => vec![inner],
            ExprKind::Unary { operand, .. } => vec![operand],
            ExprKind::Binary { lhs, rhs, .. } => vec![lhs, rhs],
            ExprKind::Call { args, .. } => args.iter().collect(),
            ExprKind::Reduce { arg, .. } => vec![arg],
            ExprKind::Softmax {
                arg, temperature, ..
            } => vec![arg, temperature],
            ExprKind::Scan { arg, decay, .. } => vec![arg, decay],
            ExprKind::Index { base, .. } => vec![base],
            ExprKind::Shift { arg, fill, .. } => vec![arg, fill],
            ExprKind::DistinctNgrams { arg, .. } => vec![arg],
            ExprKind::Uniform { seed } => vec![seed],
            ExprKind::Components { arg } => vec![arg],
            ExprKind::Rank { arg, mask, .. } => {
                [&**arg].into_iter().chain(mask.as_deref()).collect()
            }
            ExprKind::Quantile { arg, q, mask, .. } => {
                [&**arg, &**q].into_iter().chain(mask.as_deref()).collect()
            }
            ExprKind::Let { bindings, body, .. } => {
                bindings.iter().map(|(_, e)| e).chain([&**body]).collect()
            }
        }
    }
}
