//! AdamW with its state in plain vectors (so a checkpoint can save and restore it), and the gradients of
//! a model's parameters as plain vectors (accumulated over micro-batches, clipped, checked for NaN/inf).
//!
//! The update is exactly candle-nn's `AdamW` (PyTorch's, with bias correction and decoupled weight
//! decay), operation for operation in f32, but done in one pass over each parameter's values instead of a
//! dozen allocating tensor ops: in place on the parameter's storage (a candle in-place op), in parallel
//! chunks (every element is independent, so the result does not depend on the split).
//!
//! Parameters on a GPU (`rlx run --device cuda`) keep their gradients and moments there as candle
//! tensors ([`Grads::resident`], [`AdamW::resident`]): the update is then candle-nn's own sequence of
//! tensor ops (the same f32 operations, so on the CPU it equals the in-place loop bit for bit, which the
//! tests check), the norm and the finiteness check are reductions on the device, and only scalars come
//! back to the host.

use std::collections::HashMap;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Result, Tensor, Var};
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

impl AdamWParams {
    /// A run's optimizer: `train.lr` and `train.weight_decay`, the default betas and eps.
    pub fn of(train: &crate::config::TrainConfig) -> AdamWParams {
        AdamWParams {
            lr: train.lr,
            weight_decay: train.weight_decay,
            ..AdamWParams::default()
        }
    }
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
/// the loss does not reach: host vectors (`values`) for parameters on the CPU, or tensors on the
/// parameters' device (`tensors`, when built with [`Grads::resident`] or for parameters off the CPU).
#[derive(Clone, Debug, Default)]
pub struct Grads {
    pub values: Vec<Option<Vec<f32>>>,
    /// The gradients kept as f32 tensors where the parameters are (one slot per parameter, or empty
    /// when the gradients are host vectors).
    pub tensors: Vec<Option<Tensor>>,
    resident: bool,
}

impl Grads {
    /// Empty gradients for `vars`: host vectors when the parameters are on the CPU, else tensors on
    /// their device.
    pub fn new(vars: &[(String, Var)]) -> Grads {
        if vars.iter().any(|(_, v)| !v.device().is_cpu()) {
            Grads::resident()
        } else {
            Grads::default()
        }
    }

    /// Empty gradients kept as tensors where the parameters are (the GPU path; on the CPU, the same
    /// code the GPU runs, for its tests).
    pub fn resident() -> Grads {
        Grads {
            resident: true,
            ..Default::default()
        }
    }

    /// Whether the gradients are kept as tensors.
    pub fn is_resident(&self) -> bool {
        self.resident
    }

    /// The gradients `store` holds for `vars`.
    pub fn from_store(vars: &[(String, Var)], store: &GradStore) -> Result<Grads> {
        let mut grads = Grads::new(vars);
        grads.accumulate(vars, store)?;
        Ok(grads)
    }

