//! The objectives built on `rank`, `quantile` and `uniform` (docs/language.md): recipes/high_entropy.rlx
//! against TRL's own `get_high_entropy_mask`, recipes/clip_cov.rlx and recipes/kl_cov.rlx against verl's
//! `clip_cov` and `kl_cov` policy losses (Clip-Cov with its random subset forced to every candidate:
//! rlx cannot reproduce torch's generator), the distribution of Clip-Cov's random subset, and
//! `uniform`'s bits on the interpreter, the JIT and the exported torch module.

use std::path::{Path, PathBuf};
use std::process::Command;

use rlx_compiler::backend::{Options, Precision};
use rlx_compiler::export::{recipe_to_torch, ModuleInfo};
use rlx_compiler::hir::{GlobalId, Recipe};
use rlx_runtime::synthetic::{batch as synthetic_batch, Spec};
use rlx_runtime::{evaluate, evaluate_showing, Context, Kernel};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn checked(name: &str, text: &str) -> Recipe {
    let checked = rlx_compiler::check_source(name, text);
    match checked.recipe {
        Some(recipe) => recipe,
        None => panic!("{name} does not check: {:?}", checked.diagnostics),
    }
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(root().join(relative)).expect("a shipped recipe")
}

/// The recipe's torch module, written into `dir`.
fn export(relative: &str, dir: &Path) -> PathBuf {
    let text = read(relative);
    let recipe = checked(relative, &text);
    let stem = Path::new(relative)
        .file_stem()
        .unwrap()
        .to_string_lossy()
        .to_string();
    let module = recipe_to_torch(&recipe, &[], &ModuleInfo::new(&stem, relative, &text))
        .unwrap_or_else(|e| panic!("{relative} does not export: {e}"));
    let file = dir.join(format!("rlx_{stem}.py"));
    std::fs::write(&file, module).expect("a writable scratch directory");
    file
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rlx-order-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

/// Run `script` with the torch tests' Python; its stdout, after asserting that it succeeded and printed
/// `ok_lines` lines starting with "OK".
fn python(script: &str, args: &[&Path], ok_lines: usize) -> String {
    let python = rlx_tools::python();
    let output = Command::new(&python)
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success()
            && stdout.lines().filter(|l| l.starts_with("OK")).count() == ok_lines,
        "the comparison failed:\n{stdout}\n{stderr}"
    );
    stdout
}

const LOAD: &str = r#"
import importlib.util, sys, types
import torch

def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

def close(a, b):
    return abs(float(a) - float(b)) <= 1e-12 + 1e-9 * abs(float(b))
"#;

