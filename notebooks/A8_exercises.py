# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # A8 · Exercises: how your answers are graded (spoilers for chapters 02–04)
#
# Every chapter from 02 to 12 ends with exercises of three kinds:
#
# - **predict**: commit to a number or a choice before the code shows it, with `answer("04.1", 96)`;
# - **implement**: write one C function of ggml in Python, then `check("04.2", best_fit)` runs it on the
#   chapter's cases, on cases taken from the recorded runs of the real ggml and on random ones, against
#   this project's port (which equals ggml on every recorded and random check of `make test`);
# - **explore**: an open question whose worked answer is folded away under the question.
#
# This appendix is the grader's own code, then, chapter by chapter, each chapter's cases and the
# reference solutions. **It holds the solutions**: come here after trying, not before. Chapters 05–08's
# exercises are graded and solved in A9, chapters 09–12's in A10.
#
# **Learning goals**
#
# 1. What a grader does with your function: every case run on a copy of its arguments, the answers compared
#    with the port's, the smallest disagreeing case shown with the rule it exercises, never the solution (§1).
# 2. How a prediction is judged and where your progress is kept (§1).
# 3. How a chapter's cases are built so that a plausible wrong solution fails on a small case that names
#    the rule it breaks (§2 onwards, one section per chapter).
#
# Exported: `ggml_lite.exercises` (§1) and `ggml_lite.graders.chNN` for chapters 02–04 (one section each).

# %%
# | default_exp exercises

# %% [markdown]
# ## 1 · The grader
#
# An exercise is a small record: its id (`"04.2"`: chapter 04, exercise 2), its kind, a title, the minutes
# it should take and a level. A **predict** exercise also holds how to compute its answer with the port
# (never a number typed in) and the reasoning shown after an answer. An **implement** exercise holds the
# name of the function you write, the C function it ports, the port itself wrapped to the stub's
# signature, the cases, and the *rules*: each case exercises one rule of the C, and the rule's text is the
# hint shown when that case fails.
#
# A grader's cases are a **case list**, each with the rule it tests, where it comes from (`chapter`,
# `fixture NAME`, `random`) and a size; the smallest failing case is the one shown, because a small case is
# one a learner can trace by hand.

# %%
# | export
"""The course's exercises (appendix A8; not a port of C): predict, implement and explore exercises, the
grader that runs a learner's function on a chapter's cases against the port and shows the smallest case
where they disagree, and the local record of what is done (`python -m ggml_lite exercises`)."""

import collections
import copy
import datetime
import importlib
import importlib.util
import inspect
import itertools
import json
import os
import pkgutil
import re
import reprlib
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ggml_lite.errors import ExerciseError

KINDS = ("predict", "implement", "explore")
LEVELS = ("easy", "medium", "hard")
ID = re.compile(r"^(\d\d)\.(\d{1,2})\Z")


@dataclass(frozen=True, kw_only=True)
class Exercise:
    """One exercise at the end of a chapter: `id` is "CC.N" (chapter CC, exercise N)."""
    id: str
    kind: str
    title: str
    minutes: int
    level: str

    @property
    def chapter(self) -> str:
        return self.id.split(".")[0]

    @property
    def number(self) -> int:
        return int(self.id.split(".")[1])


def _plain(x: Any) -> Any:
    """A numpy value as Python's own: an array as a list, a numpy scalar as a bool, int or float."""
    return x.tolist() if type(x).__module__ == "numpy" and hasattr(x, "tolist") else x


def _same(a: Any, b: Any) -> bool:
    """Answers compare as numbers when both are numbers (96 == 96.0), as words ignoring case and the
    spaces around them when both are text, and by equality otherwise (tuples and lists alike, item by
    item); numpy values compare as the Python values they hold."""
    a, b = _plain(a), _plain(b)
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, str) and isinstance(b, str):
        return a.strip().lower() == b.strip().lower()
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b

# %% [markdown]
# The three kinds, a case, and a chapter:

# %%
# | export
@dataclass(frozen=True, kw_only=True)
class Predict(Exercise):
    """Commit to a value before the code shows it. `expected()` computes it with the port; `reasoning` is
    shown after any answer ("{expected}" in it is replaced by the value); `choices`, when given, are the
    only answers accepted; `same(answer, expected)` compares them."""
    kind: str = "predict"
    expected: Callable[[], Any]
    reasoning: str
    choices: tuple = ()
    same: Callable[[Any, Any], bool] = _same


@dataclass(frozen=True)
class Case:
    """One call of the learner's function: `args`, the rule it exercises (a key of the exercise's `rules`),
    where it comes from ("chapter", "fixture NAME" or "random") and its size (smaller is shown first)."""
    args: tuple
    rule: str
    source: str = "chapter"
    size: int = 0


@dataclass(frozen=True, kw_only=True)
class Implement(Exercise):
    """Write `function` (the stub's name), a port of the C function `c_name`. The grader calls it and
    `reference` (the port, with the stub's signature) on every case of `cases()`; `rules` maps a rule's
    name to the hint shown when a case of that rule fails; `same(expected, got)` compares two results;
    `against` names what the port stands for in the messages ("ggml", or e.g. "the simulator")."""
    kind: str = "implement"
    function: str
    c_name: str
    reference: Callable
    cases: Callable[[], Iterable[Case]]
    rules: dict
    same: Callable[[Any, Any], bool] = _same
    against: str = "ggml"


@dataclass(frozen=True, kw_only=True)
class Explore(Exercise):
    """An open question; its worked answer is folded under it in the chapter. `done(id)` records it."""
    kind: str = "explore"


@dataclass(frozen=True)
class Chapter:
    """A chapter with exercises: its number ("04"), title and notebook stem."""
    number: str
    title: str
    notebook: str

# %% [markdown]
# Exercises live in a registry filled by the chapters' grader modules, `ggml_lite.graders.ch02` to `ch12`.
# `exercise("04.2")` imports chapter 04's module the first time it is asked for (a plugin registry: the
# grader core never names a chapter, so a chapter's exercises can be added without touching it), and
# `catalog()` imports them all. `register` refuses an exercise that breaks the record's own rules, so a
# mistake in a chapter's grader module fails when the module loads, not when a learner runs it.

# %%
# | export
REGISTRY: dict[str, Exercise] = {}
CHAPTERS: dict[str, Chapter] = {}


