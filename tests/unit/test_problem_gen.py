"""Appendix A6's problems whose optimum is known (`ggml_lite.problem_gen`): the rows are a perfect packing
of the capacity x horizon rectangle, checked here without the package's planners: every block inside the
rectangle, the witness offsets overlap nowhere, the bytes alive are the capacity at every step (so the
lower bound, and the optimum, is the capacity). Seeded and reproducible; bad arguments are refused."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ggml_lite.errors import PlannerError
from ggml_lite.problem_gen import challenging_packing, challenging_problem, perfect_packing, perfect_problem
from placements import alive, conflicts

PACKINGS = {"perfect": perfect_packing, "challenging": challenging_packing}


def check_perfect(rows, capacity, offsets, n, horizon):
    assert len(rows) == len(offsets) == n
    assert [r[0] for r in rows] == list(range(n))
    assert all(0 <= lo < up <= horizon and size >= 1 for _, lo, up, size in rows)
    assert all(0 <= o and o + r[3] <= capacity for r, o in zip(rows, offsets))
    assert not conflicts(rows, offsets)
    steps = alive(rows)
    assert steps[0][0] == 0 and steps[-1] == (horizon, 0)
    assert all(total == capacity for _, total in steps[:-1])  # full at every step: the lower bound is the capacity


@pytest.mark.parametrize("kind", PACKINGS)
@pytest.mark.parametrize("n", [1, 2, 3, 50, 150])
def test_the_rows_pack_the_rectangle_exactly(kind, n):
    for seed in range(3):
        rows, capacity, offsets = PACKINGS[kind](n, seed)
        check_perfect(rows, capacity, offsets, n, 10**6)
        assert 1 << 20 <= capacity < 1 << 24  # drawn from the seed


@settings(max_examples=60, derandomize=True, deadline=None, database=None)
@given(kind=st.sampled_from(sorted(PACKINGS)), n=st.integers(1, 40), seed=st.integers(0, 10**6),
       horizon=st.integers(40, 400), capacity=st.integers(1, 300), width=st.integers(1, 12))
def test_small_rectangles_of_any_shape(kind, n, seed, horizon, capacity, width):
    if n > capacity * horizon:
        return
    extra = {"width": width} if kind == "challenging" else {}
    rows, got, offsets = PACKINGS[kind](n, seed, horizon=horizon, capacity=capacity, **extra)
    assert got == capacity
    check_perfect(rows, capacity, offsets, n, horizon)


def test_reproducible_and_seed_dependent():
    assert perfect_problem(100, 7) == perfect_problem(100, 7)
    assert challenging_problem(100, 7) == challenging_problem(100, 7)
    assert perfect_problem(100, 7) != perfect_problem(100, 8)
    assert challenging_problem(100, 7)[0] != perfect_problem(100, 7)[0]
    rows, capacity, offsets = challenging_packing(100, 7)
    assert (rows, capacity) == challenging_problem(100, 7)


def test_a_wall_keeps_many_blocks_alive_at_once():
    """The challenging kind: about `width` blocks alive at every step (the guillotine's nest fewer)."""
    rows, capacity = challenging_problem(600, 3, width=60)
    events = sorted([(lo, 1) for _, lo, _, _ in rows] + [(up, -1) for _, _, up, _ in rows])
    count, most = 0, 0
    for _, d in events:  # (ends sort before starts at the same time: half-open lifespans)
        count += d
        most = max(most, count)
    assert 50 <= most <= 80
    assert len({size for *_, size in rows}) > 500  # mixed sizes


def test_the_smallest_rectangle_that_holds_the_blocks():
    rows, capacity, offsets = perfect_packing(6, 0, horizon=3, capacity=2)
    check_perfect(rows, 2, offsets, 6, 3)
    assert sorted(r[3] for r in rows) == [1] * 6


@pytest.mark.parametrize("call, field", [
    (lambda: perfect_problem(0, 1), "n_blocks"), (lambda: perfect_problem(True, 1), "n_blocks"),
    (lambda: perfect_problem(2.0, 1), "n_blocks"),  # type: ignore[arg-type]  # (refused: what is tested)
    (lambda: perfect_problem(10**6 + 1, 1), "n_blocks"),
    (lambda: perfect_problem(5, 1, horizon=0), "horizon"), (lambda: perfect_problem(5, 1, capacity=-3), "capacity"),
    (lambda: perfect_problem(7, 1, horizon=2, capacity=3), "n_blocks"),
    (lambda: challenging_problem(7, 1, horizon=6), "horizon"), (lambda: challenging_problem(7, 1, width=0), "width"),
    (lambda: challenging_problem("7", 1), "n_blocks"),  # type: ignore[arg-type]  # (refused: what is tested)
])
def test_bad_arguments_are_refused_by_name(call, field):
    with pytest.raises(PlannerError, match=f"^{field}: "):
        call()
