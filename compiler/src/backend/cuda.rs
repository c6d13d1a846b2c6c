//! Stage `codegen` for NVIDIA GPUs: every loop function and every combine of a plan's loop IR
//! (`super::loops`) becomes one `extern "C" __global__` CUDA C kernel, compiled at run time with NVRTC
//! (`rlx_runtime::cuda`). This module is instruction selection over the loop IR (C text).
//! `rlxc compile RECIPE --emit cuda` prints the source. docs/gpu.md describes the design and the checks.
//!
//! # Launch geometry
//! Every kernel has the JIT's calling convention (the ABI of `super::abi`): `(void* const* table, u64 g_begin,
//! u64 g_end)`, the table holding device pointers to the layout arrays, the scalars and the phase's
//! buffers. A pass whose nest starts with groups runs **one block per group** (`g = g_begin +
//! blockIdx.x`); other passes (batch level, `combine`) run one block.
//!
//! - A **token pass** (a nest `group › resp › tok`) is *block-parallel*: every thread of the block walks
//!   the group's responses together, computing group- and response-level values in registers (the same
//!   values in every thread), and the threads stride over each response's tokens (`t = ts + tid; t +=
//!   blockDim.x`, so loads are coalesced). A reduction of token values keeps one partial per thread and
//!   is completed by a block reduction in a fixed order (a pairwise tree over the thread index through
//!   shared memory), so results are deterministic run to run for a given block size. Stores and memory
//!   updates above the token loop are made by thread 0 only; token-level stores (gradients) by the
//!   thread that owns the token.
//! - Any other pass (responses, pairs, features, the batch) and a token pass with a `scan` (a
//!   recurrence along the tokens) or a memory accumulation inside its token loop is *serial*: one thread
//!   per block runs the JIT's loop nest, visiting elements in the interpreter's order. These passes are
//!   O(groups + responses), or a scan.
//! - A `combine` pass reduces the per-group partials of a batch reduction in a fixed pairwise order (one
//!   thread).
//!
//! # Numerics
//! Storage and accumulation follow `Options` exactly as the JIT: buffers are `float` or `double` as the
//! plan says, registers are `rlx_acc` (`double` or `float`), reductions' accumulators `rlx_sum`
//! (`double`, `plan::SUMS`). Transcendental functions
//! are CUDA's (or, in the host-C check, libm's) in the accumulation precision; `sigmoid`,
//! `log_sigmoid`, `softplus` and `lgamma` are the interpreter's stable forms written out in C (each
//! beside its Rust form in the op table, `rlx_compiler::ops`); `min`/`max` follow
//! `f64::min`/`f64::max` (a NaN operand is ignored), comparisons and `where` follow Rust's operators (NaN
//! is true as a condition), an empty `max`/`min` reads as 0.
//!
//! # Safety contract
//! As the JIT's: the code performs unchecked loads and stores and is sound for a table built from a
//! validated layout with every buffer sized for its shape (`rlx_runtime::kernel` validates every batch
//! before anything is launched); blocks past `g_end` return at once, and `shift` clamps its source into
//! the response before loading.
//!
//! # Host C
//! The source is also valid C99 under `cuda_host.h` (`HOST_HEADER`), which maps `__global__`,
//! `threadIdx`, `blockIdx`, `blockDim`, `__shared__` and `__syncthreads` onto POSIX threads and a
//! barrier, so the tests compile every recipe's kernels with the system C compiler and check them against
//! the interpreter on machines without a GPU (tests/cuda.rs).

use super::CodegenError;
use std::fmt::Write as _;

use super::abi::{self, Fixed};
use super::layout::{Cond, Coord, Index, Scope};
use super::loops::{self, Combine, Expr, Function, Loop, LoopFunction, Operand, Order, Stmt};
use super::plan::{BufferId, KernelPlan, LoopKind, Phase, Reduction};
use super::Precision;
use crate::ir::{Graph, NodeId, Op};
use crate::ops::{self, Cuda, Primitive};

/// The portability header that makes the generated source plain host C (see the module docs).
pub const HOST_HEADER: &str = include_str!("cuda_host.h");

