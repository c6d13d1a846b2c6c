"""`Recipe.score` against `rlx score` on every recipe, and the array form against the rows form."""

import json
import math

import numpy as np
import pytest

import rlx
from conftest import ROOT, recipe_files, rlx_score, rows_to_arrays

RECIPES = recipe_files()


def close(a, b, path="document"):
    """Documents equal up to 1e-9 relative (the array path reads the same f64 values)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{path}: keys {sorted(a)} vs {sorted(b)}"
        for key in a:
            close(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{path}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b)):
            close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12), f"{path}: {a} vs {b}"
    else:
        assert a == b, f"{path}: {a!r} vs {b!r}"


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_score_rows_is_rlx_score(path, tmp_path):
    recipe = rlx.Recipe(path)
    rows = recipe.synthetic_rows(groups=3, responses=4, tokens=6, seed=7)
    expected = rlx_score(path, rows, tmp_path)
    assert recipe.score(rows, grad=True) == expected


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_score_arrays_is_score_rows(path):
    recipe = rlx.Recipe(path)
    rows = recipe.synthetic_rows(groups=3, responses=4, tokens=6, seed=11)
    from_rows = recipe.score(rows, grad=True)
    from_arrays = recipe.score(grad=True, **rows_to_arrays(recipe, rows))
    close(from_rows, from_arrays)


def test_the_worked_example_of_docs_formats():
    """docs/formats.md's GRPO fixture: the verl reference values."""
    rows = [json.loads(line) for line in (ROOT / "tests/data/grpo_fixture.jsonl").read_text().splitlines() if line]
    document = rlx.Recipe(ROOT / "recipes/grpo.rlx").score(rows, grad=True)
    assert math.isclose(document["loss"], -0.0767742, abs_tol=1e-7)
    assert [round(r["advantage"], 6) for r in document["responses"][:4]] == [0.866024, -0.866024, -0.866024, 0.866024]
    assert math.isclose(document["grad"]["logp"][0][0], -0.0333336, abs_tol=1e-7)


def test_params_set_and_shown():
    recipe = rlx.Recipe(ROOT / "recipes/grpo.rlx", beta=0.5)
    assert recipe.params["beta"] == 0.5
    default = dict((p.name, p.default) for p in recipe.param_info)["beta"]
    assert default == 0.001
    rows = recipe.synthetic_rows(seed=3)
    a = recipe.score(rows)["loss"]
    b = rlx.Recipe(ROOT / "recipes/grpo.rlx").score(rows)["loss"]
    assert a != b
    shown = recipe.score(rows, show=["logp"])["show"]["logp"]
    assert shown == [row["logp"] for row in rows]


def test_inputs_describe_the_recipe():
    recipe = rlx.Recipe(ROOT / "recipes/darling.rlx")
    by_name = {i.name: i for i in recipe.inputs}
    assert by_name["logp"].type == "f32[tok]" and by_name["logp"].differentiable
    assert by_name["cluster"].type == "i32[resp]" and not by_name["cluster"].differentiable
    assert recipe.policy_inputs == ("logp",)


def test_source_text_and_artifact(tmp_path):
    text = (ROOT / "recipes/grpo.rlx").read_text()
    from_text = rlx.Recipe(text, name="grpo")
    rows = from_text.synthetic_rows(seed=5)
    artifact = tmp_path / "grpo.rlxc"
    import subprocess
    from conftest import binary

    done = subprocess.run([binary("rlxc"), "compile", str(ROOT / "recipes/grpo.rlx"), "-o", str(artifact)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert rlx.Recipe(artifact).score(rows, grad=True) == from_text.score(rows, grad=True)


def test_interp_and_jit_agree():
    recipe = rlx.Recipe(ROOT / "recipes/dapo.rlx")
    rows = recipe.synthetic_rows(groups=4, responses=5, tokens=9, seed=2)
    close(recipe.score(rows, backend="interp"), recipe.score(rows, backend="jit"))
