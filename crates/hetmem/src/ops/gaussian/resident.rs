//! [`ResidentGaussian`]: the blur of one frame at a time from mapped input into mapped
//! output by a kernel that stays on the GPU (its documentation says how and at what cost).

use std::collections::BTreeMap;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::cpu::gaussian_cpu;
use super::gpu::{Entry, GaussianPlan, check_aligned};
use super::{FrameFormat, Gaussian};
use crate::backend::Device;
use crate::backend::cuda::{CudaDevice, LaunchConfig, ResidentKernel};
use crate::error::{Error, FrameMemoryHolder, Result};
use crate::handoff::{KernelArgs, Queue};
use crate::memory::{DeviceBuf, HostBuf, MappedWords, PinMethod, PinOptions};
use crate::stage::Strategy;

/// How long a frame, or the kernel's start or stop, may take before it is an error.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// The host words (`RB_*` in gaussian.cu), a 64-byte line each: the CPU's bell, the kernel's
/// ready and done words.
const BELL: usize = 0;
const READY: usize = 16;
const DONE: usize = 32;
const HOST_WORDS: usize = 48;
/// The kernel's words in device memory (`RB_DEVICE_WORDS`).
const DEVICE_WORDS: usize = 96;
/// The bell's value that stops the kernel (`RB_STOP`).
const STOP: u32 = u32::MAX;
/// How long the CPU spins on the done word before it yields its core between looks (and
/// asks the driver whether the kernel still runs: no driver call during a frame's first
/// milliseconds).
const SPIN_FOR: Duration = Duration::from_millis(2);
/// How often, past [`SPIN_FOR`], a frame's wait asks the driver whether the kernel still runs.
const CHECK_EVERY: Duration = Duration::from_millis(1);
/// The shortest watchdog: below it a kernel that has just been launched, or a frame of a
/// large format, would look hung.
pub const MIN_TIMEOUT: Duration = Duration::from_millis(10);

/// Blocks of the resident blurs running on each GPU (by ordinal): together at most half its
/// SMs, so that other kernels still find room beside them.
static RESIDENT_BLOCKS: Mutex<BTreeMap<usize, u32>> = Mutex::new(BTreeMap::new());

/// A resident blur's share of its GPU's SMs, given back when it stops.
#[derive(Debug)]
struct BlockClaim {
    ordinal: usize,
    blocks: u32,
}

impl BlockClaim {
    /// Claims `blocks` of the GPU `ordinal`'s resident half of its `multiprocessors`.
    fn take(ordinal: usize, blocks: u32, multiprocessors: u32) -> Result<BlockClaim> {
        let mut running = RESIDENT_BLOCKS.lock().unwrap_or_else(|poison| poison.into_inner());
        let used = running.entry(ordinal).or_default();
        let limit = (multiprocessors / 2).max(1);
        if used.saturating_add(blocks) > limit {
            return Err(Error::invalid(
                "resident blur",
                format!(
                    "{blocks} more blocks on GPU {ordinal}, where resident blurs hold {used} already: together \
                     they may take {limit} (half its SMs); shut one down, or ask for fewer tiles"
                ),
            ));
        }
        *used += blocks;
        Ok(BlockClaim { ordinal, blocks })
    }
}

impl Drop for BlockClaim {
    fn drop(&mut self) {
        let mut running = RESIDENT_BLOCKS.lock().unwrap_or_else(|poison| poison.into_inner());
        if let Some(used) = running.get_mut(&self.ordinal) {
            *used = used.saturating_sub(self.blocks);
        }
    }
}

/// The sequence number after `seq`: 1 to 0xFFFF_FFFE, never 0 (nothing rung) or [`STOP`]
/// (`rb_next` in gaussian.cu).
fn next_sequence(seq: u32) -> u32 {
    seq % 0xFFFF_FFFE + 1
}

/// How a [`ResidentGaussian`] is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResidentOptions {
    /// [`Strategy::ZeroCopy`] (the kernel reads its table of weights and tiles across the link
    /// too) or [`Strategy::Hybrid`] (the table in device memory). Frames stay in mapped host
    /// memory either way.
    pub strategy: Strategy,
    /// About how many tiles to cut a frame into, at least 1 (`None`: three per eight SMs; at
    /// least one range of rows across every band). At most one block per two SMs runs them,
    /// since every block stays resident.
    pub tiles: Option<u32>,
    /// The watchdog, at least [`MIN_TIMEOUT`]: how long a frame or the kernel's start may
    /// take. A stop waits twice as long, and at least two seconds (a frame still running
    /// finishes first).
    pub timeout: Duration,
}

