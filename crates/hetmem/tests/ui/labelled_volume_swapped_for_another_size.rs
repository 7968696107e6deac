// Promise: a labelled volume holds its shape: LabelledVolume::new checks both buffers, and
// they cannot be swapped for buffers of another size afterwards.
use hetmem::ops::ct::{LabelledVolume, VolumeShape};

fn main() {
    let mut volume = LabelledVolume::phantom(VolumeShape::new(4, 8, 8).unwrap(), 1);
    volume.hu = vec![0; 2];
    println!("{}", volume.shape().voxels());
}
