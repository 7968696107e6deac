//! Shared memory and the shared ring between real processes: this test binary re-runs itself
//! as the other process (the role in `HETMEM_TEST_CHILD`, the socket's path in
//! `HETMEM_TEST_SOCKET`; fork is unsafe in the threaded test harness). Peers are killed with
//! SIGKILL mid-frame, and the survivor must name them, promptly, after the frames they
//! finished.

use std::io::{BufRead, BufReader};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hetmem::memory::{SharedHostBuf, SharedOptions};
use hetmem::pipeline::shared_ring::{RingConsumer, RingProducer};
use hetmem::{Device, Error, HostBuf, PinOptions, Queue};

use crate::support::{CHILD_ENV, child_role, cpu_device};

const SOCKET_ENV: &str = "HETMEM_TEST_SOCKET";
const SEED_ENV: &str = "HETMEM_TEST_SEED";
const NAME_ENV: &str = "HETMEM_TEST_SHM_NAME";
const BACKEND_ENV: &str = "HETMEM_TEST_XPROC_BACKEND";
/// How long a killed peer may take to be noticed: the promise is "within a second".
const NOTICE_WITHIN: Duration = Duration::from_secs(1);
const FRAME_BYTES: usize = 65_536 + 5;
const FRAMES: u64 = 400;

/// The payload of frame `sequence` of a stream seeded `seed`: fresh random bytes, the same in
/// both processes, with the frame's index and an FNV-1a checksum of the rest in front.
fn frame_of(seed: u64, sequence: u64, len: usize) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(seed ^ sequence.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut frame: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
    frame[..8].copy_from_slice(&sequence.to_le_bytes());
    let checksum = fnv1a(&frame[16..]);
    frame[8..16].copy_from_slice(&checksum.to_le_bytes());
    frame
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(0xcbf2_9ce4_8422_2325, |hash, &byte| (hash ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3))
}

/// Checks a received frame: its index, its checksum, and every byte against the stream.
fn check_frame(seed: u64, expected_sequence: u64, frame: &[u8]) {
    let sequence = u64::from_le_bytes(frame[..8].try_into().unwrap());
    assert_eq!(sequence, expected_sequence, "frame out of order (seed {seed:#x})");
    let checksum = u64::from_le_bytes(frame[8..16].try_into().unwrap());
    assert_eq!(checksum, fnv1a(&frame[16..]), "frame {sequence}: checksum (seed {seed:#x})");
    assert!(frame == frame_of(seed, sequence, frame.len()), "frame {sequence} differs (seed {seed:#x})");
}

/// The other process, started on a fresh socket.
struct Peer {
    child: Child,
    lines: BufReader<std::process::ChildStdout>,
    socket: UnixStream,
    _dir: tempfile::TempDir,
}

