//! Reads a file holding one Erlang term in text form, ended by a full stop, as OTP's
//! `-ssl_dist_optfile` is (`[{server, [...]}, {client, [...]}].`).
//!
//! The node needs the same file the BEAM nodes of its cluster read, so it reads the literal part
//! of Erlang's syntax: atoms (bare or quoted), strings with their escapes (adjacent ones joined),
//! integers (also `Base#Digits` and `$c`), floats, lists, tuples, binaries of strings and bytes,
//! and `%` comments. Anything that would need evaluation (variables, operators, calls) is an error
//! naming its line.

use std::fmt;

/// An Erlang literal term.
#[derive(Debug, Clone, PartialEq)]
pub enum Literal {
    Atom(String),
    /// A string literal: a list of character codes in Erlang.
    Str(String),
    Int(i128),
    Float(f64),
    List(Vec<Literal>),
    Tuple(Vec<Literal>),
    Binary(Vec<u8>),
}

impl Literal {
    /// The text of a string, a list of character codes (`[]` is `""`) or a UTF-8 binary: what
    /// OTP accepts as a file name.
    pub fn as_text(&self) -> Option<String> {
        match self {
            Literal::Str(s) => Some(s.clone()),
            Literal::List(items) => items
                .iter()
                .map(|i| match i {
                    Literal::Int(c) => u32::try_from(*c).ok().and_then(char::from_u32),
                    _ => None,
                })
                .collect(),
            Literal::Binary(b) => String::from_utf8(b.clone()).ok(),
            _ => None,
        }
    }

    pub fn as_atom(&self) -> Option<&str> {
        match self {
            Literal::Atom(a) => Some(a),
            _ => None,
        }
    }

    /// The elements of a list; a string literal is a list too (of its characters).
    pub fn as_list(&self) -> Option<Vec<Literal>> {
        match self {
            Literal::List(items) => Some(items.clone()),
            Literal::Str(s) => Some(s.chars().map(|c| Literal::Int(c as i128)).collect()),
            _ => None,
        }
    }
}

impl fmt::Display for Literal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let join = |f: &mut fmt::Formatter<'_>, items: &[Literal]| -> fmt::Result {
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    f.write_str(",")?;
                }
                write!(f, "{item}")?;
            }
            Ok(())
        };
        match self {
            Literal::Atom(a) if is_bare_atom(a) => f.write_str(a),
            Literal::Atom(a) => write!(f, "'{}'", a.replace('\\', "\\\\").replace('\'', "\\'")),
            Literal::Str(s) => write!(f, "{s:?}"),
            Literal::Int(i) => write!(f, "{i}"),
            Literal::Float(x) => write!(f, "{x:?}"),
            Literal::List(items) => {
                f.write_str("[")?;
                join(f, items)?;
                f.write_str("]")
            }
            Literal::Tuple(items) => {
                f.write_str("{")?;
                join(f, items)?;
                f.write_str("}")
            }
            Literal::Binary(b) => match std::str::from_utf8(b) {
                Ok(s) => write!(f, "<<{s:?}>>"),
                Err(_) => write!(f, "<<{} bytes>>", b.len()),
            },
        }
    }
}

fn is_bare_atom(a: &str) -> bool {
    let mut chars = a.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '@')
}

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("line {line}: {message}")]
pub struct ConsultError {
    pub line: usize,
    pub message: String,
}

/// Parses the text of a file holding one term followed by a full stop.
pub fn parse(text: &str) -> Result<Literal, ConsultError> {
    let mut parser = Parser {
        chars: text.chars().collect(),
        at: 0,
        line: 1,
    };
    let term = parser.term()?;
    parser.skip_blank();
    if parser.peek() != Some('.') {
        return Err(parser.error("expected '.' after the term"));
    }
    parser.at += 1;
    parser.skip_blank();
    if parser.peek().is_some() {
        return Err(parser.error("text after the term's full stop (the file holds one term)"));
    }
    Ok(term)
}

/// Reads and parses `path`. Files that are not UTF-8 are read as Latin-1, OTP's default encoding
/// for such files.
pub fn read(path: &std::path::Path) -> Result<Literal, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let text = match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => e.into_bytes().iter().map(|&b| b as char).collect(),
    };
    parse(&text).map_err(|e| e.to_string())
}

struct Parser {
    chars: Vec<char>,
    at: usize,
    line: usize,
}

