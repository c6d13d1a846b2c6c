#!/usr/bin/env python3
"""How far DAPO's loss and gradient are from an f64 reference, for rlx's torch callable in each
arithmetic precision and for verl's own float32 computation (docs/kernels.md, docs/python.md).

The batch is `scripts/python_bench.py`'s (float32 log-probs, ±1 scores, full rows or `--ragged`);
the reference is verl's own `compute_grpo_outcome_advantage` + `compute_policy_loss_vanilla` run
on the same values as float64 tensors, with torch autograd. Printed per batch shape: the relative
error of the loss and the largest gradient error relative to the largest gradient, for verl
(float32), rlx `accumulate="f32"` (the default for float32 tensors) and rlx `accumulate="f64"`.

Usage: python scripts/python_accuracy.py (the Python of scripts/install-torch.sh --with-verl, with
the wheel of scripts/build-python.sh)
"""

import json
import os
import sys

os.environ["RAYON_NUM_THREADS"] = "1"

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import python_bench as bench  # noqa: E402

import rlx  # noqa: E402


def main():
    torch.set_num_threads(1)
    recipe = rlx.Recipe(os.path.join(bench.ROOT, "recipes", "dapo.rlx"))
    for ragged in (False, True):
        for groups, tokens in ((64, 1024), (16, 8192)):
            batch = bench.make_batch(groups, 8, tokens, seed=1, ragged=ragged)
            logp, old_logp, score, index, mask = batch
            ref_loss, ref_grad = bench.verl_step(logp.double(), old_logp.double(), score.double(), index, mask.double(), 8)
            scale = ref_grad.abs().max().item()

            def error(loss, grad):
                return {
                    "loss": abs(float(loss) - float(ref_loss)) / abs(float(ref_loss)),
                    "grad": (grad.double() - ref_grad).abs().max().item() / scale,
                }

            result = {"groups": groups, "n": 8, "tokens": tokens, "ragged": ragged, "reference_loss": float(ref_loss)}
            result["verl_f32"] = error(*bench.verl_step(*batch, 8))
            for precision in ("f32", "f64"):
                result[f"rlx_{precision}"] = error(*bench.rlx_step(recipe.torch(accumulate=precision), *batch))
            print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
