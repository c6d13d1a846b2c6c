//! Hugging Face checkpoints in and out (trainer/src/hf.rs), checked against transformers itself: for each
//! architecture a tiny random checkpoint made by transformers (`hf_reference.py make`, `save_pretrained`)
//! gives the same logits in rlx as in transformers on a ragged, left-padded batch, the same greedy
//! continuations, and rlx's export of it (plain, LoRA-merged, PEFT adapter) reloads in transformers with
//! the logits rlx computes. The config checks need no Python: their folders are written by rlx.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use candle_core::{DType, Device, Tensor};
use rlx_trainer::hf::{self, TokenIds};
use rlx_trainer::model::{LoraConfig, Model, ModelConfig};
use rlx_trainer::rng::Rng;
use rlx_trainer::sample::{generate, Settings};

/// The logits tolerance (absolute) of the issue: rlx vs transformers, both float32.
const TOLERANCE: f32 = 1e-4;

fn tmp(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("hf")
        .join(format!("{name}-{}", std::process::id()));
    if dir.exists() {
        std::fs::remove_dir_all(&dir).unwrap();
    }
    std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
    dir
}

fn python(args: &[&str]) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/hf_reference.py");
    let output = Command::new(rlx_tools::python())
        .arg(script)
        .args(args)
        .output()
        .expect("run the torch environment's python (scripts/install-torch.sh)");
    assert!(
        output.status.success(),
        "hf_reference.py {args:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The tiny transformers checkpoint of `arch`, made once per test binary.
fn fixture(arch: &'static str) -> PathBuf {
    static DIRS: OnceLock<std::sync::Mutex<Vec<(&'static str, PathBuf)>>> = OnceLock::new();
    let dirs = DIRS.get_or_init(Default::default);
    let mut dirs = dirs.lock().unwrap();
    if let Some((_, dir)) = dirs.iter().find(|(a, _)| *a == arch) {
        return dir.clone();
    }
    let dir = tmp(&format!("fixture-{arch}"));
    python(&["make", arch, dir.to_str().unwrap()]);
    dirs.push((arch, dir.clone()));
    dir
}

/// Ragged prompts (left-padded in one batch by both sides).
fn prompts(vocab: usize) -> Vec<Vec<u32>> {
    let mut rng = Rng::new(7);
    [9usize, 3, 14, 1, 6]
        .iter()
        .map(|&len| (0..len).map(|_| rng.int(3, vocab - 1) as u32).collect())
        .collect()
}

fn write_request(dir: &Path, prompts: &[Vec<u32>], max_new: usize) -> PathBuf {
    let path = dir.with_extension("request.json");
    let json = serde_json::json!({"prompts": prompts, "max_new_tokens": max_new});
    std::fs::write(&path, json.to_string()).unwrap();
    path
}

/// rlx's logits of the left-padded batch, `[rows, width, vocab]`, and the padding of each row.
fn rlx_logits(model: &Model, prompts: &[Vec<u32>]) -> (Vec<Vec<Vec<f32>>>, Vec<usize>) {
    let width = prompts.iter().map(Vec::len).max().unwrap();
    let pads: Vec<usize> = prompts.iter().map(|p| width - p.len()).collect();
    let ids: Vec<u32> = prompts
        .iter()
        .flat_map(|p| std::iter::repeat_n(0, width - p.len()).chain(p.iter().copied()))
        .collect();
    let ids = Tensor::from_vec(ids, (prompts.len(), width), &Device::Cpu).unwrap();
    let logits = model.no_grad().forward(&ids, &pads).unwrap();
    (logits.to_vec3::<f32>().unwrap(), pads)
}

fn hf_logits(args: &[&str]) -> Vec<Vec<Vec<f32>>> {
    let out = args.last().unwrap().to_string();
    python(args);
    let tensors = candle_core::safetensors::load(&out, &Device::Cpu).unwrap();
    tensors["logits"]
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec3::<f32>()
        .unwrap()
}

/// The largest |rlx − transformers| over every real (unpadded) position and vocabulary entry.
fn max_difference(a: &[Vec<Vec<f32>>], b: &[Vec<Vec<f32>>], pads: &[usize]) -> f32 {
    assert_eq!(a.len(), b.len(), "rows");
    let mut worst = 0f32;
    for (row, pad) in pads.iter().enumerate() {
        assert_eq!(a[row].len(), b[row].len(), "positions of row {row}");
        for j in *pad..a[row].len() {
            assert_eq!(a[row][j].len(), b[row][j].len(), "vocabulary");
            for (x, y) in a[row][j].iter().zip(&b[row][j]) {
                assert!(
                    x.is_finite() && y.is_finite(),
                    "row {row} position {j}: {x} vs {y}"
                );
                worst = worst.max((x - y).abs());
            }
        }
    }
    worst
}

fn read_logits(path: &Path) -> Vec<Vec<Vec<f32>>> {
    let tensors = candle_core::safetensors::load(path, &Device::Cpu).unwrap();
    tensors["logits"]
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec3::<f32>()
        .unwrap()
}

/// A LoRA model on `arch`'s checkpoint whose adapters are not zero (as after training).
fn adapted(base: Model) -> Model {
    let lora = LoraConfig {
        rank: 4,
        alpha: 8.0,
        dropout: 0.0,
        targets: ["q", "k", "v", "o", "gate", "up", "down"]
            .map(String::from)
            .to_vec(),
    };
    let model = base.with_lora(&lora, 3).unwrap();
    let mut rng = Rng::new(11);
    for (_, var) in model.vars() {
        let values: Vec<f32> = (0..var.elem_count())
            .map(|_| (rng.normal() * 0.1) as f32)
            .collect();
        var.set(&Tensor::from_vec(values, var.shape(), &Device::Cpu).unwrap())
            .unwrap();
    }
    model
}

/// Everything one architecture is checked on, with transformers run once for all of it (importing
/// torch takes seconds): rlx's logits of the checkpoint transformers made, its greedy continuations,
/// and its exports (plain, LoRA-merged, PEFT adapter on the base) reloaded in transformers.
fn against_transformers(arch: &'static str) {
    let fixture = fixture(arch);
    let work = tmp(&format!("work-{arch}"));
    std::fs::create_dir_all(&work).unwrap();
    let path = |name: &str| work.join(name).to_str().unwrap().to_string();
    let model = hf::load_model(&fixture, &Device::Cpu).unwrap();
    let prompts = prompts(model.config.vocab);
    let max_new = 12;
    let request = write_request(&work.join("request"), &prompts, max_new);
    let request = request.to_str().unwrap().to_string();
    let base = fixture.to_str().unwrap().to_string();

    hf::save(&model, &TokenIds::default(), &work.join("export"), None).unwrap();
    let lora = adapted(hf::load_model(&fixture, &Device::Cpu).unwrap());
    hf::save(&lora, &TokenIds::default(), &work.join("merged"), None).unwrap();
    hf::save_adapter(&lora, &fixture, &work.join("adapter")).unwrap();
    let jobs = serde_json::json!([
        ["logits", base, request, path("base.safetensors")],
        ["greedy", base, request, path("greedy.json")],
        [
            "logits",
            path("export"),
            request,
            path("export.safetensors")
        ],
        [
            "logits",
            path("merged"),
            request,
            path("merged.safetensors")
        ],
        [
            "peft",
            base,
            path("adapter"),
            request,
            path("peft.safetensors")
        ],
    ]);
    let jobs_file = work.join("jobs.json");
    std::fs::write(&jobs_file, jobs.to_string()).unwrap();
    python(&["jobs", jobs_file.to_str().unwrap()]);

    let (ours, pads) = rlx_logits(&model, &prompts);
    let (adapted, _) = rlx_logits(&lora, &prompts);
    let moved = max_difference(&ours, &adapted, &pads);
    assert!(
        moved > 1e-2,
        "{arch}: the adapters change nothing ({moved})"
    );
    let spread = ours[0]
        .last()
        .unwrap()
        .iter()
        .fold(0f32, |m, x| m.max(x.abs()));
    assert!(spread > 0.1, "{arch}: logits all near zero ({spread})");
    for (what, theirs, mine) in [
        ("the checkpoint transformers made", "base", &ours),
        ("rlx's export", "export", &ours),
        ("rlx's LoRA-merged export", "merged", &adapted),
        ("rlx's PEFT adapter on the base", "peft", &adapted),
    ] {
        let theirs = read_logits(&work.join(format!("{theirs}.safetensors")));
        let worst = max_difference(mine, &theirs, &pads);
        eprintln!(
            "{arch}: {what} in transformers: max |rlx − transformers| logit difference {worst:.2e}"
        );
        assert!(
            worst <= TOLERANCE,
            "{arch}: {what}: logits differ by {worst}"
        );
    }

    // Greedy decoding, all prompts in one left-padded batch (no row may see another's padding).
    let theirs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(work.join("greedy.json")).unwrap()).unwrap();
    let settings = Settings {
        temperature: 0.0,
        top_p: 1.0,
        max_new_tokens: max_new,
        stop: Vec::new(),
        entropy: false,
    };
    let greedy = generate(
        &model,
        &prompts,
        1,
        &settings,
        &mut Rng::new(0),
        &Device::Cpu,
    )
    .unwrap();
    for (i, completion) in greedy.iter().enumerate() {
        let want: Vec<u32> = serde_json::from_value(theirs["continuations"][i].clone()).unwrap();
        assert_eq!(
            completion.tokens, want,
            "{arch}: greedy continuation of prompt {i}"
        );
    }
}

macro_rules! per_architecture {
    ($($arch:ident),*) => {
        mod transformers_reference {
            $(
                #[cfg_attr(not(rlx_transformers), ignore = "needs transformers and peft: run scripts/install-torch.sh")]
                #[test]
                fn $arch() {
                    super::against_transformers(stringify!($arch));
                }
            )*
        }
    };
}

per_architecture!(llama, qwen2, qwen3);

// ---- Without Python: rlx's own round trip and the config checks. ----

fn tiny(arch: &str) -> ModelConfig {
    ModelConfig {
        vocab: 50,
        hidden: 24,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        intermediate: 40,
        rope_theta: 10000.0,
        rms_eps: 1e-5,
        max_positions: 64,
        init_std: 0.2,
        head_dim: (arch == "qwen3").then_some(8),
        attention_bias: arch == "qwen2",
        qk_norm: arch == "qwen3",
        rope_scaling: None,
    }
}

/// An rlx-written checkpoint folder of a fresh tiny model.
fn written(arch: &str, name: &str) -> (Model, PathBuf) {
    let model = Model::new(&tiny(arch), 5, &Device::Cpu).unwrap();
    let dir = tmp(name);
    hf::save(&model, &TokenIds::default(), &dir, None).unwrap();
    (model, dir)
}

#[test]
fn save_then_load_is_exact_for_each_architecture() {
    for arch in ["llama", "qwen2", "qwen3"] {
        let (model, dir) = written(arch, &format!("roundtrip-{arch}"));
        let config = hf::read_config(&dir).unwrap();
        assert_eq!(config.architecture.model_type(), arch);
        assert_eq!(config.model, model.config, "{arch}");
        let back = hf::load_model(&dir, &Device::Cpu).unwrap();
        let prompts = prompts(50);
        let (a, _) = rlx_logits(&model, &prompts);
        let (b, _) = rlx_logits(&back, &prompts);
        assert_eq!(a, b, "{arch}: logits after save + load");
    }
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) {
    let path = dir.join("config.json");
    let mut value: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(value.as_object_mut().unwrap());
    std::fs::write(&path, value.to_string()).unwrap();
}

fn load_error(dir: &Path) -> String {
    match hf::load_model(dir, &Device::Cpu) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e,
    }
}

