//! Shared monitors: one monitor per watched process, whoever needs it.
//!
//! Every callback must notice at once when its target goes down, and every run when the process
//! that asked for it does. Monitoring afresh for each callback (and each run) costs a MONITOR_P
//! and a DEMONITOR_P on the wire, each a write on the XLA thread's path and work for the peer:
//! more than the callback's own round trip on a small machine. So a [`Watch`] monitors one
//! process for as long as it is in use, and callbacks and runs *register* with it: when the `Down`
//! comes, every registered party is told, and the watch leaves the table. A watch without
//! registrations stays in the table for the next callback to the same process, up to
//! [`IDLE_KEPT`] of them.
//!
//! A watch is a node process owned by a task on the node's runtime, so a `Down` is handled while
//! every XLA thread is blocked. Registering with a watch that already fired fails with its reason.

use crate::node::{Dest, Node, Signal};
use eetf::Term;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

/// Watches without registrations kept for reuse; beyond this, idle ones are dropped (which
/// demonitors them) when a new one is made.
const IDLE_KEPT: usize = 1024;

/// Told the `Down` reason of the watched process.
type Party = Box<dyn FnOnce(&Term) + Send>;

/// One monitored process and who relies on the monitor.
pub(crate) struct Watch {
    state: Mutex<WatchState>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// How long the process typically takes to answer a callback.
    typical_reply: Typical,
}

#[derive(Default)]
struct WatchState {
    /// The `Down` reason, once it came.
    down: Option<Term>,
    next_id: u64,
    parties: HashMap<u64, Party>,
}

impl Watch {
    fn lock(&self) -> MutexGuard<'_, WatchState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn fire(&self, reason: Term) {
        let parties: Vec<Party> = {
            let mut state = self.lock();
            state.down = Some(reason.clone());
            state.parties.drain().map(|(_, p)| p).collect()
        };
        for party in parties {
            party(&reason);
        }
    }

    fn is_idle(&self) -> bool {
        self.lock().parties.is_empty()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(task) = self.task.lock().unwrap_or_else(|p| p.into_inner()).take() {
            task.abort(); // drops the watching process, which cancels its monitor
        }
    }
}

/// A party's registration; dropping it unregisters.
pub(crate) struct Registration {
    watch: Arc<Watch>,
    id: u64,
}

impl Registration {
    /// How long the watched process typically takes to answer a callback.
    pub(super) fn typical_reply(&self) -> &Typical {
        &self.watch.typical_reply
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.watch.lock().parties.remove(&self.id);
    }
}

/// The table of watches, keyed by the watched process.
pub(crate) struct Watches {
    node: Node,
    table: Arc<Mutex<HashMap<String, Arc<Watch>>>>,
}

impl Watches {
    pub(crate) fn new(node: Node) -> Self {
        Watches {
            node,
            table: Arc::default(),
        }
    }

    /// Registers `party` to be told when `dest` goes down; `Err(reason)` if it already is.
    pub(crate) fn register(
        &self,
        dest: &Dest,
        party: impl FnOnce(&Term) + Send + 'static,
    ) -> Result<Registration, Term> {
        let watch = self.watch(dest);
        let mut state = watch.lock();
        if let Some(reason) = &state.down {
            return Err(reason.clone());
        }
        state.next_id += 1;
        let id = state.next_id;
        state.parties.insert(id, Box::new(party));
        drop(state);
        Ok(Registration { watch, id })
    }

    /// The watch of `dest`, monitoring it first if none is in the table.
    fn watch(&self, dest: &Dest) -> Arc<Watch> {
        let key = key(dest, self.node.name());
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(watch) = table.get(&key) {
            return watch.clone();
        }
        if table.len() >= IDLE_KEPT {
            table.retain(|_, w| !w.is_idle());
        }
        let watch = Arc::new(Watch {
            state: Mutex::default(),
            task: Mutex::new(None),
            typical_reply: Typical::new(),
        });
        let mut process = self.node.spawn_process();
        let mref = process.monitor(dest.clone());
        let weak: Weak<Watch> = Arc::downgrade(&watch);
        let table_ref = Arc::downgrade(&self.table);
        let task_key = key.clone();
        let task = self.node.runtime().spawn(async move {
            while let Some(signal) = process.recv().await {
                let Signal::Down {
                    reference, reason, ..
                } = signal
                else {
                    continue;
                };
                if reference != mref {
                    continue;
                }
                let Some(watch) = weak.upgrade() else { return };
                // Out of the table first: the next callback to this name monitors afresh.
                if let Some(table) = table_ref.upgrade() {
                    let mut table = table.lock().unwrap_or_else(|p| p.into_inner());
                    if table.get(&task_key).is_some_and(|w| Arc::ptr_eq(w, &watch)) {
                        table.remove(&task_key);
                    }
                }
                watch.fire(reason);
                return;
            }
        });
        *watch.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
        table.insert(key, watch.clone());
        watch
    }
}

fn key(dest: &Dest, local: &str) -> String {
    match dest {
        Dest::Pid(p) => format!("<{}.{}.{}.{}>", p.node.name, p.id, p.serial, p.creation),
        Dest::Name(name) => format!("{name}@{local}"),
        Dest::Remote { name, node } => format!("{name}@{node}"),
    }
}

/// A typical duration: a moving average over recent measurements, shared between threads without
/// a lock, so that one reply slowed down by a busy machine does not flip the decision taken on it
/// (whether to poll for a callback's reply).
/// Microseconds; `u64::MAX` before the first measurement.
pub(super) struct Typical(AtomicU64);

impl Typical {
    pub(super) fn new() -> Typical {
        Typical(AtomicU64::new(u64::MAX))
    }

    /// The average so far; `None` before the first measurement.
    pub(super) fn get(&self) -> Option<Duration> {
        match self.0.load(Ordering::Relaxed) {
            u64::MAX => None,
            us => Some(Duration::from_micros(us)),
        }
    }

    /// Folds one measurement into the average (weight 1/8). Concurrent updates may lose one,
    /// which only makes the average a little less smooth.
    pub(super) fn record(&self, took: Duration) {
        let took = took.as_micros().min(u128::from(u64::MAX - 1)) as u64;
        let typical = match self.0.load(Ordering::Relaxed) {
            u64::MAX => took,
            old => old - old / 8 + took / 8,
        };
        self.0.store(typical, Ordering::Relaxed);
    }
}
