//! Reassembly of fragmented messages (`131 'E'` + `131 'F'` frames) that does not copy their large
//! binaries.
//!
//! A message under reassembly is kept as *small* bytes, everything but the data of large binaries,
//! plus one `Vec<u8>` per large binary (a `BINARY_EXT` of at least [`BIG_BINARY`] bytes). A
//! resumable walker steps over the small bytes tag by tag as they arrive ([`term::head`], the
//! layout table of [`term::scan`]: a flat walk is enough, as containers are just headers followed
//! by their elements). When it meets the header of a large binary, the message's next bytes go
//! into that binary's own vector until it is full, read there straight from the socket by
//! [`read_into`], and the small bytes get a 16-byte placeholder binary instead (a random nonce of
//! the decoder and the binary's index). Once the last fragment is in, the small bytes are decoded
//! like any message (checked by `scan` first) and each placeholder in the decoded term is swapped
//! for its vector: the data of a large binary is written once, by the socket read, and never
//! copied afterwards.
//!
//! Large binaries inside a `NEW_FUN_EXT` stay in the small bytes: the fun's Size field counts
//! them.
//!
//! A tag the walker cannot read (unknown, or malformed) ends the search for large binaries: the
//! rest of the message is kept as small bytes, and decoding it tells whether the fault lies in
//! the control message (the connection is dropped) or only in the payload (that message fails).

use super::message::{decode_message, decode_truncated, FrameError, Message};
use super::term::{self, TermError, BINARY_EXT};
use eetf::{InternalFun, Term};
use std::io;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt};

/// Binaries at least this large get a vector of their own instead of being copied out of the
/// reassembled message by the term decoder: a run's tensors of tens of KiB (a batch's shard) are
/// read once, not copied out of the reassembled bytes, for one allocation each.
pub const BIG_BINARY: usize = 16 * 1024;

/// Most memory reserved up front from lengths the peer announces (a fragment count, a binary's
/// length); larger buffers grow past it as their bytes really arrive.
pub const PREALLOCATE_LIMIT: usize = 256 << 20;

/// First reservation for the small bytes, before large binaries can have been seen.
const FIRST_SMALL: usize = 64 * 1024;

/// `BINARY_EXT` tag and 32-bit length.
const BINARY_HEADER: usize = 5;
/// Data of a placeholder binary: the nonce, then the large binary's index (32 bits).
const PLACEHOLDER_LEN: usize = 16;

/// Random part of the placeholders, one per decoder, so that a peer cannot make one by accident.
pub type Nonce = [u8; 12];

/// One fragmented message being received.
pub struct Reassembly {
    /// The message so far, each large binary's data replaced by a placeholder.
    small: Vec<u8>,
    /// Offset in `small` of the next tag the walker has not read yet.
    walk: usize,
    /// Large binaries are left in `small` before this offset (inside a `NEW_FUN_EXT`).
    no_big_before: usize,
    /// The walker met a tag it cannot read: everything from there on is small bytes.
    opaque: bool,
    bigs: Vec<Big>,
    /// Bytes of the message taken into `small` (placeholders not counted).
    small_fed: usize,
    /// The message's size as estimated from its fragment count.
    expected: usize,
    threshold: usize,
    nonce: Nonce,
}

struct Big {
    /// Offset of its header in the small bytes.
    at: usize,
    data: Vec<u8>,
    /// The length its header announces.
    len: usize,
}

impl Reassembly {
    /// A message of about `expected` bytes whose binaries of at least `threshold` bytes (more than
    /// a placeholder's 16) are kept apart.
    pub fn new(nonce: Nonce, expected: usize, threshold: usize) -> Self {
        debug_assert!(threshold > PLACEHOLDER_LEN);
        Reassembly {
            small: Vec::new(),
            walk: 0,
            no_big_before: 0,
            opaque: false,
            bigs: Vec::new(),
            small_fed: 0,
            expected,
            threshold: threshold.max(PLACEHOLDER_LEN + 1),
            nonce,
        }
    }

    /// Where the message's next bytes go when they are data of a large binary: its vector and how
    /// many bytes it still lacks. `None` when the next bytes are small bytes, for [`feed_small`].
    ///
    /// [`feed_small`]: Reassembly::feed_small
    pub fn big_target(&mut self) -> Option<(&mut Vec<u8>, usize)> {
        let big = self.bigs.last_mut()?;
        let missing = big.len - big.data.len();
        (missing > 0).then_some((&mut big.data, missing))
    }

