//! Why a batch does not fit a recipe.

use std::fmt;

/// Why a batch (its layout and input columns) does not fit a recipe's [`crate::Signature`]. Every
/// message starts with "malformed batch: ", as the runtime reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CoreError {
    /// The layout's offsets are inconsistent ([`crate::LayoutError`]'s message).
    Layout(String),
    /// A size of the batch does not fit a `usize`.
    Overflow,
}

impl fmt::Display for CoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("malformed batch: ")?;
        match self {
            CoreError::Layout(message) => f.write_str(message),
            CoreError::Overflow => f.write_str("its sizes overflow"),
        }
    }
}

impl std::error::Error for CoreError {}
