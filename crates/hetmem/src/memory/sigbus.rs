//! SIGBUS inside hetmem's own CPU loops over file mappings, recovered instead of killing the
//! process.
//!
//! A CPU access to a page of a file mapping that lies past the file's end (the file was
//! truncated while mapped) raises SIGBUS with code `BUS_ADRERR`, whose default action ends the
//! process; so does a page the storage failed to read. While one of hetmem's loops reads or
//! writes a mapping, it arms the mapping's range ([`arm`]). A `BUS_ADRERR` at an address inside
//! an armed range is recovered: the fault is recorded in every armed range the recovery touches,
//! then anonymous zero pages (with the range's protection: a read-only mapping stays read-only)
//! are mapped over the range from the faulting page to the range's end, and the instruction
//! runs again on the zeros. The loop finishes, and its caller turns the recorded fault into an
//! error (see `truncation`). Every other SIGBUS (another code, an address outside every armed
//! range, a signal sent by a process) goes to the action installed before hetmem's, or to the
//! default action, as if hetmem's handler were not there; an ignored SIGBUS from a fault ends
//! the process, as the kernel does for one that is not handled.
//!
//! Ranges are armed for the process, not for a thread, since an operation's CPU path may run
//! its loop on rayon's threads. So while one of hetmem's loops runs over a window, a fault on
//! that window from another thread (the caller's own code reading `as_slice`) is recovered
//! too: that code reads zeros where the file ended, and the loop reports the fault.
//!
//! Consistency between the handler and the threads that arm and disarm ranges: each slot's
//! range is published under a sequence number (odd while it is not armed), so the handler never
//! acts on a half-written range; the handler counts itself as a user of every armed slot while
//! it works, and disarming waits until no handler uses the slot before it reads whether the
//! range faulted, so a fault recovered while the loop ends is not lost and no zeros are mapped
//! over memory whose range was released (and perhaps unmapped) meanwhile. A child made by
//! `fork` starts with every slot free (only the forking thread lives there; ranges armed by the
//! parent's other threads are not the child's): the table is reset by a `pthread_atfork` child
//! handler.
//!
//! No program counter is rewritten, so nothing here depends on the architecture. The handler
//! touches only atomics and its own stack, makes only system calls (`mmap`, `sigaction`,
//! `raise`), and saves and restores `errno`.
//!
//! Limits. The recovery replaces the CPU's view of the pages: GPU work reading a registered
//! window through its device address still reads the pages that were page-locked when the
//! window was registered (the stale contents, not zeros), and the fault is reported only by
//! the CPU loop that met it. Python's `faulthandler`, enabled after hetmem installed its
//! handler (at the first guarded loop), takes SIGBUS first and ends the process with a
//! traceback; enabled before (as pytest does at start-up), it gets only the faults hetmem does
//! not recover. A program that replaces the SIGBUS action after hetmem's turns the recovery
//! off.
//!
//! Why this design: on 2 vCPUs of an AMD EPYC (a 1 GiB file mapping, warm, best of 7 runs),
//! an armed `memcpy` out of the mapping ran at 13.8-15.8 GB/s, as fast as the plain one
//! (13.7-15.2 GB/s); copying with `process_vm_readv` on the own process (which answers EFAULT
//! instead of raising SIGBUS) ran at 5.3-6.0 GB/s, and `pread` from the file at 5.7-6.0 GB/s.
//! Either of those would also need a bounce buffer for the loops that read a mapping in place
//! (checksums, the loader's gathers, every operation's CPU path).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering, compiler_fence};

use rustix::mm::{MapFlags, ProtFlags};

