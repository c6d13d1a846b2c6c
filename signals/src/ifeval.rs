//! IFEval instruction checks (Zhou et al. 2023, "Instruction-Following Evaluation for Large Language
//! Models"), ported from the reference implementation shipped in `llm-eval-framework==0.1.0`
//! (`eval_framework/tasks/ifeval/instructions.py`, Google Research, Apache-2.0).
//!
//! Instructions are named by their IFEval id (`punctuation:no_comma`) and take IFEval's kwargs
//! (`{"relation": "at least", "num_words": 300}`). Every check follows the Python `check_following`
//! exactly, except where noted on the variant (sentence counting and capital-word tokenisation use
//! rule-based splitters instead of NLTK models; the English-language part of the case checks is not
//! tested). `language:response_language` (needs a language detector) is unsupported: constructing it
//! returns [`IfevalError::Unsupported`].

use std::collections::HashMap;
use std::fmt;
use std::sync::OnceLock;

use regex::Regex;
use serde_json::{Map, Value};

use crate::text::{compile_regex, count_words};

/// `less than` / `at least`, IFEval's two comparison relations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Relation {
    LessThan,
    AtLeast,
}

impl Relation {
    fn holds(self, value: usize, threshold: u64) -> bool {
        let v = value as u64;
        match self {
            Relation::LessThan => v < threshold,
            Relation::AtLeast => v >= threshold,
        }
    }
}

/// One IFEval instruction with its arguments. Construct with [`Instruction::from_id`].
#[derive(Clone, Debug)]
pub enum Instruction {
    /// `punctuation:no_comma`: no `,` anywhere.
    NoComma,
    /// `length_constraints:number_words`: `\w+` runs, compared with `num_words`.
    NumberWords { relation: Relation, num_words: u64 },
    /// `length_constraints:number_sentences`: sentences ([`split_into_sentences`]).
    NumberSentences {
        relation: Relation,
        num_sentences: u64,
    },
    /// `length_constraints:number_paragraphs`: exactly `num_paragraphs` paragraphs divided by `***`
    /// (an empty paragraph between two dividers fails; empty ones at either end are not counted).
    NumberParagraphs { num_paragraphs: u64 },
    /// `length_constraints:nth_paragraph_first_word`: exactly `num_paragraphs` paragraphs divided by a
    /// blank line (`\n\n`), and paragraph `nth_paragraph` (1-based) starts with `first_word`
    /// (lowercase, leading quotes and everything from the first `. , ? ! ' "` removed).
    NthParagraphFirstWord {
        num_paragraphs: u64,
        nth_paragraph: u64,
        first_word: String,
    },
    /// `detectable_format:number_bullet_lists`: exactly `num_bullets` lines starting with `* ` or `-`.
    NumberBulletLists { num_bullets: u64 },
    /// `detectable_format:number_highlighted_sections`: at least `num_highlights` `*text*` spans
    /// (a `**text**` span counts twice, as in IFEval).
    NumberHighlightedSections { num_highlights: u64 },
    /// `detectable_format:multiple_sections`: at least `num_sections` section headers
    /// `SPLITTER N` (e.g. `Section 2`).
    MultipleSections { splitter: Regex, num_sections: u64 },
    /// `detectable_format:json_format`: the whole response (trimmed, an optional code fence
    /// ```` ```json ```` … ```` ``` ```` removed) parses as JSON.
    JsonFormat,
    /// `detectable_format:title`: contains a non-empty `<<title>>` on one line.
    Title,
    /// `detectable_format:constrained_response`: contains "My answer is yes.", "My answer is no." or
    /// "My answer is maybe.".
    ConstrainedResponse,
    /// `detectable_content:number_placeholders`: at least `num_placeholders` `[…]` spans.
    NumberPlaceholders { num_placeholders: u64 },
    /// `detectable_content:postscript`: a line (lowercased) containing the marker (`P.S.`, `P.P.S`, …).
    Postscript { pattern: Regex },
    /// `keywords:existence`: every keyword occurs (case-insensitive, as a substring).
    KeywordsExistence { keywords: Vec<Regex> },
    /// `keywords:frequency`: the keyword's case-insensitive occurrences compared with `frequency`.
    KeywordFrequency {
        keyword: Regex,
        frequency: u64,
        relation: Relation,
    },
    /// `keywords:forbidden_words`: no forbidden word occurs as a whole word (case-insensitive).
    ForbiddenWords { words: Vec<Regex> },
    /// `keywords:letter_frequency`: occurrences of `letter` (case-insensitive) compared with
    /// `let_frequency`. IFEval replaces a `letter` outside a–z by a random letter (two rows of its data
    /// ask for `#` and `!`); here the given character is counted, as the prompt asks.
    LetterFrequency {
        letter: char,
        let_frequency: u64,
        let_relation: Relation,
    },
    /// `change_case:english_lowercase`: Python `str.islower()` (the English check is not made).
    EnglishLowercase,
    /// `change_case:english_capital`: Python `str.isupper()` (the English check is not made).
    EnglishCapital,
    /// `change_case:capital_word_frequency`: words written in capitals compared with
    /// `capital_frequency`.
    CapitalWordFrequency {
        capital_frequency: u64,
        capital_relation: Relation,
    },
    /// `startend:end_checker`: the response (trimmed, outer `"` removed, lowercased) ends with
    /// `end_phrase` (trimmed, lowercased).
    EndChecker { end_phrase: String },
    /// `startend:quotation`: the trimmed response is wrapped in double quotes.
    Quotation,
    /// `combination:repeat_prompt`: the response starts with `prompt_to_repeat` (case-insensitive).
    RepeatPrompt { prompt_to_repeat: String },
    /// `combination:two_responses`: exactly two different non-empty responses separated by `******`.
    TwoResponses,
}

