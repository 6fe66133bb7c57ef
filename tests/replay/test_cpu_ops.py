"""The CPU kernels against the recorded op fixtures (`tests/fixtures/ggml-seed-ops`).

Every case of every fixture file is replayed: the inputs are created with the ggml_lite API (f16 and
quantized inputs from their raw bytes), the recorded graph is rebuilt op by op with ggml_lite's
constructors (and each node's ne, nb, op_params and view offset checked against the record), the
context is allocated in a CPU buffer, every node is computed in order with `compute_forward`, and the
output is compared with the recorded one within the tolerance of its case (`TOLERANCES`, from the
fixture README's figures: 0 where the README says bit-exact, its measured bound otherwise). The
worst relative error of every case is recorded (`record_property`) and `summary()` prints them all.

Run: `.venv/bin/python -m pytest tests/replay/test_cpu_ops.py`
(`python test_cpu_ops.py` prints the summary table).
"""

import json
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ggml_lite as gl
from ggml_lite.cpu import NUMPY, Arithmetic, ComputeParams
from ggml_lite.cpu import compute_forward as cpu_compute_forward
from ggml_lite.exact import compute_forward_exact as compute_forward  # the fixtures are ggml's bits
from ggml_lite.exact import gelu_table, libm_exact, quantize_row_q8_0, v_expf
from ggml_lite.graphio import rebuild_tensor
from ggml_lite.quants import fma_f32, fp32_to_fp16, quantize_row_q8_0_ref
from ggml_lite.tensor import Op
from helpers import FIXTURES, OPS_FILES

OPS_DIR = FIXTURES / "ggml-seed-ops"

FILES = ["ops_binary", "ops_unary", "ops_copy", "ops_get_rows", "ops_mul_mat", "ops_norm", "ops_rope", "ops_softmax"]

# ---------------------------------------------------------------------------------------------
# Tolerances: the largest relative error |ours - ggml| / |ggml| allowed per case, taken from the
# fixture README ("How exact the values are"). 0 means bit-identical output (f16 outputs: identical
# bytes). The README's figures compare ggml with exact float64 arithmetic; these kernels emulate
# ggml's float32 steps, so they may not exceed them.
# ---------------------------------------------------------------------------------------------
EXACT = 0.0
CORRECTLY_ROUNDED = 1e-6   # README: "essentially correctly rounded (<= 0.6 ulp)" and "a few ulp (<= 2.3 ulp)"
TOLERANCES = {
    # bit-exact in the README
    "add_same_shape": EXACT, "add_bcast_row": EXACT, "add_bcast_dim2": EXACT,
    "sub_same_shape": EXACT, "sub_bcast_row": EXACT, "sub_bcast_dim2": EXACT, "add1": EXACT,
    "abs": EXACT, "sgn": EXACT, "neg": EXACT, "step": EXACT, "relu": EXACT, "scale": EXACT,
    "diag_mask_inf": EXACT, "diag_mask_zero": EXACT,
    "cpy_f32_f16": EXACT, "cpy_f16_f32": EXACT, "cpy_k_cache_store": EXACT, "cpy_v_cache_store_transposed": EXACT,
    "cont_permute_0213": EXACT, "cont_permute_1203": EXACT, "cont_transpose": EXACT, "cont_2d_kqv_merged": EXACT,
    "cont_f16_transpose": EXACT, "concat_dim0": EXACT, "concat_dim1": EXACT, "concat_dim2": EXACT,
    "get_rows_f32": EXACT, "get_rows_f16": EXACT, "get_rows_q8_0": EXACT, "get_rows_q4_0": EXACT,
    # "f16-exact": the value is an f16 table entry; ours must be the same entry
    "gelu": EXACT, "gelu_quick": EXACT, "gelu_wide": EXACT,
    # essentially correctly rounded (<= 0.6 ulp) / a few ulp (<= 2.3 ulp)
    "mul_same_shape": CORRECTLY_ROUNDED, "mul_bcast_row": CORRECTLY_ROUNDED, "mul_bcast_dim2": CORRECTLY_ROUNDED,
    "div_same_shape": CORRECTLY_ROUNDED, "div_bcast_row": CORRECTLY_ROUNDED, "div_bcast_dim2": CORRECTLY_ROUNDED,
    "sqr": CORRECTLY_ROUNDED, "sqrt": CORRECTLY_ROUNDED, "scale_nonpow2": CORRECTLY_ROUNDED,
    "leaky_relu": CORRECTLY_ROUNDED, "exp": CORRECTLY_ROUNDED, "sum_rows": CORRECTLY_ROUNDED, "sum": CORRECTLY_ROUNDED,
    "mean": CORRECTLY_ROUNDED, "tanh": CORRECTLY_ROUNDED, "elu": CORRECTLY_ROUNDED, "sigmoid": CORRECTLY_ROUNDED,
    "hardswish": CORRECTLY_ROUNDED, "hardsigmoid": CORRECTLY_ROUNDED, "log": CORRECTLY_ROUNDED,
    "silu": CORRECTLY_ROUNDED,
    # soft_max: README relative <= 2.3e-7 (all variants)
    "soft_max": 2.5e-7, "soft_max_ext_mask_scale": 2.5e-7, "soft_max_ext_scale_nomask": 2.5e-7,
    "soft_max_ext_alibi": 2.5e-7, "soft_max_diag_mask_inf": 2.5e-7,
    # norms: rms_norm <= 1.6 ulp (relative <= 2e-7), norm relative <= 1.3e-6
    "rms_norm_eps1e-5": 2e-7, "rms_norm_eps1e-6_odd": 2e-7, "rms_norm_mul_weight": 2e-7,
    "norm_eps1e-5": 1.4e-6, "norm_odd": 1.4e-6,
    # mul_mat: f16/q8_0/q4_0 relative < 1e-6 (src1 as vec_dot converted), attention cases <= 0.5 ulp,
    # f32 x f32 relative 1.2e-5, the GQA case 6.8e-5
    "mul_mat_f32_f32": 1.2e-5, "mul_mat_f32_f32_k200": 1.2e-5, "mul_mat_f32_bcast_gqa": 7e-5,
    "mul_mat_f16_f32": 1e-6, "mul_mat_q8_0_f32": 1e-6, "mul_mat_q4_0_f32": 1e-6, "mul_mat_f16_f32_k200": 1e-6,
    "mul_mat_kq_f16_permuted": 1.2e-7, "mul_mat_kqv_f16_strided_view": 1.2e-7,
    # rope: relative <= 6.4e-6
    "rope_ext_normal": 6.5e-6, "rope_ext_neox": 6.5e-6, "rope_ext_normal_partial": 6.5e-6,
    "rope_ext_neox_partial": 6.5e-6, "rope_ext_normal_base500k": 6.5e-6, "rope_ext_neox_yarn": 6.5e-6,
}