    /// Add the gradients `store` holds for `vars` (micro-batch accumulation), read from the tensors'
    /// storage and added in parallel chunks (every element independent: the split changes nothing).
    pub fn accumulate(&mut self, vars: &[(String, Var)], store: &GradStore) -> Result<()> {
        if self.resident {
            if self.tensors.len() != vars.len() {
                self.tensors.resize(vars.len(), None);
            }
            for ((_, var), slot) in vars.iter().zip(self.tensors.iter_mut()) {
                let Some(g) = store.get(var.as_tensor()) else {
                    continue;
                };
                let g = g.to_dtype(DType::F32)?;
                *slot = Some(match slot.take() {
                    None => g,
                    Some(sum) => (sum + g)?,
                });
            }
            return Ok(());
        }
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

    /// The global L2 norm (accumulated in f64: host vectors per chunk of a fixed size, the chunks' sums
    /// added in order, so the result does not depend on the number of threads; kept gradients: each
    /// parameter's sum of squares in f64 on its device, one read-back for all).
    pub fn norm(&self) -> f64 {
        self.try_norm().unwrap_or(f64::NAN)
    }

    fn try_norm(&self) -> Result<f64> {
        let squares: Vec<Tensor> = self
            .tensors
            .iter()
            .flatten()
            .map(|g| g.to_dtype(DType::F64)?.sqr()?.sum_all())
            .collect::<Result<_>>()?;
        let device_sum = if squares.is_empty() {
            0.0
        } else {
            Tensor::stack(&squares, 0)?
                .to_vec1::<f64>()?
                .into_iter()
                .sum::<f64>()
        };
        let host_sum: f64 = self
            .values
            .iter()
            .flatten()
            .map(|g| {
                let parts: Vec<f64> = g
                    .par_chunks(UPDATE_CHUNK)
                    .map(|c| c.iter().map(|v| (*v as f64) * (*v as f64)).sum::<f64>())
                    .collect();
                parts.into_iter().sum::<f64>()
            })
            .sum();
        Ok((host_sum + device_sum).sqrt())
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
            for g in self.tensors.iter_mut().flatten() {
                // The same f32 product as the host loop (candle's affine on an f32 tensor).
                match g.affine(scale as f64, 0.0) {
                    Ok(scaled) => *g = scaled,
                    // A failed product leaves a NaN norm for first_non_finite to report.
                    Err(_) => return f64::NAN,
                }
            }
        }
        norm
    }

    /// The first parameter (by name) whose gradient has a NaN or an infinity, with that value. Kept
    /// gradients: Σ g·0 per parameter on the device (NaN exactly when some value is not finite), one
    /// read-back for all, and the values of the first such parameter only.
    pub fn first_non_finite(&self, vars: &[(String, Var)]) -> Option<(String, f32)> {
        for ((name, _), g) in vars.iter().zip(&self.values) {
            let Some(g) = g else { continue };
            if let Some(k) = g.par_iter().position_first(|v| !v.is_finite()) {
                return Some((name.clone(), g[k]));
            }
        }
        if self.tensors.iter().all(Option::is_none) {
            return None;
        }
        let probe = || -> Result<Option<(String, f32)>> {
            let mut which = Vec::new();
            let mut flags = Vec::new();
            for (k, g) in self.tensors.iter().enumerate() {
                if let Some(g) = g {
                    which.push(k);
                    flags.push(g.affine(0.0, 0.0)?.sum_all()?);
                }
            }
            let flags = Tensor::stack(&flags, 0)?.to_vec1::<f32>()?;
            for (k, flag) in which.into_iter().zip(flags) {
                if flag.is_finite() {
                    continue;
                }
                let values = self.tensors[k]
                    .as_ref()
                    .map(|g| g.flatten_all()?.to_vec1::<f32>())
                    .transpose()?
                    .unwrap_or_default();
                let bad = values.into_iter().find(|v| !v.is_finite()).unwrap_or(flag);
                let name = vars.get(k).map(|(n, _)| n.clone()).unwrap_or_default();
                return Ok(Some((name, bad)));
            }
            Ok(None)
        };
        probe()
            .unwrap_or_else(|e| Some((format!("(the gradients could not be read: {e})"), f32::NAN)))
    }

    /// Parameter `i`'s gradient, whichever way it is kept.
    fn get(&self, i: usize) -> Option<Gradient<'_>> {
        if let Some(Some(g)) = self.tensors.get(i) {
            return Some(Gradient::Tensor(g));
        }
        self.values
            .get(i)
            .and_then(Option::as_ref)
            .map(|g| Gradient::Host(g))
    }

    /// Whether parameter `i` has a gradient.
    fn len_of(&self, i: usize) -> Option<usize> {
        self.get(i).map(|g| match g {
            Gradient::Host(v) => v.len(),
            Gradient::Tensor(t) => t.elem_count(),
        })
    }
}

