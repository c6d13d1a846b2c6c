// The rlx extension: starts `rlxc lsp` for .rlx files and shows the standard library's modules as
// read-only `rlx-std:` documents (their text comes from the server, request `rlx/stdlibSource`).
// Plain JavaScript: no build step. Install its one dependency with `npm install` (docs/editors.md).

const vscode = require("vscode");
const { LanguageClient } = require("vscode-languageclient/node");

let client;

function activate(context) {
  const command = vscode.workspace.getConfiguration("rlx").get("server.path") || "rlxc";
  const server = { command, args: ["lsp"] };
  client = new LanguageClient(
    "rlx",
    "rlx language server",
    { run: server, debug: server },
    {
      documentSelector: [
        { scheme: "file", language: "rlx" },
        { scheme: "untitled", language: "rlx" },
        { scheme: "rlx-std", language: "rlx" },
      ],
    },
  );
  const stdlib = {
    provideTextDocumentContent: async (uri) => {
      const answer = await client.sendRequest("rlx/stdlibSource", { uri: uri.toString() });
      return answer.text;
    },
  };
  context.subscriptions.push(
    vscode.workspace.registerTextDocumentContentProvider("rlx-std", stdlib),
    vscode.workspace.onDidOpenTextDocument((document) => {
      if (document.uri.scheme === "rlx-std" && document.languageId !== "rlx") {
        vscode.languages.setTextDocumentLanguage(document, "rlx");
      }
    }),
  );
  return client.start();
}

function deactivate() {
  return client ? client.stop() : undefined;
}

module.exports = { activate, deactivate };
