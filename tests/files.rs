//! Files that `rlxc` and `rlx` read or write, treated as untrusted: a FIFO, a device, a huge sparse
//! file, a symbolic link, a full disk, a closed pipe. Each gets a clear error or the expected write,
//! never a hang, a panic or a clobbered file (compiler/src/files.rs).

use std::path::{Path, PathBuf};

mod child;

use child::{rlx, rlxc, run_bounded, scratch, sparse_file, stderr};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn grpo() -> PathBuf {
    root().join("recipes/grpo.rlx")
}

/// A copy of recipes/grpo.rlx in `directory`.
fn copy_of_grpo(directory: &Path) -> PathBuf {
    let recipe = directory.join("grpo.rlx");
    std::fs::copy(grpo(), &recipe).unwrap();
    recipe
}

fn leftover_temporaries(directory: &Path) -> Vec<String> {
    std::fs::read_dir(directory)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".rlx-tmp"))
        .collect()
}

#[cfg(unix)]
#[test]
fn a_fifo_or_a_device_is_refused_without_blocking() {
    let directory = scratch("fifo");
    let fifo = directory.join("pipe.rlx");
    child::mkfifo(&fifo);
    // The recipe itself.
    // An unreadable input is a failure (1), as in `rlx`, not a usage error (src/exit.rs).
    let output = run_bounded(rlxc().arg("check").arg(&fifo));
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("not a regular file (a FIFO)"),
        "{}",
        stderr(&output)
    );
    let output = run_bounded(rlxc().arg("check").arg("/dev/zero"));
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("not a regular file (a character device)"),
        "{}",
        stderr(&output)
    );
    // An import of it: a diagnostic at the import.
    let recipe = directory.join("recipe.rlx");
    std::fs::write(
        &recipe,
        "import \"./pipe.rlx\"\ninput score : f32[resp]\nreward = score\n",
    )
    .unwrap();
    let output = run_bounded(rlxc().arg("check").arg(&recipe));
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("rlx::import_not_found"),
        "{}",
        stderr(&output)
    );
    assert!(
        stderr(&output).contains("not a regular file (a FIFO)"),
        "{}",
        stderr(&output)
    );
    // `rlx` reads recipes the same way.
    let output = run_bounded(rlx().args(["bench"]).arg(&fifo));
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("not a regular file"),
        "{}",
        stderr(&output)
    );
    std::fs::remove_dir_all(&directory).ok();
}

#[cfg(unix)]
#[test]
fn a_huge_sparse_file_is_refused_before_it_is_read() {
    let directory = scratch("sparse");
    let big = directory.join("big.rlx");
    sparse_file(&big, b"", 1 << 30);
    let output = run_bounded(rlxc().arg("check").arg(&big));
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("the file is 1073741824 bytes; the limit is 1048576"),
        "{}",
        stderr(&output)
    );
    let recipe = directory.join("recipe.rlx");
    std::fs::write(
        &recipe,
        "import \"./big.rlx\"\ninput score : f32[resp]\nreward = score\n",
    )
    .unwrap();
    let output = run_bounded(rlxc().arg("check").arg(&recipe));
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("rlx::too_large"),
        "{}",
        stderr(&output)
    );
    assert!(
        output.stderr.len() < 4000,
        "{} bytes of stderr",
        output.stderr.len()
    );
    // Reading 1 GiB would show in the children's peak memory (it was 5.2 GB).
    assert!(
        child::peak_child_rss() < 512 << 20,
        "peak child memory {} bytes",
        child::peak_child_rss()
    );
    std::fs::remove_dir_all(&directory).ok();
}

