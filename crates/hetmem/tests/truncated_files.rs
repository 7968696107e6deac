//! Files truncated under hetmem's mappings (the CPU backend, where hetmem's own loops read
//! them): each case was a SIGBUS that killed the process, and is an `Error::FileTruncated`
//! naming the file now; a fault outside hetmem's loops still ends the process, as before.

use std::path::{Path, PathBuf};

use hetmem::data::{FilePieceData, FileRange, FileStream, LoadMethod, StreamOptions};
use hetmem::memory::WindowedFile;
use hetmem::ops::checksum;
use hetmem::{DeviceBuf, Error, MappedFile, Queue};

use crate::support::{child_role, cpu_device, on_every_backend, run_child};

const PAGE: usize = 4096;

fn file_of(dir: &Path, name: &str, len: usize) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, (0..len).map(|i| (i % 251) as u8 + 1).collect::<Vec<u8>>()).unwrap();
    path
}

fn shrink(path: &Path, len: u64) {
    std::fs::OpenOptions::new().write(true).open(path).unwrap().set_len(len).unwrap();
}

/// The error is the truncation one, names the file and says what to do.
fn assert_truncated(error: &Error, path: &Path) {
    let text = error.to_string();
    assert!(matches!(error, Error::FileTruncated { .. }), "{error:?}");
    assert!(text.contains(&path.display().to_string()), "{text}");
    assert!(text.contains("remedy") && text.contains("rename"), "{text}");
}

#[test]
fn a_copy_out_of_a_window_of_a_shrunk_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = file_of(dir.path(), "shrinks.bin", 8 * PAGE);
    let device = cpu_device();
    let queue = Queue::new(&device).unwrap();
    // SAFETY: the test breaks the contract on purpose, to check hetmem's copy survives it.
    let file = unsafe { WindowedFile::open(&device, &path) }.unwrap();
    let window = queue.share(file.window::<u8>(PAGE as u64..8 * PAGE as u64).unwrap());
    shrink(&path, 2 * PAGE as u64);
    let mut dst = queue.lend(DeviceBuf::<u8>::new(&device, 7 * PAGE).unwrap());
    let error = queue.copy(&window, &mut dst).unwrap_err();
    assert_truncated(&error, &path);
    assert!(error.to_string().contains("the file is 8192 bytes now"), "{error}");
    // A window over bytes the file no longer holds is refused before it is mapped.
    let error = file.window::<u8>(0..3 * PAGE as u64).unwrap_err();
    assert_truncated(&error, &path);
    // What the file still holds reads as before.
    let head = queue.share(file.window::<u8>(0..2 * PAGE as u64).unwrap());
    let mut dst = queue.lend(DeviceBuf::<u8>::new(&device, 2 * PAGE).unwrap());
    queue.copy(&head, &mut dst).unwrap();
    assert_eq!(dst.reclaim().unwrap().to_vec().unwrap()[4095], (4095 % 251) as u8 + 1);
}

#[test]
fn a_fault_while_reading_a_window_is_recovered_and_the_window_stays_faulted() {
    let dir = tempfile::tempdir().unwrap();
    let path = file_of(dir.path(), "races.bin", 16 * PAGE);
    // SAFETY: as above.
    let file = unsafe { WindowedFile::open(&cpu_device(), &path) }.unwrap();
    let window = file.window::<u8>(0..16 * PAGE as u64).unwrap();
    // The truncation lands after the size check, inside the guarded loop: the fault itself is
    // what is recovered.
    let error = window
        .guard_truncation(|| {
            shrink(&path, PAGE as u64);
            window.as_slice().iter().map(|&byte| u64::from(byte)).sum::<u64>()
        })
        .unwrap_err();
    assert_truncated(&error, &path);
    assert!(error.to_string().contains("SIGBUS"), "{error}");
    // Even with the file grown back, the window's pages past the old end hold zeros now.
    shrink(&path, 16 * PAGE as u64);
    let error = window.check_file().unwrap_err();
    assert!(error.to_string().contains("earlier access to this mapping faulted"), "{error}");
    assert!(file.window::<u8>(0..16 * PAGE as u64).unwrap().check_file().is_ok());
}

#[test]
fn a_copy_out_of_a_mapped_file_that_shrank_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = file_of(dir.path(), "mapped.bin", 4 * PAGE);
    let device = cpu_device();
    let queue = Queue::new(&device).unwrap();
    // SAFETY: as above.
    let mapped = queue.share(unsafe { MappedFile::<u8>::open(&device, &path) }.unwrap());
    shrink(&path, 100);
    let mut dst = queue.lend(DeviceBuf::<u8>::new(&device, 4 * PAGE).unwrap());
    assert_truncated(&queue.copy(&mapped, &mut dst).unwrap_err(), &path);
}

