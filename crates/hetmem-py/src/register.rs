//! `register`: an array's memory pinned in place, found by Rust from the array itself.
//!
//! The array's bytes are read from its own DLPack capsule, which the registration consumes;
//! what keeps those bytes alive and where they are (the array owning them, pinned against
//! resizing, or a tensor's shared storage) is found and checked by `owner`.
//!
//! Registration pins whole pages, and the driver registers a page once: a table of live
//! registrations lets an array whose pages one covers already share it, and refuses one
//! that overlaps one in part, with the cause and the remedy.

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use hetmem::{HostBuf, memory::RegisterOptions};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::device::Device;
use crate::import::{HostTensor, TensorInfo};
use crate::memory::{Layout, Memory};
use crate::owner::{Kept, take};
use crate::{HetmemError, to_py_err};

/// A live registration: the pages it pins and how.
struct Pages {
    /// The registration, which holds the first array's owner; only dropped, by `Drop`.
    buffer: ManuallyDrop<HostBuf<u8>>,
    /// The first array's host and device addresses: the pages map contiguously from them.
    host_ptr: usize,
    device_ptr: Option<u64>,
    kind: &'static str,
    /// Set once the pages are unregistered: until then a new registration of them would
    /// fail in the driver.
    released: Arc<AtomicBool>,
}

impl Drop for Pages {
    fn drop(&mut self) {
        // SAFETY: drop runs once, and `buffer` is not used after it.
        unsafe { ManuallyDrop::drop(&mut self.buffer) };
        self.released.store(true, Ordering::Release);
    }
}

/// An entry of the table of live registrations.
struct Entry {
    /// The first page's address, and the end of the last.
    first: usize,
    end: usize,
    mapped: bool,
    portable: bool,
    pages: Weak<Pages>,
    /// The registration's `released`: an entry whose pages are gone but not yet released is
    /// being unregistered now.
    released: Arc<AtomicBool>,
}

/// How long a registration waits for an overlapping one that is being unregistered as it
/// looks (its last buffer died a moment ago): unregistering takes milliseconds.
const RELEASE_WAIT: Duration = Duration::from_secs(2);

static LIVE: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

/// The pages covering `nbytes` at `address` (the sum was checked not to overflow).
fn page_span(tensor: &HostTensor) -> PyResult<(usize, usize)> {
    let page = hetmem::memory::page_size();
    let address = tensor.address;
    let first = address - address % page;
    let end = (address + tensor.nbytes).checked_next_multiple_of(page).ok_or_else(|| {
        PyValueError::new_err("register: the array's last page lies past the address space")
    })?;
    Ok((first, end))
}

/// Pins `owner` (a NumPy array, a PyTorch CPU tensor in shared memory, or an object NumPy
/// views in place: see `owner`) in place and returns its memory, with what the owner's capsule
/// describes (its shape and element type). An array whose pages a live registration covers
/// already shares it; one that overlaps one in part is refused.
#[pyfunction]
#[pyo3(signature = (device, owner, mapped = true, portable = false))]
pub fn register(
    py: Python<'_>,
    device: &Device,
    owner: &Bound<'_, PyAny>,
    mapped: bool,
    portable: bool,
) -> PyResult<(Memory, TensorInfo)> {
    let taken = take(owner)?;
    let tensor = taken.tensor;
    let (first, end) = page_span(&tensor)?;
    let device = &device.inner;
    // The table's lock is only ever taken detached, so no thread holds it while waiting for
    // the interpreter. A failure hands `kept` back; a registration that failed part-way
    // beside a resident kernel keeps it until its pieces are unregistered.
    let made = py.detach(|| {
        let mut kept = Some(taken.kept);
        let started = Instant::now();
        loop {
            match register_pages(&mut kept, &tensor, first, end, mapped, portable, device) {
                Attempt::Done(result) => return result,
                Attempt::Releasing if started.elapsed() < RELEASE_WAIT => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Attempt::Releasing => {
                    let error = HetmemError::new_err(format!(
                        "register: a registration of hetmem's over these pages [{first:#x}, {end:#x}) is still \
                         being unregistered {} s after its last buffer died (its release is waiting for the GPU): \
                         try again once that GPU work has finished",
                        RELEASE_WAIT.as_secs()
                    ));
                    return Err((error, kept));
                }
            }
        }
    });
    match made {
        Ok(memory) => Ok((memory, taken.info)),
        Err((error, kept)) => {
            drop(kept);
            Err(error)
        }
    }
}

/// One try at registering: done (or failed), or blocked by an overlapping registration whose
/// last user is unregistering it now.
enum Attempt {
    Done(Result<Memory, (PyErr, Option<Kept>)>),
    Releasing,
}

