//! rlx core: the vocabulary that the compiler, the runtime, the signals and `.rlxc` artifacts share,
//! defined once. A value has an element type ([`Elem`]) and a level ([`Level`]: how finely it varies
//! over the batch) and at most one feature axis ([`Feature`]); the two make its [`Shape`].
//! A batch is packed by a [`Layout`], over which [`Sizes`] counts every shape's elements.
//!
//! This crate depends on serde alone, so that every crate of the workspace (including rlx-signals,
//! which does not depend on the compiler) can use it.

mod elem;
mod error;
mod feature;
mod layout;
mod level;

pub use elem::Elem;
pub use error::CoreError;
pub use feature::{Feature, Shape};
pub use layout::{Layout, LayoutError, Sizes};
pub use level::Level;
