// Promise: a shared ring's slot cannot be written once published: the consumer process owns
// it then.
use hetmem::pipeline::shared_ring::RingProducer;
use hetmem::*;
use std::os::unix::net::UnixStream;

fn main() {
    let device = Device::open_best().unwrap();
    let (left, _right) = UnixStream::pair().unwrap();
    let mut producer = RingProducer::create(&device, &left, 64, 2, Default::default()).unwrap();
    let mut slot = producer.next_slot().unwrap();
    let bytes = unsafe { slot.as_mut_slice() }; // the consumer here is none: nobody writes it
    slot.publish();
    bytes[0] = 1;
}
