//! Forward passes that are never differentiated, on the tiny model (no asset needed): the
//! [`Model::no_grad`] view gives the tracked forward's logits bit for bit, records nothing for
//! backpropagation and shares the weights' storage; the sampler stops each row at the first token of its
//! stop set and generates nothing after it.

use candle_core::{Device, Tensor};
use rlx_trainer::model::{KvCache, Model, ModelConfig};
use rlx_trainer::rng::Rng;
use rlx_trainer::sample::{generate, Completion, Settings};
use rlx_trainer::train::completion_logp;

fn config() -> ModelConfig {
    ModelConfig {
        vocab: 23,
        hidden: 32,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        intermediate: 48,
        rope_theta: 10_000.0,
        rms_eps: 1e-5,
        max_positions: 40,
        // Large enough that an untrained model's distributions are far from uniform (varied greedy tokens).
        init_std: 0.5,
        head_dim: None,
        attention_bias: false,
        qk_norm: false,
        rope_scaling: None,
    }
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// Two left-padded rows (the first has 2 pad positions).
fn batch() -> (Tensor, Vec<usize>) {
    let ids: Vec<u32> = vec![0, 0, 5, 9, 3, 7, 11, 4, 8, 2, 6, 13, 1, 12];
    (
        Tensor::from_vec(ids, (2, 7), &Device::Cpu).unwrap(),
        vec![2, 0],
    )
}

#[test]
fn no_grad_forward_is_bit_identical_and_records_nothing() {
    let model = Model::new(&config(), 7, &Device::Cpu).unwrap();
    let view = model.no_grad();
    let (ids, pads) = batch();

    // The same logits, bit for bit, from the full forward and from token_logp.
    let tracked = model.forward(&ids, &pads).unwrap();
    let free = view.forward(&ids, &pads).unwrap();
    assert_eq!(bits(&tracked), bits(&free));
    let tracked_lp = model.token_logp(&ids, &pads, 3).unwrap();
    let free_lp = view.token_logp(&ids, &pads, 3).unwrap();
    assert_eq!(bits(&tracked_lp), bits(&free_lp));

    // The tracked result carries the op graph; the view's does not.
    assert!(model.tracks_gradients() && tracked.track_op());
    assert!(!view.tracks_gradients() && !free.track_op() && !free_lp.track_op());

    // Backpropagating the tracked result reaches every weight; the view's reaches none (its result is a
    // leaf: the gradient store holds only the result itself).
    let grads = tracked
        .sqr()
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    for (name, var) in model.vars() {
        assert!(grads.get(var).is_some(), "tracked: no gradient for {name}");
    }
    let loss = free.sqr().unwrap().sum_all().unwrap();
    assert!(!loss.track_op());
    let grads = loss.backward().unwrap();
    for (name, var) in model.vars() {
        assert!(
            grads.get(var).is_none(),
            "no-grad view: gradient for {name}"
        );
    }
    assert!(grads.get(&loss).is_some());

    // The view has nothing to train.
    assert!(view.vars().is_empty());
    assert_eq!(view.parameter_count(), 0);
}

#[test]
fn no_grad_view_shares_the_weights_and_their_updates() {
    let model = Model::new(&config(), 11, &Device::Cpu).unwrap();
    let view = model.no_grad();
    let (ids, pads) = batch();
    let before = bits(&view.forward(&ids, &pads).unwrap());
    // An optimizer-style in-place update of every weight (Var::set writes into the Var's storage) is seen
    // through the view made before it: the view holds the same storage, not a copy.
    for (_, var) in model.vars() {
        let scaled = (var.as_tensor() * 0.9).unwrap();
        var.set(&scaled).unwrap();
    }
    let after_tracked = bits(&model.forward(&ids, &pads).unwrap());
    let after_view = bits(&view.forward(&ids, &pads).unwrap());
    assert_ne!(before, after_view);
    assert_eq!(after_tracked, after_view);
    // A frozen copy of the view owns its weights and computes the same logits.
    let frozen = view.frozen_copy().unwrap();
    assert_eq!(frozen.vars().len(), model.vars().len());
    assert_eq!(bits(&frozen.forward(&ids, &pads).unwrap()), after_view);
}

#[test]
fn no_grad_kv_cache_matches_the_tracked_cache() {
    let model = Model::new(&config(), 3, &Device::Cpu).unwrap();
    let view = model.no_grad();
    let (ids, pads) = batch();
    let step = |m: &Model| -> Vec<Vec<u32>> {
        let mut cache = KvCache::default();
        let mut out = Vec::new();
        // The prompt's first 4 positions, then one position at a time.
        let mut offset = 0;
        for (start, len) in [(0, 4), (4, 1), (5, 1), (6, 1)] {
            let x = ids.narrow(1, start, len).unwrap();
            let h = m.hidden(&x, offset, &pads, Some(&mut cache)).unwrap();
            out.push(bits(&m.logits(&h).unwrap()));
            offset += len;
        }
        out
    };
    assert_eq!(step(&model), step(&view));
}

/// The sampler's cache keeps its positions in buffers with room to grow, written in place: decoding
/// one position at a time gives, bit for bit, what a cache that concatenates gives (the same
/// attention over the same values, read from a longer buffer), whether the buffers grow by doubling or
/// are reserved up front, and the one-pass forward's logits within float rounding. A cache continued
/// at another position than its length is an error.
#[test]
fn a_kv_cache_written_in_place_decodes_as_concatenation_does() {
    let model = Model::new(&config(), 4, &Device::Cpu).unwrap().no_grad();
    let (ids, pads) = batch();
    let decode = |mut cache: KvCache| -> Vec<Vec<u32>> {
        let mut out = Vec::new();
        let mut offset = 0;
        for (start, len) in [(0, 2), (2, 1), (3, 1), (4, 2), (6, 1)] {
            let x = ids.narrow(1, start, len).unwrap();
            let h = model.hidden(&x, offset, &pads, Some(&mut cache)).unwrap();
            out.push(bits(&model.logits(&h).unwrap()));
            offset += len;
            assert_eq!(cache.len(), offset);
        }
        out
    };
    let concatenated = decode(KvCache::keeping_graph());
    let grown = decode(KvCache::default());
    let mut reserved = KvCache::default();
    reserved.reserve(7);
    assert_eq!(grown, concatenated);
    assert_eq!(decode(reserved), concatenated);
    // The last position's logits against one pass over all 7 positions.
    let whole = model.forward(&ids, &pads).unwrap();
    let last_whole: Vec<f32> = whole
        .narrow(1, 6, 1)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let last_step: Vec<f32> = concatenated[4].iter().map(|b| f32::from_bits(*b)).collect();
    let worst = last_whole
        .iter()
        .zip(&last_step)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(worst < 1e-4, "decoded vs one pass: {worst}");
    // Continuing a cache of 2 positions at position 3 is an error, not a silent misplacement.
    let mut cache = KvCache::default();
    model
        .hidden(&ids.narrow(1, 0, 2).unwrap(), 0, &pads, Some(&mut cache))
        .unwrap();
    let err = model
        .hidden(&ids.narrow(1, 2, 1).unwrap(), 3, &pads, Some(&mut cache))
        .unwrap_err();
    assert!(err.to_string().contains("continued at position 3"), "{err}");
}

fn greedy(stop: Vec<u32>, max_new_tokens: usize) -> Settings {
    Settings {
        temperature: 0.0,
        top_p: 1.0,
        max_new_tokens,
        stop,
        entropy: false,
    }
}

fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![3, 5, 7],
        vec![11, 2],
        vec![19, 4, 4, 9, 1],
        vec![8],
        vec![13, 6, 21, 17],
        vec![10, 12, 14],
    ]
}

