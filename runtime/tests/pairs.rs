//! Pair inputs and `components` (docs/language.md, "Pair values"; docs/formats.md, "Pair inputs").
//!
//! - `components` gives the classes of the closure of the verdicts, named by their smallest member's
//!   position in the group, on the interpreter and the JIT: hand-worked groups (chains, one-way
//!   verdicts, singletons), and every partition of a group of 5 against brute-force reachability.
//! - recipes/darling_pairs.rlx equals recipes/darling.rlx when the verdicts are the closure of the
//!   cluster ids, and when they are only a one-way chain through each cluster (their closure is the
//!   same partition): rewards, advantages, loss, gradient and the shared metrics, interpreter and JIT.
//! - A rollout file carries a pair input as n − 1 values per line (the synthetic batch's JSONL reads
//!   back to the same batch); a wrong length, NaN and a non-boolean are errors naming the line.
//! - The arrays of the Python binding: packed `[P]` and an `[R, R]` matrix give the same batch; other
//!   shapes are errors.

use std::path::PathBuf;

use rlx_compiler::ir::Graph;
use rlx_runtime::arrays::{from_arrays, Array, Arrays, Elements};
use rlx_runtime::rollouts::read_rollouts;
use rlx_runtime::synthetic::{self, Spec};
use rlx_runtime::{
    evaluate, evaluate_showing, Batch, Context, Geometry, Kernel, Layout, Options, Outcome,
    Precision,
};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn recipe(name: &str, text: &str) -> rlx_compiler::hir::Recipe {
    let checked = rlx_compiler::check_source(name, text);
    checked
        .recipe
        .unwrap_or_else(|| panic!("{name} does not check: {:?}", checked.diagnostics))
}

fn graph(name: &str, text: &str) -> Graph {
    rlx_compiler::compile_graph(&recipe(name, text), &[]).expect("lowers")
}

fn graph_of_file(path: &str) -> Graph {
    let checked = rlx_compiler::check_path(&root().join(path)).expect("readable");
    let recipe = checked
        .recipe
        .unwrap_or_else(|| panic!("{path} does not check: {:?}", checked.diagnostics));
    rlx_compiler::compile_graph(&recipe, &[]).expect("lowers")
}

/// The classes as a `--show`-able reward: reward = the class id.
const CLASSES: &str = "input same : bool[pair]\nreward = components(same over others)\n";

/// The pair verdicts of groups of `sizes` responses from `joined(g, i, j)` (positions in the group).
fn verdicts(sizes: &[usize], joined: impl Fn(usize, usize, usize) -> bool) -> Batch {
    let layout = Layout::from_counts(sizes, &vec![1; sizes.iter().sum()], &[], 0).expect("layout");
    let mut values = Vec::new();
    for (g, &n) in sizes.iter().enumerate() {
        for i in 0..n {
            for j in (0..n).filter(|&j| j != i) {
                values.push(f64::from(u8::from(joined(g, i, j))));
            }
        }
    }
    Batch {
        layout,
        inputs: vec![values],
    }
}

/// The class ids by the interpreter and by the JIT, which must agree.
fn classes(batch: &Batch) -> Vec<f64> {
    let graph = graph("classes.rlx", CLASSES);
    let interp = evaluate(&graph, batch, &Context::default()).expect("interpreter");
    let kernel = Kernel::compile(&graph, &Options::default()).expect("JIT");
    let jit = kernel.run(batch, &Context::default()).expect("JIT runs");
    assert_eq!(interp.reward, jit.reward, "interpreter and JIT disagree");
    interp.reward.expect("a reward")
}

