//! Fault injection for tests: make the Nth allocation, registration, launch, copy or fence wait
//! fail, to prove that hetmem's error paths lose no data, never hang, and say what failed.
//!
//! Rules are armed process-wide through [`crate::testing::faults`] (feature `testing`); a test
//! that arms them runs in a child process of its own, so no other test sees them. Without the
//! feature every check compiles to nothing.
//!
//! This module sits below every other: a fault it injects is an [`Injected`], which each
//! layer's error type converts from (`crate::Error::InjectedFault` above the backend).

/// Where a fault can be injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum FaultPoint {
    /// Allocating host, pinned, managed or device memory.
    Allocation,
    /// Registering existing memory with the driver.
    Registration,
    /// Launching a kernel, or running an operation's CPU path on the CPU backend.
    Launch,
    /// A copy between buffers (copy engines, or memcpy on the CPU backend).
    Copy,
    /// Waiting for a lease's last work (reclaiming or dropping it).
    FenceWait,
}

#[cfg(feature = "testing")]
impl FaultPoint {
    /// The driver call hetmem makes at this point, for messages.
    pub fn call(self) -> &'static str {
        match self {
            FaultPoint::Allocation => "memory allocation",
            FaultPoint::Registration => "cuMemHostRegister",
            FaultPoint::Launch => "kernel launch",
            FaultPoint::Copy => "copy",
            FaultPoint::FenceWait => "fence wait",
        }
    }
}

/// How an injected fault fails.
#[cfg(feature = "testing")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum FaultKind {
    /// As a shortage that may pass (out of memory): [`crate::Error::is_transient`].
    Transient,
    /// As a kernel fault that loses the context: [`crate::Error::is_sticky`]. The context is
    /// not really lost; hetmem's callers react as if it were.
    Sticky,
    /// At a launch on a GPU: a kernel that really stores to an illegal address runs instead,
    /// and the context is really lost for the rest of the process. Elsewhere as `Sticky`.
    Trap,
}

/// A fault that a check injected: the `nth` call at `point` fails as `kind`.
#[cfg(feature = "testing")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Injected {
    /// Where.
    pub point: FaultPoint,
    /// Which call there, counting from 1.
    pub nth: u64,
    /// As what kind of failure.
    pub kind: FaultKind,
}

/// A fault that a check injected; without the feature `testing` none can be.
#[cfg(not(feature = "testing"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Injected {}

/// What a check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hit {
    /// Go on as usual.
    None,
    /// Launch the faulting kernel instead (GPU launches only).
    Trap,
}

#[cfg(feature = "testing")]
pub(crate) use armed::check;
#[cfg(feature = "testing")]
pub use armed::{arm, calls, clear, fired};

/// Checks for a fault at `point`; `Ok(Hit::Trap)` asks a GPU launch to fault for real.
#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn check(_point: FaultPoint) -> Result<Hit, Injected> {
    Ok(Hit::None)
}

/// Checks for a fault at a point that cannot launch the faulting kernel: a trap fails like a
/// sticky error there. The fault comes as the caller's error type, so a layer reports it as
/// it reports its own failures.
#[inline(always)]
pub(crate) fn fail<E: From<Injected>>(point: FaultPoint) -> Result<(), E> {
    match check(point)? {
        Hit::None => Ok(()),
        #[cfg(feature = "testing")]
        Hit::Trap => Err(E::from(Injected { point, nth: calls(point), kind: FaultKind::Trap })),
        #[cfg(not(feature = "testing"))]
        Hit::Trap => Ok(()),
    }
}

#[cfg(feature = "testing")]
mod armed {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use super::{FaultKind, FaultPoint, Hit, Injected};

    /// A fault to inject: the `nth` call at `point` from now (1 is the next) fails as `kind`.
    #[derive(Debug, Clone, Copy)]
    struct Rule {
        point: FaultPoint,
        nth: u64,
        kind: FaultKind,
    }

    /// A fault that was injected.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    #[cfg_attr(feature = "serde", derive(serde::Serialize))]
    pub struct Fired {
        /// Where.
        pub point: FaultPoint,
        /// The call it failed, counting from when the rule was armed (1 is the first).
        pub nth: u64,
        /// How.
        pub kind: FaultKind,
    }

    #[derive(Default)]
    struct State {
        rules: Vec<Rule>,
        calls: HashMap<FaultPoint, u64>,
        fired: Vec<Fired>,
    }

    static STATE: Mutex<Option<State>> = Mutex::new(None);

    fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
        let mut state = STATE.lock().unwrap_or_else(|poison| poison.into_inner());
        f(state.get_or_insert_with(State::default))
    }

    /// Makes the `nth` call at `point` from now on (1 is the next) fail as `kind`.
    pub fn arm(point: FaultPoint, nth: u64, kind: FaultKind) {
        with(|state| {
            let seen = state.calls.get(&point).copied().unwrap_or(0);
            state.rules.push(Rule { point, nth: seen + nth.max(1), kind });
        });
    }

    /// Removes every rule and forgets the counts and the faults fired.
    pub fn clear() {
        *STATE.lock().unwrap_or_else(|poison| poison.into_inner()) = None;
    }

    /// The faults injected so far.
    pub fn fired() -> Vec<Fired> {
        with(|state| state.fired.clone())
    }

    /// Calls seen at `point` so far.
    pub fn calls(point: FaultPoint) -> u64 {
        with(|state| state.calls.get(&point).copied().unwrap_or(0))
    }

    pub(crate) fn check(point: FaultPoint) -> Result<Hit, Injected> {
        with(|state| {
            let count = state.calls.entry(point).or_insert(0);
            *count += 1;
            let call = *count;
            let Some(at) = state.rules.iter().position(|rule| rule.point == point && rule.nth == call) else {
                return Ok(Hit::None);
            };
            let rule = state.rules.remove(at);
            state.fired.push(Fired { point, nth: call, kind: rule.kind });
            tracing::warn!("injecting a {:?} fault into call {call} at {point:?}", rule.kind);
            match rule.kind {
                FaultKind::Trap if point == FaultPoint::Launch => Ok(Hit::Trap),
                kind => Err(Injected { point, nth: call, kind }),
            }
        })
    }
}

#[cfg(feature = "testing")]
pub use armed::Fired;
