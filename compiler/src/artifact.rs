//! The compiled-recipe artifact (`rlxc compile RECIPE -o FILE.rlxc`): a recipe's checked IR graph (with
//! its loss gradient), its kernel plan and the metadata needed to use and to trust it — inputs, params
//! (defaults and the values compiled in), the SHA-256 of every source file it was compiled from, the
//! compiler version and the format version. docs/formats.md describes the format.
//!
//! # Layout
//! ```text
//! RLXC <format version> <body length in bytes> <SHA-256 of the body, hex>\n
//! <body: one JSON document>
//! ```
//!
//! # Trust
//! Nothing in an artifact is trusted to index memory. `load` checks the header (magic, format version,
//! length, checksum), the compiler version, then *re-plans* the recorded graph (which re-runs the
//! planner's graph validation) and requires the result to equal the recorded plan; it checks the
//! metadata against the graph and that no recorded source file that still exists has changed. A kernel
//! built from a loaded artifact is compiled from the validated graph and still validates every batch
//! against its plan before launching.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use rlx_core::{HasSignature, Signature};
use serde::{Deserialize, Serialize};

use crate::backend::plan;
use crate::backend::Options;
use crate::export::sha256::hex_digest;
use crate::files::{self, Escape};
use crate::hir;
use crate::ir::{Graph, InputInfo, RolloutInfo, Shape};
use crate::syntax::parser::MAX_SOURCE_BYTES;
use crate::Checked;

/// The first bytes of every artifact.
pub const MAGIC: &str = "RLXC";
/// The layout and schema version this compiler writes and reads.
pub const FORMAT_VERSION: u32 = 4;
/// The compiler that writes (and the only one that reads) an artifact: the IR and the plan are
/// internal representations, so an artifact from another version is rejected, never reinterpreted.
pub const COMPILER: &str = concat!("rlx-compiler ", env!("CARGO_PKG_VERSION"));
/// The file extension of artifacts (recipes are `.rlx`).
pub const EXTENSION: &str = "rlxc";

/// What went wrong with an artifact.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The file cannot be read or written.
    Io,
    /// The file does not start with `RLXC`, or its header line is malformed.
    Magic,
    /// Another format version, or another compiler version.
    Version,
    /// Fewer bytes than the header declares.
    Truncated,
    /// Checksum mismatch, trailing bytes, or a body that is not the artifact schema.
    Corrupt,
    /// Well-formed, but its graph, plan or metadata do not describe a valid kernel plan.
    Invalid,
    /// A source file it was compiled from has changed since.
    Stale,
    /// A param override that the artifact cannot honour (params are compiled in).
    Param,
    /// The recipe cannot be compiled into an artifact.
    Compile,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArtifactError {
    pub kind: ErrorKind,
    pub message: String,
}

