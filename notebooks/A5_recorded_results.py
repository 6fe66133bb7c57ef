# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # A5 · Recorded results, checked again: plans and numerics
#
# Appendix A1 reads a graph file and rebuilds its tensors and graph; a file that loads is a file whose
# shapes, strides, views and node order ggml_lite reproduces. But a `ggml-seed` file records more than
# the graph: what the real `ggml_gallocr` *did* with it — whether `reserve` and `alloc_graph` succeeded,
# how large the compute buffer became, what the allocator logged, and at which offset every tensor
# landed — and a file may also record what ggml *computed*, the values of its outputs for leaf data
# generated from a seed. This appendix runs both again and compares: it is what
# `python -m ggml_lite check FILE.json` does, and what the replay tests assert for all 14 recorded
# graphs.
#
# **Learning goals**
#
# 1. Replaying a plan: the external buffers first, then a fresh graph allocator on the file's buffer
#    type, then a comparison that names every difference — not just "sizes differ".
# 2. Why one recorded fact, `compute_buffer_replaced`, is compared on the terms of glibc's heap.
# 3. Recorded numerics: leaf data from a 32-bit LCG stream (generated with a jump-ahead, so a large
#    leaf costs a few numpy operations), and a tolerance relative to the largest magnitude.
# 4. Files of today's ggml (chapter 12): which allocator a file asks for, and its compute buffer in
#    chunks — each chunk's size and each tensor's chunk, compared like offsets.
#
# Exported: `ggml_lite.plancheck` and `ggml_lite.numerics`.

# %%
import copy
import json
from pathlib import Path

import numpy as np

import ggml_lite as gl

FIXTURES = Path("../tests/fixtures/ggml-seed")

# %%
# | default_exp plancheck

# %% [markdown]
# ## 1 · Plans: run a file through the graph allocator and compare
#
# A `ggml-seed` file records what `ggml_gallocr` did. To do it again the file's pre-allocated
# contexts (`external_buffers`: weights, KV cache) are first allocated as the recorder did
# (`graphio.allocate_external`, appendix A1 §9, which also checks their recorded sizes and
# `ext_offset`s) — then a fresh `GAllocr` (chapter 05) on the file's buffer type
# runs `reserve` and `alloc_graph`, and the allocator's log lines are collected per call. A sequence
# file (11, 12) replays its steps on one allocator. `check_plan_file` lists every difference with the
# record — each call's `ok`, buffer sizes and messages, and every tensor's `offset`, `buffer` label and
# `ext_offset` (after a `reserve` nothing is placed yet, so those must be null) — and the CLI's `check`
# and the tests use it. It validates the whole document first, recorded results included, and prints
# at most `limit` differences (an integer >= 1; 0 or None: all).
#
# One recorded fact needs care: a step's `compute_buffer_replaced` compares the *address* of the
# compute buffer's C struct, as the recorder saw it through a tensor's `buffer` field — which only
# `alloc_graph` sets, so the fact exists from the second `alloc_graph` step on (null before). And
# glibc hands a just-freed struct's address to the next buffer, so a buffer that `reserve_n`
# reallocated usually reads "not replaced" (file 11, step 1: the log says "reallocating", the
# record says false). ggml_lite's simulated heap reuses small chunks the same way (chapter 03), so
# the comparison is made on the same terms.

# %%
# | export
"""A recorded plan, run again (the `check` command's first half): a graph file's external buffers
allocated as the recorder did (`graphio.allocate_external`), `reserve` and `alloc_graph` on a fresh
graph allocator of the file's era (`GAllocr` of 2024, or today's `GAllocr2026`), and every difference
with what the real ggml recorded — ok flags, buffer sizes, log lines, offsets, buffers, chunks."""

import logging
import re
from dataclasses import dataclass

from ggml_lite.dyn_tallocr import captured_log
from ggml_lite.errors import GraphFileError
from ggml_lite.gallocr_today import ERAS, VBUFFER_MAX_CHUNKS, VBuffer, new_gallocr
from ggml_lite.graphio import GraphFile, allocate_external, load_document, read_graph_file
from ggml_lite.schema import CALLS, SCHEMAS, buffer_type_of, ggml_version
from ggml_lite.untrusted import check_int, check_list, check_type, fail, quote


@dataclass
class Plan:
    """A compute-buffer plan: the buffer size and each tensor's offset in it (None: not in it),
    keyed by fixture id; and where every tensor is: `buffers[id]`, the label of its buffer ("compute",
    an external context's, None: no buffer yet), and `ext_offsets[id]`, its offset in an external one.
    A plan of today's allocator also has `chunks[id]`, the chunk an offset is in (None: not in the
    compute buffer), and `chunk_sizes`, the size asked for each chunk."""

    buffer_size: int
    offsets: dict
    buffers: dict | None = None
    ext_offsets: dict | None = None
    chunks: dict | None = None
    chunk_sizes: list | None = None


def plan_of(gf: GraphFile, galloc) -> Plan:
    """The plan `galloc` carried out on `gf`'s tensors: `data - base` of the compute buffer (of the
    tensor's chunk, for a `VBuffer`: today's allocator), and of the external buffers."""
    buf = galloc.buffers[0]
    parts = list(buf.chunks) if isinstance(buf, VBuffer) else [] if buf is None else [buf]
    index = {id(b): c for c, b in enumerate(parts)}  # a buffer of the compute buffer -> its chunk
    offsets, labels, ext, chunks = {}, {}, {}, {}
    for i, t in gf.tensors.items():
        holder = t.view_src.buffer if t.view_src is not None else t.buffer
        c = chunks[i] = index.get(id(holder)) if holder is not None and t.data is not None else None
        offsets[i] = None if c is None else t.data - parts[c].get_base()
        root = t
        while root.view_src is not None:
            root = root.view_src
        labels[i] = None if t.buffer is None else "compute" if id(t.buffer) in index else root.ctx.name
        own = root.buffer
        ext[i] = t.data - own.get_base() if own is not None and id(own) not in index and t.data is not None else None
    today = isinstance(buf, VBuffer)
    return Plan(galloc.get_buffer_size(0), offsets, labels, ext, chunks if today else None,
                list(buf.asked) if today else None)


def recorded_plan(gf: GraphFile) -> Plan:
    """The plan the file recorded (for a sequence file: that of `gf.step`); `chunks` and `chunk_sizes`
    only as far as the file records them."""
    where = gf.doc["steps"][gf.step] if gf.step is not None else gf.doc
    rec = gf.records.items()
    chunks = {i: r["chunk"] for i, r in rec if "chunk" in r}
    return Plan(where["buffer_size"], {i: r.get("offset") for i, r in rec}, {i: r.get("buffer") for i, r in rec},
                {i: r.get("ext_offset") for i, r in rec}, chunks or None, where.get("chunks"))


