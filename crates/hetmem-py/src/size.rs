//! Integers from Python that become sizes, offsets, extents or indices: taken as any Python
//! int (so a negative or huge one reaches Rust, not a bare conversion error), then checked
//! here, with the argument named in the error. Every byte count derived from them is
//! computed with checked arithmetic by the caller ([`product`], [`checked_add`]).

use pyo3::exceptions::{PyOverflowError, PyValueError};
use pyo3::prelude::*;

/// A Python int, unchecked: any int (or object with `__index__`) converts, so a negative or
/// huge one reaches Rust and is refused by [`Int::size`] with the argument named, not by the
/// conversion with a bare message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Int(Wide);

/// An int's value, or the side of the 128-bit range it lies past.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wide {
    Value(i128),
    Above,
    Below,
}

impl<'py> FromPyObject<'_, 'py> for Int {
    type Error = PyErr;

    fn extract(obj: Borrowed<'_, 'py, PyAny>) -> PyResult<Int> {
        match obj.extract::<i128>() {
            Ok(value) => Ok(Int(Wide::Value(value))),
            // An int past 128 bits: kept, to be refused where its argument is known.
            Err(error) if error.is_instance_of::<PyOverflowError>(obj.py()) => {
                Ok(Int(if obj.lt(0)? { Wide::Below } else { Wide::Above }))
            }
            Err(error) => Err(error),
        }
    }
}

impl Int {
    /// The value, or None for an int past 128 bits.
    pub(crate) fn value(self) -> Option<i128> {
        match self.0 {
            Wide::Value(value) => Some(value),
            Wide::Above | Wide::Below => None,
        }
    }

    /// The value as a size, offset or index: `what` names the argument in the error.
    ///
    /// # Errors
    /// `ValueError` for a negative value or one past what this machine can address.
    pub(crate) fn size(self, what: &str) -> PyResult<usize> {
        let value = match self.0 {
            Wide::Value(value) => value,
            Wide::Below => {
                return Err(PyValueError::new_err(format!(
                    "{what}: a negative int past 128 bits; give a value >= 0"
                )));
            }
            Wide::Above => {
                return Err(PyValueError::new_err(format!(
                    "{what}: an int past 128 bits is larger than this machine can address ({} at most)",
                    usize::MAX
                )));
            }
        };
        if value < 0 {
            return Err(PyValueError::new_err(format!("{what}: {value} is negative; give a value >= 0")));
        }
        usize::try_from(value).map_err(|_| {
            PyValueError::new_err(format!(
                "{what}: {value} is larger than this machine can address ({} at most)",
                usize::MAX
            ))
        })
    }
}

impl std::fmt::Display for Int {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Wide::Value(value) => write!(f, "{value}"),
            Wide::Above => f.write_str("an int past 128 bits"),
            Wide::Below => f.write_str("a negative int past 128 bits"),
        }
    }
}

/// Each value of `values` as a size (see [`Int::size`]).
///
/// # Errors
/// As for [`Int::size`], naming the position.
pub(crate) fn sizes(values: &[Int], what: &str) -> PyResult<Vec<usize>> {
    values.iter().enumerate().map(|(at, value)| value.size(&format!("{what}[{at}]"))).collect()
}

/// The product of `factors`, or a `ValueError` naming `what` when it overflows.
///
/// # Errors
/// The product does not fit in a `usize`.
pub(crate) fn product(factors: impl IntoIterator<Item = usize>, what: &str) -> PyResult<usize> {
    factors
        .into_iter()
        .try_fold(1usize, usize::checked_mul)
        .ok_or_else(|| PyValueError::new_err(format!("{what}: the byte count overflows; give smaller sizes")))
}

/// `a + b`, or a `ValueError` naming `what` when it overflows.
///
/// # Errors
/// The sum does not fit in a `usize`.
pub(crate) fn checked_add(a: usize, b: usize, what: &str) -> PyResult<usize> {
    a.checked_add(b)
        .ok_or_else(|| PyValueError::new_err(format!("{what}: {a} + {b} overflows; give smaller sizes")))
}
