//! The op table: every built-in function of the language, one entry each, and for each primitive (a
//! built-in that is one element-wise IR op) everything a stage needs to know about it:
//!
//! | field | read by |
//! |---|---|
//! | `name`, `params`, `optional`, `doc` | the checker (`check::builtins::FUNCS`, `Func`), the LSP, docs/language.md's test |
//! | `op: Variant` | `ir::Op` (its variant is generated from here), lowering (`Func::primitive`) |
//! | `result`, `gradient` | the checker's element type and differentiability, `Op::passes_gradient` |
//! | `f64` | constant folding and the interpreter (`ir::fold` → `eval`), the JIT's shims |
//! | `f32` | the JIT's shims in f32 accumulation (present: the JIT may call out to it) |
//! | `jit` | the JIT: `Call` calls the shim, `Inline` is an instruction sequence in `backend/jit.rs` |
//! | `derivative` | autodiff (`derivative`), a rule over `ir::autodiff::Derivative` |
//! | `cuda`, `cuda_prelude` | `backend/cuda.rs`: the expression, and the device function it calls |
//! | `torch` | `export/torch.rs`: the expression (names `prelude.py`'s helpers, `_sqrt`, `_minimum`…) |
//!
//! Entries without `op` are *forms*: built-ins the checker types and lowering expands into several ops
//! (`clamp`, `where`, `stopgrad`, `dot`, `outer`; `cos(a, b)` is the two-argument form of the `cos`
//! primitive). Adding a primitive is adding one entry (ARCHITECTURE.md, "Adding a built-in").
//!
//! The table is a `macro_rules!` list rather than a `const` array of structs because two things it
//! defines cannot be values: enum variants (`Func` and `ir::Op` have one per entry, so matches stay
//! exhaustive and the IR's serde names stay what they were) and `extern "C"` shims for the JIT (a
//! closure cannot be given the C ABI). Everything else is plain data: `Primitive`, one `const` per op.

use serde::Serialize;

use crate::check::builtins::FuncSig;
use crate::ir::autodiff::{Derivative, Local};
use crate::ir::Op;

