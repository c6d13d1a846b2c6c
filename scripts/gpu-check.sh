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
# RLX_CUDA_DEVICE=N picks the GPU (default 0).
set -uo pipefail
cd "$(dirname "$0")/.."

device="cuda:${RLX_CUDA_DEVICE:-0}"
if [ "${1:-}" = "--device" ] && [ -n "${2:-}" ]; then
    device="$2"
elif [ -n "${1:-}" ]; then
    echo "usage: scripts/gpu-check.sh [--device cuda:N|cpu]" >&2
    exit 2
fi
smoke=0
case "$device" in
    cpu) smoke=1 ;;
    cuda) export RLX_CUDA_DEVICE=0 ;;
    cuda:[0-9]*) export RLX_CUDA_DEVICE="${device#cuda:}" ;;  # the agreement tests read it too
    *) echo "gpu-check: --device $device: expected cpu, cuda or cuda:N" >&2; exit 2 ;;
esac

start=$(date +%s)
log="$(mktemp -d)"
out="${RLX_BENCH_OUT:-target/gpu-bench}"
mkdir -p "$out"
status_build="not run"; status_agree="not run"; status_bench="not run"; status_torch="not run"
status_head="not run"; status_step="not run"; status_layers="not run"

elapsed() { echo "$(( $(date +%s) - start )) s"; }

if [ "$smoke" = 1 ]; then
    echo "gpu-check: --device cpu: the smoke mode (steps 4, 5 and 7 on the CPU, small sizes; no GPU used)"
elif command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
else
    echo "gpu-check: nvidia-smi not found; without a driver the GPU tests are reported as ignored"
fi

# The toolkit of the build; the binaries find its libraries by their run path, LD_LIBRARY_PATH too
# for anything else that loads them.
if [ "$smoke" = 0 ]; then
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

if [ "$smoke" = 1 ]; then
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
bin="${CARGO_TARGET_DIR:-target}/$profile"

if [ "$smoke" = 1 ]; then
    status_agree="skipped (smoke mode)"; status_bench="skipped (smoke mode)"; status_torch="skipped (smoke mode)"
elif [ "$status_build" = ok ]; then
    echo "== agreement on the GPU, host C, NVRTC/ptxas [$(elapsed)]"
    if timeout 300 cargo test --release --features cuda -p rlx --test cuda -- --nocapture --test-threads 1 \
        >"$log/agree" 2>&1; then
        status_agree="ok"
    else
        status_agree="FAILED"
    fi
    grep -E '^(test |GPU:|NVRTC)|test result|panicked' "$log/agree" | head -40
    [ "$status_agree" = ok ] || tail -60 "$log/agree"
    if grep -q 'ignored, needs a GPU' "$log/agree"; then status_agree="ok on host only: NO GPU USED"; fi

    echo "== benchmark: rlx fused kernels [$(elapsed)]"
    if RLX_BENCH_OUT="$out" timeout 180 cargo test --release --features cuda -p rlx --test cuda gpu_benchmark \
        -- --ignored --nocapture >"$log/bench" 2>&1 && [ -f "$out/rlx.json" ]; then
        status_bench="ok"
        grep -E '^rlx |^GPU' "$log/bench"
    else
        status_bench="FAILED"
        tail -40 "$log/bench"
    fi
fi

if [ "$smoke" = 0 ] && [ "$status_bench" = ok ]; then
    echo "== benchmark: PyTorch eager [$(elapsed)]"
    if [ -z "$python" ]; then
        status_torch="skipped: no Python with a CUDA torch (scripts/install-torch.sh)"
    elif timeout 180 "$python" scripts/torch_eager_bench.py "$out" >"$log/torch" 2>&1; then
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
    if timeout 180 "$bin/examples/lm_head_bench" --device "$device" "${head_shape[@]}" \
        --out "$out/head_rlx.json" >"$log/head" 2>&1; then
        if [ -z "$python" ]; then
            status_head="rlx only (no Python with torch for the comparison): $(cat "$out/head_rlx.json")"
        elif timeout 180 "$python" scripts/torch_head_bench.py "$out/head_rlx.json" >>"$log/head" 2>&1; then
            status_head="ok"
        else
            status_head="FAILED"
        fi
    else
        status_head="FAILED"
    fi
    cat "$log/head"

    echo "== GRPO steps on $device vs the first step on the CPU [$(elapsed)]"
    rm -rf "$out/grpo-device" "$out/grpo-cpu"
    # The CPU run stops after its first step (--steps 1): grpo.rlx reads neither `step` nor
    # `progress`, so that step is the device run's first (same seed, prompts and sampling stream).
    if [ "$smoke" = 1 ]; then
        step_config=(--set sft.steps=30 --set train.prompts_per_step=4 --set train.eval_every=0
            --set task.eval_questions=20)
        device_steps=3
    else
        step_config=(--config configs/smollm2-ifeval.toml --set task.eval_prompts=0
            --set train.eval_every=0)
        device_steps=20
    fi
    if [ "$smoke" = 0 ] && ! bash scripts/fetch-assets.sh >"$log/assets" 2>&1; then
        status_step="skipped: no SmolLM2 assets (scripts/fetch-assets.sh failed, $log/assets)"
    elif timeout 300 "$bin/rlx" run recipes/grpo.rlx "${step_config[@]}" --steps "$device_steps" \
            --device "$device" --out "$out/grpo-device" >"$log/step-device" 2>&1 \
        && timeout 240 "$bin/rlx" run recipes/grpo.rlx "${step_config[@]}" --steps 1 \
            --device cpu --out "$out/grpo-cpu" >"$log/step-cpu" 2>&1; then
        if "${python:-python3}" scripts/gpu_step_report.py "$out/grpo-device" "$out/grpo-cpu" \
            --json "$out/step.json" >"$log/step" 2>&1; then
            status_step="ok"
        else
            status_step="FAILED"
        fi
        cat "$log/step"
    else
        status_step="FAILED"
        tail -20 "$log/step-device" "$log/step-cpu" 2>/dev/null
    fi
fi

if [ "$status_build" = ok ]; then
    echo "== fused layers vs plain candle layers on $device [$(elapsed)]"
    if timeout 120 "$bin/examples/layers_check" --device "$device" --out "$out/layers.json" \
        >"$log/layers" 2>&1; then
        status_layers="ok: $(cat "$out/layers.json")"
    else
        status_layers="FAILED"
    fi
    cat "$log/layers"
fi

if [ "$status_step" = ok ]; then
    echo "== GRPO steps with bf16 products on $device vs the CPU's f32 first step [$(elapsed)]"
    rm -rf "$out/grpo-bf16"
    bf16_steps=5
    [ "$smoke" = 1 ] && bf16_steps=2
    if timeout 300 "$bin/rlx" run recipes/grpo.rlx "${step_config[@]}" --set train.dtype=bf16 \
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
echo "build:                 $status_build"
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