/// recipes/high_entropy.rlx against TRL: the mask from TRL's `GRPOTrainer.get_high_entropy_mask` (its
/// accelerator a single process), TRL's `dapo` loss with it (`per_token_loss * entropy_mask`, summed over
/// the completion tokens and divided by their number), for several ρ, with tied entropies.
#[test]
#[cfg_attr(not(rlx_torch), ignore = "needs torch: run scripts/install-torch.sh")]
fn high_entropy_matches_trls_mask_and_loss() {
    let dir = scratch("trl");
    let module = export("recipes/high_entropy.rlx", &dir);
    let script = format!(
        "{LOAD}{}",
        r#"
from trl import GRPOTrainer

module = load(sys.argv[1], "rlx_high_entropy")

class Accelerator:
    def pad_across_processes(self, x, dim=0, pad_index=0):
        return x
    def gather(self, x):
        return x

trainer = types.SimpleNamespace(accelerator=Accelerator())
torch.manual_seed(5)
B, T = 6, 9
mask = torch.zeros(B, T, dtype=torch.float64)
for i, n in enumerate([9, 4, 7, 1, 6, 3]):
    mask[i, :n] = 1
# entropies that float32 holds exactly (TRL takes the quantile in float32), some tied
entropy = (torch.rand(B, T) * 4).double()
entropy[1, 2] = entropy[0, 5]
entropy[4, 0] = entropy[0, 5]
entropy[2, :3] = 1.5
old = -torch.rand(B, T, dtype=torch.float64) * 2 - 0.05
adv_rows = torch.tensor([1.2, -0.8, 0.5, 0.0, -1.4, 0.9], dtype=torch.float64)
adv = adv_rows[:, None].expand(B, T)
for rho in (0.2, 0.35, 0.5, 0.0, 1.0):
    base = old + 0.3 * torch.randn(B, T, dtype=torch.float64)
    logp = base.clone().requires_grad_()
    batch = {"logp": logp, "old_logp": old, "entropy": entropy, "response_mask": mask, "advantages": adv_rows}
    ours, metrics = module.loss(batch, None, rho=rho)
    (ours_grad,) = torch.autograd.grad(ours, logp)
    theirs_mask = GRPOTrainer.get_high_entropy_mask(trainer, entropy, mask, 1 - rho)
    logp2 = base.clone().requires_grad_()
    coef_1 = torch.exp(logp2 - old)
    coef_2 = torch.clamp(coef_1, 1 - 0.2, 1 + 0.2)
    per_token_loss = -torch.min(coef_1 * adv, coef_2 * adv) * theirs_mask
    theirs = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    (their_grad,) = torch.autograd.grad(theirs, logp2)
    assert close(ours, theirs), (rho, float(ours), float(theirs))
    assert torch.allclose(ours_grad * mask, their_grad * mask, rtol=1e-9, atol=1e-12), (rho, ours_grad, their_grad)
    kept = float((theirs_mask * mask).sum() / mask.sum())
    assert close(metrics["forking_frac"], kept), (rho, metrics["forking_frac"], kept)
    threshold = float(torch.quantile(entropy[mask.bool()], 1 - rho))
    assert close(metrics["threshold"], threshold), (rho, metrics["threshold"], threshold)
    assert 0 < kept <= 1
    print("OK", rho, kept, threshold)
"#
    );
    let stdout = python(&script, &[&module], 5);
    eprintln!("TRL: {}", stdout.trim());
    let _ = std::fs::remove_dir_all(&dir);
}

/// recipes/clip_cov.rlx and recipes/kl_cov.rlx against verl's `clip_cov` and `kl_cov` on the same padded
/// batch: loss, gradient and metrics. Clip-Cov's subset is random in both (torch.randperm; rlx's
/// `uniform`), so it is compared with `clip_cov_ratio = 1`, where both select every candidate; KL-Cov's
/// top-k is deterministic (no tied covariances here) at verl's default ratio and larger ones.
#[test]
#[cfg_attr(
    not(rlx_verl),
    ignore = "needs verl: run scripts/install-torch.sh --with-verl"
)]
fn clip_cov_and_kl_cov_match_verls_losses() {
    let dir = scratch("verl");
    let clip = export("recipes/clip_cov.rlx", &dir);
    let kl = export("recipes/kl_cov.rlx", &dir);
    let script = format!(
        "{LOAD}{}",
        r#"
from verl.trainer.ppo import core_algos

class Config(dict):
    """What verl's losses read from its ActorConfig."""
    def __getattr__(self, name):
        return self[name]

clip, kl = load(sys.argv[1], "rlx_clip_cov"), load(sys.argv[2], "rlx_kl_cov")
torch.manual_seed(2)
B, T = 8, 7
mask = torch.zeros(B, T, dtype=torch.float64)
for i, n in enumerate([7, 3, 5, 1, 6, 2, 7, 4]):
    mask[i, :n] = 1
old = -torch.rand(B, T, dtype=torch.float64) * 3 - 0.05
adv_rows = torch.tensor([1.3, -0.7, 0.0, 2.0, -1.5, 0.4, -0.2, 0.9], dtype=torch.float64)
advantages = adv_rows[:, None].expand(B, T) * mask

def compare(module, mode, params, config, metric_keys):
    base = (old + 0.6 * torch.randn(B, T, dtype=torch.float64)).clamp(max=-1e-3)
    logp = base.clone().requires_grad_()
    batch = {"logp": logp, "old_logp": old, "response_mask": mask, "advantages": adv_rows}
    ours, metrics = module.loss(batch, None, **params)
    (ours_grad,) = torch.autograd.grad(ours, logp)
    logp2 = base.clone().requires_grad_()
    theirs, their_metrics = core_algos.get_policy_loss_fn(mode)(old, logp2, advantages, mask, "token-mean", config, None)
    (their_grad,) = torch.autograd.grad(theirs, logp2)
    assert close(ours, theirs), (mode, params, float(ours), float(theirs))
    assert torch.allclose(ours_grad * mask, their_grad * mask, rtol=1e-9, atol=1e-12), (mode, params)
    for ours_key, their_key in metric_keys:
        assert close(metrics[ours_key], their_metrics[their_key]), (mode, ours_key, metrics, their_metrics)
    return metrics

for lb, ub in ((0.05, 1.5), (-0.4, 0.6)):
    config = Config(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.2, global_batch_info={},
                    policy_loss=Config(clip_cov_ratio=1.0, clip_cov_lb=lb, clip_cov_ub=ub))
    params = {"clip_cov_ratio": 1.0, "clip_cov_lb": lb, "clip_cov_ub": ub}
    metrics = compare(clip, "clip_cov", params, config, [("pg_clipfrac", "actor/pg_clipfrac"), ("ppo_kl", "actor/ppo_kl")])
    assert 0 < metrics["pg_clipfrac"] < 1, metrics
    print("OK clip_cov", lb, ub, metrics["pg_clipfrac"])

for ratio in (0.0002, 0.1, 0.3):
    config = Config(global_batch_info={}, policy_loss=Config(kl_cov_ratio=ratio, ppo_kl_coef=0.1))
    metrics = compare(kl, "kl_cov", {"kl_cov_ratio": ratio, "ppo_kl_coef": 0.1}, config, [("ppo_kl", "actor/ppo_kl")])
    print("OK kl_cov", ratio, metrics["kl_cov_frac"])
"#
    );
    let stdout = python(&script, &[&clip, &kl], 5);
    eprintln!("verl: {}", stdout.trim());
    let _ = std::fs::remove_dir_all(&dir);
}

