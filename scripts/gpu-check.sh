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
#   4. one summary.
#
# Needs: the NVIDIA driver (libcuda.so.1), cargo, and for step 3 a Python with a CUDA torch ($RLX_PYTHON,
# else ~/.cache/rlx/torch/bin/python from scripts/install-torch.sh, else python3). The CUDA 13.2
# toolkit of the build (nvcc for candle's kernels; cuBLAS, cuRAND and NVRTC 13, which cudarc loads at
# run time) comes from scripts/install-cuda-toolchain.sh (~660 MB, docs/gpu.md "Building"); NVRTC 12
# and ptxas for tests/cuda.rs's compile checks from scripts/install-cuda-tools.sh (~130 MB).
# RLX_CUDA_DEVICE=N picks the GPU (default 0).
set -uo pipefail
cd "$(dirname "$0")/.."

start=$(date +%s)
log="$(mktemp -d)"
out="${RLX_BENCH_OUT:-target/gpu-bench}"
mkdir -p "$out"
status_build="not run"; status_agree="not run"; status_bench="not run"; status_torch="not run"

elapsed() { echo "$(( $(date +%s) - start )) s"; }

if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
else
    echo "gpu-check: nvidia-smi not found; without a driver the GPU tests are reported as ignored"
fi

# The toolkit of the build; the binaries find its libraries by their run path, LD_LIBRARY_PATH too
# for anything else that loads them.
bash scripts/install-cuda-toolchain.sh || echo "gpu-check: the CUDA toolkit could not be installed; the build will fail"
bash scripts/install-cuda-tools.sh
export LD_LIBRARY_PATH="$PWD/.cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

echo "== build (release, --features cuda) [$(elapsed)]"
if cargo build --release --features cuda -p rlx --bins >"$log/build" 2>&1 \
    && cargo test --release --features cuda -p rlx --test cuda --no-run >>"$log/build" 2>&1; then
    status_build="ok"
else
    status_build="FAILED"
    tail -40 "$log/build"
fi

if [ "$status_build" = ok ]; then
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

if [ "$status_bench" = ok ]; then
    echo "== benchmark: PyTorch eager [$(elapsed)]"
    python=""
    for candidate in "${RLX_PYTHON:-}" "$HOME/.cache/rlx/torch/bin/python" python3; do
        if [ -n "$candidate" ] && "$candidate" -c 'import torch, numpy; assert torch.cuda.is_available()' >/dev/null 2>&1; then
            python="$candidate"
            break
        fi
    done
    if [ -z "$python" ]; then
        status_torch="skipped: no Python with a CUDA torch (scripts/install-torch.sh)"
    elif timeout 180 "$python" scripts/torch_eager_bench.py "$out" >"$log/torch" 2>&1; then
        status_torch="ok"
    else
        status_torch="FAILED"
    fi
    [ -f "$log/torch" ] && cat "$log/torch"
fi

echo
echo "== summary [$(elapsed)]"
echo "build:                 $status_build"
echo "agreement (GPU+host):  $status_agree"
echo "rlx benchmark:         $status_bench"
echo "eager PyTorch:         $status_torch"
echo "logs:                  $log"
case "$status_build$status_agree$status_bench$status_torch" in
    *FAILED*) exit 1 ;;
esac
exit 0
