//! rlx core: the vocabulary that the compiler, the runtime, the signals and `.rlxc` artifacts share,
//! defined once. A value has an element type ([`Elem`]) and a level ([`Level`]: how finely it varies
//! over the batch) and at most one feature axis ([`Feature`]); the two make its [`Shape`].
//!
//! This crate depends on serde alone, so that every crate of the workspace (including rlx-signals,
//! which does not depend on the compiler) can use it.

mod elem;
mod feature;
mod level;

pub use elem::Elem;
pub use feature::{Feature, Shape};
pub use level::Level;