/// One parameter's gradient: a host vector or a tensor on the parameter's device.
enum Gradient<'a> {
    Host(&'a [f32]),
    Tensor(&'a Tensor),
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

/// `count` zeros, written rather than allocated zeroed. `vec![0.0; n]` asks the
/// allocator for zeroed memory, which for a large vector is fresh pages that the kernel maps to its
/// shared zero page on the first read: the first update, which reads each moment before writing it,
/// then takes a copy-on-write fault per page, and each of those flushes the page from every other
/// thread's TLB by an interprocessor interrupt (seconds for SmolLM2's 2 × 135 M moments in a virtual
/// machine; docs/performance.md, item 17). Writing the zeros first takes one plain fault per page.
fn written_zeros(count: usize) -> Vec<f32> {
    let mut zeros = Vec::with_capacity(count);
    zeros.resize(count, 0f32);
    zeros
}

/// One parameter's AdamW moments: host vectors (updated in place with the parameter on the CPU) or
/// tensors where the parameter is (candle's ops).
enum Moments {
    Host(Vec<f32>, Vec<f32>),
    Tensor(Tensor, Tensor),
}

/// AdamW over a fixed list of named parameters.
pub struct AdamW {
    pub params: AdamWParams,
    /// Updates taken so far (the bias-correction exponent).
    pub step: u64,
    vars: Vec<(String, Var)>,
    moments: Vec<Moments>,
}

impl AdamW {
    /// Moments as host vectors for parameters on the CPU, as tensors on the device for the others.
    pub fn new(vars: &[(String, Var)], params: AdamWParams) -> AdamW {
        AdamW::with_moments(vars, params, false)
    }

    /// Moments as tensors where the parameters are, also for CPU parameters (the GPU path's code, for
    /// its tests on the CPU).
    pub fn resident(vars: &[(String, Var)], params: AdamWParams) -> AdamW {
        AdamW::with_moments(vars, params, true)
    }

    fn with_moments(vars: &[(String, Var)], params: AdamWParams, resident: bool) -> AdamW {
        let moments = vars
            .iter()
            .map(|(_, var)| {
                if resident || !var.device().is_cpu() {
                    let zeros = || {
                        Tensor::zeros(var.shape(), DType::F32, var.device())
                            .expect("zeros of a parameter's shape on its own device")
                    };
                    Moments::Tensor(zeros(), zeros())
                } else {
                    let count = var.elem_count();
                    Moments::Host(written_zeros(count), written_zeros(count))
                }
            })
            .collect();
        AdamW {
            params,
            step: 0,
            moments,
            vars: vars.to_vec(),
        }
    }

    /// One update with `grads` (in the order of the parameters given to `new`); parameters without a
    /// gradient are left alone (their moments too), as in candle.
    pub fn step(&mut self, grads: &Grads) -> Result<()> {
        let count = grads.values.len().max(grads.tensors.len());
        if count != self.vars.len() {
            candle_core::bail!(
                "AdamW: {count} gradients for {} parameters",
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
            let Some(len) = grads.len_of(i) else {
                continue;
            };
            if len != var.elem_count() {
                candle_core::bail!(
                    "AdamW: gradient of {len} values for {name} ({} values)",
                    var.elem_count()
                );
            }
            let gradient = grads.get(i).expect("a gradient of known length");
            match (&mut self.moments[i], gradient) {
                (Moments::Host(m, v), gradient) => {
                    let downloaded;
                    let g: &[f32] = match gradient {
                        Gradient::Host(g) => g,
                        Gradient::Tensor(t) => {
                            downloaded = t.flatten_all()?.to_vec1::<f32>()?;
                            &downloaded
                        }
                    };
                    // In place on the parameter's own storage (views of the model share it and see
                    // the step).
                    var.as_tensor().inplace_op1(&InPlace {
                        constants,
                        grad: g,
                        moments: std::cell::RefCell::new((m, v)),
                    })?;
                }
                (Moments::Tensor(m, v), gradient) => {
                    let g = match gradient {
                        Gradient::Tensor(t) => t.reshape(var.shape())?,
                        Gradient::Host(g) => Tensor::from_slice(g, var.shape(), var.device())?,
                    };
                    tensor_update(&p, scale_m, scale_v, var, m, v, &g)?;
                }
            }
        }
        Ok(())
    }

    /// The moments as tensors named `m.<param>` and `v.<param>` (for safetensors), on `device`.
    pub fn state_tensors(&self, device: &Device) -> Result<HashMap<String, Tensor>> {
        let mut out = HashMap::new();
        for ((name, var), moments) in self.vars.iter().zip(&self.moments) {
            let (m, v) = match moments {
                Moments::Host(m, v) => {
                    let shape = var.shape();
                    (
                        Tensor::from_slice(m, shape, device)?,
                        Tensor::from_slice(v, shape, device)?,
                    )
                }
                Moments::Tensor(m, v) => (m.to_device(device)?, v.to_device(device)?),
            };
            out.insert(format!("m.{name}"), m);
            out.insert(format!("v.{name}"), v);
        }
        Ok(out)
    }

    /// Restore the moments saved by [`AdamW::state_tensors`] and the step count.
    pub fn load_state(
        &mut self,
        tensors: &HashMap<String, Tensor>,
        step: u64,
    ) -> std::result::Result<(), String> {
        for ((name, var), moments) in self.vars.iter().zip(self.moments.iter_mut()) {
            let mut loaded = Vec::with_capacity(2);
            for kind in ["m", "v"] {
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
                loaded.push((key, tensor));
            }
            let read =
                |(key, tensor): &(String, &Tensor)| -> std::result::Result<Vec<f32>, String> {
                    tensor
                        .flatten_all()
                        .and_then(|t| t.to_vec1::<f32>())
                        .map_err(|e| format!("the optimizer state `{key}`: {e}"))
                };
            let place = |(key, tensor): &(String, &Tensor)| -> std::result::Result<Tensor, String> {
                tensor
                    .to_dtype(DType::F32)
                    .and_then(|t| t.to_device(var.device()))
                    .and_then(|t| t.contiguous())
                    .map_err(|e| format!("the optimizer state `{key}`: {e}"))
            };
            *moments = match moments {
                Moments::Host(..) => Moments::Host(read(&loaded[0])?, read(&loaded[1])?),
                Moments::Tensor(..) => Moments::Tensor(place(&loaded[0])?, place(&loaded[1])?),
            };
        }
        self.step = step;
        Ok(())
    }
}

/// candle-nn's AdamW step for one parameter, op for op (so on the CPU it equals [`Update::apply`] bit
/// for bit): the moments are replaced, the parameter written in place (`Var::set`, so views that share
/// its storage see the step).
fn tensor_update(
    p: &AdamWParams,
    scale_m: f32,
    scale_v: f32,
    theta: &Var,
    m: &mut Tensor,
    v: &mut Tensor,
    g: &Tensor,
) -> Result<()> {
    let next_m = ((&*m * p.beta1)? + (g * (1.0 - p.beta1))?)?;
    let next_v = ((&*v * p.beta2)? + (g.sqr()? * (1.0 - p.beta2))?)?;
    let m_hat = (&next_m * scale_m as f64)?;
    let v_hat = (&next_v * scale_v as f64)?;
    let next_theta = (theta.as_tensor() * (1f64 - p.lr * p.weight_decay))?;
    let adjusted = (m_hat / (v_hat.sqrt()? + p.eps)?)?;
    let next_theta = (next_theta - (adjusted * p.lr)?)?;
    theta.set(&next_theta)?;
    *m = next_m;
    *v = next_v;
    Ok(())
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
            ..Default::default()
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

    /// The GPU path (gradients and moments as tensors, candle-nn's ops) run on the CPU: the same
    /// parameters as the in-place host update, bit for bit, over steps with clipping, and a saved and
    /// restored state continues identically.
    #[test]
    fn the_resident_path_equals_the_host_update_bit_for_bit() {
        let params = AdamWParams {
            lr: 3e-3,
            weight_decay: 0.1,
            ..Default::default()
        };
        let host = vars(4);
        let kept = vars(4);
        let mut host_opt = AdamW::new(&host, params);
        let mut kept_opt = AdamW::resident(&kept, params);
        let mut rng = crate::rng::Rng::new(11);
        for step in 0..4 {
            let r: Vec<Tensor> = host
                .iter()
                .map(|(_, v)| {
                    let values: Vec<f32> = (0..v.elem_count())
                        .map(|_| 3.0 * rng.normal() as f32)
                        .collect();
                    Tensor::from_vec(values, v.shape(), &Device::Cpu).unwrap()
                })
                .collect();
            let store = |vs: &[(String, Var)]| {
                let mut total = Tensor::new(0f32, &Device::Cpu).unwrap();
                for ((_, v), r) in vs.iter().zip(&r) {
                    let term = (v.as_tensor() * r).unwrap().sum_all().unwrap();
                    total = (total + term).unwrap();
                }
                total.backward().unwrap()
            };
            let mut host_grads = Grads::from_store(&host, &store(&host)).unwrap();
            let mut kept_grads = Grads::resident();
            kept_grads.accumulate(&kept, &store(&kept)).unwrap();
            assert!(!host_grads.is_resident() && kept_grads.is_resident());
            assert!(kept_grads.values.is_empty() && kept_grads.tensors.len() == 3);
            let (a, b) = (host_grads.norm(), kept_grads.norm());
            assert!((a - b).abs() <= 1e-12 * a, "step {step}: norms {a} vs {b}");
            // Clipped every other step (the norm is ~3·sqrt(54) ≈ 22).
            let max_norm = if step % 2 == 0 { 5.0 } else { 0.0 };
            host_grads.clip(max_norm);
            kept_grads.clip(max_norm);
            host_opt.step(&host_grads).unwrap();
            kept_opt.step(&kept_grads).unwrap();
            if step == 1 {
                let saved = kept_opt.state_tensors(&Device::Cpu).unwrap();
                let host_saved = host_opt.state_tensors(&Device::Cpu).unwrap();
                for (key, t) in &saved {
                    assert_eq!(
                        t.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                        host_saved[key]
                            .flatten_all()
                            .unwrap()
                            .to_vec1::<f32>()
                            .unwrap(),
                        "{key}"
                    );
                }
                let mut restored = AdamW::resident(&kept, params);
                restored.load_state(&saved, kept_opt.step).unwrap();
                kept_opt = restored;
            }
        }
        for ((name, a), (_, b)) in host.iter().zip(&kept) {
            assert_eq!(
                a.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                b.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                "{name}: the resident update differs from the host one"
            );
        }
    }

    #[test]
    fn resident_gradients_name_the_first_non_finite_parameter() {
        let vs = vars(5);
        let tensor = |values: Vec<f32>, shape: (usize, usize)| {
            Some(Tensor::from_vec(values, shape, &Device::Cpu).unwrap())
        };
        let mut grads = Grads::resident();
        grads.tensors = vec![
            tensor(vec![3.0; 35], (7, 5)),
            None,
            tensor(vec![4.0; 16], (4, 4)),
        ];
        let norm = grads.clip(1.0);
        assert!((norm - (9.0f64 * 35.0 + 16.0 * 16.0).sqrt()).abs() < 1e-9);
        assert!((grads.norm() - 1.0).abs() < 1e-5);
        assert_eq!(grads.first_non_finite(&vs), None);
        let mut values = vec![4.0f32; 16];
        values[5] = f32::NEG_INFINITY;
        grads.tensors[2] = tensor(values, (4, 4));
        assert_eq!(
            grads.first_non_finite(&vs),
            Some(("c".to_string(), f32::NEG_INFINITY))
        );
    }

    #[test]
    fn clipping_scales_to_the_max_norm_and_non_finite_values_are_named() {
        let vs = vars(3);
        let mut grads = Grads {
            values: vec![Some(vec![3.0; 35]), None, Some(vec![4.0; 16])],
            ..Default::default()
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
