//! Where one callback's time goes inside the node: timestamps of its steps, taken only when
//! `XLA_NODE_CALLBACK_TRACE=1` is set at start-up. Off, each probe is one load of a flag that
//! never changes, and nothing is recorded.
//!
//! The steps, in order (see docs/performance.md): the custom call is [`Step::Entered`], its
//! target is [`Step::Resolved`] (operands copied), the wait is [`Step::Registered`] (waiter,
//! reference, monitors), the request term is [`Step::Built`], [`Step::Encoded`] into a frame and
//! [`Step::Written`] (handed to the connection), the reply's frame is [`Step::ReplyRead`] off the
//! socket and decoded, [`Step::Delivered`] into the waiting process's mailbox, the waiting thread
//! [`Step::Woken`] holds it, and the custom call [`Step::Returned`]. The reply can be read and
//! delivered before the custom call's thread notes `Written`, when its write woke the peer on
//! its CPU.
//!
//! The custom call's thread keeps its callback's marks in a thread-local; the network side finds
//! them through the waiting process's pid, registered while the callback waits. Each finished
//! callback adds one sample (microseconds from `Entered` to each later step) to a bounded log,
//! whose medians `:info` reports under `callbacks.trace`.

use eetf::Pid;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Instant;

/// The steps after the first, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Entered,
    Resolved,
    Registered,
    Built,
    Encoded,
    Written,
    ReplyRead,
    Delivered,
    Woken,
    Returned,
}

/// How many steps are measured: all but `Entered`.
const STEPS: usize = 9;

/// The steps measured from `Entered`, with the names `:info` gives them.
pub const MEASURED: [(Step, &str); STEPS] = [
    (Step::Resolved, "resolved"),
    (Step::Registered, "registered"),
    (Step::Built, "built"),
    (Step::Encoded, "encoded"),
    (Step::Written, "written"),
    (Step::ReplyRead, "reply_read"),
    (Step::Delivered, "delivered"),
    (Step::Woken, "woken"),
    (Step::Returned, "returned"),
];

/// Samples kept for the medians.
const LOG_MAX: usize = 100_000;

static ENABLED: LazyLock<bool> =
    LazyLock::new(|| std::env::var_os("XLA_NODE_CALLBACK_TRACE").is_some_and(|v| v == "1"));

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Callbacks waiting now, by the waiting process's pid (id, serial).
type Waiting = HashMap<(u32, u32), Arc<Marks>>;
static WAITING: LazyLock<Mutex<Waiting>> = LazyLock::new(Mutex::default);

/// Finished callbacks: microseconds from `Entered` to each step of [`MEASURED`].
static LOG: LazyLock<Mutex<VecDeque<[f64; STEPS]>>> = LazyLock::new(Mutex::default);

thread_local! {
    /// The callback the custom call on this thread is serving.
    static CURRENT: RefCell<Option<Arc<Marks>>> = const { RefCell::new(None) };
    /// When the network task on this thread last finished reading a frame.
    static FRAME_READ: Cell<u64> = const { Cell::new(0) };
}

/// Nanoseconds since [`EPOCH`] per step; 0 = not reached.
#[derive(Default)]
struct Marks([AtomicU64; STEPS + 1]);

impl Marks {
    fn set(&self, step: Step, at: u64) {
        self.0[step as usize].store(at, Ordering::Relaxed);
    }

    fn sample(&self) -> Option<[f64; STEPS]> {
        let at = |s: Step| self.0[s as usize].load(Ordering::Relaxed);
        let entered = at(Step::Entered);
        let mut sample = [0.0; STEPS];
        for (slot, (step, _)) in sample.iter_mut().zip(MEASURED) {
            let t = at(step);
            if t == 0 || entered == 0 {
                return None;
            }
            *slot = t.saturating_sub(entered) as f64 / 1000.0;
        }
        Some(sample)
    }
}

/// Whether tracing is on (`XLA_NODE_CALLBACK_TRACE=1`).
pub fn enabled() -> bool {
    *ENABLED
}

fn now() -> u64 {
    EPOCH.elapsed().as_nanos() as u64
}

fn key(pid: &Pid) -> (u32, u32) {
    (pid.id, pid.serial)
}

/// A custom call starts serving a callback on this thread.
pub fn entered() {
    if !enabled() {
        return;
    }
    let marks = Arc::new(Marks::default());
    marks.set(Step::Entered, now());
    CURRENT.with(|c| *c.borrow_mut() = Some(marks));
}

/// A step of the callback served on this thread.
pub fn mark(step: Step) {
    if !enabled() {
        return;
    }
    let at = now();
    CURRENT.with(|c| {
        if let Some(marks) = &*c.borrow() {
            marks.set(step, at);
        }
    });
}

/// The callback served on this thread waits for its reply in `waiter`'s mailbox.
pub fn waiting_in(waiter: &Pid) {
    if !enabled() {
        return;
    }
    if let Some(marks) = CURRENT.with(|c| c.borrow().clone()) {
        lock(&WAITING).insert(key(waiter), marks);
    }
}

/// The callback served on this thread no longer waits in `waiter`'s mailbox.
pub fn stopped_waiting(waiter: &Pid) {
    if enabled() {
        lock(&WAITING).remove(&key(waiter));
    }
}

/// The callback served on this thread is done; records its sample.
pub fn returned() {
    if !enabled() {
        return;
    }
    mark(Step::Returned);
    let Some(marks) = CURRENT.with(|c| c.borrow_mut().take()) else {
        return;
    };
    if let Some(sample) = marks.sample() {
        let mut log = lock(&LOG);
        if log.len() == LOG_MAX {
            log.pop_front();
        }
        log.push_back(sample);
    }
}

/// The network task on this thread has read and decoded a frame.
pub fn frame_read() {
    if enabled() {
        FRAME_READ.with(|f| f.set(now()));
    }
}

/// A message is being put into `pid`'s mailbox (by the network task on this thread, if it came
/// from a peer).
pub fn delivered(pid: &Pid) {
    if !enabled() {
        return;
    }
    // Taken whatever the message: a later delivery must not see this frame's time.
    let read = FRAME_READ.with(|f| f.replace(0));
    if let Some(marks) = lock(&WAITING).get(&key(pid)) {
        if read != 0 {
            marks.set(Step::ReplyRead, read);
        }
        marks.set(Step::Delivered, now());
    }
}

/// The median microseconds from `Entered` to each step of [`MEASURED`], and the samples they
/// come from; `None` while tracing is off.
pub fn medians() -> Option<(usize, [f64; STEPS])> {
    if !enabled() {
        return None;
    }
    let log = lock(&LOG);
    let mut medians = [0.0; STEPS];
    for (i, median) in medians.iter_mut().enumerate() {
        let mut column: Vec<f64> = log.iter().map(|s| s[i]).collect();
        column.sort_by(f64::total_cmp);
        *median = column.get(column.len() / 2).copied().unwrap_or(0.0);
    }
    Some((log.len(), medians))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