def load_cases():
    """[(file, case)] for every case of every fixture file (tests/fixtures/ggml-seed-ops), in file order."""
    out = []
    for f in FILES:
        doc = json.loads((OPS_DIR / f"{f}.json").read_text())
        assert doc["schema"] == "ggml-op-fixture" and doc["schema_version"] == 1
        out += [(f, c) for c in doc["cases"]]
    return out


CASES = load_cases()


def _value(v) -> float:
    return float(v) if not isinstance(v, str) else {"inf": np.inf, "-inf": -np.inf, "nan": np.nan}[v]


def _values(seq, dtype=np.float32) -> np.ndarray:
    return np.array([_value(v) for v in seq], dtype=np.float64).astype(dtype)


class Replay:
    """A fixture case rebuilt with ggml_lite: `tensors` by recorded name, `nodes` in graph order."""

    def __init__(self, case: dict):
        self.case = case
        self.ctx = gl.Context("ops")
        self.tensors = {}
        self.nodes = []
        for inp in case["inputs"]:
            t = self.ctx.new_tensor(gl.type_by_name(inp["type"]), inp["ne"], name=inp["name"])
            assert list(t.nb) == inp["nb"], (inp["name"], t.nb, inp["nb"])
            self.tensors[inp["name"]] = t
        for spec in case["graph"]:
            t = self._build(spec)
            t.set_name(spec["name"])
            self._check(t, spec)
            self.tensors[spec["name"]] = t
            self.nodes.append(t)

    def _src(self, name: str):
        if name not in self.tensors:
            out = self.case["output"]  # a destination that is not an input: the cpy target / the cache
            assert name == out["name"], f"source {name!r} is neither an input nor the output"
            t = self.ctx.new_tensor(gl.type_by_name(out["type"]), out["ne"], name=name)
            assert list(t.nb) == out["nb"]
            self.tensors[name] = t
        return self.tensors[name]

    def _build(self, spec):
        """The node rebuilt with the table of ggml's op constructors that also loads the graph fixtures
        (`graphio.rebuild_tensor`); sources are found by recorded name."""
        replay = self

        class Sources(dict):
            def __missing__(self, name):
                return replay._src(name)

        return rebuild_tensor(self.ctx, spec, Sources(self.tensors))

    @staticmethod
    def _check(t, spec):
        words = list(t.op_params)
        while words and words[-1] == 0:
            words.pop()
        got = (t.op.name, t.type.name, list(t.ne), list(t.nb), words, t.view_offs)
        want = (spec["op"], spec["type"], spec["ne"], spec["nb"], spec["op_params"], spec["view_offs"])
        assert got == want, f"{spec['name']}: built {got}, recorded {want}"
        vs = t.view_src.name if t.view_src is not None else None
        assert vs == spec["view_src"], (spec["name"], vs, spec["view_src"])

    def allocate_and_fill(self):
        buf = gl.alloc_ctx_tensors(self.ctx, gl.cpu_buffer_type())
        for t in self.ctx.tensors:  # leafs that are not inputs (cpy targets, caches) start as zeros
            if t.view_src is None and t.op is Op.NONE:
                buf.set_tensor(t, bytes(gl.nbytes(t)), 0, gl.nbytes(t))
        for inp in self.case["inputs"]:
            t = self.tensors[inp["name"]]
            if "data_hex" in inp:
                raw = bytes.fromhex(inp["data_hex"])
                assert len(raw) == gl.nbytes(t)
                buf.set_tensor(t, raw, 0, len(raw))
            elif inp["type"] == "i32":
                gl.tensor_array(t)[...] = np.array(inp["data"], dtype=np.int32).reshape(gl.tensor_array(t).shape)
            else:
                gl.tensor_array(t)[...] = _values(inp["data"]).reshape(gl.tensor_array(t).shape)
        return buf

    def run(self, params=None):
        """Compute the case's nodes: bit-exact (each node with the exact tier), or with `params`."""
        self.allocate_and_fill()
        for node in self.nodes:
            compute_forward(node) if params is None else cpu_compute_forward(node, params)
        return self.tensors[self.case["output"]["name"]]


