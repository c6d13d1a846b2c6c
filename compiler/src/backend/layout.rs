//! Where a value lives in the packed layout: the integer index expressions of the loop IR
//! (`super::loops`). Every backend lowers these expressions instead of encoding the layout itself:
//! the element of a shape at the current loop position (`Scope::index`), the per-group coordinates a
//! loop binds (`Scope::binds`), the pair index, `shift`'s clamped source, and where a reduction
//! accumulates (`Scope::target_index`).
//!
//! # The packed layout
//! Groups hold responses `gs..gs + n` (`abi::Fixed::GroupOffsets`), responses hold tokens `ts..te`
//! (`TokenOffsets`), groups hold criteria `cs..cs + cn` (`CritOffsets`). A value with a feature axis of
//! width W at element e is at `e·W + f`, except the criterion axis, whose width differs by group: a
//! group's `[crit]` elements start at `cs`, its `[resp, crit]` elements at `rcb` (`RespCritBase`) row
//! by response, its `[pair, crit]` elements at `pcb` (`PairCritBase`) row by pair. Response i of a
//! group of n has the n − 1 pairs (i, j ≠ i) starting at `pb + i·(n − 1)` (`PairOffsets`).

use super::abi::{Fixed, Size};
use super::plan::{LoopKind, Reduction};
use super::CodegenError;
use crate::ir::{Feature, Level, Shape};

/// A coordinate (a signed 64-bit integer) bound by the function's parameters or by a loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Coord {
    /// The call's group range (parameters).
    GBegin,
    GEnd,
    /// The `dim` axis length (`abi::Size::Dim`).
    Dim,
    /// The group, its first response and size, first criterion and count, and the bases of its
    /// `[resp, crit]` elements, pairs and `[pair, crit]` elements.
    G,
    Gs,
    N,
    Cs,
    Cn,
    Rcb,
    Pb,
    Pcb,
    /// The response, its position in the group, its first and end token.
    R,
    Li,
    Ts,
    Te,
    /// The token.
    T,
    /// The other response of a pair, its position in the group, and the pair.
    J,
    Lj,
    P,
    /// The feature element.
    F,
}

impl Coord {
    /// The name the printer and the generated C use.
    pub fn name(self) -> &'static str {
        match self {
            Coord::GBegin => "g_begin",
            Coord::GEnd => "g_end",
            Coord::Dim => "dim",
            Coord::G => "g",
            Coord::Gs => "gs",
            Coord::N => "n",
            Coord::Cs => "cs",
            Coord::Cn => "cn",
            Coord::Rcb => "rcb",
            Coord::Pb => "pb",
            Coord::Pcb => "pcb",
            Coord::R => "r",
            Coord::Li => "li",
            Coord::Ts => "ts",
            Coord::Te => "te",
            Coord::T => "t",
            Coord::J => "j",
            Coord::Lj => "lj",
            Coord::P => "p",
            Coord::F => "f",
        }
    }
}

/// An integer index expression (signed 64-bit arithmetic; every value a loop visits is ≥ 0).
#[derive(Clone, Debug, PartialEq)]
pub enum Index {
    Const(i64),
    Coord(Coord),
    /// A sum of terms, left to right.
    Sum(Vec<Index>),
    Product(Box<Index>, Box<Index>),
    Diff(Box<Index>, Box<Index>),
    /// Unsigned division and remainder (of a feature element by a row width).
    Quot(Box<Index>, Box<Index>),
    Rem(Box<Index>, Box<Index>),
    /// `x + k`.
    Offset(Box<Index>, i64),
    /// `cond ? yes : no`.
    Select(Box<Cond>, Box<Index>, Box<Index>),
    /// Element `at` of a `u64` array of the ABI's fixed slots (`abi::Fixed`).
    Table(Fixed, Box<Index>),
    /// An element of the `abi::Fixed::Sizes` array.
    Size(Size),
}

