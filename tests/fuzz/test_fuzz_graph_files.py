"""Fuzz: graph files (the ggml-seed fixture schema) and their `numerics` blocks through `plan`, `plan
--json`, `check` and `check --no-numerics` (issue 22, DESIGN §3 "Untrusted input").

Every case mutates one thing of a recorded fixture (or of a fixture with a numerics block computed here):
a field of a tensor entry, of a graph section, of a step, of the top level or of the numerics block is
replaced by a wrong type, NaN / Infinity (raw JSON text), a float, 2^70, a negative number, a string,
null, another valid value, or deleted; a list item is duplicated or removed; a value becomes JSON nested
100,000 deep; or the text is truncated or a byte of it changed; or a key of an object is given twice (the
same or another value), the file is made sparse past the 32 MiB cap (os.truncate: refused by its size
before a byte is read), or it is no regular file at all (a character device, a FIFO, a socket, a link to
/dev/zero, a directory, `-`). Each command must then (tests/fuzzing.py)
exit 2 with a specific message, or give a result that is right:

- a mutation that changes nothing (the same document) must give the original's results;
- a mutation of a field no command reads (a description, a step's label) must too;
- `check` exiting 0 after a recorded result changed (an offset, a buffer size, a log line, a buffer label,
  a computed value beyond the tolerance) is wrong; exiting 1 needs a well-formed value that differs;
- after a mutation of what the plan depends on (shapes, ops, sources, flags ...), `plan --json` must give
  the plan the real ggml makes of the mutated graph, and `check` exits 0 only if that plan is the recorded
  one, 1 only if it is not (the oracle: ggml_oracle, in a forked process; without ggml-python
  these cases are counted as unverified).

Among the documents are two files of today's ggml (tests/chunked_docs.py: `ggml_version` 0.15.3, a
`buffer_type.max_size`, `chunks` and a `chunk` per tensor; one a sequence with `chunks` per step), so the
new fields take the same mutations; for the single graph the oracle is ggml 0.15.3's chunked plan
(`chunk` and `chunks` compared too).

The quick run (default) tries about 3,950 cases in some 35 s (180 random mutations, 120 hypothesis
examples, 3,600 in the sweep of every field with every wrong kind, 50 truncations); `--long` (make
test-long) about 22,800 (2,500, 1,500, 18,414, 400) in some 10 minutes, and prints the counts; the repeated
keys 60 objects x 3 commands (600 with --long), the sizes 3 x 3 and the special files 7 x 3. Cases are
seeded (case k of a run is the same on every machine) and each is bounded in time and memory by the
harness.
"""

import copy
import json
import math
import random
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from chunked_docs import chunked_document, ggml_chunked_plan
from fuzzing import assert_sound, run_cli
from helpers import SEED_FILES, fixture_path, load_json

QUICK_CASES, LONG_CASES = 180, 2500
COMMANDS = (("plan",), ("plan", "--json"), ("check",), ("check", "--no-numerics"))
SMALL = [n for n in SEED_FILES if not n.startswith(("13_", "14_"))]  # 13 and 14 (7B, 1,421 tensors): --long

# fields of the recorded results: changing one to another well-formed value must make `check` differ
RECORD_TENSOR = {"offset", "buffer", "ext_offset", "chunk"}
RECORD_CALL = {"ok", "buffer_size", "buffer_size_before", "compute_buffer_replaced", "log", "chunks"}
# fields no command reads (ggml_build is read: a release build's logs are compared by their errors only)
INFORMATIONAL = {("fixture",), ("description",), ("ggml_commit",), ("steps", "label"),
                 ("steps", "params"), ("steps", "step"), ("graph", "extra"), ("reserve", "extra")}

RAW = {"@@NaN@@": "NaN", "@@Inf@@": "Infinity", "@@-Inf@@": "-Infinity",
       "@@deep@@": "[" * 100_000 + "]" * 100_000}


# -- documents --------------------------------------------------------------------------------------

def _numerics_document(name: str, ranges: dict) -> dict:
    """Fixture `name` with a numerics block whose values ggml_lite computes here (bit-exact tier) from the
    specified leaf data: a file `check` verifies, to mutate."""
    from ggml_lite.cpu import cpu_init
    from ggml_lite.numerics import fill_leaf
    from ggml_lite.plancheck import run_plan

    doc = copy.deepcopy(load_json(fixture_path("ggml-seed", name)))
    gf, _, _ = run_plan(doc)
    ents = doc["graph"]["tensors"]
    leafs = []
    for i, e in enumerate(ents):
        if e["graph_role"] == "leaf" and e["view_src"] is None:
            rng = ranges.get(e["name"])
            leaf = {"id": i, "name": e["name"], "type": e["type"], "kind": "int" if rng else "float"}
            leafs.append({**leaf, **({"range": list(rng)} if rng else {})})
            fill_leaf(gf.tensors[i], 77, i, leaf["kind"], rng)
    cpu_init(exact=True).graph_compute(gf.graph)
    wanted = [i for i in doc["graph"]["nodes"] if ents[i]["flags_value"] & 2]
    wanted += [] if doc["graph"]["nodes"][-1] in wanted else [doc["graph"]["nodes"][-1]]
    results = []
    for i in wanted:
        e, v = ents[i], gf.tensors[i]
        from ggml_lite.backend import tensor_get

        values = tensor_get(v).astype(np.float32).reshape(-1)
        results.append({"id": i, "name": e["name"], "reason": "output", "type": e["type"], "ne": e["ne"],
                        "n_elements": int(values.size), "values": [float(x) for x in values]})
    doc.update(numeric=True, data_generator={"kind": "lcg32", "data_seed": 77},
               numerics={"leaf_data": leafs, "results": results})
    return doc


