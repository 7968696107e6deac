//! The work exchange of examples/mailbox_worker.rs, shared with its test: the message types
//! of examples/mailbox_worker.cu, the same computation on the CPU, the CPU backend's worker
//! thread (the kernel's part, step for step), and the CPU's producer side.

use std::time::{Duration, Instant};

use bytemuck::{Pod, Zeroable};
use hetmem::backend::cuda::LaunchConfig;
use hetmem::handoff::KernelArgs;
use hetmem::resident::{Mailbox, MailboxReceiver, MailboxSender};
use hetmem::{Device, Queue};

/// The worker kernel, which includes `hetmem/mapped.cuh`.
pub const SOURCE: &str = include_str!("../mailbox_worker.cu");
/// Its entry point.
pub const ENTRY: &str = "mailbox_worker";
/// Threads of its one block, as the kernel's `THREADS`.
pub const THREADS: u32 = 256;
const DATA_WORDS: usize = 12;
/// Slots of each mailbox.
pub const DEPTH: usize = 8;
/// How long the exchange may go without progress before it is an error.
const STALL: Duration = Duration::from_secs(10);

/// A piece of work, as the kernel's `struct Work`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Pod, Zeroable)]
pub struct Work {
    pub id: u32,
    pub stop: u32,
    pub seed: u32,
    pub scale: u32,
    pub data: [u32; DATA_WORDS],
}

/// The answer, as the kernel's `struct Reply`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Pod, Zeroable)]
pub struct Reply {
    pub id: u32,
    pub sum: u32,
    pub max: u32,
    pub data_sum: u32,
}

/// lowbias32, as the kernel's `mix`.
fn mix(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    x
}

/// What the kernel answers to `work`.
pub fn reference(work: &Work) -> Reply {
    let values = (0..THREADS).map(|t| {
        mix(work.seed ^ t.wrapping_mul(0x9E37_79B9))
            .wrapping_mul(work.scale)
            .wrapping_add(work.data[t as usize % DATA_WORDS])
    });
    let (sum, max) = values.fold((0u32, 0u32), |(sum, max), value| (sum.wrapping_add(value), max.max(value)));
    let data_sum = work.data.iter().fold(0u32, |sum, &x| sum.wrapping_add(x));
    Reply { id: work.id, sum, max, data_sum }
}

/// The kernel's part on the CPU backend: takes work until told to stop, answers each.
fn cpu_worker(mut inbox: MailboxReceiver<Work>, mut outbox: MailboxSender<Reply>) -> hetmem::Result<()> {
    loop {
        let work = inbox.recv(STALL)?;
        if work.stop != 0 {
            return Ok(());
        }
        outbox.send(&reference(&work), STALL)?;
    }
}

/// What an exchange did.
pub struct Exchanged {
    pub messages: usize,
    pub elapsed: Duration,
}

