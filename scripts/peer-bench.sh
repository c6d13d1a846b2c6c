#!/usr/bin/env bash
# rlx against Hugging Face transformers + PyTorch on the same model, shapes and cores, in one run
# (docs/performance.md): `rlx bench-model` (sample and train phases) and scripts/peer_bench.py (the same
# computation in torch), each phase of each run in turn, then one table with both and their ratio.
#
#   scripts/peer-bench.sh [CONFIG] [ROWS] [NEW_TOKENS] [RUNS] [RECIPE]
#
# CONFIG (default configs/smollm2.toml, with its recipe recipes/darling.rlx) names the model; it is exported once with `rlx export --config`
# to a temporary Hugging Face folder that transformers loads. Needs the release build of rlx (built here
# if missing), the assets (scripts/fetch-assets.sh) and the torch environment of scripts/install-torch.sh
# ($RLX_PYTHON, else ~/.cache/rlx/torch/bin/python); installs nothing. The table gives each side's
# process CPU seconds of the phase too (train: the median run): with RAYON_NUM_THREADS=1 OMP_NUM_THREADS=1
# they compare the work of one core even on a shared machine, where wall times do not.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG="${1:-configs/smollm2.toml}"
ROWS="${2:-16}"
NEW="${3:-64}"
RUNS="${4:-3}"
RECIPE="${5:-recipes/darling.rlx}"
PYTHON="${RLX_PYTHON:-${RLX_TORCH_VENV:-$HOME/.cache/rlx/torch}/bin/python}"
"$PYTHON" -c "import torch, transformers" 2>/dev/null || {
    echo "peer-bench: $PYTHON cannot import torch and transformers (run scripts/install-torch.sh)" >&2
    exit 1
}
cargo build --release --bin rlx >&2
RLX=target/release/rlx
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$RLX" export --config "$CONFIG" --hf "$work/model" >&2

"$RLX" bench-model --config "$CONFIG" --recipe "$RECIPE" --rows "$ROWS" --new-tokens "$NEW" --runs "$RUNS" \
    --phases sample,train | tee "$work/rlx.jsonl"
read -r PROMPT WIDTH MICRO LR WD < <("$PYTHON" - "$work/rlx.jsonl" "$CONFIG" <<'PY'
import json, sys, tomllib
lines = [json.loads(l) for l in open(sys.argv[1])]
train = next(l for l in lines if l["phase"] == "train")
sample = next(l for l in lines if l["phase"] == "sample")
config = tomllib.load(open(sys.argv[2], "rb"))
t = config.get("train", {})
print(train["width"] - sample["new_tokens"], train["width"], train["micro_batch"], t.get("lr", 1e-6), t.get("weight_decay", 0.0))
PY
)
"$PYTHON" scripts/peer_bench.py "$work/model" --rows "$ROWS" --new-tokens "$NEW" --prompt "$PROMPT" \
    --width "$WIDTH" --runs "$RUNS" --micro-batch "$MICRO" --lr "$LR" --wd "$WD" | tee "$work/torch.jsonl"

"$PYTHON" - "$work/rlx.jsonl" "$work/torch.jsonl" <<'PY'
import json, sys
rlx = {l["phase"]: l for l in map(json.loads, open(sys.argv[1]))}
torch = {l["phase"]: l for l in map(json.loads, open(sys.argv[2]))}
print(f"{'phase':<8}{'rlx tok/s':>12}{'torch tok/s':>13}{'ratio':>8}{'rlx peak RSS':>15}{'torch peak RSS':>16}"
      f"{'rlx CPU s':>11}{'torch CPU s':>13}")
for phase in ("sample", "train"):
    r, t = rlx[phase], torch[phase]
    gib = lambda b: f"{b / 2**30:.2f} GiB" if b else "n/a"
    print(f"{phase:<8}{r['tokens_per_s']:>12.1f}{t['tokens_per_s']:>13.1f}{r['tokens_per_s'] / t['tokens_per_s']:>7.2f}x"
          f"{gib(r['peak_rss_bytes']):>15}{gib(t['peak_rss_bytes']):>16}"
          f"{r['cpu_seconds']:>11.1f}{t['cpu_seconds']:>13.1f}")
PY
