//! `rlxc compile --emit plan|loops|clif`: the kernel plan, its loop IR and the JIT's code, as a user
//! inspects them.

use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn emit(recipe: &str, what: &str) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_rlxc"))
        .args(["compile", recipe, "--emit", what])
        .current_dir(root())
        .output()
        .expect("rlxc runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn clif_shows_each_loop_pass_and_its_vectorised_token_loop() {
    let (ok, plan, _) = emit("recipes/dapo.rlx", "plan");
    assert!(ok);
    // Loop passes (not the fixed-order combines) are the ones compiled.
    let loops = plan
        .lines()
        .filter(|l| l.trim_start().starts_with("pass ") && l.contains(": loop"))
        .count();
    assert!(loops >= 4, "{plan}");
    let (ok, clif, stderr) = emit("recipes/dapo.rlx", "clif");
    assert!(ok, "{stderr}");
    let ir = clif
        .lines()
        .filter(|l| l.starts_with("; rlx_pass_") && !l.ends_with("(machine code)"))
        .count();
    let machine = clif
        .lines()
        .filter(|l| l.ends_with("(machine code)"))
        .count();
    assert_eq!((ir, machine), (loops, loops), "one function per loop pass");
    // DAPO's token loops are vectorised: f64×2 lanes, f32 inputs widened, the gradient narrowed.
    assert!(clif.contains("f64x2"));
    assert!(clif.contains("fvpromote_low") && clif.contains("fvdemote"));
}

#[test]
fn loops_show_one_function_per_loop_pass_with_the_coordinates_it_binds() {
    let (ok, plan, _) = emit("recipes/dapo.rlx", "plan");
    assert!(ok);
    let loop_passes = plan
        .lines()
        .filter(|l| l.trim_start().starts_with("pass ") && l.contains(": loop"))
        .count();
    let (ok, loops, stderr) = emit("recipes/dapo.rlx", "loops");
    assert!(ok, "{stderr}");
    let functions = loops
        .lines()
        .filter(|l| l.trim_start().starts_with("fn p"))
        .count();
    assert_eq!(functions, loop_passes, "{loops}");
    // The layout's coordinates, bound by the loop headers; DAPO's token loops are shared by threads.
    assert!(
        loops.contains("ts = to[r]") && loops.contains("te = to[(r + 1)]"),
        "{loops}"
    );
    assert!(loops.contains("for t in ts..te split"), "{loops}");
}

#[test]
fn clif_of_a_recipe_that_does_not_check_is_an_error() {
    let dir = std::env::temp_dir().join(format!("rlx-emit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.rlx");
    std::fs::write(
        &path,
        "input x : f32[tok] policy\nloss = sum(x over batch)\n",
    )
    .unwrap();
    let (ok, stdout, stderr) = emit(path.to_str().unwrap(), "clif");
    std::fs::remove_dir_all(&dir).ok();
    assert!(!ok);
    assert!(stdout.is_empty());
    assert!(stderr.contains("a reduction must include it"), "{stderr}");
}

/// A bad `--set` is a usage error (exit status 2) naming the problem, in `rlxc compile` and `rlx score`
/// alike (both parse it with `rlx::parse_overrides`).
#[test]
fn a_bad_set_is_a_usage_error_in_both_binaries() {
    let run = |binary: &str, args: &[&str]| {
        let output = Command::new(binary)
            .args(args)
            .current_dir(root())
            .output()
            .expect("the binary runs");
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let rlxc = env!("CARGO_BIN_EXE_rlxc");
    let (code, stderr) = run(
        rlxc,
        &[
            "compile",
            "recipes/dapo.rlx",
            "--emit",
            "ir",
            "--set",
            "eps_low",
        ],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--set expects NAME=VALUE, got `eps_low`"),
        "{stderr}"
    );
    let (code, stderr) = run(
        rlxc,
        &[
            "compile",
            "recipes/dapo.rlx",
            "--emit",
            "plan",
            "--set",
            "eps_low=wide",
        ],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--set eps_low: `wide` is not a number"),
        "{stderr}"
    );
    let rlx = env!("CARGO_BIN_EXE_rlx");
    let (code, stderr) = run(
        rlx,
        &[
            "score",
            "recipes/grpo.rlx",
            "--rollouts",
            "tests/data/grpo_fixture.jsonl",
            "--set",
            "x=1=2",
        ],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--set x: `1=2` is not a number"),
        "{stderr}"
    );
}
