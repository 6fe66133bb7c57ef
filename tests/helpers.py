"""Helpers shared by several test files (no test file imports from another test file).

* Where things are: the project root and the recorded fixtures it carries (`tests/fixtures/`), and the
  C reference beside the project (`../shared/reference/`, read only by the tests that check names and
  line references against the C, which skip without it).
* Random graphs computed twice (`test_plan_safety.py`, `test_sched_random.py`): deterministic leaf data,
  the results a plan must keep, and an exact comparison.
"""

import json
from pathlib import Path

import numpy as np

import ggml_lite as gl
import ggml_oracle as O
from ggml_lite.numerics import leaf_bytes
from ggml_lite.verify import int_ranges as verify_int_ranges
from ggml_lite.verify import results_to_compare

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
REFERENCE = ROOT.parent / "shared" / "reference"


def _stems(folder: str) -> list:
    return sorted(p.stem for p in (FIXTURES / folder).glob("*.json"))


SEED_FILES = _stems("ggml-seed")         # 14 graph files (test_fixture_graphs checks the count)
SCHED_FILES = _stems("ggml-seed-sched")  # 14 scheduler scenarios
OPS_FILES = _stems("ggml-seed-ops")      # 8 op families


def fixture_path(folder: str, name: str) -> Path:
    return FIXTURES / folder / f"{name}.json"


def load_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def recorded_graph(name: str):
    """A seed fixture as the oracle mirrors it: `(graph_file, roots, pre-allocated contexts)`, the
    contexts holding the tensors the file records as pre-allocated (weights, KV cache)."""
    f = gl.read_graph_file(fixture_path("ggml-seed", name))
    pre: list = []
    for i, rec in f.records.items():
        t = f.tensors[i]
        if rec.get("preallocated") and t.view_src is None and not any(t.ctx is c for c in pre):
            pre.append(t.ctx)
    return f, [f.tensors[i] for i in f.expand_roots], pre


def graph_sections(doc: dict):
    """(step or None, graph section) for every graph a fixture document holds."""
    if "graph" in doc:
        yield None, doc["graph"]
    for i, step in enumerate(doc.get("steps", [])):
        if isinstance(step, dict) and "graph" in step:
            yield i, step["graph"]


# -- random graphs computed twice -------------------------------------------------------------------

# What the CPU kernels refuse where ggml's kernels assert (e.g. a unary op on a permuted tensor whose
# elements are not contiguous): the random graphs are made for planning, and some cannot be computed.
NOT_COMPUTABLE = (gl.TensorError, gl.UnsupportedOpError)


def int_ranges(rg) -> dict:
    """The value range [lo, hi) of every i32 data tensor (before a scheduler rewires sources to copies):
    `verify.int_ranges`, row indices below the rows of every get_rows that reads it, else below 64."""
    return verify_int_ranges(rg.graph)


def leaf_data(graph, seed: int, ids: dict | None = None, ranges: dict | None = None) -> dict:
    """{tensor: bytes} for every data tensor of `graph`, from the project's one seeded data filler
    (`numerics.leaf_bytes`, the numerics files' generator): tensor `t` is leaf `ids[t]` of seed `seed`
    (default: its index among the data tensors; 999 when `ids` does not hold it), i32 values in
    `ranges[t]` (default: `verify.int_ranges` of `graph`)."""
    tensors = O.graph_data_tensors(graph)
    ids = ids if ids is not None else {t: k for k, t in enumerate(tensors)}
    ranges, own = ranges or {}, verify_int_ranges(graph)
    out = {}
    for t in tensors:
        kind = "int" if t.type is gl.I32 else "float"
        value_range = (ranges.get(t) or own[t]) if kind == "int" else None
        out[t] = leaf_bytes(t.type, t.ne, seed, ids.get(t, 999), kind, value_range, t.name)
    return out


def fill(rg, ranges=None) -> None:
    """Seeded data for every data tensor of a planned random graph (`leaf_data`, each tensor's id its
    index in creation order)."""
    index = {t: k for k, t in enumerate(rg.tensors)}
    for t, raw in leaf_data(rg.graph, 1000, index, ranges if ranges is not None else int_ranges(rg)).items():
        gl.tensor_set(t, raw)


def kept(rg) -> list:
    """Indices (in `rg.graph.nodes`) of the results a plan keeps (`verify.results_to_compare`: non-view
    OUTPUT nodes and nodes nothing reads)."""
    keep = set(results_to_compare(rg.graph))
    return [k for k, t in enumerate(rg.graph.nodes) if t in keep]


def same(a: list, b: list) -> bool:
    """Equal arrays, one by one (NaN equal to NaN)."""
    return len(a) == len(b) and all(x.dtype == y.dtype and np.array_equal(x, y, equal_nan=x.dtype.kind == "f")
                                    for x, y in zip(a, b))
