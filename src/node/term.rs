//! Erlang terms as they cross the wire: a bounds-and-depth check in front of `eetf`, plus small
//! builders for the terms the node itself makes.
//!
//! `eetf` decodes recursively, pre-allocates from untrusted length fields and panics on tags it
//! does not implement (atom cache references, distribution headers). Every byte that comes off a
//! socket is therefore walked first by [`scan`], an iterative checker that knows each tag's layout:
//! it finds where a term ends, rejects unknown or unsupported tags, checks every length against the
//! bytes that are really there and bounds the nesting depth. Only then is the slice handed to eetf.
//! OTP 29's native records, which eetf does not know, are rewritten into tuples on the way
//! (see [`native_record`]).

use super::native_record::{self, RECORD_EXT};
use bytes::Bytes;
use eetf::{Atom, Binary, FixInteger, List, Term, Tuple};
use std::io::Read;

/// Deepest nesting of containers accepted from the network. The BEAM has no such limit, but the
/// decoder, encoder and `Drop` of `eetf::Term` recurse, so an unbounded depth would let a peer
/// overflow our stack. Real messages stay far below this.
pub const MAX_DEPTH: usize = 1000;

const VERSION_MAGIC: u8 = 131;

/// Why a term was rejected before decoding.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TermError {
    #[error("term truncated at byte {0}")]
    Truncated(usize),
    #[error("unsupported term tag {tag} at byte {at}")]
    UnsupportedTag { tag: u8, at: usize },
    #[error("term nested deeper than {MAX_DEPTH} levels")]
    TooDeep,
    #[error("malformed term at byte {0}: {1}")]
    Malformed(usize, &'static str),
    #[error("term decoder failed: {0}")]
    Decode(String),
}

/// What [`scan`] found out about a term.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scanned {
    /// Offset just past the term.
    pub end: usize,
    /// Whether it holds native records (`RECORD_EXT`), which decoding rewrites into tuples.
    pub native_records: bool,
}

/// Walks one term in external format (without the version byte) starting at `start` and says
/// where it ends. Iterative: `pending` counts how many terms each open container still owes, so
/// depth costs heap, not stack.
pub fn scan(buf: &[u8], start: usize) -> Result<Scanned, TermError> {
    let mut pos = start;
    let mut native_records = false;
    let mut pending: Vec<u64> = vec![1];
    while let Some(top) = pending.last_mut() {
        if *top == 0 {
            pending.pop();
            continue;
        }
        *top -= 1;
        let Head {
            tag, end, children, ..
        } = head(buf, pos, buf.len())?;
        native_records |= tag == RECORD_EXT;
        pos = end;
        if children > 0 {
            // Every term takes at least one byte: a count beyond the bytes left is a lie.
            if children > (buf.len() - pos) as u64 {
                return Err(TermError::Truncated(pos));
            }
            if pending.len() > MAX_DEPTH {
                return Err(TermError::TooDeep);
            }
            pending.push(children);
        }
    }
    Ok(Scanned {
        end: pos,
        native_records,
    })
}

/// The layout of one term as [`head`] reads it from its tag and header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub tag: u8,
    /// Offset just past the term's own bytes (tag, header fields, inline data); its child terms,
    /// if any, follow from there.
    pub end: usize,
    /// How many child terms follow.
    pub children: u64,
    /// For NEW_FUN_EXT: where its Size field says the whole fun, children included, ends.
    pub fun_end: Option<usize>,
}

