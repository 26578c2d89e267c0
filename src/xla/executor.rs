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
//! Worker pool: an elastic pool of std threads sharing one FIFO queue. It
//! keeps `core_workers` (default `max(2, cores)`) threads alive and, whenever
//! a job is queued while no worker is idle, starts another thread, up to
//! `max_workers` (default 256); extra threads exit after `idle_timeout`
//! without work. A run therefore never waits behind another run unless
//! `max_workers` runs are in flight at once: a 2-second program (or a host
//! callback blocked on the network) occupies one thread while 100 tiny runs
//! proceed on the others. Threads, not a fixed-size pool, because XLA
//! execution and host callbacks are blocking calls that cannot be preempted.

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::oneshot;

use super::client::Client;
use super::error::XlaError;
use super::executable::{CompileOptions, Executable, HostTensor};

/// A unit of work for the pool.
pub type Job = Box<dyn FnOnce() + Send + 'static>;

/// Pool sizing.
#[derive(Debug, Clone)]
pub struct ExecutorConfig {
    /// Threads kept alive even when idle.
    pub core_workers: usize,
    /// Upper bound on threads.
    pub max_workers: usize,
    /// How long an extra (non-core) thread waits for work before exiting.
    pub idle_timeout: Duration,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2);
        ExecutorConfig {
            core_workers: cores.max(2),
            max_workers: 256,
            idle_timeout: Duration::from_secs(30),
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
    /// Compile requests that failed.
    pub compile_errors: u64,
    /// Runs started through [`Executor::run`] / [`Executor::run_blocking`].
    pub runs: u64,
    /// Runs that returned an error.
    pub run_errors: u64,
    /// Executables in the cache.
    pub cached: usize,
    /// Worker threads alive.
    pub workers: usize,
    /// Jobs waiting for a worker.
    pub queued: usize,
}

type CacheKey = ([u8; 32], usize);

struct Inner {
    client: Client,
    cache: Mutex<HashMap<CacheKey, Arc<Executable>>>,
    compiles: AtomicU64,
    cache_hits: AtomicU64,
    compile_errors: AtomicU64,
    runs: AtomicU64,
    run_errors: AtomicU64,
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
    /// Creates an executor with the default pool configuration.
    pub fn new(client: Client) -> Executor {
        Executor::with_config(client, ExecutorConfig::default())
    }

    /// Creates an executor with an explicit pool configuration.
    pub fn with_config(client: Client, config: ExecutorConfig) -> Executor {
        let pool = Pool::new(config);
        Executor {
            inner: Arc::new(Inner {
                client,
                cache: Mutex::new(HashMap::new()),
                compiles: AtomicU64::new(0),
                cache_hits: AtomicU64::new(0),
                compile_errors: AtomicU64::new(0),
                runs: AtomicU64::new(0),
                run_errors: AtomicU64::new(0),
                pool,
            }),
        }
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// Compiles (or fetches from the cache) a program with default options.
    /// Returns the executable and whether it came from the cache. Blocking:
    /// from async code use [`Executor::compile_async`].
    pub fn compile(&self, program: Vec<u8>) -> Result<(Arc<Executable>, bool), XlaError> {
        self.compile_with_options(program, &CompileOptions::default())
    }

    /// Like [`Executor::compile`] with explicit options (part of the key).
    pub fn compile_with_options(
        &self,
        program: Vec<u8>,
        options: &CompileOptions,
    ) -> Result<(Arc<Executable>, bool), XlaError> {
        let opts = options.to_proto();
        let mut hasher = Sha256::new();
        hasher.update((opts.len() as u64).to_le_bytes());
        hasher.update(&opts);
        hasher.update(&program);
        let key: CacheKey = (hasher.finalize().into(), program.len());
        if let Some(exe) = self.lock_cache().get(&key) {
            self.inner.cache_hits.fetch_add(1, Ordering::Relaxed);
            return Ok((exe.clone(), true));
        }
        let exe = match self.inner.client.compile_with_options(&program, options) {
            Ok(e) => Arc::new(e),
            Err(e) => {
                self.inner.compile_errors.fetch_add(1, Ordering::Relaxed);
                return Err(e);
            }
        };
        self.inner.compiles.fetch_add(1, Ordering::Relaxed);
        let mut cache = self.lock_cache();
        let exe = cache.entry(key).or_insert(exe).clone();
        Ok((exe, false))
    }

    /// Compiles on the pool; the receiver yields the result.
    pub fn compile_async(
        &self,
        program: Vec<u8>,
    ) -> oneshot::Receiver<Result<(Arc<Executable>, bool), XlaError>> {
        let this = self.clone();
        self.spawn(move || this.compile(program))
    }

    fn lock_cache(&self) -> std::sync::MutexGuard<'_, HashMap<CacheKey, Arc<Executable>>> {
        self.inner.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drops all cached executables.
    pub fn clear_cache(&self) {
        self.lock_cache().clear();
    }

    /// Queues a job on the pool (never blocks).
    pub fn submit(&self, job: Job) {
        self.inner.pool.submit(job);
    }

    /// Runs `f` on the pool; the receiver yields its result (or is closed if
    /// `f` panicked).
    pub fn spawn<R, F>(&self, f: F) -> oneshot::Receiver<R>
    where
        R: Send + 'static,
        F: FnOnce() -> R + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        self.submit(Box::new(move || {
            let _ = tx.send(f());
        }));
        rx
    }

