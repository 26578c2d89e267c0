//! The executor: compile cache plus a worker pool that runs XLA work off the
//! async (network) threads. No `unsafe` and no PJRT details here.
//!
//! Compile cache: keyed by the SHA-256 of (serialized compile options,
//! program bytes) and the program length; values are shared
//! `Arc<Executable>`s. SHA-256 rather than MD5, whose collisions can be made:
//! two such programs would share one executable.
//! Concurrent first compiles of the same program may both compile (the first
//! to finish wins the cache slot); that only costs time.
//!
//! The cache is bounded: beyond `max_cached` executables, the least recently
//! used ones that nobody else holds (their `Arc` is the cache's alone: every
//! owner freed it, or died) are evicted, and so destroyed, at the next compile.
//! An executable still held is never evicted, so the cache may exceed the bound
//! while its owners keep more than that many alive; a service compiling a new
//! program per input shape no longer grows without end.
//!
//! Worker pool: an elastic pool of std threads sharing one FIFO queue. It
//! keeps `max(2, cores)` threads alive and, whenever a job is queued while no
//! worker is idle, starts another thread, up to 256; extra threads exit after
//! 30 s without work. A run therefore never waits behind another run unless
//! `max_workers` runs are in flight at once: a 2-second program (or a host
//! callback blocked on the network) occupies one thread while 100 tiny runs
//! proceed on the others. Threads, not a fixed-size pool, because XLA
//! execution and host callbacks are blocking calls that cannot be preempted.
//!
//! Idle polling (optional, [`IdlePolling`]): a worker that has just finished a
//! job polls the queue for a short window before it waits on the condvar,
//! yielding the CPU between polls, while its owner allows it (one worker per
//! two CPUs at most). A job submitted meanwhile needs no wake-up: on a virtual
//! machine whose idle CPUs halt, that wake-up is much of what a tiny run costs
//! beyond its request and reply.

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::client::Client;
use super::error::XlaError;
use super::executable::{CompileOptions, Executable};

/// A unit of work for the pool.
pub type Job = Box<dyn FnOnce() + Send + 'static>;

/// Pool sizing.
#[derive(Debug, Clone)]
struct PoolConfig {
    /// Threads kept alive even when idle.
    core_workers: usize,
    /// Upper bound on threads.
    max_workers: usize,
    /// How long an extra (non-core) thread waits for work before exiting.
    idle_timeout: Duration,
    /// Whether, and how long, a worker polls the queue after a job.
    idle_polling: Option<IdlePolling>,
    /// Workers that may poll at once: one per two CPUs, at least one.
    max_pollers: usize,
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

/// Counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecutorStats {
    /// Programs actually compiled (cache misses that succeeded).
    pub compiles: u64,
    /// Compile requests served from the cache.
    pub cache_hits: u64,
    /// Compiles that failed.
    pub compile_errors: u64,
    /// Executables in the cache.
    pub cached: usize,
    /// Executables evicted from the cache (and destroyed) to keep it within its bound.
    pub evictions: u64,
    /// Worker threads alive.
    pub workers: usize,
    /// Jobs waiting for a worker.
    pub queued: usize,
}

type CacheKey = ([u8; 32], usize);

/// How many executables the cache keeps unless told otherwise.
pub const DEFAULT_MAX_CACHED: usize = 256;

/// The compile cache: executables by content, each with when it was last asked for.
#[derive(Default)]
struct Cache {
    entries: HashMap<CacheKey, (Arc<Executable>, u64)>,
    /// Advances on every lookup and insert: a larger stamp is a more recent use.
    clock: u64,
}

impl Cache {
    fn get(&mut self, key: &CacheKey) -> Option<Arc<Executable>> {
        self.clock += 1;
        let clock = self.clock;
        self.entries.get_mut(key).map(|(exe, used)| {
            *used = clock;
            exe.clone()
        })
    }

    /// Stores `exe` unless the key already has one (a concurrent compile won), and returns
    /// the cached one.
    fn insert(&mut self, key: CacheKey, exe: Arc<Executable>) -> Arc<Executable> {
        self.clock += 1;
        let clock = self.clock;
        let (cached, used) = self.entries.entry(key).or_insert((exe, clock));
        *used = clock;
        cached.clone()
    }

    /// Takes out the least recently used executables that only the cache holds, until at most
    /// `max` remain (or none is left to take); the caller drops them outside the lock.
    fn evict_beyond(&mut self, max: usize) -> Vec<Arc<Executable>> {
        let excess = self.entries.len().saturating_sub(max);
        if excess == 0 {
            return Vec::new();
        }
        let mut unheld: Vec<(u64, CacheKey)> = self
            .entries
            .iter()
            .filter(|(_, (exe, _))| Arc::strong_count(exe) == 1)
            .map(|(key, (_, used))| (*used, *key))
            .collect();
        unheld.sort_unstable();
        unheld
            .into_iter()
            .take(excess)
            .filter_map(|(_, key)| self.entries.remove(&key).map(|(exe, _)| exe))
            .collect()
    }
}

