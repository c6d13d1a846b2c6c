//! Hugging Face checkpoints in and out: a folder with `config.json`, `model.safetensors` (or a sharded
//! `model.safetensors.index.json`), the tokenizer files and `generation_config.json`.
//!
//! **Reading.** `config.json` is untrusted input: every key is either understood (it sets the
//! architecture, see [`read_config`]), known to have no effect on the forward pass (metadata such as
//! `transformers_version`, `initializer_range`, the token ids the tokenizer files also hold), or an
//! error naming it — a key the loader does not know is never silently ignored, and a known key with a
//! value rlx does not implement (`hidden_act = "gelu"`, `use_sliding_window = true`, a rope type other
//! than default/linear/llama3, …) is an error too. Architectures: `LlamaForCausalLM` (Llama 3.x,
//! SmolLM2), `Qwen2ForCausalLM` (q/k/v biases), `Qwen3ForCausalLM` (per-head q/k RMS norm, its own
//! head dimension). Both config styles are read: transformers ≥ 5 (`rope_parameters`, `dtype`) and
//! earlier (`rope_theta`, `rope_scaling`, `torch_dtype`). Weights may be f32, bf16 or f16; they are
//! trained in f32.
//!
//! **Writing** ([`save`]): config.json in transformers' form, `model.safetensors` with the HF tensor
//! names (f32; LoRA adapters merged), `generation_config.json`, and the tokenizer files — a folder
//! `transformers.AutoModelForCausalLM.from_pretrained` loads. [`save_adapter`] writes a PEFT adapter
//! (`adapter_model.safetensors` + `adapter_config.json`) instead.

use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path};

use candle_core::{DType, Device, Tensor};
use serde_json::{json, Map, Value};

use crate::model::{LoraConfig, Model, ModelConfig, RopeScaling, LM_HEAD};

/// The most bytes of a JSON file of a checkpoint folder that are read.
pub const MAX_JSON_BYTES: u64 = 64 << 20;

/// The architectures rlx loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Qwen2,
    Qwen3,
}

impl Architecture {
    /// `architectures[0]` of config.json.
    pub fn class(self) -> &'static str {
        match self {
            Architecture::Llama => "LlamaForCausalLM",
            Architecture::Qwen2 => "Qwen2ForCausalLM",
            Architecture::Qwen3 => "Qwen3ForCausalLM",
        }
    }

    /// `model_type` of config.json.
    pub fn model_type(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
        }
    }

    fn all() -> [Architecture; 3] {
        [
            Architecture::Llama,
            Architecture::Qwen2,
            Architecture::Qwen3,
        ]
    }
}

/// What config.json says, read and checked.
#[derive(Clone, Debug, PartialEq)]
pub struct HfConfig {
    pub architecture: Architecture,
    pub model: ModelConfig,
    pub tied: bool,
    /// `eos_token_id` of config.json (one id or several), the stop tokens when there is no
    /// generation_config.json.
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
    pub pad_token_id: Option<u32>,
}

fn err(path: &Path, message: impl std::fmt::Display) -> String {
    format!("{}: {message}", path.display())
}

/// Read a JSON file of a checkpoint folder (size-capped, untrusted).
pub fn read_json(path: &Path) -> Result<Value, String> {
    let text = rlx_compiler::files::read_text(path, MAX_JSON_BYTES).map_err(|e| err(path, e))?;
    serde_json::from_str(&text).map_err(|e| err(path, format!("not valid JSON: {e}")))
}

/// Keys of config.json that do not change the forward pass: metadata, training-time or generation
/// settings that the tokenizer and generation files also carry, and transformers' runtime switches.
const METADATA_KEYS: [&str; 15] = [
    "_name_or_path",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "initializer_range",
    "use_cache",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "pretraining_tp",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "is_decoder",
    "_attn_implementation_autoset",
];

fn usize_key(
    path: &Path,
    config: &Map<String, Value>,
    key: &str,
    limit: usize,
) -> Result<usize, String> {
    match config.get(key) {
        None => Err(err(path, format!("key `{key}` is missing"))),
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 && n <= limit as u64 => Ok(n as usize),
            _ => Err(err(
                path,
                format!("`{key}` = {v} must be an integer in 1..={limit}"),
            )),
        },
    }
}

fn f64_key(path: &Path, value: &Value, key: &str) -> Result<f64, String> {
    match value.as_f64() {
        Some(x) if x.is_finite() && x > 0.0 => Ok(x),
        _ => Err(err(
            path,
            format!("`{key}` = {value} must be a positive number"),
        )),
    }
}

