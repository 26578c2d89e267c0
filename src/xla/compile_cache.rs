//! The executor's compile cache: executables by content, so that compiling the same program twice
//! costs one compile.
//!
//! Keyed by the SHA-256 of (serialized compile options, program bytes) and the program length;
//! values are shared `Arc<Executable>`s. SHA-256 rather than MD5, whose collisions can be made:
//! two such programs would share one executable. Concurrent first compiles of the same program may
//! both compile (the first to finish wins the cache slot); that only costs time.
//!
//! The cache is bounded: beyond `max_cached` executables, the least recently used ones that nobody
//! else holds (their `Arc` is the cache's alone: every owner freed it, or died) are evicted, and so
//! destroyed, at the next compile. An executable still held is never evicted, so the cache may
//! exceed the bound while its owners keep more than that many alive; a service compiling a new
//! program per input shape no longer grows without end.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use sha2::{Digest, Sha256};

use super::client::Client;
use super::error::XlaError;
use super::executable::{CompileOptions, Executable};

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

/// The cache and its counters.
pub(super) struct CompileCache {
    cache: Mutex<Cache>,
    /// Executables the cache keeps beyond those still held (see the module's doc).
    max_cached: usize,
    pub(super) evictions: AtomicU64,
    pub(super) compiles: AtomicU64,
    pub(super) cache_hits: AtomicU64,
    pub(super) compile_errors: AtomicU64,
}

impl CompileCache {
    pub(super) fn new(max_cached: usize) -> CompileCache {
        CompileCache {
            cache: Mutex::new(Cache::default()),
            max_cached,
            evictions: AtomicU64::new(0),
            compiles: AtomicU64::new(0),
            cache_hits: AtomicU64::new(0),
            compile_errors: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Executables in the cache.
    pub(super) fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Compiles (or fetches from the cache) a program with `options` on `client`.
    /// Returns the executable and whether it came from the cache. Blocking.
    pub(super) fn compile(
        &self,
        client: &Client,
        program: Vec<u8>,
        options: &CompileOptions,
    ) -> Result<(Arc<Executable>, bool), XlaError> {
        let opts = options.to_proto();
        let mut hasher = Sha256::new();
        hasher.update((opts.len() as u64).to_le_bytes());
        hasher.update(&opts);
        hasher.update(&program);
        let key: CacheKey = (hasher.finalize().into(), program.len());
        if let Some(exe) = self.lock().get(&key) {
            self.cache_hits.fetch_add(1, Ordering::Relaxed);
            return Ok((exe, true));
        }
        let compiled = client.compile_with_options(&program, options);
        let counter = match compiled {
            Ok(_) => &self.compiles,
            Err(_) => &self.compile_errors,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let exe = Arc::new(compiled?);
        let (exe, evicted) = {
            let mut cache = self.lock();
            let exe = cache.insert(key, exe);
            (exe, cache.evict_beyond(self.max_cached))
        };
        self.evictions
            .fetch_add(evicted.len() as u64, Ordering::Relaxed);
        // Destroyed here, outside the lock: a PJRT call on this (executor) thread.
        drop(evicted);
        Ok((exe, false))
    }
}
