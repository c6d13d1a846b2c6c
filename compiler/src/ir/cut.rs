//! A recipe's graph cut where a trainer supplies a value the recipe would compute: the loss with the
//! trainer's advantages (verl's `PolicyLossFn`, TRL's loss), or the advantage with the trainer's rewards
//! (verl's advantage estimator). The value becomes an input of that name, the gradient is derived again
//! on the cut graph, and what no output reads any more (the reward's inputs, …) leaves the graph, so a
//! kernel of it asks only for what the cut stage reads. The same cuts as the torch exporter's
//! `_loss_given_advantage` and `_advantage_given_reward` (compiler/src/export/torch.rs); the Python
//! binding runs them on the JIT (docs/python.md).

use super::{autodiff, Elem, Graph, InputInfo, Level, Node, NodeId, Op};

/// What the trainer gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Given {
    /// The advantage, per response: the loss and metrics are computed from it; `keep` filters are
    /// dropped (the trainer chose the responses) and so is the reward.
    Advantage,
    /// The reward, per response: the advantage, `keep` filters and metrics are computed from it; the
    /// loss is dropped (it needs the policy's log-probabilities, which a reward stage does not have).
    Reward,
}

impl Given {
    /// The input that carries the given value.
    pub fn input(self) -> &'static str {
        match self {
            Given::Advantage => "advantage",
            Given::Reward => "reward",
        }
    }
}

/// A cut graph, and the metrics it cannot compute.
#[derive(Clone, Debug)]
pub struct Cut {
    pub graph: Graph,
    /// Each metric left out, with the inputs it reads that are not available.
    pub missing_metrics: Vec<(String, Vec<String>)>,
    /// Whether the loss (given the advantage) or the advantage and filters (given the reward) read
    /// the group structure (a group-level or pairwise value): then the batch must say which responses
    /// share a prompt.
    pub reads_groups: bool,
}

/// Cut `graph` (from `compile_graph`, or a loaded artifact's) at `given`. `available` names the inputs
/// the caller has (inputs with a default always are): a metric that reads another input is left out
/// (and named in `Cut::missing_metrics`); a loss (or, given the reward, an advantage) that reads one is
/// an error naming it.
pub fn cut(graph: &Graph, given: Given, available: &[&str]) -> Result<Cut, String> {
    let mut graph = graph.clone();
    let name = given.input();
    let node = match given {
        Given::Advantage => graph.outputs.advantage,
        Given::Reward => graph.outputs.reward,
    };
    let Some(node) = node else {
        return Err(format!(
            "the recipe has no {name} section for a trainer's {name}s to replace"
        ));
    };
    if matches!(graph.node(node).op, Op::Const(_)) {
        return Err(format!("the recipe's {name} is a constant"));
    }
    if given == Given::Advantage && graph.outputs.loss.is_none() {
        return Err("the recipe has no loss section".into());
    }
    if graph.inputs.iter().any(|i| i.name == name) {
        return Err(format!(
            "the recipe has an input named `{name}`, the name of the given value"
        ));
    }
    // The gradient is derived again on the cut graph.
    graph.outputs.gradients.clear();
    let index = graph.inputs.len() as u32;
    let shape = graph.node(node).shape.clone();
    graph.inputs.push(InputInfo {
        name: name.to_string(),
        elem: Elem::F32,
        shape: shape.clone(),
        differentiable: false,
        default: None,
    });
    let (span, call) = (graph.node(node).span, graph.node(node).call);
    graph.nodes[node.0 as usize] = Node {
        op: Op::Input(index),
        args: Vec::new(),
        shape,
        elem: Elem::F32,
        span,
        call,
    };
    match given {
        Given::Advantage => {
            graph.outputs.keeps.clear();
            graph.outputs.reward = None;
        }
        Given::Reward => graph.outputs.loss = None,
    }
    let readable = |input: &InputInfo| {
        input.default.is_some() || input.name == name || available.contains(&input.name.as_str())
    };
    let unavailable = |graph: &Graph, root: NodeId| -> Vec<String> {
        let cone = graph.cone(&[root]);
        let mut names = Vec::new();
        for (id, node) in graph.nodes.iter().enumerate() {
            if let (true, Op::Input(i)) = (cone[id], &node.op) {
                let input = &graph.inputs[*i as usize];
                if !readable(input) && !names.contains(&input.name) {
                    names.push(input.name.clone());
                }
            }
        }
        names
    };
    let required: Vec<(&str, NodeId)> = match given {
        Given::Advantage => graph
            .outputs
            .loss
            .map(|l| ("loss", l))
            .into_iter()
            .collect(),
        Given::Reward => graph
            .outputs
            .advantage
            .map(|a| ("advantage", a))
            .into_iter()
            .chain(graph.outputs.keeps.iter().map(|(_, k)| ("keep filter", *k)))
            .collect(),
    };
    let roots: Vec<NodeId> = required.iter().map(|(_, root)| *root).collect();
    let cone = graph.cone(&roots);
    let reads_groups = graph
        .nodes
        .iter()
        .enumerate()
        .any(|(id, node)| cone[id] && matches!(node.shape.level, Level::Group | Level::Pair));
    for (what, root) in required {
        let lacking = unavailable(&graph, root);
        if !lacking.is_empty() {
            let names: Vec<String> = lacking.iter().map(|n| format!("`{n}`")).collect();
            return Err(format!(
                "the recipe's {what} reads {}, which the batch does not give",
                names.join(", ")
            ));
        }
    }
    let mut missing_metrics = Vec::new();
    let metrics = std::mem::take(&mut graph.outputs.metrics);
    for (metric, id) in metrics {
        let lacking = unavailable(&graph, id);
        if lacking.is_empty() {
            graph.outputs.metrics.push((metric, id));
        } else {
            missing_metrics.push((metric, lacking));
        }
    }
    graph.eliminate_dead_code();
    let mut graph = autodiff::differentiate(graph);
    graph.eliminate_dead_code();
    prune_inputs(&mut graph);
    graph.eliminate_dead_code();
    Ok(Cut {
        graph,
        missing_metrics,
        reads_groups,
    })
}

