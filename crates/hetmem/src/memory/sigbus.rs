//! SIGBUS inside hetmem's own CPU loops over file mappings, recovered instead of killing the
//! process.
//!
//! A CPU access to a page of a file mapping that lies past the file's end (the file was
//! truncated while mapped) raises SIGBUS with code `BUS_ADRERR`, whose default action ends the
//! process; so does a page the storage failed to read, or (writing into a hole of a sparse
//! file) could not allocate. While one of hetmem's loops reads or writes a mapping, it arms the
//! mapping's range ([`arm`]). A `BUS_ADRERR` at an address inside an armed range is recovered:
//! the fault is recorded in the mapping and in every armed range the recovery touches, then
//! anonymous zero pages (with the range's protection: a read-only mapping stays read-only) are
//! mapped over the lost pages, and the instruction runs again on the zeros. Which pages are
//! lost is decided from the file's size (`fstat` on the mapping's file, from the handler): past
//! the file's end, every page of the range from the faulting one on; a page the file still
//! holds (a read or allocation error), that page alone, so pages that can still be read keep
//! their contents. The loop finishes, and its caller turns the recorded fault into an error
//! (see `truncation`).
//!
//! Every other SIGBUS (another code, an address outside every armed range, a signal sent by a
//! process or by the kernel outside a fault) goes to the action installed before hetmem's,
//! with that action's mask and its `SA_RESETHAND` and `SA_NODEFER` flags honoured (it runs on
//! the stack hetmem's handler runs on, though), or to the default action. An ignored SIGBUS
//! from a fault ends the process, as the kernel does for one that is not handled. Where the
//! default action is taken for a fault that then does not recur (another thread's recovery
//! zeroed the page meanwhile), SIGBUS stays at the default action and the recovery is off for
//! the rest of the process.
//!
//! Ranges are armed for the process, not for a thread, since an operation's CPU path may run
//! its loop on rayon's threads. So while one of hetmem's loops runs over a window, a fault on
//! that window from another thread (the caller's own code reading `as_slice`) is recovered
//! too: that code reads zeros where the file ended, and the loop reports the fault.
//!
//! Consistency between the handler and the threads that arm and disarm ranges: each slot's
//! range is published under a sequence number (odd while it is not armed), so the handler never
//! acts on a half-written range; the handler counts itself as a user of the armed slots while
//! it works, and disarming waits until no handler uses the slot before it reads whether the
//! range faulted, so a fault recovered while the loop ends is not lost and no zeros are mapped
//! over memory whose range was released (and perhaps unmapped) meanwhile. The mapping's own
//! record is set before the zeros are mapped, so a loop that armed the mapping after the
//! handler looked at the table, and reads the zeros without faulting, still sees it when it
//! ends (`truncation::guarded` checks it then).
//!
//! `fork`: a child starts with every slot free (ranges armed by the parent's other threads
//! are not the child's; so are, in the child, ranges the forking thread itself had armed: a
//! loop that forks leaves its child unguarded), by a `pthread_atfork` child handler. A fork
//! while another thread installs the handler leaves the child's loops unarmed (their files'
//! sizes checked before them), never waiting for an install that will not finish.
//!
//! No program counter is rewritten; what depends on the architecture is the signal context's
//! mask (`ucontext_t::uc_sigmask`, read to call a previous handler with the mask the kernel
//! would give it), whose layout libc matches on x86_64 and aarch64. The handler
//! blocks every other signal while it runs, touches only atomics, its own stack and the
//! previous action (written once, before the handler is installed), makes only system calls
//! (`fstat`, `mmap`, `sigaction`, `pthread_sigmask`, `raise`), saves and restores `errno`, and
//! may call the previous action's handler.
//!
//! Limits. The recovery replaces the CPU's view of the pages: GPU work reading a registered
//! window through its device address still reads the pages that were page-locked when the
//! window was registered (the stale contents, not zeros), and the fault is reported only by
//! the CPU loops. Python's `faulthandler`, enabled after hetmem installed its handler (at the
//! first guarded loop), takes SIGBUS first and ends the process with a traceback; enabled
//! before (as pytest does at start-up), it gets only the faults hetmem does not recover. A
//! program that replaces the SIGBUS action after hetmem's turns the recovery off.
//!
//! Why this design: on 2 vCPUs of an AMD EPYC (a 1 GiB file mapping, warm, best of 7 runs),
//! an armed `memcpy` out of the mapping ran at 13.8-15.8 GB/s, as fast as the plain one
//! (13.7-15.2 GB/s); copying with `process_vm_readv` on the own process (which answers EFAULT
//! instead of raising SIGBUS) ran at 5.3-6.0 GB/s, and `pread` from the file at 5.7-6.0 GB/s.
//! Either of those would also need a bounce buffer for the loops that read a mapping in place
//! (checksums, the loader's gathers, every operation's CPU path).

