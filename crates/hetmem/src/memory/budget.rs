//! Byte budgets: [`PinnedBudget`] for page-locked host memory (bounded by the locked-memory
//! limit, `ulimit -l`) and [`DeviceBudget`] for device memory. An allocation takes a
//! [`Charge`] against a budget before it is made and gives it back when it is freed; a charge
//! that does not fit is refused with [`Error::BudgetExceeded`], naming the budget and what was
//! asked, before any memory is touched.

use std::sync::{Arc, Mutex};

use crate::error::{BudgetKind, Error, Result};

/// A limit and what is taken of it. Shared by the budget's clones and its charges.
#[derive(Debug)]
struct Account {
    kind: BudgetKind,
    limit: u64,
    /// Bytes taken now, and the most ever taken at once.
    taken: Mutex<(u64, u64)>,
}

impl Account {
    fn new(kind: BudgetKind, limit: u64) -> Arc<Account> {
        Arc::new(Account { kind, limit, taken: Mutex::new((0, 0)) })
    }

    fn charge(self: &Arc<Self>, bytes: u64) -> Result<Charge> {
        let mut taken = self.taken.lock().unwrap_or_else(|poison| poison.into_inner());
        let fits = taken.0.checked_add(bytes).is_some_and(|total| total <= self.limit);
        if !fits {
            return Err(Error::BudgetExceeded {
                budget: self.kind,
                asked: bytes,
                in_use: taken.0,
                limit: self.limit,
            });
        }
        taken.0 += bytes;
        taken.1 = taken.1.max(taken.0);
        Ok(Charge { account: Arc::clone(self), bytes })
    }

    fn taken(&self) -> (u64, u64) {
        *self.taken.lock().unwrap_or_else(|poison| poison.into_inner())
    }
}

/// Bytes taken from a budget, given back on drop.
#[derive(Debug)]
pub(crate) struct Charge {
    account: Arc<Account>,
    bytes: u64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        let mut taken = self.account.taken.lock().unwrap_or_else(|poison| poison.into_inner());
        taken.0 -= self.bytes;
    }
}

/// A cap on the page-locked host memory hetmem pins for one purpose (the windows of a
/// [`crate::memory::WindowCache`]). Cheap to clone; clones share the budget.
///
/// The kernel limits the memory a process may lock (`RLIMIT_MEMLOCK`, `ulimit -l`); pinning
/// beyond it fails in the driver with an error that does not say why.
/// [`PinnedBudget::from_memlock`] sizes the budget from that limit, so the cache evicts, or
/// refuses with a remedy, before the driver fails. The limit counts all the process locks;
/// the budget counts only what is charged to it, so leave room for other pinned buffers.
#[derive(Debug, Clone)]
pub struct PinnedBudget {
    account: Arc<Account>,
}

impl PinnedBudget {
    /// A budget of `bytes`.
    pub fn new(bytes: u64) -> PinnedBudget {
        PinnedBudget { account: Account::new(BudgetKind::PinnedMemory, bytes) }
    }

    /// A budget of the process's locked-memory limit (`RLIMIT_MEMLOCK`, soft); where that is
    /// unlimited, half of the machine's memory (the rest stays for the page cache and
    /// everything else), or 1 GiB where the memory cannot be read.
    pub fn from_memlock() -> PinnedBudget {
        PinnedBudget::new(memlock_default(
            rustix::process::getrlimit(rustix::process::Resource::Memlock).current,
            total_memory(),
        ))
    }
}

impl Default for PinnedBudget {
    /// [`PinnedBudget::from_memlock`].
    fn default() -> PinnedBudget {
        PinnedBudget::from_memlock()
    }
}

/// The budget [`PinnedBudget::from_memlock`] picks from the soft locked-memory limit (`None`:
/// unlimited) and the machine's memory.
fn memlock_default(memlock: Option<u64>, total_memory: Option<u64>) -> u64 {
    match memlock {
        Some(limit) => limit,
        None => total_memory.map_or(1 << 30, |total| total / 2),
    }
}