impl Parser {
    fn error(&self, message: impl Into<String>) -> ConsultError {
        ConsultError {
            line: self.line,
            message: message.into(),
        }
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.at += 1;
        if c == '\n' {
            self.line += 1;
        }
        Some(c)
    }

    fn skip_blank(&mut self) {
        while let Some(c) = self.peek() {
            if c == '%' {
                while self.peek().is_some_and(|c| c != '\n') {
                    self.bump();
                }
            } else if c.is_whitespace() {
                self.bump();
            } else {
                break;
            }
        }
    }

    fn expect(&mut self, wanted: char) -> Result<(), ConsultError> {
        self.skip_blank();
        match self.bump() {
            Some(c) if c == wanted => Ok(()),
            Some(c) => Err(self.error(format!("expected '{wanted}', found '{c}'"))),
            None => Err(self.error(format!("expected '{wanted}', found the end of the file"))),
        }
    }

    fn term(&mut self) -> Result<Literal, ConsultError> {
        self.skip_blank();
        let Some(c) = self.peek() else {
            return Err(self.error("expected a term, found the end of the file"));
        };
        match c {
            '[' => self.sequence('[', ']').map(Literal::List),
            '{' => self.sequence('{', '}').map(Literal::Tuple),
            '<' => self.binary(),
            '"' => {
                let mut text = self.quoted('"')?;
                // Adjacent string literals are one string, as in Erlang source.
                loop {
                    self.skip_blank();
                    if self.peek() != Some('"') {
                        break;
                    }
                    text.push_str(&self.quoted('"')?);
                }
                Ok(Literal::Str(text))
            }
            '\'' => self.quoted('\'').map(Literal::Atom),
            '$' => {
                self.bump();
                let c = match self.bump() {
                    Some('\\') => self.escape()?,
                    Some(c) => c,
                    None => return Err(self.error("'$' at the end of the file")),
                };
                Ok(Literal::Int(c as i128))
            }
            '-' | '+' | '0'..='9' => self.number(),
            c if c.is_lowercase() => {
                let mut name = String::new();
                while let Some(c) = self.peek() {
                    if c.is_alphanumeric() || c == '_' || c == '@' {
                        name.push(c);
                        self.bump();
                    } else {
                        break;
                    }
                }
                Ok(Literal::Atom(name))
            }
            c if c.is_uppercase() || c == '_' => Err(self.error(
                "variables are not allowed (the file holds a literal term; quote atoms that \
                 start with a capital letter)",
            )),
            c => Err(self.error(format!("unexpected '{c}'"))),
        }
    }

    /// Comma-separated terms between `open` and `close`.
    fn sequence(&mut self, open: char, close: char) -> Result<Vec<Literal>, ConsultError> {
        self.expect(open)?;
        let mut items = Vec::new();
        self.skip_blank();
        if self.peek() == Some(close) {
            self.bump();
            return Ok(items);
        }
        loop {
            items.push(self.term()?);
            self.skip_blank();
            match self.bump() {
                Some(',') => continue,
                Some(c) if c == close => return Ok(items),
                Some('|') if close == ']' => {
                    return Err(self.error("improper lists ('|') are not supported"))
                }
                Some(c) => {
                    return Err(self.error(format!("expected ',' or '{close}', found '{c}'")))
                }
                None => return Err(self.error(format!("missing '{close}'"))),
            }
        }
    }

    /// `<<"text", 1, 2>>`: strings and byte values.
    fn binary(&mut self) -> Result<Literal, ConsultError> {
        self.expect('<')?;
        self.expect('<')?;
        let mut bytes = Vec::new();
        self.skip_blank();
        if self.peek() == Some('>') {
            self.expect('>')?;
            self.expect('>')?;
            return Ok(Literal::Binary(bytes));
        }
        loop {
            match self.term()? {
                Literal::Str(s) => bytes.extend_from_slice(s.as_bytes()),
                Literal::Int(i) => bytes.push(
                    u8::try_from(i).map_err(|_| self.error(format!("byte {i} out of range")))?,
                ),
                other => {
                    return Err(self.error(format!("{other} cannot be part of a binary literal")))
                }
            }
            self.skip_blank();
            match self.bump() {
                Some(',') => continue,
                Some('>') if self.peek() == Some('>') => {
                    self.bump();
                    return Ok(Literal::Binary(bytes));
                }
                _ => return Err(self.error("malformed binary literal (expected ',' or '>>')")),
            }
        }
    }

