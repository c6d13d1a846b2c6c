//! The fused LM head (trainer/src/head.rs) against the materialised reference: values and gradients
//! w.r.t. hidden and weight, in f32 and f64, for budgets that force many chunks (rows and vocabulary,
//! a vocabulary chunk that does not divide v) and one chunk; a finite-difference check of the
//! gradients in f64; the errors.
//!
//! Tolerances: f32 results agree element by element within 1e-5·(1 + |reference|) (absolute 1e-5 for
//! values near zero, relative 1e-5 above one); f64 within 1e-10·(1 + |reference|).

use candle_core::{DType, Device, Tensor, Var};
use rlx_trainer::head::{
    chunk_plan, fused_logp_entropy, fused_logp_entropy_keeping, naive_logp_entropy, DEFAULT_BUDGET,
    DEFAULT_KEEP,
};
use rlx_trainer::rng::Rng;

const N: usize = 37;
const H: usize = 16;
const V: usize = 1000;

struct Case {
    hidden: Var,
    weight: Var,
    targets: Tensor,
    /// The loss's coefficients: Σ a_i·logp_i + b_i·H_i.
    a: Tensor,
    b: Tensor,
}

fn normal(rng: &mut Rng, len: usize, scale: f64) -> Vec<f64> {
    (0..len).map(|_| rng.normal() * scale).collect()
}

/// Random inputs; `scale` sets the spread of the logits (their std is about 4·scale for H = 16).
fn case(seed: u64, n: usize, h: usize, v: usize, scale: f64, dtype: DType) -> Case {
    let device = Device::Cpu;
    let mut rng = Rng::new(seed);
    let tensor = |values: Vec<f64>, shape: &[usize]| {
        Tensor::from_vec(values, shape, &device)
            .and_then(|t| t.to_dtype(dtype))
            .unwrap()
    };
    let hidden = tensor(normal(&mut rng, n * h, 1.0), &[n, h]);
    let weight = tensor(normal(&mut rng, v * h, scale), &[v, h]);
    let targets: Vec<u32> = (0..n).map(|_| rng.int(0, v - 1) as u32).collect();
    let a = tensor(normal(&mut rng, n, 1.0), &[n, 1]);
    let b = tensor(normal(&mut rng, n, 1.0), &[n, 1]);
    Case {
        hidden: Var::from_tensor(&hidden).unwrap(),
        weight: Var::from_tensor(&weight).unwrap(),
        targets: Tensor::from_vec(targets, n, &device).unwrap(),
        a,
        b,
    }
}

/// Σ a_i·logp_i + b_i·H_i of a [n, 2] result.
fn loss(result: &Tensor, c: &Case) -> Tensor {
    let coeffs = Tensor::cat(&[&c.a, &c.b], 1).unwrap();
    (result * coeffs).unwrap().sum_all().unwrap()
}

/// The result and the loss's gradients w.r.t. hidden and weight: the fused head at (chunk budget,
/// logits kept), or the reference.
fn run(c: &Case, budget: Option<(usize, usize)>) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let result = match budget {
        Some((budget, keep)) => {
            fused_logp_entropy_keeping(&c.hidden, &c.weight, &c.targets, budget, keep)
        }
        None => naive_logp_entropy(&c.hidden, &c.weight, &c.targets),
    }
    .unwrap();
    assert_eq!(result.dims(), &[c.targets.dim(0).unwrap(), 2]);
    let grads = loss(&result, c).backward().unwrap();
    let d_hidden = grads.get(&c.hidden).expect("a gradient for hidden");
    let d_weight = grads.get(&c.weight).expect("a gradient for weight");
    assert_eq!(d_hidden.dims(), c.hidden.dims());
    assert_eq!(d_weight.dims(), c.weight.dims());
    (flat(&result), flat(d_hidden), flat(d_weight))
}

/// A tensor's entries as f64.
fn flat(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1::<f64>())
        .unwrap()
}

fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let mut worst = (0.0f64, 0usize);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs() / (1.0 + w.abs());
        assert!(err.is_finite(), "{what}[{i}]: {g} vs {w}");
        if err > worst.0 {
            worst = (err, i);
        }
    }
    let i = worst.1;
    assert!(
        worst.0 <= tol,
        "{what}[{i}]: fused {} vs reference {} (error {:.3e} > {tol:e})",
        got[i],
        want[i],
        worst.0
    );
}

