// Promise: a buffer lent to one GPU's queue cannot be lent to another at the same time, even a
// portable one that every GPU may use; the first lease owns it until reclaimed.
use hetmem::*;

fn main() {
    let first = Device::open_best().unwrap();
    let second = Device::open_best().unwrap();
    let (one, two) = (Queue::new(&first).unwrap(), Queue::new(&second).unwrap());
    let options = PinOptions { portable: true, ..PinOptions::default() };
    let buf = HostBuf::<u32>::pinned(&first, 16, options).unwrap();
    let _on_one = one.lend(buf);
    let _on_two = two.lend(buf);
}