def compare(case: dict, out_tensor) -> dict:
    """Worst errors of our output against the recorded one: relative, ulps, bytes equal (f16)."""
    rec = case["output"]
    want = _values(rec["data"])
    got = np.array(gl.tensor_array(out_tensor), dtype=np.float32).reshape(-1)
    same_bytes = None
    if "data_hex" in rec:
        same_bytes = np.asarray(gl.tensor_array(out_tensor)).tobytes() == bytes.fromhex(rec["data_hex"])
    both_nan = np.isnan(want) & np.isnan(got)
    equal = (want == got) | both_nan
    w64, g64 = want.astype(np.float64), got.astype(np.float64)
    with np.errstate(all="ignore"):
        diff = np.abs(g64 - w64)
        rel = np.where(equal, 0.0, np.where(w64 != 0, diff / np.abs(w64), np.inf))
        ulp = np.where(equal, 0.0, diff / np.spacing(np.abs(want)).astype(np.float64))
    return {"n": want.size, "n_equal": int(equal.sum()), "max_rel": float(rel.max()) if rel.size else 0.0,
            "max_ulp": float(ulp.max()) if ulp.size else 0.0, "same_bytes": same_bytes}


RESULTS: dict[str, dict] = {}


def replay_case(case: dict) -> dict:
    r = Replay(case)
    res = compare(case, r.run())
    RESULTS[case["name"]] = res
    return res


@pytest.mark.parametrize("fc", CASES, ids=[c["name"] for _, c in CASES])
def test_op_fixture(fc, record_property):
    _, case = fc
    tol = TOLERANCES[case["name"]]
    res = replay_case(case)
    record_property("max_rel_error", res["max_rel"])
    record_property("max_ulp_error", res["max_ulp"])
    record_property("tolerance", tol)
    if res["same_bytes"] is not None and tol == EXACT:
        assert res["same_bytes"], f"{case['name']}: f16 bytes differ ({res})"
    assert res["max_rel"] <= tol, f"{case['name']}: worst relative error {res['max_rel']:.3g} > {tol:.3g} ({res})"


@pytest.mark.parametrize("fc", CASES, ids=[c["name"] for _, c in CASES])
def test_op_fixture_numpy_tier(fc):
    """The default tier (plain numpy, `cpu_init()`) against ggml's recorded result, within the tolerance it
    states (`Arithmetic.TOLERANCE_*`), normwise: max|ours - ggml's| / max|ggml's|. Infinities and NaNs
    must be where ggml has them."""
    _, case = fc
    r = Replay(case)
    got = np.array(gl.tensor_array(r.run(ComputeParams(NUMPY))), dtype=np.float64).reshape(-1)
    want = _values(case["output"]["data"]).astype(np.float64)
    finite = np.isfinite(want)
    assert np.array_equal(np.isnan(got), np.isnan(want)), case["name"]
    assert np.array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)]), case["name"]
    mixed = any(t.type.name != "f32" and t.type is not gl.I32 for t in r.tensors.values())
    tol = Arithmetic.TOLERANCE_MIXED if mixed else Arithmetic.TOLERANCE_F32
    scale = max(float(np.abs(want[finite]).max(initial=0.0)), np.finfo(np.float32).tiny)
    err = float(np.abs(got[finite] - want[finite]).max(initial=0.0)) / scale
    assert err <= tol, f"{case['name']}: numpy tier {err:.3g} > {tol:g}"