struct Inner {
    client: Client,
    cache: Mutex<Cache>,
    /// Executables the cache keeps beyond those still held (see the module's doc).
    max_cached: usize,
    evictions: AtomicU64,
    compiles: AtomicU64,
    cache_hits: AtomicU64,
    compile_errors: AtomicU64,
    pool: Arc<Pool>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.pool.shutdown();
    }
}

/// Compile cache + worker pool around one [`Client`]. Cheap to clone.
#[derive(Clone)]
pub struct Executor {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("stats", &self.stats())
            .finish()
    }
}

impl Executor {
    /// An executor for `client`, with its worker pool and a cache of
    /// [`DEFAULT_MAX_CACHED`] executables.
    pub fn new(client: Client) -> Executor {
        Executor::with_cache_bound(client, DEFAULT_MAX_CACHED)
    }

    /// An executor whose cache keeps at most `max_cached` executables that nobody holds.
    pub fn with_cache_bound(client: Client, max_cached: usize) -> Executor {
        Executor::with_config(client, max_cached, PoolConfig::default())
    }

    /// Like [`Executor::with_cache_bound`], with workers that poll the queue after each job
    /// (see the module's documentation); a zero window polls never.
    pub fn with_idle_polling(
        client: Client,
        max_cached: usize,
        idle_polling: IdlePolling,
    ) -> Executor {
        let idle_polling = (!idle_polling.window.is_zero()).then_some(idle_polling);
        let config = PoolConfig {
            idle_polling,
            ..PoolConfig::default()
        };
        Executor::with_config(client, max_cached, config)
    }

    fn with_config(client: Client, max_cached: usize, pool: PoolConfig) -> Executor {
        Executor {
            inner: Arc::new(Inner {
                client,
                cache: Mutex::new(Cache::default()),
                max_cached,
                evictions: AtomicU64::new(0),
                compiles: AtomicU64::new(0),
                cache_hits: AtomicU64::new(0),
                compile_errors: AtomicU64::new(0),
                pool: Pool::new(pool),
            }),
        }
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// Compiles (or fetches from the cache) a program with default options.
    /// Returns the executable and whether it came from the cache. Blocking: it
    /// belongs on the pool ([`Executor::submit`]).
    pub fn compile(&self, program: Vec<u8>) -> Result<(Arc<Executable>, bool), XlaError> {
        let options = CompileOptions::default();
        let opts = options.to_proto();
        let mut hasher = Sha256::new();
        hasher.update((opts.len() as u64).to_le_bytes());
        hasher.update(&opts);
        hasher.update(&program);
        let key: CacheKey = (hasher.finalize().into(), program.len());
        if let Some(exe) = self.lock_cache().get(&key) {
            self.inner.cache_hits.fetch_add(1, Ordering::Relaxed);
            return Ok((exe, true));
        }
        let compiled = self.inner.client.compile_with_options(&program, &options);
        let counter = match compiled {
            Ok(_) => &self.inner.compiles,
            Err(_) => &self.inner.compile_errors,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let exe = Arc::new(compiled?);
        let (exe, evicted) = {
            let mut cache = self.lock_cache();
            let exe = cache.insert(key, exe);
            (exe, cache.evict_beyond(self.inner.max_cached))
        };
        self.inner
            .evictions
            .fetch_add(evicted.len() as u64, Ordering::Relaxed);
        // Destroyed here, outside the lock: a PJRT call on this (executor) thread.
        drop(evicted);
        Ok((exe, false))
    }

    fn lock_cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.inner.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a job on the pool (never blocks).
    pub fn submit(&self, job: Job) {
        self.inner.pool.submit(job);
    }

    /// Current counters.
    pub fn stats(&self) -> ExecutorStats {
        let (workers, queued) = self.inner.pool.sizes();
        ExecutorStats {
            compiles: self.inner.compiles.load(Ordering::Relaxed),
            cache_hits: self.inner.cache_hits.load(Ordering::Relaxed),
            compile_errors: self.inner.compile_errors.load(Ordering::Relaxed),
            cached: self.lock_cache().entries.len(),
            evictions: self.inner.evictions.load(Ordering::Relaxed),
            workers,
            queued,
        }
    }
}

// ------------------------------- worker pool ---------------------------------

struct PoolState {
    queue: VecDeque<Job>,
    workers: usize,
    idle: usize,
    /// Workers polling the queue: a job they will take needs no wake-up.
    polling: usize,
    shutdown: bool,
}

struct Pool {
    /// Jobs in the queue, for polling workers to read without the lock.
    queued: AtomicUsize,
    state: Mutex<PoolState>,
    cv: Condvar,
    config: PoolConfig,
}

impl Pool {
    fn new(config: PoolConfig) -> Arc<Pool> {
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

    fn submit(self: &Arc<Self>, job: Job) {
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

    fn sizes(&self) -> (usize, usize) {
        let st = self.lock();
        (st.workers, st.queue.len())
    }

    fn shutdown(&self) {
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
