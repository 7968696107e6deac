//! Signal analysis on a continuous stream: an f32 FIR filter over a signal that arrives in
//! blocks, through hetmem's ring on the GPU, checked bit for bit against one FIR over the whole
//! signal on the CPU.
//!
//! Each frame carries the block's samples after the last `TAPS - 1` samples of the block
//! before (overlap-save), so the filter runs on across block boundaries with no seam; the taps
//! are the stage's constant data (device memory, or mapped host memory by zero-copy). Both
//! sides accumulate `taps[j] * x[i - j]` from `j = 0` up with fused multiply-adds, so the
//! results are identical.
//!
//! Run with `cargo run --release -p hetmem --example fir_stream`.

use hetmem::backend::cuda::LaunchConfig;
use hetmem::pipeline::{FrameRing, RingOptions};
use hetmem::stage::{FrameLayout, KernelCode, KernelStage, Param, ScalarType};
use hetmem::{Device, Strategy};

mod support;

use support::XorShift32;

const BLOCK: usize = 1 << 16;
const TAPS: usize = 63;
const BLOCKS: usize = 120;

const SOURCE: &str = r#"
extern "C" __global__ void fir(const float* x, float* y, const float* taps, unsigned int n,
                               unsigned int t) {
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += gridDim.x * blockDim.x) {
        float acc = 0.0f;
        for (unsigned int j = 0; j < t; ++j) acc = fmaf(taps[j], x[i + t - 1 - j], acc);
        y[i] = acc;
    }
}
"#;

/// `y[i] = sum over j of taps[j] * x[i + TAPS - 1 - j]`, for each output sample: `x` holds the
/// history before the block's samples.
fn fir(taps: &[f32], x: &[f32], y: &mut [f32]) {
    for (i, y) in y.iter_mut().enumerate() {
        *y = taps.iter().enumerate().fold(0.0f32, |acc, (j, &tap)| tap.mul_add(x[i + TAPS - 1 - j], acc));
    }
}

fn stage(taps: &[f32]) -> hetmem::Result<KernelStage> {
    let input = FrameLayout::samples(TAPS - 1 + BLOCK, ScalarType::F32)?;
    let output = FrameLayout::samples(BLOCK, ScalarType::F32)?;
    // SAFETY: fir(const float* x, float* y, const float* taps, u32 n, u32 t) takes these
    // parameters in this order; with n = BLOCK and t = TAPS it reads x[0..BLOCK + TAPS - 1) (the
    // input's samples) and taps[0..TAPS) (the constant, declared TAPS floats long), and writes
    // y[0..BLOCK).
    let stage = unsafe {
        KernelStage::new(
            KernelCode::CudaC { name: "fir".into(), source: SOURCE.into() },
            "fir",
            vec![input],
            vec![output],
            vec![
                Param::Input(0),
                Param::Output(0),
                Param::Constant { index: 0, bytes: TAPS * size_of::<f32>() },
                Param::value(BLOCK as u32),
                Param::value(TAPS as u32),
            ],
            LaunchConfig::linear(BLOCK, 256, 132 * 4),
        )?
    };
    let stage = stage.with_constants(vec![bytemuck::cast_slice(taps).to_vec()])?;
    let cpu_taps = taps.to_vec();
    Ok(stage.with_cpu(move |inputs, outputs| {
        fir(&cpu_taps, bytemuck::cast_slice(inputs[0]), bytemuck::cast_slice_mut(outputs[0]));
        Ok(())
    }))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = Device::open_best()?;
    println!("device: {} ({} backend)", device.name(), device.backend());
    let mut rng = XorShift32::from_time();
    let mut uniform = || (rng.next_u32() >> 8) as f32 / (1 << 24) as f32 * 2.0 - 1.0;
    let taps: Vec<f32> = (0..TAPS).map(|_| uniform() / TAPS as f32).collect();
    // The whole signal, with TAPS - 1 zeros of history before it.
    let mut signal = vec![0.0f32; TAPS - 1];
    signal.extend((0..BLOCKS * BLOCK).map(|_| uniform()));
    let mut want = vec![0.0f32; BLOCKS * BLOCK];
    fir(&taps, &signal, &mut want);
    let stage = stage(&taps)?;
    for strategy in Strategy::ALL {
        if strategy.check(&device).is_err() {
            continue;
        }
        let ring = FrameRing::with_stage(&device, strategy, stage.clone(), RingOptions::default())?;
        ring.fill_outputs(0xA5)?;
        let start = std::time::Instant::now();
        std::thread::scope(|scope| -> Result<(), String> {
            scope.spawn(|| {
                for block in 0..BLOCKS {
                    // Overlap-save: the block's samples after the TAPS - 1 before them.
                    let window = &signal[block * BLOCK..block * BLOCK + TAPS - 1 + BLOCK];
                    let mut slot = ring.next_input().expect("a slot");
                    slot.copy_from_slice(bytemuck::cast_slice(window));
                    slot.submit();
                }
            });
            for block in 0..BLOCKS {
                let output =
                    ring.next_output().map_err(|error| format!("{strategy}: block {block}: {error}"))?;
                let got: &[f32] = bytemuck::cast_slice(&output);
                let expected = &want[block * BLOCK..(block + 1) * BLOCK];
                if let Some(at) = got.iter().zip(expected).position(|(g, w)| g.to_bits() != w.to_bits()) {
                    return Err(format!(
                        "{strategy}: block {block}, sample {at}: {} vs {}",
                        got[at], expected[at]
                    ));
                }
            }
            Ok(())
        })?;
        let seconds = start.elapsed().as_secs_f64();
        println!(
            "{:<13} {BLOCKS} blocks of {BLOCK} samples, {TAPS} taps: bit-exact with one CPU FIR over the whole \
             signal; {:.1} Msamples/s",
            strategy.name(),
            (BLOCKS * BLOCK) as f64 / seconds / 1e6
        );
    }
    Ok(())
}
