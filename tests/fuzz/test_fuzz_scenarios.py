"""Issue 22, deliverable 4 (scenarios): every field of the 14 recorded scheduler scenarios mutated — wrong
types, NaN and Infinity written as raw JSON text, floats, 2^70, 0, negatives, strings that name nothing,
null, deleted fields, empty lists — and run through `sched FILE` and `sched FILE --check` in-process
(tests/fuzzing.py). The promise, judged per case:

- never a traceback, the last-resort handler, a hang or a jump of memory (`assert_sound`);
- the printout and the replay refuse the same files, with the same message (one validator);
- exit 2 names a field on the mutated path;
- `sched FILE` exiting 0 after a mutation of a recorded fact or of a comment prints what the unmutated
  file prints (the assignments do not depend on what was recorded after them);
- `sched FILE --check` exits 0 only when what changed is a comment, an optional record left out, or a
  set-up that happens to give the same results; it exits 1 ("a difference") only for a recorded fact
  or a valid other set-up (a pin left out, an op denied, another alignment ...), never for a malformed
  field.

Cases are seeded (case i uses random.Random(i)): a failure names its case and reproduces. The quick run
tries `QUICK` mutated files; `--long` (make test-long) `LONG`, and prints the count.
"""

import copy
import json
import random
import re
import time

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fuzzing import assert_sound, run_cli
from helpers import SCHED_FILES, fixture_path, load_json

QUICK, LONG = 600, 6000
DOCS = {name: load_json(fixture_path("ggml-seed-sched", name)) for name in SCHED_FILES}
COMMENTS = {"description", "fixture", "ggml_commit", "ggml_build", "pins[].rule"}
OPTIONAL = COMMENTS | {"fake_buffer_allocations"}
FACT_PREFIXES = ("weights[].ext_offset", "weights[].fnv1a32_of_bytes", "weights[].buffer", "external_buffers[].size",
                 "external_buffers[].is_multi_buffer", "external_buffers[].parts", "fake_buffer_allocations",
                 "outcome.stderr_until_abort", *(f"graph.tensors[].{k}" for k in (
                     "sched_backend", "sched_cause", "buffer", "offset", "ext_offset", "preallocated")))
SETUP_STEP_FIELDS = {"step", "call", "round", "batch"}
VALID_OTHER_SETUPS = {"pins", "pins[]", "pins[].tensor", "pins[].backend", "backends[].supports_op_denied",
                      "backends[].supports_op_denied[]", "backends[].alignment", "backends[].max_size",
                      "external_buffers[].usage", "sched_params.GGML_SCHED_DEBUG", "backends[].offload_op",
                      # any size that holds the graph: ggml sizes its hash set by it, nothing else
                      "sched_params.graph_size",
                      "backends", "backends[]", "steps", "steps[]", "steps[].batch",
                      *(f"steps[].batch.{k}" for k in ("n_tokens", "n_kv", "kv_head", "n_outputs"))}
ABORT_UNTOUCHED = ("model.rope", "model.rms_norm_eps", "sched_params")  # what scenario 13's abort in pass 1 never reads
NOTHING = "no_such_name"
MUTATIONS = ("delete", "null", "nothing", "2^70", "zero", "negative", "float", "nan", "infinity", "true", "empty list",
             "empty object", "wrapped", "sibling", "sibling")  # sibling: the value of another field of the same kind


def _paths(doc, path=()):
    """Every (path, value) of a JSON document, the root excluded."""
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        yield path + (key,), value
        yield from _paths(value, path + (key,))


def _text(path) -> str:
    """A path as the validator writes it: `steps[2].tensors[5].cause`."""
    out = ""
    for key in path:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else key)
    return out


def _kind(path) -> str:
    """The path with its indices dropped (`steps[].tensors[].cause`), steps keyed by their call."""
    return re.sub(r"\[\d+\]", "[]", _text(path))


def _is_fact(path) -> bool:
    kind = _kind(path)
    if path[0] == "steps" and len(path) > 2 and path[2] not in SETUP_STEP_FIELDS:
        return True
    return any(kind == p or kind.startswith(p + ".") or kind.startswith(p + "[") for p in FACT_PREFIXES)


