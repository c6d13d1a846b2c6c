//! Stage `autodiff`: reverse mode over the IR. Appends ∂loss/∂input for every differentiable input to
//! the graph as ordinary nodes, so every backend evaluates forward and backward alike.
//!
//! Subgradients: `min`/`max` pass the gradient to the first operand on ties (so at a PPO clip boundary
//! the unclipped branch gets it), reductions `max`/`min` to every element equal to the result, `abs`
//! gives 0 at 0, `sqrt` gives 0 at 0 (a zero-variance group has a zero, not infinite, std gradient),
//! `where` passes it to the chosen branch, `clamp` (lowered to max/min) gives 1 inside and 0 outside.
//! Comparisons, boolean ops, `floor`, `sign`, `lgamma`, `count`, `distinct_ngrams` and `stopgrad` pass
//! none; `scan` passes none to its decay and `shift` none to its fill value.

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
        for (position, &arg) in node.args.iter().enumerate() {
            if !active[arg.0 as usize] {
                continue;
            }
            let Some(contribution) =
                local_gradient(&mut builder, &node.op, &node.args, id, position, gradient)
            else {
                continue;
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

/// ∂node/∂args[position] times the node's adjoint `g`, at the node's shape (or the arg's, for
/// reductions' operands).
fn local_gradient(
    b: &mut Builder,
    op: &Op,
    args: &[NodeId],
    node: NodeId,
    position: usize,
    g: NodeId,
) -> Option<NodeId> {
    let shape = b.shape(node).clone();
    let f = Elem::F32;
    let map = |b: &mut Builder, op: Op, operands: Vec<NodeId>| {
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
        b.add(op, operands, out, f)
    };
    let a = args.first().copied();
    let second = args.get(1).copied();
    let one = b.constant(1.0, f);
    let zero = b.constant(0.0, f);
    Some(match (op, position) {
        (Op::Copy, _) | (Op::Add, _) | (Op::Sub, 0) => g,
        (Op::Sub, 1) | (Op::Neg, _) => map(b, Op::Neg, vec![g]),
        (Op::Mul, 0) => map(b, Op::Mul, vec![g, second?]),
        (Op::Mul, 1) => map(b, Op::Mul, vec![g, a?]),
        (Op::Div, 0) => map(b, Op::Div, vec![g, second?]),
        (Op::Div, 1) => {
            // −g·y/b
            let ratio = map(b, Op::Div, vec![node, second?]);
            let scaled = map(b, Op::Mul, vec![g, ratio]);
            map(b, Op::Neg, vec![scaled])
        }
        (Op::Pow, 0) => {
            // g·e·a^(e−1)
            let exponent = second?;
            let e_minus_one = map(b, Op::Sub, vec![exponent, one]);
            let power = map(b, Op::Pow, vec![a?, e_minus_one]);
            let scaled = map(b, Op::Mul, vec![exponent, power]);
            map(b, Op::Mul, vec![g, scaled])
        }
        (Op::Pow, 1) => {
            // g·y·ln a, for a > 0 (0 elsewhere).
            let base = a?;
            let positive = map(b, Op::Gt, vec![base, zero]);
            let safe = map(b, Op::Select, vec![positive, base, one]);
            let log = map(b, Op::Log, vec![safe]);
            let scaled = map(b, Op::Mul, vec![node, log]);
            let term = map(b, Op::Mul, vec![g, scaled]);
            map(b, Op::Select, vec![positive, term, zero])
        }
        (Op::Min, _) | (Op::Max, _) => {
            // The first operand wins ties.
            let (x, y) = (a?, second?);
            let compare = match (op, position) {
                (Op::Min, 0) => Op::Le,
                (Op::Min, _) => Op::Gt,
                (Op::Max, 0) => Op::Ge,
                _ => Op::Lt,
            };
            let chosen = map(b, compare, vec![x, y]);
            map(b, Op::Select, vec![chosen, g, zero])
        }
        (Op::Select, 0) => return None,
        (Op::Select, 1) => map(b, Op::Select, vec![a?, g, zero]),
        (Op::Select, _) => map(b, Op::Select, vec![a?, zero, g]),
        (Op::Exp, _) => map(b, Op::Mul, vec![g, node]),
        (Op::Log, _) => map(b, Op::Div, vec![g, a?]),
        (Op::Log1p, _) => {
            let shifted = map(b, Op::Add, vec![a?, one]);
            map(b, Op::Div, vec![g, shifted])
        }
        (Op::Sqrt, _) => {
            let positive = map(b, Op::Gt, vec![node, zero]);
            let safe = map(b, Op::Select, vec![positive, node, one]);
            let twice = map(b, Op::Add, vec![safe, safe]);
            let quotient = map(b, Op::Div, vec![g, twice]);
            map(b, Op::Select, vec![positive, quotient, zero])
        }
        (Op::Sigmoid, _) => {
            let complement = map(b, Op::Sub, vec![one, node]);
            let slope = map(b, Op::Mul, vec![node, complement]);
            map(b, Op::Mul, vec![g, slope])
        }
        (Op::LogSigmoid, _) => {
            let negated = map(b, Op::Neg, vec![a?]);
            let slope = map(b, Op::Sigmoid, vec![negated]);
            map(b, Op::Mul, vec![g, slope])
        }
        (Op::Tanh, _) => {
            let square = map(b, Op::Mul, vec![node, node]);
            let slope = map(b, Op::Sub, vec![one, square]);
            map(b, Op::Mul, vec![g, slope])
        }
        (Op::Softplus, _) => {
            let slope = map(b, Op::Sigmoid, vec![a?]);
            map(b, Op::Mul, vec![g, slope])
        }
        (Op::Abs, _) => {
            let sign = map(b, Op::Sign, vec![a?]);
            map(b, Op::Mul, vec![g, sign])
        }
        (Op::ReduceSum, _) => {
            let arg_shape = b.shape(a?).clone();
            b.add(Op::Copy, vec![g], arg_shape, f)
        }
        (Op::ReduceMax, _) | (Op::ReduceMin, _) => {
            let x = a?;
            let arg_shape = b.shape(x).clone();
            let result = b.add(Op::Copy, vec![node], arg_shape.clone(), f);
            let at_extreme = b.add(Op::Eq, vec![x, result], arg_shape.clone(), Elem::Bool);
            let spread = b.add(Op::Copy, vec![g], arg_shape.clone(), f);
            b.add(Op::Select, vec![at_extreme, spread, zero], arg_shape, f)
        }
        (Op::Index(k), _) => {
            let arg_shape = b.shape(a?).clone();
            let level_shape = Shape {
                level: arg_shape.level,
                feature: None,
            };
            let g = b.add(Op::Copy, vec![g], level_shape, f);
            b.add(Op::Unindex(*k), vec![g], arg_shape, f)
        }
        (Op::Unindex(k), _) => {
            let arg_shape = b.shape(a?).clone();
            b.add(Op::Index(*k), vec![g], arg_shape, f)
        }
        (Op::Other, _) => {
            let arg_shape = b.shape(a?).clone();
            b.add(Op::SumByOther, vec![g], arg_shape, f)
        }
        (Op::SumByOther, _) => {
            let arg_shape = b.shape(a?).clone();
            b.add(Op::Other, vec![g], arg_shape, f)
        }
        (Op::Cos, _) => {
            let sine = map(b, Op::Sin, vec![a?]);
            let slope = map(b, Op::Neg, vec![sine]);
            map(b, Op::Mul, vec![g, slope])
        }
        (Op::Sin, _) => {
            let slope = map(b, Op::Cos, vec![a?]);
            map(b, Op::Mul, vec![g, slope])
        }
        (Op::Shift { offset }, 0) => {
            // y_t = x_{t+k} ⇒ x_s receives g_{s−k}.
            b.add(
                Op::Shift { offset: -offset },
                vec![g, zero],
                shape.clone(),
                f,
            )
        }
        (Op::Scan { reverse }, 0) => {
            // y = scan(x) is linear in x; its adjoint is the scan the other way with the same decay.
            let decay = second?;
            b.add(
                Op::Scan { reverse: !reverse },
                vec![g, decay],
                shape.clone(),
                f,
            )
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
            builder.add_raw(
                node.op.clone(),
                node.args.clone(),
                node.shape.clone(),
                node.elem,
            );
        }
        builder.graph.outputs = graph.outputs;
        builder
    }
}
