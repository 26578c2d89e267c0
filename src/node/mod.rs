//! The hidden node: joins an Erlang cluster over the distribution protocol.
//!
//! [`Node::start`] registers with EPMD, listens for peers and hands out [`Process`]es. Everything
//! else in the program (the `:xla` server, callback waiters) is a process of this node and talks to
//! the cluster only through [`Process`] / [`Node`] methods: send, monitor, register.
//!
//! Files: `epmd` (registration, lookup), `handshake` (v6 handshake), `peers` (the one-connection-
//! per-node table, dialling and accepting), `stream` (plain TCP or TLS), `tls` (TLS distribution
//! settings from OTP's option file, read by `consult`), `connection` (framing, batching writer,
//! ticks, the message size limit), `frame` (frame formats, fragments), `message` (decoded
//! messages, decoding errors), `control` (control messages), `signals` (what incoming control
//! messages do to local processes), `native_record` (OTP 29 native records, decoded as tuples),
//! `process_table` (live processes, registered names, monitors and links), `process` (the handle a
//! process's code holds), `busy_wait` (a CPU kept awake after traffic), `probe` (a callback's
//! steps, timed on request), `traffic` (bytes and messages each way), `term`, `flags`, `cookie`,
//! `gen` (gen_server call and reply conventions).

pub mod busy_wait;
pub mod connection;
pub mod consult;
pub mod control;
pub mod cookie;
pub mod epmd;
pub mod flags;
pub mod frame;
pub mod gen;
pub mod handshake;
pub mod message;
pub mod native_record;
pub mod outbox;
pub mod peers;
pub mod probe;
pub mod process;
pub mod process_table;
pub mod reassembly;
pub mod signals;
pub mod stream;
pub mod term;
pub mod tls;
pub mod traffic;

use control::ControlMessage;
use eetf::{Atom, Pid, Reference, Term};
use handshake::LocalIdentity;
pub use process::{Dest, Process, Signal};
use process_table::{Local, ProcessTable};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// How the node presents itself and where it listens.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Full node name, `alive@host`.
    pub name: String,
    pub cookie: String,
    /// Address to listen on for peers (`inet_dist_use_interface`).
    pub listen_address: IpAddr,
    /// Port range to listen on (`inet_dist_listen_min` / `_max`); 0..=0 picks any free port.
    pub port_min: u16,
    pub port_max: u16,
    /// `net_ticktime`: a peer silent for this long is considered down.
    pub net_ticktime: Duration,
    /// How long a CPU stays busy after each message received or sent (see [`busy_wait`]);
    /// zero: never.
    pub busy_wait: Duration,
    /// TLS distribution (`inet_tls`) for every connection, accepted and dialled; `None`: plain
    /// TCP (`inet_tcp`).
    pub tls: Option<Arc<tls::TlsDist>>,
    /// Largest message a peer may send (fragments added up); a peer sending more is disconnected.
    pub max_message_bytes: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Epmd(#[from] epmd::EpmdError),
    #[error("cannot listen on {address} ports {min}..={max}: {source}")]
    Listen {
        address: IpAddr,
        min: u16,
        max: u16,
        source: std::io::Error,
    },
    #[error("cannot start the busy-wait thread: {0}")]
    BusyWait(std::io::Error),
    #[error("node name {0:?} must look like name@host")]
    BadName(String),
    #[error("epmd refused to register {0} (is a node with that name already running?)")]
    NameTaken(String),
}

/// A cloneable handle to the running node.
#[derive(Clone)]
pub struct Node {
    inner: Arc<NodeInner>,
}

pub(crate) struct NodeInner {
    name: Atom,
    identity: LocalIdentity,
    net_ticktime: Duration,
    started: Instant,
    runtime: tokio::runtime::Handle,
    next_pid: AtomicU64,
    next_ref: AtomicU64,
    next_sequence: AtomicU64,
    processes: Mutex<ProcessTable>,
    /// One slot per peer node: its connection, or the dialling of one.
    peers: Mutex<HashMap<String, Arc<peers::Peer>>>,
    shutdown: CancellationToken,
    registration: Mutex<Option<epmd::Registration>>,
    listener: Mutex<Option<TcpListener>>,
    busy_wait: busy_wait::BusyWait,
    tls: Option<Arc<tls::TlsDist>>,
    max_message_bytes: usize,
}

