#!/usr/bin/env python3
"""The LM head as PyTorch computes it (materialised logits), next to rlx's fused head.

Usage: torch_head_bench.py RLX_JSON [--runs K]

RLX_JSON is what `cargo run --example lm_head_bench` wrote (trainer/examples/lm_head_bench.rs): its
device, rows, vocab and hidden say the shapes; this script builds the same inputs from the same formula
(f64, rounded to f32), runs one forward + backward pass of sum(logp) + 0.5 * sum(entropy) through the
full [rows, vocab] logits (log_softmax, gather, -sum p log p), the median of K synchronised runs, with
torch.cuda.max_memory_allocated above the inputs (on the CPU: the resident set's growth), compares the
four values (sum logp, sum entropy, |d hidden|^2, |d weight|^2) within 1e-3 relative, prints one JSON
line and a summary line, and exits 1 on a disagreement.
"""

import json
import sys
import time


def rss_bytes(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    return 0


def main():
    import torch

    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    rlx = json.load(open(args[0]))
    runs = int(args[args.index("--runs") + 1]) if "--runs" in args else int(rlx["runs"])
    n, v, h = rlx["rows"], rlx["vocab"], rlx["hidden"]
    name = rlx["device"]
    device = torch.device("cpu" if name == "cpu" else name)
    cuda = device.type == "cuda"

    f64 = dict(dtype=torch.float64, device=device)
    i = torch.arange(n, **f64).unsqueeze(1)
    j = torch.arange(h, **f64).unsqueeze(0)
    hidden = torch.sin(0.37 * i + 1.31 * j + 0.5).float()
    vv = torch.arange(v, **f64).unsqueeze(1)
    weight = (0.08 * torch.cos(0.73 * vv + 2.17 * j + 0.011 * vv * j)).float()
    del i, j, vv
    targets = (torch.arange(n, device=device, dtype=torch.int64) * 7919 + 13) % v
    hidden.requires_grad_(True)
    weight.requires_grad_(True)

    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    else:
        try:
            open("/proc/self/clear_refs", "w").write("5")
        except OSError:
            pass
        base = rss_bytes("VmRSS:")
    times = []
    values = None
    for _ in range(runs):
        hidden.grad = None
        weight.grad = None
        start = time.perf_counter()
        logits = hidden @ weight.t()
        log_softmax = torch.log_softmax(logits, dim=-1)
        logp = log_softmax.gather(1, targets.unsqueeze(1)).squeeze(1)
        entropy = -(log_softmax.exp() * log_softmax).sum(-1)
        loss = logp.sum() + 0.5 * entropy.sum()
        loss.backward()
        if cuda:
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
        values = (
            logp.double().sum().item(),
            entropy.double().sum().item(),
            hidden.grad.double().pow(2).sum().item(),
            weight.grad.double().pow(2).sum().item(),
        )
        del logits, log_softmax, logp, entropy, loss
    if cuda:
        # Above the inputs, with the gradients of the last run still held (as rlx's pool counts them).
        peak = torch.cuda.max_memory_allocated(device) - base
        gpu = torch.cuda.get_device_name(device)
    else:
        peak = rss_bytes("VmHWM:") - base
        gpu = None
    times.sort()
    seconds = times[len(times) // 2]

    keys = ["logp_sum", "entropy_sum", "grad_hidden_sq", "grad_weight_sq"]
    worst = 0.0
    for key, ours in zip(keys, values):
        theirs = rlx[key]
        worst = max(worst, abs(ours - theirs) / max(abs(ours), abs(theirs), 1e-30))
    agree = worst <= 1e-3
    result = {
        "device": name,
        "gpu": gpu,
        "rows": n,
        "vocab": v,
        "hidden": h,
        "torch_seconds": seconds,
        "torch_peak_bytes": peak,
        "rlx_seconds": rlx["seconds"],
        "rlx_peak_bytes": rlx["peak_bytes"],
        "memory_ratio": peak / max(rlx["peak_bytes"], 1),
        "speed_ratio": seconds / max(rlx["seconds"], 1e-12),
        "worst_relative_difference": worst,
        "agree": agree,
    }
    print(json.dumps(result))
    mib = 1 << 20
    print(
        f"lm head {n} x {v} (hidden {h}) on {name}: rlx fused {rlx['seconds'] * 1e3:.1f} ms, "
        f"{rlx['peak_bytes'] / mib:.0f} MiB; torch materialised {seconds * 1e3:.1f} ms, "
        f"{peak / mib:.0f} MiB; memory {result['memory_ratio']:.1f}x below torch "
        f"(target >= 4x); values agree within {worst:.1e} (1e-3)"
    )
    if not agree:
        print("torch_head_bench: rlx and torch disagree", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
