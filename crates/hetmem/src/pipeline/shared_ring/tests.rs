//! The protocol within one process (two threads, a socket pair): ordering, the end of the
//! stream, refusals. The tests across real processes, killed peers included, are in
//! `tests/interprocess.rs`.

use super::*;
use crate::memory::fd_passing::{read_exact_until, recv_fds};
use crate::stage::{CpuStage, FrameLayout, ScalarType};

/// Frame `sequence` of a stream seeded `seed`: fresh random bytes, the same on both sides.
fn frame_bytes_of(seed: u64, sequence: u64, len: usize) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(seed ^ sequence.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    (0..len).map(|_| rng.u8(..)).collect()
}

fn producer_thread(
    socket: UnixStream,
    seed: u64,
    frames: u64,
    len: usize,
    slots: usize,
) -> std::thread::JoinHandle<Result<()>> {
    std::thread::spawn(move || {
        let mut ring = RingProducer::create(&Device::cpu(), &socket, len, slots, Default::default())?;
        for sequence in 0..frames {
            let mut slot = ring.next_slot()?;
            assert_eq!(slot.sequence(), sequence);
            slot.write_at(0, &frame_bytes_of(seed, sequence, len)).unwrap();
            slot.publish();
        }
        ring.close();
        Ok(())
    })
}

#[test]
fn frames_arrive_in_order_complete_and_once_with_frames_held_and_freed_out_of_order() {
    let seed = fastrand::u64(..);
    eprintln!("seed {seed:#x}");
    let (left, right) = UnixStream::pair().unwrap();
    let len = 10_007;
    let producer = producer_thread(left, seed, 300, len, 3);
    let mut ring = RingConsumer::connect(&Device::cpu(), &right, Default::default()).unwrap();
    assert_eq!((ring.frame_bytes(), ring.slots()), (len, 3));
    let mut held = Vec::new();
    let mut count = 0u64;
    while let Some(frame) = ring.next_frame().unwrap() {
        assert_eq!(frame.sequence(), count);
        assert!(frame.to_vec() == frame_bytes_of(seed, count, len), "frame {count} differs");
        count += 1;
        held.push(frame);
        // Hold up to two frames (the producer fills the third slot meanwhile), freeing the
        // newer first now and then.
        if held.len() == 2 {
            if count.is_multiple_of(3) {
                held.swap(0, 1);
            }
            held.clear();
        }
    }
    assert_eq!(count, 300);
    assert!(ring.next_frame().unwrap().is_none(), "the end stays the end");
    producer.join().unwrap().unwrap();
}

#[test]
fn taking_a_frame_while_holding_every_slot_is_an_error_not_a_deadlock() {
    let (left, right) = UnixStream::pair().unwrap();
    let producer = producer_thread(left, 7, 3, 100, 2);
    let mut ring = RingConsumer::connect(&Device::cpu(), &right, Default::default()).unwrap();
    let held = [ring.next_frame().unwrap().unwrap(), ring.next_frame().unwrap().unwrap()];
    let error = ring.next_frame().unwrap_err();
    assert!(
        error.to_string().contains("frame 2 needs slot 0, which this process still holds with frame 0"),
        "{error}"
    );
    drop(held);
    assert_eq!(ring.next_frame().unwrap().unwrap().sequence(), 2, "nothing was lost meanwhile");
    assert!(ring.next_frame().unwrap().is_none());
    producer.join().unwrap().unwrap();
}

