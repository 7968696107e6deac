//! Mapped flags, counters and mailboxes: the mailbox protocol between two CPU threads (order,
//! nothing lost or duplicated, fresh random payloads), a CPU producer and a resident GPU
//! consumer exchanging work (in a child process, since its kernel polls until told to stop),
//! and the worker kernel compiling with the mapped header.

use std::time::Duration;

use hetmem::Device;
use hetmem::kernels::{DEFAULT_CHECK_ARCH, KernelCache};
use hetmem::resident::mapped::{HEADER, HEADER_NAME};
use hetmem::resident::{Counter, Mailbox, SeqFlag, Writer};

use crate::support::{assert_child_passes, child_role, cpu_device};

#[path = "../examples/support/mailbox.rs"]
#[allow(dead_code, reason = "the example's protocol; the tests use only part of it")]
mod mailbox;

/// A message of 7 words: not a whole line, so slots carry padding.
type Message = [u32; 7];

#[test]
fn a_mailbox_between_two_cpu_threads_delivers_every_message_once_in_order() {
    let seed = fastrand::u64(..);
    eprintln!("mailbox between threads: seed {seed:#x}");
    for depth in [1, 2, 8] {
        let mailbox = Mailbox::<Message>::new(&cpu_device(), depth).unwrap();
        let (mut tx, mut rx) = (mailbox.sender().unwrap(), mailbox.receiver().unwrap());
        let count = 20_000;
        let sender = std::thread::spawn(move || {
            let mut rng = fastrand::Rng::with_seed(seed ^ depth as u64);
            for index in 0..count {
                // Word 0 numbers the message; the rest is fresh random data.
                let mut message: Message = std::array::from_fn(|_| rng.u32(..));
                message[0] = index;
                tx.send(&message, Duration::from_secs(10)).unwrap();
            }
            tx.sent()
        });
        let mut rng = fastrand::Rng::with_seed(seed ^ depth as u64);
        for index in 0..count {
            let mut expected: Message = std::array::from_fn(|_| rng.u32(..));
            expected[0] = index;
            let got = rx.recv(Duration::from_secs(10)).unwrap();
            assert_eq!(got, expected, "depth {depth}, message {index}");
        }
        assert_eq!(sender.join().unwrap(), count);
        assert_eq!(rx.received(), count);
        assert_eq!(rx.try_recv(), None, "depth {depth}: a message beyond those sent");
    }
}

#[test]
fn a_full_mailbox_refuses_more_until_a_message_is_taken() {
    let mailbox = Mailbox::<[u32; 2]>::new(&cpu_device(), 4).unwrap();
    let (mut tx, mut rx) = (mailbox.sender().unwrap(), mailbox.receiver().unwrap());
    let words: Vec<[u32; 2]> = (0..5).map(|_| [fastrand::u32(1..), fastrand::u32(1..)]).collect();
    for message in &words[..4] {
        assert!(tx.try_send(message));
    }
    assert!(!tx.try_send(&words[4]), "a fifth message in four slots");
    let error = tx.send(&words[4], Duration::from_millis(5)).unwrap_err();
    assert!(matches!(error, hetmem::Error::MappedWaitTimeout { .. }), "{error}");
    assert_eq!(rx.try_recv(), Some(words[0]));
    assert!(tx.try_send(&words[4]));
    for message in &words[1..] {
        assert_eq!(rx.try_recv(), Some(*message));
    }
    assert_eq!(rx.try_recv(), None);
    assert!(matches!(rx.recv(Duration::from_millis(1)), Err(hetmem::Error::MappedWaitTimeout { .. })));
}

#[test]
fn a_mailbox_has_one_sender_one_receiver_and_checked_shapes() {
    let device = cpu_device();
    let mailbox = Mailbox::<u32>::new(&device, 2).unwrap();
    let _tx = mailbox.sender().unwrap();
    assert!(matches!(mailbox.sender(), Err(hetmem::Error::StillHeld { .. })));
    let _rx = mailbox.receiver().unwrap();
    assert!(matches!(mailbox.receiver(), Err(hetmem::Error::StillHeld { .. })));
    for depth in [0, 3, 8192] {
        let error = Mailbox::<u32>::new(&device, depth).unwrap_err().to_string();
        assert!(error.contains("power of two"), "depth {depth}: {error}");
    }
    let error = Mailbox::<u16>::new(&device, 2).unwrap_err().to_string();
    assert!(error.contains("whole 32-bit words"), "{error}");
    let error = Mailbox::<[u32; 512]>::new(&device, 2).unwrap_err().to_string();
    assert!(error.contains("1024"), "{error}");
}