/// A condition on indices.
#[derive(Clone, Debug, PartialEq)]
pub enum Cond {
    /// `start <= x && x < end` (signed: `x` may be negative).
    Within { x: Index, start: Index, end: Index },
    /// `x == k`.
    Is(Index, i64),
    /// `a > b` (unsigned).
    Greater(Index, Index),
}

impl Index {
    fn product(a: Index, b: Index) -> Index {
        Index::Product(Box::new(a), Box::new(b))
    }

    fn diff(a: Index, b: Index) -> Index {
        Index::Diff(Box::new(a), Box::new(b))
    }

    /// Every coordinate the expression reads.
    pub fn coords(&self, out: &mut Vec<Coord>) {
        match self {
            Index::Const(_) | Index::Size(_) => {}
            Index::Coord(c) => out.push(*c),
            Index::Sum(terms) => terms.iter().for_each(|t| t.coords(out)),
            Index::Product(a, b) | Index::Diff(a, b) | Index::Quot(a, b) | Index::Rem(a, b) => {
                a.coords(out);
                b.coords(out);
            }
            Index::Offset(x, _) | Index::Table(_, x) => x.coords(out),
            Index::Select(cond, a, b) => {
                cond.coords(out);
                a.coords(out);
                b.coords(out);
            }
        }
    }
}

impl Cond {
    pub fn coords(&self, out: &mut Vec<Coord>) {
        match self {
            Cond::Within { x, start, end } => {
                x.coords(out);
                start.coords(out);
                end.coords(out);
            }
            Cond::Is(x, _) => x.coords(out),
            Cond::Greater(a, b) => {
                a.coords(out);
                b.coords(out);
            }
        }
    }
}

fn unbound(coord: Coord) -> String {
    format!(
        "internal: coordinate {} is not bound in this pass",
        coord.name()
    )
}

/// The coordinates bound at a point of a pass's loop nest.
#[derive(Clone, Debug, Default)]
pub struct Scope {
    bound: Vec<Coord>,
}

impl Scope {
    /// The function's entry: the group range and the axis sizes.
    pub fn entry() -> Scope {
        Scope {
            bound: vec![Coord::GBegin, Coord::GEnd, Coord::Dim],
        }
    }

    /// The coordinates bound at the function's entry, from the table.
    pub fn entry_binds() -> Vec<(Coord, Index)> {
        vec![(Coord::Dim, Index::Size(Size::Dim))]
    }

    pub fn is_bound(&self, coord: Coord) -> bool {
        self.bound.contains(&coord)
    }

    pub fn bind(&mut self, coord: Coord) {
        if !self.is_bound(coord) {
            self.bound.push(coord);
        }
    }

    /// A bound coordinate.
    pub fn coord(&self, coord: Coord) -> Result<Index, CodegenError> {
        if self.is_bound(coord) {
            Ok(Index::Coord(coord))
        } else {
            Err(unbound(coord).into())
        }
    }

    /// The length of a feature axis at the current element (a criterion axis outside a group is
    /// empty).
    pub fn width(&self, feature: &Feature) -> Result<Index, CodegenError> {
        Ok(match feature {
            Feature::Crit => {
                if self.is_bound(Coord::Cn) {
                    Index::Coord(Coord::Cn)
                } else {
                    Index::Const(0)
                }
            }
            Feature::Dim => self.coord(Coord::Dim)?,
            Feature::Rubric { len, .. } => Index::Const(i64::from(*len)),
            Feature::Matrix { rows, cols } => Index::product(self.width(rows)?, self.width(cols)?),
        })
    }

    /// At matrix element f = a·cols + b of the current feature loop: its row a (`rows`) or column b.
    pub fn matrix_coordinate(
        &self,
        matrix: Option<&Feature>,
        rows: bool,
    ) -> Result<Index, CodegenError> {
        let Some(Feature::Matrix { cols, .. }) = matrix else {
            return Err("internal: a matrix operation on a value without a matrix axis".into());
        };
        let f = Box::new(self.coord(Coord::F)?);
        let width = Box::new(self.width(cols)?);
        Ok(if rows {
            Index::Quot(f, width)
        } else {
            Index::Rem(f, width)
        })
    }

