//! Checkpoints: `OUT/checkpoint/` holds the policy (`model.safetensors`), the frozen reference when the
//! recipe uses one (`reference.safetensors`), AdamW's moments (`optimizer.safetensors`), the loop's state
//! (`state.json`: steps done, optimizer step, RNG states, accuracy before RL, recipe params), the resolved
//! config (`config.toml`) and the metrics lines so far (`metrics.jsonl`).
//!
//! A checkpoint is written into `OUT/checkpoint.tmp/` (each file flushed to disk), then swapped in with
//! renames (`checkpoint` → `checkpoint.old`, `checkpoint.tmp` → `checkpoint`, `checkpoint.old` removed),
//! so a crash at any moment leaves a complete checkpoint in `checkpoint/` or, between the two renames,
//! in `checkpoint.old/` (which [`locate`] also finds).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::model::Model;
use crate::optim::AdamW;

/// The format of `state.json`; a checkpoint of another format is refused. Format 2: parameters carry
/// their Hugging Face names (format 1 had private ones), LoRA runs save only the adapters and name
/// their base.
pub const FORMAT: u32 = 2;

/// The frozen base of a LoRA run's checkpoint: where it was loaded from and the SHA-256 of its files,
/// checked on `--resume` (the checkpoint holds only the adapters, so a changed base would silently
/// resume a different model).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BaseModel {
    pub path: String,
    pub sha256: String,
}

/// The base of a LoRA run (`None` without LoRA): the files its frozen weights come from, digested.
pub fn base_model(model: &crate::kinds::ModelSection) -> Result<Option<BaseModel>, String> {
    use crate::kinds::ModelSection;
    if model.lora().is_none() {
        return Ok(None);
    }
    let (path, files) = match model {
        ModelSection::Tiny(_) => return Ok(None),
        ModelSection::Smollm2 { .. } => {
            let gguf = crate::assets::smollm2_gguf()?;
            (gguf.clone(), vec![gguf])
        }
        ModelSection::Hf { path, .. } => {
            let dir = PathBuf::from(path);
            (dir.clone(), crate::hf::weight_files(&dir)?)
        }
    };
    Ok(Some(BaseModel {
        path: path.display().to_string(),
        sha256: digest(&files)?,
    }))
}

/// The SHA-256 of `files` (their bytes in order, each preceded by its name and length).
pub fn digest(files: &[PathBuf]) -> Result<String, String> {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    for path in files {
        let mut file = std::fs::File::open(path).map_err(|e| io(path, e))?;
        let len = file.metadata().map_err(|e| io(path, e))?.len();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        hasher.update(format!("{name}\0{len}\0").as_bytes());
        loop {
            let n = file.read(&mut buffer).map_err(|e| io(path, e))?;
            if n == 0 {
                break;
            }
            hasher.update(&buffer[..n]);
        }
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct State {
    pub format: u32,
    /// RL steps completed (the next step to run).
    pub step: usize,
    /// AdamW updates taken (the bias-correction exponent).
    pub optimizer_step: u64,
    pub prompt_rng: u64,
    pub sample_rng: u64,
    pub accuracy_before: Option<f64>,
    /// The held-out evaluation before the first step (`eval/…` metrics).
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub eval_before: serde_json::Map<String, serde_json::Value>,
    /// Mean reward of each completed step.
    pub rewards: Vec<f64>,
    /// The recipe's params as compiled (a resumed run must use the same).
    pub params: Vec<(String, f64)>,
    pub has_reference: bool,
    /// A LoRA run's base model (its checkpoints hold only the adapters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<BaseModel>,
    /// The recipe's `state` values for the next step, by name in declaration order (non-finite
    /// values as the strings `inf`, `-inf`, `nan`).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        with = "rlx_compiler::ir::json_float::pairs"
    )]
    pub recipe_state: Vec<(String, f64)>,
}

/// A checkpoint read back.
pub struct Loaded {
    pub dir: PathBuf,
    pub state: State,
    pub config_text: String,
    pub metrics_text: String,
}

fn io(path: &Path, e: impl std::fmt::Display) -> String {
    format!("checkpoint: {}: {e}", path.display())
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let mut file = std::fs::File::create(path).map_err(|e| io(path, e))?;
    file.write_all(bytes).map_err(|e| io(path, e))?;
    file.sync_all().map_err(|e| io(path, e))
}

fn save_tensors(path: &Path, tensors: &HashMap<String, Tensor>) -> Result<(), String> {
    candle_core::safetensors::save(tensors, path).map_err(|e| io(path, e))?;
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| io(path, e))
}

