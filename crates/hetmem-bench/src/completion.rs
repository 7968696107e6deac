//! How long after a kernel ends the CPU knows, for each completion signal.
//!
//! Method: a one-thread kernel (the gate, `resident::Gate`) spins until the CPU writes a go
//! word in mapped memory, then writes a done word and ends. Each sample queues the kernel and the signal,
//! waits until the kernel runs, then starts the clock, writes go and waits by the mechanism
//! under test. The `kernel_done_word` row spins on the kernel's own done word: the earliest the
//! CPU can see the kernel end. Every other row's `after_kernel_end_us` is its median minus
//! that baseline: the cost of the signal itself. Mechanisms are interleaved sample by sample so
//! drift affects all alike.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Instant;

use super::Summary;
use hetmem::error::{Error, Result};
use hetmem::handoff::{Fence, FenceKind, Queue};
use hetmem::resident::Gate;

/// A way for the CPU to learn that GPU work has finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mechanism {
    /// Spinning on the kernel's own done word (the baseline).
    KernelDoneWord,
    /// `cuEventSynchronize` on an event recorded after the kernel.
    EventSync,
    /// Spinning on `cuEventQuery`.
    EventQuerySpin,
    /// `cuStreamSynchronize`.
    StreamSync,
    /// `cuCtxSynchronize`.
    DeviceSync,
    /// Spinning on a mapped flag written by `cuStreamWriteValue32`.
    FlagSpin,
    /// A host function writing an eventfd; the CPU blocks in `read`.
    HostCallbackEventfd,
    /// A future awaiting a flag fence, woken by hetmem's poller thread.
    AsyncFlag,
    /// A future awaiting an event fence, woken by hetmem's poller thread.
    AsyncEvent,
}

const ALL: [Mechanism; 9] = [
    Mechanism::KernelDoneWord,
    Mechanism::EventSync,
    Mechanism::EventQuerySpin,
    Mechanism::StreamSync,
    Mechanism::DeviceSync,
    Mechanism::FlagSpin,
    Mechanism::HostCallbackEventfd,
    Mechanism::AsyncFlag,
    Mechanism::AsyncEvent,
];

/// One mechanism's timings, in microseconds from go.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CompletionRow {
    /// The mechanism.
    pub mechanism: Mechanism,
    /// Microseconds from the CPU writing go to the CPU knowing the kernel finished.
    pub go_to_known_us: Summary,
    /// The median minus the baseline's median: what the signal adds after the kernel's end.
    pub after_kernel_end_us: f64,
}

/// The completion-latency table.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CompletionReport {
    /// The GPU.
    pub device: String,
    /// Samples per mechanism.
    pub samples: usize,
    /// One row per mechanism, the baseline first.
    pub rows: Vec<CompletionRow>,
}

/// Measures every mechanism `samples` times on `queue` (after a warm-up).
///
/// # Errors
/// A CPU-backend queue, or a failing driver call.
pub fn measure(queue: &Queue, samples: usize) -> Result<CompletionReport> {
    let device = queue
        .cuda_device()
        .ok_or_else(|| Error::NeedsGpu {
            what: "the completion benchmark".into(),
            detail: "the CPU backend has no completion signals".into(),
        })?
        .clone();
    let gate = Gate::new(queue)?;
    let warm_up = 50.min(samples);
    let mut times: Vec<Vec<f64>> = vec![Vec::with_capacity(samples); ALL.len()];
    for round in 0..warm_up + samples {
        for offset in 0..ALL.len() {
            let index = (round + offset) % ALL.len();
            let micros = sample(queue, &gate, ALL[index])?;
            if round >= warm_up {
                times[index].push(micros);
            }
        }
    }
    device.synchronize()?;
    let summaries: Vec<Summary> = times.iter().map(|t| Summary::of(t).expect("samples > 0")).collect();
    let baseline = summaries[0].median;
    let rows = ALL
        .iter()
        .zip(summaries)
        .map(|(&mechanism, summary)| CompletionRow {
            mechanism,
            after_kernel_end_us: summary.median - baseline,
            go_to_known_us: summary,
        })
        .collect();
    Ok(CompletionReport { device: device.name().to_string(), samples, rows })
}

/// One sample: microseconds from go to the CPU knowing, by `mechanism`.
fn sample(queue: &Queue, gate: &Gate, mechanism: Mechanism) -> Result<f64> {
    gate.launch()?;
    let fence: Option<Fence> = match mechanism {
        Mechanism::EventSync | Mechanism::EventQuerySpin | Mechanism::AsyncEvent => {
            Some(queue.signal_with(FenceKind::Event)?)
        }
        Mechanism::FlagSpin | Mechanism::AsyncFlag => Some(queue.signal_with(FenceKind::Flag)?),
        Mechanism::HostCallbackEventfd => Some(queue.signal_with(FenceKind::HostCallback)?),
        Mechanism::KernelDoneWord | Mechanism::StreamSync | Mechanism::DeviceSync => None,
    };
    gate.wait_started();
    let start = Instant::now();
    gate.open();
    match (mechanism, &fence) {
        (Mechanism::KernelDoneWord, _) => {
            while !gate.is_done() {
                std::hint::spin_loop();
            }
        }
        (Mechanism::StreamSync, _) => queue.synchronize()?,
        (Mechanism::DeviceSync, _) => queue.cuda_device().expect("a GPU queue").synchronize()?,
        (Mechanism::EventQuerySpin, Some(fence)) => {
            while !fence.is_complete()? {
                std::hint::spin_loop();
            }
        }
        (Mechanism::AsyncFlag | Mechanism::AsyncEvent, Some(fence)) => block_on(fence.wait_async())?,
        (_, Some(fence)) => fence.wait()?,
        (_, None) => unreachable!("every fenced mechanism made its fence above"),
    }
    let micros = start.elapsed().as_secs_f64() * 1e6;
    queue.synchronize()?;
    Ok(micros)
}

/// Runs a future to completion on this thread, parking while it is pending: the smallest
/// executor, so the figure is the poller's wake-up plus one unpark.
fn block_on<F: Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut context = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
        std::thread::park();
    }
}
