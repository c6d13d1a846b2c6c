//! `rlx`: the rlx runtime's command line.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use rlx::exit::Failure;

/// The rlx runtime: apply compiled recipes to rollouts.
#[derive(Parser)]
#[command(name = "rlx", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Score rollouts from any trainer with a recipe: rewards, advantages, loss, metrics, gradients.
    ///
    /// The rollout file has one JSON object per line, one per response: `"group"` names its prompt and
    /// every other key is a recipe input (see docs/formats.md). Exit status: 0 on success, 1 when the
    /// recipe or the rollouts have an error (nothing is written to --out then), 2 on a usage error.
    Score {
        /// The recipe (.rlx), or its compiled artifact (.rlxc, from `rlxc compile RECIPE -o FILE.rlxc`).
        recipe: PathBuf,
        /// The rollouts (JSON lines).
        #[arg(long)]
        rollouts: PathBuf,
        /// Override a param: `--set beta=0.01` (repeatable).
        #[arg(long = "set", value_name = "NAME=VALUE")]
        set: Vec<String>,
        /// Also output ∂loss/∂input for every `policy`/`value` input.
        #[arg(long)]
        grad: bool,
        /// Write the JSON document here instead of stdout.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Also output the value of these inputs or top-level `let`s at their own level, under
        /// `"show"` (repeatable, or a comma list: `--show ratio,kl`; docs/formats.md).
        #[arg(long, value_name = "NAME", value_delimiter = ',')]
        show: Vec<String>,
        /// `jit` (compiled kernels; falls back to the interpreter, with a warning, for a recipe they do
        /// not support) or `interp` (the reference interpreter).
        #[arg(long, value_enum, default_value_t = BackendArg::Jit)]
        backend: BackendArg,
        /// `cpu`, or `cuda` / `cuda:N` to run the compiled kernels on GPU N (needs an rlx built with
        /// `--features cuda`; docs/gpu.md).
        #[arg(long, default_value = "cpu", value_parser = parse_device)]
        device: Device,
        /// Score as the trainer would at this training step: the recipe's `step` (default 0).
        #[arg(long, default_value_t = 0)]
        step: u64,
        /// The fraction of training done, the recipe's `progress`, from 0 to 1 (default 0; the trainer
        /// uses step / steps).
        #[arg(long, default_value_t = 0.0, value_parser = parse_progress)]
        progress: f64,
        /// The recipe's `state` across calls: read from FILE (JSON, `{"NAME": value}`; the initial
        /// values when FILE does not exist), and FILE rewritten with the updated state after scoring.
        #[arg(long, value_name = "FILE")]
        state: Option<PathBuf>,
    },
    /// Train a policy with a recipe: sample, score, apply the compiled recipe, backpropagate, step.
    ///
    /// With no --config, the embedded default (configs/default.toml) trains a tiny Llama-style policy on
    /// a generated arithmetic task, after a short supervised warm start. Metrics go to
    /// OUT/metrics.jsonl, one line per step (see docs/training.md).
    Run {
        /// The recipe (.rlx), or its compiled artifact (.rlxc).
        recipe: PathBuf,
        /// A TOML config stating what it changes: every key it leaves out takes its default (the
        /// embedded configs/default.toml, with configs/defaults-pretrained.toml for a pretrained
        /// model); unknown keys are errors.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Override a recipe param (`--set beta=0.01`) or a config key (`--set train.lr=1e-3`).
        #[arg(long = "set", value_name = "NAME=VALUE")]
        set: Vec<String>,
        /// Print the resolved config (every key, defaults and the recipe's rollout settings filled in)
        /// as TOML, and exit without running.
        #[arg(long)]
        print_config: bool,
        /// Number of RL steps.
        #[arg(long)]
        steps: Option<usize>,
        /// Seed for weights, prompts and sampling.
        #[arg(long)]
        seed: Option<u64>,
        /// Output directory (default runs/<recipe>-<unix time>; with --resume, the checkpoint's run).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Continue a run from its checkpoint (DIR or DIR/checkpoint), exactly where it stopped.
        #[arg(long, value_name = "DIR")]
        resume: Option<PathBuf>,
        /// Where the step runs: `cpu`, or `cuda` / `cuda:N` for GPU N (model, sampler, reference, LM
        /// head, AdamW and the recipe's CUDA kernels, whatever the config's `backend`). Overrides the
        /// config's `train.device` (default: the config's, `cpu`). Needs an rlx built with `--features
        /// cuda` (docs/gpu.md).
        #[arg(long, value_parser = parse_device)]
        device: Option<Device>,
        /// When the run completes, also write its final policy as a Hugging Face checkpoint folder here
        /// (what `rlx export OUT --hf DIR` writes: LoRA adapters merged). DIR must not exist or be
        /// empty; it is checked before the run starts.
        #[arg(long, value_name = "DIR")]
        export_hf: Option<PathBuf>,
    },
    /// Compare finished runs (e.g. several recipes × seeds): per recipe, each metric before the first
    /// step and at the last evaluation (mean ± sd and range over seeds), into OUT/results.json,
    /// OUT/table.md and OUT/curves.png (the mean over seeds, the range shaded; docs/experiments.md).
    Compare {
        /// The run directories (each with run.json, config.toml, metrics.jsonl and summary.json).
        #[arg(required = true)]
        runs: Vec<PathBuf>,
        /// A metric to compare, `NAME=KEY` (`--metric quality=eval/quality`) or a metrics key
        /// (repeatable).
        #[arg(long = "metric", value_name = "NAME=KEY", required = true)]
        metrics: Vec<String>,
        /// The folder to write.
        #[arg(long)]
        out: PathBuf,
        /// The plot's title.
        #[arg(long, default_value = "rlx compare")]
        title: String,
    },
    /// Write a run's checkpointed policy as a Hugging Face checkpoint folder (config.json,
    /// model.safetensors with HF tensor names, the tokenizer files and chat template,
    /// generation_config.json; LoRA adapters merged) that `transformers` loads, or with --adapter its
    /// LoRA adapters as a PEFT adapter folder. OUT_DIR must not exist or be empty.
    Export {
        /// The run directory (or its checkpoint/).
        #[arg(required_unless_present = "config", conflicts_with = "config")]
        run: Option<PathBuf>,
        /// Instead of a run, the model a config's `[model]` names, as a run would start from it
        /// (e.g. SmolLM2 from its GGUF: `rlx export --config configs/smollm2.toml --hf DIR`).
        #[arg(long)]
        config: Option<PathBuf>,
        /// The folder to write.
        #[arg(long, value_name = "OUT_DIR")]
        hf: PathBuf,
        /// Write the LoRA adapters only (adapter_model.safetensors + adapter_config.json, PEFT's
        /// format) instead of the merged model.
        #[arg(long)]
        adapter: bool,
    },
    /// Measure the trainer on a config's model: sampling, forward + backward + AdamW, and real steps
    /// of `rlx run`, one JSON line per phase with "phase", "seconds", "tokens_per_s", "peak_bytes" and
    /// "peak_rss_bytes" (docs/performance.md).
    BenchModel {
        /// The TOML config whose model, task and settings are measured (as `rlx run --config`).
        #[arg(long)]
        config: PathBuf,
        /// The recipe of the step phase.
        #[arg(long, default_value = "recipes/grpo.rlx")]
        recipe: PathBuf,
        /// Rows sampled (one completion per prompt) and trained on in the sample and train phases.
        #[arg(long, default_value_t = 16)]
        rows: usize,
        /// New tokens per row in the sample phase (stop tokens ignored).
        #[arg(long, default_value_t = 64)]
        new_tokens: usize,
        /// Timed forward + backward + AdamW passes in the train phase (the median is reported).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Real steps of `rlx run` in the step phase (the median step time is reported).
        #[arg(long, default_value_t = 2)]
        steps: usize,
        /// Phases to run (a comma list of sample, train, step).
        #[arg(
            long,
            value_enum,
            value_delimiter = ',',
            default_value = "sample,train,step"
        )]
        phases: Vec<PhaseArg>,
        /// Override a recipe param or a config key (as `rlx run --set`).
        #[arg(long = "set", value_name = "NAME=VALUE")]
        set: Vec<String>,
        /// Where the phases run, as `rlx run --device` (default: the config's `train.device`).
        #[arg(long, value_parser = parse_device)]
        device: Option<Device>,
    },
    /// Measure a recipe on a synthetic packed batch: per backend, one JSON line with the kernel time
    /// (median of --runs), tokens/s, peak memory above the batch, and the memory-bandwidth bound
    /// (docs/kernels.md).
    Bench {
        /// The recipe (.rlx) or its compiled artifact (.rlxc).
        recipe: PathBuf,
        /// Groups (prompts) in the batch.
        #[arg(long, default_value_t = 64)]
        groups: usize,
        /// Responses per group.
        #[arg(long, default_value_t = 8)]
        n: usize,
        /// Tokens per response.
        #[arg(long, default_value_t = 1024)]
        tokens: usize,
        /// Threads for the JIT (default: all cores).
        #[arg(long)]
        threads: Option<usize>,
        /// Timed runs per backend, after one warm-up run.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// `interp`, `jit` or `all`.
        #[arg(long, value_enum, default_value_t = BenchBackend::All)]
        backend: BenchBackend,
        /// Element-wise arithmetic in f32 instead of f64 (JIT; sums are f64 either way).
        #[arg(long)]
        f32_accumulate: bool,
        /// Override a param: `--set beta=0.01` (repeatable).
        #[arg(long = "set", value_name = "NAME=VALUE")]
        set: Vec<String>,
        /// `cpu`, or `cuda` / `cuda:N` to time the CUDA kernels on GPU N (one `"backend":"cuda"` line:
        /// synchronised kernel time, host↔device copies apart; needs an rlx built with
        /// `--features cuda`; docs/gpu.md).
        #[arg(long, default_value = "cpu", value_parser = parse_device)]
        device: Device,
    },
    /// Resolve the package's dependencies from its rlx.toml (fetching git packages into the cache)
    /// and write rlx.lock: each package's source and the SHA-256 of every file it provides
    /// (docs/sharing.md). Exit status: 0 when locked, 1 on an error.
    Update {
        /// The package's folder, or a folder inside it.
        #[arg(default_value = ".")]
        dir: PathBuf,
    },
    /// Bring the git packages of rlx.lock into the cache (`$RLX_CACHE`, else `~/.cache/rlx`) and
    /// verify every package against the lock; compiling afterwards needs no network. Exit status: 0
    /// when every package is there and matches, 1 otherwise.
    Fetch {
        #[arg(default_value = ".")]
        dir: PathBuf,
    },
}