def test_every_case_has_a_tolerance():
    assert sorted(FILES) == OPS_FILES  # every recorded file is read
    assert len(CASES) == 80
    assert {c["name"] for _, c in CASES} == set(TOLERANCES)


def test_every_case_is_bit_identical_with_the_c_library():
    """With the C library's expf/expm1f/logf/tanhf/... per element (`libm_exact`), every one of the
    recorded outputs is reproduced bit for bit (f16 outputs byte for byte)."""
    with libm_exact():
        results = {case["name"]: compare(case, Replay(case).run()) for _, case in CASES}
    differ = {k: r for k, r in results.items() if r["n_equal"] != r["n"] or r["same_bytes"] is False}
    assert not differ, differ


def _replay_with(case, change_input=None):
    r = Replay(case)
    r.allocate_and_fill()
    if change_input:
        change_input(r)
    for node in r.nodes:
        compute_forward(node)
    return compare(case, r.tensors[case["output"]["name"]])


def test_a_one_ulp_input_change_fails_an_exact_case():
    case = next(c for _, c in CASES if c["name"] == "add_same_shape")
    assert _replay_with(case)["max_rel"] == 0

    def bump(r):
        a = gl.tensor_array(r.tensors["a"])
        a.reshape(-1)[5] = np.nextafter(a.reshape(-1)[5], np.float32(np.inf))

    res = _replay_with(case, bump)
    assert res["max_rel"] > TOLERANCES["add_same_shape"] and res["n_equal"] == res["n"] - 1


def test_a_wrong_f16_rounding_fails(monkeypatch):
    """Truncating instead of rounding to nearest even in the f32 -> f16 conversion breaks cpy_f32_f16."""
    kernels = sys.modules["ggml_lite.cpu"]  # where results are stored

    def truncating(x):
        bits = np.asarray(x, dtype=np.float32).view(np.uint32)
        return np.where(np.isfinite(x), (bits & 0xFFFFE000).view(np.float32), x).astype(np.float16)

    case = next(c for _, c in CASES if c["name"] == "cpy_f32_f16")
    monkeypatch.setattr(kernels, "fp32_to_fp16", truncating)
    res = _replay_with(case)
    assert res["same_bytes"] is False and res["max_rel"] > TOLERANCES["cpy_f32_f16"]


# ---------------------------------------------------------------------------------------------
# Units that the fixtures do not pin down
# ---------------------------------------------------------------------------------------------

def _exact_fma(a, b, c) -> np.float32:
    from fractions import Fraction
    e = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    # round the rational to float32, ties to even: bracket it between neighbouring float32 values
    f = np.float32(float(e))  # float(e) is correctly rounded to double; adjust if that misrounded to f32
    if Fraction(float(f)) <= e:
        lo, hi = f, np.nextafter(f, np.float32(np.inf))
    else:
        lo, hi = np.nextafter(f, np.float32(-np.inf)), f
    dlo, dhi = e - Fraction(float(lo)), Fraction(float(hi)) - e
    if dlo != dhi:
        return lo if dlo < dhi else hi
    return lo if int(np.float32(lo).view(np.uint32)) % 2 == 0 else hi


def test_fma_f32_rounds_once():
    # the double-rounding trap: a·b + c is just below an f32 midpoint, but the float64 sum lands on it
    a = np.float32(2.0**-24 * (1 - 2.0**-18))
    b = np.float32(1 + 2.0**-18)
    c = np.float32(1 + 2.0**-23)
    assert fma_f32(a, b, c) == np.float32(1 + 2.0**-23)  # a float64 sum rounded to f32 gives 1 + 2^-22
    assert np.float32(np.float64(a) * np.float64(b) + np.float64(c)) == np.float32(1 + 2.0**-22)
    rng = np.random.default_rng(7)
    scale = np.float32(2.0) ** rng.integers(-130, 20, (3, 3000)).astype(np.float32)  # down to f32 subnormals
    x = rng.standard_normal((3, 3000)).astype(np.float32) * scale
    got = fma_f32(x[0], x[1], x[2])
    want = np.array([_exact_fma(*t) for t in x.T], dtype=np.float32)
    assert np.array_equal(got, want)


def test_v_expf_is_ggmls_vector_exp():
    x = np.linspace(-100, 88, 20001, dtype=np.float32)
    e = v_expf(x).astype(np.float64)
    ref = np.exp(x.astype(np.float64))
    ulp = np.abs(e - ref) / np.spacing(np.abs(ref.astype(np.float32))).astype(np.float64)
    assert ulp[ref > 1e-37].max() < 2.0  # "max error 1.45358 plus 0.5 ulps"
    assert v_expf(np.float32([-np.inf, -200, 100, np.inf]))[:2].tolist() == [0.0, 0.0]
    assert np.isinf(v_expf(np.float32([100, np.inf]))).all()


