//! The real-model path: SmolLM2-135M-Instruct from its GGUF (weights, tokenizer, chat template), the
//! yes/no judge, and all-MiniLM-L6-v2 sentence embeddings. These need `scripts/fetch-assets.sh`; where the
//! build found the assets missing (rlx-tools, `rlx_assets`), `cargo test` reports each as ignored.
//!
//! Reference values were measured with independent implementations on the same files: Hugging Face
//! transformers 5.24 (torch 2.15, f32) loading the GGUF (`AutoTokenizer`/`AutoModelForCausalLM` with
//! `gguf_file=`, which dequantises and un-permutes on its own) and `BertModel` + mean pooling + L2 norm
//! for MiniLM (docs/models.md, "How the reference values were measured").

use std::io::Write;
use std::sync::OnceLock;

use candle_core::{Device, Tensor};
use rlx_trainer::embed::{cosine, MiniLm};
use rlx_trainer::gguf::load_smollm2;
use rlx_trainer::judge;
use rlx_trainer::model::Model;
use rlx_trainer::rng::Rng;
use rlx_trainer::sample::{generate, Settings};
use rlx_trainer::tokenizer::{ChatTokenizer, GgufVocab, Message};

/// SmolLM2, loaded once. The tests that use it are ignored where the build found the assets missing
/// (`cfg(rlx_assets)`); where it found them, a load failure fails each of them.
fn smollm2() -> &'static (Model, ChatTokenizer) {
    static CELL: OnceLock<Result<(Model, ChatTokenizer), String>> = OnceLock::new();
    match CELL.get_or_init(|| load_smollm2(&Device::Cpu).map_err(|e| e.to_string())) {
        Ok(m) => m,
        Err(e) => panic!("SmolLM2 does not load: {e}"),
    }
}

// ---------------------------------------------------------------------------------------------------
// Tokenizer pipeline on a synthetic vocabulary (no asset needed).

/// GPT-2's byte-to-unicode map (bytes.rs of every byte-level BPE).
fn byte_chars() -> Vec<String> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32).collect();
    printable.extend(0xA1..=0xAC);
    printable.extend(0xAE..=0xFF);
    let mut out = vec![String::new(); 256];
    let mut extra = 0;
    for b in 0..256u32 {
        let c = if printable.contains(&b) {
            b
        } else {
            extra += 1;
            255 + extra
        };
        out[b as usize] = char::from_u32(c).unwrap().to_string();
    }
    out
}

fn synthetic_vocab() -> GgufVocab {
    let mut tokens = vec![
        "<|endoftext|>".to_string(),
        "<|im_start|>".into(),
        "<|im_end|>".into(),
    ];
    tokens.extend(byte_chars());
    // Merges: "a"+"b" → "ab", "Ġ"+"ab" → "Ġab", "1"+"2" → "12" (never applies: digits are split first).
    tokens.extend(["ab".into(), "Ġab".into(), "12".into()]);
    let mut token_types = vec![3; 3];
    token_types.extend(vec![1; tokens.len() - 3]);
    GgufVocab {
        model: "gpt2".into(),
        pre: "smollm".into(),
        tokens,
        token_types,
        merges: vec!["a b".into(), "Ġ ab".into(), "1 2".into()],
        bos: Some(1),
        eos: 2,
        eot: None,
        eom: None,
        pad: Some(2),
        chat_template: None,
    }
}

