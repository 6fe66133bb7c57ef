"""Plausible wrong solutions of chapter 09's implement-exercises (09.2: pass 1's rule for one tensor, 09.3: the
splits of pass 5), each with the rule its grader must name when it rejects it."""

from functools import partial

from ggml_lite.errors import SchedulerError


def pass1(can_use, node, offload_checks_op=True, offload_cpu_only=True, first_weight_only=True, abort=True):
    """`ggml_backend_sched_backend_id_from_cur` with one of its conditions switched off by a flag."""
    n = len(can_use)

    def from_buffer(buft):
        return next((i for i in range(n) if buft in can_use[i] and node.runs[i]), -1)
    for buft in (node.buffer, node.view_src):
        if buft is not None and from_buffer(buft) != -1:
            return from_buffer(buft)
    if abort and (node.buffer is not None or node.view_src is not None):
        raise SchedulerError("pre-allocated tensor in a backend that cannot run the operation")
    if node.is_input:
        return n - 1
    for w in node.weights:
        if w is None:
            continue
        b = from_buffer(w)
        if b == -1 and not first_weight_only:
            continue
        if b == n - 1 or (not offload_cpu_only and b > 0):
            for k in range(b):
                if (node.runs[k] or not offload_checks_op) and node.offloads[k]:
                    return k
        return b
    return -1


def splits(nodes, max_inputs=10, late=False, skip_views=True, usable=True, copy_once=True, weight_split=True,
           full_split=True, full_counts_copied=False, full_checks_usable=True):
    """Pass 5's splits with one of its conditions changed by a flag."""
    copied, out = set(), []
    first = next((n for n in nodes if not n.view or not skip_views), None)
    split = [first.backend if first is not None else -1, 0, len(nodes), []]
    out.append(split)
    for i, node in enumerate(nodes):
        if node.view and skip_views:
            continue
        cur = split[0]
        new = node.backend != cur
        if not new and split[3]:
            for s in node.srcs:
                if weight_split and s.weight and s.backend != cur:
                    new = True
                    break
                if full_split and len(split[3]) == max_inputs and s.backend != cur and \
                        (cur not in s.usable or not full_checks_usable) and \
                        ((s.name, cur) not in copied or full_counts_copied):
                    new = True
                    break
        if new:
            at = i + 1 if late and node.backend != cur else i
            split[2] = at
            split = [node.backend, at, len(nodes), []]
            out.append(split)
            if not copy_once:  # each split remembers only its own copies
                copied = set()
        for s in node.srcs:
            b = split[0]
            if s.backend != b and (b not in s.usable or not usable) and (s.name, b) not in copied:
                if len(split[3]) >= max_inputs:
                    raise SchedulerError("too many inputs")
                copied.add((s.name, b))
                split[3].append(s.name)
    return [(b, i0, i1, tuple(ins)) for b, i0, i1, ins in out]


WRONG = {
    "09.2": [
        ("offload to a backend that cannot run the op", partial(pass1, offload_checks_op=False), "offload"),
        ("offload a weight that is not on the CPU", partial(pass1, offload_cpu_only=False), "offload"),
        ("skip a weight no backend can run, try the next", partial(pass1, first_weight_only=False),
         "first weight only"),
        ("move a pre-allocated tensor instead of aborting", partial(pass1, abort=False), "pre-allocated"),
    ],
    "09.3": [
        ("the node that changes backend ends the old split (off by one)", partial(splits, late=True),
         "backend change"),
        ("views start splits like other nodes", partial(splits, skip_views=False), "views skipped"),
        ("copy every source on another backend, usable or not", partial(splits, usable=False), "copy needed"),
        ("copy a tensor again in each split that reads it", partial(splits, copy_once=False), "copy once"),
        ("no new split for a weight of another backend", partial(splits, weight_split=False), "weight split"),
        ("no new split when the inputs are full", partial(splits, full_split=False), "inputs full"),
        ("a full split also counts tensors already copied", partial(splits, full_counts_copied=True), "inputs full"),
        ("a full split ends before a source the backend can use", partial(splits, full_checks_usable=False),
         "inputs full"),
    ],
}
