//! `attention::causal_attention` (the fused causal attention op with its own backward) against the plain
//! candle reference `naive_causal_attention` — values within 1e-5 and gradients of q, k and v within 1e-4
//! (relative to the largest entry) — for grouped-query and plain heads, left padding of different lengths
//! per row, a KV cache (offset > 0), non-contiguous inputs and the backward pass's row blocks; the
//! reference itself against a direct f64 computation; padding rows (zeros, zero gradients); finite
//! differences; and the errors for bad shapes and dtypes.

use candle_core::{DType, Device, Tensor, Var};
use rlx_trainer::attention::{causal_attention, naive_causal_attention, SMALL_T};
use rlx_trainer::rng::Rng;

/// A tensor of normal(0, scale²) entries.
fn randn(rng: &mut Rng, dims: &[usize], scale: f64) -> Tensor {
    let n = dims.iter().product();
    let data: Vec<f32> = (0..n).map(|_| (rng.normal() * scale) as f32).collect();
    Tensor::from_vec(data, dims, &Device::Cpu).unwrap()
}

fn flat(x: &Tensor) -> Vec<f32> {
    x.flatten_all().unwrap().to_vec1().unwrap()
}

/// max |got − want| ≤ tol · max |want| (want not all zero).
fn assert_close(what: &str, got: &Tensor, want: &Tensor, tol: f64) {
    assert_eq!(got.dims(), want.dims(), "{what}: shapes");
    let (got, want) = (flat(got), flat(want));
    let scale = want.iter().fold(0f64, |m, &x| m.max((x as f64).abs()));
    assert!(scale > 0.0, "{what}: the reference is all zeros");
    let (worst, at) = got
        .iter()
        .zip(&want)
        .enumerate()
        .map(|(i, (&a, &b))| ((a as f64 - b as f64).abs(), i))
        .fold((0f64, 0), |m, x| if x.0 > m.0 { x } else { m });
    assert!(
        worst <= tol * scale,
        "{what}: |got − want| = {worst:e} at {at} (got {}, want {}) > {tol:e} × {scale:e}",
        got[at],
        want[at]
    );
}

/// One attention problem: q [b, heads, t, d], k and v [b, kv, offset + t, d], and loss weights w.
struct Case {
    b: usize,
    heads: usize,
    kv: usize,
    t: usize,
    offset: usize,
    d: usize,
    left_pad: Vec<usize>,
    /// The standard deviation of q and k (larger: peakier softmaxes).
    spread: f64,
    seed: u64,
}

impl Case {
    fn inputs(&self) -> (Tensor, Tensor, Tensor, Tensor) {
        let mut rng = Rng::new(self.seed);
        let s = self.offset + self.t;
        let q = randn(&mut rng, &[self.b, self.heads, self.t, self.d], self.spread);
        let k = randn(&mut rng, &[self.b, self.kv, s, self.d], self.spread);
        let v = randn(&mut rng, &[self.b, self.kv, s, self.d], 1.0);
        let w = randn(&mut rng, &[self.b, self.heads, self.t, self.d], 1.0);
        (q, k, v, w)
    }

    /// Values and the gradients of Σ w·out of the op and of the reference, compared.
    fn check(&self) {
        let (q, k, v, w) = self.inputs();
        let mut grads = Vec::new();
        let mut outs = Vec::new();
        for fused in [true, false] {
            let (qv, kv, vv) = (
                Var::from_tensor(&q).unwrap(),
                Var::from_tensor(&k).unwrap(),
                Var::from_tensor(&v).unwrap(),
            );
            let f = if fused {
                causal_attention
            } else {
                naive_causal_attention
            };
            let out = f(&qv, &kv, &vv, &self.left_pad, self.offset).unwrap();
            let g = (&out * &w).unwrap().sum_all().unwrap().backward().unwrap();
            grads.push([qv, kv, vv].map(|x| g.get(&x).expect("a gradient").clone()));
            outs.push(out);
        }
        assert!(outs[0].is_contiguous() && outs[0].dtype() == DType::F32);
        assert_close("out", &outs[0], &outs[1], 1e-5);
        for (name, (got, want)) in ["dq", "dk", "dv"]
            .iter()
            .zip(grads[0].iter().zip(&grads[1]))
        {
            assert_close(name, got, want, 1e-4);
        }
    }
}

