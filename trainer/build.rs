//! Probes for the pinned assets of scripts/fetch-assets.sh, which trainer/tests/models.rs and
//! smollm2.rs need: sets the cfg `rlx_assets` where they are there (rlx-tools, tools/src/lib.rs).

fn main() {
    rlx_tools::emit(&[rlx_tools::Gate::Assets]);
}
