//! The fused layers (`fused.rs`) against the plain candle versions they replace: values and the
//! gradients of every input, on random inputs with awkward sizes (rows that do not fill a parallel task,
//! non-contiguous inputs), plus a finite-difference check of each op in f64 arithmetic and the errors.

use candle_core::{DType, Device, Tensor, Var};
use rlx_trainer::fused::{
    from_heads, linear, linear_swiglu, linears, plain_rms_norm, plain_rope, plain_swiglu, rms_norm,
    rope, swiglu, to_heads, RopeTables,
};
use rlx_trainer::rng::Rng;

fn random(rng: &mut Rng, shape: &[usize], scale: f64) -> Tensor {
    let n: usize = shape.iter().product();
    let values: Vec<f32> = (0..n).map(|_| (rng.normal() * scale) as f32).collect();
    Tensor::from_vec(values, shape, &Device::Cpu).unwrap()
}

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// max |a − b| / (1 + |b|) over the elements.
fn max_rel(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    values(a)
        .iter()
        .zip(values(b))
        .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
        .fold(0.0, f32::max)
}

// The references: the plain candle versions of fused.rs (what the layers run on a CUDA device).
fn reference_rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Tensor {
    plain_rms_norm(x, w, eps).unwrap()
}

fn reference_swiglu(a: &Tensor, b: &Tensor) -> Tensor {
    plain_swiglu(a, b).unwrap()
}

fn reference_rope(x: &Tensor, tables: &RopeTables) -> Tensor {
    plain_rope(x, tables).unwrap()
}

/// The gradients of Σ out ⊙ weights w.r.t. `inputs`, for `f` of `inputs`.
fn gradients(inputs: &[Tensor], weights: &Tensor, f: impl Fn(&[Tensor]) -> Tensor) -> Vec<Tensor> {
    let vars: Vec<Var> = inputs
        .iter()
        .map(|t| Var::from_tensor(t).unwrap())
        .collect();
    let tensors: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
    let out = f(&tensors);
    let loss = (out * weights).unwrap().sum_all().unwrap();
    let store = loss.backward().unwrap();
    vars.iter()
        .map(|v| store.get(v.as_tensor()).expect("a gradient").clone())
        .collect()
}

#[test]
fn rms_norm_matches_the_primitive_version_in_values_and_gradients() {
    let mut rng = Rng::new(1);
    // 37 rows (not a multiple of the rows per parallel task) of 70.
    for shape in [vec![37, 70], vec![3, 5, 64], vec![1, 1]] {
        let h = *shape.last().unwrap();
        let x = random(&mut rng, &shape, 2.0);
        let w = random(&mut rng, &[h], 1.0);
        let eps = 1e-5;
        let fused = rms_norm(&x, &w, eps).unwrap();
        let plain = reference_rms_norm(&x, &w, eps);
        assert!(max_rel(&fused, &plain) < 1e-5, "values {shape:?}");
        let weights = random(&mut rng, &shape, 1.0);
        let g_fused = gradients(&[x.clone(), w.clone()], &weights, |t| {
            rms_norm(&t[0], &t[1], eps).unwrap()
        });
        let g_plain = gradients(&[x.clone(), w.clone()], &weights, |t| {
            reference_rms_norm(&t[0], &t[1], eps)
        });
        for (i, (a, b)) in g_fused.iter().zip(&g_plain).enumerate() {
            let err = max_rel(a, b);
            assert!(err < 1e-4, "gradient {i} of {shape:?}: {err}");
        }
    }
}

#[test]
fn rms_norm_takes_non_contiguous_input() {
    let mut rng = Rng::new(2);
    let x = random(&mut rng, &[8, 6], 1.0).t().unwrap(); // [6, 8], strided
    let w = random(&mut rng, &[8], 1.0);
    let fused = rms_norm(&x, &w, 1e-6).unwrap();
    let plain = reference_rms_norm(&x.contiguous().unwrap(), &w, 1e-6);
    assert!(max_rel(&fused, &plain) < 1e-5);
}