def test_q8_0_quantizers_differ_on_ties():
    x = np.zeros((1, 32), np.float32)
    x[0, 0], x[0, 1], x[0, 2] = 127, 2.5, -3.5  # amax 127: d = 1, id = 1 in both quantizers
    assert quantize_row_q8_0(x)["qs"][0, 0, :3].tolist() == [127, 2, -4]      # ties to even (SIMD)
    assert quantize_row_q8_0_ref(x)["qs"][0, 0, :3].tolist() == [127, 3, -4]  # roundf: away from zero
    assert NUMPY.from_float(gl.Q8_0, x)["qs"][0, 0, :3].tolist() == [127, 2, -4]  # the numpy tier: ggml's from_float


def test_both_tiers_convert_src1_to_the_dot_type():
    """`Arithmetic.to_vec_dot`: f16 (nearest even) for f16 weights, ggml's `quantize_row_q8_0` blocks for
    q8_0 and q4_0 weights (the numpy tier's blocks equal the exact tier's, NaN-free rows), nothing for
    f32 weights or a src1 already converted."""
    rng = np.random.default_rng(5)
    y = rng.uniform(-3, 3, (2, 3, 4, 64)).astype(np.float32)
    y[0, 0, 0, :32] = np.arange(32) + np.float32(0.5)  # a block of ties: amax 127 gives id = 1
    y[0, 0, 0, 0] = 127
    exact = gl.cpu_init(exact=True).arith
    assert NUMPY.to_vec_dot(gl.F32, y) is y
    assert np.array_equal(NUMPY.to_vec_dot(gl.F16, y), y.astype(np.float16))
    for w in (gl.Q8_0, gl.Q4_0):
        blocks = NUMPY.to_vec_dot(w, y)
        assert blocks.shape == (2, 3, 4, 2) and np.array_equal(blocks, exact.to_vec_dot(w, y))
        assert np.array_equal(blocks, quantize_row_q8_0(y)) and not np.array_equal(blocks, quantize_row_q8_0_ref(y))
        assert NUMPY.to_vec_dot(w, blocks) is blocks


def test_gelu_table_semantics():
    x = np.float32([-12, -10, -9.99, -0.5, 0.0, 0.5, 3.0, 9.99, 10, 12])
    ctx = gl.Context()
    a = ctx.new_tensor_1d(gl.F32, x.size)
    y = gl.gelu(ctx, a)
    gl.alloc_ctx_tensors(ctx, gl.cpu_buffer_type())
    gl.tensor_array(a)[...] = x
    compute_forward(y)
    out = np.array(gl.tensor_array(y))
    inside = (x > -10) & (x < 10)
    table = gelu_table()[fp32_to_fp16(x[inside]).view(np.uint16)].astype(np.float32)
    assert np.array_equal(out[inside], table)
    assert out[x <= -10].tolist() == [0, 0] and out[x >= 10].tolist() == [10, 12]
    assert np.array_equal(out[inside], out[inside].astype(np.float16).astype(np.float32))  # f16 values


def _alloc(ctx):
    gl.alloc_ctx_tensors(ctx, gl.cpu_buffer_type())


def test_in_place_ops_equal_their_out_of_place_versions():
    rng = np.random.default_rng(3)
    ctx = gl.Context()
    x = ctx.new_tensor_3d(gl.F32, 16, 4, 3)
    w = ctx.new_tensor_1d(gl.F32, 16)
    pairs = []
    for inplace in (False, True):
        xi = gl.cont(ctx, x)  # a private copy to work on
        r = {
            "add": gl.add_inplace(ctx, xi, w) if inplace else gl.add(ctx, xi, w),
        }
        pairs.append((xi, r))
    _alloc(ctx)
    gl.tensor_array(x)[...] = rng.uniform(-1, 1, gl.tensor_array(x).shape)
    gl.tensor_array(w)[...] = rng.uniform(-1, 1, 16)
    for xi, r in pairs:
        compute_forward(xi)
        for node in r.values():
            compute_forward(node)
    (x0, r0), (x1, r1) = pairs
    assert np.array_equal(np.array(gl.tensor_array(r0["add"])), np.array(gl.tensor_array(r1["add"])))
    assert r1["add"].data == x1.data  # the in-place result really shares its source's memory

    # a chain of in-place ops on one buffer: scale, rms_norm, soft_max, rope, unary, diag_mask
    def chain(inplace):
        c = gl.Context()
        a = c.new_tensor_3d(gl.F32, 16, 4, 3)
        p = c.new_tensor_1d(gl.I32, 3)
        t = gl.scale(c, a, 0.5, inplace=inplace)
        t = gl.rms_norm(c, t, 1e-6, inplace=inplace)
        t = gl.rope_ext(c, t, p, None, 16, 2, 0, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0, inplace=inplace)
        t = gl.silu(c, t, inplace=inplace)
        t = gl.diag_mask_inf(c, t, 1, inplace=inplace)
        t = gl.soft_max(c, t, inplace=inplace)
        gf = gl.build_forward(t)
        _alloc(c)
        gl.tensor_array(a)[...] = np.random.default_rng(5).uniform(-2, 2, gl.tensor_array(a).shape)
        gl.tensor_array(p)[...] = [1, 7, 300]
        for node in gf.nodes:
            compute_forward(node)
        return np.array(gl.tensor_array(t)), t.data == a.data

    out_of_place, shared0 = chain(False)
    in_place, shared1 = chain(True)
    assert shared1 and not shared0
    assert np.array_equal(out_of_place, in_place)


