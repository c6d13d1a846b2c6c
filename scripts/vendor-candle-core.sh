#!/usr/bin/env bash
# third_party/candle-core: candle-core 0.11.1 exactly as published on crates.io, except one word of its
# Cargo.toml: its `cuda` feature asks cudarc for `dynamic-loading` instead of `dynamic-linking`
# (docs/gpu.md, "Building"). Candle links the CUDA libraries (libcuda.so.1 included) into the binary,
# so an `rlx` built with `--features cuda` would not even start on a machine without the NVIDIA
# driver; with dynamic loading cudarc opens them when a CUDA device is asked for, and rlx probes them
# first, so `--device cuda` there is a clear error and every other command works. The root Cargo.toml
# `[patch.crates-io]` points candle-core at this copy (candle-nn follows).
#
#   scripts/vendor-candle-core.sh          re-create third_party/candle-core
#   scripts/vendor-candle-core.sh --check  verify it (exit 1 on any difference)
#
# The published crate comes through cargo (checksum-verified against crates.io's index) by fetching it
# in a scratch project; nothing else is downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="0.11.1"
TARGET="third_party/candle-core"

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/src"
cat >"$scratch/Cargo.toml" <<TOML
[package]
name = "fetch-candle-core"
version = "0.0.0"
edition = "2021"
[dependencies]
candle-core = "=$VERSION"
TOML
touch "$scratch/src/lib.rs"
cargo fetch --quiet --manifest-path "$scratch/Cargo.toml"
registry="${CARGO_HOME:-$HOME/.cargo}/registry/src"
original="$(ls -d "$registry"/*/"candle-core-$VERSION" | head -1)"
[ -f "$original/Cargo.toml" ] || { echo "vendor-candle-core: cargo did not unpack candle-core $VERSION" >&2; exit 1; }

mkdir -p "$scratch/copy"
cp -a "$original"/. "$scratch/copy/"
rm -f "$scratch/copy/.cargo-ok"
# The one change: in [dependencies.cudarc], dynamic-linking -> dynamic-loading.
python3 - "$scratch/copy/Cargo.toml" <<'PY'
import sys
path = sys.argv[1]
text = open(path).read()
head, sep, rest = text.partition("[dependencies.cudarc]")
section, nxt, tail = rest.partition("\n[")
assert sep and section.count('"dynamic-linking"') == 1, "unexpected candle-core manifest"
section = section.replace('"dynamic-linking"', '"dynamic-loading"')
open(path, "w").write(head + sep + section + nxt + tail)
PY

if [ "${1:-}" = "--check" ]; then
    if diff -r "$scratch/copy" "$TARGET" >/dev/null; then
        echo "vendor-candle-core: $TARGET is candle-core $VERSION with cudarc's dynamic-loading"
    else
        diff -r "$scratch/copy" "$TARGET" | head -20 >&2
        echo "vendor-candle-core: $TARGET differs from candle-core $VERSION + the one change" >&2
        exit 1
    fi
else
    rm -rf "$TARGET"
    mkdir -p "$(dirname "$TARGET")"
    cp -a "$scratch/copy" "$TARGET"
    echo "vendor-candle-core: wrote $TARGET (candle-core $VERSION, cudarc dynamic-loading)"
fi
