// extension.js against stand-ins for the `vscode` API and vscode-languageclient (no VS Code here):
// it starts `rlxc lsp` (or the configured binary) for rlx documents, stdlib documents included, and
// serves `rlx-std:` documents with the text the server returns for `rlx/stdlibSource`.

import { test } from "node:test";
import assert from "node:assert/strict";
import Module from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const require = Module.createRequire(import.meta.url);

function load(serverPath) {
  const seen = { providers: {}, requests: [], started: false, client: null };
  class LanguageClient {
    constructor(id, name, server, options) {
      Object.assign(this, { id, name, server, options });
      seen.client = this;
    }
    start() {
      seen.started = true;
      return Promise.resolve();
    }
    stop() {
      return Promise.resolve();
    }
    sendRequest(method, params) {
      seen.requests.push({ method, params });
      return Promise.resolve({ text: "fn f(x) = x\n" });
    }
  }
  const vscode = {
    workspace: {
      getConfiguration: () => ({ get: () => serverPath }),
      registerTextDocumentContentProvider: (scheme, provider) => {
        seen.providers[scheme] = provider;
        return { dispose() {} };
      },
      onDidOpenTextDocument: () => ({ dispose() {} }),
    },
    languages: { setTextDocumentLanguage: () => {} },
  };
  const original = Module._load;
  Module._load = function (request, ...rest) {
    if (request === "vscode") return vscode;
    if (request === "vscode-languageclient/node") return { LanguageClient };
    return original.call(this, request, ...rest);
  };
  try {
    const file = path.join(here, "../extension.js");
    delete require.cache[file];
    return { extension: require(file), seen };
  } finally {
    Module._load = original;
  }
}

test("the extension starts rlxc lsp and serves stdlib documents", async () => {
  const { extension, seen } = load(undefined);
  const context = { subscriptions: [] };
  await extension.activate(context);
  assert.ok(seen.started);
  assert.deepEqual(seen.client.server.run, { command: "rlxc", args: ["lsp"] });
  const schemes = seen.client.options.documentSelector.map((s) => s.scheme);
  assert.deepEqual(schemes.sort(), ["file", "rlx-std", "untitled"]);
  const text = await seen.providers["rlx-std"].provideTextDocumentContent({
    toString: () => "rlx-std:/loss.rlx",
  });
  assert.equal(text, "fn f(x) = x\n");
  assert.deepEqual(seen.requests, [
    { method: "rlx/stdlibSource", params: { uri: "rlx-std:/loss.rlx" } },
  ]);
  assert.equal(context.subscriptions.length, 2);
});

test("the server path is a setting", async () => {
  const { extension, seen } = load("/opt/rlx/bin/rlxc");
  await extension.activate({ subscriptions: [] });
  assert.equal(seen.client.server.run.command, "/opt/rlx/bin/rlxc");
});
