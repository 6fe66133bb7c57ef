"""The linear allocator and alloc_ctx_tensors(_from_buft): packing, splitting, views, errors."""

import logging

import pytest

import ggml_lite as gl
from ggml_lite import errors


def test_tallocr_bumps_by_padded_alloc_size():
    buf = gl.cpu_buffer_type().alloc_buffer(200)
    ta = gl.TAllocr(buf)
    c = gl.Context()
    ts = [c.new_tensor_1d(gl.F32, n, name=f"t{n}") for n in (1, 8, 9)]
    addrs = [ta.alloc(t) for t in ts]
    base = buf.get_base()
    assert [a - base for a in addrs] == [0, 32, 64] and ta.offset == 128
    assert ts[2].buffer is buf and ts[2].data == base + 64


def test_tallocr_uses_the_buffers_32_extra_bytes():
    buf = gl.cpu_buffer_type().alloc_buffer(64)  # reported size 96 from the base
    ta = gl.TAllocr(buf)
    c = gl.Context()
    ta.alloc(c.new_tensor_1d(gl.F32, 16))
    ta.alloc(c.new_tensor_1d(gl.F32, 8))  # 64 + 32 == 96: fits in the slack, as in the C
    with pytest.raises(errors.OutOfBufferSpaceError, match=r"'late'.*needed 32 bytes, available 0"):
        ta.alloc(c.new_tensor_1d(gl.F32, 1, name="late"))


def test_not_enough_space_is_logged(caplog):
    buf = gl.cpu_buffer_type().alloc_buffer(0)
    c = gl.Context()
    with caplog.at_level(logging.ERROR, logger="ggml_lite"), pytest.raises(errors.OutOfBufferSpaceError):
        gl.TAllocr(buf).alloc(c.new_tensor_1d(gl.F32, 100, name="big"))
    assert "not enough space in the buffer to allocate big (needed 416, available 32)" in caplog.text


def test_alloc_ctx_tensors_single_buffer_with_views_and_preallocated():
    c = gl.Context()
    a = c.new_tensor_2d(gl.F32, 10, 10, name="a")
    av = gl.transpose(c, a)
    pre = c.new_tensor_1d(gl.F32, 4, name="pre")
    other = gl.cpu_buffer_type().alloc_buffer(16)
    gl.tensor_alloc(other, pre, other.get_base())
    pre_view = gl.view_1d(c, pre, 2, 4)
    q = c.new_tensor_1d(gl.Q8_0, 64, name="q")
    buf = gl.alloc_ctx_tensors(c, gl.cpu_buffer_type())
    assert buf.get_size() == 416 + 96 + 32
    assert q.data - buf.get_base() == 416 and av.data == a.data and av.buffer is buf
    assert pre.buffer is other and pre_view.buffer is other and pre_view.data == pre.data + 4


def test_nothing_to_allocate_returns_none():
    c = gl.Context()
    assert gl.alloc_ctx_tensors(c, gl.cpu_buffer_type()) is None
    c.new_tensor_1d(gl.F32, 0)  # an empty tensor takes no space
    assert gl.alloc_ctx_tensors(c, gl.cpu_buffer_type()) is None


def test_max_size_splits_into_a_multi_buffer():
    """cur + this > max_size starts a new buffer. Padded sizes 896, 512, 512, 128, 1024, 128 with
    max 1024 give ranges [w0] [w1 w2] (exactly 1024: no split) [w3] [w4] [w5]."""
    dev = gl.BufferType("DEV", 128, max_size=1024)
    c = gl.Context()
    ts = [c.new_tensor_1d(gl.F32, n, name=f"w{i}") for i, n in enumerate([200, 100, 128, 10, 256, 1])]
    buf = gl.alloc_ctx_tensors_from_buft(c, dev)
    assert buf.is_multi_buffer() and buf.get_name() == "DEV"
    assert [p.get_size() for p in buf.buffers] == [896, 1024, 128, 1024, 128]
    assert [buf.buffers.index(t.buffer) for t in ts] == [0, 1, 1, 2, 3, 4]
    assert [t.data - t.buffer.get_base() for t in ts] == [0, 0, 512, 0, 0, 0]
    assert buf.get_size() == 3200


def test_too_large_tensor_frees_what_was_allocated(caplog):
    dev = gl.BufferType("DEV", 32, max_size=100)
    c = gl.Context()
    c.new_tensor_1d(gl.F32, 20, name="ok")
    c.new_tensor_1d(gl.F32, 20, name="ok2")
    c.new_tensor_1d(gl.F32, 30, name="huge")
    with caplog.at_level(logging.ERROR, logger="ggml_lite"), \
            pytest.raises(errors.TensorTooLargeError, match=r"'huge'.*128 bytes.*maximum buffer size 100.*DEV"):
        gl.alloc_ctx_tensors_from_buft(c, dev)
    assert "tensor huge is too large to fit in a DEV buffer (tensor size: 128, max buffer size: 100)" in caplog.text
    assert c.tensors[0].buffer.freed  # the first range had been allocated and is released again


def test_failed_buffer_allocation_returns_none():
    class Refusing(gl.BufferType):
        def alloc_buffer(self, size):
            return None

    c = gl.Context()
    c.new_tensor_1d(gl.F32, 4)
    assert gl.alloc_ctx_tensors_from_buft(c, Refusing("NO", 32)) is None


def test_alloc_ctx_tensors_takes_a_backend_default_buffer_type():
    class Backend:
        def get_default_buffer_type(self):
            return gl.cpu_buffer_type()

    c = gl.Context()
    t = c.new_tensor_1d(gl.F32, 4)
    assert gl.alloc_ctx_tensors(c, Backend()).get_size() == 64 and t.data is not None
