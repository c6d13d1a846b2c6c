//! Random edits to open documents: after each edit the server publishes diagnostics for the new version,
//! and answers every request (hover, definition, references, completion, signature help, symbols,
//! formatting, code actions, rename) within `ANSWER_WITHIN`, never with an internal error (a caught
//! panic). The edits are seeded, so a failure reproduces; `RLX_LSP_FUZZ_EDITS` sets the number of
//! edits per recipe (default 60).

mod common;

use std::path::Path;

use common::{file_uri, position, Client, ANSWER_WITHIN};
use serde_json::json;

/// xorshift64*: a small seeded generator (no dependency, same sequence everywhere).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Pieces that edits insert: the language's punctuation and words, and text that has broken parsers
/// before (unclosed brackets and strings, comments, non-ASCII, a byte order mark).
const PIECES: &[&str] = &[
    "(",
    ")",
    "{",
    "}",
    "[",
    "]",
    ",",
    "=",
    ".",
    "/",
    "//",
    "///",
    "\"",
    "\n",
    " ",
    "over ",
    "tok",
    "resp",
    "group",
    "batch",
    "others",
    "let x = ",
    "import ",
    "std/",
    "std/loss.{",
    "input ",
    "param p = 1",
    "fn f(a) = a",
    "rubric r { criterion c weight 1 }",
    "mean(",
    "x[",
    "other.",
    "policy",
    "1e-3",
    "-",
    "+",
    "*",
    "^",
    "and ",
    "not ",
    "π",
    "𝄞",
    "\u{feff}",
    "reward = ",
    "loss = ",
    "metric m = ",
    "keep resp when ",
    "rollout { n = 2 }",
    "((((((((",
    "))))",
];

/// Where to put the cursor: a byte offset on a character boundary (sometimes past the end).
fn offset_in(rng: &mut Rng, text: &str) -> usize {
    let mut offset = rng.below(text.len() + 1);
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    offset
}

fn check_answer(method: &str, response: lsp_server::Response, text: &str) {
    if let Some(error) = response.error {
        assert_ne!(
            error.code,
            lsp_server::ErrorCode::InternalError as i32,
            "{method} hit an internal error ({}) on:\n{text}",
            error.message
        );
    }
}

fn fuzz_document(client: &mut Client, uri: &str, mut text: String, seed: u64, edits: usize) {
    let mut rng = Rng(seed);
    client.open(uri, &text);
    for version in 2..edits as i32 + 2 {
        // Replace a random range (possibly empty) with a few random pieces.
        let start = offset_in(&mut rng, &text);
        let mut end = (start + rng.below(12)).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        let inserted: String = (0..rng.below(4))
            .map(|_| PIECES[rng.below(PIECES.len())])
            .collect();
        client.notify(
            "textDocument/didChange",
            json!({
                "textDocument": { "uri": uri, "version": version },
                "contentChanges": [{
                    "range": { "start": position(&text, start), "end": position(&text, end) },
                    "text": inserted,
                }],
            }),
        );
        text.replace_range(start..end, &inserted);
        let published = client.diagnostics(uri);
        assert_eq!(
            published["version"], version,
            "diagnostics of the new version"
        );
        let at = position(&text, offset_in(&mut rng, &text));
        let doc = json!({ "uri": uri });
        let requests = [
            (
                "textDocument/hover",
                json!({ "textDocument": doc, "position": at }),
            ),
            (
                "textDocument/definition",
                json!({ "textDocument": doc, "position": at }),
            ),
            (
                "textDocument/references",
                json!({ "textDocument": doc, "position": at, "context": { "includeDeclaration": true } }),
            ),
            (
                "textDocument/completion",
                json!({ "textDocument": doc, "position": at }),
            ),
            (
                "textDocument/signatureHelp",
                json!({ "textDocument": doc, "position": at }),
            ),
            (
                "textDocument/documentSymbol",
                json!({ "textDocument": doc }),
            ),
            (
                "textDocument/formatting",
                json!({ "textDocument": doc, "options": { "tabSize": 4, "insertSpaces": true } }),
            ),
            (
                "textDocument/codeAction",
                json!({ "textDocument": doc, "range": { "start": at, "end": at }, "context": { "diagnostics": [] } }),
            ),
            (
                "textDocument/rename",
                json!({ "textDocument": doc, "position": at, "newName": "renamed" }),
            ),
            // A position far outside the document.
            (
                "textDocument/hover",
                json!({ "textDocument": doc, "position": { "line": 100000, "character": 100000 } }),
            ),
        ];
        for (method, params) in requests {
            let response = client.respond(method, params);
            check_answer(method, response, &text);
        }
    }
}

#[test]
fn random_edits_never_stop_the_server() {
    let edits: usize = std::env::var("RLX_LSP_FUZZ_EDITS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let recipes = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../recipes")
        .canonicalize()
        .expect("recipes/");
    let mut client = Client::start();
    for (seed, name) in ["grpo.rlx", "rubicon.rlx", "darling.rlx", "healthbench.rlx"]
        .iter()
        .enumerate()
    {
        let path = recipes.join(name);
        let text = std::fs::read_to_string(&path).expect("a shipped recipe");
        fuzz_document(
            &mut client,
            &file_uri(&path),
            text,
            0x9E37_79B9 + seed as u64,
            edits,
        );
    }
    // An unsaved buffer (no folder: relative imports unavailable) and an empty one.
    fuzz_document(
        &mut client,
        "untitled:Untitled-1",
        "import \"./x.rlx\"\nlet a = 1\n".into(),
        7,
        edits,
    );
    fuzz_document(
        &mut client,
        "file:///nonexistent/dir/new.rlx",
        String::new(),
        11,
        edits,
    );
    // 6 documents, 10 requests after each edit.
    assert!(
        client.answered >= 6 * edits * 10,
        "{} answers",
        client.answered
    );
    eprintln!(
        "{} answers, the slowest in {:?} (bound {ANSWER_WITHIN:?})",
        client.answered, client.slowest
    );
    client.shutdown();
}
