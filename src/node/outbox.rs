//! The sending side of one peer's connection, shared by every thread that sends to that peer.
//!
//! A message is encoded by the thread that sends it. If the connection is established over plain
//! TCP and its writer task has nothing in hand, the sender writes the frame to the socket itself,
//! with one non-blocking `write`: no other thread is woken, which on the callback path (an XLA thread
//! sending a request, then its run's reply) saves a cross-thread wake-up each way. Otherwise the
//! frame goes to the writer task's queue, which batches, fragments and waits for the socket. Over
//! TLS every frame goes through the writer task, which alone holds the TLS session's writing half.
//!
//! Frames must never interleave on the stream, and one sender's messages must stay in order. Both
//! follow from one rule: a sender writes directly only while `pending` (frames handed to the
//! writer task and not yet written) is zero, checked and written under the same lock. A partial
//! direct write hands its rest to the writer, which then writes it before anything else.

use super::control::ControlMessage;
use super::flags;
use super::frame::{self, Encoded};
use bytes::{Buf, Bytes};
use eetf::{Pid, Term};
use std::io::{ErrorKind, IoSlice};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::mpsc;

/// What the writer task receives.
pub enum Outgoing {
    /// A message queued before the connection was up; the writer encodes it in the format the
    /// handshake settled.
    Message {
        sender: u32,
        message: Box<(ControlMessage, Option<Term>)>,
    },
    /// A whole frame (length prefix included) from `sender`, in chunks.
    Frame { sender: u32, frame: Vec<Bytes> },
    /// A header-format message body too large for one frame: the writer sends it in fragments.
    Large { sender: u32, body: Vec<Bytes> },
    /// The unwritten rest of a frame a sender began writing directly: goes out first, as is.
    Rest(Vec<Bytes>),
}

pub struct Outbox {
    queue: mpsc::UnboundedSender<Outgoing>,
    state: Mutex<State>,
}

struct State {
    /// The established connection's socket (`None` over TLS: no direct writes) and the flags the
    /// peer negotiated (which say whether it uses the `131 'D'` header format, and how alias
    /// messages are sent); `None` while dialling and after the connection ended.
    link: Option<(Option<Arc<OwnedWriteHalf>>, u64)>,
    /// Frames handed to the writer task and not yet written.
    pending: usize,
}

