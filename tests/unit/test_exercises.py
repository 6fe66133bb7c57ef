"""The exercise core (appendix A8, ggml_lite.exercises): predictions, checks, the smallest failing case, the
progress record read as untrusted input, and `python -m ggml_lite exercises`."""

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ggml_lite import exercises as ex
from ggml_lite.__main__ import main
from ggml_lite.errors import AlignmentError, ExerciseError


@pytest.fixture()
def progress(tmp_path, monkeypatch):
    path = tmp_path / "progress.json"
    monkeypatch.setenv("GGML_LITE_PROGRESS", str(path))
    return path


def test_a_prediction_says_right_or_wrong_then_why(progress, capsys):
    assert not ex.answer("02.1", ...)
    assert "not answered yet" in capsys.readouterr().out and not progress.exists()
    assert not ex.answer("02.1", 128)
    out = capsys.readouterr().out
    assert "not quite: you said 128" in out and "Why: " in out and not progress.exists()
    assert ex.answer("02.1", 124)
    assert "right." in capsys.readouterr().out and "02.1" in ex.read_progress()


def test_ids_kinds_and_functions_are_checked():
    for bad in ("2.1", "02-1", "99.99", 21, None, "02.100"):
        with pytest.raises(ExerciseError):
            ex.exercise(bad)
    with pytest.raises(ExerciseError, match="implement exercise"):
        ex.answer("02.3", 1)
    with pytest.raises(ExerciseError, match="predict exercise"):
        ex.check("02.1", lambda: 0)
    with pytest.raises(ExerciseError, match="expected your function"):
        ex.check("02.3", 42)


def good(buffer, offset, alignment):
    if alignment <= 0 or alignment & (alignment - 1):
        raise AlignmentError("not a power of two")
    return offset + (alignment - ((buffer or 0) + offset) % alignment) % alignment


def test_a_check_passes_records_and_counts(progress, capsys):
    v = ex.check("02.3", good)
    assert v.passed and v.started and v.failures == 0 and v.cases > 300
    assert "passed" in capsys.readouterr().out and "02.3" in ex.read_progress()


def test_a_stub_is_not_done_yet_and_an_error_is_a_result(progress):
    def stub(buffer, offset, alignment):
        raise NotImplementedError

    v = ex.check("02.3", stub, quiet=True)
    assert not v.started and not v.passed and "not done yet" in v.message
    v = ex.check("02.3", lambda b, o, a: 1 // 0, quiet=True)
    assert v.started and v.failures == v.cases and "raises ZeroDivisionError" in v.message
    # where the port refuses (a bad alignment), a function that refuses with another error class disagrees
    v = ex.check("02.3", lambda b, o, a: good(b, o, a) if a > 0 and not a & (a - 1) else int("x"), quiet=True)
    assert v.rule == "power of two" and "raises ValueError" in v.message and "raises AlignmentError" in v.message
    assert not progress.exists()


def test_the_smallest_failing_case_is_shown():
    def wrong(buffer, offset, alignment):  # right except for offsets above 1000
        return good(buffer, offset, alignment) + (offset > 1000)

    v = ex.check("02.3", wrong, record_done=False, quiet=True)
    failing = [c for c in ex.exercise("02.3").cases() if c.args[1] > 1000 and c.rule != "power of two"]
    assert v.case.size == min(c.size for c in failing) and v.failures == len(failing)


def test_arguments_are_copies():
    calls = []

    def keeps(buffer, offset, alignment):
        calls.append(offset)
        return good(buffer, offset, alignment)

    assert ex.check("02.3", keeps, record_done=False, quiet=True).passed and len(calls) > 300


def test_an_endless_function_ends_in_a_message(monkeypatch):
    monkeypatch.setattr(ex, "CASE_SECONDS", 0.2)
    t0 = time.perf_counter()

    def endless(buffer, offset, alignment):
        while True:
            pass

    v = ex.check("02.3", endless, record_done=False, quiet=True)
    assert not v.passed and v.failures == 1 and "still running after 0.2 s" in v.message
    assert time.perf_counter() - t0 < 60  # the first case that runs out of time ends the check


@pytest.mark.parametrize("text, field", [
    ("not json", "not JSON"), ("[]", "expected an object"), ('{"version": 2, "done": {}}', "version"),
    ('{"version": 1}', "done"), ('{"version": 1, "done": []}', "done"), ('{"version": 1, "done": {"x": "t"}}', "'x'"),
    ('{"version": 1, "done": {"02.1": 5}}', "done.02.1"), (b"\xff\xfe", "cannot be read"),
])
def test_a_bad_progress_record_is_refused_by_field(progress, text, field, capsys):
    (progress.write_bytes if isinstance(text, bytes) else progress.write_text)(text)
    with pytest.raises(ExerciseError, match=field.replace(".", r"\.").replace("[", r"\[")):
        ex.read_progress()
    assert ex.record("02.1") is False  # a notebook only warns, and never overwrites what it cannot read
    assert "progress not recorded" in capsys.readouterr().out
    assert (progress.read_bytes() if isinstance(text, bytes) else progress.read_text()) == text
    assert main(["exercises"]) == 2 and "ExerciseError" in capsys.readouterr().err


def test_a_huge_progress_record_is_refused_unread(progress):
    progress.write_bytes(b" " * (ex.MAX_PROGRESS_BYTES + 1))
    with pytest.raises(ExerciseError, match="larger than"):
        ex.read_progress()


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=50),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4)))
def test_any_json_is_read_or_refused(tmp_path_factory, doc):
    path = tmp_path_factory.mktemp("p") / "progress.json"
    path.write_text(json.dumps({"version": 1, "done": doc}))
    try:
        done = ex.read_progress(path)
    except ExerciseError:
        return
    assert all(ex.ID.match(k) and isinstance(v, str) for k, v in done.items())