#[cfg(unix)]
#[test]
fn output_through_symbolic_links_fifos_and_devices() {
    let directory = scratch("outputs");
    let recipe = copy_of_grpo(&directory);
    // A symbolic link to a regular file: the link stays, its target gets the artifact.
    let target = directory.join("real.rlxc");
    std::fs::write(&target, "old").unwrap();
    let link = directory.join("link.rlxc");
    std::os::unix::fs::symlink("real.rlxc", &link).unwrap();
    let output = run_bounded(rlxc().arg("compile").arg(&recipe).arg("-o").arg(&link));
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    rlx_compiler::artifact::load(&target).expect("the link's target holds the artifact");
    // A symbolic link to a device is written through, and stays a link.
    let null = directory.join("null.rlxc");
    std::os::unix::fs::symlink("/dev/null", &null).unwrap();
    let output = run_bounded(rlxc().arg("compile").arg(&recipe).arg("-o").arg(&null));
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(std::fs::symlink_metadata(&null)
        .unwrap()
        .file_type()
        .is_symlink());
    // /dev/stdout (a pipe here) gets the output.
    let output = run_bounded(
        rlxc()
            .args(["compile", "--emit", "torch", "-o", "/dev/stdout"])
            .arg(&recipe),
    );
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(String::from_utf8_lossy(&output.stdout).contains("import torch"));
    // A FIFO: written through to its reader, still a FIFO.
    let fifo = directory.join("module.py");
    child::mkfifo(&fifo);
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read_to_string(fifo).unwrap())
    };
    let output = run_bounded(
        rlxc()
            .args(["compile", "--emit", "torch", "-o"])
            .arg(&fifo)
            .arg(&recipe),
    );
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(reader.join().unwrap().contains("import torch"));
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    // `rlx score --out` writes the same way.
    let scores = directory.join("scores.json");
    let scores_link = directory.join("scores-link.json");
    std::os::unix::fs::symlink("scores.json", &scores_link).unwrap();
    let output = run_bounded(
        rlx()
            .arg("score")
            .arg(&recipe)
            .arg("--rollouts")
            .arg(root().join("tests/data/grpo_fixture.jsonl"))
            .arg("--out")
            .arg(&scores_link),
    );
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(std::fs::symlink_metadata(&scores_link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(std::fs::read_to_string(&scores)
        .unwrap()
        .contains("\"loss\""));
    assert!(leftover_temporaries(&directory).is_empty());
    std::fs::remove_dir_all(&directory).ok();
}

#[cfg(unix)]
#[test]
fn fmt_keeps_a_symbolic_link_and_the_file_mode() {
    use std::os::unix::fs::PermissionsExt;
    let directory = scratch("fmt-link");
    let real = directory.join("real.rlx");
    std::fs::write(&real, "input score : f32[resp]\nreward    =   score\n").unwrap();
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o640)).unwrap();
    let link = directory.join("link.rlx");
    std::os::unix::fs::symlink("real.rlx", &link).unwrap();
    let output = run_bounded(rlxc().arg("fmt").arg(&link));
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(
        std::fs::read_to_string(&real).unwrap(),
        "input score : f32[resp]\n\nreward = score\n"
    );
    let mode = std::fs::metadata(&real).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o640, "mode {mode:o}");
    std::fs::remove_dir_all(&directory).ok();
}

#[test]
fn an_output_never_overwrites_the_recipe() {
    let directory = scratch("own-source");
    let recipe = copy_of_grpo(&directory);
    let original = std::fs::read(&recipe).unwrap();
    let output = run_bounded(
        rlxc()
            .args(["compile", "--emit", "torch", "-o"])
            .arg(&recipe)
            .arg(&recipe),
    );
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("writes Python"),
        "{}",
        stderr(&output)
    );
    // Under another name (a hard link): still the recipe.
    let alias = directory.join("alias.py");
    std::fs::hard_link(&recipe, &alias).unwrap();
    let output = run_bounded(
        rlxc()
            .args(["compile", "--emit", "torch", "-o"])
            .arg(&alias)
            .arg(&recipe),
    );
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("refusing to overwrite"),
        "{}",
        stderr(&output)
    );
    assert_eq!(std::fs::read(&recipe).unwrap(), original);
    std::fs::remove_dir_all(&directory).ok();
}

#[cfg(unix)]
#[test]
fn a_failed_write_leaves_no_temporary_file_and_the_old_output() {
    let directory = scratch("failed-write");
    let recipe = copy_of_grpo(&directory);
    let out = directory.join("grpo.rlxc");
    std::fs::write(&out, "old").unwrap();
    // Files of at most 512 bytes (the artifact is larger), and SIGXFSZ ignored: the write fails
    // with EFBIG.
    let output = run_bounded(
        std::process::Command::new("sh")
            .arg("-c")
            .arg("trap '' XFSZ; ulimit -f 1; exec \"$0\" compile \"$1\" -o \"$2\"")
            .arg(env!("CARGO_BIN_EXE_rlxc"))
            .arg(&recipe)
            .arg(&out),
    );
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("cannot write"),
        "{}",
        stderr(&output)
    );
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "old");
    assert_eq!(leftover_temporaries(&directory), Vec::<String>::new());
    std::fs::remove_dir_all(&directory).ok();
}

#[cfg(unix)]
#[test]
fn a_full_disk_or_a_closed_pipe_on_stdout_is_an_error_not_a_panic() {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let output = rlxc()
        .args(["compile", "--emit", "plan"])
        .arg(grpo())
        .stdout(full)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let message = stderr(&output);
    assert_eq!(message.lines().count(), 1, "{message}");
    assert!(message.contains("cannot write to stdout"), "{message}");
    // The reader goes away before anything is written (`| head -c 0`).
    let mut running = rlxc()
        .args(["compile", "--emit", "plan"])
        .arg(grpo())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(running.stdout.take());
    let output = running.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(!stderr(&output).contains("panicked"), "{}", stderr(&output));
}

