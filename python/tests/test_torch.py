"""`Recipe.torch()`: the kernel's loss and gradient against the exported torch module
(`rlxc compile --emit torch`, float64 autograd), on every recipe with a loss; and the stage of the
loss given a trainer's advantages against the module's TRL path."""

import importlib.util
import math
import subprocess

import numpy as np
import pytest

import rlx
from conftest import ROOT, binary, need, recipe_files, rows_to_arrays

LOSS_RECIPES = [p for p in recipe_files() if rlx.Recipe(p).has_loss]


def export(path, tmp_path):
    out = tmp_path / f"rlx_{path.stem}.py"
    done = subprocess.run([binary("rlxc"), "compile", str(path), "--emit", "torch", "-o", str(out)], capture_output=True, text=True)
    if done.returncode != 0:
        return None, done.stderr
    spec = importlib.util.spec_from_file_location(out.stem, out)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, None


def module_batch(torch, recipe, arrays):
    """The same batch in the exported module's layout (padded, response_mask, crit_mask, index)."""
    lengths = arrays["lengths"]
    W = next((a.shape[1] for i in recipe.inputs if i.level == "tok" and i.name in arrays for a in [arrays[i.name]]), int(lengths.max()))
    mask = torch.zeros((len(lengths), W), dtype=torch.bool)
    for r, n in enumerate(lengths):
        mask[r, :n] = True
    batch = {"response_mask": mask, "index": torch.as_tensor(arrays["index"])}
    if "crit_counts" in arrays:
        counts = arrays["crit_counts"]
        groups = list(dict.fromkeys(arrays["index"].tolist()))
        per_response = [counts[groups.index(g)] for g in arrays["index"].tolist()]
        C = max(per_response)
        crit_mask = torch.zeros((len(lengths), C), dtype=torch.bool)
        for r, n in enumerate(per_response):
            crit_mask[r, :n] = True
        batch["crit_mask"] = crit_mask
    for inp in recipe.inputs:
        if inp.name in arrays:
            batch[inp.name] = torch.tensor(arrays[inp.name], dtype=torch.float64)
    return batch


@pytest.mark.parametrize("path", LOSS_RECIPES, ids=lambda p: p.stem)
def test_loss_and_gradient_equal_the_exported_module(path, tmp_path):
    torch = need("torch")
    recipe = rlx.Recipe(path)
    module, why = export(path, tmp_path)
    if module is None:
        pytest.fail(f"the exporter refused {path.name}: {why}")
    rows = recipe.synthetic_rows(groups=3, responses=4, tokens=7, seed=5)
    arrays = rows_to_arrays(recipe, rows, pad=0.0)

    reference = module_batch(torch, recipe, arrays)
    ours = module_batch(torch, recipe, arrays)
    ours.pop("crit_mask", None)
    ours["lengths"] = torch.as_tensor(arrays["lengths"])
    if "crit_counts" in arrays:
        ours["crit_counts"] = torch.as_tensor(arrays["crit_counts"])
    ours.pop("response_mask")
    leaves = [name for name in recipe.policy_inputs if name in reference]
    for name in leaves:
        reference[name].requires_grad_(True)
        ours[name].requires_grad_(True)

    expected_loss, expected_metrics = module.loss(reference)
    expected_loss.backward()
    loss, metrics = recipe.torch()(ours)
    loss.backward()

    assert math.isclose(float(loss), float(expected_loss), rel_tol=1e-6, abs_tol=1e-9)
    assert set(metrics) == set(expected_metrics)
    for name, value in metrics.items():
        assert math.isclose(value, float(expected_metrics[name]), rel_tol=1e-6, abs_tol=1e-9), name
    for name in leaves:
        mask = reference["response_mask"] if reference[name].dim() == 2 and recipe.inputs[[i.name for i in recipe.inputs].index(name)].level == "tok" else None
        got, want = ours[name].grad, reference[name].grad
        assert got is not None and got.shape == ours[name].shape, name
        if mask is not None:
            got, want = got[mask], want[mask]
            assert float(ours[name].grad[~mask].abs().sum()) == 0.0, "padding gets no gradient"
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-9)


