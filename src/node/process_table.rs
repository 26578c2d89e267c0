//! The process table: which local processes are alive, the names they are registered under, and
//! the monitors and links that tie them to other processes, local or on peers.
//!
//! Everything that must fire when a process ends or a node goes down is recorded here, so that
//! termination (`Node::terminate`) and nodedown (`Node::node_down`) can tell every watcher and
//! linked process, as the BEAM does: `:DOWN` / MONITOR_P_EXIT for monitors, EXIT for links.
//!
//! The table sits behind one mutex, held for the bookkeeping and for putting a signal into a
//! mailbox (an unbounded channel: it never waits). What a change must send to peers or to other
//! processes is collected under the lock and sent after it is released, so no peer's queue is
//! ever reached with the table locked.

use super::control::{ControlMessage, ProcRef};
use super::process::{Dest, Process, Signal};
use super::term::atom;
use super::{probe, Node};
use eetf::{Pid, Reference, Term};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;
use tokio::sync::mpsc;

/// The node's live processes, their names and the monitors they hold on remote processes.
pub(crate) struct ProcessTable {
    /// This run of the node: pids of an earlier run of the same node name resolve to nothing.
    creation: u32,
    processes: HashMap<u32, Entry>,
    names: HashMap<String, Pid>,
    /// Monitors our processes hold on remote processes, by reference.
    remote_monitors: HashMap<Reference, RemoteMonitor>,
}

/// Bookkeeping for one live local process.
struct Entry {
    pid: Pid,
    mailbox: mpsc::UnboundedSender<Signal>,
    name: Option<String>,
    /// Monitors held on this process.
    watchers: Vec<Watcher>,
    links: Vec<Pid>,
}

/// A monitor held on a local process, by a local or a remote process.
pub(super) struct Watcher {
    pub reference: Reference,
    /// The process holding the monitor.
    pub pid: Pid,
    /// The pid or `{name, node}` the monitor was set on: `:DOWN` and MONITOR_P_EXIT echo it back.
    pub object: Term,
}

/// A monitor one of our processes holds on a remote process.
struct RemoteMonitor {
    owner: Pid,
    target: Dest,
    reference: Reference,
}

impl ProcessTable {
    pub(super) fn new(creation: u32) -> Self {
        ProcessTable {
            creation,
            processes: HashMap::new(),
            names: HashMap::new(),
            remote_monitors: HashMap::new(),
        }
    }

    /// The live process a local pid or registered name stands for: the one lookup every
    /// operation on a local process goes through.
    fn resolve(&mut self, target: Local<'_>) -> Option<&mut Entry> {
        let key = match target {
            Local::Pid(pid) if pid.creation == self.creation => local_key(pid),
            Local::Pid(_) => return None, // a pid from an earlier run of this node name
            Local::Name(name) => local_key(self.names.get(name)?),
        };
        self.processes.get_mut(&key)
    }

    /// Takes a process out of the table with its name, the monitors others hold on it (in its
    /// entry) and the remote monitors it held; forgets the monitors and links it held on other
    /// local processes.
    fn remove(&mut self, pid: &Pid) -> Option<(Entry, Vec<RemoteMonitor>)> {
        let entry = self.processes.remove(&local_key(pid))?;
        if let Some(name) = &entry.name {
            self.names.remove(name);
        }
        let held = self
            .remote_monitors
            .extract_if(|_, m| &m.owner == pid)
            .map(|(_, m)| m)
            .collect();
        for other in self.processes.values_mut() {
            other.watchers.retain(|w| &w.pid != pid);
            other.links.retain(|l| l != pid);
        }
        Some((entry, held))
    }

    fn remove_watchers(&mut self, reference: &Reference) {
        for entry in self.processes.values_mut() {
            entry.watchers.retain(|w| &w.reference != reference);
        }
    }
}

/// A local process as a control message or a send names it: by pid or by registered name.
#[derive(Clone, Copy)]
pub(crate) enum Local<'a> {
    Pid(&'a Pid),
    Name(&'a str),
}

impl<'a> From<&'a ProcRef> for Local<'a> {
    fn from(target: &'a ProcRef) -> Self {
        match target {
            ProcRef::Pid(pid) => Local::Pid(pid),
            ProcRef::Name(name) => Local::Name(&name.name),
        }
    }
}

