#!/usr/bin/env bash
# Regenerate src/ (parser.c, grammar.json, node-types.json) from grammar.js with the tree-sitter CLI,
# and record grammar.js's sha256 so that a test notices a grammar.js edited without regenerating.
# The CLI: `cargo install tree-sitter-cli --version 0.27.1 --locked` (builds from crates.io; the npm
# package downloads a binary from GitHub in its install script, which fails offline).
set -euo pipefail
cd "$(dirname "$0")"
tree-sitter generate
sha256sum grammar.js | cut -d' ' -f1 > src/grammar.js.sha256