/// The fused head equals the reference for each budget (values, ∂hidden, ∂weight).
fn check_against_naive(c: &Case, budgets: &[usize], tol: f64) {
    let (result, d_hidden, d_weight) = run(c, None);
    // Sanity of the reference itself: log-probs ≤ 0, entropies in [0, ln v].
    let v = c.weight.dim(0).unwrap() as f64;
    for row in result.chunks(2) {
        assert!(
            row[0] <= 1e-6 && row[1] >= -1e-6 && row[1] <= v.ln() + 1e-6,
            "{row:?}"
        );
    }
    // Each budget with the forward's logits kept for the backward (these cases are below the default)
    // and recomputed.
    for &budget in budgets {
        for keep in [DEFAULT_KEEP, 0] {
            let (r, dh, dw) = run(c, Some((budget, keep)));
            let at = format!("budget {budget}, keep {keep}");
            assert_close(&format!("{at}: result"), &r, &result, tol);
            assert_close(&format!("{at}: ∂hidden"), &dh, &d_hidden, tol);
            assert_close(&format!("{at}: ∂weight"), &dw, &d_weight, tol);
        }
    }
}

/// The budgets of the comparisons: rows and vocabulary chunked (5000: 19-row chunks, 263-entry vocabulary
/// chunks, the last of 211), the vocabulary only (11100: 300-entry chunks, the last of 100), tiny chunks
/// (64: one row, 64 entries, the last of 40), and one chunk (n·v and the default).
const BUDGETS: [usize; 5] = [5000, 11100, 64, N * V, DEFAULT_BUDGET];

#[test]
fn the_budgets_chunk_as_described() {
    assert_eq!(chunk_plan(N, V, 5000), (19, 263));
    assert_eq!(chunk_plan(N, V, 11100), (N, 300));
    assert_eq!(chunk_plan(N, V, 64), (1, 64));
    assert_eq!(chunk_plan(N, V, N * V), (N, V));
    assert_eq!(chunk_plan(N, V, DEFAULT_BUDGET), (N, V));
    assert_eq!(chunk_plan(2048, 151936, DEFAULT_BUDGET), (2048, 2048));
    assert_eq!(chunk_plan(1, 1, 0), (1, 1));
    for (n, v, budget) in [
        (37, 1000, 5000),
        (5, 3, 2),
        (100000, 50000, 1 << 22),
        (0, 7, 9),
    ] {
        let (rows, cols) = chunk_plan(n, v, budget);
        assert!(rows >= 1 && cols >= 1 && cols <= v && rows * cols <= budget.max(1));
    }
}

#[test]
fn fused_equals_naive_f32() {
    check_against_naive(&case(1, N, H, V, 0.5, DType::F32), &BUDGETS, 1e-5);
}

#[test]
fn fused_equals_naive_f64() {
    check_against_naive(&case(2, N, H, V, 0.5, DType::F64), &BUDGETS, 1e-10);
}

/// Logits spread over hundreds (the running max changes between chunks, most probabilities underflow)
/// and nearly flat ones (entropy close to ln v). In f32 logits of a few hundred carry absolute errors
/// of ~1e-5 (|z|·ε), and so relative errors of p and of the gradients of that order, in either
/// computation: the peaked f32 case is held to 1e-3, the f64 one to 1e-10.
#[test]
fn fused_equals_naive_for_peaked_and_flat_softmaxes() {
    check_against_naive(&case(3, N, H, V, 40.0, DType::F32), &BUDGETS, 1e-3);
    check_against_naive(&case(4, N, H, V, 40.0, DType::F64), &BUDGETS, 1e-10);
    check_against_naive(&case(5, N, H, V, 1e-3, DType::F32), &BUDGETS, 1e-5);
}

/// The loss as a plain f64 function of hidden and weight, for the finite differences.
fn loss_value(c: &Case, hidden: &Tensor, weight: &Tensor) -> f64 {
    let result = fused_logp_entropy(hidden, weight, &c.targets, 4).unwrap();
    loss(&result, c).to_scalar::<f64>().unwrap()
}