#[test]
fn a_cpu_stage_runs_on_each_frame() {
    let seed = fastrand::u64(..);
    let (left, right) = UnixStream::pair().unwrap();
    let len = 4096 * 2 + 3;
    let producer = producer_thread(left, seed, 20, len, 2);
    let mut ring = RingConsumer::connect(&Device::cpu(), &right, Default::default()).unwrap();
    let layout = FrameLayout::samples(len, ScalarType::U8).unwrap();
    let stage = CpuStage::map(layout.clone(), layout, |input, output| {
        output.iter_mut().zip(input).for_each(|(y, x)| *y = x.wrapping_mul(3) ^ 0x5a);
        Ok(())
    })
    .unwrap();
    let mut output = vec![0xEEu8; len];
    let mut expected_sequence = 0;
    while let Some(sequence) = ring.run(&stage, &mut [&mut output]).unwrap() {
        assert_eq!(sequence, expected_sequence);
        let expected: Vec<u8> =
            frame_bytes_of(seed, sequence, len).iter().map(|x| x.wrapping_mul(3) ^ 0x5a).collect();
        assert!(output == expected, "frame {sequence}");
        output.fill(0xEE);
        expected_sequence += 1;
    }
    assert_eq!(expected_sequence, 20);
    let error = ring.run(&stage, &mut [&mut [0u8; 5]]).unwrap_err();
    assert!(error.to_string().contains("given [5]"), "{error}");
    producer.join().unwrap().unwrap();
}

#[test]
fn a_consumer_that_closes_is_named_to_the_waiting_producer() {
    let (left, right) = UnixStream::pair().unwrap();
    let consumer = std::thread::spawn(move || {
        let mut ring = RingConsumer::connect(&Device::cpu(), &right, Default::default()).unwrap();
        let first = ring.next_frame().unwrap().unwrap();
        assert_eq!(first.sequence(), 0);
        // Dropping the ring (the frame too) closes it.
    });
    let mut ring = RingProducer::create(&Device::cpu(), &left, 100, 2, Default::default()).unwrap();
    let result = (0..10).try_for_each(|_| ring.next_slot().map(SlotWriter::publish));
    consumer.join().unwrap();
    let error = result.err().or_else(|| ring.next_slot().err()).expect("the producer is told");
    assert!(
        matches!(&error, Error::PeerGone { role: "consumer", pid, .. } if *pid == std::process::id()),
        "{error}"
    );
    assert!(error.to_string().contains("closed the ring"), "{error}");
}

#[test]
fn a_producer_dropped_without_closing_breaks_the_stream_after_its_frames() {
    let (left, right) = UnixStream::pair().unwrap();
    let producer = std::thread::spawn(move || {
        let mut ring = RingProducer::create(&Device::cpu(), &left, 64, 4, Default::default()).unwrap();
        for k in 0..3u8 {
            let mut slot = ring.next_slot().unwrap();
            slot.fill(k + 1);
            slot.publish();
        }
        // An unpublished slot is given back; then the producer goes without closing.
        let mut slot = ring.next_slot().unwrap();
        slot.fill(0xFF);
        drop(slot);
    });
    let mut ring = RingConsumer::connect(&Device::cpu(), &right, Default::default()).unwrap();
    producer.join().unwrap();
    for k in 0..3u8 {
        let frame = ring.next_frame().unwrap().unwrap();
        assert!(frame.to_vec().iter().all(|&byte| byte == k + 1));
    }
    let error = ring.next_frame().unwrap_err();
    assert!(matches!(error, Error::PeerGone { role: "producer", .. }), "{error}");
    assert!(error.to_string().contains("without closing it, after 3 frames"), "{error}");
}

/// Sends a hand-made ring segment (with `damage` done to its header) to a consumer, and
/// returns the consumer's error and the answer the producer side got.
fn refused(segment_bytes: usize, damage: impl FnOnce(&HeaderWords)) -> (Error, u8) {
    let (left, right) = UnixStream::pair().unwrap();
    let layout = RingLayout::new(10_000, 4, page_size()).unwrap();
    let segment = SharedSegment::memfd("damaged-ring", segment_bytes, false).unwrap();
    let header = header_of(&segment).unwrap();
    header.init(&layout, std::process::id());
    damage(header);
    let mut hello = [0u8; 24];
    hello[..8].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
    hello[8..16].copy_from_slice(&u64::from(header::VERSION).to_le_bytes());
    send_fds(left.as_fd(), &hello, &[segment.fd()]).unwrap();
    let error = RingConsumer::connect(&Device::cpu(), &right, Default::default()).unwrap_err();
    let mut answer = [9u8];
    read_exact_until(left.as_fd(), &mut answer, None).unwrap();
    (error, answer[0])
}

