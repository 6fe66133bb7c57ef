"""Record chunked plans of the real ggml 0.15.3 as graph files of the fixture schema (`tests/fixtures/ggml-today/`).

    python -m ggml_oracle.recorder [--out tests/fixtures/ggml-today] [--only NAME ...]

writes the files listed in `RECORDINGS` (what each shows is in its `description`). A file is the graph
section ggml_lite writes for the graph (`graphio.graph_section`: ids in creation order over the
contexts) with the plan the real ggml made filled in: `ggml_gallocr_new` on the CPU buffer type with a
`max_size` (`chunked.max_size_buffer_type`), `ggml_gallocr_reserve`, `ggml_gallocr_alloc_graph`, and
per tensor its `buffer` label, its `chunk` (index of its `tensor->buffer` among the virtual buffer's
chunks, null outside the compute buffer) and its `offset` inside that chunk (`data` minus the chunk's
base), and `ext_offset` in a pre-allocated buffer. The top level carries `ggml_version` "0.15.3",
`ggml_build` (how ggml-python's library was built, probed here: `build_note`), the buffer type with
its `max_size`, `chunks` (each chunk's size as ggml allocated it), the log lines ggml printed during
each call (through `ggml_log_set`), and the buffer sizes by the 2024 CPU buffer type's rule: ggml-python's
CPU buffers report the size asked for, the 2024 reference's (and ggml_lite's) that plus 32, on every
buffer — so `buffer_size` = sum(chunks) + 32 per chunk, and each external buffer's size is
ggml-python's + 32. A sequence file (`steps`) plans several graphs on ONE allocator.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

import ggml_lite as gl
from ggml_lite.graphio import dumps, graph_section, read_graph_file

from .bindings import CPU_BUFFER_SIZE_DELTA, need_ggml
from .build import build_info
from .chunked import UNLIMITED, RealGAllocr, captured_ggml_log
from .mirror import Mirror, mirror
from .random_graphs import random_graph

ROOT = Path(__file__).resolve().parents[2]
SEED_FIXTURES = ROOT / "tests" / "fixtures" / "ggml-seed"
GGML_VERSION = "0.15.3"
GGML_COMMIT = "eced84c"  # the ggml that ggml-python 0.0.45 bundles (vendor/ggml)
KiB, MiB = 1024, 1024 * 1024


@dataclass
class Subject:
    """A graph to record: its tensors by fixture id, the expand roots, the pre-allocated contexts."""

    graph: gl.Graph
    tensors: dict  # {id: Tensor}, creation order over the contexts
    roots: list
    preallocated: list
    params: dict = field(default_factory=dict)  # a step's batch parameters, when the graph came from a sequence


def from_seed_fixture(name: str, step: int | None = None) -> Subject:
    """A recorded 2024 graph (`tests/fixtures/ggml-seed/NAME.json`, or one step of it), unplaced."""
    gf = read_graph_file(SEED_FIXTURES / f"{name}.json", step)
    pre: list = []
    for i, rec in gf.records.items():
        t = gf.tensors[i]
        if rec.get("preallocated") and t.view_src is None and not any(t.ctx is c for c in pre):
            pre.append(t.ctx)
    params = gf.doc["steps"][step].get("params", {}) if step is not None else {}
    return Subject(gf.graph, dict(gf.tensors), [gf.tensors[i] for i in gf.expand_roots], pre, params)


def from_random(seed: int, max_ops: int = 40) -> Subject:
    """`random_graph(seed)`: its weights are allocated on ggml_lite's side; only structure is read here."""
    rg = random_graph(seed, max_ops=max_ops)
    return Subject(rg.graph, dict(enumerate(rg.tensors)), rg.roots, rg.preallocated)


# -- how ggml-python's library was built -----------------------------------------------------------------

