//! [`Gate`]: a kernel that waits on the CPU, for measuring completion signals and for testing
//! that waits do not block.
//!
//! The CPU queues [`Gate::launch`]; the kernel marks itself started and spins on a go word in
//! mapped memory; [`Gate::open`] lets it finish, and it marks itself done. Because the CPU
//! decides when the kernel ends, the time from `open` to any completion signal measures that
//! signal alone, without launch overhead.

use std::mem::ManuallyDrop;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::backend::cuda::{HostAllocFlags, LaunchConfig, PinnedAlloc, ResidentKernel};
use crate::error::{Error, Result};
use crate::handoff::{KernelArgs, Queue};
use crate::kernels::{self, SIGNAL};

/// Word offsets of the kernel's started, go and done words (one 64-byte line apart).
const STARTED: usize = 0;
const GO: usize = 16;
const DONE: usize = 32;

/// A page of mapped memory and the one-thread kernel that waits on it. CUDA backend only.
///
/// Until it is opened the kernel counts as a resident kernel (see [the module](super)): hetmem
/// defers its frees on the GPU and refuses to load kernels or synchronise the device meanwhile.
/// Keep gates out of processes doing other GPU work.
#[derive(Debug)]
pub struct Gate {
    words: ManuallyDrop<PinnedAlloc>,
    queue: Queue,
    /// Counts the kernel in its context as resident from its launch until it is let go: from
    /// then on it ends on its own.
    resident: Mutex<Option<ResidentKernel>>,
}

impl Gate {
    /// A gate for kernels on `queue`.
    ///
    /// # Errors
    /// A CPU-backend queue (whose work runs on the calling thread, so it could never be
    /// opened), or the driver's error.
    pub fn new(queue: &Queue) -> Result<Gate> {
        let Some(device) = queue.cuda_device() else {
            return Err(Error::NeedsGpu {
                what: "a gate".into(),
                detail: "on the CPU backend its kernel would never finish".into(),
            });
        };
        let flags = HostAllocFlags { device_map: true, ..HostAllocFlags::default() };
        let gate = Gate {
            // Zeroed before any word is read as an atomic: the driver leaves its memory unwritten.
            words: ManuallyDrop::new(PinnedAlloc::zeroed(device, 4096, flags)?),
            queue: queue.clone(),
            resident: Mutex::new(None),
        };
        Ok(gate)
    }

    fn word(&self, index: usize) -> &AtomicU32 {
        // SAFETY: the page is 4096 bytes, page-aligned, zeroed when allocated and owned by
        // `self.words`; index ≤ 32 keeps the word inside it. The CPU only touches it through this atomic, the kernel
        // through 32-bit volatile accesses.
        unsafe { &*self.words.host_ptr().cast::<AtomicU32>().add(index) }
    }

    /// Resets the words and queues the waiting kernel. Wait for [`Gate::is_started`] before
    /// timing anything.
    ///
    /// # Errors
    /// The kernel failing to compile or launch.
    pub fn launch(&self) -> Result<()> {
        // The previous kernel (if any) must be finished before its words are reused: let it go
        // first, or waiting for it would wait for ever.
        self.open();
        self.queue.synchronize()?;
        for index in [STARTED, GO, DONE] {
            self.word(index).store(0, Ordering::Release);
        }
        let device = self.queue.cuda_device().expect("checked in Gate::new");
        let kernel = kernels::kernel(device, &SIGNAL, "wait_for_go")?;
        *self.resident() = Some(ResidentKernel::enter(device));
        let address = self.words.device_ptr().expect("the page is mapped");
        let config = LaunchConfig { grid: (1, 1, 1), block: (1, 1, 1), shared_bytes: 0 };
        // SAFETY: wait_for_go(volatile u32* words) takes one pointer; `address` is this gate's
        // mapped page, which outlives the kernel because Drop opens the gate and waits for the
        // queue before freeing it; the kernel touches words 0, 16 and 32 only.
        unsafe { self.queue.launch(&kernel, config, KernelArgs::new().value(address)) }
    }

    /// Whether the kernel has started running.
    pub fn is_started(&self) -> bool {
        self.word(STARTED).load(Ordering::Acquire) != 0
    }

    /// Spins until the kernel runs.
    pub fn wait_started(&self) {
        while !self.is_started() {
            std::hint::spin_loop();
        }
    }

    /// Lets the kernel finish. From here on it ends by itself, so it no longer counts as
    /// resident: a device-wide wait (a free, `cuCtxSynchronize`) waits only for its last steps.
    pub fn open(&self) {
        self.word(GO).store(1, Ordering::Release);
        // Dropped after the gate's lock: counting the kernel out runs deferred releases, which
        // may drop owners whose own drops must not run under it.
        let token = self.resident().take();
        drop(token);
    }

    /// Whether the kernel has written its done word: its end as the CPU first sees it.
    pub fn is_done(&self) -> bool {
        self.word(DONE).load(Ordering::Acquire) != 0
    }

    fn resident(&self) -> std::sync::MutexGuard<'_, Option<ResidentKernel>> {
        self.resident.lock().unwrap_or_else(|poison| poison.into_inner())
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.open();
        match self.queue.synchronize() {
            // SAFETY: the queue is idle, so no kernel touches the page; dropped once, here.
            Ok(()) => unsafe { ManuallyDrop::drop(&mut self.words) },
            // The kernel may still touch the page: leak it rather than free it.
            Err(error) => tracing::error!("a gate's kernel failed; leaking its page: {error}"),
        }
    }
}
