//! The distribution handshake, version 6 (OTP 23+), in both roles.
//!
//! Written here rather than taken from `erl_dist` because the node needs what that crate's
//! handshake does not do: answer `alive` and read the client's `strue`/`sfalse`, resolve
//! simultaneous connects with `nok`/`ok_simultaneous` against its own connection table, and bound
//! every step with a timeout (the caller wraps the whole exchange in one).
//!
//! Messages are `Length:16` + body over plain TCP, and `Length:32` + body over TLS (OTP's
//! `inet_tls_dist` runs the handshake on a `{packet, 4}` socket). Names follow the Erlang
//! documentation: send_name (`N`),
//! recv_status (`s`), recv_challenge (`N`), send_challenge_reply (`r`), recv_challenge_ack (`a`).

use super::flags;
use super::stream::DistStream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What this node tells peers about itself.
#[derive(Debug, Clone)]
pub struct LocalIdentity {
    pub name: String,
    pub flags: u64,
    pub creation: u32,
    pub cookie: String,
}

/// What the handshake learned about the peer.
#[derive(Debug, Clone)]
pub struct PeerInfo {
    pub name: String,
    pub flags: u64,
    pub creation: u32,
}

/// The server's answer after reading the client's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    OkSimultaneous,
    Nok,
    NotAllowed,
    Alive,
}