impl Peer {
    /// Re-runs this binary for `test` as `role` with `env`, and accepts its connection.
    fn start(test: &str, role: &str, env: &[(&str, String)]) -> Peer {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ring.sock");
        let listener = UnixListener::bind(&path).unwrap();
        listener.set_nonblocking(true).unwrap();
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .args([&format!("interprocess::{test}"), "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, role)
            .env(SOCKET_ENV, &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (key, value) in env {
            command.env(key, value);
        }
        let mut child = command.spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let socket = loop {
            match listener.accept() {
                Ok((socket, _)) => break socket,
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                    if let Some(status) = child.try_wait().unwrap() {
                        panic!("the {role} child ended ({status}) before connecting");
                    }
                    assert!(Instant::now() < deadline, "the {role} child never connected");
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(error) => panic!("accept: {error}"),
            }
        };
        socket.set_nonblocking(false).unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap());
        Peer { child, lines, socket, _dir: dir }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the child to print a line holding `prefix` (the test harness prints its own
    /// text too, `test NAME ... ` before it on the same line), and returns it from there.
    fn expect_line(&mut self, prefix: &str) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            let read = self.lines.read_line(&mut line).unwrap();
            assert!(read > 0, "the child ended before printing {prefix:?}");
            if let Some(at) = line.find(&format!("{MARK}{prefix}")) {
                return line[at + MARK.len()..].trim().to_string();
            }
        }
    }

    fn kill(&mut self) -> Instant {
        self.child.kill().unwrap();
        Instant::now()
    }

    /// Waits for the child; it must have passed.
    fn passed(&mut self) {
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the child failed: {status}");
    }

    /// Waits for the killed child; it must have died of SIGKILL.
    fn reap_killed(&mut self) {
        let status = self.child.wait().unwrap();
        assert_eq!(status.signal(), Some(9), "the child was to die of SIGKILL: {status}");
    }
}

impl Drop for Peer {
    /// A test that failed early does not leave its child running (a reaped child is not
    /// signalled again: `Child` knows it has exited).
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The child's end of the socket.
fn child_socket() -> UnixStream {
    UnixStream::connect(std::env::var(SOCKET_ENV).expect("started by Peer::start")).unwrap()
}

fn env_u64(key: &str) -> u64 {
    std::env::var(key).unwrap().parse().unwrap()
}

/// Opens what a child says to its parent, so the harness's own text cannot pass for it.
const MARK: &str = "child says: ";

/// Announces a step to the parent (stdout is its pipe).
fn say(line: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{MARK}{line}").unwrap();
    stdout.flush().unwrap();
}

fn fresh_seed() -> u64 {
    let seed = fastrand::u64(..);
    eprintln!("seed {seed:#x}");
    seed
}

/// Produces frames `0..frames`, then either closes the ring or, with `stall`, starts frame
/// `frames`, says so, and waits to be killed.
fn produce(seed: u64, frames: u64, stall: bool) {
    let socket = child_socket();
    let mut ring = RingProducer::create(&cpu_device(), &socket, FRAME_BYTES, 3, Default::default()).unwrap();
    for sequence in 0..frames {
        let mut slot = ring.next_slot().unwrap();
        slot.write_at(0, &frame_of(seed, sequence, FRAME_BYTES)).unwrap();
        slot.publish();
    }
    if !stall {
        ring.close();
        return;
    }
    let mut slot = ring.next_slot().unwrap();
    slot.write_at(0, &[0x33; FRAME_BYTES / 2]).unwrap();
    say("mid-frame");
    std::thread::sleep(Duration::from_secs(120));
    unreachable!("killed by the parent before this");
}

#[test]
fn frames_cross_to_another_process_in_order_none_lost_or_repeated() {
    const TEST: &str = "frames_cross_to_another_process_in_order_none_lost_or_repeated";
    if child_role().as_deref() == Some("producer") {
        return produce(env_u64(SEED_ENV), FRAMES, false);
    }
    let seed = fresh_seed();
    let mut peer = Peer::start(TEST, "producer", &[(SEED_ENV, seed.to_string())]);
    let mut ring = RingConsumer::connect(&cpu_device(), &peer.socket, Default::default()).unwrap();
    assert_eq!(ring.producer_pid(), peer.pid());
    let mut count = 0;
    while let Some(frame) = ring.next_frame().unwrap() {
        check_frame(seed, count, &frame.to_vec());
        count += 1;
    }
    assert_eq!(count, FRAMES, "every frame, once");
    peer.passed();
}

#[test]
fn frames_cross_from_this_process_to_a_consuming_one() {
    const TEST: &str = "frames_cross_from_this_process_to_a_consuming_one";
    if child_role().as_deref() == Some("consumer") {
        let seed = env_u64(SEED_ENV);
        let socket = child_socket();
        let mut ring = RingConsumer::connect(&cpu_device(), &socket, Default::default()).unwrap();
        let mut digest = 0u64;
        let mut count = 0;
        while let Some(frame) = ring.next_frame().unwrap() {
            check_frame(seed, count, &frame.to_vec());
            digest = digest.rotate_left(7) ^ fnv1a(&frame.to_vec());
            count += 1;
        }
        return say(&format!("consumed {count} digest {digest:#x}"));
    }
    let seed = fresh_seed();
    let mut peer = Peer::start(TEST, "consumer", &[(SEED_ENV, seed.to_string())]);
    let mut ring =
        RingProducer::create(&cpu_device(), &peer.socket, FRAME_BYTES, 4, Default::default()).unwrap();
    assert_eq!(ring.consumer_pid(), peer.pid());
    let mut digest = 0u64;
    for sequence in 0..FRAMES {
        let frame = frame_of(seed, sequence, FRAME_BYTES);
        digest = digest.rotate_left(7) ^ fnv1a(&frame);
        let mut slot = ring.next_slot().unwrap();
        slot.write_at(0, &frame).unwrap();
        slot.publish();
    }
    ring.close();
    assert_eq!(peer.expect_line("consumed"), format!("consumed {FRAMES} digest {digest:#x}"));
    peer.passed();
}

#[test]
fn a_producer_killed_mid_frame_is_named_within_a_second_after_its_frames() {
    const TEST: &str = "a_producer_killed_mid_frame_is_named_within_a_second_after_its_frames";
    if child_role().as_deref() == Some("stalling-producer") {
        return produce(env_u64(SEED_ENV), 5, true);
    }
    let seed = fresh_seed();
    let mut peer = Peer::start(TEST, "stalling-producer", &[(SEED_ENV, seed.to_string())]);
    let mut ring = RingConsumer::connect(&cpu_device(), &peer.socket, Default::default()).unwrap();
    for sequence in 0..5 {
        let frame = ring.next_frame().unwrap().expect("a frame the producer finished");
        check_frame(seed, sequence, &frame.to_vec());
    }
    peer.expect_line("mid-frame");
    let pid = peer.pid();
    let killed = peer.kill();
    let error = ring.next_frame().unwrap_err();
    let noticed = killed.elapsed();
    assert!(noticed < NOTICE_WITHIN, "noticed after {noticed:?}");
    assert!(matches!(error, Error::PeerGone { role: "producer", pid: named, .. } if named == pid), "{error}");
    let text = error.to_string();
    assert!(text.contains(&format!("pid {pid}")) && text.contains("while writing frame 5"), "{text}");
    peer.reap_killed();
}

/// The eventfds among this process's open descriptors.
fn eventfds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter(|target| target.as_os_str() == "anon_inode:[eventfd]")
        .count()
}

/// A producer that sets the ring up, then does its worst to the wake-ups without ever
/// publishing: makes its end of the socket blocking and floods it with bytes.
fn hostile_producer() {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let socket = child_socket();
    let _ring = RingProducer::create(&cpu_device(), &socket, FRAME_BYTES, 3, Default::default()).unwrap();
    // SAFETY: plain fcntl calls on a descriptor this function owns, alive for the calls.
    unsafe {
        let flags = libc::fcntl(socket.as_raw_fd(), libc::F_GETFL);
        assert!(flags >= 0 && libc::fcntl(socket.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK) == 0);
    }
    socket.set_write_timeout(Some(Duration::from_millis(500))).unwrap();
    let flood = vec![0x57u8; 1 << 16];
    while (&socket).write(&flood).is_ok_and(|written| written > 0) {}
    say("hostile");
    std::thread::sleep(Duration::from_secs(120));
    unreachable!("killed by the parent before this");
}

#[test]
fn a_producer_that_tampers_with_the_wake_ups_cannot_hang_the_consumer() {
    const TEST: &str = "a_producer_that_tampers_with_the_wake_ups_cannot_hang_the_consumer";
    if child_role().as_deref() == Some("hostile-producer") {
        return hostile_producer();
    }
    let mut peer = Peer::start(TEST, "hostile-producer", &[]);
    let before = eventfds();
    let mut ring = RingConsumer::connect(&cpu_device(), &peer.socket, Default::default()).unwrap();
    // No descriptor whose flags the peer shares (an eventfd) came with the ring.
    assert_eq!(eventfds(), before, "the ring passed an eventfd: its O_NONBLOCK is the peer's to clear");
    peer.expect_line("hostile");
    let asked = Instant::now();
    let waited = ring.next_frame_within(Some(Duration::from_millis(300))).unwrap();
    assert!(waited.is_none(), "no frame was published, and the stream did not end");
    let took = asked.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(2),
        "a bounded wait took {took:?}"
    );
    let pid = peer.pid();
    let killed = peer.kill();
    let error = ring.next_frame().unwrap_err();
    let noticed = killed.elapsed();
    assert!(noticed < NOTICE_WITHIN, "noticed after {noticed:?}");
    assert!(matches!(error, Error::PeerGone { role: "producer", pid: named, .. } if named == pid), "{error}");
    peer.reap_killed();
}

#[test]
fn a_consumer_killed_holding_frames_is_named_within_a_second() {
    const TEST: &str = "a_consumer_killed_holding_frames_is_named_within_a_second";
    if child_role().as_deref() == Some("stalling-consumer") {
        let socket = child_socket();
        let mut ring = RingConsumer::connect(&cpu_device(), &socket, Default::default()).unwrap();
        let held = [ring.next_frame().unwrap().unwrap(), ring.next_frame().unwrap().unwrap()];
        say(&format!("holding {} {}", held[0].sequence(), held[1].sequence()));
        std::thread::sleep(Duration::from_secs(120));
        unreachable!("killed by the parent before this");
    }
    let seed = fresh_seed();
    let mut peer = Peer::start(TEST, "stalling-consumer", &[]);
    let mut ring =
        RingProducer::create(&cpu_device(), &peer.socket, FRAME_BYTES, 2, Default::default()).unwrap();
    for sequence in 0..2 {
        let mut slot = ring.next_slot().unwrap();
        slot.write_at(0, &frame_of(seed, sequence, FRAME_BYTES)).unwrap();
        slot.publish();
    }
    assert_eq!(peer.expect_line("holding"), "holding 0 1");
    let pid = peer.pid();
    let killed = peer.kill();
    let error = ring.next_slot().unwrap_err();
    let noticed = killed.elapsed();
    assert!(noticed < NOTICE_WITHIN, "noticed after {noticed:?}");
    assert!(matches!(error, Error::PeerGone { role: "consumer", pid: named, .. } if named == pid), "{error}");
    assert!(error.to_string().contains("frame 2 waited for a free slot"), "{error}");
    peer.reap_killed();
}

fn shm_path(name: &str) -> PathBuf {
    Path::new("/dev/shm").join(name)
}

#[test]
fn a_named_segment_left_by_a_killed_creator_is_refused_by_name_then_reclaimed() {
    const TEST: &str = "a_named_segment_left_by_a_killed_creator_is_refused_by_name_then_reclaimed";
    if child_role().as_deref() == Some("named-creator") {
        let name = std::env::var(NAME_ENV).unwrap();
        let _socket = child_socket();
        let mut rng = fastrand::Rng::with_seed(env_u64(SEED_ENV));
        // SAFETY: the parent only opens it once this process is dead; nothing truncates it.
        let mut buf =
            unsafe { SharedHostBuf::<u32>::create_named(&cpu_device(), &name, 5000, Default::default()) }
                .unwrap();
        buf.as_mut_slice().iter_mut().for_each(|word| *word = rng.u32(..));
        say("created");
        std::thread::sleep(Duration::from_secs(120));
        unreachable!("killed by the parent before this");
    }
    let seed = fresh_seed();
    let name = format!("hetmem-test-stale-{}-{:x}", std::process::id(), fastrand::u64(..));
    let mut peer =
        Peer::start(TEST, "named-creator", &[(SEED_ENV, seed.to_string()), (NAME_ENV, name.clone())]);
    peer.expect_line("created");
    peer.kill();
    peer.reap_killed();
    assert!(shm_path(&name).exists(), "a killed creator cannot unlink its name");
    let device = cpu_device();
    // SAFETY: refused: the name is taken.
    let error =
        unsafe { SharedHostBuf::<u32>::create_named(&device, &name, 10, Default::default()) }.unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains(&format!("/dev/shm/{name} already exists")) && text.contains("remove_named"),
        "{text}"
    );
    // Reclaimed by opening it: the dead creator's data is all there, and the name goes.
    // SAFETY: its creator is dead; nothing else maps it.
    let stale = unsafe { SharedHostBuf::<u32>::open_named(&device, &name, Default::default()) }.unwrap();
    let mut rng = fastrand::Rng::with_seed(seed);
    assert!(stale.as_slice()[..5000].iter().all(|&word| word == rng.u32(..)), "the creator's words");
    assert!(!shm_path(&name).exists());
    // SAFETY: nothing else opens it.
    let again =
        unsafe { SharedHostBuf::<u32>::create_named(&device, &name, 10, Default::default()) }.unwrap();
    drop(again);
    assert!(!shm_path(&name).exists(), "the creator removes its name on drop");
    assert!(!SharedHostBuf::<u8>::remove_named(&name).unwrap());
}

