// Promise: a chunk lent to GPU work cannot be read on the CPU until it is reclaimed, while the
// CPU keeps working on the chunk beside it.
use hetmem::{memory::Chunked, *};

fn main() {
    let device = Device::open_best().unwrap();
    let queue = Queue::new(&device).unwrap();
    let buf = HostBuf::<u32>::pinned(&device, 16, PinOptions::default()).unwrap();
    let chunked = Chunked::new(buf);
    let mut beside = chunked.chunk(8..16).unwrap();
    beside.as_mut_slice()[0] = 1;
    let lent = queue.lend(chunked.chunk(0..8).unwrap());
    let _first = lent.as_slice()[0];
}
