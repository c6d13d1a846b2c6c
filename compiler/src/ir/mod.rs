//! Stage `lower` → IR: a dataflow graph of array operations, each node annotated with its shape (level
//! and feature axis). User functions are inlined, params folded to constants, common subexpressions
//! shared (hash-consing) and dead nodes dropped. Stage `autodiff` (`autodiff.rs`) appends the gradient of
//! the loss to the same graph.
//!
//! # Shapes and element order
//! A node's value is a flat array in the element order of its shape (level and feature axis), defined
//! in crate rlx-core (`rlx_core::Shape`'s module documentation), which the runtime shares.
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
pub use rlx_core::{
    Feature, InputInfo, KeepLevel, Level, OutputInfo, RubricInfo, Shape, Signature,
};

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

/// One operation of the graph.
///
/// Equality compares what the node computes (`op`, `args`, `shape`, `elem`), never its `span`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Node {
    pub op: Op,
    pub args: Vec<NodeId>,
    pub shape: Shape,
    pub elem: Elem,
    /// The recipe expression the node was lowered from (see [`Site`]); `None` for a node made by
    /// hand (tests, `ir::cut`'s new inputs) or read from an artifact written without spans.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub span: Option<Site>,
    /// When `span` lies in the body of an inlined function: the outermost call it was inlined
    /// through (an expression of the recipe's own file, where the user can act on it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<Site>,
}

impl PartialEq for Node {
    fn eq(&self, other: &Node) -> bool {
        self.op == other.op
            && self.args == other.args
            && self.shape == other.shape
            && self.elem == other.elem
    }
}

/// Where in the sources a node comes from: the byte range `start..end` of the checked expression it
/// was lowered from, in file `file` (a [`crate::FileId`] of the compilation's
/// [`crate::SourceMap`]; an artifact lists its files, `Artifact::files`). A node made by `autodiff`
/// has the site of the node it differentiates; a node shared by hash-consing keeps the site of the
/// expression that made it first. Sites are not part of a node's identity: equality, CSE and the
/// printed IR ignore them. Runtime diagnostics point at them (`rlx_runtime::origin`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Site {
    pub file: u32,
    pub start: u32,
    pub end: u32,
}

impl Site {
    pub fn new(file: crate::FileId, span: crate::syntax::ast::Span) -> Site {
        Site {
            file: file.0,
            start: span.start,
            end: span.end,
        }
    }

    pub fn file_id(&self) -> crate::FileId {
        crate::FileId(self.file)
    }

    pub fn span(&self) -> crate::syntax::ast::Span {
        crate::syntax::ast::Span {
            start: self.start,
            end: self.end,
        }
    }
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

pub use rlx_core::json_float;

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
    /// The signature of the graph's recipe: its inputs, rubrics, states and outputs, what a batch is
    /// validated against (`rlx_core::Signature::validate`). Its `params` are empty: a graph keeps only
    /// their values, folded in (`Graph::params`); a checked recipe's and an artifact's signatures
    /// list them.
    pub fn signature(&self) -> Signature {
        let o = &self.outputs;
        let output = |name: &str, id: NodeId| OutputInfo {
            name: name.to_string(),
            shape: self.node(id).shape.clone(),
        };
        let outputs = [
            ("reward", o.reward),
            ("advantage", o.advantage),
            ("loss", o.loss),
        ]
        .into_iter()
        .filter_map(|(name, id)| Some(output(name, id?)))
        .chain(o.metrics.iter().map(|(name, id)| output(name, *id)))
        .collect();
        Signature {
            inputs: self.inputs.clone(),
            params: Vec::new(),
            rubrics: self.rubrics.clone(),
            states: self
                .states
                .iter()
                .filter_map(|s| Some(self.inputs.get(s.input as usize)?.name.clone()))
                .collect(),
            outputs,
        }
    }

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
    /// The span and call site new nodes get (`Builder::at`): the expression being lowered, or the
    /// node being differentiated.
    origin: Origin,
}

/// A node's `span` and `call` (see [`Node`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Origin {
    pub span: Option<Site>,
    pub call: Option<Site>,
}