def test_view_ops_compute_nothing():
    ctx = gl.Context()
    a = ctx.new_tensor_2d(gl.F32, 4, 3)
    views = [gl.transpose(ctx, a), gl.permute(ctx, a, 1, 0, 2, 3), gl.reshape_1d(ctx, a, 12), gl.view_1d(ctx, a, 4, 8)]
    _alloc(ctx)
    gl.tensor_array(a)[...] = np.arange(12, dtype=np.float32).reshape(3, 4)
    before = a.buffer.memory().copy()
    for v in views:
        compute_forward(v)
    assert np.array_equal(before, a.buffer.memory())


@pytest.mark.skipif(not hasattr(gl, "sim_init"), reason="this ggml_lite has no SIM backend yet")
def test_device_memory_is_computed_in_place_with_device_true():
    """A backend with non-host memory (SIM) runs the same kernels on its own bytes (`device=True`)."""
    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(3, 8)
    outs = []
    for where in ("host", "device"):
        ctx = gl.Context(where)
        a = ctx.new_tensor_2d(gl.F32, 8, 3)
        y = gl.silu(ctx, a)
        gl.alloc_ctx_tensors(ctx, gl.cpu_buffer_type() if where == "host" else gl.sim_init())
        gl.tensor_set(a, x)
        if where == "device":
            with pytest.raises(gl.BufferStateError):
                compute_forward(y)  # host access to device memory is refused
        compute_forward(y, device=where == "device")
        outs.append(gl.tensor_get(y))
    assert np.array_equal(outs[0], outs[1])


def _one(build):
    ctx = gl.Context()
    node = build(ctx)
    _alloc(ctx)
    return node


def test_unsupported_combinations_raise():
    # ggml's sub kernel has no f16 variant
    with pytest.raises(gl.DataTypeError, match="f32 src0 only"):
        compute_forward(_one(lambda c: gl.sub(c, c.new_tensor_1d(gl.F16, 8), c.new_tensor_1d(gl.F32, 8))))
    # mul_mat asserts nb10 == element size: a transposed src1
    with pytest.raises(gl.LayoutError, match="permuted src0 or src1"):
        compute_forward(_one(lambda c: gl.mul_mat(c, c.new_tensor_2d(gl.F32, 4, 3),
                                                   gl.transpose(c, c.new_tensor_2d(gl.F32, 5, 4)))))
    # add asserts nb00 == sizeof(float)
    with pytest.raises(gl.LayoutError, match="nb\\[0\\]"):
        compute_forward(_one(lambda c: gl.add(c, gl.transpose(c, c.new_tensor_2d(gl.F32, 4, 4)),
                                               c.new_tensor_2d(gl.F32, 4, 4))))
    # rope with an odd unrotated tail: ggml would write past every row
    with pytest.raises(gl.ShapeError, match="odd"):
        compute_forward(_one(lambda c: gl.rope_ext(c, c.new_tensor_3d(gl.F32, 9, 2, 1), c.new_tensor_1d(gl.I32, 1),
                                                    None, 4, 0, 0, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)))
    # a quantized source cannot be converted by dup
    with pytest.raises(gl.DataTypeError):
        compute_forward(_one(lambda c: gl.cpy(c, c.new_tensor_1d(gl.Q8_0, 32), c.new_tensor_1d(gl.F32, 32))))
    # get_rows with a row index outside src0
    node = _one(lambda c: gl.get_rows(c, c.new_tensor_2d(gl.F32, 4, 3), c.new_tensor_1d(gl.I32, 2)))
    gl.tensor_array(node.src[1])[...] = [1, 3]
    with pytest.raises(gl.TensorBoundsError):
        compute_forward(node)


