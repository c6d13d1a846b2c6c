//! The SmolLM2 tokenizer, built in Rust from GGUF metadata (no tokenizer.json download), and its chat
//! template.
//!
//! The GGUF stores a GPT-2 style byte-level BPE: `tokenizer.ggml.tokens` (the vocabulary, in byte-level
//! form: a space is `Ġ`), `tokenizer.ggml.merges` (`"a b"` pairs, highest priority first),
//! `tokenizer.ggml.token_type` (3 = control token such as `<|im_start|>`) and the special ids. SmolLM2's
//! pre-tokenizer (`tokenizer.ggml.pre = "smollm"`) splits every digit on its own, then applies GPT-2's
//! byte-level regex; this module builds exactly that pipeline with the `tokenizers` crate (as the JSON a
//! `tokenizer.json` would hold, so every component is the library's own). Control tokens are special added
//! tokens: written in text (`<|im_start|>`) they encode to their single id.

use candle_core::{Error, Result};
use serde_json::{json, Map, Value};
use tokenizers::Tokenizer;

/// GGUF `tokenizer.ggml.token_type` of a control token (llama.cpp's `LLAMA_TOKEN_TYPE_CONTROL`).
const CONTROL: i32 = 3;
/// GGUF token type of a user-defined token (also matched as a whole in text).
const USER_DEFINED: i32 = 4;

/// Texts of tokens that end a generation wherever they appear in a vocabulary: the list llama.cpp's
/// vocabulary loader matches to fill its end-of-generation set (`special_eog_ids`, `llama-vocab.cpp`).
pub const END_OF_GENERATION: [&str; 12] = [
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
];

/// The default system prompt of SmolLM2's chat template (used when the conversation has none).
pub const SMOLLM2_SYSTEM: &str =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

/// One chat message.
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// The tokenizer metadata of a GGUF file.
#[derive(Clone, Debug)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model` (only `gpt2`, byte-level BPE, is supported).
    pub model: String,
    /// `tokenizer.ggml.pre` (`smollm`, or `default`/`gpt2` for plain GPT-2 splitting).
    pub pre: String,
    pub tokens: Vec<String>,
    pub token_types: Vec<i32>,
    pub merges: Vec<String>,
    pub bos: Option<u32>,
    pub eos: u32,
    /// `tokenizer.ggml.eot_token_id` (end of turn), when the file has one.
    pub eot: Option<u32>,
    /// `tokenizer.ggml.eom_token_id` (end of message), when the file has one.
    pub eom: Option<u32>,
    pub pad: Option<u32>,
    /// `tokenizer.chat_template` (Jinja), kept for the record; [`ChatTokenizer::chat_prompt`] implements
    /// the ChatML template SmolLM2 uses.
    pub chat_template: Option<String>,
}

/// A byte-level BPE tokenizer with the ChatML chat template (`<|im_start|>role\n…<|im_end|>\n`).
pub struct ChatTokenizer {
    tokenizer: Tokenizer,
    pub bos: Option<u32>,
    /// `tokenizer.ggml.eos_token_id` (`<|im_end|>` for SmolLM2), the end of a turn.
    pub eos: u32,
    /// Every token that ends a generation, sorted (see [`ChatTokenizer::stop_ids`]).
    stop: Vec<u32>,
    /// The id used to pad batches (masked out of attention, so any id works).
    pub pad: u32,
    vocab_size: usize,
}