#[test]
fn classes_are_named_by_their_smallest_member() {
    // Group 0 (5): 0 → 1 and 3 → 1 one way only, 2 and 4 alone → {0, 1, 3}, {2}, {4}.
    // Group 1 (1): alone → 0. Group 2 (4): a chain 3 → 2 → 1 → 0 → {0, 1, 2, 3}.
    // Group 3 (3): nothing joins → 0, 1, 2.
    let batch = verdicts(&[5, 1, 4, 3], |g, i, j| match g {
        0 => (i, j) == (0, 1) || (i, j) == (3, 1),
        2 => j + 1 == i,
        _ => false,
    });
    let expected = [0, 0, 2, 0, 4, 0, 0, 0, 0, 0, 0, 1, 2];
    let expected: Vec<f64> = expected.iter().map(|&c| f64::from(c)).collect();
    assert_eq!(classes(&batch), expected);
}

/// Every subset of the 10 unordered pairs of a group of 5, each pair given in one direction (which one
/// alternates), against reachability computed by Floyd–Warshall closure.
#[test]
fn every_graph_on_five_responses_gets_its_closure() {
    let n = 5;
    let edges: Vec<(usize, usize)> = (0..n)
        .flat_map(|i| (i + 1..n).map(move |j| (i, j)))
        .collect();
    let mut expected = Vec::new();
    let mut sizes = Vec::new();
    let mut graphs: Vec<u32> = Vec::new();
    for mask in 0u32..(1 << edges.len()) {
        let mut reach = [[false; 5]; 5];
        for (i, row) in reach.iter_mut().enumerate() {
            row[i] = true;
        }
        for (k, &(i, j)) in edges.iter().enumerate() {
            if mask >> k & 1 == 1 {
                reach[i][j] = true;
                reach[j][i] = true;
            }
        }
        for k in 0..n {
            for i in 0..n {
                for j in 0..n {
                    if reach[i][k] && reach[k][j] {
                        reach[i][j] = true;
                    }
                }
            }
        }
        for row in &reach {
            let smallest = (0..n).find(|&j| row[j]).expect("itself");
            expected.push(smallest as f64);
        }
        sizes.push(n);
        graphs.push(mask);
    }
    let batch = verdicts(&sizes, |g, i, j| {
        let mask = graphs[g];
        edges.iter().enumerate().any(|(k, &(a, b))| {
            // The pair's verdict in one direction only: (a, b) for even k, (b, a) for odd k.
            let directed = if k % 2 == 0 { (a, b) } else { (b, a) };
            mask >> k & 1 == 1 && directed == (i, j)
        })
    });
    assert_eq!(classes(&batch), expected);
}

/// darling_pairs.rlx's batch from darling.rlx's: the same inputs, `same` from `cluster` by `joined`.
fn pairs_batch(
    darling: &Graph,
    pairs: &Graph,
    batch: &Batch,
    joined: impl Fn(&[f64], usize, usize) -> bool,
) -> Batch {
    let cluster_index = darling
        .inputs
        .iter()
        .position(|i| i.name == "cluster")
        .expect("cluster");
    let cluster = &batch.inputs[cluster_index];
    let geometry = Geometry::new(batch.layout.clone(), Vec::new());
    let inputs = pairs
        .inputs
        .iter()
        .map(|input| match input.name.as_str() {
            "same" => geometry
                .pairs
                .iter()
                .map(|&(i, j)| f64::from(u8::from(joined(cluster, i, j))))
                .collect(),
            name => {
                let k = darling
                    .inputs
                    .iter()
                    .position(|i| i.name == name)
                    .unwrap_or_else(|| panic!("darling.rlx has no input `{name}`"));
                batch.inputs[k].clone()
            }
        })
        .collect();
    Batch {
        layout: batch.layout.clone(),
        inputs,
    }
}

fn assert_same_outcome(what: &str, darling: &Outcome, pairs: &Outcome) {
    assert_eq!(darling.reward, pairs.reward, "{what}: reward");
    assert_eq!(darling.advantage, pairs.advantage, "{what}: advantage");
    assert_eq!(darling.loss, pairs.loss, "{what}: loss");
    assert_eq!(darling.gradients, pairs.gradients, "{what}: gradients");
    for (name, value) in &darling.metrics {
        let theirs = pairs
            .metrics
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("{what}: darling_pairs.rlx has no metric `{name}`"));
        assert_eq!(*value, theirs.1, "{what}: metric {name}");
    }
}

