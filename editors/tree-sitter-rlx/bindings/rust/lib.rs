//! The rlx grammar for tree-sitter: `LANGUAGE` for the `tree-sitter` crate, and the highlight query.
//! The grammar is `grammar.js`; `src/parser.c` is generated from it by `./generate.sh`
//! (docs/editors.md).

use tree_sitter_language::LanguageFn;

extern "C" {
    fn tree_sitter_rlx() -> *const ();
}

/// The tree-sitter language of rlx.
pub const LANGUAGE: LanguageFn = unsafe { LanguageFn::from_raw(tree_sitter_rlx) };

/// The highlight query (`queries/highlights.scm`).
pub const HIGHLIGHTS_QUERY: &str = include_str!("../../queries/highlights.scm");

/// The node types (`src/node-types.json`).
pub const NODE_TYPES: &str = include_str!("../../src/node-types.json");