#[test]
fn synthetic_bpe_merges_splits_digits_and_keeps_control_tokens() {
    let vocab = synthetic_vocab();
    let tok = ChatTokenizer::from_gguf_vocab(&vocab).unwrap();
    let id = |t: &str| vocab.tokens.iter().position(|x| x == t).unwrap() as u32;
    // "ab ab": "ab" merges, " ab" → "Ġab" merges.
    assert_eq!(tok.encode("ab ab").unwrap(), vec![id("ab"), id("Ġab")]);
    // Digits are split one by one before BPE, so the "1 2" merge never fires.
    assert_eq!(tok.encode("12").unwrap(), vec![id("1"), id("2")]);
    // Control tokens in the text are single ids; the rest is byte-level.
    assert_eq!(
        tok.encode("<|im_start|>a\n").unwrap(),
        vec![1, id("a"), id("Ċ")]
    );
    for text in [
        "ab ab",
        "x\ny  z\t",
        "é🚀",
        "<|im_start|>user\nhi<|im_end|>\n",
    ] {
        let ids = tok.encode(text).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), text);
    }
    assert_eq!(tok.decode(&[1, id("a"), 2], true).unwrap(), "a");
    // Stop ids: eos (`<|im_end|>`) and `<|endoftext|>` by its text; an eot id joins them, sorted.
    assert_eq!(tok.stop_ids(), [0, 2]);
    let mut with_eot = synthetic_vocab();
    with_eot.eot = Some(id("ab"));
    with_eot.eom = Some(2);
    let tok = ChatTokenizer::from_gguf_vocab(&with_eot).unwrap();
    assert_eq!(tok.stop_ids(), [0, 2, id("ab")]);
    let mut plain = synthetic_vocab();
    plain.tokens[0] = "<|begin|>".into();
    let tok = ChatTokenizer::from_gguf_vocab(&plain).unwrap();
    assert_eq!(tok.stop_ids(), [2]);
}

#[test]
fn tokenizer_metadata_errors_name_the_problem() {
    let mut bad = synthetic_vocab();
    bad.merges.push("nospace".into());
    let err = ChatTokenizer::from_gguf_vocab(&bad)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("tokenizer.ggml.merges[3]") && err.contains("nospace"),
        "{err}"
    );

    let mut bad = synthetic_vocab();
    bad.pre = "qwen2".into();
    let err = ChatTokenizer::from_gguf_vocab(&bad)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("tokenizer.ggml.pre `qwen2` is not supported"),
        "{err}"
    );

    let mut bad = synthetic_vocab();
    bad.eos = 100_000;
    let err = ChatTokenizer::from_gguf_vocab(&bad)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("eos_token_id 100000 is outside"), "{err}");
    let mut bad = synthetic_vocab();
    bad.eot = Some(70_000);
    let err = ChatTokenizer::from_gguf_vocab(&bad)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("eot_token_id 70000 is outside"), "{err}");

    let mut bad = synthetic_vocab();
    bad.model = "llama".into();
    let err = ChatTokenizer::from_gguf_vocab(&bad)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("tokenizer.ggml.model `llama` is not supported"),
        "{err}"
    );

    let tok = ChatTokenizer::from_gguf_vocab(&synthetic_vocab()).unwrap();
    let err = tok.decode(&[5_000], false).unwrap_err().to_string();
    assert!(
        err.contains("token id 5000 is outside the vocabulary"),
        "{err}"
    );
}

/// The hand-written ChatML that `chat_prompt` was before it rendered the checkpoint's template:
/// SmolLM2's default system prompt when the conversation has none, `<|im_start|>{role}\n{content}<|im_end|>\n`
/// per message, `<|im_start|>assistant\n` with the generation prompt.
fn old_chatml(messages: &[Message], add_generation_prompt: bool) -> String {
    let mut out = String::new();
    if messages.first().is_some_and(|m| m.role != "system") {
        out.push_str(&format!(
            "<|im_start|>system\n{}<|im_end|>\n",
            rlx_trainer::tokenizer::SMOLLM2_SYSTEM
        ));
    }
    for m in messages {
        out.push_str(&format!(
            "<|im_start|>{}\n{}<|im_end|>\n",
            m.role, m.content
        ));
    }
    if add_generation_prompt {
        out.push_str("<|im_start|>assistant\n");
    }
    out
}

