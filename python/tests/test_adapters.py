"""The verl and TRL adapters against verl's and TRL's own code paths."""

import math

import numpy as np
import pytest

import rlx
from conftest import ROOT, need


def verl_adapter():
    need("verl.trainer.ppo.core_algos")
    import rlx.verl

    return rlx.verl


class Config(dict):
    """What verl's vanilla loss reads from its ActorConfig."""

    def __getattr__(self, name):
        return self[name]


def verl_batch(torch, dtype=None):
    dtype = dtype or torch.float64
    torch.manual_seed(0)
    B, T = 6, 9
    mask = torch.zeros(B, T)
    for i, n in enumerate([9, 4, 7, 1, 8, 5]):
        mask[i, :n] = 1
    old = -torch.rand(B, T, dtype=dtype) * 2
    log_prob = (old + 0.3 * torch.randn(B, T, dtype=dtype)).requires_grad_()
    advantages = torch.randn(B, 1, dtype=dtype).expand(B, T) * mask
    info = {"dp_size": 2, "batch_num_tokens": int(mask.sum()) * 3, "global_batch_size": B * 3}
    config = Config(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=10.0, global_batch_info=info)
    return old, log_prob, advantages, mask, config


def test_verl_policy_loss_equals_verls_vanilla_loss():
    torch = need("torch")
    core_algos = need("verl.trainer.ppo.core_algos")
    registered = verl_adapter().register(ROOT / "recipes/dapo.rlx", "rlx_py_dapo")
    loss_fn = core_algos.get_policy_loss_fn("rlx_py_dapo")
    assert loss_fn is registered["policy_loss"]
    assert core_algos.get_adv_estimator_fn("rlx_py_dapo") is registered["advantage_estimator"]
    old, log_prob, advantages, mask, config = verl_batch(torch)
    ours, metrics = loss_fn(old_log_prob=old, log_prob=log_prob, advantages=advantages, response_mask=mask,
                            loss_agg_mode="token-mean", config=config, rollout_is_weights=None)
    (ours_grad,) = torch.autograd.grad(ours, log_prob)
    theirs, their_metrics = core_algos.get_policy_loss_fn("vanilla")(old, log_prob, advantages, mask, "token-mean", config, None)
    (their_grad,) = torch.autograd.grad(theirs, log_prob)
    torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(ours_grad, their_grad, rtol=1e-9, atol=1e-12)
    for key in ("pg_clipfrac", "ppo_kl", "pg_clipfrac_lower"):
        # verl computes its clip fractions in float32
        assert abs(metrics[f"actor/{key}"] - their_metrics[f"actor/{key}"]) < 1e-6, key
    assert "reward_mean" in metrics.missing and "score" in metrics.missing["reward_mean"]


def test_verl_policy_loss_in_float32():
    torch = need("torch")
    core_algos = need("verl.trainer.ppo.core_algos")
    verl_adapter().register(ROOT / "recipes/dapo.rlx", "rlx_py_dapo32")
    old, log_prob, advantages, mask, config = verl_batch(torch, torch.float32)
    ours, _ = core_algos.get_policy_loss_fn("rlx_py_dapo32")(old, log_prob, advantages, mask, "token-mean", config, None)
    (ours_grad,) = torch.autograd.grad(ours, log_prob)
    theirs, _ = core_algos.get_policy_loss_fn("vanilla")(old, log_prob, advantages, mask, "token-mean", config, None)
    (their_grad,) = torch.autograd.grad(theirs, log_prob)
    assert ours.dtype == torch.float32 and ours_grad.dtype == torch.float32
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(ours_grad, their_grad, rtol=1e-5, atol=1e-8)