/// Where a free-running row ends under stop set `stop`: the first index of a token in it, inclusive.
fn cut(c: &Completion, stop: &[u32]) -> usize {
    c.tokens
        .iter()
        .position(|t| stop.contains(t))
        .map_or(c.tokens.len(), |k| k + 1)
}

#[test]
fn sampler_stops_each_row_at_the_first_of_its_stop_ids() {
    let model = Model::new(&config(), 5, &Device::Cpu).unwrap();
    let device = Device::Cpu;
    let max_new = 14;
    let prompts = prompts();
    let free = generate(
        &model,
        &prompts,
        1,
        &greedy(vec![], max_new),
        &mut Rng::new(0),
        &device,
    )
    .unwrap();
    assert!(free.iter().all(|c| c.tokens.len() == max_new));
    // A forced stop set of two ids, each the first stop of some row at least 2 tokens before the length
    // limit, and both in one row (where the later one must not matter): the first such pair in id order
    // (the free rows decide; the test fails when there is none).
    let ends = |stop: &[u32]| -> Vec<u32> {
        free.iter()
            .filter(|f| cut(f, stop) + 2 <= max_new)
            .map(|f| f.tokens[cut(f, stop) - 1])
            .collect()
    };
    let (a, b) = (0..23u32)
        .flat_map(|a| (a + 1..23).map(move |b| (a, b)))
        .find(|(a, b)| {
            let e = ends(&[*a, *b]);
            let both = free
                .iter()
                .any(|f| f.tokens.contains(a) && f.tokens.contains(b));
            e.contains(a) && e.contains(b) && both
        })
        .unwrap_or_else(|| panic!("no two stop ids each end a row early: {free:?}"));
    let stop = vec![a, b];
    let out = generate(
        &model,
        &prompts,
        1,
        &greedy(stop.clone(), max_new),
        &mut Rng::new(0),
        &device,
    )
    .unwrap();
    let mut ended_by = Vec::new();
    for (r, (c, f)) in out.iter().zip(&free).enumerate() {
        let k = cut(f, &stop);
        // The row is the free row up to and including its first stop id; nothing after it.
        assert_eq!(c.tokens, f.tokens[..k], "row {r}");
        assert_eq!(c.logp.len(), c.tokens.len(), "row {r}");
        let (got, want): (Vec<u32>, Vec<u32>) = (
            c.logp.iter().map(|v| v.to_bits()).collect(),
            f.logp[..k].iter().map(|v| v.to_bits()).collect(),
        );
        assert_eq!(got, want, "row {r}: log-probs");
        if k < max_new {
            ended_by.push(*c.tokens.last().unwrap());
        }
    }
    // Both ids ended some row: each row stops at whichever of them comes first.
    assert!(
        ended_by.contains(&a) && ended_by.contains(&b),
        "{ended_by:?}"
    );

    // What the trainer packs from these completions: exactly their tokens (the stop token included,
    // nothing after it), with the sampler's log-probs (recomputed by the trainer's forward pass).
    let tokens: Vec<Vec<u32>> = out.iter().map(|c| c.tokens.clone()).collect();
    let packed = completion_logp(&model, &prompts, &tokens, &device)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let sampled: Vec<f32> = out.iter().flat_map(|c| c.logp.clone()).collect();
    assert_eq!(packed.len(), tokens.iter().map(Vec::len).sum::<usize>());
    for (i, (p, s)) in packed.iter().zip(&sampled).enumerate() {
        assert!((p - s).abs() < 1e-4, "token {i}: {p} vs {s}");
    }
}

