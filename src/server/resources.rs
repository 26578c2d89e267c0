//! Executables and device buffers handed out to the cluster, keyed by the opaque reference the
//! caller holds, and owned by the process that created them.
//!
//! The `:xla` server monitors every owner once; when an owner dies, or its node disconnects,
//! the monitor fires and everything it owned is released here. A resource in use by a running
//! program stays alive until that run finishes (they are reference-counted), so freeing can never
//! pull a buffer out from under XLA.

use super::transfer::Upload;
use crate::dispatch::{BEAM_INFEED, BEAM_OUTFEED, RUNTIME_CALLBACK};
use crate::schedule::Lane;
use crate::xla::{Buffer, Executable};
use eetf::{Pid, Reference};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Clone)]
pub enum Resource {
    Executable(Arc<Program>),
    Buffer(Arc<Buffer>),
    /// A tensor arriving in chunks (`transfer.rs`): host memory until it is done.
    Upload(Arc<Upload>),
}

/// A compiled executable with what the server learns about it while running it.
pub struct Program {
    pub exe: Arc<Executable>,
    /// The module mentions a host-callback target: its runs may wait for replies, so they are
    /// admitted among the runs that may wait (see `crate::schedule`).
    pub calls_back: bool,
    /// A run of it completed within XLA's `Execute`, on the calling thread: XLA finds it cheap,
    /// so its runs never hold XLA's line of queued computations for long.
    executes_inline: AtomicBool,
}

impl Program {
    pub fn new(exe: Arc<Executable>, calls_back: bool) -> Program {
        Program {
            exe,
            calls_back,
            executes_inline: AtomicBool::new(false),
        }
    }

    /// The lane its runs on `device` are admitted in (see `crate::schedule::Lane`).
    pub fn lane(&self, device: usize) -> Lane {
        if self.calls_back {
            Lane::CallingBack
        } else if self.executes_inline.load(Ordering::Relaxed) {
            Lane::Inline
        } else {
            Lane::Line(device)
        }
    }

    /// A run of it succeeded; `inline`: it had completed when `Execute` returned.
    pub fn executed(&self, inline: bool) {
        if inline {
            self.executes_inline.store(true, Ordering::Relaxed);
        }
    }

    /// Whether a module's text or bytecode names a host-callback target.
    pub fn mentions_callbacks(source: &[u8]) -> bool {
        let mentions = |needle: &[u8]| source.windows(needle.len()).any(|w| w == needle);
        [RUNTIME_CALLBACK, BEAM_OUTFEED, BEAM_INFEED]
            .iter()
            .any(|target| mentions(target.as_bytes()))
    }
}

#[derive(Default)]
struct Tables {
    resources: HashMap<Reference, (Resource, Pid)>,
    /// What `resources` holds, kept as it changes so that reading it costs nothing.
    held: Held,
    /// Bytes of the buffers held by the processes of each client node (its device memory
    /// against its quota); a node holding none has no entry.
    bytes_by_node: HashMap<String, u64>,
    /// Per owner: its monitor and what it owns.
    owners: HashMap<Pid, (Reference, HashSet<Reference>)>,
    /// Monitor reference -> owner.
    monitors: HashMap<Reference, Pid>,
}

/// Executables and buffers held for clients, and the buffers' bytes on the device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    pub executables: usize,
    pub buffers: usize,
    pub buffer_bytes: u64,
}

impl Held {
    fn add(&mut self, resource: &Resource) {
        match resource {
            Resource::Executable(_) => self.executables += 1,
            Resource::Upload(_) => {}
            Resource::Buffer(b) => {
                self.buffers += 1;
                self.buffer_bytes += b.byte_size() as u64;
            }
        }
    }

    fn remove(&mut self, resource: &Resource) {
        match resource {
            Resource::Executable(_) => self.executables -= 1,
            Resource::Upload(_) => {}
            Resource::Buffer(b) => {
                self.buffers -= 1;
                self.buffer_bytes -= b.byte_size() as u64;
            }
        }
    }
}

