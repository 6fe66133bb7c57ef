"""Run ggml in a forked child: a failed `GGML_ASSERT` aborts the child only and becomes `GGMLAbort`."""

from __future__ import annotations


class GGMLAbort(RuntimeError):
    """The real ggml aborted (a `GGML_ASSERT` failed) in an isolated run; the message has its stderr."""


def run_isolated(fn, *args, timeout: float = 120.0, **kwargs):
    """`fn(*args, **kwargs)` in a forked child process; its (picklable) result comes back through a
    pipe. A `GGML_ASSERT` in ggml aborts only the child and becomes `GGMLAbort` here; an exception in
    the child becomes `GGMLAbort` with its text. POSIX only."""
    import os
    import pickle
    import select
    import signal
    import time

    r_out, w_out = os.pipe()
    r_err, w_err = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: compute, send the pickled result, leave without cleanup
        code = 0
        try:
            os.close(r_out)
            os.close(r_err)
            os.dup2(w_err, 2)
            os.environ["GGML_NO_BACKTRACE"] = "1"  # no gdb backtrace on abort
            payload = pickle.dumps(fn(*args, **kwargs))
            with os.fdopen(w_out, "wb") as f:
                f.write(payload)
        except BaseException as err:
            try:
                os.write(w_err, f"{type(err).__name__}: {err}\n".encode())
            except OSError:
                pass
            code = 3
        os._exit(code)
    os.close(w_out)
    os.close(w_err)
    chunks: dict[int, list[bytes]] = {r_out: [], r_err: []}
    open_fds = set(chunks)
    deadline = time.monotonic() + timeout
    try:
        while open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                raise GGMLAbort(f"{getattr(fn, '__name__', fn)} did not finish within {timeout} s")
            ready, _, _ = select.select(list(open_fds), [], [], left)
            for fd in ready:
                b = os.read(fd, 1 << 20)
                if b:
                    chunks[fd].append(b)
                else:
                    os.close(fd)
                    open_fds.discard(fd)
    finally:
        for fd in open_fds:
            os.close(fd)
        _, status = os.waitpid(pid, 0)
    err_text = b"".join(chunks[r_err]).decode(errors="replace").strip()
    if os.WIFSIGNALED(status) or os.WEXITSTATUS(status) != 0:
        how = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit status {os.WEXITSTATUS(status)}"
        raise GGMLAbort(f"{getattr(fn, '__name__', fn)} failed in the child ({how}): {err_text[-2000:]}")
    return pickle.loads(b"".join(chunks[r_out]))


def run_batch(fn, arg_tuples: list, timeout: float = 600.0) -> list:
    """`[fn(*args) for args in arg_tuples]` in ONE forked child (a process per batch, not per graph).
    Each entry of the result is the value, or a `GGMLAbort` when that call raised. Should ggml abort
    the child (a failed `GGML_ASSERT` kills the whole process), the batch is run again one child per
    call, so the abort is pinned on the call that caused it."""
    def each():
        out = []
        for args in arg_tuples:
            try:
                out.append(fn(*args))
            except Exception as err:
                out.append(GGMLAbort(f"{type(err).__name__}: {err}"))
        return out

    try:
        return run_isolated(each, timeout=timeout)
    except GGMLAbort:
        out = []
        for args in arg_tuples:
            try:
                out.append(run_isolated(fn, *args))
            except GGMLAbort as err:
                out.append(err)
        return out