#[test]
fn darling_pairs_equals_darling_on_the_closure_of_the_cluster_ids() {
    let darling = graph_of_file("recipes/darling.rlx");
    let pairs = graph_of_file("recipes/darling_pairs.rlx");
    let darling_kernel = Kernel::compile(&darling, &Options::default()).expect("JIT");
    let pairs_kernel = Kernel::compile(&pairs, &Options::default()).expect("JIT");
    let mut compared = 0;
    for seed in 1..=6 {
        let spec = Spec {
            groups: 4,
            responses: 6,
            seed,
            ..Spec::default()
        };
        let batch = synthetic::batch(&darling, &spec);
        let expected = evaluate(&darling, &batch, &Context::default()).expect("darling");
        let expected_jit = darling_kernel
            .run(&batch, &Context::default())
            .expect("darling JIT");
        // Symmetric verdicts, the equivalence itself.
        let closed = pairs_batch(&darling, &pairs, &batch, |c, i, j| c[i] == c[j]);
        // One way only, each response to the next of its cluster: a chain whose closure is the cluster.
        let layout = batch.layout.clone();
        let groups = layout.response_groups();
        let chain = pairs_batch(&darling, &pairs, &batch, |c, i, j| {
            let next = (i + 1..layout.group_offsets[groups[i] + 1]).find(|&k| c[k] == c[i]);
            next == Some(j)
        });
        for (what, pair_batch) in [("closed", closed), ("chain", chain)] {
            let got = evaluate(&pairs, &pair_batch, &Context::default()).expect("pairs");
            assert_same_outcome(
                &format!("seed {seed}, {what}, interpreter"),
                &expected,
                &got,
            );
            let got_jit = pairs_kernel
                .run(&pair_batch, &Context::default())
                .expect("pairs JIT");
            assert_same_outcome(
                &format!("seed {seed}, {what}, JIT"),
                &expected_jit,
                &got_jit,
            );
            compared += 1;
        }
    }
    assert_eq!(compared, 12);
}

const PAIR_SCORE: &str = "input quality : f32[resp]\n\
                          input same : bool[pair]\n\
                          input sim : f32[pair]\n\
                          let class = components(same over others)\n\
                          reward = quality + mean(sim over others) + class\n";

#[test]
fn a_rollout_file_carries_n_minus_one_values_per_line() {
    let recipe = recipe("pairs.rlx", PAIR_SCORE);
    let graph = rlx_compiler::compile_graph(&recipe, &[]).expect("lowers");
    let batch = synthetic::batch(
        &graph,
        &Spec {
            groups: 3,
            responses: 4,
            seed: 5,
            ..Spec::default()
        },
    );
    let text = synthetic::to_jsonl(&graph, &batch);
    let read = read_rollouts(&text, &recipe).expect("reads back");
    assert_eq!(read.batch.layout.group_offsets, batch.layout.group_offsets);
    for (k, (back, given)) in read.batch.inputs.iter().zip(&batch.inputs).enumerate() {
        assert_eq!(back.len(), given.len(), "input {k}");
        for (a, b) in back.iter().zip(given) {
            assert!(
                (a - b).abs() <= 1e-12 * b.abs().max(1.0),
                "input {k}: {a} vs {b}"
            );
        }
    }
    let (outcome, shown) =
        evaluate_showing(&graph, &read.batch, &Context::default()).expect("runs");
    assert!(outcome.reward.is_some());
    assert!(shown.is_empty());
}

