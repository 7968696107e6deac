//! [`WindowCache`]: read-only file windows mapped and registered on demand, kept for reuse
//! within a [`PinnedBudget`], the least recently used evicted first.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use super::budget::{Charge, PinnedBudget};
use super::window::{FileWindow, WindowedFile};
use super::{Buffer, Element, FileSpan, HostVisible, Region, Sealed};
use crate::backend::cpu::memory::page_size;
use crate::error::Result;

/// Read-only windows of one or more [`WindowedFile`]s, mapped and registered with the GPU on
/// first use and kept for the next, within a budget of page-locked bytes.
///
/// [`WindowCache::get`] returns the window of a file's byte range, mapping it if it is not
/// cached. A window is in use while a [`CachedWindow`] of it lives (on the CPU, or shared with
/// GPU work through a [`crate::Shared`] lease); windows not in use stay mapped until the budget
/// needs their bytes, and then the least recently used go first. Windows in use are never
/// evicted: when they alone fill the budget, `get` fails with [`crate::Error::BudgetExceeded`],
/// which names the locked-memory limit and the remedies.
///
/// The lock that orders the cache is held while a window is mapped and registered, so
/// threads asking at once for windows not cached take turns. A cached window holds its range
/// of the file for reading, in use or not: [`WindowCache::trim`] before asking the file for a
/// read-write window over it ([`WindowedFile::window_mut`]).
///
/// # Examples
/// ```
/// use hetmem::memory::{PinnedBudget, WindowCache, WindowedFile};
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("data.bin");
/// std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
/// let device = hetmem::Device::open_best()?;
/// // SAFETY: nothing else changes the file while its windows live.
/// let file = unsafe { WindowedFile::open(&device, &path) }?;
/// let cache = WindowCache::<u8>::new(PinnedBudget::new(256 << 10));
/// for chunk in 0..4u64 {
///     let window = cache.get(&file, chunk << 18..(chunk + 1) << 18)?; // evicts the previous
///     assert!(window.as_slice().iter().all(|&byte| byte == 7));
/// }
/// assert_eq!(cache.stats().evictions, 3);
/// # Ok::<(), hetmem::Error>(())
/// ```
#[derive(Debug)]
pub struct WindowCache<T> {
    budget: PinnedBudget,
    state: Mutex<CacheState<T>>,
}

#[derive(Debug)]
struct CacheState<T> {
    entries: Vec<Entry<T>>,
    /// Counts `get` calls: an entry's `last_use` is the count at its latest.
    clock: u64,
    stats: WindowCacheStats,
}

#[derive(Debug)]
struct Entry<T> {
    file: u64,
    range: Range<u64>,
    last_use: u64,
    cached: Arc<Cached<T>>,
}

impl<T> Entry<T> {
    fn in_use(&self) -> bool {
        Arc::strong_count(&self.cached) > 1
    }
}

/// A window and its charge on the budget, given back once it is unmapped.
#[derive(Debug)]
struct Cached<T> {
    window: FileWindow<T>,
    _charge: Charge,
}

/// What a [`WindowCache`] did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct WindowCacheStats {
    /// Windows found cached.
    pub hits: u64,
    /// Windows mapped and registered.
    pub misses: u64,
    /// Windows unmapped to make room.
    pub evictions: u64,
    /// Windows cached now.
    pub windows: usize,
    /// Bytes they lock.
    pub locked_bytes: u64,
}

impl<T: Element> WindowCache<T> {
    /// An empty cache that locks at most `budget` bytes (shared with whatever else charges the
    /// budget; see [`PinnedBudget::from_memlock`] for the usual one).
    pub fn new(budget: PinnedBudget) -> WindowCache<T> {
        WindowCache {
            budget,
            state: Mutex::new(CacheState {
                entries: Vec::new(),
                clock: 0,
                stats: WindowCacheStats::default(),
            }),
        }
    }

