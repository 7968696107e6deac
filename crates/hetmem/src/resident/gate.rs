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

use crate::backend::cuda::{LaunchConfig, ResidentKernel};
use crate::error::{Error, Result};
use crate::handoff::{KernelArgs, Queue};
use crate::kernels::{self, SIGNAL};
use crate::memory::MappedWords;

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
    words: ManuallyDrop<MappedWords>,
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
        if queue.cuda_device().is_none() {
            return Err(Error::NeedsGpu {
                what: "a gate".into(),
                detail: "on the CPU backend its kernel would never finish".into(),
            });
        }
        let gate = Gate {
            words: ManuallyDrop::new(MappedWords::zeroed(&queue.device(), DONE + 1)?),
            queue: queue.clone(),
            resident: Mutex::new(None),
        };
        Ok(gate)
    }

    fn word(&self, index: usize) -> &AtomicU32 {
        &self.words.words()[index]
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
        let address = self.words.device_address().expect("mapped words on a GPU have a device address");
        let config = LaunchConfig { grid: (1, 1, 1), block: (1, 1, 1), shared_bytes: 0 };
        // SAFETY: wait_for_go(volatile u32* words) takes one pointer; `address` is this gate's
        // mapped words (DONE + 1 of them), which outlive the kernel because Drop opens the gate
        // and waits for the queue before freeing them; the kernel touches words 0, 16 and 32.
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
            // SAFETY: the queue is idle, so no kernel touches the words; dropped once, here.
            Ok(()) => unsafe { ManuallyDrop::drop(&mut self.words) },
            // The kernel may still touch the words: leak them rather than free them.
            Err(error) => tracing::error!("a gate's kernel failed; leaking its page: {error}"),
        }
    }
}
