//! `rlxc`: the rlx compiler's command line.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use serde_json::json;

use rlx::diagnostics::{report, report_diagnostics, to_json_all};
use rlx::exit::Failure;
use rlx::output::print_status;
use rlx_compiler::syntax::parser::MAX_SOURCE_BYTES;

/// Read a recipe or module named on the command line (a regular file of at most `MAX_SOURCE_BYTES`).
fn read_source(path: &Path) -> Result<String, ExitCode> {
    rlx_compiler::files::read_text(path, MAX_SOURCE_BYTES as u64).map_err(|error| {
        Failure::Failed(format!("cannot read {}: {error}", path.display())).report()
    })
}

/// The rlx compiler: check, format and compile `.rlx` recipes.
#[derive(Parser)]
#[command(name = "rlxc", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check recipes and modules: syntax, names, levels, types, differentiability.
    ///
    /// Exit status: 0 when every file is clean, 1 when any has an error or cannot be read, 2 on a
    /// usage error.
    Check {
        /// Files to check; a folder is a package (docs/sharing.md): its dependencies are verified
        /// against rlx.lock and every `.rlx` file it provides is checked.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// `human` (miette reports on stderr) or `json` (one document on stdout, byte spans included).
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
    },
    /// Rewrite files in the canonical layout (or, with --check, report which are not).
    ///
    /// Exit status: 0 when done (or already formatted), 1 when --check finds a file to reformat, a
    /// file does not parse, or a file cannot be read or written, 2 on a usage error.
    Fmt {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Change nothing; exit 1 if any file is not formatted.
        #[arg(long)]
        check: bool,
    },
    /// Print the standard library's reference (docs/stdlib.md) from its doc comments, or with a
    /// package folder, the package's reference: modules, recipes and rubric files.
    Doc { package: Option<PathBuf> },
    /// Run the language server (LSP over stdin/stdout) for editors (docs/editors.md).
    Lsp,
    /// Compile a recipe and print one of its representations.
    Compile {
        file: PathBuf,
        /// The representation to print: `ast` (parsed, JSON), `hir` (checked and typed, JSON), `ir`
        /// (the dataflow graph with the loss gradient, readable text), `ir-json`, `plan` (the fused
        /// kernel passes, readable text), `plan-json`, `loops` (the plan's loop IR, readable text,
        /// docs/kernels.md), `torch` (a PyTorch module for verl and TRL,
        /// docs/scale.md), `cuda` (the fused kernels as CUDA C, docs/gpu.md) or `clif` (the JIT's
        /// cranelift IR and machine code per pass, docs/kernels.md). Without --emit,
        /// `-o FILE.rlxc` writes the compiled artifact (the checked IR, its kernel plan and metadata;
        /// docs/formats.md), which `rlx score` accepts in place of the recipe.
        #[arg(long, value_enum)]
        emit: Option<Emit>,
        /// Override a param before lowering: `--set beta=0.01` (repeatable).
        #[arg(long = "set", value_name = "NAME=VALUE")]
        set: Vec<String>,
        /// Write the output to FILE instead of standard output (with `--emit torch`), or, without
        /// --emit, the artifact FILE.rlxc.
        #[arg(short = 'o', long = "out", value_name = "FILE")]
        out: Option<PathBuf>,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    Human,
    Json,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Emit {
    Ast,
    Hir,
    Ir,
    IrJson,
    Plan,
    PlanJson,
    Torch,
    /// The kernel plan's loop IR, the form the backends generate code from (docs/kernels.md).
    Loops,
    /// The fused kernels as CUDA C (docs/gpu.md).
    Cuda,
    /// The JIT's code for each loop pass: cranelift IR, then the machine code (docs/kernels.md).
    Clif,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check { files, format } => check(&files, format),
        Command::Fmt { files, check } => fmt(&files, check),
        Command::Doc { package: None } => print_status(&rlx_compiler::docgen::stdlib_markdown()),
        Command::Doc { package: Some(dir) } => match rlx_compiler::docgen::package_markdown(&dir) {
            Ok(text) => print_status(&text),
            Err(message) => Failure::Failed(message).report(),
        },
        Command::Lsp => match rlx_lsp::run_stdio() {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => Failure::Failed(error.to_string()).report(),
        },
        Command::Compile {
            file,
            emit: Some(Emit::Torch),
            set,
            out,
        } => torch(&file, &set, out.as_deref()),
        Command::Compile {
            file,
            emit: None,
            set,
            out: Some(out),
        } => artifact(&file, &set, &out),
        Command::Compile { emit: None, .. } => {
            Failure::Usage("give `--emit FORM`, or `-o FILE.rlxc` to write the compiled artifact".to_string()).report()
        }
        Command::Compile { out: Some(_), .. } => {
            Failure::Usage("`-o` is supported with `--emit torch` and for the artifact (no --emit); redirect standard output".to_string()).report()
        }
        Command::Compile {
            file,
            emit: Some(emit),
            set,
            ..
        } => compile(&file, emit, &set),
    }
}