/// Calls `$callback! { { HEAD } ENTRIES }`: the one list of built-in functions. Entries keep the order
/// of the built-ins' documentation and completion lists.
macro_rules! op_table {
    ($callback:ident ! { $($head:tt)* }) => {
        $callback! {
            { $($head)* }
            Exp {
                name: "exp", params: ["x"], optional: 0, doc: "e^x",
                op: Exp {
                    arity: Unary, result: Float, gradient: true,
                    f64: f64::exp, f32: f32::exp,
                    // Inlined (`Gen::exp_f64`); the shims stay registered.
                    jit: Inline,
                    derivative: |d| Some(d.times(d.node)),
                    cuda: Cuda::Libm("exp"),
                    torch: "torch.exp({0})",
                }
            },
            Log {
                name: "log", params: ["x"], optional: 0, doc: "natural logarithm",
                op: Log {
                    arity: Unary, result: Float, gradient: true,
                    f64: f64::ln, f32: f32::ln,
                    jit: Call,
                    derivative: |d| Some(d.over(d.a()?)),
                    cuda: Cuda::Libm("log"),
                    torch: "torch.log({0})",
                }
            },
            Log1p {
                name: "log1p", params: ["x"], optional: 0, doc: "log(1 + x), accurate near 0",
                op: Log1p {
                    arity: Unary, result: Float, gradient: true,
                    f64: f64::ln_1p, f32: f32::ln_1p,
                    jit: Call,
                    derivative: |d| {
                        let shifted = d.map(Op::Add, vec![d.a()?, d.one]);
                        Some(d.over(shifted))
                    },
                    cuda: Cuda::Libm("log1p"),
                    torch: "torch.log1p({0})",
                }
            },
            Sqrt {
                name: "sqrt", params: ["x"], optional: 0, doc: "square root",
                op: Sqrt {
                    arity: Unary, result: Float, gradient: true,
                    f64: f64::sqrt,
                    jit: Inline,
                    // g / 2√x where √x > 0, 0 at 0 (a zero-variance group has a zero std gradient).
                    derivative: |d| {
                        let positive = d.map(Op::Gt, vec![d.node, d.zero]);
                        let safe = d.map(Op::Select, vec![positive, d.node, d.one]);
                        let twice = d.map(Op::Add, vec![safe, safe]);
                        Some(d.scaled(Op::Div, twice, Some(positive)))
                    },
                    cuda: Cuda::Libm("sqrt"),
                    torch: "_sqrt({0})",
                }
            },
            Sigmoid {
                name: "sigmoid", params: ["x"], optional: 0, doc: "1 / (1 + e^-x)",
                op: Sigmoid {
                    arity: Unary, result: Float, gradient: true,
                    f64: scalar::double::sigmoid, f32: scalar::single::sigmoid,
                    jit: Call,
                    derivative: |d| {
                        let complement = d.map(Op::Sub, vec![d.one, d.node]);
                        let slope = d.map(Op::Mul, vec![d.node, complement]);
                        Some(d.times(slope))
                    },
                    cuda: Cuda::Expr("rlx_sigmoid({0})"),
                    cuda_prelude: "RLX_DEVICE {t} rlx_sigmoid({t} x) {
    if (x >= 0) return 1 / (1 + exp{s}(-x));
    {t} e = exp{s}(x);
    return e / (1 + e);
}
",
                    torch: "torch.sigmoid({0})",
                }
            },
            LogSigmoid {
                name: "logsigmoid", params: ["x"], optional: 0, doc: "log σ(x), computed stably",
                op: LogSigmoid {
                    arity: Unary, result: Float, gradient: true,
                    f64: scalar::double::log_sigmoid, f32: scalar::single::log_sigmoid,
                    jit: Call,
                    derivative: |d| {
                        let negated = d.map(Op::Neg, vec![d.a()?]);
                        let slope = d.map(Op::Sigmoid, vec![negated]);
                        Some(d.times(slope))
                    },
                    cuda: Cuda::Expr("rlx_log_sigmoid({0})"),
                    cuda_prelude: "RLX_DEVICE {t} rlx_log_sigmoid({t} x) { return -rlx_softplus(-x); }\n",
                    cuda_needs: [Softplus],
                    torch: "F.logsigmoid({0})",
                }
            },
            Tanh {
                name: "tanh", params: ["x"], optional: 0, doc: "hyperbolic tangent",
                op: Tanh {
                    arity: Unary, result: Float, gradient: true,
                    f64: f64::tanh, f32: f32::tanh,
                    jit: Call,
                    derivative: |d| {
                        let square = d.map(Op::Mul, vec![d.node, d.node]);
                        let slope = d.map(Op::Sub, vec![d.one, square]);
                        Some(d.times(slope))
                    },
                    cuda: Cuda::Libm("tanh"),
                    torch: "torch.tanh({0})",
                }
            },
            Softplus {
                name: "softplus", params: ["x"], optional: 0, doc: "log(1 + e^x), computed stably",
                op: Softplus {
                    arity: Unary, result: Float, gradient: true,
                    f64: scalar::double::softplus, f32: scalar::single::softplus,
                    jit: Call,
                    derivative: |d| {
                        let slope = d.map(Op::Sigmoid, vec![d.a()?]);
                        Some(d.times(slope))
                    },
                    cuda: Cuda::Expr("rlx_softplus({0})"),
                    cuda_prelude: "RLX_DEVICE {t} rlx_softplus({t} x) { return x > 0 ? x + log1p{s}(exp{s}(-x)) : log1p{s}(exp{s}(x)); }\n",
                    torch: "F.softplus({0})",
                }
            },
            Abs {
                name: "abs", params: ["x"], optional: 0, doc: "|x| (subgradient 0 at 0)",
                op: Abs {
                    arity: Unary, result: KeepInt, gradient: true,
                    f64: f64::abs,
                    jit: Inline,
                    derivative: |d| {
                        let slope = d.map(Op::Sign, vec![d.a()?]);
                        Some(d.times(slope))
                    },
                    cuda: Cuda::Libm("fabs"),
                    torch: "torch.abs({0})",
                }
            },
            Floor {
                name: "floor", params: ["x"], optional: 0, doc: "largest integer ≤ x (gradient 0)",
                op: Floor {
                    arity: Unary, result: Float, gradient: false,
                    f64: f64::floor,
                    jit: Inline,
                    cuda: Cuda::Libm("floor"),
                    torch: "torch.floor({0})",
                }
            },
            Min {
                name: "min", params: ["a", "b"], optional: 0,
                doc: "smaller of a and b; with `over`, a reduction",
                op: Min {
                    arity: Binary, result: KeepInt, gradient: true,
                    f64: f64::min,
                    // Against a constant, one compare (`backend/jit.rs`, `backend/cuda.rs`).
                    jit: Inline,
                    // The first operand wins ties.
                    derivative: |d| d.choose(if d.position == 0 { Op::Le } else { Op::Gt }),
                    cuda: Cuda::Inline,
                    torch: "_minimum({0}, {1})",
                }
            },
            Max {
                name: "max", params: ["a", "b"], optional: 0,
                doc: "larger of a and b; with `over`, a reduction",
                op: Max {
                    arity: Binary, result: KeepInt, gradient: true,
                    f64: f64::max,
                    jit: Inline,
                    derivative: |d| d.choose(if d.position == 0 { Op::Ge } else { Op::Lt }),
                    cuda: Cuda::Inline,
                    torch: "_maximum({0}, {1})",
                }
            },
            Pow {
                name: "pow", params: ["base", "exponent"], optional: 0, doc: "base ^ exponent",
                op: Pow {
                    arity: Binary, result: Float, gradient: true,
                    f64: f64::powf, f32: f32::powf,
                    jit: Call,
                    derivative: |d| {
                        let (base, exponent) = (d.a()?, d.second()?);
                        if d.position == 0 {
                            // g·e·a^(e−1)
                            let e_minus_one = d.map(Op::Sub, vec![exponent, d.one]);
                            let power = d.map(Op::Pow, vec![base, e_minus_one]);
                            let slope = d.map(Op::Mul, vec![exponent, power]);
                            Some(d.times(slope))
                        } else {
                            // g·y·ln a, for a > 0 (0 elsewhere).
                            let positive = d.map(Op::Gt, vec![base, d.zero]);
                            let safe = d.map(Op::Select, vec![positive, base, d.one]);
                            let log = d.map(Op::Log, vec![safe]);
                            let slope = d.map(Op::Mul, vec![d.node, log]);
                            Some(d.scaled(Op::Mul, slope, Some(positive)))
                        }
                    },
                    cuda: Cuda::Libm("pow"),
                    // With a differentiable exponent, `_pow(L, base, exponent)` (torch.rs).
                    torch: "torch.pow({0}, {1})",
                }
            },
            Clamp {
                name: "clamp", params: ["x", "lo", "hi"], optional: 0,
                doc: "min(max(x, lo), hi); gradient 1 inside [lo, hi], 0 outside",
            },
            Where {
                name: "where", params: ["cond", "yes", "no"], optional: 0,
                doc: "yes where cond holds, else no; the gradient flows through the chosen branch",
            },
            Stopgrad {
                name: "stopgrad", params: ["x"], optional: 0,
                doc: "x, with no gradient flowing through it",
            },
            Cos {
                name: "cos", params: ["a", "b"], optional: 1,
                doc: "cos(a, b): cosine similarity of two vectors along their feature axis; cos(x): trigonometric cosine",
                op: Cos {
                    arity: Unary, result: Float, gradient: true,
                    f64: f64::cos, f32: f32::cos,
                    jit: Call,
                    derivative: |d| {
                        let sine = d.map(Op::Sin, vec![d.a()?]);
                        let slope = d.map(Op::Neg, vec![sine]);
                        Some(d.times(slope))
                    },
                    cuda: Cuda::Libm("cos"),
                    torch: "torch.cos({0})",
                }
            },
            Dot {
                name: "dot", params: ["a", "b"], optional: 0,
                doc: "the sum of products along the shared feature axis: vector·vector (a number), vector·matrix (Σ over the rows), matrix·vector (Σ over the columns)",
            },
            Outer {
                name: "outer", params: ["a", "b"], optional: 0,
                doc: "the matrix a_i·b_j of two vectors (rows along a's axis, columns along b's)",
            },
            Sin {
                name: "sin", params: ["x"], optional: 0, doc: "trigonometric sine",
                op: Sin {
                    arity: Unary, result: Float, gradient: true,
                    f64: f64::sin, f32: f32::sin,
                    jit: Call,
                    derivative: |d| {
                        let slope = d.map(Op::Cos, vec![d.a()?]);
                        Some(d.times(slope))
                    },
                    cuda: Cuda::Libm("sin"),
                    torch: "torch.sin({0})",
                }
            },
            Sign {
                name: "sign", params: ["x"], optional: 0, doc: "−1, 0 or 1 (no gradient)",
                op: Sign {
                    arity: Unary, result: Float, gradient: false,
                    f64: scalar::double::sign,
                    jit: Inline,
                    cuda: Cuda::Expr("({0} > 0 ? (rlx_acc)1 : ({0} < 0 ? (rlx_acc)(-1) : (rlx_acc)0))"),
                    torch: "torch.sign({0})",
                }
            },
            Lgamma {
                name: "lgamma", params: ["x"], optional: 0,
                doc: "log Γ(x) for x > 0 (no gradient); e.g. log-binomials for pass@k",
                op: Lgamma {
                    arity: Unary, result: Float, gradient: false,
                    f64: scalar::lgamma, f32: scalar::lgamma_f32,
                    jit: Call,
                    cuda: Cuda::Expr("rlx_lgamma({0})"),
                    cuda_prelude: r"/* log Γ(x): Lanczos (g = 7, n = 9) with the reflection formula below 1/2; +inf at the poles. */
RLX_DEVICE double rlx_lgamma64(double x) {
    const double c[9] = {0.99999999999980993, 676.5203681218851, -1259.1392167224028,
                         771.32342877765313, -176.61502916214059, 12.507343278686905,
                         -0.13857109526572012, 9.9843695780195716e-6, 1.5056327351493116e-7};
    const double pi = 3.141592653589793;
    double shift = 0.0, sign = 1.0;
    if (x != x) return x;
    if (x <= 0.0 && x - trunc(x) == 0.0) return rlx_inf();
    if (x < 0.5) {
        /* lgamma(x) = ln π − ln|sin πx| − lgamma(1 − x) */
        shift = log(pi) - log(fabs(sin(pi * x)));
        sign = -1.0;
        x = 1.0 - x;
    }
    x = x - 1.0;
    double sum = c[0];
    for (int i = 1; i < 9; i++) sum += c[i] / (x + (double)i);
    double t = x + 7.0 + 0.5;
    double value = 0.5 * log(2.0 * pi) + (x + 0.5) * log(t) - t + log(sum);
    return sign < 0.0 ? shift - value : value;
}
RLX_DEVICE {t} rlx_lgamma({t} x) { return ({t})rlx_lgamma64((double)x); }
",
                    torch: "torch.lgamma({0}.detach())",
                }
            },
        }
    };
}
pub(crate) use op_table;

