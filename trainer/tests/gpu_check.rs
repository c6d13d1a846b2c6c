//! The parts of scripts/gpu-check.sh that run without a GPU (its `--device cpu` smoke mode, at test
//! sizes): the LM-head benchmark (`rlx_trainer::head::benchmark`) against scripts/torch_head_bench.py
//! (PyTorch's materialised head on the same formula inputs), and scripts/gpu_step_report.py on two
//! `rlx run`s of the same first step (agreement, and a tampered loss that it must reject); and the
//! fused-against-plain layers check (`device_kernels::compare_layers`, trainer/examples/layers_check.rs)
//! on the CPU, with a 1 % difference it must reject; and the random SmolLM2-shaped checkpoint of its
//! prebuilt mode (scripts/gpu_pack_hf.py), loaded and trained a step.

use std::path::{Path, PathBuf};
use std::process::Command;

use candle_core::Device;
use rlx_trainer::cli::{prepare, RunArgs};
use rlx_trainer::head::{benchmark, BenchShape};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rlx-gpu-check-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn python(script: &str, args: &[&Path]) -> std::process::Output {
    Command::new(rlx_tools::python())
        .arg(root().join("scripts").join(script))
        .args(args)
        .output()
        .expect("run the torch environment's python (scripts/install-torch.sh)")
}