_DOCS: dict = {}


def documents(long_run: bool) -> dict:
    """{label: document}: the recorded fixtures (13 and 14 only with --long) and two numerics files."""
    key = bool(long_run)
    if key not in _DOCS:
        names = SEED_FILES if long_run else SMALL
        docs = {n: load_json(fixture_path("ggml-seed", n)) for n in names}
        docs["01_mlp_small+numerics"] = _numerics_document("01_mlp_small", {})
        docs["06_llama_block+numerics"] = _numerics_document("06_llama_block", {"inp_pos": (0, 64)})
        docs["06_llama_block+chunks"] = chunked_document("06_llama_block", 2)
        docs["11_realloc_sequence_grow+chunks"] = chunked_document("11_realloc_sequence_grow", 3)
        _DOCS[key] = docs
    return _DOCS[key]


# -- mutations ---------------------------------------------------------------------------------------

def _wrong_values(v, rng: random.Random, doc: dict) -> list:
    """Candidate replacements for a value `v`."""
    out: list = [None, True, False, "x", "", 1.5, 2**70, -1, -(2**63), 0, [], {}, [1, 2], "@@NaN@@", "@@Inf@@",
           "@@-Inf@@", "@@deep@@"]
    if isinstance(v, int) and not isinstance(v, bool):
        out += [v + 1, v - 1, v * 2, v + 32, float(v), str(v), 2**63 - 1, 2**31, -(2**31) - 1]
    if isinstance(v, float):
        out += [v * 1.5 + 0.25, -v, v + 1e-9, 1e39, int(v)]
    if isinstance(v, str):
        out += ["NONE", "VIEW", "MUL_MAT", "f16", "q8_0", "i32", "node", "leaf", "none", "compute", "weights",
                "INPUT", "OUTPUT", "GELU", "SILU", v + "#", v.upper()]
    if isinstance(v, list):
        out += [v[:-1], v + v[-1:], list(reversed(v)), [x + 1 if isinstance(x, int) else x for x in v]] if v else [[0]]
    if isinstance(v, bool):
        out += [not v, int(v)]
    return out


def _locations(doc: dict, rng: random.Random) -> list:
    """(path as keys, kind) of the places a case may mutate; kind: 'tensor', 'graph', 'step', 'top',
    'numerics'. A sample, weighted towards tensor entries."""
    locs: list[tuple[tuple, str]] = [((k,), "top") for k in doc] + [(("extra",), "top")]
    sections = [("graph",)] if "graph" in doc else [("steps", k, "graph") for k, s in enumerate(doc.get("steps", []))]
    for k, s in enumerate(doc.get("steps", [])):
        locs += [(("steps", k, f), "step") for f in s]
    for sec in sections:
        g = doc
        for key in sec:
            g = g[key]
        locs += [(sec + (f,), "graph") for f in g] + [(sec + ("extra",), "graph")]
        for _ in range(12):
            i = rng.randrange(len(g["tensors"]))
            e = g["tensors"][i]
            f = rng.choice(list(e) + ["unary_op", "extra"])
            locs.append((sec + ("tensors", i, f), "tensor"))
            if isinstance(e.get(f), list) and e[f]:
                locs.append((sec + ("tensors", i, f, rng.randrange(len(e[f]))), "tensor"))
        for f in ("nodes", "leafs", "expand_roots"):
            if g.get(f):
                locs.append((sec + (f, rng.randrange(len(g[f]))), "graph"))
    for f in ("buffer_type", "reserve", "alloc_graph"):
        if isinstance(doc.get(f), dict):
            locs += [((f, k), "top") for k in doc[f]]
    for k, ext in enumerate(doc.get("external_buffers", [])):
        locs += [(("external_buffers", k, f), "top") for f in ext]
    num = doc.get("numerics")
    if num:
        locs += [(("numerics", f), "numerics") for f in num] + [(("data_generator", "data_seed"), "numerics"),
                                                                (("numeric",), "numerics")]
        for k, leaf in enumerate(num["leaf_data"]):
            locs += [(("numerics", "leaf_data", k, f), "numerics") for f in list(leaf) + ["range"]]
        for k, res in enumerate(num["results"]):
            locs += [(("numerics", "results", k, f), "numerics") for f in res]
            for _ in range(4):
                locs.append((("numerics", "results", k, "values", rng.randrange(len(res["values"]))), "numerics"))
    return locs


def _get(doc, path):
    for key in path:
        if isinstance(doc, dict):
            if key not in doc:
                return KeyError
            doc = doc[key]
        elif isinstance(doc, list) and isinstance(key, int) and key < len(doc):
            doc = doc[key]
        else:
            return KeyError
    return doc


