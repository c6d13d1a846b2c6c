//! The policy: a Llama-family causal LM from candle matrix products and the fused layers of `fused.rs`
//! (RMS norm, SwiGLU, the rotary embedding: one custom op each, with its own backward pass — candle's
//! fused `rms_norm`, `softmax_last_dim` and `rope` have none) and the fused causal attention of
//! `attention.rs` (grouped-query heads read their key/value head directly; left padding and the causal
//! order are index ranges, not a mask tensor). The architecture options cover the checkpoints `hf.rs`
//! loads: Llama / SmolLM2 (plain), Qwen2 (biases on the q/k/v projections), Qwen3 (an RMS norm over each query and key head before the
//! rotary embedding, a head dimension of its own), tied or untied embeddings, Llama 3's rotary scaling.
//!
//! Parameters carry their Hugging Face names (`model.layers.0.self_attn.q_proj.weight`, …), so the
//! weights of a checkpoint are a `transformers` state dict as they are. A fresh model ([`Model::new`]) has
//! an untied LM head and weights from a seeded RNG, so it is deterministic; a pretrained one
//! ([`Model::from_weights`]) is loaded from GGUF (`gguf.rs`) or a Hugging Face folder (`hf.rs`).
//!
//! With LoRA ([`Model::with_lora`]) the base weights are frozen tensors (no `Var`, no gradient, no
//! optimizer state) and the trainable parameters are the adapters, named as PEFT names them
//! (`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`): a projection computes
//! `x·Wᵀ + (alpha / rank)·(x·Aᵀ)·Bᵀ`.

use std::collections::HashMap;

use candle_core::{DType, Device, Result, Tensor, Var, D};
use serde::{Deserialize, Serialize};

use crate::rng::Rng;

/// Rotary scaling (`rope_scaling` / `rope_parameters` of a Hugging Face config), applied to the inverse
/// frequencies as transformers' `ROPE_INIT_FUNCTIONS` do.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rope_type", rename_all = "snake_case", deny_unknown_fields)]
pub enum RopeScaling {
    /// Every frequency divided by `factor` (positions interpolated).
    Linear { factor: f64 },
    /// Llama 3.x: long wavelengths divided by `factor`, short ones kept, a smooth blend between.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
}

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
    /// The dimension of one attention head; absent = hidden / heads (Qwen3 sets its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    /// Biases on the q, k and v projections (Qwen2).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub attention_bias: bool,
    /// An RMS norm over each query and key head before the rotary embedding (Qwen3).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub qk_norm: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<RopeScaling>,
}

impl ModelConfig {
    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden / self.heads.max(1))
    }

    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.heads == 0 || (self.head_dim.is_none() && !self.hidden.is_multiple_of(self.heads)) {
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
        if self.head_dim() == 0 || !self.head_dim().is_multiple_of(2) {
            return Err(format!(
                "the head dimension ({}) must be even and positive for rotary embeddings",
                self.head_dim()
            ));
        }
        if self.layers == 0 || self.vocab == 0 || self.intermediate == 0 || self.max_positions == 0
        {
            return Err("model sizes must be positive".into());
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(format!(
                "model.rope_theta = {} must be a positive number",
                self.rope_theta
            ));
        }
        match &self.rope_scaling {
            None => {}
            Some(RopeScaling::Linear { factor }) if !(factor.is_finite() && *factor > 0.0) => {
                return Err(format!("rope scaling factor {factor} must be positive"));
            }
            Some(RopeScaling::Linear { .. }) => {}
            Some(RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            }) => {
                let ok = factor.is_finite()
                    && *factor > 0.0
                    && low_freq_factor.is_finite()
                    && *low_freq_factor > 0.0
                    && high_freq_factor.is_finite()
                    && high_freq_factor > low_freq_factor
                    && *original_max_position_embeddings > 0;
                if !ok {
                    return Err(format!(
                        "llama3 rope scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor and original_max_position_embeddings > 0 (got {factor}, {low_freq_factor}, {high_freq_factor}, {original_max_position_embeddings})"
                    ));
                }
            }
        }
        Ok(())
    }

    /// The rotary inverse frequencies (`head_dim / 2` of them), scaled as `rope_scaling` says.
    pub fn inv_freq(&self) -> Vec<f64> {
        let hd = self.head_dim();
        let base: Vec<f64> = (0..hd / 2)
            .map(|i| 1.0 / self.rope_theta.powf(2.0 * i as f64 / hd as f64))
            .collect();
        match &self.rope_scaling {
            None => base,
            Some(RopeScaling::Linear { factor }) => base.iter().map(|f| f / factor).collect(),
            Some(RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            }) => {
                let old = *original_max_position_embeddings as f64;
                let low_wavelen = old / low_freq_factor;
                let high_wavelen = old / high_freq_factor;
                base.iter()
                    .map(|&f| {
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let smooth = (old / wavelen - low_freq_factor)
                                / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
        }
    }
}

/// `[model.lora]`: low-rank adapters on the chosen projections; the base stays frozen.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraConfig {
    /// The adapters' rank (default 16).
    #[serde(default = "LoraConfig::default_rank")]
    pub rank: usize,
    /// The scale is `alpha / rank` (default 32: twice the default rank).
    #[serde(default = "LoraConfig::default_alpha")]
    pub alpha: f64,
    /// Dropout on the adapters' input (PEFT's `lora_dropout`); only 0 is supported.
    #[serde(default)]
    pub dropout: f64,
    /// Which projections get adapters: of `q`, `k`, `v`, `o`, `gate`, `up`, `down`.
    #[serde(default = "LoraConfig::all_targets")]
    pub targets: Vec<String>,
}

