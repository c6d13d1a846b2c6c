//! `docs/stdlib.md`, generated from the standard library's doc comments (`rlxc doc`), so the reference
//! cannot drift from the code. A test compares the committed file with this output.

use std::fmt::Write as _;

use crate::source::FileId;
use crate::stdlib;
use crate::syntax::ast::{ItemKind, Module};
use crate::syntax::parse_module;

/// A module's functions: (signature as written, doc lines).
fn functions(module: &Module, text: &str) -> Vec<(String, Vec<String>)> {
    module
        .items
        .iter()
        .filter_map(|item| match &item.kind {
            ItemKind::Fn(decl) => {
                let params: Vec<String> = decl
                    .params
                    .iter()
                    .map(|param| {
                        let mut out = param.name.name.clone();
                        if let Some(ty) = &param.ty {
                            out.push_str(": ");
                            out.push_str(text.get(ty.span.range()).unwrap_or(""));
                        }
                        if let Some(default) = &param.default {
                            out.push_str(" = ");
                            out.push_str(text.get(default.span.range()).unwrap_or(""));
                        }
                        out
                    })
                    .collect();
                Some((
                    format!("{}({})", decl.name.name, params.join(", ")),
                    item.doc.clone(),
                ))
            }
            _ => None,
        })
        .collect()
}

/// The markdown reference of every stdlib module.
pub fn stdlib_markdown() -> String {
    let mut out = String::from(
        "# The rlx standard library\n\n\
         Generated from the doc comments of `stdlib/*.rlx` by `rlxc doc` — edit those, not this file.\n\
         Import with `import std/MODULE.{name, …}`. Every function is written in rlx itself; the doc comment\n\
         cites its source and states its conventions.\n",
    );
    let mut modules: Vec<(&str, &str)> = stdlib::MODULES.to_vec();
    modules.sort();
    let _ = writeln!(out, "\n| module | functions |\n|---|---|");
    let mut sections = String::new();
    for (name, text) in modules {
        let Ok(module) = parse_module(FileId(0), text) else {
            let _ = writeln!(out, "| `std/{name}` | (does not parse) |");
            continue;
        };
        let functions = functions(&module, text);
        let names: Vec<String> = functions
            .iter()
            .map(|(signature, _)| {
                let short = signature.split('(').next().unwrap_or("");
                format!("[`{short}`](#{})", anchor(&format!("{name}.{short}")))
            })
            .collect();
        let _ = writeln!(out, "| `std/{name}` | {} |", names.join(", "));
        let _ = writeln!(sections, "\n## `std/{name}`\n");
        for (signature, doc) in functions {
            let short = signature.split('(').next().unwrap_or("");
            let _ = writeln!(
                sections,
                "<a id=\"{}\"></a>\n### `{signature}`\n",
                anchor(&format!("{name}.{short}"))
            );
            if doc.is_empty() {
                let _ = writeln!(sections, "*(undocumented)*\n");
            } else {
                let _ = writeln!(sections, "{}\n", doc.join("\n"));
            }
        }
    }
    out.push_str(&sections);
    out
}

fn anchor(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect()
}

/// Every stdlib function without a doc comment, as `std/module.name`.
pub fn undocumented() -> Vec<String> {
    let mut missing = Vec::new();
    for (name, text) in stdlib::MODULES {
        if let Ok(module) = parse_module(FileId(0), text) {
            for (signature, doc) in functions(&module, text) {
                if doc.iter().all(|line| line.trim().is_empty()) {
                    missing.push(format!(
                        "std/{name}.{}",
                        signature.split('(').next().unwrap_or("")
                    ));
                }
            }
        }
    }
    missing
}