#[test]
fn a_vocabulary_without_a_chat_template_refuses_chat_prompts() {
    let tok = ChatTokenizer::from_gguf_vocab(&synthetic_vocab()).unwrap();
    let err = tok
        .chat_prompt(&[Message::new("user", "Hi")], true)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("the GGUF has no tokenizer.chat_template"),
        "{err}"
    );
    assert!(tok.chat_ids("Hi").is_err());
    // A broken template is refused when the tokenizer is built, naming the GGUF key and the line.
    let mut bad = synthetic_vocab();
    bad.chat_template = Some("{% for m in messages %}\n{{ m.content }".into());
    let err = ChatTokenizer::from_gguf_vocab(&bad)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains(
            "chat template of the GGUF's tokenizer.chat_template, line 2 does not compile: syntax error"
        ),
        "{err}"
    );
}

#[test]
#[cfg_attr(
    not(rlx_assets),
    ignore = "needs the assets: run scripts/fetch-assets.sh"
)]
fn smollm2_gguf_template_renders_the_old_chatml() {
    let (_, tok) = smollm2();
    let source = tok.chat_template().unwrap().source();
    assert!(source.contains("<|im_start|>"), "{source}");
    let conversations: Vec<Vec<Message>> = vec![
        vec![Message::new("user", "Hi")],
        vec![
            Message::new("system", "Be brief."),
            Message::new("user", "Hi"),
        ],
        vec![
            Message::new("user", "What is 2+2?"),
            Message::new("assistant", "4"),
            Message::new("user", "And 3+3?\nShow  the work."),
        ],
        vec![
            Message::new("system", ""),
            Message::new("user", "naïve café — 東京 🚀"),
            Message::new("assistant", "<think>\n</think>ok"),
        ],
        Vec::new(),
    ];
    for messages in &conversations {
        for add_generation_prompt in [true, false] {
            assert_eq!(
                tok.chat_prompt(messages, add_generation_prompt).unwrap(),
                old_chatml(messages, add_generation_prompt),
                "{messages:?} {add_generation_prompt}"
            );
        }
    }
    assert_eq!(
        tok.chat_prompt(&[Message::new("user", "Hi")], true)
            .unwrap(),
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face\
         <|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    // chat_ids encodes the rendered prompt without adding anything.
    let ids = tok.chat_ids("Hi").unwrap();
    assert_eq!(
        ids,
        tok.encode_chat(&old_chatml(&[Message::new("user", "Hi")], true))
            .unwrap()
    );
    assert_eq!(ids[0], 1); // <|im_start|>, written by the template
}

// ---------------------------------------------------------------------------------------------------
// SmolLM2-135M-Instruct.

#[test]
#[cfg_attr(
    not(rlx_assets),
    ignore = "needs the assets: run scripts/fetch-assets.sh"
)]
fn smollm2_config_and_weights() {
    let (model, tok) = smollm2();
    let c = &model.config;
    assert_eq!(
        (
            c.vocab,
            c.hidden,
            c.layers,
            c.heads,
            c.kv_heads,
            c.intermediate
        ),
        (49152, 576, 30, 9, 3, 1536)
    );
    assert_eq!(c.rope_theta, 100_000.0);
    assert!((c.rms_eps - 1e-5).abs() < 1e-9);
    assert!(model.tied());
    // 49152·576 + 30·(2·576² + 2·192·576 + 3·1536·576 + 2·576) + 576: the published 134.5 M.
    assert_eq!(model.parameter_count(), 134_515_008);
    assert_eq!(model.vars().len(), 272);
    assert_eq!(
        (tok.vocab_size(), tok.eos, tok.pad, tok.bos),
        (49152, 2, 2, Some(1))
    );
    // The file has no eot/eom ids; llama.cpp's end-of-generation texts add `<|endoftext|>` to eos.
    assert_eq!(tok.stop_ids(), [0, 2]);
    assert_eq!(
        tok.decode(&[0, 2], false).unwrap(),
        "<|endoftext|><|im_end|>"
    );
}