/// Why an instruction cannot be built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IfevalError {
    /// The id is a known IFEval id this crate does not check (or an unknown id).
    Unsupported(String),
    /// The id is supported but its kwargs are wrong.
    Invalid(String),
}

impl fmt::Display for IfevalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IfevalError::Unsupported(id) => {
                write!(f, "unsupported IFEval instruction `{id}`")?;
                if !SUPPORTED.contains(&id.as_str()) && !UNSUPPORTED.contains(&id.as_str()) {
                    write!(f, " (not an IFEval id)")?;
                }
                Ok(())
            }
            IfevalError::Invalid(m) => f.write_str(m),
        }
    }
}

/// The IFEval ids this crate checks.
pub const SUPPORTED: &[&str] = &[
    "punctuation:no_comma",
    "length_constraints:number_words",
    "length_constraints:number_sentences",
    "length_constraints:number_paragraphs",
    "length_constraints:nth_paragraph_first_word",
    "detectable_format:number_bullet_lists",
    "detectable_format:number_highlighted_sections",
    "detectable_format:multiple_sections",
    "detectable_format:json_format",
    "detectable_format:title",
    "detectable_format:constrained_response",
    "detectable_content:number_placeholders",
    "detectable_content:postscript",
    "keywords:existence",
    "keywords:frequency",
    "keywords:forbidden_words",
    "keywords:letter_frequency",
    "change_case:english_lowercase",
    "change_case:english_capital",
    "change_case:capital_word_frequency",
    "startend:end_checker",
    "startend:quotation",
    "combination:repeat_prompt",
    "combination:two_responses",
];

/// IFEval ids that exist but are not checked here, with the reason.
pub const UNSUPPORTED: &[&str] = &["language:response_language"];

/// The constrained-response options of IFEval.
pub const CONSTRAINED_RESPONSE_OPTIONS: [&str; 3] = [
    "My answer is yes.",
    "My answer is no.",
    "My answer is maybe.",
];

struct Args<'a> {
    id: &'a str,
    map: HashMap<&'a str, &'a Value>,
    allowed: &'static [&'static str],
}