#[test]
fn sampled_rows_end_at_their_first_stop_id_or_the_length_limit() {
    let model = Model::new(&config(), 9, &Device::Cpu).unwrap();
    let settings = Settings {
        temperature: 1.0,
        top_p: 1.0,
        max_new_tokens: 10,
        stop: vec![4, 15, 20],
        entropy: false,
    };
    let out = generate(
        &model,
        &prompts(),
        6,
        &settings,
        &mut Rng::new(42),
        &Device::Cpu,
    )
    .unwrap();
    assert_eq!(out.len(), 36);
    let mut ended_by = Vec::new();
    for (r, c) in out.iter().enumerate() {
        assert!(!c.tokens.is_empty() && c.tokens.len() <= 10, "row {r}");
        assert_eq!(c.logp.len(), c.tokens.len(), "row {r}");
        let body = &c.tokens[..c.tokens.len() - 1];
        assert!(
            body.iter().all(|t| !settings.stop.contains(t)),
            "row {r}: a stop id before the end: {:?}",
            c.tokens
        );
        let last = *c.tokens.last().unwrap();
        if settings.stop.contains(&last) {
            ended_by.push(last);
        } else {
            assert_eq!(c.tokens.len(), 10, "row {r} ended early without a stop id");
        }
        assert!(c.logp.iter().all(|l| l.is_finite() && *l <= 0.0), "row {r}");
    }
    ended_by.sort_unstable();
    ended_by.dedup();
    assert!(ended_by.len() >= 2, "rows ended by {ended_by:?}");
    // Every row's log-probabilities are those of its own tokens, as teacher forcing computes them (the
    // sampler decodes one position at a time from its KV cache, teacher forcing runs all positions at
    // once: equal up to the order of the sums).
    let row_prompts: Vec<Vec<u32>> = prompts()
        .into_iter()
        .flat_map(|p| std::iter::repeat_n(p, 6))
        .collect();
    let tokens: Vec<Vec<u32>> = out.iter().map(|c| c.tokens.clone()).collect();
    let forced = completion_logp(&model, &row_prompts, &tokens, &Device::Cpu)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let sampled: Vec<f32> = out.iter().flat_map(|c| c.logp.clone()).collect();
    assert_eq!(forced.len(), sampled.len());
    for (i, (f, s)) in forced.iter().zip(&sampled).enumerate() {
        assert!(
            (f - s).abs() < 1e-4,
            "token {i}: sampled {s}, teacher-forced {f}"
        );
    }
    // The same seed gives the same completions.
    let again = generate(
        &model,
        &prompts(),
        6,
        &settings,
        &mut Rng::new(42),
        &Device::Cpu,
    )
    .unwrap();
    assert_eq!(again, out);
}