/// Largest block the generated kernels accept (the size of their shared reduction arrays).
pub const MAX_BLOCK: u32 = 1024;

/// How a kernel is launched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// The `extern "C"` symbol.
    pub name: String,
    /// One block per group of `g_begin..g_end` (otherwise a single block).
    pub per_group: bool,
    /// The block's threads share the work (token passes); otherwise launch one thread per block.
    pub threads: bool,
}

/// A plan's CUDA C: the source and, by phase then pass, how to launch each pass (`None`: a host pass,
/// `distinct_ngrams`).
#[derive(Clone, Debug)]
pub struct CudaSource {
    pub source: String,
    pub launches: Vec<Vec<Option<Launch>>>,
}

impl CudaSource {
    /// The source with the host portability header in front (valid C for the system compiler), and a
    /// host launcher `void rlx_host_NAME(void* const* table, uint64_t g_begin, uint64_t g_end,
    /// unsigned grid, unsigned block)` after every kernel.
    pub fn host_c(&self) -> String {
        format!("{HOST_HEADER}\n{}", self.source)
    }

    /// A stable hash of the source (FNV-1a, 64 bits), the key of compiled-PTX caches.
    pub fn hash(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in self.source.bytes() {
            h ^= u64::from(byte);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h
    }
}

const PRELUDE: &str = r#"#ifndef RLX_HOST
/* NVRTC: CUDA C++ without headers. Helpers a recipe does not use are not an issue. */
#pragma nv_diag_suppress 177
#define RLX_KERNEL extern "C" __global__
#define RLX_DEVICE static __device__ __forceinline__
#define RLX_HOST_LAUNCHER(name)
typedef unsigned long long rlx_u64;
RLX_DEVICE double rlx_inf(void) { return __longlong_as_double(0x7ff0000000000000LL); }
RLX_DEVICE double rlx_nan(void) { return __longlong_as_double(0x7ff8000000000000LL); }
#endif
"#;

/// The functions of one accumulation precision, written after `rlx_acc` is defined.
fn functions(ft: Precision) -> String {
    let (t, s) = match ft {
        Precision::F64 => ("double", ""),
        Precision::F32 => ("float", "f"),
    };
    let mut out = String::new();
    let _ = write!(
        out,
        r#"/* f64::max / f64::min: a NaN operand is ignored; ties keep the first operand. */
RLX_DEVICE {t} rlx_max({t} a, {t} b) {{ return a != a ? b : (b > a ? b : a); }}
RLX_DEVICE {t} rlx_min({t} a, {t} b) {{ return a != a ? b : (b < a ? b : a); }}
/* The same on the accumulators of reductions, rlx_sum (double in either precision). */
RLX_DEVICE rlx_sum rlx_sum_max(rlx_sum a, rlx_sum b) {{ return a != a ? b : (b > a ? b : a); }}
RLX_DEVICE rlx_sum rlx_sum_min(rlx_sum a, rlx_sum b) {{ return a != a ? b : (b < a ? b : a); }}
/* The interpreter's stable forms (rlx_compiler::ir). */
"#
    );
    out.push_str(&Primitive::cuda_prelude(t, s));
    let _ = write!(
        out,
        r#"/* A block-wide reduction in a fixed order: a pairwise tree over the thread index (any block size).
   op: 0 sum, 1 max, 2 min. Every thread of the block must call it; every thread gets the result. */
RLX_DEVICE rlx_sum rlx_block_reduce(rlx_sum v, int op, rlx_sum* red) {{
    unsigned tid = threadIdx.x, nth = blockDim.x;
    red[tid] = v;
    __syncthreads();
    for (unsigned s = 1; s < nth; s <<= 1) {{
        if (tid % (2 * s) == 0 && tid + s < nth) {{
            rlx_sum a = red[tid], b = red[tid + s];
            red[tid] = op == 0 ? a + b : (op == 1 ? rlx_sum_max(a, b) : rlx_sum_min(a, b));
        }}
        __syncthreads();
    }}
    rlx_sum out = red[0];
    __syncthreads();
    return out;
}}
"#
    );
    out
}

/// Generate the CUDA C of every pass of `plan` (for `graph`), from its loop IR (`super::loops`). An
/// error names what cannot be expressed.
pub fn generate(graph: &Graph, plan: &KernelPlan) -> Result<CudaSource, CodegenError> {
    let kernel = loops::lower(graph, plan)?;
    let ft = plan.options.accumulate;
    let acc = c_type(ft);
    let mut source = String::new();
    let _ = writeln!(
        source,
        "/* rlx kernels: {} phase{}, accumulate {}, storage {} (generated by rlx_compiler::backend::cuda). */",
        plan.phases.len(),
        if plan.phases.len() == 1 { "" } else { "s" },
        plan.options.accumulate.name(),
        plan.options.storage.name()
    );
    source.push_str(PRELUDE);
    let _ = writeln!(source, "typedef {acc} rlx_acc;");
    // Reductions accumulate in f64 whatever the arithmetic (`plan::SUMS`).
    let _ = writeln!(source, "typedef {} rlx_sum;", c_type(super::plan::SUMS));
    let _ = writeln!(source, "#define RLX_MAX_BLOCK {MAX_BLOCK}");
    source.push_str(&functions(ft));
    let mut launches = Vec::new();
    for ((phase_index, phase), lowered) in plan.phases.iter().enumerate().zip(&kernel.phases) {
        let mut phase_launches = Vec::new();
        for (pass_index, function) in lowered.functions.iter().enumerate() {
            match function {
                Function::Loop(function) => {
                    let name = format!("rlx_p{phase_index}_{pass_index}");
                    let mut gen = Gen {
                        out: String::new(),
                        graph,
                        phase,
                        ft,
                        threads: function.split,
                        indent: 1,
                    };
                    gen.kernel(function, &name, phase_index, pass_index)?;
                    source.push_str(&gen.out);
                    phase_launches.push(Some(Launch {
                        name,
                        per_group: function.per_group,
                        threads: function.split,
                    }));
                }
                Function::Combine(combine) => {
                    let name = format!("rlx_c{phase_index}_{pass_index}");
                    combine_kernel(&mut source, &name, phase, combine)?;
                    phase_launches.push(Some(Launch {
                        name,
                        per_group: false,
                        threads: false,
                    }));
                }
                Function::Host(_) => phase_launches.push(None),
            }
        }
        launches.push(phase_launches);
    }
    Ok(CudaSource { source, launches })
}

fn c_type(p: Precision) -> &'static str {
    match p {
        Precision::F64 => "double",
        Precision::F32 => "float",
    }
}

