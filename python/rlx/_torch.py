"""`Recipe.torch()`: the recipe's fused kernel as a torch autograd function.

The forward pass runs the JIT kernel (rlx_runtime's `Kernel::run_view`), which computes the reward,
advantage, loss, metrics and the loss's gradient with respect to every differentiable input in one
pass; the backward pass returns that gradient (times the incoming gradient). CPU tensors that are
already in the kernel's layout (packed, or padded with every row full) and dtype (float32, or float64
when a policy input is float64) are read in place (through NumPy, no copy). CUDA tensors run on rlx's
CUDA kernels when the extension was built with the `cuda` feature, else raise before anything is
copied: each is copied to the host once (every value is checked there, and a `keep` filter gathers
the kept responses there), and the kernels read a tensor already in their layout and dtype on the GPU
itself (its `data_ptr()`); the gradient comes back through the host.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import LAYOUT_KEYS, _array, _group_codes, _input_error, _rlx


class _Fused(torch.autograd.Function):
    """forward(ctx, run, *tensors): `run(tensors)` runs the kernel and returns the loss and, per
    tensor, the kernel's gradient of the loss (or None); backward scales them by the incoming
    gradient."""

    @staticmethod
    def forward(ctx, run, *tensors):
        loss, gradients = run(tensors)
        ctx.gradients = gradients
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        # Released here, so that autograd may take a gradient as the input's `.grad` as it is (it
        # copies a tensor that something else still holds).
        gradients, ctx.gradients = ctx.gradients, None
        scale = None if bool(grad_loss == 1) else grad_loss
        out = [None]
        for gradient in gradients:
            if gradient is None or scale is None:
                out.append(gradient)
            else:
                out.append(gradient * scale.to(gradient.dtype))
        return tuple(out)


class Result(dict):
    """What one call computed: `loss` (a tensor carrying the kernel's gradient), `metrics` (name ->
    float), `reward` and `advantage` (per response, or None), `kept` (bool per response)."""

    __getattr__ = dict.__getitem__


class TorchRecipe:
    """`loss, metrics = f(**batch)` (or `f(batch_dict)`): the recipe's loss as a 0-d tensor whose
    backward is the kernel's gradient, and its metrics as floats. `f.evaluate(**batch)` returns
    everything (`Result`). The batch: each recipe input as a tensor (or array, number), plus the
    layout keys `index` (the group of each response; ints or any ids, a group's responses adjacent)
    or `group_sizes`, and `response_mask` [B, T] or `lengths` [B] for padded token inputs (`lengths`
    for packed [N] ones); `step` and `progress` as numbers."""

    def __init__(self, recipe, accumulate=None):
        if accumulate not in (None, "f64", "f32"):
            raise ValueError(f"accumulate `{accumulate}`: \"f64\", \"f32\" or None (the tensors' precision)")
        self.accumulate = accumulate
        self.recipe = recipe
        self._compiled = recipe._compiled
        self._differentiable = set(recipe.policy_inputs)
        self._inputs = {i.name: i for i in recipe.inputs}

    def __repr__(self):
        return f"{self.recipe!r}.torch()"

    def __call__(self, batch: Optional[dict] = None, /, **tensors):
        result = self.evaluate(batch, **tensors)
        return result["loss"], result["metrics"]

    def evaluate(self, batch: Optional[dict] = None, /, **tensors) -> Result:
        items = dict(batch or {})
        overlap = set(items) & set(tensors)
        if overlap:
            raise TypeError(f"given twice: {', '.join(sorted(overlap))}")
        items.update(tensors)
        step = float(items.pop("step", 0.0))
        progress = float(items.pop("progress", 0.0))
        for key in items:
            if key not in self._inputs and key not in LAYOUT_KEYS:
                raise _input_error(
                    key,
                    f"`{key}`: recipe `{self.recipe.name}` has no input of that name; its inputs are "
                    f"{', '.join(self._inputs)}, and the layout keys {', '.join(LAYOUT_KEYS)}",
                )
        device = self._device(items)
        dtype = self._dtype(items)
        ordinal = None
        if device.type == "cuda":
            if not _rlx.has_cuda():
                raise RuntimeError(_rlx.NO_CUDA)
            ordinal = device.index if device.index is not None else torch.cuda.current_device()
        names = [k for k, v in items.items() if isinstance(v, torch.Tensor)]
        tensors_in = [items[k] for k in names]
        holder = {}

        def run(tensors_now):
            arrays = {}
            for key, value in items.items():
                if value is None:
                    continue
                if key == "index":
                    if isinstance(value, torch.Tensor):
                        value = value.detach().cpu().numpy()
                    value, _ = _group_codes(value)
                arrays[key] = _array(key, value)
            storage = "f64" if dtype == torch.float64 else "f32"
            addresses = None
            if ordinal is not None:
                # The kernels read these tensors on the GPU itself where the host copy is read in
                # place (the packed layout, or padded with every row full): the same dtype as the
                # kernel's storage, contiguous, so that the copy holds the same values, element by
                # element.
                addresses = {
                    key: value.data_ptr()
                    for key, value in items.items()
                    if isinstance(value, torch.Tensor)
                    and key in self._inputs
                    and value.dtype == dtype
                    and value.is_contiguous()
                }
            # The arithmetic of the tensors' precision unless asked otherwise (sums are f64 either way).
            accumulate = self.accumulate or storage
            out = self._compiled.run(arrays, storage, step, progress, ordinal, accumulate, addresses)
            holder["out"] = out
            if out["loss"] is None:
                raise ValueError(f"recipe `{self.recipe.name}` has no loss section: use Recipe.score for its rewards")
            loss = torch.tensor(out["loss"], dtype=dtype, device=device)
            gradients = []
            for key, tensor in zip(names, tensors_now):
                gradient = out["grad"].get(key)
                if gradient is None or not tensor.requires_grad:
                    gradients.append(None)
                    continue
                g = torch.from_numpy(gradient)
                if g.dtype != tensor.dtype or g.device != tensor.device:
                    g = g.to(device=tensor.device, dtype=tensor.dtype)
                gradients.append(g)
            return loss, gradients

        loss = _Fused.apply(run, *tensors_in)
        out = holder["out"]

        def per_response(values):
            return None if values is None else torch.from_numpy(values).to(device)

        return Result(
            loss=loss,
            metrics=dict(out["metrics"]),
            reward=per_response(out["reward"]),
            advantage=per_response(out["advantage"]),
            kept=per_response(out["kept"]),
        )

    def _device(self, items) -> torch.device:
        device, first = None, None
        for key, value in items.items():
            if not isinstance(value, torch.Tensor):
                continue
            if device is None:
                device, first = value.device, key
            elif value.device != device:
                raise _input_error(
                    key,
                    f"`{key}` is on {value.device}, but `{first}` is on {device}: every tensor of a call is on one device",
                )
        device = device or torch.device("cpu")
        if device.type not in ("cpu", "cuda"):
            raise _input_error(first, f"`{first}` is on {device}: rlx runs on the CPU, or on CUDA GPUs")
        return device

    def _dtype(self, items) -> torch.dtype:
        """float64 when a differentiable input is float64, else float32; a differentiable input must
        be floating."""
        dtype = torch.float32
        for key, value in items.items():
            if key not in self._differentiable or not isinstance(value, torch.Tensor):
                continue
            if not value.dtype.is_floating_point:
                raise _input_error(
                    key,
                    f"`{key}` has dtype {value.dtype}, but it is a policy input of the loss: give a floating tensor",
                )
            if value.dtype == torch.float64:
                dtype = torch.float64
        return dtype
