//! Embeds every `stdlib/*.rlx` into the compiler, so `import std/NAME` needs no files at run time.

use std::fmt::Write as _;
use std::path::Path;

fn main() {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let stdlib = Path::new(&manifest).join("..").join("stdlib");
    println!("cargo:rerun-if-changed={}", stdlib.display());
    let mut modules: Vec<(String, String)> = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&stdlib) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) == Some("rlx") {
                println!("cargo:rerun-if-changed={}", path.display());
                let name = path
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .unwrap_or_default()
                    .to_string();
                let absolute = path.canonicalize().expect("stdlib file is readable");
                modules.push((name, absolute.display().to_string()));
            }
        }
    }
    modules.sort();
    let mut out = String::from("/// (module name, source) for every file in stdlib/.\npub static MODULES: &[(&str, &str)] = &[\n");
    for (name, path) in &modules {
        writeln!(out, "    ({name:?}, include_str!({path:?})),").expect("write to string");
    }
    out.push_str("];\n");
    let out_dir = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    std::fs::write(Path::new(&out_dir).join("stdlib_modules.rs"), out)
        .expect("write generated stdlib table");
}
