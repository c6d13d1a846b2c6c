//! Stage `autodiff`: reverse mode over the IR. Appends ∂loss/∂input for every differentiable input to
//! the graph as ordinary nodes, so every backend evaluates forward and backward alike.
//!
//! Subgradients: `min`/`max` pass the gradient to the first operand on ties (so at a PPO clip boundary
//! the unclipped branch gets it), reductions `max`/`min` to every element equal to the result, `abs`
//! gives 0 at 0, `sqrt` gives 0 at 0 (a zero-variance group has a zero, not infinite, std gradient),
//! `where` passes it to the chosen branch, `clamp` (lowered to max/min) gives 1 inside and 0 outside.
//! Comparisons, boolean ops, `floor`, `sign`, `lgamma`, `count`, `distinct_ngrams` and `stopgrad` pass
//! none; `scan` passes none to its decay and `shift` none to its fill value.
//!
//! A zero adjoint stays zero: every product of an adjoint with a local derivative is emitted by one
//! function (`scaled`), as `where(g != 0, g·∂, 0)`, so 0 × ∞ and 0 × NaN are 0. The gradient therefore
//! flows through the branch `where` chooses only, even when the other branch's derivative is not finite
//! there (`where(n > 0, s / n, 0)` at n = 0: the division's adjoint sees g = 0 and gives 0, not 0/0).

use std::collections::HashMap;

use super::{Builder, Elem, Graph, NodeId, Op, Shape};

/// Which nodes depend on a differentiable input through differentiable ops (by node index): the nodes
/// a gradient flows through. The torch exporter uses the same set to decide what autograd must see.
pub fn active_nodes(graph: &Graph) -> Vec<bool> {
    let mut active = vec![false; graph.nodes.len()];
    for (index, node) in graph.nodes.iter().enumerate() {
        active[index] = match &node.op {
            Op::Input(i) => graph.inputs[*i as usize].differentiable,
            op if Op::passes_gradient(op) => node.args.iter().any(|a| active[a.0 as usize]),
            Op::Scan { .. } | Op::Shift { .. } => active[node.args[0].0 as usize],
            _ => false,
        };
    }
    active
}

/// Add the gradient of the loss w.r.t. each differentiable input to `graph.outputs.gradients`.
pub fn differentiate(graph: Graph) -> Graph {
    let Some(loss) = graph.outputs.loss else {
        return graph;
    };
    let mut builder = Builder::from_graph(graph);
    let count = builder.graph.nodes.len();
    let active = active_nodes(&builder.graph);
    let mut adjoint: HashMap<NodeId, NodeId> = HashMap::new();
    if active[loss.0 as usize] {
        let one = builder.constant(1.0, Elem::F32);
        adjoint.insert(loss, one);
    }
    for index in (0..count).rev() {
        let id = NodeId(index as u32);
        let Some(&gradient) = adjoint.get(&id) else {
            continue;
        };
        if !active[index] {
            continue;
        }
        let node = builder.graph.nodes[index].clone();
        // Every node of this node's gradient points where it does.
        builder.at(node.origin());
        for (position, &arg) in node.args.iter().enumerate() {
            if !active[arg.0 as usize] {
                continue;
            }
            let Some(local) =
                local_gradient(&mut builder, &node.op, &node.args, id, position, gradient)
            else {
                continue;
            };
            let contribution = match local {
                Local::Routed(contribution) => contribution,
                Local::Scaled { op, factor, only } => {
                    scaled(&mut builder, gradient, op, factor, only, id)
                }
            };
            let target = builder.shape(arg).clone();
            let contribution = sum_to(&mut builder, contribution, &target);
            let total = match adjoint.get(&arg) {
                Some(&existing) => {
                    builder.add(Op::Add, vec![existing, contribution], target, Elem::F32)
                }
                None => contribution,
            };
            adjoint.insert(arg, total);
        }
    }
    builder.at(Default::default());
    let mut gradients = Vec::new();
    for (index, input) in builder.graph.inputs.clone().iter().enumerate() {
        if !input.differentiable {
            continue;
        }
        let input_node = builder
            .graph
            .nodes
            .iter()
            .position(|n| n.op == Op::Input(index as u32))
            .map(|p| NodeId(p as u32));
        let gradient = match input_node.and_then(|n| adjoint.get(&n).copied()) {
            Some(g) => g,
            None => builder.constant(0.0, Elem::F32),
        };
        gradients.push((index as u32, gradient));
    }
    builder.graph.outputs.gradients = gradients;
    builder.graph
}

