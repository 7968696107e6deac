//! `Attached`: Python references inside the Rust values that hold memory (a registration's
//! owner, a shared registration's array), dropped attached to the interpreter wherever the
//! value itself is dropped.
//!
//! A `Memory` drops what holds its memory with the interpreter released (unregistering,
//! freeing pinned memory and writing back a window can take milliseconds); the Python parts
//! must still go at that moment, with the interpreter, not whenever PyO3's pool of deferred
//! references is next drained: a NumPy array must become resizable again as soon as the
//! registration that pinned it has gone.

use std::mem::ManuallyDrop;

use pyo3::ffi;
use pyo3::prelude::*;

/// A value of Python references (`Py<...>`, a tuple of them), dropped attached.
pub(crate) struct Attached<T: Send>(ManuallyDrop<T>);

impl<T: Send> Attached<T> {
    pub(crate) fn new(value: T) -> Attached<T> {
        Attached(ManuallyDrop::new(value))
    }
}

impl<T: Send> std::ops::Deref for Attached<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: Send> Drop for Attached<T> {
    fn drop(&mut self) {
        // SAFETY: Py_IsInitialized may be called at any time, attached or not.
        if unsafe { ffi::Py_IsInitialized() } == 0 {
            // The interpreter is gone or going (a buffer freed at exit): it frees every object
            // itself, and attaching to it is no longer possible.
            return;
        }
        // SAFETY: drop runs once, and the value is not used after it.
        Python::attach(|_| unsafe { ManuallyDrop::drop(&mut self.0) });
    }
}
