//! Keeps one CPU busy for a short while after the node receives or sends a message, as the BEAM's
//! schedulers do before they go to sleep (`erl +sbwt`, on by default).
//!
//! Why: a request that arrives while every CPU idles must first wake one, and on a virtual
//! machine whose idle vCPUs halt (guest halt polling off) that takes tens of microseconds, several
//! times a round trip between two threads that are awake (figures in docs/performance.md). A
//! client that calls again soon after its reply finds a CPU awake.
//!
//! The busy thread only calls `sched_yield`, so any thread with work to do takes the CPU from it
//! at once. Each message sent moves its deadline and wakes it if it sleeps; a message received
//! moves the deadline of a thread that spins, but does not wake a sleeping one: the message is
//! being handled on a CPU that is awake, and a spinner woken beside that work only takes a CPU
//! from it (and, on two CPUs, from the client's node that waits for the reply; figures in
//! docs/performance.md). Once a window passes without traffic it sleeps until the next message
//! sent, so an idle node costs no CPU. A window of zero starts no thread.
//!
//! While busy, the thread counts itself in [`BusyWait::busy_threads`], the count that threads
//! polling for callback replies also claim their places from: a CPU already kept awake needs no
//! second spinner, and on a 2-CPU machine two of them leave the callback server's node too little
//! CPU (callbacks get slower; see docs/performance.md).
//!
//! While XLA computes a program on its own threads, the CPUs are awake anyway and a spinner only
//! takes time from the computation (its threads, which spin for work themselves, fall asleep
//! and must be woken): whoever waits for such a program holds the busy wait ([`BusyWait::hold`]),
//! and the thread sleeps until the last hold is released, then spins again if traffic came
//! meanwhile.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The busy-waiting thread's handle; dropping it stops the thread.
pub struct BusyWait {
    running: Option<(Arc<Shared>, JoinHandle<()>)>,
    busy_threads: Arc<AtomicUsize>,
    /// Holds taken ([`BusyWait::hold`]), counted with or without a thread.
    holds: Arc<AtomicUsize>,
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
    /// Holds taken ([`BusyWait::hold`]): while any is, the thread does not spin.
    holds: Arc<AtomicUsize>,
}

impl Shared {
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Whether the thread should spin now: traffic within the window, and no hold.
    fn should_spin(&self) -> bool {
        self.holds.load(Ordering::SeqCst) == 0
            && self.now() < self.busy_until.load(Ordering::SeqCst)
    }

    /// Wakes the thread if it sleeps (whoever clears `asleep` wakes it).
    fn wake(&self, thread: &std::thread::Thread) {
        if self.asleep.load(Ordering::SeqCst) && self.asleep.swap(false, Ordering::SeqCst) {
            thread.unpark();
        }
    }
}

/// A hold on the busy wait ([`BusyWait::hold`]); dropping it releases the hold.
pub struct BusyHold {
    holds: Arc<AtomicUsize>,
    thread: Option<(Arc<Shared>, std::thread::Thread)>,
}

impl Drop for BusyHold {
    fn drop(&mut self) {
        let last = self.holds.fetch_sub(1, Ordering::SeqCst) == 1;
        // The last hold gone, the thread spins again if traffic came within the window.
        if let Some((shared, thread)) = &self.thread {
            if last && shared.should_spin() {
                shared.wake(thread);
            }
        }
    }
}

