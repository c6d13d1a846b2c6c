//! A small Llama-style causal LM built only from differentiable candle primitives (candle's fused
//! `rms_norm`, `softmax_last_dim` and `rope` have no backward pass): RMS norm as x / sqrt(mean(x²) + ε) · w,
//! softmax with a detached max, rotary embeddings as x·cos + rotate_half(x)·sin, grouped-query attention,
//! SwiGLU MLP. A fresh model ([`Model::new`]) has an untied LM head and weights from a seeded RNG, so it is
//! deterministic; a pretrained one ([`Model::from_weights`], e.g. SmolLM2 from its GGUF in `gguf.rs`) may tie
//! the LM head to the embedding, as SmolLM2 does.

use candle_core::{DType, Device, Result, Tensor, Var, D};
use candle_nn::VarMap;
use serde::{Deserialize, Serialize};

use crate::rng::Rng;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    pub vocab: usize,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub intermediate: usize,
    pub rope_theta: f64,
    pub rms_eps: f64,
    pub max_positions: usize,
    /// Standard deviation of the initial weights.
    pub init_std: f64,
}

impl ModelConfig {
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.heads == 0 || !self.hidden.is_multiple_of(self.heads) {
            return Err(format!(
                "model.hidden ({}) must be a multiple of model.heads ({})",
                self.hidden, self.heads
            ));
        }
        if self.kv_heads == 0 || !self.heads.is_multiple_of(self.kv_heads) {
            return Err(format!(
                "model.heads ({}) must be a multiple of model.kv_heads ({})",
                self.heads, self.kv_heads
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            return Err(
                "the head dimension (hidden / heads) must be even for rotary embeddings".into(),
            );
        }
        if self.layers == 0 || self.vocab == 0 || self.intermediate == 0 || self.max_positions == 0
        {
            return Err("model sizes must be positive".into());
        }
        Ok(())
    }
}

struct Block {
    attn_norm: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    mlp_norm: Tensor,
    gate: Tensor,
    up: Tensor,
    down: Tensor,
}

/// Per-layer keys and values of the positions seen so far (`[batch, kv_heads, time, head_dim]`).
#[derive(Default)]
pub struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
}

pub struct Model {
    pub config: ModelConfig,
    embed: Tensor,
    blocks: Vec<Block>,
    norm: Tensor,
    /// The LM head; with tied embeddings the same tensor (and `Var`) as `embed`.
    lm_head: Tensor,
    tied: bool,
    cos: Tensor,
    sin: Tensor,
    vars: Vec<(String, Var)>,
}

/// The parameter names of a model with `layers` layers, in the order of [`Model::vars`]: `embed`, then per
/// layer `layers.{l}.{attn_norm,q,k,v,o,mlp_norm,gate,up,down}`, then `norm`, then `lm_head` unless tied.
pub fn parameter_names(layers: usize, tied: bool) -> Vec<String> {
    let mut names = vec!["embed".to_string()];
    for l in 0..layers {
        for part in [
            "attn_norm",
            "q",
            "k",
            "v",
            "o",
            "mlp_norm",
            "gate",
            "up",
            "down",
        ] {
            names.push(format!("layers.{l}.{part}"));
        }
    }
    names.push("norm".into());
    if !tied {
        names.push("lm_head".into());
    }
    names
}

/// The expected shape of parameter `name` (a name from [`parameter_names`]).
fn parameter_shape(config: &ModelConfig, name: &str) -> Vec<usize> {
    let (h, hd) = (config.hidden, config.head_dim());
    let part = name.rsplit('.').next().unwrap_or(name);
    match part {
        "embed" | "lm_head" => vec![config.vocab, h],
        "attn_norm" | "mlp_norm" | "norm" => vec![h],
        "q" => vec![config.heads * hd, h],
        "k" | "v" => vec![config.kv_heads * hd, h],
        "o" => vec![h, config.heads * hd],
        "gate" | "up" => vec![config.intermediate, h],
        "down" => vec![h, config.intermediate],
        _ => vec![],
    }
}

