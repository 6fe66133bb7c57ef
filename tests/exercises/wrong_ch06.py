"""Plausible wrong solutions of chapter 06's implement-exercise (the calls `ggml_backend_tensor_copy` makes on
its two buffers, 06.2), each with the rule its grader must reject it by."""

from ggml_lite.errors import LayoutMismatchError


def _copy(dst_first=False, cpy_first=False, no_cpy=False, declined_done=False, self_copy=False, layout=True):
    """A tensor_copy_calls with one mistake."""
    def tensor_copy_calls(same_layout, same_tensor, src_host, dst_host, dst_copies):
        if layout and not same_layout:
            raise LayoutMismatchError("different layouts")
        if same_tensor and not self_copy:
            return []
        calls = []
        if cpy_first:
            calls.append("dst.cpy_tensor")
            if dst_copies:
                return calls
        if dst_first and dst_host:
            return calls + ["src.get_tensor"]
        if src_host:
            return calls + ["dst.set_tensor"]
        if dst_host:
            return calls + ["src.get_tensor"]
        if no_cpy:
            return ["src.get_tensor", "dst.set_tensor"]
        if not cpy_first:
            calls.append("dst.cpy_tensor")
        if dst_copies or declined_done:
            return calls
        return calls + ["src.get_tensor", "dst.set_tensor"]
    return tensor_copy_calls


WRONG = {
    "06.2": [
        ("the destination tested for host memory first", _copy(dst_first=True), "host source"),
        ("cpy_tensor asked before the host tests", _copy(cpy_first=True), "host source"),
        ("no cpy_tensor asked: the slow copy at once", _copy(no_cpy=True), "device copy"),
        ("a declined cpy_tensor taken as done", _copy(declined_done=True), "slow copy"),
        ("a tensor copied onto itself", _copy(self_copy=True), "same tensor"),
        ("layouts not compared", _copy(layout=False), "layout"),
    ],
}
