"""The graders of every chapter's implement-exercises (issue 25, point 3): each accepts the port itself and
rejects every plausible wrong solution of tests/exercises/wrong_chNN.py with the rule that solution breaks;
the catalog has what the course promises (≥ 3 exercises in every chapter 02-12, every kind in each, ≥ 36)."""

import importlib
import inspect
from pathlib import Path

import pytest

from ggml_lite import exercises as ex

HERE = Path(__file__).resolve().parent
WRONG: dict[str, list] = {}
for _path in sorted(HERE.glob("wrong_ch*.py")):
    for _id, _variants in importlib.import_module(_path.stem).WRONG.items():
        WRONG.setdefault(_id, []).extend(_variants)

CATALOG = ex.catalog()
IMPLEMENTS = [e for e in CATALOG if isinstance(e, ex.Implement)]
PREDICTS = [e for e in CATALOG if isinstance(e, ex.Predict)]


def test_the_course_has_its_exercises():
    chapters = {f"{n:02d}" for n in range(2, 13)}
    by_chapter = {c: [e for e in CATALOG if e.chapter == c] for c in chapters}
    thin = {c: len(v) for c, v in by_chapter.items() if len(v) < 3}
    assert not thin, f"chapters with fewer than 3 exercises: {thin}"
    missing = {c: sorted(set(ex.KINDS) - {e.kind for e in v}) for c, v in by_chapter.items()
               if {e.kind for e in v} != set(ex.KINDS)}
    assert not missing, f"kinds missing: {missing}"
    assert len(CATALOG) >= 36, len(CATALOG)
    assert set(ex.CHAPTERS) == chapters
    numbers = {c: sorted(e.number for e in v) for c, v in by_chapter.items()}
    assert all(n == list(range(1, len(n) + 1)) for n in numbers.values()), numbers
    print(f"\n{len(CATALOG)} exercises: " + ", ".join(f"{k} {sum(e.kind == k for e in CATALOG)}" for k in ex.KINDS)
          + f"; {sum(e.minutes for e in CATALOG)} minutes")


@pytest.mark.parametrize("e", PREDICTS, ids=[e.id for e in PREDICTS])
def test_a_prediction_is_computed_by_the_port_and_judged(e, capsys):
    value = e.expected()
    assert e.same(value, value)
    assert ex.answer(e.id, value, record_done=False)
    assert "{expected}" in e.reasoning or str(value) in e.reasoning or e.choices, "the reasoning gives the answer"
    if e.choices:
        other = next(c for c in e.choices if not e.same(c, value))
        assert not ex.answer(e.id, other, record_done=False)
    assert "Why: " in capsys.readouterr().out


@pytest.mark.parametrize("e", IMPLEMENTS, ids=[e.id for e in IMPLEMENTS])
def test_a_grader_accepts_the_port_and_uses_every_rule(e):
    cases = list(e.cases())
    assert cases and [c.args for c in cases] == [c.args for c in e.cases()], "cases are deterministic"
    assert {c.rule for c in cases} <= set(e.rules), {c.rule for c in cases} - set(e.rules)
    unused = set(e.rules) - {c.rule for c in cases}
    assert not unused, f"rules no case exercises: {unused}"
    v = ex.check(e.id, e.reference, record_done=False, quiet=True)
    assert v.passed and v.started and v.cases == len(cases), v.message
    print(f"\n{e.id} {e.function}: {v.cases} cases in {v.seconds:.2f} s")


def test_every_implement_exercise_has_three_wrong_variants():
    thin = {e.id: len(WRONG.get(e.id, [])) for e in IMPLEMENTS if len(WRONG.get(e.id, [])) < 3}
    assert not thin, thin
    assert set(WRONG) <= {e.id for e in IMPLEMENTS}, set(WRONG) - {e.id for e in IMPLEMENTS}


def test_every_wrong_variant_is_rejected_naming_the_rule_it_breaks():
    """Each wrong solution fails, on a smallest case of the rule it breaks, and the message names that rule and
    never shows the reference's code."""
    failed, rows = [], []
    for ex_id, variants in sorted(WRONG.items()):
        e = ex.exercise(ex_id)
        try:
            secret = [line.strip() for line in inspect.getsource(e.reference).split("\n")[1:] if len(line.strip()) > 30]
        except (OSError, TypeError):
            secret = []
        for name, fn, rule in variants:
            v = ex.check(ex_id, fn, record_done=False, quiet=True)
            ok = (not v.passed and v.started and v.rule == rule and f"rule: {rule}:" in v.message
                  and not any(line in v.message for line in secret))
            rows.append(f"  {ex_id} {'rejected' if ok else 'NOT OK  '} {name!r}: rule {v.rule!r} "
                        f"({v.failures} of {v.cases} cases, {v.seconds:.2f} s)")
            if not ok:
                failed.append((ex_id, name, rule, v.rule, v.message[:300]))
    n = sum(len(v) for v in WRONG.values())
    print(f"\n{n - len(failed)} of {n} wrong variants rejected by {len(WRONG)} graders, each naming the rule it "
          "breaks:\n" + "\n".join(rows))
    assert not failed, failed


def test_no_solution_shadows_a_grader_name():
    """A solution cell defines the stub's function in its appendix's namespace, where the grader modules' cells
    ran too: a grader global of that name would be replaced by the solution, and grade it against itself."""
    import sys

    clash = [f"{e.id}: {e.function}" for e in IMPLEMENTS
             if e.function in vars(sys.modules[f"ggml_lite.graders.ch{e.chapter}"])]
    assert not clash, clash
