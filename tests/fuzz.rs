//! End-to-end fuzzing of the binaries on untrusted input: mutated recipes (and their imports), mutated
//! rollout files and mutated compiled artifacts go through `rlxc check|fmt|compile` and `rlx score`
//! as a user would run them, and every run must end by itself with a clean status.
//!
//! The contract checked for every run (the robustness rules of ARCHITECTURE.md):
//! - exit status 0, 1 or 2 (success, diagnostics or bad data, usage or I/O); never a panic (101), a
//!   signal (abort, segmentation fault) or the text `panicked at` on stderr;
//! - no hang: each run is killed after [`TIME_LIMIT`];
//! - bounded memory: the run's peak resident set (`wait4`'s `ru_maxrss`) stays under [`RSS_LIMIT`];
//! - bounded output: stdout and stderr under [`OUTPUT_LIMIT`] each.
//!
//! `cargo test --test fuzz` runs a fixed, deterministic number of cases ([`DEFAULT_CASES`]; a minute
//! or so). A long campaign: `RLX_FUZZ_SECONDS=600 RLX_FUZZ_SEED=7 cargo test --release --test fuzz --
//! --nocapture` (a time budget instead of a case count, any seed). A failing input is kept under
//! `target/fuzz-findings/` with the command that fails on it.

#![cfg(unix)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rlx_runtime::synthetic::{self, Rng};

/// A hang guard: every input here runs in well under a second when nothing is wrong.
const TIME_LIMIT: Duration = Duration::from_secs(10);
/// Peak resident memory of one run.
const RSS_LIMIT_KB: i64 = 2 * 1024 * 1024;
const RSS_LIMIT: &str = "2 GiB";
/// What one run may print on either stream.
const OUTPUT_LIMIT: usize = 16 << 20;
/// Cases of the default (CI) run.
const DEFAULT_CASES: usize = 240;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Fragments the mutator splices in: the language's keywords and operators, extreme numbers, odd
/// characters, and JSON values that stress the rollout reader.
const RECIPE_TOKENS: &[&str] = &[
    "input ",
    "param ",
    "let ",
    "reward ",
    "advantage ",
    "loss ",
    "metric ",
    "keep ",
    "import ",
    "fn ",
    "rubric ",
    "rollout ",
    " over tok",
    " over resp",
    " over group",
    " over batch",
    " over crit",
    " over pair",
    "f32[tok]",
    "f32[resp]",
    "i32[resp]",
    "bool[resp, crit]",
    "f32[resp, dim]",
    " policy",
    " value",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ",",
    ".",
    ":",
    "=",
    "+",
    "-",
    "*",
    "/",
    "^",
    "<",
    ">=",
    "==",
    "&&",
    "||",
    "!",
    "?",
    "1e308",
    "-1e308",
    "1e-320",
    "0",
    "-0.0",
    "NaN",
    "inf",
    "4294967296",
    "99999999999999999999",
    "where(",
    "exp(",
    "log(",
    "mean(",
    "sum(",
    "std(",
    "max(",
    "min(",
    "softmax(",
    "shift(",
    "cumsum(",
    "pair(",
    "self",
    "std/advantage.{group_center}",
    "std/loss.{ppo_clip}",
    "std/agg.{token_mean}",
    "./x.rlx",
    "../x.rlx",
    "/etc/passwd",
    "//",
    "/*",
    "*/",
    "\"",
    "\"\\u{0}\"",
    "\t",
    "\n",
    "\r\n",
    "\u{feff}",
    "\u{200b}",
    "é",
    "语",
    "𝕏",
    "\u{0}",
];

const JSON_TOKENS: &[&str] = &[
    "null",
    "true",
    "false",
    "0",
    "-1",
    "1e308",
    "-1e308",
    "1e400",
    "NaN",
    "\"NaN\"",
    "[]",
    "{}",
    "[[]]",
    "\"\"",
    "\"q1\"",
    "2147483648",
    "-2147483649",
    "18446744073709551616",
    "0.5",
    "[1e308, -1e308]",
    "\"group\"",
    "\"logp\"",
    "\"mask\"",
    "\"response_mask\"",
    "\"length\"",
    ",",
    ":",
    "[",
    "]",
    "{",
    "}",
    "\n",
    "\u{feff}",
    "\u{0}",
    "\\ud800",
    "é",
];