def test_record_keeps_the_first_time(progress):
    assert ex.record("02.1") and ex.record("02.3")
    first = ex.read_progress()
    assert ex.record("02.1") and ex.read_progress() == first and set(first) == {"02.1", "02.3"}


def test_the_command_lists_every_exercise(progress, capsys):
    ex.record("02.3")
    assert main(["exercises", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert all(set(r) == {"id", "chapter", "kind", "minutes", "done"} for r in rows)
    assert [r["id"] for r in rows] == [e.id for e in ex.catalog()]
    assert {r["id"] for r in rows if r["done"]} == {"02.3"}
    assert main(["exercises"]) == 0
    out = capsys.readouterr().out
    assert "[x] 02.3" in out and "[ ] 02.1" in out and f"{len(rows)} exercises" in out and "Next: 02.1" in out


def test_numpy_results_compare_as_python_values():
    import numpy as np

    assert ex.check("02.3", lambda b, o, a: np.int64(good(b, o, a)), record_done=False, quiet=True).passed
    assert ex._same(np.array([192, 224]), (192, 224)) and ex._same(np.True_, True) and not ex._same(np.True_, 1)
    assert ex._same([np.float32(0.5), (1, 2)], (0.5, [1, 2]))
    right = ex.answer("02.1", np.int64(124), record_done=False)
    assert right and type(right.right) is bool
    assert not ex.answer("02.1", np.array([124, 1]), record_done=False)  # compared, not a traceback


def test_an_endless_loop_inside_except_exception_still_ends(monkeypatch):
    monkeypatch.setattr(ex, "CASE_SECONDS", 0.2)

    def stubborn(buffer, offset, alignment):
        while True:
            try:
                while True:
                    pass
            except Exception:  # (a learner's catch-all must not swallow the grader's alarm)
                pass

    v = ex.check("02.3", stubborn, record_done=False, quiet=True)
    assert not v.passed and "still running after 0.2 s" in v.message and "_Timeout" not in v.message


def test_the_shown_call_names_only_positional_parameters():
    def star(*args):
        return args[1] + 1

    v = ex.check("02.3", star, record_done=False, quiet=True)
    assert "aligned_offset(None, " in v.message and "a=" not in v.message


def test_failing_cases_of_several_rules_are_counted_by_rule():
    def no_check(buffer, offset, alignment):  # right except that it refuses nothing, and ignores the buffer
        return offset + (alignment - offset % alignment) % alignment if alignment > 0 else offset

    v = ex.check("02.3", no_check, record_done=False, quiet=True)
    assert v.rule == "address" and "failing cases by rule: " in v.message and "power of two 2 of 2" in v.message


@pytest.mark.parametrize("doc", ['{"version": true, "done": {}}', '{"version": 1.0, "done": {}}',
                                 '{"version": 1, "done": {"02.3\\n": "t"}}', "[" * 100_000 + "]" * 100_000])
def test_near_miss_progress_records_are_refused(progress, doc):
    progress.write_text(doc)
    with pytest.raises(ExerciseError):
        ex.read_progress()