/// The machine's memory in bytes (`MemTotal` of /proc/meminfo).
pub(crate) fn total_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|line| line.starts_with("MemTotal:"))?;
    let kib: u64 = line.trim_start_matches("MemTotal:").trim().trim_end_matches("kB").trim().parse().ok()?;
    kib.checked_mul(1024)
}

/// A cap on the device memory hetmem allocates through it ([`crate::DeviceBuf::with_budget`]),
/// so a program that processes data larger than the GPU's memory, or shares the GPU, can bound
/// what it takes. Cheap to clone; clones share the budget. The budget counts the bytes asked
/// for; the driver rounds allocations up (to 2 MiB for large ones).
#[derive(Debug, Clone)]
pub struct DeviceBudget {
    account: Arc<Account>,
}

impl DeviceBudget {
    /// A budget of `bytes`.
    pub fn new(bytes: u64) -> DeviceBudget {
        DeviceBudget { account: Account::new(BudgetKind::DeviceMemory, bytes) }
    }
}

/// What both budgets answer, from their shared account.
macro_rules! budget_accounting {
    ($budget:ident) => {
        impl $budget {
            /// The budget in bytes.
            pub fn limit(&self) -> u64 {
                self.account.limit
            }

            /// Bytes charged now (held by allocations alive).
            pub fn in_use(&self) -> u64 {
                self.account.taken().0
            }

            /// The most bytes ever charged at once.
            pub fn peak(&self) -> u64 {
                self.account.taken().1
            }

            /// Takes `bytes` until the charge drops.
            ///
            /// # Errors
            /// [`Error::BudgetExceeded`] when they do not fit.
            pub(crate) fn charge(&self, bytes: u64) -> Result<Charge> {
                self.account.charge(bytes)
            }
        }
    };
}

budget_accounting!(PinnedBudget);
budget_accounting!(DeviceBudget);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_are_refused_past_the_limit_and_given_back_on_drop() {
        let limit = fastrand::u64(1 << 20..1 << 30);
        let budget = DeviceBudget::new(limit);
        let first = budget.charge(limit / 2).unwrap();
        let second = budget.charge(limit - limit / 2).unwrap();
        assert_eq!(budget.in_use(), limit);
        let refused = budget.charge(1).unwrap_err();
        assert!(
            matches!(refused, Error::BudgetExceeded { budget: BudgetKind::DeviceMemory, asked: 1, in_use, limit: l }
                if in_use == limit && l == limit)
        );
        let text = refused.to_string();
        assert!(text.contains("device-memory budget") && text.contains(&limit.to_string()), "{text}");
        drop(first);
        assert_eq!(budget.in_use(), limit - limit / 2);
        assert!(budget.charge(u64::MAX).is_err(), "an overflowing charge is refused");
        drop(second);
        assert_eq!((budget.in_use(), budget.peak()), (0, limit));
    }

    #[test]
    fn the_pinned_budget_follows_memlock_or_half_the_memory() {
        assert_eq!(memlock_default(Some(8 << 20), Some(64 << 30)), 8 << 20);
        assert_eq!(memlock_default(None, Some(64 << 30)), 32 << 30);
        assert_eq!(memlock_default(None, None), 1 << 30);
        let total = total_memory().expect("/proc/meminfo has MemTotal");
        assert!(total > 1 << 26, "{total} bytes of memory");
        let budget = PinnedBudget::from_memlock();
        let limit = rustix::process::getrlimit(rustix::process::Resource::Memlock).current;
        assert_eq!(budget.limit(), limit.unwrap_or(total / 2));
        let text = budget.charge(budget.limit() + 1).unwrap_err().to_string();
        assert!(text.contains("memlock") && text.contains("ulimit -l"), "{text}");
    }
}
