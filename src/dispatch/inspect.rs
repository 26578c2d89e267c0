//! Elixir-style rendering of terms for error texts.
//!
//! Callback failures reach the user as `{:error, {:runtime_error, text}}` in an Elixir shell, so
//! the pids, atoms and reasons named in that text are written the way Elixir's `inspect/1` writes
//! them (`:boom`, `{:cb, :"a@b"}`, `#PID<0.112.0>`), not in eetf's Erlang-ish `Display`. Output is
//! bounded: a huge term in a bad reply must not produce a megabyte error message.

use crate::node::Dest;
use eetf::{Pid, Term};
use std::fmt::Write;

/// Longest rendering returned by [`inspect`] (longer ones end in `...`).
const MAX_LEN: usize = 300;

/// `inspect(term)` in Elixir syntax, truncated to a few hundred characters.
pub fn inspect(term: &Term) -> String {
    let mut out = String::new();
    write_term(term, &mut out);
    truncate(out)
}

/// An exit reason: bare text for an atom (`boom`), else [`inspect`].
pub fn reason(term: &Term) -> String {
    match term {
        Term::Atom(a) => a.name.clone(),
        other => inspect(other),
    }
}

/// A pid as its own node prints it, `#PID<0.id.serial>` (the node is named separately).
pub fn pid(p: &Pid) -> String {
    format!("#PID<0.{}.{}>", p.id, p.serial)
}

/// A callback target: `#PID<0.12.0> on node a@b`, or `{:name, :"node"}` for a registered name.
pub fn dest(d: &Dest, local_node: &str) -> String {
    match d {
        Dest::Pid(p) => format!("{} on node {}", pid(p), p.node.name),
        Dest::Name(name) => format!("{{{}, {}}}", atom(name), atom(local_node)),
        Dest::Remote { name, node } => format!("{{{}, {}}}", atom(name), atom(node)),
    }
}

/// `:name`, quoted when Elixir would quote it.
pub fn atom(name: &str) -> String {
    if matches!(name, "nil" | "true" | "false") {
        return name.to_string();
    }
    let mut chars = name.chars();
    let simple = match chars.next() {
        Some(c) if c.is_ascii_lowercase() || c == '_' => {
            let rest: Vec<char> = chars.collect();
            let body = match rest.last() {
                Some('?') | Some('!') => &rest[..rest.len() - 1],
                _ => &rest[..],
            };
            body.iter()
                .all(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '@')
        }
        _ => false,
    };
    if simple {
        format!(":{name}")
    } else {
        format!(":{}", quoted(name))
    }
}

fn quoted(text: &str) -> String {
    let mut s = String::with_capacity(text.len() + 2);
    s.push('"');
    for c in text.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\t' => s.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(s, "\\x{{{:X}}}", c as u32);
            }
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

fn truncate(mut s: String) -> String {
    if s.len() > MAX_LEN {
        let mut cut = MAX_LEN;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

/// Comma-separated byte values, cut off once the text is long enough.
fn write_bytes(bytes: &[u8], out: &mut String) {
    for (i, byte) in bytes.iter().enumerate() {
        if out.len() > MAX_LEN {
            break;
        }
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "{byte}");
    }
}

fn write_seq<'a>(items: impl Iterator<Item = &'a Term>, out: &mut String) {
    for (i, t) in items.enumerate() {
        if out.len() > MAX_LEN {
            return;
        }
        if i > 0 {
            out.push_str(", ");
        }
        write_term(t, out);
    }
}

fn write_term(term: &Term, out: &mut String) {
    if out.len() > MAX_LEN {
        return;
    }
    match term {
        Term::Atom(a) => out.push_str(&atom(&a.name)),
        Term::FixInteger(i) => {
            let _ = write!(out, "{}", i.value);
        }
        Term::BigInteger(b) => {
            let _ = write!(out, "{}", b.value);
        }
        Term::Float(f) => {
            let _ = write!(out, "{:?}", f.value);
        }
        Term::Pid(p) => out.push_str(&pid(p)),
        Term::Reference(r) => {
            let _ = write!(out, "#Reference<0");
            for n in &r.id {
                let _ = write!(out, ".{n}");
            }
            out.push('>');
        }
        Term::Binary(b) => match std::str::from_utf8(&b.bytes) {
            Ok(s)
                if !s
                    .chars()
                    .any(|c| c.is_control() && !matches!(c, '\n' | '\t')) =>
            {
                out.push_str(&quoted(s))
            }
            _ => {
                out.push_str("<<");
                write_bytes(&b.bytes, out);
                out.push_str(">>");
            }
        },
        Term::List(l) => {
            out.push('[');
            write_seq(l.elements.iter(), out);
            out.push(']');
        }
        Term::ImproperList(l) => {
            out.push('[');
            write_seq(l.elements.iter(), out);
            out.push_str(" | ");
            write_term(&l.last, out);
            out.push(']');
        }
        Term::ByteList(b) => {
            out.push('[');
            write_bytes(&b.bytes, out);
            out.push(']');
        }
        Term::Tuple(t) => {
            out.push('{');
            write_seq(t.elements.iter(), out);
            out.push('}');
        }
        Term::Map(m) => {
            out.push_str("%{");
            for (i, (k, v)) in m.map.iter().enumerate() {
                if out.len() > MAX_LEN {
                    break;
                }
                if i > 0 {
                    out.push_str(", ");
                }
                write_term(k, out);
                out.push_str(" => ");
                write_term(v, out);
            }
            out.push('}');
        }
        other => {
            let _ = write!(out, "{other}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::term::{atom as a, binary, int, list, tuple};

    #[test]
    fn renders_like_elixir() {
        assert_eq!(inspect(&a("boom")), ":boom");
        assert_eq!(inspect(&a("a@b")), ":a@b");
        assert_eq!(inspect(&a("cb-1@host")), ":\"cb-1@host\"");
        assert_eq!(inspect(&a("nil")), "nil");
        assert_eq!(
            inspect(&tuple(vec![a("error"), binary(b"bad".to_vec()), int(3)])),
            "{:error, \"bad\", 3}"
        );
        assert_eq!(inspect(&list(vec![binary(vec![0, 255])])), "[<<0, 255>>]");
        assert_eq!(reason(&a("boom")), "boom");
        assert!(inspect(&binary(vec![b'x'; 10_000])).len() < 400);
        let p = Pid::new("x@y", 112, 0, 1);
        assert_eq!(dest(&Dest::Pid(p), "me@h"), "#PID<0.112.0> on node x@y");
        assert_eq!(dest(&Dest::Name("cb".into()), "me@h"), "{:cb, :me@h}");
    }
}