impl Node {
    pub fn origin(&self) -> Origin {
        Origin {
            span: self.span,
            call: self.call,
        }
    }
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
            origin: Origin::default(),
        }
    }

    /// Give the nodes added from now on `origin`; returns the origin it replaces (to restore it).
    pub fn at(&mut self, origin: Origin) -> Origin {
        std::mem::replace(&mut self.origin, origin)
    }

    /// The origin new nodes get.
    pub fn origin(&self) -> Origin {
        self.origin
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
            span: self.origin.span,
            call: self.origin.call,
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

    /// The text of a node's span in `text`.
    fn spanned<'t>(text: &'t str, node: &Node) -> &'t str {
        let site = node.span.expect("every node has a span");
        &text[site.start as usize..site.end as usize]
    }

    #[test]
    fn nodes_carry_the_span_of_their_expression_and_gradients_that_of_their_node() {
        let text = "input logp : f32[tok] policy\ninput score : f32[resp]\nreward = score\nadvantage = reward - mean(reward over resp)\nloss = mean(-advantage * exp(logp) over tok, batch)\n";
        let checked = crate::check_source("t.rlx", text);
        let recipe = checked.recipe.as_ref().expect("checks");
        let forward = lower::lower(recipe, &[]);
        let graph = crate::compile_graph(recipe, &[]).expect("compiles");
        assert!(graph.nodes.iter().all(|node| node.span.is_some()));
        let exp = graph
            .nodes
            .iter()
            .position(|node| node.op == Op::Exp)
            .expect("an exp node");
        assert_eq!(spanned(text, &graph.nodes[exp]), "exp(logp)");
        // ∂exp(x)/∂x = exp(x): the gradient multiplies by the exp node, with its span.
        let backward = graph
            .nodes
            .iter()
            .skip(forward.nodes.len())
            .find(|node| node.args.contains(&NodeId(exp as u32)))
            .expect("a gradient node reads the exp node");
        assert_eq!(spanned(text, backward), "exp(logp)");
        assert!(graph.nodes.iter().all(|node| node.call.is_none()));
    }

    #[test]
    fn spans_are_not_part_of_a_node() {
        let text =
            "input score : f32[resp]\nreward = score * 2\nmetric a = mean(score * 2 over batch)\n";
        let checked = crate::check_source("t.rlx", text);
        let recipe = checked.recipe.as_ref().expect("checks");
        let graph = crate::compile_graph(recipe, &[]).expect("compiles");
        // `score * 2` is shared (CSE): it keeps the span of the expression that made it first.
        let products: Vec<&Node> = graph.nodes.iter().filter(|n| n.op == Op::Mul).collect();
        assert_eq!(products.len(), 1);
        assert_eq!(
            products[0].span.map(|s| s.start as usize),
            text.find("score * 2")
        );
        let mut unspanned = graph.clone();
        for node in &mut unspanned.nodes {
            node.span = None;
            node.call = None;
        }
        assert_eq!(unspanned, graph);
        assert_eq!(print::to_text(&unspanned), print::to_text(&graph));
        let json = serde_json::to_string(&graph).expect("serialises");
        let back: Graph = serde_json::from_str(&json).expect("reads back");
        assert_eq!(
            back.nodes.iter().map(|n| n.span).collect::<Vec<_>>(),
            graph.nodes.iter().map(|n| n.span).collect::<Vec<_>>()
        );
    }

    #[test]
    fn an_inlined_body_knows_its_call() {
        let text = "import std/advantage.{group_zscore}\ninput score : f32[resp]\nreward = score\nadvantage = group_zscore(reward, 0.5)\n";
        let checked = crate::check_source("t.rlx", text);
        let recipe = checked.recipe.as_ref().expect("checks");
        let graph = crate::compile_graph(recipe, &[]).expect("compiles");
        let division = graph
            .nodes
            .iter()
            .find(|node| node.op == Op::Div && node.span.is_some_and(|s| s.file != checked.root.0))
            .expect("the z-score's division, in std/advantage");
        let call = division.call.expect("inlined through a call");
        assert_eq!(call.file, checked.root.0);
        assert_eq!(
            &text[call.start as usize..call.end as usize],
            "group_zscore(reward, 0.5)"
        );
    }
}