def register(*items: Exercise | Chapter) -> None:
    """Add a chapter's exercises (and the chapter itself) to the registry, checking each record."""
    for ex in items:
        if isinstance(ex, Chapter):
            CHAPTERS[ex.number] = ex
            continue
        problems = [what for what, bad in (
            ("id", not ID.match(ex.id)), ("kind", ex.kind not in KINDS), ("level", ex.level not in LEVELS),
            ("minutes", not (isinstance(ex.minutes, int) and 1 <= ex.minutes <= 120)),
            ("rules", isinstance(ex, Implement) and not ex.rules)) if bad]
        if problems:
            raise ExerciseError(f"exercise {ex.id!r}: bad {', '.join(problems)}")
        old = REGISTRY.get(ex.id)
        if old is not None and (old.kind, old.title) != (ex.kind, ex.title):
            raise ExerciseError(f"exercise {ex.id!r} is registered twice: {old.title!r} and {ex.title!r}")
        REGISTRY[ex.id] = ex  # (the same exercise again, as when a notebook's cell runs again: replaced)


def exercise(exercise_id: str) -> Exercise:
    """The exercise `exercise_id` ("04.2"), its chapter's grader module imported on first use."""
    m = ID.match(exercise_id) if isinstance(exercise_id, str) else None
    if m is None:
        raise ExerciseError(f"exercise id {exercise_id!r}: expected 'CC.N', e.g. '04.2'")
    module = f"ggml_lite.graders.ch{m.group(1)}"
    if exercise_id not in REGISTRY and importlib.util.find_spec(module) is not None:
        importlib.import_module(module)  # (a chapter without exercises has no module; a broken one raises)
    if exercise_id not in REGISTRY:
        raise ExerciseError(f"exercise {exercise_id!r} does not exist (python -m ggml_lite exercises lists them)")
    return REGISTRY[exercise_id]


def catalog() -> list[Exercise]:
    """Every exercise of every chapter, in reading order."""
    import ggml_lite.graders as graders

    for mod in pkgutil.iter_modules(graders.__path__):
        importlib.import_module(f"ggml_lite.graders.{mod.name}")
    return sorted(REGISTRY.values(), key=lambda ex: (ex.chapter, ex.number))

# %% [markdown]
# **Your progress** is a small JSON file on this machine: `~/.ggml_lite/progress.json`, or the file
# `GGML_LITE_PROGRESS` names. A right prediction, a passing check or `done(id)` adds the exercise with the
# time. Nothing leaves the machine. The file is read like any input: a record that is not what `record`
# writes is refused with the field named, never half-trusted, and the notebooks' calls only warn about it
# so that a broken record never stops a chapter.

# %%
# | export
PROGRESS_VERSION = 1
MAX_PROGRESS_BYTES = 1 << 20


def progress_path() -> Path:
    """Where progress is kept: $GGML_LITE_PROGRESS, else ~/.ggml_lite/progress.json."""
    env = os.environ.get("GGML_LITE_PROGRESS")
    return Path(env) if env else Path.home() / ".ggml_lite" / "progress.json"


def read_progress(path: Path | None = None) -> dict[str, str]:
    """{exercise id: when it was done (ISO 8601)}; {} when there is no record yet."""
    path = progress_path() if path is None else Path(path)
    try:
        if path.stat().st_size > MAX_PROGRESS_BYTES:
            raise ExerciseError(f"{path}: larger than {MAX_PROGRESS_BYTES} bytes, not a progress record")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as e:
        raise ExerciseError(f"{path}: cannot be read ({e})") from None
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ExerciseError(f"{path}: not JSON ({e})") from None
    except RecursionError:
        raise ExerciseError(f"{path}: nested too deeply to be a progress record") from None
    if not isinstance(doc, dict):
        raise ExerciseError(f"{path}: expected an object with 'version' and 'done'")
    if type(doc.get("version")) is not int or doc["version"] != PROGRESS_VERSION:
        raise ExerciseError(f"{path}: version: expected {PROGRESS_VERSION}, found {doc.get('version')!r}")
    done = doc.get("done")
    if not isinstance(done, dict):
        raise ExerciseError(f"{path}: done: expected an object {{exercise id: time}}")
    for key, when in done.items():
        if not ID.match(key):
            raise ExerciseError(f"{path}: done: {key[:40]!r} is not an exercise id")
        if not isinstance(when, str) or len(when) > 40:
            raise ExerciseError(f"{path}: done.{key}: expected the time as text")
    return dict(done)


def record(exercise_id: str, path: Path | None = None) -> bool:
    """Add `exercise_id` to the record (written whole, then renamed into place); False, with a warning
    printed, when the record cannot be read or written: a chapter never stops over it."""
    path = progress_path() if path is None else Path(path)
    try:
        done = read_progress(path)
        done.setdefault(exercise_id, datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({"version": PROGRESS_VERSION, "done": done}, indent=1, sort_keys=True))
        tmp.replace(path)
        return True
    except (ExerciseError, OSError) as e:
        print(f"(progress not recorded: {e})")
        return False

# %% [markdown]
# **A prediction** is compared with the port's value; the answer is told right or wrong, then the reasoning
# is shown either way. `...` (the placeholder in every chapter's answer cell) means "not answered yet".

# %%
# | export
@dataclass(frozen=True)
class Answered:
    """What `answer` found: true when the prediction was right. Its message is printed already, so a
    notebook shows nothing more for it (`_ipython_display_`)."""
    exercise_id: str
    right: bool
    answered: bool

    def __bool__(self) -> bool:
        return self.right

    def _ipython_display_(self) -> None:
        """Nothing: `answer` has printed the message."""


def answer(exercise_id: str, value: Any, record_done: bool = True) -> Answered:
    """Judge a prediction: print right or wrong, then why; true when right (and then recorded as done)."""
    ex = exercise(exercise_id)
    if not isinstance(ex, Predict):
        raise ExerciseError(f"exercise {exercise_id} is an {ex.kind} exercise: answer() takes predictions")
    if value is Ellipsis:
        print(f"{ex.id} · {ex.title}: not answered yet. Replace ... with your prediction and run the cell.")
        return Answered(ex.id, False, False)
    if ex.choices and not any(_same(value, c) for c in ex.choices):
        print(f"{ex.id}: {value!r} is not one of the choices: {', '.join(map(repr, ex.choices))}.")
        return Answered(ex.id, False, False)
    expected = ex.expected()
    try:
        right = ex.same(value, expected)
    except Exception:  # (an answer that cannot even be compared is not the answer)
        right = False
    print(f"{ex.id} · {ex.title}: " + ("right." if right else f"not quite: you said {value!r}."))
    print("Why: " + ex.reasoning.replace("{expected}", repr(expected)))
    if right and record_done:
        record(ex.id)
    return Answered(ex.id, bool(right), True)


