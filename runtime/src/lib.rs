//! rlx runtime: the packed batch layout, reading rollout files, kernel execution.

pub mod arrays;
pub mod batch;
pub mod bench;
pub mod cuda;
mod executor;
pub mod geometry;
pub mod interp;
pub mod kernel;
pub mod rollouts;
pub mod score;
pub mod synthetic;

pub use executor::{Backend, Executor};
pub use interp::Interpreter;
