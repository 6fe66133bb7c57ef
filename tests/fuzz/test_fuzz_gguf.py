"""Fuzz tests of the `llama` command (issue 22): GGUF headers written with the `gguf` package's writer, then
truncated, corrupted byte by byte, with their numbers (counts, lengths, types, dims, offsets) overwritten by
huge or out-of-range values, or mutated structurally (tensors missing, reshaped, retyped or added, metadata
dropped or retyped); a sparse file's tensor data offsets overwritten and its length cut or extended (each
case judged independently: the tensor llama.cpp's loader refuses first, or the report); and hypothesis over
the command's flags. Each case runs through `llama` in-process
(tests/fuzzing.py) and must end with exit 2 and a specific message naming the file, or exit 0 with the
right report: the one planned from the header as the `gguf` package's own reader reads it (GGUF cases), or
from the flags' model through the API (flag cases). Never a traceback, never unbounded time or memory.

Quick run (default): a few hundred cases in all. `--long` (make test-long): every prefix, every number slot
with every hostile value, and thousands of random and hypothesis cases; each test prints its count."""

import json
import os
import random
import re
import struct
import time
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzzing import assert_sound, run_cli
from ggml_lite.models.llama import KV_TYPES, PRESETS
from ggml_lite.report import memory_report
from ggml_lite.tensor import TYPES, type_by_code
from gguf_writer import (
    QT,
    TINY,
    VT,
    header_reader,
    llama_shapes,
    number_slots,
    oracle_params,
    set_offset,
    tensor_layout,
    write_llama_gguf,
)

NAMED = re.compile(r"header[.:]|kv\[|tensors\[|missing \S+\.weight|a '.*' model")  # the field or the tensor it names
HOSTILE = (0, 1, 3, 13, 255, 2**31 - 1, 2**31, 2**32 - 1, 2**40, 2**62, 2**63, 2**64 - 1)


class Tally:
    """Counts a fuzz test's cases by outcome and prints them (visible in pytest's output)."""

    def __init__(self, kind: str):
        self.kind, self.t0 = kind, time.perf_counter()
        self.counts: Counter[str] = Counter()

    def add(self, outcome: str) -> None:
        self.counts[outcome] += 1

    def report(self, capsys) -> None:
        c = self.counts
        fitted = f" ({c['fitted']} with --fit)" if c["fitted"] else ""
        with capsys.disabled():
            print(f"\nfuzz {self.kind}: {c['refused'] + c['correct']} cases, {c['refused']} refused with exit 2, "
                  f"{c['correct']} correct results{fitted}, {time.perf_counter() - self.t0:.1f} s")


def oracle_report(path) -> dict:
    """The report of the model in `path` as the `gguf` package's reader reads its header."""
    params, codes, _ = oracle_params(path)
    types = {name: type_by_code(code) for name, code in codes.items()}  # (no output.weight: tied)
    offsets = {name: offset for name, _, _, offset in header_reader(path).infos}  # (the host maps this range)
    return memory_report(params, tensor_types=types, why=False, tensor_offsets=offsets).to_json()


