// Promise: the Gaussian kernel takes tile offsets from its table, so only a plan writes one:
// a buffer of the caller's own words cannot stand in for it (the function once took any
// lease of u32 words and trusted their contents, which let safe code steer the GPU's writes).
use hetmem::ops::gaussian::{Border, FrameFormat, Gaussian, GaussianPlan, PixelLayout, gaussian};
use hetmem::*;

fn main() {
    let device = Device::open_best().unwrap();
    let queue = Queue::new(&device).unwrap();
    let format = FrameFormat::new(64, 48, PixelLayout::Gray).unwrap();
    let plan = GaussianPlan::new(&format, &Gaussian::new(None, None, Border::default()).unwrap(), 1).unwrap();
    let mut forged = HostBuf::<u32>::pinned(&device, plan.table().len(), PinOptions::default()).unwrap();
    forged.as_mut_slice().copy_from_slice(plan.table());
    forged.as_mut_slice()[5] = u32::MAX; // a plane offset far outside the frame
    let forged = queue.share(forged);
    let input = queue.share(HostBuf::<u8>::pinned(&device, 64 * 48, PinOptions::default()).unwrap());
    let mut output = queue.lend(HostBuf::<u8>::pinned(&device, 64 * 48, PinOptions::default()).unwrap());
    gaussian(&queue, &plan, &forged, &input, &mut output).unwrap();
}