# %% [markdown]
# Two plans are compared tensor by tensor, in id order; each difference names the tensor, its op and
# size, and each fact that differs, what ggml recorded first: `ggml offset 6176, ggml_lite 6144`. A
# chunked plan adds the chunks' sizes and each tensor's chunk (`ggml chunk 1, ggml_lite chunk 0`).

# %%
# | export
def plan_differences(want: Plan, got: Plan, gf: GraphFile, limit: int | None = 10) -> list:
    """The first `limit` differences between two plans (None: all), in id order, each naming the
    tensor: its offset, and when both plans know them, its buffer, its offset in an external buffer
    and its chunk (and before the tensors, the chunks' sizes)."""
    out = []
    if want.buffer_size != got.buffer_size:
        out.append(f"buffer size: ggml {want.buffer_size}, ggml_lite {got.buffer_size}")
    if None not in (want.chunk_sizes, got.chunk_sizes) and want.chunk_sizes != got.chunk_sizes:
        out.append(f"chunks: ggml {want.chunk_sizes}, ggml_lite {got.chunk_sizes}")
    for i in sorted(want.offsets):
        facts = [("offset", want.offsets, got.offsets, ""), ("buffer", want.buffers, got.buffers, ""),
                 ("ext_offset", want.ext_offsets, got.ext_offsets, ""), ("chunk", want.chunks, got.chunks, "chunk ")]
        diff = [f"{f} {quote(w[i])}, ggml_lite {again}{quote(g.get(i))}" for f, w, g, again in facts
                if w is not None and g is not None and i in w and w[i] != g.get(i)]
        if diff:
            r = gf.records[i]
            out.append(f"tensor #{i} {quote(r['name'])} ({r['op']}, {r.get('nbytes')} B): ggml " + "; ggml ".join(diff))
            if limit and len(out) >= limit:
                break
    return out


def _call(galloc, name: str, graph, level: int = logging.INFO):
    with captured_log(level) as lines:
        ok = getattr(galloc, name)(graph)
    return ok, lines


# %% [markdown]
# ### Files of today's ggml: the era, the chunks, a release build's log
#
# Chapter 12 ports the allocator of ggml 0.15.3 beside the 2024 one. A file says which ggml recorded it
# in an optional `ggml_version` ("0.10.1", "0.15.3"; appendix A1 checks its form): from 0.10.1 on the
# file is planned by today's allocator (`GAllocr2026`), before it or without the field by the 2024 one.
# The command line's `--ggml 2024|2026` overrides the file (`era_of`). Where the buffer type has a
# `max_size`, today's allocator splits the compute buffer into chunks, and the file records them: a
# top-level (or per-step) `chunks`, the size the real ggml asked for each chunk (`GAllocr2026.chunk_sizes`,
# at most `GGML_VBUFFER_MAX_CHUNKS` = 16, each positive), `buffer_size` their sum plus 32 per chunk (the
# CPU buffer pads every buffer), and per tensor a `chunk`: the chunk its `offset` is in, null exactly
# where the offset is (an external buffer, a view of an external tensor, a tensor not placed). Both are
# optional, and compared where present. They are checked before anything is built (`check_today`):
# types, ranges, an index below the number of chunks (below 16 when `chunks` is absent), null iff the
# offset is — and they belong to today's allocator only: in a file planned with the 2024 one (an older
# `ggml_version`, or `--ggml 2024`) they are refused, since the 2024 allocator has no chunks to compare.
#
# The external buffers (weights, caches) of a file of today's ggml are allocated on its buffer type
# without the limit, as its recorder allocated them (the limit is the compute buffer's); a 2024 file's
# keep the limit, as they always did here.
#
# The logs: a debug build of today's ggml prints what the 2024 one printed (`needs_realloc`'s reasons,
# `alloc_graph`'s "reallocating buffers automatically"), except that `reserve` says "reallocating"
# only when a buffer existed before. A *release* build (NDEBUG) compiles those diagnostics out and logs
# only errors ("failed to allocate ..."). So when a file's `ggml_build` says release — "release" or CMake's other
# NDEBUG types ("RelWithDebInfo", "MinSizeRel"), or NDEBUG other than as "no NDEBUG" (the 2024 fixtures say
# "debug (no NDEBUG: ...)") — only ggml_lite's ERROR-level messages are compared with the recorded log
# (`release_build`). When a file of today's ggml says neither (or both), its logs tell: a release build when no
# recorded line is a diagnostic. And a sequence of today's ggml compares `compute_buffer_replaced` only
# where ggml_lite kept its buffer: where it allocated a new one, whether the new struct got the old address
# depends on the recording process's heap (a long-lived recorder's glibc holds other freed structs), so
# either record agrees.

# %%
# | export
TODAY = (0, 10, 1)  # the first ggml release planned with today's allocator (chapter 12)


def era_of(doc: dict, ggml: str | None = None) -> str:
    """The graph allocator a file is planned with: `ggml` ("2024" or "2026", the --ggml flag) when given;
    else today's ("2026") for a `ggml_version` of 0.10.1 or later, the 2024 one otherwise."""
    if ggml is not None:
        if ggml not in ERAS:
            raise GraphFileError(f"--ggml: expected one of {tuple(ERAS)}, found {quote(ggml)}")
        return ggml
    version = ggml_version(doc)
    return "2026" if version is not None and version >= TODAY else "2024"


RELEASE = re.compile(r"(?<!no )(?<!without )(?<!not )\b(release|relwithdebinfo|minsizerel)\b"  # CMake's NDEBUG types
                     r"|(?<!no )(?<!-u)(?<!without )ndebug(?! (is )?(not |un)defined)")  # or NDEBUG itself
DEBUG = re.compile(r"\bdebug\b|\b(no|without) (-d)?ndebug|ndebug (is )?(not |un)defined")
ERROR_LINE = re.compile(r"failed|not enough|out of")  # what ggml logs as an error (the rest: debug diagnostics)


