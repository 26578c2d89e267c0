//! Where one run's time goes inside the node: timestamps of its steps, taken only when
//! `XLA_NODE_RUN_TRACE=1` is set at start-up. Off, each probe is one load of a flag that never
//! changes, and nothing is recorded.
//!
//! The steps, in order (see docs/performance.md): the `:xla` server has the request in hand,
//! [`Step::Received`]; its arguments are checked and the run handed to the scheduler,
//! [`Step::Checked`]; an executor thread starts it, [`Step::Started`]; it is past the gate,
//! [`Step::Entered`]; XLA's `Execute` has returned, [`Step::Launched`] (its host arguments
//! copied before); its results are computed, [`Step::Completed`]; they are terms,
//! [`Step::Converted`]; the reply is written or queued, [`Step::Replied`]. A run answered at
//! launch (its results kept on the device) replies before it completes.
//!
//! The server's task stamps the first two into the run's [`RunMarks`], which travel with the run
//! to its executor thread, where they are the thread's current run until it ends; each finished
//! run adds one sample (microseconds from `Received` to each later step) to a bounded log,
//! whose medians `:info` reports under `run_trace`.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::{LazyLock, Mutex};
use std::time::Instant;

/// A run's steps, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Received,
    Checked,
    Started,
    Entered,
    Launched,
    Completed,
    Converted,
    Replied,
}

/// How many steps are measured: all but `Received`.
const STEPS: usize = 7;

/// The steps measured from `Received`, with the names `:info` gives them.
pub const MEASURED: [(Step, &str); STEPS] = [
    (Step::Checked, "checked"),
    (Step::Started, "started"),
    (Step::Entered, "entered"),
    (Step::Launched, "launched"),
    (Step::Completed, "completed"),
    (Step::Converted, "converted"),
    (Step::Replied, "replied"),
];

/// Samples kept for the medians.
const LOG_MAX: usize = 100_000;

static ENABLED: LazyLock<bool> =
    LazyLock::new(|| std::env::var_os("XLA_NODE_RUN_TRACE").is_some_and(|v| v == "1"));

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Finished runs: microseconds from `Received` to each step of [`MEASURED`].
static LOG: LazyLock<Mutex<VecDeque<[f64; STEPS]>>> = LazyLock::new(Mutex::default);

thread_local! {
    /// The run this executor thread executes.
    static CURRENT: RefCell<Option<RunMarks>> = const { RefCell::new(None) };
}

/// One run's timestamps: nanoseconds since the probe's epoch per step, 0 = not reached. Empty (and
/// free) while tracing is off.
#[derive(Debug, Default)]
pub struct RunMarks(Option<[u64; STEPS + 1]>);

impl RunMarks {
    /// A run the server has just received.
    pub fn received() -> RunMarks {
        if !enabled() {
            return RunMarks(None);
        }
        let mut at = [0; STEPS + 1];
        at[Step::Received as usize] = now();
        RunMarks(Some(at))
    }

    /// Stamps `step` now.
    pub fn mark(&mut self, step: Step) {
        if let Some(at) = &mut self.0 {
            at[step as usize] = now();
        }
    }

    fn sample(&self) -> Option<[f64; STEPS]> {
        let at = self.0.as_ref()?;
        let received = at[Step::Received as usize];
        let mut sample = [0.0; STEPS];
        for (slot, (step, _)) in sample.iter_mut().zip(MEASURED) {
            let t = at[step as usize];
            if t == 0 {
                return None;
            }
            *slot = t.saturating_sub(received) as f64 / 1000.0;
        }
        Some(sample)
    }
}

/// Whether tracing is on (`XLA_NODE_RUN_TRACE=1`).
pub fn enabled() -> bool {
    *ENABLED
}

fn now() -> u64 {
    EPOCH.elapsed().as_nanos() as u64
}

/// The run `marks` belongs to starts on this (executor) thread: it is the thread's current run
/// until [`finished`].
pub fn started(mut marks: RunMarks) {
    if !enabled() {
        return;
    }
    marks.mark(Step::Started);
    CURRENT.with(|c| *c.borrow_mut() = Some(marks));
}

/// A step of the run this thread executes.
pub fn mark(step: Step) {
    if !enabled() {
        return;
    }
    CURRENT.with(|c| {
        if let Some(marks) = &mut *c.borrow_mut() {
            marks.mark(step);
        }
    });
}

/// The run this thread executed is over; records its sample if it reached every step (a run
/// refused or failed on the way does not).
pub fn finished() {
    if !enabled() {
        return;
    }
    let Some(marks) = CURRENT.with(|c| c.borrow_mut().take()) else {
        return;
    };
    if let Some(sample) = marks.sample() {
        let mut log = LOG.lock().unwrap_or_else(|p| p.into_inner());
        if log.len() == LOG_MAX {
            log.pop_front();
        }
        log.push_back(sample);
    }
}

/// The median microseconds from `Received` to each step of [`MEASURED`], and the samples they
/// come from; `None` while tracing is off.
pub fn medians() -> Option<(usize, [f64; STEPS])> {
    if !enabled() {
        return None;
    }
    let log = LOG.lock().unwrap_or_else(|p| p.into_inner());
    let mut medians = [0.0; STEPS];
    for (i, median) in medians.iter_mut().enumerate() {
        let mut column: Vec<f64> = log.iter().map(|s| s[i]).collect();
        column.sort_by(f64::total_cmp);
        *median = column.get(column.len() / 2).copied().unwrap_or(0.0);
    }
    Some((log.len(), medians))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_needs_every_step() {
        let mut marks = RunMarks(Some([0; STEPS + 1]));
        marks.mark(Step::Received);
        for (step, _) in MEASURED {
            assert!(marks.sample().is_none(), "sampled before {step:?}");
            marks.mark(step);
        }
        let sample = marks.sample().expect("every step reached");
        assert!(sample.windows(2).all(|w| w[0] <= w[1]), "{sample:?}");
    }

    #[test]
    fn off_it_records_nothing() {
        if enabled() {
            return; // the tests were started with XLA_NODE_RUN_TRACE=1
        }
        let mut marks = RunMarks::received();
        marks.mark(Step::Checked);
        assert!(marks.sample().is_none());
        assert!(medians().is_none());
    }
}
