// Promise: a volume's shape comes from VolumeShape::new, which checks its product. A shape
// written as a literal once passed the length check with a product that wraps (2 * (2^63 + 1)
// is 2 mod 2^64), and the projection's kernel then walked 2^63 rows of a 2-element buffer.
use hetmem::ops::ct::{VolumeShape, mip_height};
use hetmem::*;

fn main() {
    let device = Device::open_best().unwrap();
    let queue = Queue::new(&device).unwrap();
    let shape = VolumeShape { depth: 2, height: (1 << 63) + 1, width: 1 };
    let hu = queue.share(HostBuf::<i16>::pinned(&device, 2, PinOptions::default()).unwrap());
    let mut out = queue.lend(HostBuf::<i16>::pinned(&device, 2, PinOptions::default()).unwrap());
    mip_height(&queue, shape, &hu, &mut out).unwrap();
}
