//! The loop IR: a kernel plan (`super::plan`) lowered to explicit loops, loads and stores with
//! index expressions (`super::layout`), accumulations, block reductions and combines, the form every
//! backend selects instructions from. `rlxc compile RECIPE --emit loops` prints it (`to_text`).
//!
//! One `Function` per pass of each phase: a loop pass becomes a `LoopFunction` (its nest as `Loop`s
//! whose headers bind the layout's coordinates, the pass's entries as `Let`s, its actions as stores,
//! register accumulations and memory updates), a `combine` pass a `Combine`, and a host pass
//! (`distinct_ngrams`, `rank`, `components`, `uniform`) stays the runtime's (`Function::Host`).
//!
//! The semantics every backend shares are decided here, once: which element of which buffer a value
//! is read from and written to, that an empty `max`/`min` reads as 0 (`Load::count`), `shift`'s
//! clamped source and fill, `unindex`'s selection, the pair index, where a reduction accumulates, and
//! which token loops may be split across the threads of a block (`Order::Split`: their reductions end
//! with a block reduction, `Finish::block`, and the effects above them are made once, `once`). The
//! element-wise arithmetic of a `Let` is the graph node's op, which each backend takes from the op
//! table (`crate::ops`); the JIT's SIMD token loops and inlined `exp` are its own optimisations.

use super::CodegenError;
use std::fmt::{self, Write as _};

use super::abi::{Fixed, Scalar};
use super::layout::{Cond, Coord, Head, Index, Scope};
use super::plan::{Action, BufferId, KernelPlan, LoopKind, LoopPass, Pass, Phase, Reduction, Role};
use crate::ir::{Feature, Graph, Level, NodeId, Op, Value};

