"""Every entry point of an exported module gets the responses' true token counts or fails loudly,
never counting padding as tokens or a missing length as 0 (tests/export.rs runs this).

Usage: python3 lengths.py MODULE.py, MODULE exported from recipes/dapo.rlx with max_len=10 and
len_buffer=4, so the reward is score + min(-(length - 6) / 4, 0): a response of 8 tokens loses 0.5.
Also: what the reward functions log when `keep` drops every response. Prints OK when every check holds.
"""

import importlib.util
import math
import sys

import torch

spec = importlib.util.spec_from_file_location("rlx_dapo_lengths", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)


def raises(what, needles, work):
    try:
        work()
    except (ValueError, KeyError) as error:
        text = str(error)
        missing = [n for n in needles if n not in text]
        assert not missing, f"{what}: the error lacks {missing}: {text}"
        return
    raise AssertionError(f"{what}: no error")


def close(a, b):
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


assert m.REWARD_TOKENS == "`length` (each response's token count)", m.REWARD_TOKENS
assert m._ALL_TOKENS is not None and m._ADVANTAGE_TOKENS is not None

# verl's compute_score: reward managers pass no length, so it must come with the inputs.
raises(
    "compute_score without response_length",
    ["`response_length`", "verl's reward managers do not pass", "reads `length`"],
    lambda: m.compute_score("src", "an answer", None, extra_info={"score": 1.0}),
)
assert close(m.compute_score("src", "an answer", None, extra_info={"score": 1.0, "response_length": 8}), 0.5)
assert close(m.compute_score("src", "an answer", None, extra_info={"score": 1.0}, response_length=3), 1.0)
judged = m.make_compute_score(lambda *args: {"score": 1.0, "response_length": 10})
assert close(judged("src", "an answer", None, extra_info={}), 0.0)
for bad in (2.5, -1, math.nan):
    raises(
        f"compute_score with response_length={bad}",
        ["`response_length`"],
        lambda: m.compute_score("src", "x", None, extra_info={"score": 1.0, "response_length": bad}),
    )

# TRL's reward_funcs: the lengths of completion_ids.
prompts, completions = ["p", "p", "q", "q"], ["a", "b", "c", "d"]
ids = [[5] * 8, [5] * 3, [5] * 7, [5] * 6]
rewards = m.reward_func(prompts, completions, completion_ids=ids, score=[1.0, 1.0, 0.0, 0.0])
assert all(close(a, b) for a, b in zip(rewards, [0.5, 1.0, -0.25, 0.0])), rewards
raises(
    "reward_func without completion_ids",
    ["`completion_ids`", "reads `length`"],
    lambda: m.reward_func(prompts, completions, score=[1.0, 1.0, 0.0, 0.0]),
)
advantage = m.make_reward_func(output="advantage")
values = advantage(prompts, completions, completion_ids=ids, score=[1.0, 1.0, 0.0, 0.0])
assert values[0] < 0 < values[1] and values[2] < 0 < values[3], values
raises(
    "reward_func(output='advantage') without completion_ids",
    ["`completion_ids`"],
    lambda: advantage(prompts, completions, score=[1.0, 1.0, 0.0, 0.0]),
)

# When `keep` drops every response (each group uniform, no length penalty under 6 tokens), rlx skips the
# step and logs no recipe metric: the reward function still returns the rewards, computes no metric
# (each named in `metrics.missing`) and logs none; the advantage function fails as the interpreter does.
logged = []
uniform = dict(completion_ids=[[5] * 3] * 4, score=[1.0, 1.0, 0.0, 0.0], log_metric=lambda *a: logged.append(a))
assert m.reward_func(prompts, completions, **uniform) == [1.0, 1.0, 0.0, 0.0]
assert dict(m.reward_func.metrics) == {} and not logged, (m.reward_func.metrics, logged)
assert "`keep` dropped every response" in m.reward_func.metrics.missing["reward_mean"], m.reward_func.metrics.missing
try:
    advantage(prompts, completions, **uniform)
    raise AssertionError("reward_func(output='advantage') with every response dropped: no error")
except ValueError as error:
    assert "every response was filtered out" in str(error), error
m.reward_func(prompts, completions, **dict(uniform, score=[1.0, 0.0, 0.0, 1.0]))
assert close(m.reward_func.metrics["reward_mean"], 0.5) and logged == [("rlx/reward_mean", 0.5)], logged

# evaluate / compute_rewards / loss on a padded batch: the mask (or the lengths) is required.
lengths = [8, 3, 7, 6]
B, T = len(lengths), max(lengths)
mask = torch.zeros(B, T, dtype=torch.bool)
for i, n in enumerate(lengths):
    mask[i, :n] = True
logp = torch.where(mask, -torch.rand(B, T, dtype=torch.float64), math.nan)
batch = {"logp": logp, "old_logp": logp.detach(), "score": torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64),
         "index": [0, 0, 1, 1]}
for entry in (m.evaluate, m.compute_rewards, m.loss):
    raises(
        f"{entry.__name__} without response_mask",
        ["`response_mask`", "`response_length`", "padding would count as tokens", "reads the token-level input"],
        lambda: entry(dict(batch)),
    )
with_mask = m.compute_rewards(dict(batch, response_mask=mask))
with_lengths = m.compute_rewards(dict(batch, response_length=lengths))
for key in ("reward", "advantage", "loss"):
    assert torch.allclose(with_mask[key], with_lengths[key], rtol=1e-12, atol=0), key
assert close(float(with_mask["reward"][0]), 1.0 - 0.5)
raises(
    "response_mask and response_length disagreeing",
    ["disagree"],
    lambda: m.compute_rewards(dict(batch, response_mask=mask, response_length=[8, 3, 7, 5])),
)
raises(
    "response_length past the token inputs' width",
    ["8 tokens", "7 wide"],
    lambda: m.compute_rewards(dict(batch, logp=logp[:, :7], old_logp=logp[:, :7], response_length=lengths)),
)
print("OK")
