#!/usr/bin/env bash
# The set-up half of the README's test command, `scripts/test-setup.sh && cargo test --workspace`:
# installs what the gated tests need.
#
# The installs are the three pinned, idempotent scripts, run in parallel: scripts/fetch-assets.sh (the
# real-model assets, about 197 MB), scripts/install-cuda-tools.sh (NVRTC and ptxas, about 130 MB) and
# scripts/install-torch.sh --with-verl (CPU torch and verl's loss registry, about 2.8 GB); each is a
# no-op when what it installs is present. An install that fails (no network) only warns: the tests that
# need it are then reported by `cargo test` as `ignored, needs …` (the build-time probe of
# tools/src/lib.rs), never as passed. RLX_NO_INSTALL=1 skips the installs (offline, or to prove that
# the suite passes without the tools); RLX_REQUIRE_TOOLS=1 (CI) makes every test that needs a missing
# tool run and fail instead.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${RLX_NO_INSTALL:-0}" != 1 ]; then
    logs="$(mktemp -d)"
    installs=(
        "fetch-assets.sh"
        "install-cuda-tools.sh"
        "install-torch.sh --with-verl"
    )
    pids=()
    for install in "${installs[@]}"; do
        # shellcheck disable=SC2086
        bash scripts/$install >"$logs/${install%% *}.log" 2>&1 &
        pids+=("$!")
    done
    for i in "${!installs[@]}"; do
        log="$logs/${installs[$i]%% *}.log"
        if wait "${pids[$i]}"; then
            grep -E '^(fetch-assets|install-torch|install-cuda-tools):' "$log" | tail -n 3
        else
            cat "$log"
            echo "test: WARNING: scripts/${installs[$i]} failed; the tests that need it will be reported as ignored" >&2
        fi
    done
    rm -rf "$logs"
fi

