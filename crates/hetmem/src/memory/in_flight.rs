//! [`InFlight`]: memory that GPU work queued by raw address may still use, freed only once
//! that work has finished.
//!
//! hetmem's own GPU work holds buffers in leases ([`crate::Lent`], [`crate::Shared`]), whose
//! drop waits for their fence. Code that queues copies and kernels on a [`Stream`] with raw
//! addresses (the memory layer's own copies, hetmem-bench's link cells, a user's own unsafe
//! launches) holds the memory they use in an `InFlight` instead, naming at construction every stream the work may be queued on.
//! Dropping it, on any path (an early `?` return included), first waits for each of those
//! streams, and drops the value only if every wait succeeded; otherwise the work may still
//! use it, and it is leaked. Nothing relies on a free call waiting for the device on its own
//! (`cuMemFree` happens to today), and the streams are held by `Arc`, so they outlive the
//! wait whatever order their owner's fields drop in.

use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use crate::backend::cuda::{CudaDevice, Stream};
use crate::error::Result;

/// Something GPU work was queued on, that the CPU can wait for.
pub trait Wait {
    /// Blocks until the work queued so far has finished.
    ///
    /// # Errors
    /// The wait failed: the work may still be running, or have failed.
    fn wait(&self) -> Result<()>;
}

/// Where the work using an [`InFlight`] value may be queued.
#[derive(Debug, Clone)]
pub enum Waiter {
    /// One of hetmem's (non-blocking) streams.
    Stream(Arc<Stream>),
    /// The device's legacy default stream, where the driver's synchronous copies run: one from
    /// pageable memory may still be writing the device when it returns.
    DefaultStream(CudaDevice),
}

impl Wait for Waiter {
    fn wait(&self) -> Result<()> {
        match self {
            Waiter::Stream(stream) => Ok(stream.synchronize()?),
            Waiter::DefaultStream(device) => Ok(device.synchronize_default_stream()?),
        }
    }
}

/// A value that GPU work queued on the `waiters` may still use. Dropping it waits for every
/// waiter, then drops the value, or leaks it when a wait fails (see the module documentation).
/// Between waits, the value is reached through `Deref` and `DerefMut`: whoever queues work
/// on it keeps the CPU off the memory that work uses until it has waited, as without a guard.
pub struct InFlight<T, W: Wait = Waiter> {
    value: ManuallyDrop<T>,
    waiters: Vec<W>,
}

impl<T, W: Wait> InFlight<T, W> {
    /// Holds `value`, which work on `waiters` may use from now on.
    pub fn new(value: T, waiters: impl IntoIterator<Item = W>) -> InFlight<T, W> {
        InFlight { value: ManuallyDrop::new(value), waiters: waiters.into_iter().collect() }
    }
}

impl<T, W: Wait> Deref for InFlight<T, W> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T, W: Wait> DerefMut for InFlight<T, W> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.value
    }
}

impl<T, W: Wait> Drop for InFlight<T, W> {
    fn drop(&mut self) {
        // After one failed wait the value is leaked whatever the others say.
        match self.waiters.iter().try_for_each(Wait::wait) {
            // SAFETY: drop runs once and `value` is not used afterwards.
            Ok(()) => unsafe { ManuallyDrop::drop(&mut self.value) },
            Err(error) => tracing::error!(
                "waiting for the GPU work using {} failed; leaking it rather than freeing it under that work: {error}",
                std::any::type_name::<T>()
            ),
        }
    }
}

