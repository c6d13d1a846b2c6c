//! Time (median of 5 runs after a warm-up) and peak extra heap of the fused causal attention
//! (`rlx_trainer::attention::causal_attention`) against the plain candle reference
//! (`naive_causal_attention`: kv heads repeated, full scores plus a mask, softmax, times v), forward alone
//! and forward + backward (the gradients of Σ w·out w.r.t. q, k and v), at SmolLM2-135M's attention shapes:
//! b = 16, heads = 9, kv heads = 3, d = 64, t = s = 102 and 512 (left padding of 0..45 positions), and a
//! decoding step (t = 1 after a cache of 700 positions, forward only).
//!
//! cargo run --release -p rlx-trainer --example attention_bench [fused|naive|all] [T]
//!
//! (the arguments select an implementation and one t).
//! "backward" is the `backward()` call alone (candle's backward of the loss Σ w·out and of the attention;
//! every candle op allocates its result afresh, so a good part of it is page faults and elementwise
//! passes common to both implementations). The peak is the most heap allocated at once during a run
//! above what was allocated before it (a counting allocator), the inputs excluded.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use candle_core::{Device, Tensor, Var};
use rlx_trainer::attention::{causal_attention, naive_causal_attention};
use rlx_trainer::rng::Rng;

/// The system allocator, counting the bytes allocated now and the peak since the last reset.
struct Counting;

static NOW: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let pointer = unsafe { System.alloc(layout) };
        if !pointer.is_null() {
            let now = NOW.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        pointer
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let pointer = unsafe { System.alloc_zeroed(layout) };
        if !pointer.is_null() {
            let now = NOW.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        unsafe { System.dealloc(pointer, layout) };
        NOW.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let moved = unsafe { System.realloc(pointer, layout, new_size) };
        if !moved.is_null() {
            if new_size >= layout.size() {
                let grown = new_size - layout.size();
                let now = NOW.fetch_add(grown, Ordering::Relaxed) + grown;
                PEAK.fetch_max(now, Ordering::Relaxed);
            } else {
                NOW.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        moved
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

type Attention = fn(&Tensor, &Tensor, &Tensor, &[usize], usize) -> candle_core::Result<Tensor>;

fn randn(rng: &mut Rng, dims: &[usize]) -> candle_core::Result<Tensor> {
    let n = dims.iter().product();
    let data: Vec<f32> = (0..n).map(|_| rng.normal() as f32).collect();
    Tensor::from_vec(data, dims, &Device::Cpu)
}

/// The median (ms) of 5 runs of `run` after one warm-up, of the whole run and of the part of it that `run`
/// times itself (its result, in ms), and the largest peak extra heap of a run (MiB).
fn measure(
    mut run: impl FnMut() -> candle_core::Result<f64>,
) -> candle_core::Result<(f64, f64, f64)> {
    run()?;
    let (mut times, mut parts) = (Vec::new(), Vec::new());
    let mut peak = 0usize;
    for _ in 0..5 {
        let base = NOW.load(Ordering::Relaxed);
        PEAK.store(base, Ordering::Relaxed);
        let start = Instant::now();
        parts.push(run()?);
        times.push(start.elapsed().as_secs_f64() * 1e3);
        peak = peak.max(PEAK.load(Ordering::Relaxed) - base);
    }
    times.sort_by(f64::total_cmp);
    parts.sort_by(f64::total_cmp);
    Ok((times[2], parts[2], peak as f64 / (1 << 20) as f64))
}

fn main() -> candle_core::Result<()> {
    let only = std::env::args().nth(1).filter(|x| x != "all");
    let only_t: Option<usize> = std::env::args().nth(2).and_then(|x| x.parse().ok());
    let (b, heads, kv, d) = (16, 9, 3, 64);
    println!(
        "b = {b}, heads = {heads}, kv heads = {kv}, d = {d}, {} rayon threads; median of 5 runs, peak extra heap",
        rayon::current_num_threads()
    );
    for (t, offset, backward) in [(102, 0, true), (512, 0, true), (1, 700, false)] {
        if only_t.is_some_and(|only| only != t) {
            continue;
        }
        let s = offset + t;
        let mut rng = Rng::new(7);
        let q = randn(&mut rng, &[b, heads, t, d])?;
        let k = randn(&mut rng, &[b, kv, s, d])?;
        let v = randn(&mut rng, &[b, kv, s, d])?;
        let w = randn(&mut rng, &[b, heads, t, d])?;
        let left_pad: Vec<usize> = (0..b).map(|r| (r * 7) % 46).collect();
        let all: [(&str, Attention); 2] = [
            ("fused", causal_attention),
            ("naive", naive_causal_attention),
        ];
        let modes: Vec<_> = all
            .into_iter()
            .filter(|(name, _)| only.as_deref().is_none_or(|only| only == *name))
            .collect();
        println!("t = {t}, s = {s}:");
        for &(name, f) in &modes {
            let (ms, _, mib) = measure(|| f(&q, &k, &v, &left_pad, offset).map(|_| 0.0))?;
            println!("  {name} forward            {ms:9.2} ms                      {mib:8.1} MiB");
        }
        if !backward {
            continue;
        }
        let vars = [&q, &k, &v].map(|x| Var::from_tensor(x).expect("a variable"));
        for &(name, f) in &modes {
            let (ms, backward_ms, mib) = measure(|| {
                let out = f(&vars[0], &vars[1], &vars[2], &left_pad, offset)?;
                let loss = (out * &w)?.sum_all()?;
                let start = Instant::now();
                let grads = loss.backward()?;
                let elapsed = start.elapsed().as_secs_f64() * 1e3;
                for x in &vars {
                    grads.get(x).expect("a gradient");
                }
                Ok(elapsed)
            })?;
            println!(
                "  {name} forward + backward {ms:9.2} ms (backward {backward_ms:8.2} ms) {mib:8.1} MiB"
            );
        }
    }
    Ok(())
}