/// Reads the tag at `buf[at]` and the header fields that give its layout. Each field that is read
/// (lengths, counts, an atom's text) must lie in `buf`; lengths that are only skipped (a binary's
/// data, integers, ids) are checked against `limit` instead. [`scan`] passes `buf.len()`; the
/// reassembly of fragmented messages passes `usize::MAX` to walk a message whose later bytes have
/// not arrived yet, and so only ever gets [`TermError::Truncated`] for a field not yet in `buf`.
pub fn head(buf: &[u8], at: usize, limit: usize) -> Result<Head, TermError> {
    let mut pos = at;
    let tag = byte(buf, pos)?;
    pos += 1;
    let mut fun_end = None;
    let children: u64 = match tag {
        97 => skip(limit, &mut pos, 1)?,  // SMALL_INTEGER_EXT
        98 => skip(limit, &mut pos, 4)?,  // INTEGER_EXT
        70 => skip(limit, &mut pos, 8)?,  // NEW_FLOAT_EXT
        99 => skip(limit, &mut pos, 31)?, // FLOAT_EXT
        106 => 0,                         // NIL_EXT
        100 | 118 => {
            // ATOM_EXT, ATOM_UTF8_EXT
            let len = u16_at(buf, &mut pos)? as usize;
            atom_text(buf, &mut pos, len, tag == 118)?;
            0
        }
        115 | 119 => {
            // SMALL_ATOM_EXT, SMALL_ATOM_UTF8_EXT
            let len = byte(buf, pos)? as usize;
            pos += 1;
            atom_text(buf, &mut pos, len, tag == 119)?;
            0
        }
        107 => {
            // STRING_EXT
            let len = u16_at(buf, &mut pos)? as usize;
            skip(limit, &mut pos, len)?
        }
        109 => {
            // BINARY_EXT
            let len = u32_at(buf, &mut pos)? as usize;
            skip(limit, &mut pos, len)?
        }
        77 => {
            // BIT_BINARY_EXT: the last byte holds 1..=8 significant bits
            let len = u32_at(buf, &mut pos)? as usize;
            let bits = byte(buf, pos)?;
            pos += 1;
            if len == 0 && bits != 0 || len > 0 && !(1..=8).contains(&bits) {
                return Err(TermError::Malformed(at, "bit count out of range"));
            }
            skip(limit, &mut pos, len)?
        }
        110 | 111 => {
            // SMALL_BIG_EXT, LARGE_BIG_EXT
            let n = if tag == 110 {
                let n = byte(buf, pos)? as usize;
                pos += 1;
                n
            } else {
                u32_at(buf, &mut pos)? as usize
            };
            let sign = byte(buf, pos)?;
            if sign > 1 {
                return Err(TermError::Malformed(at, "bignum sign"));
            }
            pos += 1;
            skip(limit, &mut pos, n)?
        }
        104 => {
            // SMALL_TUPLE_EXT
            let arity = byte(buf, pos)? as u64;
            pos += 1;
            arity
        }
        105 => u32_at(buf, &mut pos)? as u64, // LARGE_TUPLE_EXT
        108 => u32_at(buf, &mut pos)? as u64 + 1, // LIST_EXT: elements + tail
        116 => u32_at(buf, &mut pos)? as u64 * 2, // MAP_EXT: keys and values
        88 | 103 | 89 | 102 | 120 => {
            // Pids and ports: the node atom, then a fixed-size body.
            let body = match tag {
                88 => 12, // NEW_PID_EXT: id, serial, creation (4 bytes each)
                103 => 9, // PID_EXT: id, serial (4 bytes each), creation (1)
                89 => 8,  // NEW_PORT_EXT: id, creation (4 bytes each)
                102 => 5, // PORT_EXT: id (4 bytes), creation (1)
                _ => 12,  // V4_PORT_EXT: id (8 bytes), creation (4)
            };
            atom_only(buf, &mut pos)?;
            skip(limit, &mut pos, body)?
        }
        90 | 114 => {
            // NEWER_REFERENCE_EXT, NEW_REFERENCE_EXT
            let len = u16_at(buf, &mut pos)? as usize;
            if !(1..=5).contains(&len) {
                return Err(TermError::Malformed(at, "reference length"));
            }
            atom_only(buf, &mut pos)?;
            let creation = if tag == 90 { 4 } else { 1 };
            skip(limit, &mut pos, creation + 4 * len)?
        }
        101 => {
            // REFERENCE_EXT
            atom_only(buf, &mut pos)?;
            skip(limit, &mut pos, 5)?
        }
        113 => 3, // EXPORT_EXT: module, function, arity
        112 => {
            // NEW_FUN_EXT: Size, Arity, Uniq[16], Index, NumFree, then Module, OldIndex,
            // OldUniq, Pid and NumFree free variables.
            let size_at = pos;
            let size = u32_at(buf, &mut pos)? as usize;
            let end = size_at.checked_add(size);
            if size < 4 || end.is_none_or(|end| end > limit) {
                return Err(TermError::Truncated(size_at));
            }
            fun_end = end;
            skip(limit, &mut pos, 1 + 16 + 4)?;
            let num_free = u32_at(buf, &mut pos)? as u64;
            4 + num_free
        }
        117 => {
            // FUN_EXT (old): NumFree, Pid, Module, Index, Uniq, free variables
            let num_free = u32_at(buf, &mut pos)? as u64;
            4 + num_free
        }
        RECORD_EXT => {
            // OTP 29: field count, flags, then module, name, field names and values.
            let fields = u32_at(buf, &mut pos)?;
            let flags = byte(buf, pos)?;
            pos += 1;
            native_record::children(fields, flags).map_err(|why| TermError::Malformed(at, why))?
        }
        _ => return Err(TermError::UnsupportedTag { tag, at }),
    };
    Ok(Head {
        tag,
        end: pos,
        children,
        fun_end,
    })
}

