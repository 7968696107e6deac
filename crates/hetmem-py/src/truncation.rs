//! Files truncated under a window: the checks before Python gets a host view of a window, and
//! the guard around the native loops that read or write windows (the loader's batches), so a
//! shrunk file raises `HetmemError` instead of killing the interpreter with SIGBUS.

use hetmem::memory::{FileWindow, FileWindowMut};
use pyo3::prelude::*;

use crate::memory::Memory;
use crate::to_py_err;

/// The window `memory` is, if it is one.
enum Window<'a> {
    Read(&'a FileWindow<u8>),
    Write(&'a FileWindowMut<u8>),
}

fn window_of(memory: &Memory) -> Option<Window<'_>> {
    let owner = memory.owner();
    owner
        .downcast_ref::<FileWindow<u8>>()
        .map(Window::Read)
        .or_else(|| owner.downcast_ref::<FileWindowMut<u8>>().map(Window::Write))
}

/// Raises `HetmemError` when `memory` is a window whose file no longer holds it (or an access
/// to it faulted): checked before every host view (NumPy, DLPack) of a window, which would
/// otherwise hand out memory that ends the process when read. A file truncated after the view
/// was made is not caught (as with `numpy.memmap`).
#[pyfunction]
pub fn check_file(memory: &Memory) -> PyResult<()> {
    let checked = match window_of(memory) {
        Some(Window::Read(window)) => window.check_file(),
        Some(Window::Write(window)) => window.check_file(),
        None => Ok(()),
    };
    checked.map_err(to_py_err)
}

/// Runs `f`, a native loop over `memory`'s bytes, with a window's file checked
/// first and a fault from a truncation while `f` runs recovered (see
/// `FileWindow::guard_truncation`); other memory runs `f` as it is.
pub(crate) fn guarded<R>(memory: &Memory, f: impl FnOnce() -> R) -> hetmem::Result<R> {
    match window_of(memory) {
        Some(Window::Read(window)) => window.guard_truncation(f),
        Some(Window::Write(window)) => window.guard_truncation(f),
        None => Ok(f()),
    }
}