/// The projections an adapter can target, with their Hugging Face module names.
pub const LORA_TARGETS: [(&str, &str); 7] = [
    ("q", "self_attn.q_proj"),
    ("k", "self_attn.k_proj"),
    ("v", "self_attn.v_proj"),
    ("o", "self_attn.o_proj"),
    ("gate", "mlp.gate_proj"),
    ("up", "mlp.up_proj"),
    ("down", "mlp.down_proj"),
];

impl LoraConfig {
    fn default_rank() -> usize {
        16
    }

    fn default_alpha() -> f64 {
        32.0
    }

    fn all_targets() -> Vec<String> {
        LORA_TARGETS.iter().map(|(t, _)| t.to_string()).collect()
    }

    /// PEFT's scaling, `alpha / rank`.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.rank == 0 || self.rank > 65_536 {
            return Err(format!(
                "config: model.lora.rank = {} must be in 1..=65536",
                self.rank
            ));
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(format!(
                "config: model.lora.alpha = {} must be a positive number",
                self.alpha
            ));
        }
        if self.dropout != 0.0 {
            return Err(format!(
                "config: model.lora.dropout = {}: only 0 is supported (the adapters' input is not dropped)",
                self.dropout
            ));
        }
        if self.targets.is_empty() {
            return Err("config: model.lora.targets is empty".into());
        }
        for (i, t) in self.targets.iter().enumerate() {
            if !LORA_TARGETS.iter().any(|(name, _)| name == t) {
                return Err(format!(
                    "config: model.lora.targets: {t:?} is not a projection (use q, k, v, o, gate, up, down)"
                ));
            }
            if self.targets[..i].contains(t) {
                return Err(format!("config: model.lora.targets: {t:?} appears twice"));
            }
        }
        Ok(())
    }

    /// The Hugging Face module names (`q_proj`, …) of the targets, in [`LORA_TARGETS`] order.
    pub fn module_names(&self) -> Vec<&'static str> {
        LORA_TARGETS
            .iter()
            .filter(|(t, _)| self.targets.iter().any(|x| x == t))
            .map(|(_, m)| m.rsplit('.').next().unwrap_or(m))
            .collect()
    }
}

/// A low-rank adapter: `a: [rank, in]`, `b: [out, rank]`.
#[derive(Clone)]
struct Adapter {
    a: Tensor,
    b: Tensor,
    scale: f64,
}

/// A projection `x·Wᵀ (+ bias) (+ adapter)`.
#[derive(Clone)]
struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
    adapter: Option<Adapter>,
    /// The dtype of the product with `weight` ([`Model::with_compute_dtype`]): f32, or bf16 with the
    /// input and the weight cast to it and the result back to the input's dtype.
    compute: DType,
}

/// `x: [.., in]` as the rows `[positions, in]` of one matrix product.
fn as_rows(x: &Tensor) -> Result<Tensor> {
    let inp = x.dims().last().copied().unwrap_or(0);
    x.reshape((x.elem_count() / inp.max(1), inp))
}

/// The rows `y: [positions, out]` of a product of [`as_rows`]`(x)` back in `x`'s leading shape:
/// `[.., out]`.
fn like_rows_of(y: &Tensor, x: &Tensor) -> Result<Tensor> {
    let mut shape = x.dims().to_vec();
    if let Some(last) = shape.last_mut() {
        *last = y.dim(1)?;
    }
    y.reshape(shape)
}

