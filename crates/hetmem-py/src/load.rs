//! `load_checkpoint`: safetensors files (or a sharded checkpoint's index) streamed into one
//! allocation, device memory on a GPU and host memory on the CPU backend, by the library's
//! `FileStream` (the machinery of `hetmem load`), on a thread of their own while the calling
//! thread, the interpreter released between looks, hears Ctrl-C and reports the progress;
//! and `LoadedCheckpoint`, the allocation's `Memory` and where each tensor lies in it, from
//! which the Python half makes the tensors' views.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hetmem::data::{
    Checkpoint, FileStream, LoadMethod, LoadPlan, LoadReport, ShardSpec, StreamOptions, TensorFilter,
};
use hetmem::{DeviceBuf, HostBuf, PinOptions, Queue};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::device::Device;
use crate::memory::Memory;
use crate::size::Int;
use crate::{HetmemError, to_py_err};

/// How often a load's calling thread looks for a signal (Ctrl-C) and tells the progress
/// callback the bytes done.
const WATCH_EVERY: Duration = Duration::from_millis(100);

/// The most streams kept between loads (each with its pinned staging ring).
const KEPT_STREAMS: usize = 2;

/// Streams kept between loads, with their pinned staging rings (pinning the default ring,
/// 256 MiB, takes about 160 ms on the H200 machine, as long as loading 6 GB), by the device's
/// ordinal (None: the CPU backend) and the options. A load takes one out and puts it back
/// after a success, so loads at once on several threads each have their own.
static STREAMS: Mutex<Vec<(Option<usize>, StreamOptions, FileStream)>> = Mutex::new(Vec::new());

/// A checkpoint loaded into one allocation: `memory`, and each tensor's place in it.
#[pyclass(frozen, module = "hetmem._native")]
#[derive(Debug)]
pub struct LoadedCheckpoint {
    memory: Py<Memory>,
    /// (name, dtype, shape, offset, nbytes), by name.
    tensors: Vec<(String, String, Vec<usize>, usize, usize)>,
    report: LoadReport,
}

#[pymethods]
impl LoadedCheckpoint {
    /// The allocation every tensor is a view of (`"device"` memory on a GPU, host memory on
    /// the CPU backend).
    #[getter]
    fn memory(&self, py: Python<'_>) -> Py<Memory> {
        self.memory.clone_ref(py)
    }

    /// Each tensor as `(name, dtype, shape, offset, nbytes)`, by name; `dtype` as the file
    /// names it (`"BF16"`), `offset` counted from the allocation's start.
    #[getter]
    fn tensors(&self) -> Vec<(String, String, Vec<usize>, usize, usize)> {
        self.tensors.clone()
    }

    /// How the bytes moved: method, read_mode, bytes, seconds, setup_seconds, gb_per_s,
    /// auto_reason, direct_refused.
    #[getter]
    fn report<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let report = &self.report;
        let dict = PyDict::new(py);
        dict.set_item("method", report.method.name())?;
        dict.set_item("read_mode", report.read_mode.to_string())?;
        dict.set_item("bytes", report.bytes)?;
        dict.set_item("seconds", report.seconds)?;
        dict.set_item("setup_seconds", report.setup_seconds)?;
        dict.set_item("gb_per_s", if report.bytes == 0 { 0.0 } else { report.gb_per_s() })?;
        dict.set_item("auto_reason", report.auto_reason.clone())?;
        dict.set_item("direct_refused", report.direct_refused.clone())?;
        Ok(dict)
    }

    fn __repr__(&self) -> String {
        format!(
            "hetmem._native.LoadedCheckpoint({} tensors, {} bytes)",
            self.tensors.len(),
            self.report.bytes
        )
    }
}

