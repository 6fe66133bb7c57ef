"""Buffer types, buffers, multi-buffers, tensor placement and numpy views (ggml-backend.c buffer layer)."""

import numpy as np
import pytest

import ggml_lite as gl
from ggml_lite import errors


def test_cpu_buffer_type_arithmetic():
    buft = gl.cpu_buffer_type()
    assert buft is gl.cpu_buffer_type()
    got = (buft.get_name(), buft.get_alignment(), buft.get_max_size(), buft.is_host())
    assert got == ("CPU", 32, gl.SIZE_MAX, True)
    for n in (0, 1, 1000, 4096):
        b = buft.alloc_buffer(n)
        assert b.get_size() == n + 32 and b.get_base() % 32 == 0 and 0 <= b.get_base() - b.data < 32
        assert b.get_name() == "CPU" and b.get_usage() == gl.BufferUsage.ANY and b.get_type() is buft
        assert b.get_alignment() == 32 and b.is_host() and not b.is_multi_buffer()


def test_bases_that_need_aligning_occur():
    lost = [(b.get_base() - b.data) for b in (gl.cpu_buffer_type().alloc_buffer(n) for n in (8, 24, 40, 56))]
    assert 16 in lost and 0 in lost  # the simulated malloc is only 16-byte aligned, as glibc's


def test_buffer_type_defaults_and_alloc_size_hook():
    dev = gl.BufferType("DEV", 128, max_size=1 << 20, alloc_size=lambda t: t.nbytes + 64)
    c = gl.Context()
    t = c.new_tensor_1d(gl.F32, 10)
    assert dev.get_alloc_size(t) == 104 and gl.BufferType("D2", 64).get_alloc_size(t) == 40
    assert not dev.is_host() and dev.get_max_size() == 1 << 20
    b = dev.alloc_buffer(1000)
    assert b.get_base() % 128 == 0 and b.get_size() == 1000 and b.get_alloc_size(t) == 104
    assert b.get_max_size() == 1 << 20
    bad = gl.BufferType("BAD", 32, alloc_size=lambda t: 1)
    with pytest.raises(errors.BufferStateError, match="below its nbytes"):
        bad.get_alloc_size(t)


def test_tensor_alloc_and_view_init_errors():
    c = gl.Context()
    a = c.new_tensor_1d(gl.F32, 8, name="a")
    v = gl.view_1d(c, a, 4, 8)
    b = gl.cpu_buffer_type().alloc_buffer(32)
    with pytest.raises(errors.TensorNotAllocatedError, match="'a'"):
        gl.view_init(v)
    with pytest.raises(errors.TensorAlreadyAllocatedError, match="view"):
        gl.tensor_alloc(b, v, b.get_base())
    with pytest.raises(errors.TensorBoundsError, match="'a'"):
        gl.tensor_alloc(b, a, b.get_base() + 40)
    with pytest.raises(errors.TensorBoundsError):
        gl.tensor_alloc(b, a, b.get_base() - 32)
    gl.tensor_alloc(b, a, b.get_base())
    assert a.buffer is b and a.data == b.get_base()
    with pytest.raises(errors.TensorAlreadyAllocatedError, match="'a'"):
        gl.tensor_alloc(b, a, b.get_base())
    gl.view_init(v)
    assert v.buffer is b and v.data == a.data + 8
    with pytest.raises(errors.TensorAlreadyAllocatedError):
        gl.view_init(v)
    with pytest.raises(errors.BufferStateError, match="not a view"):
        gl.view_init(c.new_tensor_1d(gl.F32, 1))


def test_numpy_views_share_bytes_through_permutes_and_views():
    c = gl.Context()
    x = c.new_tensor_3d(gl.F32, 4, 3, 2, name="x")
    p = gl.permute(c, x, 2, 0, 1, 3)
    row = gl.view_1d(c, x, 4, 16)
    buf = gl.alloc_ctx_tensors(c, gl.cpu_buffer_type())
    data = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    gl.tensor_array(x)[:] = data
    # permute(2, 0, 1, 3): source dim0 -> 2, dim1 -> 0, dim2 -> 1, i.e. result ne = [ne1, ne2, ne0]
    assert p.ne[:3] == [3, 2, 4] and gl.tensor_array(p).shape == (4, 2, 3)
    assert gl.tensor_array(p)[1, 0, 2] == data[0, 2, 1]
    assert np.array_equal(gl.tensor_array(row), data[0, 1])
    gl.tensor_array(row)[:] = -1
    assert np.all(gl.tensor_array(x)[0, 1] == -1)
    assert buf.get_tensor(x, 16, 16) == np.full(4, -1, np.float32).tobytes()
    buf.set_tensor(x, np.float32([7]).tobytes(), 0, 4)
    assert gl.tensor_array(x)[0, 0, 0] == 7


def test_quantized_and_f16_views():
    c = gl.Context()
    q = c.new_tensor_2d(gl.Q4_0, 64, 3)
    h = c.new_tensor_1d(gl.F16, 5)
    gl.alloc_ctx_tensors(c, gl.cpu_buffer_type())
    a = gl.tensor_array(q)
    assert a.shape == (3, 2) and a.dtype.itemsize == 18 and a["qs"].shape == (3, 2, 16)
    gl.tensor_array(h)[:] = [0.5, 1, 2, 3, 65504]
    assert gl.tensor_array(h).dtype == np.float16 and gl.tensor_array(h)[-1] == 65504