/// A plan's loop IR: by phase, then pass.
#[derive(Clone, Debug, PartialEq)]
pub struct LoopKernel {
    pub phases: Vec<LoopPhase>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct LoopPhase {
    pub name: String,
    pub functions: Vec<Function>,
}

/// The code of one pass.
#[derive(Clone, Debug, PartialEq)]
pub enum Function {
    Loop(LoopFunction),
    Combine(Combine),
    /// A pass the runtime runs on the host (`distinct_ngrams`, `rank`, `components`, `uniform`).
    Host(&'static str),
}

/// A loop pass: called as `(table, g_begin, g_end)` (the ABI of `super::abi`).
#[derive(Clone, Debug, PartialEq)]
pub struct LoopFunction {
    pub stage: u32,
    pub path: Vec<LoopKind>,
    /// The token loop runs backwards (a reverse scan).
    pub reverse: bool,
    /// The outer loop runs over the groups of the call's range (a backend may split the range).
    pub per_group: bool,
    /// The token loop is `Order::Split`: a backend may share its iterations among threads.
    pub split: bool,
    /// The buffers the function reads or writes, in id order.
    pub buffers: Vec<BufferId>,
    /// Coordinates bound at entry (from the table), then the body.
    pub binds: Vec<(Coord, Index)>,
    pub body: Vec<Stmt>,
}

/// Reduce the per-group partials of a batch reduction over the call's groups in a fixed pairwise
/// order, for each of `width` feature elements.
#[derive(Clone, Debug, PartialEq)]
pub struct Combine {
    pub stage: u32,
    pub node: NodeId,
    pub op: Reduction,
    pub partial: BufferId,
    pub partial_count: Option<BufferId>,
    pub value: BufferId,
    pub count: Option<BufferId>,
    /// The target's feature width (1 without a feature axis), an expression of the entry's
    /// coordinates (`Scope::entry_binds`).
    pub width: Index,
}

/// The order a loop visits its counter's values in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    Forward,
    Backward,
    /// Any order, or shared among threads: the body's effects are token-level stores and register
    /// accumulations completed by a `Finish` with `block`.
    Split,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Loop {
    pub kind: LoopKind,
    pub head: Head,
    pub order: Order,
    pub body: Vec<Stmt>,
}

/// A value in the accumulation precision.
#[derive(Clone, Debug, PartialEq)]
pub enum Operand {
    /// A `Let`'s value.
    Node(NodeId),
    Load(Load),
    Zero,
    One,
}

/// Element `index` of `buffer`; with `count`, 0 where the count buffer holds 0 (an empty `max` or
/// `min`).
#[derive(Clone, Debug, PartialEq)]
pub struct Load {
    pub buffer: BufferId,
    pub count: Option<BufferId>,
    pub index: Index,
}

/// The value a `Let` binds.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// The node's element-wise op over its operands' `Let`s.
    Op,
    Const(f64),
    /// A scalar of the table (`step`, `progress`).
    Scalar(Scalar),
    /// An index as a number (`n`, `resp_index`, `length`, `token_index`).
    Count(Index),
    Operand(Operand),
    /// `cond ? yes : no`.
    Select {
        cond: Cond,
        yes: Operand,
        no: Operand,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub enum Stmt {
    /// `v{node} = expr`.
    Let {
        node: NodeId,
        expr: Expr,
    },
    Loop(Loop),
    /// `buffer[index] = value`; `once`: above a split loop, made by one thread only.
    Store {
        buffer: BufferId,
        index: Index,
        value: Operand,
        once: bool,
    },
    /// `buffer[index] = op(buffer[index], x)`, and `count[index] += 1`.
    Update {
        op: Reduction,
        buffer: BufferId,
        count: Option<BufferId>,
        index: Index,
        x: Operand,
        once: bool,
    },
    /// Register accumulator `acc` (and its count) starts empty: NaN for `max`/`min` (ignored by
    /// them), else 0.
    Reset {
        acc: usize,
        op: Reduction,
        count: bool,
    },
    /// `acc = op(acc, x)`, and its count += 1.
    Accumulate {
        acc: usize,
        op: Reduction,
        x: Operand,
        count: bool,
    },
    /// Scan carry `carry` starts at 0.
    ScanReset {
        carry: usize,
    },
    /// `carry = x + (carry == 0 ? 0 : decay·carry)`, stored at `buffer[index]`.
    Scan {
        carry: usize,
        x: NodeId,
        decay: NodeId,
        buffer: BufferId,
        index: Index,
    },
    /// Accumulator `acc` is complete: with `block`, first combined over the threads that shared the
    /// split loop (a block reduction in a fixed order); stored at `buffer[index]` (its count at
    /// `count[index]`).
    Finish {
        acc: usize,
        op: Reduction,
        block: bool,
        buffer: BufferId,
        count: Option<BufferId>,
        index: Index,
        once: bool,
    },
}

/// Lower every pass of `plan` (for `graph`). An error names what cannot be expressed.
pub fn lower(graph: &Graph, plan: &KernelPlan) -> Result<LoopKernel, CodegenError> {
    let mut phases = Vec::new();
    for phase in &plan.phases {
        let mut functions = Vec::new();
        for pass in &phase.passes {
            functions.push(match pass {
                Pass::Loop(pass) => Function::Loop(lower_pass(graph, phase, pass)?),
                Pass::Combine {
                    stage,
                    node,
                    op,
                    partial,
                    partial_count,
                    value,
                    count,
                } => {
                    let width = match &graph.node(*node).shape.feature {
                        None => Index::Const(1),
                        Some(feature) => Scope::entry().width(feature)?,
                    };
                    Function::Combine(Combine {
                        stage: *stage,
                        node: *node,
                        op: *op,
                        partial: *partial,
                        partial_count: *partial_count,
                        value: *value,
                        count: *count,
                        width,
                    })
                }
                Pass::Ngrams { .. } => Function::Host("distinct_ngrams"),
                Pass::Rank { .. } => Function::Host("rank"),
                Pass::Components { .. } => Function::Host("components"),
                Pass::Uniform { .. } => Function::Host("uniform"),
            });
        }
        phases.push(LoopPhase {
            name: phase.name.clone(),
            functions,
        });
    }
    Ok(LoopKernel { phases })
}

/// Whether a pass's token loop may be split: it has no scan (a recurrence) and no memory
/// accumulation inside it.
fn splittable(pass: &LoopPass) -> bool {
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

fn lower_pass(graph: &Graph, phase: &Phase, pass: &LoopPass) -> Result<LoopFunction, CodegenError> {
    let split = splittable(pass);
    let mut lower = Lower {
        graph,
        phase,
        pass,
        split,
        tok_depth: pass
            .path
            .iter()
            .position(|k| *k == LoopKind::Tok)
            .map(|p| p + 1),
        scope: Scope::entry(),
    };
    let body = lower.level(0)?;
    Ok(LoopFunction {
        stage: pass.stage,
        path: pass.path.clone(),
        reverse: pass.reverse,
        per_group: pass.parallel(),
        split,
        buffers: pass.buffers_used(graph, phase),
        binds: Scope::entry_binds(),
        body,
    })
}

struct Lower<'a> {
    graph: &'a Graph,
    phase: &'a Phase,
    pass: &'a LoopPass,
    split: bool,
    /// The depth of the token loop's body, if the pass has one.
    tok_depth: Option<usize>,
    scope: Scope,
}

impl Lower<'_> {
    /// A node's value from its buffer at `index`.
    fn load(&self, node: NodeId, index: Index) -> Result<Operand, CodegenError> {
        let role = self
            .phase
            .roles
            .get(node.0 as usize)
            .copied()
            .unwrap_or(Role::Unused);
        let (buffer, count) = match role {
            Role::Input(b) | Role::Carried(b) => (b, None),
            Role::Buffer { value, count } => (value, count),
            Role::Inline | Role::Unused => {
                return Err(format!(
                    "internal: %{} is read at another element but has no buffer",
                    node.0
                )
                .into())
            }
        };
        if self.phase.buffers.get(buffer as usize).is_none() {
            return Err(format!("internal: unknown buffer b{buffer}").into());
        }
        Ok(Operand::Load(Load {
            buffer,
            count,
            index,
        }))
    }

    fn entry(&self, node_id: NodeId, load: bool) -> Result<Expr, CodegenError> {
        let node = self.graph.node(node_id);
        let scope = &self.scope;
        if load {
            let index = scope.index(&node.shape, false, None)?;
            return Ok(Expr::Operand(self.load(node_id, index)?));
        }
        let arg = |k: usize| -> Result<NodeId, CodegenError> {
            node.args
                .get(k)
                .copied()
                .ok_or_else(|| format!("internal: operand {k} of %{} missing", node_id.0).into())
        };
        let operand_shape =
            || -> Result<_, CodegenError> { Ok(self.graph.node(arg(0)?).shape.clone()) };
        Ok(match &node.op {
            Op::Const(v) => Expr::Const(*v),
            Op::Value(value) => match value {
                Value::Step => Expr::Scalar(Scalar::Step),
                Value::Progress => Expr::Scalar(Scalar::Progress),
                Value::N => Expr::Count(scope.coord(Coord::N)?),
                Value::RespIndex => Expr::Count(scope.coord(Coord::Li)?),
                Value::Length => Expr::Count(Index::Diff(
                    Box::new(scope.coord(Coord::Te)?),
                    Box::new(scope.coord(Coord::Ts)?),
                )),
                Value::TokenIndex => Expr::Count(Index::Diff(
                    Box::new(scope.coord(Coord::T)?),
                    Box::new(scope.coord(Coord::Ts)?),
                )),
                Value::Inf => Expr::Const(f64::INFINITY),
                Value::Pi => Expr::Const(std::f64::consts::PI),
            },
            Op::Input(_) => return Err("internal: inputs are loaded".into()),
            Op::Other => {
                let shape = operand_shape()?;
                if shape.level == Level::Resp {
                    let index = scope.index(&shape, true, None)?;
                    Expr::Operand(self.load(arg(0)?, index)?)
                } else {
                    Expr::Operand(Operand::Node(arg(0)?))
                }
            }
            Op::Index(k) => {
                let shape = operand_shape()?;
                if matches!(shape.feature, Some(Feature::Rubric { .. })) {
                    let index = scope.index(&shape, false, Some(Index::Const(i64::from(*k))))?;
                    Expr::Operand(self.load(arg(0)?, index)?)
                } else {
                    Expr::Operand(Operand::Node(arg(0)?))
                }
            }
            Op::SpreadRows | Op::SpreadCols => {
                let shape = operand_shape()?;
                let k = scope
                    .matrix_coordinate(node.shape.feature.as_ref(), node.op == Op::SpreadRows)?;
                let index = scope.index(&shape, false, Some(k))?;
                Expr::Operand(self.load(arg(0)?, index)?)
            }
            Op::Unindex(k) => Expr::Select {
                cond: Cond::Is(scope.coord(Coord::F)?, i64::from(*k)),
                yes: Operand::Node(arg(0)?),
                no: Operand::Zero,
            },
            Op::Shift { offset } => {
                let (_, inside) = scope.shift(*offset)?;
                let yes = if operand_shape()?.level == Level::Tok {
                    self.load(arg(0)?, scope.shift_clamped(*offset)?)?
                } else {
                    Operand::Node(arg(0)?)
                };
                Expr::Select {
                    cond: inside,
                    yes,
                    no: Operand::Node(arg(1)?),
                }
            }
            _ => Expr::Op,
        })
    }

    /// Whether statements at `depth` run in every thread of a split loop's block while only one
    /// may have side effects.
    fn above_split(&self, depth: usize) -> bool {
        self.split && self.tok_depth.is_some_and(|t| depth < t)
    }

    /// Everything at loop depth `depth`, then the loop below it, then the accumulators completed
    /// at this depth.
    fn level(&mut self, depth: usize) -> Result<Vec<Stmt>, CodegenError> {
        let pass = self.pass;
        let mut out = Vec::new();
        for entry in pass.entries.iter().filter(|e| e.depth == depth) {
            out.push(Stmt::Let {
                node: entry.node,
                expr: self.entry(entry.node, entry.load)?,
            });
        }
        for (acc, action) in pass.actions.iter().enumerate() {
            match action {
                Action::Reduce { op, target, .. } if target.register && target.depth == depth => {
                    out.push(Stmt::Reset {
                        acc,
                        op: *op,
                        count: target.count.is_some(),
                    })
                }
                Action::Scan { carry_depth, .. } if *carry_depth == depth => {
                    out.push(Stmt::ScanReset { carry: acc })
                }
                _ => {}
            }
        }
        let once = self.above_split(depth);
        for (acc, action) in pass.actions.iter().enumerate() {
            match action {
                Action::Store {
                    node,
                    shape,
                    buffer,
                    depth: d,
                } if *d == depth => out.push(Stmt::Store {
                    buffer: *buffer,
                    index: self.scope.index(shape, false, None)?,
                    value: Operand::Node(*node),
                    once,
                }),
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
                        Operand::One
                    } else {
                        Operand::Node(*operand)
                    };
                    if target.register {
                        out.push(Stmt::Accumulate {
                            acc,
                            op: *op,
                            x,
                            count: target.count.is_some(),
                        });
                    } else {
                        out.push(Stmt::Update {
                            op: *op,
                            buffer: target.value,
                            count: target.count,
                            index: self.scope.target_index((from, to), target.partial, *op)?,
                            x,
                            once,
                        });
                    }
                }
                Action::Scan {
                    x,
                    decay,
                    buffer,
                    depth: d,
                    ..
                } if *d == depth => out.push(Stmt::Scan {
                    carry: acc,
                    x: *x,
                    decay: *decay,
                    buffer: *buffer,
                    index: self.scope.coord(Coord::T)?,
                }),
                _ => {}
            }
        }
        if depth < pass.path.len() {
            let saved = self.scope.clone();
            let child = self.child_loop(depth);
            self.scope = saved;
            out.push(Stmt::Loop(child?));
        }
        for (acc, action) in pass.actions.iter().enumerate() {
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
                    out.push(Stmt::Finish {
                        acc,
                        op: *op,
                        // Token contributions are split across the threads: a block reduction.
                        block: self.split && Some(*from_depth) == self.tok_depth,
                        buffer: target.value,
                        count: target.count,
                        index: self.scope.target_index((from, to), target.partial, *op)?,
                        once,
                    });
                }
            }
        }
        Ok(out)
    }

    fn child_loop(&mut self, depth: usize) -> Result<Loop, CodegenError> {
        let kind = self.pass.path[depth].clone();
        let head = self.scope.head(&kind)?;
        self.scope.bind(head.counter);
        for (coord, _) in &head.binds {
            self.scope.bind(*coord);
        }
        let order = if kind != LoopKind::Tok {
            Order::Forward
        } else if self.split {
            Order::Split
        } else if self.pass.reverse {
            Order::Backward
        } else {
            Order::Forward
        };
        let body = self.level(depth + 1)?;
        Ok(Loop {
            kind,
            head,
            order,
            body,
        })
    }
}