def release_build(doc: dict) -> bool:
    """Whether the file was recorded by a release build (NDEBUG: ggml logs only its errors): what its
    `ggml_build` says when it says one of release or debug; otherwise, for a file of today's ggml, what its
    logs show — a release build when no recorded line is a debug diagnostic — and a debug build for a 2024
    file (as this project's 2024 recordings were)."""
    build = doc.get("ggml_build", "").lower()
    release, debug = RELEASE.search(build) is not None, DEBUG.search(build) is not None
    if release != debug or era_of(doc) == "2024":
        return release and not debug
    records = [doc.get("reserve"), doc.get("alloc_graph"), *doc.get("steps", [])]  # (`plan` leaves them unchecked)
    logs = [rec["log"] for rec in records if isinstance(rec, dict) and isinstance(rec.get("log"), list)]
    return not any(isinstance(line, str) and not ERROR_LINE.search(line) for log in logs for line in log)


def check_today(doc: dict, era: str) -> None:
    """The fields of today's plans, before anything is built: `ggml_build` a string; `chunks` (of the file
    or of a step) at most 16 positive sizes; each tensor's `chunk` an index of them, null exactly where its
    `offset` is, recorded by every tensor or none; chunk fields only in a file planned with today's allocator
    (`era` "2026")."""
    check_type(doc.get("ggml_build", ""), "ggml_build", str, "a string (the build of ggml that recorded the file)")
    records = [("", doc)] if "graph" in doc else [(f"steps[{k}].", st) for k, st in enumerate(doc["steps"])]
    for p, rec in records:
        entries = rec["graph"]["tensors"] if "graph" in rec else []
        marked = [i for i, e in enumerate(entries) if "chunk" in e]
        if era != "2026" and ("chunks" in rec or marked):
            field = f"{p}chunks" if "chunks" in rec else f"{p}graph.tensors[{marked[0]}].chunk"
            why = (("--ggml 2024", "drop --ggml 2024") if era_of(doc) == "2026" else
                   (f"ggml_version {doc['ggml_version']}" if "ggml_version" in doc else "no ggml_version",
                    "give it a ggml_version of 0.10.1 or later, or pass --ggml 2026"))
            raise GraphFileError(f"{field}: chunks are planned by today's ggml (0.10.1 or later), and this file is "
                                 f"planned with the 2024 allocator ({why[0]}): {why[1]}")
        n = VBUFFER_MAX_CHUNKS
        if "chunks" in rec:
            n = len(check_list(rec["chunks"], f"{p}chunks", most=VBUFFER_MAX_CHUNKS))
            for k, size in enumerate(rec["chunks"]):
                check_int(size, f"{p}chunks[{k}]", 1)
        unmarked = next((i for i, e in enumerate(entries) if "chunk" not in e), None) if marked else None
        if unmarked is not None:  # (a tensor without it would go unchecked)
            raise GraphFileError(f"{p}graph.tensors[{unmarked}].chunk: missing; every tensor records its chunk (an "
                                 f"index or null), or none does, and tensor #{marked[0]} does")
        for i in marked:
            c, offset, path = entries[i]["chunk"], entries[i]["offset"], f"{p}graph.tensors[{i}].chunk"
            if c is None and offset is not None:
                fail(path, f"a chunk index: the tensor has an offset ({offset}) in the compute buffer", c)
            if c is not None and (not isinstance(c, int) or isinstance(c, bool) or not 0 <= c < n):
                fail(path, f"null or a chunk index in [0, {n - 1}]" if n else "null (`chunks` lists none)", c)
            if c is not None and offset is None:
                fail(path, "null: the tensor's offset is null (it is not in the compute buffer)", c)


# %% [markdown]
# `run_plan` is the replay of one file (or one step of a sequence): load, place the external buffers,
# then call the allocator as the recorder did and keep, per call, what the record holds — `ok`, the
# buffer size before and after, the log lines — and the address of the compute buffer's struct before
# and after (`handle`), from which `compute_buffer_replaced` is judged.

# %%
# | export
def run_plan(source, step: int | None = None, galloc=None, call: str | None = None, validate: bool = True,
             ggml: str | None = None) -> tuple:
    """Load `source` (path or document, `step` of a sequence), allocate its external contexts, and
    run `call` ("reserve" or "alloc_graph"; default both, as the single-graph files record) on
    `galloc` (when None, a new graph allocator of the file's era, `era_of(doc, ggml)`, on the file's
    buffer type: `buffer_type_of`). Returns `(GraphFile, galloc, {call: result})`, where
    a result holds ok, buffer_size_before, buffer_size, the compute buffer's `handle` (the address
    of its C struct; a chunked buffer's: its first chunk's) before and after, and the log lines (only
    the errors for a release build). (`validate=False`: a dict already validated, `check_today` too.)"""

    gf = read_graph_file(source, step, validate=validate)
    era = era_of(gf.doc, ggml)
    if validate:
        check_today(gf.doc, era)
    allocate_external(gf, None if era == "2026" else buffer_type_of(gf.doc))  # (2024: with the limit, as always)
    galloc = galloc or new_gallocr(buffer_type_of(gf.doc), ggml=era)
    level = logging.ERROR if release_build(gf.doc) else logging.INFO
    results = {}
    for name in ([call] if call else ["reserve", "alloc_graph"]):
        before = galloc.buffers[0]
        handle, size_before = (before.handle, galloc.get_buffer_size(0)) if before is not None else (None, 0)
        ok, lines = _call(galloc, name, gf.graph, level)
        after = galloc.buffers[0]
        results[name] = {"ok": ok, "buffer_size_before": size_before, "buffer_size": galloc.get_buffer_size(0),
                         "handle_before": handle, "handle": after.handle if after is not None else None,
                         "log": lines}
    return gf, galloc, results


def _compare_call(label: str, want: dict, got: dict) -> list:
    out = []
    for key, gkey in (("ok", "ok"), ("buffer_size", "buffer_size"), ("buffer_size_before", "buffer_size_before"),
                      ("compute_buffer_replaced", "replaced"), ("log", "log")):
        if key in want and want[key] != got[gkey] and key == "log" and isinstance(want[key], list):
            w, g = want[key], got[gkey]  # (the first differing line, quoted long enough to show it)
            k = next((k for k, (a, b) in enumerate(zip(w, g)) if a != b), min(len(w), len(g)))
            out.append(f"{label}: log[{k}]: ggml {quote(w[k], 200) if k < len(w) else '(no more lines)'}, "
                       f"ggml_lite {quote(g[k], 200) if k < len(g) else '(no more lines)'}")
        elif key in want and want[key] != got[gkey]:
            out.append(f"{label}: {key}: ggml {quote(want[key])}, ggml_lite {quote(got[gkey])}")
    return out


# %% [markdown]
# `check_plan_file` puts it together. A single-graph file is run once, both calls; a sequence file runs
# its steps on *one* allocator, as an application does between evaluations, so that a step which keeps
# the previous plan and a step which plans again are both compared with what ggml did at that step.

