//! Processes of this node as the code that plays them sees them: a pid, a mailbox of
//! [`Signal`]s, and [`Dest`]inations to send to and monitor (the node's own record of them, with
//! their names, monitors and links, is the process table in `process_table.rs`). The `:xla`
//! server, `net_kernel` and every callback waiting for a reply are such processes, so the cluster
//! sees them as ordinary Erlang processes: they can be called, monitored and linked.
//!
//! A [`Process`] is a handle owned by whatever code plays that process. Dropping it terminates the
//! process with reason `normal`; [`Process::exit`] picks the reason. Termination fires the monitors
//! (`:DOWN` / MONITOR_P_EXIT) and links (EXIT) that peers placed on it.

use super::control::ProcRef;
use super::process_table::Local;
use super::term::{atom, tuple};
use super::Node;
use eetf::{Pid, Reference, Term};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// What arrives in a process's mailbox.
#[derive(Debug)]
pub enum Signal {
    /// An ordinary message (SEND, REG_SEND or a local send).
    Message(Term),
    /// A monitor this process set fired: `{:DOWN, reference, :process, object, reason}`.
    Down {
        reference: Reference,
        object: Term,
        reason: Term,
    },
    /// An exit signal: from a linked process that terminated, or sent with `Process.exit/2`.
    Exit {
        from: Pid,
        reason: Term,
        linked: bool,
    },
}

/// Where a message or monitor goes.
#[derive(Debug, Clone, PartialEq)]
pub enum Dest {
    Pid(Pid),
    /// A name registered on this node.
    Name(String),
    /// `{name, node}`: a name registered on any node (this one included).
    Remote {
        name: String,
        node: String,
    },
}

impl From<Pid> for Dest {
    fn from(p: Pid) -> Self {
        Dest::Pid(p)
    }
}

impl From<&Pid> for Dest {
    fn from(p: &Pid) -> Self {
        Dest::Pid(p.clone())
    }
}

impl Dest {
    /// Reads a destination the way `send/2` accepts one: a pid, an atom or `{atom, node}`.
    pub fn from_term(term: &Term) -> Option<Dest> {
        match term {
            Term::Pid(p) => Some(Dest::Pid(p.clone())),
            Term::Atom(a) => Some(Dest::Name(a.name.clone())),
            Term::Tuple(t) => match &t.elements[..] {
                [Term::Atom(name), Term::Atom(node)] => Some(Dest::Remote {
                    name: name.name.clone(),
                    node: node.name.clone(),
                }),
                _ => None,
            },
            _ => None,
        }
    }

    /// The node the destination lives on, `local` for a bare name.
    pub fn node<'a>(&'a self, local: &'a str) -> &'a str {
        match self {
            Dest::Pid(p) => &p.node.name,
            Dest::Name(_) => local,
            Dest::Remote { node, .. } => node,
        }
    }

    /// How MONITOR_P / DEMONITOR_P name the destination on its node.
    pub(crate) fn proc_ref(&self) -> ProcRef {
        match self {
            Dest::Pid(p) => ProcRef::Pid(p.clone()),
            Dest::Name(name) | Dest::Remote { name, .. } => {
                ProcRef::Name(eetf::Atom::from(name.as_str()))
            }
        }
    }

    /// The destination as the process table looks it up, once it is known to be on this node.
    pub(crate) fn local(&self) -> Local<'_> {
        match self {
            Dest::Pid(p) => Local::Pid(p),
            Dest::Name(name) | Dest::Remote { name, .. } => Local::Name(name),
        }
    }

    /// The destination as a term (as it appears in `:DOWN` messages and error texts).
    pub fn to_term(&self, local: &str) -> Term {
        match self {
            Dest::Pid(p) => Term::from(p.clone()),
            Dest::Name(name) => tuple(vec![atom(name), atom(local)]),
            Dest::Remote { name, node } => tuple(vec![atom(name), atom(node)]),
        }
    }
}

/// A live process of this node. Dropping it terminates the process with reason `normal`.
pub struct Process {
    node: Node,
    pid: Pid,
    mailbox: mpsc::UnboundedReceiver<Signal>,
    exited: bool,
}

impl Process {
    pub(super) fn new(node: Node, pid: Pid, mailbox: mpsc::UnboundedReceiver<Signal>) -> Self {
        Process {
            node,
            pid,
            mailbox,
            exited: false,
        }
    }

    pub fn pid(&self) -> &Pid {
        &self.pid
    }

    pub fn node(&self) -> &Node {
        &self.node
    }

    /// Waits for the next signal. Never returns `None` while the process lives (the node keeps
    /// the sending half), but a shut-down node closes every mailbox.
    pub async fn recv(&mut self) -> Option<Signal> {
        self.mailbox.recv().await
    }

    /// The next signal if one is already there; never waits.
    pub fn try_recv(&mut self) -> Option<Signal> {
        self.mailbox.try_recv().ok()
    }

    /// Blocking receive with a deadline, for threads outside the async runtime (XLA's and the
    /// executor's). The thread parks until the node's network side delivers a signal or the
    /// timeout passes; no timer of the runtime is involved, so the deadline holds even if every
    /// runtime thread were busy. Returns `None` on timeout or when the node shut down.
    pub fn recv_blocking_timeout(&mut self, timeout: Duration) -> Option<Signal> {
        self.recv_blocking_until(Some(Instant::now() + timeout))
    }

    /// [`Process::recv_blocking_timeout`] until `deadline`; `None`: until a signal comes or the
    /// node shuts down.
    pub fn recv_blocking_until(&mut self, deadline: Option<Instant>) -> Option<Signal> {
        debug_assert!(
            tokio::runtime::Handle::try_current().is_err(),
            "recv_blocking_until blocks: never call it on a runtime thread"
        );
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        loop {
            match self.mailbox.poll_recv(&mut cx) {
                Poll::Ready(signal) => return signal,
                Poll::Pending => match deadline {
                    Some(deadline) => {
                        let left = deadline.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            return None;
                        }
                        std::thread::park_timeout(left);
                    }
                    None => std::thread::park(),
                },
            }
        }
    }

    pub fn send(&self, to: impl Into<Dest>, message: Term) {
        self.node.send(&self.pid, to.into(), message);
    }

    /// Monitors `target` (local or remote). A `Signal::Down` with the returned reference arrives
    /// when it terminates, is not there (`noproc`) or its node disconnects (`noconnection`).
    pub fn monitor(&self, target: impl Into<Dest>) -> Reference {
        self.node.monitor(&self.pid, target.into())
    }

    pub fn demonitor(&self, reference: &Reference) {
        self.node.demonitor(&self.pid, reference);
    }

    /// Registers this process under `name`; false if the name is taken.
    pub fn register(&self, name: &str) -> bool {
        self.node.register(name, &self.pid)
    }

    /// Terminates the process with `reason`, firing its monitors and links.
    pub fn exit(mut self, reason: Term) {
        self.exited = true;
        self.node.terminate(&self.pid, reason);
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if !self.exited {
            self.node.terminate(&self.pid, atom("normal"));
        }
    }
}

/// Wakes a thread parked in [`Process::recv_blocking_until`].
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}
