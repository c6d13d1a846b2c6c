//! Element types.

use std::cmp::Ordering;
use std::fmt;

use serde::{Deserialize, Serialize};

/// The element type of a value. `bool → i32 → f32` widen implicitly, and the order (`<`) is that
/// widening: `a <= b` when a value of `a` may stand where `b` is expected.
///
/// Serialized as `"F32"`, `"I32"`, `"Bool"` (the `.rlxc` artifact's and `--emit ir-json`'s form).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Elem {
    F32,
    I32,
    Bool,
}

impl Elem {
    /// The type as a recipe writes it (`f32`, `i32`, `bool`).
    pub fn name(self) -> &'static str {
        match self {
            Elem::F32 => "f32",
            Elem::I32 => "i32",
            Elem::Bool => "bool",
        }
    }

    /// Position in the widening order `bool → i32 → f32`.
    fn rank(self) -> u8 {
        match self {
            Elem::Bool => 0,
            Elem::I32 => 1,
            Elem::F32 => 2,
        }
    }

    /// Whether a value of `self` may stand where `target` is expected (equal, or widened).
    pub fn widens_to(self, target: Elem) -> bool {
        self <= target
    }

    /// Whether `x` is a value of this type: for `bool` 0 or 1, for `i32` a whole number within
    /// i32's range, for `f32` any number but NaN (the infinities are values of it; readers of batch
    /// data require finite values on top of this).
    pub fn admits(self, x: f64) -> bool {
        match self {
            Elem::Bool => x == 0.0 || x == 1.0,
            Elem::I32 => {
                x.fract() == 0.0 && (f64::from(i32::MIN)..=f64::from(i32::MAX)).contains(&x)
            }
            Elem::F32 => !x.is_nan(),
        }
    }
}

impl PartialOrd for Elem {
    fn partial_cmp(&self, other: &Elem) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Elem {
    fn cmp(&self, other: &Elem) -> Ordering {
        self.rank().cmp(&other.rank())
    }
}

impl fmt::Display for Elem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bool_widens_to_i32_widens_to_f32_and_never_back() {
        use Elem::*;
        assert!(Bool.widens_to(I32) && I32.widens_to(F32) && Bool.widens_to(F32));
        assert!(!F32.widens_to(I32) && !I32.widens_to(Bool) && !F32.widens_to(Bool));
        assert!([Bool, I32, F32].iter().all(|e| e.widens_to(*e)));
        assert_eq!(Bool.max(F32), F32);
    }

    #[test]
    fn admits_the_values_of_each_type() {
        assert!(Elem::Bool.admits(0.0) && Elem::Bool.admits(1.0) && !Elem::Bool.admits(0.5));
        assert!(!Elem::Bool.admits(2.0) && !Elem::Bool.admits(f64::NAN));
        assert!(Elem::I32.admits(-3.0) && Elem::I32.admits(f64::from(i32::MIN)));
        assert!(Elem::I32.admits(f64::from(i32::MAX)) && !Elem::I32.admits(2147483648.0));
        assert!(!Elem::I32.admits(1.5) && !Elem::I32.admits(f64::INFINITY));
        assert!(Elem::F32.admits(f64::INFINITY) && Elem::F32.admits(-0.25));
        assert!(!Elem::F32.admits(f64::NAN));
    }

    #[test]
    fn names_and_serde_forms() {
        assert_eq!(Elem::Bool.to_string(), "bool");
        assert_eq!(Elem::I32.name(), "i32");
        for (elem, json) in [
            (Elem::F32, "\"F32\""),
            (Elem::I32, "\"I32\""),
            (Elem::Bool, "\"Bool\""),
        ] {
            assert_eq!(serde_json::to_string(&elem).expect("serializes"), json);
            assert_eq!(serde_json::from_str::<Elem>(json).expect("parses"), elem);
        }
    }
}
