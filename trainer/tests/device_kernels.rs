//! The trainer's CUDA kernels (`trainer/src/device_kernels.cu`) without a GPU.
//!
//! - **Host C.** The source, with the portability header `cuda_host.h` in front
//!   (`device_kernels::host_c`), is compiled by the system C compiler (`cc`, or `$CC`) into a shared
//!   library whose kernels run on POSIX threads (a block's threads run concurrently and meet at
//!   `__syncthreads`, so the block reductions really run). Each kernel runs on random inputs, with
//!   several block and grid sizes, and is compared with the CPU path: the fused layers' CPU kernels
//!   (`fused.rs`: values, and the gradients of their backward passes through candle's autograd), the LM
//!   head's chunk passes (`head_cpu.rs`) and the recipe op's gradient columns (a scatter written out
//!   here), within f32 tolerance.
//! - **NVRTC and ptxas.** With the tools of `scripts/install-cuda-tools.sh`, the source compiles to PTX
//!   for compute_80 and compute_90 with every kernel's entry, and `ptxas` assembles it for sm_80 and
//!   sm_90 (the recipe kernels' check in tests/cuda.rs). Without them the test is reported as ignored
//!   (rlx-tools, `rlx_nvrtc`).

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use candle_core::{Device, Tensor, Var};
use rlx_trainer::device_kernels::{self, f32_word, KERNELS};
use rlx_trainer::fused::{self, RopeTables};
use rlx_trainer::head_cpu;

#[path = "../../runtime/tests/common/host_c.rs"]
mod host_c;
#[path = "../../runtime/tests/common/nvrtc.rs"]
mod nvrtc;
use host_c::HostLaunch;
use nvrtc::Nvrtc;

