"""Plausible wrong solutions of chapter 05's implement-exercises (the in-place decision of
`ggml_gallocr_allocate_node`, 05.2, and `ggml_gallocr_node_needs_realloc`, 05.3), each with the rule its grader
must reject it by."""


def _inplace(slot_0_only=False, last=False, views=True, output=True, children=True):
    """An inplace_parent with one of the C's tests left out or its loop changed."""
    def inplace_parent(can_inplace, parents):
        if not can_inplace:
            return None
        found = None
        for i, p in enumerate(parents[:1] if slot_0_only else parents):
            if p is None or not p.own or (output and p.output) or not p.same_layout:
                continue
            if (p.n_children == 1 or not children) and (p.n_views == 0 or not views):
                found = i
                if not last:
                    return i
        return found
    return inplace_parent


def _needs_realloc(literal=False, strict=False, views=True, unplaced_fits=False):
    """A node_needs_realloc with one mistake."""
    def node_needs_realloc(data, view_src, alloc_size, talloc):
        node_size = 0 if views and (data is not None or view_src is not None) else alloc_size
        if talloc.buffer_id == -1 and node_size:
            return unplaced_fits
        if literal:
            return talloc.size_max < node_size  # "needs realloc" read as the name says
        return talloc.size_max > node_size if strict else talloc.size_max >= node_size
    return node_needs_realloc


WRONG = {
    "05.2": [
        ("the last passing source instead of the first", _inplace(last=True), "first wins"),
        ("only src[0] looked at", _inplace(slot_0_only=True), "any slot"),
        ("n_views not tested", _inplace(views=False), "views"),
        ("OUTPUT sources overwritten", _inplace(output=False), "output"),
        ("n_children not tested", _inplace(children=False), "last user"),
    ],
    "05.3": [
        ("True when the tensor outgrew its slot (the name read literally)", _needs_realloc(literal=True), "fits"),
        ("> instead of >=", _needs_realloc(strict=True), "equal fits"),
        ("a view or pre-allocated tensor compared by its size", _needs_realloc(views=False), "view or data"),
        ("a slot the plan did not place taken as fine", _needs_realloc(unplaced_fits=True), "not placed"),
    ],
}
