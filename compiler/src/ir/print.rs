//! The readable text form of the IR (`rlxc compile --emit ir`).

use std::fmt::Write as _;

use super::{Feature, Graph, Op, Shape};

fn shape_text(graph: &Graph, shape: &Shape) -> String {
    match &shape.feature {
        None => shape.to_string(),
        Some(feature) => format!("[{}, {}]", shape.level.name(), feature_text(graph, feature)),
    }
}

/// A feature axis as a recipe names it (a rubric by its name, a matrix as its two axes).
pub fn feature_text(graph: &Graph, feature: &Feature) -> String {
    match feature {
        Feature::Rubric { index, .. } => graph
            .rubrics
            .get(*index as usize)
            .map(|r| r.name.clone())
            .unwrap_or_else(|| "?".into()),
        Feature::Matrix { rows, cols } => {
            format!(
                "{}, {}",
                feature_text(graph, rows),
                feature_text(graph, cols)
            )
        }
        other => other.to_string(),
    }
}

/// One line per node, `%id : elem[shape] = op args`, then the params and outputs.
pub fn to_text(graph: &Graph) -> String {
    let mut out = String::new();
    for (index, input) in graph.inputs.iter().enumerate() {
        let marker = if input.differentiable {
            " (differentiable)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "input #{index} {} : {}{}{marker}",
            input.name,
            input.elem.name(),
            shape_text(graph, &input.shape)
        );
    }
    for (name, value) in &graph.params {
        let _ = writeln!(out, "param {name} = {value}");
    }
    for (index, node) in graph.nodes.iter().enumerate() {
        let op = match &node.op {
            Op::Input(i) => format!(
                "input {}",
                graph
                    .inputs
                    .get(*i as usize)
                    .map(|x| x.name.as_str())
                    .unwrap_or("?")
            ),
            op => op.name(),
        };
        let args: Vec<String> = node.args.iter().map(|a| format!("%{}", a.0)).collect();
        let _ = writeln!(
            out,
            "%{index} : {}{} = {op}{}{}",
            node.elem.name(),
            shape_text(graph, &node.shape),
            if args.is_empty() { "" } else { " " },
            args.join(", ")
        );
    }
    let o = &graph.outputs;
    let mut line = |name: &str, id: Option<super::NodeId>| {
        if let Some(id) = id {
            let _ = writeln!(out, "{name} = %{}", id.0);
        }
    };
    line("reward", o.reward);
    line("advantage", o.advantage);
    line("loss", o.loss);
    for (name, id) in &o.metrics {
        line(&format!("metric {name}"), Some(*id));
    }
    for (level, id) in &o.keeps {
        line(&format!("keep {level:?}").to_lowercase(), Some(*id));
    }
    for (input, id) in &o.gradients {
        let name = graph
            .inputs
            .get(*input as usize)
            .map(|x| x.name.as_str())
            .unwrap_or("?");
        line(&format!("grad {name}"), Some(*id));
    }
    out
}
