//! The CPU backend's memory: page-aligned heap slices, which a GPU can also register whole,
//! and which can be guarded.

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use rustix::mm::{Advice, MapFlags, ProtFlags};

use bytemuck::Pod;

use crate::backend::error::{BackendError, Result};

/// The transparent-huge-page size on x86-64 and most Arm kernels.
pub const HUGE_PAGE_BYTES: usize = 2 << 20;

/// The base page size.
pub fn page_size() -> usize {
    rustix::param::page_size()
}

/// The machine's physical memory in bytes (`sysconf(_SC_PHYS_PAGES)` pages), or None where the
/// system does not say.
pub(crate) fn physical_memory_bytes() -> Option<u64> {
    // SAFETY: sysconf reads a system constant; it has no memory effects.
    let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) };
    u64::try_from(pages).ok().filter(|&pages| pages > 0)?.checked_mul(page_size() as u64)
}

/// Refuses to pin more bytes than the machine has: pinned pages cannot be swapped, so such a
/// request can only fail, and the driver takes minutes to find that out (a 256 GiB request
/// on the H200 machine's 128 GiB ran past a minute).
pub(crate) fn check_pinnable(what: &'static str, bytes: usize) -> Result<()> {
    check_within_memory(what, bytes, "to pin", "pinned pages cannot be swapped")
}

/// Refuses `bytes` of memory that is written in full at once (zeroed frame memory) beyond the
/// machine's memory: `why` says why it cannot be had anyway. Where the kernel overcommits,
/// the allocation succeeds and filling it runs the machine out of memory instead.
pub(crate) fn check_within_memory(what: &'static str, bytes: usize, doing: &str, why: &str) -> Result<()> {
    match physical_memory_bytes() {
        Some(total) if bytes as u64 > total => Err(BackendError::invalid(
            what,
            format!(
                "{bytes} bytes {doing}: more than this machine's {total} bytes of memory ({why}); give a smaller size"
            ),
        )),
        _ => Ok(()),
    }
}

/// `len` elements of `T` in bytes, or a clear error on zero or overflow.
pub(crate) fn byte_len<T>(what: &'static str, len: usize) -> Result<usize> {
    if len == 0 {
        return Err(BackendError::invalid(what, "0 elements: a buffer needs at least one"));
    }
    len.checked_mul(size_of::<T>()).filter(|&bytes| bytes <= isize::MAX as usize).ok_or_else(|| {
        BackendError::invalid(
            what,
            format!("{len} elements of {} bytes overflow the address space", size_of::<T>()),
        )
    })
}

/// A zero-initialised slice of `T` in its own anonymous mapping, page-aligned and a whole
/// number of pages long, freed on drop.
///
/// Because it owns whole pages, a `PageBox` can be registered with the GPU without pinning
/// anyone else's data, and guarded with `mprotect`. [`PageBox::huge`] aligns to 2 MiB and asks
/// for transparent huge pages, which register faster and cut TLB misses.
pub struct PageBox<T> {
    ptr: NonNull<T>,
    len: usize,
    map_ptr: NonNull<u8>,
    map_len: usize,
    _owns: PhantomData<T>,
}

// SAFETY: a PageBox owns its mapping exclusively, like a Box<[T]>; T: Pod is plain data.
unsafe impl<T: Pod + Send + Sync> Send for PageBox<T> {}
// SAFETY: shared access gives out only &[T], as Box<[T]> does.
unsafe impl<T: Pod + Send + Sync> Sync for PageBox<T> {}

impl<T: Pod + Send + Sync> PageBox<T> {
    /// `len` zeroed elements on base pages.
    ///
    /// # Errors
    /// Zero length, size overflow, or the mapping failing (out of memory).
    pub fn zeroed(len: usize) -> Result<PageBox<T>> {
        Self::map(len, page_size(), false)
    }

    /// `len` zeroed elements, 2 MiB aligned, with `madvise(MADV_HUGEPAGE)`. Where transparent
    /// huge pages are off this still works, on base pages.
    ///
    /// # Errors
    /// Zero length, size overflow, or the mapping failing (out of memory).
    pub fn huge(len: usize) -> Result<PageBox<T>> {
        Self::map(len, HUGE_PAGE_BYTES, true)
    }

