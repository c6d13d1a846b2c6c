//! `RunArgs::gpu` (`rlx run --device cuda:N`): the plan records the GPU only when this build has the
//! `cuda` feature and the GPU is usable; otherwise `prepare` fails with an error naming what is missing,
//! and `--device cpu` (`gpu: None`) leaves the plan on the configured CPU backend.

use std::path::Path;

use rlx_trainer::cli::{prepare, RunArgs};
use rlx_trainer::op::Objective;

fn grpo() -> rlx_compiler::hir::Recipe {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let checked = rlx_compiler::check_path(&root.join("recipes/grpo.rlx")).expect("readable");
    checked.recipe.expect("a clean recipe")
}

fn args(gpu: Option<usize>) -> RunArgs {
    RunArgs {
        recipe_name: "grpo".into(),
        gpu,
        ..Default::default()
    }
}

/// What a failure to use GPU `ordinal` must say in this build.
fn assert_names_what_is_missing(message: &str, ordinal: usize) {
    if cfg!(feature = "cuda") {
        assert!(
            message.contains("NVIDIA") || message.contains("GPU") || message.contains("CUDA"),
            "{message}"
        );
    } else {
        assert!(
            message.contains(&format!("--device cuda:{ordinal}"))
                && message.contains("built without the `cuda` feature"),
            "{message}"
        );
    }
}

#[test]
fn device_cpu_keeps_the_configured_backend() {
    let prepared = prepare(&grpo(), &args(None)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(prepared.plan.gpu, None);
}

#[test]
fn device_cuda_is_recorded_only_when_the_gpu_is_usable() {
    for ordinal in [0, 7] {
        match prepare(&grpo(), &args(Some(ordinal))) {
            Ok(prepared) if cfg!(feature = "cuda") => {
                assert_eq!(prepared.plan.gpu, Some(ordinal));
            }
            Ok(_) => panic!("no `cuda` feature, yet a GPU plan"),
            Err(message) => assert_names_what_is_missing(&message, ordinal),
        }
    }
}

#[test]
fn the_gpu_objective_is_the_cuda_kernel_or_a_clear_error() {
    let graph = rlx_compiler::compile_graph(&grpo(), &[]).unwrap();
    match Objective::gpu(&graph, 0) {
        Ok(_) if !cfg!(feature = "cuda") => panic!("no `cuda` feature, yet a GPU objective"),
        Ok(objective) => {
            assert_eq!(objective.name(), "cuda");
            assert_eq!(objective.graph().inputs.len(), graph.inputs.len());
        }
        Err(message) => assert_names_what_is_missing(&message, 0),
    }
}
