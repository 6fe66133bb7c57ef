"""The offline planners of chapter 11 (`ggml_lite.planners` and its `exact_search`, with appendix A6's `verify`):
blocks from ggml's trace, the lower bound, greedy by size and by breadth, the exact search, best; plans
placed by the graph allocator and verified by computing; `python -m ggml_lite plan --planner ... [--verify]`.

Properties run over the random graphs of `ggml_oracle` (hypothesis, few examples) and over every
recorded fixture. No assertion depends on time: the exact search is given budgets that either let it
finish on these small problems or are meant to run out."""

import itertools
import json
import math
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ggml_lite as gl
import ggml_oracle as O
from ggml_lite import exact_search as ES
from ggml_lite import planners as P
from ggml_lite import verify as V
from ggml_lite.__main__ import main
from ggml_lite.numerics import fill_leaf, leaf_bytes
from ggml_oracle import add_chain, chain_graph, fan_out_graph
from helpers import SEED_FILES, fixture_path, graph_sections, load_json

NOT_COMPUTABLE = (gl.TensorError, gl.UnsupportedOpError)


def recorded(name: str, step=None):
    gf = gl.read_graph_file(fixture_path("ggml-seed", name), step)
    gl.graphio.allocate_external(gf)
    return gf


def random_graph(seed: int, max_ops: int = 24):
    """`random_graph(seed)` with the tensors a caller fills flagged INPUT (ggml's contract for data set
    before computing; the benchmark does the same)."""
    rg = O.random_graph(seed, max_ops=max_ops)
    for t in V.data_tensors(rg.graph):
        if t.data is None:
            gl.set_input(t)
    return rg.graph


def assert_sound(problem, plans: dict) -> None:
    """Every plan valid and aligned, none below the lower bound, best no worse than ggml (when there is
    a ggml plan) nor than any other plan."""
    for name, r in plans.items():
        assert P.check_placement(problem, r.offsets) == [], name
        assert all(o % problem.alignment == 0 for o in r.offsets), name
        assert r.peak == P.peak_of(problem, r.offsets) >= problem.lower_bound, name
        assert r.buffer_size == r.peak + problem.slack
    assert plans["best"].peak == min(r.peak for r in plans.values())
    assert plans["exact"].peak <= min(plans["greedy-size"].peak, plans["greedy-breadth"].peak)
    if "ggml" in plans:
        assert plans["best"].peak <= plans["ggml"].peak


# -- hand-made problems with known answers ------------------------------------------------------------

FOUR = [(64, 3, 3), (64, 5, 5), (32, 4, 5), (32, 0, 4)]  # greedy by size: 128; optimal: 96 (chapter 11, §6)


