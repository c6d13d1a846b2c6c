//! Trivia: what the grammar skips between tokens (blanks, line breaks, `//` comments) and the
//! `///` doc lines, kept beside the tree so that a tool that writes source back (the formatter)
//! needs nothing but the parsed [`Module`](super::ast::Module).
//!
//! The AST's nodes carry byte spans; trivia is attached to the token boundaries those spans name,
//! as swc's comment map attaches comments to byte positions: a run of trivia is a [`Gap`] between
//! the end of one token and the start of the next, and a comment belongs to the gap it sits in.
//! So `gap_after(node.span.end)` is what follows a node and `gap_before(node.span.start)` what
//! precedes it. The grammar is untouched: comments stay implicit there (`COMMENT` in
//! `grammar/rlx.pest`); this module reads them once, in the same pass as the parse
//! (`parse_module`), with the same lexical rules (string literals skipped, `////` a comment,
//! `///` a doc line).

use super::ast::Span;

/// A `//` comment: its span and text, without the trailing blanks of its line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Comment {
    pub span: Span,
    pub text: String,
}

/// A maximal run of blanks, line breaks, comments and doc lines between two tokens (or the start or
/// end of the file): `[start, end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gap {
    pub start: u32,
    pub end: u32,
}

/// A comment or a doc line, in source order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Piece {
    /// Index into [`Trivia::comments`].
    Comment(usize),
    /// A `///` line: its span.
    Doc(Span),
}

/// The trivia of one file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trivia {
    /// Every gap, in source order (disjoint).
    gaps: Vec<Gap>,
    /// Every `//` comment, in source order.
    comments: Vec<Comment>,
    /// Every `///` doc line, in source order.
    docs: Vec<Span>,
    /// The offset of every line break (`\n`), in order.
    line_breaks: Vec<u32>,
    /// The length of the file.
    len: u32,
}

impl Trivia {
    /// Read the trivia of `text`.
    pub fn scan(text: &str) -> Trivia {
        let bytes = text.as_bytes();
        let mut trivia = Trivia {
            len: offset(bytes.len()),
            ..Trivia::default()
        };
        let mut index = 0;
        let mut gap_start: Option<usize> = None;
        while index < bytes.len() {
            match bytes[index] {
                b' ' | b'\t' | b'\r' | b'\n' => {
                    if bytes[index] == b'\n' {
                        trivia.line_breaks.push(offset(index));
                    }
                    gap_start.get_or_insert(index);
                    index += 1;
                }
                b'/' if bytes.get(index + 1) == Some(&b'/') => {
                    gap_start.get_or_insert(index);
                    let start = index;
                    while index < bytes.len() && bytes[index] != b'\n' {
                        index += 1;
                    }
                    let is_doc =
                        bytes.get(start + 2) == Some(&b'/') && bytes.get(start + 3) != Some(&b'/');
                    if is_doc {
                        trivia.docs.push(Span::new(start, index));
                    } else {
                        let mut end = index;
                        while end > start + 2 && matches!(bytes[end - 1], b' ' | b'\t' | b'\r') {
                            end -= 1;
                        }
                        trivia.comments.push(Comment {
                            span: Span::new(start, end),
                            text: text.get(start..end).unwrap_or("//").to_string(),
                        });
                    }
                }
                byte => {
                    if let Some(start) = gap_start.take() {
                        trivia.gaps.push(Gap {
                            start: offset(start),
                            end: offset(index),
                        });
                    }
                    index += 1;
                    if byte == b'"' {
                        while index < bytes.len() && bytes[index] != b'"' && bytes[index] != b'\n' {
                            index += if bytes[index] == b'\\' { 2 } else { 1 };
                        }
                        index += 1;
                    }
                }
            }
        }
        if let Some(start) = gap_start {
            trivia.gaps.push(Gap {
                start: offset(start),
                end: offset(bytes.len()),
            });
        }
        trivia
    }

    /// The length of the file.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every comment, in source order.
    pub fn comments(&self) -> &[Comment] {
        &self.comments
    }

    /// Every `///` doc line, in source order.
    pub fn docs(&self) -> &[Span] {
        &self.docs
    }

    /// The gap that starts at `offset` (the end of a token), if trivia follows it.
    pub fn gap_after(&self, offset: usize) -> Option<Gap> {
        let index = self
            .gaps
            .partition_point(|gap| (gap.start as usize) < offset);
        self.gaps
            .get(index)
            .copied()
            .filter(|gap| gap.start as usize == offset)
    }

