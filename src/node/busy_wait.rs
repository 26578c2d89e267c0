//! Keeps one CPU busy for a short while after the node receives or sends a message, as the BEAM's
//! schedulers do before they go to sleep (`erl +sbwt`, on by default).
//!
//! Why: a request that arrives while every CPU idles must first wake one, and on a virtual
//! machine whose idle vCPUs halt (guest halt polling off) that takes tens of microseconds, several
//! times a round trip between two threads that are awake (figures in docs/performance.md). A
//! client that calls again soon after its reply finds a CPU awake.
//!
//! The busy thread only calls `sched_yield`, so any thread with work to do takes the CPU from it
//! at once. Each message received or sent moves its deadline; once a window passes without
//! traffic it sleeps until the next message, so an idle node costs no CPU. A window of zero
//! starts no thread.
//!
//! While busy, the thread counts itself in [`BusyWait::busy_threads`], the count that threads
//! polling for callback replies also claim their places from: a CPU already kept awake needs no
//! second spinner, and on a 2-CPU machine two of them leave the callback server's node too little
//! CPU (callbacks get slower; see docs/performance.md).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The busy-waiting thread's handle; dropping it stops the thread.
pub struct BusyWait {
    running: Option<(Arc<Shared>, JoinHandle<()>)>,
    busy_threads: Arc<AtomicUsize>,
}

struct Shared {
    epoch: Instant,
    window: Duration,
    /// Nanoseconds after `epoch` until which the thread stays busy.
    busy_until: AtomicU64,
    /// Set by the thread before it parks; whoever clears it wakes the thread.
    asleep: AtomicBool,
    stop: AtomicBool,
    busy_threads: Arc<AtomicUsize>,
}

impl Shared {
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
}

impl BusyWait {
    /// Starts the thread, asleep until the first [`BusyWait::arm`]; nothing for a zero window.
    pub fn start(window: Duration) -> std::io::Result<BusyWait> {
        let busy_threads = Arc::new(AtomicUsize::new(0));
        if window.is_zero() {
            return Ok(BusyWait {
                running: None,
                busy_threads,
            });
        }
        let shared = Arc::new(Shared {
            epoch: Instant::now(),
            window,
            busy_until: AtomicU64::new(0),
            asleep: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            busy_threads: busy_threads.clone(),
        });
        let thread = std::thread::Builder::new()
            .name("xla_node-busy-wait".into())
            .spawn({
                let shared = shared.clone();
                move || busy_loop(&shared)
            })?;
        Ok(BusyWait {
            running: Some((shared, thread)),
            busy_threads,
        })
    }

    /// How long a CPU is kept busy after each message (zero: never).
    pub fn window(&self) -> Duration {
        self.running
            .as_ref()
            .map_or(Duration::ZERO, |(shared, _)| shared.window)
    }

    /// How many threads of this process keep a CPU busy now: this thread while busy, and the
    /// callback waiters that claim a place here to poll for their replies.
    pub fn busy_threads(&self) -> &Arc<AtomicUsize> {
        &self.busy_threads
    }

    /// Traffic: keeps a CPU busy for the next window. An atomic store and load, plus a wake-up
    /// when the thread sleeps.
    pub fn arm(&self) {
        let Some((shared, thread)) = &self.running else {
            return;
        };
        let until = shared.now() + shared.window.as_nanos() as u64;
        shared.busy_until.store(until, Ordering::SeqCst);
        // Load first: while the thread is busy (the common case), arming needs no atomic swap.
        if shared.asleep.load(Ordering::SeqCst) && shared.asleep.swap(false, Ordering::SeqCst) {
            thread.thread().unpark();
        }
    }

    /// Whether the thread is keeping a CPU busy now (false without a thread).
    pub fn is_busy(&self) -> bool {
        self.running.as_ref().is_some_and(|(shared, _)| {
            !shared.asleep.load(Ordering::SeqCst)
                && shared.now() < shared.busy_until.load(Ordering::SeqCst)
        })
    }
}

fn busy_loop(shared: &Shared) {
    let mut counted = false;
    while !shared.stop.load(Ordering::Relaxed) {
        if shared.now() < shared.busy_until.load(Ordering::Relaxed) {
            if !counted {
                shared.busy_threads.fetch_add(1, Ordering::Relaxed);
                counted = true;
            }
            std::thread::yield_now();
            continue;
        }
        if counted {
            shared.busy_threads.fetch_sub(1, Ordering::Relaxed);
            counted = false;
        }
        // Announce the sleep, then look at the deadline once more: an `arm` in between either
        // sees `asleep` (and unparks) or moved the deadline before this check.
        shared.asleep.store(true, Ordering::SeqCst);
        if shared.now() >= shared.busy_until.load(Ordering::SeqCst)
            && !shared.stop.load(Ordering::SeqCst)
        {
            std::thread::park();
        }
        shared.asleep.store(false, Ordering::SeqCst);
    }
    if counted {
        shared.busy_threads.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for BusyWait {
    fn drop(&mut self) {
        if let Some((shared, thread)) = self.running.take() {
            shared.stop.store(true, Ordering::SeqCst);
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::eventually;

    #[test]
    fn stays_busy_for_the_window_after_traffic_then_sleeps() {
        let busy = BusyWait::start(Duration::from_millis(300)).unwrap();
        assert!(!busy.is_busy(), "busy before any traffic");
        busy.arm();
        assert!(busy.is_busy(), "not busy right after traffic");
        assert!(eventually(
            || busy.busy_threads().load(Ordering::Relaxed) == 1
        ));
        assert!(eventually(|| !busy.is_busy()), "still busy long after");
        assert!(eventually(
            || busy.busy_threads().load(Ordering::Relaxed) == 0
        ));
        // Asleep now: the next message wakes it again.
        busy.arm();
        assert!(busy.is_busy());
    }

    #[test]
    fn a_zero_window_starts_no_thread() {
        let busy = BusyWait::start(Duration::ZERO).unwrap();
        busy.arm();
        assert!(!busy.is_busy());
        assert!(busy.running.is_none());
    }

    #[test]
    fn dropping_stops_the_thread_even_while_busy() {
        let busy = BusyWait::start(Duration::from_secs(3600)).unwrap();
        busy.arm();
        let (shared, _) = busy.running.as_ref().unwrap();
        let shared = shared.clone();
        let busy_threads = busy.busy_threads().clone();
        assert!(eventually(|| busy_threads.load(Ordering::Relaxed) == 1));
        drop(busy); // joins the thread
        assert!(shared.stop.load(Ordering::SeqCst));
        assert_eq!(busy_threads.load(Ordering::Relaxed), 0);
        assert_eq!(
            Arc::strong_count(&shared),
            1,
            "the thread still holds its state"
        );
    }
}
