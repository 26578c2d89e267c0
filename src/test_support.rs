//! Helpers for the crate's unit tests.

use std::time::{Duration, Instant};

/// Polls `condition` for up to 5 s: a thread's transitions need the scheduler's help.
pub fn eventually(condition: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}