/// Counts live bytes, for `rlx bench`'s peak memory (the system allocator underneath).
#[global_allocator]
static ALLOCATOR: rlx_runtime::bench::CountingAllocator = rlx_runtime::bench::CountingAllocator;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum PhaseArg {
    Sample,
    Train,
    Step,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BenchBackend {
    Interp,
    Jit,
    All,
}

/// Where `rlx score`, `bench` and `run` run the recipe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Device {
    Cpu,
    Cuda(usize),
}

/// `--progress`: a number from 0 to 1.
fn parse_progress(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        Ok(p) => Err(format!(
            "progress is the fraction of training done, from 0 to 1, not {p}"
        )),
        Err(_) => Err(format!("expected a number from 0 to 1, found `{text}`")),
    }
}

/// `--device` of `rlx run` and `rlx bench-model`, as the trainer's config names it.
fn train_device(device: Device) -> rlx_trainer::config::TrainDevice {
    match device {
        Device::Cpu => rlx_trainer::config::TrainDevice::Cpu,
        Device::Cuda(n) => rlx_trainer::config::TrainDevice::Cuda(n),
    }
}

fn parse_device(text: &str) -> Result<Device, String> {
    match text {
        "cpu" => Ok(Device::Cpu),
        "cuda" => Ok(Device::Cuda(0)),
        _ => match text.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(ordinal)) => Ok(Device::Cuda(ordinal)),
            _ => Err(format!("`{text}`: expected cpu, cuda or cuda:N")),
        },
    }
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BackendArg {
    Interp,
    Jit,
}

