//! Files named by users or by other files: the recipe, its imports, artifacts and what they list, and
//! the outputs of `rlxc` and `rlx`. A path is untrusted input: it may name a FIFO (opening it for
//! reading would block, reading it would wait forever), a character device (`/dev/zero` never ends), a
//! huge sparse file or a symbolic link. Every read of such a file goes through [`read_limited`] (or
//! [`Untrusted`]), every output through [`write_output`].

use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A regular file opened for reading, its size known before anything is read.
pub struct Untrusted {
    file: File,
    len: u64,
    /// Bytes read so far.
    consumed: u64,
}

impl Untrusted {
    /// Open `path` for reading without blocking (a FIFO with no writer opens at once on unix) and
    /// accept it only if it is a regular file, judged by the metadata of the opened file itself.
    pub fn open(path: &Path) -> io::Result<Untrusted> {
        let file = open_nonblocking(path)?;
        let metadata = file.metadata()?;
        if !metadata.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("not a regular file ({})", kind_of(&metadata)),
            ));
        }
        Ok(Untrusted {
            file,
            len: metadata.len(),
            consumed: 0,
        })
    }

    /// The file's size when it was opened.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Up to `count` bytes from the current position (fewer only at the end of the file).
    pub fn read_prefix(&mut self, count: usize) -> io::Result<Vec<u8>> {
        let mut bytes = Vec::with_capacity(count.min(self.len as usize));
        (&mut self.file)
            .take(count as u64)
            .read_to_end(&mut bytes)?;
        self.consumed += bytes.len() as u64;
        Ok(bytes)
    }

    /// The rest of the file, refusing a file of more than `limit` bytes in all before reading it, and
    /// reading no more than that limit allows (+1 byte), so a file that grows meanwhile is refused too.
    pub fn read_rest(mut self, limit: u64) -> io::Result<Vec<u8>> {
        if self.len > limit {
            return Err(too_large(self.len, limit));
        }
        let allowed = limit.saturating_sub(self.consumed);
        let mut bytes = Vec::with_capacity(self.len.saturating_sub(self.consumed) as usize);
        (&mut self.file)
            .take(allowed.saturating_add(1))
            .read_to_end(&mut bytes)?;
        if bytes.len() as u64 > allowed {
            return Err(too_large(self.consumed + bytes.len() as u64, limit));
        }
        Ok(bytes)
    }
}

/// The bytes of the regular file `path`, at most `limit` of them (a larger file is an error, checked
/// before reading).
pub fn read_limited(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    Untrusted::open(path)?.read_rest(limit)
}

/// [`read_limited`] as UTF-8 text.
pub fn read_text(path: &Path, limit: u64) -> io::Result<String> {
    let bytes = read_limited(path, limit)?;
    String::from_utf8(bytes).map_err(|error| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "not UTF-8 text (invalid byte at offset {})",
                error.utf8_error().valid_up_to()
            ),
        )
    })
}

fn too_large(len: u64, limit: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::FileTooLarge,
        format!("the file is {len} bytes; the limit is {limit}"),
    )
}

fn kind_of(metadata: &Metadata) -> &'static str {
    let kind = metadata.file_type();
    if kind.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "a FIFO";
        }
        if kind.is_char_device() {
            return "a character device";
        }
        if kind.is_block_device() {
            return "a block device";
        }
        if kind.is_socket() {
            return "a socket";
        }
    }
    "not a file"
}

#[cfg(unix)]
fn open_nonblocking(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    // O_NONBLOCK: opening a FIFO does not wait for a writer (and has no effect on regular files);
    // O_NOCTTY: a terminal never becomes the controlling one.
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
}

#[cfg(not(unix))]
fn open_nonblocking(path: &Path) -> io::Result<File> {
    File::open(path)
}

/// Whether `a` and `b` name the same existing file (symbolic links followed, hard links included).
pub fn is_same_file(a: &Path, b: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (std::fs::metadata(a), std::fs::metadata(b)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        match (a.canonicalize(), b.canonicalize()) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        }
    }
}

/// How [`write_output`] writes to a path.
#[derive(Debug, PartialEq, Eq)]
pub enum Target {
    /// A new file or a regular one (possibly reached through symbolic links, which stay): write a
    /// temporary file in the same folder, then rename it over this path, keeping an existing file's
    /// permissions.
    Replace { path: PathBuf, existing: bool },
    /// A FIFO, a device (`/dev/null`, a terminal) or an open descriptor (`/dev/stdout`,
    /// `/proc/self/fd/N`): open it and write through it.
    Through(PathBuf),
}

/// Deepest chain of symbolic links [`output_target`] follows (Linux's own limit is 40).
const MAX_LINKS: usize = 40;