fn token_ids(path: &Path, config: &Map<String, Value>, key: &str) -> Result<Vec<u32>, String> {
    let bad = || {
        err(
            path,
            format!("`{key}` must be a token id, a list of them or null"),
        )
    };
    let one = |v: &Value| {
        v.as_u64()
            .filter(|n| *n <= u32::MAX as u64)
            .map(|n| n as u32)
    };
    match config.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items.iter().map(|v| one(v).ok_or_else(bad)).collect(),
        Some(v) => Ok(vec![one(v).ok_or_else(bad)?]),
    }
}

/// The rotary settings: `rope_parameters` (transformers ≥ 5) or `rope_theta` + `rope_scaling`.
fn rope(path: &Path, config: &Map<String, Value>) -> Result<(f64, Option<RopeScaling>), String> {
    let (params, where_) = match (config.get("rope_parameters"), config.get("rope_scaling")) {
        (Some(p), None) if !p.is_null() => (Some(p.clone()), "rope_parameters"),
        (None | Some(Value::Null), Some(s)) if !s.is_null() => (Some(s.clone()), "rope_scaling"),
        (Some(p), Some(s)) if !p.is_null() && !s.is_null() => {
            return Err(err(
                path,
                "both `rope_parameters` and `rope_scaling` are set",
            ))
        }
        _ => (None, "rope_parameters"),
    };
    let mut theta = match config.get("rope_theta") {
        None => None,
        Some(v) => Some(f64_key(path, v, "rope_theta")?),
    };
    let Some(params) = params else {
        return Ok((theta.unwrap_or(10_000.0), None));
    };
    let Value::Object(params) = params else {
        return Err(err(path, format!("`{where_}` must be an object")));
    };
    let kind = params
        .get("rope_type")
        .or_else(|| params.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default")
        .to_string();
    let number = |key: &str| -> Result<f64, String> {
        let v = params.get(key).ok_or_else(|| {
            err(
                path,
                format!("`{where_}.{key}` is missing (rope type {kind})"),
            )
        })?;
        f64_key(path, v, &format!("{where_}.{key}"))
    };
    if let Some(v) = params.get("rope_theta") {
        let t = f64_key(path, v, &format!("{where_}.rope_theta"))?;
        if theta.is_some_and(|old| old != t) {
            return Err(err(
                path,
                "`rope_theta` and `rope_parameters.rope_theta` disagree",
            ));
        }
        theta = Some(t);
    }
    let allowed: &[&str] = match kind.as_str() {
        "default" => &["rope_type", "type", "rope_theta"],
        "linear" => &["rope_type", "type", "rope_theta", "factor"],
        "llama3" => &[
            "rope_type",
            "type",
            "rope_theta",
            "factor",
            "low_freq_factor",
            "high_freq_factor",
            "original_max_position_embeddings",
        ],
        other => {
            return Err(err(
                path,
                format!(
                    "`{where_}.rope_type` = {other:?} is not supported (default, linear, llama3)"
                ),
            ))
        }
    };
    if let Some(extra) = params.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(err(
            path,
            format!("`{where_}.{extra}` is not understood for rope type {kind:?}"),
        ));
    }
    let scaling = match kind.as_str() {
        "linear" => Some(RopeScaling::Linear {
            factor: number("factor")?,
        }),
        "llama3" => Some(RopeScaling::Llama3 {
            factor: number("factor")?,
            low_freq_factor: number("low_freq_factor")?,
            high_freq_factor: number("high_freq_factor")?,
            original_max_position_embeddings: number("original_max_position_embeddings")? as usize,
        }),
        _ => None,
    };
    Ok((theta.unwrap_or(10_000.0), scaling))
}

