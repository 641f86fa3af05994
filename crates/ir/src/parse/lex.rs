//! Tokens of the kernel text format, each with its line and column.

use super::{ParseError, ParseErrorKind};

#[derive(Clone, Debug, PartialEq)]
pub(super) enum Tok {
    /// Letters, digits, `_` and `.`, not starting with a digit: `add.rn`, `tid.x`, `f32`.
    Word(String),
    /// `%12`
    Value(u32),
    /// A numeric literal as written: `16`, `-3`, `1.5e-7`, `0x7fc00000`, `-inf`.
    Number(String),
    Str(String),
    /// One of `: = , ( ) { } [ ] < >`.
    Punct(char),
    Arrow,
    Newline,
    Eof,
}

impl Tok {
    /// How an error message names this token.
    pub(super) fn describe(&self) -> String {
        match self {
            Tok::Word(w) => format!("`{w}`"),
            Tok::Value(v) => format!("`%{v}`"),
            Tok::Number(n) => format!("`{n}`"),
            Tok::Str(_) => "a string".into(),
            Tok::Punct(c) => format!("`{c}`"),
            Tok::Arrow => "`->`".into(),
            Tok::Newline => "end of line".into(),
            Tok::Eof => "end of input".into(),
        }
    }
}

#[derive(Clone, Debug)]
pub(super) struct Token {
    pub tok: Tok,
    pub line: u32,
    pub col: u32,
}

pub(super) struct Lexer<'a> {
    src: &'a str,
    pos: usize,
    line: u32,
    col: u32,
}

impl<'a> Lexer<'a> {
    pub(super) fn new(src: &'a str) -> Lexer<'a> {
        Lexer {
            src,
            pos: 0,
            line: 1,
            col: 1,
        }
    }

    fn peek_char(&self) -> Option<char> {
        self.src[self.pos..].chars().next()
    }

    fn peek_second(&self) -> Option<char> {
        let mut it = self.src[self.pos..].chars();
        it.next();
        it.next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek_char()?;
        self.pos += c.len_utf8();
        if c == '\n' {
            self.line += 1;
            self.col = 1;
        } else {
            self.col += 1;
        }
        Some(c)
    }

    fn error(&self, line: u32, col: u32, kind: ParseErrorKind) -> ParseError {
        ParseError {
            line,
            column: col,
            kind,
        }
    }

    /// Consume characters while `keep` holds and return them.
    fn take_while(&mut self, mut keep: impl FnMut(char, &str) -> bool) -> &'a str {
        let start = self.pos;
        while let Some(c) = self.peek_char() {
            if !keep(c, &self.src[start..self.pos]) {
                break;
            }
            self.bump();
        }
        &self.src[start..self.pos]
    }

    pub(super) fn next_token(&mut self) -> Result<Token, ParseError> {
        // Skip blanks and comments (but not newlines, which end items).
        loop {
            match self.peek_char() {
                Some(' ' | '\t' | '\r') => {
                    self.bump();
                }
                Some('/') if self.peek_second() == Some('/') => {
                    self.take_while(|c, _| c != '\n');
                }
                _ => break,
            }
        }
        let (line, col) = (self.line, self.col);
        let tok = |tok| Ok(Token { tok, line, col });
        let Some(c) = self.peek_char() else {
            return tok(Tok::Eof);
        };
        match c {
            '\n' => {
                self.bump();
                tok(Tok::Newline)
            }
            ':' | '=' | ',' | '(' | ')' | '{' | '}' | '[' | ']' | '<' | '>' => {
                self.bump();
                tok(Tok::Punct(c))
            }
            '-' if self.peek_second() == Some('>') => {
                self.bump();
                self.bump();
                tok(Tok::Arrow)
            }
            '%' => {
                self.bump();
                let digits = self.take_while(|c, _| c.is_ascii_digit());
                if digits.is_empty() {
                    return Err(self.error(
                        line,
                        col,
                        ParseErrorKind::Expected {
                            expected: "a value number after `%`".into(),
                            found: self
                                .peek_char()
                                .map_or("end of input".into(), |c| format!("{c:?}")),
                        },
                    ));
                }
                match digits.parse::<u32>() {
                    Ok(v) => tok(Tok::Value(v)),
                    Err(_) => Err(self.error(
                        line,
                        col,
                        ParseErrorKind::BadNumber {
                            text: format!("%{digits}"),
                            why: "value numbers are at most 4294967295".into(),
                        },
                    )),
                }
            }
            '"' => self.string(line, col),
            c if c.is_ascii_digit()
                || (c == '-'
                    && self
                        .peek_second()
                        .is_some_and(|d| d.is_ascii_alphanumeric())) =>
            {
                self.bump();
                let rest = self.take_while(|c, so_far| {
                    let exponent_sign = (c == '+' || c == '-')
                        && so_far.ends_with(['e', 'E'])
                        && !so_far.starts_with("0x")
                        && !so_far.starts_with("x");
                    c.is_ascii_alphanumeric() || c == '_' || c == '.' || exponent_sign
                });
                tok(Tok::Number(format!("{c}{rest}")))
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let w = self.take_while(|c, _| c.is_ascii_alphanumeric() || c == '_' || c == '.');
                tok(Tok::Word(w.to_string()))
            }
            c => Err(self.error(line, col, ParseErrorKind::BadChar(c))),
        }
    }

    fn string(&mut self, line: u32, col: u32) -> Result<Token, ParseError> {
        self.bump();
        let mut s = String::new();
        loop {
            let (el, ec) = (self.line, self.col);
            match self.bump() {
                None | Some('\n') => {
                    return Err(self.error(line, col, ParseErrorKind::UnterminatedString))
                }
                Some('"') => {
                    return Ok(Token {
                        tok: Tok::Str(s),
                        line,
                        col,
                    })
                }
                Some('\\') => {
                    let bad =
                        |lx: &Self, text: String| lx.error(el, ec, ParseErrorKind::BadEscape(text));
                    match self.bump() {
                        Some('"') => s.push('"'),
                        Some('\\') => s.push('\\'),
                        Some('n') => s.push('\n'),
                        Some('t') => s.push('\t'),
                        Some('r') => s.push('\r'),
                        Some('u') => {
                            if self.bump() != Some('{') {
                                return Err(bad(self, "\\u without `{`".into()));
                            }
                            let hex = self.take_while(|c, _| c.is_ascii_hexdigit());
                            let ch = u32::from_str_radix(hex, 16).ok().and_then(char::from_u32);
                            match (ch, self.bump()) {
                                (Some(ch), Some('}')) => s.push(ch),
                                _ => return Err(bad(self, format!("\\u{{{hex}"))),
                            }
                        }
                        Some(other) => return Err(bad(self, format!("\\{other}"))),
                        None => {
                            return Err(self.error(line, col, ParseErrorKind::UnterminatedString))
                        }
                    }
                }
                Some(c) => s.push(c),
            }
        }
    }
}