# %%
# | export
def run_steps(doc: dict, ggml: str | None = None):
    """Run a validated sequence file's steps on one allocator (`run_plan`); yields per step `(k, step,
    call, GraphFile, galloc, result)`, the result with `replaced`, the `compute_buffer_replaced` to compare
    (None before the second alloc_graph), and `new_buffer`: a new virtual buffer of today's allocator since
    the last alloc_graph, where either recorded address agrees (see above)."""
    galloc = seen = seen_buf = None  # seen: the compute buffer's address after the last alloc_graph step
    for k, st in enumerate(doc["steps"]):
        call = CALLS[st["call"]]
        gf, galloc, res = run_plan(doc, k, galloc, call, validate=False, ggml=ggml)
        got = res[call]
        # the recorder saw the buffer through a tensor's `buffer`, which only alloc_graph sets
        got["replaced"] = None if call != "alloc_graph" or seen is None else got["handle"] != seen
        got["new_buffer"] = isinstance(galloc.buffers[0], VBuffer) and galloc.buffers[0] is not seen_buf
        if got["replaced"] is not None and got["new_buffer"] and isinstance(st.get("compute_buffer_replaced"), bool):
            got["replaced"] = st["compute_buffer_replaced"]
        if call == "alloc_graph":
            seen, seen_buf = got["handle"], galloc.buffers[0]
        yield k, st, call, gf, galloc, got


def check_plan_file(source, limit: int | None = 10, ggml: str | None = None) -> list:
    """Every difference between the file's recorded plan(s) and ggml_lite's (empty: identical):
    offsets, chunks, buffer sizes, ok flags, logs; for a sequence file, each step on one allocator, of
    the file's era (`era_of(doc, ggml)`). The first `limit` differences (an integer >= 1; 0 or None: all
    of them). The document is validated first, with every recorded result (`validate_document(record=True)`,
    `check_today`)."""
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
        raise GraphFileError(f"limit: expected an integer >= 1 (0 or None: every difference), found {quote(limit)}")
    limit = limit or None
    doc = load_document(source, record=True)
    if doc["schema"] != SCHEMAS[0]:
        raise GraphFileError(f"not a graph-allocator fixture (schema {quote(doc['schema'])})")
    check_today(doc, era_of(doc, ggml))
    out = []
    if "steps" in doc:
        for k, st, call, gf, galloc, got in run_steps(doc, ggml):
            out += _compare_call(f"step {k} ({call})", st, got)
            if st["ok"]:  # (after a reserve nothing is placed yet: every recorded offset must be null)
                out += [f"step {k}: {d}" for d in plan_differences(recorded_plan(gf), plan_of(gf, galloc), gf, limit)]
    else:
        gf, galloc, res = run_plan(doc, validate=False, ggml=ggml)
        for call in ("reserve", "alloc_graph"):
            res[call]["replaced"] = None
            out += _compare_call(call, doc[call], res[call])
        out += plan_differences(recorded_plan(gf), plan_of(gf, galloc), gf, limit)
    return out[:limit]


# %% [markdown]
# ### A worked example: one file, then one file with a wrong record
#
# Fixture 02 records an MLP whose element-wise ops work in place. `check_plan_file` finds nothing to
# report. Then the same document with two recorded facts changed — the compute buffer one block
# larger, one tensor moved by 32 bytes — and the differences name each fact, what ggml recorded and
# what ggml_lite computed.

# %%
# NBVAL_CHECK_OUTPUT
doc02 = json.loads((FIXTURES / "02_elementwise_inplace.json").read_text())
print("as recorded:", check_plan_file(doc02))
wrong = copy.deepcopy(doc02)
wrong["alloc_graph"]["buffer_size"] += 32
moved = next(e for e in wrong["graph"]["tensors"] if e["offset"])
moved["offset"] += 32
for d in check_plan_file(wrong):
    print(" ", d)

# %% [markdown]
# ### A worked example: a file of today's ggml, in chunks
#
# Fixture 06 again, as ggml 0.15.3 would record it on a CPU buffer type limited to 20 KiB per buffer: a
# release build, so the logs hold no diagnostics. Planned by today's allocator (the era of
# `"ggml_version": "0.15.3"`), the compute buffer is three chunks of 16,704, 10,240 and 13,760 bytes — the
# real ggml's numbers too: `tests/fixtures/ggml-today/03_llama_block_20kib.json` recorded this very case
# from ggml 0.15.3, and it checks identical, chunk for chunk (so do the other recorded files of that
# folder; `tests/unit/test_cli_today.py` makes more with the real ggml). Written into the document as the
# recorder writes it, our plan checks identical; one tensor moved to another chunk, and `check` names the
# chunk; and a file that says an older ggml recorded it has no business carrying chunks.

# %%
# NBVAL_CHECK_OUTPUT
today = json.loads((FIXTURES / "06_llama_block.json").read_text())
today.update(ggml_version="0.15.3", ggml_build="release (NDEBUG)")
today["buffer_type"]["max_size"] = 20480
gf_t, galloc_t, _ = run_plan(today)
plan_t = plan_of(gf_t, galloc_t)
print("era", era_of(today), "| chunks", plan_t.chunk_sizes, "| buffer size", plan_t.buffer_size)
today["chunks"], today["buffer_size"] = plan_t.chunk_sizes, plan_t.buffer_size
for call in ("reserve", "alloc_graph"):
    today[call].update(buffer_size=plan_t.buffer_size, log=[])
for i, e in enumerate(today["graph"]["tensors"]):
    e["chunk"], e["offset"] = plan_t.chunks[i], plan_t.offsets[i]
print("as recorded:", check_plan_file(today))
moved_t = next(e for e in today["graph"]["tensors"] if e["chunk"] == 2 and e["view_src"] is None)
moved_t["chunk"] = 1
print(*check_plan_file(today), sep="\n")
today["ggml_version"] = "0.9.9"
try:
    check_plan_file(today)
except gl.errors.GraphFileError as err:
    print(f"{type(err).__name__}: {err}")

# %% [markdown]
# ### A worked example: fixture 13, rebuilt by chapter 10's builder
#
# The project's LLaMA fixtures were recorded from the real ggml with the recorded variant of chapter 10's
# builder (`build_llama(..., recorded=True)`: one more RESHAPE of Vcur per layer, and other names). Fixture
# 13 is a Llama-2 7B at `n_ctx` 512 with every token an output. The recorded variant rebuilds it tensor for
# tensor — 1,062 nodes, 33 per layer, each with the recorded name, op and shape — and its compute buffer is
# the recorded one and the same as llama.cpp's own variant's (1,030 nodes): the extra RESHAPE is a view,
# and names take no memory.