impl ArtifactError {
    fn new(kind: ErrorKind, message: impl Into<String>) -> ArtifactError {
        ArtifactError {
            kind,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for ArtifactError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ArtifactError {}

/// Longest header line: `RLXC`, the version, the length and 64 hex digits fit in far fewer bytes.
const MAX_HEADER_BYTES: usize = 256;

/// Largest artifact `load` reads: the biggest recipe the compiler accepts (1 MiB of source, with
/// inlining capped) compiles to far less.
pub const MAX_ARTIFACT_BYTES: u64 = 64 << 20;

/// The header line of an artifact.
struct Header {
    /// Where the body starts (after the header's newline).
    body_start: usize,
    /// The body length it declares.
    length: u64,
    checksum: String,
}

impl Header {
    /// Parse the header line at the start of `bytes` (which needs to hold only the first
    /// `MAX_HEADER_BYTES`).
    fn parse(bytes: &[u8]) -> Result<Header, ArtifactError> {
        let newline = bytes
            .iter()
            .take(MAX_HEADER_BYTES)
            .position(|&b| b == b'\n');
        let head = &bytes[..newline.unwrap_or(bytes.len()).min(MAX_HEADER_BYTES)];
        if !head.starts_with(MAGIC.as_bytes()) {
            let found: String = String::from_utf8_lossy(&bytes[..bytes.len().min(8)])
                .chars()
                .map(|c| if c.is_control() { '?' } else { c })
                .collect();
            return Err(ArtifactError::new(
                ErrorKind::Magic,
                format!("not an rlx artifact: it does not start with `{MAGIC}` (found `{found}`)"),
            ));
        }
        let Some(newline) = newline else {
            return Err(ArtifactError::new(
                ErrorKind::Truncated,
                "truncated artifact: the header line is incomplete",
            ));
        };
        let header = std::str::from_utf8(&bytes[..newline])
            .map_err(|_| ArtifactError::new(ErrorKind::Magic, "malformed header line"))?;
        let fields: Vec<&str> = header.split(' ').collect();
        let malformed = || {
            ArtifactError::new(
                ErrorKind::Magic,
                format!(
                    "malformed header line `{header}` (expected `{MAGIC} VERSION LENGTH SHA256`)"
                ),
            )
        };
        if fields.len() != 4 || fields[0] != MAGIC {
            return Err(malformed());
        }
        let version: u32 = fields[1].parse().map_err(|_| malformed())?;
        if version != FORMAT_VERSION {
            return Err(ArtifactError::new(
                ErrorKind::Version,
                format!(
                    "artifact format version {version}, but this rlx reads version {FORMAT_VERSION}; recompile the recipe with `rlxc compile RECIPE -o FILE.rlxc`"
                ),
            ));
        }
        let length: u64 = fields[2].parse().map_err(|_| malformed())?;
        let checksum = fields[3];
        if checksum.len() != 64 || !checksum.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(malformed());
        }
        if length > MAX_ARTIFACT_BYTES {
            return Err(ArtifactError::new(
                ErrorKind::Corrupt,
                format!(
                    "corrupt artifact: the header declares {length} bytes of body; the limit is {MAX_ARTIFACT_BYTES}"
                ),
            ));
        }
        Ok(Header {
            body_start: newline + 1,
            length,
            checksum: checksum.to_string(),
        })
    }

    /// The body must be exactly as long as declared.
    fn check_body_length(&self, actual: u64) -> Result<(), ArtifactError> {
        let length = self.length;
        if actual < length {
            return Err(ArtifactError::new(
                ErrorKind::Truncated,
                format!(
                    "truncated artifact: the header declares {length} bytes of body, the file has {actual}"
                ),
            ));
        }
        if actual > length {
            return Err(ArtifactError::new(
                ErrorKind::Corrupt,
                format!(
                    "corrupt artifact: {} bytes after the declared {length}-byte body",
                    actual - length
                ),
            ));
        }
        Ok(())
    }
}

/// What a recorded source may be: a module, or a rubric file (`criteria "FILE"`).
const SOURCE_EXTENSIONS: [&str; 3] = ["rlx", "toml", "json"];

/// A source file the artifact was compiled from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceHash {
    /// The canonical path it was read from.
    pub path: PathBuf,
    /// SHA-256 of its bytes, 64 lowercase hex digits.
    pub sha256: String,
}

pub use rlx_core::ParamInfo;

impl HasSignature for Artifact {
    fn signature(&self) -> Cow<'_, Signature> {
        Cow::Owned(Artifact::signature(self))
    }
}