def done(exercise_id: str) -> None:
    """Record an exercise as done by hand (an explore exercise, once you have your answer)."""
    ex = exercise(exercise_id)
    if record(ex.id):
        print(f"{ex.id} · {ex.title}: recorded as done.")

# %% [markdown]
# **A check** runs your function and the port on every case, each on its own deep copy of the arguments,
# so that a function that changes a list it was given cannot change the next call's. A result is the
# returned value, or the class of the error raised: where the port refuses a case (ggml aborts), yours must
# raise an error of the same class (or a subclass) to agree. Your function gets 5 s per case (where the
# notebook's main thread can set an alarm), so an endless loop ends in a message, not a stuck kernel: the
# first case that runs out of time is the one shown, and no further case is run.
#
# Your function raising `NotImplementedError` on the first case means the stub is untouched: "not done
# yet", no error. Otherwise every case runs, and the smallest disagreeing one is printed: the call, ggml's
# result and yours, and the rule the case exercises. A small case can exercise more than one rule, so when
# cases of several rules fail, the share of each rule's cases that failed is printed too: a mistake fails
# nearly every case of its own rule and only some of the others. The reference's code is never shown.
# Results compare as values: a list and a tuple with the same items are equal, and a numpy array or scalar
# is compared as the Python list or number it holds.

# %%
# | export
CASE_SECONDS = 5


@dataclass(frozen=True)
class Raised:
    """A call that raised: the error's class (what is compared) and its message (what is shown)."""
    error: type
    message: str

    def __repr__(self) -> str:
        if self.error is _Timeout:
            return self.message
        return f"raises {self.error.__name__}" + (f" ({self.message[:80]})" if self.message else "")


class _Timeout(BaseException):
    """A call of the learner's function that ran past CASE_SECONDS (a BaseException, so that a learner's
    `except Exception:` cannot swallow it)."""


def _alarm(signum, frame):
    raise _Timeout


def _call(fn: Callable, args: tuple, seconds: int = 0) -> Any:
    """fn(*deep copy of args), or Raised(...); with `seconds`, an alarm ends a call that runs too long."""
    use_alarm = seconds and hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()
    if use_alarm:
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return fn(*copy.deepcopy(args))
    except _Timeout:
        return Raised(_Timeout, f"still running after {seconds} s: stopped, and no further case was run")
    except Exception as e:  # (the learner's error is a result to compare)
        return Raised(type(e), str(e))
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)


def _agree(ex: Implement, expected: Any, got: Any) -> bool:
    if isinstance(expected, Raised):
        return isinstance(got, Raised) and issubclass(got.error, expected.error)
    if isinstance(got, Raised):
        return False
    try:
        return bool(ex.same(expected, got))
    except Exception:  # (a result that cannot even be compared with ggml's disagrees with it)
        return False

# %%
# | export
@dataclass
class Verdict:
    """What `check` found: passed, not started (the stub untouched), or the smallest failing case."""
    exercise_id: str
    passed: bool
    started: bool
    cases: int = 0
    failures: int = 0
    case: Case | None = None
    expected: Any = None
    got: Any = None
    message: str = ""
    seconds: float = 0.0

    def __bool__(self) -> bool:
        return self.passed

    def _ipython_display_(self) -> None:
        """Nothing: `check` has printed the message."""

    @property
    def rule(self) -> str | None:
        return self.case.rule if self.case is not None else None


_SHORT = reprlib.Repr()
_SHORT.maxlist = _SHORT.maxtuple = 12
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 160, 300, 60


def _show(value: Any) -> str:
    """A value as the messages show it: long lists cut, with their length (a 256-block free list is one line)."""
    text = _SHORT.repr(value)
    return f"{text} ({len(value)} items)" if isinstance(value, list | tuple) and len(value) > 12 else text


def _call_text(ex: Implement, fn: Callable, case: Case) -> str:
    try:
        names = list(itertools.takewhile(lambda name: name, (
            p.name if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) else ""
            for p in inspect.signature(fn).parameters.values())))
    except (TypeError, ValueError):
        names = []
    parts = [f"{n}={_show(a)}" if n else _show(a) for n, a in zip(names + [""] * len(case.args), case.args)]
    return f"{ex.function}({', '.join(parts)})"


def _failure(ex: Implement, fn: Callable, cases: list[Case], bad: list, stopped: Raised | None) -> str:
    """The message for a check that failed: the smallest disagreeing case, what ggml and the learner gave,
    its rule; where other rules' cases failed as well, the share of each (the mistake is often where the
    share is largest); and a case that ran out of time, if one did."""
    case, expected, got = bad[0]
    lines = [f"{ex.id} · {ex.title}: {len(bad)} of {len(cases)} cases disagree with {ex.against}. "
             f"The smallest ({case.source}):",
             f"    {_call_text(ex, fn, case)}",
             f"    {ex.against}: {_show(expected)}",
             f"    yours: {_show(got)}",
             f"    rule: {case.rule}: {ex.rules.get(case.rule, '')}"]
    failing = collections.Counter(c.rule for c, _, _ in bad)
    if len(failing) > 1:
        total = collections.Counter(c.rule for c in cases)
        worst = sorted(failing, key=lambda r: (-failing[r] / total[r], r))[:4]
        lines.append("    failing cases by rule: " + ", ".join(f"{r} {failing[r]} of {total[r]}" for r in worst))
    if stopped is not None:
        lines.append(f"    (stopped: on a case of rule {bad[-1][0].rule}, yours was {stopped!r})")
    return "\n".join(lines)


SOURCES = {"chapter": "from the chapter", "fixture": "from recorded runs of ggml", "random": "random"}


def _where(cases: list[Case]) -> str:
    """'k from the chapter, m from recorded runs of ggml, r random': the cases counted by where they come from."""
    counts = collections.Counter(c.source.split()[0] for c in cases)
    return ", ".join(f"{counts[k]} {SOURCES[k]}" for k in SOURCES if counts[k])

