// Promise: a read-only MappedFile is not a WritableBuffer, so it can be shared but never lent.
use hetmem::*;

fn main() {
    let device = Device::open_best().unwrap();
    let queue = Queue::new(&device).unwrap();
    // SAFETY: never runs; it only has to fail to compile.
    let file = unsafe { MappedFile::<u32>::open(&device, "data.bin") }.unwrap();
    let _lent = queue.lend(file);
}
