//! [`Doorbell`]: microsecond round trips to a persistent GPU kernel through mapped memory.
//!
//! Launching a kernel per small request costs 5-10 µs before any work is done. The doorbell
//! launches one kernel (one block) that stays resident and polls a ring of request slots in
//! mapped host memory; the CPU writes a request (a gain or FIR over at most 4 KiB of f32
//! samples), then its sequence number last, and the kernel writes the reply into the same
//! slot, then the reply's sequence number last, after a system-scope fence. Neither side makes
//! a driver call per request.
//!
//! - [`Doorbell::submit`] queues a request and returns a [`Ticket`]; the queue holds `depth`
//!   requests, and a full queue blocks (up to the watchdog timeout) or, with
//!   [`Doorbell::try_submit`], returns [`Error::WouldBlock`].
//! - [`Ticket::wait`] spins, then yields, until the reply arrives; [`Ticket::wait_async`] is
//!   the same as a future. Both are watched: no reply within the timeout (default
//!   [`DEFAULT_TIMEOUT`]) is [`Error::DoorbellTimeout`], never a hang.
//! - [`Doorbell::shutdown`] (and `Drop`) asks the kernel to stop, waits a bounded time for it
//!   to exit and for its stream; a kernel that does not stop is reported and its memory leaked
//!   (freeing it would wait for the kernel for ever).
//!
//! Arithmetic: gain is one f32 multiply, FIR accumulates `taps[j] * x[i - j]` from `j = 0` up
//! with fused multiply-adds; the kernel and [`Request::reference`] do exactly the same, so
//! results are **bit-exact** with the CPU.
//!
//! # The persistent kernel and the driver
//! While the kernel runs, driver calls that wait for the whole device (freeing or unregistering
//! memory, loading or unloading a module, `cuCtxSynchronize`) would wait for it, that is until
//! shutdown, in any thread of the process. hetmem enforces this in its CUDA backend (see
//! `backend::cuda`'s resident kernels): while a doorbell runs on a GPU, hetmem defers its own
//! frees on that GPU until the doorbell has stopped, and loading a kernel for the first time or
//! synchronising the device fails at once with [`Error::ResidentKernelRunning`] instead of
//! hanging. Allocating and pinning memory, copies and launches on other queues go on as
//! usual. Driver calls made by other libraries in the process are outside hetmem's reach.
//!
//! On the CPU backend a thread plays the kernel's part with the same protocol, so the same
//! code runs and is tested without a GPU.
//!
//! # Examples
//! ```
//! use hetmem::Device;
//! use hetmem::handoff::{Doorbell, Request};
//!
//! let device = Device::open_best()?;
//! let bell = Doorbell::start(&device, 8)?;
//! let samples = [1.0f32, 2.0, 3.0, 4.0];
//! let reply = bell.submit(Request::Gain { gain: 0.5, samples: &samples })?.wait()?;
//! assert_eq!(reply, [0.5, 1.0, 1.5, 2.0]);
//! bell.shutdown()?;
//! # Ok::<(), hetmem::Error>(())
//! ```

mod cpu;

use std::future::Future;
use std::mem::ManuallyDrop;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::{KernelArgs, Queue};
use crate::backend::Device;
use crate::backend::cuda::{HostAllocFlags, LaunchConfig, PinnedAlloc, ResidentKernel};
use crate::error::{Error, Result};
use crate::kernels::{self, DOORBELL};

/// The most samples one request carries (4 KiB of f32).
pub const MAX_SAMPLES: usize = 1024;
/// The most FIR taps one request carries.
pub const MAX_TAPS: usize = 64;
/// The most requests a doorbell queues.
pub const MAX_DEPTH: usize = 256;
/// How long a reply (or the kernel's start or stop) may take before it is an error.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

// The layout in 32-bit words, as in kernels/doorbell.cu.
const STOP: usize = 0;
const STARTED: usize = 1;
const EXITED: usize = 2;
const CONTROL_WORDS: usize = 32;
const SLOT_WORDS: usize = 2144;
/// The doorbell word: the sequence number's low 16 bits, the sample count, the opcode; written
/// last, so one read tells the server a request has arrived and what it is.
const REQ_SEQ: usize = 0;
const SEQ_MASK: u32 = 0xFFFF;
const LEN_SHIFT: u32 = 16;
const LEN_MASK: u32 = 0x7FF;
const OP_SHIFT: u32 = 27;
const REQ_TAPS: usize = 3;
const REQ_GAIN: usize = 4;
const TAPS: usize = 16;
const SAMPLES: usize = 80;
const REPLY_SEQ: usize = 1104;
const REPLY_STATUS: usize = 1105;
const REPLY_SAMPLES: usize = 1120;

