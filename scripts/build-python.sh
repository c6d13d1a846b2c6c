#!/usr/bin/env bash
# Build rlx's Python package (python/: the PyO3 extension rlx._rlx and the pure-Python rlx package,
# docs/python.md) as one abi3 wheel for CPython >= 3.9 into target/wheels/ with maturin, and install it
# into the Python of the torch tests (scripts/install-torch.sh's virtual environment, or $RLX_PYTHON),
# which also has maturin. Nothing is uploaded.
#
#   scripts/build-python.sh              # release build, installed
#   scripts/build-python.sh --cuda       # with the CUDA backend for CUDA tensors (the `cuda` feature)
#   scripts/build-python.sh --no-install # build the wheel only
#
# Then: `$PYTHON -m pytest python/tests` (what .ci/run does).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${RLX_PYTHON:-${RLX_TORCH_VENV:-$HOME/.cache/rlx/torch}/bin/python}"
FEATURES=()
INSTALL=1
for argument in "$@"; do
    case "$argument" in
        --cuda) FEATURES=(--features cuda) ;;
        --no-install) INSTALL=0 ;;
        *) echo "usage: $0 [--cuda] [--no-install]" >&2; exit 2 ;;
    esac
done
if ! "$PYTHON" -m maturin --version >/dev/null 2>&1; then
    echo "build-python: $PYTHON has no maturin: run scripts/install-torch.sh (or set RLX_PYTHON)" >&2
    exit 1
fi

start=$(date +%s)
rm -f target/wheels/rlx-*.whl
"$PYTHON" -m maturin build --release --manifest-path python/Cargo.toml --out target/wheels \
    --interpreter "$PYTHON" "${FEATURES[@]}"
wheel=$(ls target/wheels/rlx-*.whl)
echo "build-python: built $wheel in $(( $(date +%s) - start )) s"
if [ "$INSTALL" = 1 ]; then
    "$PYTHON" -m pip install --disable-pip-version-check --quiet --force-reinstall --no-deps "$wheel"
    echo "build-python: installed into $PYTHON"
fi
