//! Positions: LSP speaks in (line, UTF-16 column) pairs, the compiler in byte offsets. `LineIndex`
//! converts between the two for one text; `apply_change` applies an editor's incremental edit.

use lsp_types::{Position, Range, TextDocumentContentChangeEvent};
use rlx_compiler::syntax::ast::Span;

/// The byte offset of every line start of one text.
#[derive(Clone, Debug)]
pub struct LineIndex {
    starts: Vec<usize>,
}

impl LineIndex {
    pub fn new(text: &str) -> LineIndex {
        let mut starts = vec![0];
        starts.extend(
            text.bytes()
                .enumerate()
                .filter(|(_, byte)| *byte == b'\n')
                .map(|(index, _)| index + 1),
        );
        LineIndex { starts }
    }

    /// The position of a byte offset (clamped to the text, moved back to a character boundary).
    pub fn position(&self, text: &str, offset: usize) -> Position {
        let mut offset = offset.min(text.len());
        while !text.is_char_boundary(offset) {
            offset -= 1;
        }
        let line = self.starts.partition_point(|&start| start <= offset) - 1;
        let start = self.starts[line];
        let column: usize = text[start..offset].chars().map(char::len_utf16).sum();
        Position::new(line as u32, column as u32)
    }

    /// The byte offset of a position. A line past the end is the end of the text; a column past the
    /// end of its line is the line's end (as the protocol asks); a column inside a surrogate pair is
    /// the start of its character.
    pub fn offset(&self, text: &str, position: Position) -> usize {
        let Some(&start) = self.starts.get(position.line as usize) else {
            return text.len();
        };
        let end = self
            .starts
            .get(position.line as usize + 1)
            .map_or(text.len(), |next| next - 1);
        let line = &text[start..end.max(start)];
        let mut column = 0usize;
        for (index, ch) in line.char_indices() {
            if column + ch.len_utf16() > position.character as usize {
                return start + index;
            }
            column += ch.len_utf16();
        }
        start + line.len()
    }

    pub fn range(&self, text: &str, span: Span) -> Range {
        Range::new(
            self.position(text, span.start as usize),
            self.position(text, span.end as usize),
        )
    }

    pub fn span(&self, text: &str, range: Range) -> Span {
        let start = self.offset(text, range.start);
        let end = self.offset(text, range.end);
        Span::new(start.min(end), end.max(start))
    }
}

/// The range of a span in `text` (building a line index for it).
pub fn range_in(text: &str, span: Span) -> Range {
    LineIndex::new(text).range(text, span)
}

/// Apply one content change: a ranged edit, or the whole text when it has no range.
pub fn apply_change(text: &mut String, change: TextDocumentContentChangeEvent) {
    match change.range {
        None => *text = change.text,
        Some(range) => {
            let index = LineIndex::new(text);
            let span = index.span(text, range);
            text.replace_range(span.range(), &change.text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_count_utf16_units() {
        let text = "a\nπ𝄞x\n";
        let index = LineIndex::new(text);
        // π is 2 bytes / 1 unit, 𝄞 is 4 bytes / 2 units.
        let x = text.find('x').unwrap();
        assert_eq!(index.position(text, x), Position::new(1, 3));
        assert_eq!(index.offset(text, Position::new(1, 3)), x);
        // A column inside the surrogate pair falls back to the character's start.
        assert_eq!(
            index.offset(text, Position::new(1, 2)),
            text.find('𝄞').unwrap()
        );
        // Past the end of a line: the line's end; past the last line: the text's end.
        assert_eq!(index.offset(text, Position::new(0, 99)), 1);
        assert_eq!(index.offset(text, Position::new(9, 0)), text.len());
    }

    #[test]
    fn ranged_changes_edit_in_place() {
        let mut text = String::from("let a = 1\nlet b = 2\n");
        apply_change(
            &mut text,
            TextDocumentContentChangeEvent {
                range: Some(Range::new(Position::new(1, 4), Position::new(1, 5))),
                range_length: None,
                text: "beta".into(),
            },
        );
        assert_eq!(text, "let a = 1\nlet beta = 2\n");
    }
}
