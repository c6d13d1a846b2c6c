//! Stage `lower` → IR: a dataflow graph of array operations, each node annotated with its shape (level
//! and feature axis). User functions are inlined, params folded to constants, common subexpressions
//! shared (hash-consing) and dead nodes dropped. Stage `autodiff` (`autodiff.rs`) appends the gradient of
//! the loss to the same graph.
//!
//! # Shapes and element order
//! A node's value is a flat array. With G groups, R responses, T tokens, P ordered pairs (i, j ≠ i) of
//! responses within each group, C_g criteria of group g and D embedding dimensions:
//!
//! | level | elements, in order |
//! |---|---|
//! | batch | 1 |
//! | group | G, groups in order |
//! | resp | R, groups in order, responses within |
//! | pair | for each group, for each response i, for each other response j of the group (in order) |
//! | tok | T, the tokens of each response in order, responses in packed order |
//!
//! A `crit` axis multiplies each group (or each response, or pair) element by its group's C_g
//! criteria (ragged); `dim` by D and a rubric axis by its K criteria (row-major: the element, then the
//! feature index). A matrix of two rectangular axes (`dim`, rubrics) multiplies it by their product,
//! row-major: feature index f = a·cols + b for row a, column b.
//!
//! # Broadcasting and reductions
//! An element-wise node reads each operand at the element "above" its own (a token reads its response's
//! value, a pair (i, j) reads response i's, an element with a feature reads the feature-less value).
//! `Reduce` sums (or takes max/min) over every element of its operand that maps to each of its own
//! elements the same way; `Other` reads response j of a pair and `SumByOther` is its adjoint.

pub mod autodiff;
pub mod cut;
pub mod lower;
pub mod print;

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

pub use crate::check::builtins::Value;
pub use crate::check::types::Elem;
/// The stable scalar forms, which live in the op table (`crate::ops`).
pub use crate::ops::scalar::double::{log_sigmoid, sigmoid, softplus};
pub use crate::ops::scalar::lgamma;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Batch,
    Group,
    Resp,
    /// Ordered pairs of distinct responses of one group (inside `… over others`, pair inputs).
    Pair,
    Tok,
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::Batch => "batch",
            Level::Group => "group",
            Level::Resp => "resp",
            Level::Pair => "pair",
            Level::Tok => "tok",
        }
    }

    /// Whether values at `self` broadcast to `finer` (the levels form a tree: pair and tok are both
    /// below resp, and neither is below the other).
    pub fn broadcasts_to(self, finer: Level) -> bool {
        match (self, finer) {
            (a, b) if a == b => true,
            (Level::Pair, _) | (Level::Tok, _) => false,
            (_, Level::Pair) | (_, Level::Tok) => self <= Level::Resp,
            (a, b) => a < b,
        }
    }
}

