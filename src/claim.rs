//! A place among a bounded number, counted in an atomic: runs on runtime workers, threads polling
//! for callback replies. Claiming is one atomic add; dropping the claim gives the place back,
//! also when the holder panics.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A claimed place among at most `max` counted in `counter`.
pub(crate) struct Claim(Arc<AtomicUsize>);

impl Claim {
    /// Claims a place, or returns `None` when `max` are taken.
    pub(crate) fn new(counter: &Arc<AtomicUsize>, max: usize) -> Option<Claim> {
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
