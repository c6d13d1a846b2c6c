//! Errors and warnings as plain data. The compiler never renders them: the CLI turns them into miette
//! reports (human) or JSON (`--format json`).

use serde::Serialize;

use crate::source::FileId;
use crate::syntax::ast::Span;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Label {
    pub span: Span,
    pub message: String,
}

/// One finding about a source file. The first label is the primary one.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Diagnostic {
    /// Stable code such as `rlx::unknown_name`; tests and tools match on it.
    pub code: &'static str,
    pub severity: Severity,
    pub message: String,
    pub file: FileId,
    pub labels: Vec<Label>,
    pub help: Option<String>,
    /// Further context, possibly in another file (a function body in the standard library, say).
    pub related: Vec<Diagnostic>,
}

impl Diagnostic {
    pub fn error(code: &'static str, file: FileId, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            code,
            severity: Severity::Error,
            message: message.into(),
            file,
            labels: Vec::new(),
            help: None,
            related: Vec::new(),
        }
    }

    pub fn warning(code: &'static str, file: FileId, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            severity: Severity::Warning,
            ..Diagnostic::error(code, file, message)
        }
    }

    pub fn label(mut self, span: Span, message: impl Into<String>) -> Diagnostic {
        self.labels.push(Label {
            span,
            message: message.into(),
        });
        self
    }

    pub fn help(mut self, help: impl Into<String>) -> Diagnostic {
        self.help = Some(help.into());
        self
    }

    pub fn with_related(mut self, related: Diagnostic) -> Diagnostic {
        self.related.push(related);
        self
    }

    /// The primary span, if any label exists.
    pub fn primary_span(&self) -> Option<Span> {
        self.labels.first().map(|label| label.span)
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// The closest name to `wanted` among `candidates`, if one is close enough to be a likely typo.
pub fn closest_name<'a>(
    wanted: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let limit = (wanted.chars().count() / 3).max(1);
    candidates
        .into_iter()
        .filter(|candidate| *candidate != wanted)
        .map(|candidate| (edit_distance(wanted, candidate), candidate))
        .filter(|(distance, _)| *distance <= limit)
        .min_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1)))
        .map(|(_, candidate)| candidate)
}

/// Levenshtein distance over chars (names are short; quadratic is fine).
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b_chars: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b_chars.len()).collect();
    for (i, a_char) in a.chars().enumerate() {
        let mut current = vec![i + 1; b_chars.len() + 1];
        for (j, b_char) in b_chars.iter().enumerate() {
            let substitution = previous[j] + usize::from(a_char != *b_char);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        previous = current;
    }
    previous[b_chars.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_counts_single_edits() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("logp", "logp"), 0);
    }

    #[test]
    fn closest_name_finds_typos_but_not_strangers() {
        let names = ["old_logp", "logp", "advantage", "reward"];
        assert_eq!(closest_name("old_lgp", names), Some("old_logp"));
        assert_eq!(closest_name("advantge", names), Some("advantage"));
        assert_eq!(closest_name("zzz", names), None);
    }
}