def test_float32_packed_tensors_and_a_scaled_backward():
    torch = need("torch")
    recipe = rlx.Recipe(ROOT / "recipes/dapo.rlx")
    rows = recipe.synthetic_rows(groups=4, responses=3, tokens=8, seed=9)
    lengths = [row["length"] for row in rows]
    packed = {
        name: torch.tensor([t for row in rows for t in row[name]], dtype=torch.float32)
        for name in ("logp", "old_logp", "mask")
    }
    packed["logp"].requires_grad_(True)
    batch = dict(packed, score=torch.tensor([row["score"] for row in rows]), index=torch.tensor([row["group"] for row in rows]), lengths=torch.tensor(lengths))
    loss, _ = recipe.torch()(batch)
    (3.0 * loss).backward()
    expected = recipe.score(rows, grad=True)
    want = torch.tensor([g for per in expected["grad"]["logp"] for g in per], dtype=torch.float32)
    assert packed["logp"].grad.dtype == torch.float32
    torch.testing.assert_close(packed["logp"].grad, 3.0 * want, rtol=1e-4, atol=1e-7)
    assert math.isclose(float(loss), expected["loss"], rel_tol=1e-4)


def test_the_default_arithmetic_follows_the_policy_tensors():
    """float32 tensors run the f32 kernel (element-wise f32, sums in f64), float64 ones the f64
    kernel: the same bits as asking for it; an unknown precision is a ValueError."""
    torch = need("torch")
    recipe = rlx.Recipe(ROOT / "recipes/dapo.rlx")
    rows = recipe.synthetic_rows(groups=4, responses=3, tokens=9, seed=3)
    lengths = torch.tensor([row["length"] for row in rows])

    def call(fn, dtype):
        batch = {name: torch.tensor([t for row in rows for t in row[name]], dtype=dtype) for name in ("logp", "old_logp", "mask")}
        batch["logp"].requires_grad_(True)
        batch.update(score=torch.tensor([row["score"] for row in rows]), index=torch.tensor([row["group"] for row in rows]), lengths=lengths)
        loss, metrics = fn(batch)
        loss.backward()
        return loss.detach(), metrics, batch["logp"].grad

    for dtype, name in ((torch.float32, "f32"), (torch.float64, "f64")):
        default = call(recipe.torch(), dtype)
        chosen = call(recipe.torch(accumulate=name), dtype)
        assert default[0].dtype == dtype
        assert torch.equal(default[0], chosen[0]) and default[1] == chosen[1], name
        assert torch.equal(default[2], chosen[2]), name
    f32 = call(recipe.torch(accumulate="f32"), torch.float64)
    f64 = call(recipe.torch(accumulate="f64"), torch.float64)
    assert math.isclose(float(f32[0]), float(f64[0]), rel_tol=1e-5)
    with pytest.raises(ValueError, match="accumulate `f16`"):
        recipe.torch(accumulate="f16")


def test_given_advantage_equals_the_modules_trl_path():
    torch = need("torch")
    import tempfile, pathlib

    path = ROOT / "recipes/dapo.rlx"
    recipe = rlx.Recipe(path)
    with tempfile.TemporaryDirectory() as tmp:
        module, why = export(path, pathlib.Path(tmp))
    assert module is not None, why
    B, T = 6, 5
    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(B, T, generator=g, dtype=torch.float64) - 0.2).requires_grad_(True)
    old = logp.detach() + 0.05 * torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.ones(B, T, dtype=torch.int64)
    mask[1, 3:] = 0
    mask[4, 1:] = 0
    inputs = {"completion_mask": mask, "advantages": torch.randn(B, generator=g, dtype=torch.float64), "old_per_token_logps": old}
    expected, expected_metrics = module.loss(module.trl_batch(inputs, logp))
    expected.backward()
    want = logp.grad.clone()
    logp.grad = None
    from rlx.trl import loss_from_inputs

    loss, metrics = loss_from_inputs(recipe, inputs, logp)
    loss.backward()
    assert math.isclose(float(loss), float(expected), rel_tol=1e-6, abs_tol=1e-12)
    torch.testing.assert_close(logp.grad * mask, want * mask, rtol=1e-6, atol=1e-12)
    for name, value in metrics.items():
        assert math.isclose(value, float(expected_metrics[name]), rel_tol=1e-6, abs_tol=1e-12), name
