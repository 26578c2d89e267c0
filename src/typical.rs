//! A typical duration: a moving average over recent measurements, shared between threads without
//! a lock, so that one measurement slowed down by a busy machine does not flip a decision taken
//! on it (whether a run executes inline, whether to poll for a callback's reply).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Microseconds; `u64::MAX` before the first measurement.
pub(crate) struct Typical(AtomicU64);

impl Typical {
    pub(crate) fn new() -> Typical {
        Typical(AtomicU64::new(u64::MAX))
    }

    /// The average so far; `None` before the first measurement.
    pub(crate) fn get(&self) -> Option<Duration> {
        match self.0.load(Ordering::Relaxed) {
            u64::MAX => None,
            us => Some(Duration::from_micros(us)),
        }
    }

    /// Folds one measurement into the average (weight 1/8). Concurrent updates may lose one,
    /// which only makes the average a little less smooth.
    pub(crate) fn record(&self, took: Duration) {
        let took = took.as_micros().min(u128::from(u64::MAX - 1)) as u64;
        let typical = match self.0.load(Ordering::Relaxed) {
            u64::MAX => took,
            old => old - old / 8 + took / 8,
        };
        self.0.store(typical, Ordering::Relaxed);
    }
}
