//! The compiled-recipe artifact (`rlxc compile RECIPE -o FILE.rlxc`, docs/formats.md): round trips for
//! every recipe, `rlx score` on an artifact agreeing with `rlx score` on its recipe, and a clear error
//! for each way an artifact can be wrong (stale, foreign, corrupt, truncated, invalid plan).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

mod common;

use rlx_compiler::artifact::{self, Artifact, ErrorKind, COMPILER, FORMAT_VERSION};
use rlx_compiler::backend::Options;
use rlx_compiler::export::sha256::hex_digest;
use rlx_runtime::Kernel;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn scratch(name: &str) -> PathBuf {
    let directory =
        std::env::temp_dir().join(format!("rlx-artifact-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    directory
}

fn build(path: &Path, overrides: &[(String, f64)]) -> Artifact {
    let checked = rlx_compiler::check_path(path).expect("readable recipe");
    assert!(!checked.has_errors(), "{:?}", checked.diagnostics);
    let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
    Artifact::build(&checked, &stem, overrides, &Options::default()).expect("artifact builds")
}

fn run(binary: &str, args: &[&str]) -> std::process::Output {
    Command::new(binary)
        .args(args)
        .current_dir(root())
        .output()
        .expect("binary runs")
}

/// `rlxc compile RECIPE -o OUT`, which must succeed.
fn compile(recipe: &str, out: &Path) {
    let compiled = run(
        env!("CARGO_BIN_EXE_rlxc"),
        &["compile", recipe, "-o", out.to_str().unwrap()],
    );
    assert!(
        compiled.status.success(),
        "{}",
        String::from_utf8_lossy(&compiled.stderr)
    );
}

/// The file's header line and body.
fn split(bytes: &[u8]) -> (String, Vec<u8>) {
    let newline = bytes.iter().position(|&b| b == b'\n').unwrap();
    (
        String::from_utf8(bytes[..newline].to_vec()).unwrap(),
        bytes[newline + 1..].to_vec(),
    )
}

/// A file with this body and a correct header for it.
fn sign(body: &[u8]) -> Vec<u8> {
    let mut bytes = format!(
        "RLXC {FORMAT_VERSION} {} {}\n",
        body.len(),
        hex_digest(body)
    )
    .into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// The artifact of grpo.rlx with its body edited by `edit`, re-signed (so only the edit is wrong).
fn tampered(edit: impl FnOnce(&mut Value)) -> Result<Artifact, artifact::ArtifactError> {
    let bytes = build(&root().join("recipes/grpo.rlx"), &[])
        .to_bytes()
        .unwrap();
    let (_, body) = split(&bytes);
    let mut document: Value = serde_json::from_slice(&body).unwrap();
    edit(&mut document);
    Artifact::from_bytes(&sign(&serde_json::to_vec(&document).unwrap()))
}

fn expect_error(result: Result<Artifact, artifact::ArtifactError>, kind: ErrorKind, needle: &str) {
    match result {
        Ok(_) => panic!("expected a {kind:?} error mentioning `{needle}`, but it loaded"),
        Err(error) => {
            assert_eq!(error.kind, kind, "{error}");
            assert!(error.message.contains(needle), "`{needle}` not in: {error}");
        }
    }
}

#[test]
fn every_recipe_round_trips_exactly() {
    let mut recipes: Vec<PathBuf> = std::fs::read_dir(root().join("recipes"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rlx"))
        .collect();
    recipes.sort();
    assert!(recipes.len() >= 20);
    for path in &recipes {
        let built = build(path, &[]);
        let bytes = built.to_bytes().unwrap();
        let loaded =
            Artifact::from_bytes(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(loaded.graph, built.graph, "{}", path.display());
        assert_eq!(loaded, built, "{}", path.display());
        assert_eq!(loaded.sources[0].path, path.canonicalize().unwrap());
        assert_eq!(
            loaded.sources[0].sha256,
            hex_digest(&std::fs::read(path).unwrap())
        );
        assert_eq!(loaded.compiler, COMPILER);
    }
}

#[test]
fn non_finite_params_survive_the_round_trip() {
    let path = root().join("recipes/grpo.rlx");
    let built = build(
        &path,
        &[
            ("clip_c".to_string(), f64::INFINITY),
            ("eps_low".to_string(), -0.0),
        ],
    );
    let loaded = Artifact::from_bytes(&built.to_bytes().unwrap()).unwrap();
    assert_eq!(loaded.graph, built.graph);
    let clip = loaded.params.iter().find(|p| p.name == "clip_c").unwrap();
    assert_eq!(clip.value, f64::INFINITY);
    assert_eq!(clip.default, 3.0);
    let eps = loaded.params.iter().find(|p| p.name == "eps_low").unwrap();
    assert!(eps.value == 0.0 && eps.value.is_sign_negative());
}

#[test]
fn score_on_the_artifact_equals_score_on_the_recipe() {
    let directory = scratch("score");
    for (recipe, rollouts) in [
        ("recipes/grpo.rlx", "tests/data/grpo_fixture.jsonl"),
        ("tests/scores/darling.rlx", "tests/scores/darling.jsonl"),
        ("tests/scores/dr_grpo.rlx", "tests/scores/dr_grpo.jsonl"),
        // No reward and no loss: an artifact of metrics only.
        (
            "tests/data/metrics_only.rlx",
            "tests/data/grpo_fixture.jsonl",
        ),
    ] {
        let stem = Path::new(recipe).file_stem().unwrap().to_string_lossy();
        let out = directory.join(format!("{stem}.rlxc"));
        compile(recipe, &out);
        for backend in ["jit", "interp"] {
            let score = |file: &str| {
                let output = run(
                    env!("CARGO_BIN_EXE_rlx"),
                    &[
                        "score",
                        file,
                        "--rollouts",
                        rollouts,
                        "--grad",
                        "--backend",
                        backend,
                    ],
                );
                assert!(
                    output.status.success(),
                    "{file}: {}",
                    String::from_utf8_lossy(&output.stderr)
                );
                serde_json::from_slice::<Value>(&output.stdout).unwrap()
            };
            assert_eq!(
                score(out.to_str().unwrap()),
                score(recipe),
                "{recipe} ({backend})"
            );
        }
    }
    std::fs::remove_dir_all(&directory).ok();
}

/// `--show` takes the recipe's top-level `let`s on its artifact too (the artifact's `shown` graph), with
/// the recipe's values on both backends; an unknown name lists the artifact's `let`s.
#[test]
fn show_on_the_artifact_equals_show_on_the_recipe() {
    let directory = scratch("show");
    let recipe = "tests/scores/rollouts/show_keep.rlx";
    let rollouts = "tests/scores/rollouts/show_keep.jsonl";
    let out = directory.join("show_keep.rlxc");
    compile(recipe, &out);
    let score = |file: &str, backend: &str, show: &str| {
        run(
            env!("CARGO_BIN_EXE_rlx"),
            &[
                "score",
                file,
                "--rollouts",
                rollouts,
                "--grad",
                "--backend",
                backend,
                "--show",
                show,
            ],
        )
    };
    for backend in ["jit", "interp"] {
        let document = |output: std::process::Output| -> Value {
            assert!(
                output.status.success(),
                "{}",
                String::from_utf8_lossy(&output.stderr)
            );
            serde_json::from_slice(&output.stdout).unwrap()
        };
        let shown = "doubled,group_mean,centred,weighted,score";
        let on_artifact = document(score(out.to_str().unwrap(), backend, shown));
        assert_eq!(
            on_artifact,
            document(score(recipe, backend, shown)),
            "{backend}"
        );
        assert_eq!(
            on_artifact["show"]["centred"],
            serde_json::json!([null, 1.0, null, -1.0])
        );
    }
    let typo = score(out.to_str().unwrap(), "jit", "centered");
    let stderr = String::from_utf8_lossy(&typo.stderr);
    assert_eq!(typo.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("inputs: logp, score; lets: doubled, group_mean, centred, weighted"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&directory).ok();
}

/// `rlx run` on an artifact trains exactly as on its recipe: the same metrics at every step (timings
/// aside) and the same sampler settings from the recipe's `rollout { … }` block.
#[test]
fn run_on_the_artifact_equals_run_on_the_recipe() {
    let directory = scratch("run");
    let recipe = directory.join("grpo_rollout.rlx");
    let text = std::fs::read_to_string(root().join("recipes/grpo.rlx")).unwrap();
    let text = text.replace(
        "rollout {\n    n = 8\n    temperature = 1.0\n}",
        "rollout {\n    n = 3\n    temperature = 0.8\n    top_p = 0.9\n    max_new_tokens = 99\n}",
    );
    assert!(text.contains("n = 3"), "grpo.rlx's rollout block changed");
    std::fs::write(&recipe, text).unwrap();
    let artifact = directory.join("grpo_rollout.rlxc");
    let compiled = run(
        env!("CARGO_BIN_EXE_rlxc"),
        &[
            "compile",
            recipe.to_str().unwrap(),
            "-o",
            artifact.to_str().unwrap(),
        ],
    );
    assert!(
        compiled.status.success(),
        "{}",
        String::from_utf8_lossy(&compiled.stderr)
    );
    let train = |file: &Path, out: &Path| {
        let mut args = vec![
            "run",
            file.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--steps",
            "2",
        ];
        args.extend(common::QUICK_RUN);
        let output = run(env!("CARGO_BIN_EXE_rlx"), &args);
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(output.status.success(), "{}: {stderr}", file.display());
        let lines: Vec<Value> = std::fs::read_to_string(out.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|line| {
                let mut line: Value = serde_json::from_str(line).unwrap();
                for key in rlx_trainer::train::TIMING_KEYS {
                    line.as_object_mut().unwrap().remove(key);
                }
                line
            })
            .collect();
        let summary: Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap())
                .unwrap();
        (lines, summary, stderr)
    };
    let (from_recipe, summary, stderr) = train(&recipe, &directory.join("from-recipe"));
    let (from_artifact, artifact_summary, artifact_stderr) =
        train(&artifact, &directory.join("from-artifact"));
    assert_eq!(from_recipe.len(), 2);
    assert_eq!(from_artifact, from_recipe);
    for summary in [&summary, &artifact_summary] {
        assert_eq!(
            (
                &summary["group_size"],
                &summary["temperature"],
                &summary["top_p"]
            ),
            (&Value::from(3), &Value::from(0.8), &Value::from(0.9))
        );
    }
    for stderr in [&stderr, &artifact_stderr] {
        assert!(
            stderr.contains(
                "note: the recipe's `rollout { max_new_tokens }` is not applied by `rlx run`"
            ),
            "{stderr}"
        );
    }
    std::fs::remove_dir_all(&directory).ok();
}

#[test]
fn set_on_an_artifact_must_repeat_the_compiled_value() {
    let directory = scratch("set");
    let out = directory.join("grpo.rlxc");
    let out = out.to_str().unwrap();
    let compiled = run(
        env!("CARGO_BIN_EXE_rlxc"),
        &[
            "compile",
            "recipes/grpo.rlx",
            "--set",
            "beta=0.01",
            "-o",
            out,
        ],
    );
    assert!(compiled.status.success());
    let score = |set: &str| {
        run(
            env!("CARGO_BIN_EXE_rlx"),
            &[
                "score",
                out,
                "--rollouts",
                "tests/data/grpo_fixture.jsonl",
                "--set",
                set,
            ],
        )
    };
    assert!(score("beta=0.01").status.success());
    let other = score("beta=0.02");
    assert_eq!(other.status.code(), Some(1));
    let message = String::from_utf8_lossy(&other.stderr);
    assert!(
        message.contains("param `beta` is compiled into the artifact as 0.01"),
        "{message}"
    );
    let unknown = score("betta=1");
    assert_eq!(unknown.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("unknown param `betta`"));
    std::fs::remove_dir_all(&directory).ok();
}

#[test]
fn a_changed_source_makes_the_artifact_stale() {
    let directory = scratch("stale");
    let recipe = directory.join("grpo.rlx");
    std::fs::copy(root().join("recipes/grpo.rlx"), &recipe).unwrap();
    let out = directory.join("grpo.rlxc");
    build(&recipe, &[]).save(&out).unwrap();
    artifact::load(&out).expect("fresh artifact loads");
    let mut text = std::fs::read_to_string(&recipe).unwrap();
    text.push_str("\n// edited\n");
    std::fs::write(&recipe, text).unwrap();
    let error = artifact::load(&out).expect_err("stale artifact is rejected");
    assert_eq!(error.kind, ErrorKind::Stale);
    assert!(error.message.contains("stale artifact"), "{error}");
    assert!(error.message.contains("grpo.rlx has changed"), "{error}");
    let cli = run(
        env!("CARGO_BIN_EXE_rlx"),
        &[
            "score",
            out.to_str().unwrap(),
            "--rollouts",
            "tests/data/grpo_fixture.jsonl",
        ],
    );
    assert_eq!(cli.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&cli.stderr).contains("stale artifact"));
    // An artifact is self-contained: once its source is gone it still loads.
    std::fs::remove_file(&recipe).unwrap();
    artifact::load(&out).expect("artifact without its source loads");
    std::fs::remove_dir_all(&directory).ok();
}

#[test]
fn foreign_and_damaged_files_are_rejected_by_name() {
    let good = build(&root().join("recipes/grpo.rlx"), &[])
        .to_bytes()
        .unwrap();
    let (header, body) = split(&good);
    // Bad magic.
    expect_error(
        Artifact::from_bytes(b"{\"format\": \"rlxc\"}\n"),
        ErrorKind::Magic,
        "not an rlx artifact",
    );
    expect_error(
        Artifact::from_bytes(b""),
        ErrorKind::Magic,
        "not an rlx artifact",
    );
    expect_error(
        Artifact::from_bytes(b"RLXC one 2 3\n{}"),
        ErrorKind::Magic,
        "malformed header",
    );
    // Another format version.
    let mut future = header
        .replacen(
            &format!("RLXC {FORMAT_VERSION} "),
            &format!("RLXC {} ", FORMAT_VERSION + 1),
            1,
        )
        .into_bytes();
    future.push(b'\n');
    future.extend_from_slice(&body);
    expect_error(
        Artifact::from_bytes(&future),
        ErrorKind::Version,
        &format!("format version {}", FORMAT_VERSION + 1),
    );
    // Truncated, in the body and in the header.
    expect_error(
        Artifact::from_bytes(&good[..good.len() - 10]),
        ErrorKind::Truncated,
        "truncated",
    );
    expect_error(
        Artifact::from_bytes(&good[..20]),
        ErrorKind::Truncated,
        "truncated",
    );
    // Trailing bytes.
    let mut longer = good.clone();
    longer.extend_from_slice(b"\n\n");
    expect_error(
        Artifact::from_bytes(&longer),
        ErrorKind::Corrupt,
        "bytes after",
    );
    // One flipped byte in the body.
    let mut flipped = good.clone();
    let at = good.len() - 100;
    flipped[at] ^= 0x01;
    expect_error(
        Artifact::from_bytes(&flipped),
        ErrorKind::Corrupt,
        "SHA-256",
    );
    // A correctly signed body that is not JSON.
    expect_error(
        Artifact::from_bytes(&sign(b"{\"format\": ")),
        ErrorKind::Corrupt,
        "invalid JSON",
    );
    // Another compiler.
    expect_error(
        tampered(|d| d["compiler"] = Value::from("rlx-compiler 9.9.9")),
        ErrorKind::Version,
        "written by \"rlx-compiler 9.9.9\"",
    );
    // The file through `load` and through the command line: the error names the file.
    let directory = scratch("foreign");
    let path = directory.join("foreign.rlxc");
    std::fs::write(&path, b"hello, world\n").unwrap();
    let error = artifact::load(&path).unwrap_err();
    assert!(
        error.message.starts_with(&path.display().to_string()),
        "{error}"
    );
    let cli = run(
        env!("CARGO_BIN_EXE_rlx"),
        &[
            "score",
            path.to_str().unwrap(),
            "--rollouts",
            "tests/data/grpo_fixture.jsonl",
        ],
    );
    assert_eq!(cli.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&cli.stderr);
    assert!(stderr.contains("not an rlx artifact"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    std::fs::remove_dir_all(&directory).ok();
}

#[test]
fn bodies_that_do_not_describe_a_valid_plan_are_rejected() {
    // The untouched body loads.
    tampered(|_| {}).expect("re-signed untouched body loads");
    // Schema: a missing field, an unknown field, a wrong type.
    expect_error(
        tampered(|d| {
            d.as_object_mut().unwrap().remove("graph");
        }),
        ErrorKind::Invalid,
        "missing field `graph`",
    );
    expect_error(
        tampered(|d| d["extra"] = Value::from(1)),
        ErrorKind::Invalid,
        "unknown field `extra`",
    );
    expect_error(
        tampered(|d| d["graph"]["nodes"] = Value::from("none")),
        ErrorKind::Invalid,
        "does not describe a compiled recipe",
    );
    // A node reading a later node (or one past the end): the planner's validation rejects it.
    expect_error(
        tampered(|d| {
            let nodes = d["graph"]["nodes"].as_array_mut().unwrap();
            let last = nodes.len() as u64;
            let node = nodes
                .iter_mut()
                .find(|n| !n["args"].as_array().unwrap().is_empty())
                .unwrap();
            node["args"][0] = Value::from(last + 5);
        }),
        ErrorKind::Invalid,
        "has no kernel plan",
    );
    // An output naming no node.
    expect_error(
        tampered(|d| d["graph"]["outputs"]["loss"] = Value::from(1_000_000)),
        ErrorKind::Invalid,
        "has no kernel plan",
    );
    // A plan that is not the graph's (a buffer's storage changed).
    expect_error(
        tampered(|d| {
            let buffers = d["plan"]["phases"][0]["buffers"].as_array_mut().unwrap();
            let buffer = buffers.last_mut().unwrap();
            let storage = buffer["storage"].as_str().unwrap().to_string();
            buffer["storage"] = Value::from(if storage == "f32" { "f64" } else { "f32" });
        }),
        ErrorKind::Invalid,
        "recorded plan is not the plan of the recorded graph",
    );
    // Plan made with other options than recorded.
    expect_error(
        tampered(|d| d["options"]["accumulate"] = Value::from("f32")),
        ErrorKind::Invalid,
        "recorded plan is not the plan",
    );
    // Metadata that disagrees with the graph.
    expect_error(
        tampered(|d| d["inputs"][0]["name"] = Value::from("renamed")),
        ErrorKind::Invalid,
        "`inputs` differs",
    );
    expect_error(
        tampered(|d| d["params"][0]["value"] = Value::from(123.0)),
        ErrorKind::Invalid,
        "`params` differs",
    );
    // The graph of shown values: over other inputs, or naming a node it does not have.
    expect_error(
        tampered(|d| d["shown"]["inputs"][0]["name"] = Value::from("renamed")),
        ErrorKind::Invalid,
        "its graph of shown values has other inputs",
    );
    expect_error(
        tampered(|d| {
            d["shown"]["outputs"]["shown"] = serde_json::json!([["advantage", 1_000_000]]);
        }),
        ErrorKind::Invalid,
        "its graph of shown values is malformed",
    );
    // An input's shape changed consistently in graph and metadata: the plan no longer matches.
    expect_error(
        tampered(|d| {
            for place in ["inputs", "graph"] {
                let inputs = if place == "inputs" {
                    &mut d["inputs"]
                } else {
                    &mut d["graph"]["inputs"]
                };
                inputs[0]["shape"]["level"] = Value::from("batch");
            }
        }),
        ErrorKind::Invalid,
        "invalid artifact",
    );
}

#[test]
fn a_loaded_artifact_still_validates_every_batch() {
    let loaded = Artifact::from_bytes(
        &build(&root().join("recipes/dapo.rlx"), &[])
            .to_bytes()
            .unwrap(),
    )
    .unwrap();
    let kernel = Kernel::compile(&loaded.graph, &Options::default()).expect("kernel compiles");
    let spec = rlx_runtime::synthetic::Spec::default();
    let mut batch = rlx_runtime::synthetic::batch(&loaded.graph, &spec);
    let context = rlx_runtime::Context::default();
    kernel.run(&batch, &context).expect("a valid batch runs");
    let launches = kernel.launches();
    // One token too few in a token-level input.
    let token_input = loaded
        .graph
        .inputs
        .iter()
        .position(|i| i.shape.level == rlx_compiler::ir::Level::Tok)
        .unwrap();
    batch.inputs[token_input].pop();
    let error = kernel.run(&batch, &context).expect_err("malformed batch");
    assert!(
        error.to_string().contains("malformed batch") || error.to_string().contains("values"),
        "{}",
        error.to_string()
    );
    assert_eq!(
        kernel.launches(),
        launches,
        "no kernel ran on the malformed batch"
    );
}

#[test]
fn sources_are_only_rlx_files_in_the_recipes_folder() {
    let folder = root().join("recipes").canonicalize().unwrap();
    expect_error(
        tampered(|d| d["sources"][0]["path"] = Value::from("/etc/passwd")),
        ErrorKind::Invalid,
        "source `/etc/passwd` is not a `.rlx` file",
    );
    expect_error(
        tampered(|d| d["sources"][0]["path"] = Value::from("grpo.rlx")),
        ErrorKind::Invalid,
        "is not an absolute path",
    );
    let with_source = |path: String| {
        tampered(move |d| {
            let sha256 = d["sources"][0]["sha256"].clone();
            d["sources"]
                .as_array_mut()
                .unwrap()
                .push(serde_json::json!({ "path": path, "sha256": sha256 }));
        })
    };
    expect_error(
        with_source("/etc/shadow.rlx".into()),
        ErrorKind::Invalid,
        "is outside the recipe's folder",
    );
    expect_error(
        with_source(format!("{}/../x.rlx", folder.display())),
        ErrorKind::Invalid,
        "leaves the recipe's folder",
    );
    expect_error(
        with_source(format!("{}/zero", folder.display())),
        ErrorKind::Invalid,
        "is not a `.rlx` file",
    );
}

/// An artifact carries the recipe's `state`s (`graph.states`, format 4): `rlx score --state` on it
/// writes the state the recipe writes, and a state that does not match its input or update is an
/// invalid artifact.
#[test]
fn states_survive_the_artifact_and_are_validated() {
    let dir = scratch("state");
    let artifact = dir.join("state_ema.rlxc");
    compile("tests/data/state_ema.rlx", &artifact);
    let mut written = Vec::new();
    for recipe in ["tests/data/state_ema.rlx", artifact.to_str().unwrap()] {
        let state = dir.join("state.json");
        let _ = std::fs::remove_file(&state);
        for _ in 0..2 {
            let output = run(
                env!("CARGO_BIN_EXE_rlx"),
                &[
                    "score",
                    recipe,
                    "--rollouts",
                    "tests/data/state_ema.jsonl",
                    "--state",
                    state.to_str().unwrap(),
                ],
            );
            assert!(
                output.status.success(),
                "{recipe}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        written.push(std::fs::read_to_string(&state).unwrap());
    }
    assert_eq!(written[0], written[1]);
    assert!(written[0].contains("\"calls\":2"), "{}", written[0]);

    let bytes = build(&root().join("tests/data/state_ema.rlx"), &[])
        .to_bytes()
        .unwrap();
    let (_, body) = split(&bytes);
    let document: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(document["graph"]["states"][1]["name"], "calls");
    for edit in [
        |d: &mut Value| d["graph"]["states"][0]["input"] = serde_json::json!(0),
        |d: &mut Value| d["graph"]["states"][0]["input"] = serde_json::json!(99),
        |d: &mut Value| d["graph"]["states"][1]["elem"] = serde_json::json!("F32"),
        |d: &mut Value| d["graph"]["states"][2]["metric"] = serde_json::json!("state.worst"),
    ] {
        let mut tampered = document.clone();
        edit(&mut tampered);
        expect_error(
            Artifact::from_bytes(&sign(&serde_json::to_vec(&tampered).unwrap())),
            ErrorKind::Invalid,
            "does not match its input and update in the graph",
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