# ---------------------------------------------------------------------------------------------
# op_params from a hostile file: every op the CPU kernels compute, each of its 16 op_params words
# (GGML_MAX_OP_PARAMS = 64 bytes) set to any int32, computed on both tiers: a result or a
# ggml_lite error (exit 2 on the command line), never another exception.
# ---------------------------------------------------------------------------------------------
def _op_graphs():
    """{name: build(ctx) -> the node whose op_params are drawn}: one small graph per kernel (and per
    variant of one: NeoX and YaRN rope, rope with freq_factors, soft_max with a mask)."""
    def t(c, *ne, type=gl.F32):
        return c.new_tensor(type, list(ne))

    def rope(c, mode, ff):
        x, pos = t(c, 8, 2, 3), t(c, 3, type=gl.I32)
        return gl.rope_ext(c, x, pos, t(c, 4) if ff else None, 8, mode, 64, 10000.0, 1.0, 1.0 if ff else 0.0,
                           1.0, 32.0, 1.0)

    return {
        "add": lambda c: gl.add(c, t(c, 8, 3), t(c, 8)),
        "sub": lambda c: gl.sub(c, t(c, 8, 3), t(c, 8, 3)),
        "mul": lambda c: gl.mul(c, t(c, 8, 3), t(c, 8, 3)),
        "div": lambda c: gl.div(c, t(c, 8, 3), t(c, 8, 1)),
        "add1": lambda c: gl.add1(c, t(c, 8, 3), t(c, 1)),
        "sqr": lambda c: gl.sqr(c, t(c, 8, 3)),
        "sqrt": lambda c: gl.sqrt(c, t(c, 8, 3)),
        "log": lambda c: gl.log(c, t(c, 8, 3)),
        "dup": lambda c: gl.dup(c, t(c, 8, 3)),
        "cont": lambda c: gl.cont(c, gl.transpose(c, t(c, 8, 3))),
        "cpy": lambda c: gl.cpy(c, t(c, 8, 3), t(c, 8, 3, type=gl.F16)),
        "sum": lambda c: gl.sum(c, t(c, 8, 3)),
        "sum_rows": lambda c: gl.sum_rows(c, t(c, 8, 3)),
        "mean": lambda c: gl.mean(c, t(c, 8, 3)),
        "concat": lambda c: gl.concat(c, t(c, 8, 3), t(c, 8, 2), 1),
        "norm": lambda c: gl.norm(c, t(c, 8, 3), 1e-5),
        "rms_norm": lambda c: gl.rms_norm(c, t(c, 8, 3), 1e-5),
        "mul_mat": lambda c: gl.mul_mat(c, t(c, 32, 3, type=gl.F16), t(c, 32, 2)),
        "mul_mat_q8_0": lambda c: gl.mul_mat(c, t(c, 32, 3, type=gl.Q8_0), t(c, 32, 2)),
        "scale": lambda c: gl.scale(c, t(c, 8, 3), 0.5),
        "get_rows": lambda c: gl.get_rows(c, t(c, 8, 3), t(c, 2, type=gl.I32)),
        "diag_mask_inf": lambda c: gl.diag_mask_inf(c, t(c, 4, 3, 2), 1),
        "diag_mask_zero": lambda c: gl.diag_mask_zero(c, t(c, 4, 3, 2), 1),
        "soft_max": lambda c: gl.soft_max(c, t(c, 8, 3, 2)),
        "soft_max_ext": lambda c: gl.soft_max_ext(c, t(c, 8, 3, 2), t(c, 8, 3), 0.5, 8.0),
        "rope": lambda c: rope(c, 0, False),
        "rope_neox": lambda c: rope(c, 2, False),
        "rope_yarn_ff": lambda c: rope(c, 2, True),
        "unary": lambda c: gl.gelu(c, t(c, 8, 3)),
        "leaky_relu": lambda c: gl.leaky_relu(c, t(c, 8, 3), 0.1),
    }


OP_GRAPHS = _op_graphs()
INT32_EDGES = [0, 1, -1, 2, -2, 3, 4, 7, 8, 9, 16, 32, -32, 63, 64, 2**31 - 1, -2**31, 2**30, -2**30]


def _fill_inputs(node) -> None:
    """Seeded values for the leafs under `node`: i32 row numbers in range, floats in [-1, 1)."""
    rng = np.random.default_rng(0)
    seen, stack = set(), [node]
    while stack:
        t = stack.pop()
        if t is None or t in seen:
            continue
        seen.add(t)
        stack += [*t.src, t.view_src]
        if t.op is Op.NONE and t.view_src is None:
            if t.type is gl.I32:
                gl.tensor_set(t, rng.integers(0, 3, t.nelements).astype(np.int32))
            elif t.type is gl.F16:
                gl.tensor_set(t, rng.uniform(-1, 1, t.nelements).astype(np.float16))
            elif t.type is gl.Q8_0:
                values = rng.uniform(-1, 1, t.nelements).astype(np.float32)
                gl.tensor_set(t, quantize_row_q8_0_ref(values).view(np.uint8))
            else:
                gl.tensor_set(t, rng.uniform(-1, 1, t.nelements).astype(np.float32))