impl Linear {
    /// `x: [.., in]` → `[.., out]`, as one matrix product over all the leading positions (a batched
    /// product against a broadcast weight would backpropagate a weight-sized gradient per batch row).
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x2 = as_rows(x)?;
        // A frozen weight (LoRA's base) gets no gradient computed for it (`fused::linear`).
        let mut y = self.product(&x2)?;
        if let Some(bias) = &self.bias {
            y = y.broadcast_add(bias)?;
        }
        if let Some(adapter) = &self.adapter {
            // The scale on B ([out, rank], small), not on the [tokens, out] product: one activation
            // of the projection's output size fewer per adapter kept for the backward pass.
            let b = (&adapter.b * adapter.scale)?;
            let low = x2.matmul(&adapter.a.t()?)?.matmul(&b.t()?)?;
            y = (y + low)?;
        }
        like_rows_of(&y, x)
    }

    /// `x · Wᵀ` for x: [rows, in], in the compute dtype: f32 as `fused::linear`; bf16 as a product of
    /// the bf16 casts of x and W (a weight already in bf16, as in [`Model::merged_view`], is not cast
    /// again), its result cast back to x's dtype. The casts are differentiable: a trained f32 weight
    /// gets its f32 gradient through the bf16 product.
    fn product(&self, x: &Tensor) -> Result<Tensor> {
        if self.compute == x.dtype() {
            return linear(x, &self.weight);
        }
        linear(
            &x.to_dtype(self.compute)?,
            &self.weight.to_dtype(self.compute)?,
        )?
        .to_dtype(x.dtype())
    }

    /// Whether the product runs in `x`'s own dtype (no cast).
    fn native(&self, x: &Tensor) -> bool {
        self.compute == x.dtype()
    }

    /// Each projection of `layers` applied to the same `x` ([`Linear::forward`] each, the same values):
    /// without adapters their products go through [`linears`], one parallel loop for all of them when
    /// decoding with a no-grad model.
    fn forward_all<const N: usize>(layers: [&Linear; N], x: &Tensor) -> Result<[Tensor; N]> {
        let ys = if layers.iter().any(|l| l.adapter.is_some() || !l.native(x)) {
            layers
                .iter()
                .map(|l| l.forward(x))
                .collect::<Result<Vec<_>>>()?
        } else {
            Linear::products(&layers, x)?
        };
        Ok(ys
            .try_into()
            .unwrap_or_else(|_| unreachable!("one output per projection")))
    }

    /// [`Linear::forward_all`] of projections without adapters.
    fn products(layers: &[&Linear], x: &Tensor) -> Result<Vec<Tensor>> {
        let x2 = as_rows(x)?;
        let weights: Vec<&Tensor> = layers.iter().map(|l| &l.weight).collect();
        let ys = linears(&x2, &weights)?;
        let mut out = Vec::with_capacity(layers.len());
        for (layer, y) in layers.iter().zip(ys) {
            let y = match &layer.bias {
                Some(bias) => y.broadcast_add(bias)?,
                None => y,
            };
            out.push(like_rows_of(&y, x)?);
        }
        Ok(out)
    }

    /// `swiglu(gate(x), up(x))`: [`linear_swiglu`] (one parallel loop when decoding with a no-grad
    /// model) unless a projection has an adapter or a bias.
    fn swiglu(gate: &Linear, up: &Linear, x: &Tensor) -> Result<Tensor> {
        let plain = |l: &Linear| l.adapter.is_none() && l.bias.is_none() && l.native(x);
        if !(plain(gate) && plain(up)) {
            return swiglu(&gate.forward(x)?, &up.forward(x)?);
        }
        like_rows_of(&linear_swiglu(&as_rows(x)?, &gate.weight, &up.weight)?, x)
    }

    fn detached(&self) -> Linear {
        Linear {
            weight: self.weight.detach(),
            bias: self.bias.as_ref().map(Tensor::detach),
            adapter: self.adapter.as_ref().map(|a| Adapter {
                a: a.a.detach(),
                b: a.b.detach(),
                scale: a.scale,
            }),
            compute: self.compute,
        }
    }

    /// `W + scale·B·A` (the weight with its adapter merged in).
    fn merged(&self) -> Result<Tensor> {
        match &self.adapter {
            None => Ok(self.weight.clone()),
            Some(a) => self.weight.detach() + (a.b.detach().matmul(&a.a.detach())? * a.scale)?,
        }
    }
}

#[derive(Clone)]
struct Block {
    attn_norm: Tensor,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    mlp_norm: Tensor,
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl Block {
    fn projection(&self, target: &str) -> &Linear {
        match target {
            "q" => &self.q,
            "k" => &self.k,
            "v" => &self.v,
            "o" => &self.o,
            "gate" => &self.gate,
            "up" => &self.up,
            _ => &self.down,
        }
    }

    fn projection_mut(&mut self, target: &str) -> &mut Linear {
        match target {
            "q" => &mut self.q,
            "k" => &mut self.k,
            "v" => &mut self.v,
            "o" => &mut self.o,
            "gate" => &mut self.gate,
            "up" => &mut self.up,
            _ => &mut self.down,
        }
    }
}

/// Per-layer keys and values of the positions seen so far (`[batch, kv_heads, time, head_dim]`).
///
/// A cache without graph (sampling) keeps each layer's keys and values in a buffer with room for more
/// positions, `[batch, kv_heads, capacity, head_dim]`, and writes a step's new positions into it in
/// place; attention reads the first `len` positions where they are. (Appending by concatenation copied
/// the whole cache at every decoding step: quadratic in the generated length.) The buffer grows by
/// doubling, or to [`KvCache::reserve`]'s size. A cache that keeps the graph concatenates (the
/// gradients flow through the concatenation).
#[derive(Default)]
pub struct KvCache {
    /// Per layer: keys and values whose first `len` positions are the cache's.
    layers: Vec<Option<(Tensor, Tensor)>>,
    /// The positions held.
    len: usize,
    /// The positions a layer's buffer is first made for (at least the positions it holds).
    reserved: usize,
    /// Whether the keys and values keep their backpropagation graph ([`KvCache::keeping_graph`]);
    /// otherwise they are detached (sampling).
    keep_graph: bool,
}

impl KvCache {
    /// An empty cache whose keys and values stay differentiable: a pass over a shared prefix whose
    /// continuations then read it, gradients flowing back into the prefix's computation.
    pub fn keeping_graph() -> Self {
        KvCache {
            keep_graph: true,
            ..KvCache::default()
        }
    }

    /// A cache of `len` positions of zeros for `rows` rows in each of the model's layers: the left
    /// padding of rows whose prompts are run after it, at positions `len..` (their own padding must
    /// cover these positions, so that no query sees the zeros). Empty when `len` is 0.
    pub fn zero_prefix(
        config: &ModelConfig,
        rows: usize,
        len: usize,
        device: &Device,
    ) -> Result<Self> {
        if len == 0 {
            return Ok(KvCache::default());
        }
        let zeros = Tensor::zeros(
            (rows, config.kv_heads, len, config.head_dim()),
            DType::F32,
            device,
        )?;
        Ok(KvCache {
            layers: vec![Some((zeros.clone(), zeros)); config.layers],
            len,
            ..KvCache::default()
        })
    }

