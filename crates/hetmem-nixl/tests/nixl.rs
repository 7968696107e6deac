//! hetmem-nixl: host memory written into another agent's
//! and read back, in one process and between two, every byte checked; a transfer refused before
//! it starts hands its buffer back unchanged; bad metadata and memory NIXL cannot take are
//! refused with the call named. Skips where NIXL's library is not on the loader path, and
//! fails there with `HETMEM_REQUIRE_NIXL=1` (CI sets it).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hetmem::{BackendChoice, BackendKind, Device, DeviceBuf, Error, HostBuf, PinOptions};
use hetmem_nixl::{self as nixl, Agent, RemoteRegion};

fn cpu_device() -> Device {
    Device::open(BackendChoice::Only(BackendKind::Cpu)).unwrap()
}

/// The first index where `got` and `want` differ, with both bytes.
fn first_mismatch(got: &[u8], want: &[u8]) -> Option<(usize, u8, u8)> {
    assert_eq!(got.len(), want.len(), "lengths");
    got.iter().zip(want).position(|(g, w)| g != w).map(|i| (i, got[i], want[i]))
}

/// The environment variable that tells a re-run of this test binary which role to play.
const CHILD_ENV: &str = "HETMEM_NIXL_TEST_CHILD";

fn child_role() -> Option<String> {
    std::env::var(CHILD_ENV).ok()
}

/// Re-runs this test binary for the single test `test` as `role`.
fn run_child(test: &str, role: &str) -> std::process::Output {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, role)
        .output()
        .unwrap()
}

const WAIT: Duration = Duration::from_secs(30);

/// Whether NIXL is there; skips visibly, or fails where it is required.
fn nixl_or_skip(test: &str) -> bool {
    if nixl::available() {
        return true;
    }
    assert!(
        std::env::var("HETMEM_REQUIRE_NIXL").as_deref() != Ok("1"),
        "{test}: HETMEM_REQUIRE_NIXL=1 but NIXL's library is not on the loader path"
    );
    eprintln!("{test}: skipped: NIXL's libnixl_capi.so not found (LD_LIBRARY_PATH)");
    false
}

fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..len).map(|_| rng.u8(..)).collect()
}

fn host(bytes: &[u8]) -> HostBuf<u8> {
    let mut buf = HostBuf::pinned(&cpu_device(), bytes.len(), PinOptions::default()).unwrap();
    buf.as_mut_slice().copy_from_slice(bytes);
    buf
}

#[test]
fn host_memory_is_written_to_another_agent_and_read_back() {
    if !nixl_or_skip("host_memory_is_written_to_another_agent_and_read_back") {
        return;
    }
    let seed = fastrand::u64(..);
    let len = (1 << 20) + 13;
    let data = random_bytes(seed, len);
    let ours = Agent::new("hetmem-test-initiator").unwrap();
    let theirs = Agent::new("hetmem-test-target").unwrap();
    let target = theirs.register(host(&vec![0xA5; len])).unwrap();
    let peer = ours.add_peer(&theirs.metadata().unwrap()).unwrap();
    assert_eq!(peer, "hetmem-test-target");
    let region = RemoteRegion::from_bytes(&target.remote().to_bytes()).unwrap();

    let source = ours.register(host(&data)).unwrap();
    assert!(!source.is_exposed(), "registered after the metadata went out, its region not given");
    let mut write = ours.write(source, &region).unwrap();
    write.wait(WAIT).unwrap();
    let source = write.finish().unwrap();
    // SAFETY: the only agent that can reach `target` is `ours`, whose write has finished.
    let written = unsafe { target.memory() }.as_slice();
    assert_eq!(first_mismatch(written, &data), None, "seed {seed:#x}: written");

    // Read it back into poisoned memory, from an offset of the peer's region.
    let back = ours.register(host(&vec![0x5A; len - 100])).unwrap();
    let mut read = ours.read(&region.range(100, (len - 100) as u64).unwrap(), back).unwrap();
    read.wait(WAIT).unwrap();
    let back = read.finish().unwrap();
    // SAFETY: `ours`' metadata never went out: no other agent can reach `back`.
    let got = unsafe { back.memory() }.as_slice();
    assert_eq!(first_mismatch(got, &data[100..]), None, "seed {seed:#x}: read back");
    // Neither of ours was ever reachable by a peer: handed back on drop. The target was.
    assert!(!source.is_exposed() && !back.is_exposed() && target.is_exposed());
    // SAFETY: `ours` has finished with the target and no other agent holds its region.
    let target = unsafe { target.into_inner() };
    assert_eq!(target.len(), len);
    drop((source, back));
}

