//! rlx core: the vocabulary that the compiler, the runtime, the signals and `.rlxc` artifacts share,
//! defined once. A value has an element type ([`Elem`]) and a level ([`Level`]: how finely it varies
//! over the batch) and at most one feature axis ([`Feature`]); the two make its [`Shape`].
//! A batch is packed by a [`Layout`], over which [`Sizes`] counts every shape's elements.
//! A recipe's [`Signature`] (its inputs, params, rubrics and outputs) is what a batch is validated
//! against ([`Signature::validate`]), by every reader of batches.
//!
//! This crate depends on serde alone, so that every crate of the workspace (including rlx-signals,
//! which does not depend on the compiler) can use it.

mod elem;
mod error;
mod feature;
pub mod json_float;
mod layout;
mod level;
mod signature;

pub use elem::Elem;
pub use error::CoreError;
pub use feature::{Feature, Shape};
pub use layout::{Layout, LayoutError, Sizes};
pub use level::{KeepLevel, Level};
pub use signature::{HasSignature, InputInfo, OutputInfo, ParamInfo, RubricInfo, Signature};
