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

/// Why no kernel came out of a graph: no plan for it ([`plan::PlanError`]: the caller falls back to
/// the interpreter), a broken invariant of the loop IR or of a code generator (a bug, or a malformed
/// artifact), or cranelift refusing the machine, a setting, a pass or the link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CodegenError {
    Plan(plan::PlanError),
    /// What broke (the message starts with `internal:` where the code said so).
    Internal(String),
    /// cranelift's own error, with what was being done.
    Cranelift(String),
    /// A plan beyond what this code generator expresses (too many values kept in registers, say):
    /// the kernel runs on another backend.
    Unsupported(String),
}

impl std::fmt::Display for CodegenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CodegenError::Plan(e) => write!(f, "{e}"),
            CodegenError::Internal(what)
            | CodegenError::Cranelift(what)
            | CodegenError::Unsupported(what) => f.write_str(what),
        }
    }
}

impl std::error::Error for CodegenError {}

impl From<plan::PlanError> for CodegenError {
    fn from(e: plan::PlanError) -> Self {
        CodegenError::Plan(e)
    }
}

/// The code generators' messages of broken invariants.
impl From<String> for CodegenError {
    fn from(what: String) -> Self {
        CodegenError::Internal(what)
    }
}

impl From<&str> for CodegenError {
    fn from(what: &str) -> Self {
        CodegenError::Internal(what.to_string())
    }
}

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
    /// Element-wise arithmetic in registers and the kernel's own buffers of values (f64 by default;
    /// f32 is faster, as a trainer's float32 tensors compute, and agrees with the interpreter less
    /// closely, see docs/kernels.md). Reductions accumulate in f64 either way (`plan::SUMS`); the
    /// name is kept from when they did not.
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
