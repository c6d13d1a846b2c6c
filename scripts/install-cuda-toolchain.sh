#!/usr/bin/env bash
# The CUDA 13.2 toolkit from PyPI, for `cargo build --release --features cuda` (candle's CUDA backend:
# candle-kernels compiles its kernels with nvcc at build time) and for running that build on a GPU
# (cuBLAS, cuRAND and NVRTC, which cudarc loads at run time). No GPU and no driver are needed to build.
#
# The wheels are fetched with `pip download --no-deps` (nothing is installed into any Python), their
# sha256 checked against the hashes pinned below, and unpacked into $RLX_CUDA_TOOLKIT, by default
# ~/.cache/rlx/cuda13 (outside the repository, shared by every checkout). The toolkit root is
# $RLX_CUDA_TOOLKIT/nvidia/cu13:
#   bin/nvcc, ptxas, fatbinary, nvlink, cudafe++   nvcc          (nvidia-cuda-nvcc)
#   nvvm/bin/cicc, nvvm/lib64/libnvvm.so           the NVVM back end (nvidia-nvvm)
#   include/ (crt/, cuda_fp16.h, cuda_bf16.h, cccl) headers       (nvidia-cuda-crt, -runtime, -cccl)
#   lib/libcudart_static.a, libcudart.so.13        the runtime   (nvidia-cuda-runtime)
#   lib/libcublas.so.13, libcublasLt.so.13         cuBLAS        (nvidia-cublas)
#   lib/libcurand.so.10                            cuRAND        (nvidia-curand)
#   lib/libnvrtc.so.13                             NVRTC         (nvidia-cuda-nvrtc)
# plus unversioned links for `-l` (libcublas.so, libcublasLt.so, libcurand.so, libnvrtc.so) and
# lib/libcudart.a -> libcudart_static.a (and deliberately no libcudart.so): candle-kernels asks the
# linker for `-lcudart`, which then links the runtime statically, so an `rlx` built with the feature
# needs no CUDA library to start (docs/gpu.md, "Building").
#
# Then it points the checkout at that root: <repo>/.cuda -> $RLX_CUDA_TOOLKIT/nvidia/cu13 (git-ignored),
# which .cargo/config.toml hands to the build (NVCC) and build.rs to the linker; so after this script a
# plain `cargo build --release --features cuda` needs no environment variable.
#
# About 660 MB downloaded (cuBLAS alone is 403 MB), 1.4 GB unpacked. Idempotent: a no-op when the
# pinned set is already unpacked (it only refreshes the .cuda link). Exit status 1 when a download fails,
# does not match its pinned hash or cannot be unpacked.
set -uo pipefail
cd "$(dirname "$0")/.."

DIR="${RLX_CUDA_TOOLKIT:-$HOME/.cache/rlx/cuda13}"
ROOT="$DIR/nvidia/cu13"
# CUDA 13.2 update 2 (13.2.86); cuBLAS and cuRAND of the 13.x line, compatible within the major version.
# cudarc's `cuda-13020` feature (runtime/Cargo.toml) matches it.
WHEELS=(
    "nvidia-cuda-nvcc==13.2.86 nvidia_cuda_nvcc-13.2.86-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl 7d3f56c8d705bad35bbba69eb0470d90856fd5d4dc48c6a6173aaf1e9f887cf5"
    "nvidia-nvvm==13.2.86 nvidia_nvvm-13.2.86-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl a9244f3209922d655612c11ebb4117ea1f80983cb2b215c9cccded127282cebc"
    "nvidia-cuda-crt==13.2.86 nvidia_cuda_crt-13.2.86-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl e3ab08801bf9b1e6dc979275d25e816bb5000521b648e19c324d5eef0c79f1da"
    "nvidia-cuda-runtime==13.2.86 nvidia_cuda_runtime-13.2.86-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl 3498247680dfddce31bad102af7e3e26fc795342a3cac64722bb0fa95e7f60f0"
    "nvidia-cuda-cccl==13.2.86 nvidia_cuda_cccl-13.2.86-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl 35da671cf0cecd3539da214a11bb8e7634366c9e950da9c5feecf6c490a65b20"
    "nvidia-cuda-nvrtc==13.2.86 nvidia_cuda_nvrtc-13.2.86-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl 8111c5130e967b78222ea2124145f8efe9ce201b752b2579a2513100a53be1c5"
    "nvidia-cublas==13.3.0.5 nvidia_cublas-13.3.0.5-py3-none-manylinux_2_27_x86_64.whl 366568e2dc59e6fe71ffd179f9f2a38b8b2772aed626320a64008651b1e72974"
    "nvidia-curand==10.4.2.51 nvidia_curand-10.4.2.51-py3-none-manylinux_2_27_x86_64.whl 687676887a3b26dbca19c9ff712502045bb0ed42d7fe223a6f4e7ace26854ae2"
)
# What the unpacked set records, so that a change of the pins reinstalls.
STAMP="$DIR/installed"
stamp_text="$(printf '%s\n' "${WHEELS[@]}")"