    /// The element of `shape` above the current point: at response j instead of i with `other`, at
    /// feature element `feature` instead of the loop's.
    pub fn index(
        &self,
        shape: &Shape,
        other: bool,
        feature: Option<Index>,
    ) -> Result<Index, CodegenError> {
        let f = || match &feature {
            Some(f) => Ok(f.clone()),
            None => self.coord(Coord::F),
        };
        let (r, li) = if other {
            (Coord::J, Coord::Lj)
        } else {
            (Coord::R, Coord::Li)
        };
        // Row `row` of a feature axis of `width`, at the feature element.
        let row = |row: Index, width: Index| -> Result<Index, CodegenError> {
            Ok(Index::Sum(vec![Index::product(row, width), f()?]))
        };
        Ok(match (shape.level, &shape.feature) {
            (Level::Batch, None) => Index::Const(0),
            (Level::Batch, Some(_)) => f()?,
            (Level::Group, None) => self.coord(Coord::G)?,
            (Level::Group, Some(Feature::Crit)) => Index::Sum(vec![self.coord(Coord::Cs)?, f()?]),
            (Level::Group, Some(feature)) => row(self.coord(Coord::G)?, self.width(feature)?)?,
            (Level::Resp, None) => self.coord(r)?,
            (Level::Resp, Some(Feature::Crit)) => Index::Sum(vec![
                self.coord(Coord::Rcb)?,
                Index::product(self.coord(li)?, self.coord(Coord::Cn)?),
                f()?,
            ]),
            (Level::Resp, Some(feature)) => row(self.coord(r)?, self.width(feature)?)?,
            (Level::Tok, None) => self.coord(Coord::T)?,
            (Level::Pair, None) => self.coord(Coord::P)?,
            (Level::Pair, Some(Feature::Crit)) => Index::Sum(vec![
                self.coord(Coord::Pcb)?,
                Index::product(
                    Index::diff(self.coord(Coord::P)?, self.coord(Coord::Pb)?),
                    self.coord(Coord::Cn)?,
                ),
                f()?,
            ]),
            (Level::Pair, Some(feature)) => row(self.coord(Coord::P)?, self.width(feature)?)?,
            (Level::Tok, Some(_)) => return Err("internal: token values have no feature".into()),
        })
    }

    /// The element a reduction of `from` into `to` accumulates into: group g's partial (`partial`,
    /// a batch-level target), the other response of a pair (`sum_by_other`), the column or row of a
    /// matrix element (contractions), or the target's element above the current point.
    pub fn target_index(
        &self,
        (from, to): (&Shape, &Shape),
        partial: bool,
        op: Reduction,
    ) -> Result<Index, CodegenError> {
        if matches!(op, Reduction::ContractRows | Reduction::ContractCols) {
            // Matrix element (a, b) adds into element b (over the rows) or a (over the columns).
            let k = self.matrix_coordinate(from.feature.as_ref(), op == Reduction::ContractCols)?;
            return self.index(to, false, Some(k));
        }
        if partial {
            let g = self.coord(Coord::G)?;
            return match &to.feature {
                None => Ok(g),
                Some(feature) => Ok(Index::Sum(vec![
                    Index::product(g, self.width(feature)?),
                    self.coord(Coord::F)?,
                ])),
            };
        }
        self.index(to, op == Reduction::SumByOther, None)
    }

    /// `shift`'s source token `t + offset` and whether it lies inside the response.
    pub fn shift(&self, offset: i32) -> Result<(Index, Cond), CodegenError> {
        let source = Index::Offset(Box::new(self.coord(Coord::T)?), i64::from(offset));
        let inside = Cond::Within {
            x: source.clone(),
            start: self.coord(Coord::Ts)?,
            end: self.coord(Coord::Te)?,
        };
        Ok((source, inside))
    }

