// The TextMate grammar (syntaxes/rlx.tmLanguage.json) over every shipped recipe and standard-library
// module, tokenized by vscode-textmate with the Oniguruma engine, as VS Code does. Run with
// `npm ci && npm test` in editors/vscode (CI does; docs/editors.md).

import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const vsctm = require("vscode-textmate");
const oniguruma = require("vscode-oniguruma");

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.join(here, "../../..");

async function grammar() {
  const wasm = fs.readFileSync(require.resolve("vscode-oniguruma/release/onig.wasm"));
  await oniguruma.loadWASM(wasm.buffer.slice(wasm.byteOffset, wasm.byteOffset + wasm.byteLength));
  const registry = new vsctm.Registry({
    onigLib: Promise.resolve({
      createOnigScanner: (sources) => new oniguruma.OnigScanner(sources),
      createOnigString: (text) => new oniguruma.OnigString(text),
    }),
    loadGrammar: async (scope) => {
      if (scope !== "source.rlx") return null;
      const file = path.join(here, "../syntaxes/rlx.tmLanguage.json");
      return vsctm.parseRawGrammar(fs.readFileSync(file, "utf8"), file);
    },
  });
  return registry.loadGrammar("source.rlx");
}

function files() {
  const found = [];
  // The example packages too: package imports and rubric files (docs/sharing.md).
  for (const folder of ["recipes", "stdlib", "examples/packages/house_style", "examples/packages/style_grpo"]) {
    for (const name of fs.readdirSync(path.join(root, folder)).sort()) {
      if (name.endsWith(".rlx")) found.push(path.join(root, folder, name));
    }
  }
  return found;
}

// Where a `//` comment starts on a line (outside strings), or -1.
function commentStart(line) {
  let inString = false;
  for (let i = 0; i < line.length; i++) {
    if (line[i] === '"') inString = !inString;
    else if (!inString && line[i] === "/" && line[i + 1] === "/") return i;
  }
  return -1;
}

const ITEM_KEYWORDS = /^(import|input|param|fn|let|rubric|metric|keep|rollout|reward|advantage|loss|state)\b/;

test("every recipe and stdlib module is highlighted", async () => {
  const rlx = await grammar();
  const all = files();
  // The state between lines when nothing is open.
  const base = rlx.tokenizeLine("", vsctm.INITIAL).ruleStack;
  assert.ok(all.length >= 35, `only ${all.length} files`);
  const failures = [];
  for (const file of all) {
    const lines = fs.readFileSync(file, "utf8").split("\n");
    let state = vsctm.INITIAL;
    lines.forEach((line, row) => {
      const where = `${path.relative(root, file)}:${row + 1}`;
      const result = rlx.tokenizeLine(line, state);
      state = result.ruleStack;
      // No scope runs on past the end of a line (an unclosed string or bracket rule).
      if (!state.equals(base)) failures.push(`${where}: a scope stays open after the line`);
      const scopeAt = (column) =>
        result.tokens.find((t) => t.startIndex <= column && column < t.endIndex)?.scopes ?? [];
      const comment = commentStart(line);
      if (comment >= 0) {
        for (const column of [comment, line.length - 1]) {
          if (!scopeAt(column).some((s) => s.startsWith("comment."))) {
            failures.push(`${where}:${column + 1}: comment not scoped as a comment`);
          }
        }
        const doc = line.slice(comment).startsWith("///") && !line.slice(comment).startsWith("////");
        if (doc && !scopeAt(comment).includes("comment.line.documentation.rlx")) {
          failures.push(`${where}: doc comment not scoped as documentation`);
        }
      }
      const keyword = line.match(ITEM_KEYWORDS);
      if (keyword && !scopeAt(0).some((s) => /^(keyword|storage)\./.test(s))) {
        failures.push(`${where}: item keyword \`${keyword[1]}\` not scoped as a keyword`);
      }
      // Every word and number outside comments has a scope of its own.
      for (const token of result.tokens) {
        const text = line.slice(token.startIndex, token.endIndex);
        if (comment >= 0 && token.startIndex >= comment) continue;
        if (/[A-Za-z0-9_]/.test(text) && token.scopes.length < 2) {
          failures.push(`${where}:${token.startIndex + 1}: \`${text}\` has no scope`);
        }
        if (/^[0-9]/.test(text.trim()) && !token.scopes.some((s) => s.startsWith("constant.numeric"))) {
          failures.push(`${where}:${token.startIndex + 1}: number \`${text}\` not scoped as a number`);
        }
      }
    });
  }
  assert.deepEqual(failures, []);
});

test("scopes of a sample line", async () => {
  const rlx = await grammar();
  const line = 'input logp : f32[tok] policy // the policy';
  const tokens = rlx.tokenizeLine(line, vsctm.INITIAL).tokens;
  const scope = (text) => {
    const start = line.indexOf(text);
    return tokens.find((t) => t.startIndex === start)?.scopes.at(-1);
  };
  assert.equal(scope("input"), "storage.type.rlx");
  assert.equal(scope("logp"), "variable.other.definition.rlx");
  assert.equal(scope("f32"), "storage.type.primitive.rlx");
  assert.equal(scope("tok"), "support.constant.level.rlx");
  assert.equal(scope("policy"), "storage.modifier.role.rlx");
  assert.equal(scope("// the"), "comment.line.double-slash.rlx");
});
