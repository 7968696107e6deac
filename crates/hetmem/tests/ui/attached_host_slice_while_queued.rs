// Promise: while the CPU holds the elements of an attached managed buffer, no GPU work on it
// can be queued: the lease and the host slice borrow it exclusively.
use hetmem::*;

fn main() {
    let device = Device::open_best().unwrap();
    let queue = Queue::new(&device).unwrap();
    let mut attached = queue.attach(ManagedBuf::<u32>::new(&device, 16).unwrap()).unwrap();
    let host = attached.host_mut().unwrap();
    let lease = attached.lease().unwrap();
    host[0] = 1;
    drop(lease);
}