impl<T: std::fmt::Debug, W: Wait> std::fmt::Debug for InFlight<T, W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight").field("value", &*self.value).field("waiters", &self.waiters.len()).finish()
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;

    use super::*;
    use crate::error::Error;

    type Log = Rc<RefCell<Vec<String>>>;

    /// A stream stand-in that logs its waits, and fails them when told to.
    struct FakeStream {
        name: &'static str,
        fails: bool,
        log: Log,
    }

    impl Wait for FakeStream {
        fn wait(&self) -> Result<()> {
            self.log.borrow_mut().push(format!("wait {}", self.name));
            if self.fails {
                return Err(Error::invalid("fake stream", "its work failed"));
            }
            Ok(())
        }
    }

    /// Memory stand-in that logs when it is freed.
    struct Memory(Log);

    impl Drop for Memory {
        fn drop(&mut self) {
            self.0.borrow_mut().push("free".into());
        }
    }

    fn streams(log: &Log, failing: Option<&'static str>) -> Vec<FakeStream> {
        ["stream", "second", "default"]
            .into_iter()
            .map(|name| FakeStream { name, fails: failing == Some(name), log: Rc::clone(log) })
            .collect()
    }

    /// The benchmark's pattern: work queued, then an early return by `?` before the
    /// synchronisation that would have followed it.
    fn queue_then_fail(held: InFlight<Memory, FakeStream>) -> Result<()> {
        held.0.borrow_mut().push("queue work".into());
        Err(Error::invalid("timing", "recording the end event failed"))?;
        unreachable!("returned above")
    }

    #[test]
    fn an_early_return_waits_for_every_stream_before_freeing() {
        let log = Log::default();
        let held = InFlight::new(Memory(Rc::clone(&log)), streams(&log, None));
        assert!(queue_then_fail(held).is_err());
        assert_eq!(*log.borrow(), ["queue work", "wait stream", "wait second", "wait default", "free"]);
    }

    #[test]
    fn a_failed_wait_leaks_the_memory_instead_of_freeing_it() {
        for failing in ["stream", "second", "default"] {
            let log = Log::default();
            drop(InFlight::new(Memory(Rc::clone(&log)), streams(&log, Some(failing))));
            let log = log.borrow();
            assert!(!log.contains(&"free".to_string()), "{failing} failed, yet: {log:?}");
            assert_eq!(log.last(), Some(&format!("wait {failing}")), "no wait after the failed one");
        }
    }

    #[test]
    fn the_value_is_reachable_while_held() {
        let log = Log::default();
        let mut held = InFlight::new((Memory(Rc::clone(&log)), 7u32), streams(&log, None));
        held.1 += 1;
        assert_eq!(held.1, 8);
        assert!(log.borrow().is_empty(), "nothing waited or freed while held: {:?}", log.borrow());
        drop(held);
        assert_eq!(log.borrow().last().map(String::as_str), Some("free"));
    }

    /// Mapped memory a kernel reads and writes, checked against the CPU when it is freed: were
    /// it freed before the kernel finished, the check would see the poison still in the tail.
    struct CheckedAtFree {
        input: crate::memory::HostBuf<u32>,
        output: crate::memory::HostBuf<u32>,
        expected: Vec<u32>,
        /// The first output word that differed from the CPU's when the memory was freed.
        seen: Arc<std::sync::Mutex<Option<Option<usize>>>>,
    }

    impl Drop for CheckedAtFree {
        fn drop(&mut self) {
            let output = self.output.as_slice();
            let mismatch = output.iter().zip(&self.expected).position(|(got, want)| got != want);
            *self.seen.lock().unwrap() = Some(mismatch);
        }
    }

    #[test]
    fn dropping_waits_for_a_kernel_still_writing_the_memory() {
        use crate::backend::Device;
        use crate::backend::cuda::LaunchConfig;
        use crate::memory::{HostBuf, PinOptions};

        const TEST: &str = "memory::in_flight::tests::dropping_waits_for_a_kernel_still_writing_the_memory";
        let Some(cuda) = crate::testing::cuda_device_or_skip(TEST) else { return };
        let device = Device::Cuda(cuda.clone());
        // 64 MiB each way through mapped memory takes milliseconds: far longer than the check
        // at free takes to reach the tail, should the drop not wait.
        let len = 16 << 20;
        let seed = fastrand::u64(..);
        eprintln!("{TEST}: seed {seed}");
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut input = HostBuf::<u32>::pinned(&device, len, PinOptions::default()).unwrap();
        input.as_mut_slice().iter_mut().for_each(|word| *word = rng.u32(..));
        let mut output = HostBuf::<u32>::pinned(&device, len, PinOptions::default()).unwrap();
        output.as_mut_slice().fill(0xA5A5_A5A5);
        let (a, b) = (rng.u32(..) | 1, rng.u32(..));
        let expected = input.as_slice().iter().map(|x| x.wrapping_mul(a).wrapping_add(b)).collect();
        let seen = Arc::default();
        let stream = Arc::new(Stream::new(&cuda).unwrap());
        let held = InFlight::new(
            CheckedAtFree { input, output, expected, seen: Arc::clone(&seen) },
            [Waiter::Stream(Arc::clone(&stream)), Waiter::DefaultStream(cuda.clone())],
        );
        let kernel = crate::kernels::kernel(&cuda, &crate::kernels::AFFINE, "affine_u32").unwrap();
        let mut words: [u64; 5] = [
            held.input.device_ptr().expect("mapped"),
            held.output.device_ptr().expect("mapped"),
            len as u64,
            a.into(),
            b.into(),
        ];
        let mut pointers: Vec<*mut std::ffi::c_void> =
            words.iter_mut().map(|word| (word as *mut u64).cast()).collect();
        // SAFETY: affine_u32(const u32* x, u32* y, u64 n, u32 a, u32 b) takes one 64-bit word
        // per parameter here (32-bit ones read the low half); both buffers are mapped and hold
        // `len` words, and `held` keeps them until the stream has finished.
        unsafe { kernel.launch(&stream, LaunchConfig::linear(len, 256, 1024), &mut pointers) }.unwrap();
        drop(held);
        assert_eq!(*seen.lock().unwrap(), Some(None), "the memory was freed before the kernel finished");
        assert!(stream.is_idle().unwrap());
    }
}