    /// The window of bytes `range` of `file`: the cached one, or a new one mapped and
    /// registered after evicting the least recently used windows not in use until it fits.
    ///
    /// # Errors
    /// [`crate::Error::BudgetExceeded`] when the windows in use leave too little of the budget;
    /// otherwise as for [`WindowedFile::window`].
    pub fn get(&self, file: &WindowedFile, range: Range<u64>) -> Result<CachedWindow<T>> {
        let mut state = self.state.lock().unwrap_or_else(|poison| poison.into_inner());
        state.clock += 1;
        let now = state.clock;
        if let Some(entry) =
            state.entries.iter_mut().find(|entry| entry.file == file.id() && entry.range == range)
        {
            entry.last_use = now;
            let cached = Arc::clone(&entry.cached);
            state.stats.hits += 1;
            return Ok(CachedWindow { cached });
        }
        let page = page_size() as u64;
        let locked = (range.end.saturating_sub(range.start) + range.start % page).div_ceil(page) * page;
        let charge = loop {
            match self.budget.charge(locked) {
                Ok(charge) => break charge,
                Err(refused) => {
                    let unused = state.entries.iter().enumerate().filter(|(_, entry)| !entry.in_use());
                    let Some((oldest, _)) = unused.min_by_key(|(_, entry)| entry.last_use) else {
                        return Err(refused);
                    };
                    // Unregisters and unmaps the window, then gives its bytes back.
                    drop(state.entries.swap_remove(oldest));
                    state.stats.evictions += 1;
                }
            }
        };
        let window = file.window::<T>(range.clone())?;
        debug_assert_eq!(window.locked_bytes() as u64, locked);
        let cached = Arc::new(Cached { window, _charge: charge });
        state.entries.push(Entry { file: file.id(), range, last_use: now, cached: Arc::clone(&cached) });
        state.stats.misses += 1;
        Ok(CachedWindow { cached })
    }

    /// Whether the window of bytes `range` of `file` is cached.
    pub fn contains(&self, file: &WindowedFile, range: &Range<u64>) -> bool {
        let state = self.state.lock().unwrap_or_else(|poison| poison.into_inner());
        state.entries.iter().any(|entry| entry.file == file.id() && entry.range == *range)
    }

    /// Unmaps every window not in use.
    pub fn trim(&self) {
        let mut state = self.state.lock().unwrap_or_else(|poison| poison.into_inner());
        let before = state.entries.len();
        state.entries.retain(Entry::in_use);
        state.stats.evictions += (before - state.entries.len()) as u64;
    }

    /// Hits, misses, evictions, and what is cached now.
    pub fn stats(&self) -> WindowCacheStats {
        let state = self.state.lock().unwrap_or_else(|poison| poison.into_inner());
        WindowCacheStats {
            windows: state.entries.len(),
            locked_bytes: state.entries.iter().map(|entry| entry.cached.window.locked_bytes() as u64).sum(),
            ..state.stats
        }
    }

    /// The budget the cache charges.
    pub fn budget(&self) -> &PinnedBudget {
        &self.budget
    }
}

/// A window handed out by a [`WindowCache`]: read-only, shared with GPU work through
/// [`crate::Queue::share`]. While it lives the cache keeps the window mapped; cloning it is
/// cheap and shares the window.
#[derive(Debug)]
pub struct CachedWindow<T> {
    cached: Arc<Cached<T>>,
}

impl<T> Clone for CachedWindow<T> {
    fn clone(&self) -> Self {
        CachedWindow { cached: Arc::clone(&self.cached) }
    }
}

impl<T: Element> CachedWindow<T> {
    /// The elements.
    pub fn as_slice(&self) -> &[T] {
        self.cached.window.as_slice()
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.cached.window.len()
    }

    /// Always false: windows hold at least one element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The window's bytes in the file.
    pub fn file_range(&self) -> Range<u64> {
        self.cached.window.file_range()
    }

    /// The address kernels use for the window's first element, when registered.
    pub fn device_ptr(&self) -> Option<u64> {
        self.cached.window.device_ptr()
    }
}

impl<T: Element> Sealed for CachedWindow<T> {
    fn region(&self) -> Region {
        // Clones share the mapping, so none of them owns its pages alone: no guard.
        Region { pages: None, ..self.cached.window.region() }
    }

    fn file_span(&self) -> Option<FileSpan<'_>> {
        self.cached.window.file_span()
    }
}

impl<T: Element> Buffer for CachedWindow<T> {
    type Elem = T;

    fn len(&self) -> usize {
        self.cached.window.len()
    }
}

impl<T: Element> HostVisible for CachedWindow<T> {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{BackendChoice, BackendKind, Device};
    use crate::error::{BudgetKind, Error};

    const WINDOW: u64 = 1 << 16;