/// One armed range. The range (`start`, `end`, `writable`) is written only by the thread that
/// took the slot, while `seq` is odd; the handler reads it only while `seq` is even and the
/// same before and after.
#[derive(Debug)]
struct Slot {
    /// Taken by an [`Armed`].
    taken: AtomicBool,
    /// Even while the range is armed; odd while the slot is free or being armed or disarmed.
    seq: AtomicUsize,
    start: AtomicUsize,
    end: AtomicUsize,
    /// Whether the mapping may be written (the zero pages get the same protection).
    writable: AtomicBool,
    /// Whether a fault was recovered in the range since it was armed.
    faulted: AtomicBool,
    /// Handlers working with the range now: disarming waits for none.
    users: AtomicUsize,
}

/// Ranges armed at once, across all threads: hetmem arms at most two per loop (a copy's source
/// and destination), one loop per thread. When every slot is taken, a loop runs unarmed, with
/// the file's size checked before it (a truncation during it then ends the process).
const SLOTS: usize = 256;

static TABLE: [Slot; SLOTS] = [const {
    Slot {
        taken: AtomicBool::new(false),
        seq: AtomicUsize::new(1),
        start: AtomicUsize::new(0),
        end: AtomicUsize::new(0),
        writable: AtomicBool::new(false),
        faulted: AtomicBool::new(false),
        users: AtomicUsize::new(0),
    }
}; SLOTS];

/// Counts `fork`s (in the children): a range armed before a fork is not released by the child,
/// whose table starts empty.
static GENERATION: AtomicUsize = AtomicUsize::new(0);

/// The page size, read once when the handler is installed (the handler calls nothing that
/// might not be async-signal-safe).
static PAGE: AtomicUsize = AtomicUsize::new(4096);

/// The SIGBUS action in place before hetmem's, which gets every fault hetmem does not recover.
/// Set before hetmem's handler is installed, so the handler always finds it.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// Whether installing the handler failed (then loops run unarmed, their files checked first).
static INSTALL_FAILED: AtomicBool = AtomicBool::new(false);

/// A range armed by [`arm`]: disarmed by [`Armed::finish`] or when dropped (on a panic, say),
/// which records a recovered fault in the mapping's own flag too.
#[derive(Debug)]
pub(crate) struct Armed<'a> {
    slot: Option<&'static Slot>,
    /// [`GENERATION`] when armed: a child of `fork` leaves the parent's slots alone.
    generation: usize,
    /// The mapping's record of a fault, which outlives the loop (`truncation::FileSpan`).
    mapping_faulted: &'a AtomicBool,
}

/// Arms `len` bytes from `start`, which lie in one file mapping (`writable` when it may be
/// written), until [`Armed::finish`] or the drop: a `BUS_ADRERR` at an address inside them is
/// recovered (see the module's documentation) and recorded in `mapping_faulted` too.
/// Where the handler cannot be installed or every slot is taken, nothing is armed
/// ([`Armed::is_armed`]), and a fault ends the process as it would without hetmem; both are
/// logged.
pub(crate) fn arm(start: *const u8, len: usize, writable: bool, mapping_faulted: &AtomicBool) -> Armed<'_> {
    let generation = GENERATION.load(Ordering::Acquire);
    let unarmed = Armed { slot: None, generation, mapping_faulted };
    if !install() {
        return unarmed;
    }
    let Some(slot) = TABLE
        .iter()
        .find(|slot| slot.taken.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok())
    else {
        static WARNED: AtomicBool = AtomicBool::new(false);
        if !WARNED.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "all {SLOTS} SIGBUS recovery slots are in use: file mappings are read with their \
                 file's size checked first, but a truncation during the read ends the process"
            );
        }
        return unarmed;
    };
    // The slot is ours and its sequence odd: no handler reads the fields now.
    slot.start.store(start as usize, Ordering::Relaxed);
    slot.end.store((start as usize).saturating_add(len), Ordering::Relaxed);
    slot.writable.store(writable, Ordering::Relaxed);
    slot.faulted.store(false, Ordering::Relaxed);
    // Even: armed. SeqCst orders it against the handlers' user counts (see `disarm`).
    slot.seq.fetch_add(1, Ordering::SeqCst);
    // The loop's accesses come after the range is armed, as a handler on this thread sees.
    compiler_fence(Ordering::SeqCst);
    Armed { slot: Some(slot), generation, mapping_faulted }
}