class Case:
    """One mutated document: its JSON text and what changed (for the judge)."""

    def __init__(self, label: str, doc: dict, k: int, seed: int):
        rng = random.Random(f"{seed}:{k}")
        self.label, self.original, self.k = label, doc, k
        self.path: tuple = ()
        self.kind, self.op = "text", None
        self.old: object = None
        self.new: object = None
        d = copy.deepcopy(doc)
        r = rng.random()
        if r > 0.85:  # a recorded result changed to another well-formed value
            self._record(d, rng)
            return
        if r < 0.04:  # the text itself, truncated or with a byte changed
            text = json.dumps(d)
            cut = rng.randrange(len(text))
            self.op = "truncate" if r < 0.02 else "byte"
            self.text = text[:cut] if self.op == "truncate" else text[:cut] + rng.choice('{}[]",:0a-') + text[cut + 1:]
            try:  # a changed byte may leave a document (a digit changed): judged like any other
                self.doc = json.loads(self.text)
            except (json.JSONDecodeError, RecursionError):
                self.doc = None
            return
        self.path, self.kind = rng.choice(_locations(d, rng))
        parent, key = _get(d, self.path[:-1]), self.path[-1]
        self.old = _get(d, self.path)
        if r < 0.14 and self.old is not KeyError:  # delete the field / remove the item
            self.op = "delete"
            del parent[key]
        elif r < 0.2 and isinstance(self.old, list) and self.old:  # duplicate an item of a list
            self.op = "duplicate"
            j = rng.randrange(len(self.old))
            self.old.insert(j, copy.deepcopy(self.old[j]))
            self.new = self.old
        else:
            self.op = "replace"
            self.new = rng.choice(_wrong_values(None if self.old is KeyError else self.old, rng, d))
            if isinstance(parent, dict) or (isinstance(parent, list) and isinstance(key, int) and key < len(parent)):
                parent[key] = self.new
        self.doc = d
        text = json.dumps(d)
        for mark, raw in RAW.items():
            text = text.replace(json.dumps(mark), raw)
        self.text = text

    def _record(self, d: dict, rng: random.Random) -> None:
        secs = [("graph",)] if "graph" in d else [("steps", k, "graph") for k in range(len(d["steps"]))]
        sec = rng.choice(secs)
        i = rng.randrange(len(_get(d, sec + ("tensors",))))
        locs = [(sec + ("tensors", i, f), "tensor") for f in sorted(RECORD_TENSOR)
                if f in _get(d, sec + ("tensors", i))] * 3
        locs += [(("steps", k, f), "step") for k, st in enumerate(d.get("steps", [])) for f in sorted(RECORD_CALL)
                 if f in st]
        locs += [((c, f), "top") for c in ("reserve", "alloc_graph") if c in d for f in ("ok", "buffer_size", "log")]
        locs += [((f,), "top") for f in ("buffer_size", "chunks") if f in d]
        self.path, self.kind = rng.choice(locs)
        self.old, self.op = _get(d, self.path), "replace"
        old = self.old
        if self.path[-1] == "chunks" and isinstance(old, list):  # a chunk fewer, or every chunk larger
            self.new = old[:-1] if rng.random() < 0.5 else [x + 32 for x in old]
        elif self.path[-1] == "chunk" and isinstance(old, int):  # another chunk of the plan
            self.new = (old + 1) % len(_get(d, self.path[:-4] + ("chunks",)) if "steps" in d else d["chunks"])
        elif isinstance(old, bool):
            self.new = not old
        elif isinstance(old, int):
            self.new = old + rng.choice((32, 64, 1)) if old < 64 or rng.random() < 0.5 else old - 32
        elif isinstance(old, str):
            self.new = rng.choice([None, "compute", "weights", "kv_cache", old + "x"])
        elif isinstance(old, list):
            self.new = old[:-1] if old and rng.random() < 0.5 else old + ["ggml_gallocr_reserve_n: a line"]
        else:  # null: an offset or a buffer label where there was none
            self.new = rng.choice([0, 32, "compute"] if self.path[-1] != "compute_buffer_replaced" else [True, False])
        _get(d, self.path[:-1])[self.path[-1]] = self.new
        self.doc, self.text = d, json.dumps(d)

    def same_document(self) -> bool:
        """Whether the mutated text holds the very same document (a mutation that changed nothing)."""
        if self.op in ("truncate", "byte") or any(m in self.text for m in ("NaN", "Infinity")):
            return False
        try:
            return json.loads(self.text) == self.original and _types_equal(json.loads(self.text), self.original)
        except (json.JSONDecodeError, RecursionError):
            return False

    def field(self) -> str:
        return next((str(k) for k in reversed(self.path) if isinstance(k, str)), "")

    def informational(self) -> bool:
        names = tuple(k for k in self.path if isinstance(k, str) and k not in ("tensors",))
        return names in INFORMATIONAL or (self.kind == "top" and self.path == ("extra",))

    def record_change(self) -> bool:
        """A recorded result was changed to a well-formed, different value."""
        if self.op != "replace" or (self.new == self.old and type(self.new) is type(self.old)):
            return False
        f, v = self.field(), self.new
        size = isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63
        if self.kind == "tensor" and f in RECORD_TENSOR and not isinstance(self.path[-1], int):
            return v is None or (isinstance(v, str) if f == "buffer" else size)
        if f in RECORD_CALL and self.kind in ("step", "top") and not isinstance(self.path[-1], int):
            if f == "log":
                return isinstance(v, list) and all(isinstance(x, str) for x in v)
            if f == "chunks":
                return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in v)
            new_buffer = (f == "compute_buffer_replaced" and self.kind == "step"
                          and _new_chunked_buffer_at(self.doc, self.path[1]))
            if new_buffer and isinstance(v, bool):
                return False  # where today's allocator got a new buffer, either address is right (A5)
            if f in ("ok", "compute_buffer_replaced"):
                return isinstance(v, bool) or (v is None and f == "compute_buffer_replaced")
            return size
        return False


