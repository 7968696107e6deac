// Promise: a read-only window of a file is registered read-only, so it can be shared with the
// GPU but never lent for writing; only `window_mut` gives a window kernels may write.
use hetmem::*;

fn main() {
    let device = Device::open_best().unwrap();
    let queue = Queue::new(&device).unwrap();
    // SAFETY: never runs; it only has to fail to compile.
    let file = unsafe { WindowedFile::open_rw(&device, "data.bin") }.unwrap();
    let window = file.window::<u32>(0..64).unwrap();
    let _lent = queue.lend(window);
}
