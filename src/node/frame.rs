//! Frames of an established distribution connection: `Length:32` followed by the body.
//!
//! A body is one of
//! - empty: a tick;
//! - `112` + control + payload, each with version byte: the pass-through format, used only when
//!   DFLAG_FRAGMENTS is not negotiated;
//! - `131 'D'` distribution header (no atom cache: zero references) + control + payload without
//!   version bytes;
//! - `131 'E'` / `131 'F'`: the first and following fragments of a large message, reassembled
//!   here by [`super::reassembly`], which keeps large binaries out of the reassembled bytes so that
//!   they are never copied.
//!
//! OTP requires the header format back once FRAGMENTS is negotiated (a pass-through frame then kills
//! the connection), so [`encode_owned`] picks the format from the negotiated flags.

use super::message::{decode_message, decode_pass_through};
pub use super::message::{FrameError, Message, DEFAULT_MAX_MESSAGE_SIZE};
use super::reassembly::{
    read_into, Nonce, ReadError as ReassemblyReadError, Reassembly, BIG_BINARY,
};
use super::term::{encode_bare_into, encode_bare_owned, encode_into, Chunks, TermError};
use bytes::{Buf, Bytes};
use eetf::Term;
use std::collections::{HashMap, VecDeque};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, BufReader};

/// Size of the data in each outgoing fragment. OTP sends 64 KiB fragments and accepts any size;
/// larger ones cost the receiving BEAM less per byte, and the writer still interleaves other
/// messages between them.
pub const FRAGMENT_SIZE: usize = 256 * 1024;

const PASS_THROUGH: u8 = 112;
const VERSION_MAGIC: u8 = 131;
const DIST_HEADER: u8 = b'D';
const DIST_FRAG_HEADER: u8 = b'E';
const DIST_FRAG_CONT: u8 = b'F';

/// A fragmented message being received.
struct Partial {
    next_id: u64,
    /// Bytes of data received in its fragments so far.
    received: usize,
    message: Reassembly,
}

/// Turns frame bodies into messages, holding partially received fragmented messages.
pub struct FrameDecoder {
    in_progress: HashMap<u64, Partial>,
    nonce: Nonce,
    big_binary: usize,
    /// Largest message accepted, fragments added up.
    max_message: usize,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        FrameDecoder::with_big_binary(BIG_BINARY)
    }
}

impl FrameDecoder {
    /// Decodes one non-empty frame body. Returns `None` for a fragment that does not complete a
    /// message yet.
    pub fn decode(&mut self, body: &[u8]) -> Result<Option<Message>, FrameError> {
        match body {
            [PASS_THROUGH, VERSION_MAGIC, ..] => decode_pass_through(body).map(Some),
            [VERSION_MAGIC, DIST_HEADER, refs, ..] => {
                if *refs != 0 {
                    return Err(FrameError::AtomCache);
                }
                decode_message(&body[3..]).map(Some)
            }
            [VERSION_MAGIC, DIST_FRAG_HEADER, ..] => {
                let (seq, id) = first_fragment_ids(body)?;
                let data = &body[19..];
                if id <= 1 {
                    return decode_message(data).map(Some);
                }
                self.start(seq, id, data.len()).feed(data)?;
                Ok(None)
            }
            [VERSION_MAGIC, DIST_FRAG_CONT, ..] => {
                let (seq, id) = fragment_ids(body)?;
                self.continuation(seq, id, body.len() - 18)?
                    .feed(&body[18..])?;
                self.continued(seq)
            }
            _ => Err(FrameError::UnknownType(
                body.iter().take(8).copied().collect(),
            )),
        }
    }
}

impl FrameDecoder {
    /// A decoder that keeps binaries of at least `big_binary` bytes out of reassembled messages.
    /// The messages are the same for any threshold (above a placeholder's 16 bytes).
    pub(crate) fn with_big_binary(big_binary: usize) -> Self {
        FrameDecoder {
            in_progress: HashMap::new(),
            nonce: rand::random(),
            big_binary,
            max_message: DEFAULT_MAX_MESSAGE_SIZE,
        }
    }

    /// The same decoder refusing messages larger than `max_message` bytes.
    pub fn with_max_message(self, max_message: usize) -> Self {
        FrameDecoder {
            max_message,
            ..self
        }
    }

