//! A non-finite output, explained: which output (the loss, a metric, a reward, an advantage, a
//! gradient) is not finite and — found by the f64 interpreter, the oracle — the first node of the
//! graph whose value is not finite for the offending batch element, with its operands' values there
//! and the recipe expression it was lowered from (`ir::Node::span`). The evaluators report it as
//! [`crate::EvalError::NonFinite`]; [`NonFinite::diagnostic`] makes it a compiler
//! [`Diagnostic`] with a label on that expression, which `rlx score` and `rlx run` render.
//!
//! The executor's finiteness check (`crate::executor`) is the one place that asks: whichever
//! backend ran (the interpreter, the JIT, the CUDA kernels), a non-finite output is [`explain`]ed by
//! evaluating the batch again on the f64 interpreter, keeping every node's value — only on this
//! failure path.
//!
//! The search walks back from the offending output element: at each node it moves to the first
//! operand whose value is not finite at an element the node reads for this one (the element
//! "above" it for an element-wise op, the elements reduced into it for a reduction, any element for
//! the other ops); the node where no operand is non-finite made the value.

use std::borrow::Cow;
use std::fmt;

use rlx_compiler::diagnostic::Diagnostic;
use rlx_compiler::ir::{Graph, Level, NodeId, Op, Shape, Site};
use rlx_compiler::SourceMap;

use crate::batch::Layout;
use crate::executor::Executor;
use crate::geometry::Geometry;
use crate::interp::{rubric_lens, Context, Interpreter, Outcome, PhaseValues};
use crate::kernel::ColumnRef;

/// Which output of the recipe is not finite.
#[derive(Clone, Debug, PartialEq)]
pub enum Output {
    Loss,
    Metric(String),
    /// The reward of a response (packed order over the whole batch).
    Reward {
        response: usize,
    },
    Advantage {
        response: usize,
    },
    /// ∂loss/∂`input` at `element` (in the input's element order).
    Gradient {
        input: String,
        element: usize,
    },
}

impl Output {
    /// The position of the non-finite value in the output's order: a response (packed order), a
    /// gradient's element; `None` for the loss and a metric.
    pub fn position(&self) -> Option<usize> {
        match self {
            Output::Loss | Output::Metric(_) => None,
            Output::Reward { response } | Output::Advantage { response } => Some(*response),
            Output::Gradient { element, .. } => Some(*element),
        }
    }
}

/// A batch element, by packed indices over the whole batch (`None` for the axes its level lacks).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Element {
    pub group: Option<usize>,
    /// The response (packed order) and its position within its group.
    pub response: Option<(usize, usize)>,
    /// The token's position within its response.
    pub token: Option<usize>,
    /// For a pair (i, j): response j (packed order) and its position within the group.
    pub other: Option<(usize, usize)>,
    /// The index along the feature axis.
    pub feature: Option<usize>,
}

impl fmt::Display for Element {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(group) = self.group {
            parts.push(format!("group {group}"));
        }
        if let Some((_, within)) = self.response {
            parts.push(format!("response {within}"));
        }
        if let Some((_, within)) = self.other {
            parts.push(format!("other response {within}"));
        }
        if let Some(token) = self.token {
            parts.push(format!("token {token}"));
        }
        if let Some(feature) = self.feature {
            parts.push(format!("feature {feature}"));
        }
        if parts.is_empty() {
            f.write_str("the batch")
        } else {
            f.write_str(&parts.join(", "))
        }
    }
}

/// The node that made the first non-finite value, at the offending element.
#[derive(Clone, Debug)]
pub struct Culprit {
    pub node: NodeId,
    /// Its op, as `--emit ir` prints it.
    pub op: String,
    pub span: Option<Site>,
    pub call: Option<Site>,
    pub value: f64,
    pub element: Element,
    /// The recipe input, when the culprit is one: the batch itself holds the non-finite value.
    pub input: Option<String>,
    /// Its operands at the element it reads for this one (the first one for a reduction): their
    /// node, span, the recipe input when the operand is one, and value.
    pub operands: Vec<Operand>,
}

#[derive(Clone, Debug)]
pub struct Operand {
    pub node: NodeId,
    pub span: Option<Site>,
    pub input: Option<String>,
    pub value: f64,
}