impl fmt::Display for Index {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Index::Const(k) => write!(f, "{k}"),
            Index::Coord(c) => f.write_str(c.name()),
            Index::Sum(terms) => {
                f.write_str("(")?;
                for (i, term) in terms.iter().enumerate() {
                    if i > 0 {
                        f.write_str(" + ")?;
                    }
                    match term {
                        Index::Product(a, b) => write!(f, "{a} * {b}")?,
                        term => write!(f, "{term}")?,
                    }
                }
                f.write_str(")")
            }
            Index::Product(a, b) => write!(f, "({a} * {b})"),
            Index::Diff(a, b) => write!(f, "({a} - {b})"),
            Index::Quot(a, b) => write!(f, "({a} / {b})"),
            Index::Rem(a, b) => write!(f, "({a} % {b})"),
            Index::Offset(x, k) if *k < 0 => write!(f, "({x} - {})", k.unsigned_abs()),
            Index::Offset(x, k) => write!(f, "({x} + {k})"),
            Index::Select(cond, a, b) => write!(f, "({cond} ? {a} : {b})"),
            Index::Table(fixed, at) => write!(f, "{}[{at}]", fixed.c_name()),
            Index::Size(size) => write!(f, "{}[{}]", Fixed::Sizes.c_name(), size.index()),
        }
    }
}

