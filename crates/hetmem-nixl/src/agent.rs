//! [`Agent`] and [`Registered`]: a NIXL agent with its UCX backend, and hetmem buffers
//! registered with it.

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::region::{RegionKind, RemoteRegion};
use crate::transfer::Transfer;
use crate::{LIBRARY_REMEDY, available, failed};
use hetmem::memory::Element;
use hetmem::{DeviceBuf, HostBuf};
use hetmem::{Error, Result};

/// A NIXL agent with a UCX backend. See the [crate documentation](crate).
pub struct Agent {
    agent: nixl_sys::Agent,
    backend: nixl_sys::Backend,
    name: String,
    /// Each live registration's "a peer may reach it" flag, set for all of them when the
    /// agent's metadata (which describes every registration) is handed out.
    registrations: Mutex<Vec<Weak<AtomicBool>>>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent").field("name", &self.name).finish_non_exhaustive()
    }
}

impl Agent {
    /// An agent named `name` (unique among the agents that will talk to each other) with NIXL's
    /// UCX backend, configured by UCX's own environment (`UCX_TLS`, ...).
    ///
    /// # Errors
    /// NIXL's library missing ([`crate::available`]); a name that is empty, longer than 65,535
    /// bytes or holds a NUL; the agent or UCX failing to start.
    pub fn new(name: &str) -> Result<Agent> {
        if !available() {
            return Err(Error::Nixl {
                call: "loading libnixl_capi.so",
                problem: "NIXL's C API library was not found".into(),
                remedy: LIBRARY_REMEDY,
            });
        }
        if name.is_empty() || name.len() > usize::from(u16::MAX) || name.contains('\0') {
            return Err(Error::invalid(
                "NIXL agent name",
                format!("{name:?}: give 1 to 65,535 bytes without NUL, unique among the agents that meet"),
            ));
        }
        let agent = nixl_sys::Agent::new(name).map_err(|error| {
            failed("nixlAgent", error, "check that no other agent of this process has the name")
        })?;
        let remedy = "UCX could not start: on a machine without RDMA leave UCX_TLS unset or give tcp, and \
             keep the wheel's plugins folder beside libnixl.so";
        let (_memory_kinds, params) =
            agent.get_plugin_params("UCX").map_err(|error| failed("getPluginParams(UCX)", error, remedy))?;
        let backend = agent
            .create_backend("UCX", &params)
            .map_err(|error| failed("createBackend(UCX)", error, remedy))?;
        Ok(Agent { agent, backend, name: name.to_string(), registrations: Mutex::new(Vec::new()) })
    }

    /// The agent's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What a peer needs to reach this agent ([`Agent::add_peer`] on its side). It describes
    /// every buffer registered now, so from here on a peer may move data into or out of each
    /// of them at any time (see [`Registered`]). Send it again after registering more memory.
    ///
    /// # Errors
    /// NIXL's.
    pub fn metadata(&self) -> Result<Vec<u8>> {
        // Marked under the lock: a registration made meanwhile is not in these bytes.
        let mut registrations = self.registrations.lock().unwrap_or_else(|poison| poison.into_inner());
        registrations.retain(|flag| match flag.upgrade() {
            Some(flag) => {
                flag.store(true, Ordering::Release);
                true
            }
            None => false,
        });
        self.agent
            .get_local_md()
            .map_err(|error| failed("getLocalMD", error, "a bug in NIXL or hetmem; report it"))
    }

    /// Lets this agent reach the peer whose [`Agent::metadata`] `metadata` is, and returns the
    /// peer's name.
    ///
    /// # Errors
    /// Bytes that are not an agent's metadata, or UCX unable to reach the peer.
    pub fn add_peer(&self, metadata: &[u8]) -> Result<String> {
        self.agent.load_remote_md(metadata).map_err(|error| {
            failed(
                "loadRemoteMD",
                error,
                "pass the bytes the peer's Agent::metadata returned, unchanged, and check UCX_TLS allows a \
                 transport both sides have",
            )
        })
    }

    /// Registers `memory` with the agent, so that transfers move it and peers can reach it
    /// ([`Registered::remote`]).
    ///
    /// # Errors
    /// A CPU-backend [`DeviceBuf`] (host memory only copies reach: register a [`HostBuf`]), or
    /// NIXL refusing the memory (UCX without the CUDA transports for device memory).
    pub fn register<M: NixlMemory>(&self, memory: M) -> Result<Registered<M>> {
        let (kind, address, len, device) = memory.region()?;
        let descriptor = Descriptor { address, len, kind, device };
        let mut registrations = self.registrations.lock().unwrap_or_else(|poison| poison.into_inner());
        let handle = self.agent.register_memory(&descriptor, None).map_err(|error| {
            failed(
                "registerMem",
                error,
                "for device memory UCX needs its CUDA transports (UCX_TLS with cuda_copy, and cuda_ipc \
                 between processes)",
            )
        })?;
        let exposed = Arc::new(AtomicBool::new(false));
        registrations.push(Arc::downgrade(&exposed));
        Ok(Registered {
            handle: ManuallyDrop::new(handle),
            memory: ManuallyDrop::new(memory),
            agent: self.name.clone(),
            kind,
            address,
            len: len as u64,
            device,
            exposed,
            taken: false,
        })
    }

