//! Source files known to one compilation: the recipe, its relative imports, and standard-library
//! modules (embedded in the binary).

use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct FileId(pub u32);

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum Origin {
    /// A file on disk, by the path it was opened with.
    Path(std::path::PathBuf),
    /// `std/NAME`, embedded at build time.
    Stdlib(String),
    /// Text handed over directly (tests, `rlx score` of an in-memory recipe).
    Memory,
}

#[derive(Clone, Debug, Serialize)]
pub struct SourceFile {
    /// The name shown in diagnostics.
    pub name: String,
    pub text: String,
    pub origin: Origin,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct SourceMap {
    files: Vec<SourceFile>,
}

impl SourceMap {
    pub fn new() -> SourceMap {
        SourceMap::default()
    }

    pub fn add(
        &mut self,
        name: impl Into<String>,
        text: impl Into<String>,
        origin: Origin,
    ) -> FileId {
        let id = FileId(u32::try_from(self.files.len()).unwrap_or(u32::MAX));
        self.files.push(SourceFile {
            name: name.into(),
            text: text.into(),
            origin,
        });
        id
    }

    pub fn get(&self, id: FileId) -> &SourceFile {
        &self.files[id.0 as usize]
    }

    pub fn find(&self, origin: &Origin) -> Option<FileId> {
        self.files
            .iter()
            .position(|file| &file.origin == origin)
            .map(|index| FileId(index as u32))
    }

    pub fn files(&self) -> impl Iterator<Item = (FileId, &SourceFile)> {
        self.files
            .iter()
            .enumerate()
            .map(|(index, file)| (FileId(index as u32), file))
    }
}