/// One mutation of `text` (byte-level, token insertion, deletion, duplication, splicing).
fn mutate(rng: &mut Rng, text: &[u8], tokens: &[&str], other: &[u8]) -> Vec<u8> {
    let mut out = text.to_vec();
    let rounds = 1 + rng.int(0, 3);
    for _ in 0..rounds {
        let len = out.len();
        let at = if len == 0 { 0 } else { rng.int(0, len) };
        match rng.int(0, 9) {
            // Flip a byte (may break UTF-8: the binaries must say so, not panic).
            0 if len > 0 => {
                let i = at.min(len - 1);
                out[i] ^= 1 << rng.int(0, 7);
            }
            // Insert a token, sometimes many times.
            1..=3 => {
                let token = tokens[rng.int(0, tokens.len() - 1)].as_bytes();
                let times = if rng.int(0, 15) == 0 {
                    rng.int(2, 2000)
                } else {
                    1
                };
                let insert: Vec<u8> = token.repeat(times);
                out.splice(at..at, insert);
            }
            // Delete a span.
            4 | 5 if len > 0 => {
                let end = (at + rng.int(1, 40)).min(len);
                out.drain(at.min(len)..end);
            }
            // Duplicate a span (lines, arguments, keys).
            6 if len > 0 => {
                let start = at.min(len - 1);
                let end = (start + rng.int(1, 120)).min(len);
                let span = out[start..end].to_vec();
                out.splice(end..end, span);
            }
            // Splice a span of another file of the corpus.
            7 if !other.is_empty() => {
                let start = rng.int(0, other.len() - 1);
                let end = (start + rng.int(1, 200)).min(other.len());
                out.splice(at..at, other[start..end].iter().copied());
            }
            // Replace a number with an extreme one.
            8 => {
                if let Some(position) = out[at.min(len)..].iter().position(u8::is_ascii_digit) {
                    let i = at + position;
                    let extreme = ["1e308", "-1e308", "1e999", "0", "-0", "4294967297"]
                        [rng.int(0, 5)]
                    .as_bytes();
                    out.splice(i..i + 1, extreme.iter().copied());
                }
            }
            // A very long line.
            _ => {
                let filler = [b"\t".as_slice(), b"x", "语".as_bytes()][rng.int(0, 2)];
                out.splice(at..at, filler.repeat(rng.int(1000, 70_000)));
            }
        }
    }
    out
}

