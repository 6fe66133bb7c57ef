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
from ggml_lite.quants import quantize_q8_0

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


def _int_range(t, graph) -> tuple:
    """Valid values for an i32 leaf: row indices for get_rows, positions otherwise."""
    for node in graph.nodes:
        if node.op is gl.Op.GET_ROWS and len(node.src) > 1 and node.src[1] is t:
            return 0, node.src[0].ne[1]
    return 0, 64


def int_ranges(rg) -> dict:
    """The value range of every i32 data tensor (before a scheduler rewires sources to copies)."""
    return {t: _int_range(t, rg.graph) for t in O.graph_data_tensors(rg.graph) if t.type is gl.I32}


def fill(rg, ranges=None) -> None:
    """Deterministic data for every data tensor (by its index in creation order), after planning."""
    index = {t: k for k, t in enumerate(rg.tensors)}
    ranges = ranges if ranges is not None else int_ranges(rg)
    for leaf in O.graph_data_tensors(rg.graph):
        n = gl.nelements(leaf)
        rng = np.random.default_rng(1000 + index.get(leaf, 999))
        if leaf.type is gl.I32:
            lo, hi = ranges[leaf]
            gl.tensor_set(leaf, rng.integers(lo, max(hi, lo + 1), n).astype(np.int32))
            continue
        values = rng.uniform(-1, 1, n).astype(np.float32)
        if leaf.type is gl.F16:
            gl.tensor_set(leaf, values.astype(np.float16))
        elif leaf.type is gl.Q8_0:
            gl.tensor_set(leaf, quantize_q8_0(values).view(np.uint8))
        else:
            gl.tensor_set(leaf, values)


def kept(rg) -> list:
    """Indices (in `rg.graph.nodes`) of the results a plan must keep: non-view OUTPUT nodes and nodes
    nothing consumes."""
    used = {id(s) for n in rg.graph.nodes for s in n.src if s is not None}
    return [k for k, t in enumerate(rg.graph.nodes)
            if t.view_src is None and (t.flags & gl.TensorFlag.OUTPUT or id(t) not in used)]


def same(a: list, b: list) -> bool:
    """Equal arrays, one by one (NaN equal to NaN)."""
    return len(a) == len(b) and all(x.dtype == y.dtype and np.array_equal(x, y, equal_nan=x.dtype.kind == "f")
                                    for x, y in zip(a, b))