    /// The positions the cache holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the cache holds no position.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Room for `positions` in all (the held ones included): the buffers are made that large at the
    /// next append, so that a generation of known length copies the cache once, not at each doubling.
    pub fn reserve(&mut self, positions: usize) {
        self.reserved = self.reserved.max(positions);
    }

    /// Layer `l`'s keys and values, its first [`KvCache::len`] positions.
    fn layer(&self, l: usize) -> Result<Option<(Tensor, Tensor)>> {
        match self.layers.get(l) {
            Some(Some((k, v))) => Ok(Some((k.narrow(2, 0, self.len)?, v.narrow(2, 0, self.len)?))),
            _ => Ok(None),
        }
    }

    /// The keys and values of layer `l` with `k` and `v` (`[batch, kv_heads, t, head_dim]`, the
    /// positions `len..len + t`) appended; the cache holds them once [`KvCache::advance`] moves past
    /// them (after the last layer).
    fn append(&mut self, l: usize, k: Tensor, v: Tensor) -> Result<(Tensor, Tensor)> {
        if self.layers.len() <= l {
            self.layers.resize(l + 1, None);
        }
        let (len, t) = (self.len, k.dim(2)?);
        let held = self.layer(l)?;
        if self.keep_graph {
            let (k, v) = match held {
                Some((pk, pv)) => (Tensor::cat(&[&pk, &k], 2)?, Tensor::cat(&[&pv, &v], 2)?),
                None => (k, v),
            };
            self.layers[l] = Some((k.clone(), v.clone()));
            return Ok((k, v));
        }
        // New positions that carry a graph (a trained model's pass over a cache without one) keep it
        // for this pass's attention, as concatenation gave them; the buffer stores them detached.
        let tracked = (k.track_op() || v.track_op()).then(|| (k.clone(), v.clone()));
        let (k, v) = (k.detach().contiguous()?, v.detach().contiguous()?);
        let room = matches!(&self.layers[l], Some((buffer, _)) if buffer.dim(2)? >= len + t);
        if !room {
            // A new buffer: the held positions, the new ones, then zeros up to the capacity.
            let capacity = (len + t).max(self.reserved).max(2 * len);
            let grown = |held: Option<Tensor>, new: &Tensor| -> Result<Tensor> {
                let (b, h, _, d) = new.dims4()?;
                let spare =
                    Tensor::zeros((b, h, capacity - len - t, d), new.dtype(), new.device())?;
                match held {
                    Some(held) => Tensor::cat(&[&held, new, &spare], 2),
                    None => Tensor::cat(&[new, &spare], 2),
                }
            };
            let (hk, hv) = held.map_or((None, None), |(k, v)| (Some(k), Some(v)));
            self.layers[l] = Some((grown(hk, &k)?, grown(hv, &v)?));
        } else if let Some((bk, bv)) = &self.layers[l] {
            bk.slice_set(&k, 2, len)?;
            bv.slice_set(&v, 2, len)?;
        }
        let Some((bk, bv)) = &self.layers[l] else {
            candle_core::bail!("KV cache: layer {l} has no buffer after an append")
        };
        match tracked {
            Some((k, v)) if len > 0 => Ok((
                Tensor::cat(&[&bk.narrow(2, 0, len)?, &k], 2)?,
                Tensor::cat(&[&bv.narrow(2, 0, len)?, &v], 2)?,
            )),
            Some((k, v)) => Ok((k, v)),
            None => Ok((bk.narrow(2, 0, len + t)?, bv.narrow(2, 0, len + t)?)),
        }
    }

    /// Moves past the `t` positions every layer has just appended.
    fn advance(&mut self, t: usize) {
        self.len += t;
    }

    /// The rows of `parts` one after the other (each part a cache of the same layers and positions).
    pub fn concat_rows(parts: &[KvCache]) -> Result<Self> {
        let Some(first) = parts.first() else {
            return Ok(KvCache::default());
        };
        if let Some(other) = parts.iter().find(|p| p.len != first.len) {
            candle_core::bail!(
                "KV caches of {} and {} positions cannot be joined",
                first.len,
                other.len
            );
        }
        let mut layers = Vec::with_capacity(first.layers.len());
        for l in 0..first.layers.len() {
            let mut ks = Vec::with_capacity(parts.len());
            let mut vs = Vec::with_capacity(parts.len());
            for part in parts {
                match part.layer(l)? {
                    Some((k, v)) => {
                        ks.push(k);
                        vs.push(v);
                    }
                    _ => candle_core::bail!("KV caches of different layers cannot be joined"),
                }
            }
            layers.push(Some((Tensor::cat(&ks, 0)?, Tensor::cat(&vs, 0)?)));
        }
        Ok(KvCache {
            layers,
            len: first.len,
            reserved: parts.iter().map(|p| p.reserved).max().unwrap_or(0),
            keep_graph: parts.iter().any(|p| p.keep_graph),
        })
    }

