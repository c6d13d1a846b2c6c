//! Shared by the root package's integration tests that train (`rlx run`).

/// `rlx run` settings for a test run of about a second: a one-step warm start, a tiny batch, no
/// held-out evaluation between steps, the JIT backend (add `--steps N`).
pub const QUICK_RUN: [&str; 10] = [
    "--set",
    "sft.steps=1",
    "--set",
    "task.eval_questions=4",
    "--set",
    "train.prompts_per_step=2",
    "--set",
    "train.eval_every=0",
    "--set",
    "backend=jit",
];