const OP_GAIN: u32 = 1;
const OP_FIR: u32 = 2;
const OP_STALL: u32 = 3;
const OP_WEDGE: u32 = 4;

const STATUS_DONE: u32 = 0;
const STATUS_UNKNOWN: u32 = 1;
const STATUS_STOPPED: u32 = 2;

/// Threads of the kernel's one block.
const BLOCK_THREADS: u32 = 256;
/// Spins before a waiter starts yielding its core.
const SPINS_BEFORE_YIELD: u32 = 1 << 14;

/// A small request for the doorbell.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Request<'a> {
    /// `y[i] = gain * x[i]`.
    Gain {
        /// The factor.
        gain: f32,
        /// The samples (1 to [`MAX_SAMPLES`]).
        samples: &'a [f32],
    },
    /// `y[i] = sum over j of taps[j] * x[i - j]`, samples before the block taken as 0.
    Fir {
        /// The taps (1 to [`MAX_TAPS`]).
        taps: &'a [f32],
        /// The samples (1 to [`MAX_SAMPLES`]).
        samples: &'a [f32],
    },
    /// Feature `testing` only: the server spins until shut down and never replies, so the
    /// watchdog fires.
    #[cfg(feature = "testing")]
    Stall,
    /// Feature `testing` only: the server spins for `millis` milliseconds and ignores shutdown
    /// meanwhile, like a kernel that is stuck.
    #[cfg(feature = "testing")]
    Wedge {
        /// How long.
        millis: u32,
    },
}

impl Request<'_> {
    fn samples(&self) -> &[f32] {
        match self {
            Request::Gain { samples, .. } | Request::Fir { samples, .. } => samples,
            #[cfg(feature = "testing")]
            Request::Stall | Request::Wedge { .. } => &[],
        }
    }

    fn check(&self) -> Result<()> {
        let samples = self.samples().len();
        #[cfg(feature = "testing")]
        let test_only = matches!(self, Request::Stall | Request::Wedge { .. });
        #[cfg(not(feature = "testing"))]
        let test_only = false;
        if !test_only && !(1..=MAX_SAMPLES).contains(&samples) {
            return Err(Error::invalid("doorbell request", format!("{samples} samples: 1 to {MAX_SAMPLES}")));
        }
        if let Request::Fir { taps, .. } = self
            && !(1..=MAX_TAPS).contains(&taps.len())
        {
            return Err(Error::invalid("doorbell request", format!("{} taps: 1 to {MAX_TAPS}", taps.len())));
        }
        Ok(())
    }

    /// The reply computed on the CPU, exactly as the kernel computes it (bit for bit).
    pub fn reference(&self) -> Vec<f32> {
        match *self {
            Request::Gain { gain, samples } => gain_of(gain, samples),
            Request::Fir { taps, samples } => fir_of(taps, samples),
            #[cfg(feature = "testing")]
            Request::Stall | Request::Wedge { .. } => Vec::new(),
        }
    }
}

fn gain_of(gain: f32, samples: &[f32]) -> Vec<f32> {
    samples.iter().map(|&x| gain * x).collect()
}

fn fir_of(taps: &[f32], samples: &[f32]) -> Vec<f32> {
    (0..samples.len())
        .map(|i| {
            taps.iter()
                .take(i + 1)
                .enumerate()
                .fold(0.0f32, |acc, (j, &tap)| tap.mul_add(samples[i - j], acc))
        })
        .collect()
}

/// How a [`Doorbell`] is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DoorbellOptions {
    /// Requests queued at once: a power of two, 1 to [`MAX_DEPTH`].
    pub depth: usize,
    /// The watchdog: how long a reply, the kernel's start or its stop may take.
    pub timeout: Duration,
}

impl Default for DoorbellOptions {
    fn default() -> DoorbellOptions {
        DoorbellOptions { depth: 8, timeout: DEFAULT_TIMEOUT }
    }
}

/// The memory both sides share: mapped pinned memory for the kernel, plain memory for the CPU
/// server.
enum Memory {
    Cpu(Arc<[AtomicU32]>),
    /// Leaked (never dropped) if the kernel does not stop, since it may still touch it.
    Cuda(ManuallyDrop<PinnedAlloc>),
}

