"""verl adapter: `rlx.verl.register(recipe, name)` puts a recipe's loss and advantage, run by its fused
kernel, into verl's registries (`verl.trainer.ppo.core_algos`), so that `policy_loss.loss_mode=NAME` and
`algorithm.adv_estimator=NAME` select them (docs/python.md).

- The policy loss is a verl `PolicyLossFn`: `(old_log_prob, log_prob, advantages, response_mask,
  loss_agg_mode, config, rollout_is_weights) -> (loss, metrics)`. It runs the recipe's loss given verl's
  advantages (averaged over each response's tokens), the recipe's token-level policy input receiving
  `log_prob` and its `old_logp` receiving `old_log_prob`; the loss carries the kernel's gradient. The
  micro-batch mean is rescaled as verl's `agg_loss` would for `loss_agg_mode` and
  `config.global_batch_info`, so verl's sums over micro-batches and data-parallel ranks give the
  recipe's mean. The metrics verl's arguments determine are returned as `{"actor/NAME": value}`, which
  verl's actor logs as it logs its own losses' metrics; `metrics.missing` names the others.
- The advantage estimator takes verl's `token_level_rewards` summed over tokens as the recipe's reward
  and `index` (verl's `uid`) as the groups, applies the recipe's `keep` filters (dropped responses get
  advantage 0) and returns the advantage broadcast over the tokens, as `(advantages, returns)`.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from . import Recipe

_VERL_GIVES = "verl's PolicyLossFn gives only log_prob, old_log_prob, advantages, response_mask and rollout_is_weights"


class Metrics(dict):
    """Metrics as verl logs them (name -> float), with `missing`: each metric not computed and why."""

    def __init__(self, values, missing):
        super().__init__(values)
        self.missing = dict(missing)


def _recipe(recipe) -> Recipe:
    return recipe if isinstance(recipe, Recipe) else Recipe(recipe)


def _policy_input(recipe: Recipe) -> str:
    tokens = [i.name for i in recipe.inputs if i.differentiable and i.level == "tok"]
    if not tokens:
        raise NotImplementedError(f"recipe `{recipe.name}` has no token-level policy input for verl's log_prob")
    return tokens[0]


def agg_scale(response_mask, loss_agg_mode: str, config) -> float:
    """The factor that turns the recipe's micro-batch mean into verl's share of the global loss:
    verl sums the micro-batch losses of a mini-batch and of the data-parallel ranks (`agg_loss` with
    `global_batch_info`: `dp_size`, `batch_num_tokens`, `global_batch_size`)."""
    info = None
    if config is not None:
        info = config.get("global_batch_info") if hasattr(config, "get") else getattr(config, "global_batch_info", None)
    info = info or {}
    dp = info.get("dp_size") or 1
    mask = torch.as_tensor(response_mask) != 0
    if loss_agg_mode == "token-mean":
        total = info.get("batch_num_tokens")
        return 1.0 if total is None else float(mask.sum()) / float(total) * dp
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        total = info.get("global_batch_size")
        return 1.0 if total is None else float(mask.any(-1).sum()) / float(total) * dp
    if loss_agg_mode == "token-sum":
        return float(dp)
    raise ValueError(f"unknown loss_agg_mode `{loss_agg_mode}`")


def policy_loss_fn(recipe):
    """The recipe's loss as a verl `PolicyLossFn` (see the module doc). Raises NotImplementedError when
    the loss reads something verl does not pass (e.g. `ref_logp` for an in-loss KL term: use verl's
    `use_kl_loss` instead) or the group structure."""
    recipe = _recipe(recipe)
    policy = _policy_input(recipe)
    names = {i.name for i in recipe.inputs}
    available = [policy] + [n for n in ("old_logp", "rollout_is_weights") if n in names]
    try:
        stage = recipe.given("advantage", available)
    except ValueError as error:
        raise NotImplementedError(f"{error} ({_VERL_GIVES})") from None
    if stage.reads_groups:
        raise NotImplementedError(
            f"the loss of recipe `{recipe.name}` reads the group structure, which verl's PolicyLossFn does not receive"
        )
    loss_of = stage.torch()
    missing = {name: f"reads {', '.join(needs)}, which {_VERL_GIVES}" for name, needs in stage.missing_metrics.items()}
    stage_inputs = {i.name for i in stage.inputs}

    def policy_loss(
        old_log_prob: torch.Tensor,
        log_prob: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        loss_agg_mode: str = "token-mean",
        config=None,
        rollout_is_weights: Optional[torch.Tensor] = None,
    ):
        mask = response_mask != 0
        lengths = mask.sum(-1)
        # verl's advantages are per token; an outcome advantage is the same on every token.
        advantage = (advantages * mask).sum(-1) / lengths.clamp(min=1)
        batch = {
            policy: log_prob,
            "advantage": advantage.detach(),
            "response_mask": mask,
            "group_sizes": torch.ones(log_prob.shape[0], dtype=torch.int64),
        }
        if "old_logp" in stage_inputs:
            batch["old_logp"] = old_log_prob
        if rollout_is_weights is not None:
            if "rollout_is_weights" not in names:
                raise ValueError(
                    f"verl passed rollout_is_weights, but recipe `{recipe.name}` does not read them: declare "
                    "`input rollout_is_weights : f32[tok]` in the recipe or turn verl's algorithm.rollout_correction off"
                )
            batch["rollout_is_weights"] = rollout_is_weights
        loss, metrics = loss_of(batch)
        scale = agg_scale(response_mask, loss_agg_mode, config)
        return loss * scale, Metrics({f"actor/{k}": v for k, v in metrics.items()}, missing)

    policy_loss.recipe = recipe
    policy_loss.metrics_missing = missing
    return policy_loss


def advantage_estimator_fn(recipe):
    """The recipe's advantage (with its `keep` filters) as a verl advantage estimator (see the module
    doc). Raises NotImplementedError when the advantage reads more than the reward (and what the batch
    layout gives)."""
    recipe = _recipe(recipe)
    try:
        stage = recipe.given("reward", ())
    except ValueError as error:
        raise NotImplementedError(f"{error} (verl's advantage estimator gives the rewards and the groups)") from None

    def advantage_estimator(token_level_rewards, response_mask, index=None, config=None, **kwargs):
        if index is None:
            raise ValueError("the recipe's advantage needs `index` (verl's uid: the prompt of each response)")
        mask = torch.as_tensor(response_mask)
        reward = token_level_rewards.sum(-1)
        # verl's uids (strings) or ints; a group's responses are adjacent (verl repeats each prompt n times).
        out = stage.run(storage="f64", reward=reward.detach().double(), index=np.asarray(index), response_mask=mask != 0)
        advantage = torch.from_numpy(out["advantage"]).to(token_level_rewards.device, token_level_rewards.dtype)
        advantage = advantage[:, None] * mask.to(advantage.dtype)
        return advantage, advantage

    advantage_estimator.recipe = recipe
    return advantage_estimator


def register(recipe, name: Optional[str] = None, *, loss: bool = True, advantage: bool = True) -> dict:
    """Register `recipe` (a Recipe or a path) in verl's registries as `name` (default `rlx_<recipe>`):
    its loss as a policy loss (`actor_rollout_ref.actor.policy_loss.loss_mode=NAME`) and its advantage
    as an advantage estimator (`algorithm.adv_estimator=NAME`). A part the recipe cannot provide to verl
    (a loss that reads `ref_logp`, an advantage that reads more than the reward) is not registered and
    is reported in the returned dict: {"policy_loss": fn or reason, "advantage_estimator": fn or reason}."""
    from verl.trainer.ppo import core_algos

    recipe = _recipe(recipe)
    name = name or f"rlx_{recipe.name}"
    out = {}
    if loss:
        try:
            fn = policy_loss_fn(recipe)
            core_algos.register_policy_loss(name)(fn)
            out["policy_loss"] = fn
        except NotImplementedError as error:
            out["policy_loss"] = str(error)
    if advantage:
        try:
            fn = advantage_estimator_fn(recipe)
            if core_algos.ADV_ESTIMATOR_REGISTRY.get(name) not in (None, fn):
                del core_algos.ADV_ESTIMATOR_REGISTRY[name]  # re-registering the same name replaces it
            core_algos.register_adv_est(name)(fn)
            out["advantage_estimator"] = fn
        except NotImplementedError as error:
            out["advantage_estimator"] = str(error)
    return out