#[test]
#[cfg_attr(not(rlx_torch), ignore = "needs torch: run scripts/install-torch.sh")]
fn the_head_benchmark_agrees_with_torchs_materialised_head() {
    let shape = BenchShape {
        rows: 96,
        vocab: 3000,
        hidden: 32,
        runs: 2,
    };
    let mut document = benchmark(&Device::Cpu, shape).unwrap();
    document["device"] = "cpu".into();
    for key in [
        "seconds",
        "logp_sum",
        "entropy_sum",
        "grad_hidden_sq",
        "grad_weight_sq",
    ] {
        assert!(
            document[key].as_f64().is_some_and(f64::is_finite),
            "{key}: {document}"
        );
    }
    // Entropies are positive, log-probabilities negative.
    assert!(document["logp_sum"].as_f64().unwrap() < 0.0);
    assert!(document["entropy_sum"].as_f64().unwrap() > 0.0);
    let dir = scratch("head");
    let path = dir.join("head_rlx.json");
    std::fs::write(&path, document.to_string()).unwrap();
    let output = python("torch_head_bench.py", &[&path]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(stdout.lines().next().unwrap_or("")).expect("a JSON line first");
    assert_eq!(report["agree"], true, "{report}");
    assert!(report["worst_relative_difference"].as_f64().unwrap() <= 1e-3);
    assert!(
        stdout.contains("lm head 96 x 3000 (hidden 32) on cpu"),
        "{stdout}"
    );

    // A value off by 1% is a disagreement, exit status 1.
    document["entropy_sum"] = (document["entropy_sum"].as_f64().unwrap() * 1.01).into();
    std::fs::write(&path, document.to_string()).unwrap();
    let output = python("torch_head_bench.py", &[&path]);
    assert_eq!(output.status.code(), Some(1));
    let _ = std::fs::remove_dir_all(&dir);
}

/// One tiny GRPO step with `steps` in the config (the script's device run has more, its CPU run one).
/// recipes/grpo.rlx run to its end with `args`.
fn run_grpo(args: &RunArgs) {
    let checked = rlx_compiler::check_path(&root().join("recipes/grpo.rlx")).unwrap();
    let prepared = prepare(&checked.recipe.unwrap(), args).unwrap();
    prepared.run(|_| {}).unwrap();
}

fn run(out: &Path, steps: usize) {
    let sets = [
        format!("steps={steps}"),
        "sft.steps=10".into(),
        "train.prompts_per_step=2".into(),
        "task.eval_questions=4".into(),
        "train.eval_every=0".into(),
    ];
    let args = RunArgs {
        recipe_name: "grpo".into(),
        sets: sets.to_vec(),
        out: Some(out.to_path_buf()),
        ..Default::default()
    };
    run_grpo(&args);
}

#[test]
#[cfg_attr(not(rlx_torch), ignore = "needs torch: run scripts/install-torch.sh")]
fn the_step_report_compares_the_first_steps_and_rejects_a_different_loss() {
    let dir = scratch("step");
    let (device_run, cpu_run) = (dir.join("device"), dir.join("cpu"));
    run(&device_run, 2);
    run(&cpu_run, 1);
    let json = dir.join("step.json");
    let output = python(
        "gpu_step_report.py",
        &[&device_run, &cpu_run, Path::new("--json"), &json],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["steps"], 2);
    assert_eq!(report["step0_samples"], 2 * 8);
    assert_eq!(report["step0_samples_differing"], 0);
    assert_eq!(report["agreement_ok"], true);
    assert_eq!(report["first_loss_gpu"], report["first_loss_cpu"]);
    assert_eq!(report["reward_curve"].as_array().unwrap().len(), 2);
    // No GPU: no peak memory in the metrics.
    assert!(report["gpu_peak_bytes"].is_null());
    assert!(stdout.contains("first-step loss: agree"), "{stdout}");

    // The CPU's first loss changed by 1%: a disagreement, exit status 1.
    let metrics = cpu_run.join("metrics.jsonl");
    let text = std::fs::read_to_string(&metrics).unwrap();
    let mut first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    let loss = first["loss"].as_f64().unwrap();
    first["loss"] = (loss * 1.01 + 1e-3).into();
    let rest: Vec<&str> = text.lines().skip(1).collect();
    std::fs::write(&metrics, format!("{first}\n{}", rest.join("\n"))).unwrap();
    let output = python("gpu_step_report.py", &[&device_run, &cpu_run]);
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stdout).contains("DISAGREE"));
    // First losses of 1.0 and 1.03: a disagreement at the default 1e-3, an agreement within the bf16
    // run's `--rtol 0.05`.
    let set_first_loss = |run: &Path, loss: f64| {
        let metrics = run.join("metrics.jsonl");
        let text = std::fs::read_to_string(&metrics).unwrap();
        let mut first: serde_json::Value =
            serde_json::from_str(text.lines().next().unwrap()).unwrap();
        first["loss"] = loss.into();
        let rest: Vec<&str> = text.lines().skip(1).collect();
        std::fs::write(&metrics, format!("{first}\n{}", rest.join("\n"))).unwrap();
    };
    set_first_loss(&device_run, 1.0);
    set_first_loss(&cpu_run, 1.03);
    let output = python("gpu_step_report.py", &[&device_run, &cpu_run]);
    assert_eq!(output.status.code(), Some(1));
    let output = python(
        "gpu_step_report.py",
        &[
            &device_run,
            &cpu_run,
            Path::new("--rtol"),
            Path::new("0.05"),
        ],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(stdout.contains("first-step loss: agree"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_layers_check_finds_the_fused_and_plain_layers_alike_and_rejects_a_difference() {
    use rlx_trainer::device_kernels::{compare_layers, relative_difference, LAYERS_TOLERANCE};
    let report = compare_layers(&Device::Cpu).unwrap();
    assert!(report.agree(), "{report:?}");
    assert!(report.parameters >= 10, "{report:?}");
    let json = report.to_json("cpu");
    assert_eq!(json["agree"], true, "{json}");
    assert!(json["gradients_relative_difference"]
        .as_f64()
        .is_some_and(f64::is_finite));
    // A value off by 1 % is beyond the tolerance; a NaN or a missing value is never agreement.
    let plain = [0.5f32, -2.0, 3.0, 0.0];
    let off: Vec<f32> = plain.iter().map(|v| v * 1.01).collect();
    assert!(relative_difference(&off, &plain) > LAYERS_TOLERANCE);
    assert!(relative_difference(&plain, &plain) == 0.0);
    assert!(relative_difference(&[f32::NAN, 1.0, 1.0, 1.0], &plain).is_infinite());
    assert!(relative_difference(&plain[..3], &plain).is_infinite());
    let mut tampered = report.clone();
    tampered.gradients = 0.0099;
    assert!(!tampered.agree());
}

/// Step 5 of `scripts/gpu-check.sh --prebuilt`: scripts/gpu_pack_hf.py makes a checkpoint of
/// SmolLM2-135M's shape with random weights from the config and tokenizer files that rlx exports for
/// SmolLM2 (what scripts/gpu-pack.sh packs); rlx loads its `--tiny` form and trains a step of
/// configs/smollm2-ifeval.toml on it, pointed at it the way the script does. A config of another shape
/// is refused.
#[test]
#[cfg_attr(
    not(all(rlx_transformers, rlx_assets)),
    ignore = "needs transformers and the assets: run scripts/install-torch.sh and scripts/fetch-assets.sh"
)]
fn the_prebuilt_checks_random_checkpoint_loads_and_trains() {
    let dir = scratch("hf");
    let exported = dir.join("export");
    let config = std::fs::read_to_string(root().join("configs/smollm2.toml")).unwrap();
    rlx_trainer::export::export_config(&config, &exported, false).unwrap();
    let source = dir.join("source");
    std::fs::create_dir_all(&source).unwrap();
    for file in [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        std::fs::copy(exported.join(file), source.join(file)).unwrap();
    }
    std::fs::remove_dir_all(&exported).unwrap();

    let checkpoint = dir.join("random");
    let output = python(
        "gpu_pack_hf.py",
        &[&source, &checkpoint, Path::new("--tiny")],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let made: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(made["shape"]["vocab_size"], 49152, "{made}");
    assert_eq!(made["shape"]["num_hidden_layers"], 2, "{made}");
    assert!(checkpoint.join("model.safetensors").is_file());

    let ifeval = rlx_trainer::assets::ifeval().unwrap();
    let config = std::fs::read_to_string(root().join("configs/smollm2-ifeval.toml"))
        .unwrap()
        .replace(
            "\nkind = \"smollm2\"\n",
            &format!(
                "\nkind = \"hf\"\npath = {:?}\n",
                checkpoint.display().to_string()
            ),
        );
    assert!(config.contains("kind = \"hf\""));
    let out = dir.join("run");
    let args = RunArgs {
        recipe_name: "grpo".into(),
        config_text: Some(config),
        sets: vec![
            "steps=1".into(),
            format!("task.path={}", ifeval.display()),
            "task.eval_prompts=0".into(),
            "train.eval_every=0".into(),
            "train.prompts_per_step=2".into(),
        ],
        out: Some(out.clone()),
        ..Default::default()
    };
    run_grpo(&args);
    let metrics = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let first: serde_json::Value = serde_json::from_str(metrics.lines().next().unwrap()).unwrap();
    assert!(
        first["loss"].as_f64().is_some_and(f64::is_finite),
        "{first}"
    );
    assert_eq!(first["step"], 0, "{first}");

    // Another shape is not SmolLM2-135M's.
    let mut other: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(source.join("config.json")).unwrap())
            .unwrap();
    other["hidden_size"] = 512.into();
    std::fs::write(source.join("config.json"), other.to_string()).unwrap();
    let output = python("gpu_pack_hf.py", &[&source, &dir.join("other")]);
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("not SmolLM2-135M's shape"));
    let _ = std::fs::remove_dir_all(&dir);
}
