"""MiniMalloc's exact search (chapter 11, §6: `ggml_lite.exact_search`, driven by `planners.exact`) and the
problems it reads (`problem_from_intervals`, event-compressed sections).

Soundness: the decision (a placement within a capacity, or none) equals brute force on small random
problems, with every technique switched on, off, or alone. Completeness on problems with a known optimum:
perfect packings (`problem_gen`, appendix A6) are met at their capacity. Cost that does not grow with the
time horizon is counted (sections, not nodes), never timed."""

import itertools
import random

import pytest

import ggml_lite as gl
from ggml_lite import exact_search as ES
from ggml_lite import planners as P
from ggml_lite.problem_gen import challenging_packing, perfect_packing


def brute_force_fits(problem, capacity: int) -> bool:
    """Is there a placement of `problem`'s blocks within `capacity` bytes? Every offset tried (in alignment
    units): small problems only."""
    a, blocks = problem.alignment, [b for b in problem.blocks if b.size]
    units, cap = [b.size // a for b in blocks], capacity // a
    offs = [0] * len(blocks)

    def place(k: int) -> bool:
        if k == len(blocks):
            return True
        for o in range(cap - units[k] + 1):
            if all(not blocks[k].overlaps(blocks[j]) or o + units[k] <= offs[j] or offs[j] + units[j] <= o
                   for j in range(k)):
                offs[k] = o
                if place(k + 1):
                    return True
        return False

    return place(0)


def search_of(problem, techniques=ES.TECHNIQUES, deadline=None):
    blocks = [b for b in problem.blocks if b.size]
    return ES.ExactSearch([b.size // problem.alignment for b in blocks], [b.start for b in blocks],
                          [b.end + 1 for b in blocks], deadline or P.Deadline(None), techniques), blocks


def valid_within(problem, offsets, capacity) -> bool:
    return P.check_placement(problem, offsets) == [] and P.peak_of(problem, offsets) <= capacity


def random_problems(seed: int, count: int, most: int = 7, horizon: int = 6):
    rng = random.Random(seed)
    for _ in range(count):
        specs = []
        for _ in range(rng.randint(1, most)):
            start = rng.randrange(horizon)
            specs.append((32 * rng.choice((1, 2, 3, 5)), start, rng.randint(start, horizon - 1)))
        yield P.problem_from_blocks(specs)


SWITCHES = [ES.TECHNIQUES, frozenset()] + [ES.TECHNIQUES - {t} for t in sorted(ES.TECHNIQUES)] + [
    frozenset({t}) for t in sorted(ES.TECHNIQUES)]


@pytest.mark.parametrize("techniques", SWITCHES, ids=lambda t: "+".join(sorted(t)) or "none")
def test_every_switch_keeps_the_search_sound_and_complete(techniques):
    """At the smallest capacity that fits (found by brute force) the search finds a valid placement; one
    unit below it proves that none exists; whichever techniques are on."""
    for problem in random_problems(3, 25):
        best = next(c for c in itertools.count(problem.lower_bound, 32) if brute_force_fits(problem, c))
        for capacity, fits in ((best, True), (best - 32, False)):
            search, blocks = search_of(problem, techniques)
            status = search.solve(capacity // 32)
            assert status == (ES.FOUND if fits else ES.NOT_FOUND), ([(b.size, b.start, b.end) for b in problem.blocks],
                                                                    capacity)
            if fits:
                offsets = [0] * len(problem.blocks)
                for b, u in zip(blocks, search.solution):
                    offsets[b.index] = 32 * u
                assert valid_within(problem, offsets, capacity)


def test_each_technique_prunes_the_search_tree():
    """Seven blocks whose lower bound (5 units) nothing reaches: proving it takes fewer nodes as the
    techniques are switched on (appendix A6, §1), and the answer never changes."""
    seven = P.problem_from_blocks([(96, 0, 0), (64, 0, 1), (32, 1, 2), (64, 1, 3), (32, 2, 3), (64, 3, 4), (96, 4, 4)])
    on, nodes = set(), []
    for technique in ("canonical", "inference", "floors"):
        search, _ = search_of(seven, on)
        assert search.solve(5) == ES.NOT_FOUND
        nodes.append(search.nodes)
        on.add(technique)
    search, _ = search_of(seven)
    assert search.solve(5) == ES.NOT_FOUND and search.solve(6) == ES.FOUND
    assert nodes == sorted(nodes, reverse=True) and nodes[0] > 10 * nodes[-1]


def test_exact_with_a_capacity_decides_and_says_so():
    """`feasible`: True with a plan within the capacity, False when none exists (proven by the search, or by
    the lower bound without one), None when the budget ran out; the incumbent that fits needs no search."""
    seven = P.problem_from_blocks([(96, 0, 0), (64, 0, 1), (32, 1, 2), (64, 1, 3), (32, 2, 3), (64, 3, 4), (96, 4, 4)])
    proven = P.exact(seven, budget=None, capacity=180)  # 5 units: the search proves nothing fits
    assert (proven.feasible, proven.peak, proven.nodes > 0, proven.stopped) == (False, 192, True, False)
    below = P.exact(seven, budget=None, capacity=100)  # below the lower bound: no search at all
    assert (below.feasible, below.nodes) == (False, 0)
    fits = P.exact(seven, budget=None, capacity=192)  # the greedy incumbent fits already
    assert (fits.feasible, fits.nodes) == (True, 0) and valid_within(seven, fits.offsets, 192)
    rows, capacity, _ = challenging_packing(40, 1, horizon=1000, capacity=1000)
    problem = P.problem_from_intervals(rows)
    assert min(P.greedy_by_size(problem).peak, P.greedy_by_breadth(problem).peak) > capacity  # (1,367 and more)
    found = P.exact(problem, budget=None, capacity=capacity)
    assert found.feasible is True and found.optimal is True and valid_within(problem, found.offsets, capacity)


@pytest.mark.parametrize("make, n, seed", [(perfect_packing, 60, 1), (perfect_packing, 90, 2),
                                           (challenging_packing, 60, 3), (challenging_packing, 48, 4)])
def test_perfect_packings_are_met_at_their_capacity(make, n, seed):
    """Problems cut from a capacity x horizon rectangle (appendix A6's generator): the search meets the
    capacity exactly, with a valid plan, through `run_planner` as `solve` calls it, and `exact` without a
    capacity finds that optimum and proves it (it is the lower bound)."""
    rows, capacity, truth = make(n, seed, horizon=10**9)
    problem = P.problem_from_intervals(rows)
    assert problem.lower_bound == capacity and valid_within(problem, truth, capacity)
    for planner in ("exact", "best"):
        r = P.run_planner(problem, planner, budget=None, capacity=capacity)
        assert r.feasible is True and valid_within(problem, r.offsets, capacity), planner
    r = P.exact(problem, budget=None)
    assert (r.peak, r.optimal) == (capacity, True) and valid_within(problem, r.offsets, capacity)


def test_minimum_above_the_lower_bound_is_found_by_bisection():
    """Without a capacity, `exact` asks for the lower bound, then bisects up to the incumbent: on small
    random problems its peak is brute force's smallest, proven."""
    for problem in random_problems(8, 30, most=6):
        r = P.exact(problem, budget=None)
        best = next(c for c in itertools.count(problem.lower_bound, 32) if brute_force_fits(problem, c))
        assert (r.peak, r.optimal) == (best, True) and P.check_placement(problem, r.offsets) == []


# -- problems given as intervals, over any horizon -----------------------------------------------------------

def test_problem_from_intervals_reads_half_open_lifespans():
    """Rows `(id, lower, upper, size)`: alive from lower up to but not including upper, so two blocks where one
    ends as the other starts do not meet; ids name the blocks; sizes rounded up to the alignment."""
    problem = P.problem_from_intervals([("a", 0, 10, 4), ("b", 10, 20, 4), ("c", 5, 15, 3)], alignment=2)
    a, b, c = problem.blocks
    assert (a.start, a.end, a.size, a.name) == (0, 9, 4, "a") and c.size == 4 and not a.overlaps(b)
    assert (problem.times, problem.profile, problem.lower_bound, problem.lb_step) == ([0, 5, 10, 15, 20], [4, 8, 8, 4],
                                                                                      8, 5)
    r = P.exact(problem, budget=None)
    assert (r.peak, r.optimal) == (8, True)
    assert P.check_placement(problem, [0, 0, 0])[0].startswith("blocks 0 (a; nodes 0..9")


@pytest.mark.parametrize("row, needle", [
    (("x", 5, 5, 8), "row 1: ('x', 5, 5, 8) is not (id, lower, upper, size)"),
    (("x", 6, 5, 8), "row 1"),
    (("x", -1, 5, 8), "row 1"),
    (("x", 0, 5, -8), "row 1"),
    (("x", 0, 5.5, 8), "integers 0 <= lower < upper"),
    (("x", 0, 5), "row 1"),
])
def test_bad_rows_are_refused_by_row(row, needle):
    with pytest.raises(gl.PlannerError, match=__import__("re").escape(needle)):
        P.problem_from_intervals([("ok", 0, 1, 1), row])
    with pytest.raises(gl.PlannerError, match="alignment must be a positive integer"):
        P.problem_from_intervals([("ok", 0, 1, 1)], alignment=0)


def test_the_cost_does_not_grow_with_the_horizon():
    """500 blocks living anywhere in [0, 10^9): the profile has at most 1,000 sections (one per event), the
    lower bound is the brute-force maximum over those events, both greedy planners and the exact search
    plan within them, and the per-node `live` is refused rather than listing a billion numbers."""
    rng = random.Random(4)
    rows = []
    for k in range(500):
        lower = rng.randrange(10**9 - 1)
        rows.append((f"b{k}", lower, rng.randrange(lower + 1, 10**9), rng.randrange(1, 1 << 16)))
    problem = P.problem_from_intervals(rows)
    assert len(problem.profile) == len(problem.times) - 1 <= 1000
    events = sorted({lo for _, lo, _, _ in rows} | {up for _, _, up, _ in rows})
    assert problem.lower_bound == max(sum(z for _, lo, up, z in rows if lo <= t < up) for t in events)
    for planner in (P.greedy_by_size, P.greedy_by_breadth):
        assert P.check_placement(problem, planner(problem).offsets) == []
    with pytest.raises(gl.PlannerError, match="too many to list the bytes alive at each"):
        problem.live  # noqa: B018
    search, _ = search_of(problem, deadline=P.Deadline(None))
    assert len(search.total) <= 1000 and max(search.total) == problem.lower_bound


def test_the_profile_is_the_live_bytes_per_node():
    """For ggml-sized horizons `live` still lists every node, and equals the profile spread over its
    sections; the lower bound and its first node are the same read either way."""
    for problem in random_problems(6, 40, most=12, horizon=15):
        live = problem.live
        assert live == [sum(b.size for b in problem.blocks if b.start <= i <= b.end) for i in range(problem.n_steps)]
        assert (problem.lower_bound, problem.lb_step) == (max(live), live.index(max(live)))


def test_greedy_plans_say_whether_they_fit_a_capacity():
    four = P.problem_from_blocks([(64, 3, 3), (64, 5, 5), (32, 4, 5), (32, 0, 4)])
    assert P.run_planner(four, "greedy-size", capacity=128).feasible is True
    assert P.run_planner(four, "greedy-size", capacity=96).feasible is None  # (exact finds 96: not known here)
    assert P.run_planner(four, "greedy-breadth", capacity=64).feasible is False  # below the lower bound
    plans = P.all_plans(four, capacity=96)
    assert plans["exact"].feasible is True and plans["greedy-size"].feasible is None and plans["best"].peak == 96