#[test]
fn flags_and_counters_work_on_every_backend_and_both_writers_follow_the_link() {
    crate::support::on_every_backend("flags_and_counters_work_on_every_backend", |device| {
        let value = fastrand::u32(1..);
        let flag = SeqFlag::new(device).unwrap();
        assert_eq!(flag.load(), 0);
        flag.publish(value);
        assert_eq!(flag.wait_for(value, Duration::ZERO).unwrap(), value);
        let counter = Counter::new(device, Writer::Cpu).unwrap();
        assert_eq!(counter.add(value).unwrap(), 0);
        assert_eq!(counter.load(), value);
        let both = Counter::new(device, Writer::Both);
        assert_eq!(both.is_ok(), device.capabilities().host_native_atomics, "{both:?}");
    });
}

#[test]
fn the_worker_exchanges_work_with_the_cpu_on_the_cpu_backend() {
    let mut rng = fastrand::Rng::new();
    let done = mailbox::exchange(&cpu_device(), 3000, &mut || rng.u32(..)).unwrap();
    assert_eq!(done.messages, 3000);
}

#[test]
fn a_cpu_producer_and_a_resident_gpu_consumer_exchange_work() {
    const TEST: &str = "mapped::a_cpu_producer_and_a_resident_gpu_consumer_exchange_work";
    if child_role().as_deref() == Some("mailbox-worker") {
        let gpu = hetmem::backend::cuda::CudaDevice::open(0).unwrap();
        let seed = fastrand::u64(..);
        eprintln!("mailbox worker on the GPU: seed {seed:#x}");
        let mut rng = fastrand::Rng::with_seed(seed);
        let done = mailbox::exchange(&Device::Cuda(gpu), 20_000, &mut || rng.u32(..)).unwrap();
        eprintln!("{} messages in {:?}", done.messages, done.elapsed);
        return;
    }
    if hetmem::testing::cuda_device_or_skip(TEST).is_none() || hetmem::testing::nvrtc_or_skip(TEST).is_none()
    {
        return;
    }
    assert_child_passes(TEST, "mailbox-worker");
}

#[test]
fn the_worker_kernel_compile_check_passes_with_the_mapped_header() {
    let test = "the_worker_kernel_compile_check_passes_with_the_mapped_header";
    if hetmem::testing::nvrtc_or_skip(test).is_none() {
        return;
    }
    assert_eq!(HEADER_NAME, "hetmem/mapped.cuh");
    assert!(HEADER.contains("ld.acquire.sys") && HEADER.contains("st.release.sys"));
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::at(dir.path());
    let (image, _) =
        cache.get_or_compile_user("mailbox_worker", mailbox::SOURCE, DEFAULT_CHECK_ARCH).unwrap();
    assert!(image.starts_with(b"\x7fELF"));
    // The header defines nothing a source could not also define: a second copy of it is fine.
    let twice = format!("#include <hetmem/mapped.cuh>\n{}", mailbox::SOURCE);
    assert!(cache.get_or_compile_user("twice", &twice, DEFAULT_CHECK_ARCH).is_ok());
    cache.get_or_compile_user("gain_from_flag", GAIN_SOURCE, DEFAULT_CHECK_ARCH).unwrap();
}

/// `y = x * gain`, the gain read from a mapped flag the CPU raises, each block counting itself
/// in a mapped counter the GPU writes: a user's stage with mapped views.
const GAIN_SOURCE: &str = r#"
#include <hetmem/mapped.cuh>
extern "C" __global__ void gain_from_flag(const unsigned int* x, unsigned int* y, unsigned int n,
                                          const unsigned int* gain, unsigned int* blocks_done) {
    const unsigned int g = hetmem_flag_load(gain);
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        y[i] = x[i] * g;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        hetmem_counter_add(blocks_done, 1);
    }
}
"#;