/// The model's weights on the host (a copy from the GPU for a run there; the tensors themselves on the
/// CPU).
fn weights(model: &Model) -> Result<HashMap<String, Tensor>, String> {
    model
        .vars()
        .iter()
        .map(|(name, var)| {
            let tensor = var
                .as_tensor()
                .to_device(&Device::Cpu)
                .map_err(|e| format!("cannot copy `{name}` from the GPU: {e}"))?;
            Ok((name.clone(), tensor))
        })
        .collect()
}

/// Write a checkpoint of the run in `out` atomically; returns its directory.
pub fn save(
    out: &Path,
    state: &State,
    config_toml: &str,
    metrics: &str,
    policy: &Model,
    reference: Option<&Model>,
    optimizer: &AdamW,
) -> Result<PathBuf, String> {
    let tmp = out.join("checkpoint.tmp");
    let dest = out.join("checkpoint");
    let old = out.join("checkpoint.old");
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| io(&tmp, e))?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| io(&tmp, e))?;
    save_tensors(&tmp.join("model.safetensors"), &weights(policy)?)?;
    if let Some(reference) = reference {
        save_tensors(&tmp.join("reference.safetensors"), &weights(reference)?)?;
    }
    let moments = optimizer
        .state_tensors(&Device::Cpu)
        .map_err(|e| io(&tmp, e))?;
    save_tensors(&tmp.join("optimizer.safetensors"), &moments)?;
    let json = serde_json::to_string_pretty(state).map_err(|e| io(&tmp, e))?;
    write_synced(&tmp.join("state.json"), json.as_bytes())?;
    write_synced(&tmp.join("config.toml"), config_toml.as_bytes())?;
    write_synced(&tmp.join("metrics.jsonl"), metrics.as_bytes())?;
    if dest.exists() {
        if old.exists() {
            std::fs::remove_dir_all(&old).map_err(|e| io(&old, e))?;
        }
        std::fs::rename(&dest, &old).map_err(|e| io(&dest, e))?;
    }
    std::fs::rename(&tmp, &dest).map_err(|e| io(&dest, e))?;
    if old.exists() {
        std::fs::remove_dir_all(&old).map_err(|e| io(&old, e))?;
    }
    Ok(dest)
}

/// The checkpoint directory `dir` names: `dir` itself when it holds `state.json`, else `dir/checkpoint`
/// (or `dir/checkpoint.old`, left by a crash between the two renames of a save).
pub fn locate(dir: &Path) -> Result<PathBuf, String> {
    for candidate in [
        dir.to_path_buf(),
        dir.join("checkpoint"),
        dir.join("checkpoint.old"),
    ] {
        if candidate.join("state.json").is_file() {
            return Ok(candidate);
        }
    }
    Err(format!(
        "{}: no checkpoint there (expected {}; `rlx run` writes one every train.checkpoint_every steps and at the end)",
        dir.display(),
        dir.join("checkpoint").join("state.json").display()
    ))
}

/// Read the state, config and metrics of the checkpoint `dir` names (see [`locate`]).
pub fn load(dir: &Path) -> Result<Loaded, String> {
    let dir = locate(dir)?;
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read_to_string(&path).map_err(|e| io(&path, e))
    };
    let state_path = dir.join("state.json");
    let state: State =
        serde_json::from_str(&read("state.json")?).map_err(|e| io(&state_path, e))?;
    if state.format != FORMAT {
        return Err(io(
            &state_path,
            format!("format {} (this rlx reads format {FORMAT})", state.format),
        ));
    }
    Ok(Loaded {
        config_text: read("config.toml")?,
        metrics_text: read("metrics.jsonl")?,
        state,
        dir,
    })
}

/// Read tensors saved in the checkpoint.
pub fn read_tensors(dir: &Path, name: &str) -> Result<HashMap<String, Tensor>, String> {
    let path = dir.join(name);
    candle_core::safetensors::load(&path, &Device::Cpu).map_err(|e| io(&path, e))
}

/// Set `model`'s weights from `name` (every parameter must be there with its shape).
pub fn restore_weights(model: &Model, dir: &Path, name: &str) -> Result<(), String> {
    let tensors = read_tensors(dir, name)?;
    let path = dir.join(name);
    for (param, var) in model.vars() {
        let tensor = tensors
            .get(param)
            .ok_or_else(|| io(&path, format!("no tensor `{param}`")))?;
        if tensor.dims() != var.dims() {
            return Err(io(
                &path,
                format!(
                    "`{param}` has shape {:?}, the model {:?}",
                    tensor.dims(),
                    var.dims()
                ),
            ));
        }
        // Read on the CPU; a run on a GPU has its parameters there.
        let tensor = tensor.to_device(var.device()).map_err(|e| io(&path, e))?;
        var.set(&tensor).map_err(|e| io(&path, e))?;
    }
    Ok(())
}