def brute_force(problem) -> int:
    """The smallest peak of any placement, by trying every offset (in alignment units) from the lower
    bound up: small problems only."""
    a, blocks = problem.alignment, problem.blocks
    units = [b.size // a for b in blocks]
    offs = [0] * len(blocks)

    def place(k: int, cap: int) -> bool:
        if k == len(blocks):
            return True
        for o in range(cap - units[k] + 1):
            if all(not blocks[k].overlaps(blocks[j]) or o + units[k] <= offs[j] or offs[j] + units[j] <= o
                   for j in range(k)):
                offs[k] = o
                if place(k + 1, cap):
                    return True
        return False

    for cap in itertools.count(problem.lower_bound // a):
        if place(0, cap):
            return cap * a
    raise AssertionError("unreachable: itertools.count never ends")


def test_the_four_block_example():
    four = P.problem_from_blocks(FOUR)
    plans = P.all_plans(four)
    assert four.lower_bound == 96 and "ggml" not in plans
    assert plans["greedy-size"].peak == plans["greedy-breadth"].peak == 128
    assert plans["exact"].peak == plans["best"].peak == 96 and plans["exact"].optimal is True
    assert plans["greedy-size"].optimal is False and plans["best"].source == "exact"
    assert_sound(four, plans)


def test_exact_matches_brute_force_on_small_problems():
    rng = random.Random(11)
    for _ in range(60):
        specs = []
        for _ in range(rng.randint(2, 6)):
            start = rng.randint(0, 5)
            specs.append((32 * rng.choice((1, 2, 3, 5)), start, rng.randint(start, 5)))
        problem = P.problem_from_blocks(specs)
        r = P.exact(problem, budget=10.0)
        assert r.optimal is True and r.peak == brute_force(problem), specs
        assert P.check_placement(problem, r.offsets) == []


SEVEN = [(96, 0, 0), (64, 0, 1), (32, 1, 2), (64, 1, 3), (32, 2, 3), (64, 3, 4), (96, 4, 4)]  # chapter 11, §6


def test_exact_proves_an_optimum_above_the_lower_bound():
    """Seven blocks whose lower bound (160) no placement reaches: the search proves that nothing fits
    in 160, then finds and proves 192 (brute force agrees). The same happens with a bound that is
    merely weak: the four-block problem told its lower bound is 64."""
    seven = P.problem_from_blocks(SEVEN)
    r = P.exact(seven, budget=10.0)
    assert (seven.lower_bound, r.peak, r.optimal) == (160, 192, True) and brute_force(seven) == 192
    assert P.check_placement(seven, r.offsets) == [] and r.nodes > 0
    weak = replace(P.problem_from_blocks(FOUR), lower_bound=64)
    assert (P.exact(weak, budget=10.0).peak, P.exact(weak, budget=10.0).optimal) == (96, True)


def test_sizes_are_rounded_to_the_alignment_and_empty_blocks_cost_nothing():
    problem = P.problem_from_blocks([(1, 0, 2), (33, 1, 1), (0, 0, 3)], alignment=64)
    assert [b.size for b in problem.blocks] == [64, 64, 0] and problem.lower_bound == 128
    for r in P.all_plans(problem).values():
        assert r.peak == 128 and all(o % 64 == 0 for o in r.offsets)


def test_check_placement_names_overlaps_and_misalignment():
    four = P.problem_from_blocks(FOUR)
    bad = P.check_placement(four, (0, 0, 16, 32))  # 2 and 3 meet at node 4; 16 is not aligned
    assert any("not a multiple of 32" in m for m in bad) and any("blocks 2" in m and "overlap" in m for m in bad)


def test_an_exhausted_budget_returns_the_incumbent_without_a_proof():
    """Fixture 09 (295 blocks): the search cannot finish in 10 ms; it returns the best plan it knows,
    never worse than the incumbent it was given, nor than ggml's when it makes its own."""
    problem = P.blocks_of(recorded("09_random_dag_wide_s42").graph)
    incumbent = min(P.greedy_by_size(problem), P.greedy_by_breadth(problem), key=lambda r: r.peak)
    r = P.exact(problem, budget=0.01, incumbent=incumbent)
    assert r.optimal is None and r.stopped and r.peak <= incumbent.peak and P.check_placement(problem, r.offsets) == []
    r = P.exact(problem, budget=0.01)
    assert r.optimal is None and r.stopped and r.peak <= problem.ggml_peak
    assert P.check_placement(problem, r.offsets) == []


def _textbook_greedy(problem, order_of) -> list:
    """The greedy planners as TFLite states them, without shortcuts: blocks in the planner's order,
    each into the smallest gap among every placed block it shares a node with."""
    offsets: list[int] = [0] * len(problem.blocks)
    placed: list[P.Block] = []
    for b in order_of(problem):
        busy = sorted((offsets[p.index], offsets[p.index] + p.size) for p in placed if p.overlaps(b))
        best, best_gap, top = None, None, 0
        for lo, hi in busy:
            if lo - top >= b.size and (best_gap is None or lo - top < best_gap):
                best, best_gap = top, lo - top
            top = max(top, hi)
        offsets[b.index] = top if best is None else best
        placed.append(b)
    return offsets


def _size_order(problem):
    return [b for b in sorted(problem.blocks, key=lambda b: (-b.size, b.start, b.index)) if b.size]


def _breadth_order(problem):
    out = []
    for step in sorted(range(len(problem.live)), key=lambda i: (-problem.live[i], i)):
        alive = [b for b in problem.blocks if b.start <= step <= b.end and b.size and b not in out]
        out += sorted(alive, key=lambda b: (-b.size, b.index))
    return out


def test_the_greedy_planners_are_the_textbook_ones():
    """The greedy planners (numpy finds the blocks that meet; breadth decides its order first) place
    every block where the plain statement of the algorithm does, on random problems and a recorded
    graph; the live profile is the sum of the blocks alive at each node."""
    rng = random.Random(5)
    problems = [P.blocks_of(recorded("09_random_dag_wide_s42").graph)]
    for _ in range(40):
        specs = []
        for _ in range(rng.randint(1, 30)):
            start = rng.randint(0, 12)
            specs.append((rng.choice((0, 32, 64, 96, 160, 320)), start, rng.randint(start, 12)))
        problems.append(P.problem_from_blocks(specs))
    for problem in problems:
        assert problem.live == [sum(b.size for b in problem.blocks if b.start <= i <= b.end)
                                for i in range(len(problem.live))]
        assert list(P.greedy_by_size(problem).offsets) == _textbook_greedy(problem, _size_order)
        assert list(P.greedy_by_breadth(problem).offsets) == _textbook_greedy(problem, _breadth_order)


class FakeClock:
    """A clock that advances `tick` seconds at every reading. It remembers the reading at which a
    deadline it is told about (`at`) was first passed, and `work` calls made after that reading."""

    def __init__(self, tick: float = 1e-3):
        self.now, self.tick, self.reads = 0.0, tick, 0
        self.at: float | None = None
        self.late_read: int | None = None
        self.late_work: list[str] = []

    def __call__(self) -> float:
        self.reads += 1
        self.now += self.tick
        if self.at is not None and self.now > self.at and self.late_read is None:
            self.late_read = self.reads
        return self.now

    def deadline(self, budget: float):
        d = P.Deadline(budget, self)
        self.at = d.at
        return d

    def watch(self, monkeypatch, owner, name: str) -> None:
        """Record a call of `owner.name` made after the deadline was seen to pass."""
        real = getattr(owner, name)

        def watched(*args, **kwargs):
            if self.late_read is not None:
                self.late_work.append(name)
            return real(*args, **kwargs)
        monkeypatch.setattr(owner, name, watched)


@pytest.mark.parametrize("planner", ["exact", "best", "greedy-size", "greedy-breadth", "the search alone"])
@pytest.mark.parametrize("shape", ["fan-out", "chain", "by hand"])
def test_the_budget_stops_every_phase(shape, planner, monkeypatch):
    """On a clock that advances 1 ms at every reading, a budget of 0.3 s allows 300 readings. Each
    phase (the greedy plans, the exact search's setup and search) looks at the clock in every loop that
    grows with the graph, so it stops at its first reading past the deadline: no gap is sought and no
    search step is taken after it, the readings after it are a handful, and the plan is valid, never
    worse than ggml's, with no claim of optimality unless it is at the lower bound. "The search alone"
    is the exact search given a plan that stacks every block as its incumbent, so that the budget is
    all its own."""
    n = 2000
    problem = {"fan-out": lambda: P.blocks_of(fan_out_graph(n)[0]), "chain": lambda: P.blocks_of(chain_graph(n)),
               "by hand": lambda: P.problem_from_blocks([(32 * (1 + k % 5), k, k + 3 + k % 7)
                                                         for k in range(n)])}[shape]()
    clock = FakeClock()
    clock.watch(monkeypatch, P, "_lowest_gap")
    for name in ("fits", "place", "preorder"):
        clock.watch(monkeypatch, ES.ExactSearch, name)
    if planner == "the search alone":
        a = problem.alignment  # every block stacked on the one before, above one empty unit
        stacked = list(itertools.accumulate([a] + [b.size for b in problem.blocks]))[:-1]
        r = P.exact(problem, incumbent=P.plan_result(problem, "stacked", stacked, 0.0), deadline=clock.deadline(0.3))
        assert r.nodes > 0 or shape == "fan-out"  # (4,000,000 pairs meet: the setup alone outlasts 300 readings)
    else:
        r = P.run_planner(problem, planner, deadline=clock.deadline(0.3))
    assert clock.late_read is not None and clock.late_work == [] and clock.reads - clock.late_read <= 12
    assert r.stopped or r.optimal is True  # (the exact search has nothing to do when ggml's plan is at the lower bound)
    assert P.check_placement(problem, r.offsets) == [] and r.peak == P.peak_of(problem, r.offsets)
    assert r.optimal is (True if r.peak == problem.lower_bound else False if r.optimal is False else None)
    if problem.ggml_peak is not None and planner in ("exact", "best"):
        assert r.peak <= problem.ggml_peak
        assert shape != "chain" or (r.optimal is None and r.peak == problem.ggml_peak)


def test_the_search_setup_on_thousands_of_blocks_looks_at_the_clock():
    """Building the search lists the pairs of blocks that meet: 2,000 long-lived blocks make 2,000,000 of
    them, so it reads the clock every 64 blocks and stops within them (TimeoutError, which `exact` turns
    into a stop)."""
    problem = P.problem_from_blocks([(32, k, 2000) for k in range(2000)])
    clock = FakeClock()
    with pytest.raises(TimeoutError):
        ES.ExactSearch([1] * 2000, [b.start for b in problem.blocks], [b.end + 1 for b in problem.blocks],
                       clock.deadline(0.0))
    assert clock.reads == 2 and clock.late_read == 2
    stacked = P.plan_result(problem, "stacked", [32 * (k + 1) for k in range(2000)], 0.0)  # (one unit too high)
    r = P.exact(problem, incumbent=stacked, capacity=problem.lower_bound, deadline=clock.deadline(0.0))
    assert r.stopped and r.feasible is None and r.nodes == 0 and r.peak == stacked.peak


def test_a_generous_budget_is_not_a_stop():
    clock = FakeClock()
    problem = P.blocks_of(recorded("06_llama_block").graph)
    r = P.run_planner(problem, "best", deadline=clock.deadline(10.0))
    assert not r.stopped and r.optimal is True and clock.late_read is None


@pytest.mark.parametrize("specs, needle", [
    ([(64, 3, 2)], "block 0: (64, 3, 2) is not (size, start, end)"),
    ([(32, 0, 1), (-1, 0, 0)], "block 1: (-1, 0, 0)"),
    ([(32, -1, 0)], "block 0"),
    ([(32, 0)], "block 0: (32, 0)"),
    ([(32.5, 0, 1)], "all integers"),
])
def test_hand_made_blocks_are_checked(specs, needle):
    with pytest.raises(gl.PlannerError, match=__import__("re").escape(needle)):
        P.problem_from_blocks(specs)
    with pytest.raises(gl.PlannerError, match="alignment must be a positive integer"):
        P.problem_from_blocks(FOUR, alignment=0)


def test_an_unknown_planner_is_refused():
    with pytest.raises(gl.PlannerError, match="unknown planner 'fast'"):
        P.run_planner(P.problem_from_blocks(FOUR), "fast")
    problem = P.blocks_of(recorded("01_mlp_small").graph)
    with pytest.raises(gl.PlannerError, match="unknown way of computing 'gpu'; use one of cpu, dataflow"):
        V.verify_plan(problem.graph, P.best(problem), problem, compute="gpu")


# -- the recorded graphs ---------------------------------------------------------------------------------

RECORDED = [(name, step) for name in SEED_FILES
            for step, _ in graph_sections(load_json(fixture_path("ggml-seed", name)))]


@pytest.mark.parametrize("name, step", RECORDED, ids=[f"{n}-{s}" for n, s in RECORDED])
def test_every_recorded_graph(name, step):
    """ggml's own plan is a valid placement of the blocks and ends at ggml's peak (the recorded buffer
    size - 32, which a fresh plan of a sequence step gives as well: the recorded size there may be a
    kept, larger buffer); every planner is sound; best is never worse than ggml."""
    doc = load_json(fixture_path("ggml-seed", name))
    problem = P.blocks_of(recorded(name, step).graph)
    plans = P.all_plans(problem, budget=0.2)
    assert P.check_placement(problem, plans["ggml"].offsets) == []
    assert plans["ggml"].peak == problem.ggml_peak and problem.slack == 32
    if step is None:
        assert plans["ggml"].buffer_size == doc["buffer_size"]
    assert_sound(problem, plans)


def test_fixture_14_reaches_the_lower_bound():
    """The 7B one-output graph: ggml 65.00 MiB; the lower bound 60.00 MiB; best reaches it."""
    problem = P.blocks_of(recorded("14_llama7b_ctx512_one_output").graph)
    best = P.best(problem)
    assert problem.ggml_peak + 32 == 68161600 and f"{problem.ggml_peak / 2**20:.2f}" == "65.00"
    assert f"{problem.lower_bound / 2**20:.2f}" == "60.00" and best.peak == problem.lower_bound
    assert best.buffer_size == problem.lower_bound + 32 and best.optimal is True


def test_the_lower_bound_is_chapter_05s_peak_live():
    from ggml_lite.trace import lifetimes, live_bytes

    problem = P.blocks_of(recorded("06_llama_block").graph)
    assert max(live_bytes(lifetimes(problem.graph, problem.events), len(problem.graph.nodes))) == problem.lower_bound
    assert (problem.lower_bound, problem.lb_step) == (37760, 25)


# -- random graphs ---------------------------------------------------------------------------------------

@O.oracle_settings(max_examples=25)
@given(O.graphs(max_ops=24))
def test_planners_on_random_graphs(rg):
    for t in V.data_tensors(rg.graph):
        if t.data is None:
            gl.set_input(t)
    problem = P.blocks_of(rg.graph)
    plans = P.all_plans(problem, budget=0.5)
    assert P.check_placement(problem, plans["ggml"].offsets) == [] and plans["ggml"].peak == problem.ggml_peak
    assert_sound(problem, plans)


def test_a_tensor_placed_twice():
    """random_graph(615, max_ops=40): an INPUT node takes its parent leaf in place in the counting loop,
    and ggml places the leaf again; the leaf lives where it was placed last, ggml's plan stays valid
    and the lower bound stays below it."""
    problem = P.blocks_of(random_graph(615, max_ops=40))
    inp1 = next(t for t in problem.graph.leafs if t.name == "inp1")
    homes = [b for b in problem.blocks if inp1 in b.tensors]
    assert len(homes) == 1 and homes[0].ggml_offset == 8544 and problem.block_of[inp1] == homes[0].index
    assert problem.lower_bound <= problem.ggml_peak == 16928
    assert_sound(problem, P.all_plans(problem))


def test_plans_compute_what_separate_memory_computes():
    """Every planner's plan of the first computable random graphs gives, bit for bit, the results of a
    copy of the graph with every tensor in memory of its own."""
    verified = 0
    for seed in range(12):
        problem = P.blocks_of(random_graph(seed))
        for r in P.all_plans(problem, budget=0.5).values():
            try:
                check = V.verify_plan(random_graph(seed), r)
            except NOT_COMPUTABLE:
                break
            assert check.ok, (seed, r.planner, check.differing, check.error)
            assert check.galloc.get_buffer_size(0) == r.buffer_size
            verified += 1
    assert verified >= 40


def _graph_copy_results(graph, seed: int = 0) -> list:
    """Chapter 06's way to the reference: `graph` placed by ggml, filled, then `graph_copy` (every tensor
    reached, weights included, copied into one buffer) computed; the bytes of the results to compare."""
    gl.GAllocr(gl.cpu_buffer_type()).alloc_graph(graph)
    for t, args in V.leaf_spec(graph).items():
        fill_leaf(t, seed, *args)
    copy = gl.graph_copy(gl.cpu_init(), graph)
    try:
        twin = dict(zip(graph.nodes, copy.graph.nodes))
        gl.cpu_init().graph_compute(copy.graph)
        return [gl.tensor_get(twin[t]).tobytes() for t in V.results_to_compare(graph)]
    finally:
        gl.graph_copy_free(copy)


def _reference_results(graph, seed: int = 0) -> tuple:
    """The lean reference of verify_plans on `graph`: (its bytes, its peak)."""
    spec = V.leaf_spec(graph)
    shared = V.read_only_data(graph)
    for t in shared:
        fill_leaf(t, seed, *spec[t])
    ref = V.ReferenceRun(graph, shared)
    return ref.run(lambda t, d: fill_leaf(d, seed, *spec[t])), ref.peak


@pytest.mark.parametrize("name", ["01_mlp_small", "03_views_layout", "06_llama_block", "07_llama4_kvcache"])
def test_the_reference_computes_what_a_graph_copy_computes(name):
    """The reference shares the read-only data, gives every other tensor a buffer of its own and frees it
    after its last reader: its results are chapter 06's graph_copy results, bit for bit, in less memory."""
    lean, peak = _reference_results(recorded(name).graph)
    assert lean == _graph_copy_results(recorded(name).graph)
    graph = recorded(name).graph
    assert 0 < peak <= sum(t.nbytes for t in V.reached(graph) if t.view_src is None and t.data is None) + sum(
        t.nbytes for t in V.written_data(graph))


def test_the_reference_on_random_graphs():
    compared = 0
    for seed in range(40):
        try:
            want = _graph_copy_results(random_graph(seed))
        except NOT_COMPUTABLE:
            continue
        assert _reference_results(random_graph(seed))[0] == want, seed
        compared += 1
    assert compared >= 20


def test_a_graph_built_after_the_kv_cache_has_memory():
    """llama.cpp builds each decode graph with the KV cache already allocated, so the CPY into a view of
    the cache has its address from the start. It is still a node to compute: the twins duplicate it (and
    share only the cache itself), so every plan, ggml's included, places and verifies."""
    from ggml_lite.models.llama import LlamaParams, build_graph, build_llama, layer_placement, model_tensors

    model = LlamaParams(n_vocab=64, n_embd=64, n_layer=2, n_head=8, n_head_kv=2, n_ff=96, wtype="f32").model(32)
    ctxs, _, _ = build_llama(model, layer_placement(2, 0, 0), dict(n_tokens=4, n_kv=32, kv_head=0, n_outputs=4))
    for c in ctxs[:-1]:
        gl.alloc_ctx_tensors(c, gl.cpu_init())
    w, layers = model_tensors({t.name: t for c in ctxs[:-1] for t in c.tensors}, 2)
    graph = build_graph(model, w, layers, dict(n_tokens=1, n_kv=32, kv_head=4, n_outputs=1))[1]
    for t in V.data_tensors(graph):
        if t.data is None:
            gl.set_input(t)
    assert any(n.op is gl.Op.CPY and n.data is not None for n in graph.nodes)
    problem = P.blocks_of(graph)
    plans = P.all_plans(problem)
    for compute in V.COMPUTE_WITH:
        assert all(c.ok for c in V.verify_plans(graph, list(plans.values()), problem, compute=compute)), compute


def test_written_data_is_the_kv_cache_not_the_weights():
    graph = recorded("07_llama4_kvcache").graph
    written = {t.name for t in V.written_data(graph)}
    assert written and all(n.startswith("cache_") for n in written)
    assert not any(n.startswith("cache_") for n in {t.name for t in V.data_tensors(graph)} - written)
    shared = {t.name for t in V.read_only_data(graph)}
    assert shared and not shared & written and all(".weight" in n for n in shared)


def test_plans_run_on_twins_and_identical_plans_run_once():
    """The loaded graph stays unplaced, so one graph serves every plan; plans with the same offsets share
    one verification; a twin keeps names, flags and shapes, and shares what already has memory."""
    problem = P.blocks_of(recorded("06_llama_block").graph)
    plans = P.all_plans(problem)
    checks = V.verify_plans(problem.graph, list(plans.values()), problem)
    assert all(c.ok for c in checks) and all(t.data is None for t in problem.graph.nodes)
    same = {}
    for r, c in zip(plans.values(), checks):
        assert same.setdefault(tuple(r.offsets), c) is c
        assert c.galloc.get_buffer_size(0) == r.buffer_size
    copy, twin = V.twin_graph(problem.graph, keep={t for t in V.reached(problem.graph) if t.data is not None})
    for t, d in twin.items():
        assert (d is t) == (t.data is not None)
        assert (d.name, d.flags, d.ne, d.nb, d.op, d.type) == (t.name, t.flags, t.ne, t.nb, t.op, t.type)
    assert [twin[t] for t in problem.graph.nodes] == copy.nodes


def _clobber_a_result(problem, result):
    """`result` with a block moved onto the block of a result that must survive (an OUTPUT or a node
    nothing reads), the moved block written after that result was computed; None when there is none."""
    nodes = problem.graph.nodes
    at = {t: i for i, t in enumerate(nodes)}
    for t in V.results_to_compare(problem.graph):
        k = problem.block_of.get(t)
        if k is None or not problem.blocks[k].size:
            continue
        for o in problem.blocks:
            first = o.tensors[0] if o.tensors else None
            if o.size and o.index != k and first in at and at[first] > at[t] and o.overlaps(problem.blocks[k]):
                offsets = list(result.offsets)
                offsets[o.index] = offsets[k]
                return replace(result, offsets=tuple(offsets), peak=P.peak_of(problem, offsets))
    return None


def _moved(problem, result, block: int, onto: int):
    """`result` with block `block` moved to the offset of block `onto`."""
    offsets = list(result.offsets)
    offsets[block] = offsets[onto]
    return replace(result, offsets=tuple(offsets), peak=P.peak_of(problem, offsets))


def test_a_corrupted_plan_fails_verification():
    """Two live blocks made to overlap: check_placement names them, and computing shows it. In the LLaMA
    block, ffn_up-0 (block 16) put on the gate chain (block 15) overwrites ffn_silu-0 before
    ffn_gate_par-0 reads it (chapter 11, section 8); in random graphs, a block written after a kept
    result is put on it."""
    problem = P.blocks_of(recorded("06_llama_block").graph)
    broken = _moved(problem, P.best(problem), 16, 15)
    assert P.check_placement(problem, broken.offsets)
    check = V.verify_plan(recorded("06_llama_block").graph, broken)
    assert not check.ok and check.differing == ["l_out-0"] and check.conflicts
    caught = 0
    for seed in range(12):
        problem = P.blocks_of(random_graph(seed))
        broken = _clobber_a_result(problem, P.best(problem))
        if broken is None:
            continue
        try:
            check = V.verify_plan(random_graph(seed), broken)
        except NOT_COMPUTABLE:
            continue
        assert not check.ok, seed
        caught += 1
    assert caught >= 5


def test_the_dataflow_run_fails_what_the_kernels_fail():
    """The data-flow run (a digest of every byte read, for graphs the kernels refuse) passes every good
    plan, and on a plan corrupted so that a kept result is overwritten it finds a differing result
    wherever the CPU kernels find a difference or fail (and sometimes where they compute equal bits)."""
    both = 0
    for seed in range(30):
        problem = P.blocks_of(random_graph(seed))
        broken = _clobber_a_result(problem, P.best(problem))
        plans = [*P.all_plans(problem, budget=0.2).values(), *([broken] if broken else [])]
        flow = V.verify_plans(problem.graph, plans, problem, compute="dataflow")
        assert all(c.ok for c in flow[:5]), seed
        try:
            cpu = V.verify_plans(problem.graph, plans, problem)
        except NOT_COMPUTABLE:
            continue
        assert [c.ok for c in cpu] == [c.ok for c in flow], seed
        if broken is not None and (cpu[-1].differing or cpu[-1].error):  # (an error: indices overwritten)
            assert flow[-1].differing, seed
            both += 1
    assert both >= 8


@pytest.mark.parametrize("name", ["09_random_dag_wide_s42", "10_random_dag_wide_s7"])
def test_graphs_the_kernels_refuse_are_verified_by_the_dataflow_run(name):
    problem = P.blocks_of(recorded(name).graph)
    with pytest.raises(NOT_COMPUTABLE):
        V.verify_plan(problem.graph, P.best(problem), problem)
    plans = list(P.all_plans(problem, budget=0.2).values())
    broken = _clobber_a_result(problem, plans[-1])
    checks = V.verify_plans(problem.graph, [*plans, broken], problem, compute="dataflow")
    assert [c.ok for c in checks] == [True] * 5 + [False] and checks[-1].differing


def test_element_bytes_follow_the_strides():
    """A transposed view's element bytes are the transpose of its source's; a node's data-flow result
    covers exactly its own elements (an in-place add on rows 1..2 of a 4-row tensor leaves rows 0 and 3)."""
    ctx = gl.Context()
    a = ctx.new_tensor_2d(gl.F32, 3, 4, name="a")
    t = gl.transpose(ctx, a)
    rows = gl.view_2d(ctx, a, 3, 2, a.nb[1], a.nb[1])
    y = gl.add_inplace(ctx, rows, gl.sqr(ctx, rows))
    graph = gl.build_forward(y)
    gl.GAllocr(gl.cpu_buffer_type()).alloc_graph(graph)
    gl.tensor_set(a, __import__("numpy").arange(12, dtype="float32"))
    t.buffer, t.data = a.buffer, a.data
    ea, et = V.element_bytes(a), V.element_bytes(t)
    assert ea.shape == (1, 1, 4, 3, 4) and et.shape == (1, 1, 3, 4, 4)
    assert (et[0, 0] == ea[0, 0].transpose(1, 0, 2)).all()
    before = gl.tensor_get(a).copy()
    V.dataflow_compute(graph)
    after = gl.tensor_get(a)
    assert (after[[0, 3]] == before[[0, 3]]).all() and (after[1:3] != before[1:3]).any()


def test_an_overlap_the_numpy_kernels_survive_still_fails():
    """Vcur-0 (block 8, a mul_mat of attn_norm-0) put on attn_norm-0's own block (3), which it reads at
    that very node: numpy reads all sources before writing, so the results are equal, but the placement
    is invalid, and ggml's threaded kernels could corrupt it. verify_plan fails it; the CLI exits 1."""
    problem = P.blocks_of(recorded("06_llama_block").graph)
    broken = _moved(problem, P.best(problem), 8, 3)
    check = V.verify_plan(recorded("06_llama_block").graph, broken)
    assert check.compared and not check.differing and not check.error  # computing alone sees nothing
    assert not check.ok and any("blocks 3" in c and "8" in c for c in check.conflicts)


def test_verify_fills_from_the_one_seeded_filler():
    """verify_plans's data is numerics.leaf_bytes's (the LCG of tests/fixtures/README.md): data tensor k is
    leaf k of the seed, an i32 tensor holds integers below the rows of the table a get_rows reads with it."""
    graph = recorded("07_llama4_kvcache").graph
    problem = P.blocks_of(graph)
    assert V.verify_plan(graph, P.best(problem), problem, seed=5).ok
    spec = V.leaf_spec(graph)
    assert [k for k, _, _ in spec.values()] == list(range(len(V.data_tensors(graph))))
    weights = V.read_only_data(graph)  # filled in place, once for every run, and never written
    assert weights and all(gl.tensor_get(t).tobytes() == leaf_bytes(t.type, t.ne, 5, *spec[t]) for t in weights)
    get_rows = [n for n in graph.nodes if n.op is gl.Op.GET_ROWS]
    assert get_rows and all(spec[n.src[1]][1:] == ("int", (0, n.src[0].ne[1])) for n in get_rows)


def test_a_planned_graph_is_refused_not_planned_as_empty():
    graph = recorded("06_llama_block").graph
    problem = P.blocks_of(graph)
    P.alloc_planned(graph, P.best(problem), problem)
    with pytest.raises(gl.GraphError, match="already has memory"):
        P.blocks_of(graph)


def test_verify_refuses_what_it_cannot_check():
    problem = P.blocks_of(recorded("14_llama7b_ctx512_one_output").graph)
    with pytest.raises(gl.AllocationError, match=r"needs about 13\.\d\d GiB .* max_bytes = 2\.00 GiB"):
        V.verify_plan(problem.graph, P.best(problem), problem)
    ctx = gl.Context()  # a PARAM weight in the compute context: a node that is not INPUT, filled up front
    w = ctx.new_tensor_1d(gl.F32, 16, name="w")
    gl.set_param(w)
    x = ctx.new_tensor_1d(gl.F32, 16, name="x")
    y = gl.add(ctx, gl.sqr(ctx, x), w)
    graph = gl.build_forward(y)
    problem = P.blocks_of(graph)
    assert w in graph.nodes and problem.blocks[problem.block_of[w]].start > 0
    with pytest.raises(gl.GraphError, match="Flag it INPUT"):
        V.verify_plan(graph, P.best(problem), problem)
    ctx = gl.Context()  # a weight of a type the one seeded filler (numerics.leaf_bytes) has no values of
    q = ctx.new_tensor_2d(gl.type_by_name("q4_1"), 32, 4, name="q")
    rows = ctx.new_tensor_1d(gl.I32, 2, name="rows")
    graph = gl.build_forward(gl.get_rows(ctx, q, rows))
    problem = P.blocks_of(graph)
    with pytest.raises(gl.DataTypeError, match=r"verify: 'q' q4_1 .* no values of type q4_1: it fills f32, f16"):
        V.verify_plan(graph, P.best(problem), problem)
    stale = P.best(P.problem_from_blocks(FOUR))
    with pytest.raises(gl.PlanMismatchError, match="made for another graph"):
        P.alloc_planned(recorded("06_llama_block").graph, stale)
    by_hand = P.problem_from_blocks(FOUR)  # no graph allocator behind it: nothing to place the plan with
    with pytest.raises(gl.PlanMismatchError, match="made by hand"):
        P.alloc_planned(recorded("06_llama_block").graph, P.best(by_hand), by_hand)


# -- the command line ----------------------------------------------------------------------------------

F06, F14 = (str(fixture_path("ggml-seed", n)) for n in ("06_llama_block", "14_llama7b_ctx512_one_output"))


def test_plan_json_with_a_planner(capsys):
    assert main(["plan", F14, "--planner", "best", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"buffer_size", "tensors", "planner", "lower_bound", "optimal", "ggml"}
    assert out["planner"] == "best" and out["optimal"] is True
    assert out["buffer_size"] == out["lower_bound"] + 32 == 62916640 + 32
    doc = load_json(fixture_path("ggml-seed", "14_llama7b_ctx512_one_output"))
    assert set(out["tensors"]) == {t["name"] for t in doc["graph"]["tensors"]}
    sizes = {t["name"]: t["nbytes"] for t in doc["graph"]["tensors"]}
    assert all(v["offset"] + sizes[n] <= out["lower_bound"]
               for n, v in out["tensors"].items() if v["offset"] is not None)


@pytest.mark.parametrize("planner", ["exact", "best", "greedy-size"])
def test_plan_honours_budget_on_a_large_fan_out(planner, tmp_path, monkeypatch, capsys):
    """`plan FILE --planner P --budget 0.3` on a 2,000-output fan-out written as a graph file: the
    command's planners run on a clock that advances 1 ms at every reading (the default clock of
    `Deadline`, replaced), so they stop after 300 readings whatever the machine, and the command says
    so and places a valid plan at the lower bound (ggml's, or the rest stacked)."""
    clock = FakeClock()
    monkeypatch.setattr(P.Deadline.__init__, "__defaults__", (None, clock))
    path = tmp_path / "fan_out.json"
    path.write_text(json.dumps(gl.graphio.graph_document(*fan_out_graph(2000))))
    assert main(["plan", str(path), "--planner", planner, "--budget", "0.3"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(f"planner {planner}") and "stopped by its budget" in last, last
    assert "optimal" in last and "1.0000 x the lower bound" in last
    assert clock.reads > 300  # (the readings were this clock's: the deadline passed on it)


def test_plan_json_of_ggml_keeps_the_recorded_plan(capsys):
    doc = load_json(fixture_path("ggml-seed", "06_llama_block"))
    assert main(["plan", F06, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["buffer_size"] == doc["buffer_size"] and out["planner"] == "ggml"
    assert out["tensors"] == {t["name"]: {"offset": t["offset"]} for t in doc["graph"]["tensors"]}
    assert out["lower_bound"] == 37760 and out["optimal"] is False  # greedy plans reach 37,760


def test_plan_text_of_ggml_is_unchanged(capsys):
    assert main(["plan", F06]) == 0
    out = capsys.readouterr().out
    assert "planner" not in out and "verify" not in out
    assert out.splitlines()[-2].startswith("compute buffer: 42912 bytes")


@pytest.mark.parametrize("planner", P.PLANNER_NAMES)
def test_plan_verify_exits_0(planner, capsys):
    assert main(["plan", F06, "--planner", planner, "--verify"]) == 0
    out = capsys.readouterr().out
    assert "verify: 1 result(s)" in out and "bit for bit" in out
    assert main(["plan", F06, "--planner", planner]) == 0  # the same offsets printed, verified or not
    table = lambda text: text[:text.index("compute buffer:")]  # noqa: E731
    assert table(capsys.readouterr().out) == table(out) and "  -\n" not in table(out)


def test_plan_verify_json_and_a_sequence_step(capsys):
    seq = str(fixture_path("ggml-seed", "11_realloc_sequence_grow"))
    assert main(["plan", seq, "--step", "3", "--planner", "greedy-breadth", "--verify", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["verified"] is True and out["buffer_size"] == out["lower_bound"] + 32


def test_plan_verify_fails_with_exit_1(monkeypatch, capsys):
    """A planner whose plan overlaps two live blocks: --verify computes it and exits 1."""
    real = P.run_planner

    def corrupted(problem, planner="best", budget=P.DEFAULT_BUDGET):
        return _moved(problem, real(problem, planner, budget), 16, 15)

    monkeypatch.setattr(P, "run_planner", corrupted)
    assert main(["plan", F06, "--planner", "best", "--verify"]) == 1
    out = capsys.readouterr().out
    assert "verify: FAILED: l_out-0" in out and "verify: FAILED: invalid placement: blocks 15" in out

    def survivable(problem, planner="best", budget=P.DEFAULT_BUDGET):
        return _moved(problem, real(problem, planner, budget), 8, 3)

    monkeypatch.setattr(P, "run_planner", survivable)
    assert main(["plan", F06, "--planner", "best", "--verify"]) == 1
    assert "the placement above is invalid" in capsys.readouterr().out


@pytest.mark.parametrize("args, needle", [
    (["--planner", "fast"], "invalid choice: 'fast'"),
    (["--planner", "exact", "--budget", "0"], "expected a positive number of seconds"),
    (["--planner", "exact", "--budget", "soon"], "expected a positive number of seconds"),
    (["--verify", "--max-gib", "0"], "expected a positive number of GiB"),
    (["--verify", "--max-gib", "inf"], "expected a positive number of GiB"),
    (["--verify", "--max-gib", "1e308"], "expected a positive number of GiB"),
])
def test_bad_planner_arguments_exit_2(args, needle, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["plan", F06, *args])
    assert exit_.value.code == 2 and needle in capsys.readouterr().err


@pytest.mark.parametrize("name, args, needle", [
    ("14_llama7b_ctx512_one_output", ["--verify"], "--verify: verifying by computing needs about"),
    ("06_llama_block", ["--verify", "--max-gib", "0.00001"], "(--max-gib raises it)"),
    ("09_random_dag_wide_s42", ["--planner", "greedy-size", "--verify"], "--verify: the CPU backend cannot compute"),
    ("11_realloc_sequence_grow", ["--planner", "best"], "pass --step"),
])
def test_unusable_inputs_for_a_planner_exit_2(name, args, needle, capsys):
    assert main(["plan", str(fixture_path("ggml-seed", name)), *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


# ---------------------------------------------------------------------------------------------
# Work that grows with the graph, counted (not timed): a 60,000-node chain of adds took 33 s under
# `plan --verify` when blocks_of copied a block's tuple of tensors at every member and
# check_placement compared every pair of blocks alive together (benchmarks/budget.py --large).
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [500, 1000, 2000])
def test_blocks_of_stores_each_tensor_of_a_chain_once(n, monkeypatch):
    """A block's tensors are gathered in a list and stored once: the tuples `blocks_of` assigns to
    `Block.tensors` hold n + 1 tensors in all on an in-place chain of n adds (a tuple grown one tensor
    at a time held n²/2)."""
    stored = []

    class Counted(P.Block):
        def __setattr__(self, name, value):
            if name == "tensors":
                stored.append(len(value))
            super().__setattr__(name, value)

    monkeypatch.setattr(P, "Block", Counted)
    problem = P.blocks_of(add_chain(n)[0])
    chain = max(problem.blocks, key=lambda b: len(b.tensors))
    assert len(chain.tensors) == n and sum(len(b.tensors) for b in problem.blocks) == n + 1  # (and x)
    assert sum(stored) == n + 1


def _pairwise(problem, offsets) -> set:
    """Every conflicting pair, by comparing all pairs (the definition `check_placement` sweeps for)."""
    live = [b for b in problem.blocks if b.size]
    return {(a.index, b.index) if (a.start, a.index) < (b.start, b.index) else (b.index, a.index)
            for a, b in itertools.combinations(live, 2)
            if a.overlaps(b) and offsets[a.index] < offsets[b.index] + b.size
            and offsets[b.index] < offsets[a.index] + a.size}


def _named_pairs(conflicts) -> set:
    return {(int(m.split()[1]), int(m.split(") and ")[1].split()[0])) for m in conflicts if m.startswith("blocks ")}


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 12), st.integers(0, 6), st.integers(0, 6)),
                min_size=1, max_size=30))
def test_check_placement_finds_every_overlapping_pair(specs):
    """The sweep reports exactly the pairs that a comparison of every pair finds: blocks of 0 to 128
    bytes over 0 to 18 nodes, at offsets 0 to 192 (many of them overlapping), each pair once."""
    problem = P.problem_from_blocks([(32 * size, start, start + length) for size, start, length, _ in specs])
    offsets = [32 * at for *_, at in specs]
    conflicts = P.check_placement(problem, offsets)
    assert _named_pairs(conflicts) == _pairwise(problem, offsets)
    assert len(conflicts) == len(_pairwise(problem, offsets))


@pytest.mark.parametrize("shape", ["fan-out", "in turn at offset 0", "random, placed by greedy-size"])
def test_check_placement_does_n_log_n_work(shape):
    """On valid placements of n and 2n blocks the sweep looks at fewer than 3 n log2 n tree nodes: on
    the fan-out, where every pair of the n blocks shares a node, a comparison of pairs makes n²/2."""
    rng = random.Random(5)
    for n in (2000, 4000):
        if shape == "fan-out":
            problem, offsets = P.problem_from_blocks([(64, 0, 1)] * n), [64 * k for k in range(n)]
        elif shape == "in turn at offset 0":
            problem, offsets = P.problem_from_blocks([(64, 2 * k, 2 * k + 1) for k in range(n)]), [0] * n
        else:
            starts = [rng.randrange(n) for _ in range(n)]
            problem = P.problem_from_blocks([(32 * rng.randrange(1, 9), s, s + rng.randrange(50)) for s in starts])
            offsets = P.greedy_by_size(problem).offsets
        live = P.LiveBytes(sorted(set(offsets)))
        assert P.check_placement(problem, offsets, live) == []
        assert live.visits < 3 * n * math.log2(n), (n, live.visits)


def test_negative_rope_n_dims_is_refused_under_verify(tmp_path, capsys):
    """Fixture 06 with its first ROPE's n_dims (op_params[1]) negative and even: the CPU kernel refuses
    it (ggml would copy from before each row) and the command exits 2 naming it; no internal error."""
    doc = load_json(fixture_path("ggml-seed", "06_llama_block"))
    assert doc["graph"]["tensors"][18]["op"] == "ROPE"
    for n_dims in (-2, -32, -2**31):
        doc["graph"]["tensors"][18]["op_params"][1] = n_dims
        path = tmp_path / "rope.json"
        path.write_text(json.dumps(doc))
        assert main(["plan", "--verify", str(path)]) == 2
        err = capsys.readouterr().err
        assert f"n_dims {n_dims} must be even and in 0..ne0" in err and "internal" not in err, err
