//! [`MappedWords`]: 32-bit words that the CPU and a GPU kernel both poll and write: mapped
//! pinned memory on a GPU, plain memory on the CPU backend. The memory of the doorbell and of
//! the views users build their own protocols with (`crate::resident::mapped`), and
//! [`MappedView`], how a kernel argument finds a view's memory.

use std::sync::atomic::AtomicU32;

use crate::backend::Device;
use crate::backend::memory::WordMemory;
use crate::error::{Error, Result};

/// The most words one allocation holds (64 MiB): far more than any flag, counter or mailbox
/// needs, and small enough that a word count from a caller cannot overflow a byte count.
pub(crate) const MAX_WORDS: usize = 1 << 24;

/// Words on one 64-byte cache line: views put words the two sides write on lines of their own,
/// so one side's polling never contends with the other's writes.
pub(crate) const LINE_WORDS: usize = 16;

/// Zeroed 32-bit words in memory both the CPU and the device's kernels reach. (Public only so
/// that [`MappedView`] can name it: its module is private, so code outside hetmem cannot.)
///
/// The CPU touches them only as [`AtomicU32`] (so no access of the CPU's is a data race, whatever
/// a kernel does); kernels by 32- or 64-bit loads and stores at system scope (see
/// `kernels/hetmem/mapped.cuh`).
///
/// Dropping frees the memory. On a GPU that waits for the device (`cuMemFreeHost`), or, while a
/// resident kernel hetmem knows of runs, is deferred until it has stopped: memory is never
/// freed under a kernel that may still touch it.
pub struct MappedWords {
    memory: WordMemory,
}

impl MappedWords {
    /// `words` zeroed words on `device`: mapped pinned memory on a GPU (page-aligned), plain
    /// memory on the CPU backend.
    ///
    /// # Errors
    /// No words or more than [`MAX_WORDS`]; a GPU that cannot map host memory; the driver's
    /// error (pinned memory counts against `ulimit -l`).
    pub(crate) fn zeroed(device: &Device, words: usize) -> Result<MappedWords> {
        if words == 0 || words > MAX_WORDS {
            return Err(Error::invalid("mapped words", format!("{words} words: ask for 1 to {MAX_WORDS}")));
        }
        Ok(MappedWords { memory: device.allocate_words(words)? })
    }

    /// The words, as the CPU touches them.
    pub(crate) fn words(&self) -> &[AtomicU32] {
        self.memory.words()
    }

    /// The address kernels reach the first word at; `None` on the CPU backend.
    pub(crate) fn device_address(&self) -> Option<u64> {
        self.memory.device_address()
    }

    /// The GPU whose kernels may use [`MappedWords::device_address`]; `None` on the CPU backend.
    pub(crate) fn gpu_ordinal(&self) -> Option<usize> {
        self.memory.gpu_ordinal()
    }

    /// Whether the words are on the CPU backend, where the CPU plays both sides.
    pub(crate) fn is_cpu(&self) -> bool {
        self.gpu_ordinal().is_none()
    }
}

impl std::fmt::Debug for MappedWords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedWords")
            .field("words", &self.words().len())
            .field("gpu", &self.gpu_ordinal())
            .finish()
    }
}

/// What a mapped view is, as a kernel that is given one must know: how many of its words the
/// kernel may touch follows from it (a mailbox describes its own slots in its first words).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MappedKind {
    /// A `SeqFlag`: one word.
    Flag,
    /// A `Counter`: one word. `kernel_adds`, for a kernel's parameter: whether the kernel
    /// adds to it (`hetmem_counter_add`); for a counter: whether the GPU may (it was made with
    /// `Writer::Gpu` or `Writer::Both`). A kernel that adds is launched only with a counter the
    /// GPU may add to, since its adds would race the CPU's (updates lost) where the link has no
    /// native atomics; a kernel that only reads takes any counter.
    Counter {
        /// Whether the kernel adds to it (a parameter), or the GPU may (a counter).
        kernel_adds: bool,
    },
    /// A `Mailbox` of messages of `message_bytes` bytes.
    Mailbox {
        /// The size of its message type.
        message_bytes: usize,
    },
}

impl MappedKind {
    /// Whether a view of this kind has the layout a parameter of kind `wanted` reads (which
    /// side writes a counter aside: the CPU path of a stage adds where its kernel would).
    pub(crate) fn fits(self, wanted: MappedKind) -> bool {
        match (self, wanted) {
            (MappedKind::Counter { .. }, MappedKind::Counter { .. }) => true,
            (view, wanted) => view == wanted,
        }
    }

    /// Whether a kernel whose parameter is of kind `wanted` may be launched with a view of
    /// this kind: it fits, and a kernel that adds gets a counter the GPU may add to.
    pub(crate) fn serves_launch(self, wanted: MappedKind) -> bool {
        match (self, wanted) {
            (MappedKind::Counter { kernel_adds: gpu_may }, MappedKind::Counter { kernel_adds }) => {
                gpu_may || !kernel_adds
            }
            (view, wanted) => view == wanted,
        }
    }
}

mod private {
    /// Views a kernel may be given the address of (`crate::resident::mapped`'s); unnameable
    /// outside hetmem, so no other type can pass an address of its choosing as one.
    pub trait MappedView {
        /// The memory the view lives in.
        fn memory(&self) -> &super::MappedWords;
        /// What kind of view it is.
        fn kind(&self) -> super::MappedKind;
    }
}
pub(crate) use private::MappedView;
