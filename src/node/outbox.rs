//! The sending side of one peer's connection, shared by every thread that sends to that peer.
//!
//! A message is encoded by the thread that sends it. If the connection is established and its
//! writer task has nothing in hand, the sender writes the frame to the socket itself, with one
//! non-blocking `write`: no other thread is woken, which on the callback path (an XLA thread
//! sending a request, then its run's reply) saves a cross-thread wake-up each way. Otherwise the
//! frame goes to the writer task's queue, which batches, fragments and waits for the socket.
//!
//! Frames must never interleave on the stream, and one sender's messages must stay in order. Both
//! follow from one rule: a sender writes directly only while `pending` (frames handed to the
//! writer task and not yet written) is zero, checked and written under the same lock. A partial
//! direct write hands its rest to the writer, which then writes it before anything else.

use super::control::ControlMessage;
use super::frame::{self, Fragmenter};
use bytes::Bytes;
use eetf::{Pid, Term};
use std::io::ErrorKind;
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
    /// A whole frame (length prefix included) from `sender`.
    Frame { sender: u32, frame: Bytes },
    /// A header-format message body too large for one frame: the writer sends it in fragments.
    Large { sender: u32, body: Bytes },
    /// The unwritten rest of a frame a sender began writing directly: goes out first, as is.
    Rest(Bytes),
}

pub struct Outbox {
    queue: mpsc::UnboundedSender<Outgoing>,
    state: Mutex<State>,
}

struct State {
    /// The established connection's socket and whether it uses the `131 'D'` header format;
    /// `None` while dialling and after the connection ended.
    link: Option<(Arc<OwnedWriteHalf>, bool)>,
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
        let state = self.lock();
        let Some((socket, header_format)) = state.link.clone() else {
            let out = Outgoing::Message {
                sender,
                message: Box::new((control, payload)),
            };
            return self.hand_over(state, out);
        };
        drop(state);
        // Encode outside the lock: a large message must not hold up other senders.
        let frame = frame::encode_frame(&control.to_term(), payload.as_ref(), header_format);
        if header_format && Fragmenter::needed(&frame[4..]) {
            let body = Bytes::from(frame).slice(4..);
            return self.hand_over(self.lock(), Outgoing::Large { sender, body });
        }
        let state = self.lock();
        if state.pending > 0 || state.link.is_none() {
            return self.hand_over(
                state,
                Outgoing::Frame {
                    sender,
                    frame: Bytes::from(frame),
                },
            );
        }
        match socket.as_ref().as_ref().try_write(&frame) {
            Ok(n) if n == frame.len() => {}
            Ok(n) => self.hand_over(state, Outgoing::Rest(Bytes::from(frame).slice(n..))),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                self.hand_over(state, Outgoing::Rest(Bytes::from(frame)))
            }
            // The connection is failing; its reader or writer reports it and the peer goes down.
            Err(_) => {}
        }
    }

    fn hand_over(&self, mut state: MutexGuard<'_, State>, out: Outgoing) {
        state.pending += 1;
        let _ = self.queue.send(out);
    }

    /// The writer task: the connection is up; senders may write to `socket` directly.
    pub(crate) fn attach(&self, socket: Arc<OwnedWriteHalf>, header_format: bool) {
        self.lock().link = Some((socket, header_format));
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
