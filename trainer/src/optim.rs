//! AdamW with its state in plain vectors (so a checkpoint can save and restore it), and the gradients of
//! a model's parameters as plain vectors (accumulated over micro-batches, clipped, checked for NaN/inf).
//!
//! The update is exactly candle-nn's `AdamW` (PyTorch's, with bias correction and decoupled weight
//! decay), operation for operation in f32, but done in one pass over each parameter's values instead of a
//! dozen allocating tensor ops: in place on the parameter's storage (a candle in-place op), in parallel
//! chunks (every element is independent, so the result does not depend on the split).

use std::collections::HashMap;

use candle_core::backprop::GradStore;
use candle_core::{Device, Result, Tensor, Var};
use rayon::prelude::*;

/// AdamW's hyper-parameters (candle's `ParamsAdamW` defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWParams {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl Default for AdamWParams {
    fn default() -> Self {
        AdamWParams {
            lr: 0.001,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

/// The gradient of each of a model's parameters (same order as its `vars()`), `None` for a parameter
/// the loss does not reach.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Grads {
    pub values: Vec<Option<Vec<f32>>>,
}

impl Grads {
    /// The gradients `store` holds for `vars`.
    pub fn from_store(vars: &[(String, Var)], store: &GradStore) -> Result<Grads> {
        let mut grads = Grads {
            values: vec![None; vars.len()],
        };
        grads.accumulate(vars, store)?;
        Ok(grads)
    }

    /// Add the gradients `store` holds for `vars` (micro-batch accumulation), read from the tensors'
    /// storage and added in parallel chunks (every element independent: the split changes nothing).
    pub fn accumulate(&mut self, vars: &[(String, Var)], store: &GradStore) -> Result<()> {
        if self.values.len() != vars.len() {
            self.values.resize(vars.len(), None);
        }
        for ((_, var), slot) in vars.iter().zip(self.values.iter_mut()) {
            let Some(g) = store.get(var.as_tensor()) else {
                continue;
            };
            let mut add = |g: &[f32]| match slot {
                None => *slot = Some(g.par_iter().copied().collect()),
                Some(sum) => sum
                    .par_chunks_mut(UPDATE_CHUNK)
                    .zip(g.par_chunks(UPDATE_CHUNK))
                    .for_each(|(s, g)| s.iter_mut().zip(g).for_each(|(s, g)| *s += g)),
            };
            let (storage, layout) = g.storage_and_layout();
            match (&*storage, layout.contiguous_offsets()) {
                (candle_core::Storage::Cpu(candle_core::CpuStorage::F32(data)), Some((a, b))) => {
                    add(&data[a..b])
                }
                _ => {
                    drop(storage);
                    add(&g.flatten_all()?.to_vec1::<f32>()?)
                }
            }
        }
        Ok(())
    }

    /// The global L2 norm (accumulated in f64: per chunk of a fixed size, the chunks' sums added in
    /// order, so the result does not depend on the number of threads).
    pub fn norm(&self) -> f64 {
        self.values
            .iter()
            .flatten()
            .map(|g| {
                let parts: Vec<f64> = g
                    .par_chunks(UPDATE_CHUNK)
                    .map(|c| c.iter().map(|v| (*v as f64) * (*v as f64)).sum::<f64>())
                    .collect();
                parts.into_iter().sum::<f64>()
            })
            .sum::<f64>()
            .sqrt()
    }

    /// Scale the global norm down to `max_norm` when it is larger (0 = no clipping): every gradient is
    /// multiplied by `max_norm / (norm + 1e-6)`. Returns the norm before clipping.
    pub fn clip(&mut self, max_norm: f64) -> f64 {
        let norm = self.norm();
        if max_norm > 0.0 && norm > max_norm {
            let scale = (max_norm / (norm + 1e-6)) as f32;
            for g in self.values.iter_mut().flatten() {
                g.par_iter_mut().for_each(|v| *v *= scale);
            }
        }
        norm
    }

    /// The first parameter (by name) whose gradient has a NaN or an infinity, with that value.
    pub fn first_non_finite(&self, vars: &[(String, Var)]) -> Option<(String, f32)> {
        for ((name, _), g) in vars.iter().zip(&self.values) {
            let Some(g) = g else { continue };
            if let Some(k) = g.par_iter().position_first(|v| !v.is_finite()) {
                return Some((name.clone(), g[k]));
            }
        }
        None
    }
}

/// The f32 constants of one AdamW step.
#[derive(Clone, Copy)]
struct Update {
    b1: f32,
    c1: f32,
    b2: f32,
    c2: f32,
    scale_m: f32,
    scale_v: f32,
    decay: f32,
    lr: f32,
    eps: f32,
}

impl Update {
    /// One parameter slice's update (every element independent: the split into tasks changes nothing).
    fn apply(&self, theta: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) {
        for k in 0..theta.len() {
            let next_m = m[k] * self.b1 + g[k] * self.c1;
            let next_v = v[k] * self.b2 + (g[k] * g[k]) * self.c2;
            let m_hat = next_m * self.scale_m;
            let v_hat = next_v * self.scale_v;
            let adjusted = m_hat / (v_hat.sqrt() + self.eps);
            theta[k] = theta[k] * self.decay - adjusted * self.lr;
            m[k] = next_m;
            v[k] = next_v;
        }
    }
}

/// The update of one parameter as a candle in-place op on its storage.
struct InPlace<'a> {
    constants: Update,
    grad: &'a [f32],
    moments: std::cell::RefCell<(&'a mut Vec<f32>, &'a mut Vec<f32>)>,
}

