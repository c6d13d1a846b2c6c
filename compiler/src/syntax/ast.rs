//! The abstract syntax tree: what the parser produces, before any name or type is known.
//! Every node owns its `Span` (byte offsets into its file), so the tree has no lifetimes and serialises.

use serde::Serialize;

/// Byte offsets `[start, end)` into one source file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct Span {
    pub start: u32,
    pub end: u32,
}

impl Span {
    pub fn new(start: usize, end: usize) -> Span {
        Span {
            start: clamp_u32(start),
            end: clamp_u32(end),
        }
    }

    /// The smallest span covering both.
    pub fn to(self, other: Span) -> Span {
        Span {
            start: self.start.min(other.start),
            end: self.end.max(other.end),
        }
    }

    pub fn range(self) -> std::ops::Range<usize> {
        self.start as usize..self.end as usize
    }

    pub fn len(self) -> usize {
        (self.end - self.start) as usize
    }

    pub fn is_empty(self) -> bool {
        self.start == self.end
    }
}

fn clamp_u32(offset: usize) -> u32 {
    u32::try_from(offset).unwrap_or(u32::MAX)
}

/// A name as written, with where it was written.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Ident {
    pub name: String,
    pub span: Span,
}

/// One parsed file.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Module {
    pub items: Vec<Item>,
    /// The comments, doc lines and line breaks between the tokens, by position (the formatter's
    /// input besides the items; not part of the tree's meaning, so not serialised).
    #[serde(skip)]
    pub trivia: super::trivia::Trivia,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Item {
    /// The `///` lines above the item, without the slashes and one leading space.
    pub doc: Vec<String>,
    pub kind: ItemKind,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum ItemKind {
    Import(Import),
    Input(InputDecl),
    Param(ParamDecl),
    Fn(FnDecl),
    Let(LetDecl),
    Rubric(RubricDecl),
    Reward(Expr),
    Advantage(Expr),
    Loss(Expr),
    Metric {
        name: Ident,
        value: Expr,
    },
    Keep {
        level: KeepLevel,
        level_span: Span,
        condition: Expr,
    },
    Rollout(Vec<RolloutEntry>),
    /// `state NAME [: ELEM] = INIT update EXPR`: a batch-level value carried across steps.
    State(StateDecl),
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum ImportSource {
    /// `std/loss`: a module of the embedded standard library (the path without `std/`).
    Std(String),
    /// `"./mine.rlx"`: a file relative to the importing file.
    Relative(String),
    /// `name/module` (a module, `.rlx` implied) or `name/dir/file.toml` (a rubric file): a file of
    /// the declared package `name` (docs/sharing.md).
    Package { package: String, path: String },
}

impl ImportSource {
    /// The source as written (without quotes).
    pub fn written(&self) -> String {
        match self {
            ImportSource::Std(path) => format!("std/{path}"),
            ImportSource::Relative(path) => path.clone(),
            ImportSource::Package { package, path } => format!("{package}/{path}"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Import {
    pub source: ImportSource,
    pub source_span: Span,
    /// `None` imports every function of the module.
    pub names: Option<Vec<Ident>>,
}

/// The element type a type expression names (`f32` in `f32[resp]`).
pub use rlx_core::Elem as ElemType;

/// `f32[resp, crit]` as written; the checker interprets the axis names.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TypeExpr {
    pub elem: ElemType,
    pub axes: Vec<Ident>,
    pub span: Span,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum InputRole {
    /// Differentiable: the compiler derives ∂loss/∂input.
    Policy,
    /// A critic's output: differentiable too, for value losses.
    Value,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InputDecl {
    pub name: Ident,
    pub ty: TypeExpr,
    pub role: Option<InputRole>,
    /// Used when a rollout does not supply the input.
    pub default: Option<Literal>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum LiteralValue {
    Number { value: f64, is_int: bool },
    Bool(bool),
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Literal {
    pub value: LiteralValue,
    /// The literal as written, kept so the formatter does not rewrite `1e-3` as `0.001`.
    pub text: String,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ParamDecl {
    pub name: Ident,
    pub ty: Option<(ElemType, Span)>,
    pub value: Literal,
}

/// `state coef : f32 = 0.0 update next_coef(coef, …)` (docs/language.md, "State across steps").
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StateDecl {
    pub name: Ident,
    pub ty: Option<(ElemType, Span)>,
    pub init: StateInit,
    pub update: Expr,
}

/// A state's initial value: a literal or the name of a `param`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum StateInit {
    Literal(Literal),
    Param(Ident),
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FnParam {
    pub name: Ident,
    pub ty: Option<TypeExpr>,
    pub default: Option<Expr>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FnDecl {
    pub name: Ident,
    pub params: Vec<FnParam>,
    pub ret: Option<TypeExpr>,
    pub body: Expr,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LetDecl {
    pub name: Ident,
    pub value: Expr,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RubricDecl {
    pub name: Ident,
    pub entries: Vec<RubricEntry>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum RubricEntry {
    /// `criteria "./style.toml"` / `criteria name/style.toml`: criteria from a rubric file, replaced
    /// by the criteria it declares when the recipe is resolved (`resolve.rs`, `rubric_file.rs`).
    Criteria(CriteriaFile),
    Criterion(CriterionDecl),
    Interact(InteractDecl),
    Aggregate(Ident),
    OnVeto(ShapeCall),
    Shape(ShapeCall),
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CriteriaFile {
    /// `Relative` or `Package`, the path with its extension.
    pub source: ImportSource,
    /// The path as written.
    pub source_span: Span,
    /// The whole entry.
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CriterionDecl {
    pub name: Ident,
    pub attrs: Vec<CriterionAttr>,
    pub span: Span,
    /// What a judge is asked: the `text` of a criterion from a rubric file (none when written inline).
    pub text: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum CriterionAttr {
    Weight(RubricValue),
    Points(RubricValue),
    Levels(Vec<Literal>, Span),
    Veto(Span),
    /// `critical`: the criterion scores, and failing it (a score below 0.5) vetoes the response.
    Critical(Span),
    Saturate(ShapeCall),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum InteractMode {
    Product,
    Min,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InteractDecl {
    pub first: Ident,
    pub second: Ident,
    pub mode: Option<InteractMode>,
    pub gamma: RubricValue,
    pub span: Span,
}

/// A number or the name of a `param`, in a rubric attribute.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum RubricValue {
    Number(Literal),
    Param(Ident),
}

impl RubricValue {
    pub fn span(&self) -> Span {
        match self {
            RubricValue::Number(literal) => literal.span,
            RubricValue::Param(ident) => ident.span,
        }
    }
}

/// `tanh(k = 3)`, `zero`, `penalty(value = -1)`: a named shape with constant arguments.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ShapeCall {
    pub name: Ident,
    pub args: Vec<(Ident, RubricValue)>,
    /// Whether parentheses were written (kept for the formatter).
    pub parens: bool,
    pub span: Span,
}

/// `keep group when …` or `keep resp when …`.
pub use rlx_core::KeepLevel;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum RolloutValue {
    Expr(Expr),
    Strings(Vec<(String, Span)>),
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RolloutEntry {
    pub key: Ident,
    pub value: RolloutValue,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum UnaryOp {
    Neg,
    Not,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum BinaryOp {
    Or,
    And,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Add,
    Sub,
    Mul,
    Div,
    Pow,
}

impl BinaryOp {
    pub fn symbol(self) -> &'static str {
        match self {
            BinaryOp::Or => "or",
            BinaryOp::And => "and",
            BinaryOp::Eq => "==",
            BinaryOp::Ne => "!=",
            BinaryOp::Lt => "<",
            BinaryOp::Le => "<=",
            BinaryOp::Gt => ">",
            BinaryOp::Ge => ">=",
            BinaryOp::Add => "+",
            BinaryOp::Sub => "-",
            BinaryOp::Mul => "*",
            BinaryOp::Div => "/",
            BinaryOp::Pow => "^",
        }
    }

    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge
        )
    }

    pub fn is_logical(self) -> bool {
        matches!(self, BinaryOp::Or | BinaryOp::And)
    }

    /// Binding strength, higher binds tighter (the same table the Pratt parser is built from).
    pub fn precedence(self) -> u8 {
        match self {
            BinaryOp::Or => 1,
            BinaryOp::And => 2,
            // 3 is prefix `not`
            BinaryOp::Eq
            | BinaryOp::Ne
            | BinaryOp::Lt
            | BinaryOp::Le
            | BinaryOp::Gt
            | BinaryOp::Ge => 4,
            BinaryOp::Add | BinaryOp::Sub => 5,
            BinaryOp::Mul | BinaryOp::Div => 6,
            // 7 is prefix `-`
            BinaryOp::Pow => 8,
        }
    }
}

/// One argument of a call: positional, or `name = value`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Arg {
    pub name: Option<Ident>,
    pub value: Expr,
}

/// `over tok, batch`: the axes a reduction removes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Over {
    pub axes: Vec<Ident>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LocalLet {
    pub name: Ident,
    pub value: Expr,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum ExprKind {
    Number {
        value: f64,
        is_int: bool,
        text: String,
    },
    Bool(bool),
    Name(Ident),
    /// `other.NAME` inside `… over others`.
    Other(Ident),
    Unary {
        op: UnaryOp,
        operand: Box<Expr>,
    },
    Binary {
        op: BinaryOp,
        lhs: Box<Expr>,
        rhs: Box<Expr>,
    },
    Paren(Box<Expr>),
    Call {
        func: Ident,
        args: Vec<Arg>,
        over: Option<Over>,
    },
    Index {
        base: Box<Expr>,
        criterion: Ident,
    },
    Block {
        lets: Vec<LocalLet>,
        body: Box<Expr>,
    },
}