/// Read and check `dir/config.json` (see the module doc for the rules).
pub fn read_config(dir: &Path) -> Result<HfConfig, String> {
    let path = dir.join("config.json");
    if !dir.is_dir() {
        return Err(format!(
            "model.path {}: not a directory (a Hugging Face checkpoint folder with config.json, model.safetensors and tokenizer.json)",
            dir.display()
        ));
    }
    let Value::Object(config) = read_json(&path)? else {
        return Err(err(&path, "not a JSON object"));
    };
    let model_type = config.get("model_type").and_then(Value::as_str);
    let classes: Vec<&str> = match config.get("architectures") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        Some(v) => return Err(err(&path, format!("`architectures` = {v} is not a list"))),
    };
    let architecture = match (classes.as_slice(), model_type) {
        ([class], _) => Architecture::all()
            .into_iter()
            .find(|a| a.class() == *class)
            .ok_or_else(|| {
                err(
                    &path,
                    format!("architecture `{class}` is not supported (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)"),
                )
            })?,
        ([], Some(t)) => Architecture::all()
            .into_iter()
            .find(|a| a.model_type() == t)
            .ok_or_else(|| {
                err(&path, format!("model_type `{t}` is not supported (llama, qwen2, qwen3)"))
            })?,
        ([], None) => return Err(err(&path, "neither `architectures` nor `model_type` is set")),
        (many, _) => {
            return Err(err(
                &path,
                format!("`architectures` lists {} classes; one is needed", many.len()),
            ))
        }
    };
    if let Some(t) = model_type {
        if t != architecture.model_type() {
            return Err(err(
                &path,
                format!(
                    "model_type `{t}` disagrees with architecture `{}`",
                    architecture.class()
                ),
            ));
        }
    }

    // Keys that must hold the value rlx implements.
    let mut understood: Vec<&str> = vec![
        "architectures",
        "model_type",
        "tie_word_embeddings",
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
        "rms_norm_eps",
        "max_position_embeddings",
        "head_dim",
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "hidden_act",
        "attention_dropout",
    ];
    let require = |key: &str, ok: &dyn Fn(&Value) -> bool, what: &str| -> Result<(), String> {
        match config.get(key) {
            Some(v) if !ok(v) => Err(err(
                &path,
                format!("`{key}` = {v} is not supported (rlx implements {what})"),
            )),
            _ => Ok(()),
        }
    };
    require("hidden_act", &|v| v == "silu", "\"silu\"")?;
    require(
        "attention_dropout",
        &|v| v.as_f64() == Some(0.0),
        "no attention dropout: 0.0",
    )?;
    let attention_bias = match architecture {
        Architecture::Qwen2 => true,
        Architecture::Llama | Architecture::Qwen3 => {
            understood.push("attention_bias");
            match config.get("attention_bias") {
                None | Some(Value::Bool(false)) => false,
                Some(Value::Bool(true)) => true,
                Some(v) => {
                    return Err(err(
                        &path,
                        format!("`attention_bias` = {v} is not a boolean"),
                    ))
                }
            }
        }
    };
    if architecture == Architecture::Llama {
        understood.push("mlp_bias");
        require("mlp_bias", &|v| v == false, "no MLP bias: false")?;
    } else {
        understood.extend([
            "use_sliding_window",
            "sliding_window",
            "max_window_layers",
            "layer_types",
        ]);
        require(
            "use_sliding_window",
            &|v| v == false,
            "full attention in every layer: false",
        )?;
        if let Some(Value::Array(types)) = config.get("layer_types") {
            if let Some(t) = types.iter().find(|t| *t != "full_attention") {
                return Err(err(
                    &path,
                    format!("`layer_types` has {t}: only \"full_attention\" layers are supported"),
                ));
            }
        }
    }
    if let Some(key) = config
        .keys()
        .find(|k| !understood.contains(&k.as_str()) && !METADATA_KEYS.contains(&k.as_str()))
    {
        return Err(err(
            &path,
            format!("key `{key}` is not understood by rlx's loader (a key that changed the model would be silently ignored, so it is refused)"),
        ));
    }

    let heads = usize_key(&path, &config, "num_attention_heads", 1 << 12)?;
    let kv_heads = match config.get("num_key_value_heads") {
        None | Some(Value::Null) => heads,
        Some(_) => usize_key(&path, &config, "num_key_value_heads", 1 << 12)?,
    };
    let head_dim = match config.get("head_dim") {
        None | Some(Value::Null) => None,
        Some(_) => Some(usize_key(&path, &config, "head_dim", 1 << 14)?),
    };
    let rms_eps = match config.get("rms_norm_eps") {
        None => 1e-6,
        Some(v) => f64_key(&path, v, "rms_norm_eps")?,
    };
    let (rope_theta, rope_scaling) = rope(&path, &config)?;
    let tied = match config.get("tie_word_embeddings") {
        // transformers' default for LlamaConfig, Qwen2Config and Qwen3Config.
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(err(
                &path,
                format!("`tie_word_embeddings` = {v} is not a boolean"),
            ))
        }
    };
    let mut model = ModelConfig {
        vocab: usize_key(&path, &config, "vocab_size", 1 << 22)?,
        hidden: usize_key(&path, &config, "hidden_size", 1 << 17)?,
        layers: usize_key(&path, &config, "num_hidden_layers", 1 << 10)?,
        heads,
        kv_heads,
        intermediate: usize_key(&path, &config, "intermediate_size", 1 << 20)?,
        rope_theta,
        rms_eps,
        max_positions: usize_key(&path, &config, "max_position_embeddings", 1 << 24)?,
        init_std: 0.02,
        head_dim,
        attention_bias,
        qk_norm: architecture == Architecture::Qwen3,
        rope_scaling,
    };
    if model.head_dim == Some(model.hidden / model.heads)
        && model.hidden.is_multiple_of(model.heads)
    {
        model.head_dim = None;
    }
    if let Some(eps) = config.get("initializer_range").and_then(Value::as_f64) {
        if eps.is_finite() && eps > 0.0 {
            model.init_std = eps;
        }
    }
    model.validate().map_err(|e| err(&path, e))?;
    Ok(HfConfig {
        architecture,
        model,
        tied,
        eos_token_ids: token_ids(&path, &config, "eos_token_id")?,
        bos_token_id: token_ids(&path, &config, "bos_token_id")?.first().copied(),
        pad_token_id: token_ids(&path, &config, "pad_token_id")?.first().copied(),
    })
}

