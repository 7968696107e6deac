//! [`DeviceBuf`]: memory on the GPU (plain host memory on the CPU backend).

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

use super::Element;
use super::budget::{Charge, DeviceBudget};
use super::in_flight::{InFlight, Waiter};
use super::{Buffer, Region, Sealed, WritableBuffer};
use crate::backend::Device;
use crate::backend::cpu::memory::{PageBox, byte_len};
use crate::backend::cuda::{CudaDevice, DeviceAlloc};
use crate::error::{Error, Result};

enum DeviceStorage {
    /// The buffer's own copies run on the device's utility stream and wait for themselves; one
    /// whose wait failed may still be queued there, so the allocation is freed only once that
    /// stream is idle (and leaked if it cannot be waited for).
    Cuda {
        alloc: InFlight<DeviceAlloc>,
        device: CudaDevice,
    },
    Plain(PageBox<u8>),
}

/// `len` elements of device memory. The CPU cannot address it: data moves in and out by
/// copies ([`DeviceBuf::copy_from_slice`], or queued copies between leases).
pub struct DeviceBuf<T> {
    storage: DeviceStorage,
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
        let storage = match device {
            Device::Cpu(_) => DeviceStorage::Plain(PageBox::zeroed(bytes)?),
            Device::Cuda(cuda) => {
                let stream = cuda.utility_stream()?;
                let mut alloc =
                    InFlight::new(DeviceAlloc::new(cuda, bytes)?, [Waiter::Stream(Arc::clone(&stream))]);
                alloc.zero(&stream)?;
                DeviceStorage::Cuda { alloc, device: cuda.clone() }
            }
        };
        Ok(DeviceBuf { storage, len, _charge: charge, _elems: PhantomData })
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
        match &mut self.storage {
            DeviceStorage::Plain(memory) => {
                crate::faults::fail::<crate::Error>(crate::faults::FaultPoint::Copy)?;
                memory[..size_of_val(src)].copy_from_slice(bytemuck::cast_slice(src))
            }
            DeviceStorage::Cuda { alloc, device } => {
                let stream = device.utility_stream()?;
                alloc.upload(&stream, bytemuck::cast_slice(src))?
            }
        }
        Ok(())
    }

    /// Copies the buffer into `dst` and waits for the copy.
    ///
    /// # Errors
    /// `dst` of another length, or a failed copy.
    pub fn copy_to_slice(&self, dst: &mut [T]) -> Result<()> {
        self.check_len(dst.len())?;
        match &self.storage {
            DeviceStorage::Plain(memory) => {
                crate::faults::fail::<crate::Error>(crate::faults::FaultPoint::Copy)?;
                bytemuck::cast_slice_mut(dst).copy_from_slice(&memory[..self.len * size_of::<T>()])
            }
            DeviceStorage::Cuda { alloc, device } => {
                let stream = device.utility_stream()?;
                alloc.download(&stream, bytemuck::cast_slice_mut(dst))?
            }
        }
        Ok(())
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
        match &self.storage {
            DeviceStorage::Plain(memory) => Region {
                host: Some(memory.pages().0),
                device: None,
                bytes,
                device_ordinal: None,
                pages: None,
                read_only: false,
                portable: false,
            },
            DeviceStorage::Cuda { alloc, device } => Region {
                host: None::<NonNull<u8>>,
                device: Some(alloc.device_ptr()),
                bytes,
                device_ordinal: Some(device.ordinal()),
                pages: None,
                read_only: false,
                portable: false,
            },
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
