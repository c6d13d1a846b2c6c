#!/usr/bin/env python3
"""The Python binding's benchmark (docs/python.md): DAPO's loss and gradient on one CPU thread, from
Python, as rlx's fused kernel (`rlx.Recipe("recipes/dapo.rlx").torch()`) and as verl computes it
(verl's own `compute_grpo_outcome_advantage` and `compute_policy_loss_vanilla` with token-mean, on the
groups dynamic sampling keeps, then torch autograd), on the same float32 batch: G groups × N responses
× T tokens (every response T tokens long, padded layout with a full `response_mask`, as verl holds it).

Each measurement is one training step's objective: forward and backward (∂loss/∂log_prob), median
(and minimum) of `--runs`, the three variants interleaved, after one warm-up: rlx as
`Recipe.torch()` gives it (float32 tensors: f32 element-wise arithmetic, as verl computes, with
f64 sums), rlx with f64 arithmetic (`Recipe.torch(accumulate="f64")`), verl. Both sides run on one thread (`torch.set_num_threads(1)`,
RAYON_NUM_THREADS=1 for rlx's kernel). The losses and gradients are checked to agree. Each run is
timed twice: wall-clock (`*_ms`) and the process's CPU time (`*_cpu_ms`, `time.process_time`: what
the step itself computed, which other work on a shared machine inflates less); `load` is the load
average (1 minute) before and after. A fourth variant, `rlx_packed_run_*`, is the kernel without torch:
`Recipe.run(accumulate="f32")` on the same values as packed float32 NumPy arrays with `lengths` (the binding's checks,
the kernel and its outputs; no autograd), so that the rest of `rlx_*` is the torch side's cost.

With `--ragged` each response has between T/2 and T real tokens (uniform), the rest of its row
padding (`response_mask` 0), as a trainer's batch holds them: rlx then gathers the rows into its packed
layout (and the packed variant gets only the real tokens).

Usage: python scripts/python_bench.py [--groups 64] [--n 8] [--tokens 1024] [--runs 7] [--ragged]
(the Python of scripts/install-torch.sh --with-verl, with the wheel of scripts/build-python.sh)
"""

import argparse
import json
import os
import statistics
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"  # before rlx's thread pool starts

import numpy as np  # noqa: E402
import torch  # noqa: E402

import rlx  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Config(dict):
    """What verl's vanilla loss reads from its ActorConfig (dapo.rlx's clip settings)."""

    def __getattr__(self, name):
        return self[name]


CONFIG = Config(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=10.0, global_batch_info={})