/// A shard's file name from the index: one plain `.safetensors` name inside the folder.
fn shard_name(index: &Path, name: &str) -> Result<(), String> {
    let p = Path::new(name);
    let plain = p.components().count() == 1
        && matches!(p.components().next(), Some(Component::Normal(_)))
        && name.ends_with(".safetensors");
    if plain {
        Ok(())
    } else {
        Err(err(
            index,
            format!("weight_map names the file {name:?}: shards must be plain .safetensors file names inside the folder"),
        ))
    }
}

/// The files that hold a checkpoint folder's model: config.json and the weights (the single file or
/// the index and its shards, sorted).
pub fn weight_files(dir: &Path) -> Result<Vec<std::path::PathBuf>, String> {
    let mut files = vec![dir.join("config.json")];
    let single = dir.join("model.safetensors");
    let index = dir.join("model.safetensors.index.json");
    if single.is_file() {
        files.push(single);
    } else if index.is_file() {
        let mut shards: Vec<String> = match read_json(&index)?.get("weight_map") {
            Some(Value::Object(map)) => map
                .values()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect(),
            _ => return Err(err(&index, "`weight_map` is missing or not an object")),
        };
        shards.sort();
        shards.dedup();
        files.push(index);
        for shard in shards {
            shard_name(&dir.join("model.safetensors.index.json"), &shard)?;
            files.push(dir.join(shard));
        }
    } else {
        return Err(format!(
            "{}: no model.safetensors and no model.safetensors.index.json",
            dir.display()
        ));
    }
    Ok(files)
}

/// Every tensor of the checkpoint's weights: `model.safetensors`, or the shards that
/// `model.safetensors.index.json` maps (each tensor must be in the shard the index names).
pub fn read_weights(dir: &Path, device: &Device) -> Result<HashMap<String, Tensor>, String> {
    let single = dir.join("model.safetensors");
    let index = dir.join("model.safetensors.index.json");
    let load = |path: &Path| {
        candle_core::safetensors::load(path, device)
            .map_err(|e| err(path, format!("not a readable safetensors file: {e}")))
    };
    if single.is_file() {
        return load(&single);
    }
    if !index.is_file() {
        return Err(format!(
            "{}: no model.safetensors and no model.safetensors.index.json",
            dir.display()
        ));
    }
    let map = match read_json(&index)?.get("weight_map") {
        Some(Value::Object(map)) => map.clone(),
        _ => return Err(err(&index, "`weight_map` is missing or not an object")),
    };
    let mut by_file: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (tensor, file) in &map {
        let Some(file) = file.as_str() else {
            return Err(err(
                &index,
                format!("weight_map[{tensor:?}] is not a file name"),
            ));
        };
        shard_name(&index, file)?;
        by_file
            .entry(file.to_string())
            .or_default()
            .push(tensor.clone());
    }
    let mut out = HashMap::new();
    for (file, names) in by_file {
        let path = dir.join(&file);
        let mut tensors = load(&path)?;
        for name in names {
            let t = tensors.remove(&name).ok_or_else(|| {
                err(
                    &path,
                    format!("the index puts `{name}` here, but the shard has no such tensor"),
                )
            })?;
            out.insert(name, t);
        }
        if let Some(extra) = tensors.keys().min() {
            return Err(err(
                &path,
                format!("tensor `{extra}` is not in the index's weight_map"),
            ));
        }
    }
    Ok(out)
}

