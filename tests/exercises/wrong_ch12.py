"""Wrong solutions of chapter 12's implement-exercise (12.2, the chunk `ggml_dyn_tallocr_alloc` of ggml 0.15.3
chooses), each with the rule its grader must name when it rejects it."""

SIZE_MAX = 2**64 - 1


def _choose(chunks, size, *, reset=True, with_last=False, last_rule="reuse", ties_last=False, fit=True):
    """`ggml_dyn_tallocr_alloc`'s choice of a chunk, with one of its rules changed by a flag."""
    best, best_fit_size = -1, SIZE_MAX
    for c, (blocks, _) in enumerate(chunks):
        if reset:
            best_fit_size = SIZE_MAX
        for _, bsize in blocks if with_last else blocks[:-1]:
            if size <= bsize <= best_fit_size:
                best, best_fit_size = c, bsize
    if best != -1:
        return best
    best_reuse = -(2**63)
    for c, (blocks, max_size) in enumerate(chunks):
        if not blocks or (fit and blocks[-1][1] < size):
            continue
        reuse = max_size - blocks[-1][0] - size
        if last_rule == "first":
            return c
        if last_rule == "most room":
            better = reuse > best_reuse
        elif ties_last:
            better = (best_reuse < 0 and reuse >= best_reuse) or 0 <= reuse <= best_reuse
        else:
            better = (best_reuse < 0 and reuse > best_reuse) or 0 <= reuse < best_reuse
        if better:
            best, best_reuse = c, reuse
    return len(chunks) if best == -1 else best


def global_best_fit(chunks, size):
    return _choose(chunks, size, reset=False)


def last_blocks_in_best_fit(chunks, size):
    return _choose(chunks, size, with_last=True)


def first_last_block(chunks, size):  # September 2025's rule
    return _choose(chunks, size, last_rule="first")


def most_room(chunks, size):
    return _choose(chunks, size, last_rule="most room")


def ties_to_the_last(chunks, size):
    return _choose(chunks, size, ties_last=True)


def no_fit_check(chunks, size):
    return _choose(chunks, size, fit=False)


WRONG = {
    "12.2": [
        ("one best fit over all chunks (best_fit_size not reset)", global_best_fit, "chunk by chunk"),
        ("last blocks in the best-fit loop", last_blocks_in_best_fit, "holes first"),
        ("the first chunk whose last block fits (September 2025)", first_last_block, "no growth first"),
        ("the largest reuse_factor", most_room, "least waste"),
        ("ties to the last chunk", ties_to_the_last, "first of equals"),
        ("a last block taken without checking it fits", no_fit_check, "must fit"),
    ],
}
