//! `rlxc lsp` over real stdio, as an editor starts it: the initialize handshake, a document's
//! diagnostics, a hover, shutdown and exit with status 0; and a malformed message ends the server with
//! an error message and status 1, not a panic. (The features are tested in lsp/tests/.)

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdout, Command, Stdio};

use serde_json::{json, Value};

fn start() -> Child {
    Command::new(env!("CARGO_BIN_EXE_rlxc"))
        .arg("lsp")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("rlxc starts")
}

fn send(child: &mut Child, message: Value) {
    let body = message.to_string();
    let stdin = child.stdin.as_mut().expect("stdin");
    write!(stdin, "Content-Length: {}\r\n\r\n{body}", body.len()).expect("the server reads");
    stdin.flush().expect("flushed");
}

fn receive(reader: &mut BufReader<ChildStdout>) -> Value {
    let mut length = 0;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).expect("a header line");
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some(value) = line.strip_prefix("Content-Length: ") {
            length = value.parse().expect("a length");
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).expect("the body");
    serde_json::from_slice(&body).expect("JSON")
}

#[test]
fn rlxc_lsp_serves_an_editor_over_stdio() {
    let mut child = start();
    let mut reader = BufReader::new(child.stdout.take().expect("stdout"));
    send(
        &mut child,
        json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": { "capabilities": {} } }),
    );
    let init = receive(&mut reader);
    assert_eq!(init["id"], 1);
    assert_eq!(init["result"]["capabilities"]["hoverProvider"], true);
    send(
        &mut child,
        json!({ "jsonrpc": "2.0", "method": "initialized", "params": {} }),
    );
    let text = "input logp : f32[tok] policy\nloss = mean(logp over tok, batch) + missing\n";
    let uri = "untitled:recipe.rlx";
    send(
        &mut child,
        json!({ "jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {
            "textDocument": { "uri": uri, "languageId": "rlx", "version": 1, "text": text } } }),
    );
    let published = receive(&mut reader);
    assert_eq!(published["method"], "textDocument/publishDiagnostics");
    assert_eq!(
        published["params"]["diagnostics"][0]["code"],
        "rlx::unknown_name"
    );
    send(
        &mut child,
        json!({ "jsonrpc": "2.0", "id": 2, "method": "textDocument/hover", "params": {
            "textDocument": { "uri": uri }, "position": { "line": 0, "character": 7 } } }),
    );
    let hover = receive(&mut reader);
    assert_eq!(hover["id"], 2);
    let shown = hover["result"]["contents"]["value"]
        .as_str()
        .expect("a hover");
    assert!(shown.contains("input logp : f32[tok] policy"), "{shown}");
    send(
        &mut child,
        json!({ "jsonrpc": "2.0", "id": 3, "method": "shutdown" }),
    );
    assert_eq!(receive(&mut reader)["id"], 3);
    send(&mut child, json!({ "jsonrpc": "2.0", "method": "exit" }));
    let status = child.wait().expect("rlxc exits");
    assert!(status.success(), "{status}");
}

#[test]
fn a_malformed_message_ends_the_server_with_an_error() {
    let mut child = start();
    child
        .stdin
        .as_mut()
        .expect("stdin")
        .write_all(b"Content-Length: 5\r\n\r\n{oops")
        .expect("written");
    drop(child.stdin.take());
    let output = child.wait_with_output().expect("rlxc exits");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("error"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
