//! Where a queue's work runs: a stream of a CUDA device, or the calling thread on the CPU
//! backend. `crate::handoff::Queue` holds one and asks it, rather than the device, what it
//! runs on.

use std::sync::Arc;

use super::cpu::CpuDevice;
use super::cuda::{CudaDevice, Event, Stream};
use super::error::Result;
use super::{BackendKind, Device};

/// A queue's place on a backend.
pub(crate) enum QueueStream {
    /// A stream of a GPU.
    Cuda {
        /// The stream's device.
        device: CudaDevice,
        /// The stream work is queued on.
        stream: Arc<Stream>,
    },
    /// The calling thread (the CPU backend).
    Cpu(CpuDevice),
}

impl std::fmt::Debug for QueueStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueueStream::Cuda { device, .. } => f.debug_tuple("Cuda").field(device).finish(),
            QueueStream::Cpu(_) => f.write_str("Cpu"),
        }
    }
}

impl QueueStream {
    /// A new stream on `device` (the calling thread on the CPU backend).
    ///
    /// # Errors
    /// Creating the stream failed.
    pub(crate) fn new(device: &Device) -> Result<QueueStream> {
        Ok(match device {
            Device::Cpu(cpu) => QueueStream::Cpu(cpu.clone()),
            Device::Cuda(cuda) => QueueStream::on(cuda.clone(), Arc::new(Stream::new(cuda)?)),
        })
    }

    /// `stream`, a stream of `device`.
    pub(crate) fn on(device: CudaDevice, stream: Arc<Stream>) -> QueueStream {
        QueueStream::Cuda { device, stream }
    }

    /// The backend the queue runs on.
    pub(crate) fn backend(&self) -> BackendKind {
        match self {
            QueueStream::Cuda { .. } => BackendKind::Cuda,
            QueueStream::Cpu(_) => BackendKind::Cpu,
        }
    }

    /// The GPU and its stream, on a GPU.
    pub(crate) fn gpu(&self) -> Option<(&CudaDevice, &Arc<Stream>)> {
        match self {
            QueueStream::Cuda { device, stream } => Some((device, stream)),
            QueueStream::Cpu(_) => None,
        }
    }

    /// The device the queue runs on.
    pub(crate) fn device(&self) -> Device {
        match self {
            QueueStream::Cuda { device, .. } => Device::Cuda(device.clone()),
            QueueStream::Cpu(cpu) => Device::Cpu(cpu.clone()),
        }
    }

    /// The stream, on a GPU.
    pub(crate) fn stream(&self) -> Option<&Arc<Stream>> {
        self.gpu().map(|(_, stream)| stream)
    }

    /// The GPU, on a GPU.
    pub(crate) fn cuda_device(&self) -> Option<&CudaDevice> {
        self.gpu().map(|(device, _)| device)
    }

    /// A fresh timing event on the queue's GPU; `None` on the CPU backend, whose work is not
    /// timed by events.
    ///
    /// # Errors
    /// Creating the event failed.
    pub(crate) fn timing_event(&self) -> Result<Option<Event>> {
        match self {
            QueueStream::Cuda { device, .. } => Ok(Some(Event::new(device, true)?)),
            QueueStream::Cpu(_) => Ok(None),
        }
    }

    /// Records `event` at the point the queue's work has reached (nothing to record on the
    /// CPU backend, whose work is done when queued).
    ///
    /// # Errors
    /// Recording failed.
    pub(crate) fn record(&self, event: &Event) -> Result<()> {
        match self {
            QueueStream::Cuda { stream, .. } => Ok(event.record(stream)?),
            QueueStream::Cpu(_) => Ok(()),
        }
    }

    /// The GPU's ordinal, on a GPU.
    pub(crate) fn gpu_ordinal(&self) -> Option<usize> {
        self.cuda_device().map(CudaDevice::ordinal)
    }
}