/// `gain_from_flag` as a stage over `words` u32 words in `blocks` blocks of 256 threads, with
/// `gain` and `done` as its mapped views (no CPU path: each test gives its own).
fn gain_stage(
    words: usize,
    blocks: u32,
    gain: &std::sync::Arc<SeqFlag>,
    done: &std::sync::Arc<Counter>,
) -> hetmem::stage::KernelStage {
    use hetmem::backend::cuda::LaunchConfig;
    use hetmem::memory::MappedKind;
    use hetmem::stage::{FrameLayout, KernelCode, KernelStage, Param, ScalarType};
    use std::sync::Arc;
    let layout = FrameLayout::samples(words, ScalarType::U32).unwrap();
    // SAFETY: gain_from_flag(const u32* x, u32* y, u32 n, const u32* gain, u32* blocks_done)
    // takes these parameters in order; with n = words it reads x[0..n), writes y[0..n) (both
    // `words` words), loads the flag and adds to the counter through mapped.cuh.
    unsafe {
        KernelStage::new(
            KernelCode::CudaC { name: "gain_from_flag".into(), source: GAIN_SOURCE.into() },
            "gain_from_flag",
            vec![layout.clone()],
            vec![layout],
            vec![
                Param::Input(0),
                Param::Output(0),
                Param::value(words as u32),
                Param::Mapped { index: 0, kind: MappedKind::Flag },
                Param::Mapped { index: 1, kind: MappedKind::Counter { kernel_adds: true } },
            ],
            LaunchConfig { grid: (blocks, 1, 1), block: (256, 1, 1), shared_bytes: 0 },
        )
    }
    .unwrap()
    .with_mapped(Arc::clone(gain))
    .with_mapped(Arc::clone(done))
}

fn stage_with_mapped_views(device: &Device) {
    use hetmem::{FrameFilter, Strategy};
    use std::sync::Arc;
    if device.as_cuda().is_some()
        && hetmem::testing::nvrtc_or_skip("stage_with_mapped_views on the GPU").is_none()
    {
        return;
    }
    const WORDS: usize = 1 << 14;
    const BLOCKS: u32 = 16;
    let gpu = device.capabilities().gpu;
    let gain = Arc::new(SeqFlag::new(device).unwrap());
    // The side that runs the stage writes the counter: the GPU, or the CPU path's thread.
    let done = Arc::new(Counter::new(device, if gpu { Writer::Gpu } else { Writer::Cpu }).unwrap());
    let stage = gain_stage(WORDS, BLOCKS, &gain, &done);
    let (cpu_gain, cpu_done) = (Arc::clone(&gain), Arc::clone(&done));
    let stage = stage.with_cpu(move |inputs, outputs| {
        let g = cpu_gain.load();
        for (y, x) in outputs[0].chunks_exact_mut(4).zip(inputs[0].chunks_exact(4)) {
            y.copy_from_slice(&u32::from_le_bytes(x.try_into().unwrap()).wrapping_mul(g).to_le_bytes());
        }
        cpu_done.add(BLOCKS)?;
        Ok(())
    });
    let strategy = if gpu { Strategy::ZeroCopy } else { Strategy::Cpu };
    let mut filter = FrameFilter::with_stage(device, strategy, stage).unwrap();
    for frame in 1..=4u32 {
        let g = fastrand::u32(2..);
        gain.publish(g);
        let input: Vec<u32> = (0..WORDS).map(|_| fastrand::u32(..)).collect();
        filter.fill_output(0xA5).unwrap();
        filter.input_mut().unwrap().copy_from_slice(bytemuck::cast_slice(&input));
        filter.run().unwrap();
        let got: Vec<u32> = filter
            .output()
            .unwrap()
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let expected: Vec<u32> = input.iter().map(|x| x.wrapping_mul(g)).collect();
        assert_eq!(
            crate::support::first_mismatch(&got, &expected),
            None,
            "frame {frame} on {}",
            device.name()
        );
        assert_eq!(done.load(), frame * BLOCKS, "frame {frame}: blocks counted");
    }
}

#[test]
fn a_stage_kernel_reads_a_mapped_flag_and_counts_in_a_mapped_counter() {
    crate::support::on_every_backend(
        "a_stage_kernel_reads_a_mapped_flag_and_counts_in_a_mapped_counter",
        stage_with_mapped_views,
    );
}

