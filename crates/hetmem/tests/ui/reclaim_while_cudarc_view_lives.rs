// Promise: while cudarc may use a lent buffer through a view, the lease cannot be reclaimed, so
// the CPU cannot reach the buffer.
use cudarc::driver::DevicePtrMut;
use hetmem::*;

fn main() {
    let device = Device::open_best().unwrap();
    let queue = Queue::new(&device).unwrap();
    let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    let stream = queue.cudarc_stream(&ctx).unwrap();
    let mut lent = queue.lend(HostBuf::<u32>::pinned(&device, 16, PinOptions::default()).unwrap());
    let mut view = lent.cudarc_view_mut(&stream).unwrap();
    let buf = lent.reclaim().unwrap();
    let (_address, _queued) = view.device_ptr_mut(&stream);
    drop(buf);
}
