//! Users' own stages through the filter, the ring and the fan-out: a user kernel
//! with several buffers, padded 16-bit planes and constant data, and CPU closures, by every
//! strategy, each result equal to the CPU closure's on fresh random data, outputs poisoned.

use hetmem::backend::cuda::LaunchConfig;
use hetmem::pipeline::{FanOutRing, FrameRing, RingOptions};
use hetmem::stage::{CpuStage, FrameLayout, KernelCode, KernelStage, Param, PlaneLayout, ScalarType, Stage};
use hetmem::{Device, Error, FrameFilter, Strategy};

use crate::support::{cpu_device, on_every_backend};

const WIDTH: usize = 333;
const HEIGHT: usize = 71;
/// Bytes between rows of the padded plane: more than the 666 bytes of a row of u16.
const PITCH: usize = 704;

/// `out[y][x] = lut[in[y][x] >> 6] ^ (in[y][x] * key)` over a padded u16 plane, plus the
/// plane's sum of the top bits per row into a second output of u32: two outputs, a constant
/// table, values, a pitch.
const SOURCE: &str = r#"
extern "C" __global__ void mix(const unsigned char* in, unsigned char* out, unsigned int* rows,
                               const unsigned short* lut, unsigned int width, unsigned int height,
                               unsigned int pitch, unsigned short key) {
    unsigned int y = blockIdx.x;
    if (y >= height) return;
    const unsigned short* row_in = (const unsigned short*)(in + (size_t)y * pitch);
    unsigned short* row_out = (unsigned short*)(out + (size_t)y * pitch);
    unsigned int sum = 0;
    for (unsigned int x = threadIdx.x; x < width; x += blockDim.x) {
        unsigned short v = row_in[x];
        row_out[x] = lut[v >> 6] ^ (unsigned short)(v * key);
        sum += v >> 12;
    }
    // The row's sum is stored, not added: the output starts poisoned.
    __shared__ unsigned int sums[128];
    sums[threadIdx.x] = sum;
    __syncthreads();
    for (unsigned int half = blockDim.x / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) sums[threadIdx.x] += sums[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) rows[y] = sums[0];
}
"#;

/// The bytes of the LUT `mix` reads: 1024 u16.
const LUT_BYTES: usize = 1024 * 2;

/// A LUT of 1024 random u16.
fn lut() -> Vec<u16> {
    let mut rng = fastrand::Rng::new();
    (0..1024).map(|_| rng.u16(..)).collect()
}

fn plane() -> FrameLayout {
    FrameLayout::new(vec![PlaneLayout {
        offset: 0,
        width: WIDTH,
        height: HEIGHT,
        channels: 1,
        element: ScalarType::U16,
        pitch: PITCH,
    }])
    .unwrap()
}

/// What the kernel does, on the CPU. Padding bytes of the output are left as they were: the
/// kernel does not touch them either, and [`same_pixels`] does not compare them (a strategy
/// whose output goes through a device buffer brings that buffer's padding back).
fn mix_cpu(lut: &[u16], key: u16, input: &[u8], output: &mut [u8], rows: &mut [u8]) {
    let rows: &mut [u32] = bytemuck::cast_slice_mut(rows);
    for (y, row_sum) in rows.iter_mut().enumerate().take(HEIGHT) {
        let mut sum = 0u32;
        for x in 0..WIDTH {
            let at = y * PITCH + 2 * x;
            let v = u16::from_le_bytes([input[at], input[at + 1]]);
            let mixed = lut[usize::from(v >> 6)] ^ v.wrapping_mul(key);
            output[at..at + 2].copy_from_slice(&mixed.to_le_bytes());
            sum += u32::from(v >> 12);
        }
        *row_sum = sum;
    }
}

/// The parameters of `mix`, in order.
fn mix_params(key: u16) -> Vec<Param> {
    vec![
        Param::Input(0),
        Param::Output(0),
        Param::Output(1),
        Param::Constant { index: 0, bytes: LUT_BYTES },
        Param::value(WIDTH as u32),
        Param::value(HEIGHT as u32),
        Param::value(PITCH as u32),
        Param::value(key),
    ]
}

