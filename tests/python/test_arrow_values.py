"""Numeric Arrow arrays read from their buffers (relax_straggler.readers.arrow_values) equal
pyarrow's own conversion, slices and nulls included."""

import numpy as np
import pyarrow as pa
import pytest

from relax_straggler.readers.arrow_values import nulls, values

TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint32(), pa.float16(), pa.float32(),
         pa.float64()]


@pytest.mark.parametrize("t", TYPES, ids=str)
def test_values_and_nulls_match_pyarrow_on_slices(t):
    rng = np.random.default_rng(3)
    raw = rng.integers(0, 100, 77).astype(t.to_pandas_dtype())
    mask = rng.random(77) < 0.2
    col = pa.array(raw, type=t, mask=mask)
    for sliced in (col, col.slice(5), col.slice(9, 40), col.slice(76), col.slice(3, 0)):
        want_null = np.asarray(sliced.is_null())
        assert nulls(sliced).tolist() == want_null.tolist()
        got = values(sliced)
        assert got.dtype == np.dtype(t.to_pandas_dtype())
        want = np.asarray(sliced.fill_null(0)) if sliced.null_count else np.asarray(sliced)
        assert got[~want_null].tolist() == want[~want_null].tolist()


def test_an_array_without_nulls_has_no_null_mask_to_read():
    col = pa.array([1.5, 2.5], type=pa.float64())
    assert col.buffers()[0] is None
    assert nulls(col).tolist() == [False, False] and values(col).tolist() == [1.5, 2.5]


def test_a_non_numeric_array_is_refused():
    with pytest.raises(TypeError, match="string is not an integer or floating-point type"):
        values(pa.array(["1"]))
