// Promise: a lease taken from an attached managed buffer must end before the CPU reads it
// (reading waits for the lease's work, which a live lease could still add to).
use hetmem::*;

fn main() {
    let device = Device::open_best().unwrap();
    let queue = Queue::new(&device).unwrap();
    let mut attached = queue.attach(ManagedBuf::<u32>::new(&device, 16).unwrap()).unwrap();
    let lease = attached.lease().unwrap();
    let first = attached.host().unwrap()[0];
    lease.prefetch(hetmem::backend::cuda::MemLocation::Host).unwrap();
    let _ = first;
}
