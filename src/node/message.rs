//! Decoded distribution messages and the errors of decoding frames into them.
//!
//! Shared by `frame` (which re-exports them) and `reassembly` (fragmented messages), so that
//! `reassembly` need not depend on `frame`, which uses it.
//!
//! Two kinds of failure, kept apart: a frame or control message that cannot be decoded is a
//! [`FrameError`] (nobody can tell what it was or whom it was for; the connection is dropped),
//! while a payload that cannot be decoded behind a well-formed control message is a
//! [`PayloadError`] carried in the [`Message`], so that only that message fails (see `signals`).

use super::control::{ControlError, ControlMessage};
use super::gen;
use super::term::{decode_at, Decoded, TermError};
use eetf::Term;

/// Largest message (fragments added up) accepted from a peer unless the node is told otherwise
/// (`--max-message-bytes`): room for tensors of hundreds of MiB, while a peer cannot make the node
/// allocate without bound.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 256 << 20;

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("bad term in frame: {0}")]
    Term(#[from] TermError),
    #[error("{0}")]
    Control(#[from] ControlError),
    #[error("unknown frame type {0:?}")]
    UnknownType(Vec<u8>),
    #[error("atom cache references in a distribution header (the atom cache was not negotiated)")]
    AtomCache,
    #[error("fragment {id} of sequence {seq} arrived out of order")]
    FragmentOrder { seq: u64, id: u64 },
    #[error("message larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("{0} bytes after the end of the message")]
    Trailing(usize),
}

/// A decoded message: the control tuple and, for operations that have one, the payload term.
#[derive(Debug)]
pub struct Message {
    pub control: Term,
    /// `None` for operations without a payload, and when the payload could not be decoded.
    pub payload: Option<Term>,
    /// Why the payload could not be decoded, if it could not.
    pub payload_error: Option<PayloadError>,
    /// Whether control or payload held OTP 29 native records (decoded as tuples, see
    /// [`native_record`](super::native_record)).
    pub native_records: bool,
}

/// A payload that could not be decoded, and whom to answer if it was a `$gen_call`.
#[derive(Debug)]
pub struct PayloadError {
    pub error: TermError,
    /// The caller of a `{:"$gen_call", {pid, tag}, request}` whose request (only) could not be
    /// decoded.
    pub call: Option<gen::Caller>,
}

impl Message {
    fn new(control: Decoded) -> Message {
        Message {
            control: control.term,
            payload: None,
            payload_error: None,
            native_records: control.native_records,
        }
    }
}

/// Control + optional payload, both without version bytes.
pub(crate) fn decode_message(data: &[u8]) -> Result<Message, FrameError> {
    decode_parts(data, 0, false, None)
}

/// A pass-through frame body: `112`, then control and payload each with its version byte.
pub(crate) fn decode_pass_through(body: &[u8]) -> Result<Message, FrameError> {
    decode_parts(body, 2, true, None)
}

/// A reassembled message whose bytes end early, at `truncated_at` (a large binary that never
/// got all its bytes): well-formed only if its control message ends before that point.
pub(crate) fn decode_truncated(data: &[u8], truncated_at: usize) -> Result<Message, FrameError> {
    decode_parts(data, 0, false, Some(truncated_at))
}

/// The control term at `start`, then the payload if its operation has one. A control message
/// that cannot be decoded, or bytes left after the message, are frame errors; a payload that
/// cannot be decoded is a [`PayloadError`] of the message.
fn decode_parts(
    data: &[u8],
    start: usize,
    version_bytes: bool,
    truncated_at: Option<usize>,
) -> Result<Message, FrameError> {
    let control = decode_at(data, start)?;
    if truncated_at.is_some_and(|t| control.end > t) {
        return Err(TermError::Truncated(control.end).into());
    }
    let has_payload = ControlMessage::has_payload(ControlMessage::op_of(&control.term)?);
    let end = control.end;
    let mut message = Message::new(control);
    if !has_payload {
        check_end(data, end)?;
        return Ok(message);
    }
    let mut at = end;
    let payload = if version_bytes && data.get(at) != Some(&VERSION_MAGIC) {
        Err(TermError::Malformed(at, "payload without version byte"))
    } else {
        at += usize::from(version_bytes);
        match truncated_at {
            Some(t) => Err(TermError::Truncated(t)),
            None => decode_at(data, at),
        }
    };
    match payload {
        Ok(payload) => {
            check_end(data, payload.end)?;
            message.native_records |= payload.native_records;
            message.payload = Some(payload.term);
        }
        Err(error) => {
            message.payload_error = Some(PayloadError {
                error,
                call: gen::call_envelope(&data[..truncated_at.unwrap_or(data.len())], at),
            })
        }
    }
    Ok(message)
}

const VERSION_MAGIC: u8 = 131;

pub(super) fn check_end(body: &[u8], end: usize) -> Result<(), FrameError> {
    if end == body.len() {
        Ok(())
    } else {
        Err(FrameError::Trailing(body.len() - end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::native_record::{as_native_record, MARKER};
    use crate::node::term::{atom, encode_bare_into, int, term_to_binary, tuple};
    use eetf::{Pid, Reference};

    fn pid() -> Pid {
        Pid::new("a@b", 1, 0, 1)
    }

    fn reg_send() -> Term {
        tuple(vec![int(6), Term::from(pid()), atom(""), atom("xla")])
    }

    /// Control and payload bytes as a `131 'D'` frame carries them (without its header),
    /// the payload given encoded, without version byte.
    fn data(control: &Term, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_bare_into(control, &mut out);
        out.extend_from_slice(payload);
        out
    }

    fn bare(term: &Term) -> Vec<u8> {
        term_to_binary(term)[1..].to_vec()
    }

    /// `{:"$gen_call", {pid, ref}, request}` with `request` given encoded.
    fn call_with(request: &[u8]) -> (Vec<u8>, Term) {
        let tag = Term::from(Reference::from(("a@b", vec![7, 8, 9])));
        let mut out = vec![104, 3];
        out.extend(bare(&atom("$gen_call")));
        out.extend(bare(&tuple(vec![Term::from(pid()), tag.clone()])));
        out.extend_from_slice(request);
        (out, tag)
    }

    #[test]
    fn an_undecodable_request_keeps_its_caller() {
        // An atom cache reference, an unknown tag, a truncated binary, nesting too deep.
        let deep: Vec<u8> = [104, 1].repeat(5000).into_iter().chain([106]).collect();
        for request in [&[82, 0][..], &[200], &[109, 0, 0, 0, 9, 1], &deep] {
            let (payload, tag) = call_with(request);
            let message = decode_message(&data(&reg_send(), &payload)).unwrap();
            assert_eq!(message.control, reg_send());
            assert!(message.payload.is_none());
            let failed = message.payload_error.unwrap();
            let call = failed.call.expect("the envelope is recovered");
            assert_eq!((call.pid, call.tag), (pid(), tag));
        }
    }

    #[test]
    fn an_undecodable_message_that_is_no_call_has_no_caller() {
        for payload in [
            vec![200],
            vec![108, 255, 255, 255, 255, 106],
            // A call whose `from` is what cannot be decoded, or is not `{pid, tag}`.
            [&[104, 3][..], &bare(&atom("$gen_call")), &[82, 1], &[97, 1]].concat(),
            [
                &[104, 3][..],
                &bare(&atom("$gen_call")),
                &bare(&atom("x")),
                &[200],
            ]
            .concat(),
            [
                &[104, 3][..],
                &bare(&atom("other")),
                &bare(&tuple(vec![Term::from(pid()), int(1)])),
                &[200],
            ]
            .concat(),
        ] {
            let message = decode_message(&data(&reg_send(), &payload)).unwrap();
            let failed = message.payload_error.unwrap();
            assert!(failed.call.is_none());
        }
    }

    #[test]
    fn pass_through_frames_fail_alike() {
        let (payload, _) = call_with(&[200]);
        let mut body = vec![112];
        body.extend(term_to_binary(&reg_send()));
        let mut with_version = body.clone();
        with_version.push(131);
        with_version.extend_from_slice(&payload);
        let failed = decode_pass_through(&with_version)
            .unwrap()
            .payload_error
            .unwrap();
        assert!(failed.call.is_some());
        // A payload without its version byte.
        body.extend_from_slice(&payload);
        let failed = decode_pass_through(&body).unwrap().payload_error.unwrap();
        assert!(matches!(failed.error, TermError::Malformed(..)));
    }

    #[test]
    fn what_still_drops_the_connection() {
        // A control message that cannot be decoded, trailing bytes after a whole message.
        assert!(decode_message(&[104, 1, 82, 0]).is_err());
        assert!(decode_message(&[104, 2, 97, 6, 200]).is_err());
        let mut trailing = data(&reg_send(), &bare(&atom("hi")));
        trailing.push(106);
        assert!(matches!(
            decode_message(&trailing),
            Err(FrameError::Trailing(1))
        ));
        let monitor = tuple(vec![int(20), Term::from(pid()), atom("xla")]);
        let mut extra = data(&monitor, &[]);
        extra.push(97);
        assert!(decode_message(&extra).is_err());
    }

    #[test]
    fn native_records_are_decoded_and_flagged() {
        let mut record = vec![67, 0, 0, 0, 1, 0];
        for name in ["m", "r", "f"] {
            record.extend(bare(&atom(name)));
        }
        record.extend(bare(&int(1)));
        let (payload, _) = call_with(&[&[104, 2][..], &bare(&atom("echo")), &record].concat());
        let message = decode_message(&data(&reg_send(), &payload)).unwrap();
        assert!(message.native_records && message.payload_error.is_none());
        let payload = message.payload.unwrap();
        let request = &crate::node::term::as_tuple(&payload, 3).unwrap()[2];
        let record = &crate::node::term::as_tuple(request, 2).unwrap()[1];
        assert_eq!(as_native_record(record).unwrap().to_string(), "#m:r{f}");
        assert_eq!(
            crate::node::term::as_tuple(record, 6).unwrap()[0],
            atom(MARKER)
        );
        let plain = decode_message(&data(&reg_send(), &bare(&atom("hi")))).unwrap();
        assert!(!plain.native_records);
    }
}
