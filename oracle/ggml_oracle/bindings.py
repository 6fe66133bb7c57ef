"""ggml-python 0.0.45 made safe to call, and the maps between ggml_lite's names and ggml's codes.

* ggml-python 0.0.45 wraps ggml 0.15.3 (`ggml.ggml_version()`). Four of its ctypes declarations give
  a pointer-returning function a `typing.NewType` (i.e. `int`) as `restype`, so ctypes returns a C
  `int` and the 64-bit pointer is cut to 32 bits — the next call with it crashes. `apply_ctypes_fixes`
  sets `restype = c_void_p` on `ggml_backend_cpu_buffer_type`, `ggml_backend_alloc_buffer`,
  `ggml_backend_cpu_buffer_from_ptr` and `ggml_backend_sched_get_tensor_backend` and checks that
  none of their arguments is declared narrower than a pointer. (A scan of every ctypes function the
  package exports finds exactly these four.) `need_ggml()` returns the `ggml` module with the fixes
  applied; every other module of the oracle reaches ggml through it.
* **Buffer size: ggml-python reports 32 bytes less** (`CPU_BUFFER_SIZE_DELTA`, see the package docstring).
"""

from __future__ import annotations

import ctypes
from typing import Any

from ggml_lite.tensor import TensorFlag

_g: Any
IMPORT_ERROR: Exception | None
try:  # ggml-python is a test dependency; tests skip when it is missing
    import ggml as _g

    IMPORT_ERROR = None
except Exception as err:  # pragma: no cover - depends on the environment
    _g = None
    IMPORT_ERROR = err

CPU_BUFFER_SIZE_DELTA = 32  # reference CPU buffer size - ggml-python's (see the module docstring)
FLAG_MASK = int(TensorFlag.INPUT | TensorFlag.OUTPUT | TensorFlag.PARAM)
ALIGNMENT = 32


def available() -> bool:
    """Can the real ggml be used here?"""
    return _g is not None


# ---------------------------------------------------------------------------------------------
# ctypes fixes
# ---------------------------------------------------------------------------------------------

# function -> the C argument kinds ("p": pointer, "z": size_t)
FIXED = {
    "ggml_backend_cpu_buffer_type": (),
    "ggml_backend_alloc_buffer": ("p", "z"),
    "ggml_backend_cpu_buffer_from_ptr": ("p", "z"),
    "ggml_backend_sched_get_tensor_backend": ("p", "p"),
}
_POINTER_WIDE = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_ssize_t, ctypes.c_uint64,
                 ctypes.c_int64)
_fixed = False


def is_pointer_wide(argtype) -> bool:
    if argtype in _POINTER_WIDE:
        return True
    return isinstance(argtype, type) and issubclass(argtype, (ctypes._Pointer, ctypes.c_void_p))


def apply_ctypes_fixes() -> list:
    """Make ggml-python 0.0.45 safe to call for the functions this module (or a caller) uses: set
    `restype = c_void_p` on the four pointer-returning functions it declares with an `int` restype,
    and make sure each of their arguments is declared pointer-wide (a pointer argument declared
    `c_int` would be truncated too). Idempotent; returns the names of the functions it changed."""
    global _fixed
    if _g is None:
        raise RuntimeError(f"ggml-python is not importable: {IMPORT_ERROR}")
    changed = []
    lib = _g.lib  # the shared-library proxy; its functions are the objects the `ggml` module exports
    for name, kinds in FIXED.items():
        # the module's function is the library's (ggml-python's decorator returns the ctypes object);
        # fix both should that ever change
        for fn in {id(f): f for f in (getattr(lib, name), getattr(_g, name))}.values():
            if fn.restype is not ctypes.c_void_p:
                fn.restype = ctypes.c_void_p
                changed.append(name)
            args = list(fn.argtypes or [])
            if len(args) != len(kinds):
                raise RuntimeError(f"{name}: ggml-python declares {len(args)} arguments, "
                                   f"the C function has {len(kinds)}")
            fixed_args = [a if is_pointer_wide(a) else (ctypes.c_void_p if k == "p" else ctypes.c_size_t)
                          for a, k in zip(args, kinds)]
            if fixed_args != args:
                fn.argtypes = fixed_args
                changed.append(name + " (argtypes)")
    _fixed = True
    return changed


def need_ggml():
    if _g is None:
        raise RuntimeError(f"ggml-python is not importable: {IMPORT_ERROR}")
    if not _fixed:
        apply_ctypes_fixes()
    return _g



# ---------------------------------------------------------------------------------------------
# name <-> value maps, read from the shared library itself
# ---------------------------------------------------------------------------------------------

_TYPE_CODES: dict[str, int] = {}
_UNARY_CODES: dict[str, int] = {}
_OP_NAMES: dict[int, str] = {}


def _type_code(t) -> int:
    code = _TYPE_CODES.get(t.name)
    if code is None:
        g = need_ggml()
        code = getattr(g, "GGML_TYPE_" + t.name.upper())
        got = g.ggml_type_name(code).decode()
        if got != t.name:
            raise RuntimeError(f"ggml-python's GGML_TYPE_{t.name.upper()} = {code} is {got!r} in the library")
        _TYPE_CODES[t.name] = code
    return code


def _unary_code(u) -> int:
    code = _UNARY_CODES.get(u.name)
    if code is None:
        g = need_ggml()
        code = getattr(g, "GGML_UNARY_OP_" + u.name)
        got = g.ggml_unary_op_name(code).decode()
        if got != u.name:
            raise RuntimeError(f"ggml-python's GGML_UNARY_OP_{u.name} = {code} is {got!r} in the library")
        _UNARY_CODES[u.name] = code
    return code


def _op_name(code: int) -> str:
    name = _OP_NAMES.get(code)
    if name is None:
        name = _OP_NAMES[code] = need_ggml().ggml_op_name(code).decode()
    return name