/// The element type of a primitive's result, as the checker gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Returns {
    /// Always `f32`.
    Float,
    /// `i32` when every argument is `i32`, else `f32` (`abs`, `min`, `max`).
    KeepInt,
}

/// How the JIT computes a primitive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Jit {
    /// A call of the registered shim (`shims`), lane by lane.
    Call,
    /// An instruction sequence of its own in `backend/jit.rs`.
    Inline,
}

/// A primitive in CUDA C, over its operands' expressions in the accumulation type `rlx_acc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cuda {
    /// The math library's function of that name (`exp`), `f`-suffixed in f32 accumulation (`expf`).
    Libm(&'static str),
    /// An expression over `{0}`, `{1}` (`fill`).
    Expr(&'static str),
    /// Written by `backend/cuda.rs` itself (`min`/`max`: one compare against a constant).
    Inline,
}

/// The JIT's shims of a primitive: the Rust functions of the table, callable from generated code.
#[derive(Clone, Copy, Debug)]
pub enum Shims {
    Unary {
        double: extern "C" fn(f64) -> f64,
        single: extern "C" fn(f32) -> f32,
    },
    Binary {
        double: extern "C" fn(f64, f64) -> f64,
        single: extern "C" fn(f32, f32) -> f32,
    },
}

/// A device function a primitive's CUDA expression calls, written once per accumulation precision:
/// `{t}` is the type (`double`, `float`) and `{s}` the math library's suffix (``, `f`).
#[derive(Clone, Copy, Debug)]
pub struct CudaPrelude {
    pub text: &'static str,
    /// Primitives whose device functions this one calls (emitted first).
    pub needs: &'static [Op],
}

/// One primitive: an element-wise IR op with a surface name (see the module docs for who reads what).
#[derive(Clone, Debug)]
pub struct Primitive {
    pub op: Op,
    pub func: Func,
    /// The surface name (`logsigmoid`).
    pub name: &'static str,
    /// Operands of the IR op.
    pub arity: usize,
    pub result: Returns,
    /// Whether a gradient flows through it (the checker's `grad`, `Op::passes_gradient`).
    pub gradient: bool,
    pub shims: Option<Shims>,
    pub jit: Jit,
    pub cuda: Cuda,
    pub cuda_prelude: Option<CudaPrelude>,
    /// A Python expression over `{0}`, `{1}` (`fill`).
    pub torch: &'static str,
}

/// The rule for ∂node/∂args[position] of a primitive (`None`: no gradient to that operand).
type Rule = fn(&mut Derivative) -> Option<Local>;

/// Operands of a primitive's op, and how its f64 function is applied to them (`eval`) or wrapped for
/// the JIT (`shim_fns`).
macro_rules! arity {
    (Unary) => {
        1
    };
    (Binary) => {
        2
    };
}

macro_rules! apply {
    (Unary, $f:path, $values:ident) => {
        $f($values.first().copied().unwrap_or(0.0))
    };
    (Binary, $f:path, $values:ident) => {
        $f(
            $values.first().copied().unwrap_or(0.0),
            $values.get(1).copied().unwrap_or(0.0),
        )
    };
}

macro_rules! shim_fns {
    (Unary, $double:path, $single:path) => {
        pub extern "C" fn double(x: f64) -> f64 {
            $double(x)
        }
        pub extern "C" fn single(x: f32) -> f32 {
            $single(x)
        }
    };
    (Binary, $double:path, $single:path) => {
        pub extern "C" fn double(x: f64, y: f64) -> f64 {
            $double(x, y)
        }
        pub extern "C" fn single(x: f32, y: f32) -> f32 {
            $single(x, y)
        }
    };
}

/// `Shims` of a primitive's module in `shims` (the f32 function only marks that there is one).
macro_rules! shims_of {
    ($arity:ident, $op:ident, $single:path) => {
        Shims::$arity {
            double: shims::$op::double,
            single: shims::$op::single,
        }
    };
}

/// `None`, or `Some` of the tokens given (an optional field of an entry).
macro_rules! maybe {
    () => {
        None
    };
    ($($value:tt)+) => {
        Some($($value)+)
    };
}

/// The table's items: `Func`, `FUNCS`, one `Primitive` const per primitive and `PRIMITIVES`, the
/// lookups `Func::primitive` and `Op::primitive`, `eval`, `derivative` and the shims.
macro_rules! generate {
    (
        { }
        $(
            $func:ident {
                name: $name:literal, params: [$($param:literal),*], optional: $optional:literal,
                doc: $doc:literal
                $(, op: $op:ident {
                    arity: $arity:ident, result: $result:ident, gradient: $gradient:literal,
                    f64: $double:path, $(f32: $single:path,)?
                    jit: $jit:ident,
                    $(derivative: $derivative:expr,)?
                    cuda: $cuda:expr,
                    $(cuda_prelude: $prelude:literal, $(cuda_needs: [$($need:ident),*],)?)?
                    torch: $torch:literal $(,)?
                })?
                $(,)?
            }
        ),* $(,)?
    ) => {
        /// Element-wise built-in functions (`op_table!`). Arguments broadcast against each other
        /// (coarse → fine).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
        #[serde(rename_all = "snake_case")]
        pub enum Func {
            $( #[doc = $doc] $func, )*
        }

        /// The built-in functions' signatures, in the table's order.
        pub const FUNCS: &[FuncSig] = &[
            $( FuncSig {
                func: Func::$func,
                name: $name,
                params: &[$($param),*],
                optional: $optional,
                doc: $doc,
            }, )*
        ];

        #[allow(non_upper_case_globals)]
        impl Primitive {
            $($(
                pub const $op: Primitive = Primitive {
                    op: Op::$op,
                    func: Func::$func,
                    name: $name,
                    arity: arity!($arity),
                    result: Returns::$result,
                    gradient: $gradient,
                    shims: maybe!($(shims_of!($arity, $op, $single))?),
                    jit: Jit::$jit,
                    cuda: $cuda,
                    cuda_prelude: maybe!($(CudaPrelude { text: $prelude, needs: &[$($(Op::$need),*)?] })?),
                    torch: $torch,
                };
            )?)*
        }

        /// Every primitive, in the table's order.
        pub const PRIMITIVES: &[Primitive] = &[$($(Primitive::$op,)?)*];

        impl Func {
            /// The primitive this built-in is (`None` for a form).
            pub fn primitive(self) -> Option<&'static Primitive> {
                match self {
                    $($( Func::$func => Some(&Primitive::$op), )?)*
                    _ => None,
                }
            }
        }

        impl Op {
            /// The table's entry for this op (`None` for ops that are not primitives).
            pub fn primitive(&self) -> Option<&'static Primitive> {
                match self {
                    $($( Op::$op => Some(&Primitive::$op), )?)*
                    _ => None,
                }
            }
        }

        /// A primitive's value on scalars (missing operands read as 0): the f64 semantics that
        /// folding, the interpreter and the JIT's f64 shims share. `None` for other ops.
        pub fn eval(op: &Op, values: &[f64]) -> Option<f64> {
            Some(match op {
                $($( Op::$op => apply!($arity, $double, values), )?)*
                _ => return None,
            })
        }

        /// The local derivative of a primitive (`Some(None)`: no gradient); `None` for other ops.
        pub(crate) fn derivative(op: &Op, d: &mut Derivative) -> Option<Option<Local>> {
            match op {
                $($($( Op::$op => {
                    let rule: Rule = $derivative;
                    Some(rule(d))
                } )?)?)*
                _ => op.primitive().map(|_| None),
            }
        }

        /// The JIT's shims (`Shims`), one module per primitive that has them.
        #[allow(non_snake_case)]
        pub mod shims {
            #[allow(unused_imports)]
            use super::*;
            $($($(
                pub mod $op {
                    #[allow(unused_imports)]
                    use super::*;
                    shim_fns!($arity, $double, $single);
                }
            )?)?)*
        }
    };
}

