//! A pool of pinned host memory.
//!
//! Pinning is slow (`cuMemHostAlloc` takes about 0.65 s per GiB on the H200 machine), so
//! real-time code pins once and reuses. The pool keeps released blocks by size class and pin
//! options and hands them out again without touching the driver; a byte budget bounds what it
//! pins, evicting the least recently released blocks first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use super::Element;
use super::host::{HostStorage, pin_bytes};
use super::{HostBuf, PinOptions};
use crate::backend::Device;
use crate::backend::cpu::memory::byte_len;
use crate::error::{Error, Result};

/// What the pool has done and holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PoolStats {
    /// Acquisitions served from cached blocks.
    pub hits: u64,
    /// Acquisitions that pinned new memory.
    pub misses: u64,
    /// Cached blocks freed to stay within the budget.
    pub evictions: u64,
    /// Bytes pinned by the pool now: in use plus cached.
    pub bytes_pinned: usize,
    /// Bytes in buffers handed out and not yet returned.
    pub bytes_in_use: usize,
    /// Blocks cached for reuse.
    pub blocks_cached: usize,
}

/// A pool of pinned host memory for one device. Cheap to clone; clones share the pool.
///
/// # Examples
/// ```
/// use hetmem::{Device, PinOptions, memory::PinnedPool};
/// let device = Device::open_best()?;
/// let pool = PinnedPool::new(&device, 256 << 20);
/// let frame = pool.acquire::<u8>(1920 * 1080 * 3, PinOptions::default())?;
/// drop(frame); // back to the pool, still pinned
/// let again = pool.acquire::<u8>(1920 * 1080 * 3, PinOptions::default())?;
/// assert_eq!(pool.stats().hits, 1);
/// # Ok::<(), hetmem::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct PinnedPool {
    inner: Arc<PoolInner>,
}

#[derive(Debug)]
struct PoolInner {
    device: Device,
    budget: usize,
    state: Mutex<PoolState>,
}

type PoolKey = (PinOptions, usize);

#[derive(Debug, Default)]
struct PoolState {
    free: HashMap<PoolKey, Vec<Block>>,
    stats: PoolStats,
    clock: u64,
}

struct Block {
    storage: HostStorage,
    bytes: usize,
    released_at: u64,
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Block").field("bytes", &self.bytes).finish_non_exhaustive()
    }
}

/// The size class of a request: powers of two up to 1 MiB (at least 64 KiB), then quarter
/// steps between powers of two, so no block wastes more than a quarter of itself.
fn size_class(bytes: usize) -> usize {
    const MIN: usize = 64 << 10;
    if bytes <= 1 << 20 {
        return bytes.next_power_of_two().max(MIN);
    }
    let power = 1usize << (usize::BITS - 1 - bytes.leading_zeros());
    let step = power / 4;
    bytes.div_ceil(step) * step
}

impl PinnedPool {
    /// A pool for `device` that pins at most `budget_bytes`.
    pub fn new(device: &Device, budget_bytes: usize) -> PinnedPool {
        PinnedPool {
            inner: Arc::new(PoolInner {
                device: device.clone(),
                budget: budget_bytes,
                state: Mutex::new(PoolState::default()),
            }),
        }
    }

    /// A pinned buffer of `len` elements. A reused block keeps its earlier contents (any bit
    /// pattern is a valid `T`); fresh memory is zeroed.
    ///
    /// # Errors
    /// Zero length, size overflow, the budget exhausted by buffers in use, or the driver
    /// failing to pin.
    pub fn acquire<T: Element>(&self, len: usize, options: PinOptions) -> Result<HostBuf<T>> {
        let bytes = byte_len::<T>("pooled buffer length", len)?;
        let class = size_class(bytes);
        let key = (options, class);
        let ordinal = self.inner.device.gpu_ordinal();
        let mut evicted = Vec::new();
        {
            let mut state = self.lock();
            if let Some(block) = state.free.get_mut(&key).and_then(Vec::pop) {
                state.stats.hits += 1;
                state.stats.bytes_in_use += class;
                state.stats.blocks_cached -= 1;
                drop(state);
                return Ok(self.wrap(block.storage, key, len, ordinal));
            }
            state.stats.misses += 1;
            while state.stats.bytes_pinned + class > self.inner.budget {
                let Some(block) = state.evict_oldest() else { break };
                evicted.push(block);
            }
            if state.stats.bytes_pinned + class > self.inner.budget {
                return Err(Error::PoolExhausted {
                    requested: class,
                    in_use: state.stats.bytes_in_use,
                    budget: self.inner.budget,
                });
            }
            state.stats.bytes_pinned += class;
            state.stats.bytes_in_use += class;
        }
        // Freeing and pinning take milliseconds: both happen outside the lock.
        drop(evicted);
        match pin_bytes(&self.inner.device, class, &options) {
            Ok(storage) => Ok(self.wrap(storage, key, len, ordinal)),
            Err(error) => {
                let mut state = self.lock();
                state.stats.bytes_pinned -= class;
                state.stats.bytes_in_use -= class;
                Err(error)
            }
        }
    }

    /// What the pool has done and holds.
    pub fn stats(&self) -> PoolStats {
        self.lock().stats
    }

    /// Frees every cached block; buffers in use are untouched.
    pub fn trim(&self) {
        let blocks: Vec<Block> = {
            let mut state = self.lock();
            let blocks: Vec<Block> = state.free.drain().flat_map(|(_, blocks)| blocks).collect();
            state.stats.bytes_pinned -= blocks.iter().map(|block| block.bytes).sum::<usize>();
            state.stats.blocks_cached = 0;
            blocks
        };
        drop(blocks);
    }