#[test]
fn flushing_a_read_write_window_of_a_shrunk_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = file_of(dir.path(), "written.bin", 4 * PAGE);
    // SAFETY: as above.
    let file = unsafe { WindowedFile::open_rw(&cpu_device(), &path) }.unwrap();
    let mut window = file.window_mut::<u8>(0..4 * PAGE as u64).unwrap();
    window.as_mut_slice()[..PAGE].fill(9);
    shrink(&path, PAGE as u64 + 1);
    assert_truncated(&window.flush().unwrap_err(), &path);
    // The bytes the file still holds were written.
    assert_eq!(std::fs::read(&path).unwrap()[..PAGE], vec![9u8; PAGE][..]);
}

#[test]
fn a_windows_load_of_a_file_truncated_part_way_fails_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let chunk = 16 * PAGE;
    let path = file_of(dir.path(), "load.bin", 6 * chunk);
    let device = cpu_device();
    let queue = Queue::new(&device).unwrap();
    let options =
        StreamOptions { method: LoadMethod::Windows, threads: 1, chunk_bytes: chunk, ring_depth: 1 };
    // SAFETY: as above.
    let mut stream = unsafe { FileStream::new(&device, &queue, options).unwrap().allow_windows() };
    let range = FileRange::whole(&path).unwrap();
    let mut sums = queue.lend(DeviceBuf::<u64>::new(&device, 2).unwrap());
    let mut pieces = 0;
    // The first piece's stage truncates the file below the second piece, then checksums the
    // piece it holds (still in the file); the second is refused before it is mapped.
    let error = stream
        .for_each_chunk(std::slice::from_ref(&range), &|_| {}, |piece| {
            pieces += 1;
            if piece.stream_offset == 0 {
                shrink(&path, chunk as u64 + 10);
            }
            let FilePieceData::Window { lease, offset } = piece.data else { panic!("a windows load") };
            checksum(&queue, lease, offset, piece.len, piece.source_offset, &mut sums, 0)
        })
        .unwrap_err();
    assert_truncated(&error, &path);
    assert_eq!(pieces, 1, "no piece past the truncation reaches the stage");
    // A piece truncated after it was mapped: its stage's CPU read is refused.
    shrink(&path, 6 * chunk as u64);
    let error = stream
        .for_each_chunk(std::slice::from_ref(&range), &|_| {}, |piece| {
            shrink(&path, 10);
            let FilePieceData::Window { lease, offset } = piece.data else { panic!("a windows load") };
            checksum(&queue, lease, offset, piece.len, piece.source_offset, &mut sums, 0)
        })
        .unwrap_err();
    assert_truncated(&error, &path);
    // Copied into device memory: the same.
    shrink(&path, 6 * chunk as u64);
    let truncate_once = std::sync::Once::new();
    let error = stream
        .load(std::slice::from_ref(&range), &|done| {
            if done >= chunk as u64 {
                truncate_once.call_once(|| shrink(&path, 2 * chunk as u64 - 1));
            }
        })
        .unwrap_err();
    assert_truncated(&error, &path);
}

/// On every backend (a GPU's copy engines read a registered window's pinned pages even after
/// the file dropped them): a file truncated between two pieces of a windows load, or after its
/// last piece was copied, fails the load naming the file.
#[test]
fn a_windows_load_of_a_file_truncated_between_pieces_or_at_the_end_fails_on_every_backend() {
    on_every_backend(
        "a_windows_load_of_a_file_truncated_between_pieces_or_at_the_end_fails_on_every_backend",
        |device| {
            let dir = tempfile::tempdir().unwrap();
            let chunk = 16 * PAGE;
            let path = file_of(dir.path(), "load.bin", 4 * chunk);
            let queue = Queue::new(device).unwrap();
            let options =
                StreamOptions { method: LoadMethod::Windows, threads: 1, chunk_bytes: chunk, ring_depth: 1 };
            // SAFETY: the test breaks the contract on purpose.
            let mut stream = unsafe { FileStream::new(device, &queue, options).unwrap().allow_windows() };
            let range = FileRange::whole(&path).unwrap();
            for (after, len) in [(chunk as u64, chunk as u64 + 1), (4 * chunk as u64, 3 * chunk as u64)] {
                std::fs::write(&path, (0..4 * chunk).map(|i| (i % 251) as u8 + 1).collect::<Vec<u8>>())
                    .unwrap();
                let once = std::sync::Once::new();
                let error = stream
                    .load(std::slice::from_ref(&range), &|done| {
                        if done >= after {
                            once.call_once(|| shrink(&path, len));
                        }
                    })
                    .unwrap_err();
                assert_truncated(&error, &path);
                assert!(error.to_string().contains(&format!("the file is {len} bytes now")), "{error}");
            }
        },
    );
}

