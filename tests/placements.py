"""Checks of a placement of MiniMalloc-style rows `(id, lower, upper, size)` (lifespans half-open) that the
problem-file tests share, written without the package's planners so that they can catch the planners'
mistakes: pairwise overlaps, and the bytes alive at each event time."""


def conflicts(rows, offsets) -> list:
    """Pairs (j, i) of rows alive at a common step whose bytes overlap (pairwise, O(n^2): small problems)."""
    out = []
    for i, (_, lo1, up1, s1) in enumerate(rows):
        for j in range(i):
            _, lo2, up2, s2 = rows[j]
            if lo1 < up2 and lo2 < up1 and offsets[i] < offsets[j] + s2 and offsets[j] < offsets[i] + s1:
                out.append((j, i))
    return out


def alive(rows) -> list:
    """(time, bytes alive from then on) at each distinct event time, in time order."""
    change: dict = {}
    for _, lo, up, size in rows:
        change[lo] = change.get(lo, 0) + size
        change[up] = change.get(up, 0) - size
    total, out = 0, []
    for t in sorted(change):
        total += change[t]
        out.append((t, total))
    return out
