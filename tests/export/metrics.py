"""Where a TRL or verl user finds each metric of an exported recipe (tests/export.rs runs this and
compares every value with the rlx interpreter's on the same batch).

Usage: python3 metrics.py CASES.json RESULTS.json

Each case (see driver.py for the batch format) also names `rows`, the responses rlx keeps, and the
advantages a trainer would pass for them (`trl`, `verl`). Per case this computes:

- `loss(batch)` on the whole batch: every metric of the recipe;
- TRL: the module's reward functions as `GRPOTrainer` calls and logs them (an emulation of TRL 1.x
  `_calculate_rewards` and the logging of `_generate_and_score_completions`: `rewards/<name>/mean`
  and `/std` per reward function, `reward`, and what reward functions pass to `log_metric`), with
  `reward_funcs=[f, f.reward_func]`, `reward_weights=[1, 0]`, `scale_rewards="none"`, then the loss
  as docs/scale.md's `_compute_loss` computes and logs it (`rlx/<name>`) on the kept responses;
- verl: `policy_loss` as verl's `ppo_loss` calls it (its metrics through verl's `Metric.from_dict`
  when verl is importable) and `reward_metrics` on the whole batch.
"""

import json
import math
import os
import sys
import traceback
from collections import defaultdict

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from driver import DT, build, level_of, load  # noqa: E402


def trl_nanstd(tensor):
    """trl.trainer.utils.nanstd: the standard deviation ignoring NaNs, with Bessel's correction."""
    mean = torch.nanmean(tensor)
    variance = torch.nanmean((tensor - mean) ** 2)
    count = torch.sum(~torch.isnan(tensor))
    return torch.sqrt(variance * count / (count - 1)) if count > 1 else torch.tensor(math.nan)


def trl_columns(module, case):
    """The per-completion inputs of the recipe's reward side, as an `inputs_fn` would return them."""
    data = case["batch"]
    columns = {}
    for name in module._REWARD_SIDE_INPUTS:
        level, feature = level_of(module, name)
        value = data["inputs"][name]
        if level == "batch":
            columns[name] = [value] * len(data["lengths"])
        elif level == "tok":
            raise ValueError(f"the reward side reads the token-level input `{name}`: not a TRL reward input")
        elif feature is not None:
            columns[name] = value
        else:
            columns[name] = [row[0] for row in value]
    return columns


def trl_rewards(module, case):
    """GRPOTrainer's reward phase with the recipe's advantage function and its companion reward."""
    data = case["batch"]
    columns = trl_columns(module, case)
    calls = []

    def inputs_fn(prompts, completions, completion_ids, **kwargs):
        calls.append(len(prompts))
        return columns

    advantage_func = module.make_reward_func(inputs_fn, output="advantage")
    reward_funcs = [advantage_func, advantage_func.reward_func]
    reward_weights = torch.tensor([1.0, 0.0])
    names = [func.__name__ for func in reward_funcs]  # trl.trainer.utils.get_callable_name
    prompts = [f"prompt {g}" for g in data["groups"]]
    completions = [f"completion {i}" for i in range(len(prompts))]
    completion_ids = [[7] * n for n in data["lengths"]]
    pending = defaultdict(list)  # GRPOTrainer._pending_metrics, filled by log_metric
    reward_kwargs = {"trainer_state": None, "log_extra": lambda column, values: None,
                     "log_metric": lambda name, value: pending[name].append(value)}
    rewards_per_func = torch.zeros(len(prompts), len(reward_funcs))
    for i, func in enumerate(reward_funcs):
        output = func(prompts=prompts, completions=completions, completion_ids=completion_ids, **reward_kwargs)
        output = [reward if reward is not None else torch.nan for reward in output]
        rewards_per_func[:, i] = torch.tensor(output, dtype=torch.float32)
    # scale_rewards="none": the advantage is the weighted reward minus its group mean.
    sizes = torch.bincount(torch.tensor(data["groups"]))
    generations = int(sizes[0])
    assert bool((sizes == generations).all()), "TRL's groups are num_generations completions each"
    rewards = (rewards_per_func * reward_weights.unsqueeze(0)).nansum(dim=1)
    mean_grouped = torch.nanmean(rewards.view(-1, generations), dim=1).repeat_interleave(generations, dim=0)
    advantages = rewards - mean_grouped
    logged = {}
    for i, name in enumerate(names):
        logged[f"rewards/{name}/mean"] = torch.nanmean(rewards_per_func[:, i]).item()
        logged[f"rewards/{name}/std"] = trl_nanstd(rewards_per_func[:, i]).item()
    logged["reward"] = torch.nanmean(rewards).item()
    for name in sorted(pending):
        logged[name] = sum(pending[name]) / len(pending[name])
    return {
        "names": names,
        "logged": logged,
        "inputs_fn_calls": len(calls),
        "advantages": advantages.tolist(),
        "metrics_attribute": dict(advantage_func.metrics),
    }