fn mix_stage(lut: &[u16], key: u16) -> KernelStage {
    let rows = FrameLayout::samples(HEIGHT, ScalarType::U32).unwrap();
    let params = mix_params(key);
    // SAFETY: mix(const u8*, u8*, u32*, const u16*, u32, u32, u32, u16) takes these parameters
    // in order; block y < HEIGHT reads row y of the input (y * PITCH + 2 * WIDTH bytes, inside
    // the plane), writes the same bytes of output 0 and word y of output 1 (HEIGHT words), and
    // reads lut[0..1024) (the constant's LUT_BYTES, indexed by v >> 6 < 1024).
    let stage = unsafe {
        KernelStage::new(
            KernelCode::CudaC { name: "mix".into(), source: SOURCE.into() },
            "mix",
            vec![plane()],
            vec![plane(), rows],
            params,
            LaunchConfig { grid: (HEIGHT as u32, 1, 1), block: (128, 1, 1), shared_bytes: 0 },
        )
    }
    .unwrap()
    .with_constants(vec![bytemuck::cast_slice(lut).to_vec()])
    .unwrap();
    let lut = lut.to_vec();
    stage.with_cpu(move |inputs, outputs| {
        let (first, second) = outputs.split_at_mut(1);
        second[0].fill(0);
        mix_cpu(&lut, key, inputs[0], first[0], second[0]);
        Ok(())
    })
}

/// Whether two padded planes hold the same pixels (the 2 * WIDTH bytes of each row).
fn same_pixels(got: &[u8], want: &[u8]) -> bool {
    got.len() == want.len()
        && (0..HEIGHT)
            .all(|y| got[y * PITCH..y * PITCH + 2 * WIDTH] == want[y * PITCH..y * PITCH + 2 * WIDTH])
}

fn random_frame(bytes: usize) -> Vec<u8> {
    let seed = fastrand::u64(..);
    eprintln!("random_frame: seed {seed:#x}");
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..bytes).map(|_| rng.u8(..)).collect()
}

/// The CPU closure's outputs for `input`, from outputs poisoned with 0xA5.
fn reference(stage: &KernelStage, input: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut out = vec![0xA5u8; stage.outputs()[0].bytes()];
    let mut rows = vec![0xA5u8; stage.outputs()[1].bytes()];
    stage.run_cpu(&[input], &mut [&mut out, &mut rows]).unwrap();
    (out, rows)
}

/// Every strategy `device` runs: the filter, a ring and a fan-out over two rings give the CPU
/// closure's bytes.
fn user_kernel_everywhere(device: &Device) {
    // A CUDA C stage needs NVRTC on a GPU (hetmem's own kernels do not).
    if device.as_cuda().is_some()
        && hetmem::testing::nvrtc_or_skip("user_kernel_everywhere on the GPU").is_none()
    {
        return;
    }
    let lut = lut();
    let key = fastrand::u16(1..);
    let stage = mix_stage(&lut, key);
    let strategies: Vec<Strategy> =
        Strategy::ALL.into_iter().filter(|strategy| strategy.check(device).is_ok()).collect();
    for strategy in strategies {
        let mut filter = FrameFilter::with_stage(device, strategy, stage.clone()).unwrap();
        for _ in 0..2 {
            let input = random_frame(plane().bytes());
            filter.fill_output(0xA5).unwrap();
            filter.input_mut().unwrap().copy_from_slice(&input);
            filter.run().unwrap_or_else(|error| panic!("{strategy}: {error}"));
            let (out, rows) = reference(&stage, &input);
            assert!(same_pixels(filter.output().unwrap(), &out), "{strategy}: filter output 0");
            assert!(filter.output_at(1).unwrap() == &rows[..], "{strategy}: filter output 1");
        }
        let ring = FrameRing::with_stage(device, strategy, stage.clone(), RingOptions::default()).unwrap();
        let fan = FanOutRing::with_stage(
            &[device.clone(), device.clone()],
            strategy,
            &stage,
            RingOptions::default(),
        )
        .unwrap();
        ring.fill_outputs(0xA5).unwrap();
        fan.fill_outputs(0xA5).unwrap();
        let inputs: Vec<Vec<u8>> = (0..7).map(|_| random_frame(plane().bytes())).collect();
        for input in &inputs {
            let mut slot = ring.next_input().unwrap();
            slot.copy_from_slice(input);
            slot.submit();
            let mut slot = fan.next_input().unwrap();
            slot.copy_from_slice(input);
            slot.submit();
            let (out, rows) = reference(&stage, input);
            let output = ring.next_output().unwrap();
            assert!(
                same_pixels(output.output(0).unwrap(), &out) && output.output(1).unwrap() == &rows[..],
                "{strategy}: ring"
            );
            drop(output);
            let output = fan.next_output().unwrap();
            assert!(
                same_pixels(output.output(0).unwrap(), &out) && output.output(1).unwrap() == &rows[..],
                "{strategy}: fan-out"
            );
        }
        assert_eq!(ring.strategy(), strategy);
        eprintln!("{strategy}: filter, ring and fan-out equal to the CPU closure");
    }
}

