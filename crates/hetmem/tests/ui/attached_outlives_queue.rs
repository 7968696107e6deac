// Promise: a managed buffer attached to a queue's stream cannot outlive the queue: the stream
// it is attached to.
use hetmem::*;

fn main() {
    let device = Device::open_best().unwrap();
    let queue = Queue::new(&device).unwrap();
    let attached = queue.attach(ManagedBuf::<u32>::new(&device, 16).unwrap()).unwrap();
    drop(queue);
    drop(attached);
}
