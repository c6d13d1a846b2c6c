//! The rlx trainer (`rlx run`): a small Llama-style policy in candle, a batched sampler with a KV cache,
//! the built-in arithmetic task and text tasks on real prompts (SmolLM2 with signals), the compiled recipe as
//! a candle custom op, and the training loop.

pub mod assets;
pub mod attention;
pub mod bench_model;
pub mod chat_template;
pub mod checkpoint;
pub mod cli;
pub mod compare;
pub mod config;
pub mod decompose;
pub mod device_kernels;
pub mod embed;
pub mod error;
pub mod export;
pub mod fused;
pub mod gguf;
pub mod head;
pub mod head_cpu;
pub mod hf;
pub mod judge;
pub mod kinds;
pub mod memory;
pub mod model;
pub mod op;
pub mod optim;
pub mod plot;
pub mod progress;
pub mod rng;
pub mod run_dir;
pub mod sample;
pub mod task;
pub mod tensorboard;
pub mod text_task;
pub mod tokenizer;
pub mod train;
pub mod trainer;

pub use config::Config;
pub use error::TrainError;
pub use trainer::Trainer;
