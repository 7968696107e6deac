// Promise: cudarc cannot write a Shared lease: its view is a DevicePtr, never a DevicePtrMut.
use hetmem::*;

fn main() {
    let device = Device::open_best().unwrap();
    let queue = Queue::new(&device).unwrap();
    let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    let stream = queue.cudarc_stream(&ctx).unwrap();
    let shared = queue.share(HostBuf::<u32>::pinned(&device, 16, PinOptions::default()).unwrap());
    let mut view = shared.cudarc_view(&stream).unwrap();
    stream.memset_zeros(&mut view).unwrap();
}
