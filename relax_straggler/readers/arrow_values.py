"""Numeric Arrow arrays as numpy, read from their buffers.

pyarrow's own conversion (Array.to_numpy, np.asarray of an array) imports pandas whenever
pandas is installed, ~0.2 s of a command's start-up; a reader of a numeric column needs
none of it.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def values(col: pa.Array) -> np.ndarray:
    """(len(col),) the values of an integer or floating-point array, a read-only view of its
    data buffer (a null slot holds whatever the buffer has: mask it with nulls()). Raises
    TypeError for any other type."""
    t = col.type
    if pa.types.is_integer(t):
        dtype = np.dtype(f"{'i' if pa.types.is_signed_integer(t) else 'u'}{t.bit_width // 8}")
    elif pa.types.is_floating(t):
        dtype = np.dtype(f"f{t.bit_width // 8}")
    else:
        raise TypeError(f"arrow_values.values: {t} is not an integer or floating-point type")
    if len(col) == 0:
        return np.empty(0, dtype=dtype)
    return np.frombuffer(col.buffers()[1], dtype=dtype, count=col.offset + len(col))[col.offset:]


def nulls(col: pa.Array) -> np.ndarray:
    """(len(col),) bool, True where col is null (from its validity bitmap)."""
    if col.null_count == 0:
        return np.zeros(len(col), dtype=bool)
    bits = np.unpackbits(np.frombuffer(col.buffers()[0], dtype=np.uint8), bitorder="little")
    return bits[col.offset:col.offset + len(col)] == 0
