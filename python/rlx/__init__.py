"""rlx from Python: a `.rlx` recipe checked and compiled by rlx's compiler, scored by its runtime and
run by its fused kernel (reward -> advantage -> loss -> gradient in one pass) inside your trainer.

    import rlx
    recipe = rlx.Recipe("recipes/dapo.rlx", eps_high=0.28)
    recipe.score(rows)                      # rlx score's document, on a list of dicts
    recipe.score(logp=..., old_logp=..., score=..., index=..., response_mask=...)   # on arrays
    loss_fn = recipe.torch()                # torch.autograd: the kernel's loss and its gradient
    loss, metrics = loss_fn(logp=logp, old_logp=old_logp, score=score, index=index, response_mask=mask)

See docs/python.md. Errors are exceptions: `RecipeError` (a recipe that does not check; the rendered
report and `.diagnostics`), `InputError` (data the recipe cannot read; `.key`, `.row`), `ScoreError`
(no finite result).
"""

from __future__ import annotations

import json
import os
import warnings as _warnings
from typing import Any, Mapping, NamedTuple, Optional

import numpy as np

from . import _rlx
from ._rlx import InputError, RecipeError, ScoreError

__version__ = _rlx.__version__
__all__ = [
    "Recipe",
    "Input",
    "Param",
    "check",
    "has_cuda",
    "RecipeError",
    "InputError",
    "ScoreError",
    "LAYOUT_KEYS",
]

# The keys of `Recipe.score(**arrays)` (and of the torch callable) that describe the batch's layout
# rather than a recipe input (rlx_runtime::arrays).
LAYOUT_KEYS = ("index", "group_sizes", "lengths", "response_mask", "crit_counts")


class Input(NamedTuple):
    """A recipe input: `type` as the recipe writes it (`f32[tok]`), `differentiable` for `policy` and
    `value` inputs (their gradient is computed), `default` or None."""

    name: str
    type: str
    elem: str
    level: str
    feature: Optional[str]
    differentiable: bool
    default: Optional[float]


class Param(NamedTuple):
    """A recipe param: its declared default and the value compiled in."""

    name: str
    elem: str
    default: float
    value: float


def has_cuda() -> bool:
    """Whether this build runs CUDA tensors on rlx's CUDA kernels (built with the `cuda` feature)."""
    return _rlx.has_cuda()


def _locate(path_or_source, name=None):
    """(path, source, name): a path-like or a string ending in .rlx/.rlxc (one line) is a file; any
    other string is recipe text."""
    if isinstance(path_or_source, os.PathLike):
        return os.fspath(path_or_source), None, None
    if not isinstance(path_or_source, str):
        raise TypeError(
            f"a recipe is a path or its source text, got {type(path_or_source).__name__}"
        )
    text = path_or_source
    if "\n" not in text and text.strip().endswith((".rlx", ".rlxc")):
        path = text.strip()
        if not os.path.exists(path):
            raise FileNotFoundError(f"no recipe file {path!r}")
        return path, None, None
    return None, text, name or "<source>"


def _warn(pairs):
    for _code, text in pairs:
        _warnings.warn(text, RuntimeWarning, stacklevel=3)


def check(path_or_source, *, name: Optional[str] = None) -> list:
    """Check a recipe (a file, or source text named `name`). Raises `RecipeError` with the rendered
    report (as `rlxc check` prints it) and `.diagnostics` (code, severity, message, file, labels with
    byte spans and line/column, help, related); returns the warnings' rendered text."""
    path, source, label = _locate(path_or_source, name)
    pairs = _rlx.check(path=path, source=source, name=label or "<source>")
    return [text for _, text in pairs]


def _param_value(name, value):
    if isinstance(value, bool):
        return float(value)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"param `{name}`: {value!r} is not a number or a bool") from None
    return number


def _jsonable(value):
    """json.dumps' fallback for NumPy and torch values inside rows."""
    if hasattr(value, "detach") and hasattr(value, "tolist"):
        return value.detach().cpu().tolist()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"a value of type {type(value).__name__} is not a number, bool, string or list")


def _rows_to_jsonl(rows) -> str:
    if isinstance(rows, (str, bytes)) or not hasattr(rows, "__iter__"):
        raise TypeError("rows are a list of dicts, one per response (as the lines of `rlx score`'s rollout file)")
    lines = []
    for position, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise _input_error(None, f"rows[{position}]: a dict was expected, got {type(row).__name__}", position)
        try:
            lines.append(json.dumps(dict(row), default=_jsonable, allow_nan=True))
        except (TypeError, ValueError) as error:
            raise _input_error(None, f"rows[{position}]: {error}", position) from None
    return "\n".join(lines)