    /// The token a `shift` reads: its source clamped into the response (to `t` itself), so the load
    /// is in bounds whether or not the source is.
    pub fn shift_clamped(&self, offset: i32) -> Result<Index, CodegenError> {
        let (source, inside) = self.shift(offset)?;
        Ok(Index::Select(
            Box::new(inside),
            Box::new(source),
            Box::new(self.coord(Coord::T)?),
        ))
    }

    /// The loop `kind` opens here: its counter, range, the counter value it skips, and the
    /// coordinates its body binds from the counter (in order; each may use the earlier ones).
    pub fn head(&self, kind: &LoopKind) -> Result<Head, CodegenError> {
        let c = |coord| self.coord(coord);
        let table = |fixed, at: Index| Index::Table(fixed, Box::new(at));
        let g = Index::Coord(Coord::G);
        let next = Index::Offset(Box::new(g.clone()), 1);
        Ok(match kind {
            LoopKind::Group => Head {
                counter: Coord::G,
                start: c(Coord::GBegin)?,
                end: c(Coord::GEnd)?,
                skip: None,
                binds: vec![
                    (Coord::Gs, table(Fixed::GroupOffsets, g.clone())),
                    (
                        Coord::N,
                        Index::diff(
                            table(Fixed::GroupOffsets, next.clone()),
                            Index::Coord(Coord::Gs),
                        ),
                    ),
                    (Coord::Cs, table(Fixed::CritOffsets, g.clone())),
                    (
                        Coord::Cn,
                        Index::diff(table(Fixed::CritOffsets, next), Index::Coord(Coord::Cs)),
                    ),
                    (Coord::Rcb, table(Fixed::RespCritBase, g.clone())),
                    (Coord::Pb, table(Fixed::PairOffsets, g.clone())),
                    (Coord::Pcb, table(Fixed::PairCritBase, g)),
                ],
            },
            LoopKind::Resp => {
                let r = Index::Coord(Coord::R);
                Head {
                    counter: Coord::R,
                    start: c(Coord::Gs)?,
                    end: Index::Sum(vec![c(Coord::Gs)?, c(Coord::N)?]),
                    skip: None,
                    binds: vec![
                        (Coord::Li, Index::diff(r.clone(), c(Coord::Gs)?)),
                        (Coord::Ts, table(Fixed::TokenOffsets, r.clone())),
                        (
                            Coord::Te,
                            table(Fixed::TokenOffsets, Index::Offset(Box::new(r), 1)),
                        ),
                    ],
                }
            }
            LoopKind::Tok => Head {
                counter: Coord::T,
                start: c(Coord::Ts)?,
                end: c(Coord::Te)?,
                skip: None,
                binds: vec![],
            },
            LoopKind::Pair => {
                let mut inner = self.clone();
                inner.bind(Coord::J);
                inner.bind(Coord::Lj);
                Head {
                    counter: Coord::J,
                    start: c(Coord::Gs)?,
                    end: Index::Sum(vec![c(Coord::Gs)?, c(Coord::N)?]),
                    skip: Some(c(Coord::R)?),
                    binds: vec![
                        (
                            Coord::Lj,
                            Index::diff(Index::Coord(Coord::J), c(Coord::Gs)?),
                        ),
                        (Coord::P, inner.pair_index()?),
                    ],
                }
            }
            LoopKind::Feature(feature) => Head {
                counter: Coord::F,
                start: Index::Const(0),
                end: self.width(feature)?,
                skip: None,
                binds: vec![],
            },
        })
    }

    /// The pair (i, j) of the group's responses i = li and j = lj ≠ i:
    /// `pb + li·(n − 1) + (lj − [lj > li])`.
    pub fn pair_index(&self) -> Result<Index, CodegenError> {
        let (li, lj) = (self.coord(Coord::Li)?, self.coord(Coord::Lj)?);
        Ok(Index::Sum(vec![
            self.coord(Coord::Pb)?,
            Index::product(
                li.clone(),
                Index::Offset(Box::new(self.coord(Coord::N)?), -1),
            ),
            Index::diff(
                lj.clone(),
                Index::Select(
                    Box::new(Cond::Greater(lj, li)),
                    Box::new(Index::Const(1)),
                    Box::new(Index::Const(0)),
                ),
            ),
        ]))
    }
}

