//! The pointer-table ABI of every generated function, JIT and CUDA alike: one table, read by the
//! compiler's backends (which slot to load a layout array or buffer from) and by the runtime's
//! executors (what to put in each slot).
//!
//! A function is called as `(table, g_begin, g_end)`. `table` holds, in this order, the layout arrays
//! and scalars of `Fixed::ALL` (slot = `Fixed::slot`), then the phase's buffers by id
//! (`buffer_slot`). A pass whose nest starts with groups visits groups `g_begin..g_end` only.

use super::plan::BufferId;

/// A fixed slot of the pointer table: an array every pass may read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fixed {
    /// `u64[G + 1]`: `Layout::group_offsets` (where group g's responses start).
    GroupOffsets,
    /// `u64[R + 1]`: `Layout::token_offsets` (where response r's tokens start).
    TokenOffsets,
    /// `u64[G + 1]`: `Layout::crit_offsets` (where group g's criteria start).
    CritOffsets,
    /// `u64[G + 1]`: where group g's `[resp, crit]` elements start (Σ over earlier groups of n·C).
    RespCritBase,
    /// `u64[G + 1]`: where group g's pairs start (Σ over earlier groups of n·(n − 1)).
    PairOffsets,
    /// `u64[G + 1]`: where group g's `[pair, crit]` elements start.
    PairCritBase,
    /// `f64[2]`: the scalars of `Scalar` (`step`, `progress`).
    Scalars,
    /// `u64[1]`: the lengths of the batch's free axes (`Size`: `dim`).
    Sizes,
}

impl Fixed {
    /// Every fixed slot, in table order.
    pub const ALL: [Fixed; 8] = [
        Fixed::GroupOffsets,
        Fixed::TokenOffsets,
        Fixed::CritOffsets,
        Fixed::RespCritBase,
        Fixed::PairOffsets,
        Fixed::PairCritBase,
        Fixed::Scalars,
        Fixed::Sizes,
    ];

    /// The slot's position in the table.
    pub const fn slot(self) -> usize {
        self as usize
    }

    /// The name generated C gives the array (`rlx_compiler::backend::cuda`).
    pub fn c_name(self) -> &'static str {
        match self {
            Fixed::GroupOffsets => "go",
            Fixed::TokenOffsets => "to",
            Fixed::CritOffsets => "co",
            Fixed::RespCritBase => "rcb_t",
            Fixed::PairOffsets => "po",
            Fixed::PairCritBase => "pcb_t",
            Fixed::Scalars => "sc",
            Fixed::Sizes => "sizes",
        }
    }

    /// Whether the array holds `f64` (the scalars) rather than `u64` offsets and sizes.
    pub fn is_float(self) -> bool {
        self == Fixed::Scalars
    }
}

/// An element of the `Fixed::Scalars` array.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scalar {
    Step,
    Progress,
}

impl Scalar {
    /// The number of scalars.
    pub const COUNT: usize = 2;

    pub const fn index(self) -> usize {
        self as usize
    }
}

/// An element of the `Fixed::Sizes` array.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Size {
    /// The length of the `dim` feature axis.
    Dim,
}

impl Size {
    /// The number of sizes.
    pub const COUNT: usize = 1;

    pub const fn index(self) -> usize {
        self as usize
    }
}

/// The slot of the first buffer.
pub const FIRST_BUFFER: usize = Fixed::ALL.len();

/// The slot of buffer `buffer`.
pub fn buffer_slot(buffer: BufferId) -> usize {
    FIRST_BUFFER + buffer as usize
}

/// A table in ABI order: `fixed` of every fixed slot, then `buffers` (the phase's buffers by id).
pub fn table<T>(fixed: impl FnMut(Fixed) -> T, buffers: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut table: Vec<T> = Fixed::ALL.into_iter().map(fixed).collect();
    table.extend(buffers);
    table
}

/// The scalars array (`Fixed::Scalars`) of a call.
pub fn scalars(step: f64, progress: f64) -> [f64; Scalar::COUNT] {
    let mut out = [0.0; Scalar::COUNT];
    out[Scalar::Step.index()] = step;
    out[Scalar::Progress.index()] = progress;
    out
}

/// The sizes array (`Fixed::Sizes`) of a call.
pub fn sizes(dim: u64) -> [u64; Size::COUNT] {
    let mut out = [0; Size::COUNT];
    out[Size::Dim.index()] = dim;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_slots_are_numbered_in_table_order() {
        for (position, fixed) in Fixed::ALL.into_iter().enumerate() {
            assert_eq!(fixed.slot(), position);
        }
        assert_eq!(FIRST_BUFFER, 8);
        assert_eq!(buffer_slot(3), 11);
        let t = table(|f| f.slot() * 10, [7, 9]);
        assert_eq!(t, vec![0, 10, 20, 30, 40, 50, 60, 70, 7, 9]);
        assert_eq!(scalars(3.0, 0.5), [3.0, 0.5]);
        assert_eq!(sizes(4), [4]);
    }
}