/// Elements per parallel task of the update.
const UPDATE_CHUNK: usize = 1 << 15;

impl candle_core::InplaceOp1 for InPlace<'_> {
    fn name(&self) -> &'static str {
        "rlx-adamw"
    }

    fn cpu_fwd(
        &self,
        storage: &mut candle_core::CpuStorage,
        layout: &candle_core::Layout,
    ) -> Result<()> {
        let candle_core::CpuStorage::F32(data) = storage else {
            candle_core::bail!("AdamW: only f32 parameters are supported")
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("AdamW: the parameter is not contiguous")
        };
        let theta = &mut data[start..end];
        let constants = self.constants;
        let mut moments = self.moments.borrow_mut();
        let (m, v) = &mut *moments;
        if theta.len() != self.grad.len() || m.len() != theta.len() || v.len() != theta.len() {
            candle_core::bail!("AdamW: parameter, gradient and moments differ in size")
        }
        theta
            .par_chunks_mut(UPDATE_CHUNK)
            .zip(self.grad.par_chunks(UPDATE_CHUNK))
            .zip(
                m.par_chunks_mut(UPDATE_CHUNK)
                    .zip(v.par_chunks_mut(UPDATE_CHUNK)),
            )
            .for_each(|((theta, g), (m, v))| constants.apply(theta, g, m, v));
        Ok(())
    }
}

