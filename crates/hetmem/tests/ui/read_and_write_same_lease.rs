// Promise: one launch cannot be handed the same Lent buffer both to read and to write.
use hetmem::{handoff::KernelArgs, *};

fn main() {
    let device = Device::open_best().unwrap();
    let queue = Queue::new(&device).unwrap();
    let buf = HostBuf::<u32>::pinned(&device, 16, PinOptions::default()).unwrap();
    let mut lent = queue.lend(buf);
    let _args = KernelArgs::new().read(&lent).write(&mut lent);
}