impl fmt::Display for Cond {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cond::Within { x, start, end } => write!(f, "{start} <= {x} < {end}"),
            Cond::Is(x, k) => write!(f, "{x} == {k}"),
            Cond::Greater(a, b) => write!(f, "{a} > {b}"),
        }
    }
}

impl fmt::Display for Operand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Operand::Node(node) => write!(f, "v{}", node.0),
            Operand::Load(load) => {
                write!(f, "b{}[{}]", load.buffer, load.index)?;
                if let Some(count) = load.count {
                    write!(f, " unless b{count}[{}] == 0", load.index)?;
                }
                Ok(())
            }
            Operand::Zero => f.write_str("0"),
            Operand::One => f.write_str("1"),
        }
    }
}

impl LoopKernel {
    /// The loop IR as text (`rlxc compile --emit loops`).
    pub fn to_text(&self, graph: &Graph) -> String {
        let mut out = String::new();
        for (phase_index, phase) in self.phases.iter().enumerate() {
            let _ = writeln!(out, "phase {phase_index} ({})", phase.name);
            for (pass_index, function) in phase.functions.iter().enumerate() {
                match function {
                    Function::Loop(function) => {
                        let path: Vec<&str> = function.path.iter().map(LoopKind::name).collect();
                        let buffers: Vec<String> =
                            function.buffers.iter().map(|b| format!("b{b}")).collect();
                        let _ = writeln!(
                            out,
                            "  fn p{phase_index}_{pass_index} (stage {}): {}{}{}; buffers {}",
                            function.stage,
                            if path.is_empty() {
                                "[batch]".to_string()
                            } else {
                                path.join(" > ")
                            },
                            if function.per_group {
                                ", per group"
                            } else {
                                ""
                            },
                            if function.split { ", tokens split" } else { "" },
                            if buffers.is_empty() {
                                "none".to_string()
                            } else {
                                buffers.join(" ")
                            }
                        );
                        for (coord, value) in &function.binds {
                            let _ = writeln!(out, "    {} = {value}", coord.name());
                        }
                        print_block(&mut out, graph, &function.body, 2);
                    }
                    Function::Combine(c) => {
                        let counts = match (c.partial_count, c.count) {
                            (Some(pc), Some(vc)) => format!(" (counts b{pc} → b{vc})"),
                            _ => String::new(),
                        };
                        let _ = writeln!(
                            out,
                            "  fn c{phase_index}_{pass_index} (stage {}): combine {} of %{} over groups, b{} → b{}{counts}, width {}",
                            c.stage,
                            c.op.name(),
                            c.node.0,
                            c.partial,
                            c.value,
                            c.width
                        );
                    }
                    Function::Host(name) => {
                        let _ = writeln!(out, "  pass {pass_index}: {name} on the host");
                    }
                }
            }
        }
        out
    }
}