#[test]
fn the_reference_matches_a_direct_computation() {
    let case = Case {
        b: 2,
        heads: 4,
        kv: 2,
        t: 5,
        offset: 2,
        d: 3,
        left_pad: vec![0, 4],
        spread: 1.0,
        seed: 1,
    };
    let (q, k, v, _) = case.inputs();
    let got = flat(&naive_causal_attention(&q, &k, &v, &case.left_pad, case.offset).unwrap());
    let (qf, kf, vf) = (flat(&q), flat(&k), flat(&v));
    let (t, s, d) = (case.t, case.offset + case.t, case.d);
    for r in 0..case.b {
        for h in 0..case.heads {
            let kvh = h / (case.heads / case.kv);
            for i in 0..t {
                let qi = &qf[((r * case.heads + h) * t + i) * d..][..d];
                let key =
                    |j: usize, x: &[f32]| x[((r * case.kv + kvh) * s + j) * d..][..d].to_vec();
                let seen: Vec<usize> = (case.left_pad[r]..=case.offset + i).collect();
                let scores: Vec<f64> = seen
                    .iter()
                    .map(|&j| {
                        let kj = key(j, &kf);
                        (0..d).map(|c| qi[c] as f64 * kj[c] as f64).sum::<f64>() / (d as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                for c in 0..d {
                    let want: f64 = seen
                        .iter()
                        .zip(&e)
                        .map(|(&j, p)| p / sum * key(j, &vf)[c] as f64)
                        .sum();
                    let at = ((r * case.heads + h) * t + i) * d + c;
                    assert!(
                        (got[at] as f64 - want).abs() < 1e-5,
                        "row {r} head {h} query {i} column {c}: {} vs {want}",
                        got[at]
                    );
                }
            }
        }
    }
}

#[test]
fn grouped_query_heads_with_left_padding_match_the_reference() {
    // 80 rows: three of the backward pass's 36-row blocks; heads 6 over 2 kv heads; peaky softmaxes.
    Case {
        b: 3,
        heads: 6,
        kv: 2,
        t: 80,
        offset: 0,
        d: 16,
        left_pad: vec![0, 7, 33],
        spread: 2.0,
        seed: 2,
    }
    .check();
}

#[test]
fn plain_heads_and_a_head_dim_off_the_tiles_match_the_reference() {
    // heads == kv heads; d = 12 is neither a multiple of 8 nor of 16 (the kernels' tails).
    Case {
        b: 2,
        heads: 3,
        kv: 3,
        t: 13,
        offset: 0,
        d: 12,
        left_pad: vec![4, 0],
        spread: 1.0,
        seed: 3,
    }
    .check();
}

#[test]
fn smollm2_sized_heads_match_the_reference() {
    Case {
        b: 2,
        heads: 9,
        kv: 3,
        t: 40,
        offset: 0,
        d: 64,
        left_pad: vec![0, 11],
        spread: 1.0,
        seed: 4,
    }
    .check();
}

#[test]
fn a_kv_cache_matches_the_reference() {
    // t = 1 and 3 take the forward's dot-product path (below SMALL_T rows), t = 9 and 48 the transposed
    // one. 48 rows are two of the backward's 36-row blocks, the second of two 6-row tiles; with
    // offset − left_pad = 7 (row 0), a tile's last row is the first to see a 6-key tile, so that the ∂k, ∂v
    // pass reads the scratch past that row's tile's keys, which must be zeros, not the previous head's
    // second block.
    const { assert!(3 < SMALL_T && 9 >= SMALL_T) };
    for (t, offset, seed) in [(1, 20, 5), (3, 17, 6), (9, 12, 7), (48, 7, 8)] {
        for d in [12, 64] {
            Case {
                b: 3,
                heads: 4,
                kv: 2,
                t,
                offset,
                d,
                left_pad: vec![0, 6, 19],
                spread: 1.5,
                seed,
            }
            .check();
        }
    }
}

/// Keys and values that are the first positions of a longer buffer (a KV cache with room to grow) are
/// read in place, and give bit for bit the result of their contiguous copies.
#[test]
fn keys_read_from_a_longer_buffer_give_the_contiguous_result() {
    let (b, heads, kv, t, s, capacity, d) = (2, 4, 2, 1, 9, 16, 8);
    let mut rng = Rng::new(21);
    let q = randn(&mut rng, &[b, heads, t, d], 1.0);
    let kb = randn(&mut rng, &[b, kv, capacity, d], 1.0);
    let vb = randn(&mut rng, &[b, kv, capacity, d], 1.0);
    let (k, v) = (kb.narrow(2, 0, s).unwrap(), vb.narrow(2, 0, s).unwrap());
    assert!(!k.is_contiguous());
    let left_pad = [0, 3];
    let in_place = causal_attention(&q, &k, &v, &left_pad, s - t).unwrap();
    let copied = causal_attention(
        &q,
        &k.contiguous().unwrap(),
        &v.contiguous().unwrap(),
        &left_pad,
        s - t,
    )
    .unwrap();
    assert_eq!(flat(&in_place), flat(&copied));
    // The plain candle version (what a GPU runs) takes the same views.
    let plain = naive_causal_attention(&q, &k, &v, &left_pad, s - t).unwrap();
    assert_close("plain", &plain, &copied, 1e-5);
    // Other strided layouts (positions not contiguous per head) are still copied, and agree too.
    let kt = randn(&mut rng, &[b, s, kv, d], 1.0)
        .transpose(1, 2)
        .unwrap();
    let a = causal_attention(&q, &kt, &v, &left_pad, s - t).unwrap();
    let c = causal_attention(&q, &kt.contiguous().unwrap(), &v, &left_pad, s - t).unwrap();
    assert_eq!(flat(&a), flat(&c));
}

#[test]
fn non_contiguous_inputs_match_the_reference() {
    let (b, heads, kv, t, d) = (2, 4, 2, 11, 8);
    let left_pad = [3, 0];
    let mut rng = Rng::new(8);
    // q and k as transposed views of [b, t, heads, d] / [b, s, kv, d]; v as a narrow of a wider tensor.
    let q0 = Var::from_tensor(&randn(&mut rng, &[b, t, heads, d], 1.0)).unwrap();
    let k0 = Var::from_tensor(&randn(&mut rng, &[b, t, kv, d], 1.0)).unwrap();
    let v0 = Var::from_tensor(&randn(&mut rng, &[b, kv, t, d + 5], 1.0)).unwrap();
    let w = randn(&mut rng, &[b, heads, t, d], 1.0);
    let q = q0.transpose(1, 2).unwrap();
    let k = k0.transpose(1, 2).unwrap();
    let v = v0.narrow(3, 2, d).unwrap();
    assert!(!q.is_contiguous() && !k.is_contiguous() && !v.is_contiguous());
    let mut results = Vec::new();
    for f in [causal_attention, naive_causal_attention] {
        let out = f(&q, &k, &v, &left_pad, 0).unwrap();
        let g = (&out * &w).unwrap().sum_all().unwrap().backward().unwrap();
        let grads = [&q0, &k0, &v0].map(|x| g.get(x).unwrap().clone());
        results.push((out, grads));
    }
    assert_close("out", &results[0].0, &results[1].0, 1e-5);
    for (i, name) in ["dq", "dk", "dv"].iter().enumerate() {
        assert_close(name, &results[0].1[i], &results[1].1[i], 1e-4);
    }
}

#[test]
fn padding_rows_output_zeros_and_get_zero_gradients() {
    // Row 1 is padded for its first 5 positions, row 2 entirely; the loss weights of the padding queries
    // change nothing.
    let (b, heads, kv, t, d) = (3, 4, 2, 12, 8);
    let left_pad = [0, 5, 12];
    let mut rng = Rng::new(9);
    let q = Var::from_tensor(&randn(&mut rng, &[b, heads, t, d], 1.0)).unwrap();
    let k = Var::from_tensor(&randn(&mut rng, &[b, kv, t, d], 1.0)).unwrap();
    let v = Var::from_tensor(&randn(&mut rng, &[b, kv, t, d], 1.0)).unwrap();
    let w = randn(&mut rng, &[b, heads, t, d], 1.0);
    let out = causal_attention(&q, &k, &v, &left_pad, 0).unwrap();
    let grads_with = |w: &Tensor| {
        let g = (&out * w).unwrap().sum_all().unwrap().backward().unwrap();
        [&q, &k, &v].map(|x| flat(g.get(x).unwrap()))
    };
    let grads = grads_with(&w);
    let (outs, dq, dk, dv) = (flat(&out), &grads[0], &grads[1], &grads[2]);
    for (r, &pad) in left_pad.iter().enumerate() {
        for h in 0..heads {
            for i in 0..t {
                let at = ((r * heads + h) * t + i) * d;
                let zero = |x: &[f32]| x.iter().all(|&x| x == 0.0);
                let (o, g) = (&outs[at..at + d], &dq[at..at + d]);
                assert_eq!(
                    zero(o),
                    i < pad,
                    "row {r} query {i}: zero output iff padding"
                );
                // (A query that sees a single key has a ∂q of zero up to rounding: its softmax is constant.)
                if i != pad {
                    assert_eq!(zero(g), i < pad, "row {r} query {i}: zero ∂q iff padding");
                }
            }
        }
        for h in 0..kv {
            for j in 0..t {
                let at = ((r * kv + h) * t + j) * d;
                let hidden = dk[at..at + d]
                    .iter()
                    .chain(&dv[at..at + d])
                    .all(|&x| x == 0.0);
                assert_eq!(
                    hidden,
                    j < pad,
                    "row {r} key {j}: zero gradients iff no query sees it"
                );
            }
        }
    }
    // Other weights on the padding queries: the very same gradients.
    let mut w2 = flat(&w);
    for (r, &pad) in left_pad.iter().enumerate() {
        for h in 0..heads {
            for x in &mut w2[(r * heads + h) * t * d..][..pad * d] {
                *x = 7.0 - *x;
            }
        }
    }
    let w2 = Tensor::from_vec(w2, w.dims(), &Device::Cpu).unwrap();
    assert_eq!(grads_with(&w2), grads);
}

#[test]
fn finite_differences_agree_with_the_gradients() {
    let (b, heads, kv, t, offset, d) = (1, 2, 1, 6, 1, 8);
    let left_pad = [2];
    let mut rng = Rng::new(10);
    let s = offset + t;
    let inputs = [
        randn(&mut rng, &[b, heads, t, d], 1.0),
        randn(&mut rng, &[b, kv, s, d], 1.0),
        randn(&mut rng, &[b, kv, s, d], 1.0),
    ];
    let w = flat(&randn(&mut rng, &[b, heads, t, d], 1.0));
    let loss = |x: &[Tensor; 3]| -> f64 {
        let out = flat(&causal_attention(&x[0], &x[1], &x[2], &left_pad, offset).unwrap());
        out.iter().zip(&w).map(|(&o, &w)| o as f64 * w as f64).sum()
    };
    let vars = inputs.clone().map(|x| Var::from_tensor(&x).unwrap());
    let out = causal_attention(&vars[0], &vars[1], &vars[2], &left_pad, offset).unwrap();
    let wt = Tensor::from_vec(w.clone(), out.dims(), &Device::Cpu).unwrap();
    let g = (&out * &wt).unwrap().sum_all().unwrap().backward().unwrap();
    // (input, flat coordinate): a query of the second head, a key and a value both rows see.
    for (which, at) in [
        (0, (t + 3) * d + 2),
        (1, 4 * d + 5),
        (2, 5 * d + 1),
        (1, 6 * d),
    ] {
        let analytic = flat(g.get(&vars[which]).unwrap())[at] as f64;
        let eps = 1e-2;
        let shifted = |delta: f64| {
            let mut x = inputs.clone();
            let mut data = flat(&x[which]);
            data[at] += delta as f32;
            x[which] = Tensor::from_vec(data, x[which].dims(), &Device::Cpu).unwrap();
            loss(&x)
        };
        let numeric = (shifted(eps) - shifted(-eps)) / (2.0 * eps);
        assert!(
            (numeric - analytic).abs() <= 2e-3 + 1e-2 * analytic.abs(),
            "input {which} coordinate {at}: finite difference {numeric} vs gradient {analytic}"
        );
        assert!(
            analytic.abs() > 1e-3,
            "input {which} coordinate {at}: a trivial check"
        );
    }
}

#[test]
fn bad_shapes_and_dtypes_are_errors() {
    let dev = Device::Cpu;
    let zeros = |dims: &[usize]| Tensor::zeros(dims, DType::F32, &dev).unwrap();
    let (q, k) = (zeros(&[2, 4, 3, 8]), zeros(&[2, 2, 5, 8]));
    assert!(causal_attention(&q, &k, &k, &[0, 1], 2).is_ok());
    // (q, k, v, left_pad, offset, a part of the error message)
    type Bad = (Tensor, Tensor, Tensor, Vec<usize>, usize, &'static str);
    let cases: Vec<Bad> = vec![
        (
            q.clone(),
            zeros(&[2, 2, 5, 6]),
            zeros(&[2, 2, 5, 6]),
            vec![0, 0],
            2,
            "head dim of 8",
        ),
        (
            zeros(&[2, 3, 3, 8]),
            k.clone(),
            k.clone(),
            vec![0, 0],
            2,
            "not a positive multiple",
        ),
        (q.clone(), k.clone(), k.clone(), vec![0, 0], 1, "offset + t"),
        (
            q.clone(),
            k.clone(),
            k.clone(),
            vec![0],
            2,
            "1 left_pad entries for a batch of 2",
        ),
        (
            q.clone(),
            k.clone(),
            k.clone(),
            vec![0, 6],
            2,
            "left_pad[1] = 6",
        ),
        (
            q.clone(),
            zeros(&[3, 2, 5, 8]),
            zeros(&[3, 2, 5, 8]),
            vec![0, 0],
            2,
            "batch of 2",
        ),
        (
            q.clone(),
            k.clone(),
            zeros(&[2, 2, 4, 8]),
            vec![0, 0],
            2,
            "v has shape",
        ),
        (
            zeros(&[2, 4, 24]),
            k.clone(),
            k.clone(),
            vec![0, 0],
            2,
            "q must be",
        ),
        (
            q.to_dtype(DType::F64).unwrap(),
            k.clone(),
            k.clone(),
            vec![0, 0],
            2,
            "q must be f32",
        ),
        (
            q.clone(),
            k.clone(),
            k.to_dtype(DType::F64).unwrap(),
            vec![0, 0],
            2,
            "v must be f32",
        ),
    ];
    for (q, k, v, left_pad, offset, message) in cases {
        let err = causal_attention(&q, &k, &v, &left_pad, offset)
            .map(|_| ())
            .expect_err(message)
            .to_string();
        assert!(err.contains(message), "{err:?} should say {message:?}");
        assert!(err.starts_with("causal_attention: "), "{err}");
    }
}

/// The op's output and gradients, flattened, for `case`.
fn fused_values(case: &Case) -> Vec<f32> {
    let (q, k, v, w) = case.inputs();
    let vars = [q, k, v].map(|x| Var::from_tensor(&x).unwrap());
    let out = causal_attention(&vars[0], &vars[1], &vars[2], &case.left_pad, case.offset).unwrap();
    let g = (&out * &w).unwrap().sum_all().unwrap().backward().unwrap();
    let mut values = flat(&out);
    for x in &vars {
        values.extend(flat(g.get(x).unwrap()));
    }
    values
}

#[test]
fn concurrent_calls_of_different_shapes_give_the_results_of_a_lone_call() {
    // Calls from several threads share rayon's pool (as concurrent tests and the trainer's phases do), so
    // tasks of different problems interleave on its workers; each must still compute exactly what it
    // computes alone (per-task scratch buffers are not shared or left stale between problems).
    let cases = [
        Case {
            b: 6,
            heads: 4,
            kv: 2,
            t: 9,
            offset: 0,
            d: 4,
            left_pad: vec![1, 1, 1, 0, 0, 0],
            spread: 1.0,
            seed: 1,
        },
        Case {
            b: 3,
            heads: 6,
            kv: 2,
            t: 70,
            offset: 0,
            d: 16,
            left_pad: vec![0, 5, 40],
            spread: 1.0,
            seed: 2,
        },
        Case {
            b: 2,
            heads: 9,
            kv: 3,
            t: 1,
            offset: 40,
            d: 64,
            left_pad: vec![3, 0],
            spread: 1.0,
            seed: 3,
        },
        Case {
            b: 4,
            heads: 4,
            kv: 4,
            t: 45,
            offset: 0,
            d: 8,
            left_pad: vec![0, 0, 10, 44],
            spread: 3.0,
            seed: 4,
        },
    ];
    let alone: Vec<Vec<f32>> = cases.iter().map(fused_values).collect();
    let mismatches = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for start in 0..cases.len() {
            let (cases, alone, mismatches) = (&cases, &alone, &mismatches);
            scope.spawn(move || {
                for round in 0..40 {
                    let i = (start + round) % cases.len();
                    if fused_values(&cases[i]) != alone[i] {
                        mismatches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(
        mismatches.into_inner(),
        0,
        "concurrent results differ from lone ones"
    );
}
