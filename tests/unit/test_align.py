"""aligned_offset and GGML_PAD."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

import ggml_lite as gl
from ggml_lite import errors

aligns = st.integers(0, 12).map(lambda k: 1 << k)


@given(base=st.integers(0, 2**48), off=st.integers(0, 2**40), a=aligns)
def test_aligned_offset_is_the_smallest_aligned_address(base, off, a):
    o = gl.aligned_offset(base, off, a)
    assert (base + o) % a == 0 and off <= o < off + a


@given(x=st.integers(0, 2**50), a=aligns)
def test_pad_equals_aligned_offset_from_null(x, a):
    assert gl.GGML_PAD(x, a) == gl.aligned_offset(None, x, a) == -(-x // a) * a


@pytest.mark.parametrize("bad", [0, 3, 6, 24, 100, -8])
def test_non_power_of_two_alignment(bad):
    with pytest.raises(errors.AlignmentError, match=str(bad)):
        gl.GGML_PAD(10, bad)
    with pytest.raises(errors.AlignmentError):
        gl.aligned_offset(0, 10, bad)
    with pytest.raises(errors.AlignmentError):
        gl.DynTAllocr(bad)
    with pytest.raises(errors.AlignmentError):
        gl.BufferType("X", bad)