    fn quoted(&mut self, quote: char) -> Result<String, ConsultError> {
        let start = self.line;
        self.bump();
        let mut text = String::new();
        loop {
            match self.bump() {
                None => {
                    return Err(ConsultError {
                        line: start,
                        message: format!("unterminated {quote}...{quote}"),
                    })
                }
                Some(c) if c == quote => return Ok(text),
                Some('\\') => text.push(self.escape()?),
                Some(c) => text.push(c),
            }
        }
    }

    /// The character after a backslash, as Erlang reads escapes.
    fn escape(&mut self) -> Result<char, ConsultError> {
        let c = self
            .bump()
            .ok_or_else(|| self.error("escape at the end of the file"))?;
        Ok(match c {
            'n' => '\n',
            'r' => '\r',
            't' => '\t',
            'v' => '\u{b}',
            'b' => '\u{8}',
            'f' => '\u{c}',
            'e' => '\u{1b}',
            's' => ' ',
            'd' => '\u{7f}',
            '0'..='7' => {
                let mut code = c.to_digit(8).expect("octal digit");
                for _ in 0..2 {
                    match self.peek().and_then(|d| d.to_digit(8)) {
                        Some(d) => {
                            code = code * 8 + d;
                            self.bump();
                        }
                        None => break,
                    }
                }
                char::from_u32(code).expect("at most 0o777")
            }
            'x' => {
                let mut digits = String::new();
                if self.peek() == Some('{') {
                    self.bump();
                    while let Some(d) = self.bump() {
                        if d == '}' {
                            break;
                        }
                        digits.push(d);
                    }
                } else {
                    for _ in 0..2 {
                        if let Some(d) = self.peek().filter(char::is_ascii_hexdigit) {
                            digits.push(d);
                            self.bump();
                        }
                    }
                }
                u32::from_str_radix(&digits, 16)
                    .ok()
                    .and_then(char::from_u32)
                    .ok_or_else(|| self.error(format!("bad \\x escape {digits:?}")))?
            }
            '^' => {
                let c = self
                    .bump()
                    .ok_or_else(|| self.error("escape at the end of the file"))?;
                char::from_u32(c as u32 & 0x1f).expect("below 32")
            }
            other => other,
        })
    }

