#!/usr/bin/env bash
# Install CPU-capable PyTorch, transformers and PEFT (and, with --with-verl, verl's loss registry) for
# the torch export tests (tests/export.rs) and the Hugging Face checkpoint tests (trainer/tests/hf.rs),
# plus tensorboard (the independent reader of the trainer's event files, trainer/tests/tensorboard.rs)
# and pyarrow (the Parquet files of the prompts-file tests) into a virtual environment of its own: $RLX_TORCH_VENV, by default ~/.cache/rlx/torch (outside the
# repository, so a later clone on the same machine reuses it). The tests use $RLX_PYTHON, else that
# environment's python (tools/src/lib.rs).
#
# PyPI has no CPU-only torch for Linux x86_64: `pip install torch` pulls the CUDA build and its NVIDIA
# libraries (about 2.8 GB downloaded, 5.3 GB installed; measured at about 3.5 minutes on a CI machine:
# 80 s download, 115 s install). Without them `import torch` fails (libtorch_cuda.so needs them), so
# there is no smaller install from PyPI; the CUDA code is simply unused on a machine without a GPU.
# CPU-only wheels exist only on PyTorch's own index, which this project's machines cannot reach.
#
# --with-verl adds verl (pinned, without its dependencies: Ray clusters, vLLM and friends are not needed)
# and the few packages `verl.trainer.ppo.core_algos` imports, so that the registry test runs: about
# 1 minute more.
#
# Idempotent: does nothing when the packages already import. Exit status 0 even when PyPI cannot be
# reached (cargo test then reports the tests as ignored); 1 on a real installation error.
set -uo pipefail

VENV="${RLX_TORCH_VENV:-$HOME/.cache/rlx/torch}"
TRANSFORMERS=5.24.0
PEFT=0.18.1
TENSORBOARD=2.21.0
PYARROW=26.0.1
# The Python binding's build and tests (scripts/build-python.sh, python/tests, docs/python.md): maturin
# builds the wheel, pytest runs the suite, TRL is the reference of its TRL adapter.
MATURIN=1.16.0
PYTEST=9.2.0
TRL=1.16.0
WITH_VERL=0
for argument in "$@"; do
    case "$argument" in
        --with-verl) WITH_VERL=1 ;;
        *) echo "usage: $0 [--with-verl]" >&2; exit 2 ;;
    esac
done

if [ ! -x "$VENV/bin/python" ]; then
    mkdir -p "$(dirname "$VENV")"
    python3 -m venv "$VENV" || { echo "install-torch: cannot create a virtual environment at $VENV" >&2; exit 1; }
fi
PYTHON="$VENV/bin/python"

imports() { "$PYTHON" -c "import $1" >/dev/null 2>&1; }

pip_install() {
    local attempt
    for attempt in 1 2; do
        if "$PYTHON" -m pip install --disable-pip-version-check --progress-bar off "$@"; then
            return 0
        fi
        echo "install-torch: pip install $* failed (attempt $attempt)" >&2
        sleep 5
    done
    return 1
}

start=$(date +%s)
if imports torch; then
    echo "install-torch: torch $("$PYTHON" -c 'import torch; print(torch.__version__)') is already installed"
else
    echo "install-torch: installing torch from PyPI into $VENV (about 2.8 GB)"
    if ! pip_install "torch>=2.1"; then
        echo "install-torch: WARNING: torch could not be installed; the torch export tests will be reported as ignored" >&2
        exit 0
    fi
    imports torch || { echo "install-torch: torch installed but does not import" >&2; exit 1; }
    echo "install-torch: torch $("$PYTHON" -c 'import torch; print(torch.__version__)') installed in $(( $(date +%s) - start )) s"
fi

# transformers and PEFT: the reference of the Hugging Face checkpoint tests (trainer/tests/hf.rs), pinned.
if imports peft && imports transformers \
    && [ "$("$PYTHON" -c 'import transformers; print(transformers.__version__)')" = "$TRANSFORMERS" ]; then
    echo "install-torch: transformers $TRANSFORMERS and peft are already installed"
else
    hf_start=$(date +%s)
    if pip_install "transformers==$TRANSFORMERS" "peft==$PEFT" safetensors; then
        echo "install-torch: transformers $TRANSFORMERS and peft $PEFT installed in $(( $(date +%s) - hf_start )) s"
    else
        echo "install-torch: WARNING: transformers/peft could not be installed; the Hugging Face checkpoint tests will be reported as ignored" >&2
    fi
fi

# tensorboard, pyarrow, maturin, pytest and TRL, pinned: each installed only where it does not already import.
for pinned in "tensorboard==$TENSORBOARD" "pyarrow==$PYARROW" "maturin==$MATURIN" "pytest==$PYTEST" "trl==$TRL"; do
    module="${pinned%%==*}"
    if imports "$module"; then
        echo "install-torch: $module $("$PYTHON" -c "import importlib.metadata as m; print(m.version('$module'))") is already installed"
    else
        extra_start=$(date +%s)
        if pip_install "$pinned"; then
            echo "install-torch: $pinned installed in $(( $(date +%s) - extra_start )) s"
        else
            echo "install-torch: WARNING: $pinned could not be installed; the tests that read back with it will fail" >&2
        fi
    fi
done

if [ "$WITH_VERL" = 1 ]; then
    if imports verl.trainer.ppo.core_algos; then
        echo "install-torch: verl's core_algos already imports"
    else
        verl_start=$(date +%s)
        # verl's own dependency list pins a whole training stack; core_algos needs only these.
        if pip_install --no-deps "verl==0.9.1" \
            && pip_install numpy omegaconf packaging ray tensordict transformers codetiming orjson; then
            if imports verl.trainer.ppo.core_algos; then
                echo "install-torch: verl installed in $(( $(date +%s) - verl_start )) s"
            else
                echo "install-torch: WARNING: verl installed but core_algos does not import; the registry test will be reported as ignored" >&2
            fi
        else
            echo "install-torch: WARNING: verl could not be installed; the registry test will be reported as ignored" >&2
        fi
    fi
fi

echo "install-torch: RLX_PYTHON=$PYTHON"