fn print_block(out: &mut String, graph: &Graph, body: &[Stmt], indent: usize) {
    let pad = "  ".repeat(indent);
    let once = |once: bool| if once { " (once)" } else { "" };
    for stmt in body {
        let _ = match stmt {
            Stmt::Let { node, expr } => {
                let text = match expr {
                    Expr::Op => {
                        let n = graph.node(*node);
                        let args: Vec<String> = n.args.iter().map(|a| format!("v{}", a.0)).collect();
                        format!("{}({})", n.op.name(), args.join(", "))
                    }
                    Expr::Const(v) => format!("{v:?}"),
                    Expr::Scalar(Scalar::Step) => "step".into(),
                    Expr::Scalar(Scalar::Progress) => "progress".into(),
                    Expr::Count(index) => format!("float {index}"),
                    Expr::Operand(operand) => operand.to_string(),
                    Expr::Select { cond, yes, no } => format!("{cond} ? {yes} : {no}"),
                };
                writeln!(out, "{pad}v{} = {text}", node.0)
            }
            Stmt::Loop(l) => {
                let head = &l.head;
                let order = match l.order {
                    Order::Forward => "",
                    Order::Backward => " backwards",
                    Order::Split => " split",
                };
                let _ = writeln!(
                    out,
                    "{pad}for {} in {}..{}{order}{}:  # {}",
                    head.counter.name(),
                    head.start,
                    head.end,
                    match &head.skip {
                        Some(skip) => format!(" except {skip}"),
                        None => String::new(),
                    },
                    l.kind.name()
                );
                for (coord, value) in &head.binds {
                    let _ = writeln!(out, "{pad}  {} = {value}", coord.name());
                }
                print_block(out, graph, &l.body, indent + 1);
                Ok(())
            }
            Stmt::Store {
                buffer,
                index,
                value,
                once: o,
            } => writeln!(out, "{pad}b{buffer}[{index}] = {value}{}", once(*o)),
            Stmt::Update {
                op,
                buffer,
                count,
                index,
                x,
                once: o,
            } => {
                let _ = writeln!(
                    out,
                    "{pad}b{buffer}[{index}] {}= {x}{}",
                    op.name(),
                    once(*o)
                );
                match count {
                    Some(count) => writeln!(out, "{pad}b{count}[{index}] += 1{}", once(*o)),
                    None => Ok(()),
                }
            }
            Stmt::Reset { acc, op, count } => writeln!(
                out,
                "{pad}a{acc} = empty {}{}",
                op.name(),
                if *count { ", n{acc} = 0" } else { "" }
            ),
            Stmt::Accumulate { acc, op, x, count } => writeln!(
                out,
                "{pad}a{acc} {}= {x}{}",
                op.name(),
                if *count { ", n{acc} += 1" } else { "" }
            ),
            Stmt::ScanReset { carry } => writeln!(out, "{pad}s{carry} = 0"),
            Stmt::Scan {
                carry,
                x,
                decay,
                buffer,
                index,
            } => writeln!(
                out,
                "{pad}s{carry} = v{} + v{} * s{carry} (0 for s{carry} == 0); b{buffer}[{index}] = s{carry}",
                x.0, decay.0
            ),
            Stmt::Finish {
                acc,
                op,
                block,
                buffer,
                count,
                index,
                once: o,
            } => {
                let _ = writeln!(
                    out,
                    "{pad}b{buffer}[{index}] = a{acc}{}{}",
                    if *block {
                        format!(" (block {})", op.name())
                    } else {
                        String::new()
                    },
                    once(*o)
                );
                match count {
                    Some(count) => writeln!(out, "{pad}b{count}[{index}] = n{acc}{}", once(*o)),
                    None => Ok(()),
                }
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{plan, Options};

    fn kernel(source: &str) -> (Graph, LoopKernel) {
        let checked = crate::check_source("loops", source);
        let recipe = checked.recipe.expect("checks");
        let graph = crate::compile_graph(&recipe, &[]).expect("lowers");
        let plan = plan::plan(&graph, &Options::default()).unwrap();
        let kernel = lower(&graph, &plan).unwrap();
        (graph, kernel)
    }

    fn all_stmts<'a>(body: &'a [Stmt], out: &mut Vec<&'a Stmt>) {
        for stmt in body {
            out.push(stmt);
            if let Stmt::Loop(l) = stmt {
                all_stmts(&l.body, out);
            }
        }
    }

    #[test]
    fn a_token_sum_is_split_and_its_partial_stored_once_per_group() {
        let (graph, kernel) = kernel("input x : f32[tok] policy\nloss = sum(x over tok, batch)");
        let text = kernel.to_text(&graph);
        let Function::Loop(function) = &kernel.phases[0].functions[0] else {
            panic!("{text}");
        };
        assert!(function.split, "{text}");
        let mut stmts = Vec::new();
        all_stmts(&function.body, &mut stmts);
        let finish = stmts
            .iter()
            .find_map(|s| match s {
                Stmt::Finish {
                    block, once, index, ..
                } => Some((*block, *once, index.clone())),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no finish: {text}"));
        // The batch sum's per-group partial, combined by the next pass.
        assert_eq!(finish, (true, true, Index::Coord(Coord::G)), "{text}");
        assert!(text.contains("for t in ts..te split"), "{text}");
        assert!(
            matches!(&kernel.phases[0].functions[1], Function::Combine(c) if c.op == Reduction::Sum),
            "{text}"
        );
    }
}