const SUBSET: &str = r#"
import std/advantage.{group_zscore_verl}
import std/loss.{clip_cov_selected, is_clipped, token_covariance}

input logp     : f32[tok] policy
input old_logp : f32[tok]
input score    : f32[resp]

param ratio = 0.05
param lb    = -0.5
param ub    = 0.5
param seed : i32 = 11

let cov       = token_covariance(logp, advantage)
let candidate = not is_clipped(exp(logp - old_logp), advantage) and cov > lb and cov < ub
let selected  = clip_cov_selected(logp, old_logp, advantage, seed + step, ratio, lb, ub)

reward    = score
advantage = group_zscore_verl(reward)
loss      = mean(where(selected, 0, logp) over tok, batch)
"#;

/// Clip-Cov's random subset: at every step exactly min(⌊ratio·N⌋, #candidates) tokens, all candidates;
/// over 400 steps (the seed is `seed + step`) each candidate is picked with frequency budget/#candidates
/// (within 5 binomial standard deviations), as verl's `torch.randperm` subset.
#[test]
fn clip_cov_subset_is_a_uniform_sample_of_the_candidates() {
    let recipe = checked("subset.rlx", SUBSET);
    let id = |name: &str| {
        GlobalId(
            recipe
                .globals
                .iter()
                .position(|g| g.name == name)
                .expect("a let") as u32,
        )
    };
    let graph =
        rlx_compiler::compile_graph_showing(&recipe, &[], &[id("candidate"), id("selected")])
            .expect("lowers");
    let spec = Spec {
        groups: 4,
        responses: 4,
        tokens: 10,
        ragged: true,
        singleton: false,
        criteria: 0,
        dim: 0,
        seed: 3,
    };
    let batch = synthetic_batch(&graph, &spec);
    let tokens = batch.layout.tokens();
    let budget = ((0.05 * tokens as f64).floor()).max(1.0) as usize;
    let steps = 400;
    let mut counts = vec![0usize; tokens];
    let mut candidates: Option<Vec<bool>> = None;
    for step in 0..steps {
        let context = Context {
            step: step as f64,
            progress: 0.0,
        };
        let (_, shown) = evaluate_showing(&graph, &batch, &context).expect("evaluates");
        let values = |name: &str| -> Vec<bool> {
            let (_, values) = shown.iter().find(|(n, _)| n == name).expect("shown");
            values
                .iter()
                .map(|v| v.expect("no filter") != 0.0)
                .collect()
        };
        let candidate = values("candidate");
        let selected = values("selected");
        let n = candidate.iter().filter(|c| **c).count();
        assert!(
            n > budget,
            "{n} candidates for a budget of {budget}: widen lb/ub"
        );
        assert_eq!(
            selected.iter().filter(|s| **s).count(),
            budget,
            "step {step}"
        );
        for (t, s) in selected.iter().enumerate() {
            assert!(
                !s || candidate[t],
                "step {step}: token {t} selected but not a candidate"
            );
            counts[t] += usize::from(*s);
        }
        match &candidates {
            None => candidates = Some(candidate),
            Some(first) => assert_eq!(first, &candidate, "candidates do not depend on the step"),
        }
    }
    // The JIT selects the same tokens: the gradient is 0 exactly on them.
    let plain = rlx_compiler::compile_graph(&recipe, &[]).expect("lowers");
    let options = Options {
        accumulate: Precision::F64,
        storage: Precision::F64,
    };
    let kernel = Kernel::compile(&plain, &options).expect("a kernel plan");
    for step in 0..20 {
        let context = Context {
            step: f64::from(step),
            progress: 0.0,
        };
        let expected = evaluate(&plain, &batch, &context).expect("evaluates");
        let actual = kernel.run(&batch, &context).expect("runs");
        assert_eq!(actual.gradients, expected.gradients, "step {step}");
        let zeros = expected.gradients[0]
            .1
            .iter()
            .filter(|g| **g == 0.0)
            .count();
        assert_eq!(zeros, budget, "step {step}");
    }
    let candidate = candidates.unwrap();
    let n = candidate.iter().filter(|c| **c).count() as f64;
    let p = budget as f64 / n;
    let sd = (steps as f64 * p * (1.0 - p)).sqrt();
    for (t, count) in counts.iter().enumerate() {
        if candidate[t] {
            let expected = steps as f64 * p;
            assert!(
                (*count as f64 - expected).abs() <= 5.0 * sd,
                "token {t} picked {count} times in {steps} steps, expected {expected:.1} ± {sd:.1}"
            );
        }
    }
}