/// A non-finite output and, when the interpreter found it, its culprit.
#[derive(Clone, Debug)]
pub struct NonFinite {
    pub output: Output,
    pub value: f64,
    pub culprit: Option<Culprit>,
    /// Set when a compiled kernel's non-finite output was evaluated again by the interpreter, which
    /// computed it finite (a matter of the kernel's precision, not of the recipe).
    pub interpreter_finite: bool,
}

/// Values compare as the same number, NaN equal to NaN (an error is equal to itself).
fn same(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

impl PartialEq for Operand {
    fn eq(&self, other: &Operand) -> bool {
        self.node == other.node
            && self.span == other.span
            && self.input == other.input
            && same(self.value, other.value)
    }
}

impl PartialEq for Culprit {
    fn eq(&self, other: &Culprit) -> bool {
        self.node == other.node
            && self.op == other.op
            && self.span == other.span
            && self.call == other.call
            && same(self.value, other.value)
            && self.element == other.element
            && self.input == other.input
            && self.operands == other.operands
    }
}

impl PartialEq for NonFinite {
    fn eq(&self, other: &NonFinite) -> bool {
        self.output == other.output
            && same(self.value, other.value)
            && self.culprit == other.culprit
            && self.interpreter_finite == other.interpreter_finite
    }
}

/// What the message says when no culprit is known.
const HINT: &str = "(a division by zero, the log of a non-positive value, or an overflowing exp in the recipe or the data?)";

impl NonFinite {
    pub fn new(output: Output, value: f64) -> NonFinite {
        NonFinite {
            output,
            value,
            culprit: None,
            interpreter_finite: false,
        }
    }

    /// What is not finite, without the cause: "the loss is NaN".
    pub fn what(&self) -> String {
        let value = self.value;
        match &self.output {
            Output::Loss => format!("the loss is {value}"),
            Output::Metric(name) => format!("metric `{name}` is {value}"),
            Output::Reward { response } => {
                format!("the reward of response {response} (packed order) is {value}")
            }
            Output::Advantage { response } => {
                format!("the advantage of response {response} (packed order) is {value}")
            }
            Output::Gradient { input, element } => {
                format!("the gradient with respect to `{input}` is {value} at element {element}")
            }
        }
    }

    /// The culprit in words, without source positions: "`log` (%3) is -inf for group 0, response
    /// 1: its operand is 0".
    pub fn cause(&self) -> Option<String> {
        let culprit = self.culprit.as_ref()?;
        let operands: Vec<String> = culprit
            .operands
            .iter()
            .map(|operand| match &operand.input {
                Some(name) => format!("`{name}` = {}", operand.value),
                None => format!("%{} = {}", operand.node.0, operand.value),
            })
            .collect();
        if let Some(input) = &culprit.input {
            return Some(format!(
                "input `{input}` is {} for {} (the batch holds it)",
                culprit.value, culprit.element
            ));
        }
        let mut text = format!(
            "`{}` (%{}) is {} for {}",
            culprit.op, culprit.node.0, culprit.value, culprit.element
        );
        if !operands.is_empty() {
            text.push_str(&format!(" ({})", operands.join(", ")));
        }
        Some(text)
    }

    /// The diagnostic `rlx score` and `rlx run` print: the message, a label on the culprit's
    /// expression, a label with the value on each operand's, the call it was inlined through.
    /// `None` when there is no culprit with a span that fits `sources` (an artifact whose recipe
    /// changed, say): the message ([`fmt::Display`]) says it all then.
    pub fn diagnostic(&self, sources: &SourceMap) -> Option<Diagnostic> {
        let culprit = self.culprit.as_ref()?;
        let span = culprit.span.filter(|site| fits(sources, site))?;
        let text = match &culprit.input {
            Some(input) => format!("input `{input}`"),
            None => format!("`{}`", source_text(sources, &span)),
        };
        let mut diagnostic = Diagnostic::error(
            "rlx::non_finite",
            span.file_id(),
            format!(
                "{}: {text} is {} for {}",
                self.what(),
                culprit.value,
                culprit.element
            ),
        )
        .label(
            span.span(),
            format!("this is {} for {}", culprit.value, culprit.element),
        );
        // A label on each computed operand (an input's node has the span of its first use, which
        // need not be here: inputs are named in the help).
        for operand in culprit.operands.iter().filter(|o| o.input.is_none()) {
            let Some(site) = operand
                .span
                .filter(|s| s.file == span.file && fits(sources, s))
            else {
                continue;
            };
            if site == span {
                continue;
            }
            let text = source_text(sources, &site);
            diagnostic = diagnostic.label(site.span(), format!("`{text}` = {}", operand.value));
        }
        let inputs: Vec<String> = culprit
            .operands
            .iter()
            .map(|operand| match &operand.input {
                Some(input) => format!("input `{input}` = {}", operand.value),
                None => format!("`{}` = {}", operand_text(sources, operand), operand.value),
            })
            .collect();
        if culprit.input.is_some() {
            diagnostic = diagnostic.help(
                "the value came in with the batch (the rollouts, or the model that computed it)",
            );
        } else if !inputs.is_empty() {
            diagnostic = diagnostic.help(format!(
                "its operands there: {}; guard the expression (`where`, `clamp`, a small epsilon) or check the data",
                inputs.join(", ")
            ));
        }
        if let Some(call) = culprit
            .call
            .filter(|call| call.file != span.file && fits(sources, call))
        {
            diagnostic = diagnostic.with_related(
                Diagnostic::error("rlx::non_finite", call.file_id(), "in this call")
                    .label(call.span(), "called here"),
            );
        }
        Some(diagnostic)
    }
}

impl fmt::Display for NonFinite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.what())?;
        match self.cause() {
            Some(cause) => write!(f, ": {cause}"),
            None if self.interpreter_finite => f.write_str(
                " in the compiled kernel, but finite in the f64 interpreter (a value beyond the kernel's precision: try `--backend interp`, or f64 storage)",
            ),
            None => write!(f, " {HINT}"),
        }
    }
}