#[test]
fn a_user_kernel_runs_by_every_strategy_equal_to_its_cpu_closure() {
    on_every_backend("a_user_kernel_runs_by_every_strategy_equal_to_its_cpu_closure", user_kernel_everywhere);
}

/// Where a GPU has no NVRTC beside it (hetmem's own kernels then run from their PTX), a CUDA C
/// stage is refused when prepared, naming what to install.
#[test]
fn a_cuda_c_stage_without_nvrtc_names_the_remedy() {
    let test = "a_cuda_c_stage_without_nvrtc_names_the_remedy";
    let Some(gpu) = hetmem::testing::cuda_device_or_skip(test) else { return };
    if hetmem::backend::cuda::nvrtc::is_available() {
        eprintln!("{test}: skipped: NVRTC is installed here");
        return;
    }
    let device = Device::Cuda(gpu);
    let error = FrameFilter::with_stage(&device, Strategy::PinnedAsync, mix_stage(&lut(), 7))
        .unwrap_err()
        .to_string();
    assert!(error.contains("NVRTC 12 or 13 not found"), "{error}");
    assert!(error.contains("pip install"), "{error}");
}

#[test]
fn a_cpu_closure_is_a_stage_that_runs_on_the_cpu_only() {
    let layout = FrameLayout::samples(1000, ScalarType::F32).unwrap();
    let stage = CpuStage::map(layout.clone(), layout, |input, output| {
        let (x, y): (&[f32], &mut [f32]) = (bytemuck::cast_slice(input), bytemuck::cast_slice_mut(output));
        y.iter_mut().zip(x).for_each(|(y, x)| *y = x.mul_add(0.5, 1.0));
        Ok(())
    })
    .unwrap();
    let device = cpu_device();
    let mut filter = FrameFilter::with_stage(&device, Strategy::Auto, stage.clone()).unwrap();
    assert_eq!(filter.strategy(), Strategy::Cpu);
    let samples: Vec<f32> = (0..1000).map(|_| fastrand::f32() * 100.0 - 50.0).collect();
    filter.input_mut().unwrap().copy_from_slice(bytemuck::cast_slice(&samples));
    filter.run().unwrap();
    let got: &[f32] = bytemuck::cast_slice(filter.output().unwrap());
    assert!(got.iter().zip(&samples).all(|(y, x)| y.to_bits() == x.mul_add(0.5, 1.0).to_bits()));
    // A closure has no GPU path: a GPU strategy is refused by name.
    let error = FrameRing::with_stage(&device, Strategy::Copy, stage, RingOptions::default())
        .unwrap_err()
        .to_string();
    assert!(error.contains("copy"), "{error}");
}

