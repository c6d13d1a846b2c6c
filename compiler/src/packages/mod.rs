//! Packages (docs/sharing.md): a folder with an `rlx.toml` manifest and its `.rlx` modules and rubric
//! files, depending on other packages by path or by git commit. `rlx.lock`, beside the manifest of the
//! package a recipe lives in, pins every package of the dependency graph: its source and the SHA-256
//! of every file it provides. Resolving for a compilation reads only the disk (path packages, and git
//! packages already brought into the cache by `rlx fetch`) and refuses any package whose files differ
//! from the lock; `rlx update` re-resolves from the manifests and rewrites the lock ([`git`] runs the
//! `git` command for it and for `rlx fetch`).
//!
//! Manifests and locks are untrusted input: they are read through [`files`], every error is a
//! diagnostic in the file and at the key, and sizes, counts and nesting are capped.

pub mod git;

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

use crate::diagnostic::Diagnostic;
use crate::export::sha256::hex_digest;
use crate::files;
use crate::source::{FileId, Origin, SourceMap};
use crate::syntax::ast::Span;

/// The manifest's file name.
pub const MANIFEST: &str = "rlx.toml";
/// The lock file's name, beside the manifest.
pub const LOCK: &str = "rlx.lock";
/// The lock format written and read.
pub const LOCK_VERSION: u32 = 1;
/// The extensions of the files a package provides (modules, rubric files, its manifest).
pub const PROVIDED: [&str; 3] = ["rlx", "toml", "json"];

const MAX_MANIFEST_BYTES: u64 = 64 << 10;
const MAX_LOCK_BYTES: u64 = 8 << 20;
/// Largest file a package provides (the compiler's source limit).
const MAX_FILE_BYTES: u64 = crate::syntax::parser::MAX_SOURCE_BYTES as u64;
/// Most files one package provides, and most bytes in all.
pub const MAX_PACKAGE_FILES: usize = 1000;
const MAX_PACKAGE_BYTES: u64 = 32 << 20;
/// Deepest folder nesting inside a package.
const MAX_PACKAGE_DEPTH: usize = 16;
/// Most packages in one dependency graph.
const MAX_PACKAGES: usize = 256;
/// Most ancestors searched for a manifest above a recipe.
const MAX_MANIFEST_SEARCH: usize = 64;

/// Where a dependency comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A folder, relative to the manifest that declares it.
    Path(String),
    /// A commit (40 hex digits) of a git repository.
    Git { url: String, rev: String },
}

/// One `[dependencies]` entry.
#[derive(Clone, Debug)]
pub struct Dependency {
    pub name: String,
    /// The key, in the declaring manifest.
    pub key_span: Span,
    pub source: Source,
    /// The `rev` value (git) or the `path` value.
    pub value_span: Span,
}

/// A parsed `rlx.toml`.
#[derive(Clone, Debug)]
pub struct Manifest {
    pub file: FileId,
    /// The package's canonical folder.
    pub dir: PathBuf,
    pub name: String,
    pub name_span: Span,
    pub version: String,
    pub description: Option<String>,
    pub license: Option<String>,
    pub dependencies: Vec<Dependency>,
}

impl Manifest {
    pub fn dependency(&self, name: &str) -> Option<&Dependency> {
        self.dependencies.iter().find(|d| d.name == name)
    }
}

/// One package of a lock file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Locked {
    pub name: String,
    pub version: String,
    /// `path+FOLDER` (relative to the locking package's folder) or `git+URL#COMMIT`.
    pub source: String,
    /// The names of its own dependencies.
    pub dependencies: Vec<String>,
    /// Every file it provides, by its `/`-separated path inside the package, with its SHA-256.
    pub files: BTreeMap<String, String>,
}

/// A parsed `rlx.lock`.
#[derive(Clone, Debug, Default)]
pub struct Lock {
    pub file: Option<FileId>,
    pub packages: Vec<Locked>,
}

impl Lock {
    pub fn get(&self, name: &str) -> Option<&Locked> {
        self.packages.iter().find(|p| p.name == name)
    }
}

/// A package of a resolved dependency graph.
#[derive(Clone, Debug)]
pub struct Package {
    pub manifest: Manifest,
    /// `path+…` or `git+…#…`, as in the lock.
    pub source: String,
    pub files: BTreeMap<String, String>,
}

/// The package a recipe lives in and every package it depends on, directly or not.
#[derive(Clone, Debug)]
pub struct Workspace {
    pub root: Manifest,
    pub packages: Vec<Package>,
}