    /// For a `131 'E'` frame of sequence `seq` that announces `id` > 1 fragments and carries `len`
    /// bytes of data: starts the message (replacing any unfinished one of the same sequence) and
    /// returns its reassembly, into which the reader moves the data straight from the socket.
    pub fn start(&mut self, seq: u64, id: u64, len: usize) -> &mut Reassembly {
        // `id` fragments of about this one's size: the reassembly reserves for them (within a
        // bound, as the count comes from the peer).
        let expected = len
            .saturating_mul(usize::try_from(id).unwrap_or(usize::MAX))
            .min(self.max_message);
        let partial = Partial {
            next_id: id.saturating_sub(1),
            received: len,
            message: Reassembly::new(self.nonce, expected, self.big_binary),
        };
        match self.in_progress.entry(seq) {
            std::collections::hash_map::Entry::Occupied(mut slot) => {
                slot.insert(partial);
                &mut slot.into_mut().message
            }
            std::collections::hash_map::Entry::Vacant(slot) => &mut slot.insert(partial).message,
        }
    }

    /// For a `131 'F'` frame of sequence `seq` and fragment `id` carrying `len` bytes of data:
    /// checks it continues a message in progress and returns its reassembly, into which the
    /// reader moves the data straight from the socket.
    pub fn continuation(
        &mut self,
        seq: u64,
        id: u64,
        len: usize,
    ) -> Result<&mut Reassembly, FrameError> {
        let Some(partial) = self.in_progress.get_mut(&seq) else {
            return Err(FrameError::FragmentOrder { seq, id });
        };
        if partial.next_id != id || id == 0 {
            return Err(FrameError::FragmentOrder { seq, id });
        }
        if partial.received.saturating_add(len) > self.max_message {
            return Err(FrameError::TooLarge {
                limit: self.max_message,
            });
        }
        partial.received += len;
        partial.next_id -= 1;
        Ok(&mut partial.message)
    }

    /// After a fragment's data went into its reassembly: the message, if that was its last
    /// fragment.
    pub fn continued(&mut self, seq: u64) -> Result<Option<Message>, FrameError> {
        if self.in_progress.get(&seq).is_some_and(|p| p.next_id > 0) {
            return Ok(None);
        }
        match self.in_progress.remove(&seq) {
            Some(done) => done.message.finish().map(Some),
            None => Ok(None),
        }
    }
}

/// Sequence and fragment count of a first fragment (`131 'E' Seq:64 Id:64 0`), which must not
/// reference the atom cache.
pub fn first_fragment_ids(body: &[u8]) -> Result<(u64, u64), FrameError> {
    let ids = fragment_ids(body)?;
    match body.get(18) {
        Some(0) => Ok(ids),
        Some(_) => Err(FrameError::AtomCache),
        None => Err(TermError::Truncated(18).into()),
    }
}

/// Sequence and fragment ids of a fragment frame (`131 'E'|'F' Seq:64 Id:64`).
pub fn fragment_ids(body: &[u8]) -> Result<(u64, u64), FrameError> {
    let seq = body.get(2..10).ok_or(TermError::Truncated(2))?;
    let id = body.get(10..18).ok_or(TermError::Truncated(10))?;
    Ok((
        u64::from_be_bytes(seq.try_into().expect("8 bytes")),
        u64::from_be_bytes(id.try_into().expect("8 bytes")),
    ))
}

/// The connection reader's buffer: small enough that reads of large binaries' data bypass it (no
/// extra copy), large enough to gather many small frames per syscall.
pub const READ_BUFFER: usize = 16 * 1024;

/// Why [`read_frame`] read no message.
#[derive(Debug, thiserror::Error)]
pub enum ReadFrameError {
    /// The peer sent something that is not a frame it may send (or a message over the limit).
    #[error("malformed frame: {0}")]
    Malformed(FrameError),
    /// The stream ended, failed or went silent for the tick time.
    #[error("{0}")]
    Closed(String),
}

impl From<FrameError> for ReadFrameError {
    fn from(e: FrameError) -> Self {
        ReadFrameError::Malformed(e)
    }
}

