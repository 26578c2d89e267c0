//! A duration histogram recorded with atomics alone, so that the threads that time runs and
//! callbacks never wait on a lock, and read whole for `/metrics` (its buckets) and for `:info`
//! (its p50 and p99).
//!
//! Buckets are fixed and fine: 22 per decade from 1 µs to 1000 s, each at most 15% wider than
//! the one before, so a quantile read from them (interpolated within its bucket, as Prometheus'
//! `histogram_quantile` does) is close to the true one. `/metrics` shows the coarser buckets of
//! the usual 1-2.5-5 series, each a bound of the fine ones, so their counts are exact.
//! Recording is a binary search over the bounds and two relaxed `fetch_add`s.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The bounds of one decade, in tenths of its first.
const STEPS: [u64; 22] = [
    10, 11, 12, 13, 14, 15, 16, 18, 20, 22, 25, 28, 32, 36, 40, 45, 50, 56, 63, 71, 80, 90,
];

/// Decades covered from 1 µs: up to 1000 s.
const DECADES: usize = 9;

/// Finite bucket bounds; values above the last fall in a last, unbounded bucket.
const BOUNDS: usize = DECADES * STEPS.len() + 1;

/// Upper bounds (inclusive) of the buckets, in nanoseconds.
const BOUNDS_NS: [u64; BOUNDS] = bounds_ns();

const fn bounds_ns() -> [u64; BOUNDS] {
    let mut bounds = [0; BOUNDS];
    // 1 µs is 10 tenths of 100 ns.
    let mut scale = 100;
    let mut decade = 0;
    while decade < DECADES {
        let mut step = 0;
        while step < STEPS.len() {
            bounds[decade * STEPS.len() + step] = STEPS[step] * scale;
            step += 1;
        }
        scale *= 10;
        decade += 1;
    }
    bounds[BOUNDS - 1] = 10 * scale;
    bounds
}

/// Whether a bound is one that `/metrics` shows: 1, 2.5 or 5 times a power of ten, or the last.
fn exported(bound: usize) -> bool {
    bound == BOUNDS - 1 || matches!(STEPS[bound % STEPS.len()], 10 | 25 | 50)
}

/// Durations, counted per bucket, and their sum.
pub struct Histogram {
    counts: [AtomicU64; BOUNDS + 1],
    sum_ns: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
        }
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.snapshot();
        f.debug_struct("Histogram")
            .field("count", &s.count())
            .field("sum", &s.sum())
            .finish()
    }
}

impl Histogram {
    pub fn record(&self, duration: Duration) {
        let ns = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        let bucket = BOUNDS_NS.partition_point(|&bound| bound < ns);
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// The counts now. Records that happen meanwhile may be in the buckets and not yet in the
    /// sum, never the other way round in a way that matters: each figure only grows.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            counts: self
                .counts
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
            sum_ns: self.sum_ns.load(Ordering::Relaxed),
        }
    }
}

/// A histogram's counts at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Per fine bucket, the last one unbounded; empty for a default snapshot.
    counts: Vec<u64>,
    sum_ns: u64,
}

impl Snapshot {
    /// Durations recorded.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Their sum.
    pub fn sum(&self) -> Duration {
        Duration::from_nanos(self.sum_ns)
    }

    /// The `q`-quantile (0 to 1), interpolated linearly within its bucket; `None` before any
    /// record. A quantile in the unbounded bucket is reported as the last bound (1000 s).
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let count = self.count();
        if count == 0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * count as f64;
        let mut below = 0u64;
        for (bucket, &n) in self.counts.iter().enumerate() {
            if n > 0 && (below + n) as f64 >= rank {
                let Some(&upper) = BOUNDS_NS.get(bucket) else {
                    break;
                };
                let lower = bucket.checked_sub(1).map_or(0, |b| BOUNDS_NS[b]);
                let within = ((rank - below as f64) / n as f64).max(0.0);
                let ns = lower as f64 + (upper - lower) as f64 * within;
                return Some(Duration::from_nanos(ns.round() as u64));
            }
            below += n;
        }
        Some(Duration::from_nanos(BOUNDS_NS[BOUNDS - 1]))
    }

    /// The buckets `/metrics` shows: (upper bound in seconds, durations in that bucket and above
    /// the previous one shown), the last one's bound infinite.
    pub fn exported_buckets(&self) -> Vec<(f64, u64)> {
        let mut buckets = Vec::new();
        let mut pending = 0;
        for (bucket, &n) in self.counts.iter().enumerate() {
            pending += n;
            if bucket == BOUNDS {
                buckets.push((f64::INFINITY, pending));
            } else if exported(bucket) {
                buckets.push((BOUNDS_NS[bucket] as f64 / 1e9, pending));
                pending = 0;
            }
        }
        buckets
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn bounds_rise_by_at_most_15_percent() {
        assert_eq!(BOUNDS_NS[0], 1_000);
        assert_eq!(BOUNDS_NS[BOUNDS - 1], 1_000_000_000_000);
        for pair in BOUNDS_NS.windows(2) {
            assert!(pair[1] > pair[0]);
            assert!(pair[1] as f64 / pair[0] as f64 <= 1.15, "{pair:?}");
        }
    }

    #[test]
    fn a_duration_on_a_bound_counts_in_that_bucket() {
        let h = Histogram::default();
        h.record(us(1));
        h.record(Duration::from_nanos(1_001));
        h.record(Duration::from_secs(5_000));
        let s = h.snapshot();
        assert_eq!(s.count(), 3);
        let buckets = s.exported_buckets();
        assert_eq!(buckets[0], (1e-6, 1));
        assert_eq!(buckets[1], (2.5e-6, 1));
        assert_eq!(buckets.last(), Some(&(f64::INFINITY, 1)));
        assert_eq!(buckets.iter().map(|b| b.1).sum::<u64>(), 3);
    }

    #[test]
    fn exported_buckets_follow_the_1_2_5_series() {
        let bounds: Vec<f64> = Histogram::default()
            .snapshot()
            .exported_buckets()
            .iter()
            .map(|b| b.0)
            .collect();
        assert_eq!(&bounds[..4], &[1e-6, 2.5e-6, 5e-6, 1e-5]);
        assert_eq!(&bounds[bounds.len() - 3..], &[500.0, 1000.0, f64::INFINITY]);
    }

    #[test]
    fn quantiles_are_close_to_the_true_ones() {
        let h = Histogram::default();
        assert_eq!(h.snapshot().quantile(0.5), None);
        for n in 1..=1000 {
            h.record(us(n * 10));
        }
        let s = h.snapshot();
        assert_eq!(s.sum(), us(10 * 1000 * 1001 / 2));
        for (q, truth) in [(0.5, 5_000.0), (0.99, 9_900.0), (0.01, 100.0)] {
            let got = s.quantile(q).unwrap().as_secs_f64() * 1e6;
            assert!((got - truth).abs() / truth < 0.08, "q{q}: {got} vs {truth}");
        }
    }

    #[test]
    fn concurrent_records_are_all_counted() {
        let h = std::sync::Arc::new(Histogram::default());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let h = h.clone();
                std::thread::spawn(move || (0..10_000).for_each(|i| h.record(us(i % 97))))
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(h.snapshot().count(), 40_000);
    }
}