/// Sends `messages` fresh pieces of work (`random` gives their words) to a worker on
/// `device` (the kernel on a GPU, a thread on the CPU backend) and checks every answer
/// against [`reference`]: in order, none lost, none twice.
pub fn exchange(
    device: &Device,
    messages: usize,
    random: &mut dyn FnMut() -> u32,
) -> Result<Exchanged, String> {
    let works: Vec<Work> = (1..=messages as u32)
        .map(|id| Work {
            id,
            stop: 0,
            seed: random(),
            scale: random() | 1,
            data: std::array::from_fn(|_| random()),
        })
        .collect();
    let inbox = Mailbox::<Work>::new(device, DEPTH).map_err(error("inbox"))?;
    let outbox = Mailbox::<Reply>::new(device, DEPTH).map_err(error("outbox"))?;
    let queue = Queue::new(device).map_err(error("queue"))?;
    let (mut work, mut replies) =
        (inbox.sender().map_err(error("inbox"))?, outbox.receiver().map_err(error("outbox"))?);
    // The CPU's side runs on a thread of its own, started before the worker, so the exchange
    // goes on even where a launch returns only once its kernel has ended (as a sanitizer may
    // make it). It stops the worker whatever happened, so the worker never outlives the
    // mailboxes.
    let producer = std::thread::spawn(move || {
        let start = Instant::now();
        let result = produce(&mut work, &mut replies, &works);
        let elapsed = start.elapsed();
        let stop = Work { stop: 1, ..Work::zeroed() };
        (result, work.send(&stop, STALL).map_err(error("sending stop")), elapsed)
    });
    let worker = match device.as_cuda() {
        None => {
            let (work, replies) =
                (inbox.receiver().map_err(error("inbox"))?, outbox.sender().map_err(error("outbox"))?);
            Some(std::thread::spawn(move || cpu_worker(work, replies)))
        }
        Some(gpu) => {
            // If this fails, the producer finds no answers within STALL and stops.
            let launched = (|| {
                let module = hetmem::kernels::user_module(gpu, "mailbox_worker", SOURCE)
                    .map_err(error("compiling"))?;
                let kernel = module.kernel(ENTRY).map_err(|e| format!("loading: {e}"))?;
                let config = LaunchConfig { grid: (1, 1, 1), block: (THREADS, 1, 1), shared_bytes: 0 };
                let args = KernelArgs::new().mapped(&inbox).mapped(&outbox);
                // SAFETY: mailbox_worker(u32* inbox, u32* outbox) takes the two mailboxes' first
                // words, as passed; it plays the inbox's receiving end and the outbox's sending
                // end (the producer thread holds the other two) through hetmem/mapped.cuh only,
                // with the mailboxes' own message types, and ends once it receives the stop
                // message the producer sends last; the mailboxes are dropped only after that
                // and after the queue has synchronised (or leaked, below).
                unsafe { queue.launch(&kernel, config, args) }.map_err(error("launching"))
            })();
            if let Err(why) = launched {
                let _ = producer.join();
                return Err(why);
            }
            None
        }
    };
    let (result, stopped, elapsed) =
        producer.join().map_err(|_| "the producer thread panicked".to_string())?;
    if worker.is_none()
        && let Err(why) = stopped
    {
        // The kernel may still run and touch the mailboxes: freeing them (or the queue) would
        // wait for it for ever. Leak them and report.
        std::mem::forget((inbox, outbox, queue));
        return Err(format!("{why}; the worker kernel may still run: its mailboxes are leaked"));
    }
    match worker {
        Some(thread) => {
            thread.join().map_err(|_| "the worker thread panicked".to_string())?.map_err(error("worker"))?
        }
        None => queue.synchronize().map_err(error("the worker kernel"))?,
    }
    result?;
    stopped?;
    Ok(Exchanged { messages, elapsed })
}

/// A hetmem error as a message saying what failed.
fn error(what: &'static str) -> impl Fn(hetmem::Error) -> String {
    move |e| format!("{what}: {e}")
}

/// Keeps up to the mailboxes' depth of work in flight and checks each answer as it comes.
fn produce(
    work: &mut MailboxSender<Work>,
    replies: &mut MailboxReceiver<Reply>,
    works: &[Work],
) -> Result<(), String> {
    let messages = works.len();
    let mut in_flight = std::collections::VecDeque::new();
    let mut answered = 0;
    let mut progress = Instant::now();
    while answered < messages {
        if let Some(next) = works.get(work.sent() as usize).filter(|_| in_flight.len() < DEPTH)
            && work.try_send(next)
        {
            in_flight.push_back(*next);
            continue;
        }
        match replies.try_recv() {
            Some(reply) => {
                let sent = in_flight.pop_front().ok_or_else(|| format!("a reply {reply:?} to no work"))?;
                let expected = reference(&sent);
                if reply != expected {
                    return Err(format!("message {}: got {reply:?}, the CPU computed {expected:?}", sent.id));
                }
                answered += 1;
                progress = Instant::now();
            }
            None if progress.elapsed() > STALL => {
                return Err(format!("no reply for {STALL:?}: {answered} of {messages} answered"));
            }
            None => std::hint::spin_loop(),
        }
    }
    Ok(())
}