impl Default for ResidentOptions {
    fn default() -> ResidentOptions {
        ResidentOptions { strategy: Strategy::ZeroCopy, tiles: None, timeout: DEFAULT_TIMEOUT }
    }
}

/// The plan's table where the kernel reads it.
enum Table {
    Mapped(HostBuf<u32>),
    Device(DeviceBuf<u32>),
    /// The CPU backend reads the plan.
    Cpu,
}

/// Everything the kernel touches: freed only once it has stopped, leaked otherwise.
struct Memory {
    input: HostBuf<u8>,
    output: HostBuf<u8>,
    /// Held only for the kernel, which reads it every frame.
    _table: Table,
    /// `RB_GO`, `RB_ARRIVED`, `RB_FINISHED`; `None` on the CPU backend.
    _device_words: Option<DeviceBuf<u32>>,
    /// The bell, ready and done words (shared with a test's stand-in for the kernel).
    host_words: Arc<MappedWords>,
}

enum Server {
    /// The CPU backend: frames run on the calling thread.
    Cpu,
    /// The kernel, on its own queue, counted as resident until it has stopped, with its claim
    /// on the GPU's SMs. Leaked with the memory if it does not stop (its SMs stay taken).
    Cuda(ManuallyDrop<Queue>, ManuallyDrop<(ResidentKernel, BlockClaim)>),
    /// Tests: a thread playing the kernel's part on the words alone.
    #[cfg(test)]
    Thread(Option<std::thread::JoinHandle<()>>),
}

/// A Gaussian blur of one frame at a time from mapped input into mapped output by a kernel
/// that stays on the GPU, for the lowest latency a frame can have.
///
/// A frame by the zero-copy or hybrid strategy ([`crate::FrameFilter`]) costs a launch, a
/// completion and hetmem's leases on top of the kernel's time: 8-11 us and 3-8 us on the H200
/// machine, around a kernel of about 200 us at 1080p. Here the kernel is launched once, with
/// every block running at once, and waits for the CPU: the CPU writes the frame into the
/// filter's input ([`ResidentGaussian::input_mut`]) and a sequence number into a mapped word;
/// block 0 sees it across the link and passes it on to the other blocks in device memory;
/// the blocks blur the frame into the mapped output, and the last to finish writes the
/// sequence number into another mapped word, which the CPU is spinning on. No driver call is
/// made per frame. The words are laid out in `kernels/gaussian.cu` (`RB_*`).
///
/// The hand-off is the borrow: [`ResidentGaussian::run`] takes the filter mutably and returns
/// only once the kernel has written the frame (or has failed to), so no slice of the input or
/// the output can be alive while the GPU uses them. A frame that does not finish within the
/// timeout leaves the memory to the kernel (it may still touch it): from then on the filter
/// refuses every access ([`Error::FrameMemoryLost`]), and on drop it leaks what the kernel
/// may still touch rather than free it.
///
/// The cost: the kernel holds its SMs (48 of the H200's 132 at 1080p by default) for as long as
/// it runs, and while it runs hetmem defers its frees on that GPU and refuses to load kernels
/// for the first time or to synchronise the device (see [`crate::resident`]): start it in a
/// process whose other kernels have run once. The CPU spins while it waits for a frame.
///
/// On the CPU backend the frame is blurred on the calling thread ([`gaussian_cpu`]), the same
/// bytes.
pub struct ResidentGaussian {
    memory: ManuallyDrop<Memory>,
    server: Server,
    plan: GaussianPlan,
    strategy: Strategy,
    timeout: Duration,
    /// The last frame's sequence number (0 before the first).
    seq: u32,
    /// Frames run.
    frames: u64,
    /// A frame failed or timed out: the kernel may still touch the memory (frame index).
    lost_at: Option<u64>,
    stopped: bool,
    /// Nothing touches the memory any more: only then may it be freed.
    quiet: bool,
}

impl std::fmt::Debug for ResidentGaussian {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResidentGaussian")
            .field("format", self.plan.format())
            .field("strategy", &self.strategy)
            .field("tiles", &self.plan.tiles())
            .field("blocks", &self.plan.blocks())
            .field("frames", &self.frames)
            .finish_non_exhaustive()
    }
}

impl ResidentGaussian {
    /// Starts a resident blur of `format` frames by `kernel` on `device`, zero-copy, with the
    /// default tiling and watchdog.
    ///
    /// # Errors
    /// As for [`ResidentGaussian::start_with`].
    pub fn start(device: &Device, format: FrameFormat, kernel: &Gaussian) -> Result<ResidentGaussian> {
        ResidentGaussian::start_with(device, format, kernel, ResidentOptions::default())
    }