#[test]
fn sampler_input_errors_name_the_problem() {
    let model = Model::new(&config(), 1, &Device::Cpu).unwrap();
    let err = generate(
        &model,
        &prompts(),
        1,
        &greedy(vec![2, 23], 4),
        &mut Rng::new(0),
        &Device::Cpu,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("stop token 23 is outside the model's vocabulary of 23"),
        "{err}"
    );
    let err = generate(
        &model,
        &[vec![1, 2], vec![]],
        1,
        &greedy(vec![2], 4),
        &mut Rng::new(0),
        &Device::Cpu,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("prompt 1 is empty"), "{err}");
}

#[test]
fn a_prefill_split_into_chunks_gives_the_whole_batchs_tokens_and_log_probs() {
    // Long enough prompts that the prefill runs in three chunks (1024 padded positions at most each,
    // longest first): [700], [450, 300] after a zero prefix of 250 positions, [30, 5] after one of 670.
    let config = ModelConfig {
        max_positions: 760,
        ..config()
    };
    let model = Model::new(&config, 11, &Device::Cpu).unwrap();
    let mut rng = Rng::new(3);
    let prompts: Vec<Vec<u32>> = [30usize, 700, 5, 450, 300]
        .iter()
        .map(|&len| {
            (0..len)
                .map(|_| (rng.uniform() * 23.0) as u32 % 23)
                .collect()
        })
        .collect();
    let settings = Settings {
        temperature: 1.0,
        top_p: 1.0,
        max_new_tokens: 12,
        stop: Vec::new(),
        entropy: true,
    };
    let device = Device::Cpu;
    let out = generate(&model, &prompts, 2, &settings, &mut Rng::new(5), &device).unwrap();
    assert_eq!(out.len(), 10);
    // The trainer's forward pass over the whole batch left-padded to the longest prompt (one pass, no
    // cache): the same log-probabilities of every sampled token, so each chunk's keys sit at the
    // positions, rope angles included, of the padded batch.
    let repeated: Vec<Vec<u32>> = prompts
        .iter()
        .flat_map(|p| [p.clone(), p.clone()])
        .collect();
    let tokens: Vec<Vec<u32>> = out.iter().map(|c| c.tokens.clone()).collect();
    let packed = completion_logp(&model, &repeated, &tokens, &device)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let sampled: Vec<f32> = out.iter().flat_map(|c| c.logp.clone()).collect();
    assert_eq!(packed.len(), 120);
    for (i, (p, s)) in packed.iter().zip(&sampled).enumerate() {
        assert!((p - s).abs() < 1e-4, "token {i}: {p} vs {s}");
    }
    // Each prompt alone (one chunk, no prefix) chooses the same greedy tokens as in the batch.
    let greedy = greedy(Vec::new(), 8);
    let batch = generate(&model, &prompts, 1, &greedy, &mut Rng::new(0), &device).unwrap();
    for (p, row) in prompts.iter().zip(&batch) {
        let alone = generate(
            &model,
            std::slice::from_ref(p),
            1,
            &greedy,
            &mut Rng::new(0),
            &device,
        )
        .unwrap();
        assert_eq!(alone[0].tokens, row.tokens, "prompt of {} tokens", p.len());
        for (a, b) in alone[0].logp.iter().zip(&row.logp) {
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
    }
}