/// Registers `tensor`'s pages `[first, end)`, or shares a live registration that covers them;
/// `kept` is taken when it succeeds.
fn register_pages(
    kept: &mut Option<Kept>,
    tensor: &HostTensor,
    first: usize,
    end: usize,
    mapped: bool,
    portable: bool,
    device: &hetmem::Device,
) -> Attempt {
    let mut live = LIVE.lock().unwrap_or_else(|poison| poison.into_inner());
    live.retain(|entry| entry.pages.strong_count() > 0 || !entry.released.load(Ordering::Acquire));
    for entry in live.iter() {
        if entry.first >= end || first >= entry.end {
            continue;
        }
        let covered = entry.first <= first && end <= entry.end;
        let options_fit = (entry.mapped || !mapped) && (entry.portable || !portable);
        match entry.pages.upgrade() {
            Some(pages) if covered && options_fit => {
                let kept = kept.take().expect("kept until the registration is made");
                return Attempt::Done(share(pages, kept, tensor, device));
            }
            // Its last user is letting it go as we look: the driver would refuse the pages
            // until it has unregistered them.
            None => return Attempt::Releasing,
            Some(_) => {
                let error = HetmemError::new_err(overlap_message(first, end, entry, covered));
                return Attempt::Done(Err((error, kept.take())));
            }
        }
    }
    let options = RegisterOptions { mapped, portable, ..RegisterOptions::default() };
    let owner = kept.take().expect("kept until the registration is made");
    // SAFETY: `tensor` was read from the owner's DLPack capsule, which `owner` consumed and
    // holds: by DLPack's contract its producer keeps those bytes valid until the deleter runs,
    // when `owner` drops; `owner::take` checked that they lie inside what an object `owner`
    // holds keeps in place (an array that owns its memory, pinned against resizing by a weak
    // reference; a locking exporter's export; a shared, non-resizable tensor storage), and
    // that they are writable (not flagged read-only) host memory. `owner` moves into the
    // buffer, which lets it go only after unregistering. No live registration of hetmem's
    // covers their pages (the table above, which also waits for one being unregistered); a
    // page registered outside hetmem is refused by the driver.
    let registered =
        unsafe { HostBuf::register_in_place(device, owner, tensor.ptr(), tensor.nbytes, options) };
    let mut buffer = match registered {
        Ok(buffer) => buffer,
        Err(failure) => return Attempt::Done(Err((registration_error(failure.error), failure.memory))),
    };
    let layout = Layout::of_host(&mut buffer);
    let released = Arc::new(AtomicBool::new(false));
    let pages = Arc::new(Pages {
        host_ptr: layout.host_ptr,
        device_ptr: layout.device_ptr,
        kind: layout.kind,
        buffer: ManuallyDrop::new(buffer),
        released: Arc::clone(&released),
    });
    live.push(Entry { first, end, mapped, portable, pages: Arc::downgrade(&pages), released });
    Attempt::Done(Ok(Memory::new(Box::new(pages), layout, device)))
}

/// A memory over `tensor`'s bytes, which `pages` (a live registration) covers; `kept` holds
/// the tensor's owner, `pages` the registration.
fn share(
    pages: Arc<Pages>,
    kept: Kept,
    tensor: &HostTensor,
    device: &hetmem::Device,
) -> Result<Memory, (PyErr, Option<Kept>)> {
    let host_ptr = tensor.address;
    // The registration maps its pages as one range: device addresses follow host ones.
    let device_ptr = match pages.device_ptr {
        None => None,
        Some(base) => {
            let address = i128::from(base) + (host_ptr as i128 - pages.host_ptr as i128);
            match u64::try_from(address) {
                Ok(address) => Some(address),
                Err(_) => {
                    let error =
                        HetmemError::new_err("register: the shared registration's device address wraps");
                    return Err((error, Some(kept)));
                }
            }
        }
    };
    let layout = Layout { host_ptr, nbytes: tensor.nbytes, device_ptr, readonly: false, kind: pages.kind };
    Ok(Memory::new(Box::new((pages, kept)), layout, device))
}

fn overlap_message(first: usize, end: usize, entry: &Entry, covered: bool) -> String {
    if covered {
        return format!(
            "register: this array's pages [{first:#x}, {end:#x}) lie in a live registration of hetmem's made with \
             mapped={}, portable={}, which cannot give what was asked (a page is registered once, with one set of \
             options): register with the same options, or let the other buffer and its views die first",
            py_bool(entry.mapped),
            py_bool(entry.portable)
        );
    }
    format!(
        "register: this array's pages [{first:#x}, {end:#x}) overlap a live registration of hetmem's, [{:#x}, \
         {:#x}), without lying inside it (registration pins whole pages, and a page is registered once): \
         register one array holding both, keep the arrays on pages of their own (allocate them with \
         hetmem.pinned), or let the other buffer and its views die first",
        entry.first, entry.end
    )
}

fn py_bool(value: bool) -> &'static str {
    if value { "True" } else { "False" }
}

/// The registration's error; for a page registered already, with what to do from Python.
fn registration_error(error: hetmem::Error) -> PyErr {
    if !error.to_string().contains("ALREADY_REGISTERED") {
        return to_py_err(error);
    }
    HetmemError::new_err(format!(
        "{error}; from Python: a page under this array is registered already, and no live registration of \
         hetmem's covers it, so another library pinned it (PyTorch's pin_memory, CuPy's cudaHostRegister; or hetmem \
         itself, for a registration released while a resident kernel runs, which unregisters when the kernel \
         ends): register memory that library has not pinned, or allocate with hetmem.pinned"
    ))
}