    /// Starts a resident blur: allocates its frames in mapped pinned memory, launches the
    /// kernel and waits until every block runs.
    ///
    /// # Errors
    /// A strategy other than zero-copy or hybrid; a GPU that cannot map host memory; the
    /// allocations, the kernel's load or its launch failing; the blocks not all running within
    /// the timeout (other work holds the GPU's SMs).
    pub fn start_with(
        device: &Device,
        format: FrameFormat,
        kernel: &Gaussian,
        options: ResidentOptions,
    ) -> Result<ResidentGaussian> {
        if !matches!(options.strategy, Strategy::ZeroCopy | Strategy::Hybrid) {
            return Err(Error::invalid(
                "resident blur strategy",
                format!(
                    "{}: the resident blur keeps its frames in mapped host memory, so it runs by \
                     zero-copy (its table mapped too) or hybrid (its table in device memory)",
                    options.strategy
                ),
            ));
        }
        if options.timeout < MIN_TIMEOUT {
            return Err(Error::invalid(
                "resident blur timeout",
                format!(
                    "{:?}: give at least {MIN_TIMEOUT:?} (a frame of a large format takes milliseconds)",
                    options.timeout
                ),
            ));
        }
        if options.tiles == Some(0) {
            return Err(Error::invalid("resident blur tiles", "0: give at least 1, or None for the default"));
        }
        let offers = device.capabilities();
        if offers.gpu && !offers.maps_host_memory {
            return Err(Error::invalid(
                "resident blur",
                format!("{} cannot map host memory, where the resident blur keeps its frames", device.name()),
            ));
        }
        let queue = Queue::new(device)?;
        let plan = GaussianPlan::for_resident(&format, kernel, offers.multiprocessors, options.tiles)?;
        let frame_bytes = format.frame_bytes();
        let pin = PinOptions { mapped: true, method: PinMethod::HostAlloc, ..PinOptions::default() };
        let input = HostBuf::<u8>::pinned(device, frame_bytes, pin)?;
        let output = HostBuf::<u8>::pinned(device, frame_bytes, pin)?;
        let host_words = Arc::new(MappedWords::zeroed(device, HOST_WORDS)?);
        let Some(cuda) = queue.cuda_device().cloned() else {
            let memory = Memory { input, output, _table: Table::Cpu, _device_words: None, host_words };
            return Ok(ResidentGaussian::new(memory, Server::Cpu, plan, options));
        };
        let table = match options.strategy {
            Strategy::Hybrid => {
                let mut table = DeviceBuf::<u32>::new(device, plan.table().len())?;
                table.copy_from_slice(plan.table())?;
                Table::Device(table)
            }
            _ => {
                let mut table = HostBuf::<u32>::pinned(device, plan.table().len(), pin)?;
                table.as_mut_slice().copy_from_slice(plan.table());
                Table::Mapped(table)
            }
        };
        let mut device_words = DeviceBuf::<u32>::new(device, DEVICE_WORDS)?;
        device_words.copy_from_slice(&[0; DEVICE_WORDS])?;
        // Loaded before the kernel counts as resident: a first load waits for the device.
        let entry = plan.entry_point(&cuda, Entry::Resident)?;
        ResidentGaussian::launch(
            &cuda,
            queue,
            entry,
            plan,
            options,
            input,
            output,
            table,
            device_words,
            host_words,
        )
    }

