"""Today's allocator against the chunked plans recorded from the real ggml 0.15.3 (`tests/fixtures/ggml-today/`),
without the oracle: each file is planned again with `GAllocr2026` on its buffer type (the CPU type with the
recorded `max_size`), and every recorded fact must come back — the chunks' sizes, the buffer size (sum of
the chunks + 32 per chunk), the ok flags, and every tensor's buffer, chunk, offset in the chunk and
offset in an external buffer; for the sequence file, each step on one allocator, with the buffer sizes
before and after. The recorded log lines are empty (a release build logs only errors, and none
occurred). A changed record is caught. (The `check` command reads these files too; its tests are the
command's own.)
"""

import copy
from pathlib import Path

import pytest

import ggml_lite as gl
from ggml_lite.gallocr_today import VBUFFER_MAX_CHUNKS, GAllocr2026
from ggml_lite.graphio import allocate_external, load_document, read_graph_file
from ggml_lite.schema import buffer_type_of
from helpers import FIXTURES, fixture_path, load_json

TODAY = sorted(p.stem for p in (FIXTURES / "ggml-today").glob("*.json"))


def _facts(gf, galloc) -> dict:
    """{id: (buffer label, chunk, offset, ext_offset)} of what `galloc` did with `gf`'s tensors."""
    vbuf = galloc.buffers[0]
    chunks = list(vbuf.chunks) if vbuf is not None else []
    out = {}
    for i, t in gf.tensors.items():
        c = next((k for k, b in enumerate(chunks) if t.buffer is b), None)
        root = t
        while root.view_src is not None:
            root = root.view_src
        ext = root.buffer is not None and c is None and t.data is not None
        label = None if t.buffer is None else "compute" if c is not None else root.ctx.name
        out[i] = (label, c, None if c is None or t.data is None else t.data - chunks[c].get_base(),
                  t.data - root.buffer.get_base() if ext else None)
    return out


def _recorded(gf) -> dict:
    return {i: (r["buffer"], r["chunk"], r["offset"], r["ext_offset"]) for i, r in gf.records.items()}


def _sizes(galloc) -> tuple:
    return galloc.chunk_sizes(0), galloc.get_buffer_size(0)


def replay(doc, last_block: str = "reuse_factor") -> list:
    """Every difference between the recorded plan(s) of `doc` and GAllocr2026's (empty: identical)."""
    out = []
    galloc = GAllocr2026(buffer_type_of(doc), last_block=last_block)
    steps = doc["steps"] if "steps" in doc else [None]
    for k, st in enumerate(steps):
        gf = read_graph_file(doc, k if st is not None else None)
        allocate_external(gf, gl.cpu_buffer_type())  # the pre-allocated contexts have no limit
        calls = [st["call"].removeprefix("ggml_gallocr_")] if st is not None else ["reserve", "alloc_graph"]
        where = st if st is not None else doc
        for call in calls:
            before = _sizes(galloc)[1]
            ok = bool(getattr(galloc, call)(gf.graph))
            rec = where if st is not None else doc[call]
            got = {"ok": ok, "buffer_size": _sizes(galloc)[1]}
            if st is not None:
                got["buffer_size_before"] = before
            out += [f"step {k} {call}: {key}: ggml {rec[key]}, ggml_lite {v}"
                    for key, v in got.items() if rec[key] != v]
        if _sizes(galloc) != (where["chunks"], where["buffer_size"]):
            out.append(f"step {k}: chunks, buffer size: ggml {where['chunks']}, {where['buffer_size']}; "
                       f"ggml_lite {_sizes(galloc)}")
        want, got_facts = _recorded(gf), _facts(gf, galloc)
        out += [f"step {k}: tensor #{i} {gf.records[i]['name']!r}: ggml (buffer, chunk, offset, ext_offset) "
                f"{want[i]}, ggml_lite {got_facts[i]}" for i in sorted(want) if want[i] != got_facts[i]]
    galloc.free()
    return out


def test_the_set_is_there():
    assert len(TODAY) >= 10 and any("sequence" in n for n in TODAY)
    chunks = [load_json(fixture_path("ggml-today", n)).get("chunks") for n in TODAY]
    assert max(len(c) for c in chunks if c) == VBUFFER_MAX_CHUNKS and min(len(c) for c in chunks if c) == 1
    assert (Path(FIXTURES / "ggml-today" / "README.md")).exists()


@pytest.mark.parametrize("name", TODAY)
def test_recorded_chunked_plan_is_identical(name):
    doc = load_document(fixture_path("ggml-today", name), record=True)  # (validated, with the results)
    assert doc["ggml_version"] == "0.15.3" and doc["ggml_build"].startswith("release build")
    for where in doc.get("steps", [doc]):
        assert where["buffer_size"] == sum(where["chunks"]) + 32 * len(where["chunks"])
        calls = [where] if "steps" in doc else [doc["reserve"], doc["alloc_graph"]]
        assert all(c["log"] == [] for c in calls)
    assert replay(doc) == []


def test_without_a_limit_the_plan_is_the_2024_one():
    """File 13 was recorded without a limit: one chunk, every offset as ggml of 2024 recorded it."""
    today = load_json(fixture_path("ggml-today", "13_elementwise_inplace_unlimited"))
    then = load_json(fixture_path("ggml-seed", "02_elementwise_inplace"))
    assert today["buffer_size"] == then["buffer_size"] and len(today["chunks"]) == 1
    assert [t["offset"] for t in today["graph"]["tensors"]] == [t["offset"] for t in then["graph"]["tensors"]]


def test_the_first_chunked_allocator_plans_file_12_otherwise():
    """File 12 is one where the rule of September 2025 for a chunk's last block gives another plan."""
    doc = load_json(fixture_path("ggml-today", "12_random_s28_reuse_factor"))
    assert replay(doc) == [] and replay(doc, last_block="first") != []


def _first_compute(doc):
    return next(t for t in doc["graph"]["tensors"] if t["chunk"] is not None and t["view_src"] is None)


@pytest.mark.parametrize("edit, expect", [
    (lambda d: _first_compute(d).update(offset=_first_compute(d)["offset"] + 32), "tensor #"),
    (lambda d: _first_compute(d).update(chunk=(_first_compute(d)["chunk"] + 1) % len(d["chunks"])), "tensor #"),
    (lambda d: d["chunks"].reverse(), "chunks"),
    (lambda d: d["alloc_graph"].update(buffer_size=d["alloc_graph"]["buffer_size"] - 32), "alloc_graph: buffer_size"),
])
def test_a_changed_record_is_reported(edit, expect):
    doc = copy.deepcopy(load_json(fixture_path("ggml-today", "01_llama_block_8kib")))
    edit(doc)
    diffs = replay(doc)
    assert len(diffs) == 1 and expect in diffs[0], diffs


def test_a_changed_sequence_step_is_reported():
    doc = copy.deepcopy(load_json(fixture_path("ggml-today", "14_sequence_llama_batches_12kib")))
    doc["steps"][5]["buffer_size_before"] += 32
    diffs = replay(doc)
    assert len(diffs) == 1 and diffs[0].startswith("step 5 alloc_graph: buffer_size_before"), diffs
