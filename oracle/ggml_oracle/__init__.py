"""The real ggml as an oracle for ggml_lite, through ggml-python: a package of the project's own
(`oracle/`, installed editable by `make setup`), imported by the tests and the benchmarks.

Its modules, one idea each: `bindings` (ggml-python made safe to call, name maps), `build` (how the
installed ggml was built), `mirror` (a ggml_lite graph re-created in ggml), `plans` (ggml's and
ggml_lite's plans compared), `random_graphs`, `source` (a graph as ggml_lite code), `compute` (graphs
computed by ggml), `isolation` (ggml in a forked child), `numeric` (whole numeric graphs), `tolerance`
(how values are compared), `planner_graphs` (graph shapes that stress the planners), `chunked` (a
CPU buffer type with a `max_size`, so that ggml 0.15.3 splits a compute buffer into chunks, and plans
read per chunk), `chunked_check` (ggml_lite's chunked allocator compared with it: random graphs at
drawn limits, sequences, the dry run), `recorder` (chunked plans written as fixture files:
`python -m ggml_oracle.recorder`). Everything a caller needs is imported here: `import ggml_oracle as O`,
then `O.mirror(...)`, `O.random_graph(...)`; the last two modules are imported by name.

Four things it does:

* **The C side.** `mirror(...)` re-creates ggml_lite tensors in a ggml-python `no_alloc` context by
  calling the same ggml op constructors, copies names and flags, and replays
  `ggml_build_forward_expand` on the same roots in the same order. It checks that ggml built exactly
  the tensors and the graph ggml_lite built (type, ne, nb, op, op_params, sources, view source and
  offset; node and leaf order) and raises `MirrorMismatch` otherwise — a mismatch there is a finding,
  not something to paper over. `ggml_plan(...)` then runs the real `ggml_gallocr_new`,
  `ggml_gallocr_reserve` and `ggml_gallocr_alloc_graph` and reports the compute buffer's size and
  every tensor's offset in it.
* **The Python side.** `lite_plan(...)` does the same with `ggml_lite.GAllocr`, in the same format,
  and `compare_plans` lists the differences.
* **Random graphs.** `build_random_graph(choose)` builds a random graph with the public ggml_lite API
  from a `choose(n) -> int in [0, n)` callable; `random_graph(seed)` feeds it from `random.Random`,
  `graphs()` is the hypothesis strategy (same builder, so hypothesis can shrink a failing graph).
* **Whole numeric graphs.** `mlp_graph` and `attention_graph` build MLPs and attention stacks with
  softmax heads as the `numerics` files record them; `numeric_corpus` is the seeded corpus the numpy
  tier's tolerance is measured on (`benchmarks/numerics_tolerance.py`); `ggml_results` computes one
  with the real ggml, `lite_numeric_results` with ggml_lite's tiers, and `numerics_document` writes
  it as a fixture-schema file with ggml's plan and results (`tests/differential/test_numerics_graphs.py`).

What ggml-python 0.0.45 needs, and how its ggml differs from the recorded reference
-------------------------------------------------------------------------------------
* ggml-python 0.0.45 wraps ggml 0.15.3 (`ggml.ggml_version()`). Four of its ctypes declarations give
  a pointer-returning function a `typing.NewType` (i.e. `int`) as `restype`, so ctypes returns a C
  `int` and the 64-bit pointer is cut to 32 bits — the next call with it crashes. `apply_ctypes_fixes`
  sets `restype = c_void_p` on `ggml_backend_cpu_buffer_type`, `ggml_backend_alloc_buffer`,
  `ggml_backend_cpu_buffer_from_ptr` and `ggml_backend_sched_get_tensor_backend` and checks that
  none of their arguments is declared narrower than a pointer. (A scan of every ctypes function the
  package exports finds exactly these four.)
* **Buffer size: ggml-python reports 32 bytes less.** The reference (llama.cpp `daa9623`, mid-2024)
  CPU buffer type allocates `size + TENSOR_ALIGNMENT` and reports that larger size; ggml 0.15.3
  reports the size it was asked for (and a zero-size request gives a zero-size buffer). The planned
  offsets are the same, so `reference buffer size == ggml-python's + 32` (`CPU_BUFFER_SIZE_DELTA`).
  `tests/differential/test_differential.py::test_oracle_reproduces_fixture` checks this on the 12 single-graph
  fixtures (every offset equal, every buffer size exactly 32 larger). The same holds for buffers
  made by `ggml_backend_alloc_ctx_tensors` (weights, KV cache).
* ggml 0.15.3 plans with "chunks" (a virtual buffer of up to 16 backend buffers); for the CPU buffer
  type (no maximum size) there is always a single chunk, and its best-fit search, block merging and
  in-place rules are those of the reference. `chunked.max_size_buffer_type(n)` gives a buffer type
  with a limit and `chunked_plan(...)` reads each tensor's (chunk, offset) and each chunk's size.
  Newer ggml also tags every graph node with a COMPUTE flag (16); only INPUT, OUTPUT and PARAM
  (1, 2, 4) are compared.
* ggml aborts the process (GGML_ASSERT) on arguments it rejects. ggml_lite raises on the same
  conditions, and the mirror only replays tensors ggml_lite built, so a valid ggml_lite graph is a
  valid ggml graph; the random builder stays inside the rules both versions share.
* Two ggml behaviours the sweeps ran into (details where they are handled):
  - a graph with a zero-size tensor and an otherwise empty compute buffer aborts ggml 0.15.3 in
    `ggml_gallocr_alloc_graph` (see `build_random_graph`); the reference and ggml_lite give the buffer
    its 32 spare bytes and carry on;
  - `ggml_gallocr_needs_realloc` (every version) never checks the leafs' planned slots, so a kept
    plan can be too small for a leaf of the next graph; the reference's debug build asserts, ggml_lite
    raises `PlanMismatchError`, a release build of ggml overlaps tensors (see `check_sequence` and
    `tests/differential/test_differential.py::test_a_kept_plan_too_small_for_a_leaf`).
"""

