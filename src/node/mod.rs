//! The hidden node: joins an Erlang cluster over the distribution protocol.
//!
//! [`Node::start`] registers with EPMD, listens for peers and hands out [`Process`]es. Everything
//! else in the program (the `:xla` server, callback waiters) is a process of this node and talks to
//! the cluster only through [`Process`] / [`Node`] methods: send, monitor, make_ref, register.
//!
//! Files: `epmd` (registration, lookup), `handshake` (v6 handshake), `peers` (the one-connection-
//! per-node table, dialling and accepting), `connection` (framing, batching writer, ticks),
//! `frame` (frame formats, fragments), `message` (decoded messages, decoding errors), `control`
//! (control messages), `signals` (what incoming control messages do to local processes),
//! `busy_wait` (a CPU kept awake after traffic), `probe` (a callback's steps, timed on request),
//! `process`, `term`, `flags`, `cookie`, `gen` (gen_server call and reply conventions).

pub mod busy_wait;
pub mod connection;
pub mod control;
pub mod cookie;
pub mod epmd;
pub mod flags;
pub mod frame;
pub mod gen;
pub mod handshake;
pub mod message;
pub mod outbox;
pub mod peers;
pub mod probe;
pub mod process;
pub mod reassembly;
pub mod signals;
pub mod term;

use control::{ControlMessage, ProcRef};
use eetf::{Atom, Pid, Reference, Term};
use handshake::LocalIdentity;
pub use process::{Dest, Process, Signal};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use term::{atom, ref_key};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
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
    state: Mutex<State>,
    shutdown: CancellationToken,
    listen_addr: SocketAddr,
    registration: Mutex<Option<epmd::Registration>>,
    listener: Mutex<Option<TcpListener>>,
    busy_wait: busy_wait::BusyWait,
}

#[derive(Default)]
pub(crate) struct State {
    processes: HashMap<u32, process::Entry>,
    names: HashMap<String, Pid>,
    peers: HashMap<String, Arc<peers::Peer>>,
    /// Monitors our processes hold on remote processes, by reference.
    remote_monitors: HashMap<RefKey, RemoteMonitor>,
}

type RefKey = (String, Vec<u32>, u32);

struct RemoteMonitor {
    owner: Pid,
    target: Dest,
    reference: Reference,
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
                state: Mutex::new(State::default()),
                shutdown: CancellationToken::new(),
                listen_addr,
                registration: Mutex::new(Some(registration)),
                listener: Mutex::new(None),
                busy_wait,
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

