#!/usr/bin/env bash
# Fetch NVIDIA's runtime compiler (libnvrtc.so.12) and PTX assembler (ptxas) from PyPI for the CUDA
# checks that run on every machine, GPU or not (tests/cuda.rs, docs/gpu.md): every recipe's generated
# CUDA C is compiled to PTX with NVRTC for compute_80 and compute_90 and assembled with ptxas for sm_90.
#
# The wheels are fetched with `pip download --no-deps` (nothing is installed into any Python), their
# sha256 checked against the hashes pinned below, and unpacked into $RLX_CUDA_TOOLS, by default
# ~/.cache/rlx/cuda (outside the repository):
#   $RLX_CUDA_TOOLS/nvidia/cuda_nvrtc/lib/libnvrtc.so.12   (+ libnvrtc-builtins)
#   $RLX_CUDA_TOOLS/nvidia/cuda_nvcc/bin/ptxas
# About 130 MB downloaded (nvrtc 89.6 MB, nvcc 40.5 MB); measured at about 5 s on the development
# machine, plus a few seconds to unpack.
#
# Idempotent: a no-op when both tools are present. Exit status 0 when PyPI cannot be reached (cargo test
# then reports the checks as ignored); 1 when a download does not match its pinned hash or cannot be unpacked.
set -uo pipefail

DIR="${RLX_CUDA_TOOLS:-$HOME/.cache/rlx/cuda}"
VERSION="12.9.86"
NVRTC_WHEEL="nvidia_cuda_nvrtc_cu12-${VERSION}-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl"
NVRTC_SHA256="210cf05005a447e29214e9ce50851e83fc5f4358df8b453155d5e1918094dcb4"
NVCC_WHEEL="nvidia_cuda_nvcc_cu12-${VERSION}-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl"
NVCC_SHA256="5d6a0d32fdc7ea39917c20065614ae93add6f577d840233237ff08e9a38f58f0"

NVRTC="$DIR/nvidia/cuda_nvrtc/lib/libnvrtc.so.12"
PTXAS="$DIR/nvidia/cuda_nvcc/bin/ptxas"

if [ -f "$NVRTC" ] && [ -x "$PTXAS" ]; then
    echo "install-cuda-tools: already present in $DIR (nvrtc and ptxas $VERSION)"
    exit 0
fi
if [ "$(uname -m)" != "x86_64" ] || [ "$(uname -s)" != "Linux" ]; then
    echo "install-cuda-tools: WARNING: the pinned wheels are for Linux x86_64; the NVRTC checks will be reported as ignored" >&2
    exit 0
fi

PYTHON="${PYTHON:-python3}"
mkdir -p "$DIR"
download="$(mktemp -d)"
trap 'rm -rf "$download"' EXIT
start=$(date +%s)
echo "install-cuda-tools: downloading nvidia-cuda-nvrtc-cu12==$VERSION and nvidia-cuda-nvcc-cu12==$VERSION (about 130 MB)"
fetched=0
for attempt in 1 2; do
    if "$PYTHON" -m pip download --no-deps --only-binary=:all: --disable-pip-version-check \
        --progress-bar off --platform manylinux_2_12_x86_64 --python-version 3 -d "$download" \
        "nvidia-cuda-nvrtc-cu12==$VERSION" "nvidia-cuda-nvcc-cu12==$VERSION"; then
        fetched=1
        break
    fi
    echo "install-cuda-tools: pip download failed (attempt $attempt)" >&2
    sleep 5
done
if [ "$fetched" != 1 ]; then
    echo "install-cuda-tools: WARNING: the wheels could not be downloaded; the NVRTC checks will be reported as ignored" >&2
    exit 0
fi
downloaded=$(( $(date +%s) - start ))

verify() {
    local file="$download/$1" expected="$2" actual
    if [ ! -f "$file" ]; then
        echo "install-cuda-tools: pip did not produce $1" >&2
        return 1
    fi
    actual="$(sha256sum "$file" | cut -d' ' -f1)"
    if [ "$actual" != "$expected" ]; then
        echo "install-cuda-tools: $1 has sha256 $actual, expected $expected" >&2
        return 1
    fi
}
verify "$NVRTC_WHEEL" "$NVRTC_SHA256" || exit 1
verify "$NVCC_WHEEL" "$NVCC_SHA256" || exit 1
bytes=$(( $(stat -c %s "$download/$NVRTC_WHEEL") + $(stat -c %s "$download/$NVCC_WHEEL") ))

# A wheel is a zip file; unpack only what the checks use.
"$PYTHON" - "$download/$NVRTC_WHEEL" "$download/$NVCC_WHEEL" "$DIR" <<'EOF' || { echo "install-cuda-tools: cannot unpack the wheels" >&2; exit 1; }
import sys, zipfile
*wheels, target = sys.argv[1:]
wanted = ("nvidia/cuda_nvrtc/lib/", "nvidia/cuda_nvcc/bin/ptxas")
for wheel in wheels:
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.startswith(wanted):
                archive.extract(name, target)
EOF
chmod +x "$PTXAS"
if [ ! -f "$NVRTC" ] || [ ! -x "$PTXAS" ]; then
    echo "install-cuda-tools: the wheels did not contain $NVRTC and $PTXAS" >&2
    exit 1
fi
echo "install-cuda-tools: installed nvrtc and ptxas $VERSION in $DIR ($(( bytes / 1000000 )) MB downloaded in ${downloaded} s, $(( $(date +%s) - start )) s in all)"
echo "install-cuda-tools: RLX_CUDA_TOOLS=$DIR"
