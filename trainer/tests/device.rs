//! `RunArgs::device` (`rlx run --device cuda:N`) and the config's `train.device`: the plan records the
//! GPU only when this build has the `cuda` feature and the GPU is usable; otherwise `prepare` fails with
//! an error naming what is missing, and `cpu` leaves the plan on the configured CPU backend.

use std::path::Path;

use rlx_trainer::cli::{prepare, RunArgs};
use rlx_trainer::config::TrainDevice;
use rlx_trainer::op::Objective;

fn grpo() -> rlx_compiler::hir::Recipe {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let checked = rlx_compiler::check_path(&root.join("recipes/grpo.rlx")).expect("readable");
    checked.recipe.expect("a clean recipe")
}

fn args(gpu: Option<usize>) -> RunArgs {
    RunArgs {
        recipe_name: "grpo".into(),
        device: gpu.map(TrainDevice::Cuda),
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
fn the_config_key_chooses_the_device_and_the_flag_overrides_it() {
    // `train.device = "cuda:3"` from the config asks for GPU 3: in this build (no GPU 3 anywhere CI
    // runs, or no feature) an error naming what is missing; `--device cpu` overrides it.
    let on_gpu = RunArgs {
        sets: vec!["train.device=cuda:3".into()],
        ..args(None)
    };
    match prepare(&grpo(), &on_gpu) {
        Ok(prepared) => assert_eq!(prepared.plan.gpu, Some(3)),
        Err(message) => assert_names_what_is_missing(&message, 3),
    }
    let forced_cpu = RunArgs {
        device: Some(TrainDevice::Cpu),
        ..on_gpu
    };
    let prepared = prepare(&grpo(), &forced_cpu).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(prepared.plan.gpu, None);
    assert_eq!(prepared.config.train.device, "cpu");
    // A malformed device is a config error naming the forms.
    let bad = RunArgs {
        sets: vec!["train.device=tpu".into()],
        ..args(None)
    };
    let message = prepare(&grpo(), &bad).err().expect("a malformed device");
    assert_eq!(
        message,
        "config: train.device \"tpu\": use \"cpu\", \"cuda\" or \"cuda:N\" (N the GPU's index)"
    );
}

#[test]
fn device_names_parse_and_print_back() {
    for (text, device) in [
        ("cpu", TrainDevice::Cpu),
        ("cuda", TrainDevice::Cuda(0)),
        ("cuda:0", TrainDevice::Cuda(0)),
        ("cuda:12", TrainDevice::Cuda(12)),
    ] {
        assert_eq!(TrainDevice::parse(text), Ok(device), "{text}");
    }
    assert_eq!(TrainDevice::Cuda(2).to_string(), "cuda:2");
    assert_eq!(TrainDevice::Cpu.to_string(), "cpu");
    for bad in ["", "gpu", "cuda:", "cuda:x", "cuda:-1", "CUDA"] {
        assert!(TrainDevice::parse(bad).is_err(), "{bad}");
    }
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