    /// Writes all of `source` into `destination`, a peer's region at least as long; the
    /// transfer holds `source` until NIXL reports it done.
    ///
    /// # Errors
    /// The peer's region shorter than `source` or of a peer not added; NIXL refusing the
    /// transfer (the buffer comes back in the error's place only through
    /// [`Transfer::finish`]: a transfer that cannot be made returns it in `Err`'s
    /// [`Refused`]).
    #[allow(
        clippy::result_large_err,
        reason = "a refused transfer hands the caller's buffer back, on a cold path"
    )]
    pub fn write<'a, M: NixlMemory>(
        &'a self,
        source: Registered<M>,
        destination: &RemoteRegion,
    ) -> std::result::Result<Transfer<'a, M>, Refused<M>> {
        Transfer::start(self, nixl_sys::XferOp::Write, source, destination)
    }

    /// Reads `source`, a peer's region at least as long as `destination`, into all of
    /// `destination`; the transfer holds `destination` until NIXL reports it done.
    ///
    /// # Errors
    /// As for [`Agent::write`].
    #[allow(
        clippy::result_large_err,
        reason = "a refused transfer hands the caller's buffer back, on a cold path"
    )]
    pub fn read<'a, M: NixlMemory>(
        &'a self,
        source: &RemoteRegion,
        destination: Registered<M>,
    ) -> std::result::Result<Transfer<'a, M>, Refused<M>> {
        Transfer::start(self, nixl_sys::XferOp::Read, destination, source)
    }

    pub(crate) fn raw(&self) -> &nixl_sys::Agent {
        &self.agent
    }

    pub(crate) fn backend(&self) -> &nixl_sys::Backend {
        &self.backend
    }
}

/// A transfer that could not be started: why, and the buffer, unchanged.
#[derive(Debug)]
pub struct Refused<M: NixlMemory> {
    /// Why.
    pub error: Error,
    /// The buffer the transfer would have moved.
    pub memory: Registered<M>,
}

impl<M: NixlMemory> From<Refused<M>> for Error {
    fn from(refused: Refused<M>) -> Error {
        refused.error
    }
}

/// Memory hetmem can register with NIXL: host buffers and GPUs' device buffers.
pub trait NixlMemory: private::Sealed + Send + 'static {
    /// Kind, address, length in bytes and CUDA device, or why the memory cannot be registered.
    #[doc(hidden)]
    fn region(&self) -> Result<(RegionKind, u64, usize, u64)>;
}

mod private {
    pub trait Sealed {}
    impl<T: hetmem::memory::Element> Sealed for hetmem::HostBuf<T> {}
    impl<T: hetmem::memory::Element> Sealed for hetmem::DeviceBuf<T> {}
}

impl<T: Element> NixlMemory for HostBuf<T> {
    fn region(&self) -> Result<(RegionKind, u64, usize, u64)> {
        let bytes = std::mem::size_of_val(self.as_slice());
        Ok((RegionKind::Host, self.as_slice().as_ptr() as u64, bytes, 0))
    }
}

impl<T: Element> NixlMemory for DeviceBuf<T> {
    fn region(&self) -> Result<(RegionKind, u64, usize, u64)> {
        let Some(address) = self.device_ptr() else {
            return Err(Error::invalid(
                "NIXL registration",
                "a device buffer of the CPU backend is host memory that only copies reach: register a HostBuf",
            ));
        };
        let device = self.gpu_ordinal().expect("a GPU's device buffer has its GPU") as u64;
        // len elements of T: the allocation's size, which DeviceBuf::new checked.
        Ok((RegionKind::Device, address, self.len() * std::mem::size_of::<T>(), device))
    }
}