/// Rotary tables `[max_positions, head_dim]` (the two halves repeated), non-interleaved (HF layout).
fn rope_tables(config: &ModelConfig, device: &Device) -> Result<(Tensor, Tensor)> {
    let hd = config.head_dim();
    let half = hd / 2;
    let mut cos = Vec::with_capacity(config.max_positions * hd);
    let mut sin = Vec::with_capacity(config.max_positions * hd);
    for p in 0..config.max_positions {
        for _ in 0..2 {
            for i in 0..half {
                let freq = 1.0 / config.rope_theta.powf(2.0 * i as f64 / hd as f64);
                let angle = p as f64 * freq;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
    }
    let cos = Tensor::from_vec(cos, (config.max_positions, hd), device)?;
    let sin = Tensor::from_vec(sin, (config.max_positions, hd), device)?;
    Ok((cos, sin))
}

/// `x @ wᵀ` for `x: [.., in]`, `w: [out, in]`.
fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    x.broadcast_matmul(&w.t()?)
}

fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let scale = (x.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?;
    x.broadcast_div(&scale)?.broadcast_mul(w)
}

/// Softmax over the last axis; the max is detached (it only shifts for stability).
pub fn softmax(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let e = x.broadcast_sub(&max)?.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
}

/// Log-softmax over the last axis, differentiable (detached max).
pub fn log_softmax(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let shifted = x.broadcast_sub(&max)?;
    let log_sum = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    shifted.broadcast_sub(&log_sum)
}

fn rotate_half(x: &Tensor) -> Result<Tensor> {
    let half = x.dim(D::Minus1)? / 2;
    let x1 = x.narrow(D::Minus1, 0, half)?;
    let x2 = x.narrow(D::Minus1, half, half)?;
    Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)
}

/// `[b, kv, t, d]` → `[b, kv·rep, t, d]` (each key/value head serves `rep` query heads).
fn repeat_kv(x: &Tensor, rep: usize) -> Result<Tensor> {
    if rep == 1 {
        return Ok(x.clone());
    }
    let (b, kv, t, d) = x.dims4()?;
    x.unsqueeze(2)?
        .broadcast_as((b, kv, rep, t, d))?
        .reshape((b, kv * rep, t, d))
}

/// An additive attention mask `[batch, 1, t, offset + t]`: query i (absolute position offset + i) of row b
/// sees key j when j ≤ offset + i and j ≥ left_pad[b]. Masked entries are −1e9 (finite, so rows that see
/// nothing — padding queries — give no NaN).
pub fn attention_mask(
    left_pad: &[usize],
    offset: usize,
    t: usize,
    device: &Device,
) -> Result<Tensor> {
    let total = offset + t;
    let mut mask = vec![0f32; left_pad.len() * t * total];
    for (b, pad) in left_pad.iter().enumerate() {
        for i in 0..t {
            for j in 0..total {
                if j > offset + i || j < *pad {
                    mask[(b * t + i) * total + j] = -1e9;
                }
            }
        }
    }
    Tensor::from_vec(mask, (left_pad.len(), 1, t, total), device)
}

impl Model {
    /// A freshly initialised model (normal(0, init_std) matrices, unit norms), deterministic for `seed`.
    pub fn new(config: &ModelConfig, seed: u64, device: &Device) -> Result<Model> {
        config.validate().map_err(candle_core::Error::Msg)?;
        let mut rng = Rng::new(seed);
        let mut vars = Vec::new();
        let mut param = |name: String, shape: (usize, usize), ones: bool| -> Result<Tensor> {
            let count = shape.0 * shape.1;
            let values: Vec<f32> = if ones {
                vec![1.0; count]
            } else {
                (0..count)
                    .map(|_| (rng.normal() * config.init_std) as f32)
                    .collect()
            };
            let tensor = Tensor::from_vec(values, shape, device)?;
            let tensor = if shape.0 == 1 {
                tensor.squeeze(0)?
            } else {
                tensor
            };
            let var = Var::from_tensor(&tensor)?;
            let out = var.as_tensor().clone();
            vars.push((name, var));
            Ok(out)
        };
        let (h, hd) = (config.hidden, config.head_dim());
        let embed = param("embed".into(), (config.vocab, h), false)?;
        let mut blocks = Vec::new();
        for l in 0..config.layers {
            blocks.push(Block {
                attn_norm: param(format!("layers.{l}.attn_norm"), (1, h), true)?,
                q: param(format!("layers.{l}.q"), (config.heads * hd, h), false)?,
                k: param(format!("layers.{l}.k"), (config.kv_heads * hd, h), false)?,
                v: param(format!("layers.{l}.v"), (config.kv_heads * hd, h), false)?,
                o: param(format!("layers.{l}.o"), (h, config.heads * hd), false)?,
                mlp_norm: param(format!("layers.{l}.mlp_norm"), (1, h), true)?,
                gate: param(format!("layers.{l}.gate"), (config.intermediate, h), false)?,
                up: param(format!("layers.{l}.up"), (config.intermediate, h), false)?,
                down: param(format!("layers.{l}.down"), (h, config.intermediate), false)?,
            });
        }
        let norm = param("norm".into(), (1, h), true)?;
        let lm_head = param("lm_head".into(), (config.vocab, h), false)?;
        let (cos, sin) = rope_tables(config, device)?;
        Ok(Model {
            config: config.clone(),
            embed,
            blocks,
            norm,
            lm_head,
            tied: false,
            cos,
            sin,
            vars,
        })
    }

