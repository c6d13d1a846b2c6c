//! Text checks: `regex`, `contains`, `length`.

use std::sync::OnceLock;

use regex::{Regex, RegexBuilder};
use serde::Deserialize;

/// Regexes from configs are compiled with this size limit (bytes of compiled program), so a hostile
/// pattern is an error rather than a memory blow-up. The `regex` crate matches in linear time.
pub const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// Compiles a pattern from a config (Rust `regex` syntax: no look-around, no back-references).
pub fn compile_regex(pattern: &str, case_insensitive: bool) -> Result<Regex, String> {
    RegexBuilder::new(pattern)
        .case_insensitive(case_insensitive)
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| format!("invalid regex `{pattern}`: {e}"))
}

/// Number of words as IFEval counts them: maximal runs of `\w` (Unicode letters, digits, `_`).
pub fn count_words(text: &str) -> usize {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| Regex::new(r"\w+").expect("word regex"))
        .find_iter(text)
        .count()
}

/// Number of characters (Unicode scalar values).
pub fn count_chars(text: &str) -> usize {
    text.chars().count()
}

/// How `contains` combines its keywords.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// True when at least one keyword occurs.
    #[default]
    Any,
    /// True when every keyword occurs.
    All,
    /// True when no keyword occurs.
    None,
}

/// A compiled `contains` check.
#[derive(Clone, Debug)]
pub struct Contains {
    res: Vec<Regex>,
    mode: Mode,
}

impl Contains {
    /// `keywords` are literal strings; `whole_word` requires a word boundary (`\b`) on both sides.
    pub fn new(
        keywords: &[String],
        mode: Mode,
        case_sensitive: bool,
        whole_word: bool,
    ) -> Result<Contains, String> {
        if keywords.is_empty() {
            return Err("`keywords` is empty".to_string());
        }
        let mut res = Vec::with_capacity(keywords.len());
        for k in keywords {
            if k.is_empty() {
                return Err("`keywords` contains an empty string".to_string());
            }
            let lit = regex::escape(k);
            let pat = if whole_word {
                format!(r"\b{lit}\b")
            } else {
                lit
            };
            res.push(compile_regex(&pat, !case_sensitive)?);
        }
        Ok(Contains { res, mode })
    }

    pub fn check(&self, text: &str) -> bool {
        match self.mode {
            Mode::Any => self.res.iter().any(|r| r.is_match(text)),
            Mode::All => self.res.iter().all(|r| r.is_match(text)),
            Mode::None => !self.res.iter().any(|r| r.is_match(text)),
        }
    }
}

/// What `length` measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// [`count_words`].
    Words,
    /// [`count_chars`].
    Chars,
    /// The completion's generated token count, as the caller reports it.
    Tokens,
}

/// The measured length of a completion.
pub fn measure(text: &str, tokens: usize, unit: Unit) -> usize {
    match unit {
        Unit::Words => count_words(text),
        Unit::Chars => count_chars(text),
        Unit::Tokens => tokens,
    }
}

/// `min ≤ value ≤ max`, each bound optional and inclusive.
pub fn within(value: usize, min: Option<u64>, max: Option<u64>) -> bool {
    let v = value as u64;
    min.is_none_or(|m| v >= m) && max.is_none_or(|m| v <= m)
}

/// A writing system, as far as [`script_of`] tells them apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Script {
    Latin,
    Greek,
    Cyrillic,
    Armenian,
    Hebrew,
    Arabic,
    /// One of the Indic blocks U+0900–U+0DFF, by block (Devanagari = 0, Bengali = 1, …, Sinhala = 9).
    Indic(u8),
    Thai,
    Georgian,
    Hangul,
    /// Han ideographs and Japanese kana together (Chinese and Japanese are not told apart).
    Cjk,
    /// Any other letter.
    Other,
}

/// The script of a letter (`None` for a character that is not alphabetic).
pub fn script_of(c: char) -> Option<Script> {
    if !c.is_alphabetic() {
        return None;
    }
    let u = c as u32;
    Some(match u {
        0x41..=0x5A | 0x61..=0x7A | 0xC0..=0x24F | 0x1E00..=0x1EFF => Script::Latin,
        0x370..=0x3FF | 0x1F00..=0x1FFF => Script::Greek,
        0x400..=0x52F => Script::Cyrillic,
        0x530..=0x58F => Script::Armenian,
        0x590..=0x5FF => Script::Hebrew,
        0x600..=0x6FF | 0x750..=0x77F | 0x8A0..=0x8FF | 0xFB50..=0xFDFF | 0xFE70..=0xFEFF => {
            Script::Arabic
        }
        0x900..=0xDFF => Script::Indic(((u - 0x900) / 0x80) as u8),
        0xE00..=0xE7F => Script::Thai,
        0x10A0..=0x10FF => Script::Georgian,
        0x1100..=0x11FF | 0x3130..=0x318F | 0xAC00..=0xD7AF => Script::Hangul,
        0x3040..=0x30FF
        | 0x3400..=0x4DBF
        | 0x4E00..=0x9FFF
        | 0xF900..=0xFAFF
        | 0x20000..=0x2FFFF => Script::Cjk,
        _ => Script::Other,
    })
}

/// The script most letters of `text` are written in (ties go to the earlier [`Script`]); `None` when
/// the text has no letter.
pub fn dominant_script(text: &str) -> Option<Script> {
    let mut counts: std::collections::BTreeMap<Script, usize> = std::collections::BTreeMap::new();
    for s in text.chars().filter_map(script_of) {
        *counts.entry(s).or_default() += 1;
    }
    let mut best: Option<(Script, usize)> = None;
    for (s, n) in counts {
        if best.is_none_or(|(_, m)| n > m) {
            best = Some((s, n));
        }
    }
    best.map(|(s, _)| s)
}

/// `wrong_script`: the completion is mostly written in another script than the prompt's last user
/// message. A completion or prompt without letters is never wrong.
pub fn wrong_script(prompt: &str, completion: &str) -> bool {
    match (dominant_script(prompt), dominant_script(completion)) {
        (Some(p), Some(c)) => p != c,
        _ => false,
    }
}
