//! The CUDA smoke test: a device opens, a kernel compiles, loads and runs on fresh random data,
//! and its output matches the CPU's. Also the backend's error paths on a real device.

use std::ffi::c_void;

use hetmem::backend::cuda::raw::{self, DeviceAlloc};
use hetmem::backend::cuda::{Event, LaunchConfig, Module, Stream};
use hetmem::kernels::{self, AFFINE, CodeOrigin};
use hetmem::testing::cuda_device_or_skip;
use hetmem::{Device, Error};

use crate::support::{first_mismatch, random_words};

const POISON: u8 = 0xA5;

#[test]
fn affine_kernel_matches_the_cpu_on_random_data() {
    let Some(device) = cuda_device_or_skip("affine_kernel_matches_the_cpu_on_random_data") else {
        return;
    };
    affine_matches_the_cpu(&device, kernels::origin());
}

/// The shipped PTX, compiled by the driver, computes what the CPU does: the code hetmem runs
/// where no NVRTC is installed.
#[test]
fn affine_kernel_from_shipped_ptx_matches_the_cpu() {
    let Some(device) = cuda_device_or_skip("affine_kernel_from_shipped_ptx_matches_the_cpu") else {
        return;
    };
    affine_matches_the_cpu(&device, CodeOrigin::Ptx);
}

/// Every entry point of every built-in kernel loads from its shipped PTX on this device.
#[test]
fn every_shipped_ptx_loads_with_its_entry_points() {
    let Some(device) = cuda_device_or_skip("every_shipped_ptx_loads_with_its_entry_points") else {
        return;
    };
    for source in kernels::ALL {
        for entry in source.entry_points {
            kernels::kernel_from(&device, source, entry, CodeOrigin::Ptx)
                .unwrap_or_else(|error| panic!("{}::{entry} from PTX: {error}", source.name));
        }
    }
}

fn affine_matches_the_cpu(device: &hetmem::backend::cuda::CudaDevice, origin: CodeOrigin) {
    // An odd length, so a kernel that assumes whole blocks or vectors leaves a visible tail.
    let len = (1 << 22) + 13;
    let x = random_words(len);
    let (a, b) = (fastrand::u32(..) | 1, fastrand::u32(..));
    let expected: Vec<u32> = x.iter().map(|v| v.wrapping_mul(a).wrapping_add(b)).collect();

    let stream = Stream::new(device).unwrap();
    let mut x_dev = DeviceAlloc::new(device, len * 4).unwrap();
    let mut y_dev = DeviceAlloc::new(device, len * 4).unwrap();
    x_dev.upload(&stream, bytemuck::cast_slice(&x)).unwrap();
    y_dev.upload(&stream, &vec![POISON; len * 4]).unwrap();

    let kernel = kernels::kernel_from(device, &AFFINE, "affine_u32", origin).unwrap();
    let (mut x_ptr, mut y_ptr, mut n, mut a_arg, mut b_arg) =
        (x_dev.device_ptr(), y_dev.device_ptr(), len as u64, a, b);
    let mut args = [
        (&raw mut x_ptr).cast::<c_void>(),
        (&raw mut y_ptr).cast(),
        (&raw mut n).cast(),
        (&raw mut a_arg).cast(),
        (&raw mut b_arg).cast(),
    ];
    let (start, end) = (Event::new(device, true).unwrap(), Event::new(device, true).unwrap());
    start.record(&stream).unwrap();
    // SAFETY: the arguments match affine_u32(const u32*, u32*, u64, u32, u32) in order and type;
    // both allocations hold `len` words and outlive the stream synchronisation below.
    unsafe { raw::launch(&kernel, &stream, LaunchConfig::linear(len, 256, 1024), &mut args) }.unwrap();
    end.record(&stream).unwrap();
    stream.synchronize().unwrap();
    assert!(end.is_complete().unwrap());
    assert!(end.elapsed_ms_since(&start).unwrap() > 0.0);

    let mut y = vec![0u32; len];
    y_dev.download(&stream, bytemuck::cast_slice_mut(&mut y)).unwrap();
    assert_eq!(first_mismatch(&y, &expected), None, "GPU output differs from the CPU's");
    device.synchronize().unwrap();
}

#[test]
fn the_best_device_is_the_gpu_when_there_is_one() {
    let Some(gpu) = cuda_device_or_skip("the_best_device_is_the_gpu_when_there_is_one") else {
        return;
    };
    let best = Device::open(hetmem::BackendChoice::Auto).unwrap();
    assert_eq!(best.as_cuda().unwrap().pci_bus_id(), gpu.pci_bus_id());
    assert!(!gpu.name().is_empty());
    assert!(gpu.compute_capability().major >= 7);
    let (free, total) = gpu.memory_info().unwrap();
    assert!(free > 0 && free <= total && total == gpu.total_memory());
}

