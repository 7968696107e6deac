//! Guard mode: while a buffer is lent, its pages are `mprotect(PROT_NONE)`, so a stray CPU
//! access through a raw pointer or FFI faults at once instead of racing the GPU.
//!
//! Measured on the H200 machine: the GPU keeps reading and writing such pages correctly (its
//! mapping does not go through the CPU's page tables); only CPU accesses fault. On a GPU that
//! uses the host's page tables (`pageable_memory_access_uses_host_page_tables`: ATS, as on
//! Grace Hopper) the GPU's own accesses would fault too, so guard mode is refused there.

use std::ptr::NonNull;
use std::sync::Mutex;

use rustix::mm::MprotectFlags;

use crate::error::{Error, Result};
use crate::memory::Region;

/// Protection of a lent buffer's pages, lifted on reclaim.
#[derive(Debug)]
pub(crate) struct Guard {
    start: NonNull<u8>,
    len: usize,
    restore: MprotectFlags,
    /// CPU-backend operations using the pages now: the first lifts the protection, the last
    /// restores it, so one thread never re-protects pages another is still reading.
    cpu_users: Mutex<usize>,
}

// SAFETY: Guard holds the address range of memory its lease owns; mprotect may be called from
// any thread.
unsafe impl Send for Guard {}
// SAFETY: as for Send; the methods only call mprotect.
unsafe impl Sync for Guard {}

impl Guard {
    /// Protects the pages of `region`, lent to a GPU that does (`true`) or does not use the
    /// host's page tables, or to the CPU backend (`false`).
    pub(crate) fn protect(region: &Region, uses_host_page_tables: bool) -> Result<Guard> {
        if uses_host_page_tables {
            return Err(Error::invalid(
                "guard mode",
                "this GPU reaches host memory through the CPU's page tables (ATS, as on Grace \
                 Hopper), so pages protected from the CPU would fault the GPU as well: lend the \
                 buffer without a guard (Queue::lend)",
            ));
        }
        let Some((start, len)) = region.pages else {
            return Err(Error::invalid(
                "guard mode",
                "the buffer does not own whole pages (a registered Vec, managed or device memory): \
                 use a HostBuf from HostBuf::pinned, a PageBox or a pool",
            ));
        };
        let restore =
            if region.read_only { MprotectFlags::READ } else { MprotectFlags::READ | MprotectFlags::WRITE };
        let guard = Guard { start, len, restore, cpu_users: Mutex::new(0) };
        guard.set(MprotectFlags::empty())?;
        Ok(guard)
    }

    /// Restores CPU access.
    pub(crate) fn lift(&self) -> Result<()> {
        self.set(self.restore)
    }

    /// Lets a CPU-backend operation touch the pages until the returned access drops.
    pub(crate) fn cpu_access(&self) -> Result<CpuAccess<'_>> {
        let mut users = self.cpu_users.lock().unwrap_or_else(|poison| poison.into_inner());
        if *users == 0 {
            self.lift()?;
        }
        *users += 1;
        Ok(CpuAccess { guard: self })
    }

    fn set(&self, flags: MprotectFlags) -> Result<()> {
        // SAFETY: [start, start + len) is whole pages of memory owned by the lent buffer, which
        // outlives the guard; changing its protection cannot invalidate a Rust reference, since
        // while the guard exists no safe code holds one into it.
        unsafe { rustix::mm::mprotect(self.start.as_ptr().cast(), self.len, flags) }.map_err(|errno| {
            Error::Io {
                context: format!("mprotect of {} bytes at {:p} ({flags:?})", self.len, self.start),
                source: errno.into(),
            }
        })
    }
}

/// A CPU-backend operation's access to guarded pages; the last one to drop re-protects them,
/// also when the operation panicked.
pub(crate) struct CpuAccess<'a> {
    guard: &'a Guard,
}

impl Drop for CpuAccess<'_> {
    fn drop(&mut self) {
        let mut users = self.guard.cpu_users.lock().unwrap_or_else(|poison| poison.into_inner());
        *users -= 1;
        if *users == 0
            && let Err(error) = self.guard.set(MprotectFlags::empty())
        {
            tracing::warn!("guarded pages stay accessible after a CPU operation: {error}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{PageBox, Sealed};

    #[test]
    fn a_gpu_on_the_host_page_tables_is_refused_and_the_pages_stay_open() {
        let cpu = crate::Device::open(crate::BackendChoice::Only(crate::BackendKind::Cpu)).unwrap();
        let memory = PageBox::<u8>::zeroed(4096).unwrap();
        let mut buf =
            crate::HostBuf::register(&cpu, memory, crate::memory::RegisterOptions::default()).unwrap();
        let error = Guard::protect(&buf.region(), true).unwrap_err().to_string();
        assert!(error.contains("page tables") && error.contains("Queue::lend"), "{error}");
        // Nothing was protected: the CPU still reads and writes the buffer.
        buf.as_mut_slice()[4095] = 7;
        assert_eq!(buf.as_slice()[4095], 7);
        let guard = Guard::protect(&buf.region(), false).unwrap();
        guard.lift().unwrap();
    }
}