def make_batch(groups, n, tokens, seed=0, ragged=False):
    g = torch.Generator().manual_seed(seed)
    B = groups * n
    base = torch.empty(B, tokens).uniform_(-2.5, -0.2, generator=g)
    logp = base + torch.empty(B, tokens).uniform_(-0.15, 0.15, generator=g)
    old_logp = base + torch.empty(B, tokens).uniform_(-0.15, 0.15, generator=g)
    score = torch.randint(0, 2, (B,), generator=g).float() * 2 - 1
    index = np.repeat(np.arange(groups), n)
    if ragged:
        lengths = torch.randint(tokens // 2, tokens + 1, (B,), generator=g)
        mask = (torch.arange(tokens)[None, :] < lengths[:, None]).float()
    else:
        mask = torch.ones(B, tokens)
    return logp, old_logp, score, index, mask


def verl_step(logp, old_logp, score, index, mask, n):
    """DAPO as verl computes it: reward (score + the overlong penalty of verl's dapo reward manager),
    dynamic sampling (groups whose rewards all agree are dropped), GRPO advantages, the clipped loss."""
    B, T = logp.shape
    logp = logp.detach().requires_grad_(True)
    length = mask.sum(-1)
    reward = score + torch.clamp(-(length - (20480 - 4096)) / 4096 * 1.0, max=0.0)
    kept = (reward.view(-1, n).std(dim=1) > 0).repeat_interleave(n)
    rows = kept.nonzero().squeeze(-1)
    token_level_rewards = torch.zeros(B, T, dtype=logp.dtype)
    token_level_rewards[:, -1] = reward
    advantages, _ = core_algos.compute_grpo_outcome_advantage(token_level_rewards[rows], mask[rows], index[rows.numpy()])
    loss, _metrics = core_algos.compute_policy_loss_vanilla(
        old_logp[rows], logp[rows], advantages, mask[rows], "token-mean", CONFIG, None
    )
    loss.backward()
    return loss.detach(), logp.grad


def rlx_step(fn, logp, old_logp, score, index, mask):
    logp = logp.detach().requires_grad_(True)
    loss, _metrics = fn(logp=logp, old_logp=old_logp, score=score, index=index, response_mask=mask)
    loss.backward()
    return loss.detach(), logp.grad


def timed(works, runs):
    """Median and minimum wall-clock milliseconds and median CPU milliseconds of each of `works`, run
    interleaved (one of each per round, so a shared machine's load falls on all alike), after one
    warm-up round."""
    for work in works:
        work()
    times = [[] for _ in works]
    cpu = [[] for _ in works]
    for _ in range(runs):
        for work, out, out_cpu in zip(works, times, cpu):
            start, start_cpu = time.perf_counter(), time.process_time()
            work()
            out_cpu.append(time.process_time() - start_cpu)
            out.append(time.perf_counter() - start)
    return [(statistics.median(t) * 1e3, min(t) * 1e3, statistics.median(c) * 1e3) for t, c in zip(times, cpu)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--groups", type=int, default=64)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--ragged", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    batch = make_batch(args.groups, args.n, args.tokens, ragged=args.ragged)
    fn = rlx.Recipe(os.path.join(ROOT, "recipes", "dapo.rlx")).torch()

    ours = rlx_step(fn, *batch)
    theirs = verl_step(*batch, args.n)
    assert torch.allclose(ours[0], theirs[0], rtol=1e-4, atol=1e-6), (float(ours[0]), float(theirs[0]))
    assert torch.allclose(ours[1], theirs[1], rtol=1e-3, atol=1e-9), "the gradients differ"

    precise = rlx.Recipe(os.path.join(ROOT, "recipes", "dapo.rlx")).torch(accumulate="f64")
    ours_f64 = rlx_step(precise, *batch)
    assert torch.allclose(ours_f64[0], theirs[0], rtol=1e-4, atol=1e-6), (float(ours_f64[0]), float(theirs[0]))
    assert torch.allclose(ours_f64[1], theirs[1], rtol=1e-3, atol=1e-9), "the f64 gradients differ"
    logp, old_logp, score, index, mask = batch
    real = mask.numpy() > 0
    packed = dict(
        logp=logp.numpy()[real],
        old_logp=old_logp.numpy()[real],
        score=score.numpy(),
        index=index.astype(np.int64),
        lengths=real.sum(axis=1).astype(np.int64),
    )
    load_before = os.getloadavg()[0]
    (rlx_ms, rlx_min, rlx_cpu), (f64_ms, f64_min, f64_cpu), (verl_ms, verl_min, verl_cpu), (run_ms, _, run_cpu) = timed(
        [
            lambda: rlx_step(fn, *batch),
            lambda: rlx_step(precise, *batch),
            lambda: verl_step(*batch, args.n),
            lambda: fn.recipe.run(accumulate="f32", **packed),
        ],
        args.runs,
    )
    tokens = int(real.sum())
    result = {
        "groups": args.groups,
        "n": args.n,
        "tokens": args.tokens,
        "threads": 1,
        "ragged": args.ragged,
        "real_tokens": tokens,
        "rlx_ms": round(rlx_ms, 2),
        "rlx_min_ms": round(rlx_min, 2),
        "rlx_f64_ms": round(f64_ms, 2),
        "rlx_f64_min_ms": round(f64_min, 2),
        "verl_ms": round(verl_ms, 2),
        "verl_min_ms": round(verl_min, 2),
        "speedup": round(verl_ms / rlx_ms, 2),
        "speedup_min": round(verl_min / rlx_min, 2),
        "speedup_f64": round(verl_ms / f64_ms, 2),
        "rlx_cpu_ms": round(rlx_cpu, 2),
        "rlx_f64_cpu_ms": round(f64_cpu, 2),
        "verl_cpu_ms": round(verl_cpu, 2),
        "speedup_cpu": round(verl_cpu / rlx_cpu, 2),
        "speedup_f64_cpu": round(verl_cpu / f64_cpu, 2),
        "rlx_packed_run_ms": round(run_ms, 2),
        "rlx_packed_run_cpu_ms": round(run_cpu, 2),
        "load": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "rlx_tokens_per_s": round(tokens / rlx_ms * 1e3),
        "loss": float(ours[0]),
        "torch": torch.__version__,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
