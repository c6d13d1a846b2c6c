//! Probes for torch, verl and NVRTC (tests/export.rs, tests/cuda.rs) and, with the `cuda` feature, a
//! GPU (tests/cuda.rs): sets the cfgs `rlx_torch`, `rlx_verl`, `rlx_nvrtc` and `rlx_gpu` where they
//! are there (rlx-tools, tools/src/lib.rs).

use rlx_tools::Gate;

fn main() {
    rlx_tools::emit(&[Gate::Torch, Gate::Verl, Gate::Nvrtc, Gate::Gpu]);
}