def _array(key: str, value: Any) -> np.ndarray:
    """One array of `score(**arrays)` as the extension reads it: C-contiguous float32, float64 or
    int64 (other real dtypes converted; a tensor detached and moved to the CPU)."""
    if hasattr(value, "detach") and hasattr(value, "numpy"):
        value = value.detach()
        if value.device.type != "cpu":
            value = value.cpu()
        if str(value.dtype) in ("torch.bfloat16", "torch.float16"):
            value = value.float()
        value = value.contiguous().numpy()
    try:
        array = np.asarray(value)
    except Exception as error:  # ragged lists and the like
        raise _input_error(key, f"`{key}`: not an array of numbers ({error})") from None
    kind = array.dtype.kind
    if kind == "f":
        if array.dtype not in (np.float32, np.float64):
            array = array.astype(np.float64)
    elif kind in "iub":
        if array.dtype != np.int64:
            array = array.astype(np.int64)
    else:
        raise _input_error(key, f"`{key}`: dtype {array.dtype} is not a number type (float, int or bool)")
    array = np.ascontiguousarray(array)
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    return array


def _input_error(key, message, row=None):
    error = InputError(message)
    error.key = key
    error.row = row
    return error


def _group_codes(index):
    """`index` as int64 group codes: numbers as they are; strings or other ids (verl's uid) by first
    appearance. Returns (codes, the id of each code or None)."""
    array = np.asarray(index)
    if array.dtype.kind in "iu":
        return array.astype(np.int64), None
    if array.dtype.kind == "f":
        return array, None
    if array.dtype.kind == "b":
        return array.astype(np.int64), None
    codes, ids, seen = [], [], {}
    for value in array.reshape(-1).tolist():
        if value not in seen:
            seen[value] = len(ids)
            ids.append(value)
        codes.append(seen[value])
    return np.asarray(codes, dtype=np.int64), ids


