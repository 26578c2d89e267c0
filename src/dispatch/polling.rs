//! How long a thread waiting for a callback's reply polls before it parks, and how many may poll
//! at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How a thread waiting for a callback's reply waits: it polls its mailbox for a while, yielding
/// the CPU between polls, then parks.
///
/// A reply from a live process usually arrives within a few hundred microseconds. Parking the
/// thread costs a futex wake-up by the network task that delivers the reply and the scheduler's
/// delay before the thread runs again, tens of microseconds on a virtual machine whose idle vCPUs
/// halt (docs/performance.md).
/// Polling is bounded in time (`--callback-spin-us`, and only for targets that usually answer
/// within it) and in threads (half the CPUs, the node's busy-wait thread included while it is
/// busy), so a crowd of waiting runs cannot take the CPUs from the network tasks.
pub struct ReplyPolling {
    spin: Duration,
    /// Threads keeping a CPU busy now (pollers and the node's busy-wait thread).
    spinning: Arc<AtomicUsize>,
    max_spinning: usize,
}

impl ReplyPolling {
    /// `spinning` counts the threads that keep a CPU busy (the node's busy-wait thread counts
    /// itself there).
    pub fn new(spin: Duration, spinning: Arc<AtomicUsize>) -> ReplyPolling {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        ReplyPolling {
            spin,
            spinning,
            max_spinning: (cpus / 2).max(1),
        }
    }

    /// How long to poll for the reply of a target that typically answers in `typical`: polling
    /// pays off only for a target that usually answers within the window.
    pub fn window(&self, typical: Option<Duration>) -> Duration {
        match typical {
            Some(typical) if typical > self.spin => Duration::ZERO,
            _ => self.spin,
        }
    }

    /// A polling place, if one of the few is free; dropping it gives the place back.
    pub fn place(&self) -> Option<Claim> {
        Claim::new(&self.spinning, self.max_spinning)
    }
}

/// A place among a bounded number, counted in an atomic. Claiming is one atomic add; dropping
/// the claim gives the place back, also when the holder panics.
pub struct Claim(Arc<AtomicUsize>);

impl Claim {
    /// Claims a place, or returns `None` when `max` are taken.
    fn new(counter: &Arc<AtomicUsize>, max: usize) -> Option<Claim> {
        if counter.fetch_add(1, Ordering::Relaxed) >= max {
            counter.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        Some(Claim(counter.clone()))
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