def _new_chunked_buffer_at(doc, k) -> bool:
    """Whether step `k` of a sequence planned with today's allocator ends with a new virtual buffer (A5's
    `check_plan_file` then accepts either `compute_buffer_replaced`)."""
    from ggml_lite.errors import GGMLLiteError
    from ggml_lite.plancheck import run_steps

    try:
        return next(got["new_buffer"] for j, *_, got in run_steps(doc) if j == k)
    except (GGMLLiteError, KeyError, TypeError, IndexError, StopIteration):
        return False


def _types_equal(a, b) -> bool:
    """Equal documents whose scalars also have the same types (1 == 1.0 == True for Python)."""
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if type(x) is not type(y):
            return False
        if isinstance(x, dict):
            stack += [(x[k], y[k]) for k in x]
        elif isinstance(x, list):
            stack += list(zip(x, y))
    return True


# -- the oracle: the real ggml's plan of a mutated graph ------------------------------------------------

def _ggml_plan_ids(doc: dict) -> dict:
    """(in a forked child) ggml's plan of the document's graph: buffer size, ok flags, offsets by id."""
    import ggml_oracle as O
    from ggml_lite.graphio import allocate_external, read_graph_file

    gf = read_graph_file(doc)
    allocate_external(gf)
    pre = list({id(t.ctx): t.ctx for i, t in gf.tensors.items() if gf.records[i]["preallocated"]
                and t.view_src is None}.values())
    roots = [gf.tensors[i] for i in gf.expand_roots] or None
    plan = O.ggml_plan(gf.graph, roots, pre)
    ids = {t: i for i, t in gf.tensors.items()}
    return {"buffer_size": plan["reference_buffer_size"], "ok": (plan["reserve_ok"], plan["alloc_ok"]),
            "offsets": {ids[t]: off for t, off in plan["offsets"].items() if t in ids}}


def _ggml_chunked_ids(doc: dict) -> dict:
    """(in a forked child) ggml 0.15.3's chunked plan of the document's graph on its max_size, as
    `_ggml_plan_ids` gives it, with `chunks` by id and `chunk_sizes`; the buffer size as ggml_lite's CPU
    buffers report it (+32 per chunk)."""
    sizes, where, ok = ggml_chunked_plan(doc, doc["buffer_type"]["max_size"])
    return {"buffer_size": sum(sizes) + 32 * len(sizes), "ok": (ok, ok), "chunk_sizes": sizes,
            "offsets": {i: None if w is None else w[1] for i, w in where.items()},
            "chunks": {i: None if w is None else w[0] for i, w in where.items()}}


def ggml_plan_of(doc: dict):
    """ggml's plan of `doc`'s graph (None when it cannot say: no ggml-python, a sequence, another buffer
    type, a graph the mirror refuses); on a max_size, for a file of today's ggml, its chunked plan."""
    import ggml_oracle as O
    from ggml_lite.plancheck import era_of

    bt = doc.get("buffer_type")
    if not O.available() or "graph" not in doc or not isinstance(bt, dict) or bt.get("alignment") != 32:
        return None
    chunked = isinstance(bt.get("max_size"), int) and era_of(doc) == "2026"
    if bt.get("max_size") is not None and not chunked:
        return None
    try:
        return O.run_isolated(_ggml_chunked_ids if chunked else _ggml_plan_ids, doc, timeout=60)
    except Exception:
        return None


def _same_chunks(ref: dict, sizes, chunks: dict) -> bool:
    """Whether a plan's chunk sizes and chunk per tensor (where it gives them) are the oracle's."""
    if "chunk_sizes" not in ref:
        return sizes is None and not chunks
    return (sizes is None or sizes == ref["chunk_sizes"]) and all(ref["chunks"].get(i) == c for i, c in chunks.items())


def _recorded_chunks(doc: dict) -> tuple:
    return doc.get("chunks"), {i: e["chunk"] for i, e in enumerate(doc["graph"]["tensors"]) if "chunk" in e}


# -- the judge ------------------------------------------------------------------------------------------

class Tally:
    def __init__(self, kind: str):
        self.kind, self.cases, self.runs, self.refused, self.correct, self.unverified = kind, 0, 0, 0, 0, 0
        self.t0 = time.perf_counter()

    def line(self) -> str:
        return (f"fuzz {self.kind}: {self.cases} cases ({self.runs} runs), {self.refused} refused with exit 2, "
                f"{self.correct} correct results, {self.unverified} results unverified (no oracle), "
                f"{time.perf_counter() - self.t0:.1f} s")


_BASELINE: dict = {}


def baseline(label: str, doc: dict, tmp_path) -> dict:
    """The outputs of every command on the unmutated document (all exit 0)."""
    if label not in _BASELINE:
        p = tmp_path / f"{label}.json"
        p.write_text(json.dumps(doc))
        out = {}
        for cmd in COMMANDS:
            argv = [cmd[0], str(p), *cmd[1:]] + (["--step", "0"] if cmd[0] == "plan" and "steps" in doc else [])
            o = assert_sound(run_cli(argv))
            assert o.code == 0, o.describe()
            out[cmd] = o.out.replace(str(p), "FILE")
        _BASELINE[label] = out
    return _BASELINE[label]


