//! Final-answer extraction and comparison (`exact_answer`, `numeric_answer`).

use std::sync::OnceLock;

use regex::Regex;
use serde::Deserialize;

/// Where the final answer is taken from in a completion.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Extract {
    /// `answer_tag`, else `boxed`, else `answer_is`, else (for a numeric reference) `last_number`, else
    /// `whole`.
    #[default]
    Auto,
    /// The content of the last `<answer>…</answer>` (the format of R1-style prompts), trimmed.
    AnswerTag,
    /// The last match of the signal's `pattern`: its first capture group when it has one, else the
    /// whole match.
    Regex,
    /// The content of the last `\boxed{…}` (or `\fbox{…}`), braces balanced.
    Boxed,
    /// The rest of the line after the last "answer is" / "answer:" (case-insensitive).
    AnswerIs,
    /// The last number in the text (`-1,234.5`, `3/4`, `.5`, `1e-3`).
    LastNumber,
    /// The whole completion.
    Whole,
}

fn number_re() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(
            r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?|[-+]?\.\d+(?:[eE][-+]?\d+)?",
        )
        .expect("number regex")
    })
}

fn answer_is_re() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| Regex::new(r"(?i)\banswer\s*(?:is\s*:?|:)").expect("answer regex"))
}

/// The content of the last `\boxed{…}` or `\fbox{…}` with balanced braces, if any.
pub fn last_boxed(text: &str) -> Option<&str> {
    static RE: OnceLock<Regex> = OnceLock::new();
    let re = RE.get_or_init(|| Regex::new(r"\\(?:boxed|fbox)\s*\{").expect("boxed regex"));
    let mut best = None;
    for m in re.find_iter(text) {
        let open = m.end() - 1;
        let mut depth = 0usize;
        for (i, c) in text[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        best = Some(&text[open + 1..open + i]);
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    best
}

/// The rest of the line after the last "answer is" / "answer:", up to the first `.`, `!` or `?`
/// followed by whitespace or the end of the line (so `3.5` stays whole), trimmed.
pub fn after_answer_is(text: &str) -> Option<&str> {
    static END: OnceLock<Regex> = OnceLock::new();
    let end = END.get_or_init(|| Regex::new(r"[.!?](?:\s|$)").expect("sentence end regex"));
    let m = answer_is_re().find_iter(text).last()?;
    let rest = &text[m.end()..];
    let line = rest.split('\n').next().unwrap_or("");
    let line = match end.find(line) {
        Some(e) => &line[..e.start()],
        None => line,
    };
    let line = line.trim();
    if line.is_empty() {
        None
    } else {
        Some(line)
    }
}

/// The last number in the text, as written.
pub fn last_number(text: &str) -> Option<&str> {
    number_re().find_iter(text).last().map(|m| m.as_str())
}

/// Parses a number as it may be written in an answer: thousands commas, a leading currency sign, a
/// trailing `%` (kept as written: `50%` is 50), a fraction `a/b`, `\frac{a}{b}`, `\dfrac{a}{b}`,
/// surrounding `$…$`, `\text{…}` units after the number are not accepted. `None` when it is not a number.
pub fn parse_number(s: &str) -> Option<f64> {
    let mut t = s.trim();
    t = t.trim_matches('$').trim();
    t = t.trim_end_matches('.').trim();
    t = t.strip_suffix('%').unwrap_or(t).trim();
    for cur in ['$', '€', '£'] {
        if let Some(r) = t.strip_prefix(cur) {
            t = r.trim_start();
        }
    }
    let (neg, body) = match t.strip_prefix('-') {
        Some(r) => (true, r.trim_start()),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    for pre in ["\\frac", "\\dfrac", "\\tfrac"] {
        if let Some(r) = body.strip_prefix(pre) {
            let (a, rest) = braced(r)?;
            let (b, rest) = braced(rest)?;
            if !rest.trim().is_empty() {
                return None;
            }
            let v = plain(a)? / plain(b)?;
            return finite(if neg { -v } else { v });
        }
    }
    let v = if let Some((a, b)) = body.split_once('/') {
        plain(a)? / plain(b)?
    } else {
        plain(body)?
    };
    finite(if neg { -v } else { v })
}

fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

fn braced(s: &str) -> Option<(&str, &str)> {
    let s = s.trim_start().strip_prefix('{')?;
    let end = s.find('}')?;
    Some((&s[..end], &s[end + 1..]))
}

/// A plain decimal: digits with optional thousands commas (groups of three), fraction, exponent.
fn plain(s: &str) -> Option<f64> {
    let s = s.trim();
    let (s, neg) = match s.strip_prefix('-') {
        Some(r) => (r, true),
        None => (s.strip_prefix('+').unwrap_or(s), false),
    };
    if s.is_empty() || !s.chars().next()?.is_ascii_digit() && !s.starts_with('.') {
        return None;
    }
    let cleaned: String = if s.contains(',') {
        let int_end = s.find(['.', 'e', 'E']).unwrap_or(s.len());
        let groups: Vec<&str> = s[..int_end].split(',').collect();
        let ok = !groups[0].is_empty()
            && groups[0].len() <= 3
            && groups[1..].iter().all(|g| g.len() == 3);
        if !ok {
            return None;
        }
        format!("{}{}", groups.concat(), &s[int_end..])
    } else {
        s.to_string()
    };
    if !cleaned
        .chars()
        .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '-' | '+'))
    {
        return None;
    }
    let v: f64 = cleaned.parse().ok()?;
    Some(if neg { -v } else { v })
}

/// The content of the last `<answer>…</answer>` (case-insensitive tags, spanning lines), trimmed.
pub fn answer_tag(text: &str) -> Option<&str> {
    static RE: OnceLock<Regex> = OnceLock::new();
    let re =
        RE.get_or_init(|| Regex::new(r"(?is)<answer>(.*?)</answer>").expect("answer tag regex"));
    re.captures_iter(text)
        .last()
        .and_then(|c| c.get(1))
        .map(|m| m.as_str().trim())
}

/// The last match of `pattern` in `text`: its first capture group when the pattern has one (and it
/// took part in the match), else the whole match; trimmed.
pub fn last_match<'t>(text: &'t str, pattern: &Regex) -> Option<&'t str> {
    let c = pattern.captures_iter(text).last()?;
    let m = if pattern.captures_len() > 1 {
        c.get(1)?
    } else {
        c.get(0)?
    };
    Some(m.as_str().trim())
}