def release_build() -> bool:
    """Is ggml-python's ggml a release build (NDEBUG defined)? Probed: a small graph reserved, then a
    bigger one on the same allocator, with a log callback set (`ggml_log_set`). The second reserve
    reallocates the buffer (seen through `RealGAllocr.replaced`), and `ggml_gallocr_reserve_n_impl`
    logs "reallocating" there only under `#ifndef NDEBUG` (ggml-alloc.c:926-934). The callback itself
    is checked to work on a line every build prints (a failed allocation's error)."""
    g = need_ggml()
    small, big = random_graph(15), random_graph(11)
    with captured_ggml_log() as lines, RealGAllocr() as real, \
            mirror(small.graph, small.roots, small.preallocated) as ms, \
            mirror(big.graph, big.roots, big.preallocated) as mb:
        if not (real.reserve(ms) and real.reserve(mb) and real.replaced):
            raise RuntimeError("the probe's second reserve did not reallocate the compute buffer")
        g.ggml_backend_buft_alloc_buffer(g.ggml_backend_cpu_buffer_type(), 2**62)  # fails, and says so
    if not any("failed to allocate" in line for line in lines):
        raise RuntimeError(f"the log callback saw no error line: {lines}")
    return not any("reallocating" in line for line in lines)


def build_note() -> str:
    """`ggml_build` of a recorded file: release or debug (probed), and the instruction sets."""
    flags = " ".join(k.upper() for k, v in build_info().items() if v) or "no SIMD"
    if release_build():
        kind = ("release build (NDEBUG defined: ggml's debug messages and asserts are compiled out; probed: a "
                "second, bigger reserve reallocated the compute buffer and the log callback saw no "
                "'reallocating' line, while it saw error lines), so the logs hold ggml's errors only")
    else:
        kind = "debug build (no NDEBUG: the logs hold ggml's debug messages too)"
    return (f"{kind}; ggml {GGML_VERSION} as bundled by ggml-python 0.0.45, built by pip from its sdist "
            f"(`make setup`) with {flags}")


# -- one call, one plan ------------------------------------------------------------------------------------

def _reference_size(sizes: list) -> int:
    """A buffer size by the 2024 CPU buffer type's rule: ggml-python's + 32 on every buffer."""
    return sum(sizes) + CPU_BUFFER_SIZE_DELTA * len(sizes)


def _call(real: RealGAllocr, call: str, m: Mirror) -> dict:
    before = _reference_size(real.chunks().sizes)
    with captured_ggml_log() as lines:
        ok = getattr(real, call)(m)
    return {"ok": ok, "buffer_size_before": before, "buffer_size": _reference_size(real.chunks().sizes),
            "reallocated": bool(real.replaced), "log": lines}


def _graph(subject: Subject, m: Mirror, real: RealGAllocr) -> dict:
    """The graph section with the real ggml's placements (as they are now) filled in."""
    g = need_ggml()
    sec = graph_section(subject.graph, subject.tensors, subject.roots)
    placed = real.placements(m)
    ext_label = {}
    for ctx in subject.preallocated:
        for t in ctx.tensors:
            c = m.ptr[t].contents
            if t.view_src is None and c.buffer:
                ext_label[c.buffer] = ctx.name
    for e in sec["tensors"]:
        t = subject.tensors[e["id"]]
        c = m.ptr[t].contents
        root = t
        while root.view_src is not None:
            root = root.view_src
        where = placed.get(t)
        label = ("compute" if where is not None else ext_label.get(c.buffer)) if c.buffer else None
        rest = {"preallocated": any(root.ctx is x for x in subject.preallocated), "buffer": label,
                "chunk": None if where is None else where[0], "offset": None if where is None else where[1],
                "ext_offset": c.data - g.ggml_backend_buffer_get_base(c.buffer)
                if c.buffer in ext_label and c.data else None}
        for key in ("preallocated", "buffer", "offset", "ext_offset"):
            del e[key]
        e.update(rest)
    return sec


def _external(subject: Subject, m: Mirror) -> list:
    g = need_ggml()
    out = []
    for ctx in subject.preallocated:
        bufs = {m.ptr[t].contents.buffer for t in ctx.tensors if t.view_src is None and m.ptr[t].contents.buffer}
        if len(bufs) != 1:
            raise RuntimeError(f"context {ctx.name!r}: {len(bufs)} buffers, expected one")
        out.append({"ctx": ctx.name, "size": int(g.ggml_backend_buffer_get_size(bufs.pop())) + CPU_BUFFER_SIZE_DELTA})
    return out


def _head(fixture: str, description: str, max_size: int, build: str) -> dict:
    return {"schema": "ggml-gallocr-fixture", "schema_version": 1, "fixture": fixture, "description": description,
            "ggml_version": GGML_VERSION, "ggml_commit": GGML_COMMIT, "ggml_build": build,
            "buffer_type": {"name": "CPU", "alignment": 32, "max_size": None if max_size == UNLIMITED else max_size,
                            "alloc_size": "ggml_nbytes"}}