def judge(case: Case, tmp_path, tally: Tally) -> None:
    p = tmp_path / "case.json"
    p.write_text(case.text)
    base = baseline(case.label, case.original, tmp_path)
    outcomes = {}
    what = f"case {case.label} #{case.k} {case.op} {case.path} {case.old!r:.80} -> {case.new!r:.80}: "
    for cmd in COMMANDS:
        argv = [cmd[0], str(p), *cmd[1:]] + (["--step", "0"] if cmd[0] == "plan" and "steps" in case.original else [])
        try:
            o = assert_sound(run_cli(argv), allow=(0, 1, 2) if cmd[0] == "check" else (0, 2))
        except AssertionError as e:
            raise AssertionError(what + str(e)) from None
        outcomes[cmd] = o
        tally.runs += 1
        tally.refused += o.code == 2
    same = case.same_document() or case.informational()
    for cmd, o in outcomes.items():
        if same and case.op == "replace" and case.informational():
            # a field nothing reads: only its type may be refused (e.g. a description that is a list)
            assert o.code in (0, 2) and (o.code == 2 or o.out.replace(str(p), "FILE") == base[cmd]), what + o.describe()
        elif case.same_document():
            assert o.code == 0 and o.out.replace(str(p), "FILE") == base[cmd], what + o.describe()
    check = outcomes[("check",)]
    if not isinstance(case.doc, dict):  # (a text that is no JSON object: refused, as assert_sound saw)
        assert all(o.code == 2 for o in outcomes.values()), what
        return
    if case.record_change():
        assert check.code in (1, 2), "a recorded result changed, check says identical: " + what + check.describe()
    if check.code == 1 and not case.record_change() and case.kind != "numerics":
        _judge_difference(case, check, what, tally)
    elif check.code == 0 and case.kind == "numerics" and case.op == "replace":
        _judge_numerics(case, what)
    plan = outcomes[("plan", "--json")]
    if plan.code == 0 and not case.same_document():
        _judge_loaded(case.doc, what)
    if plan.code == 0 and case.kind in ("tensor", "graph", "top", "step") and not case.same_document():
        _judge_plan(case, plan, check, what, tally)
    tally.correct += sum(o.code in (0, 1) for o in outcomes.values())


def _judge_loaded(doc: dict, what: str) -> None:
    """A file that plans is a file ggml_lite reproduces: every tensor field derived again from the loaded
    tensors (graphio.to_document) is the file's (so no recorded field was ignored)."""
    from ggml_lite.graphio import read_graph_file, to_document

    for k in ([None] if "graph" in doc else [0]):
        gf = read_graph_file(doc, k)
        again = to_document(gf)

        def sec(d: dict, k: int | None = k) -> dict:
            return d["graph"] if k is None else d["steps"][k]["graph"]

        assert json.dumps(_known_flags(sec(again))) == json.dumps(_known_flags(sec(doc))), \
            "loaded, but not as the file says: " + what


def _known_flags(graph: dict) -> dict:
    """A graph section with the flags of ggml 0.10.1+ (LOSS 8, COMPUTE 16) left out: a file may record them,
    ggml_lite reads and drops them (no planner reads them; A1)."""
    g = copy.deepcopy(graph)
    for e in g.get("tensors", []) if isinstance(g, dict) else []:
        if isinstance(e, dict) and isinstance(e.get("flags_value"), int) and isinstance(e.get("flags"), list):
            e["flags_value"] &= 7
            e["flags"] = [f for f in e["flags"] if f not in ("LOSS", "COMPUTE")]
    return g


def _judge_difference(case: Case, check, what: str, tally: Tally) -> None:
    """check said "differs" after a mutation of what the plan depends on: the real ggml's plan of the
    mutated graph must differ from the record too (or a fact the oracle does not give must differ)."""
    ref = ggml_plan_of(case.doc)
    if ref is None:
        tally.unverified += 1
        return
    doc = case.doc
    recorded = {i: e["offset"] for i, e in enumerate(doc["graph"]["tensors"])}
    same_plan = (ref["offsets"] == recorded and ref["buffer_size"] == doc["buffer_size"]
                 and ref["ok"] == (doc["reserve"]["ok"], doc["alloc_graph"]["ok"])
                 and _same_chunks(ref, *_recorded_chunks(doc)))
    if same_plan:  # then what differs must be a log line, a buffer label or an external offset
        assert all(("log" in line or "buffer" in line or "ext_offset" in line)
                   for line in check.out.splitlines()[1:]), \
            "check says the plan differs, ggml plans it as recorded: " + what + check.describe()


def _judge_plan(case: Case, plan, check, what: str, tally: Tally) -> None:
    """plan --json of a mutated (still valid) graph must be the real ggml's plan of it; and check exits 0
    only when that plan is the recorded one."""
    ref = ggml_plan_of(case.doc)
    if ref is None:
        tally.unverified += 1
        return
    out = json.loads(plan.out)
    names = [e["name"] for e in case.doc["graph"]["tensors"]]
    got = {i: out["tensors"][n]["offset"] for i, n in enumerate(names)}
    chunks = {i: out["tensors"][n]["chunk"] for i, n in enumerate(names) if "chunk" in out["tensors"][n]}
    if ref["ok"] == (True, True):
        assert out["buffer_size"] == ref["buffer_size"] and got == ref["offsets"], \
            "plan --json differs from ggml's plan of the mutated graph: " + what + plan.describe()
        one = "chunks" not in out and len(ref.get("chunk_sizes", [0])) <= 1  # (one chunk: no chunk fields)
        assert one or _same_chunks(ref, out.get("chunks"), chunks), \
            "plan --json's chunks differ from ggml's chunked plan of the mutated graph: " + what + plan.describe()
    if check.code == 0:
        recorded = {i: e["offset"] for i, e in enumerate(case.doc["graph"]["tensors"])}
        assert ref["offsets"] == recorded and ref["buffer_size"] == case.doc["buffer_size"], \
            "check says identical, ggml plans the mutated graph otherwise: " + what + check.describe()
        assert "chunk_sizes" not in ref or _same_chunks(ref, *_recorded_chunks(case.doc)), \
            "check says identical, ggml chunks the mutated graph otherwise: " + what + check.describe()


