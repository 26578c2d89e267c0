//! Executables and device buffers handed out to the cluster, keyed by the opaque reference the
//! caller holds, and held by one or more processes: the one that created them (or the `owner:`
//! it named), and any that a holder gave or shared them to (`holders.rs`).
//!
//! The `:xla` server monitors every holder once; when a holder dies, or its node disconnects,
//! the monitor fires and its holds end here: what it held alone is released, what others hold
//! too stays theirs. `{:free, ...}` releases a resource whoever holds it. A resource in use by a
//! running program stays alive until that run finishes (they are reference-counted), so freeing
//! can never pull a buffer out from under XLA.
//!
//! Each buffer's bytes are charged to one client node, for its quota (`device_budget.rs`): the
//! node of its first holder, and, once no process of that node holds it any more, the node of
//! another holder.

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

/// Who holds what: each reference's holds (a process holds a reference once per share it got,
/// as a reference count; one hold, most often; never none while it is in the table), and each
/// holder's monitor and references.
#[derive(Default)]
struct Holds {
    holders: HashMap<Reference, Vec<Pid>>,
    owners: HashMap<Pid, (Reference, HashSet<Reference>)>,
    /// Monitor reference -> holder.
    monitors: HashMap<Reference, Pid>,
}

impl Holds {
    /// `holder` holds `key` once more, monitored first if it held nothing yet: `monitor`
    /// monitors it and returns the monitor's reference.
    fn hold(&mut self, key: &Reference, holder: &Pid, monitor: &dyn Fn(&Pid) -> Reference) {
        self.holders
            .entry(key.clone())
            .or_default()
            .push(holder.clone());
        match self.owners.get_mut(holder) {
            Some((_, owned)) => {
                owned.insert(key.clone());
            }
            None => {
                let reference = monitor(holder);
                self.monitors.insert(reference.clone(), holder.clone());
                self.owners
                    .insert(holder.clone(), (reference, HashSet::from([key.clone()])));
            }
        }
    }

    fn holds(&self, key: &Reference, holder: &Pid) -> bool {
        self.holders.get(key).is_some_and(|h| h.contains(holder))
    }

    /// Ends one of `holder`'s holds on `key`: whether no hold is left.
    fn end(&mut self, key: &Reference, holder: &Pid) -> bool {
        let Some(holders) = self.holders.get_mut(key) else {
            return false;
        };
        if let Some(at) = holders.iter().position(|h| h == holder) {
            holders.swap_remove(at);
        }
        if !holders.contains(holder) {
            if let Some((_, owned)) = self.owners.get_mut(holder) {
                owned.remove(key);
            }
        }
        let last = holders.is_empty();
        if last {
            self.holders.remove(key);
        }
        last
    }

    /// Ends every hold on `key`.
    fn forget(&mut self, key: &Reference) {
        for holder in self.holders.remove(key).unwrap_or_default() {
            if let Some((_, owned)) = self.owners.get_mut(&holder) {
                owned.remove(key);
            }
        }
    }