    #[allow(clippy::too_many_arguments, reason = "the parts start_with made, handed over once")]
    fn launch(
        cuda: &CudaDevice,
        queue: Queue,
        entry: crate::backend::cuda::Kernel,
        plan: GaussianPlan,
        options: ResidentOptions,
        input: HostBuf<u8>,
        output: HostBuf<u8>,
        table: Table,
        device_words: DeviceBuf<u32>,
        host_words: Arc<MappedWords>,
    ) -> Result<ResidentGaussian> {
        let mapped = "mapped pinned memory on a GPU has a device address";
        // A 16-bit frame's samples are read and written as aligned two-byte words.
        check_aligned(&plan, "input", input.device_ptr().expect(mapped))?;
        check_aligned(&plan, "output", output.device_ptr().expect(mapped))?;
        let addresses = [
            input.device_ptr().expect(mapped),
            output.device_ptr().expect(mapped),
            match &table {
                Table::Mapped(words) => words.device_ptr().expect(mapped),
                Table::Device(words) => words.device_ptr().expect("device memory on a GPU has an address"),
                Table::Cpu => unreachable!("a GPU's table is mapped or in device memory"),
            },
            host_words.device_address().expect(mapped),
            device_words.device_ptr().expect("device memory on a GPU has an address"),
        ];
        let claim = BlockClaim::take(cuda.ordinal(), plan.blocks(), cuda.attributes().multiprocessor_count)?;
        // Counted in before the launch: from here on hetmem defers frees on this GPU.
        let resident = ResidentKernel::enter(cuda);
        let memory = Memory { input, output, _table: table, _device_words: Some(device_words), host_words };
        // From here on, dropping the filter stops whatever kernel runs.
        let filter = ResidentGaussian::new(
            memory,
            Server::Cuda(ManuallyDrop::new(queue), ManuallyDrop::new((resident, claim))),
            plan,
            options,
        );
        let Server::Cuda(queue, _) = &filter.server else { unreachable!("made above") };
        let [src, dst, table, host, device] = addresses;
        let plan = &filter.plan;
        let args = KernelArgs::new()
            .value(src)
            .value(dst)
            .value(table)
            .value(plan.format().planes().len() as u32)
            .value(plan.kernel().radius())
            .value(plan.kernel().border().code())
            .value(host)
            .value(device);
        let config: LaunchConfig = plan.launch_config();
        // SAFETY: gaussian_u8_resident and gaussian_u16_resident (const u8* src, u8* dst,
        // const u32* table, u32 plane_count, u32 radius, u32 border, u32* host, u32* device)
        // match the arguments in order and type, and the entry point is the one for the plan's
        // samples. The table holds the plan's own words (written above from the plan, and never
        // again), so every tile lies inside one frame of the plan's format, and input and output
        // are one frame each (allocated so; a 16-bit frame's at even addresses, checked): the
        // kernel stays inside them. `host` is HOST_WORDS mapped words and `device`
        // DEVICE_WORDS device words, both zeroed, the most the kernel touches (RB_*). The plan
        // launches at most one block per two SMs, so every block can run at once, as the
        // blocks' waits on each other need (other work holding SMs can delay that: the start's
        // watchdog then fails it, and the stop reaches blocks that never ran through the bell). All of it outlives the kernel: the filter frees it only
        // once the kernel's stream is idle, and leaks it otherwise. The CPU touches the frames
        // only between frames (`run` returns once the kernel has finished the frame, or the
        // filter refuses access for good), and the words only as atomics.
        unsafe { queue.launch(&entry, config, args) }?;
        filter.wait_ready()?;
        Ok(filter)
    }

    fn new(memory: Memory, server: Server, plan: GaussianPlan, options: ResidentOptions) -> ResidentGaussian {
        ResidentGaussian {
            memory: ManuallyDrop::new(memory),
            server,
            plan,
            strategy: options.strategy,
            timeout: options.timeout,
            seq: 0,
            frames: 0,
            lost_at: None,
            stopped: false,
            quiet: false,
        }
    }

    fn words(&self) -> &[AtomicU32] {
        self.memory.host_words.words()
    }

    /// Waits until every block of the kernel runs (its first frame then pays no launch).
    fn wait_ready(&self) -> Result<()> {
        let start = Instant::now();
        while self.words()[READY].load(Ordering::Acquire) == 0 {
            self.check_server()?;
            if start.elapsed() > self.timeout {
                return Err(Error::ResidentStartTimeout {
                    blocks: self.plan.blocks(),
                    timeout: self.timeout,
                });
            }
            std::thread::yield_now();
        }
        Ok(())
    }

    /// The plan the kernel runs: tiles, blocks and what a frame reads.
    pub fn plan(&self) -> &GaussianPlan {
        &self.plan
    }

    /// The strategy: zero-copy or hybrid.
    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// Frames run so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Bytes that cross the host-GPU link per frame: what the kernel reads (the frame with its
    /// re-read halos, and the table when it is mapped) and writes (the frame).
    pub fn link_bytes_per_frame(&self) -> u64 {
        let table = match self.strategy {
            Strategy::Hybrid => self.plan.bytes_read_of_table(),
            _ => 0,
        };
        self.plan.bytes_read() - table + self.plan.format().frame_bytes() as u64
    }

    /// An error once a frame has failed: the kernel may still touch the memory.
    fn check_usable(&self) -> Result<()> {
        match self.lost_at {
            Some(frame) => {
                Err(Error::FrameMemoryLost { holder: FrameMemoryHolder::ResidentBlur, frame: Some(frame) })
            }
            None if self.stopped => {
                Err(Error::invalid("resident blur", "it has been shut down: start a new one"))
            }
            None => Ok(()),
        }
    }

