// Promise: a read chunk of a buffer may overlap other read chunks, so it can be shared with the
// GPU but never lent for writing.
use hetmem::{memory::Chunked, *};

fn main() {
    let device = Device::open_best().unwrap();
    let queue = Queue::new(&device).unwrap();
    let buf = HostBuf::<u32>::pinned(&device, 16, PinOptions::default()).unwrap();
    let chunked = Chunked::new(buf);
    let read = chunked.read(0..8).unwrap();
    let _lent = queue.lend(read);
}