PATHS = {name: list(_paths(doc)) for name, doc in DOCS.items()}
KINDS: dict[str, dict[str, list]] = {name: {} for name in DOCS}
for _name, _paths_ in PATHS.items():
    for _p, _ in _paths_:
        KINDS[_name].setdefault(_kind(_p), []).append(_p)
ORIGINAL_PRINTOUT: dict[str, str] = {}


def _mutate(doc, path, how, sibling=None):
    """A copy of `doc` with the value at `path` replaced (or deleted); None when the mutation changes nothing."""
    new = copy.deepcopy(doc)
    parent = new
    for key in path[:-1]:
        parent = parent[key]
    old = parent[path[-1]]
    if how == "delete":
        del parent[path[-1]]
        return new
    value = {"null": None, "nothing": NOTHING, "2^70": 2**70, "zero": 0, "negative": -1, "float": 1.5,
             "nan": float("nan"), "infinity": float("inf"), "true": True, "empty list": [], "empty object": {},
             "wrapped": [old], "sibling": copy.deepcopy(sibling)}[how]
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (value, old))
    if (type(value) is type(old) or numbers) and value == old:  # (0 for 0.0 is the same number)
        return None
    parent[path[-1]] = value
    return new


def _value(doc, path):
    for key in path:
        doc = doc[key]
    return doc


def _case(i: int, tmp_path):
    """Case i: a scenario, a field (a field kind first, so that every kind is drawn as often), a mutation."""
    rng = random.Random(i)
    name = rng.choice(SCHED_FILES)
    kind = rng.choice(sorted(KINDS[name]))
    path = rng.choice(KINDS[name][kind])
    how = rng.choice(MUTATIONS)
    other = rng.choice(SCHED_FILES)  # a field of the same kind, in this file or another
    other = other if kind in KINDS[other] else name
    sibling = _value(DOCS[other], rng.choice(KINDS[other][kind]))
    doc = _mutate(DOCS[name], path, how, sibling)
    if doc is None:
        return None
    f = tmp_path / f"case{i}.json"
    f.write_text(json.dumps(doc))  # NaN and Infinity go in as raw JSON text
    return name, path, how, str(f)


def _printout(name, tmp_path):
    if name not in ORIGINAL_PRINTOUT:
        ORIGINAL_PRINTOUT[name] = assert_sound(run_cli(["sched", fixture_path("ggml-seed-sched", name)])).out
    return ORIGINAL_PRINTOUT[name]


def _judge(i, name, path, how, f, tmp_path) -> tuple:
    """Run both commands on a mutated file and hold them to the promise; returns the two exit codes."""
    where = f"case {i}: {name} {_text(path)} <- {how}"
    shown = assert_sound(run_cli(["sched", f]))
    checked = assert_sound(run_cli(["sched", f, "--check"]), allow=(0, 1, 2))
    kind, fact = _kind(path), _is_fact(path)
    if shown.code == 2:  # one validator: the replay refuses what the printout refuses, in the same words
        assert checked.code == 2 and checked.err == shown.err, f"{where}\n{shown.describe()}\n{checked.describe()}"
    for o in (shown, checked):
        if o.code == 2:
            named = [_text(path[:n]) for n in range(1, len(path) + 1)]
            assert any(p in o.err for p in named), f"{where}: the error names no field on the path\n{o.describe()}"
    if shown.code == 0 and (fact or kind in COMMENTS):
        assert shown.out == _printout(name, tmp_path), f"{where}: the printout changed\n{shown.describe()}"
    if checked.code == 0:
        ok = kind in COMMENTS or (how == "delete" and kind in OPTIONAL) or kind in VALID_OTHER_SETUPS or (
            DOCS[name]["outcome"]["completed"] is False and (kind.startswith(ABORT_UNTOUCHED) or (
                how == "delete" and kind in ("external_buffers", "weights", "steps"))))
        assert ok, f"{where}: --check says identical after this mutation\n{checked.describe()}"
    if checked.code == 1:
        assert fact or kind in VALID_OTHER_SETUPS, \
            f"{where}: a malformed field reported as a difference\n{checked.describe()}"
    return shown.code, checked.code