impl Tables {
    fn take(&mut self, key: &Reference) -> Option<(Resource, Pid)> {
        let taken = self.resources.remove(key)?;
        self.held.remove(&taken.0);
        self.count_bytes(&taken.0, &taken.1, false);
        Some(taken)
    }

    /// Counts a buffer's bytes in (or out of) its owner's node's.
    fn count_bytes(&mut self, resource: &Resource, owner: &Pid, added: bool) {
        let Resource::Buffer(b) = resource else {
            return;
        };
        let bytes = b.byte_size() as u64;
        if added {
            *self
                .bytes_by_node
                .entry(owner.node.name.clone())
                .or_default() += bytes;
            return;
        }
        if let Some(held) = self.bytes_by_node.get_mut(&owner.node.name) {
            *held -= bytes;
            if *held == 0 {
                self.bytes_by_node.remove(&owner.node.name);
            }
        }
    }
}

#[derive(Default)]
pub struct Resources {
    tables: Mutex<Tables>,
}

/// What [`Resources::insert`] needs the caller to do: monitor a new owner.
pub enum Owner {
    Known,
    New,
}

impl Resources {
    fn lock(&self) -> std::sync::MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores `resource` under `reference` for `owner`. Returns [`Owner::New`] when the owner has
    /// no monitor yet: the caller must then monitor it and call [`Resources::set_monitor`].
    pub fn insert(&self, reference: &Reference, resource: Resource, owner: &Pid) -> Owner {
        let mut t = self.lock();
        let key = reference.clone();
        t.held.add(&resource);
        t.count_bytes(&resource, owner, true);
        if let Some((replaced, previous)) =
            t.resources.insert(key.clone(), (resource, owner.clone()))
        {
            t.held.remove(&replaced);
            t.count_bytes(&replaced, &previous, false);
        }
        match t.owners.get_mut(owner) {
            Some((_, owned)) => {
                owned.insert(key);
                Owner::Known
            }
            None => {
                let placeholder = reference.clone();
                t.owners
                    .insert(owner.clone(), (placeholder, HashSet::from([key])));
                Owner::New
            }
        }
    }

    pub fn set_monitor(&self, owner: &Pid, monitor: Reference) {
        let mut t = self.lock();
        t.monitors.insert(monitor.clone(), owner.clone());
        if let Some(entry) = t.owners.get_mut(owner) {
            entry.0 = monitor;
        }
    }

    pub fn get(&self, reference: &Reference) -> Option<Resource> {
        self.lock().resources.get(reference).map(|(r, _)| r.clone())
    }

    /// Removes one resource from the table and returns it; `None` if the reference is unknown
    /// (or already freed). The caller drops it where XLA may be called (see `crate::schedule`).
    pub fn free(&self, reference: &Reference) -> Option<Resource> {
        let mut t = self.lock();
        let (resource, owner) = t.take(reference)?;
        if let Some((_, owned)) = t.owners.get_mut(&owner) {
            owned.remove(reference);
        }
        Some(resource)
    }

    /// The owner behind `monitor` died: removes all it owned and returns it, to be dropped as
    /// [`Resources::free`] says.
    pub fn owner_down(&self, monitor: &Reference) -> Vec<Resource> {
        let mut t = self.lock();
        let Some(owner) = t.monitors.remove(monitor) else {
            return Vec::new();
        };
        let Some((_, owned)) = t.owners.remove(&owner) else {
            return Vec::new();
        };
        owned
            .iter()
            .filter_map(|key| t.take(key).map(|(r, _)| r))
            .collect()
    }

    /// What is held now.
    pub fn held(&self) -> Held {
        self.lock().held
    }

    /// Bytes of the buffers the processes of client node `node` hold.
    pub fn bytes_of_node(&self, node: &str) -> u64 {
        self.lock().bytes_by_node.get(node).copied().unwrap_or(0)
    }
}