#[test]
fn swiglu_matches_the_primitive_version_in_values_and_gradients() {
    let mut rng = Rng::new(3);
    // Large values too: σ saturates to 0 and 1 without NaN.
    for (shape, scale) in [(vec![40_000], 3.0), (vec![2, 3, 7], 30.0)] {
        let a = random(&mut rng, &shape, scale);
        let b = random(&mut rng, &shape, 1.0);
        let fused = swiglu(&a, &b).unwrap();
        let plain = reference_swiglu(&a, &b);
        assert!(max_rel(&fused, &plain) < 1e-5, "values {shape:?}");
        let weights = random(&mut rng, &shape, 1.0);
        let g_fused = gradients(&[a.clone(), b.clone()], &weights, |t| {
            swiglu(&t[0], &t[1]).unwrap()
        });
        let g_plain = gradients(&[a.clone(), b.clone()], &weights, |t| {
            reference_swiglu(&t[0], &t[1])
        });
        for (i, (x, y)) in g_fused.iter().zip(&g_plain).enumerate() {
            let err = max_rel(x, y);
            assert!(err < 1e-5, "gradient {i} of {shape:?}: {err}");
            assert!(values(x).iter().all(|v| v.is_finite()));
        }
    }
}

#[test]
fn rope_matches_the_primitive_version_in_values_and_gradients() {
    let mut rng = Rng::new(4);
    let inv_freq: Vec<f64> = (0..8)
        .map(|i| 1.0 / 10000f64.powf(i as f64 / 8.0))
        .collect();
    for offset in [0, 5] {
        let tables = RopeTables::new(&inv_freq, offset, 7);
        let x = random(&mut rng, &[2, 3, 7, 16], 1.0);
        let fused = rope(&x, &tables).unwrap();
        let plain = reference_rope(&x, &tables);
        assert!(max_rel(&fused, &plain) < 1e-6, "values at offset {offset}");
        let weights = random(&mut rng, &[2, 3, 7, 16], 1.0);
        let g_fused = gradients(std::slice::from_ref(&x), &weights, |t| {
            rope(&t[0], &tables).unwrap()
        });
        let g_plain = gradients(std::slice::from_ref(&x), &weights, |t| {
            reference_rope(&t[0], &tables)
        });
        assert!(max_rel(&g_fused[0], &g_plain[0]) < 1e-6);
        // A rotation: the norm of each pair is kept.
        let n_in = x
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        let n_out = fused
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!((n_in - n_out).abs() < 1e-3 * n_in);
    }
    // A transposed (non-contiguous) input, as attention's heads are.
    let tables = RopeTables::new(&inv_freq, 0, 4);
    let x = random(&mut rng, &[2, 4, 3, 16], 1.0)
        .transpose(1, 2)
        .unwrap();
    let fused = rope(&x, &tables).unwrap();
    let plain = reference_rope(&x.contiguous().unwrap(), &tables);
    assert!(max_rel(&fused, &plain) < 1e-6);
}

#[test]
fn heads_are_the_transpose_and_rotation_exactly_in_values_and_gradients() {
    let mut rng = Rng::new(14);
    let inv_freq: Vec<f64> = (0..8)
        .map(|i| 1.0 / 10000f64.powf(i as f64 / 8.0))
        .collect();
    // [b, t, n, d] with 3 rows, 7 positions (offset 5, as a decoding step's), 5 heads of 16.
    let tables = RopeTables::new(&inv_freq, 5, 7);
    let x = random(&mut rng, &[3, 7, 5, 16], 1.0);
    let weights = random(&mut rng, &[3, 5, 7, 16], 1.0);
    for rotary in [Some(&tables), None] {
        let reference = |x: &Tensor| {
            let y = x.transpose(1, 2).unwrap().contiguous().unwrap();
            match rotary {
                Some(tables) => reference_rope(&y, tables),
                None => y,
            }
        };
        let fused = to_heads(&x, rotary).unwrap();
        assert_eq!(fused.dims(), &[3, 5, 7, 16]);
        // The same f32 operations on each element: equal, not close.
        assert_eq!(values(&fused), values(&rope_or_copy(&x, rotary)));
        assert!(max_rel(&fused, &reference(&x)) < 1e-6);
        let g_fused = gradients(std::slice::from_ref(&x), &weights, |t| {
            to_heads(&t[0], rotary).unwrap()
        });
        let g_plain = gradients(std::slice::from_ref(&x), &weights, |t| reference(&t[0]));
        assert!(
            max_rel(&g_fused[0], &g_plain[0]) < 1e-6,
            "{}",
            rotary.is_some()
        );
    }
    // And back: from_heads is the transpose, its gradient the transpose of the incoming one.
    let h = random(&mut rng, &[3, 5, 7, 16], 1.0);
    let back = from_heads(&h).unwrap();
    assert_eq!(
        values(&back),
        values(&h.transpose(1, 2).unwrap().contiguous().unwrap())
    );
    let weights = random(&mut rng, &[3, 7, 5, 16], 1.0);
    let g = gradients(std::slice::from_ref(&h), &weights, |t| {
        from_heads(&t[0]).unwrap()
    });
    assert_eq!(
        values(&g[0]),
        values(&weights.transpose(1, 2).unwrap().contiguous().unwrap())
    );
    // A round trip is the identity (a non-contiguous input is made contiguous first).
    let strided = random(&mut rng, &[3, 5, 7, 16], 1.0)
        .transpose(1, 2)
        .unwrap();
    let round = from_heads(&to_heads(&strided, None).unwrap()).unwrap();
    assert_eq!(values(&round), values(&strided));
    // Wrong tables or ranks are errors.
    assert!(to_heads(&random(&mut rng, &[3, 6, 5, 16], 1.0), Some(&tables)).is_err());
    assert!(to_heads(&random(&mut rng, &[3, 7, 5, 12], 1.0), Some(&tables)).is_err());
    assert!(from_heads(&random(&mut rng, &[7, 5, 16], 1.0)).is_err());
}