/// A SIGBUS that is not inside one of hetmem's loops still ends the process: hetmem's handler
/// passes it on (here to the default action) rather than hiding it.
#[test]
fn a_fault_outside_hetmems_loops_still_ends_the_process() {
    const TEST: &str = "truncated_files::a_fault_outside_hetmems_loops_still_ends_the_process";
    if child_role().as_deref() == Some("fault") {
        // Before hetmem's: the action the test harness left (Rust's own, which passes on).
        fault_outside_after(None);
        return;
    }
    assert_died_of_sigbus(&run_child(TEST, "fault"));
}

/// How often the SIGBUS handler installed before hetmem's ran (in the child of the test below).
static PREVIOUS_CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A one-shot SA_SIGINFO handler: says it ran, and gives up (exit 3) if called twice, which a
/// chain that ignored SA_RESETHAND would do for ever.
extern "C" fn previous_handler(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let calls = PREVIOUS_CALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
    let message: &[u8] = if calls == 1 { b"previous handler ran\n" } else { b"previous handler ran again\n" };
    // SAFETY: write(2) and _exit(2) are async-signal-safe; the buffer is a static string.
    unsafe {
        libc::write(2, message.as_ptr().cast(), message.len());
        if calls > 1 {
            libc::_exit(3);
        }
    }
}

/// Runs in a child: installs `action` (if any) for SIGBUS before hetmem's handler, arms and
/// releases a range (installing hetmem's), then reads a truncated window outside hetmem's
/// loops.
fn fault_outside_after(action: Option<libc::sigaction>) {
    if let Some(action) = action {
        // SAFETY: a valid sigaction for SIGBUS, in a child process that dies of the fault
        // anyway.
        assert_eq!(unsafe { libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()) }, 0);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = file_of(dir.path(), "outside.bin", 4 * PAGE);
    // SAFETY: the child breaks the contract on purpose; its death is the result.
    let file = unsafe { WindowedFile::open(&cpu_device(), &path) }.unwrap();
    let window = file.window::<u8>(0..4 * PAGE as u64).unwrap();
    window.guard_truncation(|| window.as_slice()[0]).unwrap();
    shrink(&path, 10);
    let last = std::hint::black_box(window.as_slice())[4 * PAGE - 1];
    println!("read {last} past the end of the file");
}

fn assert_died_of_sigbus(output: &std::process::Output) {
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        output.status.signal(),
        Some(libc::SIGBUS),
        "{:?}\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A handler installed before hetmem's gets the faults hetmem does not recover, as the kernel
/// would have called it: once, since it asked for SA_RESETHAND, after which the fault ends the
/// process (a chain that ignored the flag called it for ever).
#[test]
fn a_handler_installed_before_hetmems_gets_the_faults_it_does_not_recover() {
    const TEST: &str =
        "truncated_files::a_handler_installed_before_hetmems_gets_the_faults_it_does_not_recover";
    if child_role().as_deref() == Some("chain") {
        // SAFETY: a zeroed sigaction is valid; the handler has the SA_SIGINFO signature.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = previous_handler as *const () as libc::sighandler_t;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_RESETHAND;
        fault_outside_after(Some(action));
        return;
    }
    let output = run_child(TEST, "chain");
    assert_died_of_sigbus(&output);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.matches("previous handler ran").count(), 1, "{stderr}");
}

/// An ignored SIGBUS from a fault ends the process, as the kernel makes it: returning would run
/// the faulting instruction again for ever.
#[test]
fn an_ignored_sigbus_from_a_fault_still_ends_the_process() {
    const TEST: &str = "truncated_files::an_ignored_sigbus_from_a_fault_still_ends_the_process";
    if child_role().as_deref() == Some("ignored") {
        // SAFETY: a zeroed sigaction is valid.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = libc::SIG_IGN;
        fault_outside_after(Some(action));
        return;
    }
    assert_died_of_sigbus(&run_child(TEST, "ignored"));
}
