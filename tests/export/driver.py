"""Runs modules exported by `rlxc compile --emit torch` on batches written by tests/export.rs and
writes back what they computed, for comparison with the rlx interpreter.

Usage: python3 driver.py CASES.json RESULTS.json

Each case names a module and a batch: per input, one row per response (tokens, criteria or a feature
vector; group-level inputs repeated on each response of the group) or, at batch level, a number or a
vector. Padding is filled with NaN here, so a module that read it would be caught. Every entry point
that the module supports for the recipe is exercised: `evaluate` (the whole recipe, with the loss's
autograd gradient), `loss` with given advantages (TRL), `policy_loss` (verl), `advantage_estimator`
(verl), `compute_score` (verl), `reward_func` (TRL, both outputs, with the reward-side metrics and
the advantage function's companion reward) and `reward_metrics`.
"""

import importlib.util
import json
import math
import sys
import traceback

import torch

DT = torch.float64


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def level_of(module, name):
    shape = module.INPUTS[name][0]
    level, _, feature = shape.partition(":")
    return level, feature or None


def build(module, case, rows=None):
    """Padded tensors for the case's batch (optionally only the responses `rows`)."""
    data = case["batch"]
    lengths = data["lengths"]
    groups = data["groups"]
    crits = data["crits"]  # per response: its group's criterion count
    keep = list(range(len(lengths))) if rows is None else rows
    B = len(keep)
    T = max([lengths[r] for r in keep] + [0])
    C = max([crits[r] for r in keep] + [0])
    mask = torch.zeros((B, T), dtype=torch.bool)
    crit_mask = torch.zeros((B, C), dtype=torch.bool)
    for i, r in enumerate(keep):
        mask[i, : lengths[r]] = True
        crit_mask[i, : crits[r]] = True
    batch = {"response_mask": mask, "index": torch.tensor([groups[r] for r in keep])}
    if any(level_of(module, name)[1] == "crit" for name in data["inputs"]):
        batch["crit_mask"] = crit_mask
    leaves = {}
    for name, value in data["inputs"].items():
        level, feature = level_of(module, name)
        if level == "batch":
            tensor = torch.tensor(value, dtype=DT)
        else:
            selected = [value[r] for r in keep]
            if level == "tok":
                tensor = torch.full((B, T), math.nan, dtype=DT)
                for i, row in enumerate(selected):
                    tensor[i, : len(row)] = torch.tensor(row, dtype=DT)
            elif level == "pair":
                # [B, B]: row r's values are its pairs with the other responses of its group (of the
                # whole batch, in order); pairs with responses left out, and non-pairs, stay NaN.
                tensor = torch.full((B, B), math.nan, dtype=DT)
                position = {r: i for i, r in enumerate(keep)}
                for i, r in enumerate(keep):
                    others = [j for j in range(len(lengths)) if j != r and groups[j] == groups[r]]
                    for j, v in zip(others, value[r]):
                        if j in position:
                            tensor[i, position[j]] = v
            elif feature == "crit":
                tensor = torch.full((B, C), math.nan, dtype=DT)
                for i, row in enumerate(selected):
                    tensor[i, : len(row)] = torch.tensor(row, dtype=DT)
            elif feature is None:
                tensor = torch.tensor([row[0] for row in selected], dtype=DT)
            else:
                tensor = torch.tensor(selected, dtype=DT).reshape(B, -1)
        if name in case["differentiable"]:
            tensor.requires_grad_(True)
            leaves[name] = tensor
        batch[name] = tensor
    return batch, leaves


def rows_of(module, name, tensor, mask, crit_mask):
    """A tensor as rows per response, padding dropped (the inverse of `build`)."""
    level, feature = level_of(module, name)
    if level == "batch":
        return tensor.reshape(-1).tolist()
    if level == "tok":
        return [tensor[i][mask[i]].tolist() for i in range(tensor.shape[0])]
    if feature == "crit":
        return [tensor[i][crit_mask[i]].tolist() for i in range(tensor.shape[0])]
    if feature is None:
        return [[v] for v in tensor.tolist()]
    return tensor.tolist()


def gradients(module, out_loss, batch, leaves):
    names = list(leaves)
    if not names:
        return {}
    grads = torch.autograd.grad(out_loss, [leaves[n] for n in names], allow_unused=True)
    crit_mask = batch.get("crit_mask", torch.zeros((batch["response_mask"].shape[0], 0), dtype=torch.bool))
    result = {}
    for name, grad in zip(names, grads):
        if grad is None:
            grad = torch.zeros_like(leaves[name])
        if not bool(torch.isfinite(grad).all()):
            raise ValueError(f"non-finite gradient for `{name}` (padding included): {grad}")
        result[name] = rows_of(module, name, grad, batch["response_mask"], crit_mask)
    return result


