// Promise: a buffer cannot be used after it is lent; `lend` takes it by value.
use hetmem::*;

fn main() {
    let device = Device::open_best().unwrap();
    let queue = Queue::new(&device).unwrap();
    let buf = HostBuf::<u32>::pinned(&device, 16, PinOptions::default()).unwrap();
    let _lent = queue.lend(buf);
    let _first = buf.as_slice()[0];
}