impl Node {
    /// Registers with EPMD (starting it if needed), listens for peers and starts accepting.
    /// Must be called inside a tokio runtime.
    pub async fn start(config: NodeConfig) -> Result<Node, StartError> {
        let node = Node::bind(config).await?;
        node.start_accepting();
        Ok(node)
    }

    /// Like [`Node::start`] but does not accept connections yet, so that processes peers will
    /// call (such as `:xla`) can be registered first; call [`Node::start_accepting`] then.
    /// Peers that connect in between wait in the listen backlog.
    pub async fn bind(config: NodeConfig) -> Result<Node, StartError> {
        let Some((alive, _host)) = config.name.split_once('@') else {
            return Err(StartError::BadName(config.name.clone()));
        };
        epmd::ensure_running().await?;
        let listener = bind(&config).await?;
        let listen_addr = listener
            .local_addr()
            .expect("bound listener has an address");
        let registration =
            epmd::register(alive, listen_addr.port())
                .await
                .map_err(|e| match e {
                    epmd::EpmdError::Protocol(_) => StartError::NameTaken(config.name.clone()),
                    other => StartError::Epmd(other),
                })?;
        let busy_wait =
            busy_wait::BusyWait::start(config.busy_wait).map_err(StartError::BusyWait)?;
        let identity = LocalIdentity {
            name: config.name.clone(),
            flags: flags::ADVERTISED,
            creation: registration.creation,
            cookie: config.cookie.clone(),
        };
        let node = Node {
            inner: Arc::new(NodeInner {
                name: Atom::from(config.name.as_str()),
                identity,
                net_ticktime: config.net_ticktime,
                started: Instant::now(),
                runtime: tokio::runtime::Handle::current(),
                next_pid: AtomicU64::new(1),
                next_ref: AtomicU64::new(1),
                next_sequence: AtomicU64::new(1),
                processes: Mutex::new(ProcessTable::new(registration.creation)),
                peers: Mutex::new(HashMap::new()),
                shutdown: CancellationToken::new(),
                registration: Mutex::new(Some(registration)),
                listener: Mutex::new(None),
                busy_wait,
                tls: config.tls.clone(),
                max_message_bytes: config.max_message_bytes,
            }),
        };
        *node
            .inner
            .listener
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(listener);
        tracing::info!(node = %config.name, port = listen_addr.port(), creation = node.creation(), "node up (hidden)");
        Ok(node)
    }

