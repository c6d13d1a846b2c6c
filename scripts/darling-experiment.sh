#!/usr/bin/env bash
# The DARLING experiment (docs/experiments.md): GRPO, DARLING (quality × partition diversity) and its
# additive ablation trained on the open-ended decompose task (configs/darling.toml) from the same warm
# start (per seed: the warm start depends on the seed only, never on the recipe), then compared on the
# held-out targets' quality (fraction of valid samples) and distinct valid answers among 32 samples.
#
#   scripts/darling-experiment.sh [--quick] [--out DIR] [--seeds "1 2 3"] [--steps N]
#
# Writes DIR/results.json (a list of {"recipe", "seed", "quality", "distinct", ...}), DIR/table.md,
# DIR/curves.png and every run in DIR/runs/RECIPE-sSEED. --quick: one seed and 150 steps (what CI runs).
# RLX_BIN names the rlx binary to use (default: a release build of this checkout, built if needed).
set -euo pipefail
cd "$(dirname "$0")/.."

out="runs/darling-experiment"
seeds=""
steps=""
quick=0
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1; shift ;;
        --out) out="${2:?--out needs a directory}"; shift 2 ;;
        --seeds) seeds="${2:?--seeds needs a list}"; shift 2 ;;
        --steps) steps="${2:?--steps needs a number}"; shift 2 ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) echo "darling-experiment: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [ "$quick" = 1 ]; then
    seeds="${seeds:-1}"
    steps="${steps:-150}"
fi
seeds="${seeds:-1 2 3}"

if [ -z "${RLX_BIN:-}" ]; then
    cargo build --release --quiet --bin rlx
    RLX_BIN=target/release/rlx
fi
recipes="grpo darling darling_additive"
mkdir -p "$out/runs"
start=$(date +%s)
dirs=()
for seed in $seeds; do
    for recipe in $recipes; do
        dir="$out/runs/$recipe-s$seed"
        rm -rf "$dir"
        echo "darling-experiment: $recipe, seed $seed → $dir" >&2
        args=(run "recipes/$recipe.rlx" --config configs/darling.toml --seed "$seed" --out "$dir")
        if [ -n "$steps" ]; then
            args+=(--steps "$steps")
        fi
        "$RLX_BIN" "${args[@]}" 2>"$dir.log" || { cat "$dir.log" >&2; exit 1; }
        tail -n 1 "$dir.log" >&2
        dirs+=("$dir")
    done
done
"$RLX_BIN" compare "${dirs[@]}" --out "$out" \
    --metric quality=eval/quality --metric distinct=eval/distinct --metric classes=eval/classes \
    --metric train_distinct=diversity/distinct \
    --title "decompose task: grpo vs darling vs darling_additive, seeds ${seeds// /,}"
echo "darling-experiment: $(( $(date +%s) - start )) s; $out/results.json, $out/table.md, $out/curves.png" >&2