# %%
# | export
def check(exercise_id: str, fn: Callable, record_done: bool = True, quiet: bool = False) -> Verdict:
    """Grade `fn` against the port on every case of an implement exercise; print and return the verdict."""
    ex = exercise(exercise_id)
    if not isinstance(ex, Implement):
        raise ExerciseError(f"exercise {exercise_id} is a {ex.kind} exercise: check() grades implementations")
    if not callable(fn):
        raise ExerciseError(f"check({exercise_id!r}, ...): expected your function {ex.function}, got {fn!r}")
    t0 = time.perf_counter()
    cases = sorted(ex.cases(), key=lambda c: c.size)
    head = f"{ex.id} · {ex.title}"
    first = _call(fn, cases[0].args, CASE_SECONDS)
    if isinstance(first, Raised) and first.error is NotImplementedError:
        v = Verdict(ex.id, False, False, len(cases), message=f"{head}: not done yet. Write {ex.function} "
                    "above (replace its `raise NotImplementedError`), then run the cell again.")
    else:
        bad, stopped = [], None
        for i, case in enumerate(cases):
            got = first if i == 0 else _call(fn, case.args, CASE_SECONDS)
            expected = _call(ex.reference, case.args)
            if not _agree(ex, expected, got):
                bad.append((case, expected, got))
            if isinstance(got, Raised) and got.error is _Timeout:
                stopped = got
                break  # (an endless loop would take every case's seconds: no further case is run)
        if not bad:
            v = Verdict(ex.id, True, True, len(cases), message=f"{head}: passed. Your {ex.function} agrees with "
                        f"{ex.against} on all {len(cases)} cases ({_where(cases)}).")
            if record_done:
                record(ex.id)
        else:
            case, expected, got = bad[0]
            v = Verdict(ex.id, False, True, len(cases), len(bad), case, expected, got,
                        _failure(ex, fn, cases, bad, stopped))
    v.seconds = time.perf_counter() - t0
    if not quiet:
        print(v.message)
    return v

# %% [markdown]
# ### The grader on a toy exercise
#
# A made-up exercise shows every answer the grader gives: a stub, a wrong function and a right one. Its
# rules are two: round up to the alignment, and leave an aligned offset alone. The wrong function always
# adds a whole alignment, so the smallest failing case is the smallest aligned one, offset 0, which the
# grader reports with the rule it breaks. (It is registered with a chapter number no chapter uses.)

# %%
from ggml_lite.exercises import Case, Implement, check, register  # noqa: E402


def _toy_cases():
    yield Case((0, 32), "aligned stays", size=0)
    yield Case((64, 32), "aligned stays", size=2)
    yield from (Case((n, 32), "round up", "random", size=n) for n in (1, 31, 33, 100))


register(Implement(id="99.1", title="round up (a toy)", minutes=1, level="easy", function="round_up",
                   c_name="GGML_PAD", reference=lambda n, a: (n + a - 1) // a * a, cases=_toy_cases,
                   rules={"round up": "an offset that is not a multiple goes up to the next multiple",
                          "aligned stays": "a multiple of the alignment is returned unchanged"}))


def round_up(n, a):
    raise NotImplementedError