/// Whether `site` lies in a file of `sources`, inside its text, on character boundaries.
fn fits(sources: &SourceMap, site: &Site) -> bool {
    let Some((_, file)) = sources.files().nth(site.file as usize) else {
        return false;
    };
    let (start, end) = (site.start as usize, site.end as usize);
    start < end
        && end <= file.text.len()
        && file.text.is_char_boundary(start)
        && file.text.is_char_boundary(end)
}

/// The text of `site` (which [`fits`]), on one line and shortened.
fn source_text(sources: &SourceMap, site: &Site) -> String {
    let text = &sources.get(site.file_id()).text[site.start as usize..site.end as usize];
    let text: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if text.chars().count() > 48 {
        let short: String = text.chars().take(45).collect();
        format!("{short}…")
    } else {
        text
    }
}

fn operand_text(sources: &SourceMap, operand: &Operand) -> String {
    match operand.span.filter(|s| fits(sources, s)) {
        Some(site) => source_text(sources, &site),
        None => format!("%{}", operand.node.0),
    }
}

/// The first non-finite output of `outcome`: the loss, a metric, a reward, an advantage, a gradient
/// (without its culprit).
pub(crate) fn first_non_finite(outcome: &Outcome) -> Option<NonFinite> {
    if let Some(loss) = outcome.loss.filter(|l| !l.is_finite()) {
        return Some(NonFinite::new(Output::Loss, loss));
    }
    for (name, value) in &outcome.metrics {
        if !value.is_finite() {
            return Some(NonFinite::new(Output::Metric(name.clone()), *value));
        }
    }
    for (advantage, values) in [(false, &outcome.reward), (true, &outcome.advantage)] {
        let Some(values) = values else { continue };
        if let Some(response) = values.iter().position(|v| !v.is_finite()) {
            let output = if advantage {
                Output::Advantage { response }
            } else {
                Output::Reward { response }
            };
            return Some(NonFinite::new(output, values[response]));
        }
    }
    for (name, values) in &outcome.gradients {
        if let Some(element) = values.iter().position(|v| !v.is_finite()) {
            let output = Output::Gradient {
                input: name.clone(),
                element,
            };
            return Some(NonFinite::new(output, values[element]));
        }
    }
    None
}

