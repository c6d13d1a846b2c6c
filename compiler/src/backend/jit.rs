//! Stage `codegen`: every loop function of a plan's loop IR (`super::loops`) becomes one native
//! function, compiled with cranelift. This module is instruction selection over that IR: its loops,
//! index expressions (`super::layout`), loads and stores become cranelift instructions, its `let`s
//! registers (f64, or f32 with `Precision::F32` accumulation), with the JIT's own optimisations:
//! vectorised token loops (`Gen::simd_type`), the inlined `exp`, and-selections against zero.
//!
//! # Calling convention
//! `extern "C" fn(table: *const *mut u8, g_begin: usize, g_end: usize)`. The table is the ABI of
//! `super::abi` (the layout's `usize` arrays and the f64 scalars, then the phase's buffers in plan
//! order). A pass whose nest starts with groups visits groups `g_begin..g_end` only,
//! so the runtime can split groups across threads; other passes ignore the range.
//!
//! # Safety contract
//! The generated code performs unchecked loads and stores. It is sound when the caller passes a table
//! built from a validated layout (offsets start at 0, never decrease and agree with each other; see
//! `rlx_runtime::batch::Layout::validate`) with every buffer sized by `rlx_runtime::kernel`'s size
//! function for its shape, and a group range within the layout: every index the code computes is then
//! an element of that shape (the loops only visit elements of the layout, and `shift` clamps its source
//! to the response before loading).
//!
//! # Numerics
//! `exp`, the hot function of every ratio and KL term, is inlined: an argument known to lie within
//! [−700, 700] (`range`) by Tang's table method (`Gen::exp_table`: 2^(j/128) from a table, a degree-5
//! polynomial, degree 3 when the result is rounded to f32), any other by fdlibm's range reduction and
//! a degree-13 polynomial by Estrin's scheme (`Gen::exp_f64`, degree 8 for f32 results); both within
//! 1 ulp of libm. The other transcendental functions are calls to registered `extern "C"` shims
//! around the Rust functions the interpreter uses (`f64::ln`…, `rlx_compiler::ir::{sigmoid,
//! log_sigmoid, softplus, lgamma}`), so in f64 they give the interpreter's values bit for bit.
//! `min`/`max` follow `f64::min`/`f64::max` (a NaN operand is ignored), comparisons, `and`/`or`/`not`
//! and `where` follow Rust's operators (NaN is true as a condition).

use super::CodegenError;
use std::collections::HashMap;
use std::sync::Mutex;

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{
    types, AbiParam, Block, FuncRef, InstBuilder, InstructionData, MemFlagsData, Opcode, Type,
    UserFuncName, Value as ClifValue,
};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{default_libcall_names, FuncId, Linkage, Module};

use super::abi::{self, Fixed};
use super::layout::{Cond, Coord, Index};
use super::loops::{self, Expr, Function, Load, Loop, LoopFunction, Operand, Order, Stmt};
use super::plan::{Action, BufferId, KernelPlan, LoopPass, Reduction};
use super::Precision;
use crate::ir::{Graph, NodeId, Op, Value};
use crate::ops::{self, Jit, Shims};

/// The most variables one pass function may declare. Each register accumulator, count and scan carry is
/// a cranelift variable, which can become a parameter of every loop header it is live across, and
/// cranelift numbers a block's parameters with 16 bits (past 65,535 a debug assertion fires, and a
/// release build would wrap the index). The plan splits a loop into passes of at most
/// `plan::MAX_PASS_ACTIONS` actions (which also keeps compile time linear in the recipe), so a pass
/// declares a few hundred variables at most; this bound is the guard behind that rule: a pass past it
/// is refused with an error, and `rlx score` then runs the interpreter.
const MAX_PASS_VARIABLES: usize = 16_384;

/// An upper bound on the variables `pass`'s function declares: an accumulator (and its count) or a scan
/// carry in both the vectorised body and the scalar tail, and the loop counters.
fn pass_variables(pass: &LoopPass) -> usize {
    let per_action: usize = pass
        .actions
        .iter()
        .map(|action| match action {
            Action::Reduce { target, .. } if target.register => {
                2 * (1 + usize::from(target.count.is_some()))
            }
            Action::Scan { .. } => 2,
            _ => 0,
        })
        .sum();
    per_action + 4 * (pass.path.len() + 1)
}

/// A compiled loop pass (see the calling convention above).
pub type PassFn = unsafe extern "C" fn(table: *const *mut u8, g_begin: usize, g_end: usize);

/// The native code of a plan: one function per loop pass.
pub struct JitKernel {
    /// By phase, then pass: `Some` for loop passes.
    pub functions: Vec<Vec<Option<PassFn>>>,
    /// The CLIF of each loop pass, when asked for.
    pub clif: Vec<String>,
    /// Owns the code memory the pointers point into (a `Mutex` makes the kernel `Sync`; the module is
    /// only touched again when it is freed).
    module: Mutex<Option<JITModule>>,
}

impl std::fmt::Debug for JitKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JitKernel")
            .field("functions", &self.functions.len())
            .finish()
    }
}

impl Drop for JitKernel {
    fn drop(&mut self) {
        if let Ok(module) = self.module.get_mut() {
            if let Some(module) = module.take() {
                // SAFETY: the function pointers into this memory live in `self.functions`, which is
                // dropped with `self` and never handed out by value (the runtime calls them through
                // `&self`), so no pointer into the code can be used after this point.
                unsafe { module.free_memory() };
            }
        }
    }
}

/// The symbol of a primitive's shim in one precision (`rlx_log_sigmoid_f64`).
fn shim_symbol(op: &Op, precision: &str) -> String {
    format!("rlx_{}_{precision}", op.name())
}

/// The shims of the op table (`ops::shims`: the interpreter's own functions, callable from generated
/// code), by symbol.
fn symbols() -> Vec<(String, *const u8)> {
    let mut out: Vec<(String, *const u8)> = Vec::new();
    for primitive in ops::PRIMITIVES {
        let (double, single) = match primitive.shims {
            Some(Shims::Unary { double, single }) => (double as *const u8, single as *const u8),
            Some(Shims::Binary { double, single }) => (double as *const u8, single as *const u8),
            None => continue,
        };
        out.push((shim_symbol(&primitive.op, "f64"), double));
        out.push((shim_symbol(&primitive.op, "f32"), single));
    }
    out
}

/// How to generate code (`compile_with`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Codegen {
    /// Keep the CLIF text and machine code of each function in `JitKernel::clif`.
    pub keep_clif: bool,
    /// Vectorise the token loops that allow it (`Gen::simd_type`): f64×2 or f32×4 lanes, a scalar
    /// loop for the remaining tokens of each response. Off gives the scalar code (for comparison).
    pub simd: bool,
}

/// Compile every loop pass of `plan` (for `graph`), token loops vectorised. With `keep_clif`, the
/// CLIF text of each function is kept in `JitKernel::clif`.
pub fn compile(
    graph: &Graph,
    plan: &KernelPlan,
    keep_clif: bool,
) -> Result<JitKernel, CodegenError> {
    compile_with(
        graph,
        plan,
        Codegen {
            keep_clif,
            simd: true,
        },
    )
}