def check_gguf_case(path, tally: Tally) -> None:
    """`llama --gguf path --json`: exit 2 naming the file, or exit 0 with the oracle's report."""
    o = assert_sound(run_cli(["llama", "--gguf", path, "--json"]))
    if o.code == 2:
        assert str(path) in o.err and "ModelError" in o.err, o.describe()
        assert NAMED.search(o.err), "the message names no field nor tensor: " + o.describe()
        tally.add("refused")
        return
    doc, want = json.loads(o.out), oracle_report(path)
    assert (doc["model"], doc["graph"], doc["devices"]) == (want["model"], want["graph"], want["devices"]), o.describe()
    tally.add("correct")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A valid header-only GGUF of a 2-layer LLaMA with a 16-token tokenizer list (about 1.9 KB)."""
    return write_llama_gguf(tmp_path_factory.mktemp("base") / "tiny.gguf", tokens=16).read_bytes()


def test_truncated_headers(base, tmp_path, long_run, capsys):
    """Every prefix (--long) or a seeded sample of prefixes of a valid header."""
    cuts = (range(len(base) + 1) if long_run
            else sorted(set(random.Random(1).sample(range(len(base)), 60)) | {0, 3, 24, len(base)}))
    tally = Tally("gguf truncation")
    for cut in cuts:
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(base[:cut])
        check_gguf_case(path, tally)
    assert tally.counts["correct"] >= 1 and tally.counts["refused"] >= len(cuts) - 40
    tally.report(capsys)


def test_numbers_overwritten_with_hostile_values(base, tmp_path, long_run, capsys):
    """Every number of the header (as gguf's reader locates them: counts, lengths, types, values, dims,
    offsets) overwritten with 0, 2^31, 2^40, 2^63, 2^64 - 1, ... (all of them --long, a sample otherwise)."""
    src = tmp_path / "base.gguf"
    src.write_bytes(base)
    cases = [(at, size, v) for at, size, _ in number_slots(src) for v in HOSTILE if v < 2 ** (8 * size)]
    if not long_run:
        cases = random.Random(2).sample(cases, 150)
    tally = Tally("gguf numbers")
    for i, (at, size, value) in enumerate(cases):
        data = bytearray(base)
        data[at:at + size] = struct.pack("<I" if size == 4 else "<Q", value)
        path = tmp_path / f"n{i % 8}.gguf"
        path.write_bytes(data)
        check_gguf_case(path, tally)
    tally.report(capsys)


def test_random_byte_corruption(base, tmp_path, long_run, capsys):
    """1 to 8 random bytes of the header replaced by random values (seeded)."""
    rng = random.Random(3)
    tally = Tally("gguf random bytes")
    for i in range(3000 if long_run else 100):
        data = bytearray(base)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        path = tmp_path / f"r{i % 8}.gguf"
        path.write_bytes(data)
        check_gguf_case(path, tally)
    tally.report(capsys)


def expected_offset_refusal(path):
    """(index, name) of the tensor llama.cpp's checks refuse first in the file at `path`, or None; judged from
    gguf's reader's layout, independently of ggml_lite: the first offset off the alignment (32) while the infos
    are read, then the first tensor whose data end past 2^63 - 1 or, unless the file ends at or before its
    data section (header only), past its end (`llama_model_loader`'s weights, in the file's order)."""
    data_offset, size, rows = tensor_layout(path)
    bad = next((i for i, row in enumerate(rows) if row[2] % 32), None)
    if bad is None:
        bad = next((i for i, (_, _, offset, nbytes) in enumerate(rows) if data_offset + offset + nbytes > 2**63 - 1
                    or (size > data_offset and data_offset + offset + nbytes > size)), None)
    return None if bad is None else (bad, rows[bad][0])


def test_tensor_offsets_and_file_lengths(tmp_path, long_run, capsys):
    """A sparse file's tensor data offsets overwritten -- hostile values, another tensor's offset (overlap), the
    last offset that fits and the next ones, random ones -- and the file cut or extended around its data
    section (header only, one byte short, one byte long). Each case is judged by `expected_offset_refusal`:
    exit 2 naming that tensor's offset, or exit 0 with the oracle's report (overlap and header-only files
    included). Quick: a seeded sample of 80; --long: every tensor with every value, and 1,000 random cases."""
    src = write_llama_gguf(tmp_path / "sparse.gguf", tokens=16, sparse=True)
    base = src.read_bytes()
    data_offset, size, rows = tensor_layout(src)
    header_end = rows[-1][1] + 8  # (the last info's offset field ends the header)
    rng = random.Random(4)
    cases = []  # ({where: offset}, the file's length)
    for _name, at, _offset, nbytes in rows:
        fits, top = (size - data_offset - nbytes) // 32 * 32, (2**63 - 1 - data_offset - nbytes) // 32 * 32
        for v in (*HOSTILE, 7, 2**64 - 32, 2**63 - data_offset, rng.choice(rows)[2], fits, fits + 1, fits + 32):
            cases.append(({at: v}, size))
        # 2^63 in a header-only file
        cases += [({at: top}, data_offset), ({at: top + 32}, data_offset), ({at: top}, size)]
    for cut in (size - 1, size + 1, size - 32, data_offset, data_offset - 3, header_end, data_offset + 1,
                rng.randrange(data_offset, size)):
        cases.append(({}, cut))
    for _ in range(1000 if long_run else 20):
        changed = rng.sample(rows, rng.randint(1, 4))
        cases.append(({at: rng.randrange(2 * size) // (1 if rng.random() < 0.1 else 32)
                           * (1 if rng.random() < 0.1 else 32)
                       for _, at, _, _ in changed},
                      rng.choice([size, size, data_offset, rng.randrange(header_end, size + 64)])))
    if not long_run:
        cases = rng.sample(cases, 80)
    tally = Tally("gguf offsets and lengths")
    for k, (offsets, length) in enumerate(cases):
        data = bytearray(base[:length])
        for at, value in offsets.items():
            set_offset(data, at, value)
        path = tmp_path / f"o{k % 8}.gguf"
        path.write_bytes(data)
        os.truncate(path, length)  # (past the bytes: a hole)
        want = expected_offset_refusal(path)
        o = assert_sound(run_cli(["llama", "--gguf", path, "--json"]))
        if want is None:
            assert o.code == 0, f"{offsets} {length}: " + o.describe()
            doc, report = json.loads(o.out), oracle_report(path)
            assert (doc["model"], doc["graph"], doc["devices"]) == (report["model"], report["graph"], report["devices"])
            assert ("header only" in o.err) == (length <= data_offset), o.describe()
            tally.add("correct")
        else:
            assert o.code == 2 and f"tensors[{want[0]}].offset: {want[1]}: " in o.err, \
                f"{offsets} {length}: " + o.describe()
            tally.add("refused")
    assert tally.counts["refused"] > 0 and tally.counts["correct"] > 0
    tally.report(capsys)


NAMES = list(llama_shapes(TINY))
KEYS = ["llama.block_count", "llama.embedding_length", "llama.feed_forward_length", "llama.attention.head_count",
        "llama.attention.head_count_kv", "llama.context_length", "llama.vocab_size", "llama.rope.dimension_count",
        "llama.attention.layer_norm_rms_epsilon", "llama.rope.freq_base", "llama.expert_count", "general.alignment"]
SMALL_INTS = st.one_of(st.integers(0, 130), st.sampled_from([256, 513, 2**31, 2**32 - 1]))


def _value(vt: VT):
    """A strategy for a value of GGUF type `vt` (with the array's item type, for arrays)."""
    if vt == VT.STRING:
        return st.text(max_size=8).map(lambda s: (s, vt))
    if vt in (VT.FLOAT32, VT.FLOAT64):
        return st.floats(width=32, allow_nan=True, allow_infinity=True).map(lambda f: (f, vt))
    if vt == VT.BOOL:
        return st.booleans().map(lambda b: (b, vt))
    if vt == VT.ARRAY:
        return st.lists(st.integers(-3, 130), min_size=0, max_size=4).filter(bool).map(lambda xs: (xs, vt, VT.INT32))
    lo, hi = {VT.UINT8: (0, 255), VT.INT8: (-128, 127), VT.UINT16: (0, 65535), VT.INT16: (-32768, 32767),
              VT.INT32: (-2**31, 2**31 - 1), VT.INT64: (-2**63, 2**63 - 1),
              VT.UINT64: (0, 2**64 - 1)}.get(vt, (0, 2**32 - 1))
    return st.one_of(st.integers(lo, min(hi, 130)), st.integers(lo, hi)).map(lambda x: (x, vt))


KV_CHANGE = st.sampled_from(KEYS).flatmap(
    lambda key: st.one_of(st.just({key: None}), st.sampled_from(list(VT)).flatmap(_value).map(lambda v: {key: v}),
                          SMALL_INTS.map(lambda n: {key: (n, VT.UINT32)})))
SHAPE = st.lists(st.sampled_from([1, 2, 16, 32, 64, 96, 128]), min_size=1, max_size=4)
MUTATION = st.one_of(
    st.builds(lambda n: dict(drop=(n,)), st.sampled_from(NAMES)),
    st.builds(lambda n, ne: dict(shapes={n: ne}), st.sampled_from(NAMES), SHAPE),
    st.builds(lambda n, t: dict(types={n: t}), st.sampled_from(NAMES),
              st.sampled_from([QT.F32, QT.F16, QT.Q8_0, QT.Q4_0, QT.BF16, QT.I32, QT.Q4_1])),
    st.builds(lambda n, ne: dict(extra={n: ne}), st.sampled_from(["blk.2.attn_q.weight", "rope_freqs.weight", "x"]),
              SHAPE),
    KV_CHANGE.map(lambda kv: dict(kv=kv)),
    st.builds(lambda kv1, kv2: dict(kv={**kv1, **kv2}), KV_CHANGE, KV_CHANGE),
)


def test_structure_aware_headers(tmp_path, long_run, capsys):
    """hypothesis over the writer's hooks: a tensor dropped, reshaped, retyped or added, metadata dropped or
    of another type or value (one or two changes)."""
    tally = Tally("gguf structure")

    @settings(max_examples=1500 if long_run else 80, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(change=MUTATION)
    def case(change):
        try:
            path = write_llama_gguf(tmp_path / "s.gguf", **change)
        except (ValueError, OverflowError, struct.error, TypeError):  # gguf's writer refused to write it
            return
        check_gguf_case(path, tally)

    case()
    assert tally.counts["refused"] > 0 and tally.counts["correct"] > 0
    tally.report(capsys)


# ---- the flags ---------------------------------------------------------------------------------------------

INT_FLAG = st.one_of(st.integers(-3, 70),
                     st.sampled_from([0, 512, 513, 2**31 - 1, 2**31, 2**32, 10**6, 10**12, -2**31]))
FLOAT_TEXT = st.one_of(st.sampled_from(["nan", "inf", "-inf", "-1", "0", "1e400", "1e39", "3e38", "1e-45", "0.5", "24",
                                        "x"]),
                       st.floats(0.01, 100).map(lambda f: f"{f:.2f}"))
FLAGS = st.fixed_dictionaries({}, optional={
    "--n-ctx": st.one_of(st.integers(1, 4096), INT_FLAG), "--n-batch": INT_FLAG, "--n-ubatch": INT_FLAG,
    "--n-gpu-layers": INT_FLAG, "--devices": st.one_of(st.integers(0, 3), INT_FLAG),
    "--type-k": st.sampled_from([*KV_TYPES, "F16", "q9", "q4_K", ""]),
    "--type-v": st.sampled_from([*KV_TYPES, "x"]), "--flash-attn": st.just(None),
    "--vram": FLOAT_TEXT, "--tensor-split": st.lists(FLOAT_TEXT, min_size=0, max_size=4).map(",".join),
    "--no-kv-offload": st.just(None), "--fit": st.just(None),
})
MODEL = st.one_of(
    st.sampled_from(list(PRESETS) + ["LLAMA-2-7B", "Mistral-7B", "llama-9-1b", " llama-2-7b"])
    .map(lambda p: ["--preset", p]),
    st.fixed_dictionaries({"--n-vocab": INT_FLAG, "--n-embd": st.sampled_from([64, 96, 128, 100, 0, 2**32]),
                           "--n-layer": st.one_of(st.integers(1, 4), INT_FLAG),
                           "--n-head": st.sampled_from([1, 2, 4, 3, 0]),
                           "--n-ff": st.one_of(st.integers(1, 300), INT_FLAG)},
                          optional={"--n-head-kv": st.sampled_from([1, 2, 3, 0, -1]),
                                    "--wtype": st.sampled_from(["f16", "q4_0", "Q8_0", "i32", "q9", "f32"]),
                                    "--n-expert": st.sampled_from([0, 1, 4, 8, 161, -1]),
                                    "--n-expert-used": st.sampled_from([0, 1, 2, 4, 9])}
                          ).map(lambda d: [x for k, v in d.items() for x in (k, str(v))]),
)


def _api_request(model_argv: list, flags: dict) -> tuple:
    """(LlamaParams, memory_report's keyword arguments) of the same request through the API."""
    from ggml_lite.models.llama import LlamaParams

    args = dict(zip(model_argv[::2], model_argv[1::2]))
    if "--preset" in args:
        params = PRESETS[args["--preset"].lower()]
    else:
        dims = {k[2:].replace("-", "_"): int(v) for k, v in args.items() if k != "--wtype"}
        dims.setdefault("n_head_kv", dims["n_head"])
        params = LlamaParams(**dims, wtype=args.get("--wtype", "f16"))
    split = flags.get("--tensor-split")
    return params, dict(n_ctx=int(flags.get("--n-ctx", 512)), n_batch=int(flags.get("--n-batch", 2048)),
                        n_ubatch=int(flags.get("--n-ubatch", 512)), devices=int(flags.get("--devices", 0)),
                        tensor_split=[float(x) for x in split.split(",")] if split is not None else None,
                        type_k=flags.get("--type-k", "f16"), type_v=flags.get("--type-v", "f16"),
                        offload_kqv="--no-kv-offload" not in flags, flash_attn="--flash-attn" in flags)


def _api_report(model_argv: list, flags: dict) -> dict:
    """The report the API gives for the same request (what exit 0 must print)."""
    params, kw = _api_request(model_argv, flags)
    return memory_report(params, n_gpu_layers=int(flags.get("--n-gpu-layers", 0)), why=False, **kw).to_json()


def _api_fit(model_argv: list, flags: dict) -> tuple:
    """What `fit` gives for the same request (what --fit must print)."""
    from ggml_lite.fit import fit

    params, kw = _api_request(model_argv, flags)
    return fit(params, float(flags["--vram"]), kw.pop("n_ctx"), kw.pop("devices"), **kw)


def test_llama_flags(long_run, capsys):
    """hypothesis over the model (presets in odd case, hyperparameters) and every context flag: huge,
    negative, non-finite, of the wrong length or name. Exit 2 naming the flag, or exit 0 with the API's report."""
    tally = Tally("llama flags")

    @settings(max_examples=2000 if long_run else 120, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(model=MODEL, flags=FLAGS)
    def case(model, flags):
        argv = ["llama", *model, "--json"]
        for k, v in flags.items():
            argv += [k] if v is None else [f"{k}={v}"]
        o = assert_sound(run_cli(argv))
        if o.code == 2:
            assert "--" in o.err or "preset" in o.err or "usage:" in o.err, o.describe()  # it names the flag
            tally.add("refused")
            return
        doc, want = json.loads(o.out), _api_report(model, flags)
        assert (doc["graph"], doc["devices"]) == (want["graph"], want["devices"]), o.describe()
        if "--fit" in flags:
            assert tuple(doc["fit"].values()) == _api_fit(model, flags), o.describe()
            tally.add("fitted")
        tally.add("correct")

    case()
    assert tally.counts["refused"] > 0 and tally.counts["correct"] > 0
    tally.report(capsys)


def test_every_type_name_the_flags_accept_is_a_ggml_type():
    assert set(KV_TYPES) <= set(TYPES)


def _check_fit_by_scanning(params, vram: float, n_ctx: int, devices: int, split, got: tuple) -> None:
    """`fit`'s answer checked the slow way: n_gpu_layers is the first that fits scanning down from the top,
    and the context fits while 32 more (within n_ctx_train) does not."""
    from ggml_lite.report import fits

    def ok(layers, ctx):
        report = memory_report(params, ctx, n_gpu_layers=layers, devices=devices, tensor_split=split, why=False)
        return fits(report, vram)
    layers = next((n for n in range(params.n_layer + 1, 0, -1) if ok(n, n_ctx)), 0)
    assert got[0] == layers
    if got[1] is None:
        assert not ok(layers, n_ctx)
    else:
        assert ok(layers, got[1]) and (got[1] + 32 > max(params.n_ctx_train, n_ctx) or not ok(layers, got[1] + 32))


def test_fit_is_what_scanning_finds(long_run, capsys):
    """`llama --fit` (two bisections) against a linear scan of every layer count, and its context against
    the next multiple of 32, on small models whose totals straddle the given VRAM (even and uneven splits)."""
    from ggml_lite.models.llama import LlamaParams

    tally = Tally("llama --fit")

    @settings(max_examples=150 if long_run else 12, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(n_layer=st.integers(1, 6), n_embd=st.sampled_from([64, 128, 256]), n_ff=st.sampled_from([64, 256, 1024]),
           n_vocab=st.sampled_from([64, 1000, 32000]), devices=st.integers(1, 3), n_ctx=st.sampled_from([32, 100, 256]),
           vram_kib=st.integers(64, 60000), split=st.booleans())
    def case(n_layer, n_embd, n_ff, n_vocab, devices, n_ctx, vram_kib, split):
        params = LlamaParams(n_vocab, n_embd, n_layer, 4, 2, n_ff)  # (n_ctx_train 4096, as the flags make it)
        ts = [float(i + 1) for i in range(devices)] if split else None
        vram = vram_kib / 2**20
        argv = ["llama", "--n-vocab", n_vocab, "--n-embd", n_embd, "--n-layer", n_layer, "--n-head", 4,
                "--n-head-kv", 2, "--n-ff", n_ff, "--n-ctx", n_ctx, "--devices", devices, "--vram", repr(vram),
                "--fit", "--json"]
        if ts:
            argv += ["--tensor-split", ",".join(map(str, ts))]
        o = assert_sound(run_cli(argv), allow=(0,))
        got = json.loads(o.out)["fit"]
        _check_fit_by_scanning(params, vram, n_ctx, devices, ts, (got["n_gpu_layers"], got["n_ctx"]))
        tally.add("correct")

    case()
    tally.report(capsys)


VALID_MODEL = st.builds(
    lambda n_layer, n_head, kv_div, head, n_ff, n_vocab: dict(n_layer=n_layer, n_head=n_head,
                                                              n_head_kv=n_head // kv_div, n_embd=n_head * head,
                                                              n_ff=n_ff, n_vocab=n_vocab),
    st.integers(1, 4), st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4]), st.sampled_from([32, 64]),
    st.sampled_from([32, 64, 96, 256]), st.integers(1, 300)).filter(lambda d: d["n_head_kv"] >= 1)


def test_valid_files_give_the_right_report(tmp_path, long_run, capsys):
    """hypothesis over valid LLaMA files (sizes, matrix types, tied or not, Llama 3.1's rope_freqs, per-layer
    arrays, the vocabulary from vocab_size or the tokenizer's list) and a few placements: every one plans
    (exit 0) and prints the report of the header as gguf's own reader reads it — no valid file refused."""
    from ggml_lite.models.llama import LlamaParams

    tally = Tally("gguf valid files")

    @settings(max_examples=300 if long_run else 25, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(d=VALID_MODEL, mtype=st.sampled_from([QT.F16, QT.F32, QT.Q8_0, QT.Q4_0, QT.BF16]), tied=st.booleans(),
           rope=st.booleans(), arrays=st.booleans(), tokens=st.booleans(),
           place=st.sampled_from([[], ["--devices", "1", "-ngl", "2"], ["--devices", "2", "-ngl", "9", "-ts", "1,3"]]),
           experts=st.sampled_from([(0, 0), (0, 0), (4, 1), (8, 2), (4, 4)]), fa=st.booleans(), own_head=st.booleans())
    def case(d, mtype, tied, rope, arrays, tokens, place, experts, fa, own_head):
        p = LlamaParams(**d, n_ctx_train=256, n_expert=experts[0], n_expert_used=experts[1],
                        n_embd_head=2 * d["n_embd"] // d["n_head"] if own_head else None)  # (NeMo: key_length)
        kv = {"llama.vocab_size": None} if tokens else {}
        if arrays:
            kv["llama.attention.head_count_kv"] = ([p.n_head_kv] * p.n_layer, VT.ARRAY, VT.INT32)
        path = write_llama_gguf(tmp_path / "v.gguf", p, mtype, kv=kv, drop=("output.weight",) if tied else (),
                                extra={"rope_freqs.weight": [p.n_rot // 2]} if rope else None,
                                tokens=p.n_vocab if tokens else 0)
        o = assert_sound(run_cli(["llama", "--gguf", path, "--json", "-c", "128", *place, *(["-fa"] if fa else [])]),
                         allow=(0,))
        params, codes, _ = oracle_params(path)
        types = {name: type_by_code(code) for name, code in codes.items()}
        devices = int(place[1]) if place else 0
        want = memory_report(params, 128, n_gpu_layers=int(place[3]) if place else 0, devices=devices,
                             tensor_split=[1.0, 3.0] if devices == 2 else None, tensor_types=types, why=False,
                             flash_attn=fa, tensor_offsets={n: o for n, _, _, o in header_reader(path).infos}).to_json()
        doc = json.loads(o.out)
        assert (doc["model"], doc["graph"], doc["devices"]) == (want["model"], want["graph"], want["devices"]), \
            o.describe()
        tally.add("correct")

    case()
    tally.report(capsys)
