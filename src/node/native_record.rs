//! OTP 29 native records (`RECORD_EXT`, tag 67 `'C'`) as the node receives them.
//!
//! On the wire a native record is `67`, the field count N (u32), a flags byte (1: the record is
//! exported), the module atom, the record name atom, N field-name atoms and N values. `eetf` has
//! no such term, so before decoding, [`rewrite`] turns each record header into the header of a
//! tuple that keeps everything the record holds, in the same order:
//!
//! ```text
//! {:"$native_record", exported?, module, name, field_1, ..., field_N, value_1, ..., value_N}
//! ```
//!
//! The node never sends one back: it does not advertise `DFLAG_NATIVE_RECORDS`, as it cannot
//! re-encode the tuple as the record it was. A `$gen_call` whose message held a native record is
//! answered `{:error, {:argument_error, message}}` (see `signals`); other messages reach their
//! process with the tuple in the record's place.

use super::term::{as_atom, head, TermError};
use eetf::Term;

/// Tag of `RECORD_EXT`.
pub const RECORD_EXT: u8 = 67;

/// First element of the tuple a native record is decoded into.
pub const MARKER: &str = "$native_record";

/// `LARGE_TUPLE_EXT`, `SMALL_ATOM_UTF8_EXT`.
const LARGE_TUPLE_EXT: u8 = 105;
const SMALL_ATOM_UTF8_EXT: u8 = 119;

/// The layout of a record header from its field count and flags byte: its children (module,
/// name, field names, values) and whether the flags are ones this node knows (0 or 1; OTP 29
/// defines no other bit, and a later layout may differ).
pub fn children(fields: u32, flags: u8) -> Result<u64, &'static str> {
    if flags > 1 {
        return Err("native record flags");
    }
    Ok(2 + 2 * u64::from(fields))
}

/// A copy of the term `body` (already checked by `term::scan`, without version byte) with each
/// native record's header replaced by that of its tuple. A flat walk is enough: every term is
/// its header followed by its children. The module, name and field names must be atoms, as OTP
/// requires: atoms have no children, so they are the terms right after the header.
pub fn rewrite(body: &[u8]) -> Result<Vec<u8>, TermError> {
    let mut out = Vec::with_capacity(body.len() + 64);
    let mut at = 0;
    let mut atoms_owed: u64 = 0;
    while at < body.len() {
        let h = head(body, at, body.len())?;
        if atoms_owed > 0 {
            if !matches!(h.tag, 100 | 115 | 118 | 119) {
                return Err(TermError::Malformed(
                    at,
                    "native record name that is not an atom",
                ));
            }
            atoms_owed -= 1;
        }
        if h.tag == RECORD_EXT {
            // Module, name and the field names: the first half of the children after those two.
            atoms_owed = 2 + (h.children - 2) / 2;
            // Tag, field count (4 bytes), flags.
            let fields = u32::from_be_bytes(body[at + 1..at + 5].try_into().expect("4 bytes"));
            let exported = body[at + 5] == 1;
            let arity = u32::try_from(4 + 2 * u64::from(fields))
                .map_err(|_| TermError::Malformed(at, "native record too large"))?;
            out.push(LARGE_TUPLE_EXT);
            out.extend_from_slice(&arity.to_be_bytes());
            small_atom(&mut out, MARKER);
            small_atom(&mut out, if exported { "true" } else { "false" });
        } else {
            out.extend_from_slice(&body[at..h.end]);
        }
        at = h.end;
    }
    Ok(out)
}

fn small_atom(out: &mut Vec<u8>, name: &str) {
    out.push(SMALL_ATOM_UTF8_EXT);
    out.push(name.len() as u8);
    out.extend_from_slice(name.as_bytes());
}

/// A native record as [`rewrite`] decoded it.
#[derive(Debug, PartialEq)]
pub struct NativeRecord<'a> {
    pub module: &'a str,
    pub name: &'a str,
    pub exported: bool,
    pub fields: Vec<(&'a str, &'a Term)>,
}

impl std::fmt::Display for NativeRecord<'_> {
    /// Erlang's notation, `#module:name{field = value, ...}`, values left out.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let fields: Vec<&str> = self.fields.iter().map(|(k, _)| *k).collect();
        write!(f, "#{}:{}{{{}}}", self.module, self.name, fields.join(", "))
    }
}

/// `term` read as the tuple a native record was decoded into.
pub fn as_native_record(term: &Term) -> Option<NativeRecord<'_>> {
    let Term::Tuple(t) = term else { return None };
    let e = &t.elements;
    let atom = as_atom;
    if e.len() < 4 || e.len() % 2 != 0 || atom(&e[0]) != Some(MARKER) {
        return None;
    }
    let n = (e.len() - 4) / 2;
    let fields = e[4..4 + n]
        .iter()
        .zip(&e[4 + n..])
        .map(|(k, v)| Some((atom(k)?, v)))
        .collect::<Option<Vec<_>>>()?;
    Some(NativeRecord {
        module: atom(&e[2])?,
        name: atom(&e[3])?,
        exported: atom(&e[1])? == "true",
        fields,
    })
}

