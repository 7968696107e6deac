"""Sizes and offsets from callers, checked before a descriptor is made of them."""

from __future__ import annotations

import operator
from typing import Any, Tuple



def _size(value: Any, what: str) -> int:
    """A non-negative integer, or a clear error (Python integers do not overflow: the sums of
    two such values are exact, and each is checked against what it indexes)."""
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an integer, not {type(value).__name__}") from None
    if number < 0:
        raise ValueError(f"{what} {number}: it must be >= 0")
    return number


def _part(total: int, offset: Any, nbytes: Any, what: str) -> Tuple[int, int]:
    offset = _size(offset, f"{what} offset")
    nbytes = total - offset if nbytes is None else _size(nbytes, f"{what} nbytes")
    if nbytes <= 0 or offset + nbytes > total:
        raise ValueError(f"{what}: bytes {offset}..{offset + nbytes} of {total}: a part must hold at least one byte "
                         "and lie inside the registration")
    return offset, nbytes
