//! The built-in functions and values of the language, as data: the checker reads their signatures and
//! `docs/language.md` lists them (a test keeps the two in step). The functions are entries of the op
//! table (`crate::ops`), which also says what each primitive means to every later stage.

use serde::Serialize;

use super::types::{Elem, Level, Ty};

/// The built-in functions (`Func`) and their signatures (`FUNCS`) come from the op table.
pub use crate::ops::{Func, FUNCS};

/// Reductions: `op(x over AXES)` removes the named axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReduceOp {
    Sum,
    Mean,
    Max,
    Min,
    Std,
    Var,
    Count,
    Any,
    All,
    LogSumExp,
}

/// Built-in values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Value {
    Step,
    Progress,
    /// Responses in this group (after `keep resp` filters).
    N,
    RespIndex,
    /// Valid tokens in this response.
    Length,
    TokenIndex,
    Inf,
    Pi,
}

pub struct FuncSig {
    pub func: Func,
    pub name: &'static str,
    pub params: &'static [&'static str],
    /// How many trailing parameters may be omitted.
    pub optional: usize,
    pub doc: &'static str,
}

pub struct ReduceSig {
    pub op: ReduceOp,
    pub name: &'static str,
    pub doc: &'static str,
}

pub const REDUCTIONS: &[ReduceSig] = &[
    ReduceSig {
        op: ReduceOp::Sum,
        name: "sum",
        doc: "Σ x",
    },
    ReduceSig {
        op: ReduceOp::Mean,
        name: "mean",
        doc: "Σ x / count",
    },
    ReduceSig {
        op: ReduceOp::Max,
        name: "max",
        doc: "largest element",
    },
    ReduceSig {
        op: ReduceOp::Min,
        name: "min",
        doc: "smallest element",
    },
    ReduceSig {
        op: ReduceOp::Std,
        name: "std",
        doc: "standard deviation; `ddof = 1` for Bessel's correction (default 0)",
    },
    ReduceSig {
        op: ReduceOp::Var,
        name: "var",
        doc: "variance; `ddof` as for std",
    },
    ReduceSig {
        op: ReduceOp::Count,
        name: "count",
        doc: "number of true elements (i32)",
    },
    ReduceSig {
        op: ReduceOp::Any,
        name: "any",
        doc: "some element is true",
    },
    ReduceSig {
        op: ReduceOp::All,
        name: "all",
        doc: "every element is true",
    },
    ReduceSig {
        op: ReduceOp::LogSumExp,
        name: "logsumexp",
        doc: "log Σ e^x, computed stably",
    },
];

pub struct ValueSig {
    pub value: Value,
    pub name: &'static str,
    pub elem: Elem,
    pub level: Level,
    pub doc: &'static str,
}

pub const VALUES: &[ValueSig] = &[
    ValueSig {
        value: Value::Step,
        name: "step",
        elem: Elem::I32,
        level: Level::Batch,
        doc: "training step (0 when scoring)",
    },
    ValueSig {
        value: Value::Progress,
        name: "progress",
        elem: Elem::F32,
        level: Level::Batch,
        doc: "fraction of training done, 0 → 1",
    },
    ValueSig {
        value: Value::N,
        name: "n",
        elem: Elem::I32,
        level: Level::Group,
        doc: "responses in this group (after `keep resp`)",
    },
    ValueSig {
        value: Value::RespIndex,
        name: "resp_index",
        elem: Elem::I32,
        level: Level::Resp,
        doc: "position of the response in its group, from 0",
    },
    ValueSig {
        value: Value::Length,
        name: "length",
        elem: Elem::I32,
        level: Level::Resp,
        doc: "tokens in this response",
    },
    ValueSig {
        value: Value::TokenIndex,
        name: "token_index",
        elem: Elem::I32,
        level: Level::Tok,
        doc: "position of the token in its response, from 0",
    },
    ValueSig {
        value: Value::Inf,
        name: "inf",
        elem: Elem::F32,
        level: Level::Batch,
        doc: "+∞",
    },
    ValueSig {
        value: Value::Pi,
        name: "pi",
        elem: Elem::F32,
        level: Level::Batch,
        doc: "π",
    },
];

/// Operations along an axis (`over` names it).
pub const AXIS_OPS: &[(&str, &str)] = &[
    (
        "softmax",
        "softmax(x over AXIS, temperature = 1): normalised exponentials along a feature axis or `resp`",
    ),
    (
        "scan",
        "scan(x over tok, decay = 1, reverse = false): discounted running sum along each response",
    ),
    (
        "shift",
        "shift(x over tok, offset = 1, fill = 0): y_t = x_(t+offset) within each response, fill outside",
    ),
    (
        "distinct_ngrams",
        "distinct_ngrams(ids over tok, n = 4): distinct n-grams / n-grams of each response (1 if shorter than n)",
    ),
    (
        "rank",
        "rank(x over AXES, mask = c): 0-based position of each element in descending order among the elements reduced together (where c holds; ties: the earlier element first; no gradient)",
    ),
    (
        "uniform",
        "uniform(seed over LEVEL): a pseudo-random number in [0, 1) per element of LEVEL, keyed by the seed and the element's position (splitmix64; the same bits on every backend)",
    ),
    (
        "components",
        "components(same over others): the classes of the transitive closure of a pairwise verdict (a pair joins when either direction holds), as i32[resp]: each response's smallest class member's 0-based position in its group (no gradient)",
    ),
    (
        "quantile",
        "quantile(x over AXES, q = 0.5, mask = c): the q-quantile of the elements (where c holds), linearly interpolated as torch.quantile (no gradient)",
    ),
];

pub fn func(name: &str) -> Option<&'static FuncSig> {
    FUNCS.iter().find(|sig| sig.name == name)
}

pub fn reduction(name: &str) -> Option<&'static ReduceSig> {
    REDUCTIONS.iter().find(|sig| sig.name == name)
}

pub fn value(name: &str) -> Option<&'static ValueSig> {
    VALUES.iter().find(|sig| sig.name == name)
}

pub fn value_ty(sig: &ValueSig) -> Ty {
    Ty::new(sig.elem, sig.level)
}

/// Every name the language defines itself (for "did you mean" and shadowing checks).
pub fn all_names() -> impl Iterator<Item = &'static str> {
    FUNCS
        .iter()
        .map(|sig| sig.name)
        .chain(REDUCTIONS.iter().map(|sig| sig.name))
        .chain(VALUES.iter().map(|sig| sig.name))
        .chain(AXIS_OPS.iter().map(|(name, _)| *name))
}