impl From<crate::check::types::Level> for Level {
    fn from(level: crate::check::types::Level) -> Level {
        use crate::check::types::Level as L;
        match level {
            L::Batch => Level::Batch,
            L::Group => Level::Group,
            L::Resp => Level::Resp,
            L::Tok => Level::Tok,
            L::Pair => Level::Pair,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Feature {
    Crit,
    Dim,
    /// A declared rubric's criteria: its index in `Graph::rubrics` and how many criteria it has.
    Rubric {
        index: u32,
        len: u32,
    },
    /// A matrix over two rectangular axes (never `crit`): `rows × cols` values per element, row-major.
    Matrix {
        rows: Box<Feature>,
        cols: Box<Feature>,
    },
}

impl Feature {
    /// How many values the axis has when its length is fixed for the batch: `dim` is `dim`, a rubric
    /// its criteria, a matrix the product of its axes; `None` for the ragged `crit`.
    pub fn fixed_len(&self, dim: usize) -> Option<usize> {
        match self {
            Feature::Crit => None,
            Feature::Dim => Some(dim),
            Feature::Rubric { len, .. } => Some(*len as usize),
            Feature::Matrix { rows, cols } => {
                rows.fixed_len(dim)?.checked_mul(cols.fixed_len(dim)?)
            }
        }
    }

    /// The row and column axes of a matrix.
    pub fn matrix(&self) -> Option<(&Feature, &Feature)> {
        match self {
            Feature::Matrix { rows, cols } => Some((rows, cols)),
            _ => None,
        }
    }
}

impl std::fmt::Display for Feature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Feature::Crit => f.write_str("crit"),
            Feature::Dim => f.write_str("dim"),
            Feature::Rubric { index, len } => write!(f, "rubric{index}:{len}"),
            Feature::Matrix { rows, cols } => write!(f, "{rows} × {cols}"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Shape {
    pub level: Level,
    pub feature: Option<Feature>,
}

impl Shape {
    pub const BATCH: Shape = Shape {
        level: Level::Batch,
        feature: None,
    };

    pub fn new(level: Level) -> Shape {
        Shape {
            level,
            feature: None,
        }
    }

    /// Whether a value of shape `self` can be read at every element of `finer`.
    pub fn broadcasts_to(&self, finer: &Shape) -> bool {
        self.level.broadcasts_to(finer.level)
            && (self.feature.is_none() || self.feature == finer.feature)
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.feature {
            None => write!(f, "[{}]", self.level.name()),
            Some(feature) => write!(f, "[{}, {feature}]", self.level.name()),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeId(pub u32);

/// The `Op` enum: the variants written here, then one per primitive of the op table (`crate::ops`),
/// documented there.
macro_rules! op_enum {
    (
        { $(#[$attr:meta])* pub enum Op { $($fixed:tt)* } }
        $(
            $func:ident {
                name: $name:literal, params: $params:tt, optional: $optional:literal, doc: $doc:literal
                $(, op: $op:ident $body:tt)?
                $(,)?
            }
        ),* $(,)?
    ) => {
        $(#[$attr])*
        pub enum Op {
            $($fixed)*
            $($( #[doc = $doc] $op, )?)*
        }
    };
}

crate::ops::op_table!(op_enum! {
/// Operations. Element-wise ones broadcast their operands to the node's shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Const(#[serde(with = "json_float")] f64),
    /// A recipe input, by index into `Graph::inputs`.
    Input(u32),
    Value(Value),
    /// The operand, broadcast to this node's shape.
    Copy,
    Neg,
    Not,
    Add,
    Sub,
    Mul,
    Div,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    And,
    Or,
    /// `where(cond, yes, no)`.
    Select,
    /// The operand's value; no gradient flows through it.
    StopGrad,
    /// Token t + offset of the same response, or the second operand (`fill`) outside it.
    Shift {
        offset: i32,
    },
    /// Distinct n-grams / n-grams of each response's token values (1 when shorter than n).
    DistinctNgrams {
        n: u32,
    },
    /// Each element's 0-based position in descending order among the operand's elements that map to
    /// the same element of level `within` (ties: the earlier element in the batch's order first); no
    /// gradient. Same shape as the operand.
    Rank {
        within: Level,
    },
    /// A pseudo-random number in [0, 1) per element of this node's level, keyed by the operand (the
    /// seed, batch-level) and the element's position (`uniform`); no gradient.
    Uniform,
    /// For each response, the smallest 0-based position in its group of a response joined to it by
    /// the transitive closure of the operand (a pair-level condition: pair (i, j) joins i and j when
    /// it is non-zero, so either direction suffices); no gradient. Resp-level, i32.
    Components,
    /// Sum of the operand's elements that map to each element of this node.
    ReduceSum,
    ReduceMax,
    ReduceMin,
    /// How many elements of the operand map to each element of this node (the operand's value unused).
    Count,
    /// Pick feature index `k` of the operand.
    Index(u32),
    /// Place the operand at feature index `k` of this node's rubric axis, 0 elsewhere (adjoint of Index).
    Unindex(u32),
    /// Response j's value, for each pair (i, j).
    Other,
    /// For each response j, the sum over pairs (i, j) (adjoint of Other).
    SumByOther,
    /// `y_t = x_t + decay·y_{t−1}` along each response (`reverse`: from the end).
    Scan {
        reverse: bool,
    },
    /// Matrix element (a, b) of this node reads the operand's (a vector along the rows axis) value a.
    SpreadRows,
    /// Matrix element (a, b) of this node reads the operand's (a vector along the columns axis) value b.
    SpreadCols,
    /// Element b of this node (a vector along the operand's columns axis) is Σ_a of the operand's
    /// matrix elements (a, b), at the same level (adjoint of `SpreadCols`).
    ContractRows,
    /// Element a of this node (a vector along the operand's rows axis) is Σ_b of the operand's matrix
    /// elements (a, b) (adjoint of `SpreadRows`).
    ContractCols,
}
});

impl Op {
    /// Whether the op works element by element (operands broadcast to the node's shape).
    pub fn is_elementwise(&self) -> bool {
        !matches!(
            self,
            Op::Const(_)
                | Op::Input(_)
                | Op::Value(_)
                | Op::ReduceSum
                | Op::ReduceMax
                | Op::ReduceMin
                | Op::Count
                | Op::Index(_)
                | Op::Unindex(_)
                | Op::Other
                | Op::SumByOther
                | Op::Scan { .. }
                | Op::Shift { .. }
                | Op::DistinctNgrams { .. }
                | Op::Rank { .. }
                | Op::Uniform
                | Op::Components
                | Op::SpreadRows
                | Op::SpreadCols
                | Op::ContractRows
                | Op::ContractCols
        )
    }

    /// Whether the op passes a gradient to its operands (autodiff and the torch exporter agree on it);
    /// a primitive's entry in the op table says whether it does.
    pub fn passes_gradient(&self) -> bool {
        match self.primitive() {
            Some(primitive) => primitive.gradient,
            None => matches!(
                self,
                Op::Copy
                    | Op::Neg
                    | Op::Add
                    | Op::Sub
                    | Op::Mul
                    | Op::Div
                    | Op::Select
                    | Op::ReduceSum
                    | Op::ReduceMax
                    | Op::ReduceMin
                    | Op::Index(_)
                    | Op::Unindex(_)
                    | Op::Other
                    | Op::SumByOther
                    | Op::SpreadRows
                    | Op::SpreadCols
                    | Op::ContractRows
                    | Op::ContractCols
            ),
        }
    }

    pub fn name(&self) -> String {
        match self {
            Op::Const(v) => format!("const {v}"),
            Op::Input(i) => format!("input #{i}"),
            Op::Index(k) => format!("index {k}"),
            Op::Unindex(k) => format!("unindex {k}"),
            Op::Scan { reverse } => format!("scan{}", if *reverse { " reverse" } else { "" }),
            Op::Shift { offset } => format!("shift {offset}"),
            Op::DistinctNgrams { n } => format!("distinct_ngrams {n}"),
            Op::Rank { within } => format!("rank within {}", within.name()),
            other => {
                let text = serde_json::to_string(other).unwrap_or_default();
                text.trim_matches('"').to_string()
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Node {
    pub op: Op,
    pub args: Vec<NodeId>,
    pub shape: Shape,
    pub elem: Elem,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InputInfo {
    pub name: String,
    pub elem: Elem,
    pub shape: Shape,
    pub differentiable: bool,
    #[serde(with = "json_float::option")]
    pub default: Option<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeepLevel {
    Group,
    Resp,
}

/// What the graph computes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Outputs {
    pub reward: Option<NodeId>,
    pub advantage: Option<NodeId>,
    pub loss: Option<NodeId>,
    pub metrics: Vec<(String, NodeId)>,
    /// Filters, evaluated on the whole batch before advantages; conjoined per level.
    pub keeps: Vec<(KeepLevel, NodeId)>,
    /// ∂loss/∂input for each differentiable input (by input index), after `autodiff`.
    pub gradients: Vec<(u32, NodeId)>,
    /// Named `let` values kept alive for `rlx score --show` (`compile_graph_showing`); evaluated by the
    /// interpreter only, never planned. Empty in every other graph (and absent from its JSON).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shown: Vec<(String, NodeId)>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RubricInfo {
    pub name: String,
    pub criteria: Vec<String>,
    /// Each criterion's text when the rubric's criteria come from rubric files (docs/sharing.md):
    /// what a judge signal left without `criteria` asks. Empty when no criterion has a text.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub texts: Vec<String>,
}

/// A `rollout { … }` setting as a sampler reads it (`rollout_settings`): what a trainer needs of the
/// recipe's rollout block, kept in `.rlxc` artifacts beside the graph.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RolloutInfo {
    pub key: String,
    pub value: RolloutValueInfo,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RolloutValueInfo {
    /// A constant, or a param with the value compiled into the graph.
    Number(#[serde(with = "json_float")] f64),
    /// A list of strings (`stop`, `modes`).
    Strings(Vec<String>),
    /// Any other expression (of params, `step`, `progress`, `n`, `resp_index`): evaluated by a sampler
    /// that implements it, per step or per response; the expression itself is not kept.
    Expression,
}

/// The recipe's rollout settings, in declaration order, with params at their values in `graph`.
pub fn rollout_settings(recipe: &crate::hir::Recipe, graph: &Graph) -> Vec<RolloutInfo> {
    use crate::hir::{ExprKind, RolloutValue};
    recipe
        .rollout
        .iter()
        .map(|setting| {
            let value = match &setting.value {
                RolloutValue::Strings(strings) => RolloutValueInfo::Strings(strings.clone()),
                RolloutValue::Expr(expr) => match &expr.kind {
                    ExprKind::Const(v) => RolloutValueInfo::Number(*v),
                    ExprKind::Param(id) => recipe
                        .params
                        .get(id.0 as usize)
                        .and_then(|p| graph.params.iter().find(|(n, _)| *n == p.name))
                        .map_or(RolloutValueInfo::Expression, |(_, v)| {
                            RolloutValueInfo::Number(*v)
                        }),
                    _ => RolloutValueInfo::Expression,
                },
            };
            RolloutInfo {
                key: setting.key.clone(),
                value,
            }
        })
        .collect()
}

/// JSON for the graph's floats: finite values as numbers, `inf`, `-inf` and `nan` as those strings
/// (plain JSON has no non-finite numbers, and a recipe may use `inf`; the `.rlxc` artifact relies on
/// the graph surviving a round trip exactly).
pub mod json_float {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Number(f64),
        Name(String),
    }

    fn repr(value: f64) -> Repr {
        if value.is_finite() {
            Repr::Number(value)
        } else if value.is_nan() {
            Repr::Name("nan".into())
        } else if value > 0.0 {
            Repr::Name("inf".into())
        } else {
            Repr::Name("-inf".into())
        }
    }

    fn value<E: serde::de::Error>(repr: Repr) -> Result<f64, E> {
        match repr {
            Repr::Number(x) => Ok(x),
            Repr::Name(name) => match name.as_str() {
                "inf" => Ok(f64::INFINITY),
                "-inf" => Ok(f64::NEG_INFINITY),
                "nan" => Ok(f64::NAN),
                other => Err(E::custom(format!(
                    "expected a number, \"inf\", \"-inf\" or \"nan\", found \"{other}\""
                ))),
            },
        }
    }

    pub fn serialize<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
        repr(*x).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        value(Repr::deserialize(d)?)
    }

    pub mod option {
        use super::*;

        pub fn serialize<S: Serializer>(x: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
            x.map(repr).serialize(s)
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
            Option::<Repr>::deserialize(d)?.map(value).transpose()
        }
    }

    pub mod pairs {
        use super::*;

        pub fn serialize<S: Serializer>(x: &[(String, f64)], s: S) -> Result<S::Ok, S::Error> {
            let pairs: Vec<(&String, Repr)> = x.iter().map(|(n, v)| (n, repr(*v))).collect();
            pairs.serialize(s)
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Vec<(String, f64)>, D::Error> {
            Vec::<(String, Repr)>::deserialize(d)?
                .into_iter()
                .map(|(n, r)| Ok((n, value(r)?)))
                .collect()
        }
    }
}

/// The IR of one recipe, for one assignment of its params.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Graph {
    pub nodes: Vec<Node>,
    pub inputs: Vec<InputInfo>,
    #[serde(with = "json_float::pairs")]
    pub params: Vec<(String, f64)>,
    pub rubrics: Vec<RubricInfo>,
    pub outputs: Outputs,
    /// The recipe's `state` declarations (absent from the JSON of a graph without any).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub states: Vec<StateInfo>,
}

/// The prefix of a state update's name among `Outputs::metrics`: the update of state `coef` is the
/// metric `state.coef` (a metric's own name cannot contain `.`).
pub const STATE_METRIC_PREFIX: &str = "state.";

/// A `state` of the recipe (docs/language.md, "State across steps"). A step reads it through the
/// batch-level input `input` (no gradient; its default is `init`) and computes its next value as the
/// metric `metric` (`state.NAME`), on the kept responses as every metric is; the caller (the trainer,
/// `rlx score --state`) carries that value into the next step's input.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StateInfo {
    pub name: String,
    pub elem: Elem,
    /// The initial value, with the recipe's params at their values in this graph.
    #[serde(with = "json_float")]
    pub init: f64,
    /// Index into `Graph::inputs`.
    pub input: u32,
    /// Name in `Outputs::metrics`.
    pub metric: String,
}

impl Graph {
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.0 as usize]
    }

    /// Every output node, in a fixed order.
    pub fn output_nodes(&self) -> Vec<NodeId> {
        let o = &self.outputs;
        o.reward
            .iter()
            .chain(o.advantage.iter())
            .chain(o.loss.iter())
            .copied()
            .chain(o.metrics.iter().map(|(_, id)| *id))
            .chain(o.keeps.iter().map(|(_, id)| *id))
            .chain(o.gradients.iter().map(|(_, id)| *id))
            .chain(o.shown.iter().map(|(_, id)| *id))
            .collect()
    }

    /// The nodes `roots` depend on (including themselves), as a mask.
    pub fn cone(&self, roots: &[NodeId]) -> Vec<bool> {
        let mut live = vec![false; self.nodes.len()];
        let mut stack: Vec<NodeId> = roots.to_vec();
        while let Some(id) = stack.pop() {
            if std::mem::replace(&mut live[id.0 as usize], true) {
                continue;
            }
            stack.extend(self.node(id).args.iter().copied());
        }
        live
    }

    /// Drop nodes no output needs, renumbering the rest (dead-code elimination).
    pub fn eliminate_dead_code(&mut self) {
        let live = self.cone(&self.output_nodes());
        let mut renumber = vec![u32::MAX; self.nodes.len()];
        let mut kept = Vec::new();
        for (index, node) in self.nodes.iter().enumerate() {
            if live[index] {
                renumber[index] = kept.len() as u32;
                let mut node = node.clone();
                for arg in &mut node.args {
                    *arg = NodeId(renumber[arg.0 as usize]);
                }
                kept.push(node);
            }
        }
        self.nodes = kept;
        let map = |id: &mut NodeId| *id = NodeId(renumber[id.0 as usize]);
        let o = &mut self.outputs;
        o.reward.iter_mut().for_each(map);
        o.advantage.iter_mut().for_each(map);
        o.loss.iter_mut().for_each(map);
        o.metrics.iter_mut().for_each(|(_, id)| map(id));
        o.keeps.iter_mut().for_each(|(_, id)| map(id));
        o.gradients.iter_mut().for_each(|(_, id)| map(id));
        o.shown.iter_mut().for_each(|(_, id)| map(id));
    }
}

/// Builds a graph with hash-consing (CSE) and constant folding.
pub struct Builder {
    pub graph: Graph,
    memo: HashMap<String, NodeId>,
}

impl Builder {
    pub fn new(
        inputs: Vec<InputInfo>,
        params: Vec<(String, f64)>,
        rubrics: Vec<RubricInfo>,
    ) -> Builder {
        Builder {
            graph: Graph {
                nodes: Vec::new(),
                inputs,
                params,
                rubrics,
                outputs: Outputs::default(),
                states: Vec::new(),
            },
            memo: HashMap::new(),
        }
    }

    pub fn shape(&self, id: NodeId) -> &Shape {
        &self.graph.node(id).shape
    }

    pub fn elem(&self, id: NodeId) -> Elem {
        self.graph.node(id).elem
    }

    pub fn constant_value(&self, id: NodeId) -> Option<f64> {
        match self.graph.node(id).op {
            Op::Const(value) => Some(value),
            _ => None,
        }
    }

    pub fn constant(&mut self, value: f64, elem: Elem) -> NodeId {
        self.add_raw(Op::Const(value), Vec::new(), Shape::BATCH, elem)
    }

    /// Add a node; identical nodes are shared and element-wise ops on constants are folded.
    pub fn add(&mut self, op: Op, args: Vec<NodeId>, shape: Shape, elem: Elem) -> NodeId {
        if op.is_elementwise() && op != Op::Copy {
            let constants: Option<Vec<f64>> =
                args.iter().map(|&a| self.constant_value(a)).collect();
            if let Some(values) = constants {
                if shape == Shape::BATCH || !values.is_empty() {
                    if let Some(folded) = fold(&op, &values) {
                        return self.constant(folded, elem);
                    }
                }
            }
        }
        // Broadcasting a constant is the constant.
        if op == Op::Copy {
            if let Some(value) = self.constant_value(args[0]) {
                return self.constant(value, elem);
            }
            if *self.shape(args[0]) == shape {
                return args[0];
            }
        }
        self.add_raw(op, args, shape, elem)
    }

    fn add_raw(&mut self, op: Op, args: Vec<NodeId>, shape: Shape, elem: Elem) -> NodeId {
        debug_assert!(
            !matches!(
                op,
                Op::ReduceSum | Op::ReduceMax | Op::ReduceMin | Op::Count
            ) || shape.broadcasts_to(&self.graph.node(args[0]).shape),
            "reduction of {} to {shape}",
            self.graph.node(args[0]).shape
        );
        debug_assert!(
            !op.is_elementwise()
                || args
                    .iter()
                    .all(|a| self.graph.node(*a).shape.broadcasts_to(&shape)),
            "{op:?} at {shape} over operands that do not broadcast to it"
        );
        let key = format!("{op:?}|{args:?}|{shape:?}|{elem:?}");
        if let Some(&id) = self.memo.get(&key) {
            return id;
        }
        let id = NodeId(self.graph.nodes.len() as u32);
        self.graph.nodes.push(Node {
            op,
            args,
            shape,
            elem,
        });
        self.memo.insert(key, id);
        id
    }
}

/// Evaluate an element-wise op on scalars (the interpreter uses the same definitions; a primitive's
/// are its op table entry's, `ops::eval`).
pub fn fold(op: &Op, values: &[f64]) -> Option<f64> {
    let a = values.first().copied().unwrap_or(0.0);
    let b = values.get(1).copied().unwrap_or(0.0);
    let truth = |x: bool| f64::from(u8::from(x));
    Some(match op {
        Op::Copy | Op::StopGrad => a,
        Op::Neg => -a,
        Op::Not => truth(a == 0.0),
        Op::Add => a + b,
        Op::Sub => a - b,
        Op::Mul => a * b,
        Op::Div => a / b,
        Op::Eq => truth(a == b),
        Op::Ne => truth(a != b),
        Op::Lt => truth(a < b),
        Op::Le => truth(a <= b),
        Op::Gt => truth(a > b),
        Op::Ge => truth(a >= b),
        Op::And => truth(a != 0.0 && b != 0.0),
        Op::Or => truth(a != 0.0 || b != 0.0),
        Op::Select => {
            if a != 0.0 {
                b
            } else {
                values.get(2).copied().unwrap_or(0.0)
            }
        }
        _ => return crate::ops::eval(op, values),
    })
}

/// splitmix64's output function (Steele, Lea and Flood 2014): a bijective mix of 64 bits.
fn splitmix64_mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `uniform`'s number for `seed` at `position` (docs/language.md, "Pseudo-random numbers"): the seed
/// truncated to an integer s (two's complement in 64 bits; NaN as 0, ±∞ saturating), then
/// h = mix(mix(s + 0x9E3779B97F4A7C15) ⊕ position) with splitmix64's `mix`, and u = ⌊h / 2¹¹⌋ · 2⁻⁵³:
/// 53 random bits, a double in [0, 1) that every backend computes to the same bits.
pub fn uniform(seed: f64, position: u64) -> f64 {
    let s = seed as i64 as u64;
    let h = splitmix64_mix(splitmix64_mix(s.wrapping_add(0x9E37_79B9_7F4A_7C15)) ^ position);
    (h >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_is_splitmix64() {
        // splitmix64's published first output for state 0 is 0xE220A8397B1DCDAF: mix(0 + γ).
        assert_eq!(splitmix64_mix(0x9E37_79B9_7F4A_7C15), 0xE220_A839_7B1D_CDAF);
        let u = uniform(0.0, 0);
        assert_eq!(
            u,
            (splitmix64_mix(0xE220_A839_7B1D_CDAF) >> 11) as f64 / (1u64 << 53) as f64
        );
        let values: Vec<f64> = (0..1000).map(|p| uniform(7.0, p)).collect();
        assert!(values.iter().all(|u| (0.0..1.0).contains(u)));
        let mean = values.iter().sum::<f64>() / 1000.0;
        assert!((mean - 0.5).abs() < 0.05, "mean {mean}");
        assert_ne!(uniform(7.0, 3), uniform(8.0, 3));
        assert_eq!(uniform(-1.9, 5), uniform(-1.0, 5));
    }
}
