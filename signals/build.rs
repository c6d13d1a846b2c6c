//! Probes for the pinned assets of scripts/fetch-assets.sh, which signals/tests/data.rs needs: sets the
//! cfg `rlx_assets` where they are there (rlx-tools, tools/src/lib.rs).

fn main() {
    rlx_tools::emit(&[rlx_tools::Gate::Assets]);
}