fn byte(buf: &[u8], pos: usize) -> Result<u8, TermError> {
    buf.get(pos).copied().ok_or(TermError::Truncated(pos))
}

/// Advances past `n` bytes that must end within `limit`; returns 0 (no child terms) for use in
/// the tag table.
fn skip(limit: usize, pos: &mut usize, n: usize) -> Result<u64, TermError> {
    match pos.checked_add(n) {
        Some(end) if end <= limit => {
            *pos = end;
            Ok(0)
        }
        _ => Err(TermError::Truncated(*pos)),
    }
}

fn u16_at(buf: &[u8], pos: &mut usize) -> Result<u16, TermError> {
    let bytes = buf.get(*pos..*pos + 2).ok_or(TermError::Truncated(*pos))?;
    *pos += 2;
    Ok(u16::from_be_bytes([bytes[0], bytes[1]]))
}

fn u32_at(buf: &[u8], pos: &mut usize) -> Result<u32, TermError> {
    let bytes = buf.get(*pos..*pos + 4).ok_or(TermError::Truncated(*pos))?;
    *pos += 4;
    Ok(u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
}

fn atom_text(buf: &[u8], pos: &mut usize, len: usize, utf8: bool) -> Result<(), TermError> {
    let at = *pos;
    skip(buf.len(), pos, len)?;
    if utf8 && std::str::from_utf8(&buf[at..at + len]).is_err() {
        return Err(TermError::Malformed(at, "atom is not UTF-8"));
    }
    Ok(())
}

/// The node field of pids, ports and references must be an atom.
fn atom_only(buf: &[u8], pos: &mut usize) -> Result<(), TermError> {
    let tag = byte(buf, *pos)?;
    *pos += 1;
    match tag {
        100 | 118 => {
            let len = u16_at(buf, pos)? as usize;
            atom_text(buf, pos, len, tag == 118)
        }
        115 | 119 => {
            let len = byte(buf, *pos)? as usize;
            *pos += 1;
            atom_text(buf, pos, len, tag == 119)
        }
        _ => Err(TermError::Malformed(*pos - 1, "expected an atom")),
    }
}

/// A term decoded from a buffer by [`decode_at`].
#[derive(Debug)]
pub struct Decoded {
    pub term: Term,
    /// Offset just past the term in the buffer.
    pub end: usize,
    /// Whether it held native records, now tuples (see [`native_record`]).
    pub native_records: bool,
}

/// Checks and decodes one term without version byte from `buf[start..]`.
pub fn decode_at(buf: &[u8], start: usize) -> Result<Decoded, TermError> {
    let Scanned {
        end,
        native_records,
    } = scan(buf, start)?;
    let body = &buf[start..end];
    let rewritten;
    let body = if native_records {
        rewritten = native_record::rewrite(body)?;
        &rewritten[..]
    } else {
        body
    };
    // eetf wants the version byte in front; chaining avoids copying the body.
    let reader = [VERSION_MAGIC].chain(body);
    let term = std::panic::catch_unwind(|| Term::decode(reader))
        .map_err(|_| TermError::Decode("decoder panicked".into()))?
        .map_err(|e| TermError::Decode(e.to_string()))?;
    Ok(Decoded {
        term,
        end,
        native_records,
    })
}

/// Decodes a complete `term_to_binary` result (with version byte), rejecting trailing bytes.
pub fn binary_to_term(bytes: &[u8]) -> Result<Term, TermError> {
    match bytes.first() {
        Some(&VERSION_MAGIC) => {}
        Some(_) => return Err(TermError::Malformed(0, "missing version byte 131")),
        None => return Err(TermError::Truncated(0)),
    }
    let Decoded { term, end, .. } = decode_at(bytes, 1)?;
    if end != bytes.len() {
        return Err(TermError::Malformed(end, "trailing bytes after term"));
    }
    Ok(term)
}

/// `term_to_binary`: the external format with version byte.
pub fn term_to_binary(term: &Term) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(term, &mut out);
    out
}