use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::OnceLock;
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicPtr, AtomicU8, AtomicU64, AtomicUsize, Ordering, compiler_fence,
};

use rustix::mm::{MapFlags, ProtFlags};

/// What a recovered fault was, as the handler decided it from the file's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The page lies past the file's end: the file was truncated.
    PastEnd,
    /// The file still holds the page: the storage failed to read (or allocate) it.
    Unreadable,
    /// The file's size could not be read (no file known, or `fstat` failed).
    Unknown,
}

impl Fault {
    const NONE: u8 = 0;

    fn code(self) -> u8 {
        match self {
            Fault::PastEnd => 1,
            Fault::Unreadable => 2,
            Fault::Unknown => 3,
        }
    }

    fn from_code(code: u8) -> Option<Fault> {
        match code {
            1 => Some(Fault::PastEnd),
            2 => Some(Fault::Unreadable),
            3 => Some(Fault::Unknown),
            _ => None,
        }
    }
}

/// One armed range. The range's fields are written only by the thread that took the slot,
/// while `seq` is odd; the handler reads them only while `seq` is even and the same before and
/// after, and while it counts as a user (so they cannot change).
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
    /// The mapped file's descriptor (-1 when unknown) and the file offset of `start`.
    fd: AtomicI32,
    file_offset: AtomicU64,
    /// The mapping's own record of a fault (`truncation::FileSpan::faulted`), which outlives
    /// the range: valid while the slot is armed, since the [`Armed`] that borrows it disarms
    /// the slot before the borrow ends.
    mapping_faulted: AtomicPtr<AtomicBool>,
    /// The fault recovered in the range since it was armed ([`Fault::code`]), if any.
    fault: AtomicU8,
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
        fd: AtomicI32::new(-1),
        file_offset: AtomicU64::new(0),
        mapping_faulted: AtomicPtr::new(std::ptr::null_mut()),
        fault: AtomicU8::new(Fault::NONE),
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

/// The handler's installation: not yet, under way (on some thread), installed, or failed.
static INSTALL: AtomicU8 = AtomicU8::new(NOT_INSTALLED);
const NOT_INSTALLED: u8 = 0;
const INSTALLING: u8 = 1;
const INSTALLED: u8 = 2;
const FAILED: u8 = 3;

/// The mapping a range lies in, for [`arm`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mapping<'a> {
    /// Whether it may be written.
    pub(crate) writable: bool,
    /// Its file and the file offset of the range's first byte, where known.
    pub(crate) file: Option<(BorrowedFd<'a>, u64)>,
    /// Its record of a fault, set by the handler (and kept after the range is disarmed).
    pub(crate) faulted: &'a AtomicBool,
}

/// A range armed by [`with_armed`] while its closure runs: disarmed when dropped (also on a
/// panic); the mapping's own record of a fault is set by the handler either way. Never leaked:
/// it lives in `with_armed`'s frame (a leaked one would leave its slot pointing at a record and
/// a descriptor that no longer exist).
#[derive(Debug)]
struct Armed<'a> {
    slot: Option<&'static Slot>,
    /// [`GENERATION`] when armed: a child of `fork` leaves the parent's slots alone.
    generation: usize,
    /// The borrows the slot refers to (the descriptor, the mapping's record): they outlive it.
    _mapping: Mapping<'a>,
}