#[test]
fn bad_pair_values_are_errors_naming_the_line() {
    let recipe = recipe("pairs.rlx", PAIR_SCORE);
    let line = |quality: f64, same: &str, sim: &str| {
        format!("{{\"group\": \"q\", \"quality\": {quality}, \"same\": {same}, \"sim\": {sim}}}\n")
    };
    let good = format!(
        "{}{}{}",
        line(1.0, "[true, false]", "[0.5, 0.25]"),
        line(0.5, "[1, 0]", "[0.0, 1.0]"),
        line(0.0, "[false, false]", "[0.5, 0.5]")
    );
    let read = read_rollouts(&good, &recipe).expect("a good file");
    assert_eq!(read.batch.inputs[1], vec![1.0, 0.0, 1.0, 0.0, 0.0, 0.0]);
    let cases = [
        (
            line(0.5, "[true, false, true]", "[0.0, 1.0]"),
            "line 2, key `same`: pair input `same` has 3 values, but group \"q\" has 3 responses",
        ),
        (
            line(0.5, "[true, false]", "[0.0, NaN]"),
            "line 2, key `sim`: element 1",
        ),
        (
            line(0.5, "[0.5, false]", "[0.0, 1.0]"),
            "line 2, key `same`: element 0",
        ),
        (line(0.5, "true", "[0.0, 1.0]"), "line 2, key `same`"),
    ];
    for (middle, expected) in cases {
        let text = format!(
            "{}{middle}{}",
            line(1.0, "[true, false]", "[0.5, 0.25]"),
            line(0.0, "[false, false]", "[0.5, 0.5]")
        );
        let error = read_rollouts(&text, &recipe)
            .err()
            .unwrap_or_else(|| panic!("accepted: {middle}"))
            .to_string();
        assert!(error.contains(expected), "{error}\n  expected: {expected}");
    }
    // A line alone in its group lists no pair.
    let alone = format!(
        "{}{{\"group\": \"solo\", \"quality\": 2, \"same\": [], \"sim\": []}}\n",
        good
    );
    assert!(read_rollouts(&alone, &recipe).is_ok());
    let not_empty = format!(
        "{}{{\"group\": \"solo\", \"quality\": 2, \"same\": [true], \"sim\": []}}\n",
        good
    );
    let error = match read_rollouts(&not_empty, &recipe) {
        Ok(_) => panic!("a pair value on a line alone in its group was accepted"),
        Err(error) => error.to_string(),
    };
    assert!(
        error.contains("line 4, key `same`") && error.contains("(n − 1 = 0)"),
        "{error}"
    );
}

#[test]
fn packed_and_square_arrays_give_the_same_batch() {
    let graph = graph("pairs.rlx", PAIR_SCORE);
    // Groups of 3 and 2 responses: 6 + 2 = 8 pairs.
    let quality = [1.0, 0.5, 0.0, 2.0, 1.5];
    let sizes = [3i64, 2];
    let same_packed = [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0];
    let sim_packed = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8];
    // [R, R]: element [i, j] for j another response of i's group; the rest is never read (NaN here).
    let square = |packed: &[f64]| {
        let nan = f64::NAN;
        let p = packed;
        vec![
            nan, p[0], p[1], nan, nan, //
            p[2], nan, p[3], nan, nan, //
            p[4], p[5], nan, nan, nan, //
            nan, nan, nan, nan, p[6], //
            nan, nan, nan, p[7], nan,
        ]
    };
    let (same_square, sim_square) = (square(&same_packed), square(&sim_packed));
    let batch_of = |same: &[f64], sim: &[f64], shape: Vec<usize>| {
        let arrays = Arrays {
            inputs: vec![
                (
                    "quality".into(),
                    Array {
                        elements: Elements::F64(&quality),
                        shape: vec![5],
                    },
                ),
                (
                    "same".into(),
                    Array {
                        elements: Elements::F64(same),
                        shape: shape.clone(),
                    },
                ),
                (
                    "sim".into(),
                    Array {
                        elements: Elements::F64(sim),
                        shape,
                    },
                ),
            ],
            group_sizes: Some(Array {
                elements: Elements::I64(&sizes),
                shape: vec![2],
            }),
            ..Arrays::default()
        };
        from_arrays(&graph, &arrays, Precision::F64).map(|b| b.to_batch())
    };
    let packed = batch_of(&same_packed, &sim_packed, vec![8]).expect("packed");
    let matrix = batch_of(&same_square, &sim_square, vec![5, 5]).expect("square");
    assert_eq!(packed, matrix);
    assert_eq!(packed.inputs[1], same_packed.to_vec());
    let error = batch_of(&same_packed[..7], &sim_packed[..7], vec![7])
        .expect_err("7 values for 8 pairs")
        .to_string();
    assert!(
        error.contains("`same`") && error.contains("8 values"),
        "{error}"
    );
    let error = batch_of(&same_square[..20], &sim_square[..20], vec![4, 5])
        .expect_err("not square")
        .to_string();
    assert!(error.contains("[R, R] with R = 5"), "{error}");
    let mut not_bool = same_packed;
    not_bool[2] = 0.5;
    let error = batch_of(&not_bool, &sim_packed, vec![8])
        .expect_err("0.5 is no verdict")
        .to_string();
    assert!(error.contains("`same`") && error.contains("[2]"), "{error}");
    let mut nan = sim_square.clone();
    nan[1] = f64::NAN;
    let error = batch_of(&same_square, &nan, vec![5, 5])
        .expect_err("NaN score")
        .to_string();
    assert!(
        error.contains("`sim`") && error.contains("[0, 1]"),
        "{error}"
    );
}