/// Where and how output to `path` goes. A directory, a symbolic-link loop or a missing folder is an
/// error.
pub fn output_target(path: &Path) -> io::Result<Target> {
    let mut current = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        if is_descriptor_path(&current) {
            return Ok(Target::Through(path.to_path_buf()));
        }
        let metadata = match std::fs::symlink_metadata(&current) {
            Ok(metadata) => metadata,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                return Ok(Target::Replace {
                    path: current,
                    existing: false,
                })
            }
            Err(error) => return Err(error),
        };
        if metadata.file_type().is_symlink() {
            let link = std::fs::read_link(&current)?;
            current = match current.parent() {
                Some(parent) if link.is_relative() => parent.join(link),
                _ => link,
            };
            continue;
        }
        if metadata.is_file() {
            return Ok(Target::Replace {
                path: current,
                existing: true,
            });
        }
        if metadata.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::IsADirectory,
                "it is a directory",
            ));
        }
        return Ok(Target::Through(path.to_path_buf()));
    }
    Err(io::Error::other(format!(
        "more than {MAX_LINKS} symbolic links to follow"
    )))
}

/// `/dev/stdout`, `/dev/fd/N`, `/proc/…/fd/N`: a name for an already open descriptor, whose file (a
/// terminal, a pipe, or the file a shell redirected into) must be written through, never replaced.
fn is_descriptor_path(path: &Path) -> bool {
    let text = path.to_string_lossy();
    matches!(text.as_ref(), "/dev/stdout" | "/dev/stderr")
        || text.starts_with("/dev/fd/")
        || (text.starts_with("/proc/") && text.contains("/fd/"))
}

/// Write `bytes` to `path` as users expect of an output option: a new path or a regular file is
/// replaced atomically (a temporary file in the same folder, renamed over it, so an interrupted run
/// never leaves half a file; a symbolic link stays and its target is replaced; an existing file keeps
/// its permissions), and anything else (a FIFO, `/dev/null`, `/dev/stdout`) is written through. On
/// any error the temporary file is removed.
pub fn write_output(path: &Path, bytes: &[u8]) -> io::Result<()> {
    match output_target(path)? {
        Target::Through(path) => {
            let mut file = OpenOptions::new().append(true).open(path)?;
            file.write_all(bytes)?;
            file.flush()
        }
        Target::Replace { path, existing } => replace(&path, existing, bytes),
    }
}