/// `non_finite` — a run's non-finite output on the batch (`layout`, `inputs`), found by the
/// executor's finiteness check — explained: the f64 interpreter (the oracle) evaluates the batch
/// again, keeping every phase's node values, and its first non-finite output is returned with its
/// culprit (for a kernel in f32 another output may fail first; the interpreter's is the one
/// explained). When the interpreter computes every output finite, `non_finite` says so
/// (`interpreter_finite`: a matter of the kernel's precision); when it fails otherwise or finds no
/// culprit, `non_finite` comes back as it was.
pub(crate) fn explain(
    graph: &Graph,
    layout: &Layout,
    inputs: &[ColumnRef<'_>],
    context: &Context,
    non_finite: NonFinite,
) -> NonFinite {
    if non_finite.culprit.is_some() || non_finite.interpreter_finite {
        return non_finite;
    }
    let columns: Vec<Cow<'_, [f64]>> = inputs
        .iter()
        .map(|column| match column {
            ColumnRef::F64(values) => Cow::Borrowed(*values),
            ColumnRef::F32(_) => Cow::Owned(column.to_f64()),
        })
        .collect();
    let refs: Vec<ColumnRef<'_>> = columns.iter().map(|c| ColumnRef::F64(c)).collect();
    let interpreter = Interpreter::recording(graph);
    let run = Executor::new(&interpreter).run_unchecked(layout, &refs, context);
    let phases = interpreter.recorded();
    let Ok((outcome, _)) = run else {
        return non_finite;
    };
    let outcome = outcome.into_outcome();
    let Some(mut found) = first_non_finite(&outcome) else {
        return NonFinite {
            interpreter_finite: true,
            ..non_finite
        };
    };
    found.culprit = find(graph, layout, &phases, &outcome.kept, &found.output);
    if found.culprit.is_some() {
        found
    } else {
        non_finite
    }
}

/// The culprit of the interpreter's non-finite `output`, from the node values of its phases.
fn find(
    graph: &Graph,
    layout: &Layout,
    phases: &[PhaseValues],
    kept: &[bool],
    output: &Output,
) -> Option<Culprit> {
    let (node, read_shape) = output_node(graph, output)?;
    // The phase that computed the output: a reward is phase 1's (on the whole batch) when there are
    // two, everything else the last phase's.
    let phase = match output {
        Output::Reward { .. } => phases.iter().find(|p| p.phase == 0)?,
        _ => phases.last()?,
    };
    let mut geometry = Geometry::new(phase.layout.clone(), rubric_lens(graph));
    if &phase.layout == layout {
        // The whole batch: the output's position is an element of the shape it is read at.
        let element = match output.position() {
            Some(position) => {
                let node_shape = graph.node(node).shape.clone();
                *geometry.map(&read_shape, &node_shape).get(position)?
            }
            None => 0,
        };
        return culprit(
            graph,
            &phase.values,
            &mut geometry,
            node,
            element,
            &ToBatch { kept: None },
        );
    }
    // The kept responses of a `keep` filter: the node's first non-finite element there.
    let kept_responses: Vec<usize> = (0..kept.len()).filter(|&r| kept[r]).collect();
    let element = phase
        .values
        .get(node.0 as usize)?
        .as_ref()?
        .iter()
        .position(|v| !v.is_finite())?;
    culprit(
        graph,
        &phase.values,
        &mut geometry,
        node,
        element,
        &ToBatch {
            kept: Some((&kept_responses, layout)),
        },
    )
}

/// The node of an output, and the shape the outcome reads it at.
fn output_node(graph: &Graph, output: &Output) -> Option<(NodeId, Shape)> {
    let outputs = &graph.outputs;
    let resp = Shape::new(Level::Resp);
    match output {
        Output::Loss => Some((outputs.loss?, Shape::BATCH)),
        Output::Metric(name) => {
            let (_, id) = outputs.metrics.iter().find(|(n, _)| n == name)?;
            Some((*id, Shape::BATCH))
        }
        Output::Reward { .. } => Some((outputs.reward?, resp)),
        Output::Advantage { .. } => Some((outputs.advantage?, resp)),
        Output::Gradient { input, .. } => {
            let (index, id) = outputs.gradients.iter().find(|(i, _)| {
                graph
                    .inputs
                    .get(*i as usize)
                    .is_some_and(|x| &x.name == input)
            })?;
            Some((*id, graph.inputs[*index as usize].shape.clone()))
        }
    }
}

/// How an evaluator's response and group indices map to the whole batch's (the kept responses of a
/// `keep` filter are a sub-batch).
struct ToBatch<'a> {
    /// For each response of the evaluator's batch, its index in the whole batch, and the whole
    /// batch's layout; `None` when the evaluator's batch is the whole batch.
    kept: Option<(&'a [usize], &'a rlx_core::Layout)>,
}