    /// What the holder behind `monitor` holds.
    fn held_by(&self, monitor: &Reference) -> Vec<Reference> {
        self.monitors
            .get(monitor)
            .and_then(|holder| self.owners.get(holder))
            .map(|(_, owned)| owned.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The holder behind `monitor` went down: ends all its holds, and returns the references
    /// it alone held.
    fn holder_down(&mut self, monitor: &Reference) -> Vec<Reference> {
        let Some(holder) = self.monitors.remove(monitor) else {
            return Vec::new();
        };
        let Some((_, owned)) = self.owners.remove(&holder) else {
            return Vec::new();
        };
        owned
            .into_iter()
            .filter(|key| {
                let Some(holders) = self.holders.get_mut(key) else {
                    return false;
                };
                holders.retain(|h| *h != holder);
                let last = holders.is_empty();
                if last {
                    self.holders.remove(key);
                }
                last
            })
            .collect()
    }
}

#[derive(Default)]
struct Tables {
    resources: HashMap<Reference, Resource>,
    /// What `resources` holds, kept as it changes so that reading it costs nothing.
    held: Held,
    holds: Holds,
    /// Bytes of the buffers charged to each client node (its device memory against its quota);
    /// a node charged nothing has no entry. A buffer is charged to the node of one of its
    /// holders: the first, then, once no process of that node holds it, the next one's.
    bytes_by_node: HashMap<String, u64>,
    /// The node each buffer is charged to.
    charged: HashMap<Reference, String>,
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

/// Why a hold on a reference cannot change (for [`Resources::change_holds`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HoldError {
    /// The reference names nothing: never did, or was freed.
    Unknown(Reference),
    /// The process asking does not hold it (to give it away or release it).
    NotHeld(Reference),
    /// An upload not yet done belongs to its caller alone.
    Upload(Reference),
}

/// A change of holds, for each of a request's references.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldChange<'a> {
    /// `pid` holds it once more.
    Share(&'a Pid),
    /// One hold of `from` passes to `to`.
    GiveAway { from: &'a Pid, to: &'a Pid },
    /// One hold of `pid` ends; the resource goes when no hold is left.
    Release(&'a Pid),
}

/// Whether [`Resources::change_holds`] makes every change or none (a call, which answers the
/// first reference that cannot change) or skips the references that cannot (a cast).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strictness {
    AllOrNothing,
    SkipInvalid,
}

impl Tables {
    /// Takes a resource out whoever holds it.
    fn take(&mut self, key: &Reference) -> Option<Resource> {
        let resource = self.resources.remove(key)?;
        self.held.remove(&resource);
        self.holds.forget(key);
        self.uncharge(key, &resource);
        Some(resource)
    }

    /// Whether `change` can apply to `key`.
    fn check(&self, key: &Reference, change: HoldChange) -> Result<(), HoldError> {
        match self.resources.get(key) {
            None => return Err(HoldError::Unknown(key.clone())),
            Some(Resource::Upload(_)) => return Err(HoldError::Upload(key.clone())),
            Some(_) => {}
        }
        match change {
            HoldChange::Share(_) => Ok(()),
            HoldChange::GiveAway { from: holder, .. } | HoldChange::Release(holder) => {
                if self.holds.holds(key, holder) {
                    Ok(())
                } else {
                    Err(HoldError::NotHeld(key.clone()))
                }
            }
        }
    }

    /// Applies a change [`Tables::check`] allowed; what it released, if anything.
    fn apply(
        &mut self,
        key: &Reference,
        change: HoldChange,
        monitor: &dyn Fn(&Pid) -> Reference,
    ) -> Option<Resource> {
        match change {
            HoldChange::Share(pid) => {
                self.holds.hold(key, pid, monitor);
                None
            }
            HoldChange::GiveAway { from, to } => {
                self.holds.hold(key, to, monitor);
                self.holds.end(key, from);
                self.recharge(key);
                None
            }
            HoldChange::Release(pid) => {
                if self.holds.end(key, pid) {
                    self.take(key)
                } else {
                    self.recharge(key);
                    None
                }
            }
        }
    }

    /// Charges a buffer's bytes to client node `node`.
    fn charge(&mut self, key: &Reference, resource: &Resource, node: &str) {
        let Resource::Buffer(b) = resource else {
            return;
        };
        *self.bytes_by_node.entry(node.to_string()).or_default() += b.byte_size() as u64;
        self.charged.insert(key.clone(), node.to_string());
    }

    /// Takes a buffer's bytes off the node it is charged to.
    fn uncharge(&mut self, key: &Reference, resource: &Resource) {
        let (Resource::Buffer(b), Some(node)) = (resource, self.charged.remove(key)) else {
            return;
        };
        if let Some(bytes) = self.bytes_by_node.get_mut(&node) {
            *bytes -= b.byte_size() as u64;
            if *bytes == 0 {
                self.bytes_by_node.remove(&node);
            }
        }
    }

    /// After holds on `key` ended: charges it to a holder's node if no process of the node it is
    /// charged to holds it any more.
    fn recharge(&mut self, key: &Reference) {
        let (Some(node), Some(holders)) = (self.charged.get(key), self.holds.holders.get(key))
        else {
            return;
        };
        if holders.iter().any(|h| h.node.name == *node) {
            return;
        }
        let Some(next) = holders.first().map(|h| h.node.name.clone()) else {
            return;
        };
        if let Some(resource) = self.resources.get(key).cloned() {
            self.uncharge(key, &resource);
            self.charge(key, &resource, &next);
        }
    }
}

#[derive(Default)]
pub struct Resources {
    tables: Mutex<Tables>,
}

impl Resources {
    fn lock(&self) -> std::sync::MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores `resource` under `reference`, held by `owner`. `monitor` monitors a holder that
    /// holds nothing yet and returns the monitor's reference; it is called with the tables
    /// locked, so that a holder that is already dead (whose `:DOWN` may come at once) is found
    /// here when its monitor fires.
    pub fn insert(
        &self,
        reference: &Reference,
        resource: Resource,
        owner: &Pid,
        monitor: &dyn Fn(&Pid) -> Reference,
    ) {
        let mut t = self.lock();
        t.held.add(&resource);
        if let Some(replaced) = t.resources.insert(reference.clone(), resource.clone()) {
            t.held.remove(&replaced);
            t.uncharge(reference, &replaced);
        }
        t.charge(reference, &resource, &owner.node.name);
        t.holds.hold(reference, owner, monitor);
    }

    pub fn get(&self, reference: &Reference) -> Option<Resource> {
        self.lock().resources.get(reference).cloned()
    }

    /// Removes one resource from the table whoever holds it and returns it; `None` if the
    /// reference is unknown (or already freed). The caller drops it where XLA may be called
    /// (see `crate::schedule`).
    pub fn free(&self, reference: &Reference) -> Option<Resource> {
        self.lock().take(reference)
    }

    /// Applies `change` to each of `references`, in order: with [`Strictness::AllOrNothing`]
    /// every one or, at the first that cannot change, none (that one's error); with
    /// [`Strictness::SkipInvalid`] those that can. Returns the resources a last holder
    /// released, to be dropped as [`Resources::free`] says.
    pub fn change_holds(
        &self,
        references: &[Reference],
        change: HoldChange,
        strictness: Strictness,
        monitor: &dyn Fn(&Pid) -> Reference,
    ) -> Result<Vec<Resource>, HoldError> {
        let mut t = self.lock();
        if strictness == Strictness::AllOrNothing {
            for key in references {
                t.check(key, change)?;
            }
        }
        let mut released = Vec::new();
        for key in references {
            // Each time a reference is listed counts; checked again, one that cannot change any
            // more (a release past the holds given) is skipped.
            if t.check(key, change).is_ok() {
                released.extend(t.apply(key, change, monitor));
            }
        }
        Ok(released)
    }

    /// The holder behind `monitor` died: ends all its holds and returns what it held alone, to
    /// be dropped as [`Resources::free`] says.
    pub fn owner_down(&self, monitor: &Reference) -> Vec<Resource> {
        let mut t = self.lock();
        let held = t.holds.held_by(monitor);
        let alone = t.holds.holder_down(monitor);
        for key in held.iter().filter(|key| !alone.contains(key)) {
            t.recharge(key);
        }
        alone.iter().filter_map(|key| t.take(key)).collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    fn pid(id: u32) -> Pid {
        Pid::new("client@host", id, 0, 1)
    }

    fn reference(id: u32) -> Reference {
        Reference {
            node: eetf::Atom::from("xla@host"),
            id: vec![id, 0, 0],
            creation: 1,
        }
    }

    /// Holds whose monitors are numbered as they are made.
    struct Fixture {
        holds: Holds,
        monitors: RefCell<Vec<Pid>>,
    }

    impl Fixture {
        fn new() -> Fixture {
            Fixture {
                holds: Holds::default(),
                monitors: RefCell::new(Vec::new()),
            }
        }

        fn hold(&mut self, key: u32, holder: u32) {
            let monitors = &self.monitors;
            self.holds.hold(&reference(key), &pid(holder), &|p| {
                let mut m = monitors.borrow_mut();
                m.push(p.clone());
                reference(1000 + m.len() as u32 - 1)
            });
        }

        fn monitor_of(&self, holder: u32) -> Reference {
            let at = self
                .monitors
                .borrow()
                .iter()
                .position(|p| *p == pid(holder));
            reference(1000 + at.expect("monitored") as u32)
        }
    }

    #[test]
    fn a_holder_is_monitored_once_whatever_it_holds() {
        let mut f = Fixture::new();
        f.hold(1, 7);
        f.hold(2, 7);
        f.hold(1, 7);
        f.hold(1, 8);
        assert_eq!(*f.monitors.borrow(), vec![pid(7), pid(8)]);
        assert!(f.holds.holds(&reference(1), &pid(7)) && f.holds.holds(&reference(1), &pid(8)));
        assert!(!f.holds.holds(&reference(2), &pid(8)));
    }

    #[test]
    fn a_reference_goes_with_its_last_hold() {
        let mut f = Fixture::new();
        f.hold(1, 7);
        f.hold(1, 8);
        assert!(!f.holds.end(&reference(1), &pid(7)), "8 holds it still");
        assert!(f.holds.end(&reference(1), &pid(8)));
        // Ending a hold that is not there changes nothing.
        assert!(!f.holds.end(&reference(1), &pid(8)));
    }

    #[test]
    fn holds_are_counted() {
        let mut f = Fixture::new();
        f.hold(1, 7);
        f.hold(1, 7);
        f.hold(2, 7);
        assert!(!f.holds.end(&reference(1), &pid(7)), "7 holds it once more");
        assert!(f.holds.holds(&reference(1), &pid(7)));
        assert!(f.holds.end(&reference(1), &pid(7)));
        assert!(!f.holds.holds(&reference(1), &pid(7)));
        // Its exit ends the holds it has left, however many.
        f.hold(2, 7);
        assert_eq!(f.holds.holder_down(&f.monitor_of(7)), vec![reference(2)]);
    }

    #[test]
    fn a_holder_that_goes_down_releases_what_it_held_alone() {
        let mut f = Fixture::new();
        f.hold(1, 7);
        f.hold(2, 7);
        f.hold(2, 8);
        f.hold(3, 8);
        let mut alone = f.holds.holder_down(&f.monitor_of(7));
        alone.sort_by_key(|r| r.id[0]);
        assert_eq!(alone, vec![reference(1)]);
        assert!(f.holds.holds(&reference(2), &pid(8)));
        // Its monitor fires once.
        assert!(f.holds.holder_down(&f.monitor_of(7)).is_empty());
        let mut alone = f.holds.holder_down(&f.monitor_of(8));
        alone.sort_by_key(|r| r.id[0]);
        assert_eq!(alone, vec![reference(2), reference(3)]);
    }

    #[test]
    fn forgetting_a_reference_ends_every_hold_on_it() {
        let mut f = Fixture::new();
        f.hold(1, 7);
        f.hold(1, 8);
        f.hold(2, 8);
        f.holds.forget(&reference(1));
        assert!(!f.holds.holds(&reference(1), &pid(7)));
        assert_eq!(f.holds.holder_down(&f.monitor_of(8)), vec![reference(2)]);
        assert!(f.holds.holder_down(&f.monitor_of(7)).is_empty());
    }
}
