//! `rlx export RUN_DIR --hf OUT_DIR`: a run's checkpointed policy as a Hugging Face checkpoint folder
//! (LoRA adapters merged), or with `--adapter` as a PEFT adapter folder (`hf.rs` writes both).
//!
//! The policy is rebuilt from the run's resolved config (`OUT/checkpoint/config.toml`) and its weights
//! restored from the checkpoint; a LoRA run's base is checked against the digest its checkpoint
//! records first, so a changed base file is an error, not a silently different export.

use std::path::Path;
use std::time::Instant;

use candle_core::{DType, Device};

use crate::checkpoint;
use crate::config::Config;
use crate::hf::{self, TokenIds};
use crate::kinds::ModelSection;

/// What an export wrote.
pub struct Exported {
    pub step: usize,
    pub adapter: bool,
    pub seconds: f64,
    /// Files the folder lacks, and why (the tiny model has no tokenizer of its own).
    pub notes: Vec<String>,
}

/// Export the checkpoint of `run` (a run directory or its `checkpoint/`) to the new folder `out`.
pub fn export_run(run: &Path, out: &Path, adapter: bool) -> Result<Exported, String> {
    let start = Instant::now();
    checkpoint::locate(run).map_err(|e| format!("rlx export {e}"))?;
    let loaded = checkpoint::load(run)?;
    let config = Config::parse(&loaded.config_text, &[])
        .map_err(|e| format!("{}: config.toml: {e}", loaded.dir.display()))?;
    let base = checkpoint::base_model(&config.model)?;
    if loaded.state.base != base {
        return Err(format!(
            "{}: the checkpoint's base model differs from the file its config names now ({:?} vs {:?}); its adapters belong to the base it was trained on",
            loaded.dir.display(),
            loaded.state.base,
            base
        ));
    }
    let policy = config.model.build(config.seed, &Device::Cpu, DType::F32)?;
    checkpoint::restore_weights(&policy, &loaded.dir, "model.safetensors")?;
    write(&config, &policy, out, adapter, loaded.state.step, start)
}

/// Export the model a config's `[model]` section names, as `rlx run` would start from it (e.g.
/// SmolLM2 from its GGUF as a Hugging Face folder: `rlx export --config configs/smollm2.toml --hf DIR`).
pub fn export_config(config_text: &str, out: &Path, adapter: bool) -> Result<Exported, String> {
    let start = Instant::now();
    let config = Config::parse(config_text, &[])?;
    let policy = config.model.build(config.seed, &Device::Cpu, DType::F32)?;
    write(&config, &policy, out, adapter, 0, start)
}

fn write(
    config: &Config,
    policy: &crate::model::Model,
    out: &Path,
    adapter: bool,
    step: usize,
    start: Instant,
) -> Result<Exported, String> {
    let mut notes = Vec::new();
    let tokenizer = if config.model.pretrained() {
        Some(config.model.tokenizer()?.0)
    } else {
        notes.push(
            "no tokenizer files: model.kind = \"tiny\" uses the arithmetic task's built-in character tokenizer"
                .to_string(),
        );
        None
    };
    let tokens = match &tokenizer {
        Some(t) => TokenIds {
            bos: t.bos,
            eos: t.stop_ids().to_vec(),
            pad: Some(t.pad),
        },
        None => TokenIds::default(),
    };
    if adapter {
        let ModelSection::Hf { path, .. } = &config.model else {
            return Err(format!(
                "--adapter: a PEFT adapter needs a Hugging Face base folder (model.kind = \"hf\"), not model.kind = \"{}\"; export the merged model without --adapter",
                config.model.kind()
            ));
        };
        hf::save_adapter(policy, Path::new(path), out)?;
    } else {
        hf::save(policy, &tokens, out, tokenizer.as_ref())?;
    }
    Ok(Exported {
        step,
        adapter,
        seconds: start.elapsed().as_secs_f64(),
        notes,
    })
}
