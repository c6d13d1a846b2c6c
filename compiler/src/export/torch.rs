//! IR → a PyTorch module. Every IR node becomes one line of vectorised torch code (no Python loop over
//! tokens or responses: group reductions are `index_add`/`scatter_reduce` over the group index, pairs a
//! [B, B] same-group mask, feature axes a trailing padded dimension), grouped into one function per
//! stage of the recipe (reward, keep, advantage, loss, each metric). The helpers these lines call, and
//! the entry points for verl and TRL, are the fixed runtime in `prelude.py`.
//!
//! Four evaluation paths are generated from the same graph:
//! - the whole recipe (`evaluate`), with the interpreter's two-phase `keep` semantics;
//! - the loss given a trainer's advantages (verl's `policy_loss`, TRL's `loss` with `advantages`): the
//!   graph cut at the advantage node, each metric on its own so that those whose inputs a trainer does
//!   not pass can be left out (and named);
//! - the advantage given a trainer's rewards (verl's `advantage_estimator`): cut at the reward node;
//! - the reward side (TRL's reward functions, `reward_metrics`): reward, keep and advantage, and the
//!   metrics that read nothing else, which a trainer's loss cannot compute for want of their inputs.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use super::{ExportError, ModuleInfo, SymbolicGraph};
use crate::check::builtins::Value;
use crate::ir::{Elem, Feature, Graph, KeepLevel, Level, NodeId, Op, Shape};

const PRELUDE: &str = include_str!("prelude.py");

/// A section rule in the generated module.
const RULE: &str =
    "# ---------------------------------------------------------------------------------------------------";

/// Python keywords and the names the generated functions use for themselves.
const RESERVED: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield", "L", "x", "v", "torch", "math", "F",
];

/// Fail with the feature's name when the graph uses something the exporter cannot express.
pub fn check_graph(graph: &Graph) -> Result<(), ExportError> {
    for node in &graph.nodes {
        match (node.shape.level, &node.shape.feature) {
            (Level::Tok, Some(_)) => {
                return Err(ExportError {
                    feature: format!("a token-level value with a feature axis ({})", node.shape),
                    message: "feature axes are laid out as a trailing dimension of group-, \
                              response- and pair-level tensors only"
                        .into(),
                })
            }
            (Level::Batch, Some(Feature::Crit)) => {
                return Err(ExportError {
                    feature: format!("a `crit` axis at batch level ({})", node.shape),
                    message: "criteria differ per prompt and cannot be carried across groups"
                        .into(),
                })
            }
            _ => {}
        }
    }
    Ok(())
}

/// The generated module for a lowered recipe.
pub fn emit(symbolic: &SymbolicGraph, info: &ModuleInfo) -> Result<String, ExportError> {
    check_graph(&symbolic.graph)?;
    Ok(Emitter::new(symbolic, info).module())
}

/// The name of the stage function of a metric: `_metric_NAME`, and `_state_NAME` for the update of
/// state `NAME` (the metric `state.NAME`, whose name is no Python identifier).
fn metric_function(metric: &str) -> String {
    match metric.strip_prefix(crate::ir::STATE_METRIC_PREFIX) {
        Some(state) => format!("_state_{state}"),
        None => format!("_metric_{metric}"),
    }
}

/// `level` or `level:feature`, as the runtime parses it (a matrix as `level:ROWS*COLS`).
fn shape_text(graph: &Graph, shape: &Shape) -> String {
    let level = shape.level.name();
    match &shape.feature {
        None => level.to_string(),
        Some(feature) => format!("{level}:{}", feature_atom(graph, feature)),
    }
}

/// A feature axis as the runtime's shape strings write it: `crit`, `dim`, `NAME/K` for a rubric,
/// `ROWS*COLS` for a matrix.
fn feature_atom(graph: &Graph, feature: &Feature) -> String {
    match feature {
        Feature::Crit => "crit".into(),
        Feature::Dim => "dim".into(),
        Feature::Rubric { index, len } => {
            let name = graph
                .rubrics
                .get(*index as usize)
                .map(|r| r.name.as_str())
                .unwrap_or("rubric");
            format!("{name}/{len}")
        }
        Feature::Matrix { rows, cols } => {
            format!(
                "{}*{}",
                feature_atom(graph, rows),
                feature_atom(graph, cols)
            )
        }
    }
}

fn type_text(graph: &Graph, elem: Elem, shape: &Shape) -> String {
    match &shape.feature {
        None => format!("{}[{}]", elem.name(), shape.level.name()),
        Some(feature) => format!(
            "{}[{}, {}]",
            elem.name(),
            shape.level.name(),
            crate::ir::print::feature_text(graph, feature)
        ),
    }
}

/// A Python float literal.
fn py_float(value: f64) -> String {
    if value.is_nan() {
        "math.nan".into()
    } else if value == f64::INFINITY {
        "math.inf".into()
    } else if value == f64::NEG_INFINITY {
        "-math.inf".into()
    } else {
        let text = format!("{value:?}");
        if text.contains('.') || text.contains('e') {
            text
        } else {
            format!("{text}.0")
        }
    }
}

fn py_str(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".into())
}

fn mangle(name: &str) -> String {
    let numbered =
        name.len() > 1 && name.starts_with('t') && name[1..].chars().all(|c| c.is_ascii_digit());
    if RESERVED.contains(&name) || name.starts_with('_') || numbered {
        format!("{name}_")
    } else {
        name.to_string()
    }
}

/// What a stage function returns.
#[derive(Clone)]
enum Ret {
    Node(NodeId),
    Keeps(Vec<(KeepLevel, NodeId)>),
}

#[derive(Clone)]
struct Stage {
    function: String,
    doc: String,
    /// Nodes computed here, in graph order.
    nodes: Vec<NodeId>,
    ret: Ret,
}

/// What the stages of a path read (variable, source) and pass on.
struct PathPlan {
    reads: Vec<Vec<(String, String)>>,
    exports: Vec<Vec<NodeId>>,
}

struct Emitter<'a> {
    graph: &'a Graph,
    symbolic: &'a SymbolicGraph,
    info: &'a ModuleInfo,
    var: Vec<String>,
    active: Vec<bool>,
}