/// Appends `term` in external format *with* its version byte.
pub fn encode_into(term: &Term, out: &mut Vec<u8>) {
    // Encoding into a Vec only fails for values eetf cannot represent (e.g. a reference with more
    // than 65535 words), which the node never builds.
    term.encode(out)
        .expect("encoding a well-formed term into memory");
}

/// Appends `term` in external format *without* the version byte, as terms follow a
/// distribution header.
pub fn encode_bare_into(term: &Term, out: &mut Vec<u8>) {
    // The slack covers small terms the hint undercounts: growing a 16 MiB buffer by a few bytes
    // at the end would copy all of it once more.
    out.reserve(size_hint(term, 0) + 256);
    let mut writer = SkipVersionByte {
        out,
        skipped: false,
    };
    term.encode(&mut writer)
        .expect("encoding a well-formed term into memory");
}

/// Binaries at least this large are moved out of their term into a chunk of their own when the
/// term is encoded by value ([`encode_bare_owned`]), instead of being copied.
pub const SHARED_BINARY: usize = 64 * 1024;

/// An encoded term (or message) as a list of chunks: runs of encoded bytes, and large binaries
/// moved out of the term without a copy. The writer hands them to `writev` as they are.
#[derive(Default)]
pub struct Chunks {
    done: Vec<Bytes>,
    current: Vec<u8>,
    len: usize,
}

impl Chunks {
    pub fn new() -> Chunks {
        Chunks::default()
    }