const DRAWS: &str = r#"
input logp : f32[tok] policy
param seed : i32 = 12345

reward        = uniform(seed + step over resp)
loss          = sum(uniform(3 * seed over tok) * logp over tok, batch)
metric first  = uniform(seed over batch)
metric groups = sum(uniform(seed - 7 over group) * (1 + mean(logp over tok, resp)) over batch)
"#;

/// `uniform` gives the same bits on the interpreter and the JIT (f64 storage): the gradient of Σ u·logp
/// is u itself (runtime/tests/jit.rs checks every recipe, recipes/clip_cov.rlx and
/// tests/gradients/order.rlx included, for one and four threads).
#[test]
fn uniform_bits_agree_between_the_interpreter_and_the_jit() {
    let recipe = checked("draws.rlx", DRAWS);
    let graph = rlx_compiler::compile_graph(&recipe, &[]).expect("lowers");
    let spec = Spec {
        groups: 5,
        responses: 3,
        tokens: 9,
        ragged: true,
        singleton: true,
        criteria: 0,
        dim: 0,
        seed: 8,
    };
    let batch = synthetic_batch(&graph, &spec);
    let context = Context {
        step: 4.0,
        progress: 0.0,
    };
    let expected = evaluate(&graph, &batch, &context).expect("evaluates");
    let gradient = &expected.gradients[0].1;
    assert!(gradient.iter().all(|u| (0.0..1.0).contains(u)));
    assert_eq!(gradient[0], rlx_compiler::ir::uniform(3.0 * 12345.0, 0));
    let reward = expected.reward.as_ref().unwrap();
    assert_eq!(reward[2], rlx_compiler::ir::uniform(12345.0 + 4.0, 2));
    let options = Options {
        accumulate: Precision::F64,
        storage: Precision::F64,
    };
    let kernel = Kernel::compile(&graph, &options).expect("a kernel plan");
    let actual = kernel.run(&batch, &context).expect("runs");
    assert_eq!(actual.gradients, expected.gradients);
    assert_eq!(actual.reward, expected.reward);
    assert_eq!(actual.metrics[0], expected.metrics[0]);
}

