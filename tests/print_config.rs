//! `rlx run --print-config`: the resolved config (every key, the recipe's rollout settings filled in)
//! as TOML on stdout, and nothing run or written.

use std::process::Command;

#[test]
fn print_config_prints_the_resolved_config_and_runs_nothing() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = std::env::temp_dir().join(format!("rlx-print-config-{}", std::process::id()));
    let output = Command::new(env!("CARGO_BIN_EXE_rlx"))
        .current_dir(root)
        .args([
            "run",
            "recipes/grpo.rlx",
            "--print-config",
            "--set",
            "train.lr=0.5",
        ])
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let printed: toml::Table = toml::from_str(&String::from_utf8_lossy(&output.stdout)).unwrap();
    let config = rlx_trainer::Config::parse(&toml::to_string(&printed).unwrap(), &[]).unwrap();
    let mut expected = rlx_trainer::Config::default_config();
    expected.train.lr = 0.5;
    // grpo.rlx's `rollout { n = 8, temperature = 1.0 }` where the default config leaves them to it.
    expected.sampler.n = 8;
    expected.sampler.temperature = 1.0;
    expected.sampler.top_p = 1.0;
    assert_eq!(config, expected);
    assert!(!out.exists(), "--print-config wrote {}", out.display());
}
