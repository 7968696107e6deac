// Promise: a range of a read-only MappedFile can be read (and shared), never taken to write:
// `Chunked::chunk` exists only for writable buffers.
use hetmem::{memory::Chunked, *};

fn main() {
    let device = Device::open_best().unwrap();
    // SAFETY: never runs; it only has to fail to compile.
    let file = unsafe { MappedFile::<u32>::open(&device, "data.bin") }.unwrap();
    let chunked = Chunked::new(file);
    let _chunk = chunked.chunk(0..8);
}
