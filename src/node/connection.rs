//! One established distribution connection: a reader and a batching writer over one stream, plain
//! TCP or TLS ([`DistStream`]).
//!
//! Writer: senders encode their messages and, on plain TCP when the writer is idle, write them
//! themselves (see [`super::outbox`]); everything else is queued here, and everything queued at
//! that moment goes out in one `writev` (one TCP segment for small messages; TCP_NODELAY is set),
//! or in as few TLS records. Messages too large for one frame are cut into fragments
//! ([`frame::FRAGMENT_SIZE`]), and the writer sends at most `BATCH_LIMIT` of them per round, so a
//! 64 MiB transfer does not stall small messages from other processes. Messages from one sender
//! stay in order: once a sender has a message in fragments, its later messages wait in the same
//! lane. Ticks go out when nothing else has been written for a tick interval.
//!
//! Reader: frames through a buffered reader ([`frame::read_frame`]), decoded and handed to
//! [`signals::handle`]. A peer
//! silent for `net_ticktime` is declared down; so is one that sends a malformed frame or control
//! message (what it was, or whom it was for, cannot be told), or a message larger than the node's
//! limit (`--max-message-bytes`, fragments added up), which is refused before its bytes are read.
//! A well-formed control message whose payload cannot be decoded fails alone (see [`signals`]).

use super::frame::{self, Encoded, Fragmenter, FrameDecoder, FrameError, ReadFrameError};
use super::handshake::PeerInfo;
use super::outbox::{advance, Outbox, Outgoing};
use super::stream::{DistStream, TlsStream};
use super::{flags, signals, Node};
use bytes::{Bytes, BytesMut};
use std::collections::{HashMap, VecDeque};
use std::io::IoSlice;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWriteExt, BufReader, WriteHalf};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Stop adding queued messages or fragments to a round's write once it is this large: a small
/// message waits at most about one such write behind a large transfer, while a large transfer
/// takes few syscalls (each a costly wake-up of the peer on a small VM).
const BATCH_LIMIT: usize = 1024 * 1024;

/// Runs the connection until it fails, the peer goes silent, or `cancel` fires. Returns why it
/// ended, for the nodedown log line.
pub async fn run(
    node: &Node,
    peer: &str,
    stream: DistStream,
    info: &PeerInfo,
    queue: mpsc::UnboundedReceiver<Outgoing>,
    outbox: &Outbox,
    cancel: CancellationToken,
) -> String {
    let shared = Shared {
        node,
        peer,
        outbox,
        peer_flags: info.flags,
    };
    match stream {
        DistStream::Tcp(tcp) => {
            let (read_half, write_half) = tcp.into_split();
            let socket = Arc::new(write_half);
            // Senders may write to a plain socket themselves.
            outbox.attach(Some(socket.clone()), info.flags);
            serve(shared, read_half, Sink::Tcp(socket), queue, cancel).await
        }
        DistStream::Tls(tls) => {
            // The TLS session is shared by both halves; only the writer task writes to it.
            let (read_half, write_half) = tokio::io::split(*tls);
            outbox.attach(None, info.flags);
            serve(shared, read_half, Sink::Tls(write_half), queue, cancel).await
        }
    }
}

/// What the reader and the writer of one connection share.
struct Shared<'a> {
    node: &'a Node,
    peer: &'a str,
    outbox: &'a Outbox,
    peer_flags: u64,
}

async fn serve<R: AsyncRead + Unpin>(
    shared: Shared<'_>,
    read_half: R,
    sink: Sink,
    queue: mpsc::UnboundedReceiver<Outgoing>,
    cancel: CancellationToken,
) -> String {
    let Shared {
        node,
        peer,
        outbox,
        peer_flags,
    } = shared;
    let ticktime = node.net_ticktime();
    // A quarter of net_ticktime, as OTP; at most a second so that peers configured with a shorter
    // net_ticktime than ours still hear from us in time.
    let tick_interval = (ticktime / 4).min(Duration::from_secs(1));
    let reader = read_loop(node, peer, read_half, ticktime);
    let writer = write_loop(node, sink, queue, outbox, peer_flags, tick_interval);
    let reason = tokio::select! {
        r = reader => r,
        w = writer => w,
        _ = cancel.cancelled() => "closed by this node".to_string(),
    };
    // Senders must not keep the socket open (or write to it) once the connection is over.
    outbox.detach();
    reason
}