    /// Total encoded length.
    pub fn len(&self) -> usize {
        self.len + self.current.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The buffer small encodings are appended to.
    pub fn bytes_mut(&mut self) -> &mut Vec<u8> {
        &mut self.current
    }

    fn put_shared(&mut self, bytes: Vec<u8>) {
        if !self.current.is_empty() {
            let current = std::mem::take(&mut self.current);
            self.len += current.len();
            self.done.push(Bytes::from(current));
        }
        self.len += bytes.len();
        self.done.push(Bytes::from(bytes));
    }

    /// Overwrites the first four bytes (a length prefix reserved before encoding).
    pub fn set_prefix(&mut self, prefix: [u8; 4]) {
        match self.done.first_mut() {
            None => self.current[..4].copy_from_slice(&prefix),
            Some(first) => {
                // The first chunk is always encoded bytes (a shared binary follows a header), so
                // it is small: rebuilding it is cheap.
                let mut rebuilt = first.to_vec();
                rebuilt[..4].copy_from_slice(&prefix);
                *first = Bytes::from(rebuilt);
            }
        }
    }

    pub fn into_chunks(mut self) -> Vec<Bytes> {
        if !self.current.is_empty() || self.done.is_empty() {
            self.done.push(Bytes::from(self.current));
        }
        self.done
    }
}

/// Encodes `term` (without the version byte) into `out`, moving binaries of at least
/// [`SHARED_BINARY`] bytes into chunks of their own: a 16 MiB reply is not copied to be sent.
pub fn encode_bare_owned(term: Term, out: &mut Chunks) {
    if !has_shared_binary(&term, 0) {
        return encode_bare_into(&term, out.bytes_mut());
    }
    match term {
        Term::Binary(b) => {
            out.current.push(BINARY_EXT);
            out.current
                .extend_from_slice(&(b.bytes.len() as u32).to_be_bytes());
            out.put_shared(b.bytes);
        }
        Term::Tuple(t) => {
            if t.elements.len() < 0x100 {
                out.current
                    .extend_from_slice(&[SMALL_TUPLE_EXT, t.elements.len() as u8]);
            } else {
                out.current.push(LARGE_TUPLE_EXT);
                out.current
                    .extend_from_slice(&(t.elements.len() as u32).to_be_bytes());
            }
            for e in t.elements {
                encode_bare_owned(e, out);
            }
        }
        Term::List(l) => {
            out.current.push(LIST_EXT);
            out.current
                .extend_from_slice(&(l.elements.len() as u32).to_be_bytes());
            for e in l.elements {
                encode_bare_owned(e, out);
            }
            out.current.push(NIL_EXT);
        }
        Term::ImproperList(l) => {
            out.current.push(LIST_EXT);
            out.current
                .extend_from_slice(&(l.elements.len() as u32).to_be_bytes());
            for e in l.elements {
                encode_bare_owned(e, out);
            }
            encode_bare_owned(*l.last, out);
        }
        Term::Map(m) => {
            out.current.push(MAP_EXT);
            out.current
                .extend_from_slice(&(m.map.len() as u32).to_be_bytes());
            for (k, v) in m.map {
                encode_bare_owned(k, out);
                encode_bare_owned(v, out);
            }
        }
        other => encode_bare_into(&other, out.bytes_mut()),
    }
}

/// Whether `term` holds a binary of at least [`SHARED_BINARY`] bytes (within the depth bound).
fn has_shared_binary(term: &Term, depth: usize) -> bool {
    if depth > MAX_DEPTH {
        return false;
    }
    match term {
        Term::Binary(b) => b.bytes.len() >= SHARED_BINARY,
        Term::Tuple(t) => t.elements.iter().any(|e| has_shared_binary(e, depth + 1)),
        Term::List(l) => l.elements.iter().any(|e| has_shared_binary(e, depth + 1)),
        Term::ImproperList(l) => {
            l.elements.iter().any(|e| has_shared_binary(e, depth + 1))
                || has_shared_binary(&l.last, depth + 1)
        }
        Term::Map(m) => m
            .map
            .iter()
            .any(|(k, v)| has_shared_binary(k, depth + 1) || has_shared_binary(v, depth + 1)),
        _ => false,
    }
}

const SMALL_TUPLE_EXT: u8 = 104;
const LARGE_TUPLE_EXT: u8 = 105;
const NIL_EXT: u8 = 106;
const LIST_EXT: u8 = 108;
pub(crate) const BINARY_EXT: u8 = 109;
const MAP_EXT: u8 = 116;

/// Drops the version byte eetf writes first, so that a large payload is written once instead of
/// being shifted afterwards.
struct SkipVersionByte<'a> {
    out: &'a mut Vec<u8>,
    skipped: bool,
}

