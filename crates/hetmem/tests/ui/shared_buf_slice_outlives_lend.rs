// Promise: memory shared with other processes is lent like pinned memory: a slice taken
// before the lend cannot be used while the GPU holds the buffer.
use hetmem::memory::SharedHostBuf;
use hetmem::*;

fn main() {
    let device = Device::open_best().unwrap();
    let queue = Queue::new(&device).unwrap();
    let mut buf = SharedHostBuf::<u32>::create(&device, 16, Default::default()).unwrap();
    let slice = buf.as_mut_slice();
    let lent = queue.lend(buf);
    slice[0] = 1;
    drop(lent);
}