async fn read_loop<R: AsyncRead + Unpin>(
    node: &Node,
    peer: &str,
    half: R,
    ticktime: Duration,
) -> String {
    let mut reader = BufReader::with_capacity(frame::READ_BUFFER, half);
    let max_message = node.max_message_bytes();
    let mut decoder = FrameDecoder::default().with_max_message(max_message);
    // Reused for every frame that is not part of a fragmented message.
    let mut body: Vec<u8> = Vec::new();
    loop {
        let read = frame::read_frame(&mut reader, &mut decoder, &mut body, ticktime);
        let message = match read.await {
            Ok(Some(message)) => {
                super::probe::frame_read();
                super::traffic::received_message();
                message
            }
            Ok(None) => continue,
            Err(e) => return why_dropped(peer, e),
        };
        if let Err(e) = signals::handle(node, peer, message) {
            tracing::warn!(%peer, "malformed control message, dropping the connection: {e}");
            return format!("malformed control message: {e}");
        }
        node.traffic();
    }
}

/// Why a frame that could not be read ends the connection, with a warning naming the peer when
/// it sent something it should not have.
fn why_dropped(peer: &str, error: ReadFrameError) -> String {
    match error {
        ReadFrameError::Malformed(FrameError::TooLarge { limit }) => too_large(peer, limit),
        ReadFrameError::Malformed(e) => {
            tracing::warn!(%peer, "malformed frame, dropping the connection: {e}");
            format!("malformed frame: {e}")
        }
        ReadFrameError::Closed(reason) => reason,
    }
}

/// A peer sent a message over the limit: one warning naming it, and the reason the connection ends.
fn too_large(peer: &str, limit: usize) -> String {
    tracing::warn!(
        %peer,
        "message larger than --max-message-bytes ({limit} bytes); dropping the connection"
    );
    format!("message larger than --max-message-bytes ({limit} bytes)")
}

/// A sender's messages that must wait behind one of its messages being sent in fragments.
enum Unit {
    Frame(Vec<Bytes>),
    Fragments(Fragmenter),
}

#[derive(Default)]
struct Lanes {
    lanes: HashMap<u32, VecDeque<Unit>>,
    order: VecDeque<u32>,
}

impl Lanes {
    fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    fn push(&mut self, sender: u32, unit: Unit) {
        let lane = self.lanes.entry(sender).or_default();
        if lane.is_empty() {
            self.order.push_back(sender);
        }
        lane.push_back(unit);
    }

    fn has(&self, sender: u32) -> bool {
        self.lanes.get(&sender).is_some_and(|l| !l.is_empty())
    }

    /// Adds, for each lane in turn, its leading whole frames and a batch of fragments.
    fn write_round(&mut self, out: &mut Batch) {
        for _ in 0..self.order.len() {
            let sender = self.order.pop_front().expect("counted");
            let lane = self.lanes.get_mut(&sender).expect("ordered lanes exist");
            while let Some(unit) = lane.front_mut() {
                match unit {
                    Unit::Frame(frame) => {
                        std::mem::take(frame)
                            .into_iter()
                            .for_each(|chunk| out.put_bytes(chunk));
                        lane.pop_front();
                    }
                    Unit::Fragments(f) => {
                        // Up to a batch of fragments per lane and round: few syscalls for a big
                        // transfer, while other lanes and new messages still get a turn.
                        let mut done = false;
                        while out.len() < BATCH_LIMIT {
                            match f.next_fragment() {
                                Some((head, data)) => {
                                    out.put_slice(&head);
                                    data.into_iter().for_each(|d| out.put_shared(d));
                                }
                                None => {
                                    done = true;
                                    break;
                                }
                            }
                        }
                        if done {
                            lane.pop_front();
                            continue;
                        }
                        break;
                    }
                }
            }
            if lane.is_empty() {
                self.lanes.remove(&sender);
            } else {
                self.order.push_back(sender);
            }
        }
    }
}

/// Bodies at least this large are written from where they are rather than copied into the batch.
const SHARE_ABOVE: usize = 4096;

/// What one write sends: small frames copied together, large bodies and fragment data referenced
/// where they already are, all handed to one vectored write.
#[derive(Default)]
struct Batch {
    small: BytesMut,
    chunks: Vec<Bytes>,
    len: usize,
}

impl Batch {
    fn len(&self) -> usize {
        self.len
    }

    fn put_slice(&mut self, bytes: &[u8]) {
        self.small.extend_from_slice(bytes);
        self.len += bytes.len();
    }

    fn put_shared(&mut self, bytes: Bytes) {
        if !self.small.is_empty() {
            self.chunks.push(self.small.split().freeze());
        }
        self.len += bytes.len();
        self.chunks.push(bytes);
    }

    /// Bytes that are already a frame (or the rest of one): copied if small, else referenced.
    fn put_bytes(&mut self, bytes: Bytes) {
        if bytes.len() >= SHARE_ABOVE {
            self.put_shared(bytes);
        } else {
            self.put_slice(&bytes);
        }
    }