impl<'a> Emitter<'a> {
    fn new(symbolic: &'a SymbolicGraph, info: &'a ModuleInfo) -> Emitter<'a> {
        let graph = &symbolic.graph;
        let count = graph.nodes.len();
        let active = crate::ir::autodiff::active_nodes(graph);
        // Variable names: the recipe's names where it has them.
        let mut preferred: HashMap<NodeId, String> = HashMap::new();
        for (index, node) in graph.nodes.iter().enumerate() {
            if let Op::Input(i) = node.op {
                preferred.insert(NodeId(index as u32), graph.inputs[i as usize].name.clone());
            }
        }
        let o = &graph.outputs;
        let mut named = |id: NodeId, name: String| {
            preferred.entry(id).or_insert(name);
        };
        if let Some(id) = o.reward {
            named(id, "reward".into());
        }
        if let Some(id) = o.advantage {
            named(id, "advantage".into());
        }
        let mut lets: Vec<(&NodeId, &String)> = symbolic.names.iter().collect();
        lets.sort();
        for (id, name) in lets {
            named(*id, name.clone());
        }
        if let Some(id) = o.loss {
            named(id, "loss".into());
        }
        for (name, id) in &o.metrics {
            named(*id, name.clone());
        }
        for (level, id) in &o.keeps {
            named(*id, format!("keep_{}", format!("{level:?}").to_lowercase()));
        }
        let mut used = HashSet::new();
        let mut var = Vec::with_capacity(count);
        for index in 0..count {
            let name = match preferred.get(&NodeId(index as u32)) {
                Some(name) => mangle(name),
                None => format!("t{index}"),
            };
            let name = if used.contains(&name) {
                format!("{name}_{index}")
            } else {
                name
            };
            used.insert(name.clone());
            var.push(name);
        }
        Emitter {
            graph,
            symbolic,
            info,
            var,
            active,
        }
    }

    fn node(&self, id: NodeId) -> &crate::ir::Node {
        self.graph.node(id)
    }

    fn shape(&self, id: NodeId) -> String {
        shape_text(self.graph, &self.node(id).shape)
    }

    fn is_param(&self, input: u32) -> bool {
        input as usize >= self.symbolic.recipe_inputs
    }

    /// Nodes with no line of their own: constants and built-in values (written inline).
    fn is_atom(&self, id: NodeId) -> bool {
        matches!(self.node(id).op, Op::Const(_) | Op::Value(_))
    }

    /// The nodes `roots` depend on, not looking past `cut` (which are included).
    fn cone(&self, roots: &[NodeId], cut: &HashSet<NodeId>) -> Vec<bool> {
        let mut live = vec![false; self.graph.nodes.len()];
        let mut stack: Vec<NodeId> = roots.to_vec();
        while let Some(id) = stack.pop() {
            if std::mem::replace(&mut live[id.0 as usize], true) || cut.contains(&id) {
                continue;
            }
            stack.extend(self.node(id).args.iter().copied());
        }
        live
    }

    /// What of the tokens the cone of `roots` (not past `cut`, the cut nodes being given) reads, as
    /// a Python literal for `_prepare`'s `tokens`: the first token-level input, else `length`, else
    /// any other token-level value; `None` when it reads no token. A stage that reads tokens needs
    /// the batch's true token counts (`response_mask` or `response_length`), never the padded width.
    fn token_reason(&self, roots: &[NodeId], cut: &HashSet<NodeId>) -> String {
        let live = self.cone(roots, cut);
        let nodes: Vec<NodeId> = (0..live.len())
            .filter(|&i| live[i])
            .map(|i| NodeId(i as u32))
            .filter(|id| !cut.contains(id))
            .collect();
        let input = nodes.iter().find_map(|id| match self.node(*id).op {
            Op::Input(i) if self.node(*id).shape.level == Level::Tok => Some(format!(
                "the token-level input `{}`",
                self.graph.inputs[i as usize].name
            )),
            _ => None,
        });
        let length = || {
            nodes
                .iter()
                .any(|id| matches!(self.node(*id).op, Op::Value(Value::Length)))
                .then(|| "`length` (each response's token count)".to_string())
        };
        let other = || {
            nodes
                .iter()
                .any(|id| self.node(*id).shape.level == Level::Tok)
                .then(|| "token-level values (`token_index`, a reduction over `tok`)".to_string())
        };
        input
            .or_else(length)
            .or_else(other)
            .map_or("None".into(), |reason| py_str(&reason))
    }

    /// The nodes of `roots`' cone (not past `cut`) that need a line and are not in `done`.
    fn stage_nodes(&self, roots: &[NodeId], cut: &HashSet<NodeId>, done: &[bool]) -> Vec<NodeId> {
        self.cone(roots, cut)
            .iter()
            .enumerate()
            .filter(|(index, live)| **live && !done[*index])
            .map(|(index, _)| NodeId(index as u32))
            .filter(|id| {
                !cut.contains(id)
                    && !self.is_atom(*id)
                    && !matches!(self.node(*id).op, Op::Input(_))
            })
            .collect()
    }

    /// A node as an operand, as it is (a variable, a literal, or a built-in value).
    fn atom(&self, id: NodeId) -> String {
        match &self.node(id).op {
            Op::Const(value) => py_float(*value),
            Op::Value(value) => match value {
                Value::Step => "L.step".into(),
                Value::Progress => "L.progress".into(),
                Value::N => "L.n".into(),
                Value::RespIndex => "L.resp_index".into(),
                Value::Length => "L.length".into(),
                Value::TokenIndex => "L.token_index".into(),
                Value::Inf => "L.scalar(math.inf)".into(),
                Value::Pi => "L.scalar(math.pi)".into(),
            },
            _ => self.var[id.0 as usize].clone(),
        }
    }

    /// A node as an operand of a node of shape `to`, indexed so that torch broadcasting lines it up.
    fn operand(&self, id: NodeId, to: &Shape) -> String {
        let node = self.node(id);
        let mut text = self.atom(id);
        if matches!(node.op, Op::Const(_)) {
            return text;
        }
        let from = &node.shape;
        let mut level = from.level;
        if level == Level::Group && !matches!(to.level, Level::Group | Level::Batch) {
            text.push_str("[L.ix]");
            level = Level::Resp;
        }
        if level == Level::Resp && matches!(to.level, Level::Tok | Level::Pair) {
            text.push_str("[:, None]");
        }
        if to.feature.is_some() && from.feature.is_none() && from.level != Level::Batch {
            text.push_str("[..., None]");
        }
        text
    }

    /// The matrix axes of a node's shape, as `_spread`/`_contract` read them.
    fn matrix_atom(&self, id: NodeId) -> String {
        match &self.node(id).shape.feature {
            Some(feature) => feature_atom(self.graph, feature),
            None => String::new(),
        }
    }

    /// The right-hand side of a node's line.
    fn rhs(&self, id: NodeId) -> String {
        let node = self.node(id);
        let shape = &node.shape;
        let args = &node.args;
        let a = |i: usize| self.operand(args[i], shape);
        let src = |i: usize| self.shape(args[i]);
        let dst = self.shape(id);
        let text = match &node.op {
            Op::Copy => format!("_expand(L, {}, \"{dst}\")", a(0)),
            Op::Neg => format!("-{}", a(0)),
            Op::Not => format!("({} == 0).to(L.dtype)", a(0)),
            Op::Add => format!("{} + {}", a(0), a(1)),
            Op::Sub => format!("{} - {}", a(0), a(1)),
            Op::Mul => format!("{} * {}", a(0), a(1)),
            Op::Div => format!("{} / {}", a(0), a(1)),
            // With a differentiable exponent (the table's `torch.pow` otherwise).
            Op::Pow if self.active[args[1].0 as usize] => {
                format!("_pow(L, {}, {})", a(0), a(1))
            }
            Op::Eq => format!("({} == {}).to(L.dtype)", a(0), a(1)),
            Op::Ne => format!("({} != {}).to(L.dtype)", a(0), a(1)),
            Op::Lt => format!("({} < {}).to(L.dtype)", a(0), a(1)),
            Op::Le => format!("({} <= {}).to(L.dtype)", a(0), a(1)),
            Op::Gt => format!("({} > {}).to(L.dtype)", a(0), a(1)),
            Op::Ge => format!("({} >= {}).to(L.dtype)", a(0), a(1)),
            Op::And => format!("(({} != 0) & ({} != 0)).to(L.dtype)", a(0), a(1)),
            Op::Or => format!("(({} != 0) | ({} != 0)).to(L.dtype)", a(0), a(1)),
            Op::Select => format!("_where(L, {}, {}, {})", a(0), a(1), a(2)),
            Op::StopGrad => format!("{}.detach()", a(0)),
            Op::Shift { offset } => format!("_shift(L, {}, {offset}, {})", a(0), a(1)),
            Op::Scan { reverse } => format!(
                "_scan(L, {}, {}, reverse={})",
                a(0),
                a(1),
                if *reverse { "True" } else { "False" }
            ),
            Op::DistinctNgrams { n } => format!("_distinct_ngrams(L, {}, {n})", a(0)),
            Op::Uniform => format!("_uniform(L, {}, \"{dst}\")", self.atom(args[0])),
            Op::Components => format!("_components(L, {})", a(0)),
            Op::Rank { within } => format!(
                "_rank(L, {}, \"{}\", \"{dst}\", \"{}\"{})",
                self.atom(args[0]),
                src(0),
                within.name(),
                match args.get(1) {
                    Some(mask) => format!(", {}, \"{}\"", self.atom(*mask), self.shape(*mask)),
                    None => String::new(),
                }
            ),
            Op::ReduceSum => format!("_sum(L, {}, \"{}\", \"{dst}\")", self.atom(args[0]), src(0)),
            Op::ReduceMax | Op::ReduceMin => format!(
                "_{}(L, {}, \"{}\", \"{dst}\"{})",
                if node.op == Op::ReduceMax {
                    "max"
                } else {
                    "min"
                },
                self.atom(args[0]),
                src(0),
                if self.active[args[0].0 as usize] {
                    ", grad=True"
                } else {
                    ""
                }
            ),
            Op::Count => format!("_count(L, \"{}\", \"{dst}\")", src(0)),
            Op::Index(k) => format!("{}[..., {k}]", self.atom(args[0])),
            Op::Unindex(k) => {
                let size = match &shape.feature {
                    Some(Feature::Rubric { len, .. }) => *len,
                    _ => 1,
                };
                format!("_unindex(L, {}, {k}, {size})", self.atom(args[0]))
            }
            Op::SpreadRows | Op::SpreadCols => format!(
                "_spread(L, {}, \"{}\", {})",
                self.atom(args[0]),
                self.matrix_atom(id),
                if node.op == Op::SpreadRows {
                    "True"
                } else {
                    "False"
                }
            ),
            Op::ContractRows | Op::ContractCols => format!(
                "_contract(L, {}, \"{}\", {})",
                self.atom(args[0]),
                self.matrix_atom(args[0]),
                if node.op == Op::ContractRows {
                    "True"
                } else {
                    "False"
                }
            ),
            Op::Other => format!("_other(L, {})", self.atom(args[0])),
            Op::SumByOther => format!("_sum_by_other(L, {})", self.atom(args[0])),
            Op::Const(_) | Op::Input(_) | Op::Value(_) => self.atom(id),
            // A primitive: its op table expression (every other op has its arm above).
            op => match op.primitive() {
                Some(primitive) => {
                    let operands: Vec<String> = (0..primitive.arity).map(a).collect();
                    primitive.torch_expr(&operands)
                }
                None => self.atom(id),
            },
        };
        // An element-wise result covers the node's shape only if some operand has its level (and
        // its feature axis); otherwise materialise it.
        if node.op.is_elementwise() && node.op != Op::Copy && shape.level != Level::Batch {
            let operands: Vec<&Shape> = args.iter().map(|a| &self.node(*a).shape).collect();
            let covers_level = operands.iter().any(|s| s.level == shape.level);
            let covers_feature =
                shape.feature.is_none() || operands.iter().any(|s| s.feature.is_some());
            if !covers_level || !covers_feature {
                return format!("_expand(L, {text}, \"{dst}\")");
            }
        }
        text
    }

    /// The recipe inputs (not params) that `nodes` and `extra` read, in input order.
    fn inputs_read(&self, nodes: &[NodeId], extra: &[NodeId]) -> Vec<String> {
        self.inputs_read_except(nodes, extra, &HashSet::new())
    }

    /// The same, not counting the `cut` nodes (whose values a trainer supplies).
    fn inputs_read_except(
        &self,
        nodes: &[NodeId],
        extra: &[NodeId],
        cut: &HashSet<NodeId>,
    ) -> Vec<String> {
        let mut read = HashSet::new();
        let mut visit = |id: NodeId| {
            if cut.contains(&id) {
                return;
            }
            if let Op::Input(i) = self.node(id).op {
                if !self.is_param(i) {
                    read.insert(i);
                }
            }
        };
        for id in nodes {
            self.node(*id).args.iter().for_each(|a| visit(*a));
        }
        extra.iter().for_each(|id| visit(*id));
        let mut read: Vec<u32> = read.into_iter().collect();
        read.sort();
        read.iter()
            .map(|i| self.graph.inputs[*i as usize].name.clone())
            .collect()
    }

    /// Whether `nodes` (and `extra`) read the group structure: group or pair values, `n`,
    /// `resp_index`.
    fn group_reason(&self, nodes: &[NodeId], extra: &[NodeId]) -> Option<String> {
        let mut all: Vec<NodeId> = nodes.to_vec();
        for id in nodes.iter().chain(extra) {
            all.extend(self.node(*id).args.iter().copied());
        }
        all.extend(extra);
        for id in all {
            let node = self.node(id);
            match (&node.op, node.shape.level) {
                (Op::Value(Value::N), _) => return Some("`n`".into()),
                (Op::Value(Value::RespIndex), _) => return Some("`resp_index`".into()),
                (
                    Op::Rank {
                        within: Level::Group,
                    },
                    _,
                ) => return Some("a rank within each group".into()),
                (Op::Input(i), Level::Group) => {
                    return Some(format!(
                        "the group-level input `{}`",
                        self.graph.inputs[*i as usize].name
                    ))
                }
                (_, Level::Group) => return Some("a value per group".into()),
                (_, Level::Pair) => return Some("a term `over others`".into()),
                _ => {}
            }
        }
        None
    }

    /// Why the reward of one response depends on other responses (None when it does not).
    fn reward_group_reason(&self, reward: NodeId) -> Option<String> {
        let live = self.cone(&[reward], &HashSet::new());
        for (index, alive) in live.iter().enumerate() {
            if !alive {
                continue;
            }
            let node = &self.graph.nodes[index];
            match &node.op {
                Op::Value(Value::N) => return Some("`n`".into()),
                Op::Value(Value::RespIndex) => return Some("`resp_index`".into()),
                Op::Other | Op::SumByOther => return Some("a term `over others`".into()),
                Op::Components => {
                    return Some("`components` (classes of the group's pairs)".into())
                }
                Op::Rank { within } if *within != Level::Resp => {
                    return Some(format!("a rank within each {}", within.name()))
                }
                Op::Uniform if node.shape.level != Level::Batch => {
                    return Some("`uniform` (keyed by positions in the batch)".into())
                }
                Op::ReduceSum | Op::ReduceMax | Op::ReduceMin | Op::Count => {
                    let from = &self.node(node.args[0]).shape;
                    let to = &node.shape;
                    let local = from.level == to.level
                        || (from.level == Level::Tok && to.level == Level::Resp);
                    if !local {
                        return Some(format!("a reduction from {from} to {to}"));
                    }
                }
                _ => {}
            }
        }
        None
    }

    /// What each stage of a path reads from `x`/`v` and passes on in `v`; `cut` nodes are read
    /// from `v[key]`.
    fn plan_path(&self, stages: &[Stage], cut: &HashMap<NodeId, &str>) -> PathPlan {
        let cut_set: HashSet<NodeId> = cut.keys().copied().collect();
        let computed_in: HashMap<NodeId, usize> = stages
            .iter()
            .enumerate()
            .flat_map(|(s, stage)| stage.nodes.iter().map(move |id| (*id, s)))
            .collect();
        let reads: Vec<Vec<(String, String)>> = stages
            .iter()
            .enumerate()
            .map(|(s, stage)| {
                let mut referenced: Vec<NodeId> = Vec::new();
                for id in &stage.nodes {
                    referenced.extend(self.node(*id).args.iter().copied());
                }
                match &stage.ret {
                    Ret::Node(id) => referenced.push(*id),
                    Ret::Keeps(keeps) => referenced.extend(keeps.iter().map(|(_, id)| *id)),
                }
                referenced.sort();
                referenced.dedup();
                referenced
                    .into_iter()
                    .filter_map(|id| {
                        let name = self.var[id.0 as usize].clone();
                        if let Some(key) = cut.get(&id) {
                            Some((name, format!("v[\"{key}\"]")))
                        } else if let Op::Input(i) = self.node(id).op {
                            let input = &self.graph.inputs[i as usize].name;
                            Some((name, format!("x[{}]", py_str(input))))
                        } else if computed_in.get(&id).is_some_and(|&other| other < s) {
                            Some((name.clone(), format!("v[\"{name}\"]")))
                        } else {
                            None
                        }
                    })
                    .collect()
            })
            .collect();
        let mut exports: Vec<Vec<NodeId>> = vec![Vec::new(); stages.len()];
        for (s, stage) in stages.iter().enumerate() {
            for id in &stage.nodes {
                let name = &self.var[id.0 as usize];
                let later = reads[s + 1..].iter().any(|r| {
                    r.iter()
                        .any(|(n, source)| n == name && source.starts_with("v["))
                });
                if later && !cut_set.contains(id) {
                    exports[s].push(*id);
                }
            }
        }
        PathPlan { reads, exports }
    }

    /// Write a path's stage functions; `aliases[s]` names an identical function already written.
    fn write_path(
        &self,
        out: &mut String,
        stages: &[Stage],
        plan: &PathPlan,
        aliases: &[Option<String>],
    ) {
        for (s, stage) in stages.iter().enumerate() {
            if let Some(Some(existing)) = aliases.get(s) {
                if *existing != stage.function {
                    let _ = writeln!(out, "\n\n{} = {existing}  # the same nodes", stage.function);
                }
                continue;
            }
            let _ = writeln!(out, "\n\ndef {}(L, x, v):", stage.function);
            let _ = writeln!(out, "    \"\"\"{}\"\"\"", stage.doc);
            for (name, source) in &plan.reads[s] {
                let _ = writeln!(out, "    {name} = {source}");
            }
            for id in &stage.nodes {
                let node = self.node(*id);
                let _ = writeln!(
                    out,
                    "    {} = {}  # {}",
                    self.var[id.0 as usize],
                    self.rhs(*id),
                    type_text(self.graph, node.elem, &node.shape)
                );
            }
            for id in &plan.exports[s] {
                let name = &self.var[id.0 as usize];
                let _ = writeln!(out, "    v[\"{name}\"] = {name}");
            }
            match &stage.ret {
                Ret::Node(id) => {
                    let _ = writeln!(out, "    return {}", self.atom(*id));
                }
                Ret::Keeps(keeps) => {
                    let conditions: Vec<String> = keeps
                        .iter()
                        .map(|(level, id)| {
                            format!(
                                "({}, \"{}\", \"{}\")",
                                self.atom(*id),
                                self.shape(*id),
                                format!("{level:?}").to_lowercase()
                            )
                        })
                        .collect();
                    let _ = writeln!(out, "    return [{}]", conditions.join(", "));
                }
            }
        }
    }

    /// For each stage of `stages`, an identical stage of `full` (same nodes, reads and result, and
    /// passing on at least what is needed), by function name.
    fn aliases(
        stages: &[Stage],
        plan: &PathPlan,
        full: &[Stage],
        full_plan: &PathPlan,
    ) -> Vec<Option<String>> {
        stages
            .iter()
            .enumerate()
            .map(|(s, stage)| {
                full.iter().enumerate().find_map(|(f, other)| {
                    let same_ret = match (&stage.ret, &other.ret) {
                        (Ret::Node(a), Ret::Node(b)) => a == b,
                        (Ret::Keeps(a), Ret::Keeps(b)) => a == b,
                        _ => false,
                    };
                    let same = same_ret
                        && stage.nodes == other.nodes
                        && plan.reads[s] == full_plan.reads[f]
                        && plan.exports[s]
                            .iter()
                            .all(|id| full_plan.exports[f].contains(id));
                    same.then(|| other.function.clone())
                })
            })
            .collect()
    }

    fn shapes_dict(&self, nodes: &[NodeId], extra: &[(&str, String)]) -> String {
        let mut entries: Vec<String> = extra
            .iter()
            .map(|(key, shape)| format!("\"{key}\": \"{shape}\""))
            .collect();
        for id in nodes {
            entries.push(format!(
                "\"{}\": \"{}\"",
                self.var[id.0 as usize],
                self.shape(*id)
            ));
        }
        format!("{{{}}}", entries.join(", "))
    }

    fn tuple(names: &[String]) -> String {
        match names.len() {
            0 => "()".into(),
            1 => format!("({},)", py_str(&names[0])),
            _ => format!(
                "({})",
                names
                    .iter()
                    .map(|n| py_str(n))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    fn module(&self) -> String {
        let g = self.graph;
        let o = &g.outputs;
        let name = format!("rlx_{}", self.info.recipe);
        let mut out = String::new();
        self.header(&mut out, &name);
        let _ = writeln!(
            out,
            "import math\n\nimport torch\nimport torch.nn.functional as F\n"
        );
        // Metadata.
        let _ = writeln!(out, "NAME = {}", py_str(&name));
        let _ = writeln!(out, "RECIPE = {}", py_str(&self.info.recipe));
        let _ = writeln!(out, "SOURCE = {}", py_str(&self.info.source));
        let _ = writeln!(out, "SOURCE_SHA256 = {}", py_str(&self.info.source_sha256));
        let params: Vec<String> = g.inputs[self.symbolic.recipe_inputs..]
            .iter()
            .map(|p| {
                format!(
                    "{}: {}",
                    py_str(&p.name),
                    py_float(p.default.unwrap_or(0.0))
                )
            })
            .collect();
        let _ = writeln!(out, "PARAMS = {{{}}}", params.join(", "));
        let _ = writeln!(
            out,
            "# Each recipe input: (shape, default or None, differentiable)."
        );
        let _ = writeln!(out, "INPUTS = {{");
        for input in &g.inputs[..self.symbolic.recipe_inputs] {
            let role = if input.differentiable {
                "True"
            } else {
                "False"
            };
            let _ = writeln!(
                out,
                "    {}: (\"{}\", {}, {role}),",
                py_str(&input.name),
                shape_text(g, &input.shape),
                input.default.map_or("None".into(), py_float)
            );
        }
        let _ = writeln!(out, "}}");
        let policy = self.policy_input();
        let _ = writeln!(
            out,
            "POLICY_INPUT = {}",
            policy.as_deref().map_or("None".into(), py_str)
        );
        let metric_names: Vec<String> = o.metrics.iter().map(|(n, _)| n.clone()).collect();
        let _ = writeln!(out, "METRICS = {}", Self::tuple(&metric_names));
        let states: Vec<String> = g
            .states
            .iter()
            .map(|state| {
                format!(
                    "{}: ({}, {}, {})",
                    py_str(&state.name),
                    py_str(&state.metric),
                    py_str(state.elem.name()),
                    py_float(state.init)
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "# Each `state` (STATE's buffers): (the metric that computes its update, element type, initial value)."
        );
        let _ = writeln!(out, "STATES = {{{}}}", states.join(", "));

        // The whole recipe.
        let _ = writeln!(
            out,
            "\n\n{RULE}
# The recipe, one function per stage. Each line is one IR node; `L` is the batch layout, `x` the
# inputs and params, `v` the values earlier stages pass on."
        );
        let none: HashSet<NodeId> = HashSet::new();
        let mut done = vec![false; g.nodes.len()];
        let mut stages = Vec::new();
        let take = |roots: &[NodeId], done: &mut Vec<bool>| {
            let nodes = self.stage_nodes(roots, &none, done);
            for id in &nodes {
                done[id.0 as usize] = true;
            }
            nodes
        };
        let has_keeps = !o.keeps.is_empty();
        if let Some(reward) = o.reward {
            stages.push(Stage {
                function: "_reward".into(),
                doc: "reward: one scalar per response (on the whole batch).".into(),
                nodes: take(&[reward], &mut done),
                ret: Ret::Node(reward),
            });
        }
        if has_keeps {
            let roots: Vec<NodeId> = o.keeps.iter().map(|(_, id)| *id).collect();
            stages.push(Stage {
                function: "_keep".into(),
                doc: "keep: the filters' conditions, on the whole batch, before advantages.".into(),
                nodes: take(&roots, &mut done),
                ret: Ret::Keeps(o.keeps.clone()),
            });
        }
        let phase_one = stages.len();
        if let Some(advantage) = o.advantage {
            stages.push(Stage {
                function: "_advantage".into(),
                doc: if has_keeps {
                    "advantage: one scalar per kept response.".into()
                } else {
                    "advantage: one scalar per response.".into()
                },
                nodes: take(&[advantage], &mut done),
                ret: Ret::Node(advantage),
            });
        }
        if let Some(loss) = o.loss {
            stages.push(Stage {
                function: "_loss".into(),
                doc: "loss: the objective to minimise.".into(),
                nodes: take(&[loss], &mut done),
                ret: Ret::Node(loss),
            });
        }
        for (metric, id) in &o.metrics {
            stages.push(Stage {
                function: metric_function(metric),
                doc: format!("metric `{metric}`."),
                nodes: take(&[*id], &mut done),
                ret: Ret::Node(*id),
            });
        }
        let plan = self.plan_path(&stages, &HashMap::new());
        self.write_path(&mut out, &stages, &plan, &[]);
        let phase_one_exports: Vec<NodeId> = plan.exports[..phase_one]
            .iter()
            .flatten()
            .copied()
            .collect();
        let mut all_nodes: Vec<NodeId> = stages.iter().flat_map(|s| s.nodes.clone()).collect();
        all_nodes.sort();
        let returns: Vec<NodeId> = output_roots(o);
        let all_inputs = self.inputs_read(&all_nodes, &returns);
        let _ = writeln!(
            out,
            "\n\n# Recipe inputs the outputs read, and what of the tokens (None: nothing).\n_ALL_INPUTS = {}\n_ALL_TOKENS = {}",
            Self::tuple(&all_inputs),
            self.token_reason(&returns, &HashSet::new())
        );
        let _ = writeln!(
            out,
            "# Shapes of the values phase 1 (reward, keep) passes to phase 2.\n_PHASE1_SHAPES = {}",
            self.shapes_dict(&phase_one_exports, &[])
        );
        let mut advantage_nodes: Vec<NodeId> = stages
            .iter()
            .filter(|s| FRONT_STAGES.contains(&s.function.as_str()))
            .flat_map(|s| s.nodes.clone())
            .collect();
        advantage_nodes.sort();
        let advantage_roots = front_roots(o);
        let _ = writeln!(
            out,
            "# Recipe inputs the reward, keep and advantage stages read, and what of the tokens.\n_ADVANTAGE_INPUTS = {}\n_ADVANTAGE_TOKENS = {}",
            Self::tuple(&self.inputs_read(&advantage_nodes, &advantage_roots)),
            self.token_reason(&advantage_roots, &HashSet::new())
        );
        let missing: Vec<&str> = [
            ("_reward", o.reward.is_some()),
            ("_keep", has_keeps),
            ("_advantage", o.advantage.is_some()),
            ("_loss", o.loss.is_some()),
        ]
        .iter()
        .filter(|(_, present)| !present)
        .map(|(name, _)| *name)
        .collect();
        for name in missing {
            let _ = writeln!(out, "{name} = None  # the recipe has no such section");
        }
        self.evaluate(&mut out, has_keeps);

        // The adapters' paths.
        self.loss_given_advantage(&mut out, &stages, &plan);
        self.advantage_given_reward(&mut out);
        self.reward_metadata(&mut out);
        self.reward_side(&mut out, &stages, &plan);

        out.push_str("\n\n");
        out.push_str(PRELUDE);
        let _ = writeln!(out, "\n\nVERL_REGISTERED = _register_with_verl()");
        out
    }

    fn policy_input(&self) -> Option<String> {
        self.graph.inputs[..self.symbolic.recipe_inputs]
            .iter()
            .find(|i| i.differentiable && i.shape == Shape::new(Level::Tok))
            .map(|i| i.name.clone())
    }

    fn header(&self, out: &mut String, name: &str) {
        let g = self.graph;
        let info = self.info;
        let _ = writeln!(
            out,
            "\"\"\"rlx recipe `{}` for PyTorch: its reward, advantage, loss and metrics, for verl and TRL.\n",
            info.recipe
        );
        let _ = writeln!(
            out,
            "Generated by rlxc {} from {} (sha256 {}).
Do not edit: regenerate with `rlxc compile {} --emit torch -o {name}.py` (add `--set NAME=VALUE`
to change a param's default).

Inputs (a padded batch: [B, T] per token with `response_mask` (or `response_length` [B]), [B] per
response, group-level inputs per response too, with `index` [B] naming each response's group):",
            info.version, info.source, info.source_sha256, info.source
        );
        let width = g.inputs[..self.symbolic.recipe_inputs]
            .iter()
            .map(|i| i.name.len())
            .max()
            .unwrap_or(0);
        for input in &g.inputs[..self.symbolic.recipe_inputs] {
            let mut line = format!(
                "    {:width$}  {}",
                input.name,
                type_text(g, input.elem, &input.shape)
            );
            if input.differentiable {
                line.push_str("  differentiable");
            }
            if let Some(default) = input.default {
                let _ = write!(line, "  = {}", py_float(default));
            }
            let _ = writeln!(out, "{line}");
        }
        let _ = writeln!(
            out,
            "Params (PARAMS; override with config={{\"rlx\": {{...}}}} or keyword arguments):"
        );
        for param in &g.inputs[self.symbolic.recipe_inputs..] {
            let _ = writeln!(
                out,
                "    {} = {}",
                param.name,
                py_float(param.default.unwrap_or(0.0))
            );
        }
        let _ = writeln!(
            out,
            "
Entry points: evaluate, compute_rewards, loss (TRL), policy_loss (verl's PolicyLossFn) and
advantage_estimator (registered with verl as `{name}` when verl is importable), make_compute_score
(a verl reward function), make_reward_func (a TRL reward function), reward_metrics (the metrics of
the reward side). Metrics: `loss` and `policy_loss` return every metric their batch determines and
name the others in `.missing`; the reward functions compute REWARD_SIDE_METRICS. See docs/scale.md.
\"\"\"
"
        );
    }

    fn evaluate(&self, out: &mut String, has_keeps: bool) {
        let o = &self.graph.outputs;
        out.push_str(
            r#"

def evaluate(batch, config=None, **params):
    """Every output of the recipe on a padded batch, gradients attached (see `compute_rewards`)."""
    L, x = _prepare(batch, config, params, _ALL_INPUTS, _ALL_TOKENS)
    v = {}
    out = {}
    size = L.B
"#,
        );
        if let Some(reward) = o.reward {
            let _ = writeln!(
                out,
                "    out[\"reward\"] = _per_response(L, _reward(L, x, v), \"{}\")",
                self.shape(reward)
            );
        }
        if has_keeps {
            out.push_str(
                r#"    kept = _kept(L, _keep(L, x, v))
    out["kept"] = kept
    L, x, v, sel = _select(L, x, v, kept, _PHASE1_SHAPES)
"#,
            );
        } else {
            out.push_str(
                r#"    out["kept"] = torch.ones(L.B, dtype=torch.bool, device=L.device)
    sel = None
"#,
            );
        }
        if let Some(advantage) = o.advantage {
            let _ = writeln!(
                out,
                "    out[\"advantage\"] = _scatter(L, sel, _per_response(L, _advantage(L, x, v), \"{}\"), size)",
                self.shape(advantage)
            );
        }
        if o.loss.is_some() {
            let _ = writeln!(out, "    out[\"loss\"] = _t(L, _loss(L, x, v))");
        }
        for (metric, _) in &o.metrics {
            let _ = writeln!(
                out,
                "    out[{}] = _t(L, {}(L, x, v))",
                py_str(metric),
                metric_function(metric)
            );
        }
        let _ = writeln!(out, "    return out");
    }

    /// The loss (and metrics) with the advantage given: verl's `policy_loss`, TRL's `loss`.
    fn loss_given_advantage(&self, out: &mut String, full: &[Stage], full_plan: &PathPlan) {
        let o = &self.graph.outputs;
        let _ = writeln!(
            out,
            "\n\n{RULE}\n# The loss given a trainer's advantages (verl's policy_loss, TRL's loss): the graph cut at the
# advantage."
        );
        let why = match (o.loss, o.advantage) {
            (None, _) => Some("the recipe has no loss section".to_string()),
            (_, None) => Some(
                "the recipe has no advantage section for a trainer's advantages to replace"
                    .to_string(),
            ),
            (Some(_), Some(advantage)) if matches!(self.node(advantage).op, Op::Const(_)) => {
                Some("the recipe's advantage is a constant".to_string())
            }
            _ => None,
        };
        let (Some(loss), Some(advantage), None) = (o.loss, o.advantage, &why) else {
            let why = why.unwrap_or_default();
            let _ = writeln!(
                out,
                "_LOSS_GIVEN_ADVANTAGE = None
_LOSS_GIVEN_ADVANTAGE_TOKENS = None
_LOSS_GIVEN_ADVANTAGE_WHY = {}
POLICY_LOSS_WHY = _LOSS_GIVEN_ADVANTAGE_WHY",
                py_str(&format!("recipe `{}`: {why}", self.info.recipe))
            );
            return;
        };
        let cut: HashMap<NodeId, &str> = [(advantage, "advantage")].into_iter().collect();
        let cut_set: HashSet<NodeId> = cut.keys().copied().collect();
        let none_done = vec![false; self.graph.nodes.len()];
        let loss_nodes = self.stage_nodes(&[loss], &cut_set, &none_done);
        let mut done = none_done.clone();
        for id in &loss_nodes {
            done[id.0 as usize] = true;
        }
        let mut stages = vec![Stage {
            function: "_loss_given_advantage".into(),
            doc: "loss, with v[\"advantage\"] given per response.".into(),
            nodes: loss_nodes.clone(),
            ret: Ret::Node(loss),
        }];
        for (metric, id) in &o.metrics {
            stages.push(Stage {
                function: format!("{}_given_advantage", metric_function(metric)),
                doc: format!("metric `{metric}`, with v[\"advantage\"] given."),
                nodes: self.stage_nodes(&[*id], &cut_set, &done),
                ret: Ret::Node(*id),
            });
        }
        let plan = self.plan_path(&stages, &cut);
        let aliases = Self::aliases(&stages, &plan, full, full_plan);
        self.write_path(out, &stages, &plan, &aliases);
        let loss_inputs = self.inputs_read_except(&loss_nodes, &[loss], &cut_set);
        let loss_group = self.group_reason(&loss_nodes, &[loss]);
        let mut loss_needs = loss_inputs.clone();
        if loss_group.is_some() {
            loss_needs.push("index".into());
        }
        let mut metrics = Vec::new();
        for (stage, (metric, id)) in stages[1..].iter().zip(&o.metrics) {
            let mut needs = self.inputs_read_except(&stage.nodes, &[*id], &cut_set);
            if self.group_reason(&stage.nodes, &[*id]).is_some() {
                needs.push("index".into());
            }
            metrics.push(format!(
                "{}: ({}, {})",
                py_str(metric),
                stage.function,
                Self::tuple(&needs)
            ));
        }
        let _ = writeln!(
            out,
            "

# (the loss, the inputs it needs, and per metric: its function and the inputs it needs)
_LOSS_GIVEN_ADVANTAGE = (
    _loss_given_advantage,
    {},
    {{{}
    }},
)
_LOSS_GIVEN_ADVANTAGE_TOKENS = {}
_LOSS_GIVEN_ADVANTAGE_WHY = None",
            Self::tuple(&loss_needs),
            metrics
                .iter()
                .map(|m| format!("\n        {m},"))
                .collect::<String>(),
            self.token_reason(
                &std::iter::once(loss)
                    .chain(o.metrics.iter().map(|(_, id)| *id))
                    .collect::<Vec<_>>(),
                &cut_set
            )
        );
        // verl's PolicyLossFn receives the log-probs, the advantages and the mask, nothing else.
        let policy = self.policy_input();
        let verl_gives: Vec<String> = policy
            .iter()
            .cloned()
            .chain(["old_logp".to_string(), "rollout_is_weights".to_string()])
            .collect();
        let defaults: HashSet<&str> = self
            .graph
            .inputs
            .iter()
            .filter(|i| i.default.is_some())
            .map(|i| i.name.as_str())
            .collect();
        let lacking: Vec<String> = loss_inputs
            .iter()
            .filter(|n| !verl_gives.contains(n) && !defaults.contains(n.as_str()))
            .map(|n| format!("`{n}`"))
            .collect();
        let policy_why = if policy.is_none() {
            Some(format!(
                "recipe `{}` has no token-level policy input for verl's log_prob",
                self.info.recipe
            ))
        } else if !lacking.is_empty() {
            Some(format!(
                "the loss of recipe `{}` reads {}, which verl's PolicyLossFn does not receive (it gets \
                 log_prob, old_log_prob, advantages, response_mask and rollout_is_weights); for a KL \
                 term use verl's actor.use_kl_loss, or call `loss` with the whole batch",
                self.info.recipe,
                lacking.join(", ")
            ))
        } else {
            loss_group.map(|reason| {
                format!(
                    "the loss of recipe `{}` reads the group structure ({reason}), which verl's \
                     PolicyLossFn does not receive",
                    self.info.recipe
                )
            })
        };
        let _ = writeln!(
            out,
            "POLICY_LOSS_WHY = {}",
            policy_why.as_deref().map_or("None".into(), py_str)
        );
    }

    /// The advantage (and keep filters) with the reward given: verl's `advantage_estimator`.
    fn advantage_given_reward(&self, out: &mut String) {
        let o = &self.graph.outputs;
        let _ = writeln!(
            out,
            "\n\n{RULE}\n# The advantage given a trainer's rewards (verl's advantage_estimator): the graph cut at the
# reward."
        );
        let why = match (o.reward, o.advantage) {
            (_, None) => Some("the recipe has no advantage section".to_string()),
            (None, _) => Some("the recipe has no reward section".to_string()),
            (Some(reward), _) if matches!(self.node(reward).op, Op::Const(_)) => {
                Some("the recipe's reward is a constant".to_string())
            }
            _ => None,
        };
        let advantage_shape = o.advantage.map(|a| self.shape(a)).unwrap_or_default();
        let _ = writeln!(out, "ADVANTAGE_SHAPE = \"{advantage_shape}\"");
        let (Some(reward), Some(advantage), None) = (o.reward, o.advantage, &why) else {
            let _ = writeln!(
                out,
                "_ADVANTAGE_GIVEN_REWARD = None\n_ADVANTAGE_GIVEN_REWARD_WHY = {}",
                py_str(&format!(
                    "recipe `{}`: {}",
                    self.info.recipe,
                    why.unwrap_or_default()
                ))
            );
            return;
        };
        let cut: HashMap<NodeId, &str> = [(reward, "reward")].into_iter().collect();
        let cut_set: HashSet<NodeId> = cut.keys().copied().collect();
        let mut done = vec![false; self.graph.nodes.len()];
        let mut stages = Vec::new();
        if !o.keeps.is_empty() {
            let roots: Vec<NodeId> = o.keeps.iter().map(|(_, id)| *id).collect();
            let nodes = self.stage_nodes(&roots, &cut_set, &done);
            for id in &nodes {
                done[id.0 as usize] = true;
            }
            stages.push(Stage {
                function: "_keep_given_reward".into(),
                doc: "keep, with v[\"reward\"] given.".into(),
                nodes,
                ret: Ret::Keeps(o.keeps.clone()),
            });
        }
        let advantage_nodes = self.stage_nodes(&[advantage], &cut_set, &done);
        stages.push(Stage {
            function: "_advantage_given_reward".into(),
            doc: "advantage, with v[\"reward\"] given.".into(),
            nodes: advantage_nodes,
            ret: Ret::Node(advantage),
        });
        let all: Vec<NodeId> = stages.iter().flat_map(|s| s.nodes.clone()).collect();
        let mut roots: Vec<NodeId> = o.keeps.iter().map(|(_, id)| *id).collect();
        roots.push(advantage);
        let lacking: Vec<String> = self
            .inputs_read_except(&all, &roots, &cut_set)
            .into_iter()
            .filter(|name| {
                self.graph
                    .inputs
                    .iter()
                    .any(|i| &i.name == name && i.default.is_none())
            })
            .map(|name| format!("`{name}`"))
            .collect();
        if !lacking.is_empty() {
            let _ = writeln!(
                out,
                "_ADVANTAGE_GIVEN_REWARD = None\n_ADVANTAGE_GIVEN_REWARD_WHY = {}",
                py_str(&format!(
                    "the advantage of recipe `{}` reads {} besides the reward, which verl's advantage \
                     estimators do not receive",
                    self.info.recipe,
                    lacking.join(", ")
                ))
            );
            return;
        }
        let plan = self.plan_path(&stages, &cut);
        self.write_path(out, &stages, &plan, &[]);
        let keep_exports: Vec<NodeId> = if o.keeps.is_empty() {
            Vec::new()
        } else {
            plan.exports[0].clone()
        };
        let _ = writeln!(
            out,
            "

# (the keep stage or None, the advantage stage, and the shapes of what keep passes on)
_ADVANTAGE_GIVEN_REWARD = (
    {},
    _advantage_given_reward,
    {},
)
_ADVANTAGE_GIVEN_REWARD_WHY = None",
            if o.keeps.is_empty() {
                "None"
            } else {
                "_keep_given_reward"
            },
            self.shapes_dict(&keep_exports, &[("reward", self.shape(reward))])
        );
    }

    fn reward_metadata(&self, out: &mut String) {
        let o = &self.graph.outputs;
        let _ = writeln!(
            out,
            "\n\n# What the reward adapters (compute_score for verl, reward_func for TRL) need."
        );
        match o.reward {
            None => {
                out.push_str(
                    r#"REWARD_SHAPE = "resp"
REWARD_INPUTS = ()
REWARD_TOKENS = None
REWARD_PER_RESPONSE = False
REWARD_GROUP_WHY = "the recipe has no reward section"
"#,
                );
            }
            Some(reward) => {
                let live = self.cone(&[reward], &HashSet::new());
                let nodes: Vec<NodeId> = (0..live.len())
                    .filter(|i| live[*i])
                    .map(|i| NodeId(i as u32))
                    .collect();
                let inputs = self.inputs_read(&nodes, &[reward]);
                let reason = self.reward_group_reason(reward);
                let _ = writeln!(
                    out,
                    "REWARD_SHAPE = \"{}\"\nREWARD_INPUTS = {}\nREWARD_TOKENS = {}\nREWARD_PER_RESPONSE = {}\nREWARD_GROUP_WHY = {}",
                    self.shape(reward),
                    Self::tuple(&inputs),
                    self.token_reason(&[reward], &HashSet::new()),
                    if reason.is_none() { "True" } else { "False" },
                    reason.as_deref().map_or("None".into(), py_str)
                );
            }
        }
    }

    /// The reward side, for the reward functions (TRL's `reward_funcs`) and `reward_metrics`: the
    /// reward, keep and advantage stages of the whole recipe, and the metrics that read no input
    /// besides theirs (no log-probability, nothing only the loss reads). These metrics are computed
    /// as the interpreter computes them: after `keep`, on the responses it keeps.
    fn reward_side(&self, out: &mut String, full: &[Stage], full_plan: &PathPlan) {
        let o = &self.graph.outputs;
        let mut stages: Vec<Stage> = full
            .iter()
            .filter(|s| FRONT_STAGES.contains(&s.function.as_str()))
            .cloned()
            .collect();
        let front = stages.len();
        let front_nodes: Vec<NodeId> = stages.iter().flat_map(|s| s.nodes.clone()).collect();
        let mut roots = front_roots(o);
        let side_inputs: HashSet<String> =
            self.inputs_read(&front_nodes, &roots).into_iter().collect();
        let none: HashSet<NodeId> = HashSet::new();
        let mut done = vec![false; self.graph.nodes.len()];
        for id in &front_nodes {
            done[id.0 as usize] = true;
        }
        let mut metrics: Vec<String> = Vec::new();
        for (metric, id) in &o.metrics {
            let live = self.cone(&[*id], &none);
            let cone: Vec<NodeId> = (0..live.len())
                .filter(|i| live[*i])
                .map(|i| NodeId(i as u32))
                .collect();
            let reward_side = self
                .inputs_read(&cone, &[*id])
                .iter()
                .all(|name| side_inputs.contains(name));
            if !reward_side {
                continue;
            }
            let nodes = self.stage_nodes(&[*id], &none, &done);
            for node in &nodes {
                done[node.0 as usize] = true;
            }
            metrics.push(metric.clone());
            roots.push(*id);
            stages.push(Stage {
                function: format!("{}_reward_side", metric_function(metric)),
                doc: format!("metric `{metric}`, from the reward side alone."),
                nodes,
                ret: Ret::Node(*id),
            });
        }
        let plan = self.plan_path(&stages, &HashMap::new());
        let mut aliases = Self::aliases(&stages, &plan, full, full_plan);
        // A stage identical to one of the whole recipe is that function; a reward, keep or advantage
        // stage that is not (it would have to pass on more) is written under a name of its own.
        for (s, (stage, alias)) in stages.iter_mut().zip(&mut aliases).enumerate() {
            match alias {
                Some(existing) => stage.function = existing.clone(),
                None if s < front => stage.function = format!("{}_reward_side", stage.function),
                None => {}
            }
        }
        let _ = writeln!(
            out,
            "\n\n{RULE}\n# The reward side (TRL's reward functions, reward_metrics): the reward, keep and advantage stages,
# and the metrics that read nothing else, computed as rlx does (after `keep`, on the kept responses)."
        );
        self.write_path(out, &stages, &plan, &aliases);
        let slot = |name: &str| {
            stages[..front]
                .iter()
                .find(|s| s.function == name || s.function == format!("{name}_reward_side"))
                .map_or("None".to_string(), |s| s.function.clone())
        };
        // What the reward and keep stages pass on: an aliased stage passes on what it does in the
        // whole recipe.
        let mut phase_one: Vec<NodeId> = stages[..front]
            .iter()
            .zip(&plan.exports)
            .filter(|(s, _)| !s.function.starts_with("_advantage"))
            .flat_map(|(_, exports)| exports.clone())
            .chain(
                full.iter()
                    .zip(&full_plan.exports)
                    .filter(|(s, _)| s.function == "_reward" || s.function == "_keep")
                    .flat_map(|(_, exports)| exports.clone()),
            )
            .collect();
        phase_one.sort();
        phase_one.dedup();
        let all_nodes: Vec<NodeId> = stages.iter().flat_map(|s| s.nodes.clone()).collect();
        let _ = writeln!(
            out,
            "

# (the reward, keep and advantage stages (None where the recipe has none), per metric of the reward
# side its function, and the shapes of what the reward and keep stages pass on)
_REWARD_SIDE = (
    {},
    {},
    {},
    {{{}
    }},
    {},
)
_REWARD_SIDE_INPUTS = {}
_REWARD_SIDE_TOKENS = {}
# The metrics the reward side computes (the reward functions log them); the others need the loss's inputs.
REWARD_SIDE_METRICS = {}",
            slot("_reward"),
            slot("_keep"),
            slot("_advantage"),
            metrics
                .iter()
                .zip(&stages[front..])
                .map(|(name, stage)| format!("\n        {}: {},", py_str(name), stage.function))
                .collect::<String>(),
            self.shapes_dict(&phase_one, &[]),
            Self::tuple(&self.inputs_read(&all_nodes, &roots)),
            self.token_reason(&roots, &none),
            Self::tuple(&metrics)
        );
    }
}

/// The nodes the recipe's sections return (reward, advantage, loss, metrics, keeps).
fn output_roots(o: &crate::ir::Outputs) -> Vec<NodeId> {
    o.reward
        .iter()
        .chain(o.advantage.iter())
        .chain(o.loss.iter())
        .copied()
        .chain(o.metrics.iter().map(|(_, id)| *id))
        .chain(o.keeps.iter().map(|(_, id)| *id))
        .collect()
}

/// The stages of the recipe's front (reward, keep, advantage): what the reward functions run.
const FRONT_STAGES: [&str; 3] = ["_reward", "_keep", "_advantage"];

/// The front's roots: the reward, the advantage and every `keep` condition.
fn front_roots(o: &crate::ir::Outputs) -> Vec<NodeId> {
    o.reward
        .iter()
        .chain(o.advantage.iter())
        .copied()
        .chain(o.keeps.iter().map(|(_, id)| *id))
        .collect()
}