impl Outbox {
    pub fn new(queue: mpsc::UnboundedSender<Outgoing>) -> Outbox {
        Outbox {
            queue,
            state: Mutex::new(State {
                link: None,
                pending: 0,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends a control message (and payload) from `from`. Never blocks on the network; dropped,
    /// like Erlang's send, if the connection is gone.
    pub fn send(&self, from: &Pid, control: ControlMessage, payload: Option<Term>) {
        let sender = from.id | (from.serial << 15);
        super::traffic::sent_message();
        let state = self.lock();
        let Some((socket, peer_flags)) = state.link.clone() else {
            let out = Outgoing::Message {
                sender,
                message: Box::new((control, payload)),
            };
            return self.hand_over(state, out);
        };
        drop(state);
        // Encode outside the lock: a large message must not hold up other senders.
        let encoded = frame::encode_owned(
            &control.to_term_for(peer_flags),
            payload,
            peer_flags & flags::FRAGMENTS != 0,
        );
        super::probe::mark(super::probe::Step::Encoded);
        let mut frame = match encoded {
            Encoded::Large(body) => {
                return self.hand_over(self.lock(), Outgoing::Large { sender, body })
            }
            Encoded::Frame(frame) => frame,
        };
        let state = self.lock();
        let Some(socket) = socket.filter(|_| state.pending == 0 && state.link.is_some()) else {
            return self.hand_over(state, Outgoing::Frame { sender, frame });
        };
        let slices: Vec<IoSlice> = frame.iter().map(|c| IoSlice::new(c)).collect();
        let total: usize = frame.iter().map(Bytes::len).sum();
        let written = socket.as_ref().as_ref().try_write_vectored(&slices);
        if let Ok(n) = written {
            super::traffic::sent_bytes(n);
        }
        match written {
            Ok(n) if n == total => {}
            Ok(n) => {
                advance(&mut frame, n);
                self.hand_over(state, Outgoing::Rest(frame))
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                self.hand_over(state, Outgoing::Rest(frame))
            }
            // The connection is failing; its reader or writer reports it and the peer goes down.
            Err(_) => {}
        }
    }

    fn hand_over(&self, mut state: MutexGuard<'_, State>, out: Outgoing) {
        state.pending += 1;
        let _ = self.queue.send(out);
    }

    /// The writer task: the connection is up, with a peer that negotiated `peer_flags`; senders
    /// may write to `socket` directly, if given.
    pub(crate) fn attach(&self, socket: Option<Arc<OwnedWriteHalf>>, peer_flags: u64) {
        self.lock().link = Some((socket, peer_flags));
    }

    /// The writer task: the connection is over.
    pub(crate) fn detach(&self) {
        self.lock().link = None;
    }

    /// The writer task: `written` frames it took from the queue are now on the socket.
    pub(crate) fn written(&self, written: usize) {
        if written > 0 {
            let mut state = self.lock();
            state.pending = state.pending.saturating_sub(written);
        }
    }

    /// The writer task: claims the socket for a frame of its own (a tick), as if it were queued.
    pub(crate) fn claim(&self) {
        self.lock().pending += 1;
    }
}

/// Drops the first `n` bytes of chunked data (what a partial `writev` wrote).
pub(super) fn advance(chunks: &mut Vec<Bytes>, mut n: usize) {
    let whole = chunks
        .iter()
        .take_while(|c| {
            let fits = c.len() <= n;
            if fits {
                n -= c.len();
            }
            fits
        })
        .count();
    chunks.drain(..whole);
    if let Some(first) = chunks.first_mut() {
        first.advance(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::frame::{Fragmenter, FrameDecoder};
    use crate::node::term::{atom, binary, int, list, tuple};

    fn control() -> Term {
        tuple(vec![int(2), atom(""), Term::from(Pid::new("a@b", 1, 0, 1))])
    }

    #[test]
    fn large_binaries_are_sent_from_where_they_are() {
        let big = vec![7u8; 3 * frame::FRAGMENT_SIZE + 5];
        let at = big.as_ptr();
        let mut map = std::collections::HashMap::new();
        map.insert(atom("data"), binary(vec![9u8; 200_000]));
        let payload = tuple(vec![
            atom("echo"),
            binary(big),
            list(vec![int(1), Term::from(eetf::Map::from(map))]),
        ]);
        let expected = payload.clone();
        let Encoded::Large(body) = frame::encode_owned(&control(), Some(payload), true) else {
            panic!("large messages are fragmented");
        };
        assert!(
            body.iter().any(|chunk| chunk.as_ptr() == at),
            "the binary's own buffer is one of the chunks"
        );
        let mut fragments = Fragmenter::new(1, body);
        let mut decoder = FrameDecoder::default();
        let mut message = None;
        while let Some((head, data)) = fragments.next_fragment() {
            let mut frame = head[4..].to_vec();
            data.iter().for_each(|d| frame.extend_from_slice(d));
            message = decoder.decode(&frame).unwrap();
        }
        let message = message.expect("the last fragment completes the message");
        assert_eq!(message.control, control());
        assert_eq!(message.payload, Some(expected));
    }

    #[test]
    fn pass_through_frames_carry_large_binaries_too() {
        let payload = binary(vec![3u8; 100_000]);
        let Encoded::Frame(frame) = frame::encode_owned(&control(), Some(payload.clone()), false)
        else {
            panic!("without the header format there are no fragments");
        };
        assert!(frame.len() > 1);
        let bytes: Vec<u8> = frame.concat();
        assert_eq!(bytes[..4], ((bytes.len() - 4) as u32).to_be_bytes());
        let message = FrameDecoder::default()
            .decode(&bytes[4..])
            .unwrap()
            .unwrap();
        assert_eq!(message.payload, Some(payload));
    }

    #[test]
    fn advance_drops_whole_and_partial_chunks() {
        let mut chunks = vec![
            Bytes::from_static(b"abc"),
            Bytes::from_static(b"defg"),
            Bytes::from_static(b"hi"),
        ];
        advance(&mut chunks, 5);
        assert_eq!(chunks.concat(), b"fghi");
        advance(&mut chunks, 2);
        assert_eq!(chunks.concat(), b"hi");
        advance(&mut chunks, 2);
        assert!(chunks.is_empty());
    }
}