/// Metadata handed out makes every buffer registered by then reachable by peers (leaked when
/// dropped); a buffer registered later is not, until its region or newer metadata goes out.
#[test]
fn metadata_and_regions_handed_out_mark_buffers_reachable() {
    if !nixl_or_skip("metadata_and_regions_handed_out_mark_buffers_reachable") {
        return;
    }
    let agent = Agent::new("hetmem-test-exposure").unwrap();
    let early = agent.register(host(&[1; 4096])).unwrap();
    agent.metadata().unwrap();
    let late = agent.register(host(&[2; 4096])).unwrap();
    assert!(early.is_exposed() && !late.is_exposed());
    let _region = late.remote();
    assert!(late.is_exposed());
    let quiet = agent.register(host(&[3; 4096])).unwrap();
    // SAFETY: never reachable by a peer: no metadata or region of it went out.
    let back = unsafe { quiet.into_inner() };
    assert_eq!(back.as_slice(), &[3; 4096]);
}

#[test]
fn a_region_of_the_agent_itself_is_refused() {
    if !nixl_or_skip("a_region_of_the_agent_itself_is_refused") {
        return;
    }
    let agent = Agent::new("hetmem-test-loopback").unwrap();
    let target = agent.register(host(&[0; 4096])).unwrap();
    let source = agent.register(host(&random_bytes(3, 4096))).unwrap();
    let refused = agent.write(source, &target.remote()).unwrap_err();
    match &refused.error {
        Error::InvalidArgument { problem, .. } => assert!(problem.contains("this agent itself"), "{problem}"),
        other => panic!("expected the loopback refused, got {other:?}"),
    }
}

#[test]
fn a_transfer_refused_before_it_starts_hands_its_buffer_back() {
    if !nixl_or_skip("a_transfer_refused_before_it_starts_hands_its_buffer_back") {
        return;
    }
    let ours = Agent::new("hetmem-test-refusing").unwrap();
    let theirs = Agent::new("hetmem-test-short").unwrap();
    let target = theirs.register(host(&[0; 4096])).unwrap();
    ours.add_peer(&theirs.metadata().unwrap()).unwrap();
    let data = random_bytes(7, 8192);
    let source = ours.register(host(&data)).unwrap();
    // The peer's region is shorter than the source.
    let refused = ours.write(source, &target.remote()).unwrap_err();
    assert!(matches!(refused.error, Error::InvalidArgument { .. }), "{:?}", refused.error);
    // SAFETY: `ours`' metadata never went out: no other agent can reach the source.
    assert_eq!(unsafe { refused.memory.memory() }.as_slice(), data.as_slice());
    // A region of an agent never added: NIXL refuses the request, naming the call.
    let stranger = RemoteRegion::from_bytes(
        &Agent::new("hetmem-test-stranger").unwrap().register(host(&[0; 8192])).unwrap().remote().to_bytes(),
    )
    .unwrap();
    let refused = ours.write(refused.memory, &stranger).unwrap_err();
    match &refused.error {
        Error::Nixl { call, .. } => assert_eq!(*call, "createXferReq"),
        other => panic!("expected NIXL's createXferReq refused, got {other:?}"),
    }
    // SAFETY: as above.
    assert_eq!(unsafe { refused.memory.memory() }.as_slice(), data.as_slice());
}