    /// Row `i` of the cache becomes the old row `rows[i]` (`rows`: u32 indices), e.g. a prompt's keys
    /// and values repeated for each of its samples.
    pub fn repeat_rows(&mut self, rows: &Tensor) -> Result<()> {
        for l in 0..self.layers.len() {
            if let Some((k, v)) = self.layer(l)? {
                self.layers[l] = Some((k.index_select(rows, 0)?, v.index_select(rows, 0)?));
            }
        }
        Ok(())
    }
}

pub struct Model {
    pub config: ModelConfig,
    embed: Tensor,
    blocks: Vec<Block>,
    norm: Tensor,
    /// The LM head; with tied embeddings the same tensor (and `Var`) as `embed`.
    lm_head: Tensor,
    tied: bool,
    inv_freq: Vec<f64>,
    lora: Option<LoraConfig>,
    vars: Vec<(String, Var)>,
}

/// How a parameter of a fresh model is initialised.
#[derive(Clone, Copy, PartialEq)]
enum Init {
    Normal,
    Ones,
    Zeros,
}

/// The Hugging Face name of a layer's part.
fn layer_name(l: usize, part: &str) -> String {
    let module = match part {
        "attn_norm" => "input_layernorm.weight",
        "mlp_norm" => "post_attention_layernorm.weight",
        "q" => "self_attn.q_proj.weight",
        "k" => "self_attn.k_proj.weight",
        "v" => "self_attn.v_proj.weight",
        "o" => "self_attn.o_proj.weight",
        "q_bias" => "self_attn.q_proj.bias",
        "k_bias" => "self_attn.k_proj.bias",
        "v_bias" => "self_attn.v_proj.bias",
        "q_norm" => "self_attn.q_norm.weight",
        "k_norm" => "self_attn.k_norm.weight",
        "gate" => "mlp.gate_proj.weight",
        "up" => "mlp.up_proj.weight",
        "down" => "mlp.down_proj.weight",
        other => other,
    };
    format!("model.layers.{l}.{module}")
}

pub const EMBED: &str = "model.embed_tokens.weight";
pub const NORM: &str = "model.norm.weight";
pub const LM_HEAD: &str = "lm_head.weight";

/// Every parameter of the architecture, in [`Model::vars`] order, with its shape and initialisation:
/// the embedding; per layer the input norm, q, k, v, o, the post-attention norm, gate, up, down (then the
/// q/k/v biases and the q/k head norms where the architecture has them); the final norm; the LM head
/// unless tied. (Fresh weights are drawn in this order, so the optional parts draw nothing.)
fn parameter_specs(config: &ModelConfig, tied: bool) -> Vec<(String, Vec<usize>, Init)> {
    let (h, hd) = (config.hidden, config.head_dim());
    let (q_out, kv_out) = (config.heads * hd, config.kv_heads * hd);
    let mut specs = vec![(EMBED.to_string(), vec![config.vocab, h], Init::Normal)];
    for l in 0..config.layers {
        let mut part = |name: &str, shape: Vec<usize>, init: Init| {
            specs.push((layer_name(l, name), shape, init));
        };
        part("attn_norm", vec![h], Init::Ones);
        part("q", vec![q_out, h], Init::Normal);
        part("k", vec![kv_out, h], Init::Normal);
        part("v", vec![kv_out, h], Init::Normal);
        part("o", vec![h, q_out], Init::Normal);
        part("mlp_norm", vec![h], Init::Ones);
        part("gate", vec![config.intermediate, h], Init::Normal);
        part("up", vec![config.intermediate, h], Init::Normal);
        part("down", vec![h, config.intermediate], Init::Normal);
        if config.attention_bias {
            part("q_bias", vec![q_out], Init::Zeros);
            part("k_bias", vec![kv_out], Init::Zeros);
            part("v_bias", vec![kv_out], Init::Zeros);
        }
        if config.qk_norm {
            part("q_norm", vec![hd], Init::Ones);
            part("k_norm", vec![hd], Init::Ones);
        }
    }
    specs.push((NORM.to_string(), vec![h], Init::Ones));
    if !tied {
        specs.push((LM_HEAD.to_string(), vec![config.vocab, h], Init::Normal));
    }
    specs
}

/// The parameter names of a model, in the order of [`Model::vars`] (without LoRA).
pub fn parameter_names(config: &ModelConfig, tied: bool) -> Vec<String> {
    parameter_specs(config, tied)
        .into_iter()
        .map(|(n, _, _)| n)
        .collect()
}

/// The PEFT names of the adapter matrices of layer `l`'s projection `module` (`self_attn.q_proj`).
pub fn adapter_names(l: usize, module: &str) -> (String, String) {
    let base = format!("base_model.model.model.layers.{l}.{module}");
    (
        format!("{base}.lora_A.weight"),
        format!("{base}.lora_B.weight"),
    )
}

use crate::attention::causal_attention;
use crate::fused::{
    from_heads, linear, linear_swiglu, linears, rms_norm, swiglu, to_heads, RopeTables,
};

/// Log-softmax over the last axis, differentiable (detached max).
pub fn log_softmax(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let shifted = x.broadcast_sub(&max)?;
    let log_sum = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    shifted.broadcast_sub(&log_sum)
}

impl Model {
    /// A freshly initialised model (normal(0, init_std) matrices, unit norms, zero biases), deterministic
    /// for `seed`.
    pub fn new(config: &ModelConfig, seed: u64, device: &Device) -> Result<Model> {
        config.validate().map_err(candle_core::Error::Msg)?;
        let mut rng = Rng::new(seed);
        let weights = parameter_specs(config, false)
            .into_iter()
            .map(|(name, shape, init)| {
                let count: usize = shape.iter().product();
                let values: Vec<f32> = match init {
                    Init::Ones => vec![1.0; count],
                    Init::Zeros => vec![0.0; count],
                    Init::Normal => (0..count)
                        .map(|_| (rng.normal() * config.init_std) as f32)
                        .collect(),
                };
                Ok((name, Tensor::from_vec(values, shape, device)?))
            })
            .collect::<Result<Vec<_>>>()?;
        Model::from_weights(config, weights, false, device)
    }