#[test]
fn a_segment_smaller_than_its_header_says_is_refused_by_name() {
    let layout = RingLayout::new(10_000, 4, page_size()).unwrap();
    let (error, answer) = refused(layout.total_bytes - page_size(), |_| {});
    assert_eq!(answer, REFUSED);
    let text = error.to_string();
    assert!(text.contains("memfd:damaged-ring") && text.contains("holds"), "{text}");
}

#[test]
fn a_bad_magic_version_or_size_in_the_header_is_refused() {
    let total = RingLayout::new(10_000, 4, page_size()).unwrap().total_bytes;
    let (error, answer) = refused(total, |header| header.magic.store(0x1234, Ordering::Relaxed));
    assert_eq!(answer, REFUSED);
    assert!(error.to_string().contains("not a hetmem ring segment"), "{error}");
    let (error, _) = refused(total, |header| header.version.store(99, Ordering::Relaxed));
    assert!(error.to_string().contains("protocol version 99"), "{error}");
    let (error, _) = refused(total, |header| header.total_bytes.store(1 << 40, Ordering::Relaxed));
    assert!(error.to_string().contains("total size"), "{error}");
    let (error, _) = refused(total, |header| header.slots.store(1000, Ordering::Relaxed));
    assert!(error.to_string().contains("1000 slots"), "{error}");
}

/// A consumer's limits refuse a ring of more slots, or of another frame size, before any of
/// it is registered; the producer hears the refusal; a ring within them is taken.
#[test]
fn a_ring_beyond_the_consumers_limits_is_refused_before_it_is_registered() {
    let limited = |frame_bytes, max_slots| ConsumerLimits { frame_bytes, max_slots };
    for (limits, slots, wanted) in [
        (limited(None, 4), 8, "offers 8 slots of 1000 bytes; this consumer takes at most 4"),
        (limited(Some(999), 64), 2, "frames of 1000 bytes where this consumer expects 999"),
        (limited(None, 0), 2, "max_slots 0: give 1 to 64"),
        (limited(None, 65), 2, "max_slots 65: give 1 to 64"),
    ] {
        let (left, right) = UnixStream::pair().unwrap();
        let producer = std::thread::spawn(move || {
            RingProducer::create(&Device::cpu(), &left, 1000, slots, Default::default())
        });
        let error = RingConsumer::connect_limited(&Device::cpu(), &right, Default::default(), None, limits)
            .unwrap_err()
            .to_string();
        assert!(error.contains(wanted), "{error}");
        let refused = producer.join().unwrap().unwrap_err().to_string();
        assert!(refused.contains("the consumer refused the ring"), "{refused}");
    }
    let (left, right) = UnixStream::pair().unwrap();
    let producer = producer_thread(left, 3, 5, 1000, 4);
    let mut ring = RingConsumer::connect_limited(
        &Device::cpu(),
        &right,
        Default::default(),
        None,
        limited(Some(1000), 4),
    )
    .unwrap();
    let mut count = 0;
    while let Some(frame) = ring.next_frame().unwrap() {
        assert!(frame.to_vec() == frame_bytes_of(3, count, 1000), "frame {count}");
        count += 1;
    }
    assert_eq!(count, 5);
    producer.join().unwrap().unwrap();
}

