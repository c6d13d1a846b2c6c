//! `rlx export RUN_DIR --hf OUT_DIR` and `rlx run --export-hf DIR` through the binary: the folder holds
//! the run's final policy under Hugging Face names (it loads back with the checkpoint's weights), an
//! export never overwrites, and the errors say what is wrong.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use candle_core::{Device, Tensor};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rlx(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rlx"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("rlx runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn fresh(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rlx-export-hf-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn a_run_exports_its_final_policy_as_a_hugging_face_folder() {
    let out = fresh("run");
    let hf = fresh("hf");
    let run = rlx(&[
        "run",
        "recipes/grpo.rlx",
        "--steps",
        "2",
        "--set",
        "sft.steps=2",
        "--set",
        "task.eval_questions=8",
        "--out",
        path(&out),
        "--export-hf",
        path(&hf),
    ]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(
        stderr(&run).contains("no tokenizer files: model.kind = \"tiny\""),
        "{}",
        stderr(&run)
    );
    for file in ["config.json", "model.safetensors", "generation_config.json"] {
        assert!(hf.join(file).is_file(), "{file} missing");
    }
    // The folder's weights are the checkpoint's, under HF names.
    let model = rlx_trainer::hf::load_model(&hf, &Device::Cpu).unwrap();
    let checkpoint = candle_core::safetensors::load(
        out.join("checkpoint").join("model.safetensors"),
        &Device::Cpu,
    )
    .unwrap();
    let exported =
        candle_core::safetensors::load(hf.join("model.safetensors"), &Device::Cpu).unwrap();
    assert_eq!(exported.len(), checkpoint.len());
    for (name, tensor) in &checkpoint {
        let diff = (tensor - &exported[name])
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert_eq!(diff, 0.0, "{name}");
    }
    let ids = Tensor::new(&[[1u32, 2, 3]], &Device::Cpu).unwrap();
    assert!(model.forward(&ids, &[0]).is_ok());

    // An export never overwrites; the adapter form needs a LoRA run on an HF base.
    let again = rlx(&["export", path(&out), "--hf", path(&hf)]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        stderr(&again).contains("exists and is not an empty directory"),
        "{}",
        stderr(&again)
    );
    let adapter = rlx(&[
        "export",
        path(&out),
        "--hf",
        path(&fresh("adapter")),
        "--adapter",
    ]);
    assert_eq!(adapter.status.code(), Some(1));
    assert!(
        stderr(&adapter).contains("a PEFT adapter needs a Hugging Face base folder"),
        "{}",
        stderr(&adapter)
    );
    // --export-hf into a folder with files is refused before the run starts.
    let refused = rlx(&[
        "run",
        "recipes/grpo.rlx",
        "--steps",
        "1",
        "--out",
        path(&fresh("refused")),
        "--export-hf",
        path(&hf),
    ]);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("--export-hf") && !fresh("refused").exists(),
        "{}",
        stderr(&refused)
    );
    // No checkpoint there: the error names what was looked for.
    let nothing = rlx(&["export", path(&fresh("none")), "--hf", path(&fresh("x"))]);
    assert_eq!(nothing.status.code(), Some(1));
    assert!(
        stderr(&nothing).contains("error: rlx export ")
            && stderr(&nothing).contains("no checkpoint there"),
        "{}",
        stderr(&nothing)
    );
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_dir_all(&hf);
}
