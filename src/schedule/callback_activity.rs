//! Whether runs that call back execute now or did lately: what decides if idle executor threads
//! may poll for their next job (see [`CallbackActivity`]).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long after the last run that called back idle executor threads may poll again.
const CALLBACK_QUIET: Duration = Duration::from_millis(10);

/// Whether runs of programs that call back are executing, or did lately: idle executor threads
/// poll for their next job (`xla::executor`'s idle polling) only when none has for
/// `CALLBACK_QUIET`. Polling makes a tiny run faster but a run that calls back slower (its
/// waiting thread's wake-up and the network both slow down on a small machine), even with the
/// polling stopped while a callback waits; figures in docs/performance.md.
#[derive(Debug)]
pub struct CallbackActivity {
    epoch: Instant,
    running: AtomicUsize,
    /// When the last one ended, in nanoseconds after `epoch`.
    last_end: AtomicU64,
}

impl Default for CallbackActivity {
    fn default() -> Self {
        CallbackActivity {
            epoch: Instant::now(),
            running: AtomicUsize::new(0),
            last_end: AtomicU64::new(0),
        }
    }
}

impl CallbackActivity {
    /// True when no run that calls back executes and none ended within `CALLBACK_QUIET`
    /// (nor ever, for a node that has run none).
    pub fn quiet(&self) -> bool {
        if self.running.load(Ordering::Relaxed) > 0 {
            return false;
        }
        let last = self.last_end.load(Ordering::Relaxed);
        last == 0 || self.now().saturating_sub(last) >= CALLBACK_QUIET.as_nanos() as u64
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    pub(super) fn started(&self) {
        self.running.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn ended(&self) {
        self.last_end.store(self.now().max(1), Ordering::Relaxed);
        self.running.fetch_sub(1, Ordering::Relaxed);
    }
}