/// A literal of the accumulation precision.
fn literal(value: f64, ft: Precision) -> String {
    let text = if value.is_nan() {
        "rlx_nan()".to_string()
    } else if value.is_infinite() {
        if value > 0.0 {
            "rlx_inf()".into()
        } else {
            "(-rlx_inf())".into()
        }
    } else {
        let mut text = format!("{value:?}");
        if !text.contains(['.', 'e', 'E']) {
            text.push_str(".0");
        }
        if text.starts_with('-') {
            text = format!("({text})");
        }
        text
    };
    match ft {
        Precision::F64 => text,
        Precision::F32 => format!("((float){text})"),
    }
}

/// An index expression as C (`long long` arithmetic).
fn c_index(index: &Index) -> String {
    match index {
        Index::Const(k) => format!("{k}LL"),
        Index::Coord(Coord::GBegin) => "(long long)g_begin".into(),
        Index::Coord(Coord::GEnd) => "(long long)g_end".into(),
        Index::Coord(c) => c.name().into(),
        Index::Sum(terms) => {
            let terms: Vec<String> = terms
                .iter()
                .map(|term| match term {
                    Index::Product(a, b) => format!("{} * {}", c_index(a), c_index(b)),
                    term => c_index(term),
                })
                .collect();
            format!("({})", terms.join(" + "))
        }
        Index::Product(a, b) => format!("({} * {})", c_index(a), c_index(b)),
        Index::Diff(a, b) => format!("({} - {})", c_index(a), c_index(b)),
        Index::Quot(a, b) => format!("({} / {})", c_index(a), c_index(b)),
        Index::Rem(a, b) => format!("({} % {})", c_index(a), c_index(b)),
        Index::Offset(x, k) if *k < 0 => format!("({} - {}LL)", c_index(x), k.unsigned_abs()),
        Index::Offset(x, k) => format!("({} + {k}LL)", c_index(x)),
        Index::Select(cond, a, b) => {
            format!("({} ? {} : {})", c_cond(cond), c_index(a), c_index(b))
        }
        Index::Table(fixed, at) => format!("(long long){}[{}]", fixed.c_name(), c_index(at)),
        Index::Size(size) => format!(
            "(long long)((const rlx_u64*)table[{}])[{}]",
            Fixed::Sizes.slot(),
            size.index()
        ),
    }
}

