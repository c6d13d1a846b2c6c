//! rlx signals: the functions that turn (prompt, completion, per-prompt data) into the values that
//! fill a recipe's inputs by name during `rlx run`.
//!
//! A config declares signals as `[signals.NAME]` tables ([`spec::SignalSpec`]); the signal `NAME`
//! fills the recipe input `NAME`. [`Registry::new`] checks each signal's output type against the
//! input's declared type ([`InputDecl`]); [`Registry::compute`] evaluates every signal on a batch of
//! completions grouped by prompt and returns flat values in the runtime's element order. Formulas that
//! combine signals (rubric scores, HealthBench's points score, diversity) live in the recipe and the
//! standard library, never here. Semantics of every kind: docs/signals.md.

pub mod answer;
pub mod data;
pub mod dataset;
pub mod ifeval;
pub mod judge;
pub mod partition;
pub mod program;
pub mod registry;
pub mod spec;
pub mod text;
pub mod types;

pub use data::{Criterion, IfevalData, Message, Prompt};
pub use judge::{Embed, YesNo};
pub use registry::{Completion, Computed, Filled, Group, Models, Registry, SignalError};
pub use spec::SignalSpec;
pub use types::{Elem, Feature, InputDecl, Level, OutType};