    pub fn listen_addr(&self) -> SocketAddr {
        self.inner.listen_addr
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

    pub(crate) fn next_sequence(&self) -> u64 {
        self.inner.next_sequence.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock must not take the whole node down with poisoning.
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Names of the nodes with an established connection.
    pub fn connected_nodes(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .state()
            .peers
            .values()
            .filter(|p| p.is_up())
            .map(|p| p.name.clone())
            .collect();
        names.sort();
        names
    }

    /// Number of live local processes.
    pub fn process_count(&self) -> usize {
        self.state().processes.len()
    }

    /// Creates a new process with an empty mailbox.
    pub fn spawn_process(&self) -> Process {
        let n = self.inner.next_pid.fetch_add(1, Ordering::Relaxed);
        // Pid numbers are 15 bits on the wire for old nodes; the rest goes into the serial.
        let pid = Pid::new(
            self.name(),
            (n & 0x7fff) as u32,
            ((n >> 15) & 0x1fff) as u32,
            self.creation(),
        );
        let (tx, rx) = mpsc::unbounded_channel();
        self.state().processes.insert(
            pid.id | (pid.serial << 15),
            process::Entry {
                pid: pid.clone(),
                mailbox: tx,
                name: None,
                watchers: Vec::new(),
                links: Vec::new(),
            },
        );
        Process::new(self.clone(), pid, rx)
    }

    /// Creates a process and registers it under `name`. Panics if the name is taken (a
    /// programming error: the node registers its own fixed names once).
    pub fn spawn_registered(&self, name: &str) -> Process {
        let p = self.spawn_process();
        assert!(p.register(name), "name {name} registered twice");
        p
    }

    pub fn make_ref(&self) -> Reference {
        let n = self.inner.next_ref.fetch_add(1, Ordering::Relaxed);
        Reference {
            node: self.inner.name.clone(),
            id: vec![(n & 0x3ffff) as u32, (n >> 18) as u32, rand::random()],
            creation: self.creation(),
        }
    }

    pub(crate) fn register(&self, name: &str, pid: &Pid) -> bool {
        let mut state = self.state();
        if state.names.contains_key(name) {
            return false;
        }
        let Some(entry) = state.processes.get_mut(&local_key(pid)) else {
            return false;
        };
        entry.name = Some(name.to_string());
        state.names.insert(name.to_string(), pid.clone());
        true
    }

    /// The local pid registered under `name`.
    pub fn whereis(&self, name: &str) -> Option<Pid> {
        self.state().names.get(name).cloned()
    }

    fn is_local(&self, pid: &Pid) -> bool {
        pid.node == self.inner.name
    }

    /// Sends `message` from `from` to `to`. Never blocks: remote messages are queued on the peer's
    /// connection (which is dialled if needed), local ones go straight into the mailbox. Like
    /// Erlang's `send`, a message to a dead process or an unreachable node is dropped silently.
    pub fn send(&self, from: &Pid, to: Dest, message: Term) {
        match to {
            Dest::Pid(pid) if self.is_local(&pid) => self.deliver(&pid, Signal::Message(message)),
            Dest::Pid(pid) => {
                let node = pid.node.name.clone();
                self.send_control(from, &node, ControlMessage::Send { to: pid }, Some(message));
            }
            Dest::Name(name) => self.deliver_to_name(&name, message),
            Dest::Remote { name, node } if node == self.name() => {
                self.deliver_to_name(&name, message)
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

    /// Sends to an alias (the reply path of OTP 24+ `gen:call`).
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

    /// A message came in from a peer: keep a CPU awake for what follows (see [`busy_wait`]).
    pub(crate) fn traffic(&self) {
        self.inner.busy_wait.arm();
    }

    /// Threads of this process keeping a CPU busy now; others that would spin claim a place
    /// here (see [`busy_wait`]).
    pub fn busy_threads(&self) -> &Arc<AtomicUsize> {
        self.inner.busy_wait.busy_threads()
    }

    pub(crate) fn deliver(&self, pid: &Pid, signal: Signal) {
        if pid.creation != self.creation() {
            return; // a pid from an earlier run of this node name
        }
        if let Some(entry) = self.state().processes.get(&local_key(pid)) {
            // Before the send: once the message is in, its receiver may stop waiting for it.
            probe::delivered(pid);
            let _ = entry.mailbox.send(signal);
        }
    }

    fn deliver_to_name(&self, name: &str, message: Term) {
        let state = self.state();
        if let Some(entry) = state
            .names
            .get(name)
            .and_then(|pid| state.processes.get(&local_key(pid)))
        {
            let _ = entry.mailbox.send(Signal::Message(message));
        }
    }

    /// Resolves a local pid or registered name to a live process key.
    pub(crate) fn resolve_local(state: &State, creation: u32, target: &ProcRef) -> Option<u32> {
        let key = match target {
            ProcRef::Pid(pid) if pid.creation == creation => local_key(pid),
            ProcRef::Pid(_) => return None,
            ProcRef::Name(name) => local_key(state.names.get(&name.name)?),
        };
        state.processes.contains_key(&key).then_some(key)
    }

    pub(crate) fn monitor(&self, owner: &Pid, target: Dest) -> Reference {
        let reference = self.make_ref();
        let node = target.node(self.name()).to_string();
        if node == self.name() {
            let target_ref = target.proc_ref();
            let mut state = self.state();
            let object = target.to_term(self.name());
            match Self::resolve_local(&state, self.creation(), &target_ref) {
                Some(key) => state
                    .processes
                    .get_mut(&key)
                    .expect("resolved")
                    .watchers
                    .push(process::Watcher {
                        reference: reference.clone(),
                        pid: owner.clone(),
                        object,
                    }),
                None => {
                    drop(state);
                    self.deliver(
                        owner,
                        Signal::Down {
                            reference: reference.clone(),
                            object,
                            reason: atom("noproc"),
                        },
                    );
                }
            }
            return reference;
        }
        let to = target.proc_ref();
        self.state().remote_monitors.insert(
            ref_key(&reference),
            RemoteMonitor {
                owner: owner.clone(),
                target,
                reference: reference.clone(),
            },
        );
        self.send_control(
            owner,
            &node,
            ControlMessage::MonitorP {
                from: owner.clone(),
                to,
                reference: reference.clone(),
            },
            None,
        );
        reference
    }

    pub(crate) fn demonitor(&self, owner: &Pid, reference: &Reference) {
        let mut state = self.state();
        if let Some(m) = state.remote_monitors.remove(&ref_key(reference)) {
            drop(state);
            let node = m.target.node(self.name()).to_string();
            let to = m.target.proc_ref();
            self.send_control(
                owner,
                &node,
                ControlMessage::DemonitorP {
                    from: owner.clone(),
                    to,
                    reference: reference.clone(),
                },
                None,
            );
            return;
        }
        for entry in state.processes.values_mut() {
            entry.watchers.retain(|w| &w.reference != reference);
        }
    }

    /// Fires a remote monitor held by one of our processes (MONITOR_P_EXIT or connection loss).
    pub(crate) fn fire_remote_monitor(&self, reference: &Reference, reason: Term) {
        let Some(m) = self.state().remote_monitors.remove(&ref_key(reference)) else {
            return;
        };
        let object = m.target.to_term(self.name());
        self.deliver(
            &m.owner,
            Signal::Down {
                reference: reference.clone(),
                object,
                reason,
            },
        );
    }

    /// Removes a local process and fires its monitors and links with `reason`.
    pub(crate) fn terminate(&self, pid: &Pid, reason: Term) {
        let mut state = self.state();
        let Some(entry) = state.processes.remove(&local_key(pid)) else {
            return;
        };
        if let Some(name) = &entry.name {
            state.names.remove(name);
        }
        // Monitors this process held: remote ones are cancelled at the peer, local ones dropped.
        let held: Vec<RemoteMonitor> = state
            .remote_monitors
            .extract_if(|_, m| &m.owner == pid)
            .map(|(_, m)| m)
            .collect();
        for other in state.processes.values_mut() {
            other.watchers.retain(|w| &w.pid != pid);
            other.links.retain(|l| l != pid);
        }
        drop(state);

        for RemoteMonitor {
            target, reference, ..
        } in held
        {
            let node = target.node(self.name()).to_string();
            let to = target.proc_ref();
            self.send_control(
                pid,
                &node,
                ControlMessage::DemonitorP {
                    from: pid.clone(),
                    to,
                    reference,
                },
                None,
            );
        }
        for w in entry.watchers {
            if self.is_local(&w.pid) {
                self.deliver(
                    &w.pid,
                    Signal::Down {
                        reference: w.reference,
                        object: w.object,
                        reason: reason.clone(),
                    },
                );
            } else {
                let from = match &w.object {
                    Term::Pid(p) => ProcRef::Pid(p.clone()),
                    // A monitor by name is answered with the name (the caller sees `{name, node}`).
                    Term::Tuple(t) => match &t.elements[0] {
                        Term::Atom(a) => ProcRef::Name(a.clone()),
                        _ => ProcRef::Pid(pid.clone()),
                    },
                    _ => ProcRef::Pid(pid.clone()),
                };
                let node = w.pid.node.name.clone();
                self.send_control(
                    pid,
                    &node,
                    ControlMessage::MonitorPExit {
                        from,
                        to: w.pid,
                        reference: w.reference,
                        reason: Some(reason.clone()),
                    },
                    None,
                );
            }
        }
        for linked in entry.links {
            if self.is_local(&linked) {
                self.deliver(
                    &linked,
                    Signal::Exit {
                        from: pid.clone(),
                        reason: reason.clone(),
                        linked: true,
                    },
                );
            } else {
                let node = linked.node.name.clone();
                self.send_control(
                    pid,
                    &node,
                    ControlMessage::Exit {
                        from: pid.clone(),
                        to: linked,
                        reason: Some(reason.clone()),
                    },
                    None,
                );
            }
        }
    }

    /// Connection to `node` is gone: purge monitors and links that went through it and tell our
    /// processes, as the BEAM does on nodedown.
    pub(crate) fn node_down(&self, node: &str) {
        let mut state = self.state();
        let mut exits = Vec::new();
        for entry in state.processes.values_mut() {
            entry.watchers.retain(|w| w.pid.node.name != node);
            entry.links.retain(|l| {
                let gone = l.node.name == node;
                if gone {
                    exits.push((entry.pid.clone(), l.clone()));
                }
                !gone
            });
        }
        let fired: Vec<Reference> = state
            .remote_monitors
            .values()
            .filter(|m| m.target.node(&self.inner.name.name) == node)
            .map(|m| m.reference.clone())
            .collect();
        drop(state);
        for (local, remote) in exits {
            self.deliver(
                &local,
                Signal::Exit {
                    from: remote,
                    reason: atom("noconnection"),
                    linked: true,
                },
            );
        }
        for reference in fired {
            self.fire_remote_monitor(&reference, atom("noconnection"));
        }
    }

    /// Unregisters from EPMD and closes every connection (peers see nodedown at once).
    pub async fn shutdown(&self) {
        self.inner
            .registration
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        self.inner.shutdown.cancel();
        let peers: Vec<Arc<peers::Peer>> = self.state().peers.drain().map(|(_, p)| p).collect();
        for peer in &peers {
            peer.close();
        }
        for peer in peers {
            peer.closed().await;
        }
    }
}

/// Key of a local pid in the process table.
fn local_key(pid: &Pid) -> u32 {
    pid.id | (pid.serial << 15)
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
