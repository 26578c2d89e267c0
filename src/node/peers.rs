//! The connection table: at most one connection per peer node, whoever dialled.
//!
//! Each peer node has one [`Peer`] slot. Its outgoing queue exists from the moment the slot does,
//! so senders never wait: messages queue while we dial (or while an inbound handshake completes)
//! and flow once a connection takes the queue's receiving end. Exactly one connection can take it,
//! which is what keeps simultaneous connects from producing two connections:
//! - we dial and they dial at once: the server side answers `ok_simultaneous` (their name is
//!   greater: their connection takes our slot, our dial then gets `nok`) or `nok` (ours wins);
//! - they connect while we hold an established connection: we answer `alive`; if they insist
//!   (`strue`), the old connection is closed first.
//!
//! With TLS distribution, both directions speak TLS from the first byte: a dialled connection's
//! TLS handshake comes before the distribution handshake, inside the same setup time, and so does
//! an accepted one's. A peer that fails it is refused with one log line naming its address.

use super::connection;
use super::control::ControlMessage;
use super::epmd;
use super::handshake::{self, HandshakeError, PeerInfo, Status};
use super::outbox::{Outbox, Outgoing};
use super::stream::DistStream;
use super::Node;
use eetf::{Pid, Term};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Bound on a whole handshake, as OTP's `net_setuptime` (7 s).
pub const SETUP_TIME: Duration = Duration::from_secs(7);

pub struct Peer {
    pub name: String,
    outbox: Outbox,
    queue_rx: Mutex<Option<mpsc::UnboundedReceiver<Outgoing>>>,
    /// True while our own outgoing handshake to this peer runs.
    dialing: AtomicBool,
    up: AtomicBool,
    cancel: CancellationToken,
    finished: CancellationToken,
}

impl Peer {
    fn new(name: &str, dialing: bool) -> Arc<Peer> {
        let (tx, rx) = mpsc::unbounded_channel();
        Arc::new(Peer {
            name: name.to_string(),
            outbox: Outbox::new(tx),
            queue_rx: Mutex::new(Some(rx)),
            dialing: AtomicBool::new(dialing),
            up: AtomicBool::new(false),
            cancel: CancellationToken::new(),
            finished: CancellationToken::new(),
        })
    }

    pub fn enqueue(&self, from: &Pid, control: ControlMessage, payload: Option<Term>) {
        self.outbox.send(from, control, payload);
    }

    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    pub fn close(&self) {
        self.cancel.cancel();
    }

    /// Resolves once the slot's connection (or connection attempt) is over.
    pub async fn closed(&self) {
        self.finished.cancelled().await;
    }

    fn take_queue(&self) -> Option<mpsc::UnboundedReceiver<Outgoing>> {
        self.queue_rx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    fn queue_taken(&self) -> bool {
        self.queue_rx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }
}

/// The slot for `name`, dialling it if no connection exists or is under way.
pub fn peer_for(node: &Node, name: &str) -> Arc<Peer> {
    let mut peers = node.peers();
    if let Some(peer) = peers.get(name) {
        return peer.clone();
    }
    let peer = Peer::new(name, true);
    if node.shutdown_token().is_cancelled() {
        return peer; // never connected: whatever is queued is dropped
    }
    peers.insert(name.to_string(), peer.clone());
    drop(peers);
    node.runtime().spawn(dial(node.clone(), peer.clone()));
    peer
}

async fn dial(node: Node, peer: Arc<Peer>) {
    let attempt = async {
        let addr = epmd::lookup(&peer.name).await.map_err(|e| e.to_string())?;
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        tcp.set_nodelay(true).ok();
        let mut stream = match node.tls() {
            None => DistStream::Tcp(tcp),
            Some(tls) => {
                let host = peer.name.split_once('@').map_or("", |(_, host)| host);
                tls.connect(tcp, host)
                    .await
                    .map_err(|e| format!("{addr}: {e}"))?
            }
        };
        let info = handshake::client(&mut stream, node.identity(), &peer.name)
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>((stream, info))
    };
    let result = tokio::select! {
        r = tokio::time::timeout(SETUP_TIME, attempt) => r.unwrap_or_else(|_| Err("handshake timed out".into())),
        _ = peer.cancel.cancelled() => Err("node shutting down".into()),
    };
    peer.dialing.store(false, Ordering::Release);
    match result {
        Ok((stream, info)) => attach(node, peer, stream, info).await,
        // An inbound connection from the same node took over the slot (simultaneous connect).
        Err(_) if peer.queue_taken() => {}
        Err(reason) => {
            tracing::warn!(peer = %peer.name, "cannot connect: {reason}");
            release(&node, &peer);
        }
    }
}

/// Runs an established connection in `peer`'s slot until it ends, then cleans up.
async fn attach(node: Node, peer: Arc<Peer>, stream: DistStream, info: PeerInfo) {
    let Some(queue) = peer.take_queue() else {
        return; // another connection to this node won; dropping the stream closes ours
    };
    peer.up.store(true, Ordering::Release);
    tracing::info!(peer = %info.name, "nodeup");
    let reason = connection::run(
        &node,
        &peer.name,
        stream,
        &info,
        queue,
        &peer.outbox,
        peer.cancel.clone(),
    )
    .await;
    peer.up.store(false, Ordering::Release);
    tracing::info!(peer = %info.name, "nodedown: {reason}");
    release(&node, &peer);
}

/// Removes `peer` from the table (if it is still the slot there) and purges what went through it.
fn release(node: &Node, peer: &Arc<Peer>) {
    let mut peers = node.peers();
    let current = peers.get(&peer.name).is_some_and(|p| Arc::ptr_eq(p, peer));
    if current {
        peers.remove(&peer.name);
    }
    drop(peers);
    if current {
        node.node_down(&peer.name);
    }
    peer.finished.cancel();
}

pub async fn accept_loop(node: Node, listener: TcpListener) {
    let shutdown = node.shutdown_token();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, addr)) => {
                    tokio::spawn(accept(node.clone(), stream, addr));
                }
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
}

