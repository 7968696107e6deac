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
}