enum Server {
    Cpu(Mutex<Option<std::thread::JoinHandle<()>>>),
    /// Leaked with the memory if the kernel does not stop: dropping the queue frees its flag
    /// page, which would wait for the kernel. The token counts the kernel in its context
    /// until it has stopped.
    Cuda(ManuallyDrop<Queue>, ManuallyDrop<ResidentKernel>),
}

/// A persistent server of small requests: a kernel on the GPU, a thread on the CPU backend.
/// See the [module documentation](self).
pub struct Doorbell {
    memory: Memory,
    server: Server,
    depth: usize,
    timeout: Duration,
    /// The next request's sequence number (from 1); held while a request is written.
    next: Mutex<u64>,
    /// Per slot: a ticket for its request is alive and has not read the reply yet.
    outstanding: Box<[AtomicBool]>,
    stopped: AtomicBool,
    /// No server touches the memory: never started, or stopped and its stream idle. Only then
    /// may the memory be freed.
    quiet: AtomicBool,
}

impl std::fmt::Debug for Doorbell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let backend = match self.server {
            Server::Cpu(_) => "cpu",
            Server::Cuda(..) => "cuda",
        };
        f.debug_struct("Doorbell")
            .field("backend", &backend)
            .field("depth", &self.depth)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Doorbell {
    /// Starts a doorbell on `device` queueing up to `depth` requests, with the default
    /// watchdog timeout.
    ///
    /// # Errors
    /// As for [`Doorbell::start_with`].
    pub fn start(device: &Device, depth: usize) -> Result<Doorbell> {
        Doorbell::start_with(device, DoorbellOptions { depth, ..DoorbellOptions::default() })
    }

    /// Starts a doorbell: allocates its mapped memory and launches its kernel (or thread), and
    /// waits for it to run.
    ///
    /// # Errors
    /// A depth that is not a power of two in 1..=[`MAX_DEPTH`]; the allocation, compile or
    /// launch failing; the kernel not starting within the timeout.
    pub fn start_with(device: &Device, options: DoorbellOptions) -> Result<Doorbell> {
        let depth = options.depth;
        if !(depth.is_power_of_two() && depth <= MAX_DEPTH) {
            return Err(Error::invalid(
                "doorbell depth",
                format!("{depth}: a power of two from 1 to {MAX_DEPTH} (sequence numbers wrap at 2^32)"),
            ));
        }
        let words = CONTROL_WORDS + depth * SLOT_WORDS;
        let outstanding = (0..depth).map(|_| AtomicBool::new(false)).collect();
        let (memory, server) = match device {
            Device::Cpu(_) => {
                let memory: Arc<[AtomicU32]> = (0..words).map(|_| AtomicU32::new(0)).collect();
                let served = Arc::clone(&memory);
                let thread = std::thread::Builder::new()
                    .name("hetmem-doorbell".into())
                    .spawn(move || cpu::serve(&served, depth))
                    .map_err(|source| Error::Io { context: "starting the doorbell thread".into(), source })?;
                (Memory::Cpu(memory), Server::Cpu(Mutex::new(Some(thread))))
            }
            Device::Cuda(cuda) => {
                let flags = HostAllocFlags { device_map: true, ..HostAllocFlags::default() };
                let alloc = PinnedAlloc::new(cuda, words * 4, flags)?;
                let kernel = kernels::kernel(cuda, &DOORBELL, "doorbell")?;
                let queue = Queue::new(device)?;
                // Counted in before the launch: from here on hetmem defers frees on this GPU.
                let resident = ResidentKernel::enter(cuda);
                let bell = Doorbell {
                    memory: Memory::Cuda(ManuallyDrop::new(alloc)),
                    server: Server::Cuda(ManuallyDrop::new(queue), ManuallyDrop::new(resident)),
                    depth,
                    timeout: options.timeout,
                    next: Mutex::new(1),
                    outstanding,
                    // From here on, dropping the doorbell stops whatever kernel runs: a launch
                    // can fail after the kernel was queued (its fence failing).
                    stopped: AtomicBool::new(false),
                    quiet: AtomicBool::new(false),
                };
                bell.words().iter().for_each(|word| word.store(0, Ordering::Relaxed));
                let Memory::Cuda(alloc) = &bell.memory else { unreachable!("made above") };
                let address = alloc.device_ptr().expect("allocated with device_map");
                let Server::Cuda(queue, _) = &bell.server else { unreachable!("made above") };
                let config = LaunchConfig { grid: (1, 1, 1), block: (BLOCK_THREADS, 1, 1), shared_bytes: 0 };
                let args = KernelArgs::new().value(address).value(depth as u32);
                // SAFETY: doorbell(u32* words, u32 depth) takes a pointer and a u32, as passed.
                // `address` is the mapped page of CONTROL_WORDS + depth * SLOT_WORDS words, and
                // the kernel touches only words of slots below `depth`. The memory outlives the
                // kernel: shutdown frees it only after the kernel has written EXITED and the
                // stream is idle, and leaks it otherwise.
                unsafe { queue.launch(&kernel, config, args) }?;
                bell.wait_started()?;
                return Ok(bell);
            }
        };
        let bell = Doorbell {
            memory,
            server,
            depth,
            timeout: options.timeout,
            next: Mutex::new(1),
            outstanding,
            stopped: AtomicBool::new(false),
            quiet: AtomicBool::new(false),
        };
        bell.wait_started()?;
        Ok(bell)
    }

    fn wait_started(&self) -> Result<()> {
        let start = Instant::now();
        while self.words()[STARTED].load(Ordering::Acquire) == 0 {
            self.check_server()?;
            if start.elapsed() > self.timeout {
                return Err(Error::DoorbellTimeout { sequence: 0, timeout: self.timeout });
            }
            std::thread::yield_now();
        }
        Ok(())
    }

    fn words(&self) -> &[AtomicU32] {
        match &self.memory {
            Memory::Cpu(words) => words,
            Memory::Cuda(alloc) => {
                // SAFETY: the allocation is page-aligned (so 4-byte aligned), len_bytes long
                // and owned by `self` for as long as the returned borrow; the CPU touches it
                // only through these atomics, the kernel only through 32-bit accesses.
                unsafe {
                    std::slice::from_raw_parts(alloc.host_ptr().cast::<AtomicU32>(), alloc.len_bytes() / 4)
                }
            }
        }
    }

    fn slot_base(&self, seq: u64) -> usize {
        CONTROL_WORDS + ((seq - 1) as usize % self.depth) * SLOT_WORDS
    }

    /// The watchdog timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Requests queued at once.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Queues `request`, waiting while the queue is full (up to the timeout).
    ///
    /// # Errors
    /// A request out of bounds; a doorbell shut down; [`Error::DoorbellTimeout`] when the
    /// server has not finished with the slot's previous request in time; [`Error::WouldBlock`]
    /// when the queue stays full of requests whose tickets have not been waited on.
    pub fn submit(&self, request: Request<'_>) -> Result<Ticket<'_>> {
        self.enqueue(request, true)
    }

    /// Queues `request`, or returns [`Error::WouldBlock`] at once when the queue is full.
    ///
    /// # Errors
    /// As for [`Doorbell::submit`].
    pub fn try_submit(&self, request: Request<'_>) -> Result<Ticket<'_>> {
        self.enqueue(request, false)
    }

    /// Submits `request` and waits for its reply.
    ///
    /// # Errors
    /// As for [`Doorbell::submit`] and [`Ticket::wait`].
    pub fn call(&self, request: Request<'_>) -> Result<Vec<f32>> {
        self.submit(request)?.wait()
    }

    fn enqueue(&self, request: Request<'_>, block: bool) -> Result<Ticket<'_>> {
        request.check()?;
        if self.stopped.load(Ordering::Acquire) {
            return Err(Error::invalid("doorbell", "it has been shut down"));
        }
        let mut next = self.next.lock().unwrap_or_else(|poison| poison.into_inner());
        let seq = *next;
        let slot = (seq - 1) as usize % self.depth;
        let base = self.slot_base(seq);
        let words = self.words();
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            let held = self.outstanding[slot].load(Ordering::Acquire);
            // The server must be done reading the slot's previous request before it is rewritten.
            let served = seq <= self.depth as u64
                || words[base + REPLY_SEQ].load(Ordering::Acquire) == (seq - self.depth as u64) as u32;
            if !held && served {
                break;
            }
            let full = || {
                if held {
                    Error::WouldBlock(
                        "a doorbell submission (its queue is full of tickets not yet waited on)",
                    )
                } else {
                    Error::WouldBlock("a doorbell submission (the server is busy with earlier requests)")
                }
            };
            if !block {
                return Err(full());
            }
            if start.elapsed() > self.timeout {
                return Err(if held {
                    full()
                } else {
                    Error::DoorbellTimeout { sequence: seq - self.depth as u64, timeout: self.timeout }
                });
            }
            spins = self.pause(spins)?;
        }
        let (op, taps, gain) = match request {
            Request::Gain { gain, .. } => (OP_GAIN, &[][..], gain),
            Request::Fir { taps, .. } => (OP_FIR, taps, 0.0),
            #[cfg(feature = "testing")]
            Request::Stall => (OP_STALL, &[][..], 0.0),
            #[cfg(feature = "testing")]
            Request::Wedge { millis } => (OP_WEDGE, &[][..], f32::from_bits(millis)),
        };
        let samples = request.samples();
        words[base + REQ_TAPS].store(taps.len() as u32, Ordering::Relaxed);
        words[base + REQ_GAIN].store(gain.to_bits(), Ordering::Relaxed);
        for (word, tap) in words[base + TAPS..].iter().zip(taps) {
            word.store(tap.to_bits(), Ordering::Relaxed);
        }
        for (word, sample) in words[base + SAMPLES..].iter().zip(samples) {
            word.store(sample.to_bits(), Ordering::Relaxed);
        }
        self.outstanding[slot].store(true, Ordering::Release);
        // Last: the doorbell word that hands the slot to the server.
        let bell = (seq as u32 & SEQ_MASK) | ((samples.len() as u32) << LEN_SHIFT) | (op << OP_SHIFT);
        words[base + REQ_SEQ].store(bell, Ordering::Release);
        *next += 1;
        Ok(Ticket { bell: self, seq, len: samples.len(), started: None })
    }

    /// Spins, then yields, while waiting; checks the server between yields.
    fn pause(&self, spins: u32) -> Result<u32> {
        if spins < SPINS_BEFORE_YIELD {
            std::hint::spin_loop();
        } else {
            if spins.is_multiple_of(256) {
                self.check_server()?;
            }
            std::thread::yield_now();
        }
        Ok(spins.saturating_add(1))
    }

    /// An error if the server has failed or exited.
    fn check_server(&self) -> Result<()> {
        let exited = self.words()[EXITED].load(Ordering::Acquire) != 0;
        if let Server::Cuda(queue, _) = &self.server {
            // cuStreamQuery: not device-synchronising, so safe while the kernel runs.
            if let Some(stream) = queue.stream() {
                let idle = stream.is_idle()?;
                if idle && !exited {
                    return Err(Error::invalid("doorbell", "its kernel is no longer running"));
                }
            }
        }
        if exited {
            return Err(Error::invalid("doorbell", "its server has stopped"));
        }
        Ok(())
    }

    /// Stops the server and frees its memory: requests already submitted are served first.
    ///
    /// # Errors
    /// The kernel not stopping within the timeout (its memory is then leaked, never freed
    /// under it), or the kernel's failure.
    pub fn shutdown(self) -> Result<()> {
        let result = self.stop();
        // Drop finds it stopped.
        drop(self);
        result
    }

    fn stop(&self) -> Result<()> {
        if self.stopped.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.words()[STOP].store(1, Ordering::Release);
        let start = Instant::now();
        while self.words()[EXITED].load(Ordering::Acquire) == 0 {
            if let Server::Cuda(queue, _) = &self.server
                && let Some(stream) = queue.stream()
            {
                // A failed kernel never writes EXITED; its error ends the wait (and the memory
                // stays leaked: the context is lost). An idle stream runs no kernel: one that
                // never launched, so nothing touches the memory.
                if stream.is_idle()? {
                    break;
                }
            }
            if start.elapsed() > self.timeout {
                return Err(Error::DoorbellStuck { timeout: self.timeout });
            }
            std::thread::yield_now();
        }
        match &self.server {
            Server::Cpu(thread) => {
                if let Some(thread) = thread.lock().unwrap_or_else(|poison| poison.into_inner()).take() {
                    thread.join().map_err(|_| Error::invalid("doorbell", "its thread panicked"))?;
                }
            }
            Server::Cuda(queue, _) => queue.synchronize()?,
        }
        self.quiet.store(true, Ordering::Release);
        Ok(())
    }
}

impl Drop for Doorbell {
    fn drop(&mut self) {
        if let Err(error) = self.stop() {
            tracing::error!("stopping a doorbell failed: {error}");
        }
        // A failed stop (now, or in an earlier `shutdown`) leaves the memory to the kernel.
        if !self.quiet.load(Ordering::Acquire) {
            tracing::error!("a doorbell's kernel may still run: leaking its memory and stream");
        } else {
            if let Server::Cuda(_, resident) = &mut self.server {
                // SAFETY: `quiet`: the kernel has ended; dropped once, here. The frees it
                // deferred run now, before the doorbell's own.
                unsafe { ManuallyDrop::drop(resident) };
            }
            if let Memory::Cuda(alloc) = &mut self.memory {
                // SAFETY: `quiet`: the kernel never launched, or it wrote EXITED and its stream
                // has synchronised, so nothing on the GPU touches the memory; dropped once, here.
                unsafe { ManuallyDrop::drop(alloc) };
            }
            if let Server::Cuda(queue, _) = &mut self.server {
                // SAFETY: as above; the queue is not used after this.
                unsafe { ManuallyDrop::drop(queue) };
            }
        }
    }
}

/// A submitted request; [`Ticket::wait`] gets its reply. Dropping it without waiting is
/// allowed: its slot is reused once the server has replied.
#[derive(Debug)]
#[must_use = "a ticket's reply is read with wait() or wait_async()"]
pub struct Ticket<'bell> {
    bell: &'bell Doorbell,
    seq: u64,
    len: usize,
    /// When an async wait first found no reply, for its watchdog.
    started: Option<Instant>,
}

impl<'bell> Ticket<'bell> {
    /// The request's sequence number (from 1).
    pub fn sequence(&self) -> u64 {
        self.seq
    }

    /// The reply, if it has arrived.
    fn reply(&self) -> Option<Result<Vec<f32>>> {
        let words = self.bell.words();
        let base = self.bell.slot_base(self.seq);
        if words[base + REPLY_SEQ].load(Ordering::Acquire) != self.seq as u32 {
            return None;
        }
        Some(match words[base + REPLY_STATUS].load(Ordering::Relaxed) {
            STATUS_DONE => Ok(words[base + REPLY_SAMPLES..base + REPLY_SAMPLES + self.len]
                .iter()
                .map(|word| f32::from_bits(word.load(Ordering::Relaxed)))
                .collect()),
            STATUS_UNKNOWN => Err(Error::invalid("doorbell request", "the server did not know its opcode")),
            STATUS_STOPPED => {
                Err(Error::invalid("doorbell request", "the doorbell was shut down while it ran"))
            }
            other => Err(Error::invalid("doorbell reply", format!("unknown status {other}"))),
        })
    }

    /// Waits for the reply: spins first (the reply takes microseconds), then yields.
    ///
    /// # Errors
    /// [`Error::DoorbellTimeout`] when no reply comes within the doorbell's timeout; the
    /// kernel's failure.
    pub fn wait(self) -> Result<Vec<f32>> {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if let Some(reply) = self.reply() {
                return reply;
            }
            if spins >= SPINS_BEFORE_YIELD && start.elapsed() > self.bell.timeout {
                return Err(Error::DoorbellTimeout { sequence: self.seq, timeout: self.bell.timeout });
            }
            spins = self.bell.pause(spins)?;
        }
    }

    /// The reply as a future, for async code. It polls the reply word each time the executor
    /// polls it and asks to be polled again at once while there is none, so it keeps a worker
    /// busy for the few microseconds a reply takes; the watchdog applies as for
    /// [`Ticket::wait`].
    pub fn wait_async(self) -> TicketFuture<'bell> {
        TicketFuture { ticket: Some(self) }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let slot = (self.seq - 1) as usize % self.bell.depth;
        self.bell.outstanding[slot].store(false, Ordering::Release);
    }
}

/// The future of [`Ticket::wait_async`].
#[derive(Debug)]
#[must_use = "a future does nothing unless awaited"]
pub struct TicketFuture<'bell> {
    ticket: Option<Ticket<'bell>>,
}

impl Future for TicketFuture<'_> {
    type Output = Result<Vec<f32>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(ticket) = self.ticket.as_mut() else {
            return Poll::Ready(Err(Error::invalid("doorbell future", "polled after it completed")));
        };
        if let Some(reply) = ticket.reply() {
            self.ticket = None;
            return Poll::Ready(reply);
        }
        let started = *ticket.started.get_or_insert_with(Instant::now);
        if started.elapsed() > ticket.bell.timeout {
            let error = Error::DoorbellTimeout { sequence: ticket.seq, timeout: ticket.bell.timeout };
            self.ticket = None;
            return Poll::Ready(Err(error));
        }
        if let Err(error) = ticket.bell.check_server() {
            self.ticket = None;
            return Poll::Ready(Err(error));
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}