def floats(tensor):
    return [float(v) for v in tensor.detach().reshape(-1)]


def attempt(results, key, work):
    try:
        results[key] = work()
    except Exception as error:  # reported to the Rust side, which decides
        results[key] = {"error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()}


class module_params:
    """The case's param overrides as the module's defaults (what `rlxc compile --set` produces), for
    the adapters that take no config."""

    def __init__(self, module, case):
        self.module, self.overrides = module, (case.get("config") or {}).get("rlx", {})

    def __enter__(self):
        self.saved = dict(self.module.PARAMS)
        self.module.PARAMS.update(self.overrides)

    def __exit__(self, *exc):
        self.module.PARAMS.clear()
        self.module.PARAMS.update(self.saved)


def attempt_with_params(module, case, results, key, work):
    with module_params(module, case):
        attempt(results, key, work)


def run_case(module, case):
    results = {}

    def full():
        batch, leaves = build(module, case)
        out = module.evaluate(batch, case.get("config"))
        entry = {
            "kept": [bool(k) for k in out["kept"]],
            "metrics": {name: float(out[name]) for name in module.METRICS},
        }
        for key in ("reward", "advantage"):
            if key in out:
                entry[key] = floats(out[key])
        if "loss" in out:
            entry["loss"] = float(out["loss"])
            entry["grad"] = gradients(module, out["loss"], batch, leaves)
        rewards = module.compute_rewards(batch, case.get("config"))
        entry["compute_rewards_advantage"] = floats(rewards["advantage"]) if "advantage" in rewards else None
        return entry

    attempt(results, "full", full)

    def reward_side_metrics():
        batch, _ = build(module, case)
        metrics = module.reward_metrics(batch, case.get("config"))
        return {"metrics": dict(metrics), "missing": metrics.missing, "names": list(module.REWARD_SIDE_METRICS)}

    attempt(results, "reward_metrics", reward_side_metrics)

    if case.get("compile"):

        def compiled():
            """Each stage function under torch.compile(fullgraph=True), against eager execution."""
            batch, _ = build(module, case)
            L, x = module._prepare(batch, case.get("config"), {}, module._ALL_INPUTS, module._ALL_TOKENS)
            difference = 0.0
            stages = [name for name in ("_reward", "_keep", "_advantage", "_loss") if getattr(module, name) is not None]
            stages += [f"_metric_{name}" for name in module.METRICS]
            v = {}
            for name in stages:
                function = getattr(module, name)
                if name == "_advantage" and module._keep is not None:
                    kept = module._kept(L, module._keep(L, x, dict(v)))
                    L, x, v, _ = module._select(L, x, v, kept, module._PHASE1_SHAPES)
                torch._dynamo.reset()
                fast = torch.compile(function, backend="aot_eager", fullgraph=True)(L, x, dict(v))
                slow = function(L, x, v)
                if name != "_keep":
                    difference = max(difference, float((torch.as_tensor(fast) - torch.as_tensor(slow)).abs().max()))
            return {"max_difference": difference}

        attempt(results, "compile", compiled)

    sub = case.get("subset")
    if sub is not None:
        rows = sub["rows"]

        def given_advantage():
            batch, leaves = build(module, case, rows)
            batch["advantages"] = torch.tensor(sub["advantage"], dtype=DT)
            value, metrics = module.loss(batch, case.get("config"))
            return {
                "loss": float(value),
                "metrics": dict(metrics),
                "missing": metrics.missing,
                "grad": gradients(module, value, batch, leaves),
            }

        attempt(results, "loss_given_advantage", given_advantage)

    verl = case.get("verl")
    if verl is not None and module.POLICY_LOSS_WHY is None:

        def verl_policy_loss():
            batch, leaves = build(module, case, verl["rows"])
            log_prob = batch[module.POLICY_INPUT]
            old = batch.get("old_logp", log_prob.detach())
            mask = batch["response_mask"]
            advantages = torch.tensor(verl["advantage"], dtype=DT)[:, None].expand(mask.shape)
            value, metrics = module.policy_loss(old, log_prob, advantages, mask, "token-mean", None, None)
            # With verl's global batch info for this very batch the rescaling is 1.
            tokens, sequences = int(mask.sum()), int(mask.any(1).sum())
            info = {"global_batch_info": {"dp_size": 1, "batch_num_tokens": tokens, "global_batch_size": sequences}}
            scaled, _ = module.policy_loss(old, log_prob, advantages, mask, "token-mean", info, None)
            return {
                "loss": float(value),
                "scaled_loss": float(scaled),
                "metrics": dict(metrics),
                "missing": metrics.missing,
                "returns": list(module.POLICY_LOSS_METRICS),
                "grad": gradients(module, value, batch, {module.POLICY_INPUT: log_prob}),
            }

        attempt_with_params(module, case, results, "policy_loss", verl_policy_loss)

    if module._ADVANTAGE_GIVEN_REWARD is not None and case.get("reward") is not None:

        def verl_advantage():
            batch, _ = build(module, case)
            mask = batch["response_mask"]
            lengths = mask.sum(1)
            rewards = torch.zeros(mask.shape, dtype=DT)
            for i, reward in enumerate(case["reward"]):
                rewards[i, max(int(lengths[i]) - 1, 0)] = reward
            uid = [f"prompt-{int(g)}" for g in batch["index"]]
            advantages, returns = module.advantage_estimator(rewards, mask, index=uid, config=None)
            per_response = [float(advantages[i, 0]) if lengths[i] > 0 else None for i in range(mask.shape[0])]
            return {"advantage": per_response}

        attempt_with_params(module, case, results, "advantage_estimator", verl_advantage)

    if module._reward is not None and module.REWARD_PER_RESPONSE:

        def verl_compute_score():
            data = case["batch"]
            scores = []
            for r in range(len(data["lengths"])):
                extra = {}
                for name in module.REWARD_INPUTS:
                    level, feature = level_of(module, name)
                    value = data["inputs"][name]
                    if level == "batch":
                        extra[name] = value
                    elif level == "tok" or feature is not None:
                        extra[name] = value[r]
                    else:
                        extra[name] = value[r][0]
                scores.append(module.compute_score("rlx-test", "a response", None, extra_info=extra, response_length=data["lengths"][r]))
            return {"reward": scores}

        attempt_with_params(module, case, results, "compute_score", verl_compute_score)

    def trl_columns(names):
        data = case["batch"]
        columns = {}
        for name in names:
            level, feature = level_of(module, name)
            value = data["inputs"][name]
            if level == "batch":
                columns[name] = [value] * len(data["lengths"])
            elif feature is not None or level == "pair":
                columns[name] = value
            elif level != "tok":
                columns[name] = [row[0] for row in value]
        prompts = [f"prompt {g}" for g in data["groups"]]
        completions = ["a completion"] * len(prompts)
        completion_ids = [[7] * n for n in data["lengths"]]
        if "ids" in names:
            completion_ids = data["inputs"]["ids"]
        return prompts, completions, completion_ids, columns

    def tokens_from_ids_only(names):
        return all(level_of(module, name)[0] != "tok" or name == "ids" for name in names)

    if module._reward is not None and tokens_from_ids_only(module.REWARD_INPUTS):

        def trl_reward_func():
            prompts, completions, completion_ids, columns = trl_columns(module.REWARD_INPUTS)
            func = module.make_reward_func()
            reward = func(prompts, completions, completion_ids, **columns)
            return {"reward": reward, "metrics": dict(func.metrics), "missing": func.metrics.missing}

        attempt_with_params(module, case, results, "reward_func", trl_reward_func)

    if module._advantage is not None and tokens_from_ids_only(module._ADVANTAGE_INPUTS):

        def trl_advantage_func():
            prompts, completions, completion_ids, columns = trl_columns(module._ADVANTAGE_INPUTS)
            func = module.make_reward_func(output="advantage")
            advantage = func(prompts, completions, completion_ids, **columns)
            entry = {"advantage": advantage, "metrics": dict(func.metrics), "missing": func.metrics.missing}
            if func.reward_func is not None:  # the companion: the reward of the completions just scored
                entry["reward"] = func.reward_func(prompts, completions, completion_ids, **columns)
            return entry

        attempt_with_params(module, case, results, "reward_func_advantage", trl_advantage_func)

    return results


def main():
    with open(sys.argv[1]) as f:
        manifest = json.load(f)
    modules = {}
    out = []
    for index, case in enumerate(manifest["cases"]):
        path = case["module"]
        try:
            if path not in modules:
                modules[path] = load(path, f"rlx_export_case_{len(modules)}")
            out.append(run_case(modules[path], case))
        except Exception as error:
            out.append({"load": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()})
    with open(sys.argv[2], "w") as f:
        json.dump({"torch": torch.__version__, "results": out}, f)


if __name__ == "__main__":
    main()
