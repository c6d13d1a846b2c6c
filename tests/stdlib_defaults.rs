//! Every standard-library function compiles when called with every default argument omitted: a
//! documented default (`mask = 1`, `eps = 1e-6`, …) must be a value the body accepts. The functions and
//! their parameters are read from the stdlib's own signatures (`stdlib::MODULES`), not listed here, so
//! a function added later is covered too.
//!
//! Parameters are untyped, so the test searches for argument types: each required argument is drawn
//! from a fixed set of recipe inputs and numbers (`CANDIDATES`), assignments with the earlier candidates
//! first; a function passes when some assignment checks clean. A function for which none does has a
//! default that its body cannot take (or needs an argument kind missing from `CANDIDATES`).

use rlx_compiler::syntax::ast::ItemKind;
use rlx_compiler::syntax::parse_module;
use rlx_compiler::{stdlib, FileId};

/// Argument expressions, the likeliest kinds first; each input is declared by `DECLARATIONS`.
const CANDIDATES: &[&str] = &[
    "x_tok", "x_resp", "0.5", "x_group", "b_resp", "i_resp", "x_crit", "w_crit", "b_crit", "i_tok",
    "e_dim", "2", "m_dim",
];

const DECLARATIONS: &str = "\
input x_tok  : f32[tok] policy
input x_resp : f32[resp]
input x_group : f32[group]
input b_resp : bool[resp]
input i_resp : i32[resp]
input x_crit : f32[resp, crit]
input w_crit : f32[group, crit]
input b_crit : bool[resp, crit]
input i_tok  : i32[tok]
input e_dim  : f32[resp, dim]
input m_dim  : f32[batch, dim, dim]
";

/// The most assignments tried per function (the largest search, four required arguments, needs far
/// fewer).
const BUDGET: usize = 30_000;

/// Whether `module.name(args)` checks clean.
fn checks(module: &str, name: &str, args: &[&str]) -> bool {
    let source = format!(
        "import std/{module}.{{{name}}}\n{DECLARATIONS}let probe = {name}({})\n",
        args.join(", ")
    );
    !rlx_compiler::check_source("probe.rlx", &source).has_errors()
}

/// Assignments of `arity` candidates, ordered by their largest candidate index (so combinations of the
/// likeliest kinds come first), at most `BUDGET`.
fn assignments(arity: usize) -> Vec<Vec<usize>> {
    let mut out = vec![Vec::new()];
    if arity == 0 {
        return out;
    }
    out.clear();
    for largest in 0..CANDIDATES.len() {
        let mut current = vec![0usize; arity];
        loop {
            if current.contains(&largest) {
                out.push(current.clone());
                if out.len() >= BUDGET {
                    return out;
                }
            }
            // The next assignment with every index ≤ largest.
            let mut position = 0;
            loop {
                if position == arity {
                    break;
                }
                current[position] += 1;
                if current[position] <= largest {
                    break;
                }
                current[position] = 0;
                position += 1;
            }
            if position == arity {
                break;
            }
        }
    }
    out
}

#[test]
fn every_stdlib_function_compiles_with_its_defaults_omitted() {
    let mut failures = Vec::new();
    let mut functions = 0;
    let mut with_defaults = 0;
    for (module, text) in stdlib::MODULES {
        let parsed =
            parse_module(FileId(0), text).unwrap_or_else(|_| panic!("std/{module} does not parse"));
        for item in &parsed.items {
            let ItemKind::Fn(decl) = &item.kind else {
                continue;
            };
            functions += 1;
            let required = decl
                .params
                .iter()
                .take_while(|param| param.default.is_none())
                .count();
            if required < decl.params.len() {
                with_defaults += 1;
            }
            let name = &decl.name.name;
            let found = assignments(required).into_iter().any(|assignment| {
                let args: Vec<&str> = assignment.iter().map(|&i| CANDIDATES[i]).collect();
                checks(module, name, &args)
            });
            if !found {
                let omitted: Vec<&str> = decl.params[required..]
                    .iter()
                    .map(|param| param.name.name.as_str())
                    .collect();
                failures.push(format!(
                    "std/{module}.{name}: no call with {required} argument(s) and the defaults of {omitted:?} omitted checks clean"
                ));
            }
        }
    }
    assert!(
        functions > 100,
        "expected the stdlib's functions, found {functions}"
    );
    assert!(
        with_defaults > 30,
        "expected functions with defaults, found {with_defaults}"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The search itself: it finds the argument kinds of a function whose arguments differ in kind, and a
/// default its body cannot take is reported (so the test above can fail).
#[test]
fn the_search_finds_mixed_arguments_and_rejects_a_bad_default() {
    let found = assignments(2).into_iter().any(|assignment| {
        let args: Vec<&str> = assignment.iter().map(|&i| CANDIDATES[i]).collect();
        checks("rubric", "points_score", &args)
    });
    assert!(
        found,
        "points_score(met, points) should check with some candidates"
    );
    // The old `seq_mean_logp` body: a token sum of its default mask 1, a batch-level value.
    let source = format!(
        "{DECLARATIONS}fn old(logp, mask = 1) = sum(logp * mask over tok) / max(sum(mask over tok), 1)\n\
         let probe = old(x_tok)\n"
    );
    assert!(rlx_compiler::check_source("probe.rlx", &source).has_errors());
}