stub = check("99.1", round_up, record_done=False)
wrong = check("99.1", lambda n, a: n + a - n % a, record_done=False)
right = check("99.1", lambda n, a: -(-n // a) * a, record_done=False)
assert (stub.started, wrong.passed, wrong.rule, right.passed) == (False, False, "aligned stays", True)

# %% [markdown]
# ## 2 · Chapter 02: aligned offsets
#
# Four exercises. 02.1 and 02.2 ask for an offset, computed here with the chapter's own `aligned_offset`
# and `GGML_PAD`. 02.3 asks for `aligned_offset` itself, and its cases are ordered so that each plausible
# mistake first fails on a case of its own rule:
#
# | mistake | smallest failing case | rule |
# |---|---|---|
# | rounding the offset, ignoring the buffer's address | a base 4 bytes past a boundary | address |
# | always adding `alignment - offset % alignment` | offset 0 | aligned stays |
# | rounding down | offset 1 | round up |
# | no power-of-two check | alignment 24 | power of two |
#
# The size of a case counts an address that is not NULL as 10,000 and a bad alignment as 10⁶, so a
# NULL-buffer case, the simplest to trace, is shown whenever one fails.

# %%
# | export graders.ch02
"""Chapter 02's exercises (appendix A8): aligned offsets, graded with `ggml_lite.align`."""

import random

from ggml_lite import align
from ggml_lite.exercises import Case, Chapter, Explore, Implement, Predict, register

ALIGNED_OFFSET_RULES = {
    "address": "the address buffer + offset is aligned, not the offset alone: a base that is not on a "
               "boundary moves every offset with it",
    "aligned stays": "an address already on a boundary is returned unchanged (the outer % alignment)",
    "round up": "an address between two boundaries goes up to the next one, never down",
    "power of two": "an alignment that is not a power of two is refused (the C asserts it; here "
                    "AlignmentError)",
}


def aligned_offset_case(buffer, offset: int, alignment: int, source: str) -> Case:
    """A case of 02.3, its rule the one a mistake on it breaks first."""
    base = buffer or 0
    if alignment <= 0 or alignment & (alignment - 1):
        rule = "power of two"
    elif (base + offset) % alignment == 0:
        rule = "aligned stays"
    elif base % alignment:
        rule = "address"
    else:
        rule = "round up"
    size = offset + (0 if buffer is None else 10_000) + (10**6 if rule == "power of two" else 0)
    return Case((buffer, offset, alignment), rule, source, size)


def aligned_offset_cases():
    for buffer, offset, alignment in ((None, 100, 32), (0x1010, 0, 32), (0x1010, 20, 32), (0x1000, 0, 32),
                                      (None, 0, 32), (None, 1, 32), (0x1004, 0, 32), (None, 100, 24),
                                      (0x1000, 8, 0)):
        yield aligned_offset_case(buffer, offset, alignment, "chapter")
    rng = random.Random(2)
    for _ in range(300):
        alignment = 1 << rng.randrange(0, 9)
        buffer = rng.choice([None, 0x1000 * rng.randrange(1, 64) + rng.randrange(0, 512)])
        yield aligned_offset_case(buffer, rng.randrange(0, 5000), alignment, "random")


register(
    Chapter("02", "Aligned offsets", "02_aligned_offsets"),
    Predict(id="02.1", title="an offset in an unaligned buffer", minutes=3, level="easy",
            expected=lambda: align.aligned_offset(0x1004, 100, 32),
            reasoning="the address 0x1004 + 100 = 4200 is 8 bytes past a multiple of 32 (4192), so 24 bytes "
                      "are added: {expected}. The offset 100 alone would have gone to 128; what is aligned "
                      "is the address."),
    Predict(id="02.2", title="three tensors back to back", minutes=3, level="easy",
            expected=lambda: align.GGML_PAD(100, 64) + align.GGML_PAD(32, 64),
            reasoning="each tensor takes its size rounded up to 64: 100 takes 128 and 32 takes 64, so the "
                      "third starts at 128 + 64 = {expected}."),
    Implement(id="02.3", title="aligned_offset", minutes=10, level="easy", function="aligned_offset",
              c_name="aligned_offset", reference=align.aligned_offset, cases=aligned_offset_cases,
              rules=ALIGNED_OFFSET_RULES),
    Explore(id="02.4", title="GGML_PAD with an alignment of 24", minutes=10, level="medium"),
)

# %% [markdown]
# ### Solutions to chapter 02
#
# 02.1: 124. 02.2: 192. 02.3, the C written out: the distance to the next boundary of the address,
# taken modulo the alignment so that an aligned address moves by 0. Each solution is checked here with
# `record_done=False`: reading a solution does not mark an exercise done.

# %%
# NBVAL_CHECK_OUTPUT
from ggml_lite.errors import AlignmentError  # noqa: E402
from ggml_lite.exercises import answer  # noqa: E402

answer("02.1", 124, record_done=False)
answer("02.2", 192, record_done=False)

# %%
# NBVAL_CHECK_OUTPUT
# solution 02.3
def aligned_offset(buffer, offset, alignment):
    if alignment <= 0 or alignment & (alignment - 1):
        raise AlignmentError(f"alignment {alignment} is not a power of two")
    address = (buffer or 0) + offset
    return offset + (alignment - address % alignment) % alignment


assert check("02.3", aligned_offset, record_done=False)

# %% [markdown]
# ## 3 · Chapter 03: the linear allocator
#
# Four exercises. 03.1 and 03.2 are computed with the chapter's own CPU buffer type, `alloc_ctx_tensors` and
# `TAllocr`. 03.3 asks for the split of `ggml_backend_alloc_ctx_tensors_from_buft` on plain sizes. The
# reference builds a context of `i8` tensors of those sizes (a `None` becomes a tensor whose `data` is already
# set, as after an earlier allocation), allocates it with the port in a buffer type of that alignment and
# `max_size`, and reads the buffers back as ranges: a range starts at the first tensor placed in its buffer.

# %%
# | export graders.ch03
"""Chapter 03's exercises (appendix A8): buffers and the linear allocator, graded with `ggml_lite.buffer` and
`ggml_lite.tallocr` (`ggml_backend_alloc_ctx_tensors_from_buft`'s split of a context into buffers)."""

import functools
import random
from pathlib import Path

from ggml_lite.align import GGML_PAD
from ggml_lite.buffer import SIZE_MAX, BufferType, cpu_buffer_type
from ggml_lite.errors import OutOfBufferSpaceError
from ggml_lite.exercises import Case, Chapter, Explore, Implement, Predict, register
from ggml_lite.graphio import load_document
from ggml_lite.ops import view_1d
from ggml_lite.tallocr import TAllocr, alloc_ctx_tensors
from ggml_lite.tensor import F32, TYPES, Context

ROOT = Path(globals().get("__file__", "graders/ch03.py")).resolve().parents[2]  # (A8 runs in notebooks/)


def context_buffer_size() -> int:
    ctx = Context()
    tensors = [ctx.new_tensor_1d(F32, n, name=name) for name, n in (("a", 10), ("b", 25), ("c", 8))]
    view_1d(ctx, tensors[1], 5, 40)
    return alloc_ctx_tensors(ctx, cpu_buffer_type()).get_size()


def tensors_that_fit() -> int:
    talloc, ctx, n = TAllocr(cpu_buffer_type().alloc_buffer(100)), Context(), 0
    try:
        while True:
            talloc.alloc(ctx.new_tensor_1d(F32, 8, name=f"t{n}"))
            n += 1
    except OutOfBufferSpaceError:
        return n


def reference_split(sizes, alignment, max_size):
    """The port (`ggml_backend_alloc_ctx_tensors_from_buft`): the buffers as `[(first, last, size)]`."""
    ctx, tensors = Context(), []
    for k, size in enumerate(sizes):
        tensors.append(ctx.new_tensor_1d(TYPES["i8"], size or 1, name=f"t{k}"))
        if size is None:
            tensors[-1].data = 0x1000  # the C's `t->data != NULL`
    buf = alloc_ctx_tensors(ctx, BufferType("DEV", alignment, max_size))
    parts = [] if buf is None else buf.buffers if buf.is_multi_buffer() else [buf]
    firsts = [0] + [next(k for k, t in enumerate(tensors) if sizes[k] and t.buffer is p) for p in parts[1:]]
    return [(first, last, p.get_size()) for first, last, p in zip(firsts, firsts[1:] + [len(sizes)], parts)]


@functools.cache
def fixture_contexts() -> tuple:
    """`(fixture, sizes)` of each pre-allocated context of ggml-seed 06, 07 and 13; () without the fixtures."""
    found = []
    for name in ("06_llama_block", "07_llama4_kvcache", "13_llama7b_ctx512_all_outputs"):
        path = ROOT / "tests" / "fixtures" / "ggml-seed" / f"{name}.json"
        if path.is_file():
            doc = load_document(path)
            entries = sorted(doc["graph"]["tensors"], key=lambda e: e["id"])
            found += [(name, [None if e["view_src"] is not None else e["alloc_size"] for e in entries
                              if e["ctx"] == ext["ctx"]]) for ext in doc["external_buffers"]]
    return tuple(found)

# %% [markdown]
# The cases: the chapter's, one or more per rule, sized by their number of tensors; the weights and KV caches
# of the recorded models 06, 07 and 13 (the 7B: 291 weights) in creation order, whole as ggml allocated them
# and under three limits (the largest tensor exactly, twice it plus 32, 1 GiB), +1,000; 400 random contexts,
# +100, a tensor in seven needing no memory and `max_size` often a sum of the first tensors, so that buffers
# fill exactly. Each case's rule is the one a mistake on it breaks first, and each plausible mistake fails
# first on the chapter case made for its rule:
#
# | mistake | smallest failing case | rule |
# |---|---|---|
# | the last buffer forgotten | `[64]` | last range |
# | the tensor that does not fit kept in the old buffer | `[64, 96, 64]`, max 128 | split |
# | a buffer closed when it reaches max_size (`>=`) | `[64, 64, 32]`, max 128 | fits exactly |
# | sizes not padded | `[40, 100]` | pad |
# | trailing views left out of the last range | `[64, None, 64, None]` | no memory |
# | no check for a tensor larger than max_size, or one on the unpadded size | `[64, 256]`, max 128; `[100]`, max 120 | too large |
# | an empty buffer when nothing needs memory | `[None, None]` | nothing to allocate |

# %%
# | export graders.ch03
SPLIT_RULES = {
    "last range": "the tensors after the last split, up to the end of the context, get the last buffer",
    "split": "when the next tensor would take the buffer past max_size, the buffer closes before it; a new one "
             "starts with it",
    "fits exactly": "a buffer may reach max_size exactly: it closes only when the sum would exceed it (`>`)",
    "pad": "each tensor takes its size rounded up to the alignment (`GGML_PAD`)",
    "no memory": "a tensor that needs no memory (None) adds 0 bytes and belongs to the range where it appears",
    "too large": "a tensor larger than max_size on its own: raise TensorTooLargeError (the C returns NULL)",
    "nothing to allocate": "when no tensor needs memory there is no buffer at all: return []"}


def split_case(sizes, alignment: int, max_size: int, source: str, base: int = 0) -> Case:
    padded, cur, exact, split = [0 if s is None else GGML_PAD(s, alignment) for s in sizes], 0, False, False
    for p in padded:
        exact = exact or (p > 0 and cur + p == max_size)
        split, cur = (True, p) if cur + p > max_size else (split, cur + p)
    rule = "too large" if any(p > max_size for p in padded) else "nothing to allocate" if not any(padded) else \
        "pad" if any(s is not None and s % alignment for s in sizes) else "fits exactly" if exact else \
        "no memory" if None in sizes else "split" if split else "last range"
    return Case((sizes, alignment, max_size), rule, source, base + len(sizes))


def split_cases():
    for sizes, max_size in (([64], 1000), ([64, 96, 64], 128), ([64, 64, 32], 128), ([40, 100], 1000),
                            ([64, None, 64, None], 1000), ([64, None, 96], 128), ([64, 256], 128),
                            ([None, None], 128), ([], 128)):
        yield split_case(sizes, 32, max_size, "chapter")
    yield split_case([100], 32, 120, "chapter", 10)  # fits unpadded, not padded
    yield split_case([120, 68, None], 32, SIZE_MAX, "chapter", 10)  # § 9's check
    yield split_case([4000, 2400, 2400, 2800, 400, None], 128, 4096, "chapter", 10)  # § 7's weights
    for name, sizes in fixture_contexts():
        largest = max(GGML_PAD(s, 32) for s in sizes if s is not None)
        for max_size in (SIZE_MAX, largest, 2 * largest + 32, 1 << 30):
            yield split_case(sizes, 32, max_size, f"fixture {name}", 1000)
    rng = random.Random(3)
    for _ in range(400):
        alignment = rng.choice((16, 32, 64, 128))
        sizes = [None if rng.random() < 0.15 else alignment * rng.randrange(1, 9) if rng.random() < 0.7
                 else rng.randrange(1, 600) for _ in range(rng.randrange(1, 11))]
        real = [GGML_PAD(s, alignment) for s in sizes if s is not None] or [alignment]
        k = rng.randrange(len(real))
        max_size = rng.choice((sum(real[:k + 1]), max(real) + alignment * rng.randrange(0, 8), 2048, SIZE_MAX,
                               sum(real[:k + 2]))) - (alignment if rng.random() < 0.05 else 0)
        yield split_case(sizes, alignment, max_size, "random", 100)
    rng = random.Random(31)  # a max_size that is not a multiple of the alignment: the padded size decides
    for _ in range(50):
        alignment, sizes = rng.choice((16, 32, 64)), [rng.randrange(1, 300) for _ in range(rng.randrange(1, 6))]
        yield split_case(sizes, alignment, max(sizes) + rng.randrange(0, alignment), "random", 100)


register(
    Chapter("03", "Buffers and the linear allocator", "03_tallocr"),
    Predict(id="03.1", title="the size of a context's CPU buffer", minutes=5, level="easy",
            expected=context_buffer_size,
            reasoning="each tensor takes its bytes rounded up to 32: 40 → 64, 100 → 128, 32 → 32, and the view none "
                      "(it lives in b's bytes): 224 bytes. The CPU buffer type asks malloc for 32 more, so that it "
                      "can align the base, and reports that larger size: {expected}."),
    Predict(id="03.2", title="how many tensors fit", minutes=5, level="medium", expected=tensors_that_fit,
            reasoning="the buffer asked for 100 bytes reports 100 + 32 = 132, and `ggml_tallocr_alloc` compares "
                      "with that size, from the aligned base; each tensor of 8 f32 takes 32 bytes, so {expected} "
                      "fit (128 ≤ 132) and the next one, needing 32 bytes with 4 left, is refused."),
    Implement(id="03.3", title="splitting a context into buffers", minutes=20, level="medium",
              function="split_buffers", c_name="ggml_backend_alloc_ctx_tensors_from_buft",
              reference=reference_split, cases=split_cases, rules=SPLIT_RULES),
    Explore(id="03.4", title="does splitting in creation order cost memory?", minutes=15, level="medium"),
)

# %% [markdown]
# ### Solutions to chapter 03
#
# 03.1: 256. 03.2: 4. 03.3: the C's loop, a range closed whenever the next tensor would not fit.

# %%
# NBVAL_CHECK_OUTPUT
answer("03.1", 256, record_done=False)
answer("03.2", 4, record_done=False)

# %%
# NBVAL_CHECK_OUTPUT
# solution 03.3
from ggml_lite.errors import TensorTooLargeError  # noqa: E402


def split_buffers(sizes, alignment, max_size):
    buffers, first, cur = [], 0, 0
    for i, size in enumerate(sizes):
        this = 0 if size is None else (size + alignment - 1) // alignment * alignment
        if this > max_size:
            raise TensorTooLargeError(f"tensor {i} needs {this} bytes, more than max_size {max_size}")
        if cur + this > max_size:  # close the buffer before tensor i
            buffers.append((first, i, cur))
            first, cur = i, this
        else:
            cur += this
    if cur > 0:  # the remaining tensors, to the end
        buffers.append((first, len(sizes), cur))
    return buffers


assert check("03.3", split_buffers, record_done=False)

# %% [markdown]
# ## 4 · Chapter 04: the dynamic allocator
#
# Four exercises. 04.1's answer comes from running the chapter's `DynTAllocr` on the question's script. 04.2
# and 04.3 ask for the two halves of the allocator, `ggml_dyn_tallocr_alloc`'s best fit and
# `ggml_dyn_tallocr_free_tensor`'s merges, on a plain free list `[(offset, size), ...]`; the reference puts
# that list into a `DynTAllocr` and calls the port. A case is one call, with the free list as it was before
# it. The calls come from three places. The chapter's are small and hand-made, one or more per rule. The
# recorded ones are every call the allocator gets while ggml_lite plans ggml-seed graphs 01–10 and 14, with
# their weights in external buffers as ggml had them (the plans equal ggml's, so the calls are ggml's); 11
# and 12 are sequences and 13 is 14's twin. The random ones come from 40 seeded runs of 30 allocations and
# frees, at alignments 16, 32 and 64, about one size in four asked unaligned.

# %%
# | export graders.ch04
"""Chapter 04's exercises (appendix A8): the dynamic allocator, graded with `ggml_lite.dyn_tallocr`
(`ggml_dyn_tallocr_alloc`'s best fit, `ggml_dyn_tallocr_free_tensor`'s merges)."""

import functools
import random
from pathlib import Path

from ggml_lite.align import GGML_PAD
from ggml_lite.buffer import SIZE_MAX, cpu_buffer_type
from ggml_lite.dyn_tallocr import MAX_FREE_BLOCKS, AllocEvent, DynTAllocr, FreeEvent, ResetEvent
from ggml_lite.exercises import Case, Chapter, Explore, Implement, Predict, register
from ggml_lite.gallocr import GAllocr
from ggml_lite.graphio import allocate_external, read_graph_file
from ggml_lite.tensor import Tensor, nbytes

ROOT = Path(globals().get("__file__", "graders/ch04.py")).resolve().parents[2]  # (A8 runs in notebooks/)
B = SIZE_MAX // 2  # the open end: a fresh allocator's one block is [0, B)


def reference_alloc(free_blocks, size, alignment):
    """The port (`ggml_dyn_tallocr_alloc`) on the free list `free_blocks`: `(offset, free list after)`."""
    dyn = DynTAllocr(alignment)
    dyn.blocks = [list(b) for b in free_blocks]
    return dyn.alloc(size), dyn.free_blocks


def reference_free(free_blocks, offset, size, alignment):
    """The port (`ggml_dyn_tallocr_free_tensor`) on the free list `free_blocks`: the free list after."""
    dyn = DynTAllocr(alignment)
    dyn.blocks = [list(b) for b in free_blocks]
    dyn.free_tensor(offset, size)
    return dyn.free_blocks


@functools.cache
def recorded_and_random_calls() -> dict:
    """{(kind, free list before, offset, size asked, alignment): source} of the recorded and random calls."""
    runs: list[tuple[list, int, str]] = []
    for path in sorted((ROOT / "tests" / "fixtures" / "ggml-seed").glob("[01][0-9]_*.json")):
        if path.name[:2] not in ("11", "12", "13"):
            gf = read_graph_file(path)
            allocate_external(gf)
            runs.append(([], 32, f"fixture {path.stem}"))
            GAllocr(cpu_buffer_type(), trace=runs[-1][0].append).reserve(gf.graph)
    rng = random.Random(4)
    for _ in range(40):
        alignment = rng.choice((16, 32, 64))
        runs.append(([], alignment, "random"))
        dyn = DynTAllocr(alignment, trace=runs[-1][0].append)
        live: list[tuple[int, int, int]] = []
        for _ in range(30):
            if live and rng.random() < 0.45:
                dyn.free_tensor(*live.pop(rng.randrange(len(live))))
            else:  # the size asked goes into the trace as the "tensor"
                size = alignment * rng.choice((1, 2, 2, 3, 4, 6)) - rng.choice((0, 0, 0, rng.randrange(alignment)))
                live.append((dyn.alloc(size, size), size, size))
    calls: dict = {}
    for events, alignment, source in runs:
        before: tuple = ()
        for ev in events:
            if isinstance(ev, AllocEvent | FreeEvent):
                asked = nbytes(ev.tensor) if isinstance(ev.tensor, Tensor) else ev.tensor
                calls.setdefault((ev.kind, before, ev.offset, asked, alignment), source)
            if isinstance(ev, AllocEvent | FreeEvent | ResetEvent):
                before = ev.free_blocks
    return calls

# %% [markdown]
# Each case gets the rule that a mistake on it breaks first, and a size: its number of blocks, plus 100 for a
# random case and 1,000 for a recorded one or a list of 256 blocks. The chapter's cases are then the smallest,
# and each plausible mistake fails first on the chapter case made for its rule:
#
# | exercise: mistake | smallest failing case | rule |
# |---|---|---|
# | 04.2: first fit | 32 B; holes of 128 and 64 B | best fit |
# | 04.2: ties to the earlier block (`<`) | 32 B; two holes of 64 B | ties go later |
# | 04.2: the last block searched too | 32 B; 64 B, then a last block of 32 | last block last |
# | 04.2: an emptied block kept | 64 B into a hole of 64 | used up |
# | 04.2: no rounding | 20 B | round up |
# | 04.3: no merge with the next block | a range filling a 32-byte gap | merge both |
# | 04.3: no merge with the block after | a range just below the last block | merge before |
# | 04.3: new block appended, or put before the last | a range between blocks 0 and 1 | insert sorted |
# | 04.3: no rounding | 20 B after block 0 | round up |
# | 04.3: no `MAX_FREE_BLOCKS` check, or `n > 256` | 256 (or 255) blocks | out of free blocks |

# %%
# | export graders.ch04
ALLOC_RULES = {
    "best fit": "of the blocks before the last, the smallest one that is large enough is taken, wherever it lies",
    "ties go later": "of blocks of the same best size, the later one is taken (`block->size <= best_fit_size`)",
    "last block last": "the last block is searched only when no other block fits, even where it would fit best",
    "used up": "a block whose size drops to 0 is removed from the free list",
    "round up": "the size is first rounded up to a multiple of the alignment",
    "out of space": "when not even the last block is large enough, raise OutOfBufferSpaceError (the C aborts)"}
FREE_RULES = {
    "merge after": "a range that starts where a free block ends extends that block",
    "merge before": "a range that ends where a free block starts extends that block down to the range",
    "merge both": "a range that fills the gap between two free blocks joins all three into one block",
    "insert sorted": "a range touching no free block becomes a new block at its place in address order",
    "round up": "the size is first rounded up to a multiple of the alignment",
    "out of free blocks": "a new block when all 256 (MAX_FREE_BLOCKS) are in use: OutOfFreeBlocksError; a merge is ok"}


def alloc_rule(blocks, size: int, alignment: int) -> str:
    need, sizes = GGML_PAD(size, alignment), [s for _, s in blocks[:-1]]
    fits = [s for s in sizes if s >= need]
    return "out of space" if not fits and blocks[-1][1] < need else "round up" if size % alignment else \
        "last block last" if not fits or blocks[-1][1] <= min(fits) else "ties go later" if \
        sizes.count(min(fits)) > 1 else "used up" if min(fits) == need else "best fit"


def free_rule(blocks, offset: int, size: int, alignment: int) -> str:
    after = any(o + s == offset for o, s in blocks)
    before = any(o == offset + GGML_PAD(size, alignment) for o, _ in blocks)
    return "out of free blocks" if len(blocks) >= MAX_FREE_BLOCKS - 1 else "round up" if size % alignment else \
        "merge both" if after and before else "merge after" if after else "merge before" if before else \
        "insert sorted"


def dyn_cases(kind: str, chapter: list):
    rule = alloc_rule if kind == "alloc" else free_rule
    for args in chapter:
        yield Case(args, rule(*args), "chapter", len(args[0]) + (1000 if len(args[0]) > 250 else 0))
    for (k, before, offset, size, alignment), source in recorded_and_random_calls().items():
        args = (list(before), size, alignment) if kind == "alloc" else (list(before), offset, size, alignment)
        if k == kind:
            yield Case(args, rule(*args), source, len(before) + (100 if source == "random" else 1000))


ONE, TWO = [(0, 32), (128, B - 128)], [(0, 32), (64, B - 64)]
FULL = [(128 * k, 32) for k in range(MAX_FREE_BLOCKS - 1)] + [(128 * 255, B - 128 * 255)]  # 256 blocks
ALLOC_CHAPTER = [([(0, 128), (160, 64), (256, B - 256)], 32, 32), ([(0, 64), (96, 64), (192, B - 192)], 32, 32),
                 ([(0, 64), (96, 32)], 32, 32), (TWO, 64, 32), ([(0, 64), (96, B - 96)], 64, 32),
                 ([(0, 64), (96, B - 96)], 20, 32), ([(0, 32), (64, 32)], 64, 32), ([(0, 96), (128, 64)], 64, 32)]
FREE_CHAPTER = [(ONE, 64, 32, 32), (ONE, 32, 32, 32), (ONE, 96, 32, 32), (TWO, 32, 32, 32), (ONE, 64, 20, 32),
                ([(64, 32), (160, B - 160)], 0, 32, 32), ([(0, 32), (128, 32), (256, B - 256)], 64, 32, 32),
                (FULL, 448, 32, 32), (FULL, 448, 1, 32), (FULL, 416, 32, 32), (FULL[1:], 32, 32, 32)]


def hole_taken() -> int:
    dyn = DynTAllocr(32)
    at = {name: (dyn.alloc(size), size) for name, size in zip("axbycz", (96, 64, 64, 64, 64, 64))}
    for name in "abc":
        dyn.free_tensor(*at[name])
    return dyn.alloc(50)


register(
    Chapter("04", "The dynamic allocator", "04_dyn_allocator"),
    Predict(id="04.1", title="which hole a request takes", minutes=5, level="easy", expected=hole_taken,
            reasoning="a, x, b, y, c and z lie back to back from 0, so freeing a, b and c leaves holes of 96 B at 0 "
                      "and of 64 B at 160 and 288. 50 B is rounded up to 64; both 64-byte holes fit best, and of "
                      "equal blocks the later wins (`<=`): {expected}. (First fit: 0; ties to the first: 160.)"),
    Implement(id="04.2", title="the best-fit choice", minutes=20, level="medium", function="best_fit_alloc",
              c_name="ggml_dyn_tallocr_alloc", reference=reference_alloc, rules=ALLOC_RULES,
              cases=lambda: dyn_cases("alloc", ALLOC_CHAPTER)),
    Implement(id="04.3", title="freeing with merges", minutes=25, level="medium", function="free_range",
              c_name="ggml_dyn_tallocr_free_tensor", reference=reference_free, rules=FREE_RULES,
              cases=lambda: dyn_cases("free", FREE_CHAPTER)),
    Explore(id="04.4", title="where best fit loses to first fit", minutes=15, level="medium"),
)

# %% [markdown]
# ### Solutions to chapter 04
#
# 04.1: 288. 04.2 and 04.3: the C written out on a copy of the list (the grader compares what is returned).

# %%
# NBVAL_CHECK_OUTPUT
answer("04.1", 288, record_done=False)

# %%
# NBVAL_CHECK_OUTPUT
# solution 04.2
from ggml_lite.errors import OutOfBufferSpaceError  # noqa: E402


def best_fit_alloc(free_blocks, size, alignment):
    size = (size + alignment - 1) // alignment * alignment
    blocks = [tuple(b) for b in free_blocks]
    fits = [i for i in range(len(blocks) - 1) if blocks[i][1] >= size]  # every block but the last
    if fits:
        best = min(fits, key=lambda i: (blocks[i][1], -i))  # the smallest; of equal ones the later
    elif blocks[-1][1] >= size:  # the last block is the last resort
        best = len(blocks) - 1
    else:
        raise OutOfBufferSpaceError(f"no free block of {size} bytes")
    offset, left = blocks[best][0], blocks[best][1] - size
    rest = [(offset + size, left)] if left else []  # a used-up block is removed
    return offset, blocks[:best] + rest + blocks[best + 1:]


assert check("04.2", best_fit_alloc, record_done=False)

# %%
# NBVAL_CHECK_OUTPUT
# solution 04.3
from ggml_lite.errors import OutOfFreeBlocksError  # noqa: E402


def free_range(free_blocks, offset, size, alignment):
    size = (size + alignment - 1) // alignment * alignment
    blocks = [tuple(b) for b in free_blocks]
    for i, (o, s) in enumerate(blocks):
        if o + s == offset:  # the range starts where block i ends: extend it, and join block i+1 if it touches
            if i + 1 < len(blocks) and offset + size == blocks[i + 1][0]:
                return blocks[:i] + [(o, s + size + blocks[i + 1][1])] + blocks[i + 2:]
            return blocks[:i] + [(o, s + size)] + blocks[i + 1:]
        if offset + size == o:  # it ends where block i starts (the C's merge with block i-1 here never happens)
            return blocks[:i] + [(offset, s + size)] + blocks[i + 1:]
    if len(blocks) >= 256:  # MAX_FREE_BLOCKS
        raise OutOfFreeBlocksError(f"no room for a new free block at {offset}")
    pos = next((k for k, (o, _) in enumerate(blocks) if o >= offset), len(blocks))  # keep the address order
    return blocks[:pos] + [(offset, size)] + blocks[pos:]


assert check("04.3", free_range, record_done=False)
