//! The doorbell's server side: starting the kernel (or the CPU thread), the bounded queue of
//! request slots, the watchdog, and stopping it without ever freeing memory it may touch.

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::cpu;
use super::protocol::{self, EXITED, MAX_DEPTH, Request, STARTED, STOP};
use super::ticket::Ticket;
use crate::backend::Device;
use crate::backend::cuda::{CudaDevice, LaunchConfig, ResidentKernel};
use crate::error::{DoorbellStop, Error, Result};
use crate::handoff::{KernelArgs, Queue};
use crate::kernels::{self, DOORBELL};
use crate::memory::MappedWords;

/// How long a reply (or the kernel's start or stop) may take before it is an error.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// A CPU server's body: serves the doorbell memory of the given depth until told to stop.
type Serve = fn(&[AtomicU32], usize);

/// Threads of the kernel's one block.
const BLOCK_THREADS: u32 = 256;
/// Spins before a waiter starts yielding its core.
pub(super) const SPINS_BEFORE_YIELD: u32 = 1 << 14;

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

enum Server {
    Cpu(Mutex<Option<std::thread::JoinHandle<()>>>),
    /// Leaked with the memory if the kernel does not stop: dropping the queue frees its flag
    /// page, which would wait for the kernel. The token counts the kernel in its context
    /// until it has stopped.
    Cuda(ManuallyDrop<Queue>, ManuallyDrop<ResidentKernel>),
}