    /// Where to write the next frame.
    ///
    /// # Errors
    /// An earlier frame failed, so the kernel may still use the memory.
    pub fn input_mut(&mut self) -> Result<&mut [u8]> {
        self.check_usable()?;
        Ok(self.memory.input.as_mut_slice())
    }

    /// The last frame's result.
    ///
    /// # Errors
    /// As for [`ResidentGaussian::input_mut`].
    pub fn output(&self) -> Result<&[u8]> {
        self.check_usable()?;
        Ok(self.memory.output.as_slice())
    }

    /// Overwrites the output with `value`: tests poison it so an unwritten byte cannot pass.
    ///
    /// # Errors
    /// As for [`ResidentGaussian::input_mut`].
    pub fn fill_output(&mut self, value: u8) -> Result<()> {
        self.check_usable()?;
        self.memory.output.as_mut_slice().fill(value);
        Ok(())
    }

    /// Blurs the frame in the input into the output, and returns the latency: from handing
    /// the frame over to the result being readable by the CPU.
    ///
    /// # Errors
    /// An earlier frame failed; this frame did not finish within the timeout
    /// ([`Error::ResidentFrameTimeout`]) or the kernel ended or failed while it ran. Either
    /// way the memory is the kernel's from then on, and every later call says so.
    pub fn run(&mut self) -> Result<Duration> {
        self.check_usable()?;
        let start = Instant::now();
        if matches!(self.server, Server::Cpu) {
            let memory = &mut *self.memory;
            gaussian_cpu(
                self.plan.format(),
                self.plan.kernel(),
                memory.input.as_slice(),
                memory.output.as_mut_slice(),
            )?;
        } else {
            let seq = next_sequence(self.seq);
            // Release: the frame's bytes, written through `input_mut`, before the bell.
            self.words()[BELL].store(seq, Ordering::Release);
            self.seq = seq;
            if let Err(error) = self.wait_done(seq, start) {
                self.lost_at = Some(self.frames);
                return Err(error);
            }
        }
        self.frames += 1;
        Ok(start.elapsed())
    }

    /// Spins until the kernel writes `seq` into the done word; past [`SPIN_FOR`], yields
    /// between looks and checks the kernel still runs; gives up at the timeout.
    fn wait_done(&self, seq: u32, start: Instant) -> Result<()> {
        let mut checked = SPIN_FOR;
        loop {
            // Acquire: the kernel's output, fenced at system scope before the done word.
            if self.words()[DONE].load(Ordering::Acquire) == seq {
                return Ok(());
            }
            let waited = start.elapsed();
            if waited <= SPIN_FOR {
                std::hint::spin_loop();
                continue;
            }
            // The driver is asked at most once a millisecond whether the kernel still runs.
            if waited >= checked {
                self.check_server()?;
                checked = waited + CHECK_EVERY;
            }
            if waited > self.timeout {
                return Err(Error::ResidentFrameTimeout { frame: self.frames, timeout: self.timeout });
            }
            std::thread::yield_now();
        }
    }

    /// An error if the kernel has ended although it was not stopped, with its failure where
    /// the driver reports one.
    fn check_server(&self) -> Result<()> {
        match &self.server {
            Server::Cpu => Ok(()),
            Server::Cuda(queue, _) => {
                // cuStreamQuery: not device-synchronising, so safe while the kernel runs.
                if let Some(stream) = queue.stream()
                    && stream.is_idle()?
                {
                    queue.synchronize()?;
                    return Err(Error::ResidentKernelEnded);
                }
                Ok(())
            }
            #[cfg(test)]
            Server::Thread(thread) => match thread {
                Some(thread) if thread.is_finished() => Err(Error::ResidentKernelEnded),
                _ => Ok(()),
            },
        }
    }

    /// Stops the kernel and frees the memory.
    ///
    /// # Errors
    /// [`Error::ResidentStuck`] when the kernel does not stop within the timeout (the memory is
    /// then leaked, never freed under it); the kernel's failure.
    pub fn shutdown(mut self) -> Result<()> {
        let result = self.stop();
        // Drop finds it stopped.
        drop(self);
        result
    }