/// Loads the safetensors checkpoint `sources` names (one index `.json`, or safetensors files)
/// into one allocation of `device` (the CPU backend's host memory where `device` is None),
/// the tensors `names` lists or those whose name starts with one of `prefixes` (at most one
/// of the two; neither: all). `method`: `auto`, `staged` or `staged-direct`; `threads` and
/// `chunk_bytes` as for `hetmem load`. `progress(bytes_done, bytes_total)` is called about
/// every 100 ms on the calling thread. The bytes move on threads of their own; the calling
/// thread, the interpreter released between looks, runs the signal handlers as often: an
/// exception raised by a handler (Ctrl-C's `KeyboardInterrupt`) or by `progress` stops the
/// load at its next piece and is raised once its work has ended (the allocation released).
/// Nothing is returned unless every tensor arrived. `shard`: `(rank, world, dim)`, each
/// tensor cut to that rank's slice along `dim` (torch.chunk's split; a tensor with fewer
/// dimensions whole), only its bytes read.
/// The stream's pinned staging ring (2 x threads x chunk_bytes) is kept for
/// the next load (see `STREAMS`).
#[pyfunction]
#[pyo3(signature = (device, sources, *, names = None, prefixes = None, method = "auto", threads = None, chunk_bytes = None, progress = None, shard = None))]
#[allow(clippy::too_many_arguments, reason = "mirrors hetmem.load's keywords")]
pub fn load_checkpoint(
    py: Python<'_>,
    device: Option<&Device>,
    sources: Vec<PathBuf>,
    names: Option<Vec<String>>,
    prefixes: Option<Vec<String>>,
    method: &str,
    threads: Option<Int>,
    chunk_bytes: Option<Int>,
    progress: Option<Py<PyAny>>,
    shard: Option<(Int, Int, Int)>,
) -> PyResult<LoadedCheckpoint> {
    let shard = shard_spec(shard)?;
    let filter = tensor_filter(names, prefixes)?;
    let options = stream_options(method, threads, chunk_bytes)?;
    let device = device.map_or_else(hetmem::Device::cpu, |device| device.inner.clone());
    let plan = py.detach(|| -> PyResult<_> {
        let plan = checkpoint(&sources)?.plan_with(&filter, shard.as_ref()).map_err(to_py_err)?;
        check_fits(&device, &plan)?;
        Ok(plan)
    })?;
    let (memory, report) = load_plan(py, &device, &plan, options, progress.as_ref())?;
    let tensors = plan
        .tensors()
        .iter()
        .map(|(name, entry)| {
            (name.clone(), entry.dtype.clone(), entry.shape.clone(), entry.offset, entry.bytes)
        })
        .collect();
    Ok(LoadedCheckpoint { memory: Py::new(py, memory)?, tensors, report })
}

/// `device_map="balanced"`'s rule (hetmem's own): for tensors of `sizes` bytes each, in the
/// files' order, the index of the device among `devices` each goes to: contiguous runs of
/// about equal bytes, a tensor on the device whose share holds its middle byte.
#[pyfunction]
pub fn balanced_devices(sizes: Vec<Int>, devices: Int) -> PyResult<Vec<usize>> {
    let devices = devices.size("devices")?;
    if devices == 0 {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "devices: 0; give at least 1 device to spread over",
        ));
    }
    let sizes = sizes.iter().map(|size| size.size("a tensor's size")).collect::<PyResult<Vec<_>>>()?;
    Ok(hetmem::data::balanced_devices(&sizes, devices))
}

/// The tensors a `load_checkpoint` with these arguments would load, without reading any
/// tensor's bytes: `(name, nbytes, place)` for each, in the files' order (by `place`, its
/// offset in the allocation), `nbytes` the slice's where `shard` is given. Errors as
/// `load_checkpoint`'s for the files, the names, the prefixes and the shard. What
/// `hetmem.load(device_map=...)` splits among the devices.
#[pyfunction]
#[pyo3(signature = (sources, *, names = None, prefixes = None, shard = None))]
pub fn plan_checkpoint(
    py: Python<'_>,
    sources: Vec<PathBuf>,
    names: Option<Vec<String>>,
    prefixes: Option<Vec<String>>,
    shard: Option<(Int, Int, Int)>,
) -> PyResult<Vec<(String, usize, usize)>> {
    let shard = shard_spec(shard)?;
    let filter = tensor_filter(names, prefixes)?;
    let plan = py.detach(|| checkpoint(&sources)?.plan_with(&filter, shard.as_ref()).map_err(to_py_err))?;
    let mut tensors: Vec<(String, usize, usize)> =
        plan.tensors().iter().map(|(name, entry)| (name.clone(), entry.bytes, entry.offset)).collect();
    tensors.sort_by_key(|(_, _, place)| *place);
    Ok(tensors)
}

/// `shard=(rank, world, dim)` as the library's `ShardSpec`, checked.
fn shard_spec(shard: Option<(Int, Int, Int)>) -> PyResult<Option<ShardSpec>> {
    shard
        .map(|(rank, world, dim)| -> PyResult<ShardSpec> {
            ShardSpec::new(
                rank.size("load shard rank")?,
                world.size("load shard world")?,
                dim.size("load shard dim")?,
            )
            .map_err(to_py_err)
        })
        .transpose()
}

/// `names=` and `prefixes=` (at most one of them) as the library's `TensorFilter`.
fn tensor_filter(names: Option<Vec<String>>, prefixes: Option<Vec<String>>) -> PyResult<TensorFilter> {
    match (names, prefixes) {
        (Some(_), Some(_)) => Err(PyValueError::new_err("load: give names= or prefix=, not both")),
        (Some(names), None) => Ok(TensorFilter::Names(names.into_iter().collect())),
        (None, Some(prefixes)) => Ok(TensorFilter::Prefixes(prefixes)),
        (None, None) => Ok(TensorFilter::All),
    }
}