/// The trainable model of a Hugging Face checkpoint folder (every weight an f32 `Var`).
pub fn load_model(dir: &Path, device: &Device) -> Result<Model, String> {
    let config = read_config(dir)?;
    let mut weights = read_weights(dir, device)?;
    if config.tied {
        // transformers may write the tied head too; it must then be the embedding.
        if let Some(head) = weights.remove(LM_HEAD) {
            let embed = weights.get(crate::model::EMBED);
            let same = embed.is_some_and(|e| {
                e.dims() == head.dims()
                    && (e.to_dtype(DType::F32).and_then(|e| {
                        (e - head.to_dtype(DType::F32)?)?
                            .abs()?
                            .max_all()?
                            .to_scalar::<f32>()
                    }))
                    .is_ok_and(|d| d == 0.0)
            });
            if !same {
                return Err(format!(
                    "{}: tie_word_embeddings is true but `{LM_HEAD}` differs from the embedding",
                    dir.display()
                ));
            }
        }
    }
    Model::from_weights(
        &config.model,
        weights.into_iter().collect(),
        config.tied,
        device,
    )
    .map_err(|e| format!("{}: {e}", dir.display()))
}

/// config.json for `model` in transformers' (≥ 5) form.
pub fn config_json(model: &Model, architecture: Architecture, tokens: &TokenIds) -> Value {
    let c = &model.config;
    let rope = match &c.rope_scaling {
        None => json!({"rope_type": "default", "rope_theta": c.rope_theta}),
        Some(RopeScaling::Linear { factor }) => {
            json!({"rope_type": "linear", "rope_theta": c.rope_theta, "factor": factor})
        }
        Some(RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        }) => json!({
            "rope_type": "llama3", "rope_theta": c.rope_theta, "factor": factor,
            "low_freq_factor": low_freq_factor, "high_freq_factor": high_freq_factor,
            "original_max_position_embeddings": original_max_position_embeddings,
        }),
    };
    let mut config = json!({
        "architectures": [architecture.class()],
        "model_type": architecture.model_type(),
        "vocab_size": c.vocab,
        "hidden_size": c.hidden,
        "num_hidden_layers": c.layers,
        "num_attention_heads": c.heads,
        "num_key_value_heads": c.kv_heads,
        "head_dim": c.head_dim(),
        "intermediate_size": c.intermediate,
        "hidden_act": "silu",
        "rms_norm_eps": c.rms_eps,
        "max_position_embeddings": c.max_positions,
        "rope_parameters": rope,
        "tie_word_embeddings": model.tied(),
        "attention_dropout": 0.0,
        "initializer_range": c.init_std,
        "use_cache": true,
        "dtype": "float32",
        "bos_token_id": tokens.bos,
        "eos_token_id": tokens.eos_value(),
        "pad_token_id": tokens.pad,
    });
    let object = config.as_object_mut().expect("an object");
    match architecture {
        Architecture::Llama => {
            object.insert("attention_bias".into(), json!(c.attention_bias));
            object.insert("mlp_bias".into(), json!(false));
        }
        Architecture::Qwen2 | Architecture::Qwen3 => {
            if architecture == Architecture::Qwen3 {
                object.insert("attention_bias".into(), json!(c.attention_bias));
            }
            object.insert("use_sliding_window".into(), json!(false));
            object.insert("sliding_window".into(), Value::Null);
            object.insert(
                "layer_types".into(),
                json!(vec!["full_attention"; c.layers]),
            );
        }
    }
    config
}

/// The special token ids written to config.json and generation_config.json.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenIds {
    pub bos: Option<u32>,
    pub eos: Vec<u32>,
    pub pad: Option<u32>,
}

impl TokenIds {
    fn eos_value(&self) -> Value {
        match self.eos.as_slice() {
            [] => Value::Null,
            [one] => json!(one),
            many => json!(many),
        }
    }
}

/// The architecture of `model` for an export: Qwen3 with q/k norms, Qwen2 with biases, else Llama.
pub fn architecture_of(model: &Model) -> Architecture {
    let c = &model.config;
    match (c.qk_norm, c.attention_bias) {
        (true, _) => Architecture::Qwen3,
        (false, true) => Architecture::Qwen2,
        (false, false) => Architecture::Llama,
    }
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), String> {
    rlx_compiler::files::write_output(path, bytes).map_err(|e| err(path, e))
}

