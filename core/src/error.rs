//! Why a batch does not fit a recipe.

use std::fmt;

/// Why a batch (its layout and input columns) does not fit a recipe's [`crate::Signature`] (every
/// such message starts with "malformed batch: ", as the runtime has always reported it), or why a
/// signature's declarations do not fit together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CoreError {
    /// The layout's offsets are inconsistent ([`crate::LayoutError`]'s message).
    Layout(String),
    /// A size of the batch does not fit a `usize`.
    Overflow,
    /// The batch has `given` input columns for a recipe with `expected` inputs.
    InputCount { given: usize, expected: usize },
    /// Input `input` (of type `ty`, as declared) has `given` values where its shape has `expected`
    /// elements.
    InputLength {
        input: String,
        ty: String,
        given: usize,
        expected: usize,
    },
    /// The signature's declarations disagree with each other ([`crate::Signature::check`]).
    Declaration(String),
}

impl fmt::Display for CoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CoreError::Layout(message) => write!(f, "malformed batch: {message}"),
            CoreError::Overflow => f.write_str("malformed batch: its sizes overflow"),
            CoreError::InputCount { given, expected } => write!(
                f,
                "malformed batch: {given} input vectors for a recipe with {expected} inputs"
            ),
            CoreError::InputLength {
                input,
                ty,
                given,
                expected,
            } => write!(
                f,
                "malformed batch: input `{input}` has {given} values, its shape {ty} needs {expected}"
            ),
            CoreError::Declaration(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for CoreError {}