def test_unmutated_scenarios_replay_identical(tmp_path):
    for name in SCHED_FILES:
        o = assert_sound(run_cli(["sched", fixture_path("ggml-seed-sched", name), "--check"]))
        assert o.code == 0 and ("identical" in o.out or "abort reproduced" in o.out), o.describe()
        assert _printout(name, tmp_path)


def test_fuzz_scenarios(tmp_path, long_run, capsys):
    n_cases = LONG if long_run else QUICK
    t0, codes, done = time.perf_counter(), [], 0
    for i in range(n_cases):
        case = _case(i, tmp_path)
        if case is None:
            continue
        codes.append(_judge(i, *case, tmp_path))
        done += 1
        (tmp_path / f"case{i}.json").unlink()
    seconds = time.perf_counter() - t0
    refused = sum(1 for _, c in codes if c == 2)
    correct = sum(1 for _, c in codes if c != 2)
    with capsys.disabled():
        print(f"\nfuzz scenarios: {done} cases ({2 * done} runs), {refused} refused with exit 2, {correct} correct "
              f"results (exit 0 or 1), {seconds:.1f} s")
    assert refused and correct  # both kinds of outcome are exercised


# Structure-aware: hypothesis draws, for a field, a value of the field's own kind (an integer near the
# recorded one, a name another field of the same kind holds, the list with items dropped, repeated or
# reordered, the object with a key dropped or added), or any JSON value; derandomized, so reproducible.
HYPOTHESIS_QUICK, HYPOTHESIS_LONG = 150, 1500
ANY_JSON = st.recursive(st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12),
                        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
                        max_leaves=5)


def _own_kind(name, path, old):
    """Values of the same JSON kind as `old`, near it or taken from the fields of its kind."""
    kind = _kind(path)
    same_kind = [_value(DOCS[n], p) for n in SCHED_FILES for p in KINDS[n].get(kind, [])[:50]]
    if isinstance(old, bool):
        return st.booleans()
    if isinstance(old, int):
        near = st.integers(old - 2 * abs(old) - 4, old + 2 * abs(old) + 4)
        return near | st.sampled_from([0, -1, 2**31, 2**63, 2**70])
    if isinstance(old, float):
        return st.floats() | st.floats(old - abs(old) - 1, old + abs(old) + 1)
    if isinstance(old, str):
        return st.sampled_from(sorted(set(v for v in same_kind if isinstance(v, str))) or [old]) | st.text(max_size=12)
    if isinstance(old, list):
        return st.lists(st.sampled_from(old), max_size=len(old) + 2) if old else st.just([None])
    if isinstance(old, dict):
        return st.sampled_from(sorted(old)).map(lambda k: {x: v for x, v in old.items() if x != k}) | st.just(
            {**old, "unknown_field": 1})
    return ANY_JSON


def test_hypothesis_scenarios(tmp_path, long_run, capsys):
    n, codes, t0 = HYPOTHESIS_LONG if long_run else HYPOTHESIS_QUICK, [], time.perf_counter()

    @settings(max_examples=n, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def case(data):
        name = data.draw(st.sampled_from(SCHED_FILES))
        kind = data.draw(st.sampled_from(sorted(KINDS[name])))
        path = data.draw(st.sampled_from(KINDS[name][kind]))
        old = _value(DOCS[name], path)
        value = data.draw(_own_kind(name, path, old) | ANY_JSON)
        doc = _mutate(DOCS[name], path, "sibling", value)
        assume(doc is not None)
        f = tmp_path / "hypothesis.json"
        f.write_text(json.dumps(doc))
        codes.append(_judge(len(codes), name, path, "sibling", str(f), tmp_path))

    case()
    refused = sum(1 for _, c in codes if c == 2)
    with capsys.disabled():
        print(f"\nfuzz scenarios (hypothesis): {len(codes)} cases ({2 * len(codes)} runs), {refused} refused with "
              f"exit 2, {len(codes) - refused} correct results (exit 0 or 1), {time.perf_counter() - t0:.1f} s")
    assert refused and len(codes) > refused