/// Runs `f` with the `len` bytes from `start` armed: a `BUS_ADRERR` at an address inside them
/// is recovered (see the module's documentation) and recorded in the mapping. `before` runs
/// first, told whether the range is armed: where the handler is not installed (it could not
/// be, or another thread is still installing it) or every slot is taken, nothing is armed and
/// a fault ends the process as it would without hetmem (both are logged), so `before` checks
/// the file then; its error is returned without running `f`. Answers what `f` made and the
/// fault recovered in the range while it ran, if any (its lost pages then hold zeros, not the
/// file).
///
/// # Safety
/// The bytes lie in one file mapping, described by `mapping`, which stays mapped until this
/// returns: the handler maps zeros over pages of the range, and reads `mapping`'s descriptor.
pub(crate) unsafe fn with_armed<R, E>(
    start: *const u8,
    len: usize,
    mapping: Mapping<'_>,
    before: impl FnOnce(bool) -> Result<(), E>,
    f: impl FnOnce() -> R,
) -> Result<(R, Option<Fault>), E> {
    let armed = arm(start, len, mapping);
    before(armed.slot.is_some())?;
    let made = f();
    Ok((made, armed.finish()))
}

/// Arms the range for [`with_armed`] (or leaves it unarmed, `slot` empty).
fn arm<'a>(start: *const u8, len: usize, mapping: Mapping<'a>) -> Armed<'a> {
    let generation = GENERATION.load(Ordering::Acquire);
    let unarmed = Armed { slot: None, generation, _mapping: mapping };
    let Some(end) = (start as usize).checked_add(len) else {
        debug_assert!(false, "a range past the address space");
        return unarmed;
    };
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
    slot.end.store(end, Ordering::Relaxed);
    slot.writable.store(mapping.writable, Ordering::Relaxed);
    let (fd, file_offset) = mapping.file.map_or((-1, 0), |(fd, offset)| (fd.as_raw_fd(), offset));
    slot.fd.store(fd, Ordering::Relaxed);
    slot.file_offset.store(file_offset, Ordering::Relaxed);
    slot.mapping_faulted.store(std::ptr::from_ref(mapping.faulted).cast_mut(), Ordering::Relaxed);
    slot.fault.store(Fault::NONE, Ordering::Relaxed);
    // Even: armed. SeqCst orders it against the handlers' user counts (see `disarm`).
    slot.seq.fetch_add(1, Ordering::SeqCst);
    // The loop's accesses come after the range is armed, as a handler on this thread sees.
    compiler_fence(Ordering::SeqCst);
    Armed { slot: Some(slot), generation, _mapping: mapping }
}

impl Armed<'_> {
    /// Disarms the range; the fault recovered inside it while it was armed, if any.
    fn finish(mut self) -> Option<Fault> {
        self.disarm()
    }

    fn disarm(&mut self) -> Option<Fault> {
        compiler_fence(Ordering::SeqCst);
        let slot = self.slot.take()?;
        if GENERATION.load(Ordering::Acquire) != self.generation {
            // Armed in the parent before a fork: the child's table was reset without it.
            return None;
        }
        // Odd: handlers that start now pass the slot by. One that counted itself as a user
        // before this (SeqCst: its count comes first, or it sees the odd sequence) may still
        // record a fault or map zeros: wait for it (a handler does not block; yield to it
        // after a short spin in case it was preempted).
        slot.seq.fetch_add(1, Ordering::SeqCst);
        let mut spins = 0u32;
        while slot.users.load(Ordering::SeqCst) != 0 {
            if spins < 64 {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        let fault = Fault::from_code(slot.fault.load(Ordering::Acquire));
        slot.mapping_faulted.store(std::ptr::null_mut(), Ordering::Relaxed);
        slot.taken.store(false, Ordering::Release);
        fault
    }
}

impl Drop for Armed<'_> {
    fn drop(&mut self) {
        self.disarm();
    }
}

