//! The standard library: `stdlib/*.rlx`, embedded at build time (see `build.rs`).

include!(concat!(env!("OUT_DIR"), "/stdlib_modules.rs"));

/// The source of `std/NAME`, if it exists.
pub fn module(name: &str) -> Option<&'static str> {
    MODULES
        .iter()
        .find(|(module, _)| *module == name)
        .map(|(_, source)| *source)
}

pub fn module_names() -> impl Iterator<Item = &'static str> {
    MODULES.iter().map(|(name, _)| *name)
}