/// Compile every loop pass of `plan` (for `graph`) as `codegen` says.
pub fn compile_with(
    graph: &Graph,
    plan: &KernelPlan,
    codegen: Codegen,
) -> Result<JitKernel, CodegenError> {
    let keep_clif = codegen.keep_clif;
    if std::mem::size_of::<usize>() != 8 {
        return Err("the JIT needs a 64-bit target".into());
    }
    let mut flags = settings::builder();
    let set = |flags: &mut settings::Builder, name: &str, value: &str| {
        flags
            .set(name, value)
            .map_err(|e| CodegenError::Cranelift(format!("cranelift setting {name}: {e}")))
    };
    set(&mut flags, "use_colocated_libcalls", "false")?;
    set(&mut flags, "is_pic", "false")?;
    set(&mut flags, "opt_level", "speed")?;
    let isa = cranelift_native::builder()
        .map_err(|e| {
            CodegenError::Cranelift(format!("this machine is not supported by cranelift: {e}"))
        })?
        .finish(settings::Flags::new(flags))
        .map_err(|e| CodegenError::Cranelift(format!("cranelift: {e}")))?;
    let mut builder = JITBuilder::with_isa(isa, default_libcall_names());
    for (name, pointer) in symbols() {
        builder.symbol(name, pointer);
    }
    let mut module = JITModule::new(builder);
    let ft = match plan.options.accumulate {
        Precision::F64 => types::F64,
        Precision::F32 => types::F32,
    };
    let suffix = plan.options.accumulate.name();
    let mut unary_sig = module.make_signature();
    unary_sig.params.push(AbiParam::new(ft));
    unary_sig.returns.push(AbiParam::new(ft));
    let mut binary_sig = unary_sig.clone();
    binary_sig.params.push(AbiParam::new(ft));
    let mut shims: Vec<(&'static str, FuncId)> = Vec::new();
    for primitive in ops::PRIMITIVES {
        let signature = match primitive.shims {
            Some(Shims::Unary { .. }) => &unary_sig,
            Some(Shims::Binary { .. }) => &binary_sig,
            None => continue,
        };
        let id = module
            .declare_function(
                &shim_symbol(&primitive.op, suffix),
                Linkage::Import,
                signature,
            )
            .map_err(|e| CodegenError::Cranelift(e.to_string()))?;
        shims.push((primitive.name, id));
    }

    let pointer = module.target_config().pointer_type();
    let mut signature = module.make_signature();
    for _ in 0..3 {
        signature.params.push(AbiParam::new(pointer));
    }
    let mut ids: Vec<Vec<Option<FuncId>>> = Vec::new();
    let mut clif = Vec::new();
    let mut context = module.make_context();
    let mut function_context = FunctionBuilderContext::new();
    let mut counter = 0usize;
    let lowered = loops::lower(graph, plan)?;
    for ((phase_index, phase), lowered) in plan.phases.iter().enumerate().zip(&lowered.phases) {
        let mut phase_ids = Vec::new();
        for (pass_index, (pass, function)) in
            phase.passes.iter().zip(&lowered.functions).enumerate()
        {
            let (super::plan::Pass::Loop(pass), Function::Loop(function)) = (pass, function) else {
                phase_ids.push(None);
                continue;
            };
            let variables = pass_variables(pass);
            if variables > MAX_PASS_VARIABLES {
                return Err(CodegenError::Unsupported(format!(
                    "loop pass {pass_index} of phase {phase_index} keeps up to {variables} values in registers \
                     (accumulators, counts, scan carries), more than the JIT's {MAX_PASS_VARIABLES} \
                     (cranelift numbers a block's parameters with 16 bits, and its compile time grows \
                     faster than linearly with them)"
                )));
            }
            let name = format!("rlx_pass_{phase_index}_{pass_index}_{counter}");
            counter += 1;
            let id = module
                .declare_function(&name, Linkage::Local, &signature)
                .map_err(|e| CodegenError::Cranelift(e.to_string()))?;
            context.func.signature = signature.clone();
            context.func.name = UserFuncName::user(0, id.as_u32());
            let mut refs: HashMap<&'static str, FuncRef> = HashMap::new();
            for (op, shim) in &shims {
                refs.insert(op, module.declare_func_in_func(*shim, &mut context.func));
            }
            {
                let b = FunctionBuilder::new(&mut context.func, &mut function_context);
                let mut gen = Gen {
                    b,
                    graph,
                    function,
                    ft,
                    storage_types: phase
                        .buffers
                        .iter()
                        .map(|buffer| match buffer.storage {
                            Precision::F64 => types::F64,
                            Precision::F32 => types::F32,
                        })
                        .collect(),
                    shims: refs,
                    bases: HashMap::new(),
                    values: HashMap::new(),
                    conds: HashMap::new(),
                    coords: HashMap::new(),
                    accumulators: HashMap::new(),
                    simd: codegen.simd,
                    vector: None,
                };
                gen.function()?;
                gen.b.finalize(module.target_config());
            }
            if keep_clif {
                clif.push(format!("; {name}\n{}", context.func.display()));
                context.set_disasm(true);
            }
            module.define_function(id, &mut context).map_err(|e| {
                CodegenError::Cranelift(format!(
                    "cranelift could not compile pass {pass_index}: {e:?}"
                ))
            })?;
            if keep_clif {
                if let Some(code) = context.compiled_code().and_then(|c| c.vcode.clone()) {
                    clif.push(format!("; {name} (machine code)\n{code}"));
                }
            }
            module.clear_context(&mut context);
            phase_ids.push(Some(id));
        }
        ids.push(phase_ids);
    }
    module.finalize_definitions().map_err(|e| {
        CodegenError::Cranelift(format!("cranelift could not link the kernel: {e}"))
    })?;
    let functions = ids
        .iter()
        .map(|phase| {
            phase
                .iter()
                .map(|id| {
                    id.map(|id| {
                        let code = module.get_finalized_function(id);
                        // SAFETY: `code` is the entry of a function just defined with `signature`
                        // (three pointer-sized integer parameters, no result, the platform's C
                        // calling convention), which is exactly `PassFn`; the memory stays mapped
                        // until `JitKernel` frees the module.
                        unsafe { std::mem::transmute::<*const u8, PassFn>(code) }
                    })
                })
                .collect()
        })
        .collect();
    Ok(JitKernel {
        functions,
        clif,
        module: Mutex::new(Some(module)),
    })
}

struct Accumulator {
    value: Variable,
    count: Option<Variable>,
}

/// An exp's argument reduced by ln 2 (`Gen::reduce`).
struct Reduced {
    biased: ClifValue,
    k: ClifValue,
    hi: ClifValue,
    lo: ClifValue,
    r: ClifValue,
}

/// Instruction selection for one loop function of the loop IR.
struct Gen<'a, 'b> {
    b: FunctionBuilder<'b>,
    graph: &'a Graph,
    function: &'a LoopFunction,
    ft: Type,
    storage_types: Vec<Type>,
    shims: HashMap<&'static str, FuncRef>,
    /// Base pointers loaded at entry, by table slot.
    bases: HashMap<usize, ClifValue>,
    values: HashMap<NodeId, ClifValue>,
    /// For nodes that are conditions (comparisons, `and`, `or`, `not`): the `i8` truth value, so
    /// `where`/`and`/`or` test it directly instead of comparing the 0/1 float with 0.
    conds: HashMap<NodeId, ClifValue>,
    /// The coordinates bound so far (`usize` values).
    coords: HashMap<Coord, ClifValue>,
    /// Register accumulators and scan carries, by action index.
    accumulators: HashMap<usize, Accumulator>,
    /// Whether token loops may be vectorised.
    simd: bool,
    /// While generating a vectorised token loop body: its register type (`F64X2` or `F32X4`). Values
    /// of the loop's own entries are then vectors; values from outer loops stay scalars and are
    /// splatted where a vector operand is needed (`Gen::widen`).
    vector: Option<Type>,
}

type GenResult<T> = Result<T, CodegenError>;

const I64: Type = types::I64;

/// Register accumulators of reductions: f64 whatever the register precision (`plan::SUMS`). In an
/// f32×4 vector loop a sum's lanes are widened into an f64×2 accumulator (`Gen::vector_actions`).
const SUM: Type = types::F64;

fn flags() -> MemFlagsData {
    MemFlagsData::trusted()
}

/// Vector accesses: in bounds (the loops stay inside the layout) but not necessarily aligned.
fn vector_flags() -> MemFlagsData {
    MemFlagsData::new().with_notrap()
}

/// Reinterpreting a vector's lanes (`bitcast` between vector types needs an explicit byte order).
fn lanes_flags() -> MemFlagsData {
    MemFlagsData::new().with_endianness(cranelift_codegen::ir::Endianness::Little)
}

impl Gen<'_, '_> {
    fn function(&mut self) -> GenResult<()> {
        let entry = self.b.create_block();
        self.b.append_block_params_for_function_params(entry);
        self.b.switch_to_block(entry);
        let params = self.b.block_params(entry).to_vec();
        let (table, g_begin, g_end) = (params[0], params[1], params[2]);
        self.coords.insert(Coord::GBegin, g_begin);
        self.coords.insert(Coord::GEnd, g_end);
        let function = self.function;
        let mut slots: Vec<usize> = Fixed::ALL.iter().map(|f| f.slot()).collect();
        slots.extend(function.buffers.iter().copied().map(abi::buffer_slot));
        for s in slots {
            let base = self.b.ins().load(I64, flags(), table, (s * 8) as i32);
            self.bases.insert(s, base);
        }
        for (coord, value) in &function.binds {
            let value = self.index(value)?;
            self.coords.insert(*coord, value);
        }
        self.block(&function.body)?;
        self.b.ins().return_(&[]);
        self.b.seal_all_blocks();
        Ok(())
    }

    fn base(&self, slot: usize) -> GenResult<ClifValue> {
        self.bases
            .get(&slot)
            .copied()
            .ok_or_else(|| format!("internal: table slot {slot} not loaded").into())
    }

    fn buffer_base(&self, buffer: BufferId) -> GenResult<ClifValue> {
        self.base(abi::buffer_slot(buffer))
    }

    fn iconst(&mut self, value: i64) -> ClifValue {
        self.b.ins().iconst(I64, value)
    }

    /// A constant in the register type (splatted in a vector body).
    fn fconst(&mut self, value: f64) -> ClifValue {
        let ty = self.vector.unwrap_or(self.ft);
        self.const_of(ty, value)
    }

    /// A constant of `ty` (a float type or a float vector type).
    fn const_of(&mut self, ty: Type, value: f64) -> ClifValue {
        let scalar = if ty.lane_type() == types::F64 {
            self.b.ins().f64const(value)
        } else {
            self.b.ins().f32const(value as f32)
        };
        if ty.is_vector() {
            self.b.ins().splat(ty, scalar)
        } else {
            scalar
        }
    }

    fn type_of(&self, value: ClifValue) -> Type {
        self.b.func.dfg.value_type(value)
    }

    /// In a vector body, a scalar operand (a value of an outer loop) splatted to the vector type.
    fn widen(&mut self, value: ClifValue) -> ClifValue {
        match self.vector {
            Some(vt) if !self.type_of(value).is_vector() => self.b.ins().splat(vt, value),
            _ => value,
        }
    }

    /// `condition ? yes : no`, where `condition` is an `i8` truth value, or for vectors a lane mask
    /// (all ones / all zeros per lane, as `fcmp` gives), applied with `bitselect`.
    fn pick(&mut self, condition: ClifValue, yes: ClifValue, no: ClifValue) -> ClifValue {
        let ty = self.type_of(yes);
        if ty.is_vector() {
            let mask = self.b.ins().bitcast(ty, lanes_flags(), condition);
            // Against +0.0 (all bits zero) a lane mask selects with one `and` (x64: `andpd` /
            // `andnpd`, one µop, where a `blendv` takes two or three): the same bits.
            if self.is_positive_zero(no) {
                return self.b.ins().band(yes, mask);
            }
            if self.is_positive_zero(yes) {
                return self.b.ins().band_not(no, mask);
            }
            self.b.ins().bitselect(mask, yes, no)
        } else {
            self.b.ins().select(condition, yes, no)
        }
    }

    /// Whether `value` is the constant +0.0 (all bits zero), or a vector of it (`const_of`'s `splat`).
    fn is_positive_zero(&self, value: ClifValue) -> bool {
        let dfg = &self.b.func.dfg;
        let mut value = value;
        loop {
            let Some(inst) = dfg.value_def(value).inst() else {
                return false;
            };
            match &dfg.insts[inst] {
                InstructionData::Unary {
                    opcode: Opcode::Splat,
                    arg,
                } => value = *arg,
                InstructionData::UnaryIeee64 {
                    opcode: Opcode::F64const,
                    imm,
                } => return imm.bits() == 0,
                InstructionData::UnaryIeee32 {
                    opcode: Opcode::F32const,
                    imm,
                } => return imm.bits() == 0,
                _ => return false,
            }
        }
    }

    /// Run `generate` as scalar code (outside the vector mode), then splat its value if a vector
    /// body is being generated.
    fn scalar_then_widen(
        &mut self,
        generate: impl FnOnce(&mut Self) -> GenResult<ClifValue>,
    ) -> GenResult<ClifValue> {
        let vector = self.vector.take();
        let value = generate(self);
        self.vector = vector;
        let value = value?;
        Ok(self.widen(value))
    }

    /// Apply scalar code to each lane of `args` (vectors of the body's type) and gather the lanes.
    fn per_lane(
        &mut self,
        args: &[ClifValue],
        mut scalar: impl FnMut(&mut Self, &[ClifValue]) -> GenResult<ClifValue>,
    ) -> GenResult<ClifValue> {
        let Some(vt) = self.vector else {
            return scalar(self, args);
        };
        self.vector = None;
        let mut result = None;
        let mut outcome = Ok(());
        for lane in 0..vt.lane_count() {
            let lane = lane as u8;
            let xs: Vec<ClifValue> = args
                .iter()
                .map(|a| self.b.ins().extractlane(*a, lane))
                .collect();
            match scalar(self, &xs) {
                Ok(x) => {
                    result = Some(match result {
                        None => self.b.ins().splat(vt, x),
                        Some(v) => self.b.ins().insertlane(v, x, lane),
                    });
                }
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            }
        }
        self.vector = Some(vt);
        outcome?;
        result.ok_or_else(|| "internal: a vector without lanes".into())
    }

    /// `base[index]` of a `usize` array.
    fn load_index(&mut self, base: ClifValue, index: ClifValue) -> ClifValue {
        let offset = self.b.ins().ishl_imm_u(index, 3);
        let address = self.b.ins().iadd(base, offset);
        self.b.ins().load(I64, flags(), address, 0)
    }

    fn address(&mut self, buffer: BufferId, index: ClifValue) -> GenResult<(ClifValue, Type)> {
        let ty = *self
            .storage_types
            .get(buffer as usize)
            .ok_or_else(|| format!("internal: unknown buffer b{buffer}"))?;
        let base = self.buffer_base(buffer)?;
        let shift = if ty == types::F64 { 3 } else { 2 };
        let offset = self.b.ins().ishl_imm_u(index, shift);
        Ok((self.b.ins().iadd(base, offset), ty))
    }

    /// Element `index` of a buffer, in the register precision; in a vector body, the elements
    /// `index..index + lanes` as one vector.
    fn load(&mut self, buffer: BufferId, index: ClifValue) -> GenResult<ClifValue> {
        let (address, ty) = self.address(buffer, index)?;
        match self.vector {
            None => {
                let value = self.b.ins().load(ty, flags(), address, 0);
                Ok(self.convert(value, ty, self.ft))
            }
            // Same precision: one unaligned vector load.
            Some(vt) if ty == self.ft => Ok(self.b.ins().load(vt, vector_flags(), address, 0)),
            // Two f32 into f64 lanes: one 64-bit load straight into a vector register (as an f64,
            // so it does not pass through an integer register), widened.
            Some(vt) if ty == types::F32 && vt == types::F64X2 => {
                let bits = self.b.ins().load(types::F64, vector_flags(), address, 0);
                let v = self.b.ins().scalar_to_vector(types::F64X2, bits);
                let v = self.b.ins().bitcast(types::F32X4, lanes_flags(), v);
                Ok(self.b.ins().fvpromote_low(v))
            }
            // f64 storage (integer inputs) into f32 lanes: lane by lane.
            Some(vt) => {
                let size = ty.bytes() as i32;
                let mut result = None;
                for lane in 0..vt.lane_count() {
                    let x = self
                        .b
                        .ins()
                        .load(ty, vector_flags(), address, size * lane as i32);
                    let x = self.convert(x, ty, self.ft);
                    result = Some(match result {
                        None => self.b.ins().splat(vt, x),
                        Some(v) => self.b.ins().insertlane(v, x, lane as u8),
                    });
                }
                result.ok_or_else(|| "internal: a vector without lanes".into())
            }
        }
    }

    /// Store `value` (in the register precision) at `index`; in a vector body, its lanes at
    /// `index..index + lanes`.
    fn store(&mut self, buffer: BufferId, index: ClifValue, value: ClifValue) -> GenResult<()> {
        let (address, ty) = self.address(buffer, index)?;
        let value = self.widen(value);
        match self.vector {
            None => {
                let from = self.type_of(value);
                let value = self.convert(value, from, ty);
                self.b.ins().store(flags(), value, address, 0);
            }
            Some(_) if ty == self.ft => {
                self.b.ins().store(vector_flags(), value, address, 0);
            }
            // f64 lanes into two f32: narrowed, one 64-bit store (of the low lane as an f64, from
            // the vector register itself).
            Some(vt) if ty == types::F32 && vt == types::F64X2 => {
                let narrow = self.b.ins().fvdemote(value);
                let bits = self.b.ins().bitcast(types::F64X2, lanes_flags(), narrow);
                let low = self.b.ins().extractlane(bits, 0);
                self.b.ins().store(vector_flags(), low, address, 0);
            }
            Some(vt) => {
                let size = ty.bytes() as i32;
                for lane in 0..vt.lane_count() {
                    let x = self.b.ins().extractlane(value, lane as u8);
                    let x = self.convert(x, self.ft, ty);
                    self.b
                        .ins()
                        .store(vector_flags(), x, address, size * lane as i32);
                }
            }
        }
        Ok(())
    }

    fn convert(&mut self, value: ClifValue, from: Type, to: Type) -> ClifValue {
        match (from, to) {
            (a, b) if a == b => value,
            (types::F32, types::F64) => self.b.ins().fpromote(types::F64, value),
            _ => self.b.ins().fdemote(types::F32, value),
        }
    }

    fn coord(&self, coord: Coord) -> GenResult<ClifValue> {
        self.coords
            .get(&coord)
            .copied()
            .ok_or_else(|| format!("internal: coordinate {} is not bound", coord.name()).into())
    }

    /// An index expression of the loop IR (`usize` arithmetic).
    fn index(&mut self, index: &Index) -> GenResult<ClifValue> {
        Ok(match index {
            Index::Const(k) => self.iconst(*k),
            Index::Coord(c) => self.coord(*c)?,
            Index::Sum(terms) => {
                let mut sum = None;
                for term in terms {
                    let x = self.index(term)?;
                    sum = Some(match sum {
                        None => x,
                        Some(s) => self.b.ins().iadd(s, x),
                    });
                }
                match sum {
                    Some(sum) => sum,
                    None => self.iconst(0),
                }
            }
            Index::Product(a, b) | Index::Diff(a, b) | Index::Quot(a, b) | Index::Rem(a, b) => {
                let (a, b) = (self.index(a)?, self.index(b)?);
                match index {
                    Index::Product(..) => self.b.ins().imul(a, b),
                    Index::Diff(..) => self.b.ins().isub(a, b),
                    Index::Quot(..) => self.b.ins().udiv(a, b),
                    _ => self.b.ins().urem(a, b),
                }
            }
            Index::Offset(x, k) => {
                let x = self.index(x)?;
                self.b.ins().iadd_imm_s(x, *k)
            }
            Index::Select(cond, yes, no) => {
                let c = self.cond(cond)?;
                if **yes == Index::Const(1) && **no == Index::Const(0) {
                    // A truth value as 0/1.
                    self.b.ins().uextend(I64, c)
                } else {
                    let (yes, no) = (self.index(yes)?, self.index(no)?);
                    self.b.ins().select(c, yes, no)
                }
            }
            Index::Table(fixed, at) => {
                let at = self.index(at)?;
                let base = self.base(fixed.slot())?;
                self.load_index(base, at)
            }
            Index::Size(size) => {
                let base = self.base(Fixed::Sizes.slot())?;
                self.b
                    .ins()
                    .load(I64, flags(), base, (size.index() * 8) as i32)
            }
        })
    }

    /// An `i8` truth value of the loop IR.
    fn cond(&mut self, cond: &Cond) -> GenResult<ClifValue> {
        Ok(match cond {
            Cond::Within { x, start, end } => {
                // Signed: `shift`'s source may precede 0.
                let (x, start, end) = (self.index(x)?, self.index(start)?, self.index(end)?);
                let after_start = self.b.ins().icmp(IntCC::SignedGreaterThanOrEqual, x, start);
                let before_end = self.b.ins().icmp(IntCC::SignedLessThan, x, end);
                self.b.ins().band(after_start, before_end)
            }
            Cond::Is(x, k) => {
                let x = self.index(x)?;
                self.b.ins().icmp_imm_u(IntCC::Equal, x, *k)
            }
            Cond::Greater(a, b) => {
                let (a, b) = (self.index(a)?, self.index(b)?);
                self.b.ins().icmp(IntCC::UnsignedGreaterThan, a, b)
            }
        })
    }

    /// A value read from memory; an empty `max`/`min` (its count is 0) reads as 0. In a vector
    /// body, a token's value is a vector of consecutive tokens and another element's value (the
    /// same for all lanes) is splatted.
    fn load_value(&mut self, load: &Load) -> GenResult<ClifValue> {
        if self.vector.is_some() && !uses_token(&load.index) {
            return self.scalar_then_widen(|gen| gen.load_value(load));
        }
        let index = self.index(&load.index)?;
        let v = self.load(load.buffer, index)?;
        match load.count {
            None => Ok(v),
            Some(count) => {
                let n = self.load(count, index)?;
                let zero = self.fconst(0.0);
                let empty = self.b.ins().fcmp(FloatCC::Equal, n, zero);
                Ok(self.pick(empty, zero, v))
            }
        }
    }

    fn operand(&mut self, operand: &Operand) -> GenResult<ClifValue> {
        match operand {
            Operand::Node(node) => {
                let value = self.value(*node)?;
                Ok(self.widen(value))
            }
            Operand::Load(load) => self.load_value(load),
            Operand::Zero => Ok(self.fconst(0.0)),
            Operand::One => Ok(self.fconst(1.0)),
        }
    }

    fn value(&self, node: NodeId) -> GenResult<ClifValue> {
        self.values
            .get(&node)
            .copied()
            .ok_or_else(|| format!("internal: %{} used before it is computed", node.0).into())
    }

    fn truth(&mut self, condition: ClifValue) -> ClifValue {
        let one = self.fconst(1.0);
        let zero = self.fconst(0.0);
        self.pick(condition, one, zero)
    }

    /// `x != 0` (unordered: NaN counts as true, as in Rust), or the node's own truth value (a lane
    /// mask in a vector body; a scalar truth value of an outer loop is not reused there).
    fn condition(&mut self, node: NodeId, x: ClifValue) -> ClifValue {
        if let Some(condition) = self.conds.get(&node) {
            if self.type_of(*condition).is_vector() == self.vector.is_some() {
                return *condition;
            }
        }
        let x = self.widen(x);
        let zero = self.fconst(0.0);
        self.b.ins().fcmp(FloatCC::NotEqual, x, zero)
    }

    /// eˣ in f64 without a call: fdlibm's `e_exp.c` reduction (k = round(x/ln 2), r = x − k·ln 2 in
    /// two parts), e^r by its Taylor polynomial to r¹³ evaluated with Estrin's scheme (no division
    /// and a dependency chain about half as long as fdlibm's rational form with Horner's scheme: the
    /// exp dominated the token loops), then ·2ᵏ in two steps so that subnormal results stay exact to
    /// rounding; within 1 ulp of libm (as accurate as fdlibm's form: tested). Overflow gives +∞,
    /// underflow 0, NaN stays NaN. `x` is an `f64` or an `f64x2`: rounding and 2ᵏ use the 1.5·2⁵²
    /// trick (adding it rounds to an integer, whose bits are then in the low mantissa), so no
    /// float-to-integer conversion is needed. `for_f32`: the result will be rounded to f32, so a
    /// shorter polynomial suffices (below). A `bounded` argument (within ±`EXP_FAST_RANGE`) takes
    /// `exp_table` instead, which needs no range handling and a shorter polynomial.
    fn exp_f64(&mut self, x: ClifValue, bounded: bool, for_f32: bool) -> ClifValue {
        if bounded {
            return self.exp_table(x, for_f32);
        }
        let ty = self.type_of(x);
        let int_ty = if ty.is_vector() { types::I64X2 } else { I64 };
        let c = |gen: &mut Self, v: f64| gen.const_of(ty, v);
        // Clamp to [−746, 710] (a NaN stays NaN: both compares are false).
        let low = c(self, -746.0);
        let high = c(self, 710.0);
        let below = self.b.ins().fcmp(FloatCC::LessThan, x, low);
        let clamped = self.pick(below, low, x);
        let above = self.b.ins().fcmp(FloatCC::GreaterThan, clamped, high);
        let clamped = self.pick(above, high, clamped);
        let magic = c(self, MAGIC);
        let Reduced { k, hi, lo, r, .. } = self.reduce(clamped, INV_LN2, magic, LN2_HI, LN2_LO);
        // e^r = 1 + r + r²·Q(r), Q(r) = Σ_{j=0}^{m} r^j/(j+2)!, the Taylor series to r^(m+2): to r¹³
        // for an f64 result (the next term is below 5e-18 for |r| ≤ ln 2/2), to r⁸ when the result
        // is rounded to f32 (`for_f32`; the next term is below 2.1e-10, 0.004 of an f32 ulp, so the
        // f32 result is the correctly rounded one to within that). Q by Estrin's scheme: a short
        // dependency chain and no division. With r = hi − lo: 1 + (hi + (r²·Q − lo)).
        let r2 = self.b.ins().fmul(r, r);
        let q = self.taylor_tail(r, r2, if for_f32 { 7 } else { 12 });
        let q = self.b.ins().fmul(r2, q);
        let q = self.b.ins().fsub(q, lo);
        let s = self.b.ins().fadd(hi, q);
        let one = c(self, 1.0);
        let y = self.b.ins().fadd(one, s);
        // 2ᵏ = 2^(k − k₁) · 2^k₁ with k₁ = round(k/2), each a normal number for |k| ≤ 1076.
        let half = c(self, 0.5);
        let k1 = self.b.ins().fmul(k, half);
        let k1 = self.b.ins().fadd(k1, magic);
        let k1 = self.b.ins().fsub(k1, magic);
        let k2 = self.b.ins().fsub(k, k1);
        let parts = [k1, k2];
        // (bits(kᵢ + MAGIC) − bits(MAGIC) + 1023) << 52 is the f64 2^kᵢ.
        let offset = (MAGIC.to_bits() as i64) - 1023;
        let offset = self.b.ins().iconst(I64, offset);
        let offset = if ty.is_vector() {
            self.b.ins().splat(int_ty, offset)
        } else {
            offset
        };
        let mut result = y;
        for part in parts {
            let shifted = self.b.ins().fadd(part, magic);
            let bits = self.b.ins().bitcast(int_ty, lanes_flags(), shifted);
            let exponent = self.b.ins().isub(bits, offset);
            let bits = self.b.ins().ishl_imm_u(exponent, 52);
            let power = self.b.ins().bitcast(ty, lanes_flags(), bits);
            result = self.b.ins().fmul(result, power);
        }
        let overflow = c(self, 709.782_712_893_384);
        let underflow = c(self, -745.133_219_101_941_1);
        let infinity = c(self, f64::INFINITY);
        let zero = c(self, 0.0);
        let over = self.b.ins().fcmp(FloatCC::GreaterThan, x, overflow);
        let under = self.b.ins().fcmp(FloatCC::LessThan, x, underflow);
        let result = self.pick(under, zero, result);
        self.pick(over, infinity, result)
    }

    /// eˣ of an argument within [−700, 700] (`EXP_FAST_RANGE`), in f64 or f64×2, by Tang's table method
    /// (ACM TOMS 15(2), 1989; the form of glibc's `exp`): k = round(x·128/ln 2), r = x − k·ln 2/128 in
    /// two parts (|r| ≤ ln 2/256), k = 128·e + j; then eˣ = 2ᵉ · 2^(j/128) · eʳ with 2^(j/128) = hi·(1 + t)
    /// from `EXP_TABLE` and p(r) = eʳ − 1 by its Taylor polynomial to r⁵ (the next term is below 6e-19,
    /// 0.003 ulp; to r³ when the result is rounded to f32: below 2.3e-12): eˣ = s + s·(t + p(r)) (t·p is
    /// below 1e-18) with s = hi·2ᵉ, built by adding e to hi's exponent bits (normal for |x| ≤ 700).
    /// Within 0.51 ulp of eˣ, so nearly always libm's result (tested); two thirds of `exp_f64`'s
    /// vector instructions: two table loads per lane pair and a degree-5 polynomial instead of the
    /// degree-13 one.
    fn exp_table(&mut self, x: ClifValue, for_f32: bool) -> ClifValue {
        let ty = self.type_of(x);
        let int_ty = if ty.is_vector() { types::I64X2 } else { I64 };
        let c = |gen: &mut Self, v: f64| gen.const_of(ty, v);
        let n = EXP_TABLE_SIZE as f64;
        let magic = c(self, MAGIC);
        // k·(LN2_HI/128) is exact (LN2_HI has 32 trailing zero bits, |k| < 2¹⁷), so is x minus it.
        let Reduced { biased, r, .. } = self.reduce(x, INV_LN2 * n, magic, LN2_HI / n, LN2_LO / n);
        // p = eʳ − 1 = r + r²·(1/2 + r/6) [+ r⁴·(1/24 + r/120)].
        let r2 = self.b.ins().fmul(r, r);
        let c2 = c(self, 0.5);
        let c3 = c(self, 1.0 / 6.0);
        let c3r = self.b.ins().fmul(c3, r);
        let low = self.b.ins().fadd(c2, c3r);
        let mut terms = self.b.ins().fmul(r2, low);
        if !for_f32 {
            let c4 = c(self, 1.0 / 24.0);
            let c5 = c(self, 1.0 / 120.0);
            let c5r = self.b.ins().fmul(c5, r);
            let high = self.b.ins().fadd(c4, c5r);
            let r4 = self.b.ins().fmul(r2, r2);
            let high = self.b.ins().fmul(r4, high);
            terms = self.b.ins().fadd(terms, high);
        }
        let p = self.b.ins().fadd(r, terms);
        // j = k mod 128 and e = (k − j)/128 from the bits of k + MAGIC (k in the low mantissa, two's
        // complement): j is the low 7 bits; the bits above, shifted to the exponent field, add e.
        let bits = self.b.ins().bitcast(int_ty, lanes_flags(), biased);
        let mask = self.int_const(int_ty, EXP_TABLE_SIZE as i64 - 1);
        let j = self.b.ins().band(bits, mask);
        let (table_hi, table_t) = self.exp_table_entries(j, ty);
        let tail = self.b.ins().fadd(table_t, p);
        let above = self.b.ins().band_not(bits, mask);
        let exponent = self.b.ins().ishl_imm_u(above, 52 - EXP_TABLE_BITS);
        let hi_bits = self.b.ins().bitcast(int_ty, lanes_flags(), table_hi);
        let scale = self.b.ins().iadd(hi_bits, exponent);
        let scale = self.b.ins().bitcast(ty, lanes_flags(), scale);
        let product = self.b.ins().fmul(scale, tail);
        self.b.ins().fadd(scale, product)
    }

    /// eˣ in f32 arithmetic (f32 or f32×4) of an argument within ±`EXP_F32_RANGE`, where eˣ and
    /// every 2ᵏ below are normal f32 (no range handling): k = round(x/ln 2) (by `MAGIC_F32`), r = x −
    /// k·ln 2 in two parts (Cody and Waite: `LN2_HI_F32` has 9 significant bits, so k·LN2_HI_F32 and x
    /// minus it are exact; |r| ≤ 0.347), p(r) = eʳ − 1 = r + r²·q(r), q the Taylor polynomial
    /// 1/2 + r/6 + … + r⁵/5040 by Estrin's scheme (the next term is below 5.3e-9, 0.05 ulp), and eˣ = s +
    /// s·p with s = 2ᵏ from the bits of k + `MAGIC_F32`. Within 1 ulp of eˣ (r is exact, r²·q is below
    /// 0.075 so its rounding is below 0.1 ulp of the result, the two last roundings 0.5 ulp each at most).
    fn exp_f32(&mut self, x: ClifValue) -> ClifValue {
        let ty = self.type_of(x);
        let int_ty = if ty.is_vector() {
            types::I32X4
        } else {
            types::I32
        };
        let magic = self.const_of(ty, MAGIC_F32);
        let Reduced { biased, r, .. } = self.reduce(x, INV_LN2, magic, LN2_HI_F32, LN2_LO_F32);
        // q = (1/2 + r/6) + r²·(1/24 + r/120) + r⁴·(1/720 + r/5040).
        let r2 = self.b.ins().fmul(r, r);
        let q = self.taylor_tail(r, r2, 6);
        let terms = self.b.ins().fmul(r2, q);
        let p = self.b.ins().fadd(r, terms);
        // k + MAGIC_F32 holds k in its low mantissa bits (two's complement); shifted into the exponent
        // field (MAGIC_F32's own bits shift out) and added to 1.0's bits, they make 2ᵏ.
        let bits = self.b.ins().bitcast(int_ty, lanes_flags(), biased);
        let exponent = self.b.ins().ishl_imm_u(bits, 23);
        let one = self.const_of(ty, 1.0);
        let one = self.b.ins().bitcast(int_ty, lanes_flags(), one);
        let scale = self.b.ins().iadd(exponent, one);
        let scale = self.b.ins().bitcast(ty, lanes_flags(), scale);
        let product = self.b.ins().fmul(scale, p);
        self.b.ins().fadd(scale, product)
    }

    /// The reduction of an exp's argument `x` (Cody and Waite): k = round(x·`per_ln2`) by adding and
    /// subtracting `magic` (1.5·2^mantissa bits of the type), then r = x − k/`per_ln2` with 1/`per_ln2`
    /// = `ln2_hi` + `ln2_lo`: `hi` = x − k·ln2_hi (exact where ln2_hi has enough trailing zero bits),
    /// `lo` = k·ln2_lo, r = hi − lo. `biased` = k + magic holds k in its low mantissa bits.
    fn reduce(
        &mut self,
        x: ClifValue,
        per_ln2: f64,
        magic: ClifValue,
        ln2_hi: f64,
        ln2_lo: f64,
    ) -> Reduced {
        let ty = self.type_of(x);
        let per_ln2 = self.const_of(ty, per_ln2);
        let scaled = self.b.ins().fmul(x, per_ln2);
        let biased = self.b.ins().fadd(scaled, magic);
        let k = self.b.ins().fsub(biased, magic);
        let ln2_hi = self.const_of(ty, ln2_hi);
        let ln2_lo = self.const_of(ty, ln2_lo);
        let k_hi = self.b.ins().fmul(k, ln2_hi);
        let hi = self.b.ins().fsub(x, k_hi);
        let lo = self.b.ins().fmul(k, ln2_lo);
        let r = self.b.ins().fsub(hi, lo);
        Reduced {
            biased,
            k,
            hi,
            lo,
            r,
        }
    }

    /// Q(r) = Σ_{j<terms} r^j/(j+2)! (eʳ = 1 + r + r²·Q(r) to r^(terms+1)) by Estrin's scheme: a
    /// short dependency chain and no division. `r2` = r².
    fn taylor_tail(&mut self, r: ClifValue, r2: ClifValue, terms: usize) -> ClifValue {
        let ty = self.type_of(r);
        let mut factorial = 2.0;
        let mut coefficients = Vec::with_capacity(terms);
        for j in 0..terms {
            coefficients.push(1.0 / factorial);
            factorial *= (j + 3) as f64;
        }
        let mut level = Vec::with_capacity(terms.div_ceil(2));
        for pair in coefficients.chunks(2) {
            let a = self.const_of(ty, pair[0]);
            level.push(match pair.get(1) {
                Some(&b) => {
                    let b = self.const_of(ty, b);
                    let br = self.b.ins().fmul(b, r);
                    self.b.ins().fadd(a, br)
                }
                None => a,
            });
        }
        // Level by level: pairs (a, b) become a + b·r^(2^k), r², r⁴, r⁸, ….
        let mut power = r2;
        while level.len() > 1 {
            let mut next = Vec::with_capacity(level.len().div_ceil(2));
            for pair in level.chunks(2) {
                next.push(match pair.get(1) {
                    Some(&high) => {
                        let high = self.b.ins().fmul(high, power);
                        self.b.ins().fadd(pair[0], high)
                    }
                    None => pair[0],
                });
            }
            level = next;
            if level.len() > 1 {
                power = self.b.ins().fmul(power, power);
            }
        }
        level[0]
    }

    /// An integer constant of `ty` (`I64`, or splatted to `I64X2`).
    fn int_const(&mut self, ty: Type, value: i64) -> ClifValue {
        let scalar = self.b.ins().iconst(I64, value);
        if ty.is_vector() {
            self.b.ins().splat(ty, scalar)
        } else {
            scalar
        }
    }

    /// `EXP_TABLE[j]` as (hi, t) of the register type: one 16-byte entry per lane, loaded whole and
    /// split into the his and the ts (an f64×2 gathers its two lanes' entries with two loads).
    fn exp_table_entries(&mut self, j: ClifValue, ty: Type) -> (ClifValue, ClifValue) {
        let table = self
            .b
            .ins()
            .iconst(I64, EXP_TABLE.0.as_ptr() as usize as i64);
        let table_flags = MemFlagsData::trusted().with_readonly();
        let offset = self.b.ins().ishl_imm_u(j, 4);
        if !ty.is_vector() {
            let address = self.b.ins().iadd(table, offset);
            let hi = self.b.ins().load(ty, table_flags, address, 0);
            let lo = self.b.ins().load(ty, table_flags, address, 8);
            return (hi, lo);
        }
        let entries: Vec<ClifValue> = (0..2)
            .map(|lane| {
                let offset = self.b.ins().extractlane(offset, lane);
                let address = self.b.ins().iadd(table, offset);
                self.b.ins().load(ty, table_flags, address, 0)
            })
            .collect();
        let bytes =
            |gen: &mut Self, v: ClifValue| gen.b.ins().bitcast(types::I8X16, lanes_flags(), v);
        let (first, second) = (bytes(self, entries[0]), bytes(self, entries[1]));
        let halves = [0u8, 8].map(|start| {
            let mask: Vec<u8> = (start..start + 8)
                .chain(16 + start..16 + start + 8)
                .collect();
            let mask = self.b.func.dfg.immediates.push(mask.into());
            let shuffled = self.b.ins().shuffle(first, second, mask);
            self.b.ins().bitcast(ty, lanes_flags(), shuffled)
        });
        let [hi, lo] = halves;
        (hi, lo)
    }

    /// eˣ in the register type: f64 and f64×2 directly; f32 through f64 (f32×4 as two f64×2 halves),
    /// with the shorter polynomial that an f32 result needs.
    fn exp(&mut self, x: ClifValue, bounded: bool) -> ClifValue {
        match self.type_of(x) {
            types::F64 | types::F64X2 => self.exp_f64(x, bounded, false),
            types::F32X4 => {
                let low = self.b.ins().fvpromote_low(x);
                // Lanes 2, 3 moved down to 0, 1.
                let high = self.shuffle_halves(x, x, true);
                let high = self.b.ins().fvpromote_low(high);
                let low = self.exp_f64(low, bounded, true);
                let high = self.exp_f64(high, bounded, true);
                let low = self.b.ins().fvdemote(low);
                let high = self.b.ins().fvdemote(high);
                self.shuffle_halves(low, high, false)
            }
            _ => {
                let wide = self.b.ins().fpromote(types::F64, x);
                let e = self.exp_f64(wide, bounded, true);
                self.b.ins().fdemote(types::F32, e)
            }
        }
    }

    /// Of two f32×4: with `high`, `a`'s upper two lanes then `b`'s upper two lanes; without, `a`'s
    /// lower two lanes then `b`'s lower two lanes.
    fn shuffle_halves(&mut self, a: ClifValue, b: ClifValue, high: bool) -> ClifValue {
        let first = if high { 8u8 } else { 0 };
        let mask: Vec<u8> = (first..first + 8)
            .chain(16 + first..16 + first + 8)
            .collect();
        let mask = self.b.func.dfg.immediates.push(mask.into());
        let a = self.b.ins().bitcast(types::I8X16, lanes_flags(), a);
        let b = self.b.ins().bitcast(types::I8X16, lanes_flags(), b);
        let shuffled = self.b.ins().shuffle(a, b, mask);
        self.b.ins().bitcast(types::F32X4, lanes_flags(), shuffled)
    }

    /// `f64::max` / `f64::min`: NaN operands are ignored, ties give the first operand.
    fn extreme(&mut self, a: ClifValue, b: ClifValue, max: bool) -> ClifValue {
        let better = if max {
            self.b.ins().fcmp(FloatCC::GreaterThan, b, a)
        } else {
            self.b.ins().fcmp(FloatCC::LessThan, b, a)
        };
        // b where it is better or `a` is NaN: one selection of the two conditions.
        let a_nan = self.b.ins().fcmp(FloatCC::Unordered, a, a);
        let take_b = self.b.ins().bor(better, a_nan);
        self.pick(take_b, b, a)
    }

    /// A shim call (lane by lane in a vector body).
    fn call(&mut self, name: &str, args: &[ClifValue]) -> GenResult<ClifValue> {
        let callee = *self
            .shims
            .get(name)
            .ok_or_else(|| format!("internal: no shim {name}"))?;
        self.per_lane(args, |gen, xs| {
            let call = gen.b.ins().call(callee, xs);
            Ok(gen.b.inst_results(call)[0])
        })
    }

    fn usize_to_float(&mut self, x: ClifValue) -> ClifValue {
        self.b.ins().fcvt_from_uint(self.ft, x)
    }

    /// The value a `Let` binds.
    fn let_value(&mut self, node: NodeId, expr: &Expr) -> GenResult<ClifValue> {
        Ok(match expr {
            Expr::Op => self.op_value(node)?,
            Expr::Const(v) => self.fconst(*v),
            Expr::Scalar(scalar) => self.scalar_then_widen(|gen| {
                let scalars = gen.base(Fixed::Scalars.slot())?;
                let offset = (scalar.index() * 8) as i32;
                let v = gen.b.ins().load(types::F64, flags(), scalars, offset);
                Ok(gen.convert(v, types::F64, gen.ft))
            })?,
            Expr::Count(index) if self.vector.is_some() && uses_token(index) => {
                // t − ts + lane for each lane (`token_index`, the only count of a token).
                if !is_token_position(index) {
                    return Err(format!("internal: a vector of the count {index}").into());
                }
                let position = self.scalar_then_widen(|gen| {
                    let i = gen.index(index)?;
                    Ok(gen.usize_to_float(i))
                })?;
                let mut offsets = self.fconst(0.0);
                for lane in 1..self.vector.map_or(1, |vt| vt.lane_count()) {
                    let k = if self.ft == types::F64 {
                        self.b.ins().f64const(f64::from(lane))
                    } else {
                        self.b.ins().f32const(lane as f32)
                    };
                    offsets = self.b.ins().insertlane(offsets, k, lane as u8);
                }
                self.b.ins().fadd(position, offsets)
            }
            Expr::Count(index) => self.scalar_then_widen(|gen| {
                let i = gen.index(index)?;
                Ok(gen.usize_to_float(i))
            })?,
            Expr::Operand(operand) => self.operand(operand)?,
            Expr::Select { cond, yes, no } => {
                // Scalar only (`simd_type` keeps selections out of vector bodies).
                let c = self.cond(cond)?;
                let (yes, no) = (self.operand(yes)?, self.operand(no)?);
                self.b.ins().select(c, yes, no)
            }
        })
    }

    /// A node's element-wise op over its operands' values.
    fn op_value(&mut self, node_id: NodeId) -> GenResult<ClifValue> {
        let graph = self.graph;
        let node = graph.node(node_id);
        let operands: Vec<Option<ClifValue>> = node
            .args
            .iter()
            .map(|a| self.values.get(a).copied())
            .collect::<Vec<_>>()
            .into_iter()
            .map(|v| v.map(|v| self.widen(v)))
            .collect();
        let arg = |k: usize| -> GenResult<ClifValue> {
            operands.get(k).copied().flatten().ok_or_else(|| {
                format!(
                    "internal: operand {k} of %{} used before it is computed",
                    node_id.0
                )
                .into()
            })
        };
        Ok(match &node.op {
            Op::Copy | Op::StopGrad => arg(0)?,
            Op::Neg => {
                let a = arg(0)?;
                self.b.ins().fneg(a)
            }
            Op::Not => {
                // a == 0 is !(a != 0), NaN included.
                let a = self.condition(node.args[0], arg(0)?);
                let not = if self.vector.is_some() {
                    self.b.ins().bnot(a)
                } else {
                    let one = self.b.ins().iconst(types::I8, 1);
                    self.b.ins().bxor(a, one)
                };
                self.conds.insert(node_id, not);
                self.truth(not)
            }
            Op::Mul if zero_times_index(graph, &node.args).is_some() => {
                // 0 · an index (a whole number ≥ 0, never NaN or ∞) is that zero, whatever the
                // index: `token_weight`'s `0 * token_index` costs no conversion per token.
                let zero = zero_times_index(graph, &node.args).unwrap_or(0.0);
                self.fconst(zero)
            }
            Op::Add | Op::Sub | Op::Mul | Op::Div => {
                let (a, b) = (arg(0)?, arg(1)?);
                match node.op {
                    Op::Add => self.b.ins().fadd(a, b),
                    Op::Sub => self.b.ins().fsub(a, b),
                    Op::Mul => self.b.ins().fmul(a, b),
                    _ => self.b.ins().fdiv(a, b),
                }
            }
            Op::Min | Op::Max => {
                let (a, b) = (arg(0)?, arg(1)?);
                let constant = |k: usize| match graph.node(node.args[k]).op {
                    Op::Const(v) => !v.is_nan(),
                    _ => false,
                };
                let max = node.op == Op::Max;
                if constant(0) || constant(1) {
                    // Against a constant k: a NaN x gives k, as `f64::max`/`min` do; one compare.
                    let (x, k) = if constant(1) { (a, b) } else { (b, a) };
                    let cc = if max {
                        FloatCC::GreaterThan
                    } else {
                        FloatCC::LessThan
                    };
                    let better = self.b.ins().fcmp(cc, x, k);
                    self.pick(better, x, k)
                } else {
                    self.extreme(a, b, max)
                }
            }
            Op::Eq | Op::Ne | Op::Lt | Op::Le | Op::Gt | Op::Ge => {
                let (a, b) = (arg(0)?, arg(1)?);
                let cc = match node.op {
                    Op::Eq => FloatCC::Equal,
                    Op::Ne => FloatCC::NotEqual,
                    Op::Lt => FloatCC::LessThan,
                    Op::Le => FloatCC::LessThanOrEqual,
                    Op::Gt => FloatCC::GreaterThan,
                    _ => FloatCC::GreaterThanOrEqual,
                };
                let condition = self.b.ins().fcmp(cc, a, b);
                self.conds.insert(node_id, condition);
                self.truth(condition)
            }
            Op::And | Op::Or => {
                let a = self.condition(node.args[0], arg(0)?);
                let b = self.condition(node.args[1], arg(1)?);
                let both = if node.op == Op::And {
                    self.b.ins().band(a, b)
                } else {
                    self.b.ins().bor(a, b)
                };
                self.conds.insert(node_id, both);
                self.truth(both)
            }
            Op::Select => {
                let (yes, no) = (arg(1)?, arg(2)?);
                let condition = self.condition(node.args[0], arg(0)?);
                self.pick(condition, yes, no)
            }
            Op::Exp => {
                let a = arg(0)?;
                // An argument known to lie in [−700, 700] (clamped by constants, as `ratio` and `k3`
                // do) needs no clamping, overflow or underflow handling, and one 2ᵏ factor.
                // (A NaN argument gives NaN either way.)
                let r = range(graph, node.args[0], 0);
                let bounded = r.low >= -EXP_FAST_RANGE && r.high <= EXP_FAST_RANGE;
                let within_f32 = r.low >= -EXP_F32_RANGE && r.high <= EXP_F32_RANGE;
                if within_f32 && self.type_of(a).lane_type() == types::F32 {
                    return Ok(self.exp_f32(a));
                }
                self.exp(a, bounded)
            }
            Op::Sqrt => {
                let a = arg(0)?;
                self.b.ins().sqrt(a)
            }
            Op::Abs => {
                let a = arg(0)?;
                self.b.ins().fabs(a)
            }
            Op::Floor => {
                // Lane by lane: vector rounding needs SSE4.1.
                let a = arg(0)?;
                self.per_lane(&[a], |gen, xs| Ok(gen.b.ins().floor(xs[0])))?
            }
            Op::Sign => {
                let a = arg(0)?;
                let zero = self.fconst(0.0);
                let one = self.fconst(1.0);
                let minus = self.fconst(-1.0);
                let positive = self.b.ins().fcmp(FloatCC::GreaterThan, a, zero);
                let negative = self.b.ins().fcmp(FloatCC::LessThan, a, zero);
                let low = self.pick(negative, minus, zero);
                self.pick(positive, one, low)
            }
            // A primitive computed by its op table shim, lane by lane.
            op => match op.primitive().filter(|p| p.jit == Jit::Call) {
                Some(primitive) => {
                    let operands = (0..primitive.arity)
                        .map(&arg)
                        .collect::<GenResult<Vec<_>>>()?;
                    self.call(primitive.name, &operands)?
                }
                None => {
                    return Err(
                        format!("internal: {} cannot be computed in registers", op.name()).into(),
                    )
                }
            },
        })
    }

    fn block(&mut self, body: &[Stmt]) -> GenResult<()> {
        for stmt in body {
            self.stmt(stmt)?;
        }
        Ok(())
    }

    fn stmt(&mut self, stmt: &Stmt) -> GenResult<()> {
        match stmt {
            Stmt::Let { node, expr } => {
                let value = self.let_value(*node, expr)?;
                self.values.insert(*node, value);
            }
            Stmt::Loop(l) => {
                let saved = self.coords.clone();
                let generated = self.child_loop(l);
                self.coords = saved;
                generated?;
            }
            // One thread: `once` and block reductions need nothing.
            Stmt::Store {
                buffer,
                index,
                value,
                ..
            } => {
                let value = self.operand(value)?;
                let index = self.index(index)?;
                self.store(*buffer, index, value)?;
            }
            Stmt::Update {
                op,
                buffer,
                count,
                index,
                x,
                ..
            } => {
                // In the wider of the buffer's precision (`plan::SUMS` for a reduction's buffers)
                // and the registers'.
                let x = self.operand(x)?;
                let index = self.index(index)?;
                let (address, ty) = self.address(*buffer, index)?;
                let wide = if ty == types::F64 { ty } else { self.ft };
                let old = self.b.ins().load(ty, flags(), address, 0);
                let old = self.convert(old, ty, wide);
                let x = self.convert(x, self.ft, wide);
                let new = self.accumulate(*op, old, x);
                let new = self.convert(new, wide, ty);
                self.b.ins().store(flags(), new, address, 0);
                if let Some(count) = count {
                    let (address, ty) = self.address(*count, index)?;
                    let old = self.b.ins().load(ty, flags(), address, 0);
                    let one = self.const_of(ty, 1.0);
                    let new = self.b.ins().fadd(old, one);
                    self.b.ins().store(flags(), new, address, 0);
                }
            }
            Stmt::Reset { acc, op, count } => {
                let init = if matches!(op, Reduction::Max | Reduction::Min) {
                    f64::NAN
                } else {
                    0.0
                };
                let value = self.b.declare_var(SUM);
                let start = self.const_of(SUM, init);
                self.b.def_var(value, start);
                let count = count.then(|| {
                    let count = self.b.declare_var(SUM);
                    let zero = self.const_of(SUM, 0.0);
                    self.b.def_var(count, zero);
                    count
                });
                self.accumulators.insert(*acc, Accumulator { value, count });
            }
            Stmt::Accumulate { acc, op, x, .. } => {
                let x = self.operand(x)?;
                let x = self.convert(x, self.ft, SUM);
                let accumulator = self
                    .accumulators
                    .get(acc)
                    .ok_or("internal: accumulator not reset")?;
                let (value, count) = (accumulator.value, accumulator.count);
                let old = self.b.use_var(value);
                let new = self.accumulate(*op, old, x);
                self.b.def_var(value, new);
                if let Some(count) = count {
                    let old = self.b.use_var(count);
                    let one = self.const_of(SUM, 1.0);
                    let new = self.b.ins().fadd(old, one);
                    self.b.def_var(count, new);
                }
            }
            Stmt::ScanReset { carry } => {
                let value = self.b.declare_var(self.ft);
                let zero = self.fconst(0.0);
                self.b.def_var(value, zero);
                self.accumulators
                    .insert(*carry, Accumulator { value, count: None });
            }
            Stmt::Scan {
                carry,
                x,
                decay,
                buffer,
                index,
            } => {
                let carry = self
                    .accumulators
                    .get(carry)
                    .ok_or("internal: scan carry not reset")?
                    .value;
                let (x, decay) = (self.value(*x)?, self.value(*decay)?);
                let previous = self.b.use_var(carry);
                // decay · carry, 0 for a zero carry (the interpreter's `scan_carry`).
                let product = self.b.ins().fmul(decay, previous);
                let zero = self.fconst(0.0);
                let empty = self.b.ins().fcmp(FloatCC::Equal, previous, zero);
                let decayed = self.b.ins().select(empty, zero, product);
                let next = self.b.ins().fadd(x, decayed);
                self.b.def_var(carry, next);
                let index = self.index(index)?;
                self.store(*buffer, index, next)?;
            }
            Stmt::Finish {
                acc,
                buffer,
                count,
                index,
                ..
            } => {
                let accumulator = self
                    .accumulators
                    .remove(acc)
                    .ok_or("internal: accumulator not reset")?;
                let index = self.index(index)?;
                let value = self.b.use_var(accumulator.value);
                self.store(*buffer, index, value)?;
                if let (Some(n), Some(buffer)) = (accumulator.count, count) {
                    let n = self.b.use_var(n);
                    self.store(*buffer, index, n)?;
                }
            }
        }
        Ok(())
    }

    fn accumulate(&mut self, op: Reduction, old: ClifValue, x: ClifValue) -> ClifValue {
        match op {
            Reduction::Sum
            | Reduction::Count
            | Reduction::SumByOther
            | Reduction::ContractRows
            | Reduction::ContractCols => self.b.ins().fadd(old, x),
            Reduction::Max => self.extreme(old, x, true),
            Reduction::Min => self.extreme(old, x, false),
        }
    }

    /// A counted loop `start..end` (or `end` down to `start` with `reverse`); returns the loop's
    /// blocks and its counter's value in the body.
    fn open(&mut self, start: ClifValue, end: ClifValue, reverse: bool) -> (LoopBlocks, ClifValue) {
        let header = self.b.create_block();
        let body = self.b.create_block();
        let exit = self.b.create_block();
        let counter = self.b.declare_var(I64);
        self.b.def_var(counter, if reverse { end } else { start });
        self.b.ins().jump(header, &[]);
        self.b.switch_to_block(header);
        let i = self.b.use_var(counter);
        let done = if reverse {
            self.b.ins().icmp(IntCC::UnsignedLessThanOrEqual, i, start)
        } else {
            self.b.ins().icmp(IntCC::UnsignedGreaterThanOrEqual, i, end)
        };
        self.b.ins().brif(done, exit, &[], body, &[]);
        self.b.switch_to_block(body);
        let index = if reverse {
            self.b.ins().iadd_imm_s(i, -1)
        } else {
            i
        };
        (
            LoopBlocks {
                header,
                exit,
                counter,
                reverse,
            },
            index,
        )
    }

    fn close(&mut self, blocks: LoopBlocks) {
        let i = self.b.use_var(blocks.counter);
        let next = self
            .b
            .ins()
            .iadd_imm_s(i, if blocks.reverse { -1 } else { 1 });
        self.b.def_var(blocks.counter, next);
        self.b.ins().jump(blocks.header, &[]);
        self.b.switch_to_block(blocks.exit);
    }

    fn child_loop(&mut self, l: &Loop) -> GenResult<()> {
        let head = &l.head;
        let start = self.index(&head.start)?;
        let end = self.index(&head.end)?;
        let start = match self.simd_type(l) {
            Some(vt) => self.vector_tokens(l, vt, start, end)?,
            None => start,
        };
        let (blocks, i) = self.open(start, end, l.order == Order::Backward);
        self.coords.insert(head.counter, i);
        let skip = match &head.skip {
            Some(skip) => {
                let value = self.index(skip)?;
                let inner = self.b.create_block();
                let skip = self.b.create_block();
                let same = self.b.ins().icmp(IntCC::Equal, i, value);
                self.b.ins().brif(same, skip, &[], inner, &[]);
                self.b.switch_to_block(inner);
                Some(skip)
            }
            None => None,
        };
        for (coord, value) in &head.binds {
            let value = self.index(value)?;
            self.coords.insert(*coord, value);
        }
        self.block(&l.body)?;
        if let Some(skip) = skip {
            self.b.ins().jump(skip, &[]);
            self.b.switch_to_block(skip);
        }
        self.close(blocks);
        Ok(())
    }
}

impl Gen<'_, '_> {
    /// The vector type for a token loop, if it can be vectorised: the loop is the innermost and
    /// runs forwards, its `Let`s are element-wise (no selections, and the only reads of its own
    /// tokens are at the token), and its other statements are stores at the token and register
    /// accumulations.
    fn simd_type(&self, l: &Loop) -> Option<Type> {
        if !self.simd || l.head.counter != Coord::T || l.order == Order::Backward {
            return None;
        }
        let at_token = |index: &Index| *index == Index::Coord(Coord::T) || !uses_token(index);
        let operand_ok = |operand: &Operand| match operand {
            Operand::Load(load) => at_token(&load.index),
            Operand::Node(_) | Operand::Zero | Operand::One => true,
        };
        let admitted = l.body.iter().all(|stmt| match stmt {
            Stmt::Let { expr, .. } => match expr {
                Expr::Op | Expr::Const(_) | Expr::Scalar(_) => true,
                Expr::Count(index) => !uses_token(index) || is_token_position(index),
                Expr::Operand(operand) => operand_ok(operand),
                Expr::Select { .. } => false,
            },
            Stmt::Store { index, value, .. } => {
                *index == Index::Coord(Coord::T) && operand_ok(value)
            }
            Stmt::Accumulate { x, .. } => operand_ok(x),
            Stmt::Loop(_)
            | Stmt::Update { .. }
            | Stmt::Reset { .. }
            | Stmt::ScanReset { .. }
            | Stmt::Scan { .. }
            | Stmt::Finish { .. } => false,
        });
        if !admitted {
            return None;
        }
        Some(if self.ft == types::F64 {
            types::F64X2
        } else {
            types::F32X4
        })
    }

    /// The vectorised part of a token loop: tokens `ts, ts + L, …` while a whole vector of L tokens
    /// fits before `te`; register reductions go to per-lane accumulators, added into the scalar ones
    /// lane by lane (in a fixed order) after the loop. Returns the first token left for the scalar
    /// loop.
    fn vector_tokens(
        &mut self,
        l: &Loop,
        vt: Type,
        ts: ClifValue,
        te: ClifValue,
    ) -> GenResult<ClifValue> {
        let lanes = i64::from(vt.lane_count());
        // Per-lane accumulators for the reductions of the body.
        self.vector = Some(vt);
        let mut lane_accumulators: Vec<(usize, Reduction, Accumulator)> = Vec::new();
        for stmt in &l.body {
            if let Stmt::Accumulate { acc, op, count, .. } = stmt {
                let extreme = matches!(op, Reduction::Max | Reduction::Min);
                let init = if extreme { f64::NAN } else { 0.0 };
                // A sum of f32 lanes accumulates in f64 lanes; an extreme (exact in any
                // precision) and a count (whole numbers, exact in f32 lanes up to 2^24 tokens of
                // one response per lane) stay in the register type.
                let lanes_type = if vt == types::F32X4 && !extreme {
                    types::F64X2
                } else {
                    vt
                };
                let value = self.b.declare_var(lanes_type);
                let start = self.const_of(lanes_type, init);
                self.b.def_var(value, start);
                let count = count.then(|| {
                    let count = self.b.declare_var(vt);
                    let zero = self.fconst(0.0);
                    self.b.def_var(count, zero);
                    count
                });
                lane_accumulators.push((*acc, *op, Accumulator { value, count }));
            }
        }
        self.vector = None;

        let header = self.b.create_block();
        let body = self.b.create_block();
        let exit = self.b.create_block();
        let counter = self.b.declare_var(I64);
        self.b.def_var(counter, ts);
        self.b.ins().jump(header, &[]);
        self.b.switch_to_block(header);
        let t = self.b.use_var(counter);
        let vectors = TOKENS_PER_STEP / lanes;
        let step = lanes * vectors;
        let end = self.b.ins().iadd_imm_s(t, step);
        let done = self.b.ins().icmp(IntCC::UnsignedGreaterThan, end, te);
        self.b.ins().brif(done, exit, &[], body, &[]);
        self.b.switch_to_block(body);

        // `vector_body` works on per-copy scopes; the outer values stay as they are.
        let saved_t = self.coords.get(&Coord::T).copied();
        let copies: Vec<ClifValue> = (0..vectors)
            .map(|k| {
                if k == 0 {
                    t
                } else {
                    self.b.ins().iadd_imm_s(t, lanes * k)
                }
            })
            .collect();
        self.vector = Some(vt);
        let generated = self.vector_body(&l.body, &lane_accumulators, &copies);
        self.vector = None;
        match saved_t {
            Some(t) => self.coords.insert(Coord::T, t),
            None => self.coords.remove(&Coord::T),
        };
        generated?;
        let next = self.b.ins().iadd_imm_s(t, step);
        self.b.def_var(counter, next);
        self.b.ins().jump(header, &[]);

        self.b.switch_to_block(exit);
        for (position, op, lane_accumulator) in &lane_accumulators {
            let accumulator = self
                .accumulators
                .get(position)
                .ok_or("internal: accumulator not reset")?;
            let (value, count) = (accumulator.value, accumulator.count);
            let lanes_value = self.b.use_var(lane_accumulator.value);
            let lanes_type = self.type_of(lanes_value);
            let mut total = self.b.use_var(value);
            for lane in 0..lanes_type.lane_count() {
                let x = self.b.ins().extractlane(lanes_value, lane as u8);
                let x = self.convert(x, lanes_type.lane_type(), SUM);
                total = self.accumulate(*op, total, x);
            }
            self.b.def_var(value, total);
            if let (Some(count), Some(lane_count)) = (count, lane_accumulator.count) {
                let lanes_count = self.b.use_var(lane_count);
                let mut total = self.b.use_var(count);
                for lane in 0..vt.lane_count() {
                    let x = self.b.ins().extractlane(lanes_count, lane as u8);
                    let x = self.convert(x, vt.lane_type(), SUM);
                    total = self.b.ins().fadd(total, x);
                }
                self.b.def_var(count, total);
            }
        }
        Ok(self.b.use_var(counter))
    }

    /// The statements of a vectorised token loop body (`simd_type` admitted them), for the vectors
    /// of tokens starting at each of `copies`: the `Let`s interleaved copy by copy (so a constant
    /// loaded for one serves all; each copy has its own values), then each copy's stores and
    /// accumulations.
    fn vector_body(
        &mut self,
        body: &[Stmt],
        lane_accumulators: &[(usize, Reduction, Accumulator)],
        copies: &[ClifValue],
    ) -> GenResult<()> {
        let mut scopes: Vec<(HashMap<NodeId, ClifValue>, HashMap<NodeId, ClifValue>)> = copies
            .iter()
            .map(|_| (self.values.clone(), self.conds.clone()))
            .collect();
        let mut in_copy = |gen: &mut Self,
                           k: usize,
                           work: &mut dyn FnMut(&mut Self) -> GenResult<()>|
         -> GenResult<()> {
            std::mem::swap(&mut gen.values, &mut scopes[k].0);
            std::mem::swap(&mut gen.conds, &mut scopes[k].1);
            gen.coords.insert(Coord::T, copies[k]);
            let result = work(gen);
            std::mem::swap(&mut gen.values, &mut scopes[k].0);
            std::mem::swap(&mut gen.conds, &mut scopes[k].1);
            result
        };
        for stmt in body {
            if let Stmt::Let { node, expr } = stmt {
                for k in 0..copies.len() {
                    in_copy(self, k, &mut |gen| {
                        let value = gen.let_value(*node, expr)?;
                        gen.values.insert(*node, value);
                        Ok(())
                    })?;
                }
            }
        }
        let mut widened: Vec<(usize, ClifValue)> = Vec::new();
        for k in 0..copies.len() {
            in_copy(self, k, &mut |gen| {
                gen.vector_actions(body, lane_accumulators, &mut widened)
            })?;
        }
        // The f32×4 operands of each f64×2 sum, one per copy: added in f32 (one rounding, as an
        // element-wise value has), then widened once, in two halves, into the accumulator.
        for (acc, _, accumulator) in lane_accumulators {
            let mut operands = widened.iter().filter(|(a, _)| a == acc).map(|(_, x)| *x);
            let Some(first) = operands.next() else {
                continue;
            };
            let x = operands.fold(first, |total, x| self.b.ins().fadd(total, x));
            let low = self.b.ins().fvpromote_low(x);
            let high = self.shuffle_halves(x, x, true);
            let high = self.b.ins().fvpromote_low(high);
            let halves = self.b.ins().fadd(low, high);
            let old = self.b.use_var(accumulator.value);
            let new = self.b.ins().fadd(old, halves);
            self.b.def_var(accumulator.value, new);
        }
        Ok(())
    }

    /// The stores and accumulations of one vector of tokens.
    /// The operand of a sum of f32×4 lanes into an f64×2 accumulator is left in `widened` for
    /// `vector_body`.
    fn vector_actions(
        &mut self,
        body: &[Stmt],
        lane_accumulators: &[(usize, Reduction, Accumulator)],
        widened: &mut Vec<(usize, ClifValue)>,
    ) -> GenResult<()> {
        for stmt in body {
            match stmt {
                Stmt::Store { buffer, value, .. } => {
                    let value = self.operand(value)?;
                    let t = self.coord(Coord::T)?;
                    self.store(*buffer, t, value)?;
                }
                Stmt::Accumulate { acc, op, x, .. } => {
                    let x = self.operand(x)?;
                    let (_, _, accumulator) = lane_accumulators
                        .iter()
                        .find(|(p, _, _)| p == acc)
                        .ok_or("internal: no lane accumulator")?;
                    let old = self.b.use_var(accumulator.value);
                    if self.type_of(old) == types::F64X2 && self.type_of(x) == types::F32X4 {
                        widened.push((*acc, x));
                    } else {
                        let new = self.accumulate(*op, old, x);
                        self.b.def_var(accumulator.value, new);
                    }
                    if let Some(count) = accumulator.count {
                        let old = self.b.use_var(count);
                        let one = self.fconst(1.0);
                        let new = self.b.ins().fadd(old, one);
                        self.b.def_var(count, new);
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// Whether an index reads the token coordinate.
fn uses_token(index: &Index) -> bool {
    let mut coords = Vec::new();
    index.coords(&mut coords);
    coords.contains(&Coord::T)
}

/// `t − ts`: a token's position in its response (`token_index`).
fn is_token_position(index: &Index) -> bool {
    matches!(index, Index::Diff(a, b)
        if **a == Index::Coord(Coord::T) && **b == Index::Coord(Coord::Ts))
}

/// For a product of two nodes: the constant ±0.0 when one is that constant and the other an index
/// (`n`, `resp_index`, `length`, `token_index`: a `usize` as a float, never NaN, ∞ or −0), so that the
/// product is the constant itself.
fn zero_times_index(graph: &Graph, args: &[NodeId]) -> Option<f64> {
    let [a, b] = args else {
        return None;
    };
    let is_index = |node: NodeId| {
        matches!(
            graph.node(node).op,
            Op::Value(Value::N | Value::RespIndex | Value::Length | Value::TokenIndex)
        )
    };
    let zero = |node: NodeId| match graph.node(node).op {
        Op::Const(v) if v == 0.0 => Some(v),
        _ => None,
    };
    match (zero(*a), zero(*b)) {
        (Some(v), _) if is_index(*b) => Some(v),
        (_, Some(v)) if is_index(*a) => Some(v),
        _ => None,
    }
}

const INV_LN2: f64 = std::f64::consts::LOG2_E;
/// ln 2 in two parts (fdlibm's): LN2_HI has 32 trailing zero bits, so k·LN2_HI is exact for |k| < 2²¹.
const LN2_HI: f64 = 6.931_471_803_691_238e-1;
const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;
/// 1.5·2⁵²: for |k| < 2⁵¹, k + MAGIC is exact after rounding k to an integer, and its bits are MAGIC's
/// bits + k.
const MAGIC: f64 = 6_755_399_441_055_744.0;

/// `Gen::exp_table`'s table: 2^(j/128) for j = 0…127 as hi·(1 + t), hi the f64 nearest and t the
/// relative rest (|t| ≤ 2⁻⁵³), one 16-byte entry each.
const EXP_TABLE_BITS: i64 = 7;
const EXP_TABLE_SIZE: usize = 1 << EXP_TABLE_BITS;

#[repr(C, align(16))]
struct ExpTable([[f64; 2]; EXP_TABLE_SIZE]);

static EXP_TABLE: std::sync::LazyLock<ExpTable> = std::sync::LazyLock::new(|| {
    let mut table = [[0.0; 2]; EXP_TABLE_SIZE];
    for (j, entry) in table.iter_mut().enumerate() {
        *entry = exp2_parts(j as i32, EXP_TABLE_SIZE as i32);
    }
    ExpTable(table)
});

/// 2^(j/n) (n a power of two, 0 ≤ j < n) as hi·(1 + t): hi = libm's `exp2(j/n)` and t its relative
/// error, from one Newton step on yⁿ = 2ʲ in double-double arithmetic: q = hiⁿ by repeated exact
/// squaring (each square split into its rounded value and its error with a fused multiply-add),
/// d = q/2ʲ − 1 (≈ 1e-14), and 2^(j/n) = hi·(1 + d)^(−1/n) = hi·(1 − d/n) to within d², far below
/// t's own ulp.
fn exp2_parts(j: i32, n: i32) -> [f64; 2] {
    let hi = (f64::from(j) / f64::from(n)).exp2();
    let (mut q, mut q_lo) = (hi, 0.0);
    let mut power = 1;
    while power < n {
        let square = q * q;
        let error = q.mul_add(q, -square) + 2.0 * q * q_lo;
        q = square + error;
        q_lo = error - (q - square);
        power *= 2;
    }
    let target = 2f64.powi(j);
    // q − 2ʲ is exact (Sterbenz: q is within a factor 2 of 2ʲ); dividing by 2ʲ is exact.
    let d = ((q - target) + q_lo) / target;
    [hi, -d / f64::from(n)]
}

/// Tokens per iteration of a vectorised token loop: four f64×2 or two f32×4 vectors, their code
/// interleaved (DAPO's kernel, f64: 4.8–5.1 ms with four vectors against 5.2–5.3 with two and 5.5–5.9
/// with one; f32: the same with two or four).
const TOKENS_PER_STEP: i64 = 8;

/// Below this magnitude `exp` needs no range handling (`Gen::exp_f64`).
const EXP_FAST_RANGE: f64 = 700.0;

/// Below this magnitude an f32 `exp` is computed in f32 (`Gen::exp_f32`): e^±80 and every 2ᵏ for
/// |k| ≤ 116 are normal f32 (the smallest is 2⁻¹²⁶, the largest below 2¹²⁸).
const EXP_F32_RANGE: f64 = 80.0;
/// 1.5·2²³: for |k| < 2²², k + MAGIC_F32 in f32 is exact after rounding k to an integer, and its bits
/// are MAGIC_F32's bits + k.
const MAGIC_F32: f64 = 12_582_912.0;
/// ln 2 in two f32 parts (Cephes's `expf`): 0.693359375 = 355/512 (9 significant bits), so
/// k·LN2_HI_F32 is exact for |k| < 2¹⁵; LN2_LO_F32 = ln 2 − LN2_HI_F32 (rounded to f32 where used).
const LN2_HI_F32: f64 = 0.693_359_375;
const LN2_LO_F32: f64 = std::f64::consts::LN_2 - LN2_HI_F32;

/// What is known of a value: its non-NaN values lie in `[low, high]`; `nan`: it may be NaN.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Range {
    low: f64,
    high: f64,
    nan: bool,
}

const UNKNOWN: Range = Range {
    low: f64::NEG_INFINITY,
    high: f64::INFINITY,
    nan: true,
};

/// Interval arithmetic over constants, `min`, `max`, `+`, `−` and negation (anything else is
/// unknown). `min`/`max` ignore a NaN operand (`f64::min`), so `clamp(x, a, b)` lies in `[a, b]` and is
/// never NaN whatever `x` is.
fn range(graph: &Graph, node: NodeId, depth: usize) -> Range {
    if depth > 64 {
        return UNKNOWN;
    }
    let n = graph.node(node);
    let arg = |k: usize| {
        n.args
            .get(k)
            .map_or(UNKNOWN, |a| range(graph, *a, depth + 1))
    };
    let checked = |r: Range| {
        if r.low.is_nan() || r.high.is_nan() {
            UNKNOWN
        } else {
            r
        }
    };
    let infinite = |r: &Range| r.low.is_infinite() || r.high.is_infinite();
    match n.op {
        Op::Const(v) if !v.is_nan() => Range {
            low: v,
            high: v,
            nan: false,
        },
        Op::Copy | Op::StopGrad => arg(0),
        Op::Neg => {
            let a = arg(0);
            Range {
                low: -a.high,
                high: -a.low,
                nan: a.nan,
            }
        }
        Op::Add | Op::Sub => {
            let (a, b) = (arg(0), arg(1));
            let (low, high) = if n.op == Op::Add {
                (a.low + b.low, a.high + b.high)
            } else {
                (a.low - b.high, a.high - b.low)
            };
            // ∞ − ∞ is NaN.
            let nan = a.nan || b.nan || infinite(&a) || infinite(&b);
            checked(Range { low, high, nan })
        }
        Op::Max => {
            let (a, b) = (arg(0), arg(1));
            // Both numbers: max of the two; one NaN: the other one alone.
            let mut low = a.low.max(b.low);
            if a.nan {
                low = low.min(b.low);
            }
            if b.nan {
                low = low.min(a.low);
            }
            Range {
                low,
                high: a.high.max(b.high),
                nan: a.nan && b.nan,
            }
        }
        Op::Min => {
            let (a, b) = (arg(0), arg(1));
            let mut high = a.high.min(b.high);
            if a.nan {
                high = high.max(b.high);
            }
            if b.nan {
                high = high.max(a.high);
            }
            Range {
                low: a.low.min(b.low),
                high,
                nan: a.nan && b.nan,
            }
        }
        _ => UNKNOWN,
    }
}

struct LoopBlocks {
    header: Block,
    exit: Block,
    counter: Variable,
    reverse: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(source: &str) -> Graph {
        let checked = crate::check_source("range", source);
        let recipe = checked.recipe.expect("checks");
        crate::compile_graph(&recipe, &[]).expect("lowers")
    }

    /// The range of the argument of the first `exp` in `source`.
    fn exp_argument(source: &str) -> Range {
        let g = graph(source);
        let node = (0..g.nodes.len())
            .map(|i| NodeId(i as u32))
            .find(|n| g.node(*n).op == Op::Exp)
            .expect("an exp");
        range(&g, g.node(node).args[0], 0)
    }

    #[test]
    fn clamps_by_constants_bound_a_value_whatever_it_is() {
        let r = exp_argument(
            "input x : f32[tok] policy\nloss = sum(exp(clamp(x, -20, 20)) over tok, batch)",
        );
        assert_eq!((r.low, r.high, r.nan), (-20.0, 20.0, false));
        // The std/loss ratio: exp(clamp(logp − old_logp, −20, 20)).
        let r = exp_argument(
            "import std/loss.{ratio}\ninput logp : f32[tok] policy\ninput old : f32[tok]\nloss = sum(ratio(logp, old) over tok, batch)",
        );
        assert_eq!((r.low, r.high, r.nan), (-20.0, 20.0, false));
        let r = exp_argument(
            "input x : f32[tok] policy\nloss = sum(exp(-clamp(x, -3, 5) + 1) over tok, batch)",
        );
        assert_eq!((r.low, r.high, r.nan), (-4.0, 4.0, false));
    }

    #[test]
    fn unclamped_or_one_sided_values_are_not_bounded() {
        let r = exp_argument("input x : f32[tok] policy\nloss = sum(exp(x) over tok, batch)");
        assert_eq!(r, UNKNOWN);
        let r =
            exp_argument("input x : f32[tok] policy\nloss = sum(exp(max(x, -20)) over tok, batch)");
        assert_eq!((r.low, r.high, r.nan), (-20.0, f64::INFINITY, false));
        // min(a, y) ≤ a whether or not y is NaN; nothing bounds it below.
        let r = exp_argument(
            "input x : f32[tok] policy\ninput y : f32[tok]\nloss = sum(exp(min(clamp(x, 0, 1), y)) over tok, batch)",
        );
        assert_eq!((r.low, r.high, r.nan), (f64::NEG_INFINITY, 1.0, false));
        // Both operands unknown: NaN only if both are.
        let r = exp_argument(
            "input x : f32[tok] policy\ninput y : f32[tok]\nloss = sum(exp(max(x, y)) over tok, batch)",
        );
        assert_eq!(r, UNKNOWN);
    }

    /// `EXP_TABLE`: hi is the f64 nearest 2^(j/128) (|t| at most 2⁻⁵³), and hi·(1 + t) is exact far
    /// beyond f64: squared in double-double arithmetic, entry j gives entry 2j (or twice entry
    /// 2j − 128) to within 2⁻⁹⁸ relative, which a t wrong by more than 2⁻⁹⁹ fails (an f64 t alone is
    /// worth 2⁻¹⁰⁶).
    #[test]
    fn exp_table_entries_are_hi_and_lo_of_powers_of_two() {
        let table = &EXP_TABLE.0;
        for (j, &[hi, t]) in table.iter().enumerate() {
            assert!(t.abs() <= 2f64.powi(-53), "entry {j}: {hi}·(1 + {t})");
            // (hi·(1 + t))² = hi²·(1 + 2t + t²), hi² as square + error exactly.
            let square = hi * hi;
            let error = hi.mul_add(hi, -square);
            let (target, target_t) = if 2 * j < EXP_TABLE_SIZE {
                let [h, t] = table[2 * j];
                (h, t)
            } else {
                let [h, t] = table[2 * j - EXP_TABLE_SIZE];
                (2.0 * h, t)
            };
            let difference = ((square - target) + error + square * (2.0 * t + t * t)
                - target * target_t)
                / square;
            assert!(
                difference.abs() < 2f64.powi(-98),
                "entry {j}: (hi·(1 + t))² differs from entry {} by {difference:e} relative",
                2 * j % EXP_TABLE_SIZE
            );
        }
        assert_eq!(table[0], [1.0, 0.0]);
    }
}