    /// Uploads `inputs`, runs `exe`, downloads the results; on the pool.
    pub fn run(
        &self,
        exe: Arc<Executable>,
        inputs: Vec<HostTensor>,
    ) -> oneshot::Receiver<Result<Vec<HostTensor>, XlaError>> {
        let this = self.clone();
        self.spawn(move || this.run_blocking(&exe, &inputs))
    }

    /// Same as [`Executor::run`] on the calling thread.
    pub fn run_blocking(
        &self,
        exe: &Executable,
        inputs: &[HostTensor],
    ) -> Result<Vec<HostTensor>, XlaError> {
        self.inner.runs.fetch_add(1, Ordering::Relaxed);
        let r = exe.execute_host(inputs);
        if r.is_err() {
            self.inner.run_errors.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// Current counters.
    pub fn stats(&self) -> ExecutorStats {
        let (workers, queued) = self.inner.pool.sizes();
        ExecutorStats {
            compiles: self.inner.compiles.load(Ordering::Relaxed),
            cache_hits: self.inner.cache_hits.load(Ordering::Relaxed),
            compile_errors: self.inner.compile_errors.load(Ordering::Relaxed),
            runs: self.inner.runs.load(Ordering::Relaxed),
            run_errors: self.inner.run_errors.load(Ordering::Relaxed),
            cached: self.lock_cache().len(),
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
    shutdown: bool,
}

struct Pool {
    state: Mutex<PoolState>,
    cv: Condvar,
    config: ExecutorConfig,
}

impl Pool {
    fn new(config: ExecutorConfig) -> Arc<Pool> {
        let config = ExecutorConfig {
            core_workers: config.core_workers.max(1),
            max_workers: config.max_workers.max(config.core_workers.max(1)),
            idle_timeout: config.idle_timeout,
        };
        Arc::new(Pool {
            state: Mutex::new(PoolState {
                queue: VecDeque::new(),
                workers: 0,
                idle: 0,
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
        // Every idle worker will take one queued job; start a thread for the
        // rest (bounded).
        if st.idle < st.queue.len() && st.workers < self.config.max_workers {
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
        drop(st);
        self.cv.notify_one();
    }

    fn worker(self: Arc<Self>) {
        loop {
            let job = {
                let mut st = self.lock();
                loop {
                    if let Some(j) = st.queue.pop_front() {
                        break j;
                    }
                    if st.shutdown {
                        st.workers -= 1;
                        return;
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
