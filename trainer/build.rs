//! Build-time facts a run records in `OUT/run.json` (`run_dir::versions`): the rustc that compiles the
//! trainer and the candle version the workspace's Cargo.lock pins; and the probe for the pinned assets of
//! scripts/fetch-assets.sh, which trainer/tests/models.rs and smollm2.rs need: the cfg `rlx_assets` where
//! they are there (rlx-tools, tools/src/lib.rs); and `rlx_transformers` where the torch environment has
//! transformers and PEFT (trainer/tests/hf.rs); and `rlx_torch` where it is there at all
//! (trainer/tests/chat_template.rs compares against transformers' chat-template rendering); and
//! `rlx_nvrtc` where NVRTC and ptxas are (trainer/tests/device_kernels.rs compiles the trainer's CUDA
//! kernels with them).
//! With the `cuda` feature, the linker's search path for candle-kernels' `-lcudart`: the toolkit of
//! scripts/install-cuda-toolchain.sh (`<repo>/.cuda/lib`), whose `libcudart.a` links CUDA's runtime
//! statically (docs/gpu.md, "Building"). Cargo passes it on to every crate that links the trainer.

use std::process::Command;

fn main() {
    rlx_tools::emit(&[
        rlx_tools::Gate::Assets,
        rlx_tools::Gate::Transformers,
        rlx_tools::Gate::Torch,
        rlx_tools::Gate::Nvrtc,
    ]);
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=RLX_RUSTC_VERSION={version}");

    let lock = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.lock");
    println!("cargo:rerun-if-changed={lock}");
    let candle = std::fs::read_to_string(lock)
        .ok()
        .and_then(|text| {
            let at = text.find("name = \"candle-core\"\nversion = \"")?;
            let rest = &text[at + "name = \"candle-core\"\nversion = \"".len()..];
            Some(rest[..rest.find('"')?].to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=RLX_CANDLE_VERSION={candle}");

    if std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        let lib = concat!(env!("CARGO_MANIFEST_DIR"), "/../.cuda/lib");
        // Watched even while missing (Cargo then reruns this on every `cuda` build): a toolkit
        // installed after a first, failed build is picked up.
        println!("cargo:rerun-if-changed={lib}");
        if std::path::Path::new(lib).is_dir() {
            println!("cargo:rustc-link-search=native={lib}");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
