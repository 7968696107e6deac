// Promise: a managed buffer attached to one queue cannot be lent to another: only its own
// queue's lease reaches it.
use hetmem::*;

fn main() {
    let device = Device::open_best().unwrap();
    let (one, two) = (Queue::new(&device).unwrap(), Queue::new(&device).unwrap());
    let attached = one.attach(ManagedBuf::<u32>::new(&device, 16).unwrap()).unwrap();
    let _elsewhere = two.lend(attached);
}