/// The body of an artifact.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Artifact {
    /// Always `"rlxc"`.
    pub format: String,
    pub format_version: u32,
    /// `COMPILER` of the writer.
    pub compiler: String,
    /// The recipe's name (its file stem).
    pub recipe: String,
    /// The recipe file first, then every file it read from disk in its folder: imports and rubric
    /// files (the standard library is part of the compiler, so `compiler` covers it).
    pub sources: Vec<SourceHash>,
    /// The packages it was compiled with (docs/sharing.md): each one's lock entry, the SHA-256 of every
    /// file it provides. Absent when the recipe imports from no package.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub packages: Vec<crate::packages::Record>,
    /// The options the recorded plan was made with.
    pub options: Options,
    /// The recipe's inputs, in batch order (equal to `graph.inputs`).
    pub inputs: Vec<InputInfo>,
    /// The recipe's params, in declaration order (their values equal `graph.params`).
    pub params: Vec<ParamInfo>,
    /// Rubric names and criteria, in declaration order (equal to `graph.rubrics`).
    pub rubrics: Vec<crate::ir::RubricInfo>,
    /// The recipe's `rollout { … }` settings, params at their compiled values (`rlx run` reads `n`,
    /// `temperature` and `top_p`).
    pub rollout: Vec<RolloutInfo>,
    /// The IR: forward values and the loss gradient.
    pub graph: Graph,
    /// `graph` with every top-level `let` kept alive as `outputs.shown`, named as declared, and every
    /// `rollout { … }` setting given by an expression, named `rollout.KEY`
    /// (`crate::compile_graph_showing_rollout`): what `rlx score --show LET` and the scored document's
    /// `"rollout"` key evaluate on the interpreter. Never planned or run as the kernel.
    pub shown: Graph,
    /// The kernel plan of `graph` with `options` (`rlxc compile --emit plan-json`).
    pub plan: serde_json::Value,
    /// The files the graphs' node spans point into, indexed by `ir::Site::file`: where a run-time
    /// diagnostic finds the recipe text again (`Artifact::span_sources`). Absent from an artifact
    /// written without spans.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub span_files: Vec<SpanFile>,
}

/// A file of the compilation, as an artifact records it for its node spans.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpanFile {
    /// A file on disk: shown only while it is one of the artifact's `sources` with the recorded
    /// SHA-256.
    Path(PathBuf),
    /// A standard-library module, `std/NAME`, shown from this compiler's embedded copy.
    Stdlib(String),
    /// Anything else (text handed over in memory): never shown.
    Other(String),
}

impl Artifact {
    /// Build the artifact of a checked recipe, with params overridden by `overrides`.
    pub fn build(
        checked: &Checked,
        name: &str,
        overrides: &[(String, f64)],
        options: &Options,
    ) -> Result<Artifact, ArtifactError> {
        let compile = |message: String| ArtifactError::new(ErrorKind::Compile, message);
        let recipe = checked
            .recipe
            .as_ref()
            .ok_or_else(|| compile("the recipe has errors".into()))?;
        let graph = crate::compile_graph(recipe, overrides).map_err(compile)?;
        let lets: Vec<hir::GlobalId> = recipe
            .globals
            .iter()
            .enumerate()
            .filter(|(_, g)| g.kind == hir::GlobalKind::Let)
            .map(|(index, _)| hir::GlobalId(index as u32))
            .collect();
        let shown = crate::compile_graph_showing_rollout(recipe, overrides, &lets, true)
            .map_err(compile)?;
        let plan = plan::plan(&graph, options)
            .map_err(|e| compile(format!("the recipe has no kernel plan: {e}")))?;
        let plan = serde_json::to_value(&plan)
            .map_err(|e| compile(format!("cannot serialise the plan: {e}")))?;
        let files = checked.disk_files();
        let folder = files
            .first()
            .and_then(|(recipe, _)| recipe.parent())
            .map(Path::to_path_buf);
        // Package files outside the recipe's folder are pinned by `packages`.
        let sources: Vec<SourceHash> = files
            .into_iter()
            .filter(|(path, _)| folder.as_ref().is_none_or(|f| path.starts_with(f)))
            .map(|(path, text)| SourceHash {
                path: path.to_path_buf(),
                sha256: hex_digest(text.as_bytes()),
            })
            .collect();
        if sources
            .first()
            .is_some_and(|recipe| recipe.path.extension().is_none_or(|e| e != "rlx"))
        {
            return Err(compile(
                "an artifact's recipe must be a `.rlx` file (its sources are checked as imports are)"
                    .into(),
            ));
        }
        let params = recipe
            .params
            .iter()
            .zip(&graph.params)
            .map(|(declared, (_, value))| ParamInfo {
                name: declared.name.clone(),
                elem: declared.elem,
                default: declared.value,
                value: *value,
            })
            .collect();
        let span_files = checked
            .sources
            .files()
            .map(|(_, file)| match &file.origin {
                crate::Origin::Path(path) => SpanFile::Path(path.clone()),
                crate::Origin::Stdlib(name) => SpanFile::Stdlib(name.clone()),
                crate::Origin::Memory => SpanFile::Other(file.name.clone()),
            })
            .collect();
        Ok(Artifact {
            format: EXTENSION.into(),
            format_version: FORMAT_VERSION,
            compiler: COMPILER.into(),
            recipe: name.into(),
            sources,
            packages: checked.packages.clone(),
            options: *options,
            inputs: graph.inputs.clone(),
            params,
            rubrics: graph.rubrics.clone(),
            rollout: crate::ir::rollout_settings(recipe, &graph),
            graph,
            shown,
            plan,
            span_files,
        })
    }