/// glibc's malloc returns large blocks (≥ 128 KiB, or the dynamic threshold) to the system with munmap
/// when they are freed, so every activation-sized tensor of a forward or backward pass is fresh memory
/// that the kernel must fault in and zero page by page (a quarter of a SmolLM2 training step's time).
/// Serving blocks up to 32 MiB (glibc's largest threshold) from the heap and keeping freed memory for
/// reuse makes them recycled instead; the peak resident memory is unchanged (docs/performance.md).
fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes glibc's allocator parameters; called before any other thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}

/// candle runs its elementwise ops on a pool whose idle workers spin (25,000 `pause`s, about a
/// millisecond) before they sleep; on a machine with few cores that spin takes a core from the matrix
/// product that usually comes next, on rayon's threads. Unless the user set it, the spin limit is 0:
/// idle workers sleep at once (docs/performance.md, item 14: +4 % training throughput on 2 cores).
fn tune_threads() {
    const SPIN: &str = "CANDLE_BARRIER_POOL_SPIN_LIMIT";
    if std::env::var_os(SPIN).is_none() {
        // SAFETY: called first thing in main, before any other thread exists (nothing reads or writes
        // the environment concurrently).
        unsafe { std::env::set_var(SPIN, "0") };
    }
}

fn main() -> ExitCode {
    tune_allocator();
    tune_threads();
    let cli = Cli::parse();
    match cli.command {
        Command::Update { dir } => rlx::packages::update(&dir),
        Command::Fetch { dir } => rlx::packages::fetch(&dir),
        Command::Score {
            recipe,
            rollouts,
            set,
            grad,
            out,
            show,
            backend,
            device,
            step,
            progress,
            state,
        } => {
            let context = rlx_runtime::Context {
                step: step as f64,
                progress,
            };
            let backend = match (backend, device) {
                (BackendArg::Interp, Device::Cpu) => rlx_runtime::score::Backend::Interp,
                (BackendArg::Jit, Device::Cpu) => rlx_runtime::score::Backend::Jit,
                (BackendArg::Jit, Device::Cuda(n)) => rlx_runtime::score::Backend::Cuda(n),
                (BackendArg::Interp, Device::Cuda(_)) => {
                    return Failure::Usage(
                        "--backend interp runs on the CPU; drop --device cuda".to_string(),
                    )
                    .report();
                }
            };
            let mut names: Vec<String> = Vec::new();
            for name in show {
                let name = name.trim().to_string();
                if !name.is_empty() && !names.contains(&name) {
                    names.push(name);
                }
            }
            score(
                &recipe,
                &rollouts,
                &set,
                grad,
                &names,
                out.as_deref(),
                backend,
                &context,
                state.as_deref(),
            )
        }
        Command::Compare {
            runs,
            metrics,
            out,
            title,
        } => {
            let result = metrics
                .iter()
                .map(|m| rlx_trainer::compare::MetricSpec::parse(m))
                .collect::<Result<Vec<_>, _>>()
                .and_then(|metrics| {
                    let records = runs
                        .iter()
                        .map(|dir| rlx_trainer::compare::read_run(dir, &metrics))
                        .collect::<Result<Vec<_>, _>>()?;
                    rlx_trainer::compare::write_report(&records, &metrics, &title, &out)
                });
            match result {
                Ok(()) => {
                    eprintln!(
                        "rlx compare: {} runs → {} (results.json, table.md, curves.png)",
                        runs.len(),
                        out.display()
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => Failure::Failed(e.to_string()).report(),
            }
        }
        Command::Export {
            run,
            config,
            hf,
            adapter,
        } => {
            let result = match (run, config) {
                (Some(run), _) => rlx_trainer::export::export_run(&run, &hf, adapter),
                (None, Some(config)) => {
                    match rlx_compiler::files::read_text(
                        &config,
                        rlx_trainer::config::MAX_CONFIG_BYTES,
                    ) {
                        Ok(text) => rlx_trainer::export::export_config(&text, &hf, adapter),
                        Err(e) => Err(format!("cannot read {}: {e}", config.display())),
                    }
                }
                (None, None) => Err("give a run directory or --config FILE".into()),
            };
            match result {
                Ok(done) => {
                    for note in &done.notes {
                        eprintln!("note: {note}");
                    }
                    eprintln!(
                        "rlx export: wrote {} ({} of step {}) in {:.1}s",
                        hf.display(),
                        if done.adapter {
                            "the LoRA adapters"
                        } else {
                            "the model"
                        },
                        done.step,
                        done.seconds
                    );
                    ExitCode::SUCCESS
                }
                Err(message) => Failure::Failed(message.to_string()).report(),
            }
        }
        Command::Run {
            recipe,
            config,
            set,
            print_config,
            steps,
            seed,
            out,
            resume,
            device,
            export_hf,
        } => {
            let gpu = device.map(train_device);
            if let Some(dir) = &export_hf {
                if let Err(message) = rlx_trainer::hf::check_output_dir(dir) {
                    return Failure::Usage(format!("--export-hf {message}")).report();
                }
            }
            run(
                &recipe,
                config.as_deref(),
                set,
                steps,
                seed,
                out,
                resume,
                gpu,
                export_hf.as_deref(),
                print_config,
            )
        }
        Command::BenchModel {
            config,
            recipe,
            rows,
            new_tokens,
            runs,
            steps,
            phases,
            set,
            device,
        } => bench_model(
            &config,
            &recipe,
            set,
            rows,
            new_tokens,
            runs,
            steps,
            &phases,
            device.map(train_device),
        ),
        Command::Bench {
            recipe,
            groups,
            n,
            tokens,
            threads,
            runs,
            backend,
            f32_accumulate,
            set,
            device,
        } => {
            let gpu = match (backend, device) {
                (_, Device::Cpu) => None,
                (BenchBackend::Interp, Device::Cuda(_)) => {
                    return Failure::Usage(
                        "--backend interp runs on the CPU; drop --device cuda".to_string(),
                    )
                    .report();
                }
                (_, Device::Cuda(n)) => Some(n),
            };
            let settings = rlx_runtime::bench::Settings {
                groups,
                n,
                tokens,
                threads: threads.unwrap_or(0),
                runs,
                backend: match backend {
                    BenchBackend::Interp => rlx_runtime::bench::Which::Interp,
                    BenchBackend::Jit => rlx_runtime::bench::Which::Jit,
                    BenchBackend::All => rlx_runtime::bench::Which::All,
                },
                options: rlx_runtime::Options {
                    accumulate: if f32_accumulate {
                        rlx_runtime::Precision::F32
                    } else {
                        rlx_runtime::Precision::F64
                    },
                    ..Default::default()
                },
                seed: 1,
                gpu,
            };
            bench(&recipe, &set, &settings)
        }
    }
}

/// `rlx bench`: one JSON line per backend on stdout.
fn bench(recipe: &Path, set: &[String], settings: &rlx_runtime::bench::Settings) -> ExitCode {
    let graph = match rlx::overrides(set).and_then(|overrides| {
        rlx::source::load(recipe).and_then(|source| source.graph(&overrides, recipe))
    }) {
        Ok(graph) => graph,
        Err(failure) => return failure.report(),
    };
    let name = recipe.display().to_string();
    match rlx_runtime::bench::run(&graph, &name, settings) {
        Ok(lines) => {
            for line in lines {
                if let Err(code) = rlx::output::println(&line.to_string()) {
                    return code;
                }
            }
            ExitCode::SUCCESS
        }
        Err(message) => Failure::Failed(format!("{}: {message}", recipe.display())).report(),
    }
}

/// The recipe (checked `.rlx` or loaded `.rlxc`) and the config of `rlx run` (and `rlx bench-model`),
/// prepared: errors are printed, and their exit status returned.
#[allow(clippy::too_many_arguments)]
fn prepare_run(
    recipe: &Path,
    config: Option<&Path>,
    sets: Vec<String>,
    steps: Option<usize>,
    seed: Option<u64>,
    out: Option<PathBuf>,
    resume: Option<PathBuf>,
    device: Option<rlx_trainer::config::TrainDevice>,
) -> Result<(rlx_trainer::cli::Prepared, rlx::source::Source), ExitCode> {
    let loaded = rlx::source::load(recipe).map_err(Failure::report)?;
    // The files the run directory records (with their sha256): the one given, then its imports.
    let recipe_files = loaded.recorded_files().map_err(Failure::report)?;
    let source = loaded.for_trainer().map_err(Failure::report)?;
    let config_text = match config {
        None => None,
        Some(path) => {
            match rlx_compiler::files::read_text(path, rlx_trainer::config::MAX_CONFIG_BYTES) {
                Ok(text) => Some(text),
                Err(error) => {
                    return Err(Failure::Failed(format!(
                        "cannot read {}: {error}",
                        path.display()
                    ))
                    .report());
                }
            }
        }
    };
    let args = rlx_trainer::cli::RunArgs {
        recipe_name: recipe
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "run".into()),
        config_text,
        sets,
        steps,
        seed,
        out,
        resume,
        device,
        recipe_files,
    };
    let prepared = rlx_trainer::cli::prepare(source, &args)
        .map_err(|message| Failure::Failed(message.to_string()).report())?;
    Ok((prepared, loaded))
}

#[allow(clippy::too_many_arguments)]
fn bench_model(
    config: &Path,
    recipe: &Path,
    sets: Vec<String>,
    rows: usize,
    new_tokens: usize,
    runs: usize,
    steps: usize,
    phases: &[PhaseArg],
    device: Option<rlx_trainer::config::TrainDevice>,
) -> ExitCode {
    let dir = std::env::temp_dir().join(format!("rlx-bench-model-{}", std::process::id()));
    let prepared = match prepare_run(
        recipe,
        Some(config),
        sets,
        None,
        None,
        Some(dir),
        None,
        device,
    ) {
        Ok((prepared, _)) => prepared,
        Err(code) => return code,
    };
    let mut wanted = Vec::new();
    for phase in phases {
        let phase = match phase {
            PhaseArg::Sample => rlx_trainer::bench_model::Phase::Sample,
            PhaseArg::Train => rlx_trainer::bench_model::Phase::Train,
            PhaseArg::Step => rlx_trainer::bench_model::Phase::Step,
        };
        if !wanted.contains(&phase) {
            wanted.push(phase);
        }
    }
    let options = rlx_trainer::bench_model::Options {
        rows,
        new_tokens,
        runs,
        steps,
        phases: wanted,
    };
    let mut out = std::io::stdout().lock();
    let mut write_error = None;
    let result = rlx_trainer::bench_model::bench_model(prepared, &options, |line| {
        use std::io::Write;
        if write_error.is_none() {
            if let Err(e) = writeln!(out, "{line}").and_then(|_| out.flush()) {
                write_error = Some(e);
            }
        }
    });
    if let Some(e) = write_error {
        return Failure::Failed(format!("cannot write to stdout: {e}")).report();
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => Failure::Failed(message.to_string()).report(),
    }
}

#[allow(clippy::too_many_arguments)]
fn run(
    recipe: &Path,
    config: Option<&Path>,
    sets: Vec<String>,
    steps: Option<usize>,
    seed: Option<u64>,
    out: Option<PathBuf>,
    resume: Option<PathBuf>,
    device: Option<rlx_trainer::config::TrainDevice>,
    export_hf: Option<&Path>,
    print_config: bool,
) -> ExitCode {
    let (prepared, loaded) =
        match prepare_run(recipe, config, sets, steps, seed, out, resume, device) {
            Ok(prepared) => prepared,
            Err(code) => return code,
        };
    // `--print-config`: the config as the run would use it, printed as TOML; nothing is written.
    if print_config {
        return match prepared.resolved_config().to_toml() {
            Ok(text) => match rlx::output::println(text.trim_end()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(code) => code,
            },
            Err(message) => Failure::Failed(message.to_string()).report(),
        };
    }
    for note in &prepared.notes {
        eprintln!("note: {note}");
    }
    eprintln!("rlx run: writing {}", prepared.out.display());
    let mut progress = rlx_trainer::progress::Progress::stderr();
    let result = rlx_trainer::train::run_trainer(
        prepared.plan,
        &prepared.config,
        &prepared.out,
        &prepared.options,
        |event| progress.show(event),
    );
    progress.finish();
    match result {
        Ok(summary) => {
            // `None` when the task has no held-out evaluation (a text task with `task.eval_prompts = 0`).
            let accuracy = |a: Option<f64>| a.map_or("n/a".to_string(), |a| format!("{a:.3}"));
            eprintln!(
                "done in {:.1}s: greedy accuracy {} -> {}; sampling {:.0} tokens/s, training {:.0} tokens/s; metrics in {}",
                summary.wall_s,
                accuracy(summary.accuracy_before),
                accuracy(summary.accuracy_after),
                summary.sample_tokens_per_s,
                summary.train_tokens_per_s,
                summary.out.join("metrics.jsonl").display()
            );
            if let Some(dir) = export_hf {
                match rlx_trainer::export::export_run(&summary.out, dir, false) {
                    Ok(done) => {
                        for note in &done.notes {
                            eprintln!("note: {note}");
                        }
                        eprintln!(
                            "rlx run: wrote the final policy to {} in {:.1}s",
                            dir.display(),
                            done.seconds
                        );
                    }
                    Err(message) => {
                        return Failure::Failed(format!("--export-hf: {message}")).report();
                    }
                }
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            // A non-finite output: its expression first, then the run's message (the step, the
            // checkpoint to resume from).
            if let Some(non_finite) = error.non_finite() {
                loaded.report_non_finite(non_finite);
            }
            Failure::Failed(error.to_string()).report()
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn score(
    recipe: &Path,
    rollouts: &Path,
    set: &[String],
    grad: bool,
    show: &[String],
    out: Option<&Path>,
    backend: rlx_runtime::score::Backend,
    context: &rlx_runtime::Context,
    state_file: Option<&Path>,
) -> ExitCode {
    let state = match state_file.map(read_state).transpose() {
        Ok(state) => state.unwrap_or_default(),
        Err(message) => {
            return Failure::Failed(message.to_string()).report();
        }
    };
    // The recipe, checked here (`.rlx`) or loaded (`.rlxc`, docs/formats.md), with the artifact's
    // own errors before the rollouts are read.
    let loaded = rlx::overrides(set).and_then(|overrides| {
        let loaded = rlx::source::load(recipe)?;
        loaded.validate(&overrides)?;
        Ok((loaded, overrides))
    });
    let (loaded, overrides) = match loaded {
        Ok(loaded) => loaded,
        Err(failure) => return failure.report(),
    };
    let text = match rlx_runtime::rollouts::read_file(rollouts) {
        Ok(text) => text,
        Err(message) => {
            return Failure::Failed(message.to_string()).report();
        }
    };
    let scored = match (loaded.recipe(), loaded.artifact()) {
        (Some(hir), _) => rlx_runtime::score::score_at_with_state(
            hir, &text, &overrides, grad, backend, show, context, &state,
        ),
        (None, Some(artifact)) => rlx_runtime::score::score_artifact_with_state(
            artifact, &overrides, &text, grad, backend, show, context, &state,
        ),
        (None, None) => Err("internal error: no recipe".to_string().into()),
    };
    match scored {
        Ok(scored) => {
            if let Some(path) = state_file {
                let Some(updated) = scored.document.get("state") else {
                    return Failure::Failed(format!("--state {}: {} declares no `state` (docs/language.md, \"State across steps\")",
                        path.display(),
                        recipe.display())).report();
                };
                let text = format!("{updated}\n");
                if let Err(error) = rlx::write_output(path, text.as_bytes()) {
                    return Failure::Failed(format!("cannot write {}: {error}", path.display()))
                        .report();
                }
            }
            write_scored(recipe, rollouts, &scored, out)
        }
        Err(error) => match error.non_finite() {
            Some(non_finite) if loaded.report_non_finite(non_finite) => Failure::Reported.report(),
            _ => Failure::Failed(format!("{}: {error}", rollouts.display())).report(),
        },
    }
}

/// The state `rlx score --state FILE` reads: FILE's states by name, or none (the initial values)
/// when FILE does not exist.
fn read_state(path: &Path) -> Result<Vec<(String, f64)>, String> {
    const MAX_STATE_BYTES: u64 = 1 << 20;
    let name = format!("--state {}", path.display());
    let metadata = match std::fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(format!("{name}: {error}")),
    };
    if !metadata.is_file() {
        return Err(format!("{name}: not a regular file"));
    }
    if metadata.len() > MAX_STATE_BYTES {
        return Err(format!(
            "{name}: {} bytes, more than a state file's limit of {MAX_STATE_BYTES}",
            metadata.len()
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|error| format!("{name}: {error}"))?;
    rlx_runtime::score::parse_state(&text, &name)
}

/// Print `rlx score`'s warnings and write its document.
fn write_scored(
    recipe: &Path,
    rollouts: &Path,
    scored: &rlx_runtime::score::Scored,
    out: Option<&Path>,
) -> ExitCode {
    if let Some(fallback) = &scored.fallback {
        eprintln!("warning: {}: {fallback}", recipe.display());
    }
    for warning in &scored.warnings {
        eprintln!("warning: {}: {warning}", rollouts.display());
    }
    let document = scored.document.to_string();
    match out {
        None => {
            if let Err(code) = rlx::output::println(&document) {
                return code;
            }
        }
        Some(path) => {
            if let Err(error) = rlx::write_output(path, (document + "\n").as_bytes()) {
                return Failure::Failed(format!("cannot write {}: {error}", path.display()))
                    .report();
            }
        }
    }
    ExitCode::SUCCESS
}