/// Central differences (step 1e-5, f64) of the loss against the fused head's gradients, on a case small
/// enough to perturb every entry: once with the entropy alone in the loss (a = 0), once with both columns.
#[test]
fn fused_gradients_match_finite_differences() {
    let (n, h, v) = (3, 4, 7);
    for entropy_only in [true, false] {
        let mut c = case(6, n, h, v, 1.0, DType::F64);
        if entropy_only {
            c.a = c.a.zeros_like().unwrap();
        }
        assert_eq!(chunk_plan(n, v, 4), (1, 4));
        let (_, d_hidden, d_weight) = run(&c, Some((4, DEFAULT_KEEP)));
        for (which, analytic) in [("hidden", &d_hidden), ("weight", &d_weight)] {
            let base = if which == "hidden" {
                c.hidden.as_tensor()
            } else {
                c.weight.as_tensor()
            };
            let values = base.flatten_all().unwrap().to_vec1::<f64>().unwrap();
            let eps = 1e-5;
            let numeric: Vec<f64> = (0..values.len())
                .map(|i| {
                    let at = |delta: f64| {
                        let mut moved = values.clone();
                        moved[i] += delta;
                        let moved = Tensor::from_vec(moved, base.dims(), &Device::Cpu).unwrap();
                        if which == "hidden" {
                            loss_value(&c, &moved, c.weight.as_tensor())
                        } else {
                            loss_value(&c, c.hidden.as_tensor(), &moved)
                        }
                    };
                    (at(eps) - at(-eps)) / (2.0 * eps)
                })
                .collect();
            assert!(numeric.iter().any(|g| g.abs() > 1e-3), "{numeric:?}");
            assert_close(
                &format!("∂{which} (entropy only: {entropy_only})"),
                analytic,
                &numeric,
                1e-7,
            );
        }
    }
}

/// Gradients reach hidden through a tracked tensor (as in the model: the final norm's output), and only
/// the tracked input gets one when the other is a constant.
#[test]
fn tracked_inputs_and_constants() {
    let c = case(7, N, H, V, 0.5, DType::F32);
    let (_, d_hidden, d_weight) = run(&c, None);
    let double = (c.hidden.as_tensor() * 2.0).unwrap();
    let result = fused_logp_entropy(&double, &c.weight, &c.targets, 5000).unwrap();
    let grads = loss(&result, &c).backward().unwrap();
    // Compared with the reference on the same doubled input.
    let reference = naive_logp_entropy(&double, &c.weight, &c.targets).unwrap();
    let ref_grads = loss(&reference, &c).backward().unwrap();
    assert_close(
        "∂hidden via a tracked tensor",
        &flat(grads.get(&c.hidden).unwrap()),
        &flat(ref_grads.get(&c.hidden).unwrap()),
        1e-5,
    );

    // hidden a constant: only weight gets a gradient, and it is the one of the Var case.
    let constant = c.hidden.as_tensor().detach();
    let result = fused_logp_entropy(&constant, &c.weight, &c.targets, 5000).unwrap();
    let grads = loss(&result, &c).backward().unwrap();
    assert!(grads.get(&constant).is_none());
    assert_close(
        "∂weight with a constant hidden",
        &flat(grads.get(&c.weight).unwrap()),
        &d_weight,
        1e-5,
    );
    // weight a constant: only hidden.
    let constant = c.weight.as_tensor().detach();
    let result = fused_logp_entropy(&c.hidden, &constant, &c.targets, 5000).unwrap();
    let grads = loss(&result, &c).backward().unwrap();
    assert!(grads.get(&constant).is_none());
    assert_close(
        "∂hidden with a constant weight",
        &flat(grads.get(&c.hidden).unwrap()),
        &d_hidden,
        1e-5,
    );
    // Neither tracked: no graph at all.
    let result = fused_logp_entropy(
        &c.hidden.as_tensor().detach(),
        &c.weight.as_tensor().detach(),
        &c.targets,
        5000,
    )
    .unwrap();
    assert!(!result.track_op());
}

/// The kept logits serve one backward pass; a second backward over the same graph recomputes them and
/// gets the same gradients.
#[test]
fn a_second_backward_recomputes_the_kept_logits() {
    let c = case(9, N, H, V, 0.5, DType::F32);
    let result = fused_logp_entropy(&c.hidden, &c.weight, &c.targets, 5000).unwrap();
    let l = loss(&result, &c);
    let first = l.backward().unwrap();
    let second = l.backward().unwrap();
    for var in [&c.hidden, &c.weight] {
        assert_eq!(
            flat(first.get(var).unwrap()),
            flat(second.get(var).unwrap()),
            "the second backward's gradient differs from the first's"
        );
    }
}