impl Workspace {
    pub fn find(&self, name: &str) -> Option<usize> {
        self.packages.iter().position(|p| p.manifest.name == name)
    }

    /// The lock that pins this graph.
    pub fn lock(&self) -> Lock {
        Lock {
            file: None,
            packages: self
                .packages
                .iter()
                .map(|p| Locked {
                    name: p.manifest.name.clone(),
                    version: p.manifest.version.clone(),
                    source: p.source.clone(),
                    dependencies: p
                        .manifest
                        .dependencies
                        .iter()
                        .map(|d| d.name.clone())
                        .collect(),
                    files: p.files.clone(),
                })
                .collect(),
        }
    }
}

/// What an artifact records of a package it was compiled with.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    pub name: String,
    pub version: String,
    pub source: String,
    /// Every file the package provides, with its SHA-256 (as locked and verified).
    pub files: BTreeMap<String, String>,
}

impl From<&Package> for Record {
    fn from(package: &Package) -> Record {
        Record {
            name: package.manifest.name.clone(),
            version: package.manifest.version.clone(),
            source: package.source.clone(),
            files: package.files.clone(),
        }
    }
}

fn span(range: std::ops::Range<usize>) -> Span {
    Span::new(range.start, range.end)
}

fn toml_error(file: FileId, what: &str, error: &toml::de::Error) -> Diagnostic {
    let diagnostic = Diagnostic::error(
        "rlx::manifest",
        file,
        format!("invalid {what}: {}", error.message()),
    );
    match error.span() {
        Some(range) => diagnostic.label(span(range), "here"),
        None => diagnostic,
    }
}

/// Whether `name` can be written in an import (`name/module`): an identifier other than `std`.
pub fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name != "std"
        && name.len() <= 64
}

/// `MAJOR.MINOR.PATCH`, optionally with a `-pre` or `+build` suffix.
fn valid_version(version: &str) -> bool {
    let core = version.split(['-', '+']).next().unwrap_or_default();
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.len() <= 9 && p.bytes().all(|b| b.is_ascii_digit()))
        && version.len() <= 64
}

