"""The oracle's view of ggml 0.15.3's chunked compute buffers (`ggml_oracle.chunked`), groundwork for
the chunked differential tests: before ggml_lite plans in chunks, the oracle must read chunks right.

* Without a limit (`get_max_size` returning SIZE_MAX) the copied buffer type gives one chunk, and
  every tensor sits where ggml_lite's 2024 allocator puts it, on recorded fixtures and random graphs.
* With `max_size` = half the unbounded peak (at least the largest tensor, less than the peak) the
  real ggml uses 2 or more chunks (at most 16), every tensor lies inside its chunk, no chunk but the
  16th exceeds MAX(max_size, its largest tensor), and no two tensors live at the same node share
  bytes of a chunk (liveness from ggml_lite's trace, `chunked.overlaps`).
* The checks themselves catch what they should (a plan with every tensor at offset 0 overlaps).
"""

import pytest

import ggml_lite as gl
import ggml_oracle as O
from ggml_lite.graphio import allocate_external
from ggml_oracle import chunked as C
from helpers import fixture_path

pytestmark = pytest.mark.skipif(
    not O.available(), reason=f"the real ggml is not available: `import ggml` (ggml-python) failed: {O.IMPORT_ERROR}")

FIXTURES = ["01_mlp_small", "02_elementwise_inplace", "03_views_layout", "04_outputs_middle",
            "05_inputs_flagged", "06_llama_block", "07_llama4_kvcache", "08_random_dag_chain_s1234",
            "09_random_dag_wide_s42", "10_random_dag_wide_s7"]
SEEDS = range(12)


def _fixture(name):
    """A recorded graph file's graph, roots, pre-allocated contexts (as test_differential reads them)
    and a function that allocates those contexts on ggml_lite's side (`allocate_external`)."""
    gf = gl.read_graph_file(fixture_path("ggml-seed", name))
    pre = []
    for i, rec in gf.records.items():
        t = gf.tensors[i]
        if rec.get("preallocated") and t.view_src is None and not any(t.ctx is c for c in pre):
            pre.append(t.ctx)
    return gf.graph, [gf.tensors[i] for i in gf.expand_roots], pre, lambda: allocate_external(gf)


def _graph_params() -> list:
    return ([pytest.param(lambda name=name: _fixture(name), id=name) for name in FIXTURES]
            + [pytest.param(lambda seed=seed: _random(seed), id=f"seed{seed}") for seed in SEEDS])


def _random(seed):
    rg = O.random_graph(seed)
    return rg.graph, rg.roots, rg.preallocated, lambda: None  # ggml_lite's weights are allocated already


def _largest(plan) -> int:
    return max((C.aligned_size(t) for t, w in plan["placements"].items() if w and t.view_src is None), default=0)


def test_the_buffer_type_answers_like_the_cpu_one_with_a_limit():
    g = O.need_ggml()
    buft = C.max_size_buffer_type(12345)
    assert C.max_size_buffer_type(12345) is buft  # kept alive, one per value
    assert g.ggml_backend_buft_get_max_size(buft.ptr) == 12345
    assert g.ggml_backend_buft_get_max_size(g.ggml_backend_cpu_buffer_type()) == C.SIZE_MAX
    assert g.ggml_backend_buft_get_alignment(buft.ptr) == O.ALIGNMENT
    assert g.ggml_backend_buft_is_host(buft.ptr)
    with pytest.raises(ValueError):
        C.max_size_buffer_type(0)


@pytest.mark.parametrize("make", _graph_params())
def test_unlimited_is_one_chunk_and_the_2024_plan(make):
    graph, roots, pre, allocate = make()
    ref = C.chunked_plan(graph, roots, pre)
    assert ref["reserve_ok"] and ref["alloc_ok"]
    assert len(ref["chunk_sizes"]) == 1
    assert ref["chunk_sizes"] == ref["planned_chunk_sizes"] == [ref["buffer_size"]]
    got = {t: None if w is None else w[1] for t, w in ref["placements"].items()}
    assert {w[0] for w in ref["placements"].values() if w is not None} <= {0}
    # the copied buffer type plans as the CPU buffer type itself does
    cpu = O.ggml_plan(graph, roots, pre)
    assert cpu["buffer_size"] == ref["buffer_size"] and cpu["offsets"] == got
    # and as ggml_lite's 2024 allocator does (the mirror read only structure; now ggml_lite allocates)
    allocate()
    mine = O.lite_plan(graph, list(ref["placements"]))
    assert got == {t: mine["offsets"][t] for t in got}
    assert ref["buffer_size"] + O.CPU_BUFFER_SIZE_DELTA == mine["buffer_size"]


@pytest.mark.parametrize("make", _graph_params())
def test_half_the_peak_gives_chunks_that_keep_the_rules(make):
    graph, roots, pre, allocate = make()
    whole = C.chunked_plan(graph, roots, pre)
    largest, peak = _largest(whole), whole["buffer_size"]
    max_size = max(peak // 2, largest)
    if max_size >= peak:
        pytest.skip(f"the largest tensor ({largest} B) is more than half the peak ({peak} B): one chunk")
    plan = C.chunked_plan(graph, roots, pre, max_size=max_size)
    assert plan["reserve_ok"] and plan["alloc_ok"]
    assert 2 <= len(plan["chunk_sizes"]) <= C.VBUFFER_MAX_CHUNKS, plan["chunk_sizes"]
    assert plan["chunk_sizes"] == plan["planned_chunk_sizes"]
    # (the sum is not always >= the one-chunk peak: on 06_llama_block the chunks hold 40704 B against
    # 42880 B in one buffer, the best fit across chunks placing tensors better than one buffer did)
    assert sum(plan["chunk_sizes"]) == plan["buffer_size"]
    assert C.chunk_rule_violations(plan) == []
    allocate()  # ggml_lite's trace (the liveness) then sees the weights outside, as ggml does
    assert C.overlaps(plan, graph) == []
    # the same tensors are in the compute buffer as without a limit
    assert {t for t, w in plan["placements"].items() if w} == {t for t, w in whole["placements"].items() if w}


def test_a_tensor_larger_than_max_size_gets_a_chunk_of_its_own_size():
    graph, roots, pre, _ = _fixture("01_mlp_small")
    whole = C.chunked_plan(graph, roots, pre)
    largest = _largest(whole)
    plan = C.chunked_plan(graph, roots, pre, max_size=largest // 4)
    assert C.chunk_rule_violations(plan) == [] and C.overlaps(plan, graph) == []
    big = [c for c, s in enumerate(plan["chunk_sizes"]) if s > plan["max_size"]]
    assert big, plan["chunk_sizes"]
    assert max(plan["chunk_sizes"]) <= max(largest, plan["max_size"]) or \
        len(plan["chunk_sizes"]) == C.VBUFFER_MAX_CHUNKS


def test_the_checks_catch_overlaps_and_tensors_outside_a_chunk():
    graph, roots, pre, _ = _fixture("06_llama_block")
    plan = C.chunked_plan(graph, roots, pre, max_size=8192)
    squashed = dict(plan, placements={t: None if w is None else (0, 0) for t, w in plan["placements"].items()})
    assert C.overlaps(squashed, graph)
    shifted = dict(plan, placements={t: None if w is None else (w[0], w[1] + plan["chunk_sizes"][w[0]])
                                     for t, w in plan["placements"].items()})
    assert any("outside" in m for m in C.chunk_rule_violations(shifted))
    small = dict(plan, max_size=32)
    assert any("more than max_size" in m for m in C.chunk_rule_violations(small))