#[test]
fn a_refused_ring_is_an_error_for_the_producer_not_a_hang() {
    let (left, right) = UnixStream::pair().unwrap();
    let consumer = std::thread::spawn(move || {
        let mut hello = [0u8; 24];
        let fds = recv_fds(right.as_fd(), &mut hello).unwrap();
        assert_eq!(fds.len(), 1, "the memfd alone: no descriptor whose flags both sides share");
        write_all(right.as_fd(), &[REFUSED]).unwrap();
    });
    let error = RingProducer::create(&Device::cpu(), &left, 100, 2, Default::default()).unwrap_err();
    assert!(error.to_string().contains("the consumer refused the ring"), "{error}");
    consumer.join().unwrap();
    let (left, right) = UnixStream::pair().unwrap();
    drop(right);
    let error = RingProducer::create(&Device::cpu(), &left, 100, 2, Default::default()).unwrap_err();
    assert!(error.to_string().contains("sending") || error.to_string().contains("went away"), "{error}");
}

#[test]
fn a_corrupt_state_word_is_an_error_naming_the_slot() {
    let (left, right) = UnixStream::pair().unwrap();
    let producer = std::thread::spawn(move || {
        let ring = RingProducer::create(&Device::cpu(), &left, 100, 2, Default::default()).unwrap();
        ring.shared.header().slot(0).state.store(77, Ordering::Release);
        ring.shared.peer.signal();
        ring.close();
    });
    let mut ring = RingConsumer::connect(&Device::cpu(), &right, Default::default()).unwrap();
    producer.join().unwrap();
    let error = ring.next_frame().unwrap_err();
    assert!(error.to_string().contains("slot 0") && error.to_string().contains("state 77"), "{error}");
}

/// Offers a hand-made ring (a header for 4 slots of 10 000 bytes written into `segment`, and
/// the `extra` descriptors after it) to a consumer on the other end of a new socket, as a
/// hostile producer would: the producer's end of the socket and the consumer's answer.
fn offer(segment: &SharedSegment, extra: &[&OwnedFd]) -> (UnixStream, Result<RingConsumer>) {
    let (left, right) = UnixStream::pair().unwrap();
    let layout = RingLayout::new(10_000, 4, page_size()).unwrap();
    header_of(segment).unwrap().init(&layout, std::process::id());
    let mut hello = [0u8; 24];
    hello[..8].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
    hello[8..16].copy_from_slice(&u64::from(header::VERSION).to_le_bytes());
    let mut fds = vec![segment.fd()];
    fds.extend(extra.iter().map(|fd| fd.as_fd()));
    send_fds(left.as_fd(), &hello, &fds).unwrap();
    (left, RingConsumer::connect(&Device::cpu(), &right, Default::default()))
}

#[test]
fn a_named_segment_the_producer_could_truncate_under_the_consumer_is_refused() {
    // A /dev/shm segment cannot be sealed: a producer that truncated it after the consumer
    // mapped it would crash the consumer (SIGBUS) in safe code reading a frame.
    let name = format!("hetmem-test-ring-{}-{:016x}", std::process::id(), fastrand::u64(..));
    let total = RingLayout::new(10_000, 4, page_size()).unwrap().total_bytes;
    let segment = SharedSegment::create_named(&name, total).unwrap();
    let (_producer, consumer) = offer(&segment, &[]);
    let error = consumer.expect_err("an unsealed segment must be refused");
    assert!(error.to_string().contains("not sealed against shrinking"), "{error}");
}

#[test]
fn a_ring_offered_with_descriptors_of_shared_flags_is_refused() {
    let total = RingLayout::new(10_000, 4, page_size()).unwrap().total_bytes;
    let segment = SharedSegment::memfd("hostile-ring", total, false).unwrap();
    // A blocking eventfd, as the first protocol passed: its flags would be the producer's too.
    let blocking = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
    let (_producer, consumer) = offer(&segment, &[&blocking, &blocking]);
    let error = consumer.expect_err("a ring with eventfds is an older or hostile producer's");
    assert!(error.to_string().contains("3 descriptors"), "{error}");
}

