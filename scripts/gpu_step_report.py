#!/usr/bin/env python3
"""Compare an `rlx run` on a GPU with the same run's first step on the CPU (scripts/gpu-check.sh).

Usage: gpu_step_report.py GPU_RUN_DIR CPU_RUN_DIR [--json FILE] [--rtol R]

Both directories are `rlx run` outputs of the same recipe, config and seed (the CPU one may stop after
its first step). Reads their metrics.jsonl and samples.jsonl (step 0 must be written: train.samples_every
divides 0, so it always is) and prints one JSON line and a summary:

- the first step's loss on both devices. The runs sample with the same random stream, so their step-0
  completions are the same unless float rounding flipped a draw; when they are identical the losses
  must agree within 1e-3 relative + 1e-5 (`--rtol` sets the relative part: gpu-check.sh gives 0.05 to
  the run whose products are bf16) (else exit status 1), when they differ the report says in how many
  rows and does not compare the losses;
- sampling and training tokens/s and the step time: the GPU's median over the steps after the first
  (the first also compiles the recipe's kernels), and the CPU's first step;
- the GPU's peak memory (the largest `gpu/peak_bytes` of a step; absent on the CPU);
- the reward curve (`reward/mean` per step) and the step-time target (< 5 s).
"""

import json
import statistics
import sys


def lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def step_samples(run):
    return [
        (s.get("prompt"), s.get("completion"))
        for s in lines(f"{run}/samples.jsonl")
        if s.get("step") == 0
    ]


def main():
    args = sys.argv[1:]
    if len(args) < 2:
        sys.exit(__doc__)
    gpu_run, cpu_run = args[0], args[1]
    out = args[args.index("--json") + 1] if "--json" in args else None
    rtol = float(args[args.index("--rtol") + 1]) if "--rtol" in args else 1e-3
    if not rtol >= 0:
        sys.exit(f"gpu_step_report: --rtol {rtol} must be >= 0")
    gpu = lines(f"{gpu_run}/metrics.jsonl")
    cpu = lines(f"{cpu_run}/metrics.jsonl")
    if not gpu or not cpu:
        sys.exit("gpu_step_report: a run has no metrics (metrics.jsonl is empty)")
    gpu_samples, cpu_samples = step_samples(gpu_run), step_samples(cpu_run)
    if not gpu_samples or len(gpu_samples) != len(cpu_samples):
        sys.exit(
            f"gpu_step_report: step 0 has {len(gpu_samples)} samples on the GPU, "
            f"{len(cpu_samples)} on the CPU"
        )
    differing = sum(a != b for a, b in zip(gpu_samples, cpu_samples))
    loss_gpu, loss_cpu = gpu[0].get("loss"), cpu[0].get("loss")
    if differing:
        agreement = f"not compared: {differing} of {len(gpu_samples)} step-0 completions differ (a draw flipped by float rounding)"
        ok = True
    elif loss_gpu is None or loss_cpu is None:
        agreement = "not compared: the first step was skipped (the recipe's keep dropped every group)"
        ok = True
    else:
        difference = abs(loss_gpu - loss_cpu)
        bound = rtol * max(abs(loss_gpu), abs(loss_cpu)) + 1e-5
        ok = difference <= bound
        agreement = (
            f"{'agree' if ok else 'DISAGREE'}: |{loss_gpu:.6g} - {loss_cpu:.6g}| = {difference:.2e} "
            f"(bound {bound:.2e}), same {len(gpu_samples)} completions"
        )
    later = gpu[1:] or gpu

    def median(key, rows):
        values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
        return statistics.median(values) if values else None

    peaks = [r["gpu/peak_bytes"] for r in gpu if "gpu/peak_bytes" in r]
    report = {
        "steps": len(gpu),
        "first_loss_gpu": loss_gpu,
        "first_loss_cpu": loss_cpu,
        "step0_samples": len(gpu_samples),
        "step0_samples_differing": differing,
        "agreement_ok": ok,
        "gpu_step_s": median("step_time_s", later),
        "gpu_first_step_s": gpu[0].get("step_time_s"),
        "cpu_first_step_s": cpu[0].get("step_time_s"),
        "gpu_sample_tokens_per_s": median("sample_tokens_per_s", later),
        "gpu_train_tokens_per_s": median("train_tokens_per_s", later),
        "cpu_sample_tokens_per_s": cpu[0].get("sample_tokens_per_s"),
        "cpu_train_tokens_per_s": cpu[0].get("train_tokens_per_s"),
        "gpu_peak_bytes": max(peaks) if peaks else None,
        "reward_curve": [r.get("reward/mean") for r in gpu],
    }
    line = json.dumps(report)
    print(line)
    if out:
        with open(out, "w") as f:
            f.write(line + "\n")

    def fmt(value, unit="", scale=1.0, digits=1):
        return "n/a" if value is None else f"{value * scale:.{digits}f}{unit}"

    step = report["gpu_step_s"]
    print(f"first-step loss: {agreement}")
    print(
        f"step time: GPU {fmt(step, ' s', digits=2)} (median of steps 2..{len(gpu)}; first "
        f"{fmt(report['gpu_first_step_s'], ' s', digits=2)}), CPU first step "
        f"{fmt(report['cpu_first_step_s'], ' s', digits=2)}; target < 5 s: "
        f"{'met' if step is not None and step < 5 else 'NOT met'}"
    )
    print(
        f"tokens/s: sampling GPU {fmt(report['gpu_sample_tokens_per_s'])} / CPU "
        f"{fmt(report['cpu_sample_tokens_per_s'])}, training GPU {fmt(report['gpu_train_tokens_per_s'])} "
        f"/ CPU {fmt(report['cpu_train_tokens_per_s'])}"
    )
    print(f"GPU peak memory per step: {fmt(report['gpu_peak_bytes'], ' MiB', 1 / (1 << 20), 0)}")
    curve = ", ".join("n/a" if r is None else f"{r:.3f}" for r in report["reward_curve"])
    print(f"reward/mean by step: {curve}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