/// Reduce a contribution to the shape of the value it belongs to (the adjoint of broadcasting).
fn sum_to(builder: &mut Builder, contribution: NodeId, target: &Shape) -> NodeId {
    let shape = builder.shape(contribution).clone();
    if &shape == target {
        contribution
    } else if target.broadcasts_to(&shape) {
        builder.add(Op::ReduceSum, vec![contribution], target.clone(), Elem::F32)
    } else {
        // A coarser contribution (e.g. a constant): broadcast it.
        builder.add(Op::Copy, vec![contribution], target.clone(), Elem::F32)
    }
}

/// One operand's share of a node's adjoint `g`.
pub(crate) enum Local {
    /// `g` moved without arithmetic on it (copied, negated, selected, summed, re-indexed, shifted,
    /// scanned): zero where `g` is zero.
    Routed(NodeId),
    /// `g op factor` (`op` is `Mul` or `Div`), and 0 where `only` (a boolean) is false.
    Scaled {
        op: Op,
        factor: NodeId,
        only: Option<NodeId>,
    },
}

/// `g op factor` where `g != 0` (and `only` holds), 0 elsewhere: the one place an adjoint is multiplied
/// or divided, so a zero adjoint stays zero whatever the factor (∞, NaN, 0/0 from an unselected branch).
fn scaled(
    b: &mut Builder,
    g: NodeId,
    op: Op,
    factor: NodeId,
    only: Option<NodeId>,
    node: NodeId,
) -> NodeId {
    let mut shape = b.shape(node).clone();
    for operand in [g, factor].into_iter().chain(only) {
        let s = b.shape(operand).clone();
        if shape.broadcasts_to(&s) {
            shape = Shape {
                level: s.level,
                feature: s.feature.clone().or(shape.feature.clone()),
            };
        }
    }
    let zero = b.constant(0.0, Elem::F32);
    let product = b.add(op, vec![g, factor], shape.clone(), Elem::F32);
    let nonzero = match b.constant_value(g) {
        // The loss's own adjoint (1): no guard needed.
        Some(value) if value != 0.0 => None,
        Some(_) => return zero,
        None => Some(b.add(Op::Ne, vec![g, zero], shape.clone(), Elem::Bool)),
    };
    let condition = match (nonzero, only) {
        (Some(a), Some(c)) => Some(b.add(Op::And, vec![a, c], shape.clone(), Elem::Bool)),
        (a, c) => a.or(c),
    };
    match condition {
        Some(condition) => b.add(Op::Select, vec![condition, product, zero], shape, Elem::F32),
        None => product,
    }
}

/// `g` at `shape`, materialised (a constant adjoint broadcast to a matrix, which `Builder::add`
/// would keep as the constant, must be a node of the matrix's shape for a contraction to read).
fn at_shape(b: &mut Builder, g: NodeId, shape: &Shape) -> NodeId {
    if b.shape(g) == shape {
        g
    } else {
        b.add_raw(Op::Copy, vec![g], shape.clone(), Elem::F32)
    }
}

/// The element-wise op of `operands` (F32) at the node's shape, or the finer shape of an operand.
fn map_at(b: &mut Builder, shape: &Shape, op: Op, operands: Vec<NodeId>) -> NodeId {
    let mut out = shape.clone();
    for operand in &operands {
        let s = b.shape(*operand).clone();
        if out.broadcasts_to(&s) {
            out = Shape {
                level: s.level,
                feature: s.feature.clone().or(out.feature.clone()),
            };
        }
    }
    b.add(op, operands, out, Elem::F32)
}

