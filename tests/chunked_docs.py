"""Graph files of today's ggml with chunked compute buffers, made for the tests of `check` and `plan`
(tests/unit/test_cli_today.py, tests/fuzz/test_fuzz_graph_files.py).

A document is a recorded 2024 fixture (tests/fixtures/ggml-seed/) given `"ggml_version": "0.15.3"`, a
release build (`ggml_build`: only error lines are logged, and the fixture records none), a
`buffer_type.max_size` and the plan of ggml 0.15.3 on that limit: the top-level `chunks` (each chunk's size as
ggml asked for it), `buffer_size` (and the calls' `buffer_size`) their sum plus 32 per chunk (the CPU buffer's
padding), and every tensor's `chunk` and `offset` inside it.

`source="ggml"` takes the plan from the real ggml (`ggml_oracle.chunked.chunked_plan`, ggml-python 0.0.45 =
ggml 0.15.3); `source="ggml_lite"` from ggml_lite's own `GAllocr2026` (for tests of the file checks and of
the comparison, which need a valid document, not evidence); `"auto"`: the real ggml when ggml-python is
there. A sequence file (11, 12) is made by ggml_lite only: the oracle plans one graph per allocator.
"""

import copy
import functools
import json

import ggml_lite as gl
import ggml_oracle as O
from ggml_lite.plancheck import plan_of, run_plan
from helpers import fixture_path, load_json

RELEASE = "release (NDEBUG): ggml-python 0.0.45's build of ggml 0.15.3, no debug diagnostics"
VERSION = "0.15.3"
PAD = 32  # the CPU buffer type pads every buffer (each chunk) by its alignment


def max_size_for(name: str, parts: int) -> int:
    """A limit about 1/parts of the fixture's unbounded peak (32-byte aligned): several chunks."""
    doc = load_json(fixture_path("ggml-seed", name))
    peak = max(r["buffer_size"] for r in doc.get("steps", [doc])) - PAD
    return max(PAD, peak // parts // PAD * PAD)


def ggml_chunked_plan(doc: dict, max_size: int) -> tuple:
    """(chunk sizes, {id: (chunk, offset) | None}, ok) of the real ggml on the document's graph."""
    from ggml_oracle import chunked as C

    gf = gl.read_graph_file(doc)
    pre: list = []
    for i, rec in gf.records.items():
        t = gf.tensors[i]
        if rec["preallocated"] and t.view_src is None and not any(t.ctx is c for c in pre):
            pre.append(t.ctx)
    ref = C.chunked_plan(gf.graph, [gf.tensors[i] for i in gf.expand_roots], pre, max_size=max_size)
    ids = {t: i for i, t in gf.tensors.items()}
    where = {ids[t]: w for t, w in ref["placements"].items() if t in ids}
    return ref["planned_chunk_sizes"], where, ref["reserve_ok"] and ref["alloc_ok"]


def _placements(gf, galloc) -> tuple:
    """(chunk sizes, {id: (chunk, offset) | None}) of a plan of today's allocator."""
    plan = plan_of(gf, galloc)
    assert plan.chunks is not None and plan.chunk_sizes is not None, "not a plan of today's allocator"
    return plan.chunk_sizes, {i: None if plan.chunks[i] is None else (plan.chunks[i], plan.offsets[i])
                              for i in gf.tensors}


def _from_ggml_lite(doc: dict, step=None) -> tuple:
    gf, galloc, res = run_plan(doc, step, ggml="2026")
    return (*_placements(gf, galloc), all(r["ok"] for r in res.values()))


def _fill(section: dict, record: dict, sizes: list, where: dict) -> None:
    record["chunks"] = list(sizes)
    record["buffer_size"] = sum(sizes) + PAD * len(sizes)
    for i, e in enumerate(section["tensors"]):
        placed = where.get(i)
        e["chunk"], e["offset"] = (None, None) if placed is None else placed


@functools.lru_cache(maxsize=None)
def _document_text(name: str, parts: int, source: str) -> str:
    doc = copy.deepcopy(load_json(fixture_path("ggml-seed", name)))
    max_size = max_size_for(name, parts)
    doc.update(ggml_version=VERSION, ggml_build=RELEASE)
    doc["buffer_type"]["max_size"] = max_size
    doc["description"] = f"{doc.get('description', '')} Planned by ggml 0.15.3 with max_size {max_size} ({source})."
    if "graph" in doc:
        sizes, where, ok = ggml_chunked_plan(doc, max_size) if source == "ggml" else _from_ggml_lite(doc)
        assert ok, f"{name}: the plan failed"
        _fill(doc["graph"], doc, sizes, where)
        for call in ("reserve", "alloc_graph"):
            doc[call].update(buffer_size=doc["buffer_size"], log=[])
        return json.dumps(doc)
    assert source == "ggml_lite", "a sequence file is made by ggml_lite's allocator only"
    for step in doc["steps"]:
        step["log"] = []
    galloc = seen = None
    for k, step in enumerate(doc["steps"]):  # one allocator for the whole sequence, as `check` replays it
        call = gl.schema.CALLS[step["call"]]
        gf, galloc, res = run_plan(doc, k, galloc, call, ggml="2026")
        _fill(step["graph"], step, *_placements(gf, galloc))
        got = res[call]
        step.update(ok=got["ok"], buffer_size=got["buffer_size"], buffer_size_before=got["buffer_size_before"])
        step["compute_buffer_replaced"] = None if call != "alloc_graph" or seen is None else got["handle"] != seen
        seen = got["handle"] if call == "alloc_graph" else seen
    return json.dumps(doc)


def chunked_document(name: str, parts: int = 3, source: str = "auto") -> dict:
    """Fixture `name` as today's ggml plans it on a limit of about 1/parts of its peak (a fresh copy)."""
    if source == "auto":
        source = "ggml" if O.available() and "steps" not in load_json(fixture_path("ggml-seed", name)) else "ggml_lite"
    return json.loads(_document_text(name, parts, source))