link_checkout() {
    # A real directory or file named .cuda is the user's: leave it alone.
    if [ -e .cuda ] && [ ! -L .cuda ]; then
        echo "install-cuda-toolchain: .cuda exists and is not a link; not replacing it" >&2
        return 1
    fi
    ln -sfn "$ROOT" .cuda
    echo "install-cuda-toolchain: .cuda -> $ROOT"
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$stamp_text" ] && [ -x "$ROOT/bin/nvcc" ]; then
    echo "install-cuda-toolchain: CUDA 13.2 already present in $DIR"
    link_checkout || exit 1
    exit 0
fi
if [ "$(uname -m)" != "x86_64" ] || [ "$(uname -s)" != "Linux" ]; then
    echo "install-cuda-toolchain: the pinned wheels are for Linux x86_64" >&2
    exit 1
fi

PYTHON="${PYTHON:-python3}"
download="$(mktemp -d)"
trap 'rm -rf "$download"' EXIT
start=$(date +%s)
requirements=()
for entry in "${WHEELS[@]}"; do
    read -r requirement _ _ <<<"$entry"
    requirements+=("$requirement")
done
echo "install-cuda-toolchain: downloading ${requirements[*]} (about 660 MB)"
fetched=0
for attempt in 1 2; do
    if "$PYTHON" -m pip download --no-deps --only-binary=:all: --disable-pip-version-check \
        --progress-bar off --python-version 3 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64 \
        -d "$download" "${requirements[@]}"; then
        fetched=1
        break
    fi
    echo "install-cuda-toolchain: pip download failed (attempt $attempt)" >&2
    sleep 5
done
if [ "$fetched" != 1 ]; then
    echo "install-cuda-toolchain: the wheels could not be downloaded from PyPI" >&2
    exit 1
fi
downloaded=$(( $(date +%s) - start ))

bytes=0
wheels=()
for entry in "${WHEELS[@]}"; do
    read -r _ file expected <<<"$entry"
    if [ ! -f "$download/$file" ]; then
        echo "install-cuda-toolchain: pip did not produce $file" >&2
        exit 1
    fi
    actual="$(sha256sum "$download/$file" | cut -d' ' -f1)"
    if [ "$actual" != "$expected" ]; then
        echo "install-cuda-toolchain: $file has sha256 $actual, expected $expected" >&2
        exit 1
    fi
    bytes=$(( bytes + $(stat -c %s "$download/$file") ))
    wheels+=("$download/$file")
done

# A wheel is a zip file; unpack the toolkit tree (nvidia/cu13/...) of each into a fresh folder, then
# swap it in, so that an interrupted run never leaves a half toolkit behind the stamp.
rm -rf "$DIR.partial"
mkdir -p "$DIR.partial"
"$PYTHON" - "$DIR.partial" "${wheels[@]}" <<'EOF' || { echo "install-cuda-toolchain: cannot unpack the wheels" >&2; exit 1; }
import sys, zipfile
target, *wheels = sys.argv[1:]
for wheel in wheels:
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.startswith("nvidia/cu13/"):
                archive.extract(name, target)
EOF
root="$DIR.partial/nvidia/cu13"
chmod +x "$root"/bin/* "$root"/nvvm/bin/*
(
    cd "$root/lib" || exit 1
    for lib in libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libnvrtc.so.13; do
        ln -sfn "$lib" "${lib%.so.*}.so"
    done
    ln -sfn libcudart_static.a libcudart.a
) || { echo "install-cuda-toolchain: cannot link the libraries" >&2; exit 1; }
if ! "$root/bin/nvcc" --version >/dev/null 2>&1; then
    echo "install-cuda-toolchain: the unpacked nvcc does not run" >&2
    exit 1
fi
printf '%s\n' "$stamp_text" >"$DIR.partial/installed"
rm -rf "$DIR"
mv "$DIR.partial" "$DIR"
link_checkout || exit 1
echo "install-cuda-toolchain: installed CUDA 13.2 in $DIR ($(( bytes / 1000000 )) MB downloaded in ${downloaded} s, $(( $(date +%s) - start )) s in all)"
echo "install-cuda-toolchain: $("$ROOT/bin/nvcc" --version | tail -2 | head -1)"
