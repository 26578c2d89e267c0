//! The executor's worker pool: an elastic pool of std threads sharing one FIFO queue, which runs
//! XLA work off the async (network) threads.
//!
//! It keeps `max(2, cores)` threads alive and, whenever a job is queued while no worker is idle,
//! starts another thread, up to 256; extra threads exit after 30 s without work. A run therefore
//! never waits behind another run unless `max_workers` runs are in flight at once: a 2-second
//! program (or a host callback blocked on the network) occupies one thread while 100 tiny runs
//! proceed on the others. Threads, not a fixed-size pool, because XLA execution and host callbacks
//! are blocking calls that cannot be preempted. Which runs reach the queue, and when, is the
//! scheduler's decision (`crate::schedule`).
//!
//! Idle polling (optional, [`IdlePolling`]): a worker that has just finished a job polls the queue
//! for a short window before it waits on the condvar, yielding the CPU between polls, while its
//! owner allows it (one worker per two CPUs at most). A job submitted meanwhile needs no wake-up:
//! on a virtual machine whose idle CPUs halt, that wake-up is much of what a tiny run costs beyond
//! its request and reply.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// A unit of work for the pool.
pub type Job = Box<dyn FnOnce() + Send + 'static>;

/// Pool sizing.
#[derive(Debug, Clone)]
pub(super) struct PoolConfig {
    /// Threads kept alive even when idle.
    pub(super) core_workers: usize,
    /// Upper bound on threads.
    pub(super) max_workers: usize,
    /// How long an extra (non-core) thread waits for work before exiting.
    pub(super) idle_timeout: Duration,
    /// Whether, and how long, a worker polls the queue after a job.
    pub(super) idle_polling: Option<IdlePolling>,
    /// Workers that may poll at once: one per two CPUs, at least one.
    pub(super) max_pollers: usize,
}

/// How a worker that has just finished a job polls the queue: for `window`, while `allowed`
/// says so (asked before it starts and between polls).
#[derive(Clone)]
pub struct IdlePolling {
    pub window: Duration,
    pub allowed: Arc<dyn Fn() -> bool + Send + Sync>,
}

impl std::fmt::Debug for IdlePolling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdlePolling")
            .field("window", &self.window)
            .finish_non_exhaustive()
    }
}

impl Default for PoolConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2);
        PoolConfig {
            core_workers: cores.max(2),
            max_workers: 256,
            idle_timeout: Duration::from_secs(30),
            idle_polling: None,
            max_pollers: (cores / 2).max(1),
        }
    }
}

struct PoolState {
    queue: VecDeque<Job>,
    workers: usize,
    idle: usize,
    /// Workers polling the queue: a job they will take needs no wake-up.
    polling: usize,
    shutdown: bool,
}

/// The worker pool (see the module's documentation).
pub(super) struct Pool {
    /// Jobs in the queue, for polling workers to read without the lock.
    queued: AtomicUsize,
    state: Mutex<PoolState>,
    cv: Condvar,
    config: PoolConfig,
}