    /// The gap that ends at `offset` (the start of a token), if trivia precedes it.
    pub fn gap_before(&self, offset: usize) -> Option<Gap> {
        let index = self.gaps.partition_point(|gap| (gap.end as usize) < offset);
        self.gaps
            .get(index)
            .copied()
            .filter(|gap| gap.end as usize == offset)
    }

    /// Where the next token starts at or after `offset`, a token end: past the gap there, if any.
    pub fn next_token(&self, offset: usize) -> usize {
        self.gap_after(offset)
            .map_or(offset, |gap| gap.end as usize)
    }

    /// The end of `span` without the trivia it may end with (pest includes the trivia it skipped
    /// looking for an optional part that was not there).
    pub fn tight_end(&self, span: Span) -> usize {
        let start = span.start as usize;
        let end = (span.end as usize).min(self.len as usize);
        if end <= start {
            return start;
        }
        // the gap with start < end <= gap end
        let index = self.gaps.partition_point(|gap| (gap.end as usize) < end);
        match self.gaps.get(index) {
            Some(gap) if (gap.start as usize) < end => (gap.start as usize).max(start),
            _ => end,
        }
    }

    /// How many line breaks lie in `[from, to)`.
    pub fn newlines(&self, from: usize, to: usize) -> usize {
        if to <= from {
            return 0;
        }
        let first = self.line_breaks.partition_point(|&at| (at as usize) < from);
        let last = self.line_breaks.partition_point(|&at| (at as usize) < to);
        last - first
    }

    /// The index of the first comment starting at or after `offset`.
    pub fn first_comment_from(&self, offset: usize) -> usize {
        self.comments
            .partition_point(|comment| (comment.span.start as usize) < offset)
    }

    /// The comments and doc lines starting in `[from, to)`, in source order.
    pub fn pieces(&self, from: usize, to: usize) -> Vec<(Piece, Span)> {
        let mut found: Vec<(Piece, Span)> = Vec::new();
        let mut comment = self.first_comment_from(from);
        while let Some(c) = self.comments.get(comment) {
            if c.span.start as usize >= to {
                break;
            }
            found.push((Piece::Comment(comment), c.span));
            comment += 1;
        }
        let mut doc = self.docs.partition_point(|doc| (doc.start as usize) < from);
        while let Some(&span) = self.docs.get(doc) {
            if span.start as usize >= to {
                break;
            }
            found.push((Piece::Doc(span), span));
            doc += 1;
        }
        found.sort_by_key(|(_, span)| span.start);
        found
    }

    /// Whether the token at `offset` is the first of its line (only blanks before it on its line,
    /// and something before the line).
    pub fn starts_line(&self, offset: usize) -> bool {
        self.gap_before(offset)
            .is_some_and(|gap| self.newlines(gap.start as usize, offset) > 0)
    }

    /// Whether a line break separates the token ending at `end` from the next token.
    pub fn breaks_after(&self, end: usize) -> bool {
        self.gap_after(end)
            .is_some_and(|gap| self.newlines(end, gap.end as usize) > 0)
    }
}

fn offset(at: usize) -> u32 {
    u32::try_from(at).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_comments_and_docs() {
        let text = "/// doc\ninput x : f32 // c \"q\"\n\nreward = \"a // b\" //// four\n";
        let trivia = Trivia::scan(text);
        let texts: Vec<&str> = trivia.comments().iter().map(|c| c.text.as_str()).collect();
        assert_eq!(texts, ["// c \"q\"", "//// four"]);
        assert_eq!(trivia.docs, [Span::new(0, 7)]);
        // `input` starts the file's second token; the gap before it holds the doc line.
        let input = text.find("input").unwrap();
        assert_eq!(
            trivia.gap_before(input),
            Some(Gap {
                start: 0,
                end: input as u32
            })
        );
        let reward = text.find("reward").unwrap();
        assert!(trivia.starts_line(reward));
        let f32_end = text.find("f32").unwrap() + 3;
        assert!(trivia.breaks_after(f32_end));
        assert_eq!(trivia.next_token(f32_end), reward);
        assert_eq!(trivia.newlines(f32_end, reward), 2);
        // a span that ends with the trivia after it
        assert_eq!(trivia.tight_end(Span::new(input, reward)), f32_end);
        assert_eq!(trivia.pieces(0, text.len()).len(), 3);
    }
}