    /// A model with the given weights (e.g. a pretrained checkpoint), every one a trainable `Var`.
    /// `weights` must hold exactly the names of [`parameter_names`]`(config.layers, tied)` with their shapes
    /// (`embed`/`lm_head` `[vocab, hidden]`, q/o `[heads·head_dim, hidden]` / transposed, k/v
    /// `[kv_heads·head_dim, hidden]`, gate/up `[intermediate, hidden]`, down transposed, norms `[hidden]`),
    /// in HF layout (non-interleaved rotary halves). With `tied`, the LM head is the embedding matrix.
    pub fn from_weights(
        config: &ModelConfig,
        weights: Vec<(String, Tensor)>,
        tied: bool,
        device: &Device,
    ) -> Result<Model> {
        config.validate().map_err(candle_core::Error::Msg)?;
        let mut by_name: std::collections::HashMap<String, Tensor> = weights.into_iter().collect();
        let names = parameter_names(config.layers, tied);
        let mut vars = Vec::with_capacity(names.len());
        let mut tensors = std::collections::HashMap::new();
        for name in &names {
            let tensor = by_name.remove(name).ok_or_else(|| {
                candle_core::Error::Msg(format!("model weights: missing parameter `{name}`"))
            })?;
            let want = parameter_shape(config, name);
            if tensor.dims() != want.as_slice() {
                candle_core::bail!(
                    "model weights: parameter `{name}` has shape {:?}, the config needs {:?}",
                    tensor.dims(),
                    want
                );
            }
            let tensor = tensor
                .to_device(device)?
                .to_dtype(DType::F32)?
                .contiguous()?;
            let var = Var::from_tensor(&tensor)?;
            tensors.insert(name.clone(), var.as_tensor().clone());
            vars.push((name.clone(), var));
        }
        if let Some(extra) = by_name.keys().min() {
            candle_core::bail!("model weights: unexpected parameter `{extra}`");
        }
        let get = |name: &str| tensors[name].clone();
        let blocks = (0..config.layers)
            .map(|l| Block {
                attn_norm: get(&format!("layers.{l}.attn_norm")),
                q: get(&format!("layers.{l}.q")),
                k: get(&format!("layers.{l}.k")),
                v: get(&format!("layers.{l}.v")),
                o: get(&format!("layers.{l}.o")),
                mlp_norm: get(&format!("layers.{l}.mlp_norm")),
                gate: get(&format!("layers.{l}.gate")),
                up: get(&format!("layers.{l}.up")),
                down: get(&format!("layers.{l}.down")),
            })
            .collect();
        let embed = get("embed");
        let lm_head = if tied { embed.clone() } else { get("lm_head") };
        let (cos, sin) = rope_tables(config, device)?;
        Ok(Model {
            config: config.clone(),
            embed,
            blocks,
            norm: get("norm"),
            lm_head,
            tied,
            cos,
            sin,
            vars,
        })
    }

    /// Whether the LM head is the embedding matrix.
    pub fn tied(&self) -> bool {
        self.tied
    }