# %%
# NBVAL_CHECK_OUTPUT
from ggml_lite.models.llama import PRESETS, build_llama, worst_case_batch  # noqa: E402

p7 = PRESETS["llama-2-7b"]
on_cpu = dict(token_embd="CPU", output="CPU", layers=["CPU"] * p7.n_layer, kv_cache=["CPU"] * p7.n_layer)
fx = json.loads((FIXTURES / "13_llama7b_ctx512_all_outputs.json").read_text())
by_id = {t["id"]: t for t in fx["graph"]["tensors"]}
recorded_nodes = [by_id[i] for i in fx["graph"]["nodes"]]
sizes = {}
for recorded in (True, False):
    m = p7.model(512)
    ctxs13, g13, _ = build_llama(m, dict(on_cpu), worst_case_batch(512, 512), recorded=recorded)
    for c in ctxs13[:-1]:
        gl.alloc_ctx_tensors(c, gl.cpu_buffer_type())
    ga = gl.GAllocr(gl.cpu_buffer_type())
    ga.reserve(g13)
    sizes[recorded] = (len(g13.nodes), ga.get_buffer_size(0))
    if recorded:
        same = [(n.name, n.op.name, list(n.ne)) for n in g13.nodes] == \
               [(t["name"], t["op"], t["ne"]) for t in recorded_nodes]
print("recorded variant:", sizes[True], "| llama.cpp:", sizes[False], "| fixture 13 node for node:", same,
      "| recorded buffer:", fx["buffer_size"])

# %% [markdown]
# ### A picture: the plan ggml recorded, and ggml_lite's on top
#
# Each tensor of fixture 06 (one LLaMA block) that lives in the compute buffer is a bar from its offset
# to its end, at the position of its node: the allocator's whole decision in one figure. ggml's
# recorded plan is drawn wide and pale, ggml_lite's narrow and dark on top: where they agree — everywhere
# — the dark bar sits inside the pale one.

# %%
import plotly.graph_objects as go

gf06, galloc06, _ = run_plan(str(FIXTURES / "06_llama_block.json"))
want06, got06 = recorded_plan(gf06), plan_of(gf06, galloc06)
ids = [gf06.id_of(t) for t in gf06.graph.leafs + gf06.graph.nodes]
fig = go.Figure()
for plan, name, width, color in ((want06, "ggml (recorded)", 0.9, "#c6dbef"), (got06, "ggml_lite", 0.4, "#08519c")):
    placed = [i for i in ids if plan.offsets.get(i) is not None]
    fig.add_trace(go.Bar(x=[ids.index(i) for i in placed], y=[gf06.tensors[i].nbytes for i in placed],
                         base=[plan.offsets[i] for i in placed], width=width, name=name, marker_color=color,
                         hovertext=[gf06.tensors[i].name for i in placed]))
fig.update_layout(barmode="overlay", height=360, xaxis_title="leafs, then nodes in graph order",
                  yaxis_title="offset in the compute buffer (bytes)", margin=dict(l=60, r=20, t=40, b=40),
                  title=f"fixture 06: {want06.buffer_size:,} bytes recorded, {got06.buffer_size:,} planned")
fig

# %% [markdown]
# ## 2 · `check` verifies numerics
#
# A fixture-schema file may also record what the real ggml *computed*
# (`tests/fixtures/README.md`): a seed (`data_generator.data_seed`), how each leaf is filled, and the values of every
# OUTPUT node and the last node. With a CPU backend, `python -m ggml_lite check FILE.json` can
# verify them: plan the graph (chapter 05), fill every leaf from its own 32-bit LCG stream,
# compute on the CPU backend, compare. The stream is generated with a jump-ahead — `s_k = M_k·s_0 +
# C_k (mod 2^32)`, where the coefficients for `k = 1..n` are doubled `log2 n` times — so a large
# leaf costs a few numpy operations, not a Python loop per value.
#
# The comparison is relative to the result's largest magnitude, `max|got − want| / max|want|`:
# ggml's SIMD kernels and these numpy ones differ in the last bits, and an element-wise relative
# error is meaningless for outputs near zero. The tolerance is `1e-4` for a graph of f32 tensors
# only and `5e-3` when an f16 or quantized tensor takes part (their rounding differs between the
# two implementations); `check` prints it and the worst error of every result.


# %%
# | export numerics
"""The `numerics` extension of the fixture schema (`tests/fixtures/README.md`): the leaf data
generator, the validation of a `numerics` block, and the verification of recorded results on the CPU
backend."""

import math

import numpy as np

from ggml_lite.backend import tensor_get, tensor_set
from ggml_lite.cpu import Arithmetic, cpu_init
from ggml_lite.errors import AllocationError, GraphFileError
from ggml_lite.quants import quantize_q8_0, quantize_row_q4_0_ref
from ggml_lite.tensor import F16, F32, I32, Q4_0, Q8_0
from ggml_lite.untrusted import check_int, check_list, check_type, fail, need, quote

MASK = 0xFFFFFFFF
LCG_A, LCG_C = 1664525, 1013904223
TOLERANCE_F32, TOLERANCE_MIXED = Arithmetic.TOLERANCE_F32, Arithmetic.TOLERANCE_MIXED  # the numpy tier's (chapter 07)
CHUNK = 1 << 20  # values generated at a time: the generator's memory does not grow with the leaf


def _coefficients(n: int) -> tuple:
    """`(m, c)` with `s_k = m[k-1]·s_0 + c[k-1] (mod 2^32)` for `k = 1..n`."""
    m = np.array([LCG_A], dtype=np.uint64)
    c = np.array([LCG_C], dtype=np.uint64)
    while m.size < n:  # s_{j+k} = m_k·s_j + c_k: double the known coefficients
        mj, cj = m[-1], c[-1]
        m = np.concatenate([m, (m * mj) & MASK])
        c = np.concatenate([c, (m[: c.size] * cj + c) & MASK])
    return m[:n], c[:n]


def lcg_states(seed: int, n: int) -> np.ndarray:
    """The states `s_1..s_n` of the LCG `s ← (1664525·s + 1013904223) mod 2^32` from `s_0 = seed`."""
    m, c = _coefficients(n)
    return (m * np.uint64(seed & MASK) + c) & MASK