def _compute_with_op_param(name: str, slot: int, value: int) -> None:
    """OP_GRAPHS[name] with op_params[slot] = value, computed on both tiers: a result or a ggml_lite
    error naming the node (its op), nothing else."""
    for exact in (False, True):
        ctx = gl.Context()
        node = OP_GRAPHS[name](ctx)
        _alloc(ctx)
        _fill_inputs(node)
        node.op_params[slot] = value
        try:
            gl.cpu_init(exact=exact).graph_compute(gl.graph.build_forward(node))
        except gl.GGMLLiteError as e:
            assert node.op.name in str(e), (name, slot, value, e)


@pytest.mark.parametrize("name", sorted(OP_GRAPHS))
def test_every_op_param_word_at_its_edges(name):
    """A graph file can hold any int32 in any op_params word of a node (the reader checks the range):
    each of the 16 words of each op's node set to each of INT32_EDGES (0, ±1, ±2, ±32, 2^31 - 1,
    -2^31...). The kernels refuse a size, index or dimension they cannot use (ROPE's n_dims below 0,
    CONCAT's dim out of 0..3 or one the shapes do not fit, DIAG_MASK's n_past below 0, UNARY's op code)
    and compute anything else; a word read as a float (eps, scale, slope, rope's frequencies) may be
    any float, NaN and infinities included."""
    for slot in range(16):
        for value in INT32_EDGES:
            _compute_with_op_param(name, slot, value)


@pytest.mark.parametrize("name", sorted(OP_GRAPHS))
@settings(max_examples=60, deadline=None, derandomize=True)
@given(slot=st.integers(0, 15), value=st.integers(-2**31, 2**31 - 1))
def test_any_op_param_gives_a_result_or_an_error(name, slot, value):
    """As above, for int32 values drawn at random (hypothesis) in any word."""
    _compute_with_op_param(name, slot, value)


def summary() -> str:
    """The table quoted in the notes: case, op, tolerance, worst relative error, worst ulps, equal values."""
    lines = [f"{'case':32} {'op':14} {'tolerance':>9} {'max rel':>9} {'max ulp':>8} {'equal':>9}"]
    passed = 0
    for _, case in CASES:
        res = RESULTS.get(case["name"]) or replay_case(case)
        tol = TOLERANCES[case["name"]]
        ok = res["max_rel"] <= tol and (res["same_bytes"] is not False or tol != EXACT)
        passed += ok
        op = case["op"] if case["op"] != "UNARY" else case["unary_op"].lower()
        lines.append(f"{case['name']:32} {op:14} {tol:9.2g} {res['max_rel']:9.2g} {res['max_ulp']:8.3g} "
                     f"{res['n_equal']:>4}/{res['n']:<4}{'' if ok else '  FAIL'}")
    lines.append(f"{passed}/{len(CASES)} op fixture cases within tolerance; "
                 f"{sum(1 for r in RESULTS.values() if r['n_equal'] == r['n'])} bit-identical")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary())


def test_mul_mat_by_a_view_of_itself_rounds_as_by_a_copy():
    """Scheduler sweep seed 5743 (--long): mul_mat(reshape(x), x) read both operands from one buffer,
    and numpy's matmul then takes its `syrk` path (A @ A.T), which rounds otherwise than the `gemm`
    of the same values in two buffers -- so the CPU alone and a backend holding two copies disagreed.
    The numpy tier copies an aliased src1 first: the result does not depend on where operands live."""
    ctx = gl.Context("compute")
    x = ctx.new_tensor(gl.F32, [96, 4, 3, 1])
    gl.set_input(x)
    same_buffer = gl.mul_mat(ctx, gl.reshape_3d(ctx, x, 96, 4, 3), x)
    two_buffers = gl.mul_mat(ctx, gl.reshape_3d(ctx, x, 96, 4, 3), gl.cont(ctx, x))
    gf = gl.Graph()
    gl.build_forward_expand(gf, same_buffer)
    gl.build_forward_expand(gf, two_buffers)
    gl.GAllocr(gl.cpu_buffer_type()).alloc_graph(gf)
    gl.tensor_set(x, np.random.default_rng(5743).uniform(-1, 1, 96 * 4 * 3).astype(np.float32))
    gl.cpu_init().graph_compute(gf)
    assert np.array_equal(gl.tensor_get(same_buffer), gl.tensor_get(two_buffers))