/// A loop's header (`Scope::head`).
#[derive(Clone, Debug, PartialEq)]
pub struct Head {
    pub counter: Coord,
    pub start: Index,
    pub end: Index,
    /// A counter value the body skips (the pair loop's j = r).
    pub skip: Option<Index>,
    pub binds: Vec<(Coord, Index)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(index: &Index, at: &dyn Fn(Coord) -> i64) -> i64 {
        let e = |x: &Index| eval(x, at);
        match index {
            Index::Const(k) => *k,
            Index::Coord(c) => at(*c),
            Index::Sum(terms) => terms.iter().map(e).sum(),
            Index::Product(a, b) => e(a) * e(b),
            Index::Diff(a, b) => e(a) - e(b),
            Index::Quot(a, b) => e(a) / e(b),
            Index::Rem(a, b) => e(a) % e(b),
            Index::Offset(x, k) => e(x) + k,
            Index::Select(cond, a, b) => {
                let yes = match &**cond {
                    Cond::Within { x, start, end } => e(start) <= e(x) && e(x) < e(end),
                    Cond::Is(x, k) => e(x) == *k,
                    Cond::Greater(a, b) => e(a) > e(b),
                };
                if yes {
                    e(a)
                } else {
                    e(b)
                }
            }
            Index::Table(..) | Index::Size(_) => panic!("no tables here"),
        }
    }

    fn group_scope() -> Scope {
        let mut scope = Scope::entry();
        for c in [
            Coord::G,
            Coord::Gs,
            Coord::N,
            Coord::Cs,
            Coord::Cn,
            Coord::Rcb,
            Coord::Pb,
            Coord::Pcb,
            Coord::R,
            Coord::Li,
            Coord::J,
            Coord::Lj,
        ] {
            scope.bind(c);
        }
        scope
    }

    #[test]
    fn pair_indices_enumerate_each_group_s_ordered_pairs_once() {
        let scope = group_scope();
        let index = scope.pair_index().unwrap();
        let (pb, n) = (12, 4);
        let mut seen = Vec::new();
        for li in 0..n {
            for lj in (0..n).filter(|&lj| lj != li) {
                let at = |c: Coord| match c {
                    Coord::Pb => pb,
                    Coord::N => n,
                    Coord::Li => li,
                    Coord::Lj => lj,
                    _ => panic!("unexpected {c:?}"),
                };
                seen.push(eval(&index, &at));
            }
        }
        assert_eq!(seen, (pb..pb + n * (n - 1)).collect::<Vec<_>>());
    }

    #[test]
    fn shift_sources_are_clamped_into_the_response() {
        let mut scope = group_scope();
        for c in [Coord::Ts, Coord::Te, Coord::T] {
            scope.bind(c);
        }
        let (ts, te) = (10, 14);
        for offset in [-3, -1, 1, 5] {
            let clamped = scope.shift_clamped(offset).unwrap();
            for t in ts..te {
                let at = |c: Coord| match c {
                    Coord::Ts => ts,
                    Coord::Te => te,
                    Coord::T => t,
                    _ => panic!("unexpected {c:?}"),
                };
                let source = t + i64::from(offset);
                let expected = if (ts..te).contains(&source) {
                    source
                } else {
                    t
                };
                assert_eq!(eval(&clamped, &at), expected);
            }
        }
    }

    #[test]
    fn unbound_coordinates_are_errors_not_indices() {
        let scope = Scope::entry();
        let error = scope
            .index(&Shape::new(Level::Tok), false, None)
            .unwrap_err();
        assert!(
            matches!(&error, CodegenError::Internal(what) if what.contains("coordinate t is not bound")),
            "{error}"
        );
        // A criterion axis outside a group is empty.
        assert_eq!(scope.width(&Feature::Crit).unwrap(), Index::Const(0));
    }
}
