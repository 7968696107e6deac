//! [`SeqFlag`] and [`Counter`]: single mapped words with one writer each.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::wait;
use crate::backend::Device;
use crate::error::{Error, Result};
use crate::memory::{LINE_WORDS, MappedKind, MappedView, MappedWords};

/// Whether sequence number `value` has reached `target`, counting modulo 2^32: `value` is at
/// most 2^31 - 1 past it. (Sequence numbers wrap; a plain `>=` would stall at the wrap.)
fn reached(value: u32, target: u32) -> bool {
    (value.wrapping_sub(target) as i32) >= 0
}

/// A 32-bit sequence flag in mapped memory, on a 64-byte line of its own: one side raises it
/// to successive values ([`SeqFlag::publish`]; `hetmem_flag_publish` in a kernel), the other
/// waits until it reaches one ([`SeqFlag::wait_for`]; `hetmem_flag_wait`). Values compare
/// modulo 2^32 (see [the module](super) for the ordering contract).
///
/// Starts at 0. Publishing is a release store, so what the publisher wrote before is seen by a
/// side that observed the value.
///
/// # Examples
/// ```
/// use hetmem::Device;
/// use hetmem::resident::SeqFlag;
/// use std::time::Duration;
///
/// let flag = SeqFlag::new(&Device::open_best()?)?;
/// flag.publish(3);
/// assert_eq!(flag.wait_for(2, Duration::from_millis(10))?, 3);
/// # Ok::<(), hetmem::Error>(())
/// ```
#[derive(Debug)]
pub struct SeqFlag {
    words: MappedWords,
}

impl SeqFlag {
    /// A flag at 0 on `device`.
    ///
    /// # Errors
    /// A GPU that cannot map host memory; the driver's error.
    pub fn new(device: &Device) -> Result<SeqFlag> {
        Ok(SeqFlag { words: MappedWords::zeroed(device, LINE_WORDS)? })
    }

    fn word(&self) -> &AtomicU32 {
        &self.words.words()[0]
    }

    /// Raises the flag to `value` (release: everything this thread wrote before is visible to
    /// a side that reads `value`).
    pub fn publish(&self, value: u32) {
        self.word().store(value, Ordering::Release);
    }

    /// The flag's value now (acquire).
    pub fn load(&self) -> u32 {
        self.word().load(Ordering::Acquire)
    }

    /// Waits until the flag has reached `target` (modulo 2^32), and returns its value then.
    ///
    /// # Errors
    /// [`Error::MappedWaitTimeout`] after `timeout`.
    pub fn wait_for(&self, target: u32, timeout: Duration) -> Result<u32> {
        wait::until("a mapped flag's value", timeout, || {
            Some(self.load()).filter(|&value| reached(value, target))
        })
    }
}

impl MappedView for SeqFlag {
    fn memory(&self) -> &MappedWords {
        &self.words
    }

    fn kind(&self) -> MappedKind {
        MappedKind::Flag
    }
}

/// Which side writes a [`Counter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    /// CPU threads add to it (atomically among themselves); kernels only read it.
    Cpu,
    /// A GPU's threads add to it (`hetmem_counter_add`, atomic among them); the CPU only
    /// reads it.
    Gpu,
    /// Both: only where the link has native atomics
    /// ([`Capabilities::host_native_atomics`](crate::backend::Capabilities::host_native_atomics)),
    /// refused elsewhere.
    Both,
}

/// A 32-bit counter in mapped memory, on a 64-byte line of its own, with one writing side
/// ([`Writer`]). It counts modulo 2^32. Adding is a release read-modify-write on the writing
/// side; reading is an acquire load (see [the module](super) for the ordering contract).
///
/// # Examples
/// ```
/// use hetmem::Device;
/// use hetmem::resident::{Counter, Writer};
///
/// let device = Device::open_best()?;
/// let produced = Counter::new(&device, Writer::Cpu)?;
/// produced.add(5)?;
/// assert_eq!(produced.load(), 5);
/// // The GPU writes this one: the CPU may only read it.
/// let consumed = Counter::new(&device, Writer::Gpu)?;
/// assert!(consumed.add(1).is_err());
/// # Ok::<(), hetmem::Error>(())
/// ```
#[derive(Debug)]
pub struct Counter {
    words: MappedWords,
    writer: Writer,
}