fn check(files: &[PathBuf], format: Format) -> ExitCode {
    let mut any_error = false;
    let mut io_error = false;
    let mut documents = Vec::new();
    for path in files {
        if path.is_dir() {
            match rlx::packages::check_package(path) {
                Err(message) => {
                    eprintln!("error: {message}");
                    io_error = true;
                }
                Ok((error, checked)) => {
                    any_error |= error;
                    for (file, checked) in checked {
                        match format {
                            Format::Human => report(&file, &checked),
                            Format::Json => documents.push(json!({
                                "file": file.display().to_string(),
                                "ok": !checked.has_errors(),
                                "diagnostics": to_json_all(&checked.diagnostics, &checked.sources),
                            })),
                        }
                    }
                }
            }
            continue;
        }
        let checked = match rlx_compiler::check_path(path) {
            Ok(checked) => checked,
            Err(error) => {
                eprintln!("error: cannot read {}: {error}", path.display());
                io_error = true;
                continue;
            }
        };
        any_error |= checked.has_errors();
        match format {
            Format::Human => report(path, &checked),
            Format::Json => documents.push(json!({
                "file": path.display().to_string(),
                "ok": !checked.has_errors(),
                "diagnostics": to_json_all(&checked.diagnostics, &checked.sources),
            })),
        }
    }
    if format == Format::Json {
        let written = print_status(&format!("{}\n", json!({ "files": documents })));
        if written != ExitCode::SUCCESS {
            return written;
        }
    }
    if io_error || any_error {
        ExitCode::from(rlx::exit::FAILED)
    } else {
        ExitCode::SUCCESS
    }
}

fn fmt(files: &[PathBuf], check_only: bool) -> ExitCode {
    let mut status = 0u8;
    for path in files {
        let text = match read_source(path) {
            Ok(text) => text,
            Err(code) => return code,
        };
        let mut sources = rlx_compiler::SourceMap::new();
        let file = sources.add(
            path.display().to_string(),
            text.clone(),
            rlx_compiler::Origin::Memory,
        );
        match rlx_compiler::format::format_source(file, &text) {
            Err(diagnostics) => {
                report_diagnostics(&path.display().to_string(), &diagnostics, &sources);
                status = status.max(rlx::exit::FAILED);
            }
            Ok(formatted) if formatted == text => {}
            Ok(formatted) => {
                if check_only {
                    eprintln!("{} is not formatted", path.display());
                    status = status.max(rlx::exit::FAILED);
                } else if let Err(error) = rlx::write_output(path, formatted.as_bytes()) {
                    let message = format!("cannot write {}: {error}", path.display());
                    return Failure::Failed(message).report();
                }
            }
        }
    }
    ExitCode::from(status)
}

fn compile(path: &std::path::Path, emit: Emit, set: &[String]) -> ExitCode {
    let overrides = match rlx::parse_overrides(set) {
        Ok(overrides) => overrides,
        Err(code) => return code,
    };
    match emit {
        Emit::Torch => torch(path, set, None),
        Emit::Ast => {
            let text = match read_source(path) {
                Ok(text) => text,
                Err(code) => return code,
            };
            let mut sources = rlx_compiler::SourceMap::new();
            let file = sources.add(
                path.display().to_string(),
                text.clone(),
                rlx_compiler::Origin::Memory,
            );
            match rlx_compiler::syntax::parse_module(file, &text) {
                Ok(module) => print_json(&module),
                Err(diagnostics) => {
                    report_diagnostics(&path.display().to_string(), &diagnostics, &sources);
                    Failure::Reported.report()
                }
            }
        }
        Emit::Hir
        | Emit::Ir
        | Emit::IrJson
        | Emit::Plan
        | Emit::PlanJson
        | Emit::Loops
        | Emit::Cuda
        | Emit::Clif => match rlx::source::check(path) {
            Err(failure) => failure.report(),
            Ok(checked) => {
                let Some(recipe) = &checked.recipe else {
                    return Failure::Reported.report();
                };
                if emit == Emit::Hir {
                    return print_json(recipe);
                }
                match rlx_compiler::compile_graph(recipe, &overrides) {
                    Err(message) => Failure::Failed(message.to_string()).report(),
                    Ok(graph) if emit == Emit::Ir => {
                        print_status(&rlx_compiler::ir::print::to_text(&graph))
                    }
                    Ok(graph) if matches!(emit, Emit::Loops | Emit::Cuda | Emit::Clif) => {
                        let options = rlx_compiler::backend::Options::default();
                        let code = rlx_compiler::backend::plan::plan(&graph, &options)
                            .map_err(|e| format!("no kernel plan: {e}"))
                            .and_then(|plan| {
                                if emit == Emit::Loops {
                                    rlx_compiler::backend::loops::lower(&graph, &plan)
                                        .map(|kernel| kernel.to_text(&graph))
                                        .map_err(|e| format!("no loop IR: {e}"))
                                } else if emit == Emit::Cuda {
                                    rlx_compiler::backend::cuda::generate(&graph, &plan)
                                        .map(|source| source.source)
                                        .map_err(|e| format!("no CUDA kernel: {e}"))
                                } else {
                                    rlx_compiler::backend::jit::compile(&graph, &plan, true)
                                        .map(|kernel| kernel.clif.join("\n") + "\n")
                                        .map_err(|e| format!("no JIT kernel: {e}"))
                                }
                            });
                        match code {
                            Ok(code) => print_status(&code),
                            Err(message) => Failure::Failed(message.to_string()).report(),
                        }
                    }
                    Ok(graph) if matches!(emit, Emit::Plan | Emit::PlanJson) => {
                        let options = rlx_compiler::backend::Options::default();
                        match rlx_compiler::backend::plan::plan(&graph, &options) {
                            Err(error) => {
                                Failure::Failed(format!("no kernel plan: {error}")).report()
                            }
                            Ok(plan) if emit == Emit::Plan => print_status(&plan.to_text(&graph)),
                            Ok(plan) => print_json(&plan),
                        }
                    }
                    Ok(graph) => print_json(&graph),
                }
            }
        },
    }
}