def record_graph(subject: Subject, max_size: int, fixture: str, description: str, build: str) -> dict:
    """A single-graph file: reserve, then alloc_graph, on a fresh allocator."""
    with mirror(subject.graph, subject.roots, subject.preallocated) as m, RealGAllocr(max_size) as real:
        reserve = _call(real, "reserve", m)
        alloc = _call(real, "alloc_graph", m)
        info = real.chunks()
        if info.sizes != info.planned_sizes:
            raise RuntimeError(f"chunk buffers {info.sizes} differ from the plan {info.planned_sizes}")
        doc = _head(fixture, description, max_size, build)
        doc["external_buffers"] = _external(subject, m)
        doc["chunks"] = info.sizes
        for name, res in (("reserve", reserve), ("alloc_graph", alloc)):
            doc[name] = {"ok": res["ok"], "buffer_size": res["buffer_size"], "log": res["log"]}
        doc["buffer_size"] = _reference_size(info.sizes)
        doc["graph"] = _graph(subject, m, real)
        return doc


def record_sequence(steps: list, max_size: int, fixture: str, description: str, build: str) -> dict:
    """A sequence file: `steps` = [(call, Subject, label)] on ONE allocator, each step's graph placed as
    that call left it (after a reserve nothing is placed). `compute_buffer_replaced` (alloc_graph steps
    after the first) says whether the compute buffer a tensor points to — its first chunk's `struct
    ggml_backend_buffer` — is at another address than after the previous alloc_graph step, as the 2024
    recorder saw it; whether ggml freed and allocated the buffer (a chunk grew) is in the step's label."""
    mirrors: list = []
    out_steps = []
    last_seen = None
    try:
        with RealGAllocr(max_size) as real:
            for k, (call, subject, label) in enumerate(steps):
                m = mirror(subject.graph, subject.roots, subject.preallocated)
                mirrors.append(m)
                res = _call(real, call, m)
                chunks = real.chunks()
                first = chunks.chunks[0] if chunks.chunks else None
                replaced = None
                if call == "alloc_graph":
                    replaced = None if last_seen is None else first != last_seen
                    last_seen = first
                what = "reallocated the compute buffer" if res["reallocated"] else "kept the compute buffer"
                out_steps.append({
                    "step": k, "label": f"{label}; ggml {what}", "call": f"ggml_gallocr_{call}",
                    "params": subject.params, "ok": res["ok"], "buffer_size_before": res["buffer_size_before"],
                    "buffer_size": res["buffer_size"], "compute_buffer_replaced": replaced, "log": res["log"],
                    "chunks": chunks.sizes, "graph": _graph(subject, m, real)})
            doc = _head(fixture, description, max_size, build)
            doc["external_buffers"] = _external(steps[0][1], mirrors[0])
            doc["steps"] = out_steps
            return doc
    finally:
        for m in mirrors:
            m.close()


# -- what tests/fixtures/ggml-today holds ------------------------------------------------------------------

BLOCK = ("chapter 05's LLaMA block (tests/fixtures/ggml-seed/06_llama_block.json: n_embd 128, 4 heads, n_ff 344, "
         "10 tokens, F32 weights pre-allocated) on a CPU buffer type with max_size {}: {} chunks")