/// Find the culprit of a non-finite value of `start` at its element `element` (in `start`'s element
/// order over `geometry`), from every node's value (`values`, `None` where not computed).
fn culprit(
    graph: &Graph,
    values: &[Option<Vec<f64>>],
    geometry: &mut Geometry,
    start: NodeId,
    element: usize,
    to_batch: &ToBatch<'_>,
) -> Option<Culprit> {
    let value_at = |node: NodeId, e: usize| -> Option<f64> {
        values.get(node.0 as usize)?.as_ref()?.get(e).copied()
    };
    let (mut node, mut e) = (start, element);
    value_at(node, e).filter(|v| !v.is_finite())?;
    // Each step moves to an earlier node, so this ends.
    loop {
        let current = graph.node(node);
        let shape = current.shape.clone();
        let mut next = None;
        let mut operands = Vec::new();
        // Operands precede their node (`plan::check_graph` holds an artifact's graphs to it).
        for &arg in current.args.iter().filter(|arg| arg.0 < node.0) {
            let arg_shape = graph.node(arg).shape.clone();
            let read = read_elements(geometry, &current.op, &shape, e, &arg_shape);
            let found = read
                .iter()
                .copied()
                .find(|&a| value_at(arg, a).is_some_and(|v| !v.is_finite()));
            if let (None, Some(a)) = (next, found) {
                next = Some((arg, a));
            }
            if let Some(&a) = read.first() {
                if let Some(v) = value_at(arg, a) {
                    operands.push(Operand {
                        node: arg,
                        span: graph.node(arg).span,
                        input: input_name(graph, arg),
                        value: v,
                    });
                }
            }
        }
        match next {
            Some((arg, a)) => (node, e) = (arg, a),
            None => {
                return Some(Culprit {
                    node,
                    input: input_name(graph, node),
                    op: current.op.name(),
                    span: current.span,
                    call: current.call,
                    value: value_at(node, e)?,
                    element: describe(geometry, &shape, e, to_batch),
                    operands,
                })
            }
        }
    }
}

/// The name of the recipe input `node` reads, when it is an input.
fn input_name(graph: &Graph, node: NodeId) -> Option<String> {
    match graph.node(node).op {
        Op::Input(i) => graph.inputs.get(i as usize).map(|x| x.name.clone()),
        _ => None,
    }
}

/// The elements of an operand (at `arg`) that a node of op `op` at `shape` reads for its element `e`.
fn read_elements(
    geometry: &mut Geometry,
    op: &Op,
    shape: &Shape,
    e: usize,
    arg: &Shape,
) -> Vec<usize> {
    let elementwise = op.is_elementwise() || matches!(op, Op::Uniform);
    if elementwise && arg.broadcasts_to(shape) {
        return geometry
            .map(shape, arg)
            .get(e)
            .copied()
            .into_iter()
            .collect();
    }
    if matches!(op, Op::Other) && shape.level == Level::Pair && arg.level == Level::Resp {
        return geometry
            .other_map(shape, arg)
            .get(e)
            .copied()
            .into_iter()
            .collect();
    }
    if matches!(
        op,
        Op::ReduceSum | Op::ReduceMax | Op::ReduceMin | Op::Count
    ) && shape.broadcasts_to(arg)
    {
        return geometry
            .map(arg, shape)
            .iter()
            .enumerate()
            .filter(|(_, &up)| up == e)
            .map(|(a, _)| a)
            .collect();
    }
    (0..geometry.size(arg)).collect()
}

