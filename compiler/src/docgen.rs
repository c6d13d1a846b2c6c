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

/// `rlxc doc DIR`: the markdown reference of the package at or above `dir` — its manifest, its
/// dependencies, the functions of each module (from their doc comments) and the criteria of each
/// rubric file. Errors are what `rlxc check DIR` reports in detail.
pub fn package_markdown(dir: &std::path::Path) -> Result<String, String> {
    use crate::packages;
    let root = packages::find_manifest(dir)
        .ok_or_else(|| format!("no {} in {} or above it", packages::MANIFEST, dir.display()))?;
    let mut sources = crate::SourceMap::new();
    let manifest = match packages::load_manifest(&mut sources, &root) {
        Ok(manifest) => manifest,
        Err(packages::LoadError::Io(message)) => return Err(message),
        Err(packages::LoadError::Invalid(_)) => {
            return Err(format!(
                "{} is invalid: run `rlxc check {}`",
                root.join(packages::MANIFEST).display(),
                root.display()
            ))
        }
    };
    let provided = packages::package_files(&manifest.dir)?;
    let mut out = format!("# Package `{}` {}\n\n", manifest.name, manifest.version);
    if let Some(description) = &manifest.description {
        let _ = writeln!(out, "{description}\n");
    }
    if let Some(license) = &manifest.license {
        let _ = writeln!(out, "License: {license}\n");
    }
    if !manifest.dependencies.is_empty() {
        let _ = writeln!(out, "## Dependencies\n\n| package | source |\n|---|---|");
        for dependency in &manifest.dependencies {
            let source = match &dependency.source {
                packages::Source::Path(path) => format!("path `{path}`"),
                packages::Source::Git { url, rev } => format!("git `{url}` at `{rev}`"),
            };
            let _ = writeln!(out, "| `{}` | {source} |", dependency.name);
        }
        out.push('\n');
    }
    let mut modules = String::new();
    let mut rubrics = String::new();
    for path in provided.keys() {
        let full = manifest.dir.join(path);
        let Ok(text) =
            crate::files::read_text(&full, crate::syntax::parser::MAX_SOURCE_BYTES as u64)
        else {
            continue;
        };
        if let Some(module) = path.strip_suffix(".rlx") {
            let Ok(parsed) = parse_module(FileId(0), &text) else {
                let _ = writeln!(
                    modules,
                    "\n### `{}/{module}`\n\n(does not parse)",
                    manifest.name
                );
                continue;
            };
            let is_recipe = parsed
                .items
                .iter()
                .any(|item| !matches!(item.kind, ItemKind::Fn(_) | ItemKind::Import(_)));
            let what = if is_recipe { "recipe" } else { "module" };
            let _ = writeln!(modules, "\n### `{}/{module}` ({what})\n", manifest.name);
            if let Some(first) = parsed.items.first().filter(|_| is_recipe) {
                if !first.doc.is_empty() {
                    let _ = writeln!(modules, "{}\n", first.doc.join("\n"));
                }
            }
            for (signature, doc) in functions(&parsed, &text) {
                let _ = writeln!(modules, "- `{signature}`: {}", doc.join(" ").trim());
            }
        } else if path != packages::MANIFEST {
            let json = path.ends_with(".json");
            let Ok(rubric) = crate::rubric_file::parse(FileId(0), &text, json) else {
                continue;
            };
            let _ = writeln!(rubrics, "\n### `{}/{path}`\n", manifest.name);
            if let Some(description) = &rubric.description {
                let _ = writeln!(rubrics, "{description}\n");
            }
            let _ = writeln!(
                rubrics,
                "| criterion | weight / points | flags | text |\n|---|---|---|---|"
            );
            for criterion in &rubric.criteria {
                let amount = match (criterion.weight, criterion.points) {
                    (_, Some(points)) => format!("{points} points"),
                    (Some(weight), None) => format!("weight {weight}"),
                    (None, None) if criterion.veto => String::new(),
                    (None, None) => "weight 1".into(),
                };
                let mut flags: Vec<String> = Vec::new();
                if criterion.veto {
                    flags.push("veto".into());
                }
                if criterion.critical {
                    flags.push("critical".into());
                }
                if !criterion.levels.is_empty() {
                    flags.push(format!("{} levels", criterion.levels.len()));
                }
                if let Some((kind, _)) = &criterion.saturate {
                    flags.push(format!("saturate {kind}"));
                }
                flags.extend(criterion.tags.iter().map(|t| format!("#{t}")));
                let _ = writeln!(
                    rubrics,
                    "| `{}` | {amount} | {} | {} |",
                    criterion.name,
                    flags.join(" "),
                    criterion.text.replace('|', "\\|").replace('\n', " ")
                );
            }
        }
    }
    if !modules.is_empty() {
        let _ = writeln!(
            out,
            "## Modules and recipes\n\nImport with `import {}/MODULE.{{name, …}}`.",
            manifest.name
        );
        out.push_str(&modules);
    }
    if !rubrics.is_empty() {
        let _ = writeln!(
            out,
            "\n## Rubric files\n\nUse in a rubric block with `criteria {}/FILE`.",
            manifest.name
        );
        out.push_str(&rubrics);
    }
    Ok(out)
}
