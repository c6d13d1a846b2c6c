"""The same f32 products as `cargo run --release -p rlx-trainer --example gemm_rate [THREADS]`, in torch.

    ~/.cache/rlx/torch/bin/python scripts/gemm_rate.py [THREADS]

One JSON line per shape and layout (NN: x·W, NT: x·Wᵀ, TN: ∂yᵀ·x), GFLOP/s over wall time and over the
process's CPU time, the median of 10 products after 3 warm-ups; THREADS (default: torch's) sets
torch.set_num_threads. docs/performance.md, item 13.
"""
import json
import sys
import time

import torch


def main():
    if len(sys.argv) > 1:
        torch.set_num_threads(int(sys.argv[1]))
    for m, k, n in [(1632, 576, 1536), (1632, 1536, 576), (576, 1632, 1536)]:
        for layout in ["NN", "NT", "TN"]:
            a = torch.randn(k, m).t() if layout == "TN" else torch.randn(m, k)
            b = torch.randn(n, k).t() if layout == "NT" else torch.randn(k, n)
            wall, cpu = [], []
            for run in range(13):
                w0, c0 = time.perf_counter(), time.process_time()
                c = a @ b
                w1, c1 = time.perf_counter() - w0, time.process_time() - c0
                del c
                if run >= 3:
                    wall.append(w1)
                    cpu.append(c1)
            flop = 2.0 * m * k * n
            print(json.dumps({
                "side": "torch", "m": m, "k": k, "n": n, "layout": layout,
                "threads": torch.get_num_threads(),
                "gflops_wall": round(flop / sorted(wall)[5] / 1e9, 1),
                "gflops_cpu": round(flop / sorted(cpu)[5] / 1e9, 1),
            }))


if __name__ == "__main__":
    main()