def _judge_numerics(case: Case, what: str) -> None:
    """check exited 0 after a recorded value changed: the change must be within the tolerance."""
    if case.path[:2] != ("numerics", "results") or "values" not in case.path or not isinstance(case.new, (int, float)):
        return
    k = case.path[2]
    want = np.array(case.original["numerics"]["results"][k]["values"], dtype=np.float64)
    got = np.array(case.doc["numerics"]["results"][k]["values"], dtype=np.float64)
    rel = float(np.max(np.abs(got - want)) / max(np.max(np.abs(got)), 1e-30))
    assert rel <= 1e-2, f"check passed a recorded value changed by {rel:.3g} of the largest: " + what


# -- the tests ----------------------------------------------------------------------------------------

def test_fuzz_graph_files(tmp_path, long_run, capsys):
    """Seeded mutations of every fixture (and two numerics files) through plan / plan --json / check /
    check --no-numerics."""
    docs = documents(long_run)
    labels = sorted(docs)
    n = LONG_CASES if long_run else QUICK_CASES
    tally = Tally("graph files")
    for k in range(n):
        label = labels[k % len(labels)]
        case = Case(label, docs[label], k, seed=22)
        judge(case, tmp_path, tally)
        tally.cases += 1
    with capsys.disabled():
        print("\n" + tally.line())
    assert tally.refused > 0 and tally.correct > 0


JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda kids: (st.lists(kids, max_size=4)
                                                     | st.dictionaries(st.text(max_size=4), kids, max_size=3)),
                           max_leaves=8)
ENUMS = ("NONE", "VIEW", "RESHAPE", "MUL_MAT", "ADD", "CPY", "f32", "f16", "q8_0", "i32", "node", "leaf", "none",
         "compute", "weights", "INPUT", "OUTPUT", "PARAM", "SILU")


def _near(old):
    """Values of the same kind as `old`, near it: what gets past the type checks and tests the meaning."""
    if isinstance(old, bool):
        return st.booleans()
    if isinstance(old, int):
        return st.integers(max(0, old - 64), old + 64)
    if isinstance(old, str):
        return st.sampled_from(ENUMS + (old,))
    if isinstance(old, list) and old and all(isinstance(x, int) and not isinstance(x, bool) for x in old):
        return st.lists(st.sampled_from(sorted(set(old)) + [0, 1, 2, 4, 32]), min_size=len(old), max_size=len(old))
    if isinstance(old, list) and old and all(isinstance(x, str) for x in old):
        return st.lists(st.sampled_from(ENUMS + tuple(old)), max_size=len(old) + 1)
    return st.sampled_from([None, old])


TENSOR_FIELDS = ("id", "name", "ctx", "graph_role", "type", "ne", "nb", "nbytes", "alloc_size", "op", "op_params",
                 "src", "src_names", "view_src", "view_src_name", "view_offs", "flags", "flags_value", "preallocated",
                 "buffer", "offset", "ext_offset")


