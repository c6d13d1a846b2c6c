//! The memory a run needs, estimated from the config before anything is allocated, so that sizes the
//! machine cannot hold are a config error naming the key and the estimate instead of an abort.
//!
//! The estimate (f32 everywhere, bytes): the weights five times over (policy, reference, gradients,
//! AdamW's two moments), plus the largest of the phases that follow one another: the update's forward
//! and backward pass (candle keeps every activation of a micro-batch for the backward pass), sampling
//! (the KV cache of every row and the prefill's activations), the warm start's batch, and greedy
//! evaluation (chunks of 256 prompts, and the held-out prompts themselves). It is an upper-bound-style
//! count of the large tensors, not a measurement; docs/training.md ("Configuration") compares it with
//! measured peaks.

use crate::config::Config;
use crate::model::ModelConfig;

/// Greedy evaluation generates this many prompts at a time (`train::accuracy`).
pub const EVAL_CHUNK: usize = 256;

/// Used when the available memory cannot be read (no `/proc/meminfo`).
pub const FALLBACK_LIMIT: f64 = 16.0 * GIB;

const GIB: f64 = (1u64 << 30) as f64;
const F32: f64 = 4.0;

/// One phase of the estimate: its bytes and the config keys that size it.
#[derive(Clone, Debug, PartialEq)]
pub struct Part {
    pub what: &'static str,
    pub keys: &'static str,
    pub bytes: f64,
}

/// The estimate for a run of `model` with `rows` sampled responses per step (prompts × group size)
/// of up to `positions` tokens (prompt and completion).
#[derive(Clone, Debug, PartialEq)]
pub struct Estimate {
    pub parameters: f64,
    pub weights: Part,
    /// The phases after the weights (only the largest counts towards the peak).
    pub phases: Vec<Part>,
}

impl Estimate {
    pub fn new(
        model: &ModelConfig,
        config: &Config,
        group_size: usize,
        positions: usize,
    ) -> Estimate {
        let (v, h, l) = (model.vocab as f64, model.hidden as f64, model.layers as f64);
        let heads = model.heads as f64;
        let kv = (model.kv_heads * model.head_dim()) as f64;
        let i = model.intermediate as f64;
        let w = positions as f64;
        let q = (model.heads * model.head_dim()) as f64;
        let parameters = 2.0 * v * h + h + l * (2.0 * h + 2.0 * q * h + 2.0 * kv * h + 3.0 * i * h);
        // With LoRA the base is held once (no gradient, no moments, the reference shares it) and the
        // adapters five times: A [rank, in] and B [out, rank] per targeted projection.
        let (held, lora_what) = match config.model.lora() {
            None => (
                5.0 * parameters,
                "the weights (policy, reference, gradients, AdamW's two moments)",
            ),
            Some(lora) => {
                let r = lora.rank as f64;
                let per_layer: f64 = lora
                    .targets
                    .iter()
                    .map(|t| match t.as_str() {
                        "q" => r * (h + q),
                        "k" | "v" => r * (h + kv),
                        "o" => r * (q + h),
                        _ => r * (h + i),
                    })
                    .sum();
                (
                    parameters + 5.0 * l * per_layer,
                    "the frozen base and the LoRA adapters (policy, reference, gradients, AdamW's two moments)",
                )
            }
        };
        // Activations of one token through one layer, kept for the backward pass: norms, q/k/v and
        // their rotated copies, attention scores and softmax over the row, the attention and MLP
        // outputs, residuals, the MLP's gate/up/SiLU/product.
        let layer = 10.0 * h + 3.0 * kv + 2.0 * heads * w + 4.0 * i;
        let token = l * layer + 3.0 * v + h;
        // Forward and backward (gradients of the same size, transiently).
        let backward = |rows: f64| 2.0 * F32 * rows * w * token;
        // Without a graph: the KV cache of every row, and one layer's activations of the prefill.
        let sampling = |rows: f64| F32 * rows * w * (2.0 * l * kv + layer + v);
        let responses = (config.train.prompts_per_step * group_size) as f64;
        let micro = match config.train.micro_batch {
            0 => responses,
            m => responses.min(m as f64),
        };
        let mut phases = vec![
            Part {
                what: "the update's forward and backward pass",
                keys: "train.prompts_per_step × sampler.n (or train.micro_batch)",
                bytes: backward(micro),
            },
            Part {
                what: "sampling (KV cache)",
                keys: "train.prompts_per_step × sampler.n",
                bytes: sampling(responses),
            },
        ];
        if config.sft.steps > 0 {
            phases.push(Part {
                what: "the warm start's batch",
                keys: "sft.batch",
                bytes: backward(config.sft.batch as f64),
            });
        }
        if let crate::kinds::TaskSection::Arithmetic(task) = &config.task {
            let questions = task.eval_questions as f64;
            phases.push(Part {
                what: "greedy evaluation (the held-out prompts and a chunk's KV cache)",
                keys: "task.eval_questions",
                // Each held-out prompt: its text, ids and answer (about 64 bytes of bookkeeping).
                bytes: questions * (64.0 + F32 * w) + sampling(questions.min(EVAL_CHUNK as f64)),
            });
        }
        Estimate {
            parameters,
            weights: Part {
                what: lora_what,
                keys: "model.vocab, model.hidden, model.layers, model.intermediate",
                bytes: F32 * held,
            },
            phases,
        }
    }