    /// Every trainable parameter, by name, in a fixed order.
    pub fn vars(&self) -> &[(String, Var)] {
        &self.vars
    }

    pub fn parameter_count(&self) -> usize {
        self.vars.iter().map(|(_, v)| v.elem_count()).sum()
    }

    /// A `VarMap` holding this model's parameters (for `save`/`load` as safetensors).
    pub fn varmap(&self) -> VarMap {
        let map = VarMap::new();
        {
            let mut data = map.data().lock().expect("varmap lock");
            for (name, var) in &self.vars {
                data.insert(name.clone(), var.clone());
            }
        }
        map
    }

    /// The weight tensors by name, in [`parameter_names`] order (the LM head only when untied).
    fn named_tensors(&self) -> Vec<(String, &Tensor)> {
        let mut out = vec![("embed".to_string(), &self.embed)];
        for (l, b) in self.blocks.iter().enumerate() {
            for (part, t) in [
                ("attn_norm", &b.attn_norm),
                ("q", &b.q),
                ("k", &b.k),
                ("v", &b.v),
                ("o", &b.o),
                ("mlp_norm", &b.mlp_norm),
                ("gate", &b.gate),
                ("up", &b.up),
                ("down", &b.down),
            ] {
                out.push((format!("layers.{l}.{part}"), t));
            }
        }
        out.push(("norm".into(), &self.norm));
        if !self.tied {
            out.push(("lm_head".into(), &self.lm_head));
        }
        out
    }

    /// A detached copy with the same weights (the frozen reference model).
    pub fn frozen_copy(&self) -> Result<Model> {
        let device = self.embed.device().clone();
        let weights = self
            .named_tensors()
            .into_iter()
            .map(|(name, t)| Ok((name, t.detach().copy()?)))
            .collect::<Result<Vec<_>>>()?;
        Model::from_weights(&self.config, weights, self.tied, &device)
    }

    /// A view of this model for forward passes that are never differentiated (sampling, the judge,
    /// reference log-probs, evaluation): every weight is `detach()`ed — the same storage, no copy, so an
    /// optimizer step on the model is visible through a view made before it — and nothing it computes
    /// is recorded for backpropagation. candle records an op whenever an input is a `Var` or tracks one,
    /// and keeps every input of every recorded op alive until the result is dropped; through this view no
    /// input does, so each intermediate is freed as soon as the forward pass moves on. The logits are
    /// bit-identical to the tracked forward's. The view has no `vars()` (nothing of it can be trained).
    pub fn no_grad(&self) -> Model {
        Model {
            config: self.config.clone(),
            embed: self.embed.detach(),
            blocks: self
                .blocks
                .iter()
                .map(|b| Block {
                    attn_norm: b.attn_norm.detach(),
                    q: b.q.detach(),
                    k: b.k.detach(),
                    v: b.v.detach(),
                    o: b.o.detach(),
                    mlp_norm: b.mlp_norm.detach(),
                    gate: b.gate.detach(),
                    up: b.up.detach(),
                    down: b.down.detach(),
                })
                .collect(),
            norm: self.norm.detach(),
            lm_head: self.lm_head.detach(),
            tied: self.tied,
            cos: self.cos.clone(),
            sin: self.sin.clone(),
            vars: Vec::new(),
        }
    }

    /// Whether forward passes of this model record a backpropagation graph (false for a
    /// [`Model::no_grad`] view).
    pub fn tracks_gradients(&self) -> bool {
        self.embed.track_op()
    }