#[test]
fn a_producer_that_floods_the_socket_and_never_publishes_cannot_hang_the_consumer() {
    use std::io::Write;
    let total = RingLayout::new(10_000, 4, page_size()).unwrap().total_bytes;
    let segment = SharedSegment::memfd("flooding-ring", total, false).unwrap();
    let (producer, consumer) = offer(&segment, &[]);
    let mut consumer = consumer.unwrap();
    let mut answer = [9u8];
    read_exact_until(producer.as_fd(), &mut answer, None).unwrap();
    assert_eq!(answer, [ACCEPTED]);
    // Bytes by the megabyte (wake-ups to a consumer that finds nothing), its end blocking.
    producer.set_nonblocking(true).unwrap();
    let flood = vec![0x57u8; 1 << 16];
    while (&producer).write(&flood).is_ok_and(|written| written > 0) {}
    let (done, answer) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let start = std::time::Instant::now();
        let waited = consumer.next_frame_within(Some(std::time::Duration::from_millis(250)));
        let took = start.elapsed();
        let bounded = matches!(waited, Ok(None));
        let _ = done.send((bounded, took, consumer.next_frame().map(|frame| frame.is_some())));
    });
    std::thread::sleep(std::time::Duration::from_millis(600));
    drop(producer);
    let (bounded, took, result) = answer
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("the consumer hangs under a flood of wake-ups");
    assert!(bounded, "a bounded wait with no frame ends with none");
    assert!(
        took >= std::time::Duration::from_millis(250) && took < std::time::Duration::from_secs(2),
        "{took:?}"
    );
    let error = result.unwrap_err();
    assert!(matches!(error, Error::PeerGone { role: "producer", .. }), "{error}");
}

#[test]
fn copies_in_and_out_of_a_slot_are_exact_at_any_offset() {
    let (left, right) = UnixStream::pair().unwrap();
    let len = 10_003;
    let consumer = std::thread::spawn(move || {
        let mut ring = RingConsumer::connect(&Device::cpu(), &right, Default::default()).unwrap();
        let frame = ring.next_frame().unwrap().unwrap();
        assert_eq!(frame.len(), len);
        let whole = frame.to_vec();
        let mut part = vec![0xEEu8; 4001];
        frame.read_at(13, &mut part).unwrap();
        assert!(part[..] == whole[13..13 + 4001]);
        assert!(frame.read_at(len - 3, &mut [0u8; 4]).unwrap_err().to_string().contains("passes the frame"));
        whole
    });
    let mut ring = RingProducer::create(&Device::cpu(), &left, len, 2, Default::default()).unwrap();
    let mut rng = fastrand::Rng::new();
    let data: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
    let mut slot = ring.next_slot().unwrap();
    slot.fill(0x11);
    slot.write_at(0, &data[..5]).unwrap();
    slot.write_at(5, &data[5..]).unwrap();
    assert!(slot.write_at(usize::MAX, &[1]).unwrap_err().to_string().contains("passes the frame"));
    slot.publish();
    assert!(consumer.join().unwrap() == data, "what the consumer copied out is what was copied in");
    ring.close();
}

/// A peer that connected but stays silent (or sends half a message) is a `TimedOut` error
/// once the set-up's timeout passes, on both sides, and not before.
#[test]
fn a_silent_peer_times_the_set_up_out_on_both_sides() {
    let timeout = Duration::from_millis(300);
    // The consumer, facing a producer that says nothing.
    let (silent, right) = UnixStream::pair().unwrap();
    let started = Instant::now();
    let error =
        RingConsumer::connect_within(&Device::cpu(), &right, Default::default(), Some(timeout)).unwrap_err();
    let waited = started.elapsed();
    assert!(
        matches!(&error, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::TimedOut),
        "{error}"
    );
    assert!(waited >= timeout && waited < timeout * 10, "waited {waited:?} for a {timeout:?} timeout");
    // ... and one that sends the first bytes of its message, then stops.
    write_all(silent.as_fd(), &HELLO_MAGIC.to_le_bytes()[..5]).unwrap();
    let error =
        RingConsumer::connect_within(&Device::cpu(), &right, Default::default(), Some(timeout)).unwrap_err();
    assert!(error.to_string().contains("before the timeout"), "{error}");
    // The producer, facing a consumer that takes the memfd and never answers.
    let (left, quiet) = UnixStream::pair().unwrap();
    let started = Instant::now();
    let error =
        RingProducer::create_within(&Device::cpu(), &left, 4096, 2, Default::default(), Some(timeout))
            .unwrap_err();
    let waited = started.elapsed();
    assert!(
        matches!(&error, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::TimedOut),
        "{error}"
    );
    assert!(error.to_string().contains("did not answer in time"), "{error}");
    assert!(waited >= timeout && waited < timeout * 10, "waited {waited:?} for a {timeout:?} timeout");
    let mut hello = [0u8; 24];
    assert_eq!(recv_fds(quiet.as_fd(), &mut hello).unwrap().len(), 1, "the ring was sent all the same");
    drop(silent);
}

