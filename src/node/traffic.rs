//! What crossed the distribution connections: bytes and messages, each way, since start-up.
//!
//! Counted where the bytes move (a connection's reader, its writer task, and senders that write
//! to the socket themselves, see `outbox`), with relaxed atomics: nothing on those paths waits
//! for them. Process-wide: the binary runs one node, and the counters stay reachable from the
//! writing paths without threading a handle through them. Handshakes are not counted, ticks are
//! (as bytes).

use std::sync::atomic::{AtomicU64, Ordering};

static RECEIVED_BYTES: AtomicU64 = AtomicU64::new(0);
static SENT_BYTES: AtomicU64 = AtomicU64::new(0);
static RECEIVED_MESSAGES: AtomicU64 = AtomicU64::new(0);
static SENT_MESSAGES: AtomicU64 = AtomicU64::new(0);

/// Totals since start-up, for `:info` and `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Bytes of frames read (length prefixes included).
    pub received_bytes: u64,
    /// Bytes written to peers' sockets.
    pub sent_bytes: u64,
    /// Messages received whole (a fragmented message counts once, when complete).
    pub received_messages: u64,
    /// Messages sent to peers (each signal to a process of another node).
    pub sent_messages: u64,
}

/// A frame of `bytes` bytes (its length prefix included) was read.
pub(crate) fn received_bytes(bytes: usize) {
    RECEIVED_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
}

/// A message was received whole.
pub(crate) fn received_message() {
    RECEIVED_MESSAGES.fetch_add(1, Ordering::Relaxed);
}

/// `bytes` were written to a peer's socket.
pub(crate) fn sent_bytes(bytes: usize) {
    SENT_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
}

/// A message to a peer was handed to its connection.
pub(crate) fn sent_message() {
    SENT_MESSAGES.fetch_add(1, Ordering::Relaxed);
}

/// The totals now.
pub fn totals() -> Traffic {
    Traffic {
        received_bytes: RECEIVED_BYTES.load(Ordering::Relaxed),
        sent_bytes: SENT_BYTES.load(Ordering::Relaxed),
        received_messages: RECEIVED_MESSAGES.load(Ordering::Relaxed),
        sent_messages: SENT_MESSAGES.load(Ordering::Relaxed),
    }
}