    fn file_of(dir: &tempfile::TempDir, windows: u64) -> (WindowedFile, Vec<u8>) {
        let path = dir.path().join("data.bin");
        let seed = fastrand::u64(..);
        eprintln!("seed {seed:#x}");
        let mut rng = fastrand::Rng::with_seed(seed);
        let data: Vec<u8> = (0..windows * WINDOW).map(|_| rng.u8(..)).collect();
        std::fs::write(&path, &data).unwrap();
        let cpu = Device::open(BackendChoice::Only(BackendKind::Cpu)).unwrap();
        // SAFETY: the test owns the file and does not change it while mapped.
        (unsafe { WindowedFile::open(&cpu, &path) }.unwrap(), data)
    }

    fn range(index: u64) -> Range<u64> {
        index * WINDOW..(index + 1) * WINDOW
    }

    #[test]
    fn the_least_recently_used_window_not_in_use_is_evicted() {
        let dir = tempfile::tempdir().unwrap();
        let (file, data) = file_of(&dir, 8);
        let cache = WindowCache::<u8>::new(PinnedBudget::new(3 * WINDOW));
        for index in [0, 1, 2, 0] {
            let window = cache.get(&file, range(index)).unwrap();
            assert_eq!(window.as_slice(), &data[range(index).start as usize..range(index).end as usize]);
        }
        assert_eq!(
            cache.stats(),
            WindowCacheStats { hits: 1, misses: 3, evictions: 0, windows: 3, locked_bytes: 3 * WINDOW }
        );
        // 1 is now the least recently used.
        let _three = cache.get(&file, range(3)).unwrap();
        assert!(!cache.contains(&file, &range(1)));
        assert!(cache.contains(&file, &range(0)) && cache.contains(&file, &range(2)));
        let _four = cache.get(&file, range(4)).unwrap();
        assert!(!cache.contains(&file, &range(2)), "2 was used before 0");
        assert_eq!(cache.budget().in_use(), 3 * WINDOW);
        assert!(cache.budget().peak() <= cache.budget().limit());
        assert_eq!(file.live_windows(), 3, "evicted windows are unmapped");
    }

    #[test]
    fn windows_in_use_are_never_evicted_and_a_full_budget_names_memlock() {
        let dir = tempfile::tempdir().unwrap();
        let (file, data) = file_of(&dir, 4);
        let cache = WindowCache::<u8>::new(PinnedBudget::new(2 * WINDOW + 100));
        let oldest = cache.get(&file, range(0)).unwrap();
        drop(cache.get(&file, range(1)).unwrap());
        let newest = cache.get(&file, range(2)).unwrap();
        assert!(cache.contains(&file, &range(0)), "in use, though least recently used");
        assert!(!cache.contains(&file, &range(1)));
        let error = cache.get(&file, range(3)).unwrap_err();
        assert!(
            matches!(error, Error::BudgetExceeded { budget: BudgetKind::PinnedMemory, asked, in_use, .. }
                if asked == WINDOW && in_use == 2 * WINDOW),
            "{error}"
        );
        let text = error.to_string();
        assert!(
            text.contains("memlock") && text.contains("ulimit -l") && text.contains("smaller windows"),
            "{text}"
        );
        assert_eq!(oldest.as_slice(), &data[..WINDOW as usize], "the window in use is intact");
        drop(oldest);
        assert_eq!(cache.get(&file, range(3)).unwrap().as_slice(), &data[range(3).start as usize..]);
        drop(newest);
        cache.trim();
        assert_eq!((cache.stats().windows, cache.budget().in_use()), (0, 0));
    }

    #[test]
    fn an_unaligned_window_is_charged_its_whole_pages() {
        let dir = tempfile::tempdir().unwrap();
        let (file, data) = file_of(&dir, 2);
        let cache = WindowCache::<u8>::new(PinnedBudget::new(WINDOW));
        let window = cache.get(&file, 10..20).unwrap();
        assert_eq!(window.as_slice(), &data[10..20]);
        assert_eq!(cache.budget().in_use(), page_size() as u64);
        let window = cache.get(&file, page_size() as u64 - 1..page_size() as u64 + 1).unwrap();
        assert_eq!(window.as_slice(), &data[page_size() - 1..page_size() + 1]);
        assert_eq!(cache.budget().in_use(), 3 * page_size() as u64);
    }
}
