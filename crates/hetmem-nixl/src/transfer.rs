//! [`Transfer`]: one NIXL write or read, holding its local buffer until NIXL is done with it.

use std::mem::ManuallyDrop;
use std::time::{Duration, Instant};

use crate::agent::{Agent, NixlMemory, Refused, Registered};
use crate::failed;
use crate::region::RemoteRegion;
use hetmem::{Error, Result};

/// How long a transfer dropped in flight waits for NIXL before it leaks its buffer.
const DROP_WAIT: Duration = Duration::from_secs(10);

/// Where a transfer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    InFlight,
    Done,
    /// NIXL refused to post it before anything moved (an unknown peer): the buffer goes back.
    NeverStarted,
    /// NIXL reported a failure, or lost track of the request (its peer's metadata
    /// invalidated), or failed to post it after starting: UCX may still move the buffer's bytes
    /// (its status looks at a request's last step, the flush, and a cancel may not stop the
    /// step before), so the buffer is never handed back and is leaked when the transfer goes.
    Failed,
}

/// A write of a registered buffer into a peer's region, or a read of one into a registered
/// buffer. It owns the buffer until NIXL reports it complete: see the [crate
/// documentation](crate).
pub struct Transfer<'a, M: NixlMemory> {
    agent: &'a Agent,
    /// Released (by nixl-sys's drop) only once NIXL is done with it; leaked otherwise.
    request: ManuallyDrop<nixl_sys::XferRequest>,
    /// The local buffer; given back by `finish`, leaked with the request if NIXL never ends.
    memory: ManuallyDrop<Registered<M>>,
    op: nixl_sys::XferOp,
    state: State,
    failure: Option<String>,
    /// `finish` took the buffer out.
    taken: bool,
}

impl<M: NixlMemory> std::fmt::Debug for Transfer<'_, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transfer")
            .field("op", &self.op)
            .field("state", &self.state)
            .field("memory", &*self.memory)
            .finish_non_exhaustive()
    }
}