#[test]
#[cfg_attr(
    not(rlx_assets),
    ignore = "needs the assets: run scripts/fetch-assets.sh"
)]
fn smollm2_token_ids_match_the_reference_tokenizer() {
    let (_, tok) = smollm2();
    // ids from transformers' tokenizer converted from the same GGUF (independent conversion code).
    let cases: [(&str, &[u32]); 7] = [
        ("Hello, world!", &[19556, 28, 905, 17]),
        (
            "What is the capital of France?",
            &[1780, 314, 260, 3575, 282, 4649, 47],
        ),
        (
            "  two  spaces\nnew line\n\n\ttab",
            &[216, 827, 216, 5600, 198, 2241, 1761, 1116, 197, 15999],
        ),
        (
            "naïve café — 東京 🚀 emoji",
            &[
                3546, 46494, 37366, 1841, 17097, 247, 126, 16736, 122, 15107, 244, 218, 649, 33777,
            ],
        ),
        (
            "12345 + 678 = 13023",
            &[
                33, 34, 35, 36, 37, 1232, 216, 38, 39, 40, 446, 216, 33, 35, 32, 34, 35,
            ],
        ),
        ("don't you'll I'm", &[12420, 982, 346, 3060, 339, 5248]),
        (
            "<|im_start|>user\nHi<|im_end|>\n",
            &[1, 4093, 198, 26843, 2, 198],
        ),
    ];
    for (text, want) in cases {
        assert_eq!(tok.encode(text).unwrap(), want, "{text:?}");
    }
    // Round trip on varied text.
    for text in [
        "Hello, world!",
        "  leading and trailing spaces  ",
        "tabs\tand\nnewlines\r\n\n",
        "ünïcödé, 中文, русский, العربية, emoji 🚀🎉 and combining e\u{301}",
        "code: fn main() { println!(\"{}\", 1 + 2); }",
        "<|im_start|>assistant\nThe answer is 42.<|im_end|>",
        "",
    ] {
        let ids = tok.encode(text).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), text, "{ids:?}");
    }
    assert_eq!(
        tok.single_token(" yes").unwrap(),
        tok.token_id("Ġyes").unwrap()
    );
}

#[test]
#[cfg_attr(
    not(rlx_assets),
    ignore = "needs the assets: run scripts/fetch-assets.sh"
)]
fn smollm2_logits_match_the_reference_implementation() {
    let (model, tok) = smollm2();
    let ids = tok.chat_ids("What is the capital of France?").unwrap();
    assert_eq!(
        ids,
        [
            1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411,
            407, 19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1,
            520, 9531, 198
        ]
    );
    let x = Tensor::new(ids.as_slice(), &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let logits = model.forward(&x, &[0]).unwrap();
    let last: Vec<f32> = logits
        .get(0)
        .unwrap()
        .get(ids.len() - 1)
        .unwrap()
        .to_vec1()
        .unwrap();
    // transformers (f32, same dequantised weights): logits 0..8 and the top 5 of the last position.
    let want_first = [
        10.166023, 6.2121077, 6.8370695, 6.255062, 5.3848457, 4.910391, 2.386484, 4.922513,
    ];
    for (i, w) in want_first.iter().enumerate() {
        assert!((last[i] - w).abs() < 2e-3, "logit {i}: {} vs {w}", last[i]);
    }
    let mut order: Vec<usize> = (0..last.len()).collect();
    order.sort_by(|a, b| last[*b].total_cmp(&last[*a]));
    let want_top = [
        (504, 25.325392),
        (60, 25.243292),
        (15319, 24.942429),
        (2219, 24.401682),
        (7026, 24.314642),
    ];
    for (k, (id, value)) in want_top.iter().enumerate() {
        assert_eq!(order[k], *id, "top {k}");
        assert!((last[*id] - value).abs() < 2e-3, "{} vs {value}", last[*id]);
    }
}

#[test]
#[cfg_attr(
    not(rlx_assets),
    ignore = "needs the assets: run scripts/fetch-assets.sh"
)]
fn smollm2_greedy_answer_names_paris_and_is_batch_invariant() {
    let (model, tok) = smollm2();
    let settings = Settings {
        temperature: 0.0,
        top_p: 1.0,
        max_new_tokens: 24,
        stop: tok.stop_ids().to_vec(),
        entropy: false,
    };
    let question = tok.chat_ids("What is the capital of France?").unwrap();
    // A longer second prompt: the first is left-padded in the batch.
    let other = tok
        .chat_ids("Write one sentence about the history of the city of Rome and its empire.")
        .unwrap();
    assert!(other.len() > question.len());
    let out = generate(
        model,
        &[question.clone(), other],
        1,
        &settings,
        &mut Rng::new(0),
        &Device::Cpu,
    )
    .unwrap();
    let answer = tok.decode(&out[0].tokens, true).unwrap();
    assert!(answer.contains("Paris"), "{answer:?}");
    // The same tokens as transformers' greedy `generate` on the same weights.
    assert_eq!(
        out[0].tokens,
        [504, 3575, 282, 4649, 314, 7042, 30, 2],
        "{answer:?}"
    );
    let alone = generate(
        model,
        &[question],
        1,
        &settings,
        &mut Rng::new(0),
        &Device::Cpu,
    )
    .unwrap();
    assert_eq!(alone[0].tokens, out[0].tokens);
    for (a, b) in alone[0].logp.iter().zip(&out[0].logp) {
        assert!((a - b).abs() < 1e-3, "{a} vs {b}");
    }
}