    fn map(len: usize, align: usize, huge: bool) -> Result<PageBox<T>> {
        let bytes = byte_len::<T>("page-aligned buffer length", len)?;
        crate::faults::fail::<BackendError>(crate::faults::FaultPoint::Allocation)?;
        if align_of::<T>() > page_size() {
            return Err(BackendError::invalid("element type", "alignment above the page size"));
        }
        let map_len = bytes.div_ceil(align) * align;
        // Over-map by the alignment, then cut the unaligned head and the tail away.
        let over_len = map_len + if align > page_size() { align } else { 0 };
        // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
        let raw = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                over_len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )
        }
        .map_err(|errno| BackendError::Io {
            context: format!("mapping {over_len} bytes of anonymous memory"),
            source: errno.into(),
        })?
        .cast::<u8>();
        let head = raw.align_offset(align);
        // SAFETY: `head < align` and `head + map_len <= over_len`, so both cuts lie inside the
        // mapping made above.
        let map_ptr = unsafe { raw.add(head) };
        let tail = over_len - head - map_len;
        // SAFETY: unmapping the unaligned head and the spare tail of our own fresh mapping.
        unsafe {
            if head > 0 {
                let _ = rustix::mm::munmap(raw.cast(), head);
            }
            if tail > 0 {
                let _ = rustix::mm::munmap(map_ptr.add(map_len).cast(), tail);
            }
        }
        if huge {
            // SAFETY: advice on our own mapping; a kernel without THP refuses it harmlessly.
            if let Err(errno) = unsafe { rustix::mm::madvise(map_ptr.cast(), map_len, Advice::LinuxHugepage) }
            {
                tracing::debug!("madvise(MADV_HUGEPAGE) refused: {errno}");
            }
        }
        let map_ptr = NonNull::new(map_ptr).expect("mmap never returns null on success");
        Ok(PageBox { ptr: map_ptr.cast(), len, map_ptr, map_len, _owns: PhantomData })
    }
}

impl<T> PageBox<T> {
    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a `PageBox` holds at least one element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first element, for writes by code that does not hold `&mut self` (the GPU, once
    /// the box is registered). Derived from the mapping itself, never from a `&[T]`, so writes
    /// through it are allowed for as long as the box lives.
    pub fn as_mut_ptr(&mut self) -> *mut T {
        self.ptr.as_ptr()
    }

    /// The mapping's start and length in bytes (whole pages).
    pub(crate) fn pages(&self) -> (NonNull<u8>, usize) {
        (self.map_ptr, self.map_len)
    }
}

impl<T> Deref for PageBox<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: `len` initialised (zeroed, T: Pod) elements live at `ptr` for as long as self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> DerefMut for PageBox<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in deref; `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> Drop for PageBox<T> {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours and unmapped once; no reference into it outlives self.
        if let Err(errno) = unsafe { rustix::mm::munmap(self.map_ptr.as_ptr().cast(), self.map_len) } {
            tracing::warn!("munmap of a page-aligned buffer failed: {errno}");
        }
    }
}

impl<T> std::fmt::Debug for PageBox<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageBox").field("len", &self.len).field("map_len", &self.map_len).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxes_are_zeroed_aligned_and_whole_pages() {
        let small = PageBox::<u32>::zeroed(1000).unwrap();
        let (start, bytes) = small.pages();
        assert_eq!(start.as_ptr() as usize % page_size(), 0);
        assert_eq!(bytes % page_size(), 0);
        assert!(bytes >= 4000);
        assert!(small.iter().all(|&word| word == 0));

        let mut huge = PageBox::<u8>::huge(3 << 20).unwrap();
        let (start, bytes) = huge.pages();
        assert_eq!(start.as_ptr() as usize % HUGE_PAGE_BYTES, 0);
        assert_eq!(bytes, 4 << 20);
        huge[(3 << 20) - 1] = 7;
        assert_eq!(huge[(3 << 20) - 1], 7);
    }

    #[test]
    fn zero_length_and_overflow_are_clear_errors() {
        let zero = PageBox::<u64>::zeroed(0).unwrap_err().to_string();
        assert!(zero.contains("0 elements"), "{zero}");
        let overflow = PageBox::<u64>::zeroed(usize::MAX / 4).unwrap_err().to_string();
        assert!(overflow.contains("overflow"), "{overflow}");
    }
}