impl<'a, M: NixlMemory> Transfer<'a, M> {
    /// Starts `op` between `local` and `remote`: a write moves all of `local` into the start of
    /// `remote`, a read fills all of `local` from the start of `remote`.
    #[allow(
        clippy::result_large_err,
        reason = "a refused transfer hands the caller's buffer back, on a cold path"
    )]
    pub(crate) fn start(
        agent: &'a Agent,
        op: nixl_sys::XferOp,
        local: Registered<M>,
        remote: &RemoteRegion,
    ) -> std::result::Result<Transfer<'a, M>, Refused<M>> {
        let refuse = |error: Error, memory: Registered<M>| Err(Refused { error, memory });
        let (kind, address, len, device) = local.region();
        if remote.agent() == agent.name() {
            let error = Error::invalid(
                "NIXL transfer",
                format!(
                    "the region is of this agent itself ({}): NIXL would copy within this agent's own \
                     registrations; give a peer's region",
                    agent.name()
                ),
            );
            return refuse(error, local);
        }
        if remote.len() < len {
            let error = Error::invalid(
                "NIXL transfer",
                format!(
                    "the peer's region holds {} bytes, the local buffer {len}: give a region at least as \
                     long (RemoteRegion::range cuts a longer one)",
                    remote.len()
                ),
            );
            return refuse(error, local);
        }
        let described = || -> std::result::Result<_, nixl_sys::NixlError> {
            let mut mine = nixl_sys::XferDescList::new(kind.mem_type())?;
            mine.add_desc(address as usize, len as usize, device);
            let mut theirs = nixl_sys::XferDescList::new(remote.kind().mem_type())?;
            theirs.add_desc(remote.address() as usize, len as usize, remote.device());
            let mut args = nixl_sys::OptArgs::new()?;
            args.add_backend(agent.backend())?;
            agent.raw().create_xfer_req(op, &mine, &theirs, remote.agent(), Some(&args))
        };
        let request = match described() {
            Ok(request) => request,
            Err(error) => {
                let remedy = "add the peer first (Agent::add_peer), and give a region it registered \
                     (Registered::remote), of memory UCX can reach (UCX_TLS)";
                return refuse(failed("createXferReq", error, remedy), local);
            }
        };
        let mut transfer = Transfer {
            agent,
            request: ManuallyDrop::new(request),
            memory: ManuallyDrop::new(local),
            op,
            state: State::InFlight,
            failure: None,
            taken: false,
        };
        match agent.raw().post_xfer_req(&transfer.request, None) {
            Ok(true) => {}
            Ok(false) => transfer.state = State::Done,
            Err(nixl_sys::NixlError::NotFound) => {
                // Refused before the backend was asked (the peer unknown to NIXL): NIXL holds
                // nothing, so the buffer goes back at once.
                transfer.state = State::NeverStarted;
                let error = nixl_sys::NixlError::NotFound;
                let error = failed(
                    "postXferReq",
                    error,
                    "check that the peer still runs and UCX_TLS suits both sides",
                );
                let memory = transfer.finish().expect("a transfer never started gives its buffer back");
                return refuse(error, memory);
            }
            Err(error) => {
                // UCX may have started part of it before failing: the buffer stays with the
                // transfer, whose poll says why.
                transfer.state = State::Failed;
                transfer.failure = Some(format!("postXferReq failed ({error}), perhaps after starting"));
            }
        }
        Ok(transfer)
    }

    /// Whether NIXL is done with the transfer.
    ///
    /// # Errors
    /// The transfer failed (now or before): NIXL reported an error (a peer that went away),
    /// lost track of it (its peer's metadata invalidated, after a disconnect on another
    /// transfer say), or failed to post it after starting. UCX may then still move the
    /// buffer's bytes, so the buffer stays with the transfer for good ([`Transfer::finish`]
    /// never gives it back) and is leaked when the transfer is dropped.
    pub fn poll(&mut self) -> Result<bool> {
        if self.state == State::InFlight {
            match self.agent.raw().get_xfer_status(&self.request) {
                Ok(nixl_sys::XferStatus::Success) => self.state = State::Done,
                Ok(nixl_sys::XferStatus::InProgress) => {}
                Err(error) => {
                    self.state = State::Failed;
                    self.failure = Some(match error {
                        // Answered without asking UCX, whose operation may still run.
                        nixl_sys::NixlError::NotFound => "NIXL no longer knows the request's peer".into(),
                        error => error.to_string(),
                    });
                }
            }
        }
        match self.state {
            State::InFlight => Ok(false),
            State::Done | State::NeverStarted => Ok(true),
            State::Failed => Err(Error::Nixl {
                call: "getXferStatus",
                problem: format!(
                    "{}; UCX may still move the buffer's bytes, so it stays with the transfer (leaked when the \
                     transfer is dropped)",
                    self.failure.as_deref().unwrap_or("the transfer failed")
                ),
                remedy: "check that the peer still runs (a peer that exits fails its transfers), add it again \
                         (Agent::add_peer) after a disconnect, and start a new transfer with a new buffer",
            }),
        }
    }

    /// Waits until NIXL is done with the transfer, at most `timeout`: spins for the first
    /// milliseconds, then sleeps between looks.
    ///
    /// # Errors
    /// As for [`Transfer::poll`]; the timeout passing with the transfer still in flight
    /// ([`Error::Nixl`] naming the wait; the transfer goes on and may be waited for again).
    pub fn wait(&mut self, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            if self.poll()? {
                return Ok(());
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(Error::Nixl {
                    call: "waiting for a transfer",
                    problem: format!("still in flight after {timeout:?}"),
                    remedy: "wait longer, or check that the peer still runs and progresses",
                });
            }
            if waited > Duration::from_millis(2) {
                std::thread::sleep(Duration::from_micros(200));
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// The buffer back, once NIXL has completed the transfer; the transfer itself back while
    /// it is in flight, or after it failed (whose buffer UCX may still move: never handed back).
    ///
    /// # Errors
    /// The transfer, still in flight or failed.
    #[allow(clippy::result_large_err, reason = "the error hands the transfer back unchanged")]
    pub fn finish(mut self) -> std::result::Result<Registered<M>, Transfer<'a, M>> {
        if matches!(self.state, State::InFlight | State::Failed) {
            return Err(self);
        }
        self.taken = true;
        // SAFETY: NIXL is done with the request (complete, failed, or never posted), so
        // releasing it frees nothing it still uses; dropped once, here (`taken` keeps Drop off).
        unsafe { ManuallyDrop::drop(&mut self.request) };
        // SAFETY: taken once, here; Drop does not touch it again (`taken`).
        Ok(unsafe { ManuallyDrop::take(&mut self.memory) })
    }
}

impl<M: NixlMemory> Drop for Transfer<'_, M> {
    fn drop(&mut self) {
        if self.taken {
            return;
        }
        let start = Instant::now();
        while self.state == State::InFlight && start.elapsed() < DROP_WAIT {
            let _ = self.poll();
            std::thread::sleep(Duration::from_micros(200));
        }
        if matches!(self.state, State::InFlight | State::Failed) {
            // NIXL may still move the buffer's bytes: leak it and the request rather than free
            // or deregister it under the transfer.
            tracing::error!(
                "a NIXL transfer dropped while UCX may still move its bytes (in flight after {DROP_WAIT:?}, \
                 or failed): leaking its buffer"
            );
            return;
        }
        // SAFETY: NIXL is done with the request and the buffer; each dropped once, here.
        unsafe {
            ManuallyDrop::drop(&mut self.request);
            ManuallyDrop::drop(&mut self.memory);
        }
    }
}
