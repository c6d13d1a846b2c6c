"""recipes/adaptive_entropy.rlx, exported for PyTorch, against TRL's own adaptive entropy control.

Runs TRL 1.16's `GRPOTrainer._compute_loss` (loss_type "dapo", `use_adaptive_entropy=True`) itself on
a stand-in trainer object whose model returns given log-probabilities and entropies, and the exported
module's `loss` (a trainer's advantages given) on the same batch, for several optimizer steps whose
entropies fall on both sides of the target and drive the coefficient to its cap and to its floor. At
every step: the loss and its gradients (log-probabilities, entropies) and the state after the step
(TRL's `entropy_coef` and `_last_world_entropy`, the module's `STATE` buffers) must agree. Halfway,
`STATE.state_dict()` is saved, the module's state is scrambled, and `load_state_dict` restores it;
`STATE.eval()` freezes it. Usage: python adaptive_entropy.py MODULE.py; prints one JSON line."""

import collections
import importlib.util
import json
import math
import sys
import types

import torch
from trl.trainer.grpo_trainer import GRPOTrainer

spec = importlib.util.spec_from_file_location("rlx_adaptive_entropy", sys.argv[1])
rlx = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rlx)

TARGET, DELTA, LO, HI = 0.5, 0.01, 0.0, 0.025
PARAMS = {
    "entropy_target": TARGET,
    "entropy_coef_delta": DELTA,
    "entropy_coef_min": LO,
    "entropy_coef_max": HI,
}
torch.set_default_dtype(torch.float64)


def trainer(entropies_and_logps):
    """A stand-in for the parts of GRPOTrainer that `_compute_loss` reads on one process."""
    args = types.SimpleNamespace(
        delta=None,
        steps_per_generation=1,
        use_bias_correction_kl=False,
        entropy_target=TARGET,
        entropy_coef_delta=DELTA,
        entropy_coef_min=LO,
        entropy_coef_max=HI,
    )
    accelerator = types.SimpleNamespace(
        num_processes=1,
        sync_gradients=True,
        reduce=lambda tensor, reduction="sum": tensor,
        gather=lambda tensor: tensor,
        gather_for_metrics=lambda tensor: tensor,
    )
    fake = types.SimpleNamespace(
        args=args,
        accelerator=accelerator,
        model=types.SimpleNamespace(training=True),
        aux_loss_enabled=False,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level="token",
        beta=0.0,
        loss_type="dapo",
        epsilon_low=0.2,
        epsilon_high=0.2,
        use_vllm=False,
        current_gradient_accumulation_steps=1,
        entropy_coef=0.0,
        use_adaptive_entropy=True,
        _entropy_bonus_enabled=True,
        _last_world_entropy=float("inf"),
        _entropy_window_stats=None,
        _metrics={"train": collections.defaultdict(list), "eval": collections.defaultdict(list)},
    )
    fake._get_per_token_logps_and_entropies = lambda *a, **k: (*entropies_and_logps(), None)
    return fake


# Mean entropies per step: below, below, below (the cap), above, above, above (the floor), below.
MEANS = [0.3, 0.2, 0.4, 0.9, 0.7, 1.2, 0.45, 0.1]
B, T = 4, 5
mask = torch.tensor(
    [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 0, 0, 0, 0]], dtype=torch.float64
)
generator = torch.Generator().manual_seed(7)
current = {}
fake = trainer(lambda: (current["logp"], current["entropy"]))
report = {"steps": [], "problems": []}


def close(a, b, what):
    if not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12):
        report["problems"].append(f"{what}: TRL {a!r}, rlx {b!r}")


saved = None
for step, mean in enumerate(MEANS):
    logp = -torch.rand(B, T, generator=generator) - 0.1
    old = logp + 0.3 * (torch.rand(B, T, generator=generator) - 0.5)
    entropy = mean * (0.5 + torch.rand(B, T, generator=generator))
    advantages = torch.randn(B, generator=generator)

    # TRL.
    trl_logp = logp.clone().requires_grad_(True)
    trl_entropy = entropy.clone().requires_grad_(True)
    current["logp"], current["entropy"] = trl_logp, trl_entropy
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": advantages,
        "old_per_token_logps": old,
        "num_items_in_batch": mask.sum(),
    }
    trl_loss = GRPOTrainer._compute_loss(fake, None, inputs)
    trl_loss.backward()

    # rlx.
    rlx_logp = logp.clone().requires_grad_(True)
    rlx_entropy = entropy.clone().requires_grad_(True)
    batch = {
        "response_mask": mask,
        "logp": rlx_logp,
        "old_logp": old,
        "entropy": rlx_entropy,
        "advantages": advantages,
    }
    rlx_loss, metrics = rlx.loss(batch, **PARAMS)
    rlx_loss.backward()

    close(float(trl_loss.detach()), float(rlx_loss.detach()), f"step {step}: loss")
    for name, a, b in [
        ("d/dlogp", trl_logp.grad, rlx_logp.grad),
        ("d/dentropy", trl_entropy.grad, rlx_entropy.grad),
    ]:
        worst = float(((a - b) * mask).abs().max())
        if worst > 1e-12:
            report["problems"].append(f"step {step}: {name} differs by {worst}")
    close(fake.entropy_coef, float(rlx.STATE.coef), f"step {step}: coefficient after the step")
    close(fake._last_world_entropy, float(rlx.STATE.last_entropy), f"step {step}: last entropy")
    report["steps"].append(
        {"coef": fake.entropy_coef, "last_entropy": fake._last_world_entropy, "loss": float(trl_loss.detach())}
    )
    if step == 3:
        saved = {k: v.clone() for k, v in rlx.STATE.state_dict().items()}
        rlx.STATE.coef.fill_(0.75)
        rlx.STATE.last_entropy.fill_(-3.0)
        rlx.STATE.load_state_dict(saved)

report["state_dict_keys"] = sorted(saved)
# Frozen: evaluation mode leaves the buffers as they are.
before = {k: float(v) for k, v in rlx.STATE.state_dict().items()}
rlx.STATE.eval()
rlx.loss(batch, **PARAMS)
after = {k: float(v) for k, v in rlx.STATE.state_dict().items()}
report["eval_frozen"] = before == after
print(json.dumps(report))