def recordings() -> list:
    """[(file stem, kind, how to build it)]: kind "graph" -> (Subject maker, max_size, description);
    kind "steps" -> (steps maker, max_size, description)."""
    seq = "11_realloc_sequence_grow"
    batches = [("alloc_graph", k) for k in range(7)]

    def steps():
        made = [(call, from_seed_fixture(seq, k), f"{call} of fixture 11's step {k}") for call, k in batches]
        return [("reserve", made[0][1], "reserve fixture 11's step 0 (8 tokens) first")] + made

    def graph(stem, maker, max_size, text):
        return (stem, "graph", (maker, max_size, text))

    return [
        graph("01_llama_block_8kib", lambda: from_seed_fixture("06_llama_block"), 8 * KiB, BLOCK),
        graph("02_llama_block_16kib", lambda: from_seed_fixture("06_llama_block"), 16 * KiB, BLOCK),
        graph("03_llama_block_20kib", lambda: from_seed_fixture("06_llama_block"), 20 * KiB, BLOCK),
        graph("04_mlp_small_40kib", lambda: from_seed_fixture("01_mlp_small"), 40 * KiB,
              "the 3-layer MLP of ggml-seed/01_mlp_small.json (largest tensor 48 KiB, more than the limit) with "
              "max_size {}: {} chunks, one opened by a tensor larger than the limit"),
        graph("05_views_layout_8kib", lambda: from_seed_fixture("03_views_layout"), 8 * KiB,
              "the views, reshapes, permutes and copies of ggml-seed/03_views_layout.json with max_size {}: {} "
              "chunks; every view's chunk is its source's"),
        graph("06_llama4_kvcache_6kib", lambda: from_seed_fixture("07_llama4_kvcache"), 6 * KiB,
              "the 4-layer LLaMA-style model with KV cache of ggml-seed/07_llama4_kvcache.json with max_size "
              "{}: {} chunks"),
        graph("07_random_dag_wide_s42_64kib", lambda: from_seed_fixture("09_random_dag_wide_s42"), 64 * KiB,
              "the wide random DAG of ggml-seed/09_random_dag_wide_s42.json (300 ops) with max_size {}: {} chunks"),
        graph("08_llama7b_one_output_16mib", lambda: from_seed_fixture("14_llama7b_ctx512_one_output"), 16 * MiB,
              "the 7B-sized LLaMA graph of ggml-seed/14_llama7b_ctx512_one_output.json (llama.cpp daa9623's "
              "builder; 512 tokens, weights pre-allocated) with max_size {}, a scaled-down device limit: {} "
              "chunks; tensors of 32 MiB each open a chunk of their own size"),
        graph("09_random_s136_16_chunks", lambda: from_random(136), 125,
              "random graph 136 of the differential generator (ggml_oracle.random_graph) with max_size {}, far "
              "below its largest tensor: {} chunks, the 16th unbounded"),
        graph("10_random_s44_1115", lambda: from_random(44), 1115,
              "random graph 44 of the differential generator with max_size {}: {} chunks"),
        graph("11_random_s100007_200_ops", lambda: from_random(100_007, 200), 20 * KiB,
              "random graph 100007 of the differential generator (up to 200 ops) with max_size {}: {} chunks"),
        graph("12_random_s28_reuse_factor", lambda: from_random(28), 928,
              "random graph 28 of the differential generator with max_size {}: {} chunks; the allocator of "
              "September 2025 (first chunk whose last block fits) plans it otherwise"),
        graph("13_elementwise_inplace_unlimited", lambda: from_seed_fixture("02_elementwise_inplace"), UNLIMITED,
              "the in-place chain of ggml-seed/02_elementwise_inplace.json without a limit (max_size null): {1} "
              "chunk, every offset as in the 2024 recording"),
        ("14_sequence_llama_batches_12kib", "steps", (steps, 12_000,
         "one allocator with max_size 12000 over fixture 11's graphs (a 2-layer LLaMA-style model with KV "
         "cache at 8, 32, 8, 32, 16, 1 and 48 tokens), reserve first: a plan that fits the chunks keeps them; "
         "when any chunk grows the whole buffer is allocated again with the new plan's chunks, so it can "
         "shrink (step 5: 96352 -> 44032 bytes)")),
    ]


def record_all(out: Path, only: list | None = None) -> list:
    """Write every recording (or those named in `only`) into `out`; returns [(stem, chunks)]."""
    build = build_note()
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, kind, (make, max_size, text) in recordings():
        if only and stem not in only:
            continue
        if kind == "graph":
            doc = record_graph(make(), max_size, stem, "", build)
            doc["description"] = text.format(max_size if max_size != UNLIMITED else "null", len(doc["chunks"]))
            chunks = doc["chunks"]
        else:
            doc = record_sequence(make(), max_size, stem, text, build)
            chunks = [s["chunks"] for s in doc["steps"]]
        (out / f"{stem}.json").write_text(dumps(doc) + "\n")
        written.append((stem, chunks))
    return written


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "ggml-today")
    ap.add_argument("--only", nargs="*", help="file stems to record (default: all)")
    args = ap.parse_args(argv)
    for stem, chunks in record_all(args.out, args.only):
        print(f"{stem}: chunks {chunks}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