def trl_loss(module, case):
    """The loss step of docs/scale.md's RecipeTrainer on the kept responses, with TRL's inputs."""
    rows = case["rows"]
    batch, _ = build(module, case, rows)
    logp = batch[module.POLICY_INPUT]
    inputs = {
        "completion_mask": batch["response_mask"].to(torch.int64),
        "advantages": torch.tensor(case["trl"]["advantage"], dtype=DT),
    }
    for key, name in (("old_per_token_logps", "old_logp"), ("ref_per_token_logps", "ref_logp"),
                      ("sampling_per_token_logps", "sampler_logp")):
        if name in batch:
            inputs[key] = batch[name].detach()
    value, metrics = module.loss(module.trl_batch(inputs, logp))
    logged = {f"rlx/{name}": metric for name, metric in metrics.items()}
    return {"loss": float(value), "logged": logged, "missing": metrics.missing}


def verl_side(module, case):
    """verl's actor: policy_loss on the kept responses, and reward_metrics on the whole batch."""
    out = {
        "policy_loss_why": module.POLICY_LOSS_WHY,
        "returns": list(module.POLICY_LOSS_METRICS),
        "why": module.POLICY_LOSS_METRICS_WHY,
    }
    whole, _ = build(module, case)
    metrics = module.reward_metrics(whole)
    out["reward_metrics"] = dict(metrics)
    out["reward_missing"] = metrics.missing
    if module.POLICY_LOSS_WHY is None and case.get("verl") is not None:
        batch, _ = build(module, case, case["rows"])
        log_prob = batch[module.POLICY_INPUT]
        old = batch.get("old_logp", log_prob.detach())
        mask = batch["response_mask"]
        advantages = torch.tensor(case["verl"]["advantage"], dtype=DT)[:, None].expand(mask.shape)
        _, pg_metrics = module.policy_loss(
            old_log_prob=old, log_prob=log_prob, advantages=advantages, response_mask=mask,
            loss_agg_mode="token-mean", config=None, rollout_is_weights=None,
        )
        try:  # what verl's ppo_loss does with a policy loss's metrics
            from verl.utils.metric import Metric

            converted = Metric.from_dict(pg_metrics, aggregation="mean")
            out["through_verl"] = True
            values = {key: float(metric.aggregate()) for key, metric in converted.items()}
        except ImportError:
            out["through_verl"] = False
            values = {key: float(value) for key, value in pg_metrics.items()}
        out["policy_loss"] = values
        out["policy_missing"] = pg_metrics.missing
    return out


def whole_loss(module, case):
    """`loss` on the whole batch, as rlx's own trainer evaluates the recipe."""
    _, metrics = module.loss(build(module, case)[0])
    return {"metrics": dict(metrics), "missing": metrics.missing}


def run_case(module, case):
    results = {
        "NAME": module.NAME,
        "METRICS": list(module.METRICS),
        "REWARD_SIDE_METRICS": list(module.REWARD_SIDE_METRICS),
    }
    for key, work in (
        ("loss", lambda: whole_loss(module, case)),
        ("trl_rewards", lambda: trl_rewards(module, case)),
        ("trl_loss", lambda: trl_loss(module, case)),
        ("verl", lambda: verl_side(module, case)),
    ):
        try:
            results[key] = work()
        except Exception as error:  # reported to the Rust side
            results[key] = {"error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()}
    return results


def main():
    with open(sys.argv[1]) as f:
        manifest = json.load(f)
    out = []
    for index, case in enumerate(manifest["cases"]):
        try:
            out.append(run_case(load(case["module"], f"rlx_metrics_case_{index}"), case))
        except Exception as error:
            out.append({"load": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()})
    with open(sys.argv[2], "w") as f:
        json.dump({"results": out}, f)


if __name__ == "__main__":
    main()