impl<'a> Args<'a> {
    fn new(
        id: &'a str,
        kwargs: &'a Map<String, Value>,
        allowed: &'static [&'static str],
    ) -> Result<Args<'a>, IfevalError> {
        let mut map = HashMap::new();
        for (k, v) in kwargs {
            if v.is_null() {
                continue;
            }
            if !allowed.contains(&k.as_str()) {
                let expected = if allowed.is_empty() {
                    "it takes no arguments".to_string()
                } else {
                    format!("expected one of {}", list(allowed))
                };
                return Err(IfevalError::Invalid(format!(
                    "`{id}`: unknown argument `{k}`; {expected}"
                )));
            }
            map.insert(k.as_str(), v);
        }
        Ok(Args { id, map, allowed })
    }

    fn get(&self, key: &str) -> Result<&'a Value, IfevalError> {
        debug_assert!(self.allowed.contains(&key));
        self.map
            .get(key)
            .copied()
            .ok_or_else(|| IfevalError::Invalid(format!("`{}`: missing argument `{key}`", self.id)))
    }

    fn count(&self, key: &str) -> Result<u64, IfevalError> {
        let v = self.get(key)?;
        v.as_u64().ok_or_else(|| {
            IfevalError::Invalid(format!(
                "`{}`: argument `{key}` must be a non-negative integer, got {v}",
                self.id
            ))
        })
    }

    fn string(&self, key: &str) -> Result<String, IfevalError> {
        let v = self.get(key)?;
        v.as_str().map(str::to_string).ok_or_else(|| {
            IfevalError::Invalid(format!(
                "`{}`: argument `{key}` must be a string, got {v}",
                self.id
            ))
        })
    }

    fn strings(&self, key: &str) -> Result<Vec<String>, IfevalError> {
        let v = self.get(key)?;
        let bad = || {
            IfevalError::Invalid(format!(
                "`{}`: argument `{key}` must be a list of strings, got {v}",
                self.id
            ))
        };
        v.as_array()
            .ok_or_else(bad)?
            .iter()
            .map(|x| x.as_str().map(str::to_string).ok_or_else(bad))
            .collect()
    }

    fn relation(&self, key: &str) -> Result<Relation, IfevalError> {
        match self.string(key)?.as_str() {
            "less than" => Ok(Relation::LessThan),
            "at least" => Ok(Relation::AtLeast),
            other => Err(IfevalError::Invalid(format!(
                "`{}`: argument `{key}` must be \"less than\" or \"at least\", got \"{other}\"",
                self.id
            ))),
        }
    }
}