impl Status {
    fn text(self) -> &'static [u8] {
        match self {
            Status::Ok => b"ok",
            Status::OkSimultaneous => b"ok_simultaneous",
            Status::Nok => b"nok",
            Status::NotAllowed => b"not_allowed",
            Status::Alive => b"alive",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("unexpected handshake message {tag:?} while waiting for {expected}")]
    UnexpectedMessage { tag: u8, expected: &'static str },
    #[error("malformed handshake message: {0}")]
    Malformed(&'static str),
    #[error("peer {peer} sent the wrong challenge digest (cookies differ)")]
    WrongCookie { peer: String },
    #[error("peer answered status {0}")]
    Refused(String),
    #[error("peer {peer} lacks mandatory distribution flags {missing:#x}")]
    MissingFlags { peer: String, missing: u64 },
    #[error("peer called itself {got}, expected {expected}")]
    WrongName { got: String, expected: String },
}

/// Handshake messages are small; a TLS peer's 32-bit length is bounded by this.
const MAX_MESSAGE: usize = 0xffff;

async fn read_message(stream: &mut DistStream) -> Result<Vec<u8>, HandshakeError> {
    let len = match stream {
        DistStream::Tcp(_) => stream.read_u16().await? as usize,
        DistStream::Tls(_) => stream.read_u32().await? as usize,
    };
    if len > MAX_MESSAGE {
        return Err(HandshakeError::Malformed("message longer than 64 KiB"));
    }
    let mut body = vec![0; len];
    stream.read_exact(&mut body).await?;
    if body.is_empty() {
        return Err(HandshakeError::Malformed("empty message"));
    }
    Ok(body)
}

async fn write_message(stream: &mut DistStream, body: &[u8]) -> Result<(), HandshakeError> {
    let mut frame = Vec::with_capacity(body.len() + 4);
    match stream {
        DistStream::Tcp(_) => frame.extend_from_slice(&(body.len() as u16).to_be_bytes()),
        DistStream::Tls(_) => frame.extend_from_slice(&(body.len() as u32).to_be_bytes()),
    }
    frame.extend_from_slice(body);
    stream.write_all(&frame).await?;
    stream.flush().await?;
    Ok(())
}

fn digest(cookie: &str, challenge: u32) -> [u8; 16] {
    md5::compute(format!("{cookie}{challenge}")).0
}

/// `N` Flags:64 Challenge:32 Creation:32 NLen:16 Name, without the challenge for send_name.
fn new_style_name(me: &LocalIdentity, challenge: Option<u32>) -> Vec<u8> {
    let mut body = vec![b'N'];
    body.extend_from_slice(&me.flags.to_be_bytes());
    if let Some(c) = challenge {
        body.extend_from_slice(&c.to_be_bytes());
    }
    body.extend_from_slice(&me.creation.to_be_bytes());
    body.extend_from_slice(&(me.name.len() as u16).to_be_bytes());
    body.extend_from_slice(me.name.as_bytes());
    body
}

/// Parses `N` Flags:64 [Challenge:32] Creation:32 NLen:16 Name.
fn parse_new_style_name(
    body: &[u8],
    with_challenge: bool,
) -> Result<(PeerInfo, u32), HandshakeError> {
    let fixed = 1 + 8 + if with_challenge { 4 } else { 0 } + 4 + 2;
    if body.len() < fixed || body[0] != b'N' {
        return Err(HandshakeError::Malformed("name message"));
    }
    let flags = u64::from_be_bytes(body[1..9].try_into().expect("8 bytes"));
    let mut at = 9;
    let challenge = if with_challenge {
        at += 4;
        u32::from_be_bytes(body[9..13].try_into().expect("4 bytes"))
    } else {
        0
    };
    let creation = u32::from_be_bytes(body[at..at + 4].try_into().expect("4 bytes"));
    let nlen = u16::from_be_bytes(body[at + 4..at + 6].try_into().expect("2 bytes")) as usize;
    let name = body
        .get(at + 6..at + 6 + nlen)
        .and_then(|n| std::str::from_utf8(n).ok())
        .filter(|n| n.contains('@'))
        .ok_or(HandshakeError::Malformed("node name"))?;
    Ok((
        PeerInfo {
            name: name.to_string(),
            flags,
            creation,
        },
        challenge,
    ))
}

fn check_mandatory(peer: &PeerInfo) -> Result<(), HandshakeError> {
    let missing = flags::MANDATORY & !peer.flags;
    if missing != 0 {
        return Err(HandshakeError::MissingFlags {
            peer: peer.name.clone(),
            missing,
        });
    }
    Ok(())
}

/// Client role: we dialled `expected_peer`. Completes the handshake or says why not.
pub async fn client(
    stream: &mut DistStream,
    me: &LocalIdentity,
    expected_peer: &str,
) -> Result<PeerInfo, HandshakeError> {
    write_message(stream, &new_style_name(me, None)).await?;

    let status = read_message(stream).await?;
    if status[0] != b's' {
        return Err(HandshakeError::UnexpectedMessage {
            tag: status[0],
            expected: "status",
        });
    }
    match &status[1..] {
        b"ok" | b"ok_simultaneous" => {}
        // The peer believes an older connection to us is still up; we have none (or we would
        // have reused it), so tell it to drop the old one and carry on.
        b"alive" => write_message(stream, b"strue").await?,
        other => {
            return Err(HandshakeError::Refused(
                String::from_utf8_lossy(other).into_owned(),
            ))
        }
    }

    let challenge_msg = read_message(stream).await?;
    let (peer, peer_challenge) = parse_new_style_name(&challenge_msg, true)?;
    if peer.name != expected_peer {
        return Err(HandshakeError::WrongName {
            got: peer.name,
            expected: expected_peer.to_string(),
        });
    }
    check_mandatory(&peer)?;

    let my_challenge: u32 = rand::random();
    let mut reply = vec![b'r'];
    reply.extend_from_slice(&my_challenge.to_be_bytes());
    reply.extend_from_slice(&digest(&me.cookie, peer_challenge));
    write_message(stream, &reply).await?;

    // A peer with another cookie closes the connection here instead of acknowledging.
    let ack = match read_message(stream).await {
        Ok(ack) => ack,
        Err(HandshakeError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(HandshakeError::WrongCookie { peer: peer.name });
        }
        Err(e) => return Err(e),
    };
    if ack.len() != 17 || ack[0] != b'a' {
        return Err(HandshakeError::UnexpectedMessage {
            tag: ack[0],
            expected: "challenge ack",
        });
    }
    if ack[1..] != digest(&me.cookie, my_challenge) {
        return Err(HandshakeError::WrongCookie { peer: peer.name });
    }
    Ok(peer)
}

/// Server role, first half: reads the client's name so the caller can pick a [`Status`] against
/// its connection table.
pub async fn server_recv_name(stream: &mut DistStream) -> Result<PeerInfo, HandshakeError> {
    let body = read_message(stream).await?;
    if body[0] != b'N' {
        // 'n' (version 5) is only sent by nodes older than OTP 23, which OTP 25 cannot talk to either.
        return Err(HandshakeError::UnexpectedMessage {
            tag: body[0],
            expected: "send_name (N)",
        });
    }
    let (peer, _) = parse_new_style_name(&body, false)?;
    check_mandatory(&peer)?;
    Ok(peer)
}

/// Server role, second half: sends `status` and, if it lets the handshake go on, the challenge,
/// then checks the client's digest. For `Alive` it returns `Ok(false)` when the client chose to
/// give up (`sfalse`).
pub async fn server_finish(
    stream: &mut DistStream,
    me: &LocalIdentity,
    peer: &PeerInfo,
    status: Status,
) -> Result<bool, HandshakeError> {
    let mut msg = vec![b's'];
    msg.extend_from_slice(status.text());
    write_message(stream, &msg).await?;
    match status {
        Status::Ok | Status::OkSimultaneous => {}
        Status::Alive => {
            let answer = read_message(stream).await?;
            match &answer[..] {
                b"strue" => {}
                b"sfalse" => return Ok(false),
                _ => return Err(HandshakeError::Malformed("answer to alive")),
            }
        }
        Status::Nok | Status::NotAllowed => return Ok(false),
    }

    let my_challenge: u32 = rand::random();
    write_message(stream, &new_style_name(me, Some(my_challenge))).await?;

    let reply = read_message(stream).await?;
    if reply.len() != 21 || reply[0] != b'r' {
        return Err(HandshakeError::UnexpectedMessage {
            tag: reply[0],
            expected: "challenge reply",
        });
    }
    let peer_challenge = u32::from_be_bytes(reply[1..5].try_into().expect("4 bytes"));
    if reply[5..] != digest(&me.cookie, my_challenge) {
        return Err(HandshakeError::WrongCookie {
            peer: peer.name.clone(),
        });
    }
    let mut ack = vec![b'a'];
    ack.extend_from_slice(&digest(&me.cookie, peer_challenge));
    write_message(stream, &ack).await?;
    Ok(true)
}
