// Promise: the CPU cannot write a buffer lent to the GPU (a Lent has no host access).
use hetmem::*;

fn main() {
    let device = Device::open_best().unwrap();
    let queue = Queue::new(&device).unwrap();
    let buf = HostBuf::<u32>::pinned(&device, 16, PinOptions::default()).unwrap();
    let mut lent = queue.lend(buf);
    lent.as_mut_slice()[0] = 1;
}