def test_data_access_errors():
    c = gl.Context()
    a = c.new_tensor_1d(gl.F32, 4, name="a")
    with pytest.raises(errors.TensorNotAllocatedError, match="'a'"):
        gl.tensor_array(a)
    buf = gl.alloc_ctx_tensors(c, gl.cpu_buffer_type())
    with pytest.raises(errors.TensorBoundsError, match=r"\[12, 20\).*16 bytes"):
        buf.get_tensor(a, 12, 8)
    with pytest.raises(errors.TensorBoundsError, match="write"):
        buf.set_tensor(a, b"\0" * 8, 12, 8)
    with pytest.raises(errors.TensorBoundsError, match="only 2 given"):
        buf.set_tensor(a, b"\0" * 2, 0, 4)
    dev = gl.BufferType("DEV", 64)
    d = gl.Context()
    t = d.new_tensor_1d(gl.F32, 4, name="t")
    gl.alloc_ctx_tensors(d, dev)
    with pytest.raises(errors.BufferStateError, match="not host memory"):
        gl.tensor_array(t)


def test_free_clear_reset_and_double_free():
    b = gl.cpu_buffer_type().alloc_buffer(16)
    b.clear(7)
    # a buffer of 16 + 32 bytes whose base is aligned to 32: its bytes run from the malloc'ed `data` to
    # `base + 48`, 48 to 79 of them by where the simulated malloc placed it (the tests run before decide)
    assert b.get_size() == 48 and len(b.memory()) == b._extent() and 48 <= len(b.memory()) < 48 + 32
    assert (b.memory() == 7).all()
    b.reset()
    b.free()
    with pytest.raises(errors.BufferFreedError, match="freed"):
        b.free()
    with pytest.raises(errors.BufferFreedError):
        b.get_base()
    with pytest.raises(errors.BufferFreedError):
        b.clear(0)


def test_multi_buffer():
    parts = [gl.cpu_buffer_type().alloc_buffer(n) for n in (10, 20)]
    mb = gl.multi_buffer_alloc_buffer(parts)
    assert mb.is_multi_buffer() and mb.get_size() == 42 + 52
    assert mb.get_name() == "CPU" and mb.get_type() is parts[0].buft
    mb.set_usage(gl.BufferUsage.WEIGHTS)
    assert [p.get_usage() for p in parts] == [gl.BufferUsage.WEIGHTS] * 2
    mb.clear(3)
    assert all((p.memory() == 3).all() for p in parts)
    with pytest.raises(errors.BufferStateError, match="no base"):
        mb.get_base()
    c = gl.Context()
    t = c.new_tensor_1d(gl.F32, 1)
    with pytest.raises(errors.BufferStateError):
        mb.set_tensor(t, b"1234", 0, 4)
    assert mb.cpy_tensor(t, t) is False
    mb.free()
    assert all(p.freed for p in parts)
    with pytest.raises(errors.BufferStateError):
        gl.MultiBuffer([])


def test_buffer_from_ptr_uses_the_memory_in_place():
    mem = np.zeros(64, dtype=np.uint8)
    b = gl.cpu_buffer_from_ptr(mem)
    assert b.get_size() == 64 and b.get_base() == b.data and b.get_base() % 32 == 0
    c = gl.Context()
    t = c.new_tensor_1d(gl.I32, 4)
    gl.tensor_alloc(b, t, b.get_base() + 16)
    gl.tensor_array(t)[:] = [1, 2, 3, 4]
    assert mem[16:32].view(np.int32).tolist() == [1, 2, 3, 4]
    with pytest.raises(errors.AlignmentError, match="aligned"):
        gl.cpu_buffer_from_ptr(mem, address=0x1010)
    b.free()
    assert mem[16] == 1  # the wrapped memory is not the buffer's to free


def test_copy_tensor_between_buffers():
    c = gl.Context()
    src = c.new_tensor_1d(gl.F32, 4, name="src")
    dst = c.new_tensor_1d(gl.F32, 4, name="dst")
    dev = c.new_tensor_1d(gl.F32, 4, name="dev")
    b1 = gl.cpu_buffer_type().alloc_buffer(64)
    gl.tensor_alloc(b1, src, b1.get_base())
    gl.tensor_alloc(b1, dst, b1.get_base() + 32)
    gl.tensor_array(src)[:] = [1, 2, 3, 4]
    assert gl.buffer_copy_tensor(src, dst) is True and gl.tensor_array(dst).tolist() == [1, 2, 3, 4]
    devbuf = gl.BufferType("DEV", 64).alloc_buffer(64)
    gl.tensor_alloc(devbuf, dev, devbuf.get_base())
    assert gl.buffer_copy_tensor(dev, dst) is False  # a CPU buffer declines a non-host source
    with pytest.raises(errors.TensorNotAllocatedError):
        gl.buffer_copy_tensor(src, c.new_tensor_1d(gl.F32, 4))