/// The stream's options from `hetmem.load`'s keywords; the windows method is not offered
/// (it maps the files, and a file truncated under a mapping faults).
fn stream_options(method: &str, threads: Option<Int>, chunk_bytes: Option<Int>) -> PyResult<StreamOptions> {
    let method: LoadMethod = method.parse().map_err(to_py_err)?;
    if method == LoadMethod::Windows {
        return Err(PyValueError::new_err(
            "load: method \"windows\" maps the files in place, which a file truncated under it turns into a crash; \
             use \"auto\", \"staged\" or \"staged-direct\"",
        ));
    }
    let defaults = StreamOptions::default();
    let threads =
        threads.map(|threads| threads.size("load threads")).transpose()?.unwrap_or(defaults.threads);
    let chunk_bytes =
        chunk_bytes.map(|chunk| chunk.size("load chunk_bytes")).transpose()?.unwrap_or(defaults.chunk_bytes);
    let ring_depth = threads.checked_mul(2).ok_or_else(|| {
        PyValueError::new_err(format!("load: {threads} threads; give at most a few hundred"))
    })?;
    Ok(StreamOptions { method, threads, chunk_bytes, ring_depth })
}

/// The checkpoint `sources` names: one index, or safetensors files.
fn checkpoint(sources: &[PathBuf]) -> PyResult<Checkpoint> {
    let is_index = |path: &PathBuf| path.extension().is_some_and(|ext| ext == "json");
    match sources {
        [] => Err(PyValueError::new_err(
            "load: no file given; give a .safetensors file, a list of them, or an index",
        )),
        [index] if is_index(index) => Checkpoint::from_index(index).map_err(to_py_err),
        files if files.iter().any(is_index) => Err(PyValueError::new_err(
            "load: an index (.json) among other files; give the index alone, or the shard files without it",
        )),
        files => Checkpoint::from_files(files).map_err(to_py_err),
    }
}

/// Refuses a load larger than the GPU's free memory, before allocating.
fn check_fits(device: &hetmem::Device, plan: &LoadPlan) -> PyResult<()> {
    let Some(free) = device.free_device_memory().map_err(|error| to_py_err(error.into()))? else {
        return Ok(());
    };
    if plan.total_bytes() as u64 > free {
        return Err(HetmemError::new_err(format!(
            "load: {} bytes of tensors do not fit in the {free} bytes free on {}; load fewer (names= or prefix=), \
             or free device memory",
            plan.total_bytes(),
            device.name()
        )));
    }
    Ok(())
}

/// Says the load has finished when dropped, and wakes its caller now rather than at its next
/// look, so the load returns as soon as it is done: also when the load panics, so the watch
/// ends and the join passes the panic on instead of the caller looking for ever.
struct Finished<'a> {
    flag: &'a AtomicBool,
    caller: std::thread::Thread,
}

impl Drop for Finished<'_> {
    fn drop(&mut self) {
        self.flag.store(true, Ordering::Release);
        self.caller.unpark();
    }
}

/// Streams `plan` into a new allocation of `device` on a thread of its own, while this thread
/// watches it ([`watch`]); the stream is kept for the next load after a success.
fn load_plan(
    py: Python<'_>,
    device: &hetmem::Device,
    plan: &LoadPlan,
    options: StreamOptions,
    progress: Option<&Py<PyAny>>,
) -> PyResult<(Memory, LoadReport)> {
    let ordinal = device.as_cuda().map(|cuda| cuda.ordinal());
    // Pinning a new stream's ring takes a tenth of a second or more: the interpreter let go.
    let mut stream = py.detach(|| take_stream(device, ordinal, options)).map_err(to_py_err)?;
    let cancel = Arc::new(AtomicBool::new(false));
    stream.set_cancel(Some(Arc::clone(&cancel)));
    let to_read: u64 = plan.parts().iter().map(|(range, _)| range.len).sum();
    let done = AtomicU64::new(0);
    let finished = AtomicBool::new(false);
    let caller = std::thread::current();
    let (loaded, raised) = std::thread::scope(|scope| {
        let worker = scope.spawn(|| {
            let _finished = Finished { flag: &finished, caller };
            stream_plan(&mut stream, plan, &done)
        });
        let raised = watch(py, progress, to_read, &done, &finished, &cancel);
        let loaded = py.detach(|| worker.join()).unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (loaded, raised)
    });
    // Raised by a signal handler or the callback: the load stopped (or ended just then) and
    // its allocation, if any, is dropped here; the raised exception is the caller's error.
    if let Some(error) = raised {
        return Err(error);
    }
    let loaded = loaded.map_err(to_py_err)?;
    stream.set_cancel(None);
    // The stream put out of the kept ones (its ring unpinned) is dropped after the lock is let go.
    let _evicted = {
        let mut kept = STREAMS.lock().unwrap_or_else(PoisonError::into_inner);
        let evicted = (kept.len() >= KEPT_STREAMS).then(|| kept.remove(0));
        kept.push((ordinal, options, stream));
        evicted
    };
    Ok(loaded)
}