/// The outcome of one run of a binary.
struct Run {
    status: i32,
    signal: Option<i32>,
    timed_out: bool,
    max_rss_kb: i64,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

/// Run `program args` in `dir` with a deadline, measuring the child's peak RSS through `wait4`.
fn run(program: &str, args: &[&str], dir: &Path) -> Run {
    let mut child = Command::new(program)
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the binary");
    let pid = child.id() as libc::pid_t;
    // Drain both pipes on threads so a chatty child never blocks on a full pipe.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(pipe) = pipe {
                let _ = pipe.take(OUTPUT_LIMIT as u64 + 1).read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let started = Instant::now();
    let mut timed_out = false;
    let (status, usage) = loop {
        let mut status = 0;
        // SAFETY: plain libc call on our own child's pid; `usage` is a valid out-pointer.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let reaped = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if reaped == pid {
            break (status, usage);
        }
        if started.elapsed() > TIME_LIMIT && !timed_out {
            timed_out = true;
            let _ = child.kill();
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    // The child is reaped by wait4; std's handle must not wait for it again.
    std::mem::forget(child);
    let exited = libc::WIFEXITED(status);
    Run {
        status: if exited {
            libc::WEXITSTATUS(status)
        } else {
            -1
        },
        signal: libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
        timed_out,
        max_rss_kb: usage.ru_maxrss,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// What is wrong with a run, if anything.
fn violation(run: &Run) -> Option<String> {
    let stderr = String::from_utf8_lossy(&run.stderr);
    if run.timed_out {
        Some(format!("no exit within {TIME_LIMIT:?}"))
    } else if let Some(signal) = run.signal {
        Some(format!("killed by signal {signal}"))
    } else if !matches!(run.status, 0..=2) {
        Some(format!("exit status {}", run.status))
    } else if stderr.contains("panicked at") {
        Some("a panic message on stderr".into())
    } else if run.max_rss_kb > RSS_LIMIT_KB {
        Some(format!(
            "peak RSS {} MiB over {RSS_LIMIT}",
            run.max_rss_kb / 1024
        ))
    } else if run.stdout.len() > OUTPUT_LIMIT || run.stderr.len() > OUTPUT_LIMIT {
        Some("more than 16 MiB of output".into())
    } else {
        None
    }
}

/// A recipe of the corpus with a rollout file that scores on it.
struct Seed {
    recipe: Vec<u8>,
    rollouts: Vec<u8>,
}

fn seeds() -> Vec<Seed> {
    let mut paths: Vec<PathBuf> = [
        "recipes",
        "tests/scores",
        "tests/kernels",
        "tests/gradients",
    ]
    .iter()
    .flat_map(|folder| std::fs::read_dir(root().join(folder)).unwrap().flatten())
    .map(|entry| entry.path())
    .filter(|path| path.extension().is_some_and(|e| e == "rlx"))
    .collect();
    paths.sort();
    let mut seeds = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(&path).unwrap();
        let checked = rlx_compiler::check_source(&path.display().to_string(), &text);
        let Some(recipe) = checked.recipe else {
            continue;
        };
        let Ok(graph) = rlx_compiler::compile_graph(&recipe, &[]) else {
            continue;
        };
        let spec = synthetic::Spec {
            seed: seeds.len() as u64,
            ..synthetic::Spec::default()
        };
        let batch = synthetic::batch(&graph, &spec);
        seeds.push(Seed {
            recipe: text.into_bytes(),
            rollouts: synthetic::to_jsonl(&graph, &batch).into_bytes(),
        });
    }
    assert!(seeds.len() >= 20, "the corpus has {} recipes", seeds.len());
    seeds
}

/// One fuzz case: which input is mutated, and the commands run on it.
fn case(rng: &mut Rng, seeds: &[Seed], dir: &Path) -> Vec<(String, Vec<String>)> {
    let rlxc = env!("CARGO_BIN_EXE_rlxc").to_string();
    let rlx = env!("CARGO_BIN_EXE_rlx").to_string();
    let seed = &seeds[rng.int(0, seeds.len() - 1)];
    let other = &seeds[rng.int(0, seeds.len() - 1)];
    let write = |name: &str, bytes: &[u8]| std::fs::write(dir.join(name), bytes).unwrap();
    let strings = |args: &[&str]| args.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let backend = if rng.int(0, 1) == 0 { "jit" } else { "interp" };
    // `rlx score` of recipe.rlx on rollouts.jsonl, with gradients, on either backend.
    let score = (
        rlx.clone(),
        strings(&[
            "score",
            "recipe.rlx",
            "--rollouts",
            "rollouts.jsonl",
            "--grad",
            "--backend",
            backend,
        ]),
    );
    match rng.int(0, 9) {
        // A mutated recipe (sometimes importing a mutated module of its folder).
        0..=4 => {
            let mut recipe = mutate(rng, &seed.recipe, RECIPE_TOKENS, &other.recipe);
            if rng.int(0, 3) == 0 {
                write(
                    "lib.rlx",
                    &mutate(rng, &other.recipe, RECIPE_TOKENS, &seed.recipe),
                );
                let mut with_import = b"import ./lib.{reward}\n".to_vec();
                with_import.extend_from_slice(&recipe);
                recipe = with_import;
            }
            write("recipe.rlx", &recipe);
            write("rollouts.jsonl", &seed.rollouts);
            vec![
                (rlxc.clone(), strings(&["check", "recipe.rlx"])),
                (
                    rlxc.clone(),
                    strings(&["check", "--format", "json", "recipe.rlx"]),
                ),
                (rlxc.clone(), strings(&["fmt", "--check", "recipe.rlx"])),
                (
                    rlxc.clone(),
                    strings(&["compile", "recipe.rlx", "--emit", "plan"]),
                ),
                score,
            ]
        }
        // Mutated rollouts for an intact recipe.
        5..=7 => {
            write("recipe.rlx", &seed.recipe);
            write(
                "rollouts.jsonl",
                &mutate(rng, &seed.rollouts, JSON_TOKENS, &other.rollouts),
            );
            vec![score]
        }
        // A mutated compiled artifact.
        _ => {
            write("recipe.rlx", &seed.recipe);
            write("rollouts.jsonl", &seed.rollouts);
            let compiled = run(&rlxc, &["compile", "recipe.rlx", "-o", "recipe.rlxc"], dir);
            if compiled.status == 0 {
                let bytes = std::fs::read(dir.join("recipe.rlxc")).unwrap();
                write(
                    "recipe.rlxc",
                    &mutate(rng, &bytes, JSON_TOKENS, &seed.recipe),
                );
            }
            vec![(
                rlx.clone(),
                strings(&[
                    "score",
                    "recipe.rlxc",
                    "--rollouts",
                    "rollouts.jsonl",
                    "--grad",
                ]),
            )]
        }
    }
}

/// Keep a failing case's files and command for reproduction; returns where.
fn keep_finding(dir: &Path, number: usize, command: &str) -> PathBuf {
    let findings = root()
        .join("target/fuzz-findings")
        .join(format!("case-{number}"));
    std::fs::create_dir_all(&findings).unwrap();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_file()) {
            let _ = std::fs::copy(entry.path(), findings.join(entry.file_name()));
        }
    }
    std::fs::write(findings.join("COMMAND"), command).unwrap();
    findings
}

#[test]
fn binaries_survive_mutated_recipes_rollouts_and_artifacts() {
    let seeds = seeds();
    let budget = std::env::var("RLX_FUZZ_SECONDS")
        .ok()
        .map(|s| Duration::from_secs(s.parse().expect("RLX_FUZZ_SECONDS is a number of seconds")));
    let seed: u64 = std::env::var("RLX_FUZZ_SEED")
        .ok()
        .map_or(1, |s| s.parse().expect("RLX_FUZZ_SEED is an integer"));
    let mut rng = Rng::new(seed);
    let dir = std::env::temp_dir().join(format!("rlx-fuzz-{}", std::process::id()));
    let started = Instant::now();
    let (mut cases, mut runs, mut peak_kb, mut slowest) = (0usize, 0usize, 0i64, Duration::ZERO);
    let mut failures = Vec::new();
    loop {
        match budget {
            Some(budget) if started.elapsed() >= budget => break,
            None if cases >= DEFAULT_CASES => break,
            _ => {}
        }
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (program, args) in case(&mut rng, &seeds, &dir) {
            let arguments: Vec<&str> = args.iter().map(String::as_str).collect();
            let begun = Instant::now();
            let outcome = run(&program, &arguments, &dir);
            slowest = slowest.max(begun.elapsed());
            peak_kb = peak_kb.max(outcome.max_rss_kb);
            runs += 1;
            if let Some(problem) = violation(&outcome) {
                let name = Path::new(&program).file_name().unwrap().to_string_lossy();
                let command = format!("{name} {}", args.join(" "));
                let kept = keep_finding(&dir, cases, &command);
                let stderr = String::from_utf8_lossy(&outcome.stderr);
                let tail: String = stderr
                    .chars()
                    .rev()
                    .take(600)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                failures.push(format!(
                    "case {cases}: `{command}`: {problem} (kept in {}); stderr ends: {tail}",
                    kept.display()
                ));
            }
        }
        cases += 1;
    }
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!(
        "fuzz: seed {seed}, {cases} cases, {runs} runs in {:.1} s; slowest run {:.2} s, peak RSS {} MiB, {} failures",
        started.elapsed().as_secs_f64(),
        slowest.as_secs_f64(),
        peak_kb / 1024,
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {runs} runs broke the contract:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