impl Armed<'_> {
    /// Whether a range is armed (false where the handler is missing or every slot was taken).
    pub(crate) fn is_armed(&self) -> bool {
        self.slot.is_some()
    }

    /// Disarms the range; whether a fault inside it was recovered while it was armed (its
    /// pages from the faulting one on then hold zeros, not the file).
    pub(crate) fn finish(mut self) -> bool {
        self.disarm()
    }

    fn disarm(&mut self) -> bool {
        compiler_fence(Ordering::SeqCst);
        let Some(slot) = self.slot.take() else { return false };
        if GENERATION.load(Ordering::Acquire) != self.generation {
            // Armed in the parent before a fork: the child's table was reset without it.
            return false;
        }
        // Odd: handlers that start now pass the slot by. One that counted itself as a user
        // before this (SeqCst: its count comes first, or it sees the odd sequence) may still
        // record a fault or map zeros: wait for it.
        slot.seq.fetch_add(1, Ordering::SeqCst);
        while slot.users.load(Ordering::SeqCst) != 0 {
            std::hint::spin_loop();
        }
        let faulted = slot.faulted.load(Ordering::Acquire);
        if faulted {
            self.mapping_faulted.store(true, Ordering::Release);
        }
        slot.taken.store(false, Ordering::Release);
        faulted
    }
}

impl Drop for Armed<'_> {
    fn drop(&mut self) {
        self.disarm();
    }
}

/// Installs the handler once; false if it could not be.
fn install() -> bool {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        PAGE.store(super::page_size(), Ordering::Relaxed);
        // SAFETY: a zeroed sigaction is a valid value of the C struct (no handler, no flags,
        // an empty mask).
        let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: a null new action only reads the current one into `previous`, a valid
        // sigaction to write.
        let read = unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut previous) } == 0;
        // The previous action is known before hetmem's handler can run. (Another thread
        // installing its own SIGBUS action between these two calls would be replaced
        // unrecorded; hetmem installs once, at its first guarded loop.)
        if read {
            let _ = PREVIOUS.set(previous);
        }
        // SAFETY: a `pthread_atfork` child handler that only stores atomics (async-signal-safe,
        // as a child of a multi-threaded parent requires).
        let at_fork = unsafe { libc::pthread_atfork(None, None, Some(reset_after_fork)) } == 0;
        // SAFETY: as above, a zeroed sigaction is valid; the fields set below make it hetmem's.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: `action.sa_mask` is a valid sigset_t to empty; `on_sigbus` has the signature
        // SA_SIGINFO handlers take and is async-signal-safe (the module's documentation).
        let installed = read
            && at_fork
            && unsafe {
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()) == 0
            };
        if !installed {
            INSTALL_FAILED.store(true, Ordering::Relaxed);
            tracing::warn!(
                "cannot install a SIGBUS handler ({}): files are checked before hetmem reads their \
                 mappings, but one truncated during a read ends the process",
                std::io::Error::last_os_error()
            );
        }
    });
    !INSTALL_FAILED.load(Ordering::Relaxed)
}

/// In a child of `fork`: only the forking thread lives, so no range armed by another thread
/// of the parent will be disarmed; every slot starts free.
extern "C" fn reset_after_fork() {
    GENERATION.fetch_add(1, Ordering::AcqRel);
    for slot in &TABLE {
        if slot.seq.load(Ordering::Relaxed).is_multiple_of(2) {
            slot.seq.fetch_add(1, Ordering::Relaxed);
        }
        slot.users.store(0, Ordering::Relaxed);
        slot.taken.store(false, Ordering::Release);
    }
}

