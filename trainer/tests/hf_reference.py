"""transformers' side of trainer/tests/hf.rs: tiny random checkpoints and their reference outputs.

    python hf_reference.py make ARCH DIR       a tiny random ARCH model (llama, qwen2, qwen3), save_pretrained(DIR)
    python hf_reference.py logits DIR REQ OUT  logits of REQ's left-padded batch -> OUT (safetensors)
    python hf_reference.py greedy DIR REQ OUT  greedy continuations of REQ's prompts -> OUT (JSON)
    python hf_reference.py peft BASE ADAPTER REQ OUT   logits of BASE + the PEFT adapter in ADAPTER
    python hf_reference.py jobs FILE           the commands listed in FILE (a JSON list of argument
                                               lists), in one process (importing torch takes seconds)

REQ is a JSON file {"prompts": [[ids...], ...], "max_new_tokens": N}. Logits are computed in float32 with
the eager attention implementation, on the batch left-padded with attention_mask (position ids: transformers'
default); only the rows' real positions are compared by the Rust side. Deterministic (seeded).
"""

import json
import sys

import torch
import transformers
from safetensors.torch import save_file

CONFIGS = {
    # SmolLM2-like: tied embeddings, GQA, Llama 3's rope scaling.
    "llama": lambda: transformers.LlamaConfig(
        vocab_size=211, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=128,
        rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
        rope_theta=5000.0, bos_token_id=1, eos_token_id=2,
    ),
    # Qwen2.5-like: untied head, q/k/v biases, GQA.
    "qwen2": lambda: transformers.Qwen2Config(
        vocab_size=173, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-6, tie_word_embeddings=False, rope_theta=1000000.0,
    ),
    # Qwen3-like: per-head q/k norm, head_dim != hidden / heads, tied.
    "qwen3": lambda: transformers.Qwen3Config(
        vocab_size=190, hidden_size=40, intermediate_size=72, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        rms_norm_eps=1e-6, tie_word_embeddings=True, rope_theta=1000000.0,
    ),
}


def load(path):
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager")
    return model.eval()


def batch(request):
    prompts = request["prompts"]
    width = max(len(p) for p in prompts)
    ids = [[0] * (width - len(p)) + p for p in prompts]
    mask = [[0] * (width - len(p)) + [1] * len(p) for p in prompts]
    return torch.tensor(ids), torch.tensor(mask)


def logits(model, request, out):
    ids, mask = batch(request)
    with torch.no_grad():
        result = model(input_ids=ids, attention_mask=mask).logits
    save_file({"logits": result.contiguous()}, out)


def main():
    if sys.argv[1] == "jobs":
        for job in json.load(open(sys.argv[2])):
            run(job)
    else:
        run(sys.argv[1:])


def run(argv):
    argv = [sys.argv[0]] + argv
    command = argv[1]
    torch.manual_seed(0)
    if command == "make":
        arch, path = argv[2], argv[3]
        config = CONFIGS[arch]()
        model = transformers.AutoModelForCausalLM.from_config(config)
        # Larger than the default 0.02 so that the logits are not all near zero, and norms/biases
        # away from their initial 1/0 so that a loader that dropped them would show.
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.copy_(1.0 + 0.2 * torch.randn_like(p))
                elif name.endswith(".bias"):
                    p.copy_(0.3 * torch.randn_like(p))
                else:
                    p.copy_(0.15 * torch.randn_like(p))
        model.save_pretrained(path)
    elif command == "logits":
        logits(load(argv[2]), json.load(open(argv[3])), argv[4])
    elif command == "greedy":
        model = load(argv[2])
        # Exactly max_new_tokens, as rlx's side with no stop tokens.
        model.generation_config.eos_token_id = None
        request = json.load(open(argv[3]))
        outputs = []
        for prompt in request["prompts"]:
            with torch.no_grad():
                generated = model.generate(
                    torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                    max_new_tokens=request["max_new_tokens"], do_sample=False, pad_token_id=0)
            outputs.append(generated[0, len(prompt):].tolist())
        json.dump({"continuations": outputs}, open(argv[4], "w"))
    elif command == "peft":
        import peft
        base = load(argv[2])
        model = peft.PeftModel.from_pretrained(base, argv[3]).eval()
        logits(model, json.load(open(argv[4])), argv[5])
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main()