/// Under `keep resp`, a pair input seen after the filter holds the kept responses' pairs only: the
/// advantage `mean(sim over others)` of a kept response is the mean of its values with the other kept
/// responses of its group (computed here from the batch), on the interpreter and the JIT.
#[test]
fn a_filter_keeps_the_pairs_of_the_kept_responses() {
    let text = "input q : f32[resp]\ninput sim : f32[pair]\nreward = q\n\
                keep resp when q > 0.4\nadvantage = mean(sim over others)\n";
    let graph = graph("filtered.rlx", text);
    let kernel = Kernel::compile(&graph, &Options::default()).expect("JIT");
    for seed in 1..=5 {
        let batch = synthetic::batch(
            &graph,
            &Spec {
                groups: 4,
                responses: 5,
                seed,
                ..Spec::default()
            },
        );
        let (q, sim) = (&batch.inputs[0], &batch.inputs[1]);
        let geometry = Geometry::new(batch.layout.clone(), Vec::new());
        let kept: Vec<bool> = q.iter().map(|&x| x > 0.4).collect();
        let expected: Vec<f64> = (0..batch.layout.responses())
            .map(|i| {
                let mine: Vec<f64> = geometry
                    .pairs
                    .iter()
                    .zip(sim)
                    .filter(|((a, b), _)| *a == i && kept[*b])
                    .map(|(_, &v)| v)
                    .collect();
                if !kept[i] || mine.is_empty() {
                    0.0
                } else {
                    mine.iter().sum::<f64>() / mine.len() as f64
                }
            })
            .collect();
        let interp = evaluate(&graph, &batch, &Context::default()).expect("interpreter");
        assert_eq!(interp.kept, kept);
        let advantage = interp.advantage.expect("advantages");
        for (a, b) in advantage.iter().zip(&expected) {
            assert!(
                (a - b).abs() < 1e-12,
                "seed {seed}: {advantage:?} vs {expected:?}"
            );
        }
        let rounded = {
            let mut b = batch.clone();
            for v in &mut b.inputs {
                v.iter_mut().for_each(|x| *x = f64::from(*x as f32));
            }
            b
        };
        let jit = kernel.run(&rounded, &Context::default()).expect("JIT");
        let interp = evaluate(&graph, &rounded, &Context::default()).expect("interpreter");
        for (a, b) in jit.advantage.unwrap().iter().zip(interp.advantage.unwrap()) {
            assert!(
                (a - b).abs() < 1e-6,
                "seed {seed}: JIT {a} vs interpreter {b}"
            );
        }
    }
}
