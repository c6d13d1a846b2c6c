#!/usr/bin/env python3
"""The baseline of the GPU benchmark (scripts/gpu-check.sh, docs/gpu.md): DAPO and DARLING written as
PyTorch eager ops the way verl computes them (`compute_grpo_outcome_advantage`,
`compute_policy_loss_vanilla` with clip-higher and the dual clip, `agg_loss(token-mean)`, the k3 KL
penalty), on the same batch the fused kernel ran on (the inputs the Rust benchmark wrote to
$RLX_BENCH_OUT as raw little-endian f32), timed forward + backward on the same GPU, with peak memory.

It also measures the GPU's copy bandwidth (a 1 GiB device-to-device copy) and prints one summary table:
fused kernel vs eager time, the speed-up, peak memory, and the bandwidth bound (the bytes a fused run must
read and write at the measured bandwidth), and checks that eager PyTorch and rlx computed the same loss.

Usage: torch_eager_bench.py BENCH_DIR   (BENCH_DIR holds rlx.json and the *.f32 inputs)
"""
import json
import os
import sys

import torch

EPS = 1e-6


def load(directory, recipe, name, shape, device):
    data = torch.from_numpy(
        __import__("numpy").fromfile(os.path.join(directory, f"{recipe}.{name}.f32"), dtype="<f4")
    )
    return data.reshape(shape).to(device)


def masked_mean(x, mask):
    # verl.utils.torch_functional.masked_mean
    return (x * mask).sum() / (mask.sum() + 1e-8)


def grpo_advantage(scores, groups, responses):
    # verl compute_grpo_outcome_advantage (norm_adv_by_std_in_grpo=True), groups of equal size.
    s = scores.view(groups, responses)
    mean = s.mean(dim=1, keepdim=True)
    std = s.std(dim=1, keepdim=True)
    return ((s - mean) / (std + EPS)).view(-1)


def dapo(inputs, groups, responses, tokens):
    logp, old_logp, mask, score = inputs["logp"], inputs["old_logp"], inputs["mask"], inputs["score"]
    # reward: score + the overlong penalty of verl's DAPO reward manager (L_max 20480, L_cache 4096).
    length = mask.new_full((groups * responses,), float(tokens))
    exceed = length - (20480 - 4096)
    reward = score + torch.clamp(-exceed / 4096 * 1.0, max=0.0)
    # dynamic sampling: groups whose rewards all agree are dropped.
    keep = reward.view(groups, responses).std(dim=1) > 0
    kept = keep.repeat_interleave(responses)
    advantages = torch.zeros_like(reward)
    advantages[kept] = grpo_advantage(reward[kept], int(keep.sum()), responses)
    adv = advantages.unsqueeze(-1) * mask * kept.unsqueeze(-1)
    m = mask * kept.unsqueeze(-1)
    # compute_policy_loss_vanilla (clip_ratio_low 0.2, clip_ratio_high 0.28, clip_ratio_c 10).
    negative_approx_kl = torch.clamp(logp - old_logp, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = masked_mean(-negative_approx_kl, m)
    pg_losses1 = -adv * ratio
    pg_losses2 = -adv * torch.clamp(ratio, 1 - 0.2, 1 + 0.28)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).float(), m)
    pg_losses3 = -adv * 10.0
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_clipfrac_lower = masked_mean(torch.gt(clip_pg_losses1, pg_losses3) * (adv < 0).float(), m)
    pg_losses = torch.where(adv < 0, clip_pg_losses2, clip_pg_losses1)
    loss = masked_mean(pg_losses, m)
    return loss, [pg_clipfrac, pg_clipfrac_lower, ppo_kl, reward.mean()]


def darling(inputs, groups, responses, tokens):
    logp, old_logp, ref_logp = inputs["logp"], inputs["old_logp"], inputs["ref_logp"]
    quality, cluster = inputs["quality"], inputs["cluster"]
    mask = torch.ones_like(logp)
    # partition diversity: the share of the other responses in another cluster, floored at 0.1.
    c = cluster.view(groups, responses)
    differs = (c.unsqueeze(2) != c.unsqueeze(1)).float()
    diversity = torch.clamp(differs.sum(dim=2) / (responses - 1), min=0.1).view(-1)
    reward = quality * diversity
    r = reward.view(groups, responses)
    advantages = (r - r.mean(dim=1, keepdim=True)).view(-1)
    adv = advantages.unsqueeze(-1) * mask
    ratio = torch.exp(logp - old_logp)
    pg_losses1 = -adv * ratio
    pg_losses2 = -adv * torch.clamp(ratio, 1 - 0.2, 1 + 0.2)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    clip_pg_losses2 = torch.min(-adv * 3.0, clip_pg_losses1)
    pg_losses = torch.where(adv < 0, clip_pg_losses2, clip_pg_losses1)
    pg_loss = masked_mean(pg_losses, mask)
    # verl kl_penalty "low_var_kl" (k3), clamped as verl does.
    kl = torch.clamp(ref_logp - logp, min=-20.0, max=20.0)
    k3 = torch.clamp(torch.exp(kl) - kl - 1, min=-10.0, max=10.0)
    loss = pg_loss + 0.001 * masked_mean(k3, mask)
    clip_frac = ((ratio < 0.8) | (ratio > 1.2)).float().mean()
    return loss, [diversity.mean(), quality.mean(), clip_frac]


