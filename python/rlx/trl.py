"""TRL adapter: the recipe's loss, run by its fused kernel, in place of `GRPOTrainer`'s own loss
(docs/python.md).

    from rlx.trl import RecipeGRPOTrainer
    trainer = RecipeGRPOTrainer(recipe="recipes/dapo.rlx", model=..., reward_funcs=..., args=GRPOConfig(...), ...)

`RecipeGRPOTrainer` is a `trl.GRPOTrainer` whose `_compute_loss` computes the policy's per-token
log-probabilities as TRL does and then the recipe's loss given TRL's advantages (`Recipe.given(
"advantage")`), with the kernel's gradient; the recipe's metrics that TRL's loss inputs determine are
logged as `rlx/<metric>` next to TRL's own. `loss_from_inputs` is the same computation as a function,
for a trainer of your own (a `compute_loss` hook).

The recipe's inputs are filled from TRL's loss inputs: its token-level policy input from the
policy's log-probabilities, `old_logp` from `old_per_token_logps` (the log-probabilities themselves,
detached, when TRL skipped them), `ref_logp` from `ref_per_token_logps` (computed by TRL only when
`beta != 0`), `sampler_logp` from `sampling_per_token_logps`, the response mask from
`completion_mask` and the advantage from `advantages` (a [B, T] advantage averaged over each
completion's tokens). `extra` adds any other recipe input.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import Recipe

# TRL's loss inputs -> the recipe inputs they fill (the policy input is filled separately).
_FROM_TRL = {
    "old_per_token_logps": "old_logp",
    "ref_per_token_logps": "ref_logp",
    "sampling_per_token_logps": "sampler_logp",
}


def _recipe(recipe) -> Recipe:
    return recipe if isinstance(recipe, Recipe) else Recipe(recipe)


class _Stages:
    """The recipe's loss given the advantage, per set of available inputs (compiled once each)."""

    def __init__(self, recipe):
        self.recipe = _recipe(recipe)
        tokens = [i.name for i in self.recipe.inputs if i.differentiable and i.level == "tok"]
        if not tokens:
            raise NotImplementedError(f"recipe `{self.recipe.name}` has no token-level policy input for TRL's log-probabilities")
        self.policy = tokens[0]
        self.names = {i.name for i in self.recipe.inputs}
        self._stages = {}

    def get(self, available):
        key = frozenset(available)
        if key not in self._stages:
            stage = self.recipe.given("advantage", sorted(key))
            self._stages[key] = (stage, stage.torch())
        return self._stages[key]


def loss_from_inputs(recipe, inputs: dict, per_token_logps: torch.Tensor, extra: Optional[dict] = None):
    """The recipe's loss and metrics on TRL's loss inputs (`inputs` of `GRPOTrainer._compute_loss`) and
    the policy's `per_token_logps`: `(loss, metrics)`, the loss carrying the kernel's gradient (a mean
    over the micro-batch, as TRL's `grpo`/`bnpo` losses)."""
    stages = recipe if isinstance(recipe, _Stages) else _Stages(recipe)
    mask = inputs["completion_mask"]
    if "tool_mask" in inputs:
        mask = mask * inputs["tool_mask"]
    mask = mask != 0
    advantages = inputs["advantages"]
    if advantages.dim() == 2:  # per token: averaged over each completion's tokens
        advantages = (advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    batch = {stages.policy: per_token_logps, "response_mask": mask, "advantage": advantages.detach()}
    for trl_key, name in _FROM_TRL.items():
        if name in stages.names and inputs.get(trl_key) is not None:
            batch[name] = inputs[trl_key]
    if "old_logp" in stages.names and "old_logp" not in batch:
        batch["old_logp"] = per_token_logps.detach()
    for name, value in (extra or {}).items():
        batch[name] = value
    available = [k for k in batch if k in stages.names]
    stage, loss_of = stages.get(available)
    if "index" not in batch and "group_sizes" not in batch:
        if stage.reads_groups:
            raise NotImplementedError(
                f"the loss of recipe `{stages.recipe.name}` reads the group structure: pass `index` in extra"
            )
        batch["group_sizes"] = torch.ones(per_token_logps.shape[0], dtype=torch.int64)
    batch = {k: v for k, v in batch.items() if k in {i.name for i in stage.inputs} or k in ("response_mask", "index", "group_sizes")}
    return loss_of(batch)


def _grpo_trainer():
    from trl import GRPOTrainer

    return GRPOTrainer


class _Mixin:
    """`_compute_loss` from the recipe (see the module doc)."""

    def _rlx_init(self, recipe):
        self.rlx_stages = _Stages(recipe)
        self.rlx_recipe = self.rlx_stages.recipe

    def _compute_loss(self, model, inputs):
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        logits_to_keep = completion_ids.size(1)
        per_token_logps = self._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep)[0]
        loss, metrics = loss_from_inputs(self.rlx_stages, inputs, per_token_logps)
        mode = "train" if self.model.training else "eval"
        for name, value in metrics.items():
            self._metrics[mode][f"rlx/{name}"].append(value)
        # TRL averages over gradient accumulation by dividing each micro-batch's loss.
        return loss / (self.current_gradient_accumulation_steps if mode == "train" else 1)


def __getattr__(name):
    # `RecipeGRPOTrainer` is built on first use, so that `import rlx.trl` works without TRL installed.
    if name == "RecipeGRPOTrainer":
        GRPOTrainer = _grpo_trainer()

        class RecipeGRPOTrainer(_Mixin, GRPOTrainer):
            """A `trl.GRPOTrainer` whose loss is the recipe's (`recipe=`: a Recipe or a path), run by its
            fused kernel; every other argument is GRPOTrainer's."""

            def __init__(self, *args, recipe, **kwargs):
                self._rlx_init(recipe)
                super().__init__(*args, **kwargs)

        globals()["RecipeGRPOTrainer"] = RecipeGRPOTrainer
        return RecipeGRPOTrainer
    raise AttributeError(name)