impl Counter {
    /// A counter at 0 on `device`, written by `writer`.
    ///
    /// # Errors
    /// [`Error::AtomicsNotNative`] for [`Writer::Both`] where the device's link to the host
    /// has no native atomics (every PCIe GPU, and the CPU backend, so that code tested there
    /// keeps the GPU's rule); a GPU that cannot map host memory; the driver's error.
    pub fn new(device: &Device, writer: Writer) -> Result<Counter> {
        if writer == Writer::Both && !device.capabilities().host_native_atomics {
            return Err(Error::AtomicsNotNative { what: "a counter", device: device.name() });
        }
        Ok(Counter { words: MappedWords::zeroed(device, LINE_WORDS)?, writer })
    }

    fn word(&self) -> &AtomicU32 {
        &self.words.words()[0]
    }

    /// Which side writes it.
    pub fn writer(&self) -> Writer {
        self.writer
    }

    /// The count now (acquire).
    pub fn load(&self) -> u32 {
        self.word().load(Ordering::Acquire)
    }

    /// Adds `n` (modulo 2^32, release) and returns the count before.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] on a counter the GPU writes ([`Writer::Gpu`]): a CPU
    /// read-modify-write would race the GPU's.
    pub fn add(&self, n: u32) -> Result<u32> {
        if self.writer == Writer::Gpu {
            return Err(Error::invalid(
                "counter",
                "the GPU writes this counter (Writer::Gpu), so the CPU may only read it: make it \
                 with Writer::Cpu to add from the CPU",
            ));
        }
        Ok(self.word().fetch_add(n, Ordering::Release))
    }

    /// Waits until the count has reached `target` (modulo 2^32), and returns it then.
    ///
    /// # Errors
    /// [`Error::MappedWaitTimeout`] after `timeout`.
    pub fn wait_for(&self, target: u32, timeout: Duration) -> Result<u32> {
        wait::until("a mapped counter's count", timeout, || {
            Some(self.load()).filter(|&value| reached(value, target))
        })
    }
}

impl MappedView for Counter {
    fn memory(&self) -> &MappedWords {
        &self.words
    }

    fn kind(&self) -> MappedKind {
        MappedKind::Counter { kernel_adds: self.writer != Writer::Cpu }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_numbers_compare_across_the_wrap() {
        assert!(reached(5, 5) && reached(6, 5) && !reached(4, 5));
        assert!(reached(2, u32::MAX - 1), "3 past the target, across the wrap");
        assert!(!reached(u32::MAX - 1, 2));
    }

    #[test]
    fn a_flag_published_on_one_thread_releases_what_was_written_before() {
        let device = Device::cpu();
        let flag = std::sync::Arc::new(SeqFlag::new(&device).unwrap());
        let data = std::sync::Arc::new(AtomicU32::new(0));
        let seed =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos() | 1;
        let writer = {
            let (flag, data) = (flag.clone(), data.clone());
            std::thread::spawn(move || {
                for round in 1..=1000u32 {
                    data.store(seed.wrapping_mul(round), Ordering::Relaxed);
                    flag.publish(round);
                    while data.load(Ordering::Acquire) != 0 {
                        std::hint::spin_loop();
                    }
                }
            })
        };
        for round in 1..=1000u32 {
            assert_eq!(flag.wait_for(round, Duration::from_secs(10)).unwrap(), round);
            assert_eq!(data.load(Ordering::Relaxed), seed.wrapping_mul(round), "round {round}");
            data.store(0, Ordering::Release);
        }
        writer.join().unwrap();
    }

    #[test]
    fn a_counter_has_one_writer_and_both_is_refused_without_native_atomics() {
        let device = Device::cpu();
        let error = Counter::new(&device, Writer::Both).unwrap_err();
        assert!(matches!(error, Error::AtomicsNotNative { .. }), "{error}");
        assert!(error.to_string().contains("one writer"), "{error}");
        let gpu = Counter::new(&device, Writer::Gpu).unwrap();
        assert!(gpu.add(1).unwrap_err().to_string().contains("Writer::Cpu"));
        let cpu = std::sync::Arc::new(Counter::new(&device, Writer::Cpu).unwrap());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let cpu = cpu.clone();
                std::thread::spawn(move || (0..10_000).for_each(|_| assert!(cpu.add(3).is_ok())))
            })
            .collect();
        threads.into_iter().for_each(|thread| thread.join().unwrap());
        assert_eq!(cpu.load(), 4 * 10_000 * 3);
        assert!(cpu.wait_for(120_000, Duration::ZERO).is_ok());
        assert!(matches!(cpu.wait_for(120_001, Duration::ZERO), Err(Error::MappedWaitTimeout { .. })));
    }
}
