// Promise: a slice of a file window cannot outlive the window, which unmaps the range when it
// drops; nor can it be used once the window is lent to GPU work.
use hetmem::*;

fn main() {
    let device = Device::open_best().unwrap();
    let queue = Queue::new(&device).unwrap();
    // SAFETY: never runs; it only has to fail to compile.
    let file = unsafe { WindowedFile::open_rw(&device, "data.bin") }.unwrap();
    let window = file.window::<u32>(0..64).unwrap();
    let words = window.as_slice();
    drop(window);
    let _first = words[0];
    let mut writable = file.window_mut::<u32>(64..128).unwrap();
    let out = writable.as_mut_slice();
    let _lent = queue.lend(writable);
    out[0] = 1;
}