/// `-o FILE.rlxc` without `--emit`: the compiled artifact (docs/formats.md).
fn artifact(path: &std::path::Path, set: &[String], out: &std::path::Path) -> ExitCode {
    use rlx_compiler::artifact::{Artifact, EXTENSION};
    let overrides = match rlx::parse_overrides(set) {
        Ok(overrides) => overrides,
        Err(code) => return code,
    };
    if out.extension().is_none_or(|e| e != EXTENSION) {
        return Failure::Usage(format!(
            "{}: an artifact's name must end in `.{EXTENSION}` (for another form, give --emit)",
            out.display()
        ))
        .report();
    }
    let checked = match rlx::source::check(path) {
        Ok(checked) => checked,
        Err(failure) => return failure.report(),
    };
    if let Err(code) = refuse_overwriting_sources(out, &checked) {
        return code;
    }
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "recipe".into());
    let options = rlx_compiler::backend::Options::default();
    let written = Artifact::build(&checked, &stem, &overrides, &options)
        .and_then(|artifact| artifact.save(out));
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => Failure::Failed(format!("{}: {error}", path.display())).report(),
    }
}

/// `--emit torch`: the recipe as a self-contained PyTorch module (docs/scale.md).
fn torch(path: &std::path::Path, set: &[String], out: Option<&std::path::Path>) -> ExitCode {
    let overrides = match rlx::parse_overrides(set) {
        Ok(overrides) => overrides,
        Err(code) => return code,
    };
    if let Some(file) = out {
        if file.extension().is_some_and(|e| e == "rlx") {
            return Failure::Usage(format!(
                "{}: `--emit torch` writes Python, not a recipe; name the output `.py`",
                file.display()
            ))
            .report();
        }
    }
    let checked = match rlx::source::check(path) {
        Ok(checked) => checked,
        Err(failure) => return failure.report(),
    };
    let Some(recipe) = &checked.recipe else {
        return Failure::Reported.report();
    };
    if let Some(file) = out {
        if let Err(code) = refuse_overwriting_sources(file, &checked) {
            return code;
        }
    }
    // The text that was checked, not a second read of the file.
    let text = &checked.sources.get(checked.root).text;
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "recipe".into());
    let info = rlx_compiler::export::ModuleInfo::new(&stem, &path.display().to_string(), text);
    let module = match rlx_compiler::export::recipe_to_torch(recipe, &overrides, &info) {
        Ok(module) => module,
        Err(error) => {
            return Failure::Failed(error.to_string()).report();
        }
    };
    match out {
        None => print_status(&module),
        Some(file) => match rlx::write_output(file, module.as_bytes()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                Failure::Failed(format!("cannot write {}: {error}", file.display())).report()
            }
        },
    }
}

/// An output path must not be one of the files the recipe was compiled from (`-o recipe.rlx`).
fn refuse_overwriting_sources(out: &Path, checked: &rlx_compiler::Checked) -> Result<(), ExitCode> {
    for (_, file) in checked.sources.files() {
        if let rlx_compiler::Origin::Path(source) = &file.origin {
            if rlx_compiler::files::is_same_file(out, source) {
                return Err(Failure::Usage(format!(
                    "{}: refusing to overwrite {}, a source of the recipe",
                    out.display(),
                    file.name
                ))
                .report());
            }
        }
    }
    Ok(())
}

fn print_json<T: serde::Serialize>(value: &T) -> ExitCode {
    match serde_json::to_string_pretty(value) {
        Ok(text) => print_status(&(text + "\n")),
        Err(error) => Failure::Failed(format!("cannot serialise: {error}")).report(),
    }
}