    /// The sources the node spans of `graph` and `shown` point into, for a run-time diagnostic
    /// (`rlx_runtime::origin`): one file per entry of `span_files` (so that `ir::Site::file` is its
    /// `FileId`), with its text when it can be trusted — a standard-library module of this
    /// compiler, or a recorded source read again whose SHA-256 is still the recorded one — and
    /// empty otherwise (a diagnostic then leaves out the labels it cannot place).
    pub fn span_sources(&self) -> crate::SourceMap {
        let mut sources = crate::SourceMap::new();
        for file in &self.span_files {
            match file {
                SpanFile::Stdlib(name) => {
                    let text = crate::stdlib::module(name).unwrap_or_default();
                    sources.add(
                        format!("std/{name}"),
                        text,
                        crate::Origin::Stdlib(name.clone()),
                    );
                }
                SpanFile::Path(path) => {
                    let text = self
                        .sources
                        .iter()
                        .find(|source| &source.path == path)
                        .and_then(|source| {
                            let text = files::read_text(path, MAX_SOURCE_BYTES as u64).ok()?;
                            (hex_digest(text.as_bytes()) == source.sha256).then_some(text)
                        })
                        .unwrap_or_default();
                    sources.add(
                        path.display().to_string(),
                        text,
                        crate::Origin::Path(path.clone()),
                    );
                }
                SpanFile::Other(name) => {
                    sources.add(name.clone(), "", crate::Origin::Memory);
                }
            }
        }
        sources
    }

    /// The file's bytes: the header line and the JSON body.
    pub fn to_bytes(&self) -> Result<Vec<u8>, ArtifactError> {
        let mut body = serde_json::to_vec_pretty(self).map_err(|e| {
            ArtifactError::new(ErrorKind::Compile, format!("cannot serialise: {e}"))
        })?;
        body.push(b'\n');
        let mut bytes = format!(
            "{MAGIC} {FORMAT_VERSION} {} {}\n",
            body.len(),
            hex_digest(&body)
        )
        .into_bytes();
        bytes.extend_from_slice(&body);
        Ok(bytes)
    }