/// Installs the handler once; false if it is not installed (it could not be, or another thread
/// is installing it now: this loop then runs unarmed rather than wait, so a child forked in
/// the middle of an install never waits for it).
fn install() -> bool {
    match INSTALL.load(Ordering::Acquire) {
        INSTALLED => return true,
        NOT_INSTALLED => {}
        _ => return false,
    }
    if INSTALL.compare_exchange(NOT_INSTALLED, INSTALLING, Ordering::AcqRel, Ordering::Acquire).is_err() {
        // Another thread installs it: wait a little (an install is three system calls), but
        // not for ever (a child forked mid-install would wait for a thread it does not have).
        for _ in 0..10_000 {
            match INSTALL.load(Ordering::Acquire) {
                INSTALLING => std::thread::yield_now(),
                state => return state == INSTALLED,
            }
        }
        return false;
    }
    PAGE.store(super::page_size(), Ordering::Relaxed);
    // SAFETY: a zeroed sigaction is a valid value of the C struct (no handler, no flags, an
    // empty mask).
    let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a null new action only reads the current one into `previous`, a valid sigaction
    // to write.
    let read = unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut previous) } == 0;
    // The previous action is known before hetmem's handler can run. (Another thread installing
    // its own SIGBUS action between these two calls would be replaced unrecorded; hetmem
    // installs once, at its first guarded loop.)
    if read {
        let _ = PREVIOUS.set(previous);
    }
    // SAFETY: a `pthread_atfork` child handler that only stores atomics (async-signal-safe, as
    // a child of a multi-threaded parent requires).
    let at_fork = read && unsafe { libc::pthread_atfork(None, None, Some(reset_after_fork)) } == 0;
    // SAFETY: as above, a zeroed sigaction is valid; the fields set below make it hetmem's.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
    action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
    // SAFETY: `action.sa_mask` is a valid sigset_t to fill (every other signal is blocked
    // while the handler runs, so nothing interrupts it while it holds slots); `on_sigbus` has
    // the signature SA_SIGINFO handlers take and is async-signal-safe (the module's
    // documentation).
    let installed = at_fork
        && unsafe {
            libc::sigfillset(&mut action.sa_mask);
            libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()) == 0
        };
    if installed {
        INSTALL.store(INSTALLED, Ordering::Release);
    } else {
        INSTALL.store(FAILED, Ordering::Release);
        tracing::warn!(
            "cannot install a SIGBUS handler ({}): files are checked before hetmem reads their \
             mappings, but one truncated during a read ends the process",
            std::io::Error::last_os_error()
        );
    }
    installed
}

