"""Wrong solutions of chapter 11's implement-exercises (11.2 the peak-live lower bound, 11.3 greedy by size),
each with the rule its grader must name when it rejects it."""


def _peak(blocks, *, alive_to=1, last=False, nodes_extra=1, empty=True):
    """The most bytes alive at a node and the node, with one rule changed by a flag."""
    if not blocks:
        return (0, 0) if empty else (max(), 0)
    live = [sum(s for s, a, e in blocks if a <= i < e + alive_to)
            for i in range(max(e for _, _, e in blocks) + nodes_extra)]
    best = max(live, default=0)
    return best, (len(live) - 1 - live[::-1].index(best) if last else live.index(best)) if live else 0


def exclusive_end(blocks):
    return _peak(blocks, alive_to=0)


def nodes_short_by_one(blocks):  # range(max end): the last node is not counted
    return _peak(blocks, nodes_extra=0)


def last_node_of_the_peak(blocks):
    return _peak(blocks, last=True)


def crashes_without_blocks(blocks):
    return _peak(blocks, empty=False)


def _greedy(blocks, *, key=None, first_fit=False, inclusive=True, top_is_last=False, skip_zero=True):
    """Greedy by size's offsets, with one rule changed by a flag."""
    key = key or (lambda k: (-blocks[k][0], blocks[k][1], k))
    offsets, placed = [0] * len(blocks), []
    for k in sorted((k for k, b in enumerate(blocks) if b[0] or not skip_zero), key=key):
        size, start, end = blocks[k]
        meet = [j for j in placed if (blocks[j][1] <= end and start <= blocks[j][2] if inclusive
                                      else blocks[j][1] < end and start < blocks[j][2])]
        busy = sorted((offsets[j], offsets[j] + blocks[j][0]) for j in meet)
        best, best_gap, top = None, None, 0
        for lo, hi in busy:
            if lo - top >= size and (best_gap is None or (not first_fit and lo - top < best_gap)):
                best, best_gap = top, lo - top
            top = hi if top_is_last else max(top, hi)
        offsets[k] = top if best is None else best
        placed.append(k)
    return offsets


def first_fit(blocks):
    return _greedy(blocks, first_fit=True)


def ties_by_index(blocks):
    return _greedy(blocks, key=lambda k: (-blocks[k][0], k))


def exclusive_ends(blocks):
    return _greedy(blocks, inclusive=False)


def top_of_the_last_gap(blocks):
    return _greedy(blocks, top_is_last=True)


def in_given_order(blocks):
    return _greedy(blocks, key=lambda k: k)


def zero_bytes_placed(blocks):
    return _greedy(blocks, skip_zero=False)


WRONG = {
    "11.2": [
        ("ends exclusive (range(start, end))", exclusive_end, "inclusive end"),
        ("the last node not counted (range(max end))", nodes_short_by_one, "inclusive end"),
        ("the last node reaching the peak", last_node_of_the_peak, "first node"),
        ("max() of nothing when there are no blocks", crashes_without_blocks, "no blocks"),
    ],
    "11.3": [
        ("first fit instead of the smallest gap", first_fit, "smallest gap"),
        ("ties of size by index, not by start", ties_by_index, "ties"),
        ("blocks touching at a node taken as apart", exclusive_ends, "shares a node"),
        ("above the last block met, not the highest", top_of_the_last_gap, "above the highest"),
        ("the blocks in the order given", in_given_order, "largest first"),
        ("blocks of 0 bytes placed too", zero_bytes_placed, "zero bytes"),
    ],
}
