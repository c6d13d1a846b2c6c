"""Malformed recipes and data raise Python exceptions that name the input (or row) and the element;
nothing crashes the interpreter."""

import math

import numpy as np
import pytest

import rlx
from conftest import ROOT, need, rows_to_arrays

DAPO = ROOT / "recipes/dapo.rlx"


def dapo_arrays(**changes):
    recipe = rlx.Recipe(DAPO)
    rows = recipe.synthetic_rows(groups=2, responses=3, tokens=4, seed=4, ragged=False)
    arrays = rows_to_arrays(recipe, rows)
    arrays.update(changes)
    return recipe, arrays


def test_a_recipe_that_does_not_check():
    with pytest.raises(rlx.RecipeError) as caught:
        rlx.Recipe("input logp : f32[tok] policy\nloss = mean(logp over resp)\n", name="bad.rlx")
    error = caught.value
    assert "×" in str(error) and "bad.rlx" in str(error)
    assert error.diagnostics and error.diagnostics[0]["severity"] == "error"
    assert {"code", "message", "labels", "help"} <= set(error.diagnostics[0])
    label = error.diagnostics[0]["labels"][0]
    assert label["line"] >= 1 and label["end"] > label["start"]
    with pytest.raises(rlx.RecipeError):
        rlx.check("input x : f32[resp]\nreward = y\n")
    assert rlx.check(DAPO) == []


def test_missing_file_and_unknown_param():
    with pytest.raises(FileNotFoundError):
        rlx.Recipe("no/such/recipe.rlx")
    with pytest.raises(ValueError, match="unknown param `betta`"):
        rlx.Recipe(ROOT / "recipes/grpo.rlx", betta=0.1)


def test_a_non_finite_value_names_the_input_and_element():
    logp = dapo_arrays()[1]["logp"].copy()
    logp[1, 2] = np.nan
    recipe, arrays = dapo_arrays(logp=logp)
    with pytest.raises(rlx.InputError) as caught:
        recipe.score(**arrays)
    assert caught.value.key == "logp" and "[1, 2]" in str(caught.value) and "NaN: not finite" in str(caught.value)


def test_padding_is_never_read():
    recipe, arrays = dapo_arrays()
    arrays["lengths"] = np.array([4, 2, 4, 3, 4, 1])
    logp = arrays["logp"].copy()
    logp[1, 2:] = np.inf  # padding of response 1
    arrays["logp"] = logp
    assert math.isfinite(recipe.score(**arrays)["loss"])


def test_rows_errors_name_the_row_and_key():
    recipe = rlx.Recipe(DAPO)
    rows = recipe.synthetic_rows(seed=2)
    rows[2]["score"] = float("nan")
    with pytest.raises(rlx.InputError) as caught:
        recipe.score(rows)
    assert caught.value.row == 2 and caught.value.key == "score" and "rows[2]" in str(caught.value)
    with pytest.raises(rlx.InputError, match=r"rows\[1\]"):
        recipe.score([rows[0], "not a dict"])
    del rows[2]["score"]
    with pytest.raises(rlx.InputError, match="missing key"):
        recipe.score(rows)


@pytest.mark.parametrize(
    "change, key, message",
    [
        (dict(logp=np.zeros((6, 3))), "old_logp", "one width"),
        (dict(score=np.zeros(5)), "score", "shape [5]"),
        (dict(score=np.zeros(6, dtype=np.complex128)), "score", "not a number type"),
        (dict(score=np.array(["a"] * 6)), "score", "not a number type"),
        (dict(index=np.array([0, 1, 0, 1, 0, 1])), "index", "adjacent"),
        (dict(lengths=np.array([4, 4, 4, 4, 4, 5])), "lengths", "more than the 4 columns"),
        (dict(lengths=np.array([4, 4, 4, 4, 4, -1])), "lengths", "not a whole number"),
        (dict(nonsense=np.zeros(6)), "nonsense", "no input of that name"),
        (dict(index=None, group_sizes=np.array([2**40, 2**40])), "group_sizes", "not a whole number from 0 to"),
        (dict(index=None, group_sizes=np.array([2**25, 2**25, 2**25])), "group_sizes", "more than the 67108864"),
    ],
)
def test_malformed_arrays_raise(change, key, message):
    recipe, arrays = dapo_arrays(**change)
    with pytest.raises(rlx.InputError) as caught:
        recipe.score(**arrays)
    assert caught.value.key == key and message in str(caught.value), str(caught.value)


