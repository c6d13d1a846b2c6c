#!/usr/bin/env bash
# The `cuda` build on any machine (docs/gpu.md, "Building"), as CI runs it:
#
#   1. scripts/install-cuda-toolchain.sh (a no-op when the pinned CUDA 13.2 toolkit is there);
#   2. `cargo build --release --features cuda --bin rlx`, with no CUDA environment variable;
#   3. that `rlx` depends on no CUDA library at load time (readelf: no libcuda, libcudart, libcublas,
#      libcurand or libnvrtc among its NEEDED entries);
#   4. it runs a CPU command (`rlx score … --device cpu`);
#   5. without an NVIDIA driver: `rlx score|bench|run … --device cuda` each exit with status 1 and an
#      error naming the driver, no panic, and `rlx run` writes no output directory. With a driver
#      (a GPU machine), `rlx score --device cuda` must succeed instead.
#
# Exit status 0 when every check passes, 1 otherwise (each failure is printed).
set -uo pipefail
cd "$(dirname "$0")/.."

failures=0
fail() {
    echo "check-cuda-build: FAILED: $*" >&2
    failures=$((failures + 1))
}

bash scripts/install-cuda-toolchain.sh || exit 1
start=$(date +%s)
if ! env -u CUDA_HOME -u CUDA_PATH -u NVCC -u CUDA_COMPUTE_CAP \
    cargo build --release --features cuda --bin rlx; then
    echo "check-cuda-build: FAILED: cargo build --release --features cuda --bin rlx" >&2
    exit 1
fi
echo "check-cuda-build: built in $(( $(date +%s) - start )) s"
rlx="${CARGO_TARGET_DIR:-target}/release/rlx"

needed="$(readelf -d "$rlx" | grep NEEDED)"
echo "$needed"
if ! echo "$needed" | grep -q 'libc\.so'; then
    fail "readelf -d $rlx lists no NEEDED libc (is readelf installed?)"
elif echo "$needed" | grep -Eq 'lib(cuda|cudart|cublas|cublasLt|curand|nvrtc)\.so'; then
    fail "$rlx needs a CUDA library to start"
fi

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
score=(score recipes/grpo.rlx --rollouts tests/data/grpo_fixture.jsonl)
if ! "$rlx" "${score[@]}" --device cpu >"$scratch/cpu.out" 2>"$scratch/cpu.err" || [ ! -s "$scratch/cpu.out" ]; then
    cat "$scratch/cpu.err" >&2
    fail "rlx score --device cpu"
fi

# The driver's presence, as the runtime probes it (runtime/src/cuda/nvidia.rs).
if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; then
    echo "check-cuda-build: an NVIDIA driver is installed: rlx score --device cuda must run"
    if ! "$rlx" "${score[@]}" --device cuda >"$scratch/gpu.out" 2>"$scratch/gpu.err"; then
        cat "$scratch/gpu.err" >&2
        fail "rlx score --device cuda on a machine with a driver"
    fi
else
    expect_driver_error() {
        local what="$1"
        shift
        "$@" >"$scratch/out" 2>"$scratch/err"
        local status=$?
        if [ "$status" != 1 ]; then
            fail "$what: exit status $status, expected 1"
        fi
        if ! grep -q 'NVIDIA driver' "$scratch/err"; then
            fail "$what: the error does not name the NVIDIA driver"
        fi
        if grep -q 'panicked' "$scratch/err"; then
            fail "$what: panicked"
        fi
        echo "check-cuda-build: $what -> exit $status: $(head -c 300 "$scratch/err")"
    }
    expect_driver_error "rlx score --device cuda" "$rlx" "${score[@]}" --device cuda
    expect_driver_error "rlx bench --device cuda" "$rlx" bench recipes/grpo.rlx --device cuda:0
    expect_driver_error "rlx run --device cuda" "$rlx" run recipes/grpo.rlx --device cuda \
        --steps 1 --out "$scratch/run"
    if [ -e "$scratch/run" ]; then
        fail "rlx run --device cuda wrote $scratch/run before the error"
    fi
fi

if [ "$failures" != 0 ]; then
    echo "check-cuda-build: $failures check(s) failed" >&2
    exit 1
fi
echo "check-cuda-build: ok"