/// Element `e` of `shape` in batch terms.
fn describe(geometry: &Geometry, shape: &Shape, e: usize, to_batch: &ToBatch<'_>) -> Element {
    let Some(&(base, feature)) = geometry.elements(shape).get(e) else {
        return Element::default();
    };
    let layout = &geometry.layout;
    // (group, (response, position in its group)) in the whole batch.
    let response = |r: usize| match to_batch.kept {
        Some((kept, full)) => {
            let r = kept.get(r).copied().unwrap_or(r);
            let group = full.response_groups().get(r).copied().unwrap_or(0);
            let first = full.group_offsets.get(group).copied().unwrap_or(r);
            (group, (r, r - first))
        }
        None => {
            let group = geometry.response_group[r];
            (group, (r, r - layout.group_offsets[group]))
        }
    };
    let group = |g: usize| match to_batch.kept {
        Some((kept, full)) => {
            let first = layout.group_offsets[g];
            let r = kept.get(first).copied().unwrap_or(first);
            full.response_groups().get(r).copied().unwrap_or(g)
        }
        None => g,
    };
    let mut element = Element {
        feature: shape.feature.is_some().then_some(feature),
        ..Element::default()
    };
    match shape.level {
        Level::Batch => {}
        Level::Group => element.group = Some(group(base)),
        Level::Resp => {
            let (g, r) = response(base);
            element.group = Some(g);
            element.response = Some(r);
        }
        Level::Pair => {
            let (i, j) = geometry.pairs[base];
            let (g, r) = response(i);
            element.group = Some(g);
            element.response = Some(r);
            element.other = Some(response(j).1);
        }
        Level::Tok => {
            let r = geometry.token_response[base];
            let (g, within) = response(r);
            element.group = Some(g);
            element.response = Some(within);
            element.token = Some(base - layout.token_offsets[r]);
        }
    }
    element
}

#[cfg(test)]
mod tests {
    use rlx_compiler::ir::Graph;

    use super::*;
    use crate::interp::{evaluate, Context, EvalError};
    use crate::kernel::{Kernel, Options};

    /// A recipe (its text, with its sources) compiled, and rollouts read against it.
    fn compiled(text: &str, rollouts: &str) -> (rlx_compiler::Checked, Graph, crate::batch::Batch) {
        let checked = rlx_compiler::check_source("case.rlx", text);
        let recipe = checked.recipe.as_ref().expect("the recipe checks");
        let graph = rlx_compiler::compile_graph(recipe, &[]).expect("compiles");
        let read = crate::rollouts::read_rollouts(rollouts, recipe).expect("rollouts");
        (checked, graph, read.batch)
    }

    fn non_finite(error: EvalError) -> NonFinite {
        match error {
            EvalError::NonFinite(non_finite) => *non_finite,
            other => panic!("not a non-finite output: {other}"),
        }
    }

    fn span_text(text: &str, site: Option<Site>) -> &str {
        let site = site.expect("a span");
        &text[site.start as usize..site.end as usize]
    }

    const LOG: &str = "input logp : f32[tok] policy\ninput score : f32[resp]\nreward = log(score)\nadvantage = reward - mean(reward over resp)\nloss = mean(-advantage * logp over tok, batch)\n";
    const LOG_ROLLOUTS: &str = "{\"group\": \"a\", \"score\": 1, \"logp\": [-1, -2]}\n{\"group\": \"a\", \"score\": 0, \"logp\": [-1]}\n{\"group\": \"b\", \"score\": 2, \"logp\": [-1]}\n";

    #[test]
    fn the_interpreter_names_the_log_of_zero() {
        let (checked, graph, batch) = compiled(LOG, LOG_ROLLOUTS);
        let error = evaluate(&graph, &batch, &Context::default()).expect_err("a NaN loss");
        let found = non_finite(error);
        assert_eq!(found.output, Output::Loss);
        let culprit = found.culprit.clone().expect("a culprit");
        assert_eq!(span_text(LOG, culprit.span), "log(score)");
        assert_eq!(culprit.value, f64::NEG_INFINITY);
        assert_eq!(culprit.element.to_string(), "group 0, response 1");
        assert_eq!(culprit.operands.len(), 1);
        assert_eq!(culprit.operands[0].input.as_deref(), Some("score"));
        assert_eq!(culprit.operands[0].value, 0.0);
        let message = found.to_string();
        assert!(
            message.starts_with("the loss is NaN: `log` (%"),
            "{message}"
        );
        assert!(message.contains("`score` = 0"), "{message}");
        let diagnostic = found.diagnostic(&checked.sources).expect("a diagnostic");
        assert_eq!(diagnostic.code, "rlx::non_finite");
        assert_eq!(diagnostic.file, checked.root);
        assert_eq!(
            diagnostic.message,
            "the loss is NaN: `log(score)` is -inf for group 0, response 1"
        );
        let label = &diagnostic.labels[0];
        assert_eq!(
            &LOG[label.span.start as usize..label.span.end as usize],
            "log(score)"
        );
        assert!(diagnostic
            .help
            .as_deref()
            .unwrap_or("")
            .contains("input `score` = 0"));
    }