/// Reads one frame from a connection's stream: returns the message it completes, if any (a
/// tick, or a fragment that does not end its message, completes none). The one dispatch on frame
/// types: the connection's reader uses it, and [`decode_stream`] (the fuzz target's path) too.
///
/// Fragments of a fragmented message (`131 'E'`, 19-byte header, then `131 'F'`, 18 bytes) go
/// from the stream straight into the message's reassembly, large binaries into vectors of their
/// own that become the decoded binaries: their data is copied once, by the read. Other frames are
/// read whole into `body` and decoded by [`FrameDecoder::decode`]. A frame larger than the
/// decoder's message limit is refused before its bytes are read.
pub async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    decoder: &mut FrameDecoder,
    body: &mut Vec<u8>,
    ticktime: Duration,
) -> Result<Option<Message>, ReadFrameError> {
    let closed = |reason: String| ReadFrameError::Closed(reason);
    let len = match tokio::time::timeout(ticktime, reader.read_u32()).await {
        Err(_) => return Err(closed(format!("no data for net_ticktime ({ticktime:?})"))),
        // The peer closed the connection (over TLS, possibly without a close_notify alert).
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(closed("connection closed".to_string()))
        }
        Ok(Err(e)) => return Err(closed(format!("connection closed ({e})"))),
        Ok(Ok(len)) => len as usize,
    };
    super::traffic::received_bytes(4 + len);
    if len == 0 {
        return Ok(None); // tick
    }
    if len > decoder.max_message {
        return Err(FrameError::TooLarge {
            limit: decoder.max_message,
        }
        .into());
    }
    let mut head = [0u8; 19];
    let mut head_len = 0;
    if len > 18 {
        read_exact_within(reader, &mut head[..18], ticktime).await?;
        head_len = 18;
        let fragment = match head[..2] {
            [VERSION_MAGIC, DIST_FRAG_CONT] => {
                let (seq, id) = fragment_ids(&head[..18]).expect("18-byte header");
                let message = decoder.continuation(seq, id, len - 18)?;
                Some((seq, message))
            }
            [VERSION_MAGIC, DIST_FRAG_HEADER] => {
                read_exact_within(reader, &mut head[18..], ticktime).await?;
                head_len = 19;
                let (seq, id) = first_fragment_ids(&head)?;
                // A message in one fragment is decoded from `body` like any other frame.
                (id > 1).then(|| (seq, decoder.start(seq, id, len - 19)))
            }
            _ => None,
        };
        if let Some((seq, message)) = fragment {
            let read = read_into(reader, message, len - head_len);
            match tokio::time::timeout(ticktime, read).await {
                Err(_) => return Err(closed("frame stalled for net_ticktime".to_string())),
                Ok(Err(ReassemblyReadError::Frame(e))) => return Err(e.into()),
                Ok(Err(e)) => return Err(closed(e.to_string())),
                Ok(Ok(())) => {}
            }
            return Ok(decoder.continued(seq)?);
        }
    }
    body.clear();
    body.extend_from_slice(&head[..head_len]);
    read_to_end_within(reader, body, len - head_len, ticktime).await?;
    Ok(decoder.decode(body)?)
}

/// Reads exactly `buf.len()` bytes, or says why the connection ends.
async fn read_exact_within<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    buf: &mut [u8],
    limit: Duration,
) -> Result<(), ReadFrameError> {
    match tokio::time::timeout(limit, reader.read_exact(buf)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(ReadFrameError::Closed(format!(
            "connection closed inside a frame ({e})"
        ))),
        Err(_) => Err(ReadFrameError::Closed(
            "frame stalled for net_ticktime".to_string(),
        )),
    }
}

/// Appends exactly `len` bytes to `buf`, growing it as bytes arrive rather than trusting the
/// length up front.
async fn read_to_end_within<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    buf: &mut Vec<u8>,
    len: usize,
    limit: Duration,
) -> Result<(), ReadFrameError> {
    buf.reserve(len.min(1 << 20));
    let closed = ReadFrameError::Closed;
    match tokio::time::timeout(limit, reader.take(len as u64).read_to_end(buf)).await {
        Ok(Ok(n)) if n == len => Ok(()),
        Ok(Ok(n)) => Err(closed(format!(
            "connection closed inside a frame ({n} of {len} bytes)"
        ))),
        Ok(Err(e)) => Err(closed(format!("connection closed ({e})"))),
        Err(_) => Err(closed("frame stalled for net_ticktime".to_string())),
    }
}