def leaf_values(data_seed: int, leaf_id: int, n: int, kind: str, value_range=None) -> np.ndarray:
    """The `n` values of leaf `leaf_id` in memory order: f32 in [-1, 1), or int32 integers in `range`
    `[lo, hi)`; generated `CHUNK` values at a time (each chunk continues from the last state)."""
    integer = value_range is not None or kind in ("int", "i32")
    if integer:
        if value_range is None:
            raise GraphFileError(f"leaf {leaf_id}: an integer leaf needs a range [lo, hi)")
        lo, hi = value_range
        if not -(2**31) <= lo < hi <= 2**31:
            raise GraphFileError(f"leaf {leaf_id}: range [{lo}, {hi}) is not a non-empty range of int32 values")
    out = np.empty(n, dtype=np.int32 if integer else np.float32)
    m, c = _coefficients(min(n, CHUNK))
    s = np.uint64((data_seed + 2654435761 * (leaf_id + 1)) & MASK)
    for start in range(0, n, CHUNK):
        states = (m * s + c) & MASK
        u = states[: n - start] >> np.uint64(8)
        if integer:
            out[start:start + u.size] = lo + (u % np.uint64(hi - lo)).astype(np.int64)
        else:
            out[start:start + u.size] = (u.astype(np.float64) - 2.0**23) / 2.0**23
        s = states[-1]
    return out


# %% [markdown]
# A leaf's values become its bytes by its type: f32 and i32 as generated, f16 rounded to nearest even,
# q8_0 and q4_0 through ggml's reference quantizers (so both sides start from identical bytes). The
# seed is read from `data_generator.data_seed`, or from a top-level `data_seed` in files written
# before the specification said where it goes. This is the project's one seeded data filler: the tests,
# the oracle and appendix A6's check of a plan by computing (`verify_plans`) fill their graphs with it.

# %%
# | export numerics
def leaf_bytes(type, ne, data_seed: int, leaf_id: int, kind: str = "float", value_range=None,
               name: str = "") -> bytes:
    """The generated data of one leaf of `type` and shape `ne`, as the tensor's bytes: f32 as is, f16
    rounded to nearest even, q8_0 (and q4_0) quantized by ggml's reference quantizer, i32 integers. The
    one seeded data filler of the project (the tests, the oracle and `verify` fill their graphs with it)."""
    values = leaf_values(data_seed, leaf_id, ne[0] * ne[1] * ne[2] * ne[3], kind, value_range)
    if type is F32 or type is I32:
        return values.astype(np.float32 if type is F32 else np.int32).tobytes()
    if type is F16:
        return values.astype(np.float16).tobytes()
    if type is Q8_0:
        return quantize_q8_0(values).tobytes()
    if type is Q4_0:  # (beyond the spec, as the oracle's numeric graphs fill it)
        return quantize_row_q4_0_ref(values.reshape(-1, ne[0])).tobytes()
    raise GraphFileError(f"leaf {leaf_id} ({quote(name)}): no generator for type {type.name}")


def fill_leaf(tensor, data_seed: int, leaf_id: int, kind: str = "float", value_range=None) -> None:
    """Write the generated data of one leaf (`leaf_bytes`) into its tensor."""
    tensor_set(tensor, leaf_bytes(tensor.type, tensor.ne, data_seed, leaf_id, kind, value_range, tensor.name))


def _values_f32(tensor) -> np.ndarray:
    """The tensor's values as f32 in ggml memory order (i0 fastest)."""
    return tensor_get(tensor).astype(np.float32).reshape(-1)


GENERATOR_KIND = "lcg32"  # `data_generator.kind`: the 32-bit LCG of tests/fixtures/README.md, the only one


def data_seed(doc: dict) -> int:
    """The leaf-data seed: `data_generator.data_seed` (the spec's place), else a top-level `data_seed`
    (files written before the spec said so)."""
    gen = doc.get("data_generator")
    if isinstance(gen, dict) and gen.get("kind", GENERATOR_KIND) != GENERATOR_KIND:
        fail("data_generator.kind", f"{GENERATOR_KIND!r}, the only generator a file can name (the LCG of "
             "tests/fixtures/README.md, which fills the leafs)", gen["kind"])
    if gen is not None and not isinstance(gen, dict) and gen != "LCG":
        fail("data_generator", f"an object with `data_seed` and `kind` {GENERATOR_KIND!r} (or, in older files, "
             "'LCG')", gen)
    seed, path = (gen.get("data_seed"), "data_generator.data_seed") if isinstance(gen, dict) else (None, "")
    if seed is None:
        seed, path = doc.get("data_seed"), "data_seed"
    if seed is None:
        raise GraphFileError("numerics: the file has no seed: expected `data_generator.data_seed` (an integer)")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**32:
        fail(path, "an integer in [0, 2^32)", seed)
    return seed


# %% [markdown]
# A `numerics` block is validated like the rest of the file, before any byte is allocated: each
# `leaf_data` entry names a leaf of the graph, with its name and type, and a kind its type allows (an
# integer leaf has a range `[lo, hi)` of int32 values); every leaf that holds data has one entry; each
# result names a node, its type and `ne`, `n_elements` equal to the product of `ne`, and exactly that
# many finite f32 `values` (or, summarised, `first`, `sum` and `sum_sq`). An empty `results` list is
# refused: there would be nothing to compare. And computing needs real bytes and time, so the block is
# refused when its buffers (the recorded compute buffer and external buffers, with room for
# temporaries) would exceed `max_bytes` (1 GiB by default; `check --max-gib` raises it), or when the graph
# takes more than 2^33 multiply-adds (`NUMERICS_MAX_WORK`).

# %%
# | export numerics
NUMERICS_MAX_BYTES = 2**30
NUMERICS_MAX_WORK = 2**33  # multiply-adds: seconds with BLAS (the bit-exact tier takes longer)
F32_MAX = float(np.finfo(np.float32).max)
KINDS = {"float": False, "int": True, "i32": True}  # kind -> integer data
FILLABLE = ("f32", "f16", "q8_0", "q4_0", "i32")


def _check_values(vals, path: str, n: int) -> None:
    for k, v in enumerate(check_list(vals, path, length=n)):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not (math.isfinite(v) and abs(v) <= F32_MAX):
            fail(f"{path}[{k}]", "a finite f32 value", v)