/// A persistent server of small requests: a kernel on the GPU, a thread on the CPU backend.
/// See the [module documentation](super).
pub struct Doorbell {
    /// The memory both sides share: mapped pinned memory for the kernel, plain memory for the
    /// CPU server (whose thread holds it too). Leaked (never dropped) if the kernel does not
    /// stop, since it may still touch it.
    memory: ManuallyDrop<Arc<MappedWords>>,
    server: Server,
    pub(super) depth: usize,
    pub(super) timeout: Duration,
    /// The next request's sequence number (from 1); held while a request is written.
    next: Mutex<u64>,
    /// Per slot: a ticket for its request is alive and has not read the reply yet.
    pub(super) outstanding: Box<[AtomicBool]>,
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
        match device {
            Device::Cpu(_) => Doorbell::start_cpu(options, cpu::serve),
            Device::Cuda(cuda) => Doorbell::start_cuda(device, cuda, options),
        }
    }

    /// A doorbell whose server has not started yet, over `memory`.
    fn new(memory: Arc<MappedWords>, server: Server, options: DoorbellOptions) -> Doorbell {
        Doorbell {
            memory: ManuallyDrop::new(memory),
            server,
            depth: options.depth,
            timeout: options.timeout,
            next: Mutex::new(1),
            outstanding: (0..options.depth).map(|_| AtomicBool::new(false)).collect(),
            stopped: AtomicBool::new(false),
            quiet: AtomicBool::new(false),
        }
    }

    /// Starts a thread running `serve` over plain memory as the server (the CPU backend's
    /// [`cpu::serve`]; tests give servers that misbehave).
    fn start_cpu(options: DoorbellOptions, serve: Serve) -> Result<Doorbell> {
        let depth = options.depth;
        let memory = Arc::new(MappedWords::zeroed(&Device::cpu(), protocol::words_for(depth))?);
        let served = Arc::clone(&memory);
        let thread = std::thread::Builder::new()
            .name("hetmem-doorbell".into())
            .spawn(move || serve(served.words(), depth))
            .map_err(|source| Error::Io { context: "starting the doorbell thread".into(), source })?;
        let bell = Doorbell::new(memory, Server::Cpu(Mutex::new(Some(thread))), options);
        bell.wait_started()?;
        Ok(bell)
    }

    /// Allocates the mapped memory and launches the kernel on `cuda`.
    fn start_cuda(device: &Device, cuda: &CudaDevice, options: DoorbellOptions) -> Result<Doorbell> {
        let depth = options.depth;
        let memory = Arc::new(MappedWords::zeroed(device, protocol::words_for(depth))?);
        let kernel = kernels::kernel(cuda, &DOORBELL, "doorbell")?;
        let queue = Queue::new(device)?;
        // Counted in before the launch: from here on hetmem defers frees on this GPU.
        let resident = ResidentKernel::enter(cuda);
        // From here on, dropping the doorbell stops whatever kernel runs: a launch can fail
        // after the kernel was queued (its fence failing).
        let address = memory.device_address().expect("mapped words on a GPU have a device address");
        let bell = Doorbell::new(
            memory,
            Server::Cuda(ManuallyDrop::new(queue), ManuallyDrop::new(resident)),
            options,
        );
        let Server::Cuda(queue, _) = &bell.server else { unreachable!("made above") };
        let config = LaunchConfig { grid: (1, 1, 1), block: (BLOCK_THREADS, 1, 1), shared_bytes: 0 };
        let args = KernelArgs::new().value(address).value(depth as u32);
        // SAFETY: doorbell(u32* words, u32 depth) takes a pointer and a u32, as passed.
        // `address` is the mapped page of CONTROL_WORDS + depth * SLOT_WORDS words, and the
        // kernel touches only words of slots below `depth`. The memory outlives the kernel:
        // shutdown frees it only after the kernel has written EXITED and the stream is idle,
        // and leaks it otherwise.
        unsafe { queue.launch(&kernel, config, args) }?;
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

    pub(super) fn words(&self) -> &[AtomicU32] {
        self.memory.words()
    }

    pub(super) fn slot_base(&self, seq: u64) -> usize {
        protocol::slot_base(self.depth, seq)
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
    /// A request out of bounds; [`Error::DoorbellStopped`] when the server no longer serves;
    /// [`Error::DoorbellTimeout`] when the server has not finished with the slot's previous
    /// request in time; [`Error::WouldBlock`] when the queue stays full of requests whose
    /// tickets have not been waited on.
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
            return Err(Error::DoorbellStopped { cause: DoorbellStop::ShutDown });
        }
        let mut next = self.next.lock().unwrap_or_else(|poison| poison.into_inner());
        let seq = *next;
        let slot = protocol::slot_index(self.depth, seq);
        let base = self.slot_base(seq);
        let words = self.words();
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            let held = self.outstanding[slot].load(Ordering::Acquire);
            // The server must be done reading the slot's previous request before it is rewritten.
            let served = seq <= self.depth as u64
                || protocol::reply_sequence(words, base) == Some((seq - self.depth as u64) as u32);
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
        self.outstanding[slot].store(true, Ordering::Release);
        request.write(words, base, seq);
        *next += 1;
        Ok(Ticket::new(self, seq, request.samples().len()))
    }

    /// Spins, then yields, while waiting; checks the server between yields.
    pub(super) fn pause(&self, spins: u32) -> Result<u32> {
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
    pub(super) fn check_server(&self) -> Result<()> {
        let exited = || self.words()[EXITED].load(Ordering::Acquire) != 0;
        match &self.server {
            Server::Cuda(queue, _) => {
                // cuStreamQuery: not device-synchronising, so safe while the kernel runs.
                // EXITED is read after the stream is seen idle, so that a kernel that wrote it
                // and finished between the two looks is not taken for one that ended unasked.
                if let Some(stream) = queue.stream()
                    && stream.is_idle()?
                    && !exited()
                {
                    return Err(Error::DoorbellStopped { cause: DoorbellStop::ServerEnded });
                }
            }
            // The thread writes EXITED as its last act: one that finished without it panicked.
            // EXITED is read after the thread is seen finished, so that a thread that exited
            // normally between the two looks is not taken for a panic.
            Server::Cpu(_) if self.thread_finished() && !exited() => {
                return Err(Error::DoorbellStopped { cause: DoorbellStop::Panicked });
            }
            Server::Cpu(_) => {}
        }
        if exited() {
            let cause = match self.stopped.load(Ordering::Acquire) {
                true => DoorbellStop::ShutDown,
                false => DoorbellStop::ServerEnded,
            };
            return Err(Error::DoorbellStopped { cause });
        }
        Ok(())
    }

    /// Whether the CPU backend's server thread has finished (false for a kernel).
    fn thread_finished(&self) -> bool {
        match &self.server {
            Server::Cpu(thread) => thread
                .lock()
                .unwrap_or_else(|poison| poison.into_inner())
                .as_ref()
                .is_some_and(std::thread::JoinHandle::is_finished),
            Server::Cuda(..) => false,
        }
    }

    /// Stops the server and frees its memory: requests already submitted are served first.
    ///
    /// # Errors
    /// [`Error::DoorbellStuck`] when the kernel does not stop within the timeout (its memory
    /// is then leaked, never freed under it); the kernel's failure;
    /// [`Error::DoorbellStopped`] when the CPU backend's server thread panicked.
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
            // A thread that panicked never writes EXITED either; joining it says so.
            if self.thread_finished() {
                break;
            }
            if start.elapsed() > self.timeout {
                return Err(Error::DoorbellStuck { timeout: self.timeout });
            }
            std::thread::yield_now();
        }
        match &self.server {
            Server::Cpu(thread) => {
                if let Some(thread) = thread.lock().unwrap_or_else(|poison| poison.into_inner()).take()
                    && thread.join().is_err()
                {
                    // The thread is gone, so nothing touches the memory any more.
                    self.quiet.store(true, Ordering::Release);
                    return Err(Error::DoorbellStopped { cause: DoorbellStop::Panicked });
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
            if self.memory.is_cpu() {
                // SAFETY: plain memory, which the server thread keeps alive through its own
                // handle for as long as it runs; dropped once, here.
                unsafe { ManuallyDrop::drop(&mut self.memory) };
            } else {
                tracing::error!("a doorbell's kernel may still run: leaking its memory and stream");
            }
        } else {
            if let Server::Cuda(_, resident) = &mut self.server {
                // SAFETY: `quiet`: the kernel has ended; dropped once, here. The frees it
                // deferred run now, before the doorbell's own.
                unsafe { ManuallyDrop::drop(resident) };
            }
            // SAFETY: `quiet`: the server never started, or it wrote EXITED and its stream has
            // synchronised (its thread has ended), so nothing touches the memory; dropped once,
            // here.
            unsafe { ManuallyDrop::drop(&mut self.memory) };
            if let Server::Cuda(queue, _) = &mut self.server {
                // SAFETY: as above; the queue is not used after this.
                unsafe { ManuallyDrop::drop(queue) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resident::doorbell::protocol::{CONTROL_WORDS, REQ_LINE, STATUS_UNKNOWN, write_reply};

    const SAMPLES: [f32; 4] = [1.0, 2.0, 3.0, 4.0];

    fn gain() -> Request<'static> {
        Request::Gain { gain: 2.0, samples: &SAMPLES }
    }

    /// A watchdog far longer than any check below takes, so that each state is seen to be
    /// reported by its own check, not by the timeout.
    fn options() -> DoorbellOptions {
        DoorbellOptions { depth: 2, timeout: Duration::from_secs(5) }
    }

    fn expect_stopped<T: std::fmt::Debug>(result: Result<T>, cause: DoorbellStop) {
        match result {
            Err(Error::DoorbellStopped { cause: got }) if got == cause => {}
            other => panic!("expected Error::DoorbellStopped {{ cause: {cause:?} }}, got {other:?}"),
        }
    }

    #[test]
    fn a_submission_after_shutdown_is_refused_as_shut_down() {
        let bell = Doorbell::start_cpu(options(), cpu::serve).unwrap();
        assert_eq!(bell.call(gain()).unwrap(), [2.0, 4.0, 6.0, 8.0]);
        bell.stop().unwrap();
        expect_stopped(bell.submit(gain()), DoorbellStop::ShutDown);
    }

    /// A request still running when the doorbell stops gets a reply that says so.
    #[test]
    fn a_request_running_at_shutdown_reports_the_shutdown() {
        let bell = Doorbell::start_cpu(options(), cpu::serve).unwrap();
        let stalled = bell.submit(Request::Stall).unwrap();
        bell.stop().unwrap();
        expect_stopped(stalled.wait(), DoorbellStop::ShutDown);
    }

    /// A server that exits although the doorbell never asked it to: a wait ends at once with
    /// the cause, not at the watchdog's timeout.
    #[test]
    fn a_server_that_ends_unasked_is_reported() {
        let bell = Doorbell::start_cpu(options(), cpu::serve).unwrap();
        // Tell the server to stop behind the doorbell's back.
        bell.words()[STOP].store(1, Ordering::Release);
        while bell.words()[EXITED].load(Ordering::Acquire) == 0 {
            std::thread::sleep(Duration::from_micros(50));
        }
        let start = Instant::now();
        expect_stopped(bell.call(gain()), DoorbellStop::ServerEnded);
        assert!(start.elapsed() < options().timeout, "reported by the watchdog, not the check");
        bell.shutdown().unwrap();
    }

    /// Marks itself started, then panics at the first request, as a buggy server would.
    fn panics(words: &[AtomicU32], _depth: usize) {
        words[STARTED].store(1, Ordering::Release);
        while words[CONTROL_WORDS + REQ_LINE].load(Ordering::Acquire) == 0 {
            std::thread::sleep(Duration::from_micros(50));
        }
        panic!("a doorbell server that panics on purpose (a test)");
    }

    /// A panicked server thread is reported as such by the wait and by the shutdown, at once:
    /// it once looked like a kernel that would not stop, after the timeout.
    #[test]
    fn a_panicked_server_thread_is_reported() {
        let bell = Doorbell::start_cpu(options(), panics).unwrap();
        let start = Instant::now();
        expect_stopped(bell.call(gain()), DoorbellStop::Panicked);
        expect_stopped(bell.shutdown(), DoorbellStop::Panicked);
        assert!(start.elapsed() < options().timeout, "reported by the watchdog, not the check");
    }

    /// Replies to the first request with `status` and no samples, then waits to be stopped.
    fn reply_once(words: &[AtomicU32], status: u32) {
        words[STARTED].store(1, Ordering::Release);
        while words[CONTROL_WORDS + REQ_LINE].load(Ordering::Acquire) == 0 {
            std::thread::sleep(Duration::from_micros(50));
        }
        write_reply(words, CONTROL_WORDS, 1, status, &[]);
        while words[STOP].load(Ordering::Acquire) == 0 {
            std::thread::sleep(Duration::from_micros(50));
        }
        words[EXITED].store(1, Ordering::Release);
    }

    #[test]
    fn a_reply_that_breaks_the_protocol_is_reported() {
        fn unknown_opcode(words: &[AtomicU32], _depth: usize) {
            reply_once(words, STATUS_UNKNOWN);
        }
        fn unknown_status(words: &[AtomicU32], _depth: usize) {
            reply_once(words, 7);
        }
        let servers: [(Serve, u32); 2] = [(unknown_opcode, STATUS_UNKNOWN), (unknown_status, 7)];
        for (serve, status) in servers {
            let bell = Doorbell::start_cpu(options(), serve).unwrap();
            match bell.call(gain()) {
                Err(Error::DoorbellBadReply { sequence: 1, status: got }) => assert_eq!(got, status),
                other => panic!("expected Error::DoorbellBadReply with status {status}, got {other:?}"),
            }
            bell.shutdown().unwrap();
        }
    }
}