/// With a timeout that does not pass, the set-up goes through as without one, frames and all.
#[test]
fn a_set_up_within_its_timeout_runs_the_ring() {
    let (left, right) = UnixStream::pair().unwrap();
    let timeout = Some(Duration::from_secs(30));
    let consumer = std::thread::spawn(move || {
        let mut ring =
            RingConsumer::connect_within(&Device::cpu(), &right, Default::default(), timeout).unwrap();
        let mut got = Vec::new();
        while let Some(frame) = ring.next_frame().unwrap() {
            got.push(frame.to_vec());
        }
        got
    });
    let mut ring =
        RingProducer::create_within(&Device::cpu(), &left, 5000, 3, Default::default(), timeout).unwrap();
    let frames: Vec<Vec<u8>> = (0..7).map(|_| (0..5000).map(|_| fastrand::u8(1..)).collect()).collect();
    for frame in &frames {
        let mut slot = ring.next_slot().unwrap();
        slot.write_at(0, frame).unwrap();
        slot.publish();
    }
    ring.close();
    assert_eq!(consumer.join().unwrap(), frames);
}

#[test]
fn a_frame_shared_with_a_queue_keeps_its_slot_until_reclaimed_and_dropped() {
    // The pipelined consumer's rule: the slot of a frame whose queue work may still read it
    // goes back to the producer only once the lease is reclaimed and the frame dropped.
    let (left, right) = UnixStream::pair().unwrap();
    let (got_slot, slot_came) = std::sync::mpsc::channel();
    let producer = std::thread::spawn(move || -> Result<()> {
        let mut ring = RingProducer::create(&Device::cpu(), &left, 64, 1, Default::default())?;
        for sequence in 0..2u8 {
            let mut slot = ring.next_slot()?;
            got_slot.send(sequence).unwrap();
            slot.fill(sequence + 1);
            slot.publish();
        }
        ring.close();
        Ok(())
    });
    let device = Device::cpu();
    let mut ring = RingConsumer::connect(&device, &right, Default::default()).unwrap();
    let queue = crate::Queue::new(&device).unwrap();
    let frame = ring.next_frame().unwrap().unwrap();
    assert_eq!(slot_came.recv().unwrap(), 0);
    let lease = queue.share(frame);
    let waited = Duration::from_millis(150);
    assert!(slot_came.recv_timeout(waited).is_err(), "the slot went back while a queue held the frame");
    let frame = lease.reclaim().unwrap();
    assert!(slot_came.recv_timeout(waited).is_err(), "the slot went back while the frame was held");
    let mut first = [0u8];
    frame.read_at(0, &mut first).unwrap();
    assert_eq!(first, [1]);
    drop(frame);
    assert_eq!(
        slot_came.recv_timeout(Duration::from_secs(10)).unwrap(),
        1,
        "dropping the frame frees its slot"
    );
    let next = ring.next_frame().unwrap().unwrap();
    assert_eq!((next.sequence(), next.to_vec()), (1, vec![2u8; 64]));
    drop(next);
    assert!(ring.next_frame().unwrap().is_none());
    producer.join().unwrap().unwrap();
}
