// Promise: a checked shape stays checked: its sides cannot be changed after VolumeShape::new.
use hetmem::ops::ct::VolumeShape;

fn main() {
    let mut shape = VolumeShape::new(2, 3, 1).unwrap();
    shape.height = (1 << 63) + 1;
    println!("{}", shape.voxels());
}
