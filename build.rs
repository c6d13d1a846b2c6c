//! Probes for torch, verl and NVRTC (tests/export.rs, tests/cuda.rs) and, with the `cuda` feature, a
//! GPU (tests/cuda.rs): sets the cfgs `rlx_torch`, `rlx_verl`, `rlx_nvrtc` and `rlx_gpu` where they
//! are there (rlx-tools, tools/src/lib.rs). With the `cuda` feature, the binaries' run-time library
//! path gets the toolkit of scripts/install-cuda-toolchain.sh (`<repo>/.cuda/lib`: cuBLAS, cuRAND and
//! NVRTC 13, which cudarc loads when a CUDA device is asked for), after `LD_LIBRARY_PATH`.

use rlx_tools::Gate;

fn main() {
    rlx_tools::emit(&[Gate::Torch, Gate::Verl, Gate::Nvrtc, Gate::Gpu]);
    if std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        let lib = concat!(env!("CARGO_MANIFEST_DIR"), "/.cuda/lib");
        // Watched even while missing, as in trainer/build.rs.
        println!("cargo:rerun-if-changed={lib}");
        if std::path::Path::new(lib).is_dir() {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
        }
    }
}