    /// Hidden states after the final norm, `[batch, t, hidden]`, for `ids: [batch, t]` (u32) at
    /// positions `offset..offset + t`. With a cache, keys/values are appended to it.
    pub fn hidden(
        &self,
        ids: &Tensor,
        offset: usize,
        mask: &Tensor,
        mut cache: Option<&mut KvCache>,
    ) -> Result<Tensor> {
        let c = &self.config;
        let (b, t) = ids.dims2()?;
        if offset + t > c.max_positions {
            candle_core::bail!(
                "sequence of {} positions exceeds model.max_positions ({})",
                offset + t,
                c.max_positions
            );
        }
        let hd = c.head_dim();
        let cos = self.cos.narrow(0, offset, t)?;
        let sin = self.sin.narrow(0, offset, t)?;
        let rope = |x: &Tensor| -> Result<Tensor> {
            x.broadcast_mul(&cos)? + rotate_half(x)?.broadcast_mul(&sin)?
        };
        let mut x = self
            .embed
            .index_select(&ids.flatten_all()?, 0)?
            .reshape((b, t, c.hidden))?;
        if let Some(cache) = cache.as_deref_mut() {
            cache.layers.resize(self.blocks.len(), None);
        }
        for (l, block) in self.blocks.iter().enumerate() {
            let h = rms_norm(&x, &block.attn_norm, c.rms_eps)?;
            let q = linear(&h, &block.q)?
                .reshape((b, t, c.heads, hd))?
                .transpose(1, 2)?
                .contiguous()?;
            let k = linear(&h, &block.k)?
                .reshape((b, t, c.kv_heads, hd))?
                .transpose(1, 2)?
                .contiguous()?;
            let v = linear(&h, &block.v)?
                .reshape((b, t, c.kv_heads, hd))?
                .transpose(1, 2)?
                .contiguous()?;
            let q = rope(&q)?;
            let mut k = rope(&k)?;
            let mut v = v;
            if let Some(cache) = cache.as_deref_mut() {
                if let Some((pk, pv)) = &cache.layers[l] {
                    k = Tensor::cat(&[pk, &k], 2)?;
                    v = Tensor::cat(&[pv, &v], 2)?;
                }
                cache.layers[l] = Some((k.detach(), v.detach()));
            }
            let rep = c.heads / c.kv_heads;
            let k = repeat_kv(&k, rep)?;
            let v = repeat_kv(&v, rep)?;
            let scores =
                (q.matmul(&k.t()?.contiguous()?)? / (hd as f64).sqrt())?.broadcast_add(mask)?;
            let attn = softmax(&scores)?.matmul(&v)?;
            let attn = attn
                .transpose(1, 2)?
                .contiguous()?
                .reshape((b, t, c.heads * hd))?;
            x = (x + linear(&attn, &block.o)?)?;
            let h = rms_norm(&x, &block.mlp_norm, c.rms_eps)?;
            let gate = linear(&h, &block.gate)?;
            let silu = (&gate * candle_nn::ops::sigmoid(&gate)?)?;
            let mlp = linear(&(silu * linear(&h, &block.up)?)?, &block.down)?;
            x = (x + mlp)?;
        }
        rms_norm(&x, &self.norm, c.rms_eps)
    }

    /// Logits `[.., vocab]` of hidden states `[.., hidden]`.
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        linear(hidden, &self.lm_head)
    }

    /// log π(ids[:, j] | ids[:, ..j]) for the positions `j` in `start..t`, `[batch, t - start]`
    /// (differentiable). Only those positions go through the LM head and the log-softmax, which saves most of
    /// the 49,152-wide work for a real vocabulary when the prompt is long. `start` ≥ 1.
    pub fn token_logp(&self, ids: &Tensor, left_pad: &[usize], start: usize) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        if start == 0 || start > t {
            candle_core::bail!("token_logp: start {start} must be in 1..={t}");
        }
        let mask = attention_mask(left_pad, 0, t, ids.device())?;
        let hidden = self.hidden(ids, 0, &mask, None)?;
        let n = t - start;
        let logits = self.logits(&hidden.narrow(1, start - 1, n)?)?;
        let logp = log_softmax(&logits)?;
        let targets = ids.narrow(1, start, n)?.contiguous()?.unsqueeze(2)?;
        logp.gather(&targets, 2)?.reshape((b, n))
    }

    /// Logits of every position, `[batch, t, vocab]` (no cache).
    pub fn forward(&self, ids: &Tensor, left_pad: &[usize]) -> Result<Tensor> {
        let (_, t) = ids.dims2()?;
        let mask = attention_mask(left_pad, 0, t, ids.device())?;
        self.logits(&self.hidden(ids, 0, &mask, None)?)
    }
}

/// The dtype of token ids.
pub const IDS: DType = DType::U32;