def test_missing_inputs_and_layout():
    recipe, arrays = dapo_arrays()
    del arrays["score"]
    with pytest.raises(rlx.InputError, match="`score`: missing"):
        recipe.score(**arrays)
    recipe, arrays = dapo_arrays()
    del arrays["index"]
    with pytest.raises(rlx.InputError, match="index"):
        recipe.score(**arrays)
    recipe, arrays = dapo_arrays()
    del arrays["lengths"]
    for name in ("logp", "old_logp", "mask"):
        arrays[name] = np.nan_to_num(arrays[name]).reshape(-1)
    with pytest.raises(rlx.InputError, match="packed"):
        recipe.score(**arrays)


def test_element_types():
    recipe = rlx.Recipe(ROOT / "recipes/darling.rlx")
    rows = recipe.synthetic_rows(seed=3)
    arrays = rows_to_arrays(recipe, rows)
    arrays["cluster"] = arrays["cluster"] + 0.5
    with pytest.raises(rlx.InputError, match="not a whole number"):
        recipe.score(**arrays)
    mask = np.ones((2, 3))
    mask[0, 1] = 0
    recipe, arrays = dapo_arrays()
    arrays.pop("lengths")
    arrays["response_mask"] = np.ones((6, 4))
    arrays["response_mask"][0, 1] = 0
    with pytest.raises(rlx.InputError, match="1 after a 0"):
        recipe.score(**arrays)


def test_an_evaluation_without_finite_result():
    recipe = rlx.Recipe("input score : f32[resp]\nreward = log(score)\nadvantage = reward\n", name="log.rlx")
    with pytest.raises(rlx.ScoreError, match="the reward of response 0 .* is -inf"):
        recipe.score(score=np.zeros(3), group_sizes=np.array([3]))


def test_torch_errors():
    torch = need("torch")
    recipe, arrays = dapo_arrays()
    f = recipe.torch()
    batch = {k: torch.as_tensor(v) for k, v in arrays.items()}
    batch["logp"] = batch["logp"].to(torch.int64)
    with pytest.raises(rlx.InputError, match="policy input"):
        f(batch)
    batch = {k: torch.as_tensor(v) for k, v in arrays.items()}
    batch["score"] = torch.zeros(6, device="meta")
    with pytest.raises(rlx.InputError, match="one device"):
        f(batch)
    batch = {k: torch.as_tensor(v) for k, v in arrays.items()}
    batch["logp"] = batch["logp"].clone()
    batch["logp"][0, 0] = float("inf")
    with pytest.raises(rlx.InputError, match=r"`logp`.*\[0, 0\]"):
        f(batch)
    with pytest.raises(rlx.InputError, match="no input of that name"):
        f(batch, logpp=batch["logp"])


def test_cuda_without_the_feature_is_a_clear_error():
    recipe = rlx.Recipe(DAPO)
    rows = recipe.synthetic_rows(seed=1)
    if rlx.has_cuda():
        pytest.fail("this test expects a build without the cuda feature")
    with pytest.raises(RuntimeError, match="built without CUDA"):
        recipe.score(rows, backend="cuda:0")


def test_cuda_tensors_without_the_feature_raise_before_any_copy():
    torch = need("torch")
    if rlx.has_cuda():
        pytest.fail("this test expects a build without the cuda feature")

    class OnCuda(torch.Tensor):
        """A tensor that says it is on cuda:0 (this torch may have no CUDA) and refuses to be read
        or copied: the binding's path for a CUDA tensor, up to its first copy."""

        @property
        def device(self):
            return torch.device("cuda", 0)

        def cpu(self, *args, **kwargs):
            raise AssertionError("a CUDA tensor was copied to the host")

        def numpy(self, *args, **kwargs):
            raise AssertionError("a CUDA tensor was read")

    recipe, arrays = dapo_arrays()
    batch = {k: torch.as_tensor(v).as_subclass(OnCuda) for k, v in arrays.items()}
    assert batch["logp"].device.type == "cuda"
    with pytest.raises(RuntimeError, match=r"built without CUDA.*scripts/build-python.sh --cuda"):
        recipe.torch()(batch)
