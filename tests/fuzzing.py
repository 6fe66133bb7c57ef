"""The harness the fuzz tests share (tests/fuzz/test_fuzz_*.py): run the command line in-process on one input,
bounded in time, and judge its outcome by the project's promise (DESIGN.md §3, "Untrusted input"):

- exit 2 with a message `error: <GGMLLiteError subclass>: ...` (or argparse's usage error), or
- exit 0 (or 1, where the case allows "a difference") with a result the test then checks;
- never a traceback, never the CLI's last-resort handler ("internal error"), never more than
  `TIME_LIMIT` seconds, never more than `MEMORY_LIMIT_MIB` of new peak memory for one case.

In-process (`ggml_lite.__main__.main`) rather than a subprocess per case: a case costs milliseconds, so
the quick run tries hundreds and `make test-long` thousands. A hang is cut by SIGALRM (a BaseException,
so no `except Exception` in the package can swallow it); memory is the process's peak RSS, which only
rises, so a case that grows memory by gigabytes shows as a jump of the high-water mark.
"""

import contextlib
import io
import re
import resource
import signal
import time
from dataclasses import dataclass

import ggml_lite.errors as errors
from ggml_lite.__main__ import main

TIME_LIMIT = 20.0        # seconds one case may take before it counts as a hang
MEMORY_LIMIT_MIB = 400   # new peak memory one case may add

ERROR_NAMES = {name for name, obj in vars(errors).items()
               if isinstance(obj, type) and issubclass(obj, errors.GGMLLiteError)}
_ERROR_LINE = re.compile(r"^error: (?:(\w+Error): )?")


class Hang(BaseException):
    """Raised by the alarm inside a case that runs past `TIME_LIMIT`."""


@dataclass
class Outcome:
    argv: list
    code: int
    out: str
    err: str
    seconds: float
    grew_mib: float

    def describe(self) -> str:
        return (f"argv {self.argv}: exit {self.code} after {self.seconds:.2f} s (+{self.grew_mib:.0f} MiB peak)\n"
                f"--- stderr ---\n{self.err[-2000:]}\n--- stdout ---\n{self.out[-1000:]}")


def peak_rss_mib() -> float:
    """The process's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_cli(argv: list, time_limit: float = TIME_LIMIT) -> Outcome:
    """Run `python -m ggml_lite ARGV` in this process; its output captured, its time bounded."""

    def on_alarm(signum, frame):
        raise Hang()

    out, err = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, on_alarm)
    before, t0 = peak_rss_mib(), time.perf_counter()
    signal.setitimer(signal.ITIMER_REAL, time_limit)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(a) for a in argv])
            except SystemExit as e:  # argparse's usage errors
                code = e.code if isinstance(e.code, int) else 2
    except Hang:
        raise AssertionError(f"argv {argv}: still running after {time_limit} s (a hang or unbounded work)") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return Outcome(list(argv), code, out.getvalue(), err.getvalue(), time.perf_counter() - t0, peak_rss_mib() - before)


def assert_sound(o: Outcome, allow: tuple = (0, 2)) -> Outcome:
    """The promise: an allowed exit code; exit 2 with a specific message (a ggml_lite error or a usage
    error), never a traceback nor the last-resort handler; bounded memory. Returns the outcome."""
    assert "Traceback (most recent call last)" not in o.err + o.out, o.describe()
    assert "internal error" not in o.err, "the last-resort handler caught it: " + o.describe()
    assert o.grew_mib <= MEMORY_LIMIT_MIB, "memory grew past the limit: " + o.describe()
    assert o.code in allow, o.describe()
    if o.code == 2:
        lines = [line for line in o.err.splitlines() if line.startswith("error:") or ": error: " in line]
        assert lines, "exit 2 without an error message: " + o.describe()
        m = _ERROR_LINE.match(lines[-1])
        if m is not None:  # our own handler (argparse's lines read "usage: ... error: ...")
            assert m.group(1) in ERROR_NAMES, f"not a ggml_lite.errors class: {o.describe()}"
    return o
