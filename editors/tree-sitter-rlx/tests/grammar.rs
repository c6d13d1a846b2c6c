//! The tree-sitter grammar against the language: every shipped recipe and standard-library module
//! parses without an ERROR or MISSING node, the corpus tests of `test/corpus/` hold (the same files
//! `tree-sitter test` reads, run here through the `tree-sitter` crate so that no CLI is needed), the
//! highlight query compiles and captures, and `src/` is generated from the current `grammar.js`.

use std::path::{Path, PathBuf};

use tree_sitter::{Language, Node, Parser, Query, QueryCursor, StreamingIterator as _};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn language() -> Language {
    tree_sitter_rlx::LANGUAGE.into()
}

fn parser() -> Parser {
    let mut parser = Parser::new();
    parser
        .set_language(&language())
        .expect("the generated parser's ABI is supported by the runtime");
    parser
}

fn rlx_files(folder: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(folder)
        .unwrap_or_else(|e| panic!("{}: {e}", folder.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "rlx"))
        .collect();
    files.sort();
    files
}

/// The first ERROR or MISSING node under `node`, as (kind, row, column).
fn first_error(node: Node) -> Option<(String, usize, usize)> {
    if node.is_error() || node.is_missing() {
        let at = node.start_position();
        return Some((node.kind().to_string(), at.row + 1, at.column + 1));
    }
    if !node.has_error() {
        return None;
    }
    let mut cursor = node.walk();
    let children: Vec<Node> = node.children(&mut cursor).collect();
    children.into_iter().find_map(first_error)
}