fn write_json(path: &Path, value: &Value) -> Result<(), String> {
    let mut text = serde_json::to_string_pretty(value).map_err(|e| err(path, e))?;
    text.push('\n');
    write(path, text.as_bytes())
}

fn save_safetensors(path: &Path, tensors: Vec<(String, Tensor)>) -> Result<(), String> {
    let map: HashMap<String, Tensor> = tensors
        .into_iter()
        .map(|(n, t)| Ok((n, t.to_device(&Device::Cpu)?.contiguous()?)))
        .collect::<candle_core::Result<_>>()
        .map_err(|e| err(path, e))?;
    candle_core::safetensors::save(&map, path).map_err(|e| err(path, e))
}

/// Create `out` (it must not exist, or be an empty directory: an export never overwrites files).
fn fresh_dir(out: &Path) -> Result<(), String> {
    check_output_dir(out)?;
    std::fs::create_dir_all(out).map_err(|e| err(out, e))
}

/// Whether `out` may receive an export: absent or an empty directory (checked again by the export
/// itself; `rlx run --export-hf` checks it before a run starts).
pub fn check_output_dir(out: &Path) -> Result<(), String> {
    let empty = std::fs::read_dir(out).is_ok_and(|mut d| d.next().is_none());
    if out.exists() && !empty {
        return Err(format!(
            "{}: exists and is not an empty directory (an export does not overwrite files)",
            out.display()
        ));
    }
    Ok(())
}

/// Write `model` (LoRA adapters merged) as a Hugging Face checkpoint folder `out`: config.json,
/// model.safetensors (f32, HF tensor names; the tied head not repeated), and the tokenizer files and
/// generation_config.json (the stop tokens) that `tokenizer` writes — or, without a tokenizer, a
/// generation_config.json of `tokens`.
pub fn save(
    model: &Model,
    tokens: &TokenIds,
    out: &Path,
    tokenizer: Option<&crate::tokenizer::ChatTokenizer>,
) -> Result<(), String> {
    let architecture = architecture_of(model);
    fresh_dir(out)?;
    write_json(
        &out.join("config.json"),
        &config_json(model, architecture, tokens),
    )?;
    let weights = model.merged_weights().map_err(|e| err(out, e))?;
    save_safetensors(&out.join("model.safetensors"), weights)?;
    match tokenizer {
        // The tokenizer writes the tokenizer files and generation_config.json (its stop ids).
        Some(tokenizer) => tokenizer.save_hf(out).map_err(|e| err(out, e))?,
        None => {
            let mut generation = json!({"_from_model_config": false});
            let g = generation.as_object_mut().expect("an object");
            if let Some(bos) = tokens.bos {
                g.insert("bos_token_id".into(), json!(bos));
            }
            if !tokens.eos.is_empty() {
                g.insert("eos_token_id".into(), tokens.eos_value());
            }
            if let Some(pad) = tokens.pad {
                g.insert("pad_token_id".into(), json!(pad));
            }
            write_json(&out.join("generation_config.json"), &generation)?;
        }
    }
    Ok(())
}

/// Write the LoRA adapters of `model` as a PEFT adapter folder `out` (`adapter_model.safetensors` with
/// PEFT's tensor names, `adapter_config.json` pointing at `base`).
pub fn save_adapter(model: &Model, base: &Path, out: &Path) -> Result<(), String> {
    let Some(lora) = model.lora() else {
        return Err("the model has no LoRA adapters (model.lora is not set)".into());
    };
    fresh_dir(out)?;
    let tensors = model
        .vars()
        .iter()
        .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
        .collect();
    save_safetensors(&out.join("adapter_model.safetensors"), tensors)?;
    write_json(
        &out.join("adapter_config.json"),
        &adapter_config(lora, base),
    )
}

/// PEFT's `adapter_config.json` for `lora` on the base model folder `base`.
pub fn adapter_config(lora: &LoraConfig, base: &Path) -> Value {
    json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base.display().to_string(),
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": lora.module_names(),
        "bias": "none",
        "fan_in_fan_out": false,
        "inference_mode": true,
        "init_lora_weights": true,
        "use_rslora": false,
        "use_dora": false,
        "modules_to_save": null,
        "layers_to_transform": null,
    })
}