/// Decodes a byte stream of length-prefixed frames through [`read_frame`], as a connection's
/// reader does after the handshake, stopping at the first error; fewer than 4 bytes left over
/// end the stream. Used by the fuzz target and its corpus replay. Binaries from 64 bytes up count
/// as large in fragmented messages (the messages are the same for any threshold), so that short
/// inputs reach the reassembly's zero-copy path too.
pub fn decode_stream(data: &[u8]) -> Result<Vec<Message>, ReadFrameError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|e| ReadFrameError::Closed(format!("cannot start a runtime: {e}")))?;
    runtime.block_on(async {
        let mut reader = BufReader::with_capacity(READ_BUFFER, data);
        let mut decoder = FrameDecoder::with_big_binary(64);
        let mut body = Vec::new();
        let mut messages = Vec::new();
        // Bytes in memory never stall: the tick time only bounds a bug.
        let ticktime = Duration::from_secs(60);
        while reader.buffer().len() + reader.get_ref().len() >= 4 {
            let read = read_frame(&mut reader, &mut decoder, &mut body, ticktime).await?;
            messages.extend(read);
        }
        Ok(messages)
    })
}

/// One message body (without the length prefix) in one buffer, as [`encode_owned`] sends it: for
/// tests that feed encoded messages to the decoder.
#[cfg(test)]
pub(crate) fn encode_message(
    control: &Term,
    payload: Option<&Term>,
    header_format: bool,
) -> Vec<u8> {
    match encode_owned(control, payload.cloned(), header_format) {
        Encoded::Frame(frame) => frame.concat()[4..].to_vec(),
        Encoded::Large(body) => body.concat(),
    }
}

/// One message encoded for the writer, in chunks (see [`Chunks`]): large binaries of the
/// payload are moved, not copied.
pub enum Encoded {
    /// A whole frame, length prefix included.
    Frame(Vec<Bytes>),
    /// A header-format body (no length prefix) too large for one frame: to be sent in fragments.
    Large(Vec<Bytes>),
}

/// Encodes one message, taking the payload by value so that its large binaries need no copy.
pub fn encode_owned(control: &Term, payload: Option<Term>, header_format: bool) -> Encoded {
    let mut chunks = Chunks::new();
    let buf = chunks.bytes_mut();
    buf.extend_from_slice(&[0; 4]); // the length prefix, set below
    if header_format {
        buf.extend_from_slice(&[VERSION_MAGIC, DIST_HEADER, 0]);
        encode_bare_into(control, buf);
    } else {
        buf.push(PASS_THROUGH);
        encode_into(control, buf);
    }
    if let Some(payload) = payload {
        if !header_format {
            chunks.bytes_mut().push(VERSION_MAGIC);
        }
        encode_bare_owned(payload, &mut chunks);
    }
    let body_len = chunks.len() - 4;
    if header_format && Fragmenter::needed(body_len) {
        let mut body = chunks.into_chunks();
        body[0] = body[0].slice(4..);
        return Encoded::Large(body);
    }
    chunks.set_prefix((body_len as u32).to_be_bytes());
    Encoded::Frame(chunks.into_chunks())
}

/// Splits an encoded header-format body into `131 'E'` / `131 'F'` frames, one at a time, so the
/// writer can interleave other messages between them. Each fragment is a small header plus
/// slices of the body's chunks: its data is never copied.
pub struct Fragmenter {
    sequence: u64,
    /// What is left of the body's data (after its 3-byte distribution header).
    rest: VecDeque<Bytes>,
    first: bool,
    next_id: u64,
}

impl Fragmenter {
    /// `body` must come from [`encode_owned`] as [`Encoded::Large`] (or be a header-format body).
    pub fn new(sequence: u64, body: Vec<Bytes>) -> Self {
        let mut rest: VecDeque<Bytes> = body.into();
        let mut header = 3;
        while header > 0 {
            let Some(front) = rest.front_mut() else { break };
            let n = header.min(front.len());
            front.advance(n);
            header -= n;
            if front.is_empty() {
                rest.pop_front();
            }
        }
        let data_len: usize = rest.iter().map(Bytes::len).sum();
        Fragmenter {
            sequence,
            rest,
            first: true,
            next_id: data_len.div_ceil(FRAGMENT_SIZE).max(1) as u64,
        }
    }