/// `rope` after the transpose, the two ops `to_heads` replaces.
fn rope_or_copy(x: &Tensor, rotary: Option<&RopeTables>) -> Tensor {
    let y = x.transpose(1, 2).unwrap().contiguous().unwrap();
    match rotary {
        Some(tables) => rope(&y, tables).unwrap(),
        None => y,
    }
}

/// Central finite differences of Σ f(x) ⊙ weights at a few coordinates, against the op's gradient
/// (f32 ops, so a loose tolerance with a moderate step).
fn finite_difference(x: &Tensor, weights: &Tensor, f: impl Fn(&Tensor) -> Tensor) {
    let grad = gradients(std::slice::from_ref(x), weights, |t| f(&t[0]));
    let grad = values(&grad[0]);
    let base = values(x);
    let loss = |v: &[f32]| -> f64 {
        let t = Tensor::from_vec(v.to_vec(), x.shape(), &Device::Cpu).unwrap();
        let out = (f(&t) * weights).unwrap();
        out.to_dtype(DType::F64)
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
    };
    for k in [0, base.len() / 3, base.len() - 1] {
        let h = 1e-2f32;
        let mut plus = base.clone();
        plus[k] += h;
        let mut minus = base.clone();
        minus[k] -= h;
        let numeric = (loss(&plus) - loss(&minus)) / (2.0 * h as f64);
        let analytic = grad[k] as f64;
        assert!(
            (numeric - analytic).abs() < 2e-2 * (1.0 + analytic.abs()),
            "coordinate {k}: finite difference {numeric}, gradient {analytic}"
        );
    }
}

#[test]
fn the_fused_gradients_agree_with_finite_differences() {
    let mut rng = Rng::new(5);
    let x = random(&mut rng, &[4, 12], 1.0);
    let w = random(&mut rng, &[12], 1.0);
    let weights = random(&mut rng, &[4, 12], 1.0);
    finite_difference(&x, &weights, |x| rms_norm(x, &w, 1e-5).unwrap());
    let b = random(&mut rng, &[4, 12], 1.0);
    finite_difference(&x, &weights, |x| swiglu(x, &b).unwrap());
    let inv_freq = [1.0, 0.1, 0.01, 0.001, 0.0001, 0.00001];
    let tables = RopeTables::new(&inv_freq, 3, 4);
    let weights = random(&mut rng, &[1, 4, 12], 1.0);
    let x = random(&mut rng, &[1, 4, 12], 1.0);
    finite_difference(&x, &weights, |x| rope(x, &tables).unwrap());
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let mut rng = Rng::new(6);
    let x = random(&mut rng, &[3, 4], 1.0);
    let message = |r: candle_core::Result<Tensor>| r.unwrap_err().to_string();
    assert!(message(rms_norm(&x, &random(&mut rng, &[5], 1.0), 1e-5)).contains("weight has shape"));
    assert!(message(rms_norm(&x, &random(&mut rng, &[4], 1.0), f64::NAN)).contains("eps"));
    let x64 = x.to_dtype(DType::F64).unwrap();
    assert!(message(rms_norm(&x64, &random(&mut rng, &[4], 1.0), 1e-5)).contains("f32"));
    assert!(message(swiglu(&x, &random(&mut rng, &[4, 3], 1.0))).contains("differ in shape"));
    let tables = RopeTables::new(&[1.0, 0.5], 0, 5);
    assert!(message(rope(&x, &tables)).contains("tables are for"));
}

