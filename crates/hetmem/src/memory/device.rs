//! [`DeviceBuf`]: memory on the GPU (plain host memory on the CPU backend).

use std::marker::PhantomData;
use std::sync::Arc;

use super::Element;
use super::budget::{Charge, DeviceBudget};
use super::in_flight::{InFlight, Waiter};
use super::{Buffer, Region, Sealed, WritableBuffer};
use crate::backend::Device;
use crate::backend::cpu::memory::byte_len;
use crate::backend::memory::DeviceMemory;
use crate::error::{Error, Result};

/// `len` elements of device memory. The CPU cannot address it: data moves in and out by
/// copies ([`DeviceBuf::copy_from_slice`], or queued copies between leases).
pub struct DeviceBuf<T> {
    /// Freed only once its stream is idle (at once on the CPU backend).
    storage: InFlight<DeviceMemory>,
    len: usize,
    /// The bytes taken from a [`DeviceBudget`], given back when the buffer is freed.
    _charge: Option<Charge>,
    _elems: PhantomData<T>,
}

impl<T: Element> DeviceBuf<T> {
    /// `len` elements on `device`, zeroed.
    ///
    /// # Errors
    /// Zero length, size overflow, or the driver's out-of-memory error.
    pub fn new(device: &Device, len: usize) -> Result<DeviceBuf<T>> {
        DeviceBuf::allocate(device, len, None)
    }

    /// `len` elements on `device`, zeroed, charged to `budget` until the buffer is dropped.
    ///
    /// # Errors
    /// [`Error::BudgetExceeded`] when the buffer does not fit in what is left of the budget
    /// (checked before allocating); otherwise as for [`DeviceBuf::new`].
    ///
    /// # Examples
    /// ```
    /// use hetmem::{Device, DeviceBuf, memory::DeviceBudget};
    /// let device = Device::open_best()?;
    /// let budget = DeviceBudget::new(1 << 20);
    /// let chunk = DeviceBuf::<u32>::with_budget(&device, 1 << 18, &budget)?; // 1 MiB
    /// assert!(DeviceBuf::<u32>::with_budget(&device, 1, &budget).is_err());
    /// drop(chunk);
    /// assert_eq!(budget.in_use(), 0);
    /// # Ok::<(), hetmem::Error>(())
    /// ```
    pub fn with_budget(device: &Device, len: usize, budget: &DeviceBudget) -> Result<DeviceBuf<T>> {
        let bytes = byte_len::<T>("device buffer length", len)?;
        DeviceBuf::allocate(device, len, Some(budget.charge(bytes as u64)?))
    }

    fn allocate(device: &Device, len: usize, charge: Option<Charge>) -> Result<DeviceBuf<T>> {
        let bytes = byte_len::<T>("device buffer length", len)?;
        let memory = device.allocate_device(bytes)?;
        // Held from the start where it is freed only once its stream is idle, so that a failed
        // zeroing does not free it under the GPU.
        let waiters = memory.stream().map(|stream| Waiter::Stream(Arc::clone(stream)));
        let mut storage = InFlight::new(memory, waiters);
        storage.zero_fresh()?;
        Ok(DeviceBuf { storage, len, _charge: charge, _elems: PhantomData })
    }

    /// The address kernels use for the first element; None on the CPU backend, where the
    /// buffer is host memory that only copies reach.
    pub fn device_ptr(&self) -> Option<u64> {
        self.storage.device_ptr()
    }

    /// The GPU the buffer is on: its ordinal among the process's CUDA devices; `None` on the
    /// CPU backend.
    pub fn gpu_ordinal(&self) -> Option<usize> {
        self.storage.gpu_ordinal()
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: hetmem buffers hold at least one element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `src` into the buffer and waits for the copy.
    ///
    /// # Errors
    /// `src` of another length, or a failed copy.
    pub fn copy_from_slice(&mut self, src: &[T]) -> Result<()> {
        self.check_len(src.len())?;
        Ok(self.storage.upload(bytemuck::cast_slice(src))?)
    }

    /// Copies the buffer into `dst` and waits for the copy.
    ///
    /// # Errors
    /// `dst` of another length, or a failed copy.
    pub fn copy_to_slice(&self, dst: &mut [T]) -> Result<()> {
        self.check_len(dst.len())?;
        Ok(self.storage.download(bytemuck::cast_slice_mut(dst))?)
    }

    /// The buffer's contents in a new `Vec`.
    ///
    /// # Errors
    /// A failed copy.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); self.len];
        self.copy_to_slice(&mut out)?;
        Ok(out)
    }

    fn check_len(&self, len: usize) -> Result<()> {
        if len != self.len {
            return Err(Error::invalid(
                "copy length",
                format!("{len} elements for a device buffer of {}", self.len),
            ));
        }
        Ok(())
    }
}

impl<T: Element> Sealed for DeviceBuf<T> {
    fn region(&self) -> Region {
        let bytes = self.len * size_of::<T>();
        Region {
            host: self.storage.host_ptr(),
            device: self.storage.device_ptr(),
            bytes,
            device_ordinal: self.storage.gpu_ordinal(),
            pages: None,
            read_only: false,
            portable: false,
        }
    }
}

impl<T: Element> Buffer for DeviceBuf<T> {
    type Elem = T;

    fn len(&self) -> usize {
        self.len
    }
}

impl<T: Element> WritableBuffer for DeviceBuf<T> {}

impl<T> std::fmt::Debug for DeviceBuf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuf").field("len", &self.len).finish_non_exhaustive()
    }
}