#[test]
fn backend_errors_name_the_call_and_the_remedy() {
    let Some(device) = cuda_device_or_skip("backend_errors_name_the_call_and_the_remedy") else {
        return;
    };
    // Random words, made to look like no ELF image: the driver parses them as PTX text, which
    // ends at the NUL Module::load appends.
    let mut garbage = random_words(256);
    garbage[0] = u32::from_le_bytes(*b"//x ");
    // SAFETY: not an ELF image (checked above), so the driver reads text up to the NUL.
    match unsafe { Module::load(&device, bytemuck::cast_slice(&garbage)) }.map_err(Error::from) {
        Err(Error::Cuda(error)) => {
            assert_eq!(error.call, "cuModuleLoadData");
            assert!(error.name.starts_with("CUDA_ERROR_"), "{error}");
        }
        other => panic!("loading garbage should fail in the driver, got {other:?}"),
    }
    match DeviceAlloc::new(&device, 1 << 50).map_err(Error::from) {
        Err(Error::Cuda(error)) => {
            assert_eq!(error.name, "CUDA_ERROR_OUT_OF_MEMORY");
            assert!(error.to_string().contains("GPU is out of memory"), "{error}");
        }
        other => panic!("a 1 PiB allocation should fail, got {other:?}"),
    }
    assert!(matches!(DeviceAlloc::new(&device, 0).map_err(Error::from), Err(Error::InvalidArgument { .. })));
    let stream = Stream::new(&device).unwrap();
    let mut small = DeviceAlloc::new(&device, 16).unwrap();
    assert!(matches!(
        small.upload(&stream, &[1; 17]).map_err(Error::from),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        kernels::kernel(&device, &AFFINE, "no_such_kernel"),
        Err(Error::InvalidArgument { .. })
    ));
    // The device still works after all of that.
    small.upload(&stream, &[7; 16]).unwrap();
    let mut back = [0u8; 16];
    small.download(&stream, &mut back).unwrap();
    assert_eq!(back, [7; 16]);
}

/// The legacy default stream, borrowed: an event recorded there marks the work launched on it
/// (what the Python binding waits for when a DLPack consumer names `stream=1`), and dropping
/// one handle to it leaves it usable.
#[test]
fn the_legacy_default_stream_is_borrowed_and_its_events_mark_its_work() {
    const TEST: &str = "the_legacy_default_stream_is_borrowed_and_its_events_mark_its_work";
    let Some(device) = cuda_device_or_skip(TEST) else { return };
    let len = (1 << 22) + 13;
    let x = random_words(len);
    let ours = Stream::new(&device).unwrap();
    let mut x_dev = DeviceAlloc::new(&device, len * 4).unwrap();
    let mut y_dev = DeviceAlloc::new(&device, len * 4).unwrap();
    x_dev.upload(&ours, bytemuck::cast_slice(&x)).unwrap();
    ours.synchronize().unwrap();
    let kernel = kernels::kernel(&device, &AFFINE, "affine_u32").unwrap();
    for round in 0..2 {
        y_dev.upload(&ours, &vec![POISON; len * 4]).unwrap();
        ours.synchronize().unwrap();
        let (a, b) = (fastrand::u32(..) | 1, fastrand::u32(..));
        let expected: Vec<u32> = x.iter().map(|v| v.wrapping_mul(a).wrapping_add(b)).collect();
        let legacy = Stream::legacy_default(&device).unwrap();
        let (mut x_ptr, mut y_ptr, mut n, mut a_arg, mut b_arg) =
            (x_dev.device_ptr(), y_dev.device_ptr(), len as u64, a, b);
        let mut args = [
            (&raw mut x_ptr).cast::<c_void>(),
            (&raw mut y_ptr).cast(),
            (&raw mut n).cast(),
            (&raw mut a_arg).cast(),
            (&raw mut b_arg).cast(),
        ];
        // SAFETY: the arguments match affine_u32(const u32*, u32*, u64, u32, u32) in order and
        // type; both allocations hold `len` words and outlive the event's wait below.
        unsafe { raw::launch(&kernel, &legacy, LaunchConfig::linear(len, 256, 1024), &mut args) }.unwrap();
        let done = Event::new(&device, false).unwrap();
        done.record(&legacy).unwrap();
        drop(legacy);
        done.synchronize().unwrap();
        // Read on another (non-blocking) stream, which orders nothing after the legacy one:
        // only the event's wait makes the output complete here.
        let mut y = vec![0u32; len];
        y_dev.download(&ours, bytemuck::cast_slice_mut(&mut y)).unwrap();
        assert_eq!(
            first_mismatch(&y, &expected),
            None,
            "round {round}: the event fired before the kernel ended"
        );
    }
}
