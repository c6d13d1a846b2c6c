//! Stage `parse`: text → AST (pest grammar in `grammar/rlx.pest` + a Pratt parser for expressions).

pub mod ast;
pub mod parser;
pub mod trivia;

pub use parser::parse_module;