    /// Writes everything, then empties the batch for the next round.
    async fn write_to(&mut self, sink: &mut Sink) -> std::io::Result<()> {
        if !self.small.is_empty() {
            self.chunks.push(self.small.split().freeze());
        }
        match sink {
            Sink::Tcp(socket) => write_socket(&mut self.chunks, socket.as_ref().as_ref()).await?,
            Sink::Tls(tls) => {
                while !self.chunks.is_empty() {
                    let written = tls.write_vectored(&slices(&self.chunks)).await?;
                    if written == 0 {
                        return Err(std::io::ErrorKind::WriteZero.into());
                    }
                    advance(&mut self.chunks, written);
                }
                // Records the socket did not take at once are still in the TLS session.
                tls.flush().await?;
            }
        }
        self.len = 0;
        Ok(())
    }
}

/// Where a connection's writer writes.
enum Sink {
    /// The plain socket, shared with senders that write to it directly.
    Tcp(Arc<OwnedWriteHalf>),
    /// The TLS session's writing half.
    Tls(WriteHalf<TlsStream>),
}

/// The first buffers of `chunks`, for one vectored write.
fn slices(chunks: &[Bytes]) -> Vec<IoSlice<'_>> {
    chunks[..chunks.len().min(MAX_IOVECS)]
        .iter()
        .map(|c| IoSlice::new(c))
        .collect()
}

/// Writes all of `chunks` to a plain socket, waiting whenever it is full.
async fn write_socket(chunks: &mut Vec<Bytes>, stream: &TcpStream) -> std::io::Result<()> {
    while !chunks.is_empty() {
        let written = match stream.try_write_vectored(&slices(chunks)) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                stream.writable().await?;
                continue;
            }
            Err(e) => return Err(e),
        };
        advance(chunks, written);
    }
    Ok(())
}

/// Most buffers handed to one `writev` (Linux allows 1024).
const MAX_IOVECS: usize = 64;

async fn write_loop(
    node: &Node,
    mut sink: Sink,
    mut queue: mpsc::UnboundedReceiver<Outgoing>,
    outbox: &Outbox,
    peer_flags: u64,
    tick_interval: Duration,
) -> String {
    let header_format = peer_flags & flags::FRAGMENTS != 0;
    let mut batch = Batch::default();
    let mut lanes = Lanes::default();
    let mut ticker = tokio::time::interval(tick_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut wrote_since_tick = false;
    // Frames taken from the queue (or claimed) and not yet reported written to the outbox.
    let mut taken = 0;
    let add = |batch: &mut Batch, lanes: &mut Lanes, out: Outgoing| {
        let (sender, frame) = match out {
            Outgoing::Rest(rest) => return rest.into_iter().for_each(|c| batch.put_bytes(c)),
            Outgoing::Large { sender, body } => {
                let fragments = Fragmenter::new(node.next_sequence(), body);
                return lanes.push(sender, Unit::Fragments(fragments));
            }
            Outgoing::Frame { sender, frame } => (sender, frame),
            Outgoing::Message { sender, message } => {
                let (control, payload) = *message;
                match frame::encode_owned(&control.to_term_for(peer_flags), payload, header_format)
                {
                    Encoded::Frame(frame) => (sender, frame),
                    Encoded::Large(body) => {
                        let fragments = Fragmenter::new(node.next_sequence(), body);
                        return lanes.push(sender, Unit::Fragments(fragments));
                    }
                }
            }
        };
        if lanes.has(sender) {
            lanes.push(sender, Unit::Frame(frame));
        } else {
            frame.into_iter().for_each(|chunk| batch.put_bytes(chunk));
        }
    };
    loop {
        if lanes.is_empty() {
            // Everything taken so far is on the socket: senders may write directly again.
            outbox.written(std::mem::take(&mut taken));
            tokio::select! {
                next = queue.recv() => match next {
                    Some(out) => {
                        taken += 1;
                        add(&mut batch, &mut lanes, out);
                    }
                    None => return "queue closed".to_string(),
                },
                _ = ticker.tick() => {
                    if !wrote_since_tick {
                        outbox.claim();
                        taken += 1;
                        batch.put_slice(&[0, 0, 0, 0]);
                    }
                    wrote_since_tick = false;
                }
            }
        }
        while batch.len() < BATCH_LIMIT {
            match queue.try_recv() {
                Ok(out) => {
                    taken += 1;
                    add(&mut batch, &mut lanes, out);
                }
                Err(_) => break,
            }
        }
        lanes.write_round(&mut batch);
        if batch.len() == 0 {
            continue;
        }
        let bytes = batch.len();
        if let Err(e) = batch.write_to(&mut sink).await {
            return format!("write failed ({e})");
        }
        super::traffic::sent_bytes(bytes);
        wrote_since_tick = true;
    }
}
