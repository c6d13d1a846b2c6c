#!/usr/bin/env bash
# The CUDA backend on a real GPU (docs/gpu.md), in one go, designed to finish in under 8 minutes on one
# H100/H200 including the build:
#
#   1. build rlx with `--features cuda` (release);
#   2. the agreement suite on the GPU: every recipe of recipes/ and tests/gradients/, random ragged
#      packed batches, CUDA vs the f64 interpreter within the documented tolerance (f64 accumulation:
#      1e-5 relative + 1e-9; f32 accumulation: 1e-3 + 1e-5), blocks of 32 and 256 threads — plus the
#      host-C and NVRTC/ptxas checks of tests/cuda.rs;
#   3. the benchmark: 64 groups × 8 responses × 4096 tokens, recipes/dapo.rlx and recipes/darling.rlx,
#      the fused kernels (inputs resident on the GPU) vs the same objectives as PyTorch eager ops the way
#      verl computes them (scripts/torch_eager_bench.py): time, peak memory, the bandwidth bound;
#   4. the fused LM head vs PyTorch's materialised logits at V = 151936 (Qwen2.5's vocabulary; 4096
#      positions, hidden size 896): time, peak memory, values within 1e-3
#      (trainer/examples/lm_head_bench.rs, scripts/torch_head_bench.py);
#   5. 20 GRPO steps on SmolLM2-135M on the GPU (configs/smollm2-ifeval.toml: 8 prompts × 8 × 48
#      tokens, LoRA) and the same run's first step on the CPU: first-step loss agreement, tokens/s of
#      sampling and training, step time, peak GPU memory, the reward curve (scripts/gpu_step_report.py);
#   6. the same GRPO steps with bf16 products (`--set train.dtype=bf16`, 5 steps; smoke mode 2): step
#      time and peak memory beside step 5's, the first-step loss against the CPU's f32 one within 5 %;
#   7. the fused layers' CUDA kernels against the plain candle layers: one forward and backward pass of a
#      tiny model each way, the LM head's values and every gradient within 1e-3 relative
#      (trainer/examples/layers_check.rs; smoke mode: the CPU kernels against the plain layers);
#   8. one summary.
#
# `scripts/gpu-check.sh --prebuilt DIR` (with `--device cuda:N` or `cpu` as well) is the same check on a
# machine without cargo or network, such as this project's lent GPU machines (docs/gpu.md, "On this
# project's lent GPU machines"): no build, no install script; it unpacks what scripts/gpu-pack.sh packed
# into DIR and runs those binaries for every step (the agreement suite and the benchmark are the packed
# test binary of tests/cuda.rs, with the arguments the cargo-test invocations pass it). cudarc finds
# NVRTC 13, cuBLAS and cuRAND in python3's site-packages/nvidia/*/lib (LD_LIBRARY_PATH). Step 5 runs on
# a checkpoint of SmolLM2-135M's shape with random weights that transformers makes there
# (scripts/gpu_pack_hf.py; the GGUF does not travel), so its reward curve means nothing, while its step
# time, tokens/s, peak memory and first-step loss against the CPU are the real model's. The whole run is
# held to 8 minutes ($RLX_GPU_CHECK_BUDGET seconds, default 470): a step that would start past it is
# reported as skipped, and each step's timeout is cut to what is left. RLX_GPU_CHECK_LOG=DIR keeps the
# logs in DIR (default: a fresh temporary folder).
#
# `scripts/gpu-check.sh --device cpu` is the smoke mode: steps 4, 5 and 7 on the CPU at small sizes (a
# debug build without the feature; the head at V = 8192, three GRPO steps of the tiny default model
# against a second CPU run), steps 1–3 skipped; it checks the script, the example, the two Python
# reports and the metrics they read on any machine (trainer/tests/gpu_check.rs runs the reports).
#
# Needs: the NVIDIA driver (libcuda.so.1), cargo, and for step 3 a Python with a CUDA torch ($RLX_PYTHON,
# else ~/.cache/rlx/torch/bin/python from scripts/install-torch.sh, else python3). The CUDA 13.2
# toolkit of the build (nvcc for candle's kernels; cuBLAS, cuRAND and NVRTC 13, which cudarc loads at
# run time) comes from scripts/install-cuda-toolchain.sh (~660 MB, docs/gpu.md "Building"); NVRTC 12
# and ptxas for tests/cuda.rs's compile checks from scripts/install-cuda-tools.sh (~130 MB).
# With --prebuilt: no cargo and no install script, but python3 with the CUDA wheels (nvidia-cuda-nvrtc,
# nvidia-cublas, nvidia-curand; `import nvidia`) and a Python with torch and transformers for step 5.
# RLX_CUDA_DEVICE=N picks the GPU (default 0). A relative DIR is taken from the repository root.
set -uo pipefail
cd "$(dirname "$0")/.."

