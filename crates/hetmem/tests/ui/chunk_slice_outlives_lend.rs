// Promise: a slice of a chunk cannot outlive lending the chunk: `lend` takes the chunk by value,
// so a CPU write through a slice taken before would race the GPU.
use hetmem::{memory::Chunked, *};

fn main() {
    let device = Device::open_best().unwrap();
    let queue = Queue::new(&device).unwrap();
    let buf = HostBuf::<u32>::pinned(&device, 16, PinOptions::default()).unwrap();
    let chunked = Chunked::new(buf);
    let mut chunk = chunked.chunk(0..8).unwrap();
    let slice = chunk.as_mut_slice();
    let _lent = queue.lend(chunk);
    slice[0] = 1;
}