    fn wrap<T: Element>(
        &self,
        storage: HostStorage,
        key: PoolKey,
        len: usize,
        ordinal: Option<usize>,
    ) -> HostBuf<T> {
        let block = Block { storage, bytes: key.1, released_at: 0 };
        let returned = PoolReturn { block: Some(block), key, pool: Arc::downgrade(&self.inner) };
        HostBuf::from_storage(HostStorage::Pooled(Box::new(returned)), len, ordinal)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.inner.state.lock().unwrap_or_else(|poison| poison.into_inner())
    }
}

impl PoolState {
    fn evict_oldest(&mut self) -> Option<Block> {
        let key = *self
            .free
            .iter()
            .filter_map(|(key, blocks)| blocks.first().map(|block| (key, block.released_at)))
            .min_by_key(|&(_, released_at)| released_at)?
            .0;
        let blocks = self.free.get_mut(&key)?;
        let block = blocks.remove(0);
        if blocks.is_empty() {
            self.free.remove(&key);
        }
        self.stats.evictions += 1;
        self.stats.blocks_cached -= 1;
        self.stats.bytes_pinned -= block.bytes;
        Some(block)
    }
}

/// The pool's claim on a handed-out block: returns it on drop, or frees it if the pool is gone.
pub(crate) struct PoolReturn {
    block: Option<Block>,
    key: PoolKey,
    pool: Weak<PoolInner>,
}

impl PoolReturn {
    pub(crate) fn storage(&self) -> &HostStorage {
        &self.block.as_ref().expect("a pool block is present until drop").storage
    }
}

impl Drop for PoolReturn {
    fn drop(&mut self) {
        let Some(mut block) = self.block.take() else { return };
        let Some(pool) = self.pool.upgrade() else { return };
        let mut state = pool.state.lock().unwrap_or_else(|poison| poison.into_inner());
        state.clock += 1;
        block.released_at = state.clock;
        state.stats.bytes_in_use -= block.bytes;
        state.stats.blocks_cached += 1;
        state.free.entry(self.key).or_default().push(block);
    }
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        // Blocks still handed out are freed by their buffers (their Weak no longer upgrades).
        let state = self.state.get_mut().unwrap_or_else(|poison| poison.into_inner());
        state.free.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{BackendChoice, BackendKind};

    fn cpu_pool(budget: usize) -> PinnedPool {
        PinnedPool::new(&Device::open(BackendChoice::Only(BackendKind::Cpu)).unwrap(), budget)
    }

    #[test]
    fn size_classes_cover_the_request_with_little_waste() {
        assert_eq!(size_class(1), 64 << 10);
        assert_eq!(size_class(100 << 10), 128 << 10);
        assert_eq!(size_class(1 << 20), 1 << 20);
        let frame = 1920 * 1080 * 3;
        let class = size_class(frame);
        assert!(class >= frame && (class - frame) * 4 <= class, "{class}");
        for bytes in [(1 << 20) + 1, 5 << 20, (1 << 30) - 1, 3 << 30] {
            let class = size_class(bytes);
            assert!(class >= bytes && (class - bytes) * 4 <= class, "{bytes} -> {class}");
        }
    }

    #[test]
    fn released_buffers_are_reused_and_accounted() {
        let pool = cpu_pool(64 << 20);
        let mut first = pool.acquire::<u32>(1000, PinOptions::default()).unwrap();
        first.as_mut_slice()[0] = 42;
        let stats = pool.stats();
        assert_eq!(
            (stats.hits, stats.misses, stats.bytes_in_use, stats.bytes_pinned),
            (0, 1, 64 << 10, 64 << 10)
        );
        drop(first);
        assert_eq!(pool.stats().bytes_in_use, 0);
        assert_eq!(pool.stats().blocks_cached, 1);
        let again = pool.acquire::<u32>(900, PinOptions::default()).unwrap();
        assert_eq!(again.as_slice()[0], 42, "the same block comes back");
        assert_eq!(pool.stats().hits, 1);
        // Other pin options never share blocks.
        let portable = PinOptions { portable: true, ..PinOptions::default() };
        let other = pool.acquire::<u32>(900, portable).unwrap();
        assert_eq!(pool.stats().misses, 2);
        drop((again, other));
        pool.trim();
        let stats = pool.stats();
        assert_eq!((stats.bytes_in_use, stats.bytes_pinned, stats.blocks_cached), (0, 0, 0));
    }

    #[test]
    fn the_budget_evicts_cached_blocks_then_refuses() {
        let pool = cpu_pool(2 << 20);
        let a = pool.acquire::<u8>(1 << 20, PinOptions::default()).unwrap();
        let b = pool.acquire::<u8>(512 << 10, PinOptions::default()).unwrap();
        drop(a);
        // 1 MiB cached + 512 KiB in use; a new 1.25 MiB class must evict the cached block.
        let c = pool.acquire::<u8>((1 << 20) + 1, PinOptions::default()).unwrap();
        assert_eq!(pool.stats().evictions, 1);
        let refused = pool.acquire::<u8>(1 << 20, PinOptions::default()).unwrap_err();
        assert!(matches!(refused, Error::PoolExhausted { .. }), "{refused}");
        assert!(refused.to_string().contains("raise the budget"), "{refused}");
        drop((b, c));
        assert_eq!(pool.stats().bytes_in_use, 0);
    }

    #[test]
    fn buffers_outliving_their_pool_free_themselves() {
        let pool = cpu_pool(1 << 20);
        let mut buf = pool.acquire::<u64>(10, PinOptions::default()).unwrap();
        drop(pool);
        buf.as_mut_slice()[9] = 1;
        assert_eq!(buf.as_slice()[9], 1);
    }
}