async fn accept(node: Node, tcp: TcpStream, addr: std::net::SocketAddr) {
    tcp.set_nodelay(true).ok();
    let receive_name = async {
        let mut stream = match node.tls() {
            Some(tls) => tls.accept(tcp).await?,
            None => {
                refuse_tls_on_plain(&tcp).await?;
                DistStream::Tcp(tcp)
            }
        };
        let info = handshake::server_recv_name(&mut stream)
            .await
            .map_err(|e| format!("handshake aborted: {e}"))?;
        Ok::<_, String>((stream, info))
    };
    let (mut stream, info) = match tokio::time::timeout(SETUP_TIME, receive_name).await {
        Ok(Ok(accepted)) => accepted,
        Ok(Err(e)) => return tracing::warn!(%addr, "connection refused: {e}"),
        Err(_) => return tracing::warn!(%addr, "handshake timed out"),
    };
    if info.name == node.name() {
        return tracing::warn!(%addr, "peer claims our own name {}", info.name);
    }

    let (status, slot) = {
        let mut peers = node.peers();
        match peers.get(&info.name).cloned() {
            None => {
                let peer = Peer::new(&info.name, false);
                peers.insert(info.name.clone(), peer.clone());
                (Status::Ok, Some(peer))
            }
            Some(existing) if existing.is_up() => (Status::Alive, Some(existing)),
            Some(existing)
                if existing.dialing.load(Ordering::Acquire) && !existing.queue_taken() =>
            {
                if info.name.as_bytes() > node.name().as_bytes() {
                    (Status::OkSimultaneous, Some(existing))
                } else {
                    (Status::Nok, None)
                }
            }
            Some(_) => (Status::Nok, None),
        }
    };

    let finished = tokio::time::timeout(
        SETUP_TIME,
        handshake::server_finish(&mut stream, node.identity(), &info, status),
    )
    .await;
    let proceed = match finished {
        Ok(Ok(proceed)) => proceed,
        Ok(Err(HandshakeError::WrongCookie { peer })) => {
            tracing::warn!(%addr, "connection attempt from node {peer} rejected: wrong cookie");
            false
        }
        Ok(Err(e)) => {
            tracing::warn!(peer = %info.name, %addr, "handshake failed: {e}");
            false
        }
        Err(_) => {
            tracing::warn!(peer = %info.name, %addr, "handshake timed out");
            false
        }
    };

    match (status, slot) {
        (Status::Ok | Status::OkSimultaneous, Some(peer)) if proceed => {
            attach(node, peer, stream, info).await
        }
        (Status::Ok, Some(peer)) => release(&node, &peer),
        (Status::Alive, Some(old)) if proceed => {
            // The peer restarted or lost the old connection before we noticed: replace it.
            old.close();
            old.closed().await;
            let peer = peer_slot_for_inbound(&node, &info.name);
            attach(node, peer, stream, info).await
        }
        _ => {}
    }
}

/// On a plain-TCP node, a peer whose first byte opens a TLS handshake record is told apart from
/// a broken one (without this it would wait out the setup time on a length it misread).
async fn refuse_tls_on_plain(tcp: &TcpStream) -> Result<(), String> {
    const TLS_HANDSHAKE_RECORD: u8 = 0x16;
    let mut first = [0u8; 1];
    match tcp.peek(&mut first).await {
        Ok(1) if first[0] == TLS_HANDSHAKE_RECORD => Err(
            "the peer speaks TLS (inet_tls) and this node plain TCP (start it with --proto-dist \
             inet_tls)"
                .to_string(),
        ),
        _ => Ok(()),
    }
}

fn peer_slot_for_inbound(node: &Node, name: &str) -> Arc<Peer> {
    let mut peers = node.peers();
    let peer = Peer::new(name, false);
    peers.insert(name.to_string(), peer.clone());
    peer
}