#[test]
fn a_frozen_weight_gets_no_gradient_and_the_input_gets_candles() {
    let mut rng = Rng::new(7);
    // 37 rows × 29 in → 13 out: no size a multiple of a kernel tile.
    let x = random(&mut rng, &[37, 29], 1.0);
    let w = random(&mut rng, &[13, 29], 0.3);
    let weights = random(&mut rng, &[37, 13], 1.0);
    let fused = linear(&x, &w).unwrap();
    let plain = x.matmul(&w.t().unwrap()).unwrap();
    assert!(
        max_rel(&fused, &plain) < 1e-6,
        "{}",
        max_rel(&fused, &plain)
    );
    // The weight a plain tensor: only ∂x, equal to candle's.
    let xv = Var::from_tensor(&x).unwrap();
    let loss = (linear(xv.as_tensor(), &w).unwrap() * &weights)
        .unwrap()
        .sum_all()
        .unwrap();
    let store = loss.backward().unwrap();
    let dx = store.get(xv.as_tensor()).expect("∂x").clone();
    assert!(store.get(&w).is_none(), "a frozen weight got a gradient");
    let [want_dx, _] = gradients(&[x.clone(), w.clone()], &weights, |t| {
        t[0].matmul(&t[1].t().unwrap()).unwrap()
    })
    .try_into()
    .unwrap();
    assert!(max_rel(&dx, &want_dx) < 1e-5, "{}", max_rel(&dx, &want_dx));
    // A trained weight: both gradients, candle's values (∂w computed as ∂yᵀ·x by `fused::linear`).
    let got = gradients(&[x.clone(), w.clone()], &weights, |t| {
        linear(&t[0], &t[1]).unwrap()
    });
    let want = gradients(&[x.clone(), w.clone()], &weights, |t| {
        t[0].matmul(&t[1].t().unwrap()).unwrap()
    });
    for (g, r) in got.iter().zip(&want) {
        assert!(max_rel(g, r) < 1e-5);
    }
    // A transposed (non-contiguous) input gives the same product.
    let xt = x.t().unwrap().contiguous().unwrap().t().unwrap();
    assert!(max_rel(&linear(&xt, &w).unwrap(), &plain) < 1e-6);
    let message = |r: candle_core::Result<Tensor>| r.unwrap_err().to_string();
    assert!(message(linear(&x, &random(&mut rng, &[13, 28], 1.0))).contains("input size"));
}

/// A few rows (decoding) take the matrix–vector kernel (`fused::matvec`, at most `MATVEC_ROWS` rows):
/// its products equal candle's for every row count up to one past the threshold, each row's equal to
/// the row's own product bit for bit, for sizes that leave a
/// remainder in the dot product (not a multiple of 32) and in the parallel split (not a multiple of
/// 64 outputs), for a non-contiguous weight (candle's kernel then), with the ∂x of the frozen path, and
/// for a trained weight (the same values as frozen, both gradients candle's).
#[test]
fn a_few_rows_take_the_matrix_vector_kernel_with_the_same_values() {
    use rlx_trainer::fused::MATVEC_ROWS;
    let mut rng = Rng::new(11);
    for (inp, out) in [(576, 192), (45, 131), (7, 3), (64, 64)] {
        let w = random(&mut rng, &[out, inp], 0.3);
        for n in 1..=MATVEC_ROWS + 1 {
            let x = random(&mut rng, &[n, inp], 1.0);
            let plain = x.matmul(&w.t().unwrap()).unwrap();
            let fused = linear(&x, &w).unwrap();
            assert_eq!(fused.dims(), &[n, out]);
            let err = max_rel(&fused, &plain);
            // f32 sums of up to 576 products in two different orders (gemm's blocks, the kernel's
            // 16 lanes) differ by up to about 1e-5 relative to the sum (1.03e-5 seen at 32 × 576).
            assert!(err < 5e-5, "{n} rows × {inp} → {out}: {err}");
            // The same product again: the kernel is deterministic.
            assert_eq!(values(&linear(&x, &w).unwrap()), values(&fused));
            // Each row's products are those of the row alone, bit for bit: a row's logits do not
            // depend on the rows decoded beside it (its place in a block of the kernel or its tail).
            if n <= MATVEC_ROWS {
                for r in 0..n {
                    let row = x.narrow(0, r, 1).unwrap();
                    let alone = values(&linear(&row, &w).unwrap());
                    let within = values(&fused.narrow(0, r, 1).unwrap());
                    assert_eq!(alone, within, "row {r} of {n}, {inp} → {out}");
                }
            }
        }
    }
    // A weight stored transposed (a strided view) is not read as if contiguous.
    let wt = random(&mut rng, &[40, 33], 0.3);
    let w = wt.t().unwrap();
    let x = random(&mut rng, &[1, 40], 1.0);
    let plain = x.matmul(&w.t().unwrap()).unwrap();
    assert!(max_rel(&linear(&x, &w).unwrap(), &plain) < 1e-5);
    // ∂x of one row through the frozen path is candle's.
    let w = random(&mut rng, &[70, 50], 0.3);
    let x = random(&mut rng, &[1, 50], 1.0);
    let weights = random(&mut rng, &[1, 70], 1.0);
    let xv = Var::from_tensor(&x).unwrap();
    let loss = (linear(xv.as_tensor(), &w).unwrap() * &weights)
        .unwrap()
        .sum_all()
        .unwrap();
    let store = loss.backward().unwrap();
    let dx = store.get(xv.as_tensor()).expect("∂x").clone();
    let want = weights.matmul(&w).unwrap();
    assert!(max_rel(&dx, &want) < 1e-5, "{}", max_rel(&dx, &want));
    // A trained weight with a few rows takes the same kernel (a model and its no-grad view decode
    // alike) and keeps both gradients, candle's.
    for n in 1..=MATVEC_ROWS {
        let wv = Var::from_tensor(&random(&mut rng, &[70, 50], 0.3)).unwrap();
        let xv = Var::from_tensor(&random(&mut rng, &[n, 50], 1.0)).unwrap();
        let weights = random(&mut rng, &[n, 70], 1.0);
        let fused = linear(xv.as_tensor(), wv.as_tensor()).unwrap();
        let frozen = linear(xv.as_tensor(), &wv.as_tensor().detach()).unwrap();
        assert_eq!(values(&fused), values(&frozen), "{n} rows");
        let grads = |y: &Tensor| {
            let store = (y * &weights)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            let dx = store.get(xv.as_tensor()).expect("∂x").clone();
            let dw = store.get(wv.as_tensor()).expect("∂w").clone();
            (dx, dw)
        };
        let plain = xv.as_tensor().matmul(&wv.as_tensor().t().unwrap()).unwrap();
        assert!(max_rel(&fused, &plain) < 1e-5, "{n} rows");
        let ((dx, dw), (want_dx, want_dw)) = (grads(&fused), grads(&plain));
        assert!(max_rel(&dx, &want_dx) < 1e-5, "{n} rows: ∂x");
        assert!(max_rel(&dw, &want_dw) < 1e-5, "{n} rows: ∂w");
    }
}

