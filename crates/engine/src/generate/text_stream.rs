//! Streaming generated text: only text that later tokens cannot change is handed out.

use super::run::{Drawn, FinishReason};

/// Turns the growing decoded text into pieces that are final.
#[derive(Debug)]
pub struct TextStream {
    stops: Vec<String>,
    /// The whole decoded text so far (cut at a stop string once one appears).
    decoded: String,
    /// How much of `decoded` has been handed out.
    released: usize,
}

/// What the newest token did to the text ([`TextStream::update`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Piece {
    /// Text that became final (possibly empty).
    Text(String),
    /// A stop string appeared: the rest of the text before it, then generation ends.
    Stopped(String),
}

impl TextStream {
    /// A stream ending at the first of `stops` (empty ones never match).
    pub fn new(stops: &[String]) -> Self {
        TextStream {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            decoded: String::new(),
            released: 0,
        }
    }

    /// Takes the decoded text of all tokens generated so far.
    pub fn set(&mut self, decoded: String) {
        self.decoded = decoded;
    }

    /// Cuts the text before the earliest stop string in it and returns that string.
    pub fn cut_at_stop(&mut self) -> Option<String> {
        let (at, stop) = self
            .stops
            .iter()
            .filter_map(|s| self.decoded.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|(at, _)| *at)?;
        // Text handed out is never taken back (a detokenizer may rewrite earlier text).
        self.decoded.truncate(at.max(self.released));
        Some(stop.clone())
    }

    /// The text not handed out yet that later tokens cannot change: without a trailing
    /// replacement character (an incomplete multi-byte character) or a tail that is the
    /// start of a stop string.
    pub fn release_final(&mut self) -> String {
        let text = self.decoded.trim_end_matches('\u{FFFD}');
        let held = text
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| self.stops.iter().any(|s| s.starts_with(&text[i..])))
            .unwrap_or(text.len());
        self.release_to(held)
    }

    /// Takes the decoded text of all tokens generated so far and says what became final.
    pub fn update(&mut self, decoded: String) -> Piece {
        self.set(decoded);
        match self.cut_at_stop() {
            Some(_) => Piece::Stopped(self.release_all()),
            None => Piece::Text(self.release_final()),
        }
    }

    /// The whole text so far, cut before a stop string once one appeared.
    pub fn text(&self) -> &str {
        &self.decoded
    }

    /// All the text not handed out yet.
    pub fn release_all(&mut self) -> String {
        self.release_to(self.decoded.len())
    }

    /// Text handed out is never taken back: if the detokenizer rewrote earlier text, what
    /// follows continues after the part already handed out.
    fn release_to(&mut self, end: usize) -> String {
        let piece = self
            .decoded
            .get(self.released..end)
            .unwrap_or("")
            .to_owned();
        self.released = self.released.max(end);
        piece
    }

    /// The whole text (cut before a stop string) with the tokens it came from.
    pub(crate) fn finish(self, tokens: Vec<u32>, finish: FinishReason) -> Drawn {
        Drawn {
            tokens,
            text: self.decoded,
            finish,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(stops: &[&str]) -> TextStream {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        TextStream::new(&stops)
    }

    #[test]
    fn holds_back_what_may_become_a_stop_string() {
        let mut out = stream(&["END"]);
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
        let mut out = stream(&["zz", "y", ""]);
        assert_eq!(out.update("a\u{FFFD}".into()), Piece::Text("a".into()));
        assert_eq!(out.update("aé".into()), Piece::Text("é".into()));
        assert_eq!(out.update("aébzzcy".into()), Piece::Stopped("b".into()));
        assert_eq!(out.text(), "aéb");
    }

    #[test]
    fn release_all_sends_held_text() {
        let mut out = stream(&["stop"]);
        assert_eq!(out.update("go st".into()), Piece::Text("go ".into()));
        assert_eq!(out.release_all(), "st");
        assert_eq!(out.release_all(), "");
    }
}