#[test]
fn every_recipe_stdlib_module_and_example_package_parses_without_error() {
    let mut parser = parser();
    let mut files = rlx_files(&root().join("recipes"));
    files.extend(rlx_files(&root().join("stdlib")));
    files.extend(rlx_files(&root().join("tests/gradients")));
    // The example packages: package imports and rubric files (docs/sharing.md).
    for package in [
        "examples/packages/house_style",
        "examples/packages/style_grpo",
    ] {
        files.extend(rlx_files(&root().join(package)));
    }
    assert!(files.len() >= 35, "found only {} files", files.len());
    let mut failures = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("readable");
        let tree = parser.parse(&text, None).expect("a tree");
        if let Some((kind, row, column)) = first_error(tree.root_node()) {
            failures.push(format!("{}:{row}:{column}: {kind}", file.display()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A file that does not parse gets an ERROR node rather than a silent tree (the check above can fail).
#[test]
fn a_syntax_error_is_an_error_node() {
    let mut parser = parser();
    let tree = parser
        .parse("let a = (1 +\nloss = a", None)
        .expect("a tree");
    assert!(first_error(tree.root_node()).is_some());
}

/// One corpus test: name, input, expected S-expression.
struct Case {
    name: String,
    input: String,
    expected: String,
}

/// Read a corpus file in `tree-sitter test`'s format: a `===` header around the name, the input,
/// a `---` line, the expected tree.
fn corpus(text: &str) -> Vec<Case> {
    let mut cases = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let is_rule = |line: &str, ch: char| line.len() >= 3 && line.chars().all(|c| c == ch);
    let mut index = 0;
    while index < lines.len() {
        if !is_rule(lines[index], '=') {
            index += 1;
            continue;
        }
        let name = lines[index + 1].trim().to_string();
        index += 3;
        let start = index;
        while index < lines.len() && !is_rule(lines[index], '-') {
            index += 1;
        }
        let input = lines[start..index].join("\n");
        index += 1;
        let start = index;
        while index < lines.len() && !is_rule(lines[index], '=') {
            index += 1;
        }
        let expected = lines[start..index].join("\n");
        cases.push(Case {
            name,
            input,
            expected,
        });
    }
    cases
}

/// An S-expression without field names and with single spaces.
fn normalise(sexp: &str) -> String {
    sexp.replace('(', " (")
        .replace(')', " )")
        .split_whitespace()
        .filter(|token| !token.ends_with(':'))
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn corpus_tests_hold() {
    let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("test/corpus");
    let mut parser = parser();
    let mut count = 0;
    let mut failures = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&folder)
        .expect("test/corpus")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    for file in files {
        for case in corpus(&std::fs::read_to_string(&file).expect("readable")) {
            count += 1;
            let tree = parser.parse(&case.input, None).expect("a tree");
            let got = normalise(&tree.root_node().to_sexp());
            let expected = normalise(&case.expected);
            if got != expected {
                failures.push(format!(
                    "{} / {}:\n  expected {expected}\n  got      {got}",
                    file.display(),
                    case.name
                ));
            }
        }
    }
    assert!(count >= 10, "only {count} corpus cases");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_highlight_query_compiles_and_captures() {
    let language = language();
    let query = Query::new(&language, tree_sitter_rlx::HIGHLIGHTS_QUERY)
        .unwrap_or_else(|e| panic!("queries/highlights.scm: {e}"));
    let text = std::fs::read_to_string(root().join("recipes/grpo.rlx")).expect("grpo");
    let tree = parser().parse(&text, None).expect("a tree");
    let mut cursor = QueryCursor::new();
    let mut captured: Vec<(String, String)> = Vec::new();
    let mut matches = cursor.matches(&query, tree.root_node(), text.as_bytes());
    while let Some(found) = matches.next() {
        for capture in found.captures() {
            let name = query.capture_names()[capture.index as usize].to_string();
            let node_text = capture
                .node
                .utf8_text(text.as_bytes())
                .unwrap_or("")
                .to_string();
            captured.push((name, node_text));
        }
    }
    let has = |name: &str, text: &str| captured.iter().any(|(n, t)| n == name && t == text);
    assert!(has("keyword", "import"), "{captured:?}");
    assert!(has("module", "std/advantage"));
    assert!(has("function.call", "group_zscore"));
    assert!(has("function.builtin", "exp"));
    assert!(has("type.builtin", "f32"));
    assert!(has("type.qualifier", "policy"));
    assert!(has("constant.builtin", "tok"));
    assert!(has("constant", "eps_low"));
    assert!(has("number", "0.2"));
    assert!(captured.iter().any(|(n, _)| n == "comment"));
}

/// `src/` was generated from this `grammar.js` (./generate.sh records its sha256).
#[test]
fn the_generated_parser_is_current() {
    let folder = Path::new(env!("CARGO_MANIFEST_DIR"));
    let grammar = std::fs::read(folder.join("grammar.js")).expect("grammar.js");
    let recorded = std::fs::read_to_string(folder.join("src/grammar.js.sha256"))
        .expect("src/grammar.js.sha256");
    assert_eq!(
        recorded.trim(),
        rlx_compiler::export::sha256::hex_digest(&grammar),
        "grammar.js changed since src/ was generated: run editors/tree-sitter-rlx/generate.sh"
    );
}

/// The names inside the first `(a|b|c)` group after `marker` in `text`.
fn alternatives(text: &str, marker: &str) -> std::collections::BTreeSet<String> {
    let at = text
        .find(marker)
        .unwrap_or_else(|| panic!("{marker:?} not found"));
    let rest = &text[at..];
    let open = rest.find('(').expect("a group") + 1;
    let close = open + rest[open..].find(')').expect("a closed group");
    rest[open..close].split('|').map(str::to_string).collect()
}

/// Both grammars highlight exactly the compiler's built-ins (compiler/src/check/builtins.rs is the one
/// list): the functions, reductions and axis operations, and the built-in values.
#[test]
fn the_grammars_know_every_builtin() {
    use rlx_compiler::check::builtins;
    let functions: std::collections::BTreeSet<String> = builtins::FUNCS
        .iter()
        .map(|f| f.name)
        .chain(builtins::REDUCTIONS.iter().map(|r| r.name))
        .chain(builtins::AXIS_OPS.iter().map(|(name, _)| *name))
        .map(str::to_string)
        .collect();
    let values: std::collections::BTreeSet<String> = builtins::VALUES
        .iter()
        .map(|v| v.name.to_string())
        .filter(|name| name != "inf")
        .collect();
    let highlights = tree_sitter_rlx::HIGHLIGHTS_QUERY;
    assert_eq!(alternatives(highlights, "@function.builtin \"^"), functions);
    assert_eq!(alternatives(highlights, "@variable.builtin \"^"), values);
    let textmate =
        std::fs::read_to_string(root().join("editors/vscode/syntaxes/rlx.tmLanguage.json"))
            .expect("the TextMate grammar");
    let function_rule = textmate
        .find("support.function.builtin.rlx")
        .expect("a built-in function rule");
    let rule_start = textmate[..function_rule]
        .rfind("\"match\"")
        .expect("its pattern");
    assert_eq!(
        alternatives(&textmate[rule_start..], "\"match\""),
        functions
    );
    let value_rule = textmate
        .find("variable.language.builtin.rlx")
        .expect("a built-in value rule");
    let rule_start = textmate[..value_rule]
        .rfind("\"match\"")
        .expect("its pattern");
    let mut textmate_values = alternatives(&textmate[rule_start..], "\"match\"");
    textmate_values.insert("pi".into()); // a constant there, with `true`, `false` and `inf`
    assert_eq!(textmate_values, values);
}
