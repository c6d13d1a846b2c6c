#!/usr/bin/env python3
"""The torch side of scripts/peer-bench.sh: the computation of `rlx bench-model`'s sample and train phases
in Hugging Face transformers + PyTorch, on the same model folder (the one `rlx export --config` writes)
and the same shapes, on the same cores. Prints one JSON line per phase, with the fields of rlx's lines.

  sample: `generate` of ROWS rows × NEW exactly (min_new_tokens = max_new_tokens, so no row stops early),
          sampling at temperature 1, KV cache, f32, left-padded prompts of PROMPT tokens (random ids).
  train:  forward over ROWS × WIDTH tokens, the LM head on the completion positions only (the hidden
          states narrowed first, as rlx's fused head does), log-softmax, the log-prob of each completion
          token, loss −mean, backward, torch.optim.AdamW (foreach) with the same lr and weight decay;
          median of RUNS passes after none (the first pass counts, as in rlx).

peak_rss_bytes is the process's peak resident set (ru_maxrss), model weights included.

Usage: peer_bench.py MODEL_DIR --rows R --new-tokens T --prompt P --width W --runs N --lr LR --wd WD
       [--phases sample,train] [--micro-batch M]
"""
import argparse
import json
import resource
import statistics
import time

import torch
from transformers import AutoModelForCausalLM


def peak_rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--rows", type=int, required=True)
    p.add_argument("--new-tokens", type=int, required=True)
    p.add_argument("--prompt", type=int, required=True, help="prompt tokens per row")
    p.add_argument("--width", type=int, required=True, help="prompt + completion tokens per row")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--wd", type=float, default=0.0)
    p.add_argument("--micro-batch", type=int, default=0)
    p.add_argument("--phases", default="sample,train")
    a = p.parse_args()
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    vocab = model.config.vocab_size
    phases = a.phases.split(",")

    if "sample" in phases:
        model.eval()
        ids = torch.randint(0, vocab, (a.rows, a.prompt))
        mask = torch.ones_like(ids)
        with torch.no_grad():
            start = time.perf_counter()
            cpu_start = time.process_time()
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=a.new_tokens,
                min_new_tokens=a.new_tokens,
                pad_token_id=0,
            )
            seconds = time.perf_counter() - start
            cpu = time.process_time() - cpu_start
        generated = (out.shape[1] - a.prompt) * a.rows
        print(json.dumps({
            "phase": "sample", "peer": "torch", "rows": a.rows, "new_tokens": a.new_tokens,
            "tokens": generated, "seconds": seconds, "tokens_per_s": generated / seconds, "cpu_seconds": cpu,
            "peak_rss_bytes": peak_rss(), "threads": threads,
        }), flush=True)

    if "train" in phases:
        model.train()
        completion = a.width - a.prompt
        ids = torch.randint(0, vocab, (a.rows, a.width))
        optimizer = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.wd, foreach=True)
        micro = a.micro_batch or a.rows
        count = a.rows * completion
        times, cpu_times = [], []
        for _ in range(a.runs):
            start = time.perf_counter()
            cpu_start = time.process_time()
            for first in range(0, a.rows, micro):
                rows = ids[first:first + micro]
                hidden = model.model(input_ids=rows).last_hidden_state
                logits = model.lm_head(hidden[:, a.prompt - 1:-1])
                logp = torch.log_softmax(logits, -1).gather(-1, rows[:, a.prompt:, None]).squeeze(-1)
                loss = -logp.sum() / count
                loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - cpu_start)
        seconds = statistics.median(times)
        print(json.dumps({
            "phase": "train", "peer": "torch", "rows": a.rows, "width": a.width,
            "completion_tokens": count, "micro_batch": micro, "runs": a.runs, "seconds": seconds,
            "seconds_each": times, "tokens_per_s": a.rows * a.width / seconds,
            "cpu_seconds": statistics.median(cpu_times),
            "peak_rss_bytes": peak_rss(), "threads": threads,
        }), flush=True)


if __name__ == "__main__":
    main()
