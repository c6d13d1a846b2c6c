#!/usr/bin/env bash
# third_party/candle-core: candle-core 0.11.1 exactly as published on crates.io, except two changes
# that this script makes (and nothing else may):
#
# 1. One word of its Cargo.toml: its `cuda` feature asks cudarc for `dynamic-loading` instead of
#    `dynamic-linking` (docs/gpu.md, "Building"). Candle links the CUDA libraries (libcuda.so.1
#    included) into the binary, so an `rlx` built with `--features cuda` would not even start on a
#    machine without the NVIDIA driver; with dynamic loading cudarc opens them when a CUDA device is
#    asked for, and rlx probes them first, so `--device cuda` there is a clear error and every other
#    command works.
# 2. src/backprop.rs: the backward pass added every gradient contribution to a fresh tensor of zeros
#    (`grads.or_insert(x)` then `*sum = sum.add(&g)`), a zero fill and a full pass per node of the graph
#    even when the node has one consumer, which is most of them; `GradStore::accumulate` stores the
#    first contribution as it is (made contiguous, which copies only a strided view) and adds the later
#    ones (docs/performance.md, item 14). The call sites
#    of that exact two-line form are rewritten to it; the others are left as published.
#
# The root Cargo.toml `[patch.crates-io]` points candle-core at this copy (candle-nn follows).
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
# The second change: first gradient contributions stored as they are (see the top of this file).
python3 - "$scratch/copy/src/backprop.rs" <<'PY'
import re, sys
path = sys.argv[1]
text = open(path).read()
pattern = re.compile(
    r"let (\w+) = grads\.or_insert\((\w+)\)\?;\n\s*\*\1 = \1\.add\((&[^;\n]+?)\)\?;?\n"
)
count = 0
def accumulate(m):
    global count
    var, tensor, grad = m.groups()
    # `sum.add(&g.broadcast_as(sum.dims())?)`: the sum has the tensor's shape.
    grad = grad.replace(f"{var}.dims()", f"{tensor}.dims()")
    if var in grad:
        return m.group(0)
    count += 1
    return f"grads.accumulate({tensor}, {grad})?;\n"
text = pattern.sub(accumulate, text)
anchor = "    /// Extend this gradient store with the contents of another."
assert count == 44 and text.count(anchor) == 1, f"unexpected candle-core backprop.rs ({count} sites)"
method = """    /// Add `grad` to the gradient of `tensor`. The first contribution is stored as it is, made
    /// contiguous (a copy only for a strided or broadcast view: candle's own backward rules, `scatter_add`
    /// of a gather's, take the stored gradients as contiguous, as the sums with zeros made them), when
    /// it has the tensor's shape, dtype and device (else it is added to zeros, as `or_insert` would): no
    /// zero fill and no extra pass for a node with one consumer. (rlx's change,
    /// scripts/vendor-candle-core.sh.)
    fn accumulate(&mut self, tensor: &Tensor, grad: &Tensor) -> Result<()> {
        match self.0.entry(tensor.id()) {
            Entry::Occupied(mut entry) => {
                let sum = entry.get().add(grad)?;
                entry.insert(sum);
            }
            Entry::Vacant(entry) => {
                let fits = grad.shape() == tensor.shape()
                    && grad.dtype() == tensor.dtype()
                    && grad.device().same_device(tensor.device());
                let first = if fits {
                    grad.contiguous()?
                } else {
                    tensor.zeros_like()?.add(grad)?
                };
                entry.insert(first);
            }
        }
        Ok(())
    }

"""
text = text.replace(anchor, method + anchor)
open(path, "w").write(text)
PY

if [ "${1:-}" = "--check" ]; then
    if diff -r "$scratch/copy" "$TARGET" >/dev/null; then
        echo "vendor-candle-core: $TARGET is candle-core $VERSION with cudarc's dynamic-loading and the gradient accumulation"
    else
        diff -r "$scratch/copy" "$TARGET" | head -20 >&2
        echo "vendor-candle-core: $TARGET differs from candle-core $VERSION + the two changes" >&2
        exit 1
    fi
else
    rm -rf "$TARGET"
    mkdir -p "$(dirname "$TARGET")"
    cp -a "$scratch/copy" "$TARGET"
    echo "vendor-candle-core: wrote $TARGET (candle-core $VERSION, cudarc dynamic-loading, gradient accumulation)"
fi