    /// The largest phase.
    pub fn largest(&self) -> &Part {
        self.phases
            .iter()
            .fold(&self.weights, |a, b| if b.bytes > a.bytes { b } else { a })
    }

    pub fn peak(&self) -> f64 {
        self.weights.bytes + self.phases.iter().map(|p| p.bytes).fold(0.0, f64::max)
    }

    /// An error when the peak exceeds `limit` bytes, naming the largest part, its keys and the numbers.
    pub fn check(&self, limit: f64, limit_source: &str) -> Result<(), String> {
        let peak = self.peak();
        if peak <= limit {
            return Ok(());
        }
        let part = self.largest();
        Err(format!(
            "config: the run needs about {} of memory, more than the {} {limit_source}; the largest part is {} ({}), sized by {}: lower it",
            human(peak),
            human(limit),
            part.what,
            human(part.bytes),
            part.keys
        ))
    }
}

/// The memory a run may use: `MemAvailable` of `/proc/meminfo`, else [`FALLBACK_LIMIT`]; with the
/// words that say where it came from.
pub fn available() -> (f64, &'static str) {
    let from_proc = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
            let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024.0)
        });
    match from_proc {
        Some(bytes) => (bytes, "available (MemAvailable in /proc/meminfo)"),
        None => (
            FALLBACK_LIMIT,
            "cap used where the available memory is unknown",
        ),
    }
}

/// Bytes in KiB/MiB/GiB/TiB, three significant digits.
pub fn human(bytes: f64) -> String {
    let units = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut value = bytes;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{value:.0} bytes")
    } else {
        format!("{value:.3} {}", units[unit])
    }
}

/// The high-water mark of GPU memory in use on `device` (a candle CUDA device) since the last
/// [`reset_gpu_peak`]: the `CU_MEMPOOL_ATTR_USED_MEM_HIGH` of the GPU's default memory pool, from which
/// cudarc's stream-ordered allocations (candle's tensors, the recipe kernels' buffers) come. `None` on
/// the CPU; an error naming the failure otherwise (e.g. a driver without stream-ordered allocation).
pub fn gpu_peak_bytes(device: &candle_core::Device) -> Result<Option<u64>, String> {
    #[cfg(feature = "cuda")]
    if let candle_core::Device::Cuda(cuda) = device {
        return pool_attribute(cuda, false).map(Some);
    }
    let _ = device;
    Ok(None)
}

/// Start a new high-water mark for [`gpu_peak_bytes`] (waits for the device's queued work first); a
/// no-op on the CPU.
pub fn reset_gpu_peak(device: &candle_core::Device) -> Result<(), String> {
    #[cfg(feature = "cuda")]
    if let candle_core::Device::Cuda(cuda) = device {
        return pool_attribute(cuda, true).map(|_| ());
    }
    let _ = device;
    Ok(())
}

/// Read (or, with `reset`, zero) the default pool's used-memory high-water mark of `cuda`'s GPU.
#[cfg(feature = "cuda")]
fn pool_attribute(cuda: &candle_core::CudaDevice, reset: bool) -> Result<u64, String> {
    use candle_core::cuda_backend::cudarc::driver::{result, sys};
    let stream = cuda.cuda_stream();
    stream
        .synchronize()
        .map_err(|e| format!("the GPU reported an error: {e}"))?;
    let context = stream.context();
    context
        .bind_to_thread()
        .map_err(|e| format!("cannot bind the CUDA context: {e}"))?;
    let attribute = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH;
    let mut value: u64 = 0;
    // SAFETY: the device handle comes from a live context (cudarc's own), so its default pool is a
    // valid pool; the attribute USED_MEM_HIGH is a cuuint64_t, which `value` is (set accepts only 0).
    unsafe {
        let pool = result::device::get_default_mem_pool(context.cu_device())
            .map_err(|e| format!("the GPU's default memory pool: {e}"))?;
        let pointer = &mut value as *mut u64 as *mut std::ffi::c_void;
        if reset {
            result::mem_pool::set_attribute(pool, attribute, pointer)
        } else {
            result::mem_pool::get_attribute(pool, attribute, pointer)
        }
        .map_err(|e| format!("the memory pool's high-water mark: {e}"))?;
    }
    Ok(value)
}