    #[test]
    fn the_kernel_failure_is_explained_by_the_interpreter() {
        // The executor's finiteness check explains a kernel's non-finite output the same way.
        let (_, graph, batch) = compiled(LOG, LOG_ROLLOUTS);
        let kernel = Kernel::compile(&graph, &Options::default()).expect("a kernel");
        let error = kernel
            .run(&batch, &Context::default())
            .expect_err("a NaN loss");
        let culprit = non_finite(error.clone()).culprit.expect("a culprit");
        assert_eq!(span_text(LOG, culprit.span), "log(score)");
        assert_eq!(culprit.element.to_string(), "group 0, response 1");
        // Explaining it again changes nothing.
        assert_eq!(
            error.clone().explained(&graph, &batch, &Context::default()),
            error
        );
    }

    #[test]
    fn a_value_beyond_the_kernels_precision_is_said_to_be_finite_in_the_interpreter() {
        // exp(100) overflows f32 but not f64.
        let text = "input logp : f32[tok] policy\ninput score : f32[resp]\nreward = exp(score)\nadvantage = reward - mean(reward over resp)\nloss = mean(-advantage * logp over tok, batch)\n";
        let rollouts = "{\"group\": \"a\", \"score\": 100, \"logp\": [-1]}\n{\"group\": \"a\", \"score\": 1, \"logp\": [-1]}\n";
        let (_, graph, batch) = compiled(text, rollouts);
        assert!(evaluate(&graph, &batch, &Context::default()).is_ok());
        let f32_kernel = Options {
            accumulate: crate::kernel::Precision::F32,
            storage: crate::kernel::Precision::F32,
        };
        let kernel = Kernel::compile(&graph, &f32_kernel).expect("a kernel");
        let found = non_finite(kernel.run(&batch, &Context::default()).unwrap_err());
        assert!(
            found.culprit.is_none() && found.interpreter_finite,
            "{found}"
        );
        assert!(
            found.to_string().contains("finite in the f64 interpreter"),
            "{found}"
        );
    }

    #[test]
    fn a_kept_sub_batch_names_elements_of_the_whole_batch() {
        // Group a is dropped; in group b the second response's token 1 divides by 0.
        let text = "input logp : f32[tok] policy\ninput score : f32[resp]\ninput d : f32[tok]\nreward = score\nkeep group when max(reward over resp) > 0\nadvantage = reward\nloss = mean(-advantage * logp / d over tok, batch)\n";
        let rollouts = "{\"group\": \"a\", \"score\": 0, \"logp\": [-1], \"d\": [0]}\n{\"group\": \"b\", \"score\": 1, \"logp\": [-1], \"d\": [1]}\n{\"group\": \"b\", \"score\": 2, \"logp\": [-1, -2], \"d\": [1, 0]}\n";
        let (_, graph, batch) = compiled(text, rollouts);
        let error = evaluate(&graph, &batch, &Context::default()).expect_err("an infinite loss");
        let culprit = non_finite(error).culprit.expect("a culprit");
        assert_eq!(span_text(text, culprit.span), "-advantage * logp / d");
        assert_eq!(culprit.element.to_string(), "group 1, response 1, token 1");
        assert_eq!(culprit.element.response, Some((2, 1)));
    }

    #[test]
    fn a_non_finite_input_is_its_own_culprit() {
        let (_, graph, mut batch) = compiled(LOG, LOG_ROLLOUTS);
        // score 0 → 1, and a NaN log-probability at the second token of the first response.
        batch.inputs[1][1] = 1.0;
        batch.inputs[0][1] = f64::NAN;
        let found = non_finite(evaluate(&graph, &batch, &Context::default()).unwrap_err());
        let culprit = found.culprit.clone().expect("a culprit");
        assert_eq!(culprit.input.as_deref(), Some("logp"));
        assert_eq!(culprit.element.to_string(), "group 0, response 0, token 1");
        assert!(found.to_string().contains("input `logp` is NaN"), "{found}");
    }
}