#[test]
fn a_segment_smaller_than_claimed_or_not_a_ring_is_refused_by_name() {
    const TEST: &str = "a_segment_smaller_than_claimed_or_not_a_ring_is_refused_by_name";
    if child_role().as_deref() == Some("sender") {
        let socket = child_socket();
        let mut buf = SharedHostBuf::<u8>::create(&cpu_device(), 4096, SharedOptions::default()).unwrap();
        buf.as_mut_slice().fill(0x5c);
        // SAFETY: this process does not touch the buffer again; the parent only reads it.
        unsafe { buf.send(&socket) }.unwrap();
        // SAFETY: as above.
        unsafe { buf.send(&socket) }.unwrap();
        // The parent's refusal of the second as a ring says it is done with both.
        let mut done = [0u8; 1];
        let _ = std::io::Read::read(&mut &socket, &mut done);
        return;
    }
    let mut peer = Peer::start(TEST, "sender", &[]);
    let device = cpu_device();
    // SAFETY: the sender does not write the buffer after sending it.
    let small = unsafe { SharedHostBuf::<u8>::receive(&device, &peer.socket, Default::default()) }.unwrap();
    assert!(small.as_slice().iter().all(|&byte| byte == 0x5c));
    // SAFETY: the second mapping is refused before it is made.
    let fd = unsafe { small.fd() }.try_clone_to_owned().unwrap();
    // SAFETY: refused before anything is mapped.
    let error =
        unsafe { SharedHostBuf::<u8>::from_fd(&device, fd, 4096 * 3, Default::default()) }.unwrap_err();
    let text = error.to_string();
    assert!(text.contains("memfd:hetmem-shared") && text.contains("holds 4096 bytes"), "{text}");
    // A shared buffer's message is not a ring's.
    let error = RingConsumer::connect(&device, &peer.socket, Default::default()).unwrap_err();
    assert!(error.to_string().contains("not a RingProducer"), "{error}");
    peer.passed();
}