fn replace(path: &Path, existing: bool, bytes: &[u8]) -> io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let folder = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut temporary_name = std::ffi::OsString::from(".");
    temporary_name.push(name);
    temporary_name.push(format!(
        ".{}.{}.rlx-tmp",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let temporary = folder.join(temporary_name);
    // `create_new`: never follow a link or reuse a file that someone placed at the temporary name.
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&temporary)?;
    let written = (|| {
        file.write_all(bytes)?;
        if existing {
            let permissions = std::fs::metadata(path)?.permissions();
            file.set_permissions(permissions)?;
        }
        file.sync_all()?;
        drop(file);
        std::fs::rename(&temporary, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

/// Why a path written in one file (an import, an artifact's source) may not be read.
#[derive(Debug, PartialEq, Eq)]
pub enum Escape {
    /// An absolute path.
    Absolute,
    /// A `..` component (or a Windows prefix).
    Parent,
    /// Not a `.rlx` file.
    NotRlx,
    /// Nothing there (the path looked for).
    Missing(PathBuf),
    /// Inside the folder as written, outside once symbolic links are followed.
    Outside,
}

/// The one rule for paths that a recipe or an artifact names: `written`, relative to `base`, must be
/// relative, without `..`, name a `.rlx` file, and (symbolic links followed) stay inside `root`, the
/// canonical folder of the recipe (or of the package the importing file belongs to). Returns the
/// canonical path.
pub fn resolve_inside(root: Option<&Path>, base: &Path, written: &Path) -> Result<PathBuf, Escape> {
    resolve_inside_with(root, base, written, &["rlx"])
}

/// [`resolve_inside`] for a file with one of `extensions` (a rubric file: `toml` or `json`).
pub fn resolve_inside_with(
    root: Option<&Path>,
    base: &Path,
    written: &Path,
    extensions: &[&str],
) -> Result<PathBuf, Escape> {
    check_relative_with(written, extensions)?;
    let target = base.join(written);
    let canonical = target.canonicalize().map_err(|_| Escape::Missing(target))?;
    match root {
        Some(root) if !canonical.starts_with(root) => Err(Escape::Outside),
        _ => Ok(canonical),
    }
}

/// The part of [`resolve_inside`]'s rule that needs no file system: relative, no `..`, `.rlx`.
pub fn check_relative(written: &Path) -> Result<(), Escape> {
    check_relative_with(written, &["rlx"])
}

/// [`check_relative`] for a file with one of `extensions` (`Escape::NotRlx` when it has none of them).
pub fn check_relative_with(written: &Path, extensions: &[&str]) -> Result<(), Escape> {
    use std::path::Component;
    if written.is_absolute() || written.has_root() {
        return Err(Escape::Absolute);
    }
    if written
        .components()
        .any(|c| matches!(c, Component::ParentDir | Component::Prefix(_)))
    {
        return Err(Escape::Parent);
    }
    if written
        .extension()
        .is_none_or(|e| !extensions.iter().any(|x| e == *x))
    {
        return Err(Escape::NotRlx);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let directory =
            std::env::temp_dir().join(format!("rlx-files-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&directory);
        std::fs::create_dir_all(&directory).unwrap();
        directory
    }

    #[test]
    fn a_file_over_the_limit_is_refused_and_one_within_it_read() {
        let directory = scratch("limit");
        let path = directory.join("big.rlx");
        std::fs::write(&path, vec![b'x'; 1001]).unwrap();
        let error = read_limited(&path, 1000).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::FileTooLarge);
        assert_eq!(
            error.to_string(),
            "the file is 1001 bytes; the limit is 1000"
        );
        assert_eq!(read_limited(&path, 1001).unwrap().len(), 1001);
        let error = read_limited(&directory, 1000).unwrap_err();
        assert_eq!(error.to_string(), "not a regular file (a directory)");
        std::fs::write(&path, [0xff, b'a']).unwrap();
        let error = read_text(&path, 10).unwrap_err();
        assert_eq!(
            error.to_string(),
            "not UTF-8 text (invalid byte at offset 0)"
        );
        std::fs::remove_dir_all(&directory).ok();
    }

    #[test]
    fn the_header_of_a_file_is_read_before_the_rest() {
        let directory = scratch("prefix");
        let path = directory.join("file");
        std::fs::write(&path, b"RLXC 2 rest of the file").unwrap();
        let mut file = Untrusted::open(&path).unwrap();
        assert_eq!(file.read_prefix(4).unwrap(), b"RLXC");
        assert_eq!(file.read_rest(23).unwrap(), b" 2 rest of the file");
        let mut file = Untrusted::open(&path).unwrap();
        file.read_prefix(4).unwrap();
        assert_eq!(
            file.read_rest(22).unwrap_err().kind(),
            io::ErrorKind::FileTooLarge
        );
        std::fs::remove_dir_all(&directory).ok();
    }

    #[cfg(unix)]
    #[test]
    fn outputs_are_replaced_or_written_through() {
        let directory = scratch("targets");
        let new = directory.join("new.json");
        assert_eq!(
            output_target(&new).unwrap(),
            Target::Replace {
                path: new.clone(),
                existing: false
            }
        );
        std::fs::write(&new, "x").unwrap();
        let link = directory.join("link.json");
        std::os::unix::fs::symlink("new.json", &link).unwrap();
        assert_eq!(
            output_target(&link).unwrap(),
            Target::Replace {
                path: directory.join("new.json"),
                existing: true
            }
        );
        for device in ["/dev/null", "/dev/stdout", "/proc/self/fd/1"] {
            assert_eq!(
                output_target(Path::new(device)).unwrap(),
                Target::Through(PathBuf::from(device))
            );
        }
        assert_eq!(
            output_target(&directory).unwrap_err().kind(),
            io::ErrorKind::IsADirectory
        );
        let looped = directory.join("loop.json");
        std::os::unix::fs::symlink("loop.json", &looped).unwrap();
        assert!(output_target(&looped).is_err());
        write_output(&link, b"written").unwrap();
        assert_eq!(std::fs::read_to_string(&new).unwrap(), "written");
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        std::fs::remove_dir_all(&directory).ok();
    }

    #[test]
    fn paths_named_in_files_follow_the_import_rules() {
        let directory = scratch("inside");
        std::fs::create_dir(directory.join("root")).unwrap();
        std::fs::write(directory.join("outside.rlx"), "").unwrap();
        let root = directory.join("root").canonicalize().unwrap();
        std::fs::write(root.join("a.rlx"), "").unwrap();
        let resolve = |written: &str| resolve_inside(Some(&root), &root, Path::new(written));
        assert_eq!(resolve("a.rlx"), Ok(root.join("a.rlx")));
        assert_eq!(resolve("/etc/passwd"), Err(Escape::Absolute));
        assert_eq!(resolve("sub/../a.rlx"), Err(Escape::Parent));
        assert_eq!(resolve("a.txt"), Err(Escape::NotRlx));
        assert_eq!(resolve("b.rlx"), Err(Escape::Missing(root.join("b.rlx"))));
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink("../outside.rlx", root.join("out.rlx")).unwrap();
            assert_eq!(resolve("out.rlx"), Err(Escape::Outside));
        }
        std::fs::remove_dir_all(&directory).ok();
    }
}
