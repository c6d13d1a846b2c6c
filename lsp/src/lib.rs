//! `rlxc lsp`: a Language Server Protocol server for `.rlx` recipes and modules, over stdio.
//!
//! Everything it says comes from the compiler: diagnostics are `rlxc check`'s, types are the checked
//! HIR's, formatting is `rlxc fmt`'s, imports follow the resolver's sandbox rules, and the standard
//! library (with its doc comments) is the embedded one, served as read-only `rlx-std:/NAME.rlx`
//! documents (custom request `rlx/stdlibSource`). Documents are synchronised incrementally (ranged
//! edits applied to the kept text); each change re-analyses the whole document.
//!
//! The server never goes down on its input: every request and notification is handled under
//! `catch_unwind`; a panic is logged on stderr and the request answered with an error.

pub mod analysis;
pub mod features;
pub mod index;
pub mod text;

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use lsp_server::{Connection, ErrorCode, Message, Notification, Request, Response};
use lsp_types::notification::{
    DidChangeTextDocument, DidCloseTextDocument, DidOpenTextDocument, DidSaveTextDocument,
    Notification as _, PublishDiagnostics,
};
use lsp_types::request::{
    CodeActionRequest, Completion, DocumentSymbolRequest, Formatting, GotoDefinition, HoverRequest,
    PrepareRenameRequest, References, Rename, Request as _, SignatureHelpRequest,
};
use lsp_types::{
    CodeActionProviderCapability, CompletionOptions, HoverProviderCapability, OneOf,
    PrepareRenameResponse, PublishDiagnosticsParams, RenameOptions, ServerCapabilities, ServerInfo,
    SignatureHelpOptions, TextDocumentSyncCapability, TextDocumentSyncKind,
    TextDocumentSyncOptions, TextDocumentSyncSaveOptions, Url,
};
use serde_json::Value;

use analysis::Analysis;

/// The custom request that returns the text of a `rlx-std:` document: params `{ "uri": … }`,
/// result `{ "text": … }`.
pub const STDLIB_SOURCE: &str = "rlx/stdlibSource";

/// The stack of the thread that serves requests (the compiler caps nesting; this leaves room).
const SERVER_STACK_BYTES: usize = 64 << 20;

pub fn capabilities() -> ServerCapabilities {
    ServerCapabilities {
        text_document_sync: Some(TextDocumentSyncCapability::Options(
            TextDocumentSyncOptions {
                open_close: Some(true),
                change: Some(TextDocumentSyncKind::INCREMENTAL),
                save: Some(TextDocumentSyncSaveOptions::Supported(true)),
                ..TextDocumentSyncOptions::default()
            },
        )),
        hover_provider: Some(HoverProviderCapability::Simple(true)),
        definition_provider: Some(OneOf::Left(true)),
        references_provider: Some(OneOf::Left(true)),
        completion_provider: Some(CompletionOptions {
            trigger_characters: Some(vec![
                "{".into(),
                ",".into(),
                "[".into(),
                "(".into(),
                "/".into(),
                " ".into(),
            ]),
            ..CompletionOptions::default()
        }),
        signature_help_provider: Some(SignatureHelpOptions {
            trigger_characters: Some(vec!["(".into(), ",".into()]),
            retrigger_characters: None,
            work_done_progress_options: Default::default(),
        }),
        document_symbol_provider: Some(OneOf::Left(true)),
        document_formatting_provider: Some(OneOf::Left(true)),
        rename_provider: Some(OneOf::Right(RenameOptions {
            prepare_provider: Some(true),
            work_done_progress_options: Default::default(),
        })),
        code_action_provider: Some(CodeActionProviderCapability::Simple(true)),
        ..ServerCapabilities::default()
    }
}

/// Serve the protocol on stdin/stdout until the client says `exit`.
pub fn run_stdio() -> Result<(), String> {
    let (connection, io_threads) = Connection::stdio();
    let served = serve_on_thread(connection);
    io_threads
        .join()
        .map_err(|error| format!("rlxc lsp: {error}"))?;
    served
}