impl ChatTokenizer {
    /// Builds the tokenizer from GGUF tokenizer metadata. Errors name what is wrong (unsupported model or
    /// pre-tokenizer, malformed merge, out-of-range special id, a duplicated token).
    pub fn from_gguf_vocab(vocab: &GgufVocab) -> Result<ChatTokenizer> {
        if vocab.model != "gpt2" {
            candle_core::bail!(
                "tokenizer.ggml.model `{}` is not supported (only `gpt2`, byte-level BPE)",
                vocab.model
            );
        }
        let n = vocab.tokens.len();
        if n == 0 {
            candle_core::bail!("tokenizer.ggml.tokens is empty");
        }
        if !vocab.token_types.is_empty() && vocab.token_types.len() != n {
            candle_core::bail!(
                "tokenizer.ggml.token_type has {} entries for {} tokens",
                vocab.token_types.len(),
                n
            );
        }
        for (what, id) in [
            ("bos", vocab.bos),
            ("eos", Some(vocab.eos)),
            ("eot", vocab.eot),
            ("eom", vocab.eom),
            ("pad", vocab.pad),
        ] {
            if let Some(id) = id {
                if id as usize >= n {
                    candle_core::bail!(
                        "tokenizer.ggml.{what}_token_id {id} is outside the {n} tokens"
                    );
                }
            }
        }
        let mut vocab_map = Map::with_capacity(n);
        for (id, token) in vocab.tokens.iter().enumerate() {
            if vocab_map.insert(token.clone(), json!(id)).is_some() {
                candle_core::bail!("tokenizer.ggml.tokens: token {token:?} appears twice");
            }
        }
        let mut merges = Vec::with_capacity(vocab.merges.len());
        for (i, merge) in vocab.merges.iter().enumerate() {
            match merge.split_once(' ') {
                Some((a, b)) if !a.is_empty() && !b.is_empty() => merges.push(json!([a, b])),
                _ => candle_core::bail!("tokenizer.ggml.merges[{i}] = {merge:?} is not `a b`"),
            }
        }
        let added: Vec<Value> = vocab
            .token_types
            .iter()
            .enumerate()
            .filter(|(_, t)| **t == CONTROL || **t == USER_DEFINED)
            .map(|(id, t)| {
                json!({
                    "id": id, "content": vocab.tokens[id], "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": *t == CONTROL,
                })
            })
            .collect();
        let byte_level = json!({
            "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true
        });
        let pre_tokenizer = match vocab.pre.as_str() {
            // llama.cpp's LLAMA_VOCAB_PRE_TYPE_SMOLLM: `\p{N}` then the GPT-2 regex; HF's SmolLM2
            // tokenizer.json: Digits(individual) then ByteLevel.
            "smollm" => json!({
                "type": "Sequence",
                "pretokenizers": [{"type": "Digits", "individual_digits": true}, byte_level],
            }),
            "default" | "gpt2" | "gpt-2" => byte_level.clone(),
            other => candle_core::bail!(
                "tokenizer.ggml.pre `{other}` is not supported (supported: smollm, gpt2, default)"
            ),
        };
        let spec = json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": pre_tokenizer,
            "post_processor": null,
            "decoder": byte_level,
            "model": {
                "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                "ignore_merges": false, "vocab": vocab_map, "merges": merges,
            },
        });
        let tokenizer: Tokenizer = spec.to_string().parse().map_err(|e| {
            Error::Msg(format!(
                "building the BPE tokenizer from GGUF metadata: {e}"
            ))
        })?;
        let mut stop: Vec<u32> = [Some(vocab.eos), vocab.eot, vocab.eom]
            .into_iter()
            .flatten()
            .chain(
                vocab
                    .tokens
                    .iter()
                    .enumerate()
                    .filter(|(_, text)| END_OF_GENERATION.contains(&text.as_str()))
                    .map(|(id, _)| id as u32),
            )
            .collect();
        stop.sort_unstable();
        stop.dedup();
        Ok(ChatTokenizer {
            tokenizer,
            bos: vocab.bos,
            eos: vocab.eos,
            stop,
            pad: vocab.pad.unwrap_or(vocab.eos),
            vocab_size: n,
        })
    }

    /// The tokens that end a generation, sorted: `eos`, `eot` and `eom` from the metadata where present,
    /// and every token written as one of llama.cpp's end-of-generation markers ([`END_OF_GENERATION`]) —
    /// llama.cpp's rule for its `special_eog_ids`. SmolLM2: `<|endoftext|>` (0)
    /// and `<|im_end|>` (2). The sampler stops a reply at the first of them.
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop
    }

    /// The underlying `tokenizers` tokenizer (e.g. to save it as tokenizer.json).
    pub fn inner(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Token ids of `text`; control tokens written in the text (`<|im_start|>`) become their ids. No BOS is
    /// added (SmolLM2's `add_bos_token` is false; the chat template starts with `<|im_start|>`).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| Error::Msg(format!("tokenizing {text:?}: {e}")))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Text of `ids`; with `skip_special`, control tokens are left out.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        if let Some(bad) = ids.iter().find(|id| **id as usize >= self.vocab_size) {
            candle_core::bail!(
                "token id {bad} is outside the vocabulary of {}",
                self.vocab_size
            );
        }
        self.tokenizer
            .decode(ids, skip_special)
            .map_err(|e| Error::Msg(format!("decoding {} ids: {e}", ids.len())))
    }

    /// The id of a token given in its vocabulary form (byte-level: `Ġyes` is " yes").
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    /// The id of `text` when it encodes to exactly one token.
    pub fn single_token(&self, text: &str) -> Result<u32> {
        match self.encode(text)?.as_slice() {
            [id] => Ok(*id),
            ids => candle_core::bail!("{text:?} is {} tokens, not one: {ids:?}", ids.len()),
        }
    }

    /// SmolLM2's chat template (ChatML): when the first message is not a system message, the default
    /// system prompt [`SMOLLM2_SYSTEM`] comes first; each message is `<|im_start|>{role}\n{content}<|im_end|>\n`;
    /// with `add_generation_prompt`, `<|im_start|>assistant\n` follows.
    pub fn chat_prompt(messages: &[Message], add_generation_prompt: bool) -> String {
        let mut out = String::new();
        if messages.first().is_some_and(|m| m.role != "system") {
            out.push_str(&format!("<|im_start|>system\n{SMOLLM2_SYSTEM}<|im_end|>\n"));
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

    /// The ids of a one-turn chat (`user` message, generation prompt added), ready to sample a reply.
    pub fn chat_ids(&self, user: &str) -> Result<Vec<u32>> {
        self.encode(&Self::chat_prompt(&[Message::new("user", user)], true))
    }
}