/// `uniform` and `rank` in the exported torch module give the interpreter's bits and ranks: the gradient
/// of Σ u·logp (u per token), the rewards (u per response, and a rank across the batch's responses with
/// ties) and a per-group draw, on a batch whose groups are interleaved in the padded rows.
#[test]
#[cfg_attr(not(rlx_torch), ignore = "needs torch: run scripts/install-torch.sh")]
fn uniform_and_rank_bits_agree_with_the_torch_module() {
    let text = format!(
        "{DRAWS}metric ranked = sum(rank(floor(3 * uniform(seed over resp)) over batch) * uniform(1 over resp) over batch)\n"
    );
    let recipe = checked("draws.rlx", &text);
    let dir = scratch("bits");
    let module = recipe_to_torch(&recipe, &[], &ModuleInfo::new("draws", "draws.rlx", &text))
        .expect("exports");
    let file = dir.join("rlx_draws.py");
    std::fs::write(&file, module).unwrap();
    // Three groups, interleaved in the rows: packed order is (group 0: rows 0, 3), (group 1: rows 1,
    // 4), (group 2: rows 2, 5).
    let lengths = [3usize, 1, 4, 2, 5, 2];
    let index = [0usize, 1, 2, 0, 1, 2];
    let packed_rows = [0usize, 3, 1, 4, 2, 5];
    let graph = rlx_compiler::compile_graph(&recipe, &[]).expect("lowers");
    let packed_lengths: Vec<usize> = packed_rows.iter().map(|&r| lengths[r]).collect();
    let layout = rlx_runtime::Layout::from_counts(&[2, 2, 2], &packed_lengths, &[], 0).unwrap();
    let tokens = layout.tokens();
    let batch = rlx_runtime::Batch {
        layout,
        inputs: vec![vec![0.0; tokens]],
    };
    let context = Context {
        step: 4.0,
        progress: 0.0,
    };
    let expected = evaluate(&graph, &batch, &context).expect("evaluates");
    let script = format!(
        "{LOAD}{}",
        r#"
import json
module = load(sys.argv[1], "rlx_draws")
lengths, index, step = json.loads(sys.argv[2]), json.loads(sys.argv[3]), 4
B, T = len(lengths), max(lengths)
mask = torch.zeros(B, T, dtype=torch.float64)
for i, n in enumerate(lengths):
    mask[i, :n] = 1
logp = torch.zeros(B, T, dtype=torch.float64, requires_grad=True)
out = module.evaluate({"logp": logp, "response_mask": mask, "index": torch.tensor(index), "step": step}, None)
(grad,) = torch.autograd.grad(out["loss"], logp)
print("OK", json.dumps({
    "gradient": [[float(grad[i, t]) for t in range(n)] for i, n in enumerate(lengths)],
    "reward": [float(r) for r in out["reward"]],
    "first": float(out["first"]), "groups": float(out["groups"]), "ranked": float(out["ranked"]),
}))
"#
    );
    let stdout = python(
        &script,
        &[
            &file,
            Path::new(&serde_json::to_string(&lengths).unwrap()),
            Path::new(&serde_json::to_string(&index).unwrap()),
        ],
        1,
    );
    let line = stdout.lines().find(|l| l.starts_with("OK")).unwrap();
    let got: serde_json::Value = serde_json::from_str(&line[3..]).unwrap();
    let floats = |v: &serde_json::Value| -> Vec<f64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    // Rows back in packed order.
    let mut gradient = Vec::new();
    let mut reward = Vec::new();
    for &row in &packed_rows {
        gradient.extend(floats(&got["gradient"][row]));
        reward.push(floats(&got["reward"])[row]);
    }
    assert_eq!(gradient, expected.gradients[0].1, "per-token draws");
    assert_eq!(
        &reward,
        expected.reward.as_ref().unwrap(),
        "per-response draws"
    );
    for (name, value) in &expected.metrics {
        assert_eq!(
            got[name.as_str()].as_f64().unwrap(),
            *value,
            "metric {name}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