fn c_cond(cond: &Cond) -> String {
    match cond {
        Cond::Within { x, start, end } => {
            let x = c_index(x);
            format!("({x} >= {} && {x} < {})", c_index(start), c_index(end))
        }
        Cond::Is(x, k) => format!("{} == {k}LL", c_index(x)),
        Cond::Greater(a, b) => format!("{} > {}", c_index(a), c_index(b)),
    }
}

fn buffer_type(phase: &Phase, b: BufferId) -> Result<&'static str, CodegenError> {
    phase
        .buffers
        .get(b as usize)
        .map(|buffer| c_type(buffer.storage))
        .ok_or_else(|| format!("internal: unknown buffer b{b}").into())
}

fn combine_kernel(
    out: &mut String,
    name: &str,
    phase: &Phase,
    combine: &Combine,
) -> Result<(), CodegenError> {
    let ty = |b: BufferId| buffer_type(phase, b);
    let (combine_op, identity) = match combine.op {
        Reduction::Max => ("rlx_sum_max(a, b)", "rlx_nan()"),
        Reduction::Min => ("rlx_sum_min(a, b)", "rlx_nan()"),
        Reduction::Sum
        | Reduction::Count
        | Reduction::SumByOther
        | Reduction::ContractRows
        | Reduction::ContractCols => ("a + b", "0"),
    };
    let (partial, value) = (combine.partial, combine.value);
    let counts = match (combine.partial_count, combine.count) {
        (Some(pc), Some(c)) => Some((pc, c)),
        _ => None,
    };
    let _ = writeln!(
        out,
        "\n/* combine: the per-group partials of a batch reduction, pairwise in a fixed order (one thread). */"
    );
    let _ = writeln!(
        out,
        "RLX_KERNEL void {name}(void* const* table, rlx_u64 g_begin, rlx_u64 g_end) {{"
    );
    let _ = writeln!(
        out,
        "    if (threadIdx.x != 0 || blockIdx.x != 0) return;\n    long long groups = (long long)g_end - (long long)g_begin;"
    );
    let mut width_coords = Vec::new();
    combine.width.coords(&mut width_coords);
    for (coord, value) in Scope::entry_binds() {
        if !width_coords.contains(&coord) {
            continue;
        }
        let _ = writeln!(
            out,
            "    const long long {} = {}; (void){};",
            coord.name(),
            c_index(&value),
            coord.name()
        );
    }
    let _ = writeln!(out, "    long long width = {};", c_index(&combine.width));
    let _ = writeln!(
        out,
        "    {} *p = ({} *)table[{}];\n    {} *v = ({} *)table[{}];",
        ty(partial)?,
        ty(partial)?,
        abi::buffer_slot(partial),
        ty(value)?,
        ty(value)?,
        abi::buffer_slot(value)
    );
    if let Some((pc, c)) = counts {
        let _ = writeln!(
            out,
            "    {} *pc = ({} *)table[{}];\n    {} *vc = ({} *)table[{}];",
            ty(pc)?,
            ty(pc)?,
            abi::buffer_slot(pc),
            ty(c)?,
            ty(c)?,
            abi::buffer_slot(c)
        );
    }
    let _ = writeln!(out, "    for (long long f = 0; f < width; f++) {{");
    let _ = writeln!(
        out,
        "        for (long long s = 1; s < groups; s <<= 1) {{\n            for (long long i = 0; i + s < groups; i += 2 * s) {{\n                rlx_sum a = (rlx_sum)p[i * width + f], b = (rlx_sum)p[(i + s) * width + f];\n                p[i * width + f] = {combine_op};"
    );
    if counts.is_some() {
        let _ = writeln!(
            out,
            "                pc[i * width + f] = (rlx_sum)pc[i * width + f] + (rlx_sum)pc[(i + s) * width + f];"
        );
    }
    let _ = writeln!(out, "            }}\n        }}");
    let _ = writeln!(
        out,
        "        v[f] = groups > 0 ? (rlx_sum)p[f] : (rlx_sum){identity};"
    );
    if counts.is_some() {
        let _ = writeln!(
            out,
            "        vc[f] = groups > 0 ? (rlx_sum)pc[f] : (rlx_sum)0;"
        );
    }
    let _ = writeln!(out, "    }}\n}}\nRLX_HOST_LAUNCHER({name})");
    Ok(())
}

