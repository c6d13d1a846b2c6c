//! The rlx trainer (`rlx run`): a small Llama-style policy in candle, a batched sampler with a KV cache,
//! the built-in arithmetic task, the compiled recipe as a candle custom op, and the training loop.

pub mod cli;
pub mod config;
pub mod model;
pub mod op;
pub mod rng;
pub mod sample;
pub mod task;
pub mod train;

pub use config::Config;