def test_fuzz_tensor_fields_with_hypothesis(tmp_path, long_run, capsys):
    """Hypothesis: any JSON value in any field of any tensor of fixture 06 (weights pre-allocated) and
    fixture 03 (views); `plan --json` and `check` stay sound, and a changed recorded result is never
    reported identical."""
    docs = {n: load_json(fixture_path("ggml-seed", n)) for n in ("03_views_layout", "06_llama_block")}
    docs["06_llama_block+chunks"] = chunked_document("06_llama_block", 2)
    tally = Tally("tensor fields (hypothesis)")

    @settings(max_examples=1500 if long_run else 120, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(name=st.sampled_from(sorted(docs)), i=st.integers(0, 40), field_=st.sampled_from(TENSOR_FIELDS + ("chunk",)),
           data=st.data())
    def one(name, i, field_, data):
        doc = copy.deepcopy(docs[name])
        e = doc["graph"]["tensors"][i % len(doc["graph"]["tensors"])]
        assume(field_ in e)  # (a chunk only in the chunked file)
        old = e[field_]
        value = data.draw(st.one_of(JSON_VALUES, _near(old)))
        e[field_] = value
        p = tmp_path / "h.json"
        p.write_text(json.dumps(doc))
        for cmd in (("plan", "--json"), ("check",)):
            o = assert_sound(run_cli([cmd[0], str(p), *cmd[1:]]), allow=(0, 1, 2) if cmd[0] == "check" else (0, 2))
            tally.runs += 1
            tally.refused += o.code == 2
            tally.correct += o.code != 2
            changed = value != old or type(value) is not type(old)
            if cmd == ("check",) and field_ in RECORD_TENSOR and changed:
                assert o.code != 0, f"{name} tensor {i} {field_}: {old!r} -> {value!r}: " + o.describe()
            if cmd == ("check",) and not changed:
                assert o.code == 0, o.describe()
            what = f"{name} tensor {i} {field_}: {old!r} -> {value!r}: "
            if o.code == 0 and changed and cmd == ("plan", "--json"):
                _judge_loaded(doc, what)
            if o.code == 0 and changed and cmd == ("check",):  # identical: then ggml plans it as recorded
                ref = ggml_plan_of(doc)
                tally.unverified += ref is None
                recorded = {k: x["offset"] for k, x in enumerate(doc["graph"]["tensors"])}
                assert ref is None or (ref["offsets"] == recorded and ref["buffer_size"] == doc["buffer_size"]
                                       and _same_chunks(ref, *_recorded_chunks(doc))), what
        tally.cases += 1

    one()
    with capsys.disabled():
        print("\n" + tally.line())


@pytest.mark.parametrize("mutation", ["truncate", "nest"])
def test_every_prefix_class_of_a_fixture_is_refused(tmp_path, mutation, long_run):
    """Truncated texts of a fixture (at 50 evenly spread places, 400 with --long) and the fixture with a
    value nested 100,000 deep at each of its top-level fields: exit 2 with a message, every time."""
    text = fixture_path("ggml-seed", "06_llama_block").read_text()
    p = tmp_path / "t.json"
    if mutation == "truncate":
        n = 400 if long_run else 50
        variants = [text[: len(text) * k // n] for k in range(n)]
    else:
        doc = json.loads(text)
        variants = [json.dumps({**doc, key: "@@deep@@"}).replace('"@@deep@@"', RAW["@@deep@@"]) for key in doc]
    for v in variants:
        p.write_text(v)
        for cmd in ("plan", "check"):
            o = assert_sound(run_cli([cmd, str(p)]))
            assert o.code == 2, o.describe()


def _objects(doc, path=""):
    """(JSON path, object) of every object of a parsed document, in document order (the reader's paths)."""
    out, stack = [], [(path, doc)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, dict):
            out.append((path or "the top level", v))
            stack.extend((f"{path}.{k}" if path else k, x) for k, x in reversed(list(v.items())))
        elif isinstance(v, list):
            stack.extend((f"{path}[{k}]", x) for k, x in reversed(list(enumerate(v))))
    return out


def test_a_key_given_twice_is_refused_in_any_object(tmp_path, long_run, capsys):
    """Mutation class "repeated key": in an object of a fixture (or of a numerics file) one of its keys is
    given a second time, after the first, with the same value or another well-formed one (json would let the
    last win: `"schema_version": 99, "schema_version": 1` was checked as version 1). Every command refuses it
    at parse time, naming the object's JSON path and the key. Quick: 60 objects; --long: 600."""
    rng = random.Random(22)
    docs = documents(long_run)
    n = 600 if long_run else 60
    p = tmp_path / "repeated.json"
    for k in range(n):
        label = sorted(docs)[k % len(docs)]
        doc = copy.deepcopy(docs[label])
        candidates = [(path, obj) for path, obj in _objects(doc) if obj]
        path, obj = rng.choice(candidates)
        key = rng.choice(list(obj))
        value = obj[key] if rng.random() < 0.5 else rng.choice(_wrong_values(obj[key], rng, doc))
        obj["@@repeat@@"] = value
        text = json.dumps(doc).replace('"@@repeat@@"', json.dumps(key), 1)
        for mark, raw in RAW.items():
            text = text.replace(json.dumps(mark), raw)
        p.write_text(text)
        for cmd in ("plan", "check", "sched"):
            o = assert_sound(run_cli([cmd, str(p)]))
            assert o.code == 2, o.describe()
            if not any(mark in json.dumps(value) for mark in RAW):  # (NaN, nesting: reported first)
                want = f"{path}: expected each key once in an object, found the key {key!r} more than once"
                assert want in o.err, f"{label} {path} {key!r}: " + o.describe()
    with capsys.disabled():
        print(f"\nrepeated keys: {n} cases x 3 commands, every one refused with the object's path")


def test_a_file_above_the_size_cap_is_refused_unread(tmp_path):
    """Mutation class "oversize": a fixture's text made sparse past MAX_JSON_BYTES with os.truncate (just
    above the cap, 2.2 GB -- which ran out of memory --, and 1 TiB). The size is checked before reading:
    each refusal takes no memory to speak of and names the size and the cap."""
    import os

    from ggml_lite.untrusted import MAX_JSON_BYTES

    text = fixture_path("ggml-seed", "01_mlp_small").read_text()
    p = tmp_path / "sparse.json"
    for size in (MAX_JSON_BYTES + 1, 2_200_000_000, 2**40):
        p.write_text(text)
        os.truncate(p, size)
        for cmd in ("plan", "check", "sched"):
            o = assert_sound(run_cli([cmd, str(p)], time_limit=5))
            assert o.code == 2 and f"found {size:,} bytes" in o.err and "at most 32 MiB" in o.err, o.describe()
            assert o.grew_mib < 16, o.describe()


def test_special_files_are_refused_for_what_they_are(tmp_path):
    """Mutation class "not a regular file": a character device (/dev/zero would be read forever, /dev/null
    as empty), a FIFO (a blocking read would hang: the harness's alarm would say so), a socket, a symbolic
    link to /dev/zero, a directory and `-` (standard input): each is refused with what it is, unread."""
    import os
    import socket

    fifo, sock, link = tmp_path / "pipe.json", tmp_path / "sock.json", tmp_path / "link.json"
    os.mkfifo(fifo)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    os.symlink("/dev/zero", link)
    cases = [("/dev/zero", "a character device"), ("/dev/null", "a character device"), (fifo, "a FIFO"),
             (sock, "a socket"), (link, "a character device"), (tmp_path, "is a directory"),
             ("-", "no such file (standard input is not read")]
    try:
        for path, what in cases:
            for cmd in ("plan", "check", "sched"):
                o = assert_sound(run_cli([cmd, str(path)], time_limit=5))
                assert o.code == 2 and what in o.err, o.describe()
                assert what.startswith("no such") or "no such file" not in o.err, o.describe()
    finally:
        s.close()


def test_the_numerics_documents_pass_check(tmp_path):
    """The fuzzer's numerics files are sound starting points: check verifies them (default tier)."""
    for doc in documents(False).values():
        if "numerics" in doc:
            p = tmp_path / "n.json"
            p.write_text(json.dumps(doc))
            o = assert_sound(run_cli(["check", str(p)]))
            assert o.code == 0 and "numerics:" in o.out and "FAIL" not in o.out, o.describe()
            assert math.isfinite(doc["numerics"]["results"][0]["values"][0])


PATHOLOGICAL = (None, True, 1.5, "x", -1, 2**70, [[1]], {"a": 1}, "@@NaN@@")
INFO_FIELDS = ("description", "fixture", "ggml_commit", "ggml_build", "label", "params", "step")


def _well_formed_record(field_: str, v) -> bool:
    """Whether `v` is a well-formed value of the recorded result `field_` (a difference, not an error)."""
    size = isinstance(v, int) and not isinstance(v, bool) and v >= 0
    return {"offset": v is None or size, "ext_offset": v is None or size, "buffer": v is None or isinstance(v, str),
            "ok": isinstance(v, bool), "compute_buffer_replaced": v is None or isinstance(v, bool),
            "buffer_size": size, "buffer_size_before": size, "chunk": v is None or size,
            "ggml_build": isinstance(v, str),  # (a release build's file said to be a debug build: its logs differ)
            "chunks": isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in v),
            "log": isinstance(v, list) and all(isinstance(x, str) for x in v)}.get(field_, False)


def test_every_field_of_every_tensor_takes_every_wrong_kind(tmp_path, long_run, capsys):
    """Exhaustively: each field of a tensor of each op of fixture 03 and of the chunked file of 06 (with --long:
    of every tensor of 03, and of a tensor of each op of 07, of a step of 12 and of the chunked sequence of 11),
    each top-level, step and graph field (`ggml_version`, `chunks` among them), replaced by each
    pathological value (null, a boolean, a float, a string, a negative number, 2^70, a nested list, an
    object, NaN): `check` exits 2 naming that field; or, for a value of the field's own kind, 1 for a
    recorded result that differs, or 0 with a file that re-derives to itself."""
    tally = Tally("every field x every wrong kind")
    p = tmp_path / "w.json"
    plan = {"03_views_layout": "per op", "12_realloc_sequence_reserve_first": "none", "06_llama_block+chunks": "per op"}
    if long_run:
        plan = {"03_views_layout": "all", "07_llama4_kvcache": "per op", "12_realloc_sequence_reserve_first": "per op",
                "06_llama_block+chunks": "per op", "11_realloc_sequence_grow+chunks": "per op"}
    for name, which in plan.items():
        stem, chunked = name.split("+")[0], name.endswith("+chunks")
        doc = chunked_document(stem, 2) if chunked else load_json(fixture_path("ggml-seed", name))
        sec = ("graph",) if "graph" in doc else ("steps", 1, "graph")
        ents = _get(doc, sec + ("tensors",))
        per_op = {}
        for i, e in enumerate(ents):
            per_op.setdefault(e["op"], i)
        rows = {"all": range(len(ents)), "per op": sorted(per_op.values()), "none": []}[which]
        paths = [sec + ("tensors", i, f) for i in rows for f in ents[i]]
        paths += [(k,) for k in doc] + [sec + (k,) for k in _get(doc, sec) if k != "tensors"]
        paths += [("steps", 1, k) for k in doc.get("steps", [{}, {}])[1] if k != "graph"]
        for path in paths:
            for value in PATHOLOGICAL if long_run else PATHOLOGICAL[:4] + PATHOLOGICAL[5:7]:
                d = copy.deepcopy(doc)
                old = _get(d, path)
                _get(d, path[:-1])[path[-1]] = value
                p.write_text(json.dumps(d).replace('"@@NaN@@"', "NaN"))
                o = assert_sound(run_cli(["check", str(p)]), allow=(0, 1, 2))
                tally.cases += 1
                tally.runs += 1
                tally.refused += o.code == 2
                tally.correct += o.code != 2
                named = ".".join(str(k) for k in path if not isinstance(k, int))
                if o.code == 0:  # only a value of the field's own kind (then the file re-derives), or unread
                    assert type(value) is type(old) or path[-1] in INFO_FIELDS, \
                        f"{path} = {value!r} accepted: " + o.describe()
                    _judge_loaded(d, f"{path} = {value!r}: ")
                elif o.code == 1:  # "differs": only a well-formed recorded result
                    assert _well_formed_record(path[-1], value), f"{path} = {value!r}: exit 1: " + o.describe()
                elif type(value) is not type(old) and value != "@@NaN@@":  # a wrong kind: named
                    last = path[-1] if isinstance(path[-1], str) else path[-2]
                    assert str(last) in o.err, f"{path} = {value!r}: the message does not name {named}: " + o.err
    with capsys.disabled():
        print("\n" + tally.line())