/// A full commit id: 40 lowercase hex digits.
pub fn valid_rev(rev: &str) -> bool {
    rev.len() == 40 && rev.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A git URL that cannot be taken for an option of the `git` command.
fn valid_url(url: &str) -> bool {
    !url.is_empty()
        && !url.starts_with('-')
        && !url.chars().any(char::is_control)
        && url.len() <= 2048
}

/// The folder of the nearest `rlx.toml` at or above `dir`.
pub fn find_manifest(dir: &Path) -> Option<PathBuf> {
    let mut current = Some(dir);
    for _ in 0..MAX_MANIFEST_SEARCH {
        let here = current?;
        if here.join(MANIFEST).is_file() {
            return Some(here.to_path_buf());
        }
        current = here.parent();
    }
    None
}

/// Why a manifest could not be loaded.
pub enum LoadError {
    /// The file could not be read (the message says why).
    Io(String),
    /// It was read (and added to the source map) but is invalid.
    Invalid(Vec<Diagnostic>),
}

/// Read and check `dir/rlx.toml`, adding it to `sources`.
pub fn load_manifest(sources: &mut SourceMap, dir: &Path) -> Result<Manifest, LoadError> {
    let path = dir.join(MANIFEST);
    let text = files::read_text(&path, MAX_MANIFEST_BYTES)
        .map_err(|e| LoadError::Io(format!("cannot read {}: {e}", path.display())))?;
    let canonical_dir = dir
        .canonicalize()
        .map_err(|e| LoadError::Io(format!("cannot read {}: {e}", dir.display())))?;
    let file = sources.add(
        path.display().to_string(),
        text.clone(),
        Origin::Path(canonical_dir.join(MANIFEST)),
    );
    parse_manifest(file, &text, canonical_dir).map_err(LoadError::Invalid)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    package: RawPackage,
    #[serde(default)]
    dependencies: BTreeMap<Spanned<String>, Spanned<RawDependency>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPackage {
    name: Spanned<String>,
    version: Spanned<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    license: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDependency {
    path: Option<Spanned<String>>,
    git: Option<Spanned<String>>,
    rev: Option<Spanned<String>>,
}

/// Parse a manifest's text (`file` in the source map, `dir` its canonical folder).
pub fn parse_manifest(file: FileId, text: &str, dir: PathBuf) -> Result<Manifest, Vec<Diagnostic>> {
    let raw: RawManifest =
        toml::from_str(text).map_err(|e| vec![toml_error(file, "rlx.toml", &e)])?;
    let mut errors = Vec::new();
    let invalid = |at: Span, message: String, help: &str| {
        Diagnostic::error("rlx::manifest", file, message)
            .label(at, "here")
            .help(help)
    };
    let name = raw.package.name;
    if !valid_name(name.get_ref()) {
        errors.push(invalid(
            span(name.span()),
            format!("`{}` is not a package name", name.get_ref()),
            "a package name is an identifier (letters, digits, `_`) other than `std`, so that `import NAME/module` can name it",
        ));
    }
    let version = raw.package.version;
    if !valid_version(version.get_ref()) {
        errors.push(invalid(
            span(version.span()),
            format!("`{}` is not a version", version.get_ref()),
            "write MAJOR.MINOR.PATCH, e.g. `0.1.0`",
        ));
    }
    let mut dependencies = Vec::new();
    for (key, value) in raw.dependencies {
        let key_span = span(key.span());
        let dep_name = key.into_inner();
        let value_span = span(value.span());
        let dep = value.into_inner();
        if !valid_name(&dep_name) {
            errors.push(invalid(
                key_span,
                format!("`{dep_name}` is not a package name"),
                "a package name is an identifier (letters, digits, `_`) other than `std`",
            ));
            continue;
        }
        let source = match (dep.path, dep.git, dep.rev) {
            (Some(path), None, None) => {
                let written = Path::new(path.get_ref());
                if written.is_absolute() || written.has_root() || path.get_ref().is_empty() {
                    errors.push(invalid(
                        span(path.span()),
                        format!("`{}` is not a relative path", path.get_ref()),
                        "a path dependency is a folder relative to this manifest, e.g. `../style`",
                    ));
                    continue;
                }
                (Source::Path(path.get_ref().clone()), span(path.span()))
            }
            (None, Some(url), Some(rev)) => {
                if !valid_url(url.get_ref()) {
                    errors.push(invalid(
                        span(url.span()),
                        format!("`{}` is not a git URL", url.get_ref()),
                        "a URL the `git` command can clone, not starting with `-`",
                    ));
                    continue;
                }
                if !valid_rev(rev.get_ref()) {
                    errors.push(invalid(
                        span(rev.span()),
                        format!("`{}` is not a full commit id", rev.get_ref()),
                        "pin a git dependency to a commit: `rev` is its 40 lowercase hex digits (`git rev-parse HEAD`)",
                    ));
                    continue;
                }
                (
                    Source::Git {
                        url: url.get_ref().clone(),
                        rev: rev.get_ref().clone(),
                    },
                    span(rev.span()),
                )
            }
            (None, Some(_), None) => {
                errors.push(invalid(
                    value_span,
                    format!("git dependency `{dep_name}` has no `rev`"),
                    "pin it to a commit: `{ git = \"URL\", rev = \"40 hex digits\" }`",
                ));
                continue;
            }
            _ => {
                errors.push(invalid(
                    value_span,
                    format!("dependency `{dep_name}` needs either `path` or `git` with `rev`"),
                    "`name = { path = \"../x\" }` or `name = { git = \"URL\", rev = \"COMMIT\" }`",
                ));
                continue;
            }
        };
        dependencies.push(Dependency {
            name: dep_name,
            key_span,
            source: source.0,
            value_span: source.1,
        });
    }
    if dependencies.len() > MAX_PACKAGES {
        errors.push(invalid(
            Span::default(),
            format!("more than {MAX_PACKAGES} dependencies"),
            "split the package",
        ));
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(Manifest {
        file,
        dir,
        name_span: span(name.span()),
        name: name.into_inner(),
        version: version.into_inner(),
        description: raw.package.description,
        license: raw.package.license,
        dependencies,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLock {
    version: Spanned<u32>,
    #[serde(default)]
    package: Vec<RawLocked>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLocked {
    name: Spanned<String>,
    version: String,
    source: String,
    #[serde(default)]
    dependencies: Vec<String>,
    files: BTreeMap<Spanned<String>, Spanned<String>>,
}

/// Read `dir/rlx.lock` if there is one (`Ok(None)` when there is none), adding it to `sources`.
pub fn load_lock(sources: &mut SourceMap, dir: &Path) -> Result<Option<Lock>, Vec<Diagnostic>> {
    let path = dir.join(LOCK);
    if std::fs::symlink_metadata(&path).is_err() {
        return Ok(None);
    }
    let text = match files::read_text(&path, MAX_LOCK_BYTES) {
        Ok(text) => text,
        Err(error) => {
            let file = sources.add(path.display().to_string(), "", Origin::Path(path.clone()));
            return Err(vec![Diagnostic::error(
                "rlx::lock",
                file,
                format!("cannot read {}: {error}", path.display()),
            )
            .label(Span::default(), "this file")]);
        }
    };
    let file = sources.add(path.display().to_string(), text.clone(), Origin::Path(path));
    parse_lock(file, &text).map(Some)
}

/// Parse a lock file's text.
pub fn parse_lock(file: FileId, text: &str) -> Result<Lock, Vec<Diagnostic>> {
    let lock_error = |at: Span, message: String| {
        Diagnostic::error("rlx::lock", file, message)
            .label(at, "here")
            .help("the lock is written by `rlx update`; run it again rather than editing the file")
    };
    let raw: RawLock = toml::from_str(text).map_err(|e| {
        let mut diagnostic = toml_error(file, "rlx.lock", &e);
        diagnostic.code = "rlx::lock";
        vec![diagnostic]
    })?;
    if *raw.version.get_ref() != LOCK_VERSION {
        return Err(vec![lock_error(
            span(raw.version.span()),
            format!(
                "lock format version {} (this rlx reads version {LOCK_VERSION})",
                raw.version.get_ref()
            ),
        )]);
    }
    let mut errors = Vec::new();
    let mut packages: Vec<Locked> = Vec::new();
    for locked in raw.package {
        if packages.iter().any(|p| p.name == *locked.name.get_ref()) {
            errors.push(lock_error(
                span(locked.name.span()),
                format!("package `{}` is locked twice", locked.name.get_ref()),
            ));
            continue;
        }
        if locked.files.len() > MAX_PACKAGE_FILES {
            errors.push(lock_error(
                span(locked.name.span()),
                format!("more than {MAX_PACKAGE_FILES} files"),
            ));
            continue;
        }
        let mut files = BTreeMap::new();
        for (path, hash) in locked.files {
            if !valid_relative_file(path.get_ref()) {
                errors.push(lock_error(
                    span(path.span()),
                    format!("`{}` is not a path inside a package", path.get_ref()),
                ));
            } else if hash.get_ref().len() != 64
                || !hash
                    .get_ref()
                    .bytes()
                    .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            {
                errors.push(lock_error(
                    span(hash.span()),
                    "not a SHA-256 (64 lowercase hex digits)".into(),
                ));
            } else {
                files.insert(path.into_inner(), hash.into_inner());
            }
        }
        packages.push(Locked {
            name: locked.name.into_inner(),
            version: locked.version,
            source: locked.source,
            dependencies: locked.dependencies,
            files,
        });
    }
    if packages.len() > MAX_PACKAGES {
        errors.push(lock_error(
            Span::default(),
            format!("more than {MAX_PACKAGES} packages"),
        ));
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(Lock {
        file: Some(file),
        packages,
    })
}

/// A `/`-separated relative path without `.`/`..` components, with an extension a package provides.
fn valid_relative_file(path: &str) -> bool {
    !path.is_empty()
        && path.len() <= 4096
        && path
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != ".." && !part.contains('\\'))
        && Path::new(path)
            .extension()
            .is_some_and(|e| PROVIDED.iter().any(|p| e == *p))
}

fn quote(text: &str) -> String {
    toml::Value::String(text.to_string()).to_string()
}

impl Lock {
    /// The lock file's text: deterministic (packages by name, files by path).
    pub fn to_text(&self) -> String {
        let mut packages: Vec<&Locked> = self.packages.iter().collect();
        packages.sort_by(|a, b| a.name.cmp(&b.name));
        let mut out = String::from(
            "# Written by `rlx update`: the source of every package this one depends on and the SHA-256\n\
             # of every file it provides. Checked by every compilation; do not edit.\n",
        );
        out.push_str(&format!("version = {LOCK_VERSION}\n"));
        for package in packages {
            out.push_str("\n[[package]]\n");
            out.push_str(&format!("name = {}\n", quote(&package.name)));
            out.push_str(&format!("version = {}\n", quote(&package.version)));
            out.push_str(&format!("source = {}\n", quote(&package.source)));
            let deps: Vec<String> = package.dependencies.iter().map(|d| quote(d)).collect();
            out.push_str(&format!("dependencies = [{}]\n", deps.join(", ")));
            out.push_str("\n[package.files]\n");
            for (path, hash) in &package.files {
                out.push_str(&format!("{} = {}\n", quote(path), quote(hash)));
            }
        }
        out
    }
}

/// The files a package provides (`.rlx`, `.toml`, `.json`, outside hidden folders), by `/`-separated
/// path, with their SHA-256. A symbolic link must stay inside the package; files are read through
/// [`files`] and counts, sizes and nesting are capped.
pub fn package_files(root: &Path) -> Result<BTreeMap<String, String>, String> {
    let root = root
        .canonicalize()
        .map_err(|e| format!("cannot read {}: {e}", root.display()))?;
    let mut found = BTreeMap::new();
    let mut total = 0u64;
    walk(&root, &root, "", 0, &mut found, &mut total)?;
    Ok(found)
}

fn walk(
    root: &Path,
    dir: &Path,
    prefix: &str,
    depth: usize,
    found: &mut BTreeMap<String, String>,
    total: &mut u64,
) -> Result<(), String> {
    if depth > MAX_PACKAGE_DEPTH {
        return Err(format!(
            "folders nest more than {MAX_PACKAGE_DEPTH} deep at `{prefix}`"
        ));
    }
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
        names.push(entry.file_name());
        if names.len() > 4 * MAX_PACKAGE_FILES {
            return Err(format!("{} has too many entries", dir.display()));
        }
    }
    names.sort();
    for name in names {
        let Some(name) = name.to_str().map(str::to_string) else {
            continue;
        };
        if name.starts_with('.') {
            continue;
        }
        let path = dir.join(&name);
        let relative = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        let metadata = std::fs::symlink_metadata(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if metadata.is_dir() {
            walk(root, &path, &relative, depth + 1, found, total)?;
            continue;
        }
        let provided = Path::new(&name)
            .extension()
            .is_some_and(|e| PROVIDED.iter().any(|p| e == *p));
        if !provided || name == LOCK {
            continue;
        }
        if metadata.file_type().is_symlink() {
            let target = path
                .canonicalize()
                .map_err(|_| format!("`{relative}` is a broken symbolic link"))?;
            if !target.starts_with(root) {
                return Err(format!(
                    "`{relative}` is a symbolic link that leads outside the package"
                ));
            }
        }
        let bytes = files::read_limited(&path, MAX_FILE_BYTES)
            .map_err(|e| format!("cannot read `{relative}`: {e}"))?;
        *total += bytes.len() as u64;
        if *total > MAX_PACKAGE_BYTES || found.len() >= MAX_PACKAGE_FILES {
            return Err(format!(
                "the package provides more than {MAX_PACKAGE_FILES} files or {} MiB",
                MAX_PACKAGE_BYTES >> 20
            ));
        }
        found.insert(relative, hex_digest(&bytes));
    }
    Ok(())
}

/// `path` relative to `base` (both canonical): `..` for each component of `base` not shared.
fn relative_to(path: &Path, base: &Path) -> String {
    let path: Vec<Component> = path.components().collect();
    let base: Vec<Component> = base.components().collect();
    let common = path.iter().zip(&base).take_while(|(a, b)| a == b).count();
    let mut parts: Vec<String> = vec!["..".to_string(); base.len() - common];
    parts.extend(
        path[common..]
            .iter()
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
    if parts.is_empty() {
        ".".into()
    } else {
        parts.join("/")
    }
}

/// The cache that git packages are fetched into: `$RLX_CACHE`, else `$XDG_CACHE_HOME/rlx`, else
/// `$HOME/.cache/rlx`.
pub fn cache_dir() -> Option<PathBuf> {
    let var = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("RLX_CACHE")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("rlx")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("rlx")))
}

/// Where the commit `rev` of the repository `url` lives in the cache.
pub fn git_checkout_dir(cache: &Path, url: &str, rev: &str) -> PathBuf {
    cache
        .join("git")
        .join(&hex_digest(url.as_bytes())[..16])
        .join(rev)
}

/// How [`resolve`] finds each package.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// A compilation: the lock says what each package is; git packages must be in the cache.
    Locked,
    /// `rlx fetch`: as `Locked`, bringing missing git packages into the cache first.
    Fetch,
    /// `rlx update`: the manifests say what each package is (git packages fetched); the lock is
    /// ignored, and the result is the new lock.
    Update,
}

/// Resolve the dependency graph of the package whose manifest is in `dir`. Diagnostics point at the
/// manifests' keys and the lock's entries.
pub fn resolve(
    sources: &mut SourceMap,
    dir: &Path,
    mode: Mode,
) -> (Option<Workspace>, Vec<Diagnostic>) {
    let root = match load_manifest(sources, dir) {
        Ok(manifest) => manifest,
        Err(LoadError::Invalid(diagnostics)) => return (None, diagnostics),
        Err(LoadError::Io(message)) => {
            let file = sources.add(dir.join(MANIFEST).display().to_string(), "", Origin::Memory);
            return (
                None,
                vec![Diagnostic::error("rlx::manifest", file, message)],
            );
        }
    };
    let lock = if mode == Mode::Update {
        None
    } else {
        match load_lock(sources, &root.dir) {
            Ok(lock) => Some(lock.unwrap_or_default()),
            Err(diagnostics) => return (None, diagnostics),
        }
    };
    let mut resolver = Resolver {
        sources,
        mode,
        lock,
        cache: cache_dir(),
        root_dir: root.dir.clone(),
        packages: Vec::new(),
        declared_by: Vec::new(),
        diagnostics: Vec::new(),
    };
    let mut stack = vec![root.name.clone()];
    resolver.dependencies(&root, &mut stack);
    let Resolver {
        packages,
        diagnostics,
        ..
    } = resolver;
    if diagnostics.iter().any(Diagnostic::is_error) {
        return (None, diagnostics);
    }
    (Some(Workspace { root, packages }), diagnostics)
}

struct Resolver<'s> {
    sources: &'s mut SourceMap,
    mode: Mode,
    lock: Option<Lock>,
    cache: Option<PathBuf>,
    root_dir: PathBuf,
    packages: Vec<Package>,
    /// For each package: the manifest that first declared it (its name).
    declared_by: Vec<String>,
    diagnostics: Vec<Diagnostic>,
}

impl Resolver<'_> {
    fn dependencies(&mut self, declaring: &Manifest, stack: &mut Vec<String>) {
        for dependency in &declaring.dependencies {
            self.dependency(declaring, dependency, stack);
        }
    }

    fn dependency(&mut self, declaring: &Manifest, dep: &Dependency, stack: &mut Vec<String>) {
        let error = |code, message: String, label: &str| {
            Diagnostic::error(code, declaring.file, message).label(dep.key_span, label.to_string())
        };
        if let Some(at) = stack.iter().position(|name| *name == dep.name) {
            let chain: Vec<&str> = stack[at..]
                .iter()
                .map(String::as_str)
                .chain([dep.name.as_str()])
                .collect();
            self.diagnostics.push(
                error(
                    "rlx::package_cycle",
                    format!("package cycle: {}", chain.join(" → ")),
                    "this dependency closes the cycle",
                )
                .help("packages form a tree (or a DAG): move what both need into a third package"),
            );
            return;
        }
        // The source, as the lock writes it.
        let (source, location) = match &dep.source {
            Source::Path(written) => {
                if declaring.dir != self.root_dir
                    && self
                        .packages
                        .iter()
                        .any(|p| p.manifest.dir == declaring.dir && p.source.starts_with("git+"))
                {
                    self.diagnostics.push(
                        error(
                            "rlx::manifest",
                            format!(
                                "git package `{}` has a path dependency `{}`",
                                declaring.name, dep.name
                            ),
                            "a path outside the repository",
                        )
                        .help("a package fetched by git can only depend on other git packages"),
                    );
                    return;
                }
                match declaring.dir.join(written).canonicalize() {
                    Ok(dir) if dir.join(MANIFEST).is_file() => (
                        format!("path+{}", relative_to(&dir, &self.root_dir)),
                        Some(dir),
                    ),
                    _ => {
                        self.diagnostics.push(
                            Diagnostic::error(
                                "rlx::package_not_found",
                                declaring.file,
                                format!(
                                    "package `{}`: no {MANIFEST} in `{}`",
                                    dep.name,
                                    declaring.dir.join(written).display()
                                ),
                            )
                            .label(dep.value_span, "this folder")
                            .help("a path dependency names a package's folder, relative to this manifest"),
                        );
                        return;
                    }
                }
            }
            Source::Git { url, rev } => (format!("git+{url}#{rev}"), None),
        };
        if let Some(index) = self
            .packages
            .iter()
            .position(|p| p.manifest.name == dep.name)
        {
            if self.packages[index].source != source {
                self.diagnostics.push(
                    error(
                        "rlx::package_conflict",
                        format!(
                            "two versions of package `{}`: `{}` (required by `{}`) and `{source}` (required here)",
                            dep.name, self.packages[index].source, self.declared_by[index]
                        ),
                        "a second version",
                    )
                    .help("one dependency graph holds one version of each package: make both require the same"),
                );
            }
            return;
        }
        if self.packages.len() >= MAX_PACKAGES {
            self.diagnostics.push(error(
                "rlx::manifest",
                format!("more than {MAX_PACKAGES} packages"),
                "here",
            ));
            return;
        }
        let locked = match (&self.lock, self.mode) {
            (Some(lock), Mode::Locked | Mode::Fetch) => match lock.get(&dep.name) {
                None => {
                    self.diagnostics.push(
                        error(
                            "rlx::lock_missing",
                            format!("package `{}` is not in {LOCK}", dep.name),
                            "not locked",
                        )
                        .help("run `rlx update` to resolve the dependencies and write the lock"),
                    );
                    return;
                }
                Some(locked) if locked.source != source => {
                    self.diagnostics.push(
                        error(
                            "rlx::lock_stale",
                            format!(
                                "package `{}` is locked at `{}`, but the manifest asks for `{source}`",
                                dep.name, locked.source
                            ),
                            "changed since the lock was written",
                        )
                        .help("run `rlx update` to lock the new source"),
                    );
                    return;
                }
                Some(locked) => Some(locked.clone()),
            },
            _ => None,
        };
        let dir = match (&dep.source, location) {
            (_, Some(dir)) => dir,
            (Source::Git { url, rev }, None) => {
                let Some(cache) = &self.cache else {
                    self.diagnostics.push(error(
                        "rlx::not_fetched",
                        "no cache folder for git packages: set RLX_CACHE or HOME".into(),
                        "a git package",
                    ));
                    return;
                };
                let dir = git_checkout_dir(cache, url, rev);
                if !dir.is_dir() {
                    if self.mode == Mode::Locked {
                        self.diagnostics.push(
                            error(
                                "rlx::not_fetched",
                                format!("git package `{}` is not in the cache ({})", dep.name, dir.display()),
                                "not fetched",
                            )
                            .help("run `rlx fetch` (once, with network access); compiling never fetches"),
                        );
                        return;
                    }
                    if let Err(failure) = git::fetch(url, rev, &dir) {
                        let (code, at) = match failure {
                            git::Failure::NoCommit(_) => ("rlx::bad_rev", dep.value_span),
                            git::Failure::Other(_) => ("rlx::fetch", dep.key_span),
                        };
                        self.diagnostics.push(
                            Diagnostic::error(
                                code,
                                declaring.file,
                                format!("cannot fetch package `{}`: {failure}", dep.name),
                            )
                            .label(at, "here"),
                        );
                        return;
                    }
                }
                dir
            }
            (Source::Path(_), None) => return,
        };
        let files = match package_files(&dir) {
            Ok(files) => files,
            Err(message) => {
                self.diagnostics.push(error(
                    "rlx::package_files",
                    format!("package `{}`: {message}", dep.name),
                    "this package",
                ));
                return;
            }
        };
        if let Some(locked) = &locked {
            if let Some(problem) = compare_files(&locked.files, &files) {
                self.diagnostics.push(
                    error(
                        "rlx::package_modified",
                        format!("package `{}` does not match {LOCK}: {problem}", dep.name),
                        "its content changed",
                    )
                    .help("if the change is intended, run `rlx update` to lock the new content"),
                );
                return;
            }
        }
        let manifest = match load_manifest(self.sources, &dir) {
            Ok(manifest) => manifest,
            Err(LoadError::Invalid(found)) => {
                self.diagnostics.extend(found);
                return;
            }
            Err(LoadError::Io(message)) => {
                self.diagnostics
                    .push(error("rlx::package_not_found", message, "this package"));
                return;
            }
        };
        if manifest.name != dep.name {
            self.diagnostics.push(
                error(
                    "rlx::package_name",
                    format!(
                        "the package at `{source}` is named `{}`, not `{}`",
                        manifest.name, dep.name
                    ),
                    "this name",
                )
                .help("a dependency's key is the name in the package's own rlx.toml"),
            );
            return;
        }
        if let Some(locked) = &locked {
            if locked.version != manifest.version {
                self.diagnostics.push(
                    error(
                        "rlx::lock_stale",
                        format!(
                            "package `{}` is locked at version {}, but is {}",
                            dep.name, locked.version, manifest.version
                        ),
                        "changed since the lock was written",
                    )
                    .help("run `rlx update`"),
                );
                return;
            }
        }
        self.packages.push(Package {
            manifest: manifest.clone(),
            source,
            files,
        });
        self.declared_by.push(declaring.name.clone());
        stack.push(dep.name.clone());
        self.dependencies(&manifest, stack);
        stack.pop();
    }
}

/// What `rlx update`, `rlx fetch` and `rlxc check DIR` found: the files read (for rendering the
/// diagnostics), the diagnostics, and the resolved graph when there was no error.
pub struct Outcome {
    pub sources: SourceMap,
    pub diagnostics: Vec<Diagnostic>,
    pub workspace: Option<Workspace>,
}

impl Outcome {
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }
}

fn no_package(dir: &Path) -> Outcome {
    let mut sources = SourceMap::new();
    let file = sources.add(dir.display().to_string(), "", Origin::Memory);
    Outcome {
        sources,
        diagnostics: vec![Diagnostic::error(
            "rlx::no_manifest",
            file,
            format!("no {MANIFEST} in {} or above it", dir.display()),
        )
        .help("a package is a folder with an rlx.toml (docs/sharing.md)")],
        workspace: None,
    }
}

/// Resolve the package at or above `dir` in `mode`.
pub fn resolve_at(dir: &Path, mode: Mode) -> Outcome {
    let Some(root) = find_manifest(dir) else {
        return no_package(dir);
    };
    let mut sources = SourceMap::new();
    let (workspace, diagnostics) = resolve(&mut sources, &root, mode);
    Outcome {
        sources,
        diagnostics,
        workspace,
    }
}

/// `rlx update`: resolve the package at or above `dir` from its manifests (fetching git packages
/// into the cache) and write its `rlx.lock`.
pub fn update(dir: &Path) -> Outcome {
    let mut outcome = resolve_at(dir, Mode::Update);
    if let Some(workspace) = &outcome.workspace {
        let path = workspace.root.dir.join(LOCK);
        if let Err(error) = files::write_output(&path, workspace.lock().to_text().as_bytes()) {
            outcome.diagnostics.push(Diagnostic::error(
                "rlx::lock",
                workspace.root.file,
                format!("cannot write {}: {error}", path.display()),
            ));
            outcome.workspace = None;
        }
    }
    outcome
}

/// `rlx fetch`: bring the git packages of the lock into the cache and verify every package
/// against the lock.
pub fn fetch(dir: &Path) -> Outcome {
    resolve_at(dir, Mode::Fetch)
}

/// The first difference between the locked files and the files found, said in words.
fn compare_files(
    locked: &BTreeMap<String, String>,
    found: &BTreeMap<String, String>,
) -> Option<String> {
    for (path, hash) in locked {
        match found.get(path) {
            None => return Some(format!("`{path}` is missing")),
            Some(now) if now != hash => {
                return Some(format!(
                    "`{path}` has changed (SHA-256 {now}, locked {hash})"
                ))
            }
            Some(_) => {}
        }
    }
    found
        .keys()
        .find(|path| !locked.contains_key(*path))
        .map(|path| format!("`{path}` is not in the lock"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_versions_and_revs() {
        assert!(valid_name("house_style"));
        assert!(!valid_name("std"));
        assert!(!valid_name("house-style"));
        assert!(!valid_name("9lives"));
        assert!(valid_version("0.1.0"));
        assert!(valid_version("1.2.3-rc.1"));
        assert!(!valid_version("1.2"));
        assert!(valid_rev(&"a".repeat(40)));
        assert!(!valid_rev("main"));
        assert!(!valid_url("--upload-pack=touch /tmp/x"));
    }

    #[test]
    fn relative_paths_between_folders() {
        assert_eq!(
            relative_to(Path::new("/a/b/c"), Path::new("/a/d")),
            "../b/c"
        );
        assert_eq!(relative_to(Path::new("/a/d/e"), Path::new("/a/d")), "e");
        assert_eq!(relative_to(Path::new("/a"), Path::new("/a")), ".");
    }

    #[test]
    fn a_lock_round_trips_through_its_text() {
        let lock = Lock {
            file: None,
            packages: vec![Locked {
                name: "style".into(),
                version: "0.1.0".into(),
                source: "git+file:///x \"y\"#".to_string() + &"0".repeat(40),
                dependencies: vec!["base".into()],
                files: [("a/b.rlx".to_string(), "f".repeat(64))].into(),
            }],
        };
        let parsed = parse_lock(FileId(0), &lock.to_text()).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(parsed.packages, lock.packages);
        let bad = lock.to_text().replace("a/b.rlx", "../b.rlx");
        assert!(parse_lock(FileId(0), &bad).is_err());
    }
}