impl BusyWait {
    /// Starts the thread, asleep until the first [`BusyWait::arm`]; nothing for a zero window.
    pub fn start(window: Duration) -> std::io::Result<BusyWait> {
        let busy_threads = Arc::new(AtomicUsize::new(0));
        let holds = Arc::new(AtomicUsize::new(0));
        if window.is_zero() {
            return Ok(BusyWait {
                running: None,
                busy_threads,
                holds,
            });
        }
        let shared = Arc::new(Shared {
            epoch: Instant::now(),
            window,
            busy_until: AtomicU64::new(0),
            asleep: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            busy_threads: busy_threads.clone(),
            holds: holds.clone(),
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
            holds,
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

    /// A message received: a thread that spins keeps spinning for the next window, one that
    /// sleeps sleeps on. The node is handling the message on a CPU that is awake; waking the
    /// spinner now would only take a CPU from that handling (on two CPUs, from the reply's way
    /// back to a client on the same machine). One atomic store.
    pub fn extend(&self) {
        if let Some((shared, _)) = &self.running {
            let until = shared.now() + shared.window.as_nanos() as u64;
            shared.busy_until.store(until, Ordering::SeqCst);
        }
    }

    /// A message sent: keeps a CPU busy for the next window, for the request that may answer
    /// it. An atomic store and load, plus a wake-up when the thread sleeps.
    pub fn arm(&self) {
        let Some((shared, thread)) = &self.running else {
            return;
        };
        let until = shared.now() + shared.window.as_nanos() as u64;
        shared.busy_until.store(until, Ordering::SeqCst);
        // While held, the thread sleeps on: releasing the last hold wakes it. Load first: while
        // the thread is busy (the common case), arming needs no atomic swap.
        if shared.holds.load(Ordering::SeqCst) == 0 {
            shared.wake(thread.thread());
        }
    }

    /// Keeps the thread from spinning until the returned hold is dropped (holds nest): for
    /// whoever waits while XLA's threads compute, which keep the CPUs awake themselves. Holds
    /// are counted without a thread too ([`BusyWait::is_held`]).
    pub fn hold(&self) -> BusyHold {
        self.holds.fetch_add(1, Ordering::SeqCst);
        BusyHold {
            holds: self.holds.clone(),
            thread: self
                .running
                .as_ref()
                .map(|(shared, thread)| (shared.clone(), thread.thread().clone())),
        }
    }

    /// Whether a hold is taken now: XLA computes for someone, and nothing else need spin.
    pub fn is_held(&self) -> bool {
        self.holds.load(Ordering::SeqCst) > 0
    }

    /// Whether the thread is keeping a CPU busy now (false without a thread).
    pub fn is_busy(&self) -> bool {
        self.running.as_ref().is_some_and(|(shared, _)| {
            !shared.asleep.load(Ordering::SeqCst) && shared.should_spin()
        })
    }
}

fn busy_loop(shared: &Shared) {
    let mut counted = false;
    while !shared.stop.load(Ordering::Relaxed) {
        if shared.should_spin() {
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
        // Announce the sleep, then look at the deadline and the holds once more: an `arm` or the
        // release of the last hold in between either sees `asleep` (and unparks) or changed
        // them before this check.
        shared.asleep.store(true, Ordering::SeqCst);
        if !shared.should_spin() && !shared.stop.load(Ordering::SeqCst) {
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
    fn a_message_received_keeps_a_spinning_thread_busy_but_does_not_wake_a_sleeping_one() {
        let busy = BusyWait::start(Duration::from_millis(100)).unwrap();
        // Asleep: it started without traffic (a thread not yet asleep spins on, as it should).
        std::thread::sleep(Duration::from_millis(20));
        busy.extend();
        assert!(!busy.is_busy(), "woken by a message received");
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(busy.busy_threads().load(Ordering::Relaxed), 0);
        // Spinning (after a message sent), received messages keep it so past its window.
        busy.arm();
        let until = Instant::now() + Duration::from_millis(300);
        while Instant::now() < until {
            busy.extend();
            assert!(busy.is_busy(), "stopped spinning while messages came in");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(eventually(|| !busy.is_busy()), "still busy long after");
    }

    #[test]
    fn a_hold_stops_the_spinning_until_released() {
        let busy = BusyWait::start(Duration::from_secs(3600)).unwrap();
        busy.arm();
        assert!(eventually(
            || busy.busy_threads().load(Ordering::Relaxed) == 1
        ));
        let first = busy.hold();
        let second = busy.hold();
        assert!(busy.is_held());
        assert!(eventually(
            || busy.busy_threads().load(Ordering::Relaxed) == 0
        ));
        // Traffic while held does not wake it.
        busy.arm();
        assert!(!busy.is_busy());
        drop(first);
        assert!(!busy.is_busy(), "spinning while still held");
        drop(second);
        assert!(!busy.is_held());
        // The window is still open: it spins again.
        assert!(eventually(
            || busy.busy_threads().load(Ordering::Relaxed) == 1
        ));
    }

    #[test]
    fn a_zero_window_starts_no_thread() {
        let busy = BusyWait::start(Duration::ZERO).unwrap();
        busy.arm();
        assert!(!busy.is_busy());
        let hold = busy.hold();
        assert!(busy.is_held(), "holds are counted without a thread");
        drop(hold);
        assert!(!busy.is_held());
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