#[test]
#[cfg_attr(
    not(rlx_assets),
    ignore = "needs the assets: run scripts/fetch-assets.sh"
)]
fn smollm2_trains_every_weight_and_frozen_copy_is_independent() {
    let (model, tok) = smollm2();
    let ids = tok.chat_ids("Say hi.").unwrap();
    let n = ids.len();
    let x = Tensor::new(ids.as_slice(), &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let frozen = model.frozen_copy().unwrap();
    let logp = model.token_logp(&x, &[0], n - 4).unwrap();
    let reference = frozen.token_logp(&x, &[0], n - 4).unwrap();
    let (a, b): (Vec<f32>, Vec<f32>) = (
        logp.flatten_all().unwrap().to_vec1().unwrap(),
        reference.flatten_all().unwrap().to_vec1().unwrap(),
    );
    assert_eq!(a, b);
    // token_logp agrees with a log-softmax of the full forward.
    let full = rlx_trainer::model::log_softmax(&model.forward(&x, &[0]).unwrap()).unwrap();
    for (j, lp) in a.iter().enumerate() {
        let pos = n - 4 + j;
        let want: f32 = full
            .get(0)
            .unwrap()
            .get(pos - 1)
            .unwrap()
            .get(ids[pos] as usize)
            .unwrap()
            .to_scalar()
            .unwrap();
        assert!((lp - want).abs() < 1e-4, "{lp} vs {want}");
    }
    let grads = logp.sum_all().unwrap().backward().unwrap();
    for (name, var) in model.vars() {
        let g = grads
            .get(var)
            .unwrap_or_else(|| panic!("no gradient for {name}"));
        let norm: f32 = g.sqr().unwrap().sum_all().unwrap().to_scalar().unwrap();
        assert!(
            norm.is_finite() && norm > 0.0,
            "{name}: gradient norm² {norm}"
        );
    }
    // The frozen copy owns its weights: nothing of it is in the policy's gradient.
    for (name, var) in frozen.vars() {
        assert!(grads.get(var).is_none(), "frozen {name} got a gradient");
    }
}

#[test]
#[cfg_attr(
    not(rlx_assets),
    ignore = "needs the assets: run scripts/fetch-assets.sh"
)]
fn judge_puts_a_true_statement_above_a_false_one() {
    let (model, tok) = smollm2();
    let questions = vec![
        "Is Paris the capital of France?".to_string(),
        "Is the Pacific Ocean a desert in Africa?".to_string(),
    ];
    let p = judge::p_yes(model, tok, &questions, 2, &Device::Cpu).unwrap();
    let _ = writeln!(
        std::io::stderr(),
        "judge P(yes): true {:.4}, false {:.4}",
        p[0],
        p[1]
    );
    assert!(p.iter().all(|p| (0.0..=1.0).contains(p)));
    assert!(p[0] > p[1], "{p:?}");
    // Batched equals one at a time, whether one question is asked or both in batches of 1.
    let alone = judge::p_yes(model, tok, &questions[1..], 2, &Device::Cpu).unwrap();
    assert!((alone[0] - p[1]).abs() < 1e-3, "{alone:?} vs {p:?}");
    let singles = judge::p_yes(model, tok, &questions, 1, &Device::Cpu).unwrap();
    for (a, b) in singles.iter().zip(&p) {
        assert!((a - b).abs() < 1e-3, "{singles:?} vs {p:?}");
    }
    // The judge's answer is the tracked forward's: the no-grad view changes nothing.
    let ids = judge::judge_ids(tok, &questions[0]).unwrap();
    let x = Tensor::new(ids.as_slice(), &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let hidden = model.hidden(&x, 0, &[0], None).unwrap();
    let logits = model
        .logits(&hidden.narrow(1, ids.len() - 1, 1).unwrap())
        .unwrap();
    assert!(logits.track_op(), "the policy's own forward is recorded");
    let last: Vec<f32> = logits.flatten_all().unwrap().to_vec1().unwrap();
    let tracked = judge::YesNo::new(tok).unwrap().p_yes(&last);
    assert_eq!(tracked, singles[0]);
    let err = judge::p_yes(model, tok, &questions, 0, &Device::Cpu).unwrap_err();
    assert!(
        err.to_string().contains("batch size must be at least 1"),
        "{err}"
    );
    let yn = judge::YesNo::new(tok).unwrap();
    assert!(!yn.yes.is_empty() && !yn.no.is_empty());
}

// ---------------------------------------------------------------------------------------------------
// all-MiniLM-L6-v2.

fn minilm() -> &'static MiniLm {
    static CELL: OnceLock<Result<MiniLm, String>> = OnceLock::new();
    match CELL.get_or_init(|| MiniLm::load_default(&Device::Cpu).map_err(|e| e.to_string())) {
        Ok(m) => m,
        Err(e) => panic!("MiniLM does not load: {e}"),
    }
}