/// Drop the inputs no node reads, renumbering the others.
fn prune_inputs(graph: &mut Graph) {
    let mut read = vec![false; graph.inputs.len()];
    for node in &graph.nodes {
        if let Op::Input(i) = node.op {
            read[i as usize] = true;
        }
    }
    let mut renumber = vec![u32::MAX; graph.inputs.len()];
    let mut kept = Vec::new();
    for (index, input) in graph.inputs.iter().enumerate() {
        if read[index] {
            renumber[index] = kept.len() as u32;
            kept.push(input.clone());
        }
    }
    graph.inputs = kept;
    for node in &mut graph.nodes {
        if let Op::Input(i) = &mut node.op {
            *i = renumber[*i as usize];
        }
    }
    // A differentiable input nothing reads has a zero gradient; it is gone with its input.
    graph.outputs.gradients.retain(|(i, _)| read[*i as usize]);
    for (i, _) in &mut graph.outputs.gradients {
        *i = renumber[*i as usize];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dapo() -> Graph {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../recipes/dapo.rlx");
        let checked = crate::check_path(std::path::Path::new(path)).expect("readable");
        crate::compile_graph(&checked.recipe.expect("dapo checks"), &[]).expect("it lowers")
    }

    #[test]
    fn the_loss_given_the_advantage_reads_the_log_probs_and_the_advantage() {
        let cut = cut(&dapo(), Given::Advantage, &["logp", "old_logp"]).expect("cuts");
        let names: Vec<&str> = cut.graph.inputs.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["logp", "old_logp", "mask", "advantage"]);
        assert!(cut.graph.outputs.keeps.is_empty() && cut.graph.outputs.reward.is_none());
        assert_eq!(cut.graph.outputs.gradients.len(), 1);
        assert_eq!(cut.graph.outputs.gradients[0].0, 0, "∂loss/∂logp");
        assert_eq!(
            cut.missing_metrics,
            vec![("reward_mean".to_string(), vec!["score".to_string()])]
        );
        assert!(!cut.reads_groups);
    }

    #[test]
    fn the_advantage_given_the_reward_keeps_the_filters_and_reads_the_groups() {
        let cut = cut(&dapo(), Given::Reward, &[]).expect("cuts");
        let names: Vec<&str> = cut.graph.inputs.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["reward"]);
        assert_eq!(cut.graph.outputs.keeps.len(), 1);
        assert!(cut.graph.outputs.loss.is_none() && cut.graph.outputs.gradients.is_empty());
        assert!(cut.reads_groups);
    }

    #[test]
    fn a_loss_that_reads_an_unavailable_input_is_an_error() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../recipes/grpo.rlx");
        let checked = crate::check_path(std::path::Path::new(path)).expect("readable");
        let graph = crate::compile_graph(&checked.recipe.expect("checks"), &[]).expect("lowers");
        let error = cut(&graph, Given::Advantage, &["logp", "old_logp"]).expect_err("ref_logp");
        assert!(error.contains("`ref_logp`"), "{error}");
    }
}