/// [`serve`] on a thread of its own with a large stack.
pub fn serve_on_thread(connection: Connection) -> Result<(), String> {
    std::thread::Builder::new()
        .name("rlx-lsp".into())
        .stack_size(SERVER_STACK_BYTES)
        .spawn(move || serve(&connection))
        .map_err(|error| format!("rlxc lsp: cannot start: {error}"))?
        .join()
        .map_err(|_| "rlxc lsp: the server thread panicked".to_string())?
}

/// How the server runs.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Answer `rlx/internal/panic` by panicking (the test harness checks that a panic in a request
    /// is answered with an error and the server stays up). Off in `rlxc lsp`.
    pub test_hooks: bool,
}

/// Serve one client on `connection`: the initialize handshake, then requests until `exit`.
pub fn serve(connection: &Connection) -> Result<(), String> {
    serve_with(connection, Options::default())
}

/// [`serve`] with options.
pub fn serve_with(connection: &Connection, options: Options) -> Result<(), String> {
    let capabilities = serde_json::to_value(capabilities()).map_err(|e| e.to_string())?;
    let result = serde_json::json!({
        "capabilities": capabilities,
        "serverInfo": ServerInfo { name: "rlxc lsp".into(), version: Some(env!("CARGO_PKG_VERSION").into()) },
    });
    let (id, _params) = connection
        .initialize_start()
        .map_err(|e| format!("rlxc lsp: {e}"))?;
    connection
        .initialize_finish(id, result)
        .map_err(|e| format!("rlxc lsp: {e}"))?;
    let mut server = Server {
        options,
        documents: HashMap::new(),
        sender: connection.sender.clone(),
    };
    for message in &connection.receiver {
        match message {
            Message::Request(request) => {
                if connection
                    .handle_shutdown(&request)
                    .map_err(|e| format!("rlxc lsp: {e}"))?
                {
                    return Ok(());
                }
                let id = request.id.clone();
                let method = request.method.clone();
                let outcome = catch_unwind(AssertUnwindSafe(|| server.request(request)));
                let response = match outcome {
                    Ok(Ok(value)) => Response::new_ok(id, value),
                    Ok(Err((code, message))) => Response::new_err(id, code as i32, message),
                    Err(panic) => {
                        let what = panic_message(&*panic);
                        eprintln!("rlxc lsp: internal error in {method}: {what}");
                        Response::new_err(
                            id,
                            ErrorCode::InternalError as i32,
                            format!(
                                "internal error in {method} (logged; please report it): {what}"
                            ),
                        )
                    }
                };
                server.send(Message::Response(response));
            }
            Message::Notification(notification) => {
                if notification.method == "exit" {
                    return Ok(());
                }
                let method = notification.method.clone();
                if let Err(panic) =
                    catch_unwind(AssertUnwindSafe(|| server.notification(notification)))
                {
                    eprintln!(
                        "rlxc lsp: internal error in {method}: {}",
                        panic_message(&*panic)
                    );
                }
            }
            Message::Response(_) => {}
        }
    }
    Ok(())
}

