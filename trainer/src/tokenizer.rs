//! The policy's tokenizer and its chat template, from either source a checkpoint comes in:
//!
//! - **GGUF** ([`ChatTokenizer::from_gguf_vocab`]): the GGUF stores a GPT-2 style byte-level BPE:
//!   `tokenizer.ggml.tokens` (the vocabulary, in byte-level form: a space is `Ġ`), `tokenizer.ggml.merges`
//!   (`"a b"` pairs, highest priority first), `tokenizer.ggml.token_type` (3 = control token such as
//!   `<|im_start|>`) and the special ids. SmolLM2's pre-tokenizer (`tokenizer.ggml.pre = "smollm"`) splits
//!   every digit on its own, then applies GPT-2's byte-level regex; this module builds exactly that
//!   pipeline with the `tokenizers` crate (as the JSON a `tokenizer.json` would hold, so every component
//!   is the library's own). Control tokens are special added tokens: written in text (`<|im_start|>`) they
//!   encode to their single id. The chat template is the GGUF's `tokenizer.chat_template`.
//! - **A Hugging Face checkpoint folder** ([`ChatTokenizer::from_hf_dir`]): `tokenizer.json`,
//!   `tokenizer_config.json` (special tokens, `add_bos_token`, the chat template unless
//!   `chat_template.jinja` holds it) and `generation_config.json` when present (the stop ids).
//!   [`ChatTokenizer::save_hf`] writes such a folder back.
//!
//! Chat prompts are rendered by the checkpoint's own Jinja template ([`ChatTemplate`], as transformers
//! renders it) and encoded without added special tokens, as transformers' `apply_chat_template(...,
//! tokenize=True)` does (`add_special_tokens=False`): a template that wants a BOS writes it.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::{Error, Result};
use rlx_compiler::files;
use serde_json::{json, Map, Value};
use tokenizers::Tokenizer;

use crate::chat_template::{ChatTemplate, Value as TemplateValue, SPECIAL_TOKEN_NAMES};

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
    /// `tokenizer.chat_template` (Jinja): the template [`ChatTokenizer::chat_prompt`] renders. Without
    /// one, chat prompts are an error (no format is guessed).
    pub chat_template: Option<String>,
}