/// The handler: recovers a `BUS_ADRERR` inside an armed range, else passes the signal on.
extern "C" fn on_sigbus(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the calling thread's errno, read and restored so the interrupted code sees its own.
    let errno = unsafe { *libc::__errno_location() };
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let info_ref = unsafe { &*info };
    // BUS_ADRERR: a fault on a page the mapping's object cannot back (past a file's end, or a
    // read error). Not alignment faults, not hardware memory errors, not a signal sent by a
    // process (whose code is not positive).
    let recovered = info_ref.si_code == libc::BUS_ADRERR && {
        // SAFETY: a SIGBUS the kernel raised for a fault carries the faulting address.
        let address = unsafe { info_ref.si_addr() } as usize;
        recover(address)
    };
    if !recovered {
        pass_on(signal, info, context);
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// The slots a handler holds (counted as their user), as a bit set.
struct Held([u64; SLOTS / 64]);

impl Held {
    fn has(&self, index: usize) -> bool {
        self.0[index / 64] & (1 << (index % 64)) != 0
    }
}

/// The handler's view of one slot: counts itself as a user and reads the range, if the slot
/// is armed and its range stable while read; otherwise leaves it alone.
fn hold(slot: &Slot) -> Option<(usize, usize, bool)> {
    if !slot.taken.load(Ordering::Acquire) {
        return None;
    }
    slot.users.fetch_add(1, Ordering::SeqCst);
    let before = slot.seq.load(Ordering::SeqCst);
    let range = (
        slot.start.load(Ordering::Relaxed),
        slot.end.load(Ordering::Relaxed),
        slot.writable.load(Ordering::Relaxed),
    );
    // Even and unchanged: armed throughout, and (since this handler now counts as a user)
    // it cannot be disarmed, let alone re-armed, until the handler lets it go.
    if before.is_multiple_of(2) && slot.seq.load(Ordering::SeqCst) == before {
        Some(range)
    } else {
        slot.users.fetch_sub(1, Ordering::SeqCst);
        None
    }
}

/// If an armed range holds `address`: records the fault in every armed range overlapping the
/// pages from the one holding `address` to that range's end, maps zeros over those pages, and
/// answers true.
///
/// It runs on the signal stack (often the few KiB of `sigaltstack`), so it keeps no copy of
/// the table: a held slot's range cannot change until it is let go, and is read again.
fn recover(address: usize) -> bool {
    let mut held = Held([0; SLOTS / 64]);
    // The armed range holding the address that reaches furthest: every such range lies in the
    // one mapping that holds the address.
    let mut target: Option<(usize, bool)> = None;
    for (index, slot) in TABLE.iter().enumerate() {
        if let Some((start, end, writable)) = hold(slot) {
            held.0[index / 64] |= 1 << (index % 64);
            if (start..end).contains(&address) && target.is_none_or(|(furthest, _)| end > furthest) {
                target = Some((end, writable));
            }
        }
    }
    let mapped = target.is_some_and(|(end, writable)| {
        let page = PAGE.load(Ordering::Relaxed);
        let (from, to) = (address / page * page, end.next_multiple_of(page));
        // Recorded first: a loop that sees its zeros sees the fault (and the disarm waits for
        // this handler anyway).
        for (index, slot) in TABLE.iter().enumerate() {
            if held.has(index)
                && slot.start.load(Ordering::Relaxed) < to
                && from < slot.end.load(Ordering::Relaxed)
            {
                slot.faulted.store(true, Ordering::Release);
            }
        }
        let protection = if writable { ProtFlags::READ | ProtFlags::WRITE } else { ProtFlags::READ };
        // SAFETY: [from, to) lies in the mapping that holds `address`: the armed range holding
        // it lies in one file mapping (`arm`'s contract), which stays mapped while the range is
        // armed, and it is armed until this handler stops counting as its user; mappings cover
        // whole pages, up to the page holding their last byte. Those pages can no longer be
        // read (the file ends before them, or the storage failed); zeros with the mapping's
        // protection take their place until the mapping is unmapped, and every loop whose
        // range they overlap is told (above), so its caller discards what it made of them.
        let zeros = unsafe {
            rustix::mm::mmap_anonymous(
                from as *mut libc::c_void,
                to - from,
                protection,
                MapFlags::PRIVATE | MapFlags::FIXED,
            )
        };
        zeros.is_ok()
    });
    for (index, slot) in TABLE.iter().enumerate() {
        if held.has(index) {
            slot.users.fetch_sub(1, Ordering::SeqCst);
        }
    }
    mapped
}

/// Gives the signal to the action hetmem's replaced: its handler, or the default action (which
/// ends the process when the faulting instruction runs again, or at once for a signal sent).
fn pass_on(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the kernel's siginfo, as in `on_sigbus`.
    let from_fault = unsafe { (*info).si_code } > 0;
    let previous = PREVIOUS.get();
    match previous.map(|action| action.sa_sigaction) {
        // An ignored signal sent by a process stays ignored; an ignored fault would run the
        // instruction again forever, so it gets the default action, as the kernel gives it.
        Some(libc::SIG_IGN) if !from_fault => {}
        Some(handler) if handler != libc::SIG_DFL && handler != libc::SIG_IGN => {
            let flags = previous.map_or(0, |action| action.sa_flags);
            if flags & libc::SA_SIGINFO != 0 {
                // SAFETY: the previous action was installed with SA_SIGINFO, so its handler
                // takes these three arguments, which are the kernel's own.
                let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(handler) };
                handler(signal, info, context);
            } else {
                // SAFETY: without SA_SIGINFO a handler takes the signal number alone.
                let handler: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
                handler(signal);
            }
        }
        _ => {
            // SAFETY: a zeroed sigaction with SIG_DFL restores the default action. A signal
            // sent by a process is raised again (blocked until this handler returns, then
            // delivered); a fault recurs when the instruction runs again.
            unsafe {
                let mut default: libc::sigaction = std::mem::zeroed();
                default.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(signal, &default, std::ptr::null_mut());
                if !from_fault {
                    libc::raise(signal);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shrinking_map(pages: usize, byte: u8) -> (tempfile::TempDir, std::path::PathBuf, memmap2::Mmap) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shrinks.bin");
        let page = super::super::page_size();
        std::fs::write(&path, vec![byte; pages * page]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: the tests truncate the file only to check that armed reads survive it.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        (dir, path, map)
    }

    fn truncate(path: &std::path::Path, bytes: usize) {
        std::fs::OpenOptions::new().write(true).open(path).unwrap().set_len(bytes as u64).unwrap();
    }

    #[test]
    fn a_fault_inside_an_armed_range_is_recovered_and_reads_zeros() {
        let page = super::super::page_size();
        let (_dir, path, map) = shrinking_map(4, 7);
        truncate(&path, page + 10);
        let mapping_faulted = AtomicBool::new(false);
        let armed = arm(map.as_ptr(), map.len(), false, &mapping_faulted);
        assert!(armed.is_armed());
        let copy = map.to_vec();
        assert!(armed.finish());
        assert!(mapping_faulted.load(Ordering::Acquire), "the mapping keeps the record");
        assert_eq!(&copy[..page + 10], &vec![7u8; page + 10][..], "the bytes still in the file");
        assert!(copy[2 * page..].iter().all(|&byte| byte == 0), "the pages past the end read as zeros");
        let again = AtomicBool::new(false);
        let clean = arm(map.as_ptr(), map.len(), false, &again);
        assert_eq!(map[0], 7);
        assert!(!clean.finish());
    }

    /// An operation's CPU path may read on rayon's threads: a fault on another thread than
    /// the one that armed the range is recovered too, and recorded in every range it zeroed.
    #[test]
    fn a_fault_on_another_thread_is_recovered_and_recorded_in_every_overlapping_range() {
        let page = super::super::page_size();
        let (_dir, path, map) = shrinking_map(8, 5);
        let (whole_flag, tail_flag) = (AtomicBool::new(false), AtomicBool::new(false));
        let whole = arm(map.as_ptr(), map.len(), false, &whole_flag);
        // SAFETY: 6 pages in, within the mapping.
        let tail = arm(unsafe { map.as_ptr().add(6 * page) }, 2 * page, false, &tail_flag);
        truncate(&path, page);
        let sum: u64 = std::thread::scope(|scope| {
            scope.spawn(|| map[3 * page..].iter().map(|&byte| u64::from(byte)).sum()).join().unwrap()
        });
        assert_eq!(sum, 0, "the pages past the end read as zeros");
        assert!(whole.finish() && tail.finish());
    }

    /// The zero pages keep the mapping's protection: a read-only window does not become
    /// writable because its file shrank.
    #[test]
    fn the_zeros_over_a_read_only_mapping_stay_read_only() {
        let page = super::super::page_size();
        let (_dir, path, map) = shrinking_map(4, 3);
        truncate(&path, page);
        let flag = AtomicBool::new(false);
        let armed = arm(map.as_ptr(), map.len(), false, &flag);
        // SAFETY: within the mapping; a volatile read, so it happens while armed.
        let byte = unsafe { map.as_ptr().add(2 * page).read_volatile() };
        assert!(armed.finish());
        assert_eq!(byte, 0);
        // The zeros' protection, as /proc/self/maps lists it.
        let zeros = map.as_ptr() as usize + 2 * page;
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let line = maps
            .lines()
            .find(|line| {
                let (range, _) = line.split_once(' ').unwrap();
                let (from, to) = range.split_once('-').unwrap();
                let (from, to) =
                    (usize::from_str_radix(from, 16).unwrap(), usize::from_str_radix(to, 16).unwrap());
                (from..to).contains(&zeros)
            })
            .unwrap();
        assert!(line.split_whitespace().nth(1).unwrap().starts_with("r--"), "{line}");
    }

    /// A range disarmed by a panic records its fault in the mapping, so the next access is
    /// refused instead of reading zeros as data.
    #[test]
    fn a_panic_in_the_loop_still_records_the_fault_in_the_mapping() {
        let page = super::super::page_size();
        let (_dir, path, map) = shrinking_map(4, 9);
        truncate(&path, page);
        let flag = AtomicBool::new(false);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _armed = arm(map.as_ptr(), map.len(), false, &flag);
            // SAFETY: within the mapping.
            let byte = unsafe { map.as_ptr().add(3 * page).read_volatile() };
            panic!("the loop fails after reading {byte}");
        }));
        assert!(outcome.is_err());
        assert!(flag.load(Ordering::Acquire));
    }

    /// Arming and disarming on many threads while a fault is recovered: every slot comes back,
    /// and the fault is reported by the range that held it.
    #[test]
    fn slots_armed_and_disarmed_concurrently_all_come_back() {
        let page = super::super::page_size();
        let (_dir, path, map) = shrinking_map(4, 1);
        let churn = AtomicBool::new(true);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    let local = vec![2u8; page];
                    while churn.load(Ordering::Relaxed) {
                        let flag = AtomicBool::new(false);
                        let armed = arm(local.as_ptr(), local.len(), false, &flag);
                        assert!(!armed.finish(), "memory that never faults records no fault");
                    }
                });
            }
            truncate(&path, page);
            let flag = AtomicBool::new(false);
            let armed = arm(map.as_ptr(), map.len(), false, &flag);
            // SAFETY: within the mapping.
            let byte = unsafe { map.as_ptr().add(2 * page).read_volatile() };
            assert!(armed.finish());
            assert_eq!(byte, 0);
            churn.store(false, Ordering::Relaxed);
        });
        assert!(TABLE.iter().all(|slot| slot.users.load(Ordering::SeqCst) == 0));
    }
}