fn list(items: &[&str]) -> String {
    items
        .iter()
        .map(|s| format!("`{s}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn regex_ci(pattern: &str) -> Result<Regex, IfevalError> {
    compile_regex(pattern, true).map_err(IfevalError::Invalid)
}

impl Instruction {
    /// Builds the instruction `id` from IFEval kwargs (`null` values are ignored, as absent).
    /// Unknown or missing arguments and wrong types are [`IfevalError::Invalid`]; ids not checked by
    /// this crate are [`IfevalError::Unsupported`].
    pub fn from_id(id: &str, kwargs: &Map<String, Value>) -> Result<Instruction, IfevalError> {
        use Instruction as I;
        let a = |allowed: &'static [&'static str]| Args::new(id, kwargs, allowed);
        Ok(match id {
            "punctuation:no_comma" => {
                a(&[])?;
                I::NoComma
            }
            "length_constraints:number_words" => {
                let a = a(&["relation", "num_words"])?;
                I::NumberWords {
                    relation: a.relation("relation")?,
                    num_words: a.count("num_words")?,
                }
            }
            "length_constraints:number_sentences" => {
                let a = a(&["relation", "num_sentences"])?;
                I::NumberSentences {
                    relation: a.relation("relation")?,
                    num_sentences: a.count("num_sentences")?,
                }
            }
            "length_constraints:number_paragraphs" => {
                let a = a(&["num_paragraphs"])?;
                I::NumberParagraphs {
                    num_paragraphs: a.count("num_paragraphs")?,
                }
            }
            "length_constraints:nth_paragraph_first_word" => {
                let a = a(&["num_paragraphs", "nth_paragraph", "first_word"])?;
                let nth_paragraph = a.count("nth_paragraph")?;
                if nth_paragraph == 0 {
                    return Err(IfevalError::Invalid(format!(
                        "`{id}`: `nth_paragraph` counts from 1, got 0"
                    )));
                }
                I::NthParagraphFirstWord {
                    num_paragraphs: a.count("num_paragraphs")?,
                    nth_paragraph,
                    first_word: a.string("first_word")?.to_lowercase(),
                }
            }
            "detectable_format:number_bullet_lists" => {
                let a = a(&["num_bullets"])?;
                I::NumberBulletLists {
                    num_bullets: a.count("num_bullets")?,
                }
            }
            "detectable_format:number_highlighted_sections" => {
                let a = a(&["num_highlights"])?;
                I::NumberHighlightedSections {
                    num_highlights: a.count("num_highlights")?,
                }
            }
            "detectable_format:multiple_sections" => {
                let a = a(&["section_spliter", "num_sections"])?;
                let s = a.string("section_spliter")?;
                let s = s.trim();
                if s.is_empty() {
                    return Err(IfevalError::Invalid(format!(
                        "`{id}`: `section_spliter` is empty"
                    )));
                }
                let splitter = compile_regex(&format!(r"\s?{}\s?\d+\s?", regex::escape(s)), false)
                    .map_err(IfevalError::Invalid)?;
                I::MultipleSections {
                    splitter,
                    num_sections: a.count("num_sections")?,
                }
            }
            "detectable_format:json_format" => {
                a(&[])?;
                I::JsonFormat
            }
            "detectable_format:title" => {
                a(&[])?;
                I::Title
            }
            "detectable_format:constrained_response" => {
                a(&[])?;
                I::ConstrainedResponse
            }
            "detectable_content:number_placeholders" => {
                let a = a(&["num_placeholders"])?;
                I::NumberPlaceholders {
                    num_placeholders: a.count("num_placeholders")?,
                }
            }
            "detectable_content:postscript" => {
                let a = a(&["postscript_marker"])?;
                let marker = a.string("postscript_marker")?;
                let marker = marker.trim();
                if marker.is_empty() {
                    return Err(IfevalError::Invalid(format!(
                        "`{id}`: `postscript_marker` is empty"
                    )));
                }
                // IFEval's special cases, then the marker itself (IFEval interpolates it unescaped;
                // here it is a literal).
                let pat = match marker {
                    "P.P.S" => r"(?m)\s*p\.\s?p\.\s?s.*$".to_string(),
                    "P.S." => r"(?m)\s*p\.\s?s\..*$".to_string(),
                    m => format!(r"(?m)\s*{}.*$", regex::escape(&m.to_lowercase())),
                };
                I::Postscript {
                    pattern: compile_regex(&pat, false).map_err(IfevalError::Invalid)?,
                }
            }
            "keywords:existence" => {
                let a = a(&["keywords"])?;
                let keywords = a
                    .strings("keywords")?
                    .iter()
                    .map(|k| regex_ci(&regex::escape(k)))
                    .collect::<Result<_, _>>()?;
                I::KeywordsExistence { keywords }
            }
            "keywords:frequency" => {
                let a = a(&["keyword", "frequency", "relation"])?;
                let k = a.string("keyword")?;
                let k = k.trim();
                if k.is_empty() {
                    return Err(IfevalError::Invalid(format!("`{id}`: `keyword` is empty")));
                }
                I::KeywordFrequency {
                    keyword: regex_ci(&regex::escape(k))?,
                    frequency: a.count("frequency")?,
                    relation: a.relation("relation")?,
                }
            }
            "keywords:forbidden_words" => {
                let a = a(&["forbidden_words"])?;
                let words = a
                    .strings("forbidden_words")?
                    .iter()
                    .map(|w| regex_ci(&format!(r"\b{}\b", regex::escape(w))))
                    .collect::<Result<_, _>>()?;
                I::ForbiddenWords { words }
            }
            "keywords:letter_frequency" => {
                let a = a(&["letter", "let_frequency", "let_relation"])?;
                let l = a.string("letter")?;
                let l = l.trim().to_lowercase();
                let mut chars = l.chars();
                let letter = match (chars.next(), chars.next()) {
                    (Some(c), None) => c,
                    _ => {
                        return Err(IfevalError::Invalid(format!(
                            "`{id}`: `letter` must be one character, got \"{l}\""
                        )))
                    }
                };
                I::LetterFrequency {
                    letter,
                    let_frequency: a.count("let_frequency")?,
                    let_relation: a.relation("let_relation")?,
                }
            }
            "change_case:english_lowercase" => {
                a(&[])?;
                I::EnglishLowercase
            }
            "change_case:english_capital" => {
                a(&[])?;
                I::EnglishCapital
            }
            "change_case:capital_word_frequency" => {
                let a = a(&["capital_frequency", "capital_relation"])?;
                I::CapitalWordFrequency {
                    capital_frequency: a.count("capital_frequency")?,
                    capital_relation: a.relation("capital_relation")?,
                }
            }
            "startend:end_checker" => {
                let a = a(&["end_phrase"])?;
                I::EndChecker {
                    end_phrase: a.string("end_phrase")?.trim().to_lowercase(),
                }
            }
            "startend:quotation" => {
                a(&[])?;
                I::Quotation
            }
            "combination:repeat_prompt" => {
                let a = a(&["prompt_to_repeat"])?;
                I::RepeatPrompt {
                    prompt_to_repeat: a.string("prompt_to_repeat")?.trim().to_lowercase(),
                }
            }
            "combination:two_responses" => {
                a(&[])?;
                I::TwoResponses
            }
            other => return Err(IfevalError::Unsupported(other.to_string())),
        })
    }

    /// IFEval's `check_following` on one response text.
    pub fn check_following(&self, value: &str) -> bool {
        use Instruction as I;
        match self {
            I::NoComma => !value.contains(','),
            I::NumberWords {
                relation,
                num_words,
            } => relation.holds(count_words(value), *num_words),
            I::NumberSentences {
                relation,
                num_sentences,
            } => relation.holds(split_into_sentences(value).len(), *num_sentences),
            I::NumberParagraphs { num_paragraphs } => {
                static RE: OnceLock<Regex> = OnceLock::new();
                let re = RE.get_or_init(|| Regex::new(r"\s?\*\*\*\s?").expect("paragraph regex"));
                let parts: Vec<&str> = re.split(value).collect();
                let mut n = parts.len();
                for (i, p) in parts.iter().enumerate() {
                    if p.trim().is_empty() {
                        if i == 0 || i == parts.len() - 1 {
                            n -= 1;
                        } else {
                            return false;
                        }
                    }
                }
                n as u64 == *num_paragraphs
            }
            I::NthParagraphFirstWord {
                num_paragraphs,
                nth_paragraph,
                first_word,
            } => {
                let parts: Vec<&str> = value.split("\n\n").collect();
                let n = parts.iter().filter(|p| !p.trim().is_empty()).count();
                if *nth_paragraph > n as u64 {
                    return false;
                }
                let paragraph = parts[(*nth_paragraph - 1) as usize].trim();
                if paragraph.is_empty() {
                    return false;
                }
                let word = paragraph.split_whitespace().next().unwrap_or("").trim();
                let word = word.trim_start_matches('\'').trim_start_matches('"');
                let mut first = String::new();
                for c in word.chars() {
                    if matches!(c, '.' | ',' | '?' | '!' | '\'' | '"') {
                        break;
                    }
                    first.extend(c.to_lowercase());
                }
                n as u64 == *num_paragraphs && first == *first_word
            }
            I::NumberBulletLists { num_bullets } => {
                static RE: OnceLock<(Regex, Regex)> = OnceLock::new();
                let (star, dash) = RE.get_or_init(|| {
                    (
                        Regex::new(r"(?m)^\s*\*[^\*].*$").expect("bullet regex"),
                        Regex::new(r"(?m)^\s*-.*$").expect("bullet regex"),
                    )
                });
                (star.find_iter(value).count() + dash.find_iter(value).count()) as u64
                    == *num_bullets
            }
            I::NumberHighlightedSections { num_highlights } => {
                static RE: OnceLock<(Regex, Regex)> = OnceLock::new();
                let (single, double) = RE.get_or_init(|| {
                    (
                        Regex::new(r"\*[^\n\*]*\*").expect("highlight regex"),
                        Regex::new(r"\*\*[^\n\*]*\*\*").expect("highlight regex"),
                    )
                });
                let mut n = 0u64;
                for m in single.find_iter(value) {
                    if !m.as_str().trim_matches('*').trim().is_empty() {
                        n += 1;
                    }
                }
                for m in double.find_iter(value) {
                    let s = m.as_str();
                    let inner = &s[2..s.len() - 2];
                    if !inner.trim().is_empty() {
                        n += 1;
                    }
                }
                n >= *num_highlights
            }
            I::MultipleSections {
                splitter,
                num_sections,
            } => (splitter.split(value).count() as u64).saturating_sub(1) >= *num_sections,
            I::JsonFormat => {
                let mut v = value.trim();
                for p in ["```json", "```Json", "```JSON", "```"] {
                    v = v.strip_prefix(p).unwrap_or(v);
                }
                v = v.strip_suffix("```").unwrap_or(v);
                serde_json::from_str::<Value>(v.trim()).is_ok()
            }
            I::Title => {
                static RE: OnceLock<Regex> = OnceLock::new();
                let re = RE.get_or_init(|| Regex::new(r"<<[^\n]+>>").expect("title regex"));
                re.find_iter(value).any(|m| {
                    !m.as_str()
                        .trim_start_matches('<')
                        .trim_end_matches('>')
                        .trim()
                        .is_empty()
                })
            }
            I::ConstrainedResponse => {
                let v = value.trim();
                CONSTRAINED_RESPONSE_OPTIONS.iter().any(|o| v.contains(o))
            }
            I::NumberPlaceholders { num_placeholders } => {
                static RE: OnceLock<Regex> = OnceLock::new();
                let re = RE.get_or_init(|| Regex::new(r"\[.*?\]").expect("placeholder regex"));
                re.find_iter(value).count() as u64 >= *num_placeholders
            }
            I::Postscript { pattern } => pattern.is_match(&value.to_lowercase()),
            I::KeywordsExistence { keywords } => keywords.iter().all(|k| k.is_match(value)),
            I::KeywordFrequency {
                keyword,
                frequency,
                relation,
            } => relation.holds(keyword.find_iter(value).count(), *frequency),
            I::ForbiddenWords { words } => !words.iter().any(|w| w.is_match(value)),
            I::LetterFrequency {
                letter,
                let_frequency,
                let_relation,
            } => {
                let n = value.to_lowercase().chars().filter(|c| c == letter).count();
                let_relation.holds(n, *let_frequency)
            }
            I::EnglishLowercase => py_islower(value),
            I::EnglishCapital => py_isupper(value),
            I::CapitalWordFrequency {
                capital_frequency,
                capital_relation,
            } => {
                let n = capital_words(value);
                capital_relation.holds(n, *capital_frequency)
            }
            I::EndChecker { end_phrase } => value
                .trim()
                .trim_matches('"')
                .to_lowercase()
                .ends_with(end_phrase.as_str()),
            I::Quotation => {
                let v = value.trim();
                v.chars().count() > 1 && v.starts_with('"') && v.ends_with('"')
            }
            I::RepeatPrompt { prompt_to_repeat } => value
                .trim()
                .to_lowercase()
                .starts_with(prompt_to_repeat.as_str()),
            I::TwoResponses => {
                let parts: Vec<&str> = value.split("******").collect();
                let mut valid = Vec::new();
                for (i, p) in parts.iter().enumerate() {
                    if p.trim().is_empty() {
                        if i != 0 && i != parts.len() - 1 {
                            return false;
                        }
                    } else {
                        valid.push(*p);
                    }
                }
                valid.len() == 2 && valid[0].trim() != valid[1].trim()
            }
        }
    }

    /// IFEval's strict test: a blank response follows nothing.
    pub fn follows_strict(&self, response: &str) -> bool {
        !response.trim().is_empty() && self.check_following(response)
    }

    /// IFEval's loose test: the response, or it without its first line, its last line or both, each
    /// also with every `*` removed, follows the instruction.
    pub fn follows_loose(&self, response: &str) -> bool {
        loose_variants(response)
            .iter()
            .any(|r| !r.trim().is_empty() && self.check_following(r))
    }
}

/// The eight response variants of IFEval's loose evaluation, in its order.
pub fn loose_variants(response: &str) -> Vec<String> {
    let lines: Vec<&str> = response.split('\n').collect();
    let join = |ls: &[&str]| ls.join("\n").trim().to_string();
    let n = lines.len();
    let remove_first = join(&lines[1.min(n)..]);
    let remove_last = join(&lines[..n.saturating_sub(1)]);
    let remove_both = if n >= 2 {
        join(&lines[1..n - 1])
    } else {
        String::new()
    };
    vec![
        response.to_string(),
        response.replace('*', ""),
        remove_first.clone(),
        remove_last.clone(),
        remove_both.clone(),
        remove_first.replace('*', ""),
        remove_last.replace('*', ""),
        remove_both.replace('*', ""),
    ]
}

/// Python's `str.isupper()`: at least one cased character and no lowercase one.
pub fn py_isupper(s: &str) -> bool {
    s.chars().any(char::is_uppercase) && !s.chars().any(char::is_lowercase)
}

/// Python's `str.islower()`: at least one cased character and no uppercase one.
pub fn py_islower(s: &str) -> bool {
    s.chars().any(char::is_lowercase) && !s.chars().any(char::is_uppercase)
}

/// Words written in capitals: whitespace-separated tokens, outer punctuation removed (hyphenated
/// words stay one word), for which [`py_isupper`] holds. IFEval tokenises with NLTK's
/// `word_tokenize`, which also splits contractions (`DON'T` → `DO`, `N'T`); this does not.
pub fn capital_words(text: &str) -> usize {
    text.split_whitespace()
        .map(|w| w.trim_matches(|c: char| !c.is_alphanumeric()))
        .filter(|w| py_isupper(w))
        .count()
}

struct SentenceRes {
    prefixes: Regex,
    websites: Regex,
    digits: Regex,
    multiple_dots: Regex,
    single_initial: Regex,
    acronym_starter: Regex,
    three_letters: Regex,
    two_letters: Regex,
    suffix_starter: Regex,
    suffix: Regex,
    letter: Regex,
}

fn sentence_res() -> &'static SentenceRes {
    static RES: OnceLock<SentenceRes> = OnceLock::new();
    RES.get_or_init(|| {
        let alpha = "([A-Za-z])";
        let starters = r"(Mr|Mrs|Ms|Dr|Prof|Capt|Cpt|Lt|He\s|She\s|It\s|They\s|Their\s|Our\s|We\s|But\s|However\s|That\s|This\s|Wherever)";
        let acronyms = "([A-Z][.][A-Z][.](?:[A-Z][.])?)";
        let suffixes = "(Inc|Ltd|Jr|Sr|Co)";
        let re = |p: &str| Regex::new(p).expect("sentence regex");
        SentenceRes {
            prefixes: re("(Mr|St|Mrs|Ms|Dr)[.]"),
            websites: re("[.](com|net|org|io|gov|edu|me)"),
            digits: re("([0-9])[.]([0-9])"),
            multiple_dots: re(r"\.{2,}"),
            single_initial: re(&format!(r"\s{alpha}[.] ")),
            acronym_starter: re(&format!("{acronyms} {starters}")),
            three_letters: re(&format!("{alpha}[.]{alpha}[.]{alpha}[.]")),
            two_letters: re(&format!("{alpha}[.]{alpha}[.]")),
            suffix_starter: re(&format!(" {suffixes}[.] {starters}")),
            suffix: re(&format!(" {suffixes}[.]")),
            letter: re(&format!(" {alpha}[.]")),
        }
    })
}