/// Extracts the final answer of `text` with `how`. `numeric_reference` tells `auto` whether to fall
/// back to the last number (true) or to the whole completion (false). `Extract::Regex` needs
/// [`extract_with`] and its pattern (here it finds nothing).
pub fn extract(text: &str, how: Extract, numeric_reference: bool) -> Option<&str> {
    extract_with(text, how, None, numeric_reference)
}

/// [`extract`] with the pattern of `Extract::Regex`.
pub fn extract_with<'t>(
    text: &'t str,
    how: Extract,
    pattern: Option<&Regex>,
    numeric_reference: bool,
) -> Option<&'t str> {
    match how {
        Extract::AnswerTag => answer_tag(text),
        Extract::Regex => pattern.and_then(|p| last_match(text, p)),
        Extract::Boxed => last_boxed(text).map(str::trim),
        Extract::AnswerIs => after_answer_is(text),
        Extract::LastNumber => last_number(text),
        Extract::Whole => Some(text.trim()),
        Extract::Auto => answer_tag(text)
            .or_else(|| last_boxed(text).map(str::trim))
            .or_else(|| after_answer_is(text))
            .or_else(|| {
                if numeric_reference {
                    last_number(text)
                } else {
                    Some(text.trim())
                }
            }),
    }
}

/// Normalises an answer for exact comparison: surrounding whitespace, `$`, `**` and a trailing `.`
/// removed, inner whitespace runs collapsed to one space, lowercased unless `case_sensitive`.
pub fn normalize(s: &str, case_sensitive: bool) -> String {
    let mut t = s.trim();
    loop {
        let before = t;
        t = t.trim_matches('$').trim();
        t = t.strip_prefix("**").unwrap_or(t);
        t = t.strip_suffix("**").unwrap_or(t).trim();
        t = t.trim_end_matches('.').trim();
        if t == before {
            break;
        }
    }
    let joined = t.split_whitespace().collect::<Vec<_>>().join(" ");
    if case_sensitive {
        joined
    } else {
        joined.to_lowercase()
    }
}

/// Whether two numbers are the same answer under `math_equivalence`: equal up to 1e-9 relative to
/// the larger magnitude (or 1e-12 absolute), so `1/2` = `0.5` = `\frac{1}{2}` and `1,000` = `1000`.
pub fn same_number(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12_f64.max(1e-9 * a.abs().max(b.abs()))
}

/// `exact_answer`: the extracted answer equals the reference after [`normalize`] of both; with
/// `math_equivalence`, also when both parse as the same number ([`parse_number`], [`same_number`]).
pub fn exact_match(
    text: &str,
    reference: &str,
    how: Extract,
    pattern: Option<&Regex>,
    case_sensitive: bool,
    math_equivalence: bool,
) -> bool {
    let reference_number = parse_number(reference);
    let Some(a) = extract_with(text, how, pattern, reference_number.is_some()) else {
        return false;
    };
    if normalize(a, case_sensitive) == normalize(reference, case_sensitive) {
        return true;
    }
    match (math_equivalence, reference_number, parse_number(a)) {
        (true, Some(r), Some(x)) => same_number(x, r),
        _ => false,
    }
}

/// `numeric_answer`: the extracted answer parses as a number x with |x − ref| ≤ abs_tol + rel_tol·|ref|.
pub fn numeric_match(
    text: &str,
    reference: f64,
    how: Extract,
    pattern: Option<&Regex>,
    abs_tol: f64,
    rel_tol: f64,
) -> bool {
    let Some(a) = extract_with(text, how, pattern, true) else {
        return false;
    };
    match parse_number(a).or_else(|| last_number(a).and_then(parse_number)) {
        Some(x) => (x - reference).abs() <= abs_tol + rel_tol * reference.abs(),
        None => false,
    }
}