from __future__ import annotations

from .bindings import (
    ALIGNMENT,
    CPU_BUFFER_SIZE_DELTA,
    FLAG_MASK,
    IMPORT_ERROR,
    apply_ctypes_fixes,
    available,
    need_ggml,
)
from .build import REPRODUCED_BUILD, build_info, describe_build, sums_in_reproduced_order
from .chunked import MaxSizeBufferType, chunked_plan, max_size_buffer_type
from .compute import ggml_compute, ggml_lockstep, graph_data_tensors
from .isolation import GGMLAbort, run_batch, run_isolated
from .mirror import Mirror, MirrorMismatch, infer_roots, mirror, reachable
from .numeric import (
    NumericGraph,
    UnconvertedArithmetic,
    attention_graph,
    ggml_results,
    lite_numeric_results,
    mlp_graph,
    numeric_corpus,
    numerics_data,
    numerics_document,
    result_entry,
    result_values,
)
from .planner_graphs import add_chain, chain_graph, fan_out_graph
from .plans import Difference, check_random_graph, check_sequence, compare_plans, ggml_plan, lite_plan
from .random_graphs import (
    MAX_TENSOR_BYTES,
    SHRINK_SECONDS,
    RandomGraph,
    build_compute_graph,
    build_random_graph,
    compute_graph,
    compute_graphs,
    graphs,
    oracle_settings,
    random_graph,
)
from .source import graph_to_code
from .tolerance import normwise_error, version_dependent

__all__ = [
    "ALIGNMENT", "CPU_BUFFER_SIZE_DELTA", "Difference", "FLAG_MASK", "GGMLAbort", "IMPORT_ERROR",
    "MAX_TENSOR_BYTES", "MaxSizeBufferType", "Mirror", "MirrorMismatch", "NumericGraph", "REPRODUCED_BUILD",
    "RandomGraph", "SHRINK_SECONDS", "UnconvertedArithmetic", "add_chain", "apply_ctypes_fixes",
    "attention_graph", "available", "build_compute_graph", "build_info", "build_random_graph", "chain_graph",
    "check_random_graph", "check_sequence", "chunked_plan", "compare_plans", "compute_graph", "compute_graphs",
    "describe_build", "fan_out_graph", "ggml_compute", "ggml_lockstep", "ggml_plan", "ggml_results",
    "graph_data_tensors", "graph_to_code", "graphs", "infer_roots", "lite_numeric_results", "lite_plan",
    "max_size_buffer_type", "mirror", "mlp_graph", "need_ggml", "normwise_error", "numeric_corpus",
    "numerics_data", "numerics_document", "oracle_settings", "random_graph", "reachable", "result_entry",
    "result_values", "run_batch", "run_isolated", "sums_in_reproduced_order", "version_dependent",
]
