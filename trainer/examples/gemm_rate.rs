//! The rate of candle's f32 matrix products (the `gemm` crate, which `Tensor::matmul` calls on the CPU)
//! at SmolLM2-135M's projection shapes, in the three layouts a training step uses: `NN` (x · W), `NT`
//! (x · Wᵀ: a forward projection of an `[out, in]` weight) and `TN` (∂yᵀ · x: a weight's gradient).
//! m = 1,632 rows (16 rows of 102 positions), hidden 576, MLP 1,536.
//!
//! cargo run --release -p rlx-trainer --example gemm_rate [THREADS]
//!
//! Prints one JSON line per shape and layout: GFLOP/s over wall time, and over the process's CPU time
//! (`clock_gettime(CLOCK_PROCESS_CPUTIME_ID)`), the median of 10 products after 3 warm-ups. On a busy
//! machine the wall rate drops while the CPU-time rate of one thread stays near the processor's own
//! rate, which makes one thread's CPU-time rate the number to compare with `scripts/gemm_rate.py` (the
//! same products in torch) when the machine is shared. THREADS (default: all) sets rayon's pool, which
//! candle's products use.

use std::time::Instant;

use candle_core::{Device, Tensor};

use rlx_trainer::bench_model::cpu_seconds;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() -> candle_core::Result<()> {
    if let Some(threads) = std::env::args().nth(1) {
        let threads: usize = threads.parse().expect("THREADS is a number");
        std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build_global()
            .expect("the rayon pool");
    }
    let device = Device::Cpu;
    for (m, k, n) in [(1632, 576, 1536), (1632, 1536, 576), (576, 1632, 1536)] {
        for layout in ["NN", "NT", "TN"] {
            // The operands as the layout stores them; `.t()` is a strided view, as in the model.
            let a = if layout == "TN" {
                Tensor::randn(0f32, 1.0, (k, m), &device)?.t()?
            } else {
                Tensor::randn(0f32, 1.0, (m, k), &device)?
            };
            let b = if layout == "NT" {
                Tensor::randn(0f32, 1.0, (n, k), &device)?.t()?
            } else {
                Tensor::randn(0f32, 1.0, (k, n), &device)?
            };
            let (mut wall, mut cpu) = (Vec::new(), Vec::new());
            for run in 0..13 {
                let (w0, c0) = (Instant::now(), cpu_seconds());
                let c = a.matmul(&b)?;
                let (w1, c1) = (w0.elapsed().as_secs_f64(), cpu_seconds() - c0);
                drop(c);
                if run >= 3 {
                    wall.push(w1);
                    cpu.push(c1);
                }
            }
            let flop = 2.0 * (m * k * n) as f64;
            println!(
                "{{\"side\":\"candle\",\"m\":{m},\"k\":{k},\"n\":{n},\"layout\":\"{layout}\",\"threads\":{},\"gflops_wall\":{:.1},\"gflops_cpu\":{:.1}}}",
                rayon::current_num_threads(),
                flop / median(wall) / 1e9,
                flop / median(cpu) / 1e9
            );
        }
    }
    Ok(())
}
