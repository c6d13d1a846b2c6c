//! rlx runtime: the packed batch layout, reading rollout files, kernel execution.
//!
//! # The facade
//!
//! The engine's modules are private; what other crates use is re-exported here:
//!
//! - **Batches**: [`Batch`] (a packed batch of f64 inputs) and its [`Layout`] (offsets of groups,
//!   responses, tokens and criteria); [`Geometry`], the index maps between a layout's levels.
//! - **Running a recipe**: the [`Executor`], the one driver of every [`Backend`] (a sealed trait):
//!   it validates a batch against the recipe's signature before anything runs, runs the two phases of
//!   `keep`, a plan's host passes and combines, and checks the outputs. Its backends are the f64
//!   reference interpreter ([`Interpreter`], or [`evaluate`] / [`evaluate_showing`]), the JIT
//!   [`Kernel`] (cranelift code for a kernel plan, `Options`/`Precision` choosing its storage and
//!   accumulation; inputs as [`Column`]s of a [`PackedBatch`] or borrowed [`ColumnRef`]s, outputs a
//!   [`PackedOutcome`]) and the CUDA kernels ([`DeviceKernel`] on a [`Device`]; [`GpuKernel`] on an
//!   NVIDIA GPU with the `cuda` feature, [`probe_gpu`] to check one). Every run takes a [`Context`]
//!   (`step`, `progress`) and gives an [`Outcome`] or an [`EvalError`]. A non-finite output is
//!   [`EvalError::NonFinite`]: the executor's finiteness check has the f64 interpreter name the node
//!   that made it, for which batch element ([`NonFinite`], its [`Culprit`] and
//!   [`NonFinite::diagnostic`] on the recipe expression).
//! - **Tools**, as modules: [`rollouts`] (the JSONL rollout reader), [`arrays`] (batches from packed or
//!   padded arrays, the Python binding's), [`score`] (`rlx score`), [`bench`] (`rlx bench`, the
//!   counting allocator), [`synthetic`] (random batches for tests and benchmarks).

pub mod arrays;
mod batch;
pub mod bench;
mod cuda;
mod executor;
mod geometry;
mod interp;
mod kernel;
mod nonfinite;
pub mod rollouts;
pub mod score;
pub mod synthetic;

pub use batch::{
    check_group_sizes, max_group, Batch, Layout, LayoutError, DEFAULT_MAX_GROUP, MAX_GROUP_VAR,
};
#[cfg(feature = "cuda")]
pub use cuda::CudaDevice;
pub use cuda::{
    probe as probe_gpu, Device, DeviceBatch, DeviceGradient, DeviceKernel, GpuKernel,
    WithDeviceGradients,
};
pub use executor::{Backend, Executor};
pub use geometry::Geometry;
pub use interp::{evaluate, evaluate_showing, Context, EvalError, Interpreter, Outcome, Shown};
pub use kernel::{Column, ColumnRef, Kernel, Options, PackedBatch, PackedOutcome, Precision};
pub use nonfinite::{Culprit, Element, NonFinite, Operand, Output as NonFiniteOutput};