    fn stop(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.stopped, true) {
            return Ok(());
        }
        self.words()[BELL].store(STOP, Ordering::Release);
        let start = Instant::now();
        // A frame still running (one that timed out, say) finishes before the kernel sees the
        // stop: the stop waits longer than a frame may take.
        let patience = self.timeout.max(DEFAULT_TIMEOUT).saturating_mul(2);
        match &mut self.server {
            Server::Cpu => {}
            Server::Cuda(queue, _) => {
                // A kernel that never launched leaves the stream idle too: nothing to wait for.
                while let Some(stream) = queue.stream()
                    && !stream.is_idle()?
                {
                    if start.elapsed() > patience {
                        return Err(Error::ResidentStuck { timeout: patience });
                    }
                    std::thread::yield_now();
                }
                queue.synchronize()?;
            }
            #[cfg(test)]
            Server::Thread(thread) => {
                if let Some(thread) = thread.take() {
                    while !thread.is_finished() {
                        if start.elapsed() > patience {
                            // Dropping the handle detaches the thread, which holds its words.
                            return Err(Error::ResidentStuck { timeout: patience });
                        }
                        std::thread::yield_now();
                    }
                    let _ = thread.join();
                }
            }
        }
        self.quiet = true;
        Ok(())
    }
}

impl Drop for ResidentGaussian {
    fn drop(&mut self) {
        if let Err(error) = self.stop() {
            tracing::error!("stopping a resident blur failed: {error}");
        }
        if !self.quiet {
            tracing::error!("a resident blur's kernel may still run: leaking its memory and queue");
            return;
        }
        if let Server::Cuda(_, resident) = &mut self.server {
            // SAFETY: `quiet`: the kernel's stream is idle; dropped once, here. The frees it
            // deferred run now, before the filter's own, and its SMs are given back.
            unsafe { ManuallyDrop::drop(resident) };
        }
        // SAFETY: `quiet`: the kernel never ran or its stream is idle (a test's thread has
        // ended), so nothing touches the memory; dropped once, here.
        unsafe { ManuallyDrop::drop(&mut self.memory) };
        if let Server::Cuda(queue, _) = &mut self.server {
            // SAFETY: as above; the queue is not used after this.
            unsafe { ManuallyDrop::drop(queue) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::gaussian::{Border, PixelLayout};

    fn format() -> FrameFormat {
        FrameFormat::new(37, 23, PixelLayout::Rgb).unwrap()
    }

    fn blur() -> Gaussian {
        Gaussian::new(Some(2), None, Border::Reflect101).unwrap()
    }

    /// A filter whose kernel is a thread running `serve` over the words (frames are not
    /// blurred: these tests are of the protocol).
    fn with_thread(serve: fn(&[AtomicU32]), timeout: Duration) -> Result<ResidentGaussian> {
        let device = Device::cpu();
        let bytes = format().frame_bytes();
        let memory = Memory {
            input: HostBuf::pinned(&device, bytes, PinOptions::default())?,
            output: HostBuf::pinned(&device, bytes, PinOptions::default())?,
            _table: Table::Cpu,
            _device_words: None,
            host_words: Arc::new(MappedWords::zeroed(&device, HOST_WORDS)?),
        };
        let words = Arc::clone(&memory.host_words);
        let thread = std::thread::spawn(move || serve(words.words()));
        let plan = GaussianPlan::for_resident(&format(), &blur(), 1, None)?;
        let options = ResidentOptions { timeout, ..ResidentOptions::default() };
        let filter = ResidentGaussian::new(memory, Server::Thread(Some(thread)), plan, options);
        filter.wait_ready()?;
        Ok(filter)
    }

    /// The kernel's protocol, frames aside: ready, then each bell answered by its done word,
    /// until the stop.
    fn serves(words: &[AtomicU32]) {
        words[READY].store(1, Ordering::Release);
        let mut seq = 0;
        loop {
            let bell = words[BELL].load(Ordering::Acquire);
            if bell == STOP {
                return;
            }
            if bell == next_sequence(seq) {
                seq = bell;
                words[DONE].store(seq, Ordering::Release);
            }
            std::thread::yield_now();
        }
    }

    /// Answers two frames, then never again (a hung kernel), until the stop.
    fn hangs_at_the_third_frame(words: &[AtomicU32]) {
        words[READY].store(1, Ordering::Release);
        let mut seq = 0;
        while words[BELL].load(Ordering::Acquire) != STOP {
            let bell = words[BELL].load(Ordering::Acquire);
            if bell == next_sequence(seq) && seq < 2 {
                seq = bell;
                words[DONE].store(seq, Ordering::Release);
            }
            std::thread::yield_now();
        }
    }

    /// Answers one frame, then ends unasked.
    fn ends_after_one_frame(words: &[AtomicU32]) {
        words[READY].store(1, Ordering::Release);
        while words[BELL].load(Ordering::Acquire) != 1 {
            std::thread::yield_now();
        }
        words[DONE].store(1, Ordering::Release);
    }

    /// Never says it is ready.
    fn never_ready(words: &[AtomicU32]) {
        while words[BELL].load(Ordering::Acquire) != STOP {
            std::thread::yield_now();
        }
    }

    /// Ignores the stop for longer than a stop waits (twice the default timeout).
    fn slow_to_stop(words: &[AtomicU32]) {
        words[READY].store(1, Ordering::Release);
        while words[BELL].load(Ordering::Acquire) != STOP {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_millis(2500));
    }

    /// Finishes a frame only after `FRAME_TAKES` (a frame longer than a tight watchdog), and
    /// ends at the stop only once that frame is done.
    const FRAME_TAKES: Duration = Duration::from_millis(300);
    fn slow_frames(words: &[AtomicU32]) {
        words[READY].store(1, Ordering::Release);
        loop {
            let bell = words[BELL].load(Ordering::Acquire);
            if bell == STOP {
                return;
            }
            if bell != 0 && words[DONE].load(Ordering::Acquire) != bell {
                std::thread::sleep(FRAME_TAKES);
                words[DONE].store(bell, Ordering::Release);
            }
            std::thread::yield_now();
        }
    }

    /// Resident blurs on one GPU share half its SMs: a claim past it is refused, naming what
    /// runs, and a stopped blur's blocks are given back.
    #[test]
    fn resident_blurs_on_one_gpu_take_half_its_sms_together() {
        let ordinal = 1 << 20; // no real GPU's, so no other test's claims meet these
        let first = BlockClaim::take(ordinal, 40, 132).unwrap();
        match BlockClaim::take(ordinal, 30, 132) {
            Err(Error::InvalidArgument { problem, .. }) => {
                assert!(problem.contains("hold 40 already") && problem.contains("66"), "{problem}")
            }
            other => panic!("expected the second claim refused, got {other:?}"),
        }
        let second = BlockClaim::take(ordinal, 26, 132).unwrap();
        drop(first);
        let third = BlockClaim::take(ordinal, 40, 132).unwrap();
        drop((second, third));
        assert!(BlockClaim::take(ordinal, 1, 1).is_ok(), "a one-SM GPU still runs one block");
    }

    #[test]
    fn sequence_numbers_skip_nothing_rung_and_the_stop() {
        assert_eq!(next_sequence(0), 1);
        assert_eq!(next_sequence(41), 42);
        assert_eq!(next_sequence(0xFFFF_FFFD), 0xFFFF_FFFE);
        assert_eq!(next_sequence(0xFFFF_FFFE), 1);
        assert_ne!(next_sequence(STOP - 1), STOP);
    }

    #[test]
    fn each_frame_waits_for_its_own_done_word() {
        let mut filter = with_thread(serves, Duration::from_secs(5)).unwrap();
        for frame in 1..=5u32 {
            filter.run().unwrap();
            assert_eq!(filter.words()[DONE].load(Ordering::Acquire), frame);
        }
        assert_eq!(filter.frames(), 5);
        filter.shutdown().unwrap();
    }

    /// A frame the kernel never finishes is reported at the timeout, and the memory is the
    /// kernel's from then on: every access is refused, naming the frame.
    #[test]
    fn a_frame_that_never_finishes_gives_the_memory_up() {
        let timeout = Duration::from_millis(200);
        let mut filter = with_thread(hangs_at_the_third_frame, timeout).unwrap();
        filter.run().unwrap();
        filter.run().unwrap();
        let start = Instant::now();
        match filter.run() {
            Err(Error::ResidentFrameTimeout { frame: 2, timeout: got }) => assert_eq!(got, timeout),
            other => panic!("expected the third frame (index 2) to time out, got {other:?}"),
        }
        assert!(start.elapsed() >= timeout);
        let lost = |result: Result<()>| match result {
            Err(Error::FrameMemoryLost { holder: FrameMemoryHolder::ResidentBlur, frame: Some(2) }) => {}
            other => panic!("expected the memory lost to frame 2, got {other:?}"),
        };
        lost(filter.input_mut().map(|_| ()));
        lost(filter.output().map(|_| ()));
        lost(filter.fill_output(0));
        lost(filter.run().map(|_| ()));
        // The stand-in still honours the stop, so the filter stops and frees cleanly.
        filter.shutdown().unwrap();
    }

    /// A kernel that ends unasked is reported at once, not at the timeout.
    #[test]
    fn a_kernel_that_ends_unasked_is_reported_at_once() {
        let timeout = Duration::from_secs(5);
        let mut filter = with_thread(ends_after_one_frame, timeout).unwrap();
        filter.run().unwrap();
        let start = Instant::now();
        assert!(matches!(filter.run(), Err(Error::ResidentKernelEnded)));
        assert!(start.elapsed() < timeout, "reported by the watchdog, not the check");
        assert!(matches!(filter.input_mut(), Err(Error::FrameMemoryLost { .. })));
        filter.shutdown().unwrap();
    }

    #[test]
    fn a_kernel_whose_blocks_never_all_run_fails_the_start() {
        match with_thread(never_ready, Duration::from_millis(100)) {
            Err(Error::ResidentStartTimeout { .. }) => {}
            other => panic!("expected the start to time out, got {other:?}"),
        }
    }

    #[test]
    fn a_kernel_slow_to_stop_is_reported_stuck() {
        let filter = with_thread(slow_to_stop, Duration::from_millis(50)).unwrap();
        match filter.shutdown() {
            Err(Error::ResidentStuck { timeout }) => assert_eq!(timeout, DEFAULT_TIMEOUT * 2),
            other => panic!("expected the stop stuck after twice the default timeout, got {other:?}"),
        }
    }

    /// A frame that outlasts a tight watchdog times out, but the stop waits for it to finish:
    /// the kernel stops cleanly and nothing is leaked.
    #[test]
    fn a_stop_after_a_timed_out_frame_waits_for_that_frame() {
        let mut filter = with_thread(slow_frames, Duration::from_millis(20)).unwrap();
        assert!(matches!(filter.run(), Err(Error::ResidentFrameTimeout { frame: 0, .. })));
        filter.stop().unwrap();
        assert!(filter.quiet, "stopped cleanly, so its memory is freed");
    }

    #[test]
    fn a_watchdog_too_short_and_no_tiles_are_refused() {
        let short = ResidentOptions { timeout: Duration::from_millis(1), ..ResidentOptions::default() };
        let none = ResidentOptions { tiles: Some(0), ..ResidentOptions::default() };
        for (options, what) in [(short, "resident blur timeout"), (none, "resident blur tiles")] {
            match ResidentGaussian::start_with(&Device::cpu(), format(), &blur(), options) {
                Err(Error::InvalidArgument { what: got, .. }) => assert_eq!(got, what),
                other => panic!("expected {what} refused, got {other:?}"),
            }
        }
    }

    /// On the CPU backend the frame is blurred on the calling thread: the CPU path's bytes,
    /// over a poisoned output, frame after frame.
    #[test]
    fn the_cpu_backend_blurs_each_frame_as_the_cpu_path_does() {
        let seed = fastrand::u64(..);
        let mut rng = fastrand::Rng::with_seed(seed);
        let kernel = blur();
        for strategy in [Strategy::ZeroCopy, Strategy::Hybrid] {
            let options = ResidentOptions { strategy, ..ResidentOptions::default() };
            let mut filter =
                ResidentGaussian::start_with(&Device::cpu(), format(), &kernel, options).unwrap();
            for frame in 0..3 {
                let input: Vec<u8> = (0..format().frame_bytes()).map(|_| rng.u8(..)).collect();
                let mut want = vec![0u8; input.len()];
                gaussian_cpu(&format(), &kernel, &input, &mut want).unwrap();
                filter.input_mut().unwrap().copy_from_slice(&input);
                filter.fill_output(0xA5).unwrap();
                filter.run().unwrap();
                assert!(filter.output().unwrap() == want, "{strategy} frame {frame}, seed {seed:#x}");
            }
            assert_eq!(filter.strategy(), strategy);
            filter.shutdown().unwrap();
        }
    }

    #[test]
    fn strategies_that_copy_frames_are_refused() {
        for strategy in [Strategy::PinnedAsync, Strategy::Copy, Strategy::Managed, Strategy::Cpu] {
            let options = ResidentOptions { strategy, ..ResidentOptions::default() };
            match ResidentGaussian::start_with(&Device::cpu(), format(), &blur(), options) {
                Err(Error::InvalidArgument { what, problem }) => {
                    assert_eq!(what, "resident blur strategy");
                    assert!(problem.contains("zero-copy") && problem.contains("hybrid"), "{problem}");
                }
                other => panic!("expected {strategy} refused, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_shut_down_filter_refuses_frames() {
        let mut filter = ResidentGaussian::start(&Device::cpu(), format(), &blur()).unwrap();
        filter.stop().unwrap();
        assert!(matches!(filter.run(), Err(Error::InvalidArgument { .. })));
    }
}
