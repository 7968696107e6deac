//! [`Claims`]: which ranges of one buffer or file are held, for reading or for writing.
//!
//! A range held for reading may overlap other ranges held for reading; a range held for
//! writing overlaps nothing. Chunks of a [`super::Chunked`] buffer and windows of a
//! [`super::WindowedFile`] claim their range here when made and release it when dropped, so
//! safe code never holds two views of one byte of which one may write.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

/// How a range is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Only read: may overlap other reads.
    Read,
    /// Read and written: overlaps nothing.
    Write,
}

#[derive(Debug)]
struct Held {
    id: u64,
    range: Range<u64>,
    access: Access,
}

#[derive(Debug, Default)]
struct Ledger {
    held: Vec<Held>,
    next_id: u64,
}

/// The ranges held of one buffer or file.
#[derive(Debug)]
pub(crate) struct Claims {
    /// What the ranges are of, for errors: `buffer range`, `file window`.
    what: &'static str,
    ledger: Mutex<Ledger>,
}

impl Claims {
    pub(crate) fn new(what: &'static str) -> Arc<Claims> {
        Arc::new(Claims { what, ledger: Mutex::new(Ledger::default()) })
    }

    /// Holds `range` with `access` until the returned claim drops.
    ///
    /// # Errors
    /// [`Error::RangeInUse`] when it overlaps a range held for writing, or is to be written
    /// and overlaps any range held.
    pub(crate) fn claim(self: &Arc<Self>, range: Range<u64>, access: Access) -> Result<Claim> {
        let mut ledger = self.ledger.lock().unwrap_or_else(|poison| poison.into_inner());
        let conflict = ledger.held.iter().find(|held| {
            held.range.start < range.end
                && range.start < held.range.end
                && (access == Access::Write || held.access == Access::Write)
        });
        if let Some(held) = conflict {
            return Err(Error::RangeInUse {
                what: self.what,
                asked: range,
                held: held.range.clone(),
                held_exclusively: held.access == Access::Write,
            });
        }
        let id = ledger.next_id;
        ledger.next_id += 1;
        ledger.held.push(Held { id, range, access });
        Ok(Claim { claims: Arc::clone(self), id })
    }

    /// How many ranges are held.
    pub(crate) fn count(&self) -> usize {
        self.ledger.lock().unwrap_or_else(|poison| poison.into_inner()).held.len()
    }
}

/// A range held in [`Claims`], released on drop. A claim that is never dropped (its owner
/// forgotten or leaked) keeps its range held for good, which is safe.
#[derive(Debug)]
pub(crate) struct Claim {
    claims: Arc<Claims>,
    id: u64,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut ledger = self.claims.ledger.lock().unwrap_or_else(|poison| poison.into_inner());
        ledger.held.retain(|held| held.id != self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_overlap_reads_and_writes_overlap_nothing() {
        let claims = Claims::new("buffer range");
        let first = claims.claim(10..20, Access::Read).unwrap();
        let second = claims.claim(15..30, Access::Read).unwrap();
        let refused = claims.claim(19..21, Access::Write).unwrap_err();
        assert!(
            matches!(&refused, Error::RangeInUse { asked, held, held_exclusively: false, .. }
                if *asked == (19..21) && *held == (10..20)),
            "{refused}"
        );
        let beside = claims.claim(30..40, Access::Write).unwrap();
        let refused = claims.claim(35..36, Access::Read).unwrap_err().to_string();
        assert!(
            refused.contains("buffer range 35..36 overlaps 30..40, which is held for writing"),
            "{refused}"
        );
        assert_eq!(claims.count(), 3);
        drop((first, second));
        let _write = claims.claim(0..30, Access::Write).unwrap();
        drop(beside);
        assert_eq!(claims.count(), 1);
    }

    #[test]
    fn a_forgotten_claim_keeps_its_range() {
        let claims = Claims::new("file window");
        std::mem::forget(claims.claim(0..8, Access::Write).unwrap());
        assert!(claims.claim(4..5, Access::Read).is_err());
        assert_eq!(claims.count(), 1);
    }
}