/// On `device`, in two processes: the first writes fresh words and sends the buffer; the
/// second's device reads them in place (y = 3x + 1 into its own pinned output, compared with
/// the CPU), then it writes new words, which the first's device reads in place in turn.
fn gpu_reads_in_place(device: &Device, socket: &UnixStream, seed: u64, creator: bool) {
    const WORDS: usize = 1 << 18;
    let words = |round: u64| -> Vec<u32> {
        let mut rng = fastrand::Rng::with_seed(seed ^ round);
        (0..WORDS).map(|_| rng.u32(..)).collect()
    };
    let read_in_place = |buf: SharedHostBuf<u32>, expected: &[u32]| -> SharedHostBuf<u32> {
        assert!(buf.as_slice() == expected, "the CPU sees the other process's words");
        let queue = Queue::new(device).unwrap();
        let mut output = HostBuf::<u32>::pinned(device, WORDS, PinOptions::default()).unwrap();
        output.as_mut_slice().fill(crate::support::POISON);
        let input = queue.share(buf);
        let mut output = queue.lend(output);
        hetmem::ops::affine_u32(&queue, &input, &mut output, 3, 1).unwrap();
        let output = output.reclaim().unwrap();
        let mut reference = vec![0u32; WORDS];
        hetmem::ops::affine_u32_cpu(expected, &mut reference, 3, 1);
        assert!(crate::support::first_mismatch(output.as_slice(), &reference).is_none(), "GPU read differs");
        input.reclaim().unwrap()
    };
    let mut byte = [0u8; 1];
    if creator {
        let mut buf = SharedHostBuf::<u32>::create(device, WORDS, SharedOptions::default()).unwrap();
        assert_eq!(buf.is_mapped(), device.gpu_ordinal().is_some());
        buf.as_mut_slice().copy_from_slice(&words(1));
        // SAFETY: the processes take turns, ordered by the socket's messages.
        unsafe { buf.send(socket) }.unwrap();
        // The other process reads round 1, then writes round 2 and says so.
        std::io::Read::read_exact(&mut &*socket, &mut byte).unwrap();
        read_in_place(buf, &words(2));
    } else {
        // SAFETY: the processes take turns, ordered by the socket's messages.
        let buf = unsafe { SharedHostBuf::<u32>::receive(device, socket, Default::default()) }.unwrap();
        let mut buf = read_in_place(buf, &words(1));
        buf.as_mut_slice().copy_from_slice(&words(2));
        std::io::Write::write_all(&mut &*socket, &[2]).unwrap();
    }
}