#[test]
fn config_errors_name_the_problem() {
    let missing = tmp("missing-folder");
    assert!(
        load_error(&missing).contains("not a directory"),
        "{}",
        load_error(&missing)
    );

    type Break = Box<dyn Fn(&Path)>;
    let cases: Vec<(&str, Break, &str)> = vec![
        (
            "no-config",
            Box::new(|d| std::fs::remove_file(d.join("config.json")).unwrap()),
            "config.json",
        ),
        (
            "bad-json",
            Box::new(|d| std::fs::write(d.join("config.json"), "{ nope").unwrap()),
            "not valid JSON",
        ),
        (
            "architecture",
            Box::new(|d| {
                edit_config(d, |c| {
                    c.insert("architectures".into(), serde_json::json!(["GPT2LMHeadModel"]));
                })
            }),
            "architecture `GPT2LMHeadModel` is not supported",
        ),
        (
            "unknown-key",
            Box::new(|d| {
                edit_config(d, |c| {
                    c.insert("attn_logit_softcapping".into(), serde_json::json!(50.0));
                })
            }),
            "key `attn_logit_softcapping` is not understood",
        ),
        (
            "activation",
            Box::new(|d| {
                edit_config(d, |c| {
                    c.insert("hidden_act".into(), serde_json::json!("gelu"));
                })
            }),
            "`hidden_act` = \"gelu\" is not supported",
        ),
        (
            "rope",
            Box::new(|d| {
                edit_config(d, |c| {
                    c.insert(
                        "rope_parameters".into(),
                        serde_json::json!({"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}),
                    );
                })
            }),
            "rope_type` = \"yarn\" is not supported",
        ),
        (
            "shape",
            Box::new(|d| {
                edit_config(d, |c| {
                    c.insert("intermediate_size".into(), serde_json::json!(48));
                })
            }),
            "parameter `model.layers.0.mlp.gate_proj.weight` has shape [40, 24], the config needs [48, 24]",
        ),
        (
            "no-weights",
            Box::new(|d| std::fs::remove_file(d.join("model.safetensors")).unwrap()),
            "no model.safetensors and no model.safetensors.index.json",
        ),
        (
            "bad-weights",
            Box::new(|d| std::fs::write(d.join("model.safetensors"), b"garbage").unwrap()),
            "not a readable safetensors file",
        ),
        (
            "shard-escape",
            Box::new(|d| {
                std::fs::remove_file(d.join("model.safetensors")).unwrap();
                std::fs::write(
                    d.join("model.safetensors.index.json"),
                    r#"{"weight_map": {"model.norm.weight": "../outside.safetensors"}}"#,
                )
                .unwrap();
            }),
            "shards must be plain .safetensors file names inside the folder",
        ),
    ];
    for (name, break_it, want) in cases {
        let (_, dir) = written("llama", &format!("error-{name}"));
        break_it(&dir);
        let message = load_error(&dir);
        assert!(message.contains(want), "{name}: {message}");
    }

    // Qwen2 with sliding-window attention is refused, not run as full attention.
    let (_, dir) = written("qwen2", "error-sliding");
    edit_config(&dir, |c| {
        c.insert("use_sliding_window".into(), serde_json::json!(true));
    });
    let message = load_error(&dir);
    assert!(
        message.contains("`use_sliding_window` = true is not supported"),
        "{message}"
    );
}

#[test]
fn sharded_checkpoints_load_like_one_file() {
    let (model, dir) = written("qwen3", "sharded");
    let tensors =
        candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu).unwrap();
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    let (first, second) = names.split_at(names.len() / 2);
    let mut map = serde_json::Map::new();
    for (file, part) in [
        ("model-00001-of-00002.safetensors", first),
        ("model-00002-of-00002.safetensors", second),
    ] {
        let shard: std::collections::HashMap<String, Tensor> = part
            .iter()
            .map(|n| ((*n).clone(), tensors[*n].clone()))
            .collect();
        candle_core::safetensors::save(&shard, dir.join(file)).unwrap();
        for n in part {
            map.insert((*n).clone(), serde_json::json!(file));
        }
    }
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::json!({"metadata": {}, "weight_map": map}).to_string(),
    )
    .unwrap();
    let back = hf::load_model(&dir, &Device::Cpu).unwrap();
    let prompts = prompts(50);
    assert_eq!(
        rlx_logits(&model, &prompts).0,
        rlx_logits(&back, &prompts).0
    );
}

