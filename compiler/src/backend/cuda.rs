//! Stage `codegen` for NVIDIA GPUs: every loop pass and every `combine` pass of a kernel plan becomes
//! one `extern "C" __global__` CUDA C kernel, compiled at run time with NVRTC (`rlx_runtime::cuda`).
//! `rlxc compile RECIPE --emit cuda` prints the source. docs/gpu.md describes the design and the checks.
//!
//! # Launch geometry
//! Every kernel has the JIT's calling convention (`jit::slot`): `(void* const* table, u64 g_begin,
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
//! plan says, registers and reductions are `rlx_acc` (`double` or `float`). Transcendental functions
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

use std::collections::HashSet;
use std::fmt::Write as _;

use super::plan::{
    Action, BufferId, Entry, KernelPlan, LoopKind, LoopPass, Pass, Phase, Reduction, Role,
};
use super::Precision;
use crate::ir::{Feature, Graph, Level, NodeId, Op, Shape, Value};
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
/* The interpreter's stable forms (rlx_compiler::ir). */
"#
    );
    out.push_str(&Primitive::cuda_prelude(t, s));
    let _ = write!(
        out,
        r#"/* A block-wide reduction in a fixed order: a pairwise tree over the thread index (any block size).
   op: 0 sum, 1 max, 2 min. Every thread of the block must call it; every thread gets the result. */
RLX_DEVICE {t} rlx_block_reduce({t} v, int op, {t}* red) {{
    unsigned tid = threadIdx.x, nth = blockDim.x;
    red[tid] = v;
    __syncthreads();
    for (unsigned s = 1; s < nth; s <<= 1) {{
        if (tid % (2 * s) == 0 && tid + s < nth) {{
            {t} a = red[tid], b = red[tid + s];
            red[tid] = op == 0 ? a + b : (op == 1 ? rlx_max(a, b) : rlx_min(a, b));
        }}
        __syncthreads();
    }}
    {t} out = red[0];
    __syncthreads();
    return out;
}}
"#
    );
    out
}