#[test]
fn errors_name_the_problem() {
    let c = case(8, 4, 3, 10, 1.0, DType::F32);
    let (hidden, weight, targets) = (c.hidden.as_tensor(), c.weight.as_tensor(), &c.targets);
    let device = Device::Cpu;
    let err = |r: candle_core::Result<Tensor>| match r {
        Ok(t) => panic!("expected an error, got a {:?} tensor", t.dims()),
        Err(e) => e.to_string(),
    };
    let cases: Vec<(String, &str)> = vec![
        (
            err(fused_logp_entropy(&hidden.flatten_all().unwrap(), weight, targets, 100)),
            "fused_logp_entropy: hidden must be [rows, hidden size], got shape [12]",
        ),
        (
            err(fused_logp_entropy(hidden, &weight.unsqueeze(0).unwrap(), targets, 100)),
            "fused_logp_entropy: weight must be [vocab, hidden size], got shape [1, 10, 3]",
        ),
        (
            err(fused_logp_entropy(hidden, &weight.t().unwrap(), targets, 100)),
            "fused_logp_entropy: weight is [3, 10] but hidden is [4, 3]: the hidden sizes differ",
        ),
        (
            err(fused_logp_entropy(hidden, weight, &targets.narrow(0, 0, 3).unwrap(), 100)),
            "fused_logp_entropy: 3 targets for 4 rows of hidden",
        ),
        (
            err(fused_logp_entropy(hidden, weight, &targets.unsqueeze(1).unwrap(), 100)),
            "fused_logp_entropy: targets must be [rows], got shape [4, 1]",
        ),
        (
            err(fused_logp_entropy(
                hidden,
                weight,
                &targets.to_dtype(DType::I64).unwrap(),
                100,
            )),
            "fused_logp_entropy: targets must be u32, got I64",
        ),
        (
            err(fused_logp_entropy(
                hidden,
                weight,
                &Tensor::new(&[1u32, 9, 10, 0], &device).unwrap(),
                100,
            )),
            "fused_logp_entropy: target 10 of row 2 is outside the vocabulary of 10 (weight's rows)",
        ),
        (
            err(fused_logp_entropy(
                &hidden.to_dtype(DType::F64).unwrap(),
                weight,
                targets,
                100,
            )),
            "fused_logp_entropy: weight is F32 but hidden is F64",
        ),
        (
            err(fused_logp_entropy(
                &hidden.to_dtype(DType::BF16).unwrap(),
                &weight.to_dtype(DType::BF16).unwrap(),
                targets,
                100,
            )),
            "fused_logp_entropy: hidden must be f32 or f64, got BF16",
        ),
        (
            err(fused_logp_entropy(hidden, &weight.narrow(0, 0, 0).unwrap(), targets, 100)),
            "fused_logp_entropy: weight has no rows (an empty vocabulary)",
        ),
        (
            err(fused_logp_entropy(
                &Tensor::zeros((4, 0), DType::F32, &device).unwrap(),
                &Tensor::zeros(((1 << 24) + 1, 0), DType::F32, &device).unwrap(),
                targets,
                100,
            )),
            "fused_logp_entropy: a vocabulary of 16777217 is more than 2^24",
        ),
        (
            err(fused_logp_entropy(hidden, weight, targets, 0)),
            "fused_logp_entropy: the chunk budget must be at least 1 element, got 0",
        ),
        (
            err(naive_logp_entropy(
                hidden,
                weight,
                &Tensor::new(&[1u32, 2, 3, 99], &device).unwrap(),
            )),
            "naive_logp_entropy: target 99 of row 3 is outside the vocabulary of 10 (weight's rows)",
        ),
    ];
    for (got, want) in cases {
        assert!(got.starts_with(want), "error {got:?}, expected {want:?}");
    }
}

/// No rows: an empty [0, 2] result whose backward gives zero gradients.
#[test]
fn no_rows() {
    let c = case(9, 0, 3, 10, 1.0, DType::F32);
    let result = fused_logp_entropy(&c.hidden, &c.weight, &c.targets, 100).unwrap();
    assert_eq!(result.dims(), &[0, 2]);
    let grads = loss(&result, &c).backward().unwrap();
    let d_weight = grads.get(&c.weight).unwrap();
    assert_eq!(d_weight.dims(), &[10, 3]);
    assert_eq!(
        d_weight
            .abs()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap(),
        0.0
    );
}