usage() {
    echo "usage: scripts/gpu-check.sh [--device cuda:N|cpu] [--prebuilt DIR]" >&2
    exit 2
}
device="cuda:${RLX_CUDA_DEVICE:-0}"
prebuilt=""
while [ $# -gt 0 ]; do
    case "$1" in
        --device) [ -n "${2:-}" ] || usage; device="$2"; shift 2 ;;
        --prebuilt) [ -n "${2:-}" ] || usage; prebuilt="$2"; shift 2 ;;
        *) usage ;;
    esac
done
smoke=0
case "$device" in
    cpu) smoke=1 ;;
    cuda) export RLX_CUDA_DEVICE=0 ;;
    cuda:[0-9]*) export RLX_CUDA_DEVICE="${device#cuda:}" ;;  # the agreement tests read it too
    *) echo "gpu-check: --device $device: expected cpu, cuda or cuda:N" >&2; exit 2 ;;
esac

start=$(date +%s)
if [ -n "${RLX_GPU_CHECK_LOG:-}" ]; then
    log="$RLX_GPU_CHECK_LOG"
    mkdir -p "$log" || exit 1
else
    log="$(mktemp -d)"
fi
out="${RLX_BENCH_OUT:-target/gpu-bench}"
mkdir -p "$out" || exit 1
out="$(cd "$out" && pwd)"
status_build="not run"; status_agree="not run"; status_bench="not run"; status_torch="not run"
status_head="not run"; status_step="not run"; status_layers="not run"

elapsed() { echo "$(( $(date +%s) - start )) s"; }

# The timeout of a step: CAP seconds, or what is left of the prebuilt mode's budget on a GPU; fails
# (the step is then skipped) when under 15 s are left.
deadline=""
if [ -n "$prebuilt" ] && [ "$smoke" = 0 ]; then
    deadline=$((start + ${RLX_GPU_CHECK_BUDGET:-470}))
fi
spent() { echo "skipped: the budget of ${RLX_GPU_CHECK_BUDGET:-470} s is spent ($(elapsed))"; }
limit() {
    local cap="$1"
    if [ -n "$deadline" ] && [ $((deadline - $(date +%s))) -lt "$cap" ]; then
        cap=$((deadline - $(date +%s)))
    fi
    [ "$cap" -ge 15 ] && echo "$cap"
}

if [ "$smoke" = 1 ]; then
    echo "gpu-check: --device cpu: the smoke mode (steps 4, 5 and 7 on the CPU, small sizes; no GPU used)"
elif command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
elif [ -n "$prebuilt" ]; then
    echo "gpu-check: nvidia-smi not found; without a driver the GPU steps fail"
else
    echo "gpu-check: nvidia-smi not found; without a driver the GPU tests are reported as ignored"
fi

# The toolkit of the build; the binaries find its libraries by their run path, LD_LIBRARY_PATH too
# for anything else that loads them.
if [ "$smoke" = 0 ] && [ -z "$prebuilt" ]; then
    bash scripts/install-cuda-toolchain.sh || echo "gpu-check: the CUDA toolkit could not be installed; the build will fail"
    bash scripts/install-cuda-tools.sh
    export LD_LIBRARY_PATH="$PWD/.cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# The Python with torch (CUDA torch on a GPU, any torch in the smoke mode).
python=""
torch_check='import torch, numpy; assert torch.cuda.is_available()'
[ "$smoke" = 1 ] && torch_check='import torch'
for candidate in "${RLX_PYTHON:-}" "$HOME/.cache/rlx/torch/bin/python" python3; do
    if [ -n "$candidate" ] && "$candidate" -c "$torch_check" >/dev/null 2>&1; then
        python="$candidate"
        break
    fi
done

# The Python with transformers that makes step 5's random checkpoint in the prebuilt mode.
hf_python=""
if [ -n "$prebuilt" ]; then
    for candidate in "${RLX_PYTHON:-}" "$HOME/.cache/rlx/torch/bin/python" python3; do
        if [ -n "$candidate" ] && "$candidate" -c 'import torch, transformers' >/dev/null 2>&1; then
            hf_python="$candidate"
            break
        fi
    done