#[test]
fn lora_trains_only_the_adapters_and_starts_at_the_base() {
    let base = Model::new(&tiny("llama"), 5, &Device::Cpu).unwrap();
    let full = base.parameter_count();
    let prompts = prompts(50);
    let before = rlx_logits(&base, &prompts).0;
    let lora = LoraConfig {
        rank: 2,
        alpha: 4.0,
        dropout: 0.0,
        targets: vec!["q".into(), "v".into()],
    };
    let model = base.with_lora(&lora, 1).unwrap();
    // Two layers × (q, v) × (A, B).
    assert_eq!(model.vars().len(), 8);
    let count = model.parameter_count();
    // Per layer, q (24 → 24): A [2, 24] + B [24, 2]; v (24 → 2 heads × 6): A [2, 24] + B [12, 2].
    assert_eq!(count, 2 * (2 * 24 + 24 * 2 + 2 * 24 + 12 * 2));
    assert!(count * 20 < full, "{count} adapter parameters of {full}");
    assert!(model.vars()[0]
        .0
        .ends_with("layers.0.self_attn.q_proj.lora_A.weight"));
    // B = 0: the adapted model starts exactly at the base.
    assert_eq!(rlx_logits(&model, &prompts).0, before);
    // The reference copy shares the base: changing the policy's adapters leaves it alone.
    let reference = model.frozen_copy().unwrap();
    let (_, b) = &model.vars()[1];
    b.set(&b.as_tensor().ones_like().unwrap()).unwrap();
    assert_ne!(rlx_logits(&model, &prompts).0, before);
    assert_eq!(rlx_logits(&reference, &prompts).0, before);

    let bad = LoraConfig {
        targets: vec!["q".into(), "lm_head".into()],
        ..lora.clone()
    };
    let error = Model::new(&tiny("llama"), 5, &Device::Cpu)
        .unwrap()
        .with_lora(&bad, 1)
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("\"lm_head\" is not a projection"), "{error}");
}