    /// Takes the message's next bytes from the front of `bytes` into the small bytes, stopping
    /// right after the header of a large binary: returns how many it took (at least one when
    /// `bytes` is not empty). Only when [`big_target`] is `None`.
    ///
    /// [`big_target`]: Reassembly::big_target
    pub fn feed_small(&mut self, bytes: &[u8]) -> Result<usize, FrameError> {
        debug_assert!(self.big_target().is_none());
        let old = self.small.len();
        self.reserve_small(bytes.len());
        self.small.extend_from_slice(bytes);
        while !self.opaque {
            let at = self.walk;
            let head = match term::head(&self.small, at, usize::MAX) {
                Ok(head) => head,
                // The rest of this tag's header has not arrived yet.
                Err(TermError::Truncated(_)) => break,
                // Decoding the whole message says what it spoils.
                Err(_) => {
                    self.opaque = true;
                    break;
                }
            };
            if let Some(end) = head.fun_end {
                self.no_big_before = self.no_big_before.max(end);
            }
            let data_at = at + BINARY_HEADER;
            if head.tag == BINARY_EXT
                && at >= self.no_big_before
                && head.end - data_at >= self.threshold
            {
                return self.split_big(at, head.end - data_at, old);
            }
            self.walk = head.end;
        }
        self.small_fed += bytes.len();
        Ok(bytes.len())
    }

    /// The walker found a large binary of `len` bytes whose header is at `at`, in the bytes of the
    /// current [`feed_small`](Reassembly::feed_small), which started at `old`. Returns how many
    /// of them are taken: up to the end of the header, the binary's data is left to the caller.
    fn split_big(&mut self, at: usize, len: usize, old: usize) -> Result<usize, FrameError> {
        let data_at = at + BINARY_HEADER;
        // The walker stops at the first header that is not complete, so a header completed by
        // this feed ends in its bytes. Checked all the same: the bytes before `old` are taken.
        if data_at <= old {
            return Err(TermError::Malformed(at, "binary header walked twice").into());
        }
        self.small.truncate(data_at);
        let index = self.bigs.len() as u32;
        self.small[at + 1..data_at].copy_from_slice(&(PLACEHOLDER_LEN as u32).to_be_bytes());
        self.small.extend_from_slice(&self.nonce);
        self.small.extend_from_slice(&index.to_be_bytes());
        self.walk = data_at + PLACEHOLDER_LEN;
        self.bigs.push(Big {
            at,
            data: Vec::with_capacity(len.min(PREALLOCATE_LIMIT)),
            len,
        });
        let taken = data_at - old;
        self.small_fed += taken;
        Ok(taken)
    }

    /// Room for `n` more small bytes (and a placeholder). The first reservation is modest, as large
    /// binaries may take most of the message; later ones make room for the rest of the message
    /// at once, so that a large message without large binaries is not copied again each time its
    /// buffer would double.
    fn reserve_small(&mut self, n: usize) {
        let needed = n + PLACEHOLDER_LEN;
        if self.small.capacity() - self.small.len() >= needed {
            return;
        }
        let fed = self.small_fed + self.bigs.iter().map(|b| b.data.len()).sum::<usize>();
        let mut rest = self.expected.saturating_sub(fed).min(PREALLOCATE_LIMIT);
        if self.small.capacity() == 0 {
            rest = rest.min(FIRST_SMALL);
        }
        self.small.reserve(needed.max(rest));
    }

    /// Takes all of `bytes` as the message's next bytes.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Result<(), FrameError> {
        while !bytes.is_empty() {
            let n = match self.big_target() {
                Some((big, missing)) => {
                    let n = missing.min(bytes.len());
                    big.extend_from_slice(&bytes[..n]);
                    n
                }
                None => self.feed_small(bytes)?,
            };
            bytes = &bytes[n..];
        }
        Ok(())
    }

    /// Decodes the complete message and puts each large binary's vector in its place.
    pub fn finish(mut self) -> Result<Message, FrameError> {
        let mut message = match self.big_target() {
            // A binary claims more bytes than the message has: the term holding it is cut short.
            Some(_) => decode_truncated(&self.small, self.bigs.last().expect("a target").at)?,
            None => decode_message(&self.small)?,
        };
        if self.bigs.is_empty() {
            return Ok(message);
        }
        let mut slots: Vec<Option<Vec<u8>>> = self.bigs.into_iter().map(|b| Some(b.data)).collect();
        let mut restore = Restore {
            nonce: &self.nonce,
            slots: &mut slots,
        };
        restore.term(&mut message.control)?;
        if let Some(payload) = &mut message.payload {
            restore.term(payload)?;
        }
        match &mut message.payload_error {
            // The payload's binaries went with it.
            Some(failed) => {
                if let Some(call) = &mut failed.call {
                    restore.term(&mut call.tag)?;
                }
            }
            None if slots.iter().any(Option::is_some) => return Err(misplaced()),
            None => {}
        }
        Ok(message)
    }
}