/// What a primitive's derivative rule (`ops::op_table!`, `derivative`) sees: the node, its operands,
/// which operand the rule is for, and the constants 1 and 0.
pub(crate) struct Derivative<'a> {
    b: &'a mut Builder,
    shape: Shape,
    args: &'a [NodeId],
    /// The node's adjoint.
    g: NodeId,
    /// The node's own value (y).
    pub node: NodeId,
    /// The operand whose share is asked for.
    pub position: usize,
    pub one: NodeId,
    pub zero: NodeId,
}

impl Derivative<'_> {
    /// The first operand.
    pub fn a(&self) -> Option<NodeId> {
        self.args.first().copied()
    }

    /// The second operand.
    pub fn second(&self) -> Option<NodeId> {
        self.args.get(1).copied()
    }

    /// A new element-wise node (F32) over `operands`.
    pub fn map(&mut self, op: Op, operands: Vec<NodeId>) -> NodeId {
        map_at(self.b, &self.shape, op, operands)
    }

    /// `g · factor`.
    pub fn times(&self, factor: NodeId) -> Local {
        self.scaled(Op::Mul, factor, None)
    }

    /// `g / factor`.
    pub fn over(&self, factor: NodeId) -> Local {
        self.scaled(Op::Div, factor, None)
    }

    /// `g op factor` where `only` holds, 0 elsewhere.
    pub fn scaled(&self, op: Op, factor: NodeId, only: Option<NodeId>) -> Local {
        Local::Scaled { op, factor, only }
    }

    /// `g` where `compare(a, second)` holds, 0 elsewhere (the subgradient of `min`/`max`).
    pub fn choose(&mut self, compare: Op) -> Option<Local> {
        let (x, y) = (self.a()?, self.second()?);
        let chosen = self.map(compare, vec![x, y]);
        Some(Local::Routed(
            self.map(Op::Select, vec![chosen, self.g, self.zero]),
        ))
    }
}

