//! Stages `fuse` and `codegen`: the IR graph becomes a kernel plan (`plan.rs`: passes over the packed
//! layout, which values live in registers and which in buffers), the plan a backend-neutral loop IR
//! (`loops.rs`, its index expressions from `layout.rs`), and each loop function of that IR one native
//! function compiled with cranelift (`jit.rs`) or one CUDA C kernel (`cuda.rs`), both called through the
//! pointer table of `abi.rs`. Execution (buffers, threads, keep filters)
//! lives in the runtime (`rlx_runtime::kernel`). docs/kernels.md describes the design.

pub mod abi;
pub mod cuda;
pub mod jit;
pub mod layout;
pub mod loops;
pub mod plan;

use serde::Serialize;

/// A floating-point width.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    F32,
    #[default]
    F64,
}

impl Precision {
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::F64 => "f64",
        }
    }

    pub fn bytes(self) -> usize {
        match self {
            Precision::F32 => 4,
            Precision::F64 => 8,
        }
    }
}

/// Compile options of a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
pub struct Options {
    /// Arithmetic in registers, reductions and the kernel's own buffers (f64 by default; f32 is faster
    /// and agrees with the interpreter less closely, see docs/kernels.md).
    pub accumulate: Precision,
    /// Storage of `f32` inputs and of token-level outputs (gradients): f32 by default, as a trainer
    /// holds them; f64 keeps the batch's values exactly (`rlx score`). `i32`/`bool` inputs are always
    /// stored as f64, so every integer the interpreter accepts is represented exactly.
    pub storage: Precision,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            accumulate: Precision::F64,
            storage: Precision::F32,
        }
    }
}
