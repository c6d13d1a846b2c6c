//! An editor's side of the protocol: the server runs on a thread over in-memory channels (the same
//! `serve` that `rlxc lsp` runs over stdio), and the client sends JSON-RPC messages and waits, with a
//! bound, for each answer.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use lsp_server::{Connection, Message, Notification, Request, RequestId, Response};
use serde_json::{json, Value};

/// The longest any answer may take.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(10);

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// The protocol position (line, UTF-16 column) of a byte offset.
pub fn position(text: &str, offset: usize) -> Value {
    let before = &text[..offset];
    let line = before.matches('\n').count();
    let start = before.rfind('\n').map_or(0, |n| n + 1);
    let column: usize = before[start..].chars().map(char::len_utf16).sum();
    json!({ "line": line, "character": column })
}

pub fn file_uri(path: &Path) -> String {
    lsp_types::Url::from_file_path(path)
        .expect("an absolute path")
        .to_string()
}

pub struct Client {
    connection: Connection,
    server: Option<JoinHandle<Result<(), String>>>,
    next_id: i32,
    /// Notifications received while waiting for responses, oldest first.
    pub notifications: Vec<Notification>,
    /// The slowest answer so far.
    pub slowest: Duration,
    /// How many requests were answered.
    pub answered: usize,
}

impl Client {
    /// Start a server and complete the initialize handshake.
    pub fn start() -> Client {
        let (server_side, client_side) = Connection::memory();
        let server = std::thread::spawn(move || {
            rlx_lsp::serve_with(&server_side, rlx_lsp::Options { test_hooks: true })
        });
        let mut client = Client {
            connection: client_side,
            server: Some(server),
            next_id: 0,
            notifications: Vec::new(),
            slowest: Duration::ZERO,
            answered: 0,
        };
        let init = client.request(
            "initialize",
            json!({ "processId": null, "rootUri": null, "capabilities": {} }),
        );
        assert!(init.get("capabilities").is_some(), "initialize: {init}");
        client.notify("initialized", json!({}));
        client
    }

    pub fn notify(&mut self, method: &str, params: Value) {
        self.connection
            .sender
            .send(Message::Notification(Notification::new(
                method.into(),
                params,
            )))
            .expect("the server is listening");
    }

    /// Send a request and return its response (result or error), within `ANSWER_WITHIN`.
    pub fn respond(&mut self, method: &str, params: Value) -> Response {
        self.next_id += 1;
        let id = RequestId::from(self.next_id);
        let started = Instant::now();
        self.connection
            .sender
            .send(Message::Request(Request::new(
                id.clone(),
                method.into(),
                params,
            )))
            .expect("the server is listening");
        loop {
            let left = ANSWER_WITHIN.saturating_sub(started.elapsed());
            match self.connection.receiver.recv_timeout(left) {
                Ok(Message::Response(response)) if response.id == id => {
                    self.slowest = self.slowest.max(started.elapsed());
                    self.answered += 1;
                    return response;
                }
                Ok(Message::Response(other)) => panic!("an answer to another request: {other:?}"),
                Ok(Message::Notification(notification)) => self.notifications.push(notification),
                Ok(Message::Request(request)) => panic!("unexpected server request {request:?}"),
                Err(error) => panic!("no answer to {method} within {ANSWER_WITHIN:?}: {error}"),
            }
        }
    }

    /// A request's result; an error response fails the test.
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        let response = self.respond(method, params);
        if let Some(error) = response.error {
            panic!("{method} failed: {} ({})", error.message, error.code);
        }
        response.result.unwrap_or(Value::Null)
    }

    /// Wait for the next `publishDiagnostics` of `uri`.
    pub fn diagnostics(&mut self, uri: &str) -> Value {
        let started = Instant::now();
        loop {
            if let Some(index) = self.notifications.iter().position(|n| {
                n.method == "textDocument/publishDiagnostics" && n.params["uri"] == uri
            }) {
                return self.notifications.remove(index).params;
            }
            let left = ANSWER_WITHIN.saturating_sub(started.elapsed());
            match self.connection.receiver.recv_timeout(left) {
                Ok(Message::Notification(notification)) => self.notifications.push(notification),
                Ok(other) => panic!("unexpected message while waiting for diagnostics: {other:?}"),
                Err(error) => panic!("no diagnostics for {uri} within {ANSWER_WITHIN:?}: {error}"),
            }
        }
    }

    pub fn open(&mut self, uri: &str, text: &str) -> Value {
        self.notify(
            "textDocument/didOpen",
            json!({ "textDocument": { "uri": uri, "languageId": "rlx", "version": 1, "text": text } }),
        );
        self.diagnostics(uri)
    }

    /// Shut the server down as an editor does, and check that it ends cleanly.
    pub fn shutdown(mut self) {
        let result = self.request("shutdown", Value::Null);
        assert_eq!(result, Value::Null);
        self.notify("exit", Value::Null);
        let server = self.server.take().expect("a running server");
        let outcome = server.join().expect("the server thread does not panic");
        assert_eq!(outcome, Ok(()));
    }
}