def _check_leaf(leaf: dict, p: str, ents: list) -> int:
    check_type(leaf, p, dict, "an object {id, name, type, kind, range?}")
    i = check_int(need(leaf, "id", f"{p}.id"), f"{p}.id", 0, len(ents) - 1)
    e = ents[i]
    if e["graph_role"] == "none" or e["op"] != "NONE":
        fail(f"{p}.id", "the id of a leaf of the graph (op NONE)", i)
    for f in ("name", "type"):
        if need(leaf, f, f"{p}.{f}") != e[f]:
            fail(f"{p}.{f}", f"{quote(e[f])}, the {f} of tensor #{i}", leaf[f])
    if e["type"] not in FILLABLE:
        fail(f"{p}.type", f"a type the generator fills {FILLABLE}", e["type"])
    kind = leaf.get("kind", "float")
    if not isinstance(kind, str) or kind not in KINDS or KINDS[kind] != (e["type"] == "i32"):
        fail(f"{p}.kind", "'int' for an i32 leaf" if e["type"] == "i32" else f"'float' for a leaf of type {e['type']}",
             kind)
    if KINDS[kind] or "range" in leaf:
        r = check_list(need(leaf, "range", f"{p}.range"), f"{p}.range", length=2)
        if not KINDS[kind]:
            fail(f"{p}.range", "no range on a float leaf", r)
        lo, hi = (check_int(x, f"{p}.range[{k}]", -(2**31), 2**31) for k, x in enumerate(r))
        if lo >= hi:
            fail(f"{p}.range", "[lo, hi) with lo < hi", r)
    return i


def _check_result(res: dict, p: str, ents: list) -> int:
    check_type(res, p, dict, "an object {id, name, type, ne, n_elements, values}")
    i = check_int(need(res, "id", f"{p}.id"), f"{p}.id", 0, len(ents) - 1)
    e = ents[i]
    if e["graph_role"] != "node":
        fail(f"{p}.id", "the id of a node of the graph", i)
    for f in ("name", "type", "ne"):
        if need(res, f, f"{p}.{f}") != e[f]:
            fail(f"{p}.{f}", f"{quote(e[f])}, the {f} of tensor #{i}", res[f])
    n = math.prod(e["ne"])
    if check_int(need(res, "n_elements", f"{p}.n_elements"), f"{p}.n_elements") != n:
        fail(f"{p}.n_elements", f"{n}, the product of ne {e['ne']}", res["n_elements"])
    if not check_type(res.get("summary", False), f"{p}.summary", bool, "true or false"):
        _check_values(need(res, "values", f"{p}.values"), f"{p}.values", n)
        return i
    _check_values(need(res, "first", f"{p}.first"), f"{p}.first", min(n, 256))
    for f in ("sum", "sum_sq"):
        v = need(res, f, f"{p}.{f}")
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or (f == "sum_sq" and v < 0):
            fail(f"{p}.{f}", "a finite number" + (" >= 0" if f == "sum_sq" else ""), v)
    return i


# %%
# | export numerics
def validate_numerics(doc: dict, max_bytes: int = NUMERICS_MAX_BYTES) -> None:
    """Check the `numerics` block of a validated single-graph document (`schema.validate_document`)
    against its graph, field by field, and the memory computing it needs against `max_bytes`."""
    if check_type(doc.get("numeric", True), "numeric", bool, "true or false") is False or "numerics" not in doc:
        raise GraphFileError("numeric / numerics: a file with computed results has `numeric: true` and a "
                             f"`numerics` block; this one has numeric = {quote(doc.get('numeric'))} and "
                             f"{'a' if 'numerics' in doc else 'no'} `numerics` block")
    if "graph" not in doc:
        raise GraphFileError("numerics: recorded results go with a single graph, not with a sequence of steps")
    num = check_type(doc["numerics"], "numerics", dict, "an object {leaf_data, results}")
    ents = doc["graph"]["tensors"]
    seen: dict[int, int] = {}
    for k, leaf in enumerate(check_list(need(num, "leaf_data", "numerics.leaf_data"), "numerics.leaf_data")):
        i = _check_leaf(leaf, f"numerics.leaf_data[{k}]", ents)
        if seen.setdefault(i, k) != k:
            fail(f"numerics.leaf_data[{k}].id", f"a leaf not described before (leaf_data[{seen[i]}] is)", i)
    for i, e in enumerate(ents):
        if e["graph_role"] != "none" and e["op"] == "NONE" and e["view_src"] is None and i not in seen:
            raise GraphFileError(f"numerics.leaf_data: no entry for graph.tensors[{i}] {quote(e['name'])}, a leaf that "
                                 "holds data (every leaf's data must be described)")
    results = check_list(need(num, "results", "numerics.results"), "numerics.results")
    if not results:
        fail("numerics.results", "at least one result (an empty list leaves nothing to compare)", results)
    done: dict[int, int] = {}
    for k, res in enumerate(results):
        i = _check_result(res, f"numerics.results[{k}]", ents)
        if done.setdefault(i, k) != k:
            fail(f"numerics.results[{k}].id", f"a node not compared before (results[{done[i]}] is)", i)
    data_seed(doc)
    _check_memory(doc, [math.prod(e["ne"]) for i, e in enumerate(ents) if i in seen or i in done], max_bytes)
    _check_work(ents)


def _check_work(ents: list) -> None:
    """Computing takes time too: a MUL_MAT costs a multiply-add per output element and row element of its
    `src[0]`, any other node one per element; beyond `NUMERICS_MAX_WORK` the block is refused."""
    work = sum(math.prod(e["ne"]) * (ents[e["src"][0]]["ne"][0] if e["op"] == "MUL_MAT" and e["src"]
                                      and e["src"][0] is not None else 1)
               for e in ents if e["graph_role"] == "node")
    if work > NUMERICS_MAX_WORK:
        raise AllocationError(f"numerics: computing this graph takes about {work:.3g} multiply-adds, more than the "
                              f"{NUMERICS_MAX_WORK:.3g} a check computes (check --no-numerics compares the plan only)")


def _check_memory(doc: dict, counts: list, max_bytes: int) -> None:
    """Computing allocates the compute and external buffers (twice: room for the kernels' temporaries)
    and, per leaf or result, 16 bytes an element while generating or comparing."""
    buffers = doc["buffer_size"] + sum(ext["size"] for ext in doc.get("external_buffers", []))
    need_ = 2 * buffers + 16 * max(counts, default=0)
    if need_ > max_bytes:
        raise AllocationError(f"numerics: computing this graph needs about {need_ / 2**30:.2f} GiB (buffers of "
                              f"{buffers / 2**30:.2f} GiB), more than the {max_bytes / 2**30:.3g} GiB allowed "
                              "(check --max-gib raises it)")