impl std::io::Write for SkipVersionByte<'_> {
    fn write(&mut self, mut buf: &[u8]) -> std::io::Result<usize> {
        let n = buf.len();
        if !self.skipped && !buf.is_empty() {
            self.skipped = true;
            buf = &buf[1..];
        }
        self.out.extend_from_slice(buf);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Roughly how many bytes `term` encodes to: exact for binaries and atoms, a generous guess for
/// the rest (pids and references carry their node's name). Lets the encoder reserve once instead
/// of growing a large buffer.
fn size_hint(term: &Term, depth: usize) -> usize {
    if depth > MAX_DEPTH {
        return 0;
    }
    match term {
        Term::Binary(b) => 5 + b.bytes.len(),
        Term::BitBinary(b) => 6 + b.bytes.len(),
        Term::Atom(a) => 3 + a.name.len(),
        Term::Tuple(t) => {
            5 + t
                .elements
                .iter()
                .map(|e| size_hint(e, depth + 1))
                .sum::<usize>()
        }
        Term::List(l) => {
            6 + l
                .elements
                .iter()
                .map(|e| size_hint(e, depth + 1))
                .sum::<usize>()
        }
        Term::Map(m) => {
            5 + m
                .map
                .iter()
                .map(|(k, v)| size_hint(k, depth + 1) + size_hint(v, depth + 1))
                .sum::<usize>()
        }
        Term::Pid(p) => 16 + p.node.name.len(),
        Term::Port(p) => 20 + p.node.name.len(),
        Term::Reference(r) => 11 + r.node.name.len() + 4 * r.id.len(),
        _ => 32,
    }
}

// ---- builders ----------------------------------------------------------------------------------

pub fn atom(name: &str) -> Term {
    Term::from(Atom::from(name))
}

/// `true` or `false`, the atoms Erlang's booleans are.
pub fn boolean(value: bool) -> Term {
    atom(if value { "true" } else { "false" })
}

pub fn tuple(elements: Vec<Term>) -> Term {
    Term::from(Tuple::from(elements))
}

pub fn list(elements: Vec<Term>) -> Term {
    Term::from(List::from(elements))
}

pub fn int(value: i64) -> Term {
    if let Ok(small) = i32::try_from(value) {
        Term::from(FixInteger::from(small))
    } else {
        Term::from(eetf::BigInteger::from(value))
    }
}

pub fn binary(bytes: Vec<u8>) -> Term {
    Term::from(Binary::from(bytes))
}

/// A map with atom keys, as Elixir writes `%{key: value}`.
pub fn map(entries: Vec<(&str, Term)>) -> Term {
    let entries: std::collections::HashMap<Term, Term> =
        entries.into_iter().map(|(k, v)| (atom(k), v)).collect();
    Term::from(eetf::Map::from(entries))
}

pub fn ok(value: Term) -> Term {
    tuple(vec![atom("ok"), value])
}

pub fn error(value: Term) -> Term {
    tuple(vec![atom("error"), value])
}

/// `{:error, {kind, message}}` with the message as a binary, the shape Elixir callers match on.
pub fn error_kind(kind: &str, message: impl Into<String>) -> Term {
    error(tuple(vec![atom(kind), binary(message.into().into_bytes())]))
}

/// The atom's text if `term` is an atom.
pub fn as_atom(term: &Term) -> Option<&str> {
    match term {
        Term::Atom(a) => Some(a.name.as_str()),
        _ => None,
    }
}

/// A term's integer value if it fits in an i64.
pub fn as_i64(term: &Term) -> Option<i64> {
    match term {
        Term::FixInteger(i) => Some(i64::from(i.value)),
        Term::BigInteger(b) => i64::try_from(&b.value).ok(),
        _ => None,
    }
}

/// The elements of a tuple of exactly `n` elements.
pub fn as_tuple(term: &Term, n: usize) -> Option<&[Term]> {
    match term {
        Term::Tuple(t) if t.elements.len() == n => Some(&t.elements),
        _ => None,
    }
}

/// The elements of a proper list (`[]` included; Erlang strings arrive as byte lists).
pub fn as_list(term: &Term) -> Option<Vec<Term>> {
    match term {
        Term::List(l) => Some(l.elements.clone()),
        Term::ByteList(b) => Some(b.bytes.iter().map(|&b| int(i64::from(b))).collect()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(term: &Term) -> Term {
        binary_to_term(&term_to_binary(term)).unwrap()
    }

    #[test]
    fn scans_and_roundtrips_common_terms() {
        let t = tuple(vec![
            atom("héllo"),
            int(1 << 40),
            list(vec![int(1), binary(vec![1, 2, 3])]),
            Term::from(eetf::Pid::new("a@b", 1, 2, 3)),
        ]);
        assert_eq!(roundtrip(&t), t);
    }

    #[test]
    fn rejects_deep_nesting_without_recursion() {
        let depth = 1_000_000;
        let mut bytes = vec![131];
        for _ in 0..depth {
            bytes.extend_from_slice(&[104, 1]);
        }
        bytes.push(106);
        assert_eq!(binary_to_term(&bytes), Err(TermError::TooDeep));
    }

    #[test]
    fn rejects_lying_lengths_and_unknown_tags() {
        assert!(matches!(
            binary_to_term(&[131, 108, 255, 255, 255, 255, 106]),
            Err(TermError::Truncated(_))
        ));
        assert!(matches!(
            binary_to_term(&[131, 109, 0, 0, 0, 9, 1]),
            Err(TermError::Truncated(_))
        ));
        assert!(matches!(
            binary_to_term(&[131, 82, 0]),
            Err(TermError::UnsupportedTag { tag: 82, .. })
        ));
        assert!(matches!(
            binary_to_term(&[131, 77, 0, 0, 0, 1, 0, 5]),
            Err(TermError::Malformed(..))
        ));
        assert!(binary_to_term(&[131]).is_err());
    }

    #[test]
    fn accepts_a_million_element_list() {
        let t = list((0..1_000_000).map(|i| int(i % 200)).collect());
        assert_eq!(roundtrip(&t), t);
    }

    #[test]
    fn head_reads_layouts_before_the_data_arrives() {
        // A binary's header is enough to know where it ends; `scan`'s limit is the buffer.
        let binary = [109, 0, 0, 1, 0, 42];
        let head_of = |limit| head(&binary, 0, limit);
        assert_eq!(
            head_of(usize::MAX).map(|h| (h.tag, h.end)),
            Ok((109, 5 + 256))
        );
        assert_eq!(head_of(binary.len()), Err(TermError::Truncated(5)));
        assert_eq!(
            head(&binary[..3], 0, usize::MAX),
            Err(TermError::Truncated(1))
        );
        // Atom text is read, so it must be there whatever the limit.
        assert!(matches!(
            head(&[100, 0, 3, b'a'], 0, usize::MAX),
            Err(TermError::Truncated(_))
        ));
        // Containers: a header, then children.
        let list = head(&[108, 0, 0, 0, 2], 0, usize::MAX).unwrap();
        assert_eq!((list.end, list.children), (5, 3));
        // A new fun's Size says where the whole fun ends.
        let mut fun = vec![112, 0, 0, 0, 200, 1];
        fun.extend_from_slice(&[0; 20]);
        fun.extend_from_slice(&[0, 0, 0, 1]);
        let fun = head(&fun, 0, usize::MAX).unwrap();
        assert_eq!((fun.fun_end, fun.children), (Some(201), 5));
        // A native record: module, name, 3 field names and 3 values follow its header.
        let record = head(&[67, 0, 0, 0, 3, 1], 0, usize::MAX).unwrap();
        assert_eq!((record.end, record.children), (6, 8));
        assert!(matches!(
            head(&[67, 0, 0, 0, 3, 2], 0, usize::MAX),
            Err(TermError::Malformed(0, _))
        ));
        assert_eq!(
            head(&[67, 0, 0, 0, 3], 0, usize::MAX),
            Err(TermError::Truncated(5))
        );
    }
}