fn misplaced() -> FrameError {
    TermError::Malformed(0, "large binary placeholder not found exactly once").into()
}

/// Swaps placeholders for the large binaries they stand for. Recursive: terms are at most
/// [`term::MAX_DEPTH`] deep once `scan` accepted them.
struct Restore<'a> {
    nonce: &'a Nonce,
    slots: &'a mut [Option<Vec<u8>>],
}

impl Restore<'_> {
    fn index(&self, bytes: &[u8]) -> Option<usize> {
        if bytes.len() != PLACEHOLDER_LEN || bytes[..self.nonce.len()] != self.nonce[..] {
            return None;
        }
        let index = bytes[self.nonce.len()..].try_into().expect("4 bytes");
        Some(u32::from_be_bytes(index) as usize)
    }

    fn term(&mut self, term: &mut Term) -> Result<(), FrameError> {
        match term {
            Term::Binary(binary) => {
                if let Some(index) = self.index(&binary.bytes) {
                    let slot = self.slots.get_mut(index).ok_or_else(misplaced)?;
                    binary.bytes = slot.take().ok_or_else(misplaced)?;
                }
            }
            Term::Tuple(t) => self.all(&mut t.elements)?,
            Term::List(l) => self.all(&mut l.elements)?,
            Term::ImproperList(l) => {
                self.all(&mut l.elements)?;
                self.term(&mut l.last)?;
            }
            Term::Map(m) => {
                if m.map.keys().any(|k| self.holds(k)) {
                    // Keys are hashed by content: take them out to change them.
                    let entries: Vec<(Term, Term)> = m.map.drain().collect();
                    for (mut key, mut value) in entries {
                        self.term(&mut key)?;
                        self.term(&mut value)?;
                        if m.map.insert(key, value).is_some() {
                            return Err(TermError::Malformed(0, "duplicate map key").into());
                        }
                    }
                } else {
                    for value in m.map.values_mut() {
                        self.term(value)?;
                    }
                }
            }
            Term::InternalFun(f) => match &mut **f {
                InternalFun::Old { free_vars, .. } | InternalFun::New { free_vars, .. } => {
                    self.all(free_vars)?
                }
            },
            _ => {}
        }
        Ok(())
    }

    fn all(&mut self, terms: &mut [Term]) -> Result<(), FrameError> {
        terms.iter_mut().try_for_each(|t| self.term(t))
    }

    /// Whether `term` contains a placeholder (a map key to take out before changing it).
    fn holds(&self, term: &Term) -> bool {
        match term {
            Term::Binary(binary) => self.index(&binary.bytes).is_some(),
            Term::Tuple(t) => t.elements.iter().any(|e| self.holds(e)),
            Term::List(l) => l.elements.iter().any(|e| self.holds(e)),
            Term::ImproperList(l) => {
                l.elements.iter().any(|e| self.holds(e)) || self.holds(&l.last)
            }
            Term::Map(m) => m.map.iter().any(|(k, v)| self.holds(k) || self.holds(v)),
            Term::InternalFun(f) => match &**f {
                InternalFun::Old { free_vars, .. } | InternalFun::New { free_vars, .. } => {
                    free_vars.iter().any(|e| self.holds(e))
                }
            },
            _ => false,
        }
    }
}