# %% [markdown]
# Verification, once the block is known to be sound: fill every described leaf, compute the whole graph
# on the CPU backend (with `exact=True`, appendix A2's bit-exact tier), and compare each recorded result
# with the bytes ggml_lite's plan put at that node.

# %%
# | export numerics
def verify_numerics(doc: dict, gf, exact: bool = False, max_bytes: int = NUMERICS_MAX_BYTES) -> tuple:
    """Fill the leafs of the planned graph `gf` (a `graphio.GraphFile` after `plancheck.run_plan`), compute it on
    the CPU backend (`exact`: with the bit-exact tier of appendix A2) and compare every recorded
    result. Returns `(tolerance, rows)` with one row per result: `(name, worst relative error, ok)`.
    The block is validated first (`validate_numerics`, with `max_bytes`)."""
    validate_numerics(doc, max_bytes)
    num = doc["numerics"]
    seed = data_seed(doc)
    for leaf in num["leaf_data"]:
        fill_leaf(gf.tensors[leaf["id"]], seed, leaf["id"], leaf.get("kind", "float"), leaf.get("range"))
    cpu_init(exact=exact).graph_compute(gf.graph)
    mixed = any(t.type.name != "f32" and t.type is not I32 for t in gf.tensors.values())
    tol = TOLERANCE_MIXED if mixed else TOLERANCE_F32
    errors = [(res["name"], _worst(res, _values_f32(gf.tensors[res["id"]]))) for res in num["results"]]
    return tol, [(name, err, err <= tol) for name, err in errors]


def _relative(got: np.ndarray, want: np.ndarray) -> float:
    """`max|got − want| / max|want|`; infinite when a computed value is not finite."""
    if not want.size:
        return 0.0
    diff = np.abs(got - want)
    if not np.all(np.isfinite(diff)):
        return float("inf")
    return float(np.max(diff) / max(np.max(np.abs(want)), np.finfo(np.float32).tiny))


def _worst(res: dict, got: np.ndarray) -> float:
    """Relative error of one result: against its largest recorded magnitude; for a summarised result,
    the `first` values and the `sum` / `sum_sq` (relative to the sum of magnitudes / sum of squares)."""
    if got.size != res["n_elements"]:
        return float("inf")
    g = got.astype(np.float64)
    if not res.get("summary"):
        return _relative(g, np.array(res["values"], dtype=np.float64))
    first = np.array(res["first"], dtype=np.float64)
    errs = [_relative(g[: first.size], first),
            abs(g.sum() - res["sum"]) / max(np.abs(g).sum(), 1e-30),
            abs((g * g).sum() - res["sum_sq"]) / max(res["sum_sq"], 1e-30)]
    return float("inf") if not all(math.isfinite(x) for x in errs) else max(errs)



# %% [markdown]
# The generator for leaf 3 of a file with `data_seed` 42 — floats in memory order — and the
# jump-ahead checked against the plain recurrence:

# %%
# NBVAL_CHECK_OUTPUT
print(leaf_values(42, 3, 5, "float"))
print(leaf_values(42, 3, 5, "int", (0, 10)))
s_, plain = (42 + 2654435761 * 4) & MASK, []
for _ in range(1000):
    s_ = (LCG_A * s_ + LCG_C) & MASK
    plain.append(s_)
print("jump-ahead == loop for 1000 states:", lcg_states((42 + 2654435761 * 4) & MASK, 1000).tolist() == plain)


# %% [markdown]
# ### A worked example: recording numerics, then checking them
#
# No fixture of the project carries numerics (the differential tests make them with the real ggml at
# test time), so here is the round trip on fixture 01, with ggml_lite standing in for ggml as the
# recorder: plan the graph, fill its leafs from seed 7, compute, record the output `probs` as a result
# — and `verify_numerics` on a fresh load finds the recorded values again. One value changed by 1 %
# of the largest is reported as a relative error of 0.01, far above the tolerance.

# %%
doc01 = json.loads((FIXTURES / "01_mlp_small.json").read_text())
gf01, _, _ = run_plan(doc01)
leaf_data = [{"id": gf01.id_of(t), "name": t.name, "type": t.type.name, "kind": "float"} for t in gf01.graph.leafs]
for leaf in leaf_data:
    fill_leaf(gf01.tensors[leaf["id"]], 7, leaf["id"])
gl.cpu_init().graph_compute(gf01.graph)
probs = gf01.graph.nodes[-1]
values = _values_f32(probs)
result = {"id": gf01.id_of(probs), "name": probs.name, "type": "f32", "ne": list(probs.ne),
          "n_elements": int(values.size), "values": values.tolist()}
doc01.update(numeric=True, data_generator={"kind": "lcg32", "data_seed": 7},
             numerics={"leaf_data": leaf_data, "results": [result]})
tol, rows = verify_numerics(doc01, run_plan(doc01)[0])
print(f"tolerance {tol}:", rows)
result["values"][0] += 0.01 * float(np.max(np.abs(values)))
print(verify_numerics(doc01, run_plan(doc01)[0])[1])

# %% [markdown]
# ## 3 · Check

# %%
assert check_plan_file(doc02) == []
assert len(check_plan_file(wrong)) == 2 and check_plan_file(wrong, limit=1) == check_plan_file(wrong)[:1]
assert want06.offsets == got06.offsets and want06.buffer_size == got06.buffer_size
assert same and sizes[True][0] == 1062 and sizes[False][0] == 1030
assert sizes[True][1] == sizes[False][1] == fx["buffer_size"]
assert plan_t.chunk_sizes == [16704, 10240, 13760] and plan_t.buffer_size == sum(plan_t.chunk_sizes) + 3 * 32
recorded_today = json.loads((FIXTURES.parent / "ggml-today" / "03_llama_block_20kib.json").read_text())
assert recorded_today["chunks"] == plan_t.chunk_sizes and check_plan_file(recorded_today) == []
assert era_of(doc02) == "2024" and era_of(doc02, "2026") == "2026" and era_of(today, "2024") == "2024"
assert release_build({"ggml_build": "release"}) and not release_build(doc02)  # doc02: "debug (no NDEBUG: ...)"
assert rows[0][2] and not verify_numerics(doc01, run_plan(doc01)[0])[1][0][2]
assert lcg_states(7, 3).tolist()[:2] == [(LCG_A * 7 + LCG_C) & MASK, (LCG_A * ((LCG_A * 7 + LCG_C) & MASK) + LCG_C) & MASK]
try:
    check_plan_file(doc02, limit=-1)
    raise AssertionError("a negative limit was accepted")
except gl.GraphFileError as e:
    assert "limit" in str(e)
print("appendix A5: all checks passed")