RECIPES = {
    "dapo": (dapo, {"logp": "tok", "old_logp": "tok", "score": "resp", "mask": "tok"}),
    "darling": (
        darling,
        {"logp": "tok", "old_logp": "tok", "ref_logp": "tok", "quality": "resp", "cluster": "resp"},
    ),
}


def bandwidth(device):
    """Device-to-device copy bandwidth in bytes/s (read + write), median of 10 copies of 1 GiB."""
    n = 1 << 28
    a = torch.empty(n, dtype=torch.float32, device=device)
    b = torch.empty_like(a)
    times = []
    for _ in range(12):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        b.copy_(a)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del a, b
    torch.cuda.empty_cache()
    times = sorted(times[2:])
    return 2 * n * 4 / times[len(times) // 2]


def main():
    directory = sys.argv[1]
    with open(os.path.join(directory, "rlx.json")) as f:
        rlx = json.load(f)
    groups, responses, tokens = rlx["groups"], rlx["responses"], rlx["tokens"]
    device = torch.device("cuda")
    bw = bandwidth(device)
    print(f"GPU: {torch.cuda.get_device_name(device)}, torch {torch.__version__}, "
          f"measured copy bandwidth {bw / 1e9:.0f} GB/s")
    rows = []
    ok = True
    for recipe, (function, shapes) in RECIPES.items():
        inputs = {}
        for name, level in shapes.items():
            shape = (groups * responses, tokens) if level == "tok" else (groups * responses,)
            inputs[name] = load(directory, recipe, name, shape, device)
        inputs["logp"].requires_grad_(True)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        times = []
        loss_value = None
        for rep in range(25):
            inputs["logp"].grad = None
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            loss, metrics = function(inputs, groups, responses, tokens)
            loss.backward()
            # The metrics are outputs too (the fused kernel returns them): bring them to the host.
            values = [m.item() for m in metrics]
            end.record()
            torch.cuda.synchronize()
            if rep >= 5:
                times.append(start.elapsed_time(end))
            loss_value = loss.item()
        peak = torch.cuda.max_memory_allocated(device) - base
        eager_ms = sorted(times)[len(times) // 2]
        for run in rlx["runs"]:
            if run["recipe"] != recipe:
                continue
            bound_ms = run["bytes"] / bw * 1e3
            agree = abs(run["loss"] - loss_value) <= 1e-3 * max(abs(run["loss"]), abs(loss_value)) + 1e-5
            ok &= agree
            rows.append((recipe, run["accumulate"], run["kernel_ms"], run["end_to_end_ms"], eager_ms,
                         eager_ms / run["kernel_ms"], bound_ms, run["kernel_ms"] / bound_ms,
                         run["device_bytes"] / 2**20, peak / 2**20,
                         run["loss"], loss_value, agree))
        del inputs
        torch.cuda.empty_cache()
    print()
    print(f"{groups} groups x {responses} responses x {tokens} tokens "
          f"({groups * responses * tokens:,} tokens); times are medians of 20 runs")
    header = ("recipe", "acc", "rlx kernels ms", "rlx e2e ms", "eager ms", "speed-up",
              "bound ms", "x bound", "rlx MiB", "eager peak MiB", "rlx loss", "eager loss", "agree")
    print(" | ".join(header))
    for row in rows:
        print(" | ".join([row[0], row[1], f"{row[2]:.3f}", f"{row[3]:.3f}", f"{row[4]:.3f}",
                          f"{row[5]:.1f}x", f"{row[6]:.3f}", f"{row[7]:.2f}", f"{row[8]:.0f}",
                          f"{row[9]:.0f}", f"{row[10]:.7f}", f"{row[11]:.7f}", str(row[12])]))
    print()
    print("rlx MiB: inputs + the kernel's buffers on the GPU; eager peak MiB: memory allocated by the "
          "eager forward + backward beyond its inputs. bound: bytes read and written once at the "
          "measured copy bandwidth.")
    if not ok:
        print("error: eager PyTorch and rlx disagree on a loss", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
