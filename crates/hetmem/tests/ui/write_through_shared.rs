// Promise: a Shared lease is read-only for the CPU; `host()` gives `&[T]`, never `&mut [T]`.
use hetmem::*;

fn main() {
    let device = Device::open_best().unwrap();
    let queue = Queue::new(&device).unwrap();
    let buf = HostBuf::<u32>::pinned(&device, 16, PinOptions::default()).unwrap();
    let shared = queue.share(buf);
    shared.host()[0] = 1;
}