    /// Whether a body of `len` bytes is large enough to be sent in fragments.
    pub fn needed(len: usize) -> bool {
        len > FRAGMENT_SIZE + 3
    }

    /// The next fragment as a complete frame: its length prefix and fragment header, and the
    /// slices of its data. Returns `None` once the last fragment has been handed out.
    pub fn next_fragment(&mut self) -> Option<(FragmentHead, Vec<Bytes>)> {
        if self.next_id == 0 {
            return None;
        }
        let mut data = Vec::new();
        let mut data_len = 0;
        while data_len < FRAGMENT_SIZE {
            let Some(front) = self.rest.front_mut() else {
                break;
            };
            let take = (FRAGMENT_SIZE - data_len).min(front.len());
            data.push(front.split_to(take));
            data_len += take;
            if front.is_empty() {
                self.rest.pop_front();
            }
        }
        let mut head = FragmentHead::default();
        let header_len = if self.first { 19 } else { 18 };
        head.push(&((header_len + data_len) as u32).to_be_bytes());
        head.push(&[
            VERSION_MAGIC,
            if self.first {
                DIST_FRAG_HEADER
            } else {
                DIST_FRAG_CONT
            },
        ]);
        head.push(&self.sequence.to_be_bytes());
        head.push(&self.next_id.to_be_bytes());
        if self.first {
            head.push(&[0]); // no atom cache references
        }
        self.first = false;
        self.next_id -= 1;
        Some((head, data))
    }
}

/// Length prefix and header of one fragment frame (at most 4 + 19 bytes).
#[derive(Default)]
pub struct FragmentHead {
    bytes: [u8; 23],
    len: usize,
}

impl FragmentHead {
    fn push(&mut self, bytes: &[u8]) {
        self.bytes[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }
}

impl std::ops::Deref for FragmentHead {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::term::{atom, binary, int, tuple};

    #[test]
    fn fragments_reassemble_into_the_same_message() {
        let control = tuple(vec![
            int(6),
            Term::from(eetf::Pid::new("a@b", 1, 0, 1)),
            atom(""),
            atom("xla"),
        ]);
        let payload = binary(vec![7u8; 3 * FRAGMENT_SIZE + 11]);
        let Encoded::Large(body) = encode_owned(&control, Some(payload.clone()), true) else {
            panic!("a message this large is sent in fragments");
        };
        let mut fragments = Fragmenter::new(42, body);
        let mut frames = Vec::new();
        while let Some((head, data)) = fragments.next_fragment() {
            let mut frame = head.to_vec();
            data.iter().for_each(|d| frame.extend_from_slice(d));
            frames.push(frame);
        }
        assert_eq!(frames.len(), 4);
        let mut decoder = FrameDecoder::default();
        let mut result = None;
        for frame in frames {
            result = decoder.decode(&frame[4..]).unwrap();
        }
        let message = result.expect("last fragment completes the message");
        assert_eq!(message.control, control);
        assert_eq!(message.payload, Some(payload));
    }

    #[test]
    fn pass_through_and_header_formats_decode_alike() {
        let control = tuple(vec![
            int(2),
            atom(""),
            Term::from(eetf::Pid::new("a@b", 1, 0, 1)),
        ]);
        let payload = atom("hello");
        for header in [false, true] {
            let body = encode_message(&control, Some(&payload), header);
            let m = FrameDecoder::default().decode(&body).unwrap().unwrap();
            assert_eq!(m.control, control);
            assert_eq!(m.payload.as_ref(), Some(&payload));
        }
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let mut decoder = FrameDecoder::default();
        for body in [
            &[1u8, 2, 3][..],
            &[131, 68, 5],
            &[131, 70, 0, 0],
            &[112, 131, 82, 1],
            &[131, 68, 0, 104],
        ] {
            assert!(decoder.decode(body).is_err());
        }
    }
}