/// The first native record in `term` (depth first, within `term::MAX_DEPTH`), for messages.
pub fn find(term: &Term) -> Option<NativeRecord<'_>> {
    let mut stack = vec![(term, 0)];
    while let Some((term, depth)) = stack.pop() {
        if let Some(record) = as_native_record(term) {
            return Some(record);
        }
        if depth >= super::term::MAX_DEPTH {
            continue;
        }
        let children: Vec<&Term> = match term {
            Term::Tuple(t) => t.elements.iter().collect(),
            Term::List(l) => l.elements.iter().collect(),
            Term::ImproperList(l) => l.elements.iter().chain([&*l.last]).collect(),
            Term::Map(m) => m.map.iter().flat_map(|(k, v)| [k, v]).collect(),
            _ => continue,
        };
        stack.extend(children.into_iter().rev().map(|c| (c, depth + 1)));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::term::{atom, binary_to_term, int, list, tuple};

    /// `#m:r{a = 1, b = 2}`, not exported: the bytes OTP 29 sends (RECORD_EXT in erl_ext_dist).
    fn record_m_r() -> Vec<u8> {
        let mut b = vec![RECORD_EXT, 0, 0, 0, 2, 0];
        for name in ["m", "r", "a", "b"] {
            b.extend_from_slice(&[119, 1, name.as_bytes()[0]]);
        }
        b.extend_from_slice(&[97, 1, 97, 2]);
        b
    }

    #[test]
    fn a_record_decodes_into_its_tuple() {
        let mut bytes = vec![131];
        bytes.extend(record_m_r());
        let term = binary_to_term(&bytes).unwrap();
        assert_eq!(
            term,
            tuple(vec![
                atom(MARKER),
                atom("false"),
                atom("m"),
                atom("r"),
                atom("a"),
                atom("b"),
                int(1),
                int(2)
            ])
        );
        let record = as_native_record(&term).unwrap();
        assert_eq!(record.to_string(), "#m:r{a, b}");
        assert_eq!(record.fields, vec![("a", &int(1)), ("b", &int(2))]);
        assert!(!record.exported);
    }

    #[test]
    fn records_nest_in_containers_and_in_each_other() {
        // [{:ok, #m:r{a = #m:r{a = 1, b = 2}, b = 2}}], exported outer record.
        let inner = record_m_r();
        let mut outer = vec![RECORD_EXT, 0, 0, 0, 2, 1];
        for name in ["m", "r", "a", "b"] {
            outer.extend_from_slice(&[119, 1, name.as_bytes()[0]]);
        }
        outer.extend_from_slice(&inner);
        outer.extend_from_slice(&[97, 2]);
        let mut bytes = vec![131, 108, 0, 0, 0, 1, 104, 2, 119, 2, b'o', b'k'];
        bytes.extend_from_slice(&outer);
        bytes.push(106);
        let term = binary_to_term(&bytes).unwrap();
        let found = find(&term).unwrap();
        assert!(found.exported);
        let inner = as_native_record(found.fields[0].1).unwrap();
        assert_eq!(inner.fields[1], ("b", &int(2)));
        assert!(find(&list(vec![int(1), tuple(vec![atom(MARKER)])])).is_none());
    }

    #[test]
    fn a_record_with_no_fields_and_bad_ones() {
        let empty = [131, RECORD_EXT, 0, 0, 0, 0, 0, 119, 1, b'm', 119, 1, b'e'];
        let term = binary_to_term(&empty).unwrap();
        assert_eq!(as_native_record(&term).unwrap().to_string(), "#m:e{}");
        // Unknown flags, a field count beyond the bytes, a truncated record.
        let mut flags = empty;
        flags[6] = 2;
        assert!(matches!(
            binary_to_term(&flags),
            Err(TermError::Malformed(..))
        ));
        let mut count = empty;
        count[1..5].copy_from_slice(&[0xff, 0xff, 0xff, 0xff]);
        assert!(binary_to_term(&count).is_err());
        assert!(binary_to_term(&empty[..9]).is_err());
        // A field name that is not an atom.
        let not_atoms = [
            131, RECORD_EXT, 0, 0, 0, 1, 0, 119, 1, b'm', 119, 1, b'r', 97, 1, 97, 2,
        ];
        assert!(matches!(
            binary_to_term(&not_atoms),
            Err(TermError::Malformed(..))
        ));
    }
}