#[test]
fn a_recipe_file_may_start_with_a_byte_order_mark() {
    let directory = scratch("bom");
    let recipe = directory.join("bom.rlx");
    std::fs::write(&recipe, "\u{feff}input score : f32[resp]\nreward = score\n").unwrap();
    let output = run_bounded(rlxc().arg("check").arg(&recipe));
    assert!(output.status.success(), "{}", stderr(&output));
    std::fs::remove_dir_all(&directory).ok();
}

#[cfg(unix)]
#[test]
fn a_source_or_an_artifact_that_is_not_a_regular_file_is_refused_without_blocking() {
    let directory = scratch("artifact-fifo");
    let recipe = directory.join("grpo.rlx");
    std::fs::copy(root().join("recipes/grpo.rlx"), &recipe).unwrap();
    let out = directory.join("grpo.rlxc");
    let compiled = run_bounded(rlxc().arg("compile").arg(&recipe).arg("-o").arg(&out));
    assert!(compiled.status.success(), "{}", stderr(&compiled));
    let score = |artifact: &Path| {
        run_bounded(
            rlx()
                .arg("score")
                .arg(artifact)
                .arg("--rollouts")
                .arg(root().join("tests/data/grpo_fixture.jsonl")),
        )
    };
    // The recipe replaced by a FIFO: opening it for reading used to block forever.
    std::fs::remove_file(&recipe).unwrap();
    child::mkfifo(&recipe);
    let output = score(&out);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("not a regular file (a FIFO)"),
        "{}",
        stderr(&output)
    );
    // ... or by a link out of the folder (to a device).
    std::fs::remove_file(&recipe).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &recipe).unwrap();
    let output = score(&out);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("resolves outside the recipe's folder"),
        "{}",
        stderr(&output)
    );
    // The artifact itself: a device, and a 1 GiB sparse file behind a header declaring 10 bytes.
    let zero = directory.join("zero.rlxc");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let output = score(&zero);
    assert!(
        stderr(&output).contains("not a regular file (a character device)"),
        "{}",
        stderr(&output)
    );
    let sparse = directory.join("sparse.rlxc");
    let header = format!(
        "RLXC {} 10 {}\n",
        rlx_compiler::artifact::FORMAT_VERSION,
        "0".repeat(64)
    );
    sparse_file(&sparse, header.as_bytes(), 1 << 30);
    let output = score(&sparse);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let after = (1u64 << 30) - header.len() as u64 - 10;
    assert!(
        stderr(&output).contains(&format!(
            "corrupt artifact: {after} bytes after the declared 10-byte body"
        )),
        "{}",
        stderr(&output)
    );
    // Not read: the children's peak memory stays far below the file.
    assert!(
        child::peak_child_rss() < 512 << 20,
        "peak child memory {} bytes",
        child::peak_child_rss()
    );
    std::fs::remove_dir_all(&directory).ok();
}

/// One exit status map for both binaries (src/exit.rs): a file named on the command line that cannot
/// be read is a failure (1) in every command, a bad command line a usage error (2).
#[test]
fn every_command_maps_an_unreadable_input_to_1_and_a_usage_error_to_2() {
    let missing = scratch("exit-codes").join("missing.rlx");
    let rollouts = root().join("tests/data/grpo_fixture.jsonl");
    let rlxc_runs: [&[&str]; 5] = [
        &["check"],
        &["fmt"],
        &["compile", "--emit", "ast"],
        &["compile", "--emit", "ir"],
        &["compile", "--emit", "torch"],
    ];
    for args in rlxc_runs {
        let output = run_bounded(rlxc().args(args).arg(&missing));
        assert_eq!(
            output.status.code(),
            Some(1),
            "rlxc {args:?}: {}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains("cannot read"),
            "{}",
            stderr(&output)
        );
    }
    let output = run_bounded(
        rlx()
            .arg("score")
            .arg(&missing)
            .arg("--rollouts")
            .arg(&rollouts),
    );
    assert_eq!(
        output.status.code(),
        Some(1),
        "rlx score: {}",
        stderr(&output)
    );
    let output = run_bounded(rlx().arg("bench").arg(&missing));
    assert_eq!(
        output.status.code(),
        Some(1),
        "rlx bench: {}",
        stderr(&output)
    );
    let artifact = missing.with_extension("rlxc");
    let output = run_bounded(rlx().arg("bench").arg(&artifact));
    assert_eq!(
        output.status.code(),
        Some(1),
        "rlx bench: {}",
        stderr(&output)
    );

    // usage errors: a bad `--set`, an option combination, an output name
    let output = run_bounded(
        rlxc()
            .args(["compile", "--emit", "ir", "--set", "x"])
            .arg(grpo()),
    );
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let output = run_bounded(rlxc().arg("compile").arg(grpo()));
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let output = run_bounded(rlx().args(["bench", "--set", "x"]).arg(grpo()));
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
}
