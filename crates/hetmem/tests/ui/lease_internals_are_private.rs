// Promise: a lease's addresses and bookkeeping never leave hetmem. They were public (hidden
// from the docs) and gave safe code the raw host address of a buffer the GPU was writing.
use hetmem::*;

fn main() {
    let device = Device::open_best().unwrap();
    let queue = Queue::new(&device).unwrap();
    let lent = queue.lend(HostBuf::<u32>::pinned(&device, 16, PinOptions::default()).unwrap());
    let _where = lent.region();
    let _bookkeeping = lent.state();
    let _host_view = lent.cpu_read(|words: &[u32]| words[0]);
    let _named: Option<hetmem::memory::Region> = None;
}