#[test]
fn a_kernel_without_a_cpu_path_is_refused_on_the_cpu_backend_by_name() {
    let layout = FrameLayout::samples(64, ScalarType::U8).unwrap();
    // SAFETY: never launched (the CPU backend refuses it first).
    let stage = unsafe {
        KernelStage::new(
            KernelCode::Ptx(".version 8.0".into()),
            "k",
            vec![layout.clone()],
            vec![layout],
            vec![Param::Input(0), Param::Output(0)],
            LaunchConfig::linear(64, 64, 1),
        )
    }
    .unwrap();
    let error = FrameFilter::with_stage(&cpu_device(), Strategy::Auto, stage.clone()).unwrap_err();
    assert!(matches!(error, Error::NeedsGpu { .. }) && error.to_string().contains("no CPU path"), "{error}");
    let error = FrameFilter::with_stage(&cpu_device(), Strategy::Cpu, stage).unwrap_err().to_string();
    assert!(error.contains("no CPU path"), "{error}");
}

/// A function cudarc loaded runs as a stage too: the same kernel, compiled by hetmem's cache,
/// loaded by cudarc, through a ring by the mapped and the copy strategies, equal to the CPU
/// closure; a context that is not the GPU's primary one is refused when the stage is prepared.
#[test]
fn a_cudarc_function_runs_as_a_stage() {
    let Some(gpu) = hetmem::testing::cuda_device_or_skip("a_cudarc_function_runs_as_a_stage") else { return };
    if hetmem::testing::nvrtc_or_skip("a_cudarc_function_runs_as_a_stage").is_none() {
        return;
    }
    use cudarc::driver::CudaContext;
    use cudarc::nvrtc::Ptx;
    let source = hetmem::kernels::KernelSource {
        name: "mix",
        source: SOURCE,
        entry_points: &["mix"],
        options: &[],
        ptx: None,
    };
    let (cubin, _) =
        hetmem::kernels::cache().get_or_compile(&source, &gpu.compute_capability().sm_name()).unwrap();
    let ctx = CudaContext::new(gpu.ordinal()).unwrap();
    let function = ctx.load_module(Ptx::from_binary(cubin)).unwrap().load_function("mix").unwrap();
    let lut = lut();
    let key = fastrand::u16(1..);
    let by_hetmem = mix_stage(&lut, key);
    let device = Device::Cuda(gpu);
    let params = mix_params(key);
    let make = |context: std::sync::Arc<CudaContext>| {
        // SAFETY: as for mix_stage: the same kernel, the same parameters; the function was
        // loaded in `ctx`, the GPU's primary context (the other context is refused unlaunched).
        unsafe {
            KernelStage::new(
                KernelCode::Cudarc { context, function: function.clone() },
                "mix",
                vec![plane()],
                vec![plane(), FrameLayout::samples(HEIGHT, ScalarType::U32).unwrap()],
                params.clone(),
                LaunchConfig { grid: (HEIGHT as u32, 1, 1), block: (128, 1, 1), shared_bytes: 0 },
            )
        }
        .unwrap()
        .with_constants(vec![bytemuck::cast_slice(&lut).to_vec()])
        .unwrap()
    };
    let stage = make(std::sync::Arc::clone(&ctx));
    for strategy in [Strategy::ZeroCopy, Strategy::Copy] {
        let ring = FrameRing::with_stage(&device, strategy, stage.clone(), RingOptions::default()).unwrap();
        ring.fill_outputs(0xA5).unwrap();
        for _ in 0..4 {
            let input = random_frame(plane().bytes());
            let mut slot = ring.next_input().unwrap();
            slot.copy_from_slice(&input);
            slot.submit();
            let (out, rows) = reference(&by_hetmem, &input);
            let output = ring.next_output().unwrap();
            assert!(
                same_pixels(output.output(0).unwrap(), &out) && output.output(1).unwrap() == &rows[..],
                "{strategy}"
            );
        }
    }
    let other = CudaContext::new_non_primary(device.as_cuda().unwrap().ordinal(), 0).ok();
    if let Some(other) = other {
        let error =
            FrameFilter::with_stage(&device, Strategy::ZeroCopy, make(other)).unwrap_err().to_string();
        assert!(error.contains("primary"), "{error}");
    }
}
