//! Turning a sequence's generated tokens into text pieces that can be sent: text is held
//! back while it ends in an incomplete UTF-8 character or could still become a stop string,
//! and generation ends at the first stop string, which is not sent.

/// The text side of one generating sequence.
#[derive(Debug)]
pub struct TextOut {
    stops: Vec<String>,
    /// The decoded text of every generated token (cut before a stop string once one shows).
    text: String,
    /// Bytes of `text` already handed out.
    sent: usize,
}

/// What the newest token did to the text.
#[derive(Debug, PartialEq, Eq)]
pub enum Piece {
    /// Text that became final (possibly empty).
    Text(String),
    /// A stop string appeared: the rest of the text before it, then generation ends.
    Stopped(String),
}

impl TextOut {
    pub fn new(stops: Vec<String>) -> Self {
        TextOut {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            text: String::new(),
            sent: 0,
        }
    }

    /// Takes the decoded text of all generated tokens so far.
    pub fn update(&mut self, decoded: String) -> Piece {
        self.text = decoded;
        let first_stop = self
            .stops
            .iter()
            .filter_map(|s| self.text.find(s.as_str()))
            .min();
        if let Some(at) = first_stop {
            // Never take back text already sent (a detokenizer may rewrite earlier text).
            self.text.truncate(at.max(self.sent));
            return Piece::Stopped(self.take_to(self.text.len()));
        }
        let settled = self.text.trim_end_matches(char::REPLACEMENT_CHARACTER);
        // Hold back the longest tail that a stop string starts with.
        let hold_from = settled
            .char_indices()
            .map(|(i, _)| i)
            .filter(|&i| i >= self.sent)
            .find(|&i| self.stops.iter().any(|s| s.starts_with(&settled[i..])))
            .unwrap_or(settled.len());
        Piece::Text(self.take_to(hold_from))
    }

    /// Everything not sent yet (generation ended some other way).
    pub fn flush(&mut self) -> String {
        self.take_to(self.text.len())
    }

    /// The whole text, as cut at a stop string.
    pub fn text(&self) -> &str {
        &self.text
    }

    fn take_to(&mut self, end: usize) -> String {
        let piece = self.text.get(self.sent..end).unwrap_or("").to_owned();
        self.sent = self.sent.max(end);
        piece
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_what_may_become_a_stop_string() {
        let mut out = TextOut::new(vec!["END".into()]);
        assert_eq!(out.update("ab".into()), Piece::Text("ab".into()));
        assert_eq!(out.update("abcE".into()), Piece::Text("c".into()));
        assert_eq!(out.update("abcEN".into()), Piece::Text("".into()));
        assert_eq!(out.update("abcENX".into()), Piece::Text("ENX".into()));
        assert_eq!(
            out.update("abcENXEND tail".into()),
            Piece::Stopped("".into())
        );
        assert_eq!(out.text(), "abcENX");
    }

    #[test]
    fn earliest_stop_string_wins_and_incomplete_characters_wait() {
        let mut out = TextOut::new(vec!["zz".into(), "y".into(), String::new()]);
        assert_eq!(out.update("a\u{FFFD}".into()), Piece::Text("a".into()));
        assert_eq!(out.update("aé".into()), Piece::Text("é".into()));
        assert_eq!(out.update("aébzzcy".into()), Piece::Stopped("b".into()));
        assert_eq!(out.text(), "aéb");
    }

    #[test]
    fn flush_sends_held_text() {
        let mut out = TextOut::new(vec!["stop".into()]);
        assert_eq!(out.update("go st".into()), Piece::Text("go ".into()));
        assert_eq!(out.flush(), "st");
        assert_eq!(out.flush(), "");
    }
}
