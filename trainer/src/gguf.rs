//! SmolLM2-135M-Instruct (any Llama-family GGUF) as a trainable [`Model`]: read with candle's GGUF reader,
//! every tensor dequantised to f32, GGUF names mapped to the model's parameters, and the q/k rows
//! un-permuted. llama.cpp's converter permutes the rows of `attn_q`/`attn_k` so that its interleaved rotary
//! embedding (pairs `(2i, 2i+1)`) computes what HF's half-split rotary computes on the original weights;
//! this model uses the half-split form, so each projection is permuted back:
//! `w.reshape((n_head, head_dim/2, 2, in)).transpose(1, 2).reshape((out, in))`, with n_head = heads for q
//! and kv_heads for k. (Without it nothing fails; the model just emits garbage.)

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::{Device, Error, Result, Tensor};

use crate::model::{Model, ModelConfig};
use crate::tokenizer::{ChatTokenizer, GgufVocab};

/// An opened GGUF file: its metadata and tensor index (tensor data is read on demand).
pub struct Gguf {
    path: PathBuf,
    content: Content,
}

fn gguf_error(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Msg(format!("{}: {e}", path.display()))
}

impl Gguf {
    pub fn open(path: &Path) -> Result<Gguf> {
        let file = File::open(path).map_err(|e| gguf_error(path, e))?;
        let content = Content::read(&mut BufReader::new(file))
            .map_err(|e| gguf_error(path, format!("not a readable GGUF file: {e}")))?;
        Ok(Gguf {
            path: path.to_path_buf(),
            content,
        })
    }

    pub fn metadata(&self) -> &HashMap<String, Value> {
        &self.content.metadata
    }

    fn get(&self, key: &str) -> Result<&Value> {
        self.content
            .metadata
            .get(key)
            .ok_or_else(|| gguf_error(&self.path, format!("metadata key `{key}` is missing")))
    }

    fn usize(&self, key: &str) -> Result<usize> {
        let value = self.get(key)?;
        // Integer keys are u32 in practice, but any integer type is valid GGUF.
        let n = value
            .to_u32()
            .map(u64::from)
            .or_else(|_| value.to_u64())
            .or_else(|_| value.to_i32().map(|v| v as u64))
            .map_err(|e| gguf_error(&self.path, format!("metadata `{key}`: {e}")))?;
        Ok(n as usize)
    }

    fn f64_or(&self, key: &str, default: f64) -> Result<f64> {
        match self.content.metadata.get(key) {
            None => Ok(default),
            Some(v) => v
                .to_f32()
                .map(f64::from)
                .or_else(|_| v.to_f64())
                .map_err(|e| gguf_error(&self.path, format!("metadata `{key}`: {e}"))),
        }
    }

    fn string(&self, key: &str) -> Result<String> {
        self.get(key)?
            .to_string()
            .cloned()
            .map_err(|e| gguf_error(&self.path, format!("metadata `{key}`: {e}")))
    }

    fn array(&self, key: &str) -> Result<&Vec<Value>> {
        self.get(key)?
            .to_vec()
            .map_err(|e| gguf_error(&self.path, format!("metadata `{key}`: {e}")))
    }

    fn optional_id(&self, key: &str) -> Result<Option<u32>> {
        match self.content.metadata.get(key) {
            None => Ok(None),
            Some(_) => Ok(Some(self.usize(key)? as u32)),
        }
    }

    /// The model configuration from `llama.*` metadata (`general.architecture` must be `llama`).
    /// `max_positions` is the context length; `init_std` is unused for a loaded model (0.02).
    pub fn llama_config(&self) -> Result<ModelConfig> {
        let arch = self.string("general.architecture")?;
        if arch != "llama" {
            return Err(gguf_error(
                &self.path,
                format!("architecture `{arch}` is not supported (only `llama`)"),
            ));
        }
        let vocab = match self.content.metadata.get("llama.vocab_size") {
            Some(_) => self.usize("llama.vocab_size")?,
            None => self.array("tokenizer.ggml.tokens")?.len(),
        };
        let config = ModelConfig {
            vocab,
            hidden: self.usize("llama.embedding_length")?,
            layers: self.usize("llama.block_count")?,
            heads: self.usize("llama.attention.head_count")?,
            kv_heads: self.usize("llama.attention.head_count_kv")?,
            intermediate: self.usize("llama.feed_forward_length")?,
            rope_theta: self.f64_or("llama.rope.freq_base", 10_000.0)?,
            rms_eps: self.f64_or("llama.attention.layer_norm_rms_epsilon", 1e-5)?,
            max_positions: self.usize("llama.context_length")?,
            init_std: 0.02,
            head_dim: None,
            attention_bias: false,
            qk_norm: false,
            rope_scaling: None,
        };
        config
            .validate()
            .map_err(|e| gguf_error(&self.path, format!("model metadata: {e}")))?;
        if let Some(dims) = self.content.metadata.get("llama.rope.dimension_count") {
            let dims = dims.to_u32().map_err(|e| gguf_error(&self.path, e))? as usize;
            if dims != config.head_dim() {
                return Err(gguf_error(
                    &self.path,
                    format!(
                        "partial rotary embeddings (rope.dimension_count {dims} < head dim {}) are not \
                         supported",
                        config.head_dim()
                    ),
                ));
            }
        }
        Ok(config)
    }