#[test]
#[cfg_attr(
    not(rlx_assets),
    ignore = "needs the assets: run scripts/fetch-assets.sh"
)]
fn minilm_similarities_match_the_reference() {
    let m = minilm();
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    // sentence-transformers' documented pair (0.7553) and the model card's two example sentences
    // (0.4046, measured with transformers' BertModel), in one padded batch.
    let e = m
        .embed(&s(&[
            "A man is eating food.",
            "A man is eating a piece of bread.",
            "This is an example sentence",
            "Each sentence is converted",
        ]))
        .unwrap();
    let c = cosine(&e[0], &e[1]);
    assert!((c - 0.7553).abs() < 5e-4, "{c}");
    let c = cosine(&e[2], &e[3]);
    assert!((c - 0.40456).abs() < 5e-4, "{c}");
    // The model card's published embedding of "This is an example sentence" starts so.
    let want = [
        0.067657, 0.063496, 0.048713, 0.079305, 0.037448, 0.002653, 0.039375, -0.007098,
    ];
    for (i, w) in want.iter().enumerate() {
        assert!((e[2][i] - w).abs() < 1e-4, "{i}: {} vs {w}", e[2][i]);
    }
    for v in &e {
        assert_eq!(v.len(), 384);
        let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5);
    }
    // Padding does not change an embedding: alone equals in the batch.
    let alone = m.embed(&s(&["Each sentence is converted"])).unwrap();
    for (a, b) in alone[0].iter().zip(&e[3]) {
        assert!((a - b).abs() < 1e-5);
    }
    // Truncation at 256 tokens (transformers: first values of a 400-word text's embedding).
    let long = vec!["word"; 400].join(" ");
    let e = m.embed(&[long]).unwrap();
    let want = [-0.008124, -0.095586, -0.038673, 0.049662];
    for (i, w) in want.iter().enumerate() {
        assert!((e[0][i] - w).abs() < 1e-4, "{i}: {} vs {w}", e[0][i]);
    }
    assert!(m.embed(&[]).unwrap().is_empty());
}