/// Upper bound on `tokenizer.json` (the largest real ones are tens of MB).
pub const MAX_TOKENIZER_JSON_BYTES: u64 = 256 << 20;
/// Upper bound on `tokenizer_config.json`, `generation_config.json` and `chat_template.jinja`.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// A tokenizer with its special tokens, stop tokens and chat template.
pub struct ChatTokenizer {
    tokenizer: Tokenizer,
    /// The beginning-of-sequence token, when the checkpoint names one.
    pub bos: Option<u32>,
    /// The end-of-sequence token (`<|im_end|>` for SmolLM2, the end of a turn).
    pub eos: u32,
    /// Every token that ends a generation, sorted (see [`ChatTokenizer::stop_ids`]).
    stop: Vec<u32>,
    /// The id used to pad batches (masked out of attention, so any id works).
    pub pad: u32,
    vocab_size: usize,
    /// Whether [`ChatTokenizer::encode`] puts `bos` first (`add_bos_token` of a Hugging Face checkpoint).
    add_bos: bool,
    /// The named special tokens as text (`bos_token`, `eos_token`, …): what the chat template sees and
    /// what [`ChatTokenizer::save_hf`] writes.
    special_tokens: BTreeMap<String, String>,
    /// The chat template, or why there is none (the error of a chat prompt).
    template: std::result::Result<ChatTemplate, String>,
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
        let mut special_tokens = BTreeMap::new();
        for (name, id) in [
            ("bos_token", vocab.bos),
            ("eos_token", Some(vocab.eos)),
            ("pad_token", vocab.pad),
        ] {
            if let Some(id) = id {
                special_tokens.insert(name.to_string(), vocab.tokens[id as usize].clone());
            }
        }
        let template = match &vocab.chat_template {
            Some(source) => Ok(ChatTemplate::new(
                source,
                "the GGUF's tokenizer.chat_template",
                special_tokens.clone(),
            )
            .map_err(Error::Msg)?),
            None => Err(
                "the GGUF has no tokenizer.chat_template, so there is no chat format to \
                 render prompts with"
                    .to_string(),
            ),
        };
        Ok(ChatTokenizer {
            tokenizer,
            bos: vocab.bos,
            eos: vocab.eos,
            stop,
            pad: vocab.pad.unwrap_or(vocab.eos),
            vocab_size: n,
            add_bos: false,
            special_tokens,
            template,
        })
    }

    /// Builds the tokenizer of a Hugging Face checkpoint folder:
    ///
    /// - `tokenizer.json` (required): the `tokenizers` pipeline itself;
    /// - `tokenizer_config.json` (required): the named special tokens (`bos_token`, `eos_token`,
    ///   `pad_token`, …, each a string or an `{"content": …}` object), `add_bos_token`, and the chat
    ///   template `chat_template` (a string, or in older files a list of `{"name", "template"}` of which
    ///   the one named `default` is taken);
    /// - `chat_template.jinja` (optional): the chat template as newer transformers versions save it; it
    ///   takes precedence over `tokenizer_config.json`'s, as in transformers;
    /// - `generation_config.json` (optional): `eos_token_id` (an id or a list), `pad_token_id`,
    ///   `bos_token_id`.
    ///
    /// The **stop ids** are `generation_config.json`'s `eos_token_id`s together with the id of
    /// `tokenizer_config.json`'s `eos_token`, nothing else (no token is guessed from its text). `eos` is the
    /// `eos_token` (else the first `eos_token_id`), `pad` the `pad_token` (else `pad_token_id`, else
    /// `eos`), `bos` the `bos_token` (else `bos_token_id`). A missing chat template is an error only when a
    /// chat prompt is asked for. Every file is read through a size-capped reader; a missing, oversized or
    /// invalid file, or a special token that is not in the vocabulary, is an error naming the file.
    pub fn from_hf_dir(dir: &Path) -> Result<ChatTokenizer> {
        if !dir.is_dir() {
            candle_core::bail!("{} is not a directory", dir.display());
        }
        let tokenizer_path = dir.join("tokenizer.json");
        let text = read_text(&tokenizer_path, MAX_TOKENIZER_JSON_BYTES)?;
        let tokenizer: Tokenizer = text.parse().map_err(|e| {
            Error::Msg(format!(
                "{}: not a tokenizers tokenizer.json: {e}",
                tokenizer_path.display()
            ))
        })?;
        let vocab_size = tokenizer.get_vocab_size(true);
        let config_path = dir.join("tokenizer_config.json");
        let config = read_json_object(&config_path)?;
        let generation_path = dir.join("generation_config.json");
        let generation = if generation_path.exists() {
            Some(read_json_object(&generation_path)?)
        } else {
            None
        };

        let mut special_tokens = BTreeMap::new();
        for name in SPECIAL_TOKEN_NAMES {
            let text = match config.get(name) {
                None | Some(Value::Null) => continue,
                Some(Value::String(s)) => s.clone(),
                Some(Value::Object(o)) => match o.get("content") {
                    Some(Value::String(s)) => s.clone(),
                    _ => candle_core::bail!(
                        "{}: `{name}` is an object without a string `content`",
                        config_path.display()
                    ),
                },
                Some(other) => candle_core::bail!(
                    "{}: `{name}` is {other}, not a string or an {{\"content\": …}} object",
                    config_path.display()
                ),
            };
            special_tokens.insert(name.to_string(), text);
        }
        let token_id = |name: &str| -> Result<Option<u32>> {
            match special_tokens.get(name) {
                None => Ok(None),
                Some(text) => match tokenizer.token_to_id(text) {
                    Some(id) => Ok(Some(id)),
                    None => candle_core::bail!(
                        "{}: `{name}` {text:?} is not a token of {}",
                        config_path.display(),
                        tokenizer_path.display()
                    ),
                },
            }
        };
        let add_bos = match config.get("add_bos_token") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => candle_core::bail!(
                "{}: `add_bos_token` is {other}, not true or false",
                config_path.display()
            ),
        };
        let generation_ids = |key: &str| -> Result<Vec<u32>> {
            let Some(generation) = &generation else {
                return Ok(Vec::new());
            };
            let values: Vec<&Value> = match generation.get(key) {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(items)) => items.iter().collect(),
                Some(v) => vec![v],
            };
            values
                .into_iter()
                .map(|v| match v.as_u64() {
                    Some(id)
                        if id <= u32::MAX as u64 && tokenizer.id_to_token(id as u32).is_some() =>
                    {
                        Ok(id as u32)
                    }
                    Some(id) => Err(Error::Msg(format!(
                        "{}: `{key}` {id} is not a token of {}",
                        generation_path.display(),
                        tokenizer_path.display()
                    ))),
                    None => Err(Error::Msg(format!(
                        "{}: `{key}` holds {v}, not a token id",
                        generation_path.display()
                    ))),
                })
                .collect()
        };
        let eos_ids = generation_ids("eos_token_id")?;
        let eos = match (token_id("eos_token")?, eos_ids.first()) {
            (Some(id), _) => id,
            (None, Some(id)) => *id,
            (None, None) => candle_core::bail!(
                "{}: no end-of-sequence token: {} has no `eos_token` and there is no `eos_token_id` in {}",
                dir.display(),
                config_path.display(),
                generation_path.display()
            ),
        };
        let mut stop = eos_ids.clone();
        stop.push(eos);
        stop.sort_unstable();
        stop.dedup();
        let pad = match token_id("pad_token")? {
            Some(id) => id,
            None => generation_ids("pad_token_id")?
                .first()
                .copied()
                .unwrap_or(eos),
        };
        let bos = match token_id("bos_token")? {
            Some(id) => Some(id),
            None => generation_ids("bos_token_id")?.first().copied(),
        };
        for name in SPECIAL_TOKEN_NAMES {
            token_id(name)?;
        }
        if add_bos && bos.is_none() {
            candle_core::bail!(
                "{}: `add_bos_token` is true but there is no `bos_token`",
                config_path.display()
            );
        }

        let jinja_path = dir.join("chat_template.jinja");
        let (source, origin) = if jinja_path.exists() {
            (
                Some(read_text(&jinja_path, MAX_CONFIG_BYTES)?),
                jinja_path.display().to_string(),
            )
        } else {
            match config.get("chat_template") {
                None | Some(Value::Null) => (None, String::new()),
                Some(Value::String(s)) => (
                    Some(s.clone()),
                    format!("{} (`chat_template`)", config_path.display()),
                ),
                Some(Value::Array(named)) => {
                    let mut names = Vec::new();
                    let mut found = None;
                    for entry in named {
                        match (entry.get("name"), entry.get("template")) {
                            (Some(Value::String(name)), Some(Value::String(template))) => {
                                if name == "default" {
                                    found = Some(template.clone());
                                }
                                names.push(name.clone());
                            }
                            _ => candle_core::bail!(
                                "{}: `chat_template` lists {entry}, not a {{\"name\", \"template\"}} pair of strings",
                                config_path.display()
                            ),
                        }
                    }
                    match found {
                        Some(template) => (
                            Some(template),
                            format!("{} (`chat_template` \"default\")", config_path.display()),
                        ),
                        None => candle_core::bail!(
                            "{}: `chat_template` lists {names:?} but none named \"default\"",
                            config_path.display()
                        ),
                    }
                }
                Some(other) => candle_core::bail!(
                    "{}: `chat_template` is {other}, not a string or a list of named templates",
                    config_path.display()
                ),
            }
        };
        let template =
            match source {
                Some(source) => Ok(ChatTemplate::new(&source, &origin, special_tokens.clone())
                    .map_err(Error::Msg)?),
                None => Err(format!(
                    "{} has no chat template (no chat_template.jinja, no `chat_template` in \
                 tokenizer_config.json), so there is no chat format to render prompts with",
                    dir.display()
                )),
            };
        Ok(ChatTokenizer {
            tokenizer,
            bos,
            eos,
            stop,
            pad,
            vocab_size,
            add_bos,
            special_tokens,
            template,
        })
    }

    /// Writes the tokenizer as a Hugging Face checkpoint folder (created if missing) that
    /// `transformers.AutoTokenizer.from_pretrained(dir)` and [`ChatTokenizer::from_hf_dir`] load:
    /// `tokenizer.json`; `tokenizer_config.json` with the special tokens, `add_bos_token` and the chat
    /// template (`PreTrainedTokenizerFast`, so transformers needs no model-specific class); and
    /// `generation_config.json` with `bos_token_id`, `pad_token_id` and the stop ids as `eos_token_id`
    /// (a model exporter may write a fuller one over it). Since transformers takes a BOS only from
    /// `tokenizer.json`'s post-processor, a tokenizer that adds one gets a post-processor that does.
    pub fn save_hf(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::Msg(format!("creating {}: {e}", dir.display())))?;
        let mut tokenizer = self.tokenizer.clone();
        if let (true, Some(bos)) = (self.add_bos, self.bos) {
            let adds_bos = tokenizer
                .encode("a", true)
                .map(|e| e.get_ids().first() == Some(&bos))
                .unwrap_or(false);
            if !adds_bos {
                let text = self
                    .tokenizer
                    .id_to_token(bos)
                    .ok_or_else(|| Error::Msg(format!("bos id {bos} has no token")))?;
                let processor = tokenizers::processors::template::TemplateProcessing::builder()
                    .try_single(format!("{text}:0 $A:0"))
                    .and_then(|b| b.try_pair(format!("{text}:0 $A:0 {text}:1 $B:1")))
                    .map_err(|e| Error::Msg(format!("BOS post-processor: {e}")))?
                    .special_tokens(vec![(text.clone(), bos)])
                    .build()
                    .map_err(|e| Error::Msg(format!("BOS post-processor: {e}")))?;
                tokenizer.with_post_processor(Some(processor));
            }
        }
        let tokenizer_json = tokenizer
            .to_string(true)
            .map_err(|e| Error::Msg(format!("serializing tokenizer.json: {e}")))?;
        let mut config = Map::new();
        config.insert("tokenizer_class".into(), json!("PreTrainedTokenizerFast"));
        config.insert("clean_up_tokenization_spaces".into(), json!(false));
        for (name, text) in &self.special_tokens {
            config.insert(name.clone(), json!(text));
        }
        config.insert("add_bos_token".into(), json!(self.add_bos));
        if let Ok(template) = &self.template {
            config.insert("chat_template".into(), json!(template.source()));
        }
        let mut generation = Map::new();
        if let Some(bos) = self.bos {
            generation.insert("bos_token_id".into(), json!(bos));
        }
        generation.insert("eos_token_id".into(), json!(self.stop));
        generation.insert("pad_token_id".into(), json!(self.pad));
        for (name, bytes) in [
            ("tokenizer.json", tokenizer_json.into_bytes()),
            ("tokenizer_config.json", pretty(&config)?),
            ("generation_config.json", pretty(&generation)?),
        ] {
            let path = dir.join(name);
            files::write_output(&path, &bytes)
                .map_err(|e| Error::Msg(format!("writing {}: {e}", path.display())))?;
        }
        Ok(())
    }

    /// The tokens that end a generation, sorted. From a GGUF: `eos`, `eot` and `eom` from the metadata
    /// where present, and every token written as one of llama.cpp's end-of-generation markers
    /// ([`END_OF_GENERATION`]) — llama.cpp's rule for its `special_eog_ids`; SmolLM2: `<|endoftext|>` (0)
    /// and `<|im_end|>` (2). From a Hugging Face folder: `generation_config.json`'s `eos_token_id`s and
    /// `tokenizer_config.json`'s `eos_token`, nothing guessed ([`ChatTokenizer::from_hf_dir`]). The
    /// sampler stops a reply at the first of them.
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

    /// Token ids of `text`, special tokens added as a plain encode adds them: what `tokenizer.json`'s
    /// post-processor adds (transformers' `add_special_tokens=True`; Llama 3's adds `<|begin_of_text|>`),
    /// and `bos` first when the checkpoint's `add_bos_token` is true and the post-processor did not add
    /// it (transformers 5 ignores `add_bos_token` when there is a tokenizer.json; 4.x honoured it). Control
    /// tokens written in the text (`<|im_start|>`) become their ids. The GGUF tokenizer adds nothing
    /// (SmolLM2's `add_bos_token` is false). For a rendered chat prompt use
    /// [`ChatTokenizer::encode_chat`].
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = self.encode_with(text, true)?;
        if let (true, Some(bos)) = (self.add_bos, self.bos) {
            let added_bos =
                ids.first() == Some(&bos) && ids.len() > self.encode_with(text, false)?.len();
            if !added_bos {
                ids.insert(0, bos);
            }
        }
        Ok(ids)
    }

    /// Token ids of a rendered chat prompt: nothing added (the template writes any BOS), as transformers'
    /// `apply_chat_template(..., tokenize=True)` encodes with `add_special_tokens=False`.
    pub fn encode_chat(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_with(text, false)
    }

    fn encode_with(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let encoding = self
            .tokenizer
            .encode(text, add_special_tokens)
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

    /// The chat template, or why there is none.
    pub fn chat_template(&self) -> std::result::Result<&ChatTemplate, &str> {
        self.template.as_ref().map_err(|e| e.as_str())
    }

    /// The same tokenizer with `template` as its chat template.
    pub fn with_chat_template(mut self, template: ChatTemplate) -> ChatTokenizer {
        self.template = Ok(template);
        self
    }

    /// The named special tokens as text (`bos_token`, `eos_token`, `pad_token`, …).
    pub fn special_tokens(&self) -> &BTreeMap<String, String> {
        &self.special_tokens
    }

    /// Whether [`ChatTokenizer::encode`] puts the BOS first (`add_bos_token`).
    pub fn adds_bos(&self) -> bool {
        self.add_bos
    }

    /// The text of `messages` rendered by the checkpoint's chat template, with the assistant's header
    /// after them when `add_generation_prompt`. An error when the checkpoint has no template or the
    /// template fails (its message names where the template came from).
    pub fn chat_prompt(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        self.chat_prompt_with(messages, add_generation_prompt, &[])
    }

    /// [`ChatTokenizer::chat_prompt`] with extra template variables (`("enable_thinking",
    /// TemplateValue::from(false))`), see [`ChatTemplate::render_with`].
    pub fn chat_prompt_with(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        kwargs: &[(&str, TemplateValue)],
    ) -> Result<String> {
        let template = self.template.as_ref().map_err(|e| Error::Msg(e.clone()))?;
        template
            .render_with(messages, add_generation_prompt, kwargs)
            .map_err(Error::Msg)
    }

    /// The ids of `messages` as a chat prompt ([`ChatTokenizer::chat_prompt`], then
    /// [`ChatTokenizer::encode_chat`]).
    pub fn chat_prompt_ids(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>> {
        self.encode_chat(&self.chat_prompt(messages, add_generation_prompt)?)
    }

    /// The ids of a one-turn chat (`user` message, generation prompt added), ready to sample a reply.
    pub fn chat_ids(&self, user: &str) -> Result<Vec<u32>> {
        self.chat_prompt_ids(&[Message::new("user", user)], true)
    }
}

/// A file through the size-capped reader, as UTF-8; errors name the file.
fn read_text(path: &Path, limit: u64) -> Result<String> {
    files::read_text(path, limit).map_err(|e| Error::Msg(format!("{}: {e}", path.display())))
}

/// A JSON object file; errors name the file.
fn read_json_object(path: &Path) -> Result<Map<String, Value>> {
    let text = read_text(path, MAX_CONFIG_BYTES)?;
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => candle_core::bail!("{}: not a JSON object", path.display()),
        Err(e) => candle_core::bail!("{}: invalid JSON: {e}", path.display()),
    }
}

fn pretty(map: &Map<String, Value>) -> Result<Vec<u8>> {
    let mut bytes =
        serde_json::to_vec_pretty(map).map_err(|e| Error::Msg(format!("serializing JSON: {e}")))?;
    bytes.push(b'\n');
    Ok(bytes)
}