// ---- SmolLM2-135M-Instruct from an HF folder made from its GGUF. ----

/// The folder `rlx export --config configs/smollm2.toml --hf DIR` writes, made once.
fn smollm2_folder() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tmp("smollm2-hf");
        let config = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../configs/smollm2.toml"
        ))
        .unwrap();
        rlx_trainer::export::export_config(&config, &dir, false).unwrap();
        dir
    })
}

#[cfg_attr(
    not(rlx_assets),
    ignore = "needs the pinned assets: run scripts/fetch-assets.sh"
)]
#[test]
fn smollm2_from_an_hf_folder_is_the_gguf_model() {
    let (gguf, tokenizer) = rlx_trainer::gguf::load_smollm2(&Device::Cpu).unwrap();
    let dir = smollm2_folder();
    let model = hf::load_model(dir, &Device::Cpu).unwrap();
    assert_eq!(model.config, gguf.config);
    assert!(model.tied());
    let question = tokenizer
        .chat_ids("What is the capital of France?")
        .unwrap();
    let prompts = vec![question.clone(), question[3..].to_vec()];
    assert_eq!(
        rlx_logits(&model, &prompts).0,
        rlx_logits(&gguf, &prompts).0
    );
    let settings = Settings {
        temperature: 0.0,
        top_p: 1.0,
        max_new_tokens: 16,
        stop: tokenizer.stop_ids().to_vec(),
        entropy: false,
    };
    let greedy = |m: &Model| {
        generate(
            m,
            &prompts[..1],
            1,
            &settings,
            &mut Rng::new(0),
            &Device::Cpu,
        )
        .unwrap()[0]
            .tokens
            .clone()
    };
    let answer = greedy(&model);
    assert_eq!(answer, greedy(&gguf));
    let text = tokenizer.decode(&answer, true).unwrap();
    assert!(text.contains("Paris"), "{text:?}");
    // The folder's tokenizer is the GGUF's: same ids, same chat prompt, same stop tokens.
    let back = rlx_trainer::tokenizer::ChatTokenizer::from_hf_dir(dir).unwrap();
    assert_eq!(
        back.chat_ids("What is the capital of France?").unwrap(),
        question
    );
    assert_eq!(back.stop_ids(), tokenizer.stop_ids());
}