#[test]
fn bad_metadata_and_memory_nixl_cannot_take_are_refused() {
    if !nixl_or_skip("bad_metadata_and_memory_nixl_cannot_take_are_refused") {
        return;
    }
    let agent = Agent::new("hetmem-test-bad-input").unwrap();
    match agent.add_peer(b"not metadata") {
        Err(Error::Nixl { call, remedy, .. }) => {
            assert_eq!(call, "loadRemoteMD");
            assert!(remedy.contains("unchanged"), "{remedy}");
        }
        other => panic!("expected the metadata refused, got {other:?}"),
    }
    let device = DeviceBuf::<u8>::new(&cpu_device(), 64).unwrap();
    assert!(matches!(agent.register(device), Err(Error::InvalidArgument { .. })));
    for name in ["", "a\0b"] {
        assert!(matches!(Agent::new(name), Err(Error::InvalidArgument { .. })), "{name:?}");
    }
}

/// The two processes' hand-shake: files in one folder, each written whole then renamed.
fn put(dir: &Path, name: &str, bytes: &[u8]) {
    let part = dir.join(format!("{name}.part"));
    std::fs::write(&part, bytes).unwrap();
    std::fs::rename(part, dir.join(name)).unwrap();
}

fn take(dir: &Path, name: &str) -> Vec<u8> {
    let start = Instant::now();
    loop {
        if let Ok(bytes) = std::fs::read(dir.join(name)) {
            return bytes;
        }
        assert!(start.elapsed() < WAIT, "no {name} from the other process within {WAIT:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

const SIZES: [usize; 2] = [1 << 20, (16 << 20) + 7];

/// The target process: registers a poisoned buffer per size, publishes its agent and regions,
/// and checks each buffer holds the seed's bytes once the initiator says it wrote them.
fn target_process(dir: &Path) {
    let agent = Agent::new("hetmem-test-process-target").unwrap();
    let targets: Vec<_> = SIZES.iter().map(|&len| agent.register(host(&vec![0xA5; len])).unwrap()).collect();
    for (index, target) in targets.iter().enumerate() {
        put(dir, &format!("region-{index}"), &target.remote().to_bytes());
    }
    put(dir, "metadata", &agent.metadata().unwrap());
    let seed = u64::from_le_bytes(take(dir, "written").try_into().unwrap());
    for (index, target) in targets.iter().enumerate() {
        let want = random_bytes(seed + index as u64, SIZES[index]);
        // SAFETY: the one peer said its writes are done ("written") and writes no more.
        let got = unsafe { target.memory() }.as_slice();
        assert_eq!(first_mismatch(got, &want), None, "size {}", SIZES[index]);
    }
}

#[test]
fn host_memory_is_written_into_another_process() {
    if let Some(dir) = child_role().and_then(|role| role.strip_prefix("nixl-target:").map(PathBuf::from)) {
        return target_process(&dir);
    }
    if !nixl_or_skip("host_memory_is_written_into_another_process") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("hetmem-nixl-{}-{}", std::process::id(), fastrand::u32(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let role = format!("nixl-target:{}", dir.display());
    let child = std::thread::spawn(move || run_child("host_memory_is_written_into_another_process", &role));
    let agent = Agent::new("hetmem-test-process-initiator").unwrap();
    let peer = agent.add_peer(&take(&dir, "metadata")).unwrap();
    let seed = fastrand::u64(..u64::MAX / 2);
    for (index, &len) in SIZES.iter().enumerate() {
        let region = RemoteRegion::from_bytes(&take(&dir, &format!("region-{index}"))).unwrap();
        assert_eq!((region.agent(), region.len()), (peer.as_str(), len as u64));
        let source = agent.register(host(&random_bytes(seed + index as u64, len))).unwrap();
        let mut write = agent.write(source, &region).unwrap();
        write.wait(WAIT).unwrap();
        drop(write.finish().unwrap());
    }
    put(&dir, "written", &seed.to_le_bytes());
    end_child(child, &dir, "the target process", seed);
}

/// Waits for the target process, removes the hand-shake folder, and fails with the child's
/// output unless it passed.
fn end_child(child: std::thread::JoinHandle<std::process::Output>, dir: &Path, what: &str, seed: u64) {
    let output = child.join().unwrap();
    let _ = std::fs::remove_dir_all(dir);
    assert!(
        output.status.success(),
        "{what} failed ({}), seed {seed:#x}:\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A GPU's device memory (`VRAM_SEG`) in the target process, written from the initiator's host
/// memory and read back, every byte checked on both sides. Skips without a GPU (fails with
/// `HETMEM_REQUIRE_GPU=1`).
fn device_target_process(dir: &Path) {
    let device = Device::open_best().unwrap();
    let agent = Agent::new("hetmem-test-device-target").unwrap();
    let len = SIZES[1];
    let mut memory = DeviceBuf::<u8>::new(&device, len).unwrap();
    memory.copy_from_slice(&vec![0xA5; len]).unwrap();
    let target = agent.register(memory).unwrap();
    put(dir, "region", &target.remote().to_bytes());
    put(dir, "metadata", &agent.metadata().unwrap());
    let seed = u64::from_le_bytes(take(dir, "written").try_into().unwrap());
    let mut got = vec![0u8; len];
    // SAFETY: the one peer said its write is done and only reads from here on; a copy out
    // reads the device memory, as the peer's read does.
    unsafe { target.memory() }.copy_to_slice(&mut got).unwrap();
    assert_eq!(first_mismatch(&got, &random_bytes(seed, len)), None, "device memory after the write");
    put(dir, "checked", b"ok");
    take(dir, "read");
}

#[test]
fn host_memory_is_written_into_another_process_device_memory_and_read_back() {
    let test = "host_memory_is_written_into_another_process_device_memory_and_read_back";
    if let Some(dir) = child_role().and_then(|role| role.strip_prefix("nixl-device:").map(PathBuf::from)) {
        return device_target_process(&dir);
    }
    if !nixl_or_skip(test) {
        return;
    }
    let gpu = Device::open_best().unwrap();
    if gpu.gpu_ordinal().is_none() {
        assert!(std::env::var("HETMEM_REQUIRE_GPU").as_deref() != Ok("1"), "{test}: no GPU");
        eprintln!("{test}: skipped: no GPU");
        return;
    }
    let dir =
        std::env::temp_dir().join(format!("hetmem-nixl-device-{}-{}", std::process::id(), fastrand::u32(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let role = format!("nixl-device:{}", dir.display());
    let child = std::thread::spawn(move || run_child(test, &role));
    let agent = Agent::new("hetmem-test-device-initiator").unwrap();
    agent.add_peer(&take(&dir, "metadata")).unwrap();
    let region = RemoteRegion::from_bytes(&take(&dir, "region")).unwrap();
    assert_eq!(region.kind(), nixl::RegionKind::Device);
    let seed = fastrand::u64(..);
    let data = random_bytes(seed, SIZES[1]);
    let mut write = agent.write(agent.register(host(&data)).unwrap(), &region).unwrap();
    write.wait(WAIT).unwrap();
    drop(write.finish().unwrap());
    put(&dir, "written", &seed.to_le_bytes());
    take(&dir, "checked");
    let mut read = agent.read(&region, agent.register(host(&vec![0x5A; SIZES[1]])).unwrap()).unwrap();
    read.wait(WAIT).unwrap();
    let back = read.finish().unwrap();
    // SAFETY: this agent's metadata never went out: no other agent can reach `back`.
    assert_eq!(first_mismatch(unsafe { back.memory() }.as_slice(), &data), None, "read back, seed {seed:#x}");
    put(&dir, "read", b"ok");
    end_child(child, &dir, "the device target", seed);
}