fn device_of(backend: &str) -> Device {
    match backend {
        "cuda" => Device::Cuda(hetmem::backend::cuda::CudaDevice::open(0).unwrap()),
        _ => cpu_device(),
    }
}

#[test]
fn a_device_reads_in_place_what_another_process_wrote_to_shared_memory() {
    const TEST: &str = "a_device_reads_in_place_what_another_process_wrote_to_shared_memory";
    if child_role().as_deref() == Some("reader") {
        let backend = std::env::var(BACKEND_ENV).unwrap();
        return gpu_reads_in_place(&device_of(&backend), &child_socket(), env_u64(SEED_ENV), false);
    }
    let mut backends = vec!["cpu"];
    if hetmem::testing::cuda_device_or_skip(TEST).is_some() {
        backends.push("cuda");
    }
    for backend in backends {
        let seed = fresh_seed();
        let mut peer =
            Peer::start(TEST, "reader", &[(SEED_ENV, seed.to_string()), (BACKEND_ENV, backend.to_string())]);
        gpu_reads_in_place(&device_of(backend), &peer.socket, seed, true);
        peer.passed();
    }
}

/// The socket-pair end a child was given, by its descriptor number.
const PAIR_FD_ENV: &str = "HETMEM_TEST_PAIR_FD";

/// A ring over a `socketpair` this process made and handed one end of to its child (as a
/// trainer does for each worker): the socket's credentials name this process for both ends,
/// so the ring watches the pid its peer wrote in the header. The child's `SIGKILL` is then
/// noticed although its end of the socket stays open here (as in a child of its that kept
/// it): before, the ring watched its own pid and waited for good.
#[test]
fn a_producer_on_a_socket_pair_is_watched_by_its_own_pid() {
    const TEST: &str = "a_producer_on_a_socket_pair_is_watched_by_its_own_pid";
    if child_role().as_deref() == Some("pair-producer") {
        let _harness = child_socket();
        let fd: i32 = std::env::var(PAIR_FD_ENV).unwrap().parse().unwrap();
        // SAFETY: the parent left this descriptor open across exec for this process alone.
        let socket = unsafe { <UnixStream as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let mut ring = RingProducer::create(&cpu_device(), &socket, 4096, 2, Default::default()).unwrap();
        let mut slot = ring.next_slot().unwrap();
        slot.fill(0x5a);
        slot.publish();
        say("published");
        std::thread::sleep(Duration::from_secs(120));
        unreachable!("killed by the parent before this");
    }
    let (mine, theirs) = UnixStream::pair().unwrap();
    // Inherited by the child (exec keeps it), and kept open here too.
    rustix::io::fcntl_setfd(&theirs, rustix::io::FdFlags::empty()).unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&theirs);
    let mut peer = Peer::start(TEST, "pair-producer", &[(PAIR_FD_ENV, fd.to_string())]);
    let mut ring = RingConsumer::connect(&cpu_device(), &mine, Default::default()).unwrap();
    assert_eq!(ring.producer_pid(), peer.pid(), "the child's pid, not this process's");
    let frame = ring.next_frame().unwrap().unwrap();
    assert_eq!(frame.to_vec(), vec![0x5a; 4096]);
    drop(frame);
    peer.expect_line("published");
    let killed = peer.kill();
    let outcome = ring.next_frame_within(Some(Duration::from_secs(20)));
    let waited = killed.elapsed();
    let error = outcome.expect_err("the killed producer is noticed, not waited for");
    assert!(matches!(error, Error::PeerGone { role: "producer", .. }), "{error}");
    assert!(waited < Duration::from_secs(10), "noticed after {waited:?}");
    peer.reap_killed();
    drop(theirs);
}
