//! A user's own CUDA C kernel through hetmem's ring, by every strategy: RGB frames to a grey
//! plane and a threshold mask (one input buffer, two outputs), each frame checked byte for byte
//! against the same computation as a CPU closure.
//!
//! Run with `cargo run --release -p hetmem --example user_stage` (on the CPU backend only the
//! CPU strategy runs).

use hetmem::backend::cuda::LaunchConfig;
use hetmem::pipeline::{FrameRing, RingOptions};
use hetmem::stage::{FrameLayout, KernelCode, KernelStage, Param, ScalarType};
use hetmem::{Device, Strategy};

mod support;

use support::XorShift32;

const WIDTH: usize = 1920;
const HEIGHT: usize = 1080;
const THRESHOLD: u32 = 128;
const FRAMES: usize = 60;

/// BT.601 luma in 8-bit fixed point, then a threshold: the kernel, one pixel per thread.
const SOURCE: &str = r#"
extern "C" __global__ void grey_threshold(const unsigned char* rgb, unsigned char* grey,
                                          unsigned char* mask, unsigned int pixels,
                                          unsigned int threshold) {
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < pixels;
         i += gridDim.x * blockDim.x) {
        unsigned int r = rgb[3 * i], g = rgb[3 * i + 1], b = rgb[3 * i + 2];
        unsigned int y = (77 * r + 150 * g + 29 * b + 128) >> 8;
        grey[i] = (unsigned char)y;
        mask[i] = y > threshold ? 255 : 0;
    }
}
"#;

/// The same on the CPU.
fn grey_threshold(rgb: &[u8], grey: &mut [u8], mask: &mut [u8]) {
    for ((pixel, grey), mask) in rgb.chunks_exact(3).zip(grey).zip(mask) {
        let y = (77 * u32::from(pixel[0]) + 150 * u32::from(pixel[1]) + 29 * u32::from(pixel[2]) + 128) >> 8;
        *grey = y as u8;
        *mask = if y > THRESHOLD { 255 } else { 0 };
    }
}

fn stage() -> hetmem::Result<KernelStage> {
    let rgb = FrameLayout::packed(WIDTH, HEIGHT, 3, ScalarType::U8)?;
    let plane = FrameLayout::packed(WIDTH, HEIGHT, 1, ScalarType::U8)?;
    let pixels = WIDTH * HEIGHT;
    // SAFETY: grey_threshold(const u8* rgb, u8* grey, u8* mask, u32 pixels, u32 threshold)
    // takes these parameters in this order; with pixels = WIDTH * HEIGHT it reads rgb[0..3 *
    // pixels) (the input's bytes) and writes grey[0..pixels) and mask[0..pixels) (the outputs').
    let stage = unsafe {
        KernelStage::new(
            KernelCode::CudaC { name: "grey_threshold".into(), source: SOURCE.into() },
            "grey_threshold",
            vec![rgb],
            vec![plane.clone(), plane],
            vec![
                Param::Input(0),
                Param::Output(0),
                Param::Output(1),
                Param::value(pixels as u32),
                Param::value(THRESHOLD),
            ],
            LaunchConfig::linear(pixels, 256, 132 * 8),
        )?
    };
    Ok(stage.with_cpu(|inputs, outputs| {
        let (grey, mask) = outputs.split_at_mut(1);
        grey_threshold(inputs[0], grey[0], mask[0]);
        Ok(())
    }))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = Device::open_best()?;
    println!("device: {} ({} backend)", device.name(), device.backend());
    let stage = stage()?;
    let mut rng = XorShift32::from_time();
    let frames: Vec<Vec<u8>> =
        (0..FRAMES).map(|_| (0..WIDTH * HEIGHT * 3).map(|_| rng.next_u32() as u8).collect()).collect();
    let want: Vec<(Vec<u8>, Vec<u8>)> = frames
        .iter()
        .map(|frame| {
            let (mut grey, mut mask) = (vec![0; WIDTH * HEIGHT], vec![0; WIDTH * HEIGHT]);
            grey_threshold(frame, &mut grey, &mut mask);
            (grey, mask)
        })
        .collect();
    for strategy in Strategy::ALL {
        if strategy.check(&device).is_err() {
            continue;
        }
        let ring = FrameRing::with_stage(&device, strategy, stage.clone(), RingOptions::default())?;
        ring.fill_outputs(0xA5)?;
        let start = std::time::Instant::now();
        std::thread::scope(|scope| -> Result<(), String> {
            scope.spawn(|| {
                for frame in &frames {
                    let mut slot = ring.next_input().expect("a slot");
                    slot.copy_from_slice(frame);
                    slot.submit();
                }
            });
            for (index, (grey, mask)) in want.iter().enumerate() {
                let output =
                    ring.next_output().map_err(|error| format!("{strategy}: frame {index}: {error}"))?;
                let ok = output.output(0).map_err(|e| e.to_string())? == &grey[..]
                    && output.output(1).map_err(|e| e.to_string())? == &mask[..];
                if !ok {
                    return Err(format!("{strategy}: frame {index} differs from the CPU closure"));
                }
            }
            Ok(())
        })?;
        let seconds = start.elapsed().as_secs_f64();
        println!(
            "{:<13} {FRAMES} frames equal to the CPU closure; {:.0} frames/s",
            strategy.name(),
            FRAMES as f64 / seconds
        );
    }
    Ok(())
}
