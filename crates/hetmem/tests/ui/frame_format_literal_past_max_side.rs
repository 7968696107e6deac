// Promise: a frame format comes from FrameFormat::new, which keeps each side within MAX_SIDE.
// A format written as a literal once reached GaussianPlan::new with sides whose table words
// (cast to u32) described 4 GiB more than the buffers gaussian() then checked.
use hetmem::ops::gaussian::{Border, FrameFormat, Gaussian, GaussianPlan, PixelLayout, SampleType};

fn main() {
    let format = FrameFormat {
        width: 131073,
        height: 562945658585088,
        layout: PixelLayout::Gray,
        sample: SampleType::U8,
    };
    let kernel = Gaussian::new(None, None, Border::default()).unwrap();
    GaussianPlan::new(&format, &kernel, 132).unwrap();
}