    /// One tensor, dequantised to f32 (`[rows, cols]` as in PyTorch: GGUF's dims reversed).
    pub fn tensor(&self, name: &str, device: &Device) -> Result<Tensor> {
        let file = File::open(&self.path).map_err(|e| gguf_error(&self.path, e))?;
        let mut reader = BufReader::new(file);
        let q = self
            .content
            .tensor(&mut reader, name, device)
            .map_err(|e| gguf_error(&self.path, format!("tensor `{name}`: {e}")))?;
        q.dequantize(device)
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// The trainable model: every weight dequantised to f32 in a `Var`; tied embeddings when the file has
    /// no `output.weight` (SmolLM2).
    pub fn load_model(&self, device: &Device) -> Result<Model> {
        let config = self.llama_config()?;
        let tied = !self.has_tensor("output.weight");
        let hd = config.head_dim();
        let unpermute = |w: Tensor, n_head: usize| -> Result<Tensor> {
            let (out, inp) = w.dims2()?;
            if out != n_head * hd {
                candle_core::bail!("q/k projection has {out} rows, expected {}", n_head * hd);
            }
            w.reshape((n_head, hd / 2, 2, inp))?
                .transpose(1, 2)?
                .contiguous()?
                .reshape((out, inp))
        };
        let mut weights = vec![
            (
                crate::model::EMBED.to_string(),
                self.tensor("token_embd.weight", device)?,
            ),
            (
                crate::model::NORM.to_string(),
                self.tensor("output_norm.weight", device)?,
            ),
        ];
        if !tied {
            weights.push((
                crate::model::LM_HEAD.into(),
                self.tensor("output.weight", device)?,
            ));
        }
        for l in 0..config.layers {
            let t = |part: &str| self.tensor(&format!("blk.{l}.{part}.weight"), device);
            let name = |module: &str| format!("model.layers.{l}.{module}.weight");
            weights.push((name("input_layernorm"), t("attn_norm")?));
            weights.push((
                name("self_attn.q_proj"),
                unpermute(t("attn_q")?, config.heads)?,
            ));
            weights.push((
                name("self_attn.k_proj"),
                unpermute(t("attn_k")?, config.kv_heads)?,
            ));
            weights.push((name("self_attn.v_proj"), t("attn_v")?));
            weights.push((name("self_attn.o_proj"), t("attn_output")?));
            weights.push((name("post_attention_layernorm"), t("ffn_norm")?));
            weights.push((name("mlp.gate_proj"), t("ffn_gate")?));
            weights.push((name("mlp.up_proj"), t("ffn_up")?));
            weights.push((name("mlp.down_proj"), t("ffn_down")?));
        }
        Model::from_weights(&config, weights, tied, device).map_err(|e| gguf_error(&self.path, e))
    }

    /// The tokenizer metadata (`tokenizer.ggml.*`, `tokenizer.chat_template`).
    pub fn vocab(&self) -> Result<GgufVocab> {
        let strings = |key: &str| -> Result<Vec<String>> {
            self.array(key)?
                .iter()
                .map(|v| {
                    v.to_string()
                        .cloned()
                        .map_err(|e| gguf_error(&self.path, format!("`{key}`: {e}")))
                })
                .collect()
        };
        let token_types = match self.content.metadata.get("tokenizer.ggml.token_type") {
            None => Vec::new(),
            Some(_) => self
                .array("tokenizer.ggml.token_type")?
                .iter()
                .map(|v| {
                    v.to_i32()
                        .or_else(|_| v.to_u32().map(|u| u as i32))
                        .map_err(|e| gguf_error(&self.path, format!("`token_type`: {e}")))
                })
                .collect::<Result<_>>()?,
        };
        Ok(GgufVocab {
            model: self.string("tokenizer.ggml.model")?,
            pre: self
                .string("tokenizer.ggml.pre")
                .unwrap_or_else(|_| "default".into()),
            tokens: strings("tokenizer.ggml.tokens")?,
            token_types,
            merges: strings("tokenizer.ggml.merges")?,
            bos: self.optional_id("tokenizer.ggml.bos_token_id")?,
            eos: self.usize("tokenizer.ggml.eos_token_id")? as u32,
            eot: self.optional_id("tokenizer.ggml.eot_token_id")?,
            eom: self.optional_id("tokenizer.ggml.eom_token_id")?,
            pad: self.optional_id("tokenizer.ggml.padding_token_id")?,
            chat_template: self.string("tokenizer.chat_template").ok(),
        })
    }

    pub fn tokenizer(&self) -> Result<ChatTokenizer> {
        ChatTokenizer::from_gguf_vocab(&self.vocab()?).map_err(|e| gguf_error(&self.path, e))
    }
}

/// SmolLM2-135M-Instruct from the fetched assets: the trainable model and its tokenizer. A missing asset
/// is an error naming `scripts/fetch-assets.sh`.
pub fn load_smollm2(device: &Device) -> Result<(Model, ChatTokenizer)> {
    let path = crate::assets::smollm2_gguf().map_err(Error::Msg)?;
    let gguf = Gguf::open(&path)?;
    Ok((gguf.load_model(device)?, gguf.tokenizer()?))
}