#[cfg_attr(
    not(all(rlx_assets, rlx_transformers)),
    ignore = "needs the pinned assets and transformers: run scripts/fetch-assets.sh and scripts/install-torch.sh"
)]
#[test]
fn smollm2_hf_folder_matches_transformers() {
    let dir = smollm2_folder();
    let model = hf::load_model(dir, &Device::Cpu).unwrap();
    let tokenizer = rlx_trainer::tokenizer::ChatTokenizer::from_hf_dir(dir).unwrap();
    let prompts: Vec<Vec<u32>> = ["What is the capital of France?", "Say hi."]
        .iter()
        .map(|q| tokenizer.chat_ids(q).unwrap())
        .collect();
    let request = write_request(&tmp("smollm2-request"), &prompts, 0);
    let out = tmp("smollm2-logits").with_extension("safetensors");
    let theirs = hf_logits(&[
        "logits",
        dir.to_str().unwrap(),
        request.to_str().unwrap(),
        out.to_str().unwrap(),
    ]);
    let (ours, pads) = rlx_logits(&model, &prompts);
    let worst = max_difference(&ours, &theirs, &pads);
    // 30 layers of f32 arithmetic in two orders: the bound is relative to the logits' scale (about
    // 20 here), 1e-5 of it.
    let scale = ours
        .iter()
        .flatten()
        .flatten()
        .fold(0f32, |m, x| m.max(x.abs()));
    eprintln!(
        "SmolLM2-135M: max |rlx − transformers| logit difference {worst:.2e}, {:.2e} of the largest logit ({scale:.1})",
        worst / scale
    );
    assert!(scale > 1.0, "the logits are all small ({scale})");
    assert!(
        worst <= 1e-5 * scale,
        "SmolLM2: logits differ by {worst} (largest logit {scale})"
    );
}
