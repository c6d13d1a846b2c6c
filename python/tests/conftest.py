"""Shared pieces of the Python binding's tests (python/tests, run by .ci/run after
scripts/build-python.sh installs the wheel into the torch environment).

Tests that need torch, verl or TRL import them through `need`: where the module is missing they are
skipped, except under RLX_REQUIRE_TOOLS=1 (CI), where the import error fails the test."""

import importlib
import json
import os
import pathlib
import subprocess

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def need(module):
    try:
        return importlib.import_module(module)
    except ImportError:
        if os.environ.get("RLX_REQUIRE_TOOLS") == "1":
            raise
        pytest.skip(f"needs {module}: run scripts/install-torch.sh")


def recipe_files():
    files = sorted((ROOT / "recipes").glob("*.rlx")) + sorted((ROOT / "tests" / "gradients").glob("*.rlx"))
    assert len(files) > 30, f"only {len(files)} recipes found under {ROOT}"
    return files


def binary(name):
    """The `rlx`/`rlxc` binary: $RLX_BIN_DIR, else target/debug or target/release (built by `cargo
    test` or `cargo build`); a test that needs it fails without it."""
    candidates = [pathlib.Path(os.environ["RLX_BIN_DIR"]) / name] if os.environ.get("RLX_BIN_DIR") else []
    candidates += [ROOT / "target" / "debug" / name, ROOT / "target" / "release" / name]
    for path in candidates:
        if path.is_file():
            return str(path)
    raise AssertionError(f"no {name} binary in {[str(c) for c in candidates]}: run `cargo build --bin {name}`")


def rlx_score(recipe_path, rows, tmp_path, *extra):
    """`rlx score RECIPE --rollouts FILE --grad`'s document for `rows`."""
    rollouts = tmp_path / "rows.jsonl"
    rollouts.write_text("".join(json.dumps(row) + "\n" for row in rows))
    done = subprocess.run(
        [binary("rlx"), "score", str(recipe_path), "--rollouts", str(rollouts), "--grad", *extra],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def rows_to_arrays(recipe, rows, pad=np.nan):
    """The rows as `score(**arrays)` takes them: padded [R, W] token arrays with `lengths`, per-response
    values, group-level values repeated per response, crit inputs [R, C] with `crit_counts`, pair inputs
    [R, R]; padding filled with `pad` (NaN: it must never be read)."""
    R = len(rows)
    lengths = [row["length"] for row in rows]
    W = max(lengths + [1])
    groups = [row["group"] for row in rows]
    arrays = {"index": np.asarray(groups), "lengths": np.asarray(lengths)}
    crit_inputs = [i for i in recipe.inputs if i.feature == "crit" and i.name in rows[0]]
    if crit_inputs:
        first = {}
        for row in rows:
            first.setdefault(row["group"], row)
        arrays["crit_counts"] = np.asarray([len(first[g][crit_inputs[0].name]) for g in first])
    C = max([len(row[i.name]) for row in rows for i in crit_inputs] + [0])
    for inp in recipe.inputs:
        if inp.name not in rows[0]:
            continue
        values = [row[inp.name] for row in rows]
        if inp.level == "tok":
            array = np.full((R, W), pad)
            for r, v in enumerate(values):
                array[r, : len(v)] = v
        elif inp.feature == "crit":
            array = np.full((R, C), pad)
            for r, v in enumerate(values):
                array[r, : len(v)] = v
        elif inp.level == "pair":
            # The [R, R] form: element [r, k] for each other response k of r's group (in order); the
            # rest is padding.
            array = np.full((R, R), pad)
            for r, v in enumerate(values):
                others = [k for k in range(R) if groups[k] == groups[r] and k != r]
                array[r, others] = v
        elif inp.level == "batch":
            array = np.asarray(values[0], dtype=np.float64)
        else:
            array = np.asarray(values, dtype=np.float64)
        arrays[inp.name] = array
    return arrays
