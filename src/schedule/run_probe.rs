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
//!
//! With `XLA_NODE_RUN_TRACE_FILE=PATH` as well, each finished run is also one line of that file:
//! the time of each step, in [`Step`]'s order, in nanoseconds since the Unix epoch by the system
//! clock, separated by spaces. A client on the same machine stamps its own side of the call with
//! the same clock (Erlang's `:os.system_time(:nanosecond)`) and pairs the two, call by call:
//! where a call's time goes between the two processes (`bench/nx_devices.exs` does, given
//! `XLA_NODE_BENCH_CALL_TRACE`).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::sync::{LazyLock, Mutex};
use std::time::{Instant, SystemTime};

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

/// The system clock's nanoseconds since the Unix epoch at [`EPOCH`].
static EPOCH_WALL_NS: LazyLock<u64> = LazyLock::new(|| {
    let since_epoch = EPOCH.elapsed().as_nanos() as u64;
    let wall = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    wall.saturating_sub(since_epoch)
});

/// `XLA_NODE_RUN_TRACE_FILE`'s file, opened to append, while tracing is on.
static TRACE_FILE: LazyLock<Option<Mutex<File>>> = LazyLock::new(|| {
    let path = std::env::var_os("XLA_NODE_RUN_TRACE_FILE").filter(|_| enabled())?;
    match File::options().create(true).append(true).open(&path) {
        Ok(file) => Some(Mutex::new(file)),
        Err(e) => {
            tracing::warn!("XLA_NODE_RUN_TRACE_FILE {}: {e}", path.to_string_lossy());
            None
        }
    }
});

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

    /// Its steps as one line of `XLA_NODE_RUN_TRACE_FILE`: each step's time by the system clock
    /// (`epoch_wall_ns` at the probe's epoch), in nanoseconds; `None` unless every step was
    /// reached.
    fn clock_line(&self, epoch_wall_ns: u64) -> Option<String> {
        let at = self.0.as_ref()?;
        if at.contains(&0) {
            return None;
        }
        let times: Vec<String> = at.iter().map(|t| (epoch_wall_ns + t).to_string()).collect();
        Some(times.join(" ") + "\n")
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
    if let Some(file) = TRACE_FILE.as_ref() {
        if let Some(line) = marks.clock_line(*EPOCH_WALL_NS) {
            let mut file = file.lock().unwrap_or_else(|p| p.into_inner());
            if let Err(e) = file.write_all(line.as_bytes()) {
                tracing::warn!("XLA_NODE_RUN_TRACE_FILE: {e}");
            }
        }
    }
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
    fn a_clock_line_gives_every_step_by_the_system_clock() {
        let mut marks = RunMarks(Some([0; STEPS + 1]));
        assert_eq!(marks.clock_line(1_000), None, "no step reached");
        for (i, at) in marks.0.as_mut().unwrap().iter_mut().enumerate() {
            *at = 10 * (i as u64 + 1);
        }
        assert_eq!(
            marks.clock_line(1_000).as_deref(),
            Some("1010 1020 1030 1040 1050 1060 1070 1080\n")
        );
        marks.0.as_mut().unwrap()[Step::Launched as usize] = 0;
        assert_eq!(marks.clock_line(1_000), None, "a step not reached");
        assert_eq!(RunMarks(None).clock_line(1_000), None, "tracing off");
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
