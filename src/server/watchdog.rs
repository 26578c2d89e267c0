//! A watchdog for the rule `crate::schedule` states: the network side never waits on XLA.
//!
//! A task on the node's runtime notes the time every 100 ms; a thread of its own, outside the
//! runtime, checks the note. If the runtime has not run that task for more than a second, the
//! node's network side (connections, ticks, `:ping`, callback replies) is not being scheduled,
//! and the thread logs an error saying where the runs are, so that a stall is never silent.

use crate::dispatch::Dispatcher;
use crate::schedule::Scheduler;
use crate::xla::Executor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the runtime task notes the time.
const BEAT: Duration = Duration::from_millis(100);

/// Silence after which the thread reports, and again after each further interval of it.
const STALLED_AFTER: Duration = Duration::from_secs(1);
const REPORT_EVERY: Duration = Duration::from_secs(5);

/// What the watchdog reports on.
pub struct Watched {
    pub scheduler: Arc<Scheduler>,
    pub dispatcher: Arc<Dispatcher>,
    pub executor: Executor,
}

/// Starts the watchdog; the returned task is the heartbeat, and aborting it ends the thread.
pub fn start(
    runtime: &tokio::runtime::Handle,
    watched: Watched,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let epoch = Instant::now();
    let beat = Arc::new(AtomicU64::new(0));
    let noted = beat.clone();
    let heartbeat = runtime.spawn(async move {
        let mut ticks = tokio::time::interval(BEAT);
        loop {
            ticks.tick().await;
            noted.store(epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
        }
    });
    std::thread::Builder::new()
        .name("xla-node-watchdog".into())
        .spawn(move || watch(epoch, beat, watched))?;
    Ok(heartbeat)
}

fn watch(epoch: Instant, beat: Arc<AtomicU64>, watched: Watched) {
    let mut reported: Option<Duration> = None;
    // The heartbeat task holds the other reference; it is gone once the task is aborted.
    while Arc::strong_count(&beat) > 1 {
        std::thread::sleep(BEAT);
        let last = Duration::from_millis(beat.load(Ordering::Relaxed));
        let silent = epoch.elapsed().saturating_sub(last);
        if silent <= STALLED_AFTER {
            if reported.take().is_some() {
                tracing::warn!(
                    "the node's network side runs again after {} ms without",
                    silent.as_millis()
                );
            }
            continue;
        }
        if reported.is_some_and(|at| silent < at + REPORT_EVERY) {
            continue;
        }
        reported = Some(silent);
        let runs = watched.scheduler.counts();
        let callbacks = watched.dispatcher.stats();
        let executor = watched.executor.stats();
        tracing::error!(
            "the node's network side (connections, ticks, :ping, callback replies) has not been \
             scheduled for {} ms. Runs: {} executing ({} of programs that call back), {} \
             callbacks waiting for replies, {} queued for a place; executor threads: {}, jobs \
             waiting for one: {}",
            silent.as_millis(),
            runs.running,
            runs.running_calling_back,
            callbacks.pending,
            runs.queued,
            executor.workers,
            executor.queued
        );
    }
}