    /// Parse and validate an artifact's bytes (`load` without the staleness check).
    pub fn from_bytes(bytes: &[u8]) -> Result<Artifact, ArtifactError> {
        let header = Header::parse(bytes)?;
        let body = &bytes[header.body_start..];
        header.check_body_length(body.len() as u64)?;
        let checksum = &header.checksum;
        if hex_digest(body) != checksum.to_ascii_lowercase() {
            return Err(ArtifactError::new(
                ErrorKind::Corrupt,
                "corrupt artifact: the body's SHA-256 differs from the header's",
            ));
        }
        let document: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
            ArtifactError::new(
                ErrorKind::Corrupt,
                format!("corrupt artifact: invalid JSON: {e}"),
            )
        })?;
        // Versions first, so that another compiler's artifact says so rather than failing the schema.
        let field = |name: &str| document.get(name).cloned().unwrap_or_default();
        if field("format") != serde_json::json!(EXTENSION)
            || field("format_version") != serde_json::json!(FORMAT_VERSION)
        {
            return Err(ArtifactError::new(
                ErrorKind::Corrupt,
                format!("corrupt artifact: its body does not declare format `{EXTENSION}` version {FORMAT_VERSION}"),
            ));
        }
        if field("compiler") != serde_json::json!(COMPILER) {
            return Err(ArtifactError::new(
                ErrorKind::Version,
                format!(
                    "the artifact was written by {}, but this is {COMPILER}; recompile the recipe with `rlxc compile RECIPE -o FILE.rlxc`",
                    field("compiler")
                ),
            ));
        }
        let artifact: Artifact = serde_json::from_value(document).map_err(|e| {
            ArtifactError::new(
                ErrorKind::Invalid,
                format!("invalid artifact: the body does not describe a compiled recipe: {e}"),
            )
        })?;
        artifact.validate()?;
        Ok(artifact)
    }

    /// Check that the graph is one the planner accepts, the recorded plan is its plan, and the
    /// metadata describes the graph.
    fn validate(&self) -> Result<(), ArtifactError> {
        let invalid = |message: String| {
            ArtifactError::new(ErrorKind::Invalid, format!("invalid artifact: {message}"))
        };
        let planned = plan::plan(&self.graph, &self.options)
            .map_err(|e| invalid(format!("its graph has no kernel plan: {e}")))?;
        let planned = serde_json::to_value(&planned)
            .map_err(|e| invalid(format!("cannot serialise the plan: {e}")))?;
        if planned != self.plan {
            return Err(invalid(
                "the recorded plan is not the plan of the recorded graph".into(),
            ));
        }
        if self.inputs != self.graph.inputs {
            return Err(invalid("`inputs` differs from the graph's inputs".into()));
        }
        if self.rubrics != self.graph.rubrics {
            return Err(invalid("`rubrics` differs from the graph's rubrics".into()));
        }
        let same = |a: f64, b: f64| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        let params_agree = self.params.len() == self.graph.params.len()
            && self
                .params
                .iter()
                .zip(&self.graph.params)
                .all(|(p, (name, value))| &p.name == name && same(p.value, *value));
        if !params_agree {
            return Err(invalid("`params` differs from the graph's params".into()));
        }
        // The graph of `--show`: well formed (as the planner checks any graph, shown values included),
        // over the same inputs, params and rubrics.
        plan::check_graph(&self.shown)
            .map_err(|e| invalid(format!("its graph of shown values is malformed: {e}")))?;
        let shown = &self.shown;
        let same_params = shown.params.len() == self.graph.params.len()
            && shown
                .params
                .iter()
                .zip(&self.graph.params)
                .all(|(a, b)| a.0 == b.0 && same(a.1, b.1));
        if shown.inputs != self.graph.inputs || shown.rubrics != self.graph.rubrics || !same_params
        {
            return Err(invalid(
                "its graph of shown values has other inputs, params or rubrics than its graph"
                    .into(),
            ));
        }
        // Shapes a batch can hold, rubric axes that name the rubrics.
        self.signature()
            .check()
            .map_err(|e| invalid(e.to_string()))?;
        // Each `state`: a batch-level input without a gradient of its element type, and an update
        // among the metrics.
        for state in &self.graph.states {
            let input = self.graph.inputs.get(state.input as usize);
            let fits = input.is_some_and(|i| {
                i.name == state.name
                    && i.elem == state.elem
                    && i.shape == Shape::BATCH
                    && !i.differentiable
            });
            let updated = self
                .graph
                .outputs
                .metrics
                .iter()
                .any(|(n, _)| *n == state.metric);
            if !fits || !updated {
                return Err(invalid(format!(
                    "state `{}` does not match its input and update in the graph",
                    state.name
                )));
            }
        }
        self.source_paths()?;
        let files = self.span_files.len();
        for (what, graph) in [
            ("graph", &self.graph),
            ("graph of shown values", &self.shown),
        ] {
            let misplaced = graph.nodes.iter().position(|node| {
                [node.span, node.call]
                    .iter()
                    .flatten()
                    .any(|site| site.file as usize >= files || site.start > site.end)
            });
            if let Some(index) = misplaced {
                return Err(invalid(format!(
                    "node %{index} of its {what} has a span outside its `span_files`"
                )));
            }
        }
        Ok(())
    }

    /// Each recorded source as the recipe's folder and the path inside it. The recipe (first) is an
    /// absolute `.rlx` path, and every other source lies in its folder: a source is only ever read
    /// under the rules of imports ([`files::resolve_inside`]), never at a path the artifact chose freely.
    fn source_paths(&self) -> Result<Option<(&Path, Vec<&Path>)>, ArtifactError> {
        let invalid = |source: &SourceHash, why: &str| {
            ArtifactError::new(
                ErrorKind::Invalid,
                format!("invalid artifact: source `{}` {why}", source.path.display()),
            )
        };
        let Some(recipe) = self.sources.first() else {
            return Ok(None);
        };
        let (Some(folder), Some(_)) = (recipe.path.parent(), recipe.path.file_name()) else {
            return Err(invalid(recipe, "is not a file path"));
        };
        if !recipe.path.is_absolute() {
            return Err(invalid(recipe, "is not an absolute path"));
        }
        if recipe.path.extension().is_none_or(|e| e != "rlx") {
            return Err(invalid(recipe, "is not a `.rlx` file"));
        }
        let mut inside = Vec::with_capacity(self.sources.len());
        for source in &self.sources {
            let relative = source
                .path
                .strip_prefix(folder)
                .map_err(|_| invalid(source, "is outside the recipe's folder"))?;
            match files::check_relative_with(relative, &SOURCE_EXTENSIONS) {
                Ok(()) => inside.push(relative),
                Err(Escape::NotRlx) => {
                    return Err(invalid(
                        source,
                        "is not a `.rlx` file (nor a rubric file, `.toml` or `.json`)",
                    ))
                }
                Err(_) => return Err(invalid(source, "leaves the recipe's folder")),
            }
        }
        Ok(Some((folder, inside)))
    }

    /// The first recorded source file that still exists and has changed, if any. Sources are read as
    /// imports are: regular `.rlx` files of at most `MAX_SOURCE_BYTES` inside the recipe's folder
    /// (symbolic links followed); one that no longer exists is skipped (the artifact is
    /// self-contained), one that cannot be read is an error.
    pub fn stale_source(&self) -> Result<Option<(&Path, String)>, ArtifactError> {
        let Some((folder, inside)) = self.source_paths()? else {
            return Ok(None);
        };
        // The folder is gone, and every source with it.
        let Ok(root) = folder.canonicalize() else {
            return Ok(None);
        };
        for (source, relative) in self.sources.iter().zip(inside) {
            let path = match files::resolve_inside_with(
                Some(&root),
                &root,
                relative,
                &SOURCE_EXTENSIONS,
            ) {
                Ok(path) => path,
                Err(Escape::Missing(_)) => continue,
                Err(_) => {
                    return Err(ArtifactError::new(
                        ErrorKind::Invalid,
                        format!(
                            "invalid artifact: source `{}` resolves outside the recipe's folder",
                            source.path.display()
                        ),
                    ))
                }
            };
            let bytes = files::read_limited(&path, MAX_SOURCE_BYTES as u64).map_err(|e| {
                ArtifactError::new(
                    ErrorKind::Io,
                    format!("cannot check source {}: {e}", source.path.display()),
                )
            })?;
            let now = hex_digest(&bytes);
            if now != source.sha256 {
                return Ok(Some((source.path.as_path(), now)));
            }
        }
        Ok(None)
    }

    /// The graph to run, given `--set` overrides: params are compiled in, so an override must name a
    /// param and repeat its compiled value.
    pub fn graph_with(&self, overrides: &[(String, f64)]) -> Result<&Graph, ArtifactError> {
        for (name, value) in overrides {
            let Some(param) = self.params.iter().find(|p| &p.name == name) else {
                let known: Vec<&str> = self.params.iter().map(|p| p.name.as_str()).collect();
                return Err(ArtifactError::new(
                    ErrorKind::Param,
                    format!(
                        "unknown param `{name}` (the artifact's params: {})",
                        if known.is_empty() {
                            "none".into()
                        } else {
                            known.join(", ")
                        }
                    ),
                ));
            };
            if param.value != *value {
                return Err(ArtifactError::new(
                    ErrorKind::Param,
                    format!(
                        "param `{name}` is compiled into the artifact as {}; recompile with `rlxc compile RECIPE --set {name}={value} -o FILE.rlxc`, or use the .rlx recipe",
                        param.value
                    ),
                ));
            }
        }
        Ok(&self.graph)
    }

    /// The recipe's signature: its inputs, params (at their compiled values), rubrics, states and
    /// outputs, what rollout files and arrays are read against (`rlx_runtime::rollouts`).
    pub fn signature(&self) -> Signature {
        Signature {
            inputs: self.inputs.clone(),
            params: self.params.clone(),
            ..self.graph.signature()
        }
    }

    /// Write the artifact to `path` ([`files::write_output`]: atomically, or through a FIFO or device).
    pub fn save(&self, path: &Path) -> Result<(), ArtifactError> {
        let bytes = self.to_bytes()?;
        files::write_output(path, &bytes).map_err(|e| {
            ArtifactError::new(
                ErrorKind::Io,
                format!("cannot write {}: {e}", path.display()),
            )
        })
    }
}