op_table!(generate! {});

impl Primitive {
    /// The torch expression over the operands' expressions.
    pub fn torch_expr(&self, operands: &[String]) -> String {
        fill(self.torch, operands)
    }

    /// The device functions of the CUDA prelude for one accumulation precision (`ty`: `double` or
    /// `float`; `suffix`: the math library's, `` or `f`), each primitive's after those it needs.
    pub fn cuda_prelude(ty: &str, suffix: &str) -> String {
        fn emit(p: &Primitive, ty: &str, suffix: &str, done: &mut Vec<Op>, out: &mut String) {
            let Some(prelude) = &p.cuda_prelude else {
                return;
            };
            if done.contains(&p.op) {
                return;
            }
            done.push(p.op.clone());
            for need in prelude.needs {
                if let Some(needed) = need.primitive() {
                    emit(needed, ty, suffix, done, out);
                }
            }
            out.push_str(&prelude.text.replace("{t}", ty).replace("{s}", suffix));
        }
        let mut out = String::new();
        let mut done = Vec::new();
        for p in PRIMITIVES {
            emit(p, ty, suffix, &mut done, &mut out);
        }
        out
    }
}

/// `template` with `{k}` replaced by `operands[k]` (one pass: an operand's own text is never read as
/// a placeholder).
pub fn fill(template: &str, operands: &[String]) -> String {
    let mut out =
        String::with_capacity(template.len() + operands.iter().map(String::len).sum::<usize>());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let operand = after.find('}').and_then(|close| {
            let index: usize = after[..close].parse().ok()?;
            Some((close, operands.get(index)?))
        });
        match operand {
            Some((close, text)) => {
                out.push_str(text);
                rest = &after[close + 1..];
            }
            None => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The scalar functions the table names that the standard library lacks, each written once.
pub mod scalar {
    /// The same text at f64 (`double`) and f32 (`single`): the JIT's f32 shims round like f32 code.
    macro_rules! in_both_precisions {
        ($($item:item)*) => {
            pub mod double {
                #[allow(dead_code)]
                type F = f64;
                $($item)*
            }
            pub mod single {
                #[allow(dead_code)]
                type F = f32;
                $($item)*
            }
        };
    }

    in_both_precisions! {
        /// σ(x), stable for large |x|.
        pub fn sigmoid(x: F) -> F {
            if x >= 0.0 {
                1.0 / (1.0 + (-x).exp())
            } else {
                let e = x.exp();
                e / (1.0 + e)
            }
        }

        /// log σ(x) = −softplus(−x), stable.
        pub fn log_sigmoid(x: F) -> F {
            -softplus(-x)
        }

        /// log(1 + eˣ), stable.
        pub fn softplus(x: F) -> F {
            if x > 0.0 {
                x + (-x).exp().ln_1p()
            } else {
                x.exp().ln_1p()
            }
        }

        /// −1, 0 or 1 (0 for NaN).
        pub fn sign(x: F) -> F {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                0.0
            }
        }
    }

    /// log Γ(x) for x > 0 (Lanczos approximation, g = 7, n = 9; relative error below 1e-14), with the
    /// reflection formula below 1/2; +∞ at the poles (0, −1, −2, …).
    pub fn lgamma(x: f64) -> f64 {
        const G: f64 = 7.0;
        const COEFFICIENTS: [f64; 9] = [
            0.999_999_999_999_809_9,
            676.520_368_121_885_1,
            -1_259.139_216_722_402_8,
            771.323_428_777_653_1,
            -176.615_029_162_140_6,
            12.507_343_278_686_905,
            -0.138_571_095_265_720_12,
            9.984_369_578_019_572e-6,
            1.505_632_735_149_311_6e-7,
        ];
        if x.is_nan() {
            return f64::NAN;
        }
        if x <= 0.0 && x.fract() == 0.0 {
            return f64::INFINITY;
        }
        if x < 0.5 {
            // Γ(x)Γ(1 − x) = π / sin(πx)
            let sine = (std::f64::consts::PI * x).sin().abs();
            return std::f64::consts::PI.ln() - sine.ln() - lgamma(1.0 - x);
        }
        let x = x - 1.0;
        let mut sum = COEFFICIENTS[0];
        for (i, c) in COEFFICIENTS.iter().enumerate().skip(1) {
            sum += c / (x + i as f64);
        }
        let t = x + G + 0.5;
        0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + sum.ln()
    }

    /// `lgamma` in f32: computed in f64 and rounded.
    pub fn lgamma_f32(x: f32) -> f32 {
        lgamma(f64::from(x)) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lgamma_matches_known_values() {
        use scalar::lgamma;
        // ln Γ(n) = ln (n − 1)!
        assert!((lgamma(1.0)).abs() < 1e-13);
        assert!((lgamma(5.0) - 24f64.ln()).abs() < 1e-12);
        assert!((lgamma(11.0) - 3_628_800f64.ln()).abs() < 1e-11);
        // Γ(1/2) = √π
        assert!((lgamma(0.5) - std::f64::consts::PI.sqrt().ln()).abs() < 1e-13);
        assert!((lgamma(0.1) - 2.252_712_651_734_206).abs() < 1e-12);
        assert_eq!(lgamma(0.0), f64::INFINITY);
    }

    #[test]
    fn every_primitive_is_found_by_its_op_and_its_func() {
        for p in PRIMITIVES {
            assert_eq!(p.op.primitive().map(|q| &q.op), Some(&p.op), "{}", p.name);
            assert_eq!(p.func.primitive().map(|q| &q.op), Some(&p.op), "{}", p.name);
            assert!(FUNCS
                .iter()
                .any(|sig| sig.func == p.func && sig.name == p.name));
            assert_eq!(p.torch.matches('{').count(), p.arity, "{}", p.torch);
            if p.jit == Jit::Call {
                assert!(p.shims.is_some(), "{} is called but has no shim", p.name);
            }
        }
        assert_eq!(Op::Add.primitive().map(|p| p.name), None);
        assert_eq!(Func::Clamp.primitive().map(|p| p.name), None);
    }

    #[test]
    fn shims_compute_the_f64_semantics() {
        for p in PRIMITIVES {
            for x in [-3.5, -1.0, -0.0, 0.25, 2.0, 40.0] {
                let want = eval(&p.op, &[x, 1.5]).expect("a primitive evaluates");
                let got = match p.shims {
                    Some(Shims::Unary { double, .. }) => double(x),
                    Some(Shims::Binary { double, .. }) => double(x, 1.5),
                    None => continue,
                };
                assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "{}({x}): shim {got}, table {want}",
                    p.name
                );
            }
        }
    }

    #[test]
    fn the_stable_forms_agree_in_both_precisions() {
        for x in [-30.0f32, -2.0, -0.5, 0.0, 0.5, 2.0, 30.0] {
            let wide = f64::from(x);
            assert!(
                (f64::from(scalar::single::sigmoid(x)) - scalar::double::sigmoid(wide)).abs()
                    < 1e-6
            );
            assert!(
                (f64::from(scalar::single::softplus(x)) - scalar::double::softplus(wide)).abs()
                    < 1e-5
            );
            assert_eq!(
                scalar::double::log_sigmoid(wide),
                -scalar::double::softplus(-wide)
            );
        }
    }

    #[test]
    fn fill_reads_each_placeholder_once() {
        let operands = vec!["a{1}".to_string(), "b".to_string()];
        assert_eq!(fill("f({0}, {1})", &operands), "f(a{1}, b)");
        assert_eq!(fill("{x} {2}", &operands), "{x} {2}");
    }

    #[test]
    fn the_cuda_prelude_defines_before_use() {
        let prelude = Primitive::cuda_prelude("double", "");
        let softplus = prelude
            .find("rlx_softplus(double x)")
            .expect("softplus defined");
        let log_sigmoid = prelude
            .find("rlx_log_sigmoid(double x)")
            .expect("log_sigmoid defined");
        assert!(softplus < log_sigmoid);
        assert_eq!(prelude.matches("RLX_DEVICE double rlx_softplus").count(), 1);
    }
}