def test_verl_advantage_estimator_equals_verls_grpo():
    torch = need("torch")
    core_algos = need("verl.trainer.ppo.core_algos")
    registered = verl_adapter().register(ROOT / "recipes/grpo.rlx", "rlx_py_grpo")
    # grpo.rlx's loss reads ref_logp (its KL term), which verl's PolicyLossFn does not receive.
    assert isinstance(registered["policy_loss"], str) and "ref_logp" in registered["policy_loss"]
    estimator = core_algos.get_adv_estimator_fn("rlx_py_grpo")
    B, T = 8, 5
    torch.manual_seed(1)
    mask = torch.ones(B, T)
    mask[2, 3:] = 0
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    rewards = torch.zeros(B, T)
    lengths = mask.sum(-1).long()
    rewards[torch.arange(B), lengths - 1] = scores
    index = np.array(["a"] * 4 + ["b"] * 4, dtype=object)
    ours, _ = estimator(token_level_rewards=rewards, response_mask=mask, index=index)
    theirs, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, index)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_trl_trainer_loss_is_the_recipe_loss():
    """RecipeGRPOTrainer._compute_loss on TRL's loss inputs, with TRL's own per-token log-prob
    computation replaced by a fixed tensor: the recipe's loss (dapo.rlx given TRL's advantages) equals
    TRL's own `dapo`-style clipped loss (GRPOTrainer._compute_loss, loss_type="bnpo") where no dual clip
    applies, and the metrics are logged under rlx/."""
    torch = need("torch")
    need("trl")
    from collections import defaultdict

    from rlx.trl import RecipeGRPOTrainer, loss_from_inputs

    B, T = 4, 6
    torch.manual_seed(2)
    logp = (-torch.rand(B, T, dtype=torch.float64) - 0.1).requires_grad_(True)
    old = logp.detach() + 0.02 * torch.randn(B, T, dtype=torch.float64)
    mask = torch.ones(B, T, dtype=torch.int64)
    mask[0, 4:] = 0
    inputs = {
        "prompt_ids": torch.zeros(B, 2, dtype=torch.int64),
        "prompt_mask": torch.ones(B, 2, dtype=torch.int64),
        "completion_ids": torch.zeros(B, T, dtype=torch.int64),
        "completion_mask": mask,
        "advantages": torch.tensor([0.5, -0.3, 1.2, -1.0], dtype=torch.float64),
        "old_per_token_logps": old,
    }

    class Model:
        training = True

    trainer = RecipeGRPOTrainer.__new__(RecipeGRPOTrainer)
    trainer._rlx_init(ROOT / "recipes/dapo.rlx")
    trainer.model = Model()
    trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    trainer.current_gradient_accumulation_steps = 2
    trainer._get_per_token_logps_and_entropies = lambda model, ids, attention, keep, **kw: (logp, None, None)
    loss = trainer._compute_loss(None, inputs)
    (grad,) = torch.autograd.grad(loss, logp)

    # TRL's own loss (GRPOTrainer._compute_loss, loss_type="bnpo": the token-level clipped loss with
    # epsilon_low 0.2 and epsilon_high 0.28, as dapo.rlx's), on the same inputs and log-probabilities.
    from types import SimpleNamespace

    from trl import GRPOTrainer

    reference = logp.detach().clone().requires_grad_(True)

    class Accelerator:
        num_processes = 1

        def gather(self, x):
            return x

        gather_for_metrics = gather

        def reduce(self, x, reduction="mean"):
            return x

    stub = SimpleNamespace(
        aux_loss_enabled=False, top_entropy_quantile=1.0, off_policy_mask_threshold=None,
        importance_sampling_level="token", beta=0.0, loss_type="bnpo", epsilon_low=0.2, epsilon_high=0.28,
        args=SimpleNamespace(delta=None, use_bias_correction_kl=False), use_vllm=False,
        vllm_importance_sampling_correction=False, model=Model(), current_gradient_accumulation_steps=2,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)}, accelerator=Accelerator(),
        _entropy_bonus_enabled=False, use_adaptive_entropy=False, entropy_coef=0.0,
        _get_per_token_logps_and_entropies=lambda *a, **k: (reference, torch.zeros_like(reference), None),
    )
    expected = GRPOTrainer._compute_loss(stub, None, inputs)
    (expected_grad,) = torch.autograd.grad(expected, reference)
    torch.testing.assert_close(loss, expected, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(grad * mask, expected_grad * mask, rtol=1e-9, atol=1e-12)
    logged = trainer._metrics["train"]
    assert set(logged) == {"rlx/pg_clipfrac", "rlx/pg_clipfrac_lower", "rlx/ppo_kl"}, set(logged)
    _, metrics = loss_from_inputs(ROOT / "recipes/dapo.rlx", inputs, logp)
    assert logged["rlx/ppo_kl"] == [metrics["ppo_kl"]]