class Recipe:
    """A recipe compiled with its params: `Recipe("dapo.rlx", eps_high=0.3)`, `Recipe(source_text,
    name="mine")`, or a compiled artifact `Recipe("dapo.rlxc")` (its params compiled in).

    `inputs` and `params` describe it; `score` applies it as `rlx score` does; `torch()` gives the
    fused kernel as a torch autograd function."""

    def __init__(self, path_or_source, *, name: Optional[str] = None, **params):
        if isinstance(path_or_source, _rlx.Compiled):  # a stage of a recipe (`given`)
            self._compiled = path_or_source
            self._source = name
            return
        path, source, label = _locate(path_or_source, name)
        overrides = [(key, _param_value(key, value)) for key, value in params.items()]
        self._compiled = _rlx.Compiled(path=path, source=source, name=label or "<source>", params=overrides)
        self._source = path or label
        _warn(self._compiled.warnings)

    def __repr__(self):
        stage = self._compiled.stage
        return f"rlx.Recipe({self.name!r}{', ' + stage if stage else ''})"

    @property
    def name(self) -> str:
        """The recipe's name (its file stem)."""
        return self._compiled.name

    @property
    def inputs(self) -> tuple:
        """The inputs in batch order, as `Input`s."""
        return tuple(Input(*fields) for fields in self._compiled.inputs)

    @property
    def params(self) -> dict:
        """Each param's value as compiled (the default, or what the constructor set)."""
        return {p[0]: p[3] for p in self._compiled.params}

    @property
    def param_info(self) -> tuple:
        """The params as `Param`s (declared default and value)."""
        return tuple(Param(*fields) for fields in self._compiled.params)

    @property
    def has_loss(self) -> bool:
        """Whether the recipe has a loss section (and so a gradient)."""
        return self._compiled.sections[2]

    @property
    def has_reward(self) -> bool:
        return self._compiled.sections[0]

    @property
    def has_advantage(self) -> bool:
        return self._compiled.sections[1]

    @property
    def metrics(self) -> tuple:
        """The metrics' names."""
        return tuple(self._compiled.metrics)

    @property
    def policy_inputs(self) -> tuple:
        """The names of the differentiable (`policy`, `value`) inputs: those with a gradient."""
        return tuple(i.name for i in self.inputs if i.differentiable)

    def score(self, rows=None, /, *, grad: bool = False, show=(), backend: str = "jit", **arrays) -> dict:
        """`rlx score` from Python: the same document (`loss`, `metrics`, `responses` in input order
        with `group`, `reward`, `advantage`, `kept`; `grad` with grad=True; `show` for the inputs and
        top-level lets named). Give `rows`, a list of dicts as the lines of a rollout file
        (docs/formats.md), or arrays by keyword: the recipe's inputs plus `index` (or `group_sizes`),
        and `response_mask` or `lengths` for padded [R, W] token arrays (`lengths` for packed [N]
        ones). backend: "jit" (default), "interp" (the reference interpreter), "cuda[:N]"."""
        show = [show] if isinstance(show, str) else list(show)
        if rows is not None:
            if arrays:
                raise TypeError("give rows or arrays, not both")
            document, warnings = self._compiled.score_rows(_rows_to_jsonl(rows), grad, show, backend)
            _warn([(None, w) for w in warnings])
            return document
        if not arrays:
            raise TypeError("score() needs rows (a list of dicts) or arrays by keyword")
        prepared, ids = self._prepare(arrays)
        document, warnings = self._compiled.score_arrays(prepared, grad, show, backend)
        _warn([(None, w) for w in warnings])
        if ids is not None:
            for response in document["responses"]:
                response["group"] = ids[response["group"]]
        return document

    def _prepare(self, arrays: dict):
        """The arrays as the extension takes them, and the group ids when `index` was not numeric."""
        prepared, ids = {}, None
        for key, value in arrays.items():
            if value is None:
                continue
            if key == "index":
                value, ids = _group_codes(value.detach().cpu().numpy() if hasattr(value, "detach") else value)
            prepared[key] = _array(key, value)
        return prepared, ids

    def run(self, *, storage: str = "f32", accumulate: str = "f64", step: float = 0.0, progress: float = 0.0, **arrays) -> dict:
        """Run the fused kernel on arrays (as `score(**arrays)` takes them), `f32` inputs held in
        `storage` ("f32" or "f64"; arrays already in that dtype and in the packed layout are read in
        place; `accumulate` "f64" or "f32", the kernel's element-wise arithmetic: its sums are f64 either
        way, docs/kernels.md): a dict of `loss`, `metrics`, `reward`, `advantage` (per response, NumPy),
        `kept` (bool per response) and `grad` (each differentiable input's gradient, shaped like its
        array)."""
        prepared, _ = self._prepare(arrays)
        return self._compiled.run(prepared, storage, step, progress, None, accumulate)

    def given(self, value: str, available=()) -> "Recipe":
        """The stage of the recipe that a trainer calls with its own `value`: "advantage" gives the loss
        (and metrics) from the trainer's advantages (verl's policy loss, TRL's loss; `keep` filters and
        the reward are left out), "reward" gives the advantage, `keep` filters and metrics from its
        rewards (verl's advantage estimator). The stage reads only inputs with a default and those
        named in `available`; `missing_metrics` names the metrics it cannot compute."""
        return Recipe(self._compiled.cut(value, list(available)), name=self._source)

    @property
    def missing_metrics(self) -> dict:
        """For a stage (`given`): each metric it cannot compute, with the inputs it lacks."""
        return {name: tuple(needs) for name, needs in self._compiled.missing_metrics}

    @property
    def reads_groups(self) -> bool:
        """Whether the (staged) recipe reads which responses share a prompt (`index` is then needed)."""
        return self._compiled.reads_groups

    def synthetic_rows(self, groups=3, responses=4, tokens=5, *, seed=1, ragged=True, singleton=False) -> list:
        """Random rows for this recipe (the synthetic batches of rlx's own tests and `rlx bench`): a
        list of dicts as `score(rows)` takes them, each with its `group` and `length`."""
        text = self._compiled.synthetic_rows(groups, responses, tokens, seed, ragged, singleton)
        return [json.loads(line) for line in text.splitlines() if line]

    def torch(self, *, accumulate: Optional[str] = None):
        """The recipe as a torch callable: `loss, metrics = f(**tensors)` runs the fused kernel on the
        tensors (CPU tensors in place where already in its layout) and attaches the kernel's own
        gradient to the loss through a `torch.autograd.Function` (docs/python.md). `accumulate`:
        the kernel's element-wise arithmetic, "f32" or "f64"; by default the precision of the
        policy tensors, as torch computes (f64 for float64 ones, else f32). Sums are accumulated
        in f64 either way (docs/kernels.md)."""
        from ._torch import TorchRecipe

        return TorchRecipe(self, accumulate)
