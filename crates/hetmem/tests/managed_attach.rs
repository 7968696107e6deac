//! Managed buffers attached to one queue's stream: GPU work through the attached lease agrees
//! with the CPU over many rounds of hand-offs, CPU access waits for that work, the buffer
//! comes back attached globally with its contents, and another queue refuses the lease. The
//! same on the CPU backend, where attaching is a no-op with the same types.

use hetmem::backend::cuda::MemLocation;
use hetmem::{Device, Error, HostBuf, ManagedBuf, PinOptions, Queue, ops};

use crate::support::{POISON, first_mismatch, on_every_backend, random_words};

const LEN: usize = 1 << 16;

fn managed_or_skip(device: &Device) -> bool {
    let managed = device.capabilities();
    if managed.gpu && !managed.concurrent_managed_access {
        eprintln!("managed_attach: skipped on {}: no concurrent managed access", device.name());
        return false;
    }
    true
}

/// Rounds of y = 3x + 1 into the attached buffer, then CPU writes of fresh data into it,
/// each round checked against the CPU.
fn rounds_through_an_attached_buffer(device: &Device) {
    if !managed_or_skip(device) {
        return;
    }
    let queue = Queue::new(device).unwrap();
    let mut managed = ManagedBuf::<u32>::new(device, LEN).unwrap();
    managed.as_mut_slice().fill(POISON);
    let mut attached = queue.attach(managed).unwrap();
    assert!(attached.host().unwrap().iter().all(|&x| x == POISON), "attaching changed the contents");
    for round in 0..8u32 {
        let mut input = HostBuf::<u32>::pinned(device, LEN, PinOptions::default()).unwrap();
        input.as_mut_slice().copy_from_slice(&random_words(LEN));
        let input = queue.share(input);
        attached.prefetch(MemLocation::Device(device.gpu_ordinal().unwrap_or(0))).unwrap();
        ops::affine_u32(&queue, &input, attached.lease().unwrap(), 3, round).unwrap();
        let input = input.reclaim().unwrap();
        let expected: Vec<u32> =
            input.as_slice().iter().map(|x| x.wrapping_mul(3).wrapping_add(round)).collect();
        // The host slice waits for the kernel first: no synchronise here.
        let got = attached.host_mut().unwrap();
        assert_eq!(first_mismatch(got, &expected), None, "round {round} on {}", device.name());
        // The CPU's writes reach the next round's GPU work.
        got.copy_from_slice(&random_words(LEN));
        let written = got.to_vec();
        let mut copy = HostBuf::<u32>::pinned(device, LEN, PinOptions::default()).unwrap();
        copy.as_mut_slice().fill(POISON);
        let mut copy = queue.lend(copy);
        queue.copy(attached.lease().unwrap(), &mut copy).unwrap();
        assert_eq!(
            first_mismatch(copy.reclaim().unwrap().as_slice(), &written),
            None,
            "round {round}: CPU writes"
        );
    }
    let last = attached.host().unwrap().to_vec();
    let managed = attached.detach().unwrap();
    assert_eq!(managed.as_slice(), &last[..], "detaching changed the contents");
}

#[test]
fn an_attached_managed_buffer_agrees_with_the_cpu_round_after_round() {
    on_every_backend(
        "an_attached_managed_buffer_agrees_with_the_cpu_round_after_round",
        rounds_through_an_attached_buffer,
    );
}

#[test]
fn another_queue_refuses_the_lease_of_an_attached_buffer() {
    let Some(gpu) =
        hetmem::testing::cuda_device_or_skip("another_queue_refuses_the_lease_of_an_attached_buffer")
    else {
        return;
    };
    let device = Device::Cuda(gpu);
    if !managed_or_skip(&device) {
        return;
    }
    let (one, two) = (Queue::new(&device).unwrap(), Queue::new(&device).unwrap());
    let mut attached = one.attach(ManagedBuf::<u32>::new(&device, 1024).unwrap()).unwrap();
    let input = two.share(HostBuf::<u32>::pinned(&device, 1024, PinOptions::default()).unwrap());
    let error = ops::affine_u32(&two, &input, attached.lease().unwrap(), 1, 1).unwrap_err();
    assert!(matches!(error, Error::ForeignQueue { .. }), "{error}");
}