/// A buffer registered with an agent. A [`Transfer`] of this agent owns it while it runs, so no
/// such transfer outlives it; but NIXL is one-sided: once a peer can reach the buffer (its
/// agent's [`Agent::metadata`] or its [`Registered::remote`] handed out), the peer may move
/// data into or out of it at any time, without this process taking part. So the contents are
/// reached only through `unsafe` accessors, whose caller vouches that no agent moves data
/// meanwhile (the application's own protocol says when: a message, a notification, the end of
/// a step), and a buffer a peer could reach is leaked when dropped rather than freed (NIXL does
/// not tell peers of a deregistration, and a peer's stale region would write freed memory):
/// [`Registered::into_inner`] (`unsafe`) hands it back to a caller who knows no peer will
/// touch it again.
pub struct Registered<M: NixlMemory> {
    handle: ManuallyDrop<nixl_sys::RegistrationHandle>,
    memory: ManuallyDrop<M>,
    agent: String,
    kind: RegionKind,
    address: u64,
    len: u64,
    device: u64,
    /// A peer may reach the buffer: its region or its agent's metadata was handed out.
    exposed: Arc<AtomicBool>,
    /// `into_inner` took the memory.
    taken: bool,
}

impl<M: NixlMemory> std::fmt::Debug for Registered<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registered")
            .field("agent", &self.agent)
            .field("kind", &self.kind)
            .field("len", &self.len)
            .field("device", &self.device)
            .field("exposed", &self.is_exposed())
            .finish_non_exhaustive()
    }
}

impl<M: NixlMemory> Registered<M> {
    /// The memory, to read.
    ///
    /// # Safety
    /// No agent writes the buffer while the reference lives: no peer holding this agent's
    /// metadata or the buffer's region moves data into it, and no transfer of another agent
    /// of this process targets it. (This agent's own transfers of it cannot run meanwhile:
    /// they own it.)
    pub unsafe fn memory(&self) -> &M {
        &self.memory
    }

    /// The memory, to write (a [`DeviceBuf`] is written by its copies, which take it mutably).
    ///
    /// # Safety
    /// As for [`Registered::memory`], and no agent reads the buffer meanwhile either. The
    /// memory is written in place, never replaced: `std::mem::swap` or `replace` would leave
    /// the registration on memory the caller then owns, and may free.
    pub unsafe fn memory_mut(&mut self) -> &mut M {
        &mut self.memory
    }

    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Always false: hetmem buffers hold at least one element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether a peer may reach the buffer: its region, or its agent's metadata, was handed out
    /// since it was registered. Such a buffer is leaked when dropped.
    pub fn is_exposed(&self) -> bool {
        self.exposed.load(Ordering::Acquire)
    }

    /// The buffer as a peer reaches it: send [`RemoteRegion::to_bytes`] to the peer. From here
    /// on the buffer counts as reachable by peers ([`Registered::is_exposed`]).
    pub fn remote(&self) -> RemoteRegion {
        self.exposed.store(true, Ordering::Release);
        RemoteRegion::new(self.agent.clone(), self.kind, self.address, self.len, self.device)
    }

    /// Deregisters the buffer and gives it back.
    ///
    /// # Safety
    /// No agent moves data into or out of the buffer from here on: no peer holds its region or
    /// this agent's metadata from before any more (or each has been told to stop using them).
    pub unsafe fn into_inner(mut self) -> M {
        // SAFETY: taken once, here; `taken` keeps Drop from touching it again. Drop, run as
        // `self` goes below, deregisters it before the caller gets it.
        let memory = unsafe { ManuallyDrop::take(&mut self.memory) };
        self.taken = true;
        drop(self);
        memory
    }

    pub(crate) fn region(&self) -> (RegionKind, u64, u64, u64) {
        (self.kind, self.address, self.len, self.device)
    }
}

impl<M: NixlMemory> Drop for Registered<M> {
    fn drop(&mut self) {
        // SAFETY: dropped once, here: deregistered before the memory is freed or handed back.
        unsafe { ManuallyDrop::drop(&mut self.handle) };
        if self.taken {
            return;
        }
        if self.is_exposed() {
            // A peer may still write it through a region it keeps: never freed.
            tracing::warn!(
                "a NIXL-registered buffer of {} bytes that peers could reach was dropped: leaked (use the \
                 unsafe Registered::into_inner once no peer uses it)",
                self.len
            );
            return;
        }
        // SAFETY: dropped once, here; no peer can reach it (never exposed), and no transfer of
        // this agent runs (they own the Registered).
        unsafe { ManuallyDrop::drop(&mut self.memory) };
    }
}

/// One registered range as nixl-sys describes memory.
#[derive(Debug)]
struct Descriptor {
    address: u64,
    len: usize,
    kind: RegionKind,
    device: u64,
}

impl nixl_sys::MemoryRegion for Descriptor {
    unsafe fn as_ptr(&self) -> *const u8 {
        self.address as *const u8
    }

    fn size(&self) -> usize {
        self.len
    }
}

impl nixl_sys::NixlDescriptor for Descriptor {
    fn mem_type(&self) -> nixl_sys::MemType {
        self.kind.mem_type()
    }

    fn device_id(&self) -> u64 {
        self.device
    }
}
