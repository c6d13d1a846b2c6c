//! rlx runtime: the packed batch layout, reading rollout files, kernel execution.

pub mod arrays;
pub mod batch;
pub mod bench;
pub mod cuda;
pub mod geometry;
pub mod interp;
pub mod kernel;
pub mod nonfinite;
pub mod rollouts;
pub mod score;
pub mod synthetic;