/// Why [`read_into`] stopped.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("connection closed inside a frame ({0})")]
    Io(#[from] io::Error),
    #[error(transparent)]
    Frame(#[from] FrameError),
}

/// Reads `len` bytes of a fragment's data from `reader` into `message`: small bytes through the
/// reader's buffer (looked at there, so that none past a large binary's header is taken), a large
/// binary's data into its own vector (a `tokio::io::BufReader` hands a read larger than its buffer
/// straight to the socket when it holds nothing buffered).
pub async fn read_into<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    message: &mut Reassembly,
    mut len: usize,
) -> Result<(), ReadError> {
    while len > 0 {
        if let Some((big, missing)) = message.big_target() {
            let n = missing.min(len);
            // Within the capacity reserved from its length (up to PREALLOCATE_LIMIT); beyond it,
            // grown as bytes really arrive.
            big.reserve(n.min(1 << 20));
            let got = (&mut *reader).take(n as u64).read_to_end(big).await?;
            if got != n {
                return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
            }
            len -= n;
        } else {
            let available = reader.fill_buf().await?;
            if available.is_empty() {
                return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
            }
            let n = available.len().min(len);
            let taken = message.feed_small(&available[..n])?;
            reader.consume(taken);
            len -= taken;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::frame::{
        decode_stream, encode_message, FrameDecoder, DEFAULT_MAX_MESSAGE_SIZE,
    };
    use crate::node::term::{atom, binary, int, list, tuple};
    use eetf::{ImproperList, Map, Pid};
    use std::collections::HashMap;
    use tokio::io::BufReader;

    /// Threshold for the sweeps over every cut: small messages, every boundary.
    const T: usize = 40;

    fn pid() -> Pid {
        Pid::new("a@b", 1, 0, 1)
    }

    /// `len` bytes whose pattern depends on `seed`.
    fn bytes(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    fn big(len: usize, seed: u8) -> Term {
        binary(bytes(len, seed))
    }

    fn tensor(len: usize, seed: u8) -> Term {
        let dims = list(vec![int(len as i64 / 4)]);
        tuple(vec![
            big(len, seed),
            tuple(vec![tuple(vec![atom("f"), int(32)]), dims]),
        ])
    }

    fn map(entries: Vec<(Term, Term)>) -> Term {
        Term::from(Map::from(entries.into_iter().collect::<HashMap<_, _>>()))
    }

    fn fun(free_vars: Vec<Term>, new: bool) -> Term {
        Term::from(if new {
            InternalFun::New {
                module: "m".into(),
                arity: 1,
                pid: pid(),
                free_vars,
                index: 3,
                uniq: [7; 16],
                old_index: 1,
                old_uniq: 2,
            }
        } else {
            InternalFun::Old {
                module: "m".into(),
                pid: pid(),
                free_vars,
                index: 1,
                uniq: 2,
            }
        })
    }

    /// `{6, From, Unused, :xla}` (REG_SEND): `unused` puts a binary into the control message.
    fn reg_send(unused: Term) -> Term {
        tuple(vec![int(6), Term::from(pid()), unused, atom("xla")])
    }

    /// A message's data as fragments carry it: control and payload without version bytes.
    fn data_of(control: &Term, payload: &Term) -> Vec<u8> {
        encode_message(control, Some(payload), true)[3..].to_vec()
    }

    /// Control, payload, and how many binaries of at least `T` bytes are kept apart.
    fn messages() -> Vec<(Term, Term, usize)> {
        let none = reg_send(atom(""));
        vec![
            // No large binary; one just below the threshold.
            (
                none.clone(),
                tuple(vec![
                    atom("echo"),
                    big(T - 1, 1),
                    list(vec![int(1), int(1 << 40)]),
                ]),
                0,
            ),
            // One, the whole payload: its header starts the payload and its data ends the message.
            (none.clone(), big(T, 2), 1),
            // One in the control message, near the start, and one at the very end.
            (
                reg_send(big(T + 5, 3)),
                tuple(vec![atom("x"), big(2 * T, 4)]),
                2,
            ),
            // {:run, exe, [t1, t2]}
            (
                none.clone(),
                tuple(vec![
                    atom("run"),
                    big(8, 5),
                    list(vec![tensor(T + 1, 6), tensor(3 * T, 7)]),
                ]),
                2,
            ),
            // A list element, a map key and a map value, an improper list's tail.
            (
                none.clone(),
                list(vec![
                    big(T, 8),
                    map(vec![(big(T + 2, 9), int(1)), (atom("k"), big(T + 3, 10))]),
                    Term::from(ImproperList::from((vec![int(1)], big(T + 4, 11)))),
                ]),
                4,
            ),
            // A new fun's Size counts its free variables: they stay in the small bytes. An old
            // fun has no such field.
            (
                none.clone(),
                tuple(vec![
                    fun(vec![big(T, 12), fun(vec![big(T, 13)], true)], true),
                    fun(vec![big(T + 1, 14)], false),
                    big(T + 6, 15),
                ]),
                2,
            ),
            // Back to back, equal contents, an empty binary between.
            (
                none,
                list(vec![big(T, 16), big(T, 16), binary(vec![]), big(T + 1, 17)]),
                3,
            ),
        ]
    }

    /// Offsets around each binary of at least `T` bytes: its header (tag, each length byte, its
    /// data's first byte) and its end. `data` may be cut short.
    fn interesting(data: &[u8]) -> Vec<usize> {
        let mut spots = Vec::new();
        let mut at = 0;
        while let Ok(head) = term::head(data, at, usize::MAX) {
            if head.tag == BINARY_EXT && head.end - at - BINARY_HEADER >= T {
                spots.extend(at..=at + BINARY_HEADER + 1);
                spots.extend(head.end - 1..=head.end + 1);
            }
            at = head.end;
        }
        spots.retain(|&s| s <= data.len());
        spots.sort_unstable();
        spots.dedup();
        spots
    }

    /// Every way of cutting tried: none, one cut anywhere, fragments of every size, two cuts at
    /// any two interesting offsets.
    fn cuts_of(data: &[u8]) -> Vec<Vec<usize>> {
        let mut cases = vec![vec![]];
        cases.extend((0..=data.len()).map(|c| vec![c]));
        cases.extend((1..data.len()).map(|size| (size..data.len()).step_by(size).collect()));
        let spots = interesting(data);
        for &a in &spots {
            for &b in &spots {
                if a < b {
                    cases.push(vec![a, b]);
                }
            }
        }
        cases
    }

    /// Frame bodies (`131 'E'` then `131 'F'`...) carrying `data` cut at `cuts`.
    fn fragments(seq: u64, data: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
        let mut bounds = vec![0];
        bounds.extend_from_slice(cuts);
        bounds.push(data.len());
        let count = bounds.len() - 1;
        (0..count)
            .map(|i| {
                let mut frame = vec![131, if i == 0 { b'E' } else { b'F' }];
                frame.extend_from_slice(&seq.to_be_bytes());
                frame.extend_from_slice(&((count - i) as u64).to_be_bytes());
                if i == 0 {
                    frame.push(0);
                }
                frame.extend_from_slice(&data[bounds[i]..bounds[i + 1]]);
                frame
            })
            .collect()
    }

    /// The frames with their length prefixes, as they come off the socket.
    fn stream(frames: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        for frame in frames {
            out.extend_from_slice(&(frame.len() as u32).to_be_bytes());
            out.extend_from_slice(frame);
        }
        out
    }

    /// Decodes frame bodies the way `FrameDecoder::decode` is fed whole frames.
    fn decode_frames(
        decoder: &mut FrameDecoder,
        frames: &[Vec<u8>],
    ) -> Result<Message, FrameError> {
        let mut result = None;
        for frame in frames {
            assert!(
                result.is_none(),
                "a message completed before its last fragment"
            );
            result = decoder.decode(frame)?;
        }
        Ok(result.expect("the last fragment completes the message"))
    }

    /// Reads a stream of frames the way the connection's reader does (`frame::read_frame`):
    /// fragments through `start`/`continuation`, `read_into` and `continued`, other frames whole.
    /// Records where each large binary's vector was allocated, checking it never moves: a copy
    /// of `read_frame`'s steps with that check between `read_into` and `continued`, which
    /// `read_frame` itself has no place for.
    async fn read_stream(
        decoder: &mut FrameDecoder,
        bytes: &[u8],
        capacity: usize,
        vectors: &mut Vec<*const u8>,
    ) -> Result<Vec<Message>, String> {
        let mut reader = BufReader::with_capacity(capacity, bytes);
        let mut messages = Vec::new();
        while let Ok(len) = reader.read_u32().await {
            let len = len as usize;
            let mut head = [0u8; 19];
            let mut head_len = 0;
            if len > 18 {
                reader.read_exact(&mut head[..18]).await.unwrap();
                head_len = 18;
                let fragment = match head[..2] {
                    [131, b'F'] => {
                        let (seq, id) = crate::node::frame::fragment_ids(&head[..18]).unwrap();
                        let message = decoder
                            .continuation(seq, id, len - 18)
                            .map_err(|e| e.to_string())?;
                        Some((seq, message))
                    }
                    [131, b'E'] => {
                        reader.read_exact(&mut head[18..]).await.unwrap();
                        head_len = 19;
                        let (seq, id) = crate::node::frame::first_fragment_ids(&head)
                            .map_err(|e| e.to_string())?;
                        (id > 1).then(|| (seq, decoder.start(seq, id, len - 19)))
                    }
                    _ => None,
                };
                if let Some((seq, message)) = fragment {
                    let read = read_into(&mut reader, message, len - head_len).await;
                    for (i, big) in message.bigs.iter().enumerate() {
                        match vectors.get(i) {
                            Some(&at) => assert_eq!(at, big.data.as_ptr(), "vector moved"),
                            None => vectors.push(big.data.as_ptr()),
                        }
                    }
                    read.map_err(|e| e.to_string())?;
                    messages.extend(decoder.continued(seq).map_err(|e| e.to_string())?);
                    continue;
                }
            }
            let mut body = head[..head_len].to_vec();
            body.resize(len, 0);
            reader.read_exact(&mut body[head_len..]).await.unwrap();
            messages.extend(decoder.decode(&body).map_err(|e| e.to_string())?);
        }
        Ok(messages)
    }

    /// The data pointers of all binaries in `term` of at least `min` bytes, in any order.
    fn binary_pointers(term: &Term, min: usize, out: &mut Vec<*const u8>) {
        match term {
            Term::Binary(b) if b.bytes.len() >= min => out.push(b.bytes.as_ptr()),
            Term::Tuple(t) => t.elements.iter().for_each(|e| binary_pointers(e, min, out)),
            Term::List(l) => l.elements.iter().for_each(|e| binary_pointers(e, min, out)),
            _ => {}
        }
    }

    #[test]
    fn fragmented_messages_decode_as_unfragmented_at_every_cut() {
        for (control, payload, bigs) in messages() {
            let data = data_of(&control, &payload);
            // Today's path for the same bytes unfragmented.
            let expected = decode_message(&data).unwrap();
            for cuts in cuts_of(&data) {
                let what = format!("{payload} cut at {cuts:?}");
                let frames = fragments(9, &data, &cuts);
                if frames.len() > 1 {
                    // The reassembly alone, to see that the large binaries were kept apart.
                    let mut message = Reassembly::new([3; 12], data.len(), T);
                    for frame in &frames {
                        let header = if frame[1] == b'E' { 19 } else { 18 };
                        message.feed(&frame[header..]).unwrap();
                    }
                    assert_eq!(message.bigs.len(), bigs, "{what}");
                    let m = message.finish().unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert_eq!(m.control, expected.control, "{what}");
                    assert_eq!(m.payload, expected.payload, "{what}");
                }
                let mut decoder = FrameDecoder::with_big_binary(T);
                let m =
                    decode_frames(&mut decoder, &frames).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(m.control, expected.control, "{what}");
                assert_eq!(m.payload, expected.payload, "{what}");
            }
        }
    }

    #[tokio::test]
    async fn the_reader_path_decodes_as_unfragmented_at_every_cut() {
        for (control, payload, bigs) in messages() {
            let data = data_of(&control, &payload);
            let expected = decode_message(&data).unwrap();
            // The reader's buffer sees the stream in pieces of its capacity: one byte, a few, more
            // than a fragment.
            for capacity in [1, 2, 5, 16, 4096] {
                for cut in 0..=data.len() {
                    let bytes = stream(&fragments(5, &data, &[cut]));
                    let mut decoder = FrameDecoder::with_big_binary(T);
                    let mut vectors = Vec::new();
                    let messages = read_stream(&mut decoder, &bytes, capacity, &mut vectors)
                        .await
                        .unwrap_or_else(|e| panic!("{payload} cut at {cut}: {e}"));
                    assert_eq!(messages.len(), 1);
                    assert_eq!(messages[0].control, expected.control);
                    assert_eq!(messages[0].payload, expected.payload);
                    assert_eq!(vectors.len(), bigs);
                }
            }
        }
    }

    #[tokio::test]
    async fn large_binaries_are_read_into_the_vectors_that_become_the_binaries() {
        // {:run, exe, [t1, t2]}, two tensors of at least BIG_BINARY bytes (and together more than
        // a fragment), in 64 KiB fragments as OTP sends them, then with cuts inside and right
        // after each binary's header.
        let size = BIG_BINARY.max(64 << 10);
        let payload = tuple(vec![
            atom("run"),
            big(24, 1),
            list(vec![tensor(size + 1000, 2), tensor(size, 3)]),
        ]);
        let data = data_of(&reg_send(atom("")), &payload);
        let spots = interesting(&data);
        let mut cases: Vec<Vec<usize>> = vec![(64 << 10..data.len()).step_by(64 << 10).collect()];
        cases.extend(spots.iter().map(|&s| vec![s]));
        cases.push(spots.clone());
        for cuts in cases {
            let bytes = stream(&fragments(77, &data, &cuts));
            let mut decoder = FrameDecoder::default();
            let mut vectors = Vec::new();
            let mut messages = read_stream(&mut decoder, &bytes, 16 * 1024, &mut vectors)
                .await
                .unwrap();
            let message = messages.pop().unwrap();
            assert_eq!(message.payload.as_ref(), Some(&payload));
            // The decoded binaries are the very vectors the data was read into.
            let mut decoded = Vec::new();
            binary_pointers(message.payload.as_ref().unwrap(), BIG_BINARY, &mut decoded);
            assert_eq!(decoded.len(), 2);
            assert_eq!(vectors, decoded, "cut at {cuts:?}");
        }
    }

    #[test]
    fn a_placeholder_is_swapped_not_copied() {
        let payload = tuple(vec![atom("echo"), big(BIG_BINARY, 4)]);
        let data = data_of(&reg_send(atom("")), &payload);
        let mut message = Reassembly::new(rand::random(), data.len(), BIG_BINARY);
        let header_end = interesting(&data)[5];
        assert_eq!(message.feed_small(&data).unwrap(), header_end);
        let (vector, missing) = message.big_target().unwrap();
        assert_eq!(missing, BIG_BINARY);
        assert_eq!(vector.capacity(), BIG_BINARY);
        let at = vector.as_ptr();
        message.feed(&data[header_end..]).unwrap();
        let decoded = message.finish().unwrap();
        assert_eq!(decoded.payload.as_ref(), Some(&payload));
        let mut pointers = Vec::new();
        binary_pointers(decoded.payload.as_ref().unwrap(), BIG_BINARY, &mut pointers);
        assert_eq!(pointers, [at]);
    }

    /// A message whose payload is cut short or lies fails alone: it still decodes, with its
    /// control message and a payload error.
    fn payload_failed(result: Result<Message, FrameError>, control: &Term) -> bool {
        matches!(result, Ok(m) if m.payload_error.is_some() && m.payload.is_none() && &m.control == control)
    }

    #[test]
    fn truncated_messages_are_errors() {
        // Every strict prefix of a message, however cut, among them those that end inside a
        // large binary's header or data: a frame error while the control message is cut, a
        // payload error after.
        for (control, payload, _) in messages() {
            let data = data_of(&control, &payload);
            let control_len = term::decode_at(&data, 0).unwrap().end;
            for end in 0..data.len() {
                let prefix = &data[..end];
                for cuts in [vec![], vec![end / 2], interesting(prefix)] {
                    let frames = fragments(1, prefix, &cuts);
                    if frames.len() < 2 {
                        continue;
                    }
                    let mut decoder = FrameDecoder::with_big_binary(T);
                    let result = decode_frames(&mut decoder, &frames);
                    if end < control_len {
                        assert!(result.is_err(), "{payload} to {end}");
                    } else {
                        assert!(payload_failed(result, &control), "{payload} to {end}");
                    }
                }
            }
        }
    }

    #[test]
    fn lying_binary_lengths_are_errors() {
        let payload = tuple(vec![atom("echo"), big(T, 4), int(1)]);
        let control = reg_send(atom(""));
        let data = data_of(&control, &payload);
        let at = interesting(&data)[0];
        for claimed in [T as u32 + 1, T as u32 + 1000, u32::MAX] {
            let mut lying = data.clone();
            lying[at + 1..at + 5].copy_from_slice(&claimed.to_be_bytes());
            for cuts in [vec![at + 3], vec![at + 5, at + 9], vec![lying.len() - 1]] {
                let mut decoder = FrameDecoder::with_big_binary(T);
                let frames = fragments(2, &lying, &cuts);
                assert!(payload_failed(
                    decode_frames(&mut decoder, &frames),
                    &control
                ));
            }
        }
        // A huge claimed length is not reserved up front.
        let mut lying = data.clone();
        lying[at + 1..at + 5].copy_from_slice(&u32::MAX.to_be_bytes());
        let mut message = Reassembly::new([0; 12], lying.len(), T);
        message.feed(&lying).unwrap();
        let (vector, missing) = message.big_target().unwrap();
        assert_eq!(missing, u32::MAX as usize - (lying.len() - at - 5));
        assert!(vector.capacity() <= PREALLOCATE_LIMIT);
        let failed = message.finish().unwrap().payload_error.unwrap();
        assert!(matches!(failed.error, TermError::Truncated(_)));
    }

    #[test]
    fn fragments_out_of_order_are_errors() {
        let payload = list(vec![big(T, 1), big(T, 2)]);
        let data = data_of(&reg_send(atom("")), &payload);
        let frames = fragments(3, &data, &[10, 50, 90, 110]);
        let order_error = |order: &[usize]| {
            let mut decoder = FrameDecoder::with_big_binary(T);
            let mut result = Ok(None);
            for &i in order {
                result = decoder.decode(&frames[i]);
                if result.is_err() {
                    break;
                }
            }
            matches!(result, Err(FrameError::FragmentOrder { .. }))
        };
        assert!(order_error(&[0, 2]));
        assert!(order_error(&[0, 1, 1]));
        assert!(order_error(&[1]));
        assert!(order_error(&[0, 1, 2, 3, 4, 4]));
        // Fragment id 0 and an unknown sequence.
        let mut decoder = FrameDecoder::with_big_binary(T);
        decoder.decode(&frames[0]).unwrap();
        assert!(decoder.continuation(3, 0, 1).is_err());
        assert!(decoder.continuation(4, 3, 1).is_err());
        // More than the largest message in all is refused before any of it is read.
        assert!(matches!(
            decoder.continuation(3, 4, DEFAULT_MAX_MESSAGE_SIZE),
            Err(FrameError::TooLarge { .. })
        ));
    }

    #[test]
    fn placeholder_lookalikes_are_errors() {
        let nonce = [5u8; 12];
        let lookalike = |index: u32, nonce: &[u8]| binary([nonce, &index.to_be_bytes()].concat());
        for (payload, ok) in [
            (list(vec![lookalike(0, &nonce), big(T, 1)]), false),
            (list(vec![big(T, 1), lookalike(0, &nonce)]), false),
            (list(vec![big(T, 1), lookalike(7, &nonce)]), false),
            (list(vec![big(T, 1), lookalike(0, &[6; 12])]), true),
        ] {
            let data = data_of(&reg_send(atom("")), &payload);
            let mut message = Reassembly::new(nonce, data.len(), T);
            message.feed(&data).unwrap();
            match message.finish() {
                Ok(m) => {
                    assert!(ok);
                    assert_eq!(m.payload, Some(payload));
                }
                Err(e) => assert!(!ok, "{e}"),
            }
        }
    }

    #[test]
    fn bad_tags_after_a_large_binary_are_errors() {
        // In the payload: that message fails, with or without large binaries before the tag.
        for (control, payload) in [
            (reg_send(atom("")), list(vec![big(T, 1), int(1)])),
            (reg_send(big(T, 2)), list(vec![atom("x"), int(1)])),
        ] {
            let mut data = data_of(&control, &payload);
            let last = data.len() - 3; // the SMALL_INTEGER_EXT before the tail
            assert_eq!(data[last], 97);
            data[last] = 82; // an atom cache reference
            for cuts in [
                vec![last - 10],
                vec![last],
                vec![last + 1],
                vec![5, last + 2],
            ] {
                let mut decoder = FrameDecoder::with_big_binary(T);
                let result = decode_frames(&mut decoder, &fragments(1, &data, &cuts));
                assert!(payload_failed(result, &control), "cut at {cuts:?}");
            }
        }
        // In the control message, after a large binary there: the connection's fault.
        let control = tuple(vec![int(6), Term::from(pid()), big(T, 3), atom("xla")]);
        let mut data = data_of(&control, &int(1));
        let name = data.iter().rposition(|&b| b == 119).unwrap(); // `xla`'s tag
        data[name] = 82;
        let mut decoder = FrameDecoder::with_big_binary(T);
        assert!(decode_frames(&mut decoder, &fragments(1, &data, &[name - 3])).is_err());
    }

    #[test]
    fn a_call_whose_request_cannot_be_decoded_keeps_its_caller() {
        // {:"$gen_call", {pid, [:alias | ref]}, {:echo, big, <bad tag>}} in fragments.
        let tag = Term::from(eetf::ImproperList::from((
            vec![atom("alias")],
            Term::from(eetf::Reference::from(("a@b", vec![1, 2, 3]))),
        )));
        let request = tuple(vec![atom("echo"), big(T, 1), int(7)]);
        let payload = tuple(vec![
            atom("$gen_call"),
            tuple(vec![Term::from(pid()), tag.clone()]),
            request,
        ]);
        let control = reg_send(atom(""));
        let mut data = data_of(&control, &payload);
        let last = data.len() - 2;
        assert_eq!(data[last], 97);
        data[last] = 200; // no such tag
        let mut decoder = FrameDecoder::with_big_binary(T);
        let message = decode_frames(&mut decoder, &fragments(4, &data, &[30, last])).unwrap();
        let failed = message.payload_error.unwrap();
        assert!(matches!(
            failed.error,
            TermError::UnsupportedTag { tag: 200, .. }
        ));
        let call = failed.call.unwrap();
        assert_eq!((call.pid, call.tag), (pid(), tag));
    }

    #[test]
    fn decode_stream_reassembles_through_the_large_binary_path() {
        let payload = tuple(vec![big(100, 1), list(vec![big(64, 2), big(63, 3)])]);
        let data = data_of(&reg_send(atom("")), &payload);
        let mut frames = fragments(1, &data, &[7, 40, 150, 151]);
        frames.extend(fragments(2, &data, &[100]));
        let messages = decode_stream(&stream(&frames)).unwrap();
        assert_eq!(messages.len(), 2);
        for m in messages {
            assert_eq!(m.payload.as_ref(), Some(&payload));
        }
        frames.swap(1, 2);
        assert!(decode_stream(&stream(&frames)).is_err());
    }
}