fi

if [ -n "$prebuilt" ]; then
    echo "== unpack the prebuilt binaries of $prebuilt (no build) [$(elapsed)]"
    pack="$out/prebuilt"
    rm -rf "$pack"
    mkdir -p "$pack"
    archive="$prebuilt/rlx-gpu-pack.tar.xz"
    if [ ! -f "$archive" ]; then
        status_build="FAILED: no $archive (scripts/gpu-pack.sh $prebuilt writes it)"
    elif ! { tar -xJf "$archive" -C "$pack" 2>"$log/unpack" \
        || python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
            "$archive" "$pack" 2>>"$log/unpack"; }; then
        cat "$log/unpack"
        status_build="FAILED: cannot unpack $archive"
    else
        field() { awk -F'\t' -v k="$1" '$1 == k { print $2 }' "$pack/manifest.txt"; }
        status_build="ok"
        sed 's/^/gpu-check:   /' "$pack/manifest.txt"
        bin="$pack/bin"
        # The test binary reads the recipes below the checkout it was built in and runs the `rlx` it
        # was built with (paths compiled into it): where they are missing, link them to this tree.
        checkout="$(field checkout)"
        rlx_exe="$(field rlx_exe)"
        if [ "$checkout" != "$PWD" ] && [ ! -e "$checkout" ]; then
            if mkdir -p "$(dirname "$checkout")" && ln -s "$PWD" "$checkout"; then
                echo "gpu-check: linked $checkout (the packed tests' checkout) to $PWD"
            else
                echo "gpu-check: cannot link $checkout to $PWD: the agreement tests will not find the recipes"
            fi
        elif [ "$checkout" != "$PWD" ]; then
            echo "gpu-check: the packed tests read the recipes of $checkout, not of $PWD"
        fi
        if [ ! -e "$rlx_exe" ]; then
            mkdir -p "$(dirname "$rlx_exe")" && ln -s "$bin/rlx" "$rlx_exe" \
                || echo "gpu-check: cannot link $rlx_exe to the packed rlx: its test will fail"
        fi
    fi
    if [ "$smoke" = 0 ]; then
        # cudarc opens libnvrtc.so.13, libcublas.so.13, libcublasLt.so.13 and libcurand.so.10 by name
        # (dlopen): python3's CUDA wheels hold them (the binaries' run path is the packing machine's).
        nvidia_lib="$(python3 -c '