/// IFEval's rule-based sentence splitter (`instructions_util.split_into_sentences`), ported rule by
/// rule. IFEval's `number_sentences` check counts with NLTK's Punkt model instead, which this crate
/// does not ship; on ordinary prose the two agree, on abbreviations they may differ by a sentence.
pub fn split_into_sentences(text: &str) -> Vec<String> {
    let r = sentence_res();
    let mut t = format!(" {text}  ").replace('\n', " ");
    t = r.prefixes.replace_all(&t, "${1}<prd>").into_owned();
    t = r.websites.replace_all(&t, "<prd>${1}").into_owned();
    t = r.digits.replace_all(&t, "${1}<prd>${2}").into_owned();
    t = r
        .multiple_dots
        .replace_all(&t, |c: &regex::Captures| {
            format!("{}<stop>", "<prd>".repeat(c[0].len()))
        })
        .into_owned();
    if t.contains("Ph.D") {
        t = t.replace("Ph.D.", "Ph<prd>D<prd>");
    }
    t = r.single_initial.replace_all(&t, " ${1}<prd> ").into_owned();
    t = r
        .acronym_starter
        .replace_all(&t, "${1}<stop> ${2}")
        .into_owned();
    t = r
        .three_letters
        .replace_all(&t, "${1}<prd>${2}<prd>${3}<prd>")
        .into_owned();
    t = r
        .two_letters
        .replace_all(&t, "${1}<prd>${2}<prd>")
        .into_owned();
    t = r
        .suffix_starter
        .replace_all(&t, " ${1}<stop> ${2}")
        .into_owned();
    t = r.suffix.replace_all(&t, " ${1}<prd>").into_owned();
    t = r.letter.replace_all(&t, " ${1}<prd>").into_owned();
    if t.contains('”') {
        t = t.replace(".”", "”.");
    }
    if t.contains('"') {
        t = t.replace(".\"", "\".");
    }
    if t.contains('!') {
        t = t.replace("!\"", "\"!");
    }
    if t.contains('?') {
        t = t.replace("?\"", "\"?");
    }
    t = t.replace('.', ".<stop>");
    t = t.replace('?', "?<stop>");
    t = t.replace('!', "!<stop>");
    t = t.replace("<prd>", ".");
    let mut out: Vec<String> = t.split("<stop>").map(|s| s.trim().to_string()).collect();
    if out.last().is_some_and(|s| s.is_empty()) {
        out.pop();
    }
    out
}
