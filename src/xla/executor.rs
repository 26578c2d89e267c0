//! The executor: a compile cache (`compile_cache.rs`) and a worker pool (`pool.rs`) around one
//! client, so that XLA work runs off the async (network) threads. No `unsafe` and no PJRT details
//! here.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::client::Client;
use super::compile_cache::CompileCache;
pub use super::compile_cache::DEFAULT_MAX_CACHED;
use super::error::XlaError;
use super::executable::{CompileOptions, Executable};
pub use super::pool::{IdlePolling, Job};
use super::pool::{Pool, PoolConfig};

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

struct Inner {
    client: Client,
    cache: CompileCache,
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
                cache: CompileCache::new(max_cached),
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
        self.compile_with(program, &CompileOptions::default())
    }

    /// [`Executor::compile`] with `options` (an SPMD program over several devices).
    pub fn compile_with(
        &self,
        program: Vec<u8>,
        options: &CompileOptions,
    ) -> Result<(Arc<Executable>, bool), XlaError> {
        self.inner
            .cache
            .compile(&self.inner.client, program, options)
    }

    /// Queues a job on the pool (never blocks).
    pub fn submit(&self, job: Job) {
        self.inner.pool.submit(job);
    }

    /// Current counters.
    pub fn stats(&self) -> ExecutorStats {
        let (workers, queued) = self.inner.pool.sizes();
        let cache = &self.inner.cache;
        ExecutorStats {
            compiles: cache.compiles.load(Ordering::Relaxed),
            cache_hits: cache.cache_hits.load(Ordering::Relaxed),
            compile_errors: cache.compile_errors.load(Ordering::Relaxed),
            cached: cache.len(),
            evictions: cache.evictions.load(Ordering::Relaxed),
            workers,
            queued,
        }
    }
}