/// Streams `plan` into a new allocation of the stream's device, recording the bytes done in
/// `done`. A failed or stopped load drops its allocation here, once the copies into it ended
/// (the lease's drop waits for them).
fn stream_plan(
    stream: &mut FileStream,
    plan: &LoadPlan,
    done: &AtomicU64,
) -> hetmem::Result<(Memory, LoadReport)> {
    // The kept stream's device (the same GPU, or the CPU backend), which its queue copies for.
    let device = &stream.device().clone();
    let queue = stream.queue().clone();
    // An allocation has at least one byte; a plan of empty tensors needs none.
    let bytes = plan.total_bytes().max(1);
    let record = |done_now: u64| done.store(done_now, Ordering::Relaxed);
    if device.as_cuda().is_some() {
        let mut dst = queue.lend(DeviceBuf::<u8>::new(device, bytes)?);
        let report = stream.load_plan(plan, &mut dst, &record)?;
        Ok((Memory::from_device(dst.reclaim()?, device), report))
    } else {
        let mut dst = queue.lend(HostBuf::<u8>::pinned(device, bytes, PinOptions::default())?);
        let report = stream.load_plan(plan, &mut dst, &record)?;
        Ok((Memory::from_host(dst.reclaim()?, device), report))
    }
}

/// The load's calling thread until the load has `finished`: every [`WATCH_EVERY`] (the
/// interpreter let go meanwhile) it runs the signal handlers, then calls
/// `callback(bytes_done, total)`. The first exception either raises sets `cancel`, which stops
/// the load at its next piece, and is returned; no call is made after it. Signal handlers run
/// only on the main thread: a load on another thread (a `device_map`'s) is stopped by its
/// callback raising (the map's, once the whole load failed or heard Ctrl-C).
fn watch(
    py: Python<'_>,
    callback: Option<&Py<PyAny>>,
    total: u64,
    done: &AtomicU64,
    finished: &AtomicBool,
    cancel: &AtomicBool,
) -> Option<PyErr> {
    loop {
        py.detach(|| {
            if !finished.load(Ordering::Acquire) {
                std::thread::park_timeout(WATCH_EVERY);
            }
        });
        if finished.load(Ordering::Acquire) {
            return None;
        }
        let looked = py.check_signals().and_then(|()| match callback {
            Some(callback) => callback.call1(py, (done.load(Ordering::Relaxed), total)).map(drop),
            None => Ok(()),
        });
        if let Err(error) = looked {
            cancel.store(true, Ordering::Relaxed);
            return Some(error);
        }
    }
}

/// A kept stream of `device` with `options`, or a new one.
fn take_stream(
    device: &hetmem::Device,
    ordinal: Option<usize>,
    options: StreamOptions,
) -> hetmem::Result<FileStream> {
    let found = {
        let mut kept = STREAMS.lock().unwrap_or_else(PoisonError::into_inner);
        let at = kept.iter().position(|(on, with, _)| *on == ordinal && *with == options);
        at.map(|index| kept.remove(index).2)
    };
    // A new stream is made with the lock let go: pinning its ring takes a tenth of a second or
    // more, and the loads of other devices (a device_map's) must not wait for it.
    match found {
        Some(stream) => Ok(stream),
        None => FileStream::new(device, &Queue::new(device)?, options),
    }
}

/// The link's host-to-device rate, as `hetmem load` measures it (hetmem-bench's: the best of 5
/// copies of 256 MiB from pinned memory), GB/s; None on the CPU backend. Takes a few tenths of
/// a second (pinning the buffer, mostly), with the interpreter released.
#[pyfunction]
pub fn link_h2d_gb_per_s(py: Python<'_>, device: &Device) -> PyResult<Option<f64>> {
    py.detach(|| {
        let queue = Queue::new(&device.inner)?;
        hetmem_bench::file::link_h2d_gb_per_s(&device.inner, &queue)
    })
    .map_err(|error| HetmemError::new_err(format!("measuring the link: {error}")))
}