/// AdamW over a fixed list of named parameters.
pub struct AdamW {
    pub params: AdamWParams,
    /// Updates taken so far (the bias-correction exponent).
    pub step: u64,
    vars: Vec<(String, Var)>,
    m: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl AdamW {
    pub fn new(vars: &[(String, Var)], params: AdamWParams) -> AdamW {
        let zeros = |var: &Var| vec![0f32; var.elem_count()];
        AdamW {
            params,
            step: 0,
            m: vars.iter().map(|(_, v)| zeros(v)).collect(),
            v: vars.iter().map(|(_, v)| zeros(v)).collect(),
            vars: vars.to_vec(),
        }
    }

    /// One update with `grads` (in the order of the parameters given to `new`); parameters without a
    /// gradient are left alone (their moments too), as in candle.
    pub fn step(&mut self, grads: &Grads) -> Result<()> {
        if grads.values.len() != self.vars.len() {
            candle_core::bail!(
                "AdamW: {} gradients for {} parameters",
                grads.values.len(),
                self.vars.len()
            );
        }
        self.step += 1;
        let p = self.params;
        // The same f32 constants candle's affine ops use.
        let b1 = p.beta1 as f32;
        let c1 = (1.0 - p.beta1) as f32;
        let b2 = p.beta2 as f32;
        let c2 = (1.0 - p.beta2) as f32;
        let scale_m = (1f64 / (1f64 - p.beta1.powi(self.step as i32))) as f32;
        let scale_v = (1f64 / (1f64 - p.beta2.powi(self.step as i32))) as f32;
        let decay = (1f64 - p.lr * p.weight_decay) as f32;
        let lr = p.lr as f32;
        let eps = p.eps as f32;
        let constants = Update {
            b1,
            c1,
            b2,
            c2,
            scale_m,
            scale_v,
            decay,
            lr,
            eps,
        };
        for (i, (name, var)) in self.vars.iter().enumerate() {
            let Some(g) = &grads.values[i] else {
                continue;
            };
            if g.len() != var.elem_count() {
                candle_core::bail!(
                    "AdamW: gradient of {} values for {name} ({} values)",
                    g.len(),
                    var.elem_count()
                );
            }
            let (m, v) = (&mut self.m[i], &mut self.v[i]);
            // In place on the parameter's own storage (views of the model share it and see the step).
            var.as_tensor().inplace_op1(&InPlace {
                constants,
                grad: g,
                moments: std::cell::RefCell::new((m, v)),
            })?;
        }
        Ok(())
    }

    /// The moments as tensors named `m.<param>` and `v.<param>` (for safetensors).
    pub fn state_tensors(&self, device: &Device) -> Result<HashMap<String, Tensor>> {
        let mut out = HashMap::new();
        for (i, (name, var)) in self.vars.iter().enumerate() {
            let shape = var.shape();
            out.insert(
                format!("m.{name}"),
                Tensor::from_slice(&self.m[i], shape, device)?,
            );
            out.insert(
                format!("v.{name}"),
                Tensor::from_slice(&self.v[i], shape, device)?,
            );
        }
        Ok(out)
    }

    /// Restore the moments saved by [`AdamW::state_tensors`] and the step count.
    pub fn load_state(
        &mut self,
        tensors: &HashMap<String, Tensor>,
        step: u64,
    ) -> std::result::Result<(), String> {
        for (i, (name, var)) in self.vars.iter().enumerate() {
            for (kind, slot) in [("m", &mut self.m[i]), ("v", &mut self.v[i])] {
                let key = format!("{kind}.{name}");
                let tensor = tensors
                    .get(&key)
                    .ok_or_else(|| format!("the optimizer state has no `{key}`"))?;
                if tensor.dims() != var.dims() {
                    return Err(format!(
                        "the optimizer state `{key}` has shape {:?}, the parameter {:?}",
                        tensor.dims(),
                        var.dims()
                    ));
                }
                *slot = tensor
                    .flatten_all()
                    .and_then(|t| t.to_vec1::<f32>())
                    .map_err(|e| format!("the optimizer state `{key}`: {e}"))?;
            }
        }
        self.step = step;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_nn::Optimizer;

    fn vars(seed: u64) -> Vec<(String, Var)> {
        let mut rng = crate::rng::Rng::new(seed);
        let mut make = |name: &str, shape: (usize, usize)| {
            let values: Vec<f32> = (0..shape.0 * shape.1)
                .map(|_| rng.normal() as f32)
                .collect();
            let t = Tensor::from_vec(values, shape, &Device::Cpu).unwrap();
            (name.to_string(), Var::from_tensor(&t).unwrap())
        };
        vec![make("a", (7, 5)), make("b", (1, 3)), make("c", (4, 4))]
    }

    #[test]
    fn the_update_is_candles_adamw_bit_for_bit() {
        let params = AdamWParams {
            lr: 3e-3,
            weight_decay: 0.1,
            ..Default::default()
        };
        let ours = vars(1);
        let theirs = vars(1);
        let mut opt = AdamW::new(&ours, params);
        let mut reference = candle_nn::AdamW::new(
            theirs.iter().map(|(_, v)| v.clone()).collect(),
            candle_nn::ParamsAdamW {
                lr: params.lr,
                beta1: params.beta1,
                beta2: params.beta2,
                eps: params.eps,
                weight_decay: params.weight_decay,
            },
        )
        .unwrap();
        let mut rng = crate::rng::Rng::new(9);
        for _ in 0..5 {
            // The same loss on both copies: sum(w · r) + sum(w²), a fresh r each step.
            let r: Vec<Tensor> = ours
                .iter()
                .map(|(_, v)| {
                    let values: Vec<f32> =
                        (0..v.elem_count()).map(|_| rng.normal() as f32).collect();
                    Tensor::from_vec(values, v.shape(), &Device::Cpu).unwrap()
                })
                .collect();
            let loss = |vs: &[(String, Var)]| {
                let mut total = Tensor::new(0f32, &Device::Cpu).unwrap();
                for ((_, v), r) in vs.iter().zip(&r) {
                    let term = ((v.as_tensor() * r).unwrap().sum_all().unwrap()
                        + v.as_tensor().sqr().unwrap().sum_all().unwrap())
                    .unwrap();
                    total = (total + term).unwrap();
                }
                total.backward().unwrap()
            };
            let store = loss(&ours);
            opt.step(&Grads::from_store(&ours, &store).unwrap())
                .unwrap();
            reference.step(&loss(&theirs)).unwrap();
        }
        for ((name, a), (_, b)) in ours.iter().zip(&theirs) {
            let a = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let b = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(a, b, "{name} differs from candle's AdamW");
        }
    }

    #[test]
    fn saved_state_continues_the_same_updates() {
        let params = AdamWParams::default();
        let a = vars(2);
        let b = vars(2);
        let mut first = AdamW::new(&a, params);
        let grads = |vs: &[(String, Var)], k: f32| Grads {
            values: vs
                .iter()
                .map(|(_, v)| Some(vec![k; v.elem_count()]))
                .collect(),
        };
        first.step(&grads(&a, 0.5)).unwrap();
        let mut second = AdamW::new(&b, params);
        second.step(&grads(&b, 0.5)).unwrap();
        let saved = first.state_tensors(&Device::Cpu).unwrap();
        let mut restored = AdamW::new(&b, params);
        restored.load_state(&saved, first.step).unwrap();
        first.step(&grads(&a, -0.25)).unwrap();
        restored.step(&grads(&b, -0.25)).unwrap();
        for ((_, x), (_, y)) in a.iter().zip(&b) {
            assert_eq!(
                x.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                y.flatten_all().unwrap().to_vec1::<f32>().unwrap()
            );
        }
        let mut missing = saved.clone();
        missing.remove("v.c");
        assert_eq!(
            AdamW::new(&b, params).load_state(&missing, 1).unwrap_err(),
            "the optimizer state has no `v.c`"
        );
    }

    #[test]
    fn clipping_scales_to_the_max_norm_and_non_finite_values_are_named() {
        let vs = vars(3);
        let mut grads = Grads {
            values: vec![Some(vec![3.0; 35]), None, Some(vec![4.0; 16])],
        };
        let norm = grads.clip(1.0);
        let expected = (9.0f64 * 35.0 + 16.0 * 16.0).sqrt();
        assert!((norm - expected).abs() < 1e-9);
        assert!((grads.norm() - 1.0).abs() < 1e-5);
        assert_eq!(grads.first_non_finite(&vs), None);
        grads.values[2].as_mut().unwrap()[5] = f32::NAN;
        let (name, value) = grads.first_non_finite(&vs).unwrap();
        assert_eq!(name, "c");
        assert!(value.is_nan());
    }
}