    fn number(&mut self) -> Result<Literal, ConsultError> {
        let mut text = String::new();
        if let Some(sign @ ('-' | '+')) = self.peek() {
            text.push(sign);
            self.bump();
        }
        let digit_or_separator = |c: char| c.is_ascii_alphanumeric() || c == '_';
        while let Some(c) = self.peek().filter(|&c| c.is_ascii_digit() || c == '_') {
            text.push(c);
            self.bump();
        }
        let negative = text.starts_with('-');
        let unsigned = text.trim_start_matches(['-', '+']).replace('_', "");
        if unsigned.is_empty() {
            return Err(self.error("expected a number after the sign"));
        }
        let signed = |value: i128| if negative { -value } else { value };
        match self.peek() {
            Some('#') => {
                self.bump();
                let base: u32 = unsigned
                    .parse()
                    .ok()
                    .filter(|b| (2..=36).contains(b))
                    .ok_or_else(|| self.error(format!("bad base {unsigned}")))?;
                let mut digits = String::new();
                while let Some(c) = self.peek().filter(|&c| digit_or_separator(c)) {
                    digits.push(c);
                    self.bump();
                }
                i128::from_str_radix(&digits.replace('_', ""), base)
                    .map(|v| Literal::Int(signed(v)))
                    .map_err(|_| self.error(format!("bad base-{base} number {digits:?}")))
            }
            Some('.')
                if self
                    .chars
                    .get(self.at + 1)
                    .is_some_and(char::is_ascii_digit) =>
            {
                let mut float = unsigned;
                float.push('.');
                self.bump();
                while let Some(c) = self
                    .peek()
                    .filter(|&c| c.is_ascii_digit() || matches!(c, 'e' | 'E' | '_'))
                {
                    float.push(c);
                    self.bump();
                    if matches!(c, 'e' | 'E') {
                        if let Some(sign @ ('-' | '+')) = self.peek() {
                            float.push(sign);
                            self.bump();
                        }
                    }
                }
                float
                    .replace('_', "")
                    .parse::<f64>()
                    .map(|v| Literal::Float(if negative { -v } else { v }))
                    .map_err(|_| self.error(format!("bad float {float:?}")))
            }
            _ => unsigned
                .parse::<i128>()
                .map(|v| Literal::Int(signed(v)))
                .map_err(|_| self.error(format!("integer {unsigned} out of range"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn atom(a: &str) -> Literal {
        Literal::Atom(a.into())
    }

    fn tuple(items: Vec<Literal>) -> Literal {
        Literal::Tuple(items)
    }

    #[test]
    fn reads_an_ssl_dist_optfile() {
        let text = r#"
            %% TLS distribution options, as for `erl -ssl_dist_optfile`.
            [{server, [{certfile, "/etc/ssl/node.pem"},   % the node's certificate
                       {keyfile, "/etc/ssl/node" ".key"},
                       {verify, verify_peer},
                       {fail_if_no_peer_cert, true},
                       {depth, 2},
                       {versions, ['tlsv1.2', 'tlsv1.3']}]},
             {client, [{cacertfile, <<"/etc/ssl/ca.pem">>},
                       {server_name_indication, disable}]}].
        "#;
        let expected = Literal::List(vec![
            tuple(vec![
                atom("server"),
                Literal::List(vec![
                    tuple(vec![
                        atom("certfile"),
                        Literal::Str("/etc/ssl/node.pem".into()),
                    ]),
                    tuple(vec![
                        atom("keyfile"),
                        Literal::Str("/etc/ssl/node.key".into()),
                    ]),
                    tuple(vec![atom("verify"), atom("verify_peer")]),
                    tuple(vec![atom("fail_if_no_peer_cert"), atom("true")]),
                    tuple(vec![atom("depth"), Literal::Int(2)]),
                    tuple(vec![
                        atom("versions"),
                        Literal::List(vec![atom("tlsv1.2"), atom("tlsv1.3")]),
                    ]),
                ]),
            ]),
            tuple(vec![
                atom("client"),
                Literal::List(vec![
                    tuple(vec![
                        atom("cacertfile"),
                        Literal::Binary(b"/etc/ssl/ca.pem".to_vec()),
                    ]),
                    tuple(vec![atom("server_name_indication"), atom("disable")]),
                ]),
            ]),
        ]);
        assert_eq!(parse(text).unwrap(), expected);
    }

    #[test]
    fn reads_escapes_numbers_and_quoted_atoms() {
        let term = parse(
            r#"{"a\"b\\c\n\x41\x{263a}\101\s", 'It\'s', -16#ff, 2#101, $a, $\n, 1.5e3, 1_000}."#,
        )
        .unwrap();
        assert_eq!(
            term,
            tuple(vec![
                Literal::Str("a\"b\\c\nA\u{263a}A ".into()),
                atom("It's"),
                Literal::Int(-255),
                Literal::Int(5),
                Literal::Int(97),
                Literal::Int(10),
                Literal::Float(1500.0),
                Literal::Int(1000),
            ])
        );
    }

    #[test]
    fn text_of_strings_lists_and_binaries() {
        assert_eq!(parse(r#""a/b"."#).unwrap().as_text().unwrap(), "a/b");
        assert_eq!(parse("[$a, $/, 98].").unwrap().as_text().unwrap(), "a/b");
        assert_eq!(parse("[].").unwrap().as_text().unwrap(), "");
        assert_eq!(parse(r#"<<"a/b">>."#).unwrap().as_text().unwrap(), "a/b");
        assert_eq!(parse("[a].").unwrap().as_text(), None);
        assert_eq!(parse(r#""ab"."#).unwrap().as_list().unwrap().len(), 2);
    }

    #[test]
    fn errors_name_the_line() {
        let error = |text: &str| parse(text).unwrap_err();
        assert_eq!(error("[{server, []}]").line, 1);
        assert!(error("[{server, []}]").message.contains("'.'"));
        assert_eq!(error("[\n{server,\n Opts}].").line, 3);
        assert!(error("[\n{server,\n Opts}].").message.contains("variables"));
        assert_eq!(error("[\"abc\n\n].").line, 1);
        assert!(error("[a | b].").message.contains("improper"));
        assert!(error("[a]. [b].").message.contains("one term"));
        assert!(error("{a b}.").message.contains("expected ','"));
        assert!(error("[a, ").message.contains("end of the file"));
    }

    #[test]
    fn displays_as_erlang() {
        let term = parse(r#"[{verify, 'Bad Atom'}, "x", <<"y">>, 3]."#).unwrap();
        assert_eq!(term.to_string(), r#"[{verify,'Bad Atom'},"x",<<"y">>,3]"#);
    }
}
