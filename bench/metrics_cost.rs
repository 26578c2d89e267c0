//! What the metrics cost a run, without the network: `cargo run --release --example
//! metrics_cost`. Times what the node adds to each run to count and time it (three clock reads,
//! two histogram records, five relaxed counter increments: the run's outcome, and a message and
//! its bytes each way), on one thread and on two at once sharing the same counters, to set
//! against the tiny run's round trip that `bench/run.sh metrics` measures.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use xla_node::metrics::Histogram;

/// The counters one run touches.
#[derive(Default)]
struct Counters {
    queue_wait: Histogram,
    duration: Histogram,
    tallies: [AtomicU64; 5],
}

/// What the node does for one run's metrics.
fn one_run(c: &Counters, received: Instant) {
    let started = Instant::now();
    c.queue_wait.record(started - received);
    c.duration.record(started.elapsed());
    for t in &c.tallies {
        t.fetch_add(1, Ordering::Relaxed);
    }
}

/// Nanoseconds per call of `f`, the median of 21 rounds of `n`.
fn per_call(n: u32, mut f: impl FnMut()) -> f64 {
    let mut rounds: Vec<f64> = (0..21)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..n {
                f();
            }
            t.elapsed().as_nanos() as f64 / n as f64
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[10]
}

fn main() {
    let n = 200_000;
    let c = Arc::new(Counters::default());
    let clock = per_call(n, || {
        std::hint::black_box(Instant::now());
    });
    let record = per_call(n, || {
        c.duration
            .record(std::hint::black_box(Duration::from_micros(42)))
    });
    let run = per_call(n, || one_run(&c, Instant::now()));
    // Two threads recording into the same counters, as two executor threads would.
    let other = {
        let c = c.clone();
        std::thread::spawn(move || per_call(n, || one_run(&c, Instant::now())))
    };
    let contended = per_call(n, || one_run(&c, Instant::now()));
    let contended = (contended + other.join().unwrap()) / 2.0;
    println!("clock read:                        {clock:.1} ns");
    println!("histogram record:                  {record:.1} ns");
    println!("a run's metrics, one thread:       {run:.1} ns");
    println!("a run's metrics, two threads:      {contended:.1} ns");
    println!(
        "counted: {} runs, p50 of their recorded durations {:?}",
        c.duration.snapshot().count(),
        c.duration.snapshot().quantile(0.5).unwrap_or_default()
    );
}