/// [`Analysis::new`], and where it panics (a bug), the text alone: the document stays open with its
/// current text, so later edits still apply to the right text.
fn analyse(uri: Url, text: String, previous: Option<&Analysis>) -> Analysis {
    catch_unwind(AssertUnwindSafe(|| {
        Analysis::new(uri.clone(), text.clone(), previous)
    }))
    .unwrap_or_else(|panic| {
        eprintln!(
            "rlxc lsp: internal error analysing {uri}: {}",
            panic_message(&*panic)
        );
        Analysis::text_only(uri, text)
    })
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

type RequestResult = Result<Value, (ErrorCode, String)>;

struct Server {
    options: Options,
    documents: HashMap<Url, Analysis>,
    sender: crossbeam_channel::Sender<Message>,
}

fn params<P: serde::de::DeserializeOwned>(value: Value) -> Result<P, (ErrorCode, String)> {
    serde_json::from_value(value)
        .map_err(|error| (ErrorCode::InvalidParams, format!("invalid params: {error}")))
}

fn json<T: serde::Serialize>(value: T) -> RequestResult {
    serde_json::to_value(value).map_err(|error| (ErrorCode::InternalError, error.to_string()))
}

impl Server {
    fn send(&self, message: Message) {
        // A closed connection ends the loop on the receiving side.
        let _ = self.sender.send(message);
    }

    /// The analysis of an open document; a `rlx-std:` document is opened on demand.
    fn document(&mut self, uri: &Url) -> Result<&Analysis, (ErrorCode, String)> {
        if !self.documents.contains_key(uri) {
            if let Some(module) = index::std_module_of(uri) {
                let text = rlx_compiler::stdlib::module(module).unwrap_or_default();
                let analysis = analyse(uri.clone(), text.into(), None);
                self.documents.insert(uri.clone(), analysis);
            }
        }
        self.documents.get(uri).ok_or_else(|| {
            (
                ErrorCode::InvalidParams,
                format!("{uri} is not open (send textDocument/didOpen first)"),
            )
        })
    }

    fn request(&mut self, request: Request) -> RequestResult {
        let Request {
            method, params: p, ..
        } = request;
        match method.as_str() {
            HoverRequest::METHOD => {
                let p: lsp_types::HoverParams = params(p)?;
                let at = p.text_document_position_params;
                json(features::hover(
                    self.document(&at.text_document.uri)?,
                    at.position,
                ))
            }
            GotoDefinition::METHOD => {
                let p: lsp_types::GotoDefinitionParams = params(p)?;
                let at = p.text_document_position_params;
                json(features::definition(
                    self.document(&at.text_document.uri)?,
                    at.position,
                ))
            }
            References::METHOD => {
                let p: lsp_types::ReferenceParams = params(p)?;
                let at = p.text_document_position;
                self.document(&at.text_document.uri)?;
                let analysis = &self.documents[&at.text_document.uri];
                json(features::references(
                    analysis,
                    at.position,
                    &self.documents,
                    p.context.include_declaration,
                ))
            }
            Completion::METHOD => {
                let p: lsp_types::CompletionParams = params(p)?;
                let at = p.text_document_position;
                json(features::completion(
                    self.document(&at.text_document.uri)?,
                    at.position,
                ))
            }
            SignatureHelpRequest::METHOD => {
                let p: lsp_types::SignatureHelpParams = params(p)?;
                let at = p.text_document_position_params;
                json(features::signature_help(
                    self.document(&at.text_document.uri)?,
                    at.position,
                ))
            }
            DocumentSymbolRequest::METHOD => {
                let p: lsp_types::DocumentSymbolParams = params(p)?;
                json(features::document_symbols(
                    self.document(&p.text_document.uri)?,
                ))
            }
            Formatting::METHOD => {
                let p: lsp_types::DocumentFormattingParams = params(p)?;
                let analysis = self.document(&p.text_document.uri)?;
                if index::std_module_of(&analysis.uri).is_some() {
                    return json(Vec::<lsp_types::TextEdit>::new());
                }
                json(features::formatting(analysis).map_err(|e| (ErrorCode::RequestFailed, e))?)
            }
            PrepareRenameRequest::METHOD => {
                let p: lsp_types::TextDocumentPositionParams = params(p)?;
                let analysis = self.document(&p.text_document.uri)?;
                let occurrence = features::prepare_rename(analysis, p.position)
                    .map_err(|e| (ErrorCode::RequestFailed, e))?;
                json(PrepareRenameResponse::Range(
                    analysis.range(occurrence.span),
                ))
            }
            Rename::METHOD => {
                let p: lsp_types::RenameParams = params(p)?;
                let at = p.text_document_position;
                self.document(&at.text_document.uri)?;
                let analysis = &self.documents[&at.text_document.uri];
                json(
                    features::rename(analysis, at.position, &p.new_name, &self.documents)
                        .map_err(|e| (ErrorCode::RequestFailed, e))?,
                )
            }
            CodeActionRequest::METHOD => {
                let p: lsp_types::CodeActionParams = params(p)?;
                json(features::code_actions(
                    self.document(&p.text_document.uri)?,
                    p.range,
                ))
            }
            STDLIB_SOURCE => {
                #[derive(serde::Deserialize)]
                struct Params {
                    uri: Url,
                }
                let p: Params = params(p)?;
                let module = index::std_module_of(&p.uri).ok_or_else(|| {
                    (
                        ErrorCode::InvalidParams,
                        format!("{} is not a standard-library module", p.uri),
                    )
                })?;
                json(serde_json::json!({ "text": rlx_compiler::stdlib::module(module) }))
            }
            "rlx/internal/panic" if self.options.test_hooks => {
                panic!("a deliberate panic (test hook)")
            }
            _ => Err((
                ErrorCode::MethodNotFound,
                format!("rlxc lsp does not handle `{method}`"),
            )),
        }
    }

    fn notification(&mut self, notification: Notification) {
        let Notification { method, params: p } = notification;
        match method.as_str() {
            DidOpenTextDocument::METHOD => {
                let Ok(p) = serde_json::from_value::<lsp_types::DidOpenTextDocumentParams>(p)
                else {
                    return;
                };
                let doc = p.text_document;
                let analysis = analyse(doc.uri.clone(), doc.text, None);
                self.documents.insert(doc.uri.clone(), analysis);
                self.publish(&doc.uri, Some(doc.version));
            }
            DidChangeTextDocument::METHOD => {
                let Ok(p) = serde_json::from_value::<lsp_types::DidChangeTextDocumentParams>(p)
                else {
                    return;
                };
                let uri = p.text_document.uri;
                let Some(previous) = self.documents.remove(&uri) else {
                    return;
                };
                let mut text = previous.text.clone();
                for change in p.content_changes {
                    text::apply_change(&mut text, change);
                }
                let analysis = analyse(uri.clone(), text, Some(&previous));
                self.documents.insert(uri.clone(), analysis);
                self.publish(&uri, Some(p.text_document.version));
            }
            DidSaveTextDocument::METHOD => {
                // A saved module changes what the documents that import it see: re-check them all.
                let uris: Vec<Url> = self.documents.keys().cloned().collect();
                for uri in uris {
                    if let Some(previous) = self.documents.remove(&uri) {
                        let analysis = analyse(uri.clone(), previous.text.clone(), Some(&previous));
                        self.documents.insert(uri.clone(), analysis);
                        self.publish(&uri, None);
                    }
                }
            }
            DidCloseTextDocument::METHOD => {
                let Ok(p) = serde_json::from_value::<lsp_types::DidCloseTextDocumentParams>(p)
                else {
                    return;
                };
                if self.documents.remove(&p.text_document.uri).is_some() {
                    self.send_diagnostics(p.text_document.uri, Vec::new(), None);
                }
            }
            _ => {}
        }
    }

    fn publish(&self, uri: &Url, version: Option<i32>) {
        if let Some(analysis) = self.documents.get(uri) {
            self.send_diagnostics(uri.clone(), analysis.diagnostics(), version);
        }
    }

    fn send_diagnostics(
        &self,
        uri: Url,
        diagnostics: Vec<lsp_types::Diagnostic>,
        version: Option<i32>,
    ) {
        let params = PublishDiagnosticsParams {
            uri,
            diagnostics,
            version,
        };
        self.send(Message::Notification(Notification::new(
            PublishDiagnostics::METHOD.into(),
            params,
        )));
    }
}