    /// A model with the given weights (e.g. a pretrained checkpoint), every one a trainable `Var`.
    /// `weights` must hold exactly the names of [`parameter_names`] with their shapes, in Hugging Face
    /// layout (non-interleaved rotary halves). With `tied`, the LM head is the embedding matrix.
    pub fn from_weights(
        config: &ModelConfig,
        weights: Vec<(String, Tensor)>,
        tied: bool,
        device: &Device,
    ) -> Result<Model> {
        config.validate().map_err(candle_core::Error::Msg)?;
        let mut by_name: HashMap<String, Tensor> = weights.into_iter().collect();
        let specs = parameter_specs(config, tied);
        let mut vars = Vec::with_capacity(specs.len());
        let mut tensors = HashMap::new();
        for (name, want, _) in &specs {
            let tensor = by_name.remove(name).ok_or_else(|| {
                candle_core::Error::Msg(format!("model weights: missing parameter `{name}`"))
            })?;
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
        Ok(Model::assemble(config, &tensors, tied, None, vars))
    }

    /// The model from its weights by name (every name of [`parameter_specs`] present).
    fn assemble(
        config: &ModelConfig,
        tensors: &HashMap<String, Tensor>,
        tied: bool,
        lora: Option<LoraConfig>,
        vars: Vec<(String, Var)>,
    ) -> Model {
        let get = |name: &str| tensors[name].clone();
        let linear = |l: usize, part: &str, bias: bool| Linear {
            weight: get(&layer_name(l, part)),
            bias: bias.then(|| get(&layer_name(l, &format!("{part}_bias")))),
            adapter: None,
            compute: DType::F32,
        };
        let b = config.attention_bias;
        let blocks = (0..config.layers)
            .map(|l| Block {
                attn_norm: get(&layer_name(l, "attn_norm")),
                q: linear(l, "q", b),
                k: linear(l, "k", b),
                v: linear(l, "v", b),
                o: linear(l, "o", false),
                q_norm: config.qk_norm.then(|| get(&layer_name(l, "q_norm"))),
                k_norm: config.qk_norm.then(|| get(&layer_name(l, "k_norm"))),
                mlp_norm: get(&layer_name(l, "mlp_norm")),
                gate: linear(l, "gate", false),
                up: linear(l, "up", false),
                down: linear(l, "down", false),
            })
            .collect();
        let embed = get(EMBED);
        let lm_head = if tied { embed.clone() } else { get(LM_HEAD) };
        Model {
            config: config.clone(),
            embed,
            blocks,
            norm: get(NORM),
            lm_head,
            tied,
            inv_freq: config.inv_freq(),
            lora,
            vars,
        }
    }

    /// This model as the frozen base of LoRA adapters on `lora.targets` of every layer: the base
    /// weights become plain tensors (no gradient, no optimizer state) and the adapters the only
    /// parameters — `A` uniform in ±1/√in (PEFT's default, Kaiming-uniform with a = √5) from `seed`, `B`
    /// zero, so the adapted model starts equal to the base.
    pub fn with_lora(self, lora: &LoraConfig, seed: u64) -> Result<Model> {
        lora.validate().map_err(candle_core::Error::Msg)?;
        if self.lora.is_some() {
            candle_core::bail!("the model already has LoRA adapters");
        }
        let mut rng = Rng::new(seed);
        let device = self.embed.device().clone();
        let mut model = self.no_grad();
        model.lora = Some(lora.clone());
        let mut vars = Vec::new();
        for (l, block) in model.blocks.iter_mut().enumerate() {
            for (target, module) in LORA_TARGETS {
                if !lora.targets.iter().any(|t| t == target) {
                    continue;
                }
                let proj = block.projection_mut(target);
                let (out, inp) = proj.weight.dims2()?;
                let bound = 1.0 / (inp as f64).sqrt();
                let a: Vec<f32> = (0..lora.rank * inp)
                    .map(|_| ((rng.uniform() * 2.0 - 1.0) * bound) as f32)
                    .collect();
                let a = Var::from_tensor(&Tensor::from_vec(a, (lora.rank, inp), &device)?)?;
                let b = Var::zeros((out, lora.rank), DType::F32, &device)?;
                proj.adapter = Some(Adapter {
                    a: a.as_tensor().clone(),
                    b: b.as_tensor().clone(),
                    scale: lora.scale(),
                });
                let (a_name, b_name) = adapter_names(l, module);
                vars.push((a_name, a));
                vars.push((b_name, b));
            }
        }
        model.vars = vars;
        Ok(model)
    }

    /// The model with its projections' products in `dtype` (`train.dtype`): f32 (the default), or bf16
    /// — the inputs and weights of the seven projections of every layer cast to bf16 for the product
    /// (on a GPU, cuBLAS multiplies bf16 with f32 accumulation), the result cast back to f32, so that
    /// the trained weights (the f32 master copy AdamW updates), the embedding, the norms, attention, the
    /// residual stream and the LM head's log-softmax stay f32, as under torch's `autocast(bfloat16)`.
    /// [`Model::merged_view`] (sampling, reference log-probs) holds its weights in bf16, half the
    /// memory the decoding steps read.
    pub fn with_compute_dtype(mut self, dtype: DType) -> Result<Model> {
        if !matches!(dtype, DType::F32 | DType::BF16) {
            candle_core::bail!("the projections compute in f32 or bf16, not {dtype:?}");
        }
        for block in &mut self.blocks {
            for (target, _) in LORA_TARGETS {
                block.projection_mut(target).compute = dtype;
            }
        }
        Ok(self)
    }

    /// The dtype of the projections' products ([`Model::with_compute_dtype`]).
    pub fn compute_dtype(&self) -> DType {
        self.blocks.first().map_or(DType::F32, |b| b.q.compute)
    }

    /// The LoRA settings of an adapted model.
    pub fn lora(&self) -> Option<&LoraConfig> {
        self.lora.as_ref()
    }

    /// Whether the LM head is the embedding matrix.
    pub fn tied(&self) -> bool {
        self.tied
    }

    /// Every trainable parameter, by name, in a fixed order (the adapters only, with LoRA).
    pub fn vars(&self) -> &[(String, Var)] {
        &self.vars
    }

    /// The number of trainable parameters.
    pub fn parameter_count(&self) -> usize {
        self.vars.iter().map(|(_, v)| v.elem_count()).sum()
    }

    /// Every weight by its Hugging Face name, in [`parameter_names`] order, with LoRA adapters merged
    /// into their projections (`W + (alpha / rank)·B·A`): the state dict of a plain checkpoint.
    pub fn merged_weights(&self) -> Result<Vec<(String, Tensor)>> {
        let mut out = vec![(EMBED.to_string(), self.embed.clone())];
        for (l, b) in self.blocks.iter().enumerate() {
            out.push((layer_name(l, "attn_norm"), b.attn_norm.clone()));
            for part in ["q", "k", "v", "o"] {
                out.push((layer_name(l, part), b.projection(part).merged()?));
            }
            out.push((layer_name(l, "mlp_norm"), b.mlp_norm.clone()));
            for part in ["gate", "up", "down"] {
                out.push((layer_name(l, part), b.projection(part).merged()?));
            }
            for part in ["q", "k", "v"] {
                if let Some(bias) = &b.projection(part).bias {
                    out.push((layer_name(l, &format!("{part}_bias")), bias.clone()));
                }
            }
            for (part, norm) in [("q_norm", &b.q_norm), ("k_norm", &b.k_norm)] {
                if let Some(norm) = norm {
                    out.push((layer_name(l, part), norm.clone()));
                }
            }
        }
        out.push((NORM.to_string(), self.norm.clone()));
        if !self.tied {
            out.push((LM_HEAD.to_string(), self.lm_head.clone()));
        }
        Ok(out)
    }

    /// A detached copy with the same weights (the frozen reference model). With LoRA the frozen base is
    /// shared (it never changes) and only the adapters are copied, so the reference costs the adapters'
    /// memory, not a second model.
    pub fn frozen_copy(&self) -> Result<Model> {
        let device = self.embed.device().clone();
        if self.lora.is_none() {
            let weights = self
                .merged_weights()?
                .into_iter()
                .map(|(name, t)| Ok((name, t.detach().copy()?)))
                .collect::<Result<Vec<_>>>()?;
            return Model::from_weights(&self.config, weights, self.tied, &device)?
                .with_compute_dtype(self.compute_dtype());
        }
        let mut copy = self.no_grad();
        let mut vars = Vec::with_capacity(self.vars.len());
        let mut source = self.vars.iter();
        for (l, block) in copy.blocks.iter_mut().enumerate() {
            for (target, _) in LORA_TARGETS {
                let proj = block.projection_mut(target);
                if let Some(adapter) = &mut proj.adapter {
                    let (Some((a_name, a)), Some((b_name, b))) = (source.next(), source.next())
                    else {
                        candle_core::bail!("layer {l}: the adapters and their parameters disagree");
                    };
                    let a = Var::from_tensor(&a.as_tensor().detach().copy()?)?;
                    let b = Var::from_tensor(&b.as_tensor().detach().copy()?)?;
                    adapter.a = a.as_tensor().clone();
                    adapter.b = b.as_tensor().clone();
                    vars.push((a_name.clone(), a));
                    vars.push((b_name.clone(), b));
                }
            }
        }
        copy.vars = vars;
        Ok(copy)
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
                    q: b.q.detached(),
                    k: b.k.detached(),
                    v: b.v.detached(),
                    o: b.o.detached(),
                    q_norm: b.q_norm.as_ref().map(Tensor::detach),
                    k_norm: b.k_norm.as_ref().map(Tensor::detach),
                    mlp_norm: b.mlp_norm.detach(),
                    gate: b.gate.detached(),
                    up: b.up.detached(),
                    down: b.down.detached(),
                })
                .collect(),
            norm: self.norm.detach(),
            lm_head: self.lm_head.detach(),
            tied: self.tied,
            inv_freq: self.inv_freq.clone(),
            lora: self.lora.clone(),
            vars: Vec::new(),
        }
    }

    /// [`Model::no_grad`] with every LoRA adapter merged into its weight (`W + scale·B·A`, the product
    /// [`Model::merged_weights`] exports): one product per projection instead of three, for passes that
    /// run many positions without training (sampling, the reference's log-probs). The merged weights
    /// are new tensors (the base's size), computed when the view is made, so the view does not see
    /// later optimizer steps; make it per pass. With bf16 products ([`Model::with_compute_dtype`]) its
    /// projection weights are their bf16 casts (again new tensors, half the size). Without adapters and
    /// in f32 it is [`Model::no_grad`], and so is the merged view of a merged view (it has no adapters
    /// left). Its values equal the unmerged forward's up to float rounding (without adapters,
    /// bit for bit).
    pub fn merged_view(&self) -> Result<Model> {
        let mut view = self.no_grad();
        let compute = self.compute_dtype();
        if view.lora.take().is_none() && compute == DType::F32 {
            return Ok(view);
        }
        for block in &mut view.blocks {
            for (target, _) in LORA_TARGETS {
                let proj = block.projection_mut(target);
                if proj.adapter.is_some() {
                    proj.weight = proj.merged()?;
                    proj.adapter = None;
                }
                // In bf16 the view's weights are the casts the tracked forward makes at each product.
                proj.weight = proj.weight.to_dtype(compute)?;
            }
        }
        Ok(view)
    }

    /// Whether forward passes of this model record a backpropagation graph (false for a
    /// [`Model::no_grad`] view).
    pub fn tracks_gradients(&self) -> bool {
        !self.vars.is_empty()
    }

    /// Hidden states after the final norm, `[batch, t, hidden]`, for `ids: [batch, t]` (u32) at
    /// positions `offset..offset + t`. With a cache, keys/values are appended to it.
    pub fn hidden(
        &self,
        ids: &Tensor,
        offset: usize,
        left_pad: &[usize],
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
        let tables = RopeTables::new(&self.inv_freq, offset, t);
        // [b, t, heads·hd] → [b, heads, t, hd], each head RMS-normed first where the model has it and
        // rotated (q and k) on the way.
        let heads = |x: Tensor, n: usize, norm: &Option<Tensor>, rotary: Option<&RopeTables>| {
            let x = x.reshape((b, t, n, hd))?;
            let x = match norm {
                Some(w) => rms_norm(&x, w, c.rms_eps)?,
                None => x,
            };
            to_heads(&x, rotary)
        };
        let mut x = self
            .embed
            .index_select(&ids.flatten_all()?, 0)?
            .reshape((b, t, c.hidden))?;
        if let Some(cache) = cache.as_deref_mut() {
            if cache.len() != offset {
                candle_core::bail!(
                    "a KV cache of {} positions continued at position {offset}",
                    cache.len()
                );
            }
        }
        for (l, block) in self.blocks.iter().enumerate() {
            let h = rms_norm(&x, &block.attn_norm, c.rms_eps)?;
            let [q, k, v] = Linear::forward_all([&block.q, &block.k, &block.v], &h)?;
            let q = heads(q, c.heads, &block.q_norm, Some(&tables))?;
            let mut k = heads(k, c.kv_heads, &block.k_norm, Some(&tables))?;
            let mut v = heads(v, c.kv_heads, &None, None)?;
            if let Some(cache) = cache.as_deref_mut() {
                (k, v) = cache.append(l, k, v)?;
            }
            let attn = causal_attention(&q, &k, &v, left_pad, offset)?;
            let attn = from_heads(&attn)?.reshape((b, t, c.heads * hd))?;
            x = (x + block.o.forward(&attn)?)?;
            let h = rms_norm(&x, &block.mlp_norm, c.rms_eps)?;
            let act = Linear::swiglu(&block.gate, &block.up, &h)?;
            let mlp = block.down.forward(&act)?;
            x = (x + mlp)?;
        }
        if let Some(cache) = cache {
            cache.advance(t);
        }
        rms_norm(&x, &self.norm, c.rms_eps)
    }

    /// The LM head's weight `[vocab, hidden]` (the embedding matrix when tied).
    pub fn lm_head(&self) -> &Tensor {
        &self.lm_head
    }

    /// Logits `[.., vocab]` of hidden states `[.., hidden]`.
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        // As one product over all the leading positions ([`linear`]: a frozen head, as in a no-grad
        // view, takes the frozen kernel, which runs a row or a few as matrix–vector products).
        let dims = hidden.dims().to_vec();
        let width = dims.last().copied().unwrap_or(0);
        let rows = hidden.elem_count() / width.max(1);
        let logits = linear(&hidden.reshape((rows, width))?, &self.lm_head)?;
        let mut out = dims;
        if let Some(last) = out.last_mut() {
            *last = logits.dim(1)?;
        }
        logits.reshape(out)
    }

    /// log π(ids[:, j] | ids[:, ..j]) for the positions `j` in `start..t`, `[batch, t - start]`
    /// (differentiable). Only those positions go through the LM head and the log-softmax, which saves most of
    /// the 49,152-wide work for a real vocabulary when the prompt is long. `start` ≥ 1.
    pub fn token_logp(&self, ids: &Tensor, left_pad: &[usize], start: usize) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        if start == 0 || start > t {
            candle_core::bail!("token_logp: start {start} must be in 1..={t}");
        }
        let hidden = self.hidden(ids, 0, left_pad, None)?;
        let n = t - start;
        let logits = self.logits(&hidden.narrow(1, start - 1, n)?)?;
        let logp = log_softmax(&logits)?;
        let targets = ids.narrow(1, start, n)?.contiguous()?.unsqueeze(2)?;
        logp.gather(&targets, 2)?.reshape((b, n))
    }

    /// Logits of every position, `[batch, t, vocab]` (no cache).
    pub fn forward(&self, ids: &Tensor, left_pad: &[usize]) -> Result<Tensor> {
        self.logits(&self.hidden(ids, 0, left_pad, None)?)
    }
}

/// The dtype of token ids.
pub const IDS: DType = DType::U32;
