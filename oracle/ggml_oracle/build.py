"""How the installed ggml was built, and so how the differential tests compare with it."""

from __future__ import annotations

from .bindings import IMPORT_ERROR, available, need_ggml

# ---------------------------------------------------------------------------------------------
# how the oracle was built: bit-exact comparisons only where it sums in the reproduced order
# ---------------------------------------------------------------------------------------------

# `ggml_cpu_has_*` report the instruction sets ggml was *compiled* for (compile-time macros), which
# fix the SIMD width and so the order in which dot products, silu's and soft_max's vectorised exp and
# the row sums are evaluated. ggml_lite's exact kernels reproduce the build of the recorded fixtures:
# x86-64 with AVX2, FMA and F16C, no AVX-512, no llamafile sgemm. `make setup` builds ggml-python that
# way (GGML_NATIVE=OFF ...), but a user's own install may be native: then the comparisons below the
# exact ones fall back to the documented tolerance (`tests/differential/test_compute_differential.py`).
REPRODUCED_BUILD = {"avx2": True, "fma": True, "f16c": True, "avx512": False, "llamafile": False}
_BUILD_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512", "avx512_vnni", "neon", "arm_fma", "sve", "llamafile")


def build_info() -> dict:
    """{flag: bool} for the instruction sets the installed ggml was compiled with (`ggml_cpu_has_avx2`,
    `ggml_cpu_has_avx512`, ...); a flag ggml-python does not export is False."""
    g = need_ggml()
    info = {}
    for flag in _BUILD_FLAGS:
        try:
            info[flag] = bool(getattr(g, f"ggml_cpu_has_{flag}")())
        except (AttributeError, RuntimeError):  # not exported by this ggml-python / this library
            info[flag] = False
    return info


def sums_in_reproduced_order() -> bool:
    """Does the installed ggml evaluate in the order ggml_lite's exact kernels reproduce?"""
    info = build_info()
    return all(info[k] == v for k, v in REPRODUCED_BUILD.items())


def describe_build() -> str:
    """One line for the test report: which ggml, built with what, compared how."""
    if not available():
        return f"ggml-python is not importable ({IMPORT_ERROR}): the differential tests skip"
    info = build_info()
    flags = " ".join(k.upper() for k, v in info.items() if v) or "no SIMD"
    mode = ("bit-exact comparisons (the build of the recorded fixtures)" if sums_in_reproduced_order() else
            "comparisons within the documented tolerance (another summation order than the fixtures' build)")
    return f"ggml {need_ggml().ggml_version().decode()} via ggml-python, built with {flags}: {mode}"

