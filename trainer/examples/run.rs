//! `cargo run --release -p rlx-trainer --example run -- RECIPE [--set K=V]…`: the trainer without the CLI.
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let recipe = rlx_compiler::check_path(std::path::Path::new(&args[0]))
        .expect("readable")
        .recipe
        .expect("recipe checks");
    let sets = args[1..]
        .iter()
        .filter(|a| *a != "--set")
        .cloned()
        .collect();
    let prepared = rlx_trainer::cli::prepare(
        &recipe,
        &rlx_trainer::cli::RunArgs {
            recipe_name: "example".into(),
            sets,
            out: Some("/tmp/rlx-example-run".into()),
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let summary = rlx_trainer::train::run(prepared.plan, &prepared.config, &prepared.out, |l| {
        eprintln!("{l}")
    })
    .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{summary:?}");
}