/// A fresh scratch folder.
fn scratch(label: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("rlx-device-kernels-{}-{label}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The kernels as a host library, compiled once per test binary.
fn library() -> &'static libloading::Library {
    static LIBRARY: OnceLock<libloading::Library> = OnceLock::new();
    LIBRARY.get_or_init(|| {
        let dir = scratch("host");
        let so = host_c::shared_library(
            &device_kernels::host_c(),
            &dir,
            &["-Wno-unused-function", "-Wno-unused-variable"],
        )
        .unwrap_or_else(|message| panic!("{message}"));
        // SAFETY: our own kernels; the library's initialisers do nothing.
        let library = unsafe { libloading::Library::new(&so) }.expect("loads");
        let _ = std::fs::remove_dir_all(&dir);
        library
    })
}

/// Run kernel `name` on the host with `table` (addresses of host memory and sizes, as on the GPU).
fn launch(name: &str, table: &[u64], grid: u32, block: u32) {
    let symbol = format!("rlx_host_{name}");
    // SAFETY: RLX_HOST_LAUNCHER defines every rlx_host_* with the `HostLaunch` signature.
    let function: libloading::Symbol<HostLaunch> =
        unsafe { library().get(symbol.as_bytes()) }.expect("a host launcher per kernel");
    // SAFETY: each test builds `table` as the kernel documents, over live vectors it owns.
    let status = unsafe { function(table.as_ptr().cast(), 0, 0, grid, block) };
    assert_eq!(status, 0, "host launch of {name}");
}

fn address<T>(v: &[T]) -> u64 {
    v.as_ptr() as u64
}

fn address_mut<T>(v: &mut [T]) -> u64 {
    v.as_mut_ptr() as u64
}

/// Deterministic pseudo-random values in [-scale, scale).
fn random(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// f32 tolerance: 1e-4 relative + 1e-6.
fn assert_close(what: &str, actual: &[f32], expected: &[f32]) {
    assert_eq!(actual.len(), expected.len(), "{what}: lengths");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        let tolerance = 1e-4 * a.abs().max(e.abs()) + 1e-6;
        assert!(
            (a - e).abs() <= tolerance,
            "{what}: element {i}: kernel {a}, CPU {e}"
        );
    }
}

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

/// (threads per block, blocks): one thread, a partial warp, more threads than elements, few blocks.
const SHAPES: [(u32, u32); 4] = [(1, 1), (4, 3), (32, 2), (64, 64)];

#[test]
fn rms_norm_and_its_backward_agree_with_the_cpu_kernel() {
    let (rows, h, eps) = (7usize, 37usize, 1e-5f32);
    let x = random(1, rows * h, 2.0);
    let w = random(2, h, 1.5);
    let dy = random(3, rows * h, 1.0);
    let cpu = Device::Cpu;
    let xv = Var::from_vec(x.clone(), (rows, h), &cpu).unwrap();
    let wv = Var::from_vec(w.clone(), h, &cpu).unwrap();
    let g = Tensor::from_vec(dy.clone(), (rows, h), &cpu).unwrap();
    let y = fused::rms_norm(xv.as_tensor(), wv.as_tensor(), eps as f64).unwrap();
    let grads = (&y * &g).unwrap().sum_all().unwrap().backward().unwrap();
    let (dx, dw) = (
        values(grads.get(xv.as_tensor()).unwrap()),
        values(grads.get(wv.as_tensor()).unwrap()),
    );
    for (block, grid) in SHAPES {
        let mut out = vec![f32::NAN; rows * h];
        let table = [
            address(&x),
            address(&w),
            address_mut(&mut out),
            rows as u64,
            h as u64,
            f32_word(eps),
        ];
        launch("rlx_rms_norm", &table, grid, block);
        assert_close(&format!("rms_norm block {block}"), &out, &values(&y));

        let mut both = vec![f32::NAN; (rows + 1) * h];
        let mut inv = vec![0f32; rows];
        let table = [
            address(&x),
            address(&w),
            address(&dy),
            address_mut(&mut both),
            address_mut(&mut inv),
            rows as u64,
            h as u64,
            f32_word(eps),
        ];
        launch("rlx_rms_norm_bwd_rows", &table, grid, block);
        let table = [
            address(&x),
            address(&dy),
            address(&inv),
            address_mut(&mut both),
            rows as u64,
            h as u64,
        ];
        launch("rlx_rms_norm_bwd_weight", &table, grid, block);
        assert_close(&format!("∂x block {block}"), &both[..rows * h], &dx);
        assert_close(&format!("∂w block {block}"), &both[rows * h..], &dw);
    }
}

#[test]
fn swiglu_and_its_backward_agree_with_the_cpu_kernel() {
    let n = 301usize;
    let a = random(4, n, 6.0);
    let b = random(5, n, 2.0);
    let dy = random(6, n, 1.0);
    let cpu = Device::Cpu;
    let av = Var::from_vec(a.clone(), n, &cpu).unwrap();
    let bv = Var::from_vec(b.clone(), n, &cpu).unwrap();
    let g = Tensor::from_vec(dy.clone(), n, &cpu).unwrap();
    let y = fused::swiglu(av.as_tensor(), bv.as_tensor()).unwrap();
    let grads = (&y * &g).unwrap().sum_all().unwrap().backward().unwrap();
    let (da, db) = (
        values(grads.get(av.as_tensor()).unwrap()),
        values(grads.get(bv.as_tensor()).unwrap()),
    );
    for (block, grid) in SHAPES {
        let mut out = vec![f32::NAN; n];
        launch(
            "rlx_swiglu",
            &[address(&a), address(&b), address_mut(&mut out), n as u64],
            grid,
            block,
        );
        assert_close("swiglu", &out, &values(&y));
        let mut both = vec![f32::NAN; 2 * n];
        let table = [
            address(&a),
            address(&b),
            address(&dy),
            address_mut(&mut both),
            n as u64,
        ];
        launch("rlx_swiglu_bwd", &table, grid, block);
        assert_close("∂gate", &both[..n], &da);
        assert_close("∂up", &both[n..], &db);
    }
}

/// `rlx_heads` on `x` with `dims` = (b, t, n, d), `mode` and `sign`, the tables if any.
fn heads_kernel(
    x: &[f32],
    dims: (usize, usize, usize, usize),
    tables: Option<&RopeTables>,
    mode: u64,
    sign: f32,
    (block, grid): (u32, u32),
) -> Vec<f32> {
    let (b, t, n, d) = dims;
    let mut out = vec![f32::NAN; x.len()];
    let (cos, sin) = match tables {
        Some(tables) => (address(tables.cos()), address(tables.sin())),
        None => (0, 0),
    };
    let table = [
        address(x),
        address_mut(&mut out),
        cos,
        sin,
        b as u64,
        t as u64,
        n as u64,
        d as u64,
        mode,
        f32_word(sign),
    ];
    launch("rlx_heads", &table, grid, block);
    out
}

#[test]
fn rope_and_the_head_moves_agree_with_the_cpu_kernels_both_ways() {
    let (b, t, n, d) = (2usize, 5usize, 3usize, 8usize);
    let inv_freq: Vec<f64> = (0..d / 2)
        .map(|i| 1.0 / 10_000f64.powf(2.0 * i as f64 / d as f64))
        .collect();
    let tables = RopeTables::new(&inv_freq, 3, t);
    let cpu = Device::Cpu;
    let x = random(7, b * t * n * d, 1.0);
    let g = random(8, b * t * n * d, 1.0);
    for shape in SHAPES {
        // rope on [b·n, t, d] rows: forward (sign +1), backward = rotation by −θ.
        let xv = Var::from_vec(x.clone(), (b * n, t, d), &cpu).unwrap();
        let y = fused::rope(xv.as_tensor(), &tables).unwrap();
        let gt = Tensor::from_vec(g.clone(), (b * n, t, d), &cpu).unwrap();
        let grads = (&y * &gt).unwrap().sum_all().unwrap().backward().unwrap();
        let dims = (b * n, t, 1, d);
        assert_close(
            "rope",
            &heads_kernel(&x, dims, Some(&tables), 0, 1.0, shape),
            &values(&y),
        );
        assert_close(
            "rope backward",
            &heads_kernel(&g, dims, Some(&tables), 0, -1.0, shape),
            &values(grads.get(xv.as_tensor()).unwrap()),
        );

        for rotate in [false, true] {
            let rope = rotate.then_some(&tables);
            // to_heads: [b, t, n, d] → [b, n, t, d]; its backward is from_heads' move with −θ.
            let xv = Var::from_vec(x.clone(), (b, t, n, d), &cpu).unwrap();
            let y = fused::to_heads(xv.as_tensor(), rope).unwrap();
            let gt = Tensor::from_vec(g.clone(), (b, n, t, d), &cpu).unwrap();
            let grads = (&y * &gt).unwrap().sum_all().unwrap().backward().unwrap();
            let label = if rotate { "rotated" } else { "plain" };
            assert_close(
                &format!("to_heads {label}"),
                &heads_kernel(&x, (b, t, n, d), rope, 1, 1.0, shape),
                &values(&y),
            );
            assert_close(
                &format!("to_heads backward {label}"),
                &heads_kernel(&g, (b, t, n, d), rope, 2, -1.0, shape),
                &values(grads.get(xv.as_tensor()).unwrap()),
            );
        }
        // from_heads: [b, n, t, d] → [b, t, n, d]; its backward is to_heads' move.
        let xv = Var::from_vec(x.clone(), (b, n, t, d), &cpu).unwrap();
        let y = fused::from_heads(xv.as_tensor()).unwrap();
        let gt = Tensor::from_vec(g.clone(), (b, t, n, d), &cpu).unwrap();
        let grads = (&y * &gt).unwrap().sum_all().unwrap().backward().unwrap();
        assert_close(
            "from_heads",
            &heads_kernel(&x, (b, t, n, d), None, 2, 1.0, shape),
            &values(&y),
        );
        assert_close(
            "from_heads backward",
            &heads_kernel(&g, (b, t, n, d), None, 1, 1.0, shape),
            &values(grads.get(xv.as_tensor()).unwrap()),
        );
    }
}

#[test]
fn the_lm_head_chunks_agree_with_the_cpu_passes() {
    let (rows, v, chunk) = (6usize, 250usize, 96usize);
    let cpu = Device::Cpu;
    let z = random(9, rows * v, 8.0);
    let targets: Vec<u32> = (0..rows).map(|i| ((i * 97 + 13) % v) as u32).collect();
    let g1 = random(10, rows, 1.0);
    let g2 = random(11, rows, 1.0);
    let full = Tensor::from_vec(z.clone(), (rows, v), &cpu).unwrap();
    // The CPU passes over the same chunks.
    let mut states = vec![head_cpu::RowState::default(); rows];
    let chunks: Vec<(usize, usize)> = (0..v)
        .step_by(chunk)
        .map(|c0| (c0, chunk.min(v - c0)))
        .collect();
    for &(c0, vc) in &chunks {
        let part = full.narrow(1, c0, vc).unwrap().contiguous().unwrap();
        head_cpu::forward_chunk(&part, c0, &targets, &mut states).unwrap();
    }
    let done = head_cpu::finish(&states);
    for (block, grid) in SHAPES {
        let mut state: Vec<f32> = (0..rows)
            .flat_map(|_| [f32::NEG_INFINITY, 0.0, 0.0, 0.0])
            .collect();
        for &(c0, vc) in &chunks {
            let part = values(&full.narrow(1, c0, vc).unwrap().contiguous().unwrap());
            let table = [
                address(&part),
                address(&targets),
                address_mut(&mut state),
                rows as u64,
                vc as u64,
                c0 as u64,
            ];
            launch("rlx_head_forward_chunk", &table, grid, block);
        }
        let mut out = vec![f32::NAN; rows * 3];
        launch(
            "rlx_head_finish",
            &[address(&state), address_mut(&mut out), rows as u64],
            grid,
            block,
        );
        let expected: Vec<f32> = done.iter().flat_map(|(a, b, c)| [*a, *b, *c]).collect();
        assert_close(&format!("head forward block {block}"), &out, &expected);

        let lse: Vec<f32> = done.iter().map(|d| d.1).collect();
        let entropy: Vec<f32> = done.iter().map(|d| d.2).collect();
        for &(c0, vc) in &chunks {
            let part = full.narrow(1, c0, vc).unwrap().contiguous().unwrap();
            let expected =
                head_cpu::backward_chunk(&part, c0, &targets, &lse, &entropy, &g1, &g2, &cpu)
                    .unwrap();
            let part = values(&part);
            let mut dz = vec![f32::NAN; rows * vc];
            let table = [
                address(&part),
                address(&targets),
                address(&lse),
                address(&entropy),
                address(&g1),
                address(&g2),
                address_mut(&mut dz),
                rows as u64,
                vc as u64,
                c0 as u64,
            ];
            launch("rlx_head_backward_chunk", &table, grid, block);
            assert_close(&format!("∂z chunk {c0}"), &dz, &values(&expected));
        }
    }
}

#[test]
fn gradient_columns_land_in_the_argument_layout_and_report_the_first_non_finite_element() {
    let (elements, width) = (50usize, 3usize);
    let f32_column = random(12, elements, 3.0);
    // A filtered run: 20 kept elements (every other one from 5), stored in f64.
    let map: Vec<u64> = (0..20).map(|i| 5 + 2 * i as u64).collect();
    let f64_column: Vec<f64> = random(13, map.len(), 3.0)
        .iter()
        .map(|v| *v as f64)
        .collect();
    for (block, grid) in SHAPES {
        let mut out = vec![0f32; elements * width];
        let mut first_bad = vec![u64::MAX; width];
        let bad = address_mut(&mut first_bad);
        let table = [
            address_mut(&mut out),
            address(&f32_column),
            0,
            bad,
            elements as u64,
            width as u64,
            0,
            0,
        ];
        launch("rlx_gradient_column_f32", &table, grid, block);
        let table = [
            address_mut(&mut out),
            address(&f64_column),
            address(&map),
            bad + 16,
            map.len() as u64,
            width as u64,
            2,
            1,
        ];
        launch("rlx_gradient_column_f64", &table, grid, block);
        let mut expected = vec![0f32; elements * width];
        for (e, v) in f32_column.iter().enumerate() {
            expected[e * width] = *v;
        }
        for (k, e) in map.iter().enumerate() {
            expected[*e as usize * width + 2] = f64_column[k] as f32;
        }
        assert_eq!(out, expected, "block {block}");
        assert_eq!(first_bad, vec![u64::MAX; width], "all values are finite");

        // Non-finite values: the smallest element index is reported, whichever thread saw it first.
        let mut broken = f64_column.clone();
        broken[3] = f64::INFINITY;
        broken[17] = f64::NAN;
        broken[9] = f64::NEG_INFINITY;
        let table = [
            address_mut(&mut out),
            address(&broken),
            address(&map),
            bad + 16,
            map.len() as u64,
            width as u64,
            2,
            1,
        ];
        launch("rlx_gradient_column_f64", &table, grid, block);
        assert_eq!(first_bad[2], map[3], "block {block}");
        assert_eq!(first_bad[0], u64::MAX);
    }
}

// ---------------------------------------------------------------------------------------------------
// NVRTC and ptxas.

#[test]
#[cfg_attr(
    not(rlx_nvrtc),
    ignore = "needs NVRTC and ptxas: run scripts/install-cuda-tools.sh"
)]
fn nvrtc_compiles_the_kernels_and_ptxas_assembles_them() {
    let nvrtc = Nvrtc::load(&rlx_tools::nvrtc_library());
    let work = scratch("ptx");
    for sm in ["80", "90"] {
        let (ptx, log) = nvrtc
            .compile(
                device_kernels::SOURCE,
                "device_kernels.cu",
                &format!("compute_{sm}"),
            )
            .unwrap_or_else(|log| panic!("compute_{sm}: {log}"));
        assert!(
            !log.contains("warning"),
            "compute_{sm}: NVRTC warnings:\n{log}"
        );
        for name in KERNELS {
            assert!(
                ptx.contains(&format!(".entry {name}(")),
                "no entry {name} for compute_{sm}"
            );
        }
        let file = work.join(format!("kernels-{sm}.ptx"));
        std::fs::write(&file, &ptx).unwrap();
        let output = Command::new(rlx_tools::ptxas())
            .arg(format!("-arch=sm_{sm}"))
            .arg(&file)
            .arg("-o")
            .arg(file.with_extension("cubin"))
            .output()
            .expect("ptxas runs");
        let messages = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success() && !messages.contains("error"),
            "ptxas sm_{sm}: {messages}"
        );
    }
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn every_kernel_has_a_host_launcher() {
    for name in KERNELS {
        let symbol = format!("rlx_host_{name}");
        // SAFETY: only looked up, not called.
        let found = unsafe { library().get::<HostLaunch>(symbol.as_bytes()) }.is_ok();
        assert!(found, "{symbol} missing");
    }
}
