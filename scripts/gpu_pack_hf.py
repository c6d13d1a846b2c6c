#!/usr/bin/env python3
"""A Hugging Face checkpoint of SmolLM2-135M's shape with random weights (scripts/gpu-check.sh --prebuilt).

Usage: gpu_pack_hf.py SRC OUT [--tiny] [--std S] [--seed N]

SRC holds SmolLM2-135M-Instruct's config.json and tokenizer files as `rlx export --config
configs/smollm2.toml --hf` writes them from the GGUF (scripts/gpu-pack.sh packs them; the GGUF's 98 MB of
weights do not travel). transformers builds `LlamaForCausalLM` from that config.json, every weight matrix
is drawn from N(0, S²) (norm weights stay 1) from torch's generator seeded with N, and `save_pretrained`
writes OUT/model.safetensors (f32); OUT then gets SRC's config.json (the form rlx reads; transformers'
serialisation of the same config may carry keys of its own version) and tokenizer files. --tiny keeps the
vocabulary, tokenizer, rotary settings and tied embeddings but shrinks the rest to 2 layers of width 64
(the smoke mode on a CPU).

S defaults to 0.2 rather than transformers' 0.02: with 0.02 the next-token distribution over the 49152
tokens is almost uniform (10.7 nats of entropy at SmolLM2-135M's shape, of the 10.8 of a uniform draw),
so float rounding flips many sampled tokens between the CPU and the GPU and the first step's completions,
hence losses, are rarely the same; with 0.2 it is peaked (3.4 nats, the most likely token 0.3 on
average), nearer a trained model's.

Prints one JSON line: the sizes, the parameter count, the bytes written and the seconds taken.
"""

import json
import os
import shutil
import sys
import time

TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"]
SMOLLM2_135M = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152}
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}


def fail(message):
    sys.exit(f"gpu_pack_hf: {message}")


def option(args, name, default, kind):
    if name not in args:
        return default
    at = args.index(name)
    if at + 1 >= len(args):
        fail(f"{name} needs a value")
    try:
        return kind(args[at + 1])
    except ValueError:
        fail(f"{name} {args[at + 1]}: not a {kind.__name__}")


def main():
    args = sys.argv[1:]
    positional = [a for i, a in enumerate(args)
                  if not a.startswith("--") and (i == 0 or args[i - 1] not in ("--std", "--seed"))]
    unknown = [a for a in args if a.startswith("--") and a not in ("--tiny", "--std", "--seed")]
    if unknown:
        fail(f"unknown option {unknown[0]} (options: --tiny, --std S, --seed N)")
    if len(positional) != 2:
        sys.exit(__doc__)
    source, out = positional
    tiny = "--tiny" in args
    std = option(args, "--std", 0.2, float)
    seed = option(args, "--seed", 0, int)
    if not 0 < std < 10:
        fail(f"--std {std}: expected a standard deviation in (0, 10)")
    started = time.time()

    try:
        config = json.load(open(os.path.join(source, "config.json")))
    except (OSError, ValueError) as e:
        fail(f"cannot read {source}/config.json: {e}")
    if config.get("architectures") != ["LlamaForCausalLM"]:
        fail(f"{source}/config.json: architectures {config.get('architectures')}, expected LlamaForCausalLM")
    differing = {k: (config.get(k), v) for k, v in SMOLLM2_135M.items() if config.get(k) != v}
    if differing:
        fail(f"{source}/config.json is not SmolLM2-135M's shape: {differing} (found, expected)")
    if tiny:
        config.update(TINY)
    if os.path.exists(out) and os.listdir(out):
        fail(f"{out} exists and is not empty")
    os.makedirs(out, exist_ok=True)

    import torch
    import transformers

    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    hf_config = transformers.AutoConfig.from_pretrained(out)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, std)
    model.save_pretrained(out, safe_serialization=True)
    # The config as rlx exported it (the architecture transformers just built), and the tokenizer.
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    for name in TOKENIZER_FILES:
        if os.path.exists(os.path.join(source, name)):
            shutil.copy(os.path.join(source, name), os.path.join(out, name))
        elif name in ("tokenizer.json", "tokenizer_config.json"):
            fail(f"{source} has no {name}")
    weights = os.path.join(out, "model.safetensors")
    if not os.path.exists(weights):
        fail(f"save_pretrained wrote no {weights}")
    print(json.dumps({
        "out": out,
        "shape": {k: config[k] for k in SMOLLM2_135M},
        "tiny": tiny,
        "std": std,
        "seed": seed,
        "parameters": sum(p.numel() for p in model.parameters()),
        "bytes": os.path.getsize(weights),
        "transformers": transformers.__version__,
        "seconds": round(time.time() - started, 1),
    }))


if __name__ == "__main__":
    main()