/// Read, validate and staleness-check the artifact at `path`. Every error names the file.
pub fn load(path: &Path) -> Result<Artifact, ArtifactError> {
    let named = |e: ArtifactError| ArtifactError {
        kind: e.kind,
        message: format!("{}: {}", path.display(), e.message),
    };
    let io = |e: std::io::Error| {
        ArtifactError::new(
            ErrorKind::Io,
            format!("cannot read {}: {e}", path.display()),
        )
    };
    // The magic and the declared length first: a file that is no artifact, or one longer or shorter
    // than it says, is refused before its body is read.
    let mut file = files::Untrusted::open(path).map_err(io)?;
    let mut bytes = file.read_prefix(MAX_HEADER_BYTES).map_err(io)?;
    let header = Header::parse(&bytes).map_err(named)?;
    let total = header.body_start as u64 + header.length;
    header
        .check_body_length(file.len().saturating_sub(header.body_start as u64))
        .map_err(named)?;
    bytes.extend(file.read_rest(total).map_err(io)?);
    let artifact = Artifact::from_bytes(&bytes).map_err(named)?;
    if let Some((source, _)) = artifact.stale_source().map_err(named)? {
        return Err(named(ArtifactError::new(
            ErrorKind::Stale,
            format!(
                "stale artifact: {} has changed since it was compiled; recompile with `rlxc compile {} -o {}`",
                source.display(),
                source.display(),
                path.display()
            ),
        )));
    }
    Ok(artifact)
}

/// Whether `path` names an artifact (by its extension) rather than a recipe.
pub fn is_artifact_path(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == EXTENSION)
}
