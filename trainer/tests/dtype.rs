//! `train.dtype = "bf16"`: the projections' products in bf16, everything else f32 (`Model::
//! with_compute_dtype`). Against the f32 model: the log-probs differ by bf16 rounding only, the trained
//! weights stay f32 and get f32 gradients close to the f32 model's, the merged view (sampling, the
//! reference) computes exactly what the trained forward computes, and a short run trains.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use rlx_trainer::cli::{prepare, RunArgs};
use rlx_trainer::model::{LoraConfig, Model, ModelConfig};
use rlx_trainer::train::completion_logp;

fn tiny() -> ModelConfig {
    ModelConfig {
        vocab: 17,
        hidden: 32,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        intermediate: 48,
        rope_theta: 10000.0,
        rms_eps: 1e-5,
        max_positions: 32,
        init_std: 0.3,
        head_dim: None,
        attention_bias: true,
        qk_norm: false,
        rope_scaling: None,
    }
}

fn rollouts() -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let prompts = vec![
        vec![3, 12, 4, 15],
        vec![3, 12, 4, 15],
        vec![5, 6, 12, 7, 15],
    ];
    let completions = vec![vec![7, 1], vec![8, 9, 1, 4, 2], vec![2, 11]];
    (prompts, completions)
}

fn logp(model: &Model) -> Tensor {
    let (prompts, completions) = rollouts();
    completion_logp(model, &prompts, &completions, &Device::Cpu).unwrap()
}

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

/// The gradients of Σ log-probs for every trainable parameter, flattened, in `vars()` order.
fn gradients(model: &Model) -> Vec<Vec<f32>> {
    let store = logp(model).sum_all().unwrap().backward().unwrap();
    model
        .vars()
        .iter()
        .map(|(name, var)| {
            let g = store
                .get(var.as_tensor())
                .unwrap_or_else(|| panic!("no gradient for {name}"));
            assert_eq!(g.dtype(), DType::F32, "{name}'s gradient");
            values(g)
        })
        .collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let norm = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

#[test]
fn bf16_products_round_like_bf16_and_keep_f32_weights_and_gradients() {
    let f32_model = Model::new(&tiny(), 7, &Device::Cpu).unwrap();
    let bf16_model = Model::new(&tiny(), 7, &Device::Cpu)
        .unwrap()
        .with_compute_dtype(DType::BF16)
        .unwrap();
    assert_eq!(f32_model.compute_dtype(), DType::F32);
    assert_eq!(bf16_model.compute_dtype(), DType::BF16);
    for (_, var) in bf16_model.vars() {
        assert_eq!(var.dtype(), DType::F32, "the trained weights stay f32");
    }
    let (a, b) = (values(&logp(&f32_model)), values(&logp(&bf16_model)));
    let diff = max_abs_diff(&a, &b);
    let scale = a.iter().fold(0f32, |m, x| m.max(x.abs()));
    // bf16 keeps 8 bits of mantissa (relative rounding 2⁻⁹ ≈ 0.002 per cast, of inputs and weights
    // in every product): the log-probs move, by 0.12 at most of 1.5–7.1 here, but by rounding, not by a
    // different computation (the gradients below point the same way).
    assert!(diff > 0.0, "the bf16 products computed nothing in bf16");
    assert!(
        diff < 0.05 * scale,
        "bf16 log-probs differ from f32 by {diff} (largest {scale})"
    );
    let (ga, gb) = (gradients(&f32_model), gradients(&bf16_model));
    for ((name, _), (ga, gb)) in f32_model.vars().iter().zip(ga.iter().zip(&gb)) {
        let c = cosine(ga, gb);
        assert!(
            c > 0.99,
            "{name}: the bf16 gradient's cosine with f32's is {c}"
        );
    }
}

#[test]
fn the_merged_view_in_bf16_computes_what_the_trained_forward_computes() {
    let model = Model::new(&tiny(), 9, &Device::Cpu)
        .unwrap()
        .with_compute_dtype(DType::BF16)
        .unwrap();
    let view = model.merged_view().unwrap();
    assert!(!view.tracks_gradients());
    assert_eq!(view.compute_dtype(), DType::BF16);
    // The view holds the bf16 casts the trained forward makes at every product: the same values.
    assert_eq!(values(&logp(&view)), values(&logp(&model)));
    // The reference model (a frozen copy) keeps the dtype.
    assert_eq!(model.frozen_copy().unwrap().compute_dtype(), DType::BF16);
    // With LoRA: the adapters stay f32 and trained, the view merges them before the cast.
    let lora = LoraConfig {
        rank: 4,
        alpha: 8.0,
        dropout: 0.0,
        targets: ["q", "v", "down"].map(String::from).to_vec(),
    };
    let adapted = Model::new(&tiny(), 9, &Device::Cpu)
        .unwrap()
        .with_lora(&lora, 3)
        .unwrap()
        .with_compute_dtype(DType::BF16)
        .unwrap();
    for (_, var) in adapted.vars() {
        let values: Vec<f32> = (0..var.elem_count())
            .map(|i| ((i * 7919 % 101) as f32 / 101.0 - 0.5) * 0.4)
            .collect();
        var.set(&Tensor::from_vec(values, var.shape(), &Device::Cpu).unwrap())
            .unwrap();
    }
    let tracked = values(&logp(&adapted));
    let merged = values(&logp(&adapted.merged_view().unwrap()));
    let diff = max_abs_diff(&tracked, &merged);
    assert!(
        diff < 0.05,
        "merged bf16 view vs the adapted forward: {diff}"
    );
    assert_eq!(gradients(&adapted).len(), adapted.vars().len());
}

#[test]
fn other_dtypes_are_errors_naming_the_choices() {
    let err = Model::new(&tiny(), 1, &Device::Cpu)
        .unwrap()
        .with_compute_dtype(DType::F16)
        .err()
        .expect("f16 is not offered");
    assert!(err.to_string().contains("f32 or bf16"), "{err}");
    let run_args = RunArgs {
        recipe_name: "grpo".into(),
        sets: vec!["train.dtype=fp8".into()],
        ..Default::default()
    };
    let err = prepare(&recipe(), &run_args).err().expect("fp8 is refused");
    assert!(
        err.contains("train.dtype = \"fp8\"") && err.contains("\"bf16\""),
        "{err}"
    );
}

fn recipe() -> rlx_compiler::hir::Recipe {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    rlx_compiler::check_path(&root.join("recipes/grpo.rlx"))
        .expect("recipe readable")
        .recipe
        .expect("recipe checks")
}

/// A short GRPO run of the built-in task with bf16 products trains: finite losses, every step.
#[test]
fn a_short_run_trains_with_bf16_products() {
    let out = std::env::temp_dir().join(format!("rlx-dtype-run-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let run_args = RunArgs {
        recipe_name: "grpo".into(),
        sets: [
            "train.dtype=bf16",
            "steps=2",
            "sft.steps=5",
            "sft.batch=8",
            "train.prompts_per_step=2",
            "task.eval_questions=4",
        ]
        .map(String::from)
        .to_vec(),
        out: Some(out.clone()),
        ..Default::default()
    };
    let prepared = prepare(&recipe(), &run_args).unwrap();
    assert_eq!(prepared.config.train.dtype, "bf16");
    rlx_trainer::train::run(prepared.plan, &prepared.config, &prepared.out, |_| {}).unwrap();
    let metrics = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let losses: Vec<f64> = metrics
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|m| m.get("loss").and_then(|v| v.as_f64()))
        .collect();
    assert_eq!(losses.len(), 2, "{metrics}");
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    let _ = std::fs::remove_dir_all(&out);
}
