// Promise: the CPU cannot read a buffer the GPU may be writing (a Lent has no `host()`).
use hetmem::*;

fn main() {
    let device = Device::open_best().unwrap();
    let queue = Queue::new(&device).unwrap();
    let buf = HostBuf::<u32>::pinned(&device, 16, PinOptions::default()).unwrap();
    let lent = queue.lend(buf);
    let _first = lent.host()[0];
}