/// Several products of the same rows (a decoding step's q, k and v; gate and up with the SwiGLU) in
/// one parallel loop give each product bit for bit as `linear` (and `swiglu`) alone: for every row
/// count the kernel takes and one past it, for output sizes that leave a remainder in the parallel
/// split, with untracked weights (the one-loop path) and with a trained weight (one `linear` each,
/// gradients kept).
#[test]
fn products_of_the_same_rows_in_one_loop_equal_each_product_alone() {
    use rlx_trainer::fused::MATVEC_ROWS;
    let mut rng = Rng::new(12);
    let inp = 45;
    let ws: Vec<Tensor> = [131, 7, 64]
        .iter()
        .map(|&out| random(&mut rng, &[out, inp], 0.3))
        .collect();
    let refs: Vec<&Tensor> = ws.iter().collect();
    let gate = random(&mut rng, &[37, inp], 0.3);
    let up = random(&mut rng, &[37, inp], 0.3);
    for n in 1..=MATVEC_ROWS + 1 {
        let x = random(&mut rng, &[n, inp], 1.0);
        let all = linears(&x, &refs).unwrap();
        assert_eq!(all.len(), ws.len());
        for (y, w) in all.iter().zip(&ws) {
            assert_eq!(values(y), values(&linear(&x, w).unwrap()), "{n} rows");
        }
        let act = linear_swiglu(&x, &gate, &up).unwrap();
        let alone = swiglu(&linear(&x, &gate).unwrap(), &linear(&x, &up).unwrap()).unwrap();
        assert_eq!(act.dims(), &[n, 37]);
        assert_eq!(values(&act), values(&alone), "{n} rows");
    }
    // A trained weight among them: each its own `linear`, both gradients flowing.
    let wv = Var::from_tensor(&ws[0]).unwrap();
    let x = random(&mut rng, &[3, inp], 1.0);
    let ys = linears(&x, &[wv.as_tensor(), &ws[1]]).unwrap();
    assert_eq!(values(&ys[0]), values(&linear(&x, &ws[0]).unwrap()));
    let store = ys[0].sum_all().unwrap().backward().unwrap();
    assert!(
        store.get(wv.as_tensor()).is_some(),
        "the trained weight's gradient"
    );
    // Weights of another input size are an error, not a wrong product.
    let bad = random(&mut rng, &[5, inp + 1], 0.3);
    assert!(linears(&x, &[&ws[1], &bad]).is_err());
}