/// Generate the CUDA C of every pass of `plan` (for `graph`). An error names what cannot be expressed.
pub fn generate(graph: &Graph, plan: &KernelPlan) -> Result<CudaSource, String> {
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
    let _ = writeln!(source, "#define RLX_MAX_BLOCK {MAX_BLOCK}");
    source.push_str(&functions(ft));
    let mut launches = Vec::new();
    for (phase_index, phase) in plan.phases.iter().enumerate() {
        let mut phase_launches = Vec::new();
        for (pass_index, pass) in phase.passes.iter().enumerate() {
            match pass {
                Pass::Loop(loop_pass) => {
                    let name = format!("rlx_p{phase_index}_{pass_index}");
                    let threads = block_parallel(loop_pass);
                    let mut gen = Gen {
                        out: String::new(),
                        graph,
                        phase,
                        pass: loop_pass,
                        ft,
                        threads,
                        tok_depth: loop_pass
                            .path
                            .iter()
                            .position(|k| *k == LoopKind::Tok)
                            .map(|p| p + 1),
                        bound: HashSet::new(),
                        indent: 1,
                    };
                    gen.kernel(&name, phase_index, pass_index)?;
                    source.push_str(&gen.out);
                    phase_launches.push(Some(Launch {
                        name,
                        per_group: loop_pass.parallel(),
                        threads,
                    }));
                }
                Pass::Combine {
                    node,
                    op,
                    partial,
                    partial_count,
                    value,
                    count,
                    ..
                } => {
                    let name = format!("rlx_c{phase_index}_{pass_index}");
                    combine_kernel(
                        &mut source,
                        &name,
                        phase,
                        graph.node(*node).shape.feature.as_ref(),
                        *op,
                        (*partial, *partial_count),
                        (*value, *count),
                    )?;
                    phase_launches.push(Some(Launch {
                        name,
                        per_group: false,
                        threads: false,
                    }));
                }
                Pass::Ngrams { .. }
                | Pass::Rank { .. }
                | Pass::Uniform { .. }
                | Pass::Components { .. } => phase_launches.push(None),
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

/// Whether the block's threads share a pass's token loop: a token pass without a scan (a recurrence)
/// and without memory accumulation inside its token loop.
fn block_parallel(pass: &LoopPass) -> bool {
    let Some(tok) = pass.path.iter().position(|k| *k == LoopKind::Tok) else {
        return false;
    };
    let tok_depth = tok + 1;
    pass.actions.iter().all(|action| match action {
        Action::Scan { .. } => false,
        Action::Reduce { depth, target, .. } => *depth < tok_depth || target.register,
        Action::Store { .. } => true,
    })
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

fn combine_kernel(
    out: &mut String,
    name: &str,
    phase: &Phase,
    feature: Option<&Feature>,
    op: Reduction,
    (partial, partial_count): (BufferId, Option<BufferId>),
    (value, count): (BufferId, Option<BufferId>),
) -> Result<(), String> {
    let ty = |b: BufferId| -> Result<&'static str, String> {
        phase
            .buffers
            .get(b as usize)
            .map(|buffer| c_type(buffer.storage))
            .ok_or_else(|| format!("internal: unknown buffer b{b}"))
    };
    fn batch_width(feature: &Feature) -> String {
        match feature {
            Feature::Dim => "(long long)((const rlx_u64*)table[7])[0]".into(),
            Feature::Rubric { len, .. } => format!("{len}"),
            // Criteria are per group: a batch-level criterion axis is empty.
            Feature::Crit => "0".into(),
            Feature::Matrix { rows, cols } => {
                format!("({} * {})", batch_width(rows), batch_width(cols))
            }
        }
    }
    let width = match feature {
        None => "1".to_string(),
        Some(feature) => batch_width(feature),
    };
    let (combine, identity) = match op {
        Reduction::Max => ("rlx_max(a, b)", "rlx_nan()"),
        Reduction::Min => ("rlx_min(a, b)", "rlx_nan()"),
        Reduction::Sum
        | Reduction::Count
        | Reduction::SumByOther
        | Reduction::ContractRows
        | Reduction::ContractCols => ("a + b", "0"),
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
        "    if (threadIdx.x != 0 || blockIdx.x != 0) return;\n    long long groups = (long long)g_end - (long long)g_begin;\n    long long width = {width};"
    );
    let _ = writeln!(
        out,
        "    {} *p = ({} *)table[{}];\n    {} *v = ({} *)table[{}];",
        ty(partial)?,
        ty(partial)?,
        super::jit::slot::FIRST_BUFFER + partial as usize,
        ty(value)?,
        ty(value)?,
        super::jit::slot::FIRST_BUFFER + value as usize
    );
    if let (Some(pc), Some(c)) = (partial_count, count) {
        let _ = writeln!(
            out,
            "    {} *pc = ({} *)table[{}];\n    {} *vc = ({} *)table[{}];",
            ty(pc)?,
            ty(pc)?,
            super::jit::slot::FIRST_BUFFER + pc as usize,
            ty(c)?,
            ty(c)?,
            super::jit::slot::FIRST_BUFFER + c as usize
        );
    }
    let _ = writeln!(out, "    for (long long f = 0; f < width; f++) {{");
    let _ = writeln!(
        out,
        "        for (long long s = 1; s < groups; s <<= 1) {{\n            for (long long i = 0; i + s < groups; i += 2 * s) {{\n                rlx_acc a = (rlx_acc)p[i * width + f], b = (rlx_acc)p[(i + s) * width + f];\n                p[i * width + f] = {combine};"
    );
    if partial_count.is_some() && count.is_some() {
        let _ = writeln!(
            out,
            "                pc[i * width + f] = (rlx_acc)pc[i * width + f] + (rlx_acc)pc[(i + s) * width + f];"
        );
    }
    let _ = writeln!(out, "            }}\n        }}");
    let _ = writeln!(
        out,
        "        v[f] = groups > 0 ? (rlx_acc)p[f] : (rlx_acc){identity};"
    );
    if partial_count.is_some() && count.is_some() {
        let _ = writeln!(
            out,
            "        vc[f] = groups > 0 ? (rlx_acc)pc[f] : (rlx_acc)0;"
        );
    }
    let _ = writeln!(out, "    }}\n}}\nRLX_HOST_LAUNCHER({name})");
    Ok(())
}

struct Gen<'a> {
    out: String,
    graph: &'a Graph,
    phase: &'a Phase,
    pass: &'a LoopPass,
    ft: Precision,
    /// Block-parallel (see `block_parallel`).
    threads: bool,
    /// The depth of the token loop's body, if the pass has one.
    tok_depth: Option<usize>,
    /// Coordinates bound so far.
    bound: HashSet<&'static str>,
    indent: usize,
}

fn unbound(name: &str) -> String {
    format!("internal: coordinate {name} is not bound in this pass")
}

impl Gen<'_> {
    fn line(&mut self, text: &str) {
        for _ in 0..self.indent {
            self.out.push_str("    ");
        }
        self.out.push_str(text);
        self.out.push('\n');
    }

    fn coord(&self, name: &'static str) -> Result<&'static str, String> {
        if self.bound.contains(name) {
            Ok(name)
        } else {
            Err(unbound(name))
        }
    }

    fn fn_name(&self, name: &str) -> String {
        match self.ft {
            Precision::F64 => name.to_string(),
            Precision::F32 => format!("{name}f"),
        }
    }

    fn storage(&self, buffer: BufferId) -> Result<Precision, String> {
        self.phase
            .buffers
            .get(buffer as usize)
            .map(|b| b.storage)
            .ok_or_else(|| format!("internal: unknown buffer b{buffer}"))
    }

    fn kernel(&mut self, name: &str, phase_index: usize, pass_index: usize) -> Result<(), String> {
        let path: Vec<&str> = self.pass.path.iter().map(loop_name).collect();
        let _ = writeln!(
            self.out,
            "\n/* phase {phase_index} ({}), pass {pass_index} (stage {}): loop {}{}; {}. */",
            self.phase.name,
            self.pass.stage,
            if path.is_empty() {
                "[batch]".to_string()
            } else {
                path.join(" > ")
            },
            if self.pass.reverse {
                ", tokens backwards"
            } else {
                ""
            },
            match (self.pass.parallel(), self.threads) {
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
            self.line("__shared__ rlx_acc rlx_red[RLX_MAX_BLOCK];");
        } else {
            self.line("if (threadIdx.x != 0) return;");
        }
        if !self.pass.parallel() {
            self.line("if (blockIdx.x != 0) return;");
        }
        self.line("const rlx_u64* go = (const rlx_u64*)table[0];");
        self.line("const rlx_u64* to = (const rlx_u64*)table[1];");
        self.line("const rlx_u64* co = (const rlx_u64*)table[2];");
        self.line("const rlx_u64* rcb_t = (const rlx_u64*)table[3];");
        self.line("const rlx_u64* po = (const rlx_u64*)table[4];");
        self.line("const rlx_u64* pcb_t = (const rlx_u64*)table[5];");
        self.line("const double* sc = (const double*)table[6];");
        self.line("const long long dim = (long long)((const rlx_u64*)table[7])[0];");
        self.line("(void)go; (void)to; (void)co; (void)rcb_t; (void)po; (void)pcb_t; (void)sc; (void)dim; (void)g_end;");
        for b in self.pass.buffers_used(self.graph, self.phase) {
            let ty = c_type(self.storage(b)?);
            let slot = super::jit::slot::FIRST_BUFFER + b as usize;
            self.line(&format!("{ty}* b{b} = ({ty}*)table[{slot}];"));
        }
        self.bound.insert("dim");
        self.level(0)?;
        self.out.push_str("}\n");
        let _ = writeln!(self.out, "RLX_HOST_LAUNCHER({name})");
        Ok(())
    }

    fn width(&self, feature: &Feature) -> Result<String, String> {
        Ok(match feature {
            Feature::Crit => {
                if self.bound.contains("cn") {
                    "cn".into()
                } else {
                    "0LL".into()
                }
            }
            Feature::Dim => self.coord("dim")?.into(),
            Feature::Rubric { len, .. } => format!("{len}LL"),
            Feature::Matrix { rows, cols } => {
                format!("({} * {})", self.width(rows)?, self.width(cols)?)
            }
        })
    }

    /// At matrix element f = a·cols + b of the current feature loop: its row a (`rows`) or column b.
    fn matrix_coordinate(&self, matrix: Option<&Feature>, rows: bool) -> Result<String, String> {
        let Some(Feature::Matrix { cols, .. }) = matrix else {
            return Err("internal: a matrix operation on a value without a matrix axis".into());
        };
        let f = self.coord("f")?;
        let width = self.width(cols)?;
        Ok(if rows {
            format!("({f} / {width})")
        } else {
            format!("({f} % {width})")
        })
    }

    /// The element of `shape` above the current point (as the JIT's `index`).
    fn index(&self, shape: &Shape, other: bool, feature: Option<&str>) -> Result<String, String> {
        let f = || -> Result<String, String> {
            match feature {
                Some(f) => Ok(f.to_string()),
                None => Ok(self.coord("f")?.to_string()),
            }
        };
        let (r, li) = if other { ("j", "lj") } else { ("r", "li") };
        Ok(match (shape.level, &shape.feature) {
            (Level::Batch, None) => "0LL".into(),
            (Level::Batch, Some(_)) => f()?,
            (Level::Group, None) => self.coord("g")?.into(),
            (Level::Group, Some(Feature::Crit)) => format!("({} + {})", self.coord("cs")?, f()?),
            (Level::Group, Some(feature)) => {
                format!(
                    "({} * {} + {})",
                    self.coord("g")?,
                    self.width(feature)?,
                    f()?
                )
            }
            (Level::Resp, None) => self.coord_any(r)?,
            (Level::Resp, Some(Feature::Crit)) => format!(
                "({} + {} * {} + {})",
                self.coord("rcb")?,
                self.coord_any(li)?,
                self.coord("cn")?,
                f()?
            ),
            (Level::Resp, Some(feature)) => {
                format!(
                    "({} * {} + {})",
                    self.coord_any(r)?,
                    self.width(feature)?,
                    f()?
                )
            }
            (Level::Tok, None) => self.coord("t")?.into(),
            (Level::Pair, None) => self.coord("p")?.into(),
            (Level::Pair, Some(Feature::Crit)) => format!(
                "({} + ({} - {}) * {} + {})",
                self.coord("pcb")?,
                self.coord("p")?,
                self.coord("pb")?,
                self.coord("cn")?,
                f()?
            ),
            (Level::Pair, Some(feature)) => {
                format!(
                    "({} * {} + {})",
                    self.coord("p")?,
                    self.width(feature)?,
                    f()?
                )
            }
            (Level::Tok, Some(_)) => return Err("internal: token values have no feature".into()),
        })
    }

    fn coord_any(&self, name: &str) -> Result<String, String> {
        if self.bound.contains(name) {
            Ok(name.to_string())
        } else {
            Err(unbound(name))
        }
    }

    /// Element `index` of a buffer, in the accumulation precision.
    fn load(&self, buffer: BufferId, index: &str) -> Result<String, String> {
        self.storage(buffer)?;
        Ok(format!("((rlx_acc)b{buffer}[{index}])"))
    }

    /// A node's value from its buffer at `index`; an empty `max`/`min` reads as 0.
    fn load_node(&self, node: NodeId, index: &str) -> Result<String, String> {
        match self.phase.roles[node.0 as usize] {
            Role::Input(b) | Role::Carried(b) => self.load(b, index),
            Role::Buffer { value, count } => {
                let v = self.load(value, index)?;
                match count {
                    None => Ok(v),
                    Some(count) => Ok(format!(
                        "({} == 0 ? (rlx_acc)0 : {v})",
                        self.load(count, index)?
                    )),
                }
            }
            Role::Inline | Role::Unused => Err(format!(
                "internal: %{} is read at another element but has no buffer",
                node.0
            )),
        }
    }

    fn lit(&self, v: f64) -> String {
        literal(v, self.ft)
    }

    /// The C expression of one entry.
    fn entry(&self, entry: &Entry) -> Result<String, String> {
        let graph = self.graph;
        let node = graph.node(entry.node);
        if entry.load {
            let index = self.index(&node.shape, false, None)?;
            return self.load_node(entry.node, &index);
        }
        let arg = |k: usize| -> Result<String, String> {
            node.args
                .get(k)
                .map(|a| format!("v{}", a.0))
                .ok_or_else(|| format!("internal: operand {k} of %{} missing", entry.node.0))
        };
        let cond = |k: usize| -> Result<String, String> { Ok(format!("({} != 0)", arg(k)?)) };
        let truth = |c: String| format!("(({c}) ? (rlx_acc)1 : (rlx_acc)0)");
        Ok(match &node.op {
            Op::Const(v) => self.lit(*v),
            Op::Value(value) => match value {
                Value::Step => "((rlx_acc)sc[0])".into(),
                Value::Progress => "((rlx_acc)sc[1])".into(),
                Value::N => format!("((rlx_acc){})", self.coord("n")?),
                Value::RespIndex => format!("((rlx_acc){})", self.coord("li")?),
                Value::Length => {
                    format!("((rlx_acc)({} - {}))", self.coord("te")?, self.coord("ts")?)
                }
                Value::TokenIndex => {
                    format!("((rlx_acc)({} - {}))", self.coord("t")?, self.coord("ts")?)
                }
                Value::Inf => self.lit(f64::INFINITY),
                Value::Pi => self.lit(std::f64::consts::PI),
            },
            Op::Input(_) => return Err("internal: inputs are loaded".into()),
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
            Op::Other => {
                let operand = node.args[0];
                let shape = graph.node(operand).shape.clone();
                if shape.level == Level::Resp {
                    let index = self.index(&shape, true, None)?;
                    self.load_node(operand, &index)?
                } else {
                    arg(0)?
                }
            }
            Op::Index(k) => {
                let operand = node.args[0];
                let shape = graph.node(operand).shape.clone();
                if matches!(shape.feature, Some(Feature::Rubric { .. })) {
                    let k = format!("{k}LL");
                    let index = self.index(&shape, false, Some(&k))?;
                    self.load_node(operand, &index)?
                } else {
                    arg(0)?
                }
            }
            Op::SpreadRows | Op::SpreadCols => {
                let operand = node.args[0];
                let shape = graph.node(operand).shape.clone();
                let k =
                    self.matrix_coordinate(node.shape.feature.as_ref(), node.op == Op::SpreadRows)?;
                let index = self.index(&shape, false, Some(&k))?;
                self.load_node(operand, &index)?
            }
            Op::Unindex(k) => format!("({} == {k}LL ? {} : (rlx_acc)0)", self.coord("f")?, arg(0)?),
            Op::Shift { offset } => {
                let (t, ts, te) = (self.coord("t")?, self.coord("ts")?, self.coord("te")?);
                let source = format!("({t} + ({offset}LL))");
                let inside = format!("({source} >= {ts} && {source} < {te})");
                let operand = node.args[0];
                let shape = graph.node(operand).shape.clone();
                let value = if shape.level == Level::Tok {
                    // Clamp into the response so the load is in bounds either way.
                    let clamped = format!("({inside} ? {source} : {t})");
                    self.load_node(operand, &clamped)?
                } else {
                    arg(0)?
                };
                format!("({inside} ? {value} : {})", arg(1)?)
            }
            // A primitive: its op table expression.
            op => {
                let Some(primitive) = op.primitive() else {
                    return Err(format!(
                        "the CUDA backend cannot express `{}` in registers",
                        op.name()
                    ));
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
                        ))
                    }
                }
            }
        })
    }

    /// Whether code at `depth` runs in every thread while only thread 0 may have side effects.
    fn above_tokens(&self, depth: usize) -> bool {
        self.threads && self.tok_depth.is_some_and(|t| depth < t)
    }

    fn store(
        &mut self,
        buffer: BufferId,
        index: &str,
        value: &str,
        guard: bool,
    ) -> Result<(), String> {
        let ty = c_type(self.storage(buffer)?);
        let text = format!("b{buffer}[{index}] = ({ty})({value});");
        if guard {
            self.line(&format!("if (tid == 0) {text}"));
        } else {
            self.line(&text);
        }
        Ok(())
    }

    /// Emit everything at loop depth `depth`, then the loop below it (as the JIT's `level`).
    fn level(&mut self, depth: usize) -> Result<(), String> {
        let pass = self.pass;
        for entry in pass.entries.iter().filter(|e| e.depth == depth) {
            let value = self.entry(entry)?;
            self.line(&format!("const rlx_acc v{} = {value};", entry.node.0));
        }
        for (position, action) in pass.actions.iter().enumerate() {
            match action {
                Action::Reduce { op, target, .. } if target.register && target.depth == depth => {
                    let init = if matches!(op, Reduction::Max | Reduction::Min) {
                        self.lit(f64::NAN)
                    } else {
                        "(rlx_acc)0".into()
                    };
                    self.line(&format!("rlx_acc a{position} = {init};"));
                    if target.count.is_some() {
                        self.line(&format!("rlx_acc n{position} = (rlx_acc)0;"));
                    }
                }
                Action::Scan { carry_depth, .. } if *carry_depth == depth => {
                    self.line(&format!("rlx_acc s{position} = (rlx_acc)0;"));
                }
                _ => {}
            }
        }
        let guard = self.above_tokens(depth);
        for (position, action) in pass.actions.iter().enumerate() {
            match action {
                Action::Store {
                    node,
                    shape,
                    buffer,
                    depth: d,
                } if *d == depth => {
                    let index = self.index(shape, false, None)?;
                    self.store(*buffer, &index, &format!("v{}", node.0), guard)?;
                }
                Action::Reduce {
                    op,
                    operand,
                    from,
                    to,
                    depth: d,
                    target,
                    ..
                } if *d == depth => {
                    let x = if *op == Reduction::Count {
                        "(rlx_acc)1".to_string()
                    } else {
                        format!("v{}", operand.0)
                    };
                    if target.register {
                        let new = accumulate(*op, &format!("a{position}"), &x);
                        self.line(&format!("a{position} = {new};"));
                        if target.count.is_some() {
                            self.line(&format!("n{position} += (rlx_acc)1;"));
                        }
                    } else {
                        let index = self.target_index((from, to), target.partial, *op)?;
                        let old = self.load(target.value, &index)?;
                        let new = accumulate(*op, &old, &x);
                        let mut body = Vec::new();
                        let ty = c_type(self.storage(target.value)?);
                        body.push(format!("b{}[{index}] = ({ty})({new});", target.value));
                        if let Some(count) = target.count {
                            let ty = c_type(self.storage(count)?);
                            let old = self.load(count, &index)?;
                            body.push(format!("b{count}[{index}] = ({ty})({old} + (rlx_acc)1);"));
                        }
                        if guard {
                            self.line(&format!("if (tid == 0) {{ {} }}", body.join(" ")));
                        } else {
                            for b in body {
                                self.line(&b);
                            }
                        }
                    }
                }
                Action::Scan {
                    x,
                    decay,
                    buffer,
                    depth: d,
                    ..
                } if *d == depth => {
                    self.line(&format!(
                        "s{position} = v{} + (s{position} == (rlx_acc)0 ? (rlx_acc)0 : v{} * s{position});",
                        x.0, decay.0
                    ));
                    let t = self.coord("t")?;
                    self.store(*buffer, t, &format!("s{position}"), false)?;
                }
                _ => {}
            }
        }
        if depth < pass.path.len() {
            let saved = self.bound.clone();
            self.child_loop(depth)?;
            self.bound = saved;
        }
        // Register accumulators complete here.
        for (position, action) in pass.actions.iter().enumerate() {
            if let Action::Reduce {
                op,
                from,
                to,
                target,
                depth: from_depth,
                ..
            } = action
            {
                if target.register && target.depth == depth {
                    let index = self.target_index((from, to), target.partial, *op)?;
                    let mut value = format!("a{position}");
                    let mut count = format!("n{position}");
                    // Token contributions are split across the threads: a block reduction.
                    if self.threads && Some(*from_depth) == self.tok_depth {
                        let code = match op {
                            Reduction::Max => 1,
                            Reduction::Min => 2,
                            _ => 0,
                        };
                        self.line(&format!(
                            "const rlx_acc r{position} = rlx_block_reduce(a{position}, {code}, rlx_red);"
                        ));
                        value = format!("r{position}");
                        if target.count.is_some() {
                            self.line(&format!(
                                "const rlx_acc rn{position} = rlx_block_reduce(n{position}, 0, rlx_red);"
                            ));
                            count = format!("rn{position}");
                        }
                    }
                    self.store(target.value, &index, &value, guard)?;
                    if let Some(buffer) = target.count {
                        self.store(buffer, &index, &count, guard)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn target_index(
        &self,
        (from, to): (&Shape, &Shape),
        partial: bool,
        op: Reduction,
    ) -> Result<String, String> {
        if matches!(op, Reduction::ContractRows | Reduction::ContractCols) {
            // Matrix element (a, b) adds into element b (over the rows) or a (over the columns).
            let k = self.matrix_coordinate(from.feature.as_ref(), op == Reduction::ContractCols)?;
            return self.index(to, false, Some(&k));
        }
        if partial {
            let g = self.coord("g")?;
            return match &to.feature {
                None => Ok(g.into()),
                Some(feature) => Ok(format!(
                    "({g} * {} + {})",
                    self.width(feature)?,
                    self.coord("f")?
                )),
            };
        }
        self.index(to, op == Reduction::SumByOther, None)
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

    fn child_loop(&mut self, depth: usize) -> Result<(), String> {
        let kind = self.pass.path[depth].clone();
        match kind {
            LoopKind::Group => {
                // One block per group.
                self.open("");
                self.line("const long long g = (long long)g_begin + (long long)blockIdx.x;");
                self.line("if (g >= (long long)g_end) return;");
                self.line("const long long gs = (long long)go[g], n = (long long)go[g + 1] - gs;");
                self.line("const long long cs = (long long)co[g], cn = (long long)co[g + 1] - cs;");
                self.line("const long long rcb = (long long)rcb_t[g], pb = (long long)po[g], pcb = (long long)pcb_t[g];");
                self.line("(void)gs; (void)n; (void)cs; (void)cn; (void)rcb; (void)pb; (void)pcb;");
                for c in ["g", "gs", "n", "cs", "cn", "rcb", "pb", "pcb"] {
                    self.bound.insert(c);
                }
                self.level(depth + 1)?;
                self.close();
            }
            LoopKind::Resp => {
                let (gs, n) = (self.coord("gs")?, self.coord("n")?);
                self.open(&format!("for (long long r = {gs}; r < {gs} + {n}; r++)"));
                self.line(&format!("const long long li = r - {gs};"));
                self.line("const long long ts = (long long)to[r], te = (long long)to[r + 1];");
                self.line("(void)li; (void)ts; (void)te;");
                for c in ["r", "li", "ts", "te"] {
                    self.bound.insert(c);
                }
                self.level(depth + 1)?;
                self.close();
            }
            LoopKind::Tok => {
                let (ts, te) = (self.coord("ts")?, self.coord("te")?);
                if self.threads {
                    self.open(&format!(
                        "for (long long t = {ts} + tid; t < {te}; t += nth)"
                    ));
                } else if self.pass.reverse {
                    self.open(&format!("for (long long t = {te} - 1; t >= {ts}; t--)"));
                } else {
                    self.open(&format!("for (long long t = {ts}; t < {te}; t++)"));
                }
                self.bound.insert("t");
                self.level(depth + 1)?;
                self.close();
            }
            LoopKind::Pair => {
                let (gs, n, r, li, pb) = (
                    self.coord("gs")?,
                    self.coord("n")?,
                    self.coord("r")?,
                    self.coord("li")?,
                    self.coord("pb")?,
                );
                self.open(&format!("for (long long j = {gs}; j < {gs} + {n}; j++)"));
                self.line(&format!("if (j == {r}) continue;"));
                self.line(&format!("const long long lj = j - {gs};"));
                // p = pair_base + li·(n − 1) + (lj − [lj > li])
                self.line(&format!(
                    "const long long p = {pb} + {li} * ({n} - 1) + (lj - (lj > {li} ? 1 : 0));"
                ));
                for c in ["j", "lj", "p"] {
                    self.bound.insert(c);
                }
                self.level(depth + 1)?;
                self.close();
            }
            LoopKind::Feature(feature) => {
                let width = self.width(&feature)?;
                self.open(&format!("for (long long f = 0; f < {width}; f++)"));
                self.bound.insert("f");
                self.level(depth + 1)?;
                self.close();
            }
        }
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
        Reduction::Max => format!("rlx_max({old}, {x})"),
        Reduction::Min => format!("rlx_min({old}, {x})"),
    }
}

fn loop_name(kind: &LoopKind) -> &'static str {
    match kind {
        LoopKind::Group => "group",
        LoopKind::Resp => "resp",
        LoopKind::Tok => "tok",
        LoopKind::Pair => "pair",
        LoopKind::Feature(Feature::Crit) => "crit",
        LoopKind::Feature(Feature::Dim) => "dim",
        LoopKind::Feature(Feature::Rubric { .. }) => "rubric",
        LoopKind::Feature(Feature::Matrix { .. }) => "matrix",
    }
}