/// Key of a local pid in the process table.
fn local_key(pid: &Pid) -> u32 {
    pid.id | (pid.serial << 15)
}

impl Node {
    fn table(&self) -> MutexGuard<'_, ProcessTable> {
        // A panic while holding the lock must not take the whole node down with poisoning.
        self.inner
            .processes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Number of live local processes.
    pub fn process_count(&self) -> usize {
        self.table().processes.len()
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
        self.table().processes.insert(
            local_key(&pid),
            Entry {
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

    /// Registers the local process `pid` under `name`; false if the name is taken or the
    /// process is gone.
    pub(crate) fn register(&self, name: &str, pid: &Pid) -> bool {
        let mut table = self.table();
        if table.names.contains_key(name) {
            return false;
        }
        let Some(entry) = table.resolve(Local::Pid(pid)) else {
            return false;
        };
        entry.name = Some(name.to_string());
        table.names.insert(name.to_string(), pid.clone());
        true
    }

    /// The pid of the live local process `to` stands for.
    pub(crate) fn live_pid(&self, to: Local<'_>) -> Option<Pid> {
        self.table().resolve(to).map(|entry| entry.pid.clone())
    }

    /// The local pid registered under `name`.
    pub fn whereis(&self, name: &str) -> Option<Pid> {
        self.table().names.get(name).cloned()
    }

    /// Puts `signal` into the mailbox of the local process `to`; dropped silently if there is
    /// no such process, as Erlang's `send` does.
    pub(crate) fn deliver(&self, to: Local<'_>, signal: Signal) {
        if let Some(entry) = self.table().resolve(to) {
            // Before the send: once the message is in, its receiver may stop waiting for it.
            probe::delivered(&entry.pid);
            let _ = entry.mailbox.send(signal);
        }
    }

    /// Links the local process `local` to `other` (LINK from a peer); false if `local` is not
    /// there.
    pub(super) fn add_link(&self, local: &Pid, other: Pid) -> bool {
        match self.table().resolve(Local::Pid(local)) {
            Some(entry) => {
                entry.links.push(other);
                true
            }
            None => false,
        }
    }

    /// Removes the link between the local process `local` and `other`; false if there was none.
    pub(super) fn remove_link(&self, local: &Pid, other: &Pid) -> bool {
        let mut table = self.table();
        let Some(entry) = table.resolve(Local::Pid(local)) else {
            return false;
        };
        let before = entry.links.len();
        entry.links.retain(|l| l != other);
        entry.links.len() != before
    }

    /// Places `watcher`'s monitor on the local process `target`; gives the watcher back if
    /// there is no such process (boxed: that is the rare case).
    pub(super) fn add_watcher(
        &self,
        target: Local<'_>,
        watcher: Watcher,
    ) -> Result<(), Box<Watcher>> {
        match self.table().resolve(target) {
            Some(entry) => {
                entry.watchers.push(watcher);
                Ok(())
            }
            None => Err(Box::new(watcher)),
        }
    }

    /// Removes the monitor `reference` held on a local process (DEMONITOR_P, or a local
    /// demonitor).
    pub(super) fn remove_watcher(&self, reference: &Reference) {
        self.table().remove_watchers(reference);
    }

    /// `owner` monitors `target`: on this node, a watcher on its entry (or `:DOWN` `noproc` at
    /// once); elsewhere, a remote monitor recorded here and MONITOR_P to its node.
    pub(crate) fn monitor(&self, owner: &Pid, target: Dest) -> Reference {
        let reference = self.make_ref();
        let node = target.node(self.name()).to_string();
        if node == self.name() {
            let watcher = Watcher {
                reference: reference.clone(),
                pid: owner.clone(),
                object: target.to_term(self.name()),
            };
            if let Err(watcher) = self.add_watcher(target.local(), watcher) {
                self.deliver(
                    Local::Pid(owner),
                    Signal::Down {
                        reference: watcher.reference,
                        object: watcher.object,
                        reason: atom("noproc"),
                    },
                );
            }
            return reference;
        }
        let to = target.proc_ref();
        self.table().remote_monitors.insert(
            reference.clone(),
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

    /// Drops the monitor `reference` that `owner` set with [`Node::monitor`].
    pub(crate) fn demonitor(&self, owner: &Pid, reference: &Reference) {
        let mut table = self.table();
        match table.remote_monitors.remove(reference) {
            Some(m) => {
                drop(table);
                self.cancel_remote_monitor(owner, m.target, reference.clone());
            }
            None => table.remove_watchers(reference),
        }
    }

    /// Asks the peer holding `target` to drop the monitor `reference` (DEMONITOR_P).
    fn cancel_remote_monitor(&self, owner: &Pid, target: Dest, reference: Reference) {
        let node = target.node(self.name()).to_string();
        let to = target.proc_ref();
        self.send_control(
            owner,
            &node,
            ControlMessage::DemonitorP {
                from: owner.clone(),
                to,
                reference,
            },
            None,
        );
    }

    /// Fires a remote monitor held by one of our processes (MONITOR_P_EXIT or connection loss).
    pub(crate) fn fire_remote_monitor(&self, reference: &Reference, reason: Term) {
        let Some(m) = self.table().remote_monitors.remove(reference) else {
            return;
        };
        let object = m.target.to_term(self.name());
        self.deliver(
            Local::Pid(&m.owner),
            Signal::Down {
                reference: reference.clone(),
                object,
                reason,
            },
        );
    }

    /// Removes a local process and fires its monitors and links with `reason`.
    pub(crate) fn terminate(&self, pid: &Pid, reason: Term) {
        let Some((entry, held)) = self.table().remove(pid) else {
            return;
        };
        // Monitors this process held on remote processes are cancelled at their peers.
        for m in held {
            self.cancel_remote_monitor(pid, m.target, m.reference);
        }
        for watcher in entry.watchers {
            self.fire_watcher(pid, watcher, reason.clone());
        }
        for linked in entry.links {
            self.send_link_exit(pid, linked, reason.clone());
        }
    }

    /// Tells the holder of a monitor on the local process `pid` that it ended with `reason`.
    fn fire_watcher(&self, pid: &Pid, w: Watcher, reason: Term) {
        if self.is_local(&w.pid) {
            self.deliver(
                Local::Pid(&w.pid),
                Signal::Down {
                    reference: w.reference,
                    object: w.object,
                    reason,
                },
            );
            return;
        }
        let from = match &w.object {
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
                reason: Some(reason),
            },
            None,
        );
    }

    /// Sends the exit signal of the local process `pid` to the process `linked` to it.
    fn send_link_exit(&self, pid: &Pid, linked: Pid, reason: Term) {
        if self.is_local(&linked) {
            self.deliver(
                Local::Pid(&linked),
                Signal::Exit {
                    from: pid.clone(),
                    reason,
                    linked: true,
                },
            );
            return;
        }
        let node = linked.node.name.clone();
        self.send_control(
            pid,
            &node,
            ControlMessage::Exit {
                from: pid.clone(),
                to: linked,
                reason: Some(reason),
            },
            None,
        );
    }

    /// Connection to `node` is gone: purge monitors and links that went through it and tell our
    /// processes, as the BEAM does on nodedown.
    pub(crate) fn node_down(&self, node: &str) {
        let mut table = self.table();
        let mut exits = Vec::new();
        for entry in table.processes.values_mut() {
            entry.watchers.retain(|w| w.pid.node.name != node);
            entry.links.retain(|l| {
                let gone = l.node.name == node;
                if gone {
                    exits.push((entry.pid.clone(), l.clone()));
                }
                !gone
            });
        }
        let fired: Vec<Reference> = table
            .remote_monitors
            .values()
            .filter(|m| m.target.node(self.name()) == node)
            .map(|m| m.reference.clone())
            .collect();
        drop(table);
        for (local, remote) in exits {
            self.deliver(
                Local::Pid(&local),
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
}
