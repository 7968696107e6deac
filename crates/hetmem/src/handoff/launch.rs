//! [`KernelArgs`]: the arguments of a user's own kernel, with the leases they refer to.

use bytemuck::Pod;

use super::lease::{Lease, LeaseParts, LeaseState, Lent};
use crate::error::{Error, Result};
use crate::memory::{MappedView, Region, Sealed, WritableBuffer};

#[cfg(target_endian = "big")]
compile_error!("kernel arguments are passed as little-endian words");

enum Arg<'a> {
    Value(u64),
    Buffer {
        state: &'a LeaseState,
        region: Region,
    },
    /// A mapped view's first word: its device address and GPU (`None` on the CPU backend).
    Mapped {
        address: Option<u64>,
        gpu: Option<usize>,
    },
}

/// The arguments of one kernel launch, in order: buffers (by lease) and plain values.
///
/// Reading a buffer borrows its lease shared; writing borrows it exclusively, so one launch
/// cannot be handed the same buffer to read and to write through two arguments.
///
/// ```
/// # use hetmem::{handoff::KernelArgs, *};
/// # fn launch(queue: &Queue, kernel: &hetmem::backend::cuda::Kernel,
/// #           input: &Shared<HostBuf<u32>>, output: &mut Lent<HostBuf<u32>>) -> Result<()> {
/// let args = KernelArgs::new().read(input).write(output).value(input.len() as u64);
/// let config = hetmem::backend::cuda::LaunchConfig::linear(input.len(), 256, 1024);
/// // SAFETY: the kernel is `k(const u32*, u32*, u64)` and stays within the lengths.
/// unsafe { queue.launch(kernel, config, args) }
/// # }
/// ```
#[derive(Default)]
pub struct KernelArgs<'a> {
    args: Vec<Arg<'a>>,
    error: Option<Error>,
}

impl std::fmt::Debug for KernelArgs<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelArgs").field("count", &self.args.len()).finish_non_exhaustive()
    }
}

impl<'a> KernelArgs<'a> {
    /// No arguments yet.
    pub fn new() -> KernelArgs<'a> {
        KernelArgs::default()
    }

    /// A buffer the kernel reads, passed as a pointer to its first element.
    pub fn read<L: Lease>(mut self, lease: &'a L) -> KernelArgs<'a> {
        self.args.push(Arg::Buffer { state: lease.state(), region: lease.region() });
        self
    }

    /// A buffer the kernel writes (and may read), passed as a pointer to its first element.
    pub fn write<B: WritableBuffer>(mut self, lease: &'a mut Lent<B>) -> KernelArgs<'a> {
        let lease: &'a Lent<B> = lease;
        self.args.push(Arg::Buffer { state: lease.state(), region: lease.region() });
        self
    }

    /// A mapped flag, counter or mailbox (`hetmem::resident::mapped`), passed as a pointer to
    /// its first 32-bit word, for the kernel to use with `hetmem/mapped.cuh`. The borrow keeps
    /// the view alive while the arguments are built; a kernel that outlives the launch call (a
    /// resident one) must be stopped before the view is dropped (that module's "Lifetime").
    pub fn mapped<V: MappedView + ?Sized>(mut self, view: &'a V) -> KernelArgs<'a> {
        let memory = view.memory();
        self.args.push(Arg::Mapped { address: memory.device_address(), gpu: memory.gpu_ordinal() });
        self
    }

    /// A plain value of at most 8 bytes (`u32`, `f32`, `u64`, ...), passed by value.
    pub fn value<V: Pod>(self, value: V) -> KernelArgs<'a> {
        self.value_bytes(bytemuck::bytes_of(&value))
    }

    /// A plain value given as its little-endian bytes (at most 8).
    pub(crate) fn value_bytes(mut self, bytes: &[u8]) -> KernelArgs<'a> {
        if bytes.len() > 8 {
            self.error.get_or_insert(Error::invalid(
                "kernel argument",
                format!("a {}-byte value; pass larger values through a buffer", bytes.len()),
            ));
            return self;
        }
        let mut word = [0u8; 8];
        word[..bytes.len()].copy_from_slice(bytes);
        self.args.push(Arg::Value(u64::from_le_bytes(word)));
        self
    }

    /// One word per argument (values, or device addresses from `address`), and the leases to
    /// record the launch on, for a launch on GPU `gpu`.
    pub(crate) fn resolve(
        self,
        gpu: Option<usize>,
        address: impl Fn(&LeaseState, &Region) -> Result<u64>,
    ) -> Result<(Vec<u64>, Vec<&'a LeaseState>)> {
        if let Some(error) = self.error {
            return Err(error);
        }
        let mut words = Vec::with_capacity(self.args.len());
        let mut leases = Vec::new();
        for arg in self.args {
            match arg {
                Arg::Value(word) => words.push(word),
                Arg::Buffer { state, region } => {
                    words.push(address(state, &region)?);
                    leases.push(state);
                }
                Arg::Mapped { address: Some(address), gpu: view_gpu } if view_gpu == gpu => {
                    words.push(address)
                }
                Arg::Mapped { gpu: view_gpu, .. } => {
                    return Err(Error::invalid(
                        "mapped view kernel argument",
                        format!(
                            "the view was made on {}, the launch is on {}: make the view on the \
                             device of the queue that launches the kernel",
                            view_gpu
                                .map_or("the CPU backend".to_string(), |gpu| format!("CUDA device {gpu}")),
                            gpu.map_or("the CPU backend".to_string(), |gpu| format!("CUDA device {gpu}")),
                        ),
                    ));
                }
            }
        }
        Ok((words, leases))
    }
}
