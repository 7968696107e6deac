// Promise: a frame received from another process cannot be read by the CPU while it is lent
// to the GPU (a Lent has no `host()`).
use hetmem::pipeline::shared_ring::RingConsumer;
use hetmem::*;
use std::os::unix::net::UnixStream;

fn main() {
    let device = Device::open_best().unwrap();
    let (_left, right) = UnixStream::pair().unwrap();
    let mut consumer = RingConsumer::connect(&device, &right, Default::default()).unwrap();
    let queue = Queue::new(&device).unwrap();
    let frame = consumer.next_frame().unwrap().unwrap();
    let lent = queue.lend(frame);
    let _first = lent.host()[0];
}