/// In a child of `fork`: only the forking thread lives, so no range armed before the fork will
/// be disarmed; every slot starts free.
extern "C" fn reset_after_fork() {
    GENERATION.fetch_add(1, Ordering::AcqRel);
    for slot in &TABLE {
        if slot.seq.load(Ordering::Relaxed).is_multiple_of(2) {
            slot.seq.fetch_add(1, Ordering::Relaxed);
        }
        slot.users.store(0, Ordering::Relaxed);
        slot.mapping_faulted.store(std::ptr::null_mut(), Ordering::Relaxed);
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

    fn set(&mut self, index: usize) {
        self.0[index / 64] |= 1 << (index % 64);
    }

    fn clear(&mut self, index: usize) {
        self.0[index / 64] &= !(1 << (index % 64));
    }
}

/// The handler's view of one slot: counts itself as a user and reads the range, if the slot
/// is armed and its range stable while read; otherwise leaves it alone.
fn hold(slot: &Slot) -> Option<(usize, usize)> {
    if !slot.taken.load(Ordering::Acquire) {
        return None;
    }
    slot.users.fetch_add(1, Ordering::SeqCst);
    let before = slot.seq.load(Ordering::SeqCst);
    let range = (slot.start.load(Ordering::Relaxed), slot.end.load(Ordering::Relaxed));
    // Even and unchanged: armed throughout, and (since this handler now counts as a user)
    // it cannot be disarmed, let alone re-armed, until the handler lets it go.
    if before.is_multiple_of(2) && slot.seq.load(Ordering::SeqCst) == before {
        Some(range)
    } else {
        slot.users.fetch_sub(1, Ordering::SeqCst);
        None
    }
}

/// The pages lost in the held `slot`'s range for a fault at `address`, and what the fault
/// was: from the file's size, every page from the faulting one to the range's end when the
/// faulting page lies past the file's end, else the faulting page alone (the storage failed on
/// it; the pages after it may still be read). Where the size is unknown (no file, or `fstat`
/// failed), every page to the range's end: the mapping is refused from then on anyway, and one
/// fault per page of a long range would cost a signal and a mapping each.
fn lost_pages(slot: &Slot, address: usize, page: usize) -> Option<(usize, usize, Fault)> {
    let (start, end) = (slot.start.load(Ordering::Relaxed), slot.end.load(Ordering::Relaxed));
    let from = address / page * page;
    let to_end = end.checked_next_multiple_of(page)?;
    let fd = slot.fd.load(Ordering::Relaxed);
    if fd < 0 {
        return Some((from, to_end, Fault::Unknown));
    }
    // SAFETY: the descriptor of the armed mapping's file, which its `Armed` borrows: open while
    // the slot is held.
    let size = rustix::fs::fstat(unsafe { BorrowedFd::borrow_raw(fd) }).map(|stat| stat.st_size as u64);
    // The file offset of the faulting byte (`address` lies in the range: `start <= address`).
    let at = slot.file_offset.load(Ordering::Relaxed).checked_add((address - start) as u64)?;
    match size {
        // Mappings start at page-aligned file offsets, so `at`'s page is the file's page
        // `at / page`: past the end when no byte of it is in the file.
        Ok(size) if at / page as u64 >= size.div_ceil(page as u64) => Some((from, to_end, Fault::PastEnd)),
        Ok(_) => Some((from, from.checked_add(page)?, Fault::Unreadable)),
        Err(_) => Some((from, to_end, Fault::Unknown)),
    }
}

/// If an armed range holds `address`: records the fault in the mapping and in every armed
/// range overlapping the lost pages ([`lost_pages`]), maps zeros over those pages, and answers
/// true.
///
/// It runs on the signal stack (often the few KiB of `sigaltstack`), so it keeps no copy of
/// the table: a held slot's range cannot change until it is let go, and is read again.
fn recover(address: usize) -> bool {
    let mut held = Held([0; SLOTS / 64]);
    // The armed range holding the address that reaches furthest: every such range lies in the
    // one mapping that holds the address.
    let mut target: Option<(usize, usize)> = None;
    for (index, slot) in TABLE.iter().enumerate() {
        if let Some((start, end)) = hold(slot) {
            held.set(index);
            if (start..end).contains(&address) && target.is_none_or(|(_, furthest)| end > furthest) {
                target = Some((index, end));
            }
        }
    }
    let page = PAGE.load(Ordering::Relaxed);
    // Only the ranges the lost pages may overlap stay held; the others are let go at once, so
    // their disarms need wait neither for the file's size (`fstat` may block on a network or
    // FUSE file system) nor for the mapping below.
    let let_go = |held: &mut Held, keep: Option<(usize, usize)>| {
        for (index, slot) in TABLE.iter().enumerate() {
            let overlaps = |(from, to): (usize, usize)| {
                slot.start.load(Ordering::Relaxed) < to && from < slot.end.load(Ordering::Relaxed)
            };
            if held.has(index) && !keep.is_some_and(overlaps) {
                slot.users.fetch_sub(1, Ordering::SeqCst);
                held.clear(index);
            }
        }
    };
    let widest =
        target.and_then(|(_, end)| Some((address / page * page, end.checked_next_multiple_of(page)?)));
    let_go(&mut held, widest);
    let lost =
        target.and_then(|(index, _)| lost_pages(&TABLE[index], address, page).map(|lost| (index, lost)));
    let_go(&mut held, lost.map(|(_, (from, to, _))| (from, to)));
    let Some((target, (from, to, fault))) = lost else { return false };
    // The mappings' records first: a loop that armed after the scan above and reads the zeros
    // without faulting sees the record when it ends.
    for (index, slot) in TABLE.iter().enumerate() {
        let record = slot.mapping_faulted.load(Ordering::Relaxed);
        if held.has(index) && !record.is_null() {
            // SAFETY: the record of a held (so still armed) slot, which its `Armed` borrows.
            unsafe { (*record).store(true, Ordering::Release) };
        }
    }
    let writable = TABLE[target].writable.load(Ordering::Relaxed);
    let protection = if writable { ProtFlags::READ | ProtFlags::WRITE } else { ProtFlags::READ };
    // SAFETY: [from, to) lies in the mapping that holds `address`: the armed range holding it
    // lies in one file mapping (`arm`'s contract), which stays mapped while the range is
    // armed, and it is armed until this handler stops counting as its user; mappings cover
    // whole pages, up to the page holding their last byte. Those pages can no longer be read
    // (the file ends before them, or the storage failed on this one); zeros with the mapping's
    // protection take their place until the mapping is unmapped, and every armed loop whose
    // range they overlap is told (above and below), so its caller discards what it made of
    // them.
    let zeros = unsafe {
        rustix::mm::mmap_anonymous(
            from as *mut libc::c_void,
            to - from,
            protection,
            MapFlags::PRIVATE | MapFlags::FIXED,
        )
    };
    for (index, slot) in TABLE.iter().enumerate() {
        if held.has(index) {
            if zeros.is_ok() {
                slot.fault.store(fault.code(), Ordering::Release);
            }
            slot.users.fetch_sub(1, Ordering::SeqCst);
        }
    }
    zeros.is_ok()
}

/// Gives the signal to the action hetmem's replaced: its handler (with its mask and flags), or
/// the default action (which ends the process when the faulting instruction runs again, or at
/// once for a signal sent).
fn pass_on(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the kernel's siginfo, as in `on_sigbus`.
    let code = unsafe { (*info).si_code };
    // A synchronous fault recurs when the instruction runs again; anything else (a signal sent
    // by a process or by the kernel, an asynchronous memory error report) does not, and is
    // raised again instead.
    let from_fault =
        matches!(code, libc::BUS_ADRALN | libc::BUS_ADRERR | libc::BUS_OBJERR | libc::BUS_MCEERR_AR);
    let previous = PREVIOUS.get();
    match previous.map(|action| action.sa_sigaction) {
        // An ignored signal sent by a process stays ignored; an ignored fault would run the
        // instruction again forever, so it gets the default action, as the kernel gives it.
        Some(libc::SIG_IGN) if !from_fault => {}
        Some(handler) if handler != libc::SIG_DFL && handler != libc::SIG_IGN => {
            let Some(previous) = previous else { return };
            call_previous(previous, signal, info, context);
        }
        _ => {
            // SAFETY: a zeroed sigaction with SIG_DFL restores the default action. A signal
            // sent is raised again (blocked until this handler returns, then delivered); a
            // fault recurs when the instruction runs again.
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

/// Calls the previous action's handler as the kernel would have: the default action restored
/// first for `SA_RESETHAND`, and the signal mask of the interrupted code plus the action's own
/// (and SIGBUS itself, unless `SA_NODEFER`) in force while it runs.
fn call_previous(
    previous: &libc::sigaction,
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    // SAFETY: every call below is async-signal-safe; `context` is the kernel's ucontext for
    // this delivery, whose `uc_sigmask` is the interrupted code's mask; the sigsets are valid
    // values built from it and from the previous action's mask.
    unsafe {
        if previous.sa_flags & libc::SA_RESETHAND != 0 {
            let mut default: libc::sigaction = std::mem::zeroed();
            default.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(signal, &default, std::ptr::null_mut());
        }
        // The interrupted code's mask (`uc_sigmask` matches the kernel's frame on x86_64 and
        // aarch64, the targets hetmem builds for); none if another library chained to this
        // handler without a context: the mask in force now (every signal) is kept.
        if context.is_null() {
            call_handler(previous, signal, info, context);
            return;
        }
        let mut mask = (*context.cast::<libc::ucontext_t>()).uc_sigmask;
        // Linux's signals are 1 to 64.
        for other in 1..=64 {
            if libc::sigismember(&previous.sa_mask, other) == 1 {
                libc::sigaddset(&mut mask, other);
            }
        }
        if previous.sa_flags & libc::SA_NODEFER == 0 {
            libc::sigaddset(&mut mask, signal);
        }
        let mut ours: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_SETMASK, &mask, &mut ours);
        call_handler(previous, signal, info, context);
        libc::pthread_sigmask(libc::SIG_SETMASK, &ours, std::ptr::null_mut());
    }
}

/// Calls the previous action's handler with the arguments its flags say it takes.
fn call_handler(
    previous: &libc::sigaction,
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    let handler = previous.sa_sigaction;
    if previous.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous action was installed with SA_SIGINFO, so its handler takes
        // these three arguments, which are the kernel's own.
        let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(handler) };
        handler(signal, info, context);
    } else {
        // SAFETY: without SA_SIGINFO a handler takes the signal number alone.
        let handler: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
        handler(signal);
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    struct Shrinking {
        _dir: tempfile::TempDir,
        path: std::path::PathBuf,
        file: std::fs::File,
        map: memmap2::Mmap,
    }

    fn shrinking_map(pages: usize, byte: u8) -> Shrinking {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shrinks.bin");
        let page = super::super::page_size();
        std::fs::write(&path, vec![byte; pages * page]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: the tests truncate the file only to check that armed reads survive it.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        Shrinking { _dir: dir, path, file, map }
    }

    impl Shrinking {
        fn truncate(&self, bytes: usize) {
            std::fs::OpenOptions::new().write(true).open(&self.path).unwrap().set_len(bytes as u64).unwrap();
        }

        fn mapping<'a>(&'a self, faulted: &'a AtomicBool) -> Mapping<'a> {
            Mapping { writable: false, file: Some((self.file.as_fd(), 0)), faulted }
        }

        /// Runs `f` with `pages` pages from `first` armed (which they must be: a test that ran
        /// unarmed would die of the signal); what it made and the fault recorded.
        fn armed<R>(
            &self,
            first: usize,
            pages: usize,
            mapping: Mapping<'_>,
            f: impl FnOnce() -> R,
        ) -> (R, Option<Fault>) {
            let page = super::super::page_size();
            assert!((first + pages) * page <= self.map.len());
            // SAFETY: the pages lie in the test's mapping, which outlives the call.
            let start = unsafe { self.map.as_ptr().add(first * page) };
            let must_be_armed = |armed: bool| if armed { Ok(()) } else { Err("not armed") };
            // SAFETY: as above; `mapping` describes this mapping.
            unsafe { with_armed(start, pages * page, mapping, must_be_armed, f) }.unwrap()
        }
    }

    /// The byte `offset` into the mapping, read while armed (volatile: the read is not moved
    /// out of the armed closure).
    fn byte_at(map: &memmap2::Mmap, offset: usize) -> u8 {
        assert!(offset < map.len());
        // SAFETY: within the mapping.
        unsafe { map.as_ptr().add(offset).read_volatile() }
    }

    #[test]
    fn a_fault_inside_an_armed_range_is_recovered_and_reads_zeros() {
        let page = super::super::page_size();
        let shrinking = shrinking_map(4, 7);
        shrinking.truncate(page + 10);
        let mapping_faulted = AtomicBool::new(false);
        let (copy, fault) =
            shrinking.armed(0, 4, shrinking.mapping(&mapping_faulted), || shrinking.map.to_vec());
        assert_eq!(fault, Some(Fault::PastEnd));
        assert!(mapping_faulted.load(Ordering::Acquire), "the mapping keeps the record");
        assert_eq!(&copy[..page + 10], &vec![7u8; page + 10][..], "the bytes still in the file");
        assert!(copy[2 * page..].iter().all(|&byte| byte == 0), "the pages past the end read as zeros");
        let again = AtomicBool::new(false);
        let (first, fault) = shrinking.armed(0, 4, shrinking.mapping(&again), || byte_at(&shrinking.map, 0));
        assert_eq!((first, fault), (7, None));
    }

    /// An operation's CPU path may read on rayon's threads: a fault on another thread than
    /// the one that armed the range is recovered too, and recorded in every range it zeroed.
    #[test]
    fn a_fault_on_another_thread_is_recovered_and_recorded_in_every_overlapping_range() {
        let page = super::super::page_size();
        let shrinking = shrinking_map(8, 5);
        let map = &shrinking.map;
        let (whole_flag, tail_flag) = (AtomicBool::new(false), AtomicBool::new(false));
        let tail_mapping = Mapping {
            file: Some((shrinking.file.as_fd(), 6 * page as u64)),
            ..shrinking.mapping(&tail_flag)
        };
        let ((sum, tail_fault), whole_fault) = shrinking.armed(0, 8, shrinking.mapping(&whole_flag), || {
            shrinking.armed(6, 2, tail_mapping, || {
                shrinking.truncate(page);
                std::thread::scope(|scope| {
                    scope
                        .spawn(|| map[3 * page..].iter().map(|&byte| u64::from(byte)).sum::<u64>())
                        .join()
                        .unwrap()
                })
            })
        });
        assert_eq!(sum, 0, "the pages past the end read as zeros");
        assert_eq!((whole_fault, tail_fault), (Some(Fault::PastEnd), Some(Fault::PastEnd)));
        assert!(whole_flag.load(Ordering::Acquire) && tail_flag.load(Ordering::Acquire));
    }

    /// A fault on a page the file still holds (a read error) zeros that page alone: later
    /// pages keep what they hold, and fault (and are recovered) one by one if they must. The
    /// handler is shown a larger file than the mapping's, so its own file's lost pages count
    /// as held.
    #[test]
    fn a_page_the_file_still_holds_is_zeroed_alone() {
        let page = super::super::page_size();
        let shrinking = shrinking_map(4, 6);
        let larger = shrinking_map(8, 1);
        shrinking.truncate(page);
        let flag = AtomicBool::new(false);
        let mapping = Mapping { file: Some((larger.file.as_fd(), 0)), ..shrinking.mapping(&flag) };
        let (bytes, fault) = shrinking.armed(0, 4, mapping, || {
            (byte_at(&shrinking.map, 0), byte_at(&shrinking.map, page), byte_at(&shrinking.map, 3 * page))
        });
        assert_eq!(fault, Some(Fault::Unreadable));
        assert_eq!(bytes, (6, 0, 0));
        let zeroed: Vec<_> = std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .filter(|line| line.starts_with(&format!("{:x}-", shrinking.map.as_ptr() as usize + page)))
            .map(str::to_string)
            .collect();
        let one_page_ends = format!("-{:x} ", shrinking.map.as_ptr() as usize + 2 * page);
        assert!(zeroed.len() == 1 && zeroed[0].contains(&one_page_ends), "one page of zeros: {zeroed:?}");
    }

    /// A mapping whose file is unknown loses every page from the fault on at once: it is
    /// refused from then on anyway.
    #[test]
    fn a_mapping_of_an_unknown_file_loses_the_rest_of_the_range_at_once() {
        let page = super::super::page_size();
        let shrinking = shrinking_map(4, 8);
        shrinking.truncate(page);
        let flag = AtomicBool::new(false);
        let mapping = Mapping { file: None, ..shrinking.mapping(&flag) };
        let (copy, fault) = shrinking.armed(0, 4, mapping, || shrinking.map.to_vec());
        assert_eq!(fault, Some(Fault::Unknown));
        assert!(copy[..page].iter().all(|&byte| byte == 8) && copy[page..].iter().all(|&byte| byte == 0));
    }

    /// The zero pages keep the mapping's protection: a read-only window does not become
    /// writable because its file shrank.
    #[test]
    fn the_zeros_over_a_read_only_mapping_stay_read_only() {
        let page = super::super::page_size();
        let shrinking = shrinking_map(4, 3);
        shrinking.truncate(page);
        let flag = AtomicBool::new(false);
        let (byte, fault) =
            shrinking.armed(0, 4, shrinking.mapping(&flag), || byte_at(&shrinking.map, 2 * page));
        assert_eq!((byte, fault), (0, Some(Fault::PastEnd)));
        // The zeros' protection, as /proc/self/maps lists it: private, read-only, no file.
        let zeros = shrinking.map.as_ptr() as usize + 2 * page;
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
        let fields: Vec<_> = line.split_whitespace().collect();
        assert_eq!((fields[1], fields[4]), ("r--p", "0"), "{line}");
    }

    /// A range disarmed by a panic leaves its fault recorded in the mapping, so the next access
    /// is refused instead of reading zeros as data.
    #[test]
    fn a_panic_in_the_loop_still_records_the_fault_in_the_mapping() {
        let page = super::super::page_size();
        let shrinking = shrinking_map(4, 9);
        shrinking.truncate(page);
        let flag = AtomicBool::new(false);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            shrinking.armed(0, 4, shrinking.mapping(&flag), || {
                let byte = byte_at(&shrinking.map, 3 * page);
                panic!("the loop fails after reading {byte}");
            })
        }));
        assert!(outcome.is_err());
        assert!(flag.load(Ordering::Acquire));
    }

    /// Arming and disarming on other threads while a fault is recovered: no fault is lost, and
    /// none is reported where none happened.
    #[test]
    fn ranges_armed_and_disarmed_during_a_recovery_lose_no_fault() {
        let page = super::super::page_size();
        let shrinking = shrinking_map(4, 1);
        let churn = AtomicBool::new(true);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    let local = vec![2u8; page];
                    while churn.load(Ordering::Relaxed) {
                        let flag = AtomicBool::new(false);
                        let mapping = Mapping { writable: false, file: None, faulted: &flag };
                        // SAFETY: memory that never faults (no file mapping): the handler
                        // never acts on it.
                        let (_, fault) = unsafe {
                            with_armed(local.as_ptr(), local.len(), mapping, |_| Ok::<(), ()>(()), || ())
                        }
                        .unwrap();
                        assert_eq!(fault, None, "memory that never faults records no fault");
                    }
                });
            }
            shrinking.truncate(page);
            let flag = AtomicBool::new(false);
            let (byte, fault) =
                shrinking.armed(0, 4, shrinking.mapping(&flag), || byte_at(&shrinking.map, 2 * page));
            churn.store(false, Ordering::Relaxed);
            assert_eq!((byte, fault), (0, Some(Fault::PastEnd)));
        });
    }
}