impl Pool {
    pub(super) fn new(config: PoolConfig) -> Arc<Pool> {
        let config = PoolConfig {
            core_workers: config.core_workers.max(1),
            max_workers: config.max_workers.max(config.core_workers.max(1)),
            ..config
        };
        Arc::new(Pool {
            queued: AtomicUsize::new(0),
            state: Mutex::new(PoolState {
                queue: VecDeque::new(),
                workers: 0,
                idle: 0,
                polling: 0,
                shutdown: false,
            }),
            cv: Condvar::new(),
            config,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a job (never blocks).
    pub(super) fn submit(self: &Arc<Self>, job: Job) {
        let mut st = self.lock();
        st.queue.push_back(job);
        self.queued.fetch_add(1, Ordering::SeqCst);
        // Every idle worker will take one queued job; start a thread for the
        // rest (bounded).
        let waiting = st.idle + st.polling;
        if waiting < st.queue.len() && st.workers < self.config.max_workers {
            st.workers += 1;
            let pool = Arc::clone(self);
            let spawned = std::thread::Builder::new()
                .name("xla-worker".into())
                .spawn(move || pool.worker());
            if let Err(e) = spawned {
                st.workers -= 1;
                tracing::error!("cannot start XLA worker thread: {e}");
            }
        }
        // A polling worker takes the job without being woken; checked under the lock that
        // it takes to stop polling, so no job is left unseen.
        let wake = st.queue.len() > st.polling;
        drop(st);
        if wake {
            self.cv.notify_one();
        }
    }

    fn worker(self: Arc<Self>) {
        let mut just_worked = false;
        loop {
            let job = {
                let mut st = self.lock();
                loop {
                    if let Some(j) = st.queue.pop_front() {
                        self.queued.fetch_sub(1, Ordering::SeqCst);
                        break j;
                    }
                    if st.shutdown {
                        st.workers -= 1;
                        return;
                    }
                    let poll = self.config.idle_polling.as_ref().filter(|polling| {
                        std::mem::take(&mut just_worked)
                            && st.polling < self.config.max_pollers
                            && (polling.allowed)()
                    });
                    if let Some(polling) = poll {
                        st.polling += 1;
                        drop(st);
                        self.poll(polling);
                        st = self.lock();
                        st.polling -= 1;
                        continue;
                    }
                    st.idle += 1;
                    let (g, timeout) = self
                        .cv
                        .wait_timeout(st, self.config.idle_timeout)
                        .unwrap_or_else(|p| p.into_inner());
                    st = g;
                    st.idle -= 1;
                    if timeout.timed_out()
                        && st.queue.is_empty()
                        && st.workers > self.config.core_workers
                    {
                        st.workers -= 1;
                        return;
                    }
                }
            };
            if catch_unwind(AssertUnwindSafe(job)).is_err() {
                tracing::error!("XLA worker job panicked");
            }
            just_worked = true;
        }
    }

    /// Polls for a queued job for the window, yielding the CPU between polls; stops early when
    /// polling is no longer allowed.
    fn poll(&self, polling: &IdlePolling) {
        let until = std::time::Instant::now() + polling.window;
        while self.queued.load(Ordering::SeqCst) == 0
            && (polling.allowed)()
            && std::time::Instant::now() < until
        {
            std::thread::yield_now();
        }
    }

    /// (worker threads alive, jobs waiting for one).
    pub(super) fn sizes(&self) -> (usize, usize) {
        let st = self.lock();
        (st.workers, st.queue.len())
    }

    pub(super) fn shutdown(&self) {
        self.lock().shutdown = true;
        self.cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::eventually;
    use std::sync::atomic::AtomicBool;
    use std::sync::mpsc;

    fn polling_pool(allowed: &Arc<AtomicBool>, window: Duration) -> Arc<Pool> {
        let allowed = allowed.clone();
        Pool::new(PoolConfig {
            core_workers: 2,
            max_workers: 4,
            idle_timeout: Duration::from_secs(30),
            idle_polling: Some(IdlePolling {
                window,
                allowed: Arc::new(move || allowed.load(Ordering::SeqCst)),
            }),
            max_pollers: 1,
        })
    }

    #[test]
    fn jobs_submitted_while_a_worker_polls_all_run() {
        let allowed = Arc::new(AtomicBool::new(true));
        let pool = polling_pool(&allowed, Duration::from_secs(2));
        let (done, finished) = mpsc::channel();
        let first = done.clone();
        pool.submit(Box::new(move || first.send(0).unwrap()));
        finished.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(eventually(|| pool.lock().polling == 1), "no worker polls");
        // More jobs at once than pollers: the rest must wake (or start) other workers.
        for i in 1..=5 {
            let done = done.clone();
            pool.submit(Box::new(move || {
                std::thread::sleep(Duration::from_millis(20));
                done.send(i).unwrap();
            }));
        }
        let mut got: Vec<i32> = (1..=5)
            .map(|_| finished.recv_timeout(Duration::from_secs(5)).unwrap())
            .collect();
        got.sort();
        assert_eq!(got, vec![1, 2, 3, 4, 5]);
        allowed.store(false, Ordering::SeqCst);
        pool.shutdown();
    }

    #[test]
    fn workers_poll_only_while_allowed() {
        let allowed = Arc::new(AtomicBool::new(true));
        let pool = polling_pool(&allowed, Duration::from_secs(2));
        let (done, finished) = mpsc::channel();
        let first = done.clone();
        pool.submit(Box::new(move || first.send(()).unwrap()));
        finished.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(eventually(|| pool.lock().polling == 1));
        allowed.store(false, Ordering::SeqCst);
        assert!(eventually(|| pool.lock().polling == 0), "still polling");
        pool.submit(Box::new(move || done.send(()).unwrap()));
        finished.recv_timeout(Duration::from_secs(5)).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(pool.lock().polling, 0, "polled while not allowed");
        pool.shutdown();
    }
}