#[test]
fn a_stage_refuses_a_mapped_view_of_another_kind_than_its_parameter_declares() {
    use hetmem::backend::cuda::LaunchConfig;
    use hetmem::memory::MappedKind;
    use hetmem::stage::{FrameLayout, KernelCode, KernelStage, Param, ScalarType};
    use hetmem::{FrameFilter, Strategy};
    use std::sync::Arc;
    let device = cpu_device();
    let words = FrameLayout::samples(64, ScalarType::U32).unwrap();
    let kind = MappedKind::Mailbox { message_bytes: 16 };
    let stage = || {
        // SAFETY: never launched (the CPU backend runs the CPU path); only the checks run.
        unsafe {
            KernelStage::new(
                KernelCode::CudaC { name: "k".into(), source: "extern \"C\" __global__ void k() {}".into() },
                "k",
                vec![words.clone()],
                vec![words.clone()],
                vec![Param::Input(0), Param::Output(0), Param::Mapped { index: 0, kind }],
                LaunchConfig::linear(64, 64, 1),
            )
        }
        .unwrap()
        .with_cpu(|inputs, outputs| {
            outputs[0].copy_from_slice(inputs[0]);
            Ok(())
        })
    };
    let run = |stage: KernelStage| FrameFilter::with_stage(&device, Strategy::Cpu, stage).map(drop);
    // A flag where the kernel takes a mailbox, a mailbox of another message size, none at all.
    let error = run(stage().with_mapped(Arc::new(SeqFlag::new(&device).unwrap()))).unwrap_err().to_string();
    assert!(error.contains("is a Flag") && error.contains("Mailbox"), "{error}");
    let other = Arc::new(Mailbox::<[u32; 8]>::new(&device, 2).unwrap());
    let error = run(stage().with_mapped(other)).unwrap_err().to_string();
    assert!(error.contains("message_bytes: 32"), "{error}");
    let error = run(stage()).unwrap_err().to_string();
    assert!(error.contains("with_mapped"), "{error}");
    let right = Arc::new(Mailbox::<[u32; 4]>::new(&device, 2).unwrap());
    run(stage().with_mapped(right)).unwrap();
}

/// A kernel that adds to a counter is not launched with one the CPU writes (its adds would race
/// the CPU's); on the CPU backend the stage's CPU path, which adds as the CPU, runs with it.
fn a_kernel_that_adds_takes_no_cpu_written_counter(device: &Device) {
    use hetmem::{FrameFilter, Strategy};
    use std::sync::Arc;
    if device.as_cuda().is_some()
        && hetmem::testing::nvrtc_or_skip("a_kernel_that_adds_takes_no_cpu_written_counter").is_none()
    {
        return;
    }
    const WORDS: usize = 256;
    let gpu = device.capabilities().gpu;
    let gain = Arc::new(SeqFlag::new(device).unwrap());
    gain.publish(3);
    let done = Arc::new(Counter::new(device, Writer::Cpu).unwrap());
    let stage = gain_stage(WORDS, 1, &gain, &done);
    let cpu_done = Arc::clone(&done);
    let stage = stage.with_cpu(move |inputs, outputs| {
        outputs[0].copy_from_slice(inputs[0]);
        cpu_done.add(1)?;
        Ok(())
    });
    let strategy = if gpu { Strategy::ZeroCopy } else { Strategy::Cpu };
    let mut filter = FrameFilter::with_stage(device, strategy, stage).unwrap();
    filter.input_mut().unwrap().fill(7);
    match filter.run() {
        Ok(_) => assert!(!gpu, "the GPU launched a kernel that adds with a CPU-written counter"),
        Err(error) => {
            assert!(gpu, "the CPU path adds as the CPU and must run: {error}");
            let text = error.to_string();
            assert!(text.contains("Writer::Cpu") && text.contains("Writer::Gpu"), "{text}");
        }
    }
    assert_eq!(done.load(), u32::from(!gpu), "counted by the CPU path only");
}

#[test]
fn a_kernel_that_adds_to_a_counter_is_not_launched_with_one_the_cpu_writes() {
    crate::support::on_every_backend(
        "a_kernel_that_adds_to_a_counter_is_not_launched_with_one_the_cpu_writes",
        a_kernel_that_adds_takes_no_cpu_written_counter,
    );
}