/// ∂node/∂args[position] for the node's adjoint `g`: `g` routed (at the node's shape, or the arg's for
/// reductions' operands), or the local derivative that `scaled` multiplies `g` by. A primitive's is its
/// op table entry's rule.
fn local_gradient(
    b: &mut Builder,
    op: &Op,
    args: &[NodeId],
    node: NodeId,
    position: usize,
    g: NodeId,
) -> Option<Local> {
    let shape = b.shape(node).clone();
    let f = Elem::F32;
    let a = args.first().copied();
    let second = args.get(1).copied();
    let one = b.constant(1.0, f);
    let zero = b.constant(0.0, f);
    if op.primitive().is_some() {
        let mut derivative = Derivative {
            b,
            shape,
            args,
            node,
            position,
            g,
            one,
            zero,
        };
        return crate::ops::derivative(op, &mut derivative).flatten();
    }
    let map = |b: &mut Builder, op: Op, operands: Vec<NodeId>| map_at(b, &shape, op, operands);
    let routed = Local::Routed;
    let times = |factor: NodeId| Local::Scaled {
        op: Op::Mul,
        factor,
        only: None,
    };
    let over = |factor: NodeId| Local::Scaled {
        op: Op::Div,
        factor,
        only: None,
    };
    Some(match (op, position) {
        (Op::Copy, _) | (Op::Add, _) | (Op::Sub, 0) => routed(g),
        (Op::Sub, 1) | (Op::Neg, _) => routed(map(b, Op::Neg, vec![g])),
        (Op::Mul, 0) => times(second?),
        (Op::Mul, 1) => times(a?),
        (Op::Div, 0) => over(second?),
        (Op::Div, 1) => {
            // −g·y/b
            let ratio = map(b, Op::Div, vec![node, second?]);
            times(map(b, Op::Neg, vec![ratio]))
        }
        (Op::Select, 0) => return None,
        (Op::Select, 1) => routed(map(b, Op::Select, vec![a?, g, zero])),
        (Op::Select, _) => routed(map(b, Op::Select, vec![a?, zero, g])),
        (Op::ReduceSum, _) => {
            let arg_shape = b.shape(a?).clone();
            routed(b.add(Op::Copy, vec![g], arg_shape, f))
        }
        (Op::ReduceMax, _) | (Op::ReduceMin, _) => {
            let x = a?;
            let arg_shape = b.shape(x).clone();
            let result = b.add(Op::Copy, vec![node], arg_shape.clone(), f);
            let at_extreme = b.add(Op::Eq, vec![x, result], arg_shape.clone(), Elem::Bool);
            let spread = b.add(Op::Copy, vec![g], arg_shape.clone(), f);
            routed(b.add(Op::Select, vec![at_extreme, spread, zero], arg_shape, f))
        }
        (Op::Index(k), _) => {
            let arg_shape = b.shape(a?).clone();
            let level_shape = Shape {
                level: arg_shape.level,
                feature: None,
            };
            let g = b.add(Op::Copy, vec![g], level_shape, f);
            routed(b.add(Op::Unindex(*k), vec![g], arg_shape, f))
        }
        (Op::Unindex(k), _) => {
            let arg_shape = b.shape(a?).clone();
            routed(b.add(Op::Index(*k), vec![g], arg_shape, f))
        }
        (Op::Other, _) => {
            let arg_shape = b.shape(a?).clone();
            routed(b.add(Op::SumByOther, vec![g], arg_shape, f))
        }
        (Op::SpreadRows | Op::SpreadCols, _) => {
            // y[a, b] = x[a] ⇒ x[a] receives Σ_b g[a, b] (and x[b] receives Σ_a for columns).
            let g = at_shape(b, g, &shape);
            let (rows, cols) = shape.feature.as_ref()?.matrix()?;
            let (contract, axis) = if *op == Op::SpreadRows {
                (Op::ContractCols, rows.clone())
            } else {
                (Op::ContractRows, cols.clone())
            };
            let out = Shape {
                level: shape.level,
                feature: Some(axis),
            };
            routed(b.add(contract, vec![g], out, f))
        }
        (Op::ContractRows | Op::ContractCols, _) => {
            // y[b] = Σ_a m[a, b] ⇒ m[a, b] receives g[b] (g[a] for columns).
            let arg_shape = b.shape(a?).clone();
            if b.constant_value(g).is_some() {
                routed(g)
            } else {
                let g = at_shape(b, g, &shape);
                let spread = if *op == Op::ContractRows {
                    Op::SpreadCols
                } else {
                    Op::SpreadRows
                };
                routed(b.add(spread, vec![g], arg_shape, f))
            }
        }
        (Op::SumByOther, _) => {
            let arg_shape = b.shape(a?).clone();
            routed(b.add(Op::Other, vec![g], arg_shape, f))
        }
        (Op::Shift { offset }, 0) => {
            // y_t = x_{t+k} ⇒ x_s receives g_{s−k}.
            routed(b.add(
                Op::Shift { offset: -offset },
                vec![g, zero],
                shape.clone(),
                f,
            ))
        }
        (Op::Scan { reverse }, 0) => {
            // y = scan(x) is linear in x; its adjoint is the scan the other way with the same decay.
            let decay = second?;
            routed(b.add(
                Op::Scan { reverse: !reverse },
                vec![g, decay],
                shape.clone(),
                f,
            ))
        }
        _ => return None,
    })
}

impl Builder {
    /// Continue building on an existing graph (new nodes are appended; existing ones are shared).
    pub fn from_graph(graph: Graph) -> Builder {
        let mut builder = Builder::new(
            graph.inputs.clone(),
            graph.params.clone(),
            graph.rubrics.clone(),
        );
        for node in &graph.nodes {
            builder.at(node.origin());
            builder.add_raw(
                node.op.clone(),
                node.args.clone(),
                node.shape.clone(),
                node.elem,
            );
        }
        builder.at(Default::default());
        builder.graph.outputs = graph.outputs;
        builder.graph.states = graph.states;
        builder
    }
}