import glob, os, nvidia
want = ("libnvrtc.so.13", "libcublas.so.13", "libcublasLt.so.13", "libcurand.so.10")
print(":".join(d for base in nvidia.__path__ for d in sorted(glob.glob(os.path.join(base, "*", "lib")))
               if any(os.path.exists(os.path.join(d, w)) for w in want)))' 2>/dev/null)"
        for lib in libnvrtc.so.13 libcublas.so.13 libcublasLt.so.13 libcurand.so.10; do
            found=""
            for d in ${nvidia_lib//:/ }; do [ -e "$d/$lib" ] && found="$d"; done
            if [ -n "$found" ]; then
                echo "gpu-check: $lib from $found"
            else
                echo "gpu-check: $lib is not in python3's site-packages/nvidia/*/lib: the steps that need it will fail"
            fi
        done
        [ -n "$nvidia_lib" ] && export LD_LIBRARY_PATH="$nvidia_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
elif [ "$smoke" = 1 ]; then
    profile=debug
    echo "== build (debug, no cuda feature: smoke mode) [$(elapsed)]"
    if cargo build -p rlx --bins >"$log/build" 2>&1 \
        && cargo build -p rlx-trainer --example lm_head_bench --example layers_check >>"$log/build" 2>&1; then
        status_build="ok"
    else
        status_build="FAILED"
        tail -40 "$log/build"
    fi
else
    profile=release
    echo "== build (release, --features cuda) [$(elapsed)]"
    if cargo build --release --features cuda -p rlx --bins >"$log/build" 2>&1 \
        && cargo build --release --features cuda -p rlx-trainer --example lm_head_bench \
            --example layers_check >>"$log/build" 2>&1 \
        && cargo test --release --features cuda -p rlx --test cuda --no-run >>"$log/build" 2>&1; then
        status_build="ok"
    else
        status_build="FAILED"
        tail -40 "$log/build"
    fi
fi
[ -z "$prebuilt" ] && bin="${CARGO_TARGET_DIR:-target}/$profile"

# tests/cuda.rs: `cargo test`, or in the prebuilt mode its packed binary with the same arguments.
run_tests() {
    local t="$1"
    shift
    if [ -n "$prebuilt" ]; then
        timeout "$t" "$bin/cuda-tests" "$@"
    else
        timeout "$t" cargo test --release --features cuda -p rlx --test cuda -- "$@"
    fi
}
agree_args=(--nocapture --test-threads 1)
agree_note=""
if [ -n "$prebuilt" ]; then
    # The packed binary was built without a GPU, so its GPU tests carry `ignore` (cfg rlx_gpu):
    # --include-ignored runs them on a GPU (the benchmark apart, as with cargo).
    [ "$smoke" = 0 ] && agree_args+=(--include-ignored --skip gpu_benchmark)
    if [ ! -e "${RLX_CUDA_TOOLS:-$HOME/.cache/rlx/cuda}/nvidia/cuda_nvrtc/lib/libnvrtc.so.12" ]; then
        agree_args+=(--skip nvrtc_compiles_every_recipe_and_ptxas_assembles_it)
        agree_note="; NVRTC 12 + ptxas compile check not run: no scripts/install-cuda-tools.sh tools here (CI runs it)"
    fi
    if ! command -v "${CC:-cc}" >/dev/null; then
        agree_args+=(gpu::)
        agree_note="$agree_note; host-C tests not run: no C compiler (${CC:-cc}) here (CI runs them)"
    fi
fi

if [ "$smoke" = 1 ] && [ -z "$prebuilt" ]; then
    status_agree="skipped (smoke mode)"; status_bench="skipped (smoke mode)"; status_torch="skipped (smoke mode)"
elif [ "$status_build" = ok ]; then
    echo "== agreement on the GPU, host C, NVRTC/ptxas [$(elapsed)]"
    if ! t=$(limit 300); then
        status_agree="$(spent)"
    elif run_tests "$t" "${agree_args[@]}" >"$log/agree" 2>&1; then
        status_agree="ok$agree_note"
    else
        status_agree="FAILED$agree_note"
    fi
    if [ -f "$log/agree" ]; then
        grep -E '^(test |GPU:|NVRTC)|test result|panicked' "$log/agree" | head -40
        [ "${status_agree%%;*}" = ok ] || tail -60 "$log/agree"
    fi
    if [ "$smoke" = 1 ]; then
        [ "${status_agree%%;*}" = ok ] && status_agree="ok on host only (smoke mode: the GPU tests not run)$agree_note"
        status_bench="skipped (smoke mode)"; status_torch="skipped (smoke mode)"
    else
        if grep -q 'ignored, needs a GPU' "$log/agree" 2>/dev/null; then status_agree="ok on host only: NO GPU USED"; fi

        echo "== benchmark: rlx fused kernels [$(elapsed)]"
        if ! t=$(limit 180); then
            status_bench="$(spent)"
        elif RLX_BENCH_OUT="$out" run_tests "$t" gpu_benchmark --ignored --nocapture >"$log/bench" 2>&1 \
            && [ -f "$out/rlx.json" ]; then
            status_bench="ok"
            grep -E '^rlx |^GPU' "$log/bench"
        else
            status_bench="FAILED"
            tail -40 "$log/bench"
        fi
    fi
fi

if [ "$smoke" = 0 ] && [ "$status_bench" = ok ]; then
    echo "== benchmark: PyTorch eager [$(elapsed)]"
    if [ -z "$python" ]; then
        status_torch="skipped: no Python with a CUDA torch (scripts/install-torch.sh)"
    elif ! t=$(limit 180); then
        status_torch="$(spent)"
    elif timeout "$t" "$python" scripts/torch_eager_bench.py "$out" >"$log/torch" 2>&1; then
        status_torch="ok"
    else
        status_torch="FAILED"
    fi
    [ -f "$log/torch" ] && cat "$log/torch"
fi

if [ "$status_build" = ok ]; then
    echo "== LM head: rlx fused vs torch materialised [$(elapsed)]"
    if [ "$smoke" = 1 ]; then head_shape=(--rows 256 --vocab 8192 --hidden 64 --runs 2); else
        head_shape=(--rows 4096 --vocab 151936 --hidden 896 --runs 5); fi
    if ! t=$(limit 180); then
        status_head="$(spent)"
    elif timeout "$t" "$bin/examples/lm_head_bench" --device "$device" "${head_shape[@]}" \
        --out "$out/head_rlx.json" >"$log/head" 2>&1; then
        if [ -z "$python" ]; then
            status_head="rlx only (no Python with torch for the comparison): $(cat "$out/head_rlx.json")"
        elif ! t=$(limit 180); then
            status_head="rlx only ($(spent)): $(cat "$out/head_rlx.json")"
        elif timeout "$t" "$python" scripts/torch_head_bench.py "$out/head_rlx.json" >>"$log/head" 2>&1; then
            status_head="ok"
        else
            status_head="FAILED"
        fi
    else
        status_head="FAILED"
    fi
    [ -f "$log/head" ] && cat "$log/head"

    echo "== GRPO steps on $device vs the first step on the CPU [$(elapsed)]"
    rm -rf "$out/grpo-device" "$out/grpo-cpu"
    # The CPU run stops after its first step (--steps 1): grpo.rlx reads neither `step` nor
    # `progress`, so that step is the device run's first (same seed, prompts and sampling stream).
    if [ -n "$prebuilt" ]; then
        # SmolLM2-135M's shape with random weights (the GGUF does not travel; the smoke mode shrinks
        # it to 2 layers of width 64), its tokenizer and chat template, IFEval's prompts, all packed.
        hf="$out/hf-random"
        rm -rf "$hf"
        hf_args=()
        [ "$smoke" = 1 ] && hf_args=(--tiny)
        # configs/smollm2-ifeval.toml with [model] kind = "hf", path = that checkpoint.
        sed "s|^kind = \"smollm2\"\$|kind = \"hf\"\npath = \"$hf\"|" configs/smollm2-ifeval.toml \
            >"$out/smollm2-ifeval-random.toml"
        step_config=(--config "$out/smollm2-ifeval-random.toml" --set "task.path=$pack/ifeval.jsonl"
            --set task.eval_prompts=0 --set train.eval_every=0)
        device_steps=20
        [ "$smoke" = 1 ] && step_config+=(--set train.prompts_per_step=2) && device_steps=3
        if ! grep -q '^kind = "hf"$' "$out/smollm2-ifeval-random.toml"; then
            status_step="FAILED: configs/smollm2-ifeval.toml has no line kind = \"smollm2\" to point at the checkpoint"
        elif [ -z "$hf_python" ]; then
            status_step="skipped: no Python with torch and transformers for the random checkpoint"
        elif ! t=$(limit 120); then
            status_step="$(spent)"
        elif ! timeout "$t" "$hf_python" scripts/gpu_pack_hf.py "$pack/hf" "$hf" "${hf_args[@]}" \
            >"$log/hf" 2>&1; then
            status_step="FAILED: scripts/gpu_pack_hf.py: $(tail -1 "$log/hf")"
        fi
        [ -f "$log/hf" ] && cat "$log/hf"
    elif [ "$smoke" = 1 ]; then
        step_config=(--set sft.steps=30 --set train.prompts_per_step=4 --set train.eval_every=0
            --set task.eval_questions=20)
        device_steps=3
    else
        step_config=(--config configs/smollm2-ifeval.toml --set task.eval_prompts=0
            --set train.eval_every=0)
        device_steps=20
    fi
    if [ "$status_step" != "not run" ]; then
        :
    elif [ "$smoke" = 0 ] && [ -z "$prebuilt" ] && ! bash scripts/fetch-assets.sh >"$log/assets" 2>&1; then
        status_step="skipped: no SmolLM2 assets (scripts/fetch-assets.sh failed, $log/assets)"
    elif ! t=$(limit 300); then
        status_step="$(spent)"
    elif ! timeout "$t" "$bin/rlx" run recipes/grpo.rlx "${step_config[@]}" --steps "$device_steps" \
            --device "$device" --out "$out/grpo-device" >"$log/step-device" 2>&1; then
        status_step="FAILED"
        tail -20 "$log/step-device"
    elif ! t=$(limit 240); then
        status_step="$(spent): the $device run passed, the CPU's first step did not run"
    elif ! timeout "$t" "$bin/rlx" run recipes/grpo.rlx "${step_config[@]}" --steps 1 \
            --device cpu --out "$out/grpo-cpu" >"$log/step-cpu" 2>&1; then
        status_step="FAILED"
        tail -20 "$log/step-cpu"
    else
        if "${python:-python3}" scripts/gpu_step_report.py "$out/grpo-device" "$out/grpo-cpu" \
            --json "$out/step.json" >"$log/step" 2>&1; then
            status_step="ok"
        else
            status_step="FAILED"
        fi
        cat "$log/step"
        if [ -n "$prebuilt" ]; then
            # Random weights seldom draw a stop token: every completion is max_new_tokens long, and then
            # GRPO's first-step loss is 0 whatever the rewards (zero-sum advantages, ratio 1, KL 0). The
            # gradient is 0 too unless a group's rewards differ (with random weights they seldom do):
            # the first step's gradient norm, loss, reward and length on both devices, to read the
            # comparison by (docs/gpu.md, "On this project's lent GPU machines").
            "${python:-python3}" - "$out/grpo-device" "$out/grpo-cpu" >>"$log/step" 2>&1 <<'EOF'
import json, sys
first = [json.loads(open(f"{run}/metrics.jsonl").readline()) for run in sys.argv[1:]]
def show(key):
    return " / ".join("n/a" if m.get(key) is None else f"{m[key]:.6g}" for m in first)
print(f"step 0 (device / CPU): grad_norm {show('grad_norm')}, loss {show('loss')}, "
      f"reward/mean {show('reward/mean')}, response_length/mean {show('response_length/mean')}")
EOF
            tail -1 "$log/step"
            status_step="$status_step: RANDOM WEIGHTS (SmolLM2-135M's shape$([ "$smoke" = 1 ] && echo ', shrunk'): the reward curve means nothing; step time, tokens/s and memory are real); $(grep -m1 '^first-step loss' "$log/step"); $(tail -1 "$log/step")"
        fi
    fi
fi

if [ "$status_build" = ok ]; then
    echo "== fused layers vs plain candle layers on $device [$(elapsed)]"
    if ! t=$(limit 120); then
        status_layers="$(spent)"
    elif timeout "$t" "$bin/examples/layers_check" --device "$device" --out "$out/layers.json" \
        >"$log/layers" 2>&1; then
        status_layers="ok: $(cat "$out/layers.json")"
    else
        status_layers="FAILED"
    fi
    [ -f "$log/layers" ] && cat "$log/layers"
fi

if [ "${status_step%%:*}" = ok ]; then
    echo "== GRPO steps with bf16 products on $device vs the CPU's f32 first step [$(elapsed)]"
    rm -rf "$out/grpo-bf16"
    bf16_steps=5
    [ "$smoke" = 1 ] && bf16_steps=2
    if ! t=$(limit 300); then
        status_bf16="$(spent)"
    elif timeout "$t" "$bin/rlx" run recipes/grpo.rlx "${step_config[@]}" --set train.dtype=bf16 \
            --steps "$bf16_steps" --device "$device" --out "$out/grpo-bf16" >"$log/step-bf16" 2>&1 \
        && "${python:-python3}" scripts/gpu_step_report.py "$out/grpo-bf16" "$out/grpo-cpu" \
            --rtol 0.05 --json "$out/step-bf16.json" >"$log/bf16" 2>&1; then
        status_bf16="ok"
    else
        status_bf16="FAILED"
        tail -20 "$log/step-bf16" 2>/dev/null
    fi
    cat "$log/bf16" 2>/dev/null
else
    status_bf16="skipped: the f32 GRPO steps did not pass"
fi

echo
echo "== summary [$(elapsed)]"
echo "device:                $device"
if [ -n "$prebuilt" ] && [ "$status_build" = ok ]; then
    echo "build:                 prebuilt ($prebuilt: $(field commit), built $(field built), no build here)"
else
    echo "build:                 $status_build"
fi
echo "agreement (GPU+host):  $status_agree"
echo "rlx benchmark:         $status_bench"
echo "eager PyTorch:         $status_torch"
echo "LM head vs torch:      $status_head"
echo "GRPO steps vs CPU:     $status_step"
echo "bf16 GRPO steps:       $status_bf16"
echo "fused vs plain layers: $status_layers"
echo "logs:                  $log"
case "$status_build$status_agree$status_bench$status_torch$status_head$status_step$status_bf16$status_layers" in
    *FAILED*) exit 1 ;;
esac
exit 0
