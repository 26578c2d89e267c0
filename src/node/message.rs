//! Decoded distribution messages and the errors of decoding frames into them.
//!
//! Shared by `frame` (which re-exports them) and `reassembly` (fragmented messages), so that
//! `reassembly` need not depend on `frame`, which uses it.

use super::control::{ControlError, ControlMessage};
use super::term::{decode_at, TermError};
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
    pub payload: Option<Term>,
}

/// Control + optional payload, both without version bytes.
pub(crate) fn decode_message(data: &[u8]) -> Result<Message, FrameError> {
    let (control, end) = decode_at(data, 0)?;
    let payload = if ControlMessage::has_payload(ControlMessage::op_of(&control)?) {
        let (payload, end) = decode_at(data, end)?;
        check_end(data, end)?;
        Some(payload)
    } else {
        check_end(data, end)?;
        None
    };
    Ok(Message { control, payload })
}

pub(super) fn check_end(body: &[u8], end: usize) -> Result<(), FrameError> {
    if end == body.len() {
        Ok(())
    } else {
        Err(FrameError::Trailing(body.len() - end))
    }
}