/// Instruction selection for one loop function: C text.
struct Gen<'a> {
    out: String,
    graph: &'a Graph,
    phase: &'a Phase,
    ft: Precision,
    /// The function's token loop is split across the block's threads.
    threads: bool,
    indent: usize,
}

impl Gen<'_> {
    fn line(&mut self, text: &str) {
        for _ in 0..self.indent {
            self.out.push_str("    ");
        }
        self.out.push_str(text);
        self.out.push('\n');
    }

    fn fn_name(&self, name: &str) -> String {
        match self.ft {
            Precision::F64 => name.to_string(),
            Precision::F32 => format!("{name}f"),
        }
    }

    fn ty(&self, buffer: BufferId) -> Result<&'static str, CodegenError> {
        buffer_type(self.phase, buffer)
    }

    fn kernel(
        &mut self,
        function: &LoopFunction,
        name: &str,
        phase_index: usize,
        pass_index: usize,
    ) -> Result<(), CodegenError> {
        let path: Vec<&str> = function.path.iter().map(LoopKind::name).collect();
        let _ = writeln!(
            self.out,
            "\n/* phase {phase_index} ({}), pass {pass_index} (stage {}): loop {}{}; {}. */",
            self.phase.name,
            function.stage,
            if path.is_empty() {
                "[batch]".to_string()
            } else {
                path.join(" > ")
            },
            if function.reverse {
                ", tokens backwards"
            } else {
                ""
            },
            match (function.per_group, self.threads) {
                (true, true) => "a block per group, threads over tokens",
                (true, false) => "a block per group, one thread",
                (false, _) => "one thread",
            }
        );
        let _ = writeln!(
            self.out,
            "RLX_KERNEL void {name}(void* const* table, rlx_u64 g_begin, rlx_u64 g_end) {{"
        );
        if self.threads {
            self.line("const long long tid = (long long)threadIdx.x, nth = (long long)blockDim.x;");
            self.line("__shared__ rlx_sum rlx_red[RLX_MAX_BLOCK];");
        } else {
            self.line("if (threadIdx.x != 0) return;");
        }
        if !function.per_group {
            self.line("if (blockIdx.x != 0) return;");
        }
        // The ABI's fixed arrays (`abi::Fixed`), the entry's coordinates, the buffers used.
        let mut unused = Vec::new();
        for fixed in Fixed::ALL {
            if fixed == Fixed::Sizes {
                // Read where a size is bound (`c_index` of `Index::Size`).
                continue;
            }
            let ty = if fixed.is_float() {
                "double"
            } else {
                "rlx_u64"
            };
            let (name, slot) = (fixed.c_name(), fixed.slot());
            self.line(&format!("const {ty}* {name} = (const {ty}*)table[{slot}];"));
            unused.push(name);
        }
        unused.extend(self.binds(&function.binds));
        unused.push("g_end");
        self.void(&unused);
        for &b in &function.buffers {
            let ty = self.ty(b)?;
            let slot = abi::buffer_slot(b);
            self.line(&format!("{ty}* b{b} = ({ty}*)table[{slot}];"));
        }
        self.block(&function.body)?;
        self.out.push_str("}\n");
        let _ = writeln!(self.out, "RLX_HOST_LAUNCHER({name})");
        Ok(())
    }

    /// A declaration of each bound coordinate; returns their names.
    fn binds(&mut self, binds: &[(Coord, Index)]) -> Vec<&'static str> {
        for (coord, value) in binds {
            self.line(&format!(
                "const long long {} = {};",
                coord.name(),
                c_index(value)
            ));
        }
        binds.iter().map(|(coord, _)| coord.name()).collect()
    }

    /// `(void)x;` for names that may be unused.
    fn void(&mut self, names: &[&str]) {
        let text: Vec<String> = names.iter().map(|n| format!("(void){n};")).collect();
        if !text.is_empty() {
            self.line(&text.join(" "));
        }
    }

    fn lit(&self, v: f64) -> String {
        literal(v, self.ft)
    }

    fn operand(&self, operand: &Operand) -> Result<String, CodegenError> {
        Ok(match operand {
            Operand::Node(node) => format!("v{}", node.0),
            Operand::Load(load) => {
                let index = c_index(&load.index);
                self.ty(load.buffer)?;
                let v = format!("((rlx_acc)b{}[{index}])", load.buffer);
                match load.count {
                    None => v,
                    Some(count) => {
                        self.ty(count)?;
                        format!("(((rlx_acc)b{count}[{index}]) == 0 ? (rlx_acc)0 : {v})")
                    }
                }
            }
            Operand::Zero => "(rlx_acc)0".into(),
            Operand::One => "(rlx_acc)1".into(),
        })
    }

    /// The C expression of a `Let`.
    fn expr(&self, node_id: NodeId, expr: &Expr) -> Result<String, CodegenError> {
        Ok(match expr {
            Expr::Op => self.op(node_id)?,
            Expr::Const(v) => self.lit(*v),
            Expr::Scalar(scalar) => format!("((rlx_acc)sc[{}])", scalar.index()),
            Expr::Count(index) => format!("((rlx_acc){})", c_index(index)),
            Expr::Operand(operand) => self.operand(operand)?,
            Expr::Select { cond, yes, no } => format!(
                "({} ? {} : {})",
                c_cond(cond),
                self.operand(yes)?,
                self.operand(no)?
            ),
        })
    }

    /// A node's element-wise op over its operands (the op table's C forms).
    fn op(&self, node_id: NodeId) -> Result<String, CodegenError> {
        let graph = self.graph;
        let node = graph.node(node_id);
        let arg = |k: usize| -> Result<String, CodegenError> {
            node.args
                .get(k)
                .map(|a| format!("v{}", a.0))
                .ok_or_else(|| format!("internal: operand {k} of %{} missing", node_id.0).into())
        };
        let cond = |k: usize| -> Result<String, CodegenError> { Ok(format!("({} != 0)", arg(k)?)) };
        let truth = |c: String| format!("(({c}) ? (rlx_acc)1 : (rlx_acc)0)");
        Ok(match &node.op {
            Op::Copy | Op::StopGrad => arg(0)?,
            Op::Neg => format!("(-{})", arg(0)?),
            Op::Not => truth(format!("!{}", cond(0)?)),
            Op::Add => format!("({} + {})", arg(0)?, arg(1)?),
            Op::Sub => format!("({} - {})", arg(0)?, arg(1)?),
            Op::Mul => format!("({} * {})", arg(0)?, arg(1)?),
            Op::Div => format!("({} / {})", arg(0)?, arg(1)?),
            Op::Min | Op::Max => {
                let constant = |k: usize| match graph.node(node.args[k]).op {
                    Op::Const(v) => !v.is_nan(),
                    _ => false,
                };
                let max = node.op == Op::Max;
                if constant(0) || constant(1) {
                    // Against a constant k: a NaN x gives k, as `f64::max`/`min` do.
                    let (x, k) = if constant(1) {
                        (arg(0)?, arg(1)?)
                    } else {
                        (arg(1)?, arg(0)?)
                    };
                    let cmp = if max { '>' } else { '<' };
                    format!("({x} {cmp} {k} ? {x} : {k})")
                } else {
                    let f = if max { "rlx_max" } else { "rlx_min" };
                    format!("{f}({}, {})", arg(0)?, arg(1)?)
                }
            }
            Op::Eq | Op::Ne | Op::Lt | Op::Le | Op::Gt | Op::Ge => {
                let cmp = match node.op {
                    Op::Eq => "==",
                    Op::Ne => "!=",
                    Op::Lt => "<",
                    Op::Le => "<=",
                    Op::Gt => ">",
                    _ => ">=",
                };
                truth(format!("{} {cmp} {}", arg(0)?, arg(1)?))
            }
            Op::And => truth(format!("{} && {}", cond(0)?, cond(1)?)),
            Op::Or => truth(format!("{} || {}", cond(0)?, cond(1)?)),
            Op::Select => format!("({} ? {} : {})", cond(0)?, arg(1)?, arg(2)?),
            // A primitive: its op table expression.
            op => {
                let Some(primitive) = op.primitive() else {
                    return Err(CodegenError::Unsupported(format!(
                        "the CUDA backend cannot express `{}` in registers",
                        op.name()
                    )));
                };
                let operands = (0..primitive.arity)
                    .map(&arg)
                    .collect::<Result<Vec<_>, _>>()?;
                match primitive.cuda {
                    Cuda::Libm(name) => format!("{}({})", self.fn_name(name), operands.join(", ")),
                    Cuda::Expr(template) => ops::fill(template, &operands),
                    Cuda::Inline => {
                        return Err(format!(
                            "internal: `{}` has no arm of its own in the CUDA backend",
                            op.name()
                        )
                        .into())
                    }
                }
            }
        })
    }

    /// `buffer[index] = value` (converted to the buffer's type), by thread 0 only with `once` in a
    /// block-parallel kernel.
    fn store(
        &mut self,
        buffer: BufferId,
        index: &str,
        value: &str,
        once: bool,
    ) -> Result<(), CodegenError> {
        let ty = self.ty(buffer)?;
        let text = format!("b{buffer}[{index}] = ({ty})({value});");
        if once && self.threads {
            self.line(&format!("if (tid == 0) {text}"));
        } else {
            self.line(&text);
        }
        Ok(())
    }

    fn block(&mut self, body: &[Stmt]) -> Result<(), CodegenError> {
        for stmt in body {
            self.stmt(stmt)?;
        }
        Ok(())
    }

    fn stmt(&mut self, stmt: &Stmt) -> Result<(), CodegenError> {
        match stmt {
            Stmt::Let { node, expr } => {
                let value = self.expr(*node, expr)?;
                self.line(&format!("const rlx_acc v{} = {value};", node.0));
            }
            Stmt::Loop(l) => self.child_loop(l)?,
            Stmt::Store {
                buffer,
                index,
                value,
                once,
            } => {
                let value = self.operand(value)?;
                self.store(*buffer, &c_index(index), &value, *once)?;
            }
            Stmt::Update {
                op,
                buffer,
                count,
                index,
                x,
                once,
            } => {
                let index = c_index(index);
                let x = self.operand(x)?;
                let old = format!("((rlx_sum)b{buffer}[{index}])");
                let new = accumulate(*op, &old, &format!("(rlx_sum)({x})"));
                let mut body = Vec::new();
                body.push(format!(
                    "b{buffer}[{index}] = ({})({new});",
                    self.ty(*buffer)?
                ));
                if let Some(count) = count {
                    body.push(format!(
                        "b{count}[{index}] = ({})(((rlx_sum)b{count}[{index}]) + (rlx_sum)1);",
                        self.ty(*count)?
                    ));
                }
                if *once && self.threads {
                    self.line(&format!("if (tid == 0) {{ {} }}", body.join(" ")));
                } else {
                    for b in body {
                        self.line(&b);
                    }
                }
            }
            Stmt::Reset { acc, op, count } => {
                let init = if matches!(op, Reduction::Max | Reduction::Min) {
                    self.lit(f64::NAN)
                } else {
                    "(rlx_sum)0".into()
                };
                self.line(&format!("rlx_sum a{acc} = {init};"));
                if *count {
                    self.line(&format!("rlx_sum n{acc} = (rlx_sum)0;"));
                }
            }
            Stmt::Accumulate { acc, op, x, count } => {
                let x = self.operand(x)?;
                let new = accumulate(*op, &format!("a{acc}"), &format!("(rlx_sum)({x})"));
                self.line(&format!("a{acc} = {new};"));
                if *count {
                    self.line(&format!("n{acc} += (rlx_sum)1;"));
                }
            }
            Stmt::ScanReset { carry } => self.line(&format!("rlx_acc s{carry} = (rlx_acc)0;")),
            Stmt::Scan {
                carry,
                x,
                decay,
                buffer,
                index,
            } => {
                self.line(&format!(
                    "s{carry} = v{} + (s{carry} == (rlx_acc)0 ? (rlx_acc)0 : v{} * s{carry});",
                    x.0, decay.0
                ));
                self.store(*buffer, &c_index(index), &format!("s{carry}"), false)?;
            }
            Stmt::Finish {
                acc,
                op,
                block,
                buffer,
                count,
                index,
                once,
            } => {
                let index = c_index(index);
                let mut value = format!("a{acc}");
                let mut n = format!("n{acc}");
                // Token contributions are split across the threads: a block reduction.
                if *block && self.threads {
                    let code = match op {
                        Reduction::Max => 1,
                        Reduction::Min => 2,
                        _ => 0,
                    };
                    self.line(&format!(
                        "const rlx_sum r{acc} = rlx_block_reduce(a{acc}, {code}, rlx_red);"
                    ));
                    value = format!("r{acc}");
                    if count.is_some() {
                        self.line(&format!(
                            "const rlx_sum rn{acc} = rlx_block_reduce(n{acc}, 0, rlx_red);"
                        ));
                        n = format!("rn{acc}");
                    }
                }
                self.store(*buffer, &index, &value, *once)?;
                if let Some(count) = count {
                    self.store(*count, &index, &n, *once)?;
                }
            }
        }
        Ok(())
    }

    fn open(&mut self, header: &str) {
        if header.is_empty() {
            self.line("{");
        } else {
            self.line(&format!("{header} {{"));
        }
        self.indent += 1;
    }

    fn close(&mut self) {
        self.indent -= 1;
        self.line("}");
    }

    fn child_loop(&mut self, l: &Loop) -> Result<(), CodegenError> {
        let head = &l.head;
        let c = head.counter.name();
        let (start, end) = (c_index(&head.start), c_index(&head.end));
        if head.counter == Coord::G {
            // One block per group.
            self.open("");
            self.line(&format!(
                "const long long {c} = {start} + (long long)blockIdx.x;"
            ));
            self.line(&format!("if ({c} >= {end}) return;"));
        } else {
            self.open(&match l.order {
                Order::Forward => format!("for (long long {c} = {start}; {c} < {end}; {c}++)"),
                Order::Backward => {
                    format!("for (long long {c} = {end} - 1; {c} >= {start}; {c}--)")
                }
                Order::Split if self.threads => {
                    format!("for (long long {c} = {start} + tid; {c} < {end}; {c} += nth)")
                }
                Order::Split => format!("for (long long {c} = {start}; {c} < {end}; {c}++)"),
            });
        }
        if let Some(skip) = &head.skip {
            self.line(&format!("if ({c} == {}) continue;", c_index(skip)));
        }
        let names = self.binds(&head.binds);
        self.void(&names);
        self.block(&l.body)?;
        self.close();
        Ok(())
    }
}

fn accumulate(op: Reduction, old: &str, x: &str) -> String {
    match op {
        Reduction::Sum
        | Reduction::Count
        | Reduction::SumByOther
        | Reduction::ContractRows
        | Reduction::ContractCols => format!("{old} + {x}"),
        Reduction::Max => format!("rlx_sum_max({old}, {x})"),
        Reduction::Min => format!("rlx_sum_min({old}, {x})"),
    }
}