    /// Starts accepting peers' connections (once; later calls do nothing).
    pub fn start_accepting(&self) {
        if let Some(listener) = self
            .inner
            .listener
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            tokio::spawn(peers::accept_loop(self.clone(), listener));
        }
    }

    pub fn name(&self) -> &str {
        &self.inner.name.name
    }

    pub fn creation(&self) -> u32 {
        self.inner.identity.creation
    }

    pub fn uptime(&self) -> Duration {
        self.inner.started.elapsed()
    }

    pub fn runtime(&self) -> &tokio::runtime::Handle {
        &self.inner.runtime
    }

    /// Cancelled when the node shuts down.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.inner.shutdown.clone()
    }

    pub(crate) fn identity(&self) -> &LocalIdentity {
        &self.inner.identity
    }

    pub(crate) fn net_ticktime(&self) -> Duration {
        self.inner.net_ticktime
    }

    pub(crate) fn tls(&self) -> Option<&tls::TlsDist> {
        self.inner.tls.as_deref()
    }

    pub fn max_message_bytes(&self) -> usize {
        self.inner.max_message_bytes
    }

    pub(crate) fn next_sequence(&self) -> u64 {
        self.inner.next_sequence.fetch_add(1, Ordering::Relaxed)
    }

    /// The peer table (see [`peers`]).
    pub(crate) fn peers(&self) -> MutexGuard<'_, HashMap<String, Arc<peers::Peer>>> {
        // A panic while holding the lock must not take the whole node down with poisoning.
        self.inner.peers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Names of the nodes with an established connection.
    pub fn connected_nodes(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .peers()
            .values()
            .filter(|p| p.is_up())
            .map(|p| p.name.clone())
            .collect();
        names.sort();
        names
    }

    pub fn make_ref(&self) -> Reference {
        let n = self.inner.next_ref.fetch_add(1, Ordering::Relaxed);
        Reference {
            node: self.inner.name.clone(),
            id: vec![(n & 0x3ffff) as u32, (n >> 18) as u32, rand::random()],
            creation: self.creation(),
        }
    }

    fn is_local(&self, pid: &Pid) -> bool {
        pid.node == self.inner.name
    }

    /// Sends `message` from `from` to `to`. Never blocks: remote messages are queued on the peer's
    /// connection (which is dialled if needed), local ones go straight into the mailbox. Like
    /// Erlang's `send`, a message to a dead process or an unreachable node is dropped silently.
    pub fn send(&self, from: &Pid, to: Dest, message: Term) {
        match to {
            Dest::Pid(pid) if self.is_local(&pid) => {
                self.deliver(Local::Pid(&pid), Signal::Message(message))
            }
            Dest::Pid(pid) => {
                let node = pid.node.name.clone();
                self.send_control(from, &node, ControlMessage::Send { to: pid }, Some(message));
            }
            Dest::Name(name) => self.deliver(Local::Name(&name), Signal::Message(message)),
            Dest::Remote { name, node } if node == self.name() => {
                self.deliver(Local::Name(&name), Signal::Message(message))
            }
            Dest::Remote { name, node } => self.send_control(
                from,
                &node,
                ControlMessage::RegSend {
                    from: from.clone(),
                    to_name: Atom::from(name),
                },
                Some(message),
            ),
        }
    }

    /// Sends to an alias (the reply path of OTP 24+ `gen:call`): as ALTACT_SIG_SEND to peers
    /// that advertise it (OTP 28+), else as ALIAS_SEND; the connection picks the form.
    pub fn send_alias(&self, from: &Pid, alias: &Reference, message: Term) {
        if alias.node == self.inner.name {
            return; // this node never hands out aliases
        }
        let node = alias.node.name.clone();
        self.send_control(
            from,
            &node,
            ControlMessage::AliasSend {
                from: from.clone(),
                alias: alias.clone(),
            },
            Some(message),
        );
    }

    /// Queues a control message to `node`; `from` is the local process it comes from (messages
    /// of one sender stay in order).
    pub(crate) fn send_control(
        &self,
        from: &Pid,
        node: &str,
        control: ControlMessage,
        payload: Option<Term>,
    ) {
        peers::peer_for(self, node).enqueue(from, control, payload);
        self.inner.busy_wait.arm();
    }

    /// A message came in from a peer: a CPU kept awake stays so for what follows, without a
    /// wake-up of its own (see [`busy_wait`]).
    pub(crate) fn traffic(&self) {
        self.inner.busy_wait.extend();
    }

    /// Keeps the busy-waiting thread from spinning until the hold is dropped: while XLA's
    /// threads compute a program (see [`busy_wait`]).
    pub fn hold_busy_wait(&self) -> busy_wait::BusyHold {
        self.inner.busy_wait.hold()
    }

    /// Whether someone holds the busy wait now ([`Node::hold_busy_wait`]).
    pub fn busy_wait_held(&self) -> bool {
        self.inner.busy_wait.is_held()
    }

    /// How long a CPU is kept busy after each message (`--busy-wait-us`; zero: never).
    pub fn busy_window(&self) -> Duration {
        self.inner.busy_wait.window()
    }

    /// Threads of this process keeping a CPU busy now; others that would spin claim a place
    /// here (see [`busy_wait`]).
    pub fn busy_threads(&self) -> &Arc<AtomicUsize> {
        self.inner.busy_wait.busy_threads()
    }

    /// Unregisters from EPMD and closes every connection (peers see nodedown at once).
    pub async fn shutdown(&self) {
        self.inner
            .registration
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        self.inner.shutdown.cancel();
        let peers: Vec<Arc<peers::Peer>> = self.peers().drain().map(|(_, p)| p).collect();
        for peer in &peers {
            peer.close();
        }
        for peer in peers {
            peer.closed().await;
        }
    }
}

async fn bind(config: &NodeConfig) -> Result<TcpListener, StartError> {
    let mut last_err = None;
    for port in config.port_min..=config.port_max.max(config.port_min) {
        match TcpListener::bind((config.listen_address, port)).await {
            Ok(l) => return Ok(l),
            Err(e) => last_err = Some(e),
        }
    }
    Err(StartError::Listen {
        address: config.listen_address,
        min: config.port_min,
        max: config.port_max,
        source: last_err.unwrap_or_else(|| std::io::Error::other("empty port range")),
    })
}
