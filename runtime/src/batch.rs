//! The packed batch: tokens of all responses contiguous with offsets, responses grouped with offsets,
//! ragged per-prompt criterion lists with offsets. Nothing is padded.

use serde::Serialize;

use rlx_compiler::ir::{Graph, Level};

pub use rlx_core::{Layout, LayoutError};

/// The most responses one group may have when the recipe has pairwise terms (`over others`,
/// `other.NAME`, and so `std/diversity`): their cost is n·(n − 1) pairs per group, so a group of 10⁶
/// would be 10¹² pairs. `$RLX_MAX_GROUP` raises (or lowers) it for every backend (docs/formats.md).
pub const DEFAULT_MAX_GROUP: usize = 1024;

/// The environment variable that overrides [`DEFAULT_MAX_GROUP`].
pub const MAX_GROUP_VAR: &str = "RLX_MAX_GROUP";

/// The group-size limit for pairwise recipes: `$RLX_MAX_GROUP` when set (a whole number ≥ 1), else
/// [`DEFAULT_MAX_GROUP`].
pub fn max_group() -> Result<usize, String> {
    match std::env::var(MAX_GROUP_VAR) {
        Err(std::env::VarError::NotPresent) => Ok(DEFAULT_MAX_GROUP),
        Err(std::env::VarError::NotUnicode(text)) => Err(format!(
            "{MAX_GROUP_VAR}={} is not a number of responses (a whole number ≥ 1)",
            text.to_string_lossy()
        )),
        Ok(text) => match text.trim().parse::<usize>() {
            Ok(limit) if limit >= 1 => Ok(limit),
            _ => Err(format!(
                "{MAX_GROUP_VAR}={text} is not a number of responses (a whole number ≥ 1)"
            )),
        },
    }
}

/// Refuse a batch whose groups are too large for the recipe's pairwise terms, before anything is
/// sized or allocated for them: the one check for the interpreter, the JIT and the CUDA kernels
/// (`Executor::check_layout`). A recipe without pairwise terms has no limit (its
/// cost is linear in the group size).
pub fn check_group_sizes(graph: &Graph, layout: &Layout) -> Result<(), String> {
    check_group_sizes_named(graph, layout, |g| {
        format!("group {g} of the batch (counting from 0)")
    })
}

/// [`check_group_sizes`] with `label` naming group `g` in the message (`rlx score` names it as the
/// rollout file does).
pub fn check_group_sizes_named(
    graph: &Graph,
    layout: &Layout,
    label: impl Fn(usize) -> String,
) -> Result<(), String> {
    if !graph
        .nodes
        .iter()
        .any(|node| node.shape.level == Level::Pair)
    {
        return Ok(());
    }
    check_group_sizes_within(layout, max_group()?, label)
}

/// [`check_group_sizes`] with the limit given (for a recipe known to have pairwise terms).
pub fn check_group_sizes_within(
    layout: &Layout,
    limit: usize,
    label: impl Fn(usize) -> String,
) -> Result<(), String> {
    match (0..layout.groups()).find(|&g| layout.group_size(g) > limit) {
        None => Ok(()),
        Some(g) => {
            let size = layout.group_size(g);
            Err(format!(
                "{} has {size} responses, more than the {limit} per group that a recipe with \
                 pairwise terms (`over others`) accepts: they cost n·(n − 1) pairs per group; split \
                 the group, or raise the limit with {MAX_GROUP_VAR}={size}",
                label(g)
            ))
        }
    }
}

/// One batch: its layout and every input of the recipe, by the recipe's input order, flat in the
/// element order of the input's shape (see `rlx_compiler::ir::Shape`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Batch {
    pub layout: Layout,
    pub inputs: Vec<Vec<f64>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interp::{evaluate, Context, EvalError};
    use crate::kernel::{Kernel, Options};
    use crate::synthetic::{batch as synthetic_batch, Spec};

    /// A recipe with a pairwise term, on one group of `responses`.
    fn pairwise(responses: usize) -> (Graph, Batch) {
        let text = "input score : f32[resp]\n\
                    reward = score - mean(other.score over others)\n\
                    advantage = reward\n";
        let recipe = rlx_compiler::check_source("pairwise.rlx", text)
            .recipe
            .expect("the recipe checks");
        let graph = rlx_compiler::compile_graph(&recipe, &[]).expect("it lowers");
        let spec = Spec {
            groups: 1,
            responses,
            tokens: 1,
            ragged: false,
            singleton: false,
            criteria: 0,
            dim: 0,
            seed: 3,
        };
        let batch = synthetic_batch(&graph, &spec);
        (graph, batch)
    }

    #[test]
    fn every_backend_refuses_a_group_past_the_pairwise_limit() {
        let (graph, batch) = pairwise(DEFAULT_MAX_GROUP + 1);
        let kernel = Kernel::compile(&graph, &Options::default()).expect("the JIT compiles it");
        let interp = evaluate(&graph, &batch, &Context::default()).expect_err("too large");
        let jit = kernel
            .run(&batch, &Context::default())
            .expect_err("too large");
        for error in [interp, jit] {
            assert!(matches!(error, EvalError::GroupSize(_)), "{error}");
            let error = error.to_string();
            assert!(
                error.starts_with(
                    "group 0 of the batch (counting from 0) has 1025 responses, more than the 1024"
                ) && error.contains("RLX_MAX_GROUP=1025"),
                "{error}"
            );
        }
    }

    #[test]
    fn a_group_at_the_pairwise_limit_runs() {
        let (graph, batch) = pairwise(DEFAULT_MAX_GROUP);
        let kernel = Kernel::compile(&graph, &Options::default()).expect("the JIT compiles it");
        let outcome = kernel
            .run(&batch, &Context::default())
            .expect("at the limit");
        assert_eq!(outcome.kept.len(), DEFAULT_MAX_GROUP);
        assert!(evaluate(&graph, &batch, &Context::default()).is_ok());
    }

    #[test]
    fn a_recipe_without_pairwise_terms_has_no_group_limit() {
        let layout = Layout::from_counts(
            &[DEFAULT_MAX_GROUP * 4],
            &[1; DEFAULT_MAX_GROUP * 4],
            &[],
            0,
        )
        .expect("a layout");
        let recipe =
            rlx_compiler::check_source("linear.rlx", "input score : f32[resp]\nreward = score\n")
                .recipe
                .expect("the recipe checks");
        let graph = rlx_compiler::compile_graph(&recipe, &[]).expect("it lowers");
        assert_eq!(check_group_sizes(&graph, &layout), Ok(()));
        assert!(check_group_sizes_within(&layout, DEFAULT_MAX_GROUP, |g| format!("g{g}")).is_err());
    }
}
