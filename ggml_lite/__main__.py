"""The command line of ggml_lite (DESIGN.md §4); a plain module, not exported from a notebook.

    python -m ggml_lite plan GRAPH.json [--json] [--step K]
    python -m ggml_lite check FIXTURE.json [--no-numerics]
    python -m ggml_lite sched SCENARIO.json [--check]

`plan` runs the graph allocator (`GAllocr.reserve`, then `alloc_graph`) on a fixture-schema graph on
the CPU buffer type and prints where every tensor goes. `check` does the same and compares with the
plan recorded in the file (offsets, buffer sizes, and the allocator's messages; every step of a
sequence file); when the file records computed results (../shared/fixtures/NUMERICS.md) it also fills
the leafs, computes the graph on the CPU backend and compares every result within the tolerance it
prints. It exits 0 only when everything is equal (results: within tolerance). `sched` prints the
scheduler's assignments of a recorded scenario's round-0 graph in GGML_SCHED_DEBUG format; with
`--check` it replays the whole scenario (chapter 06) and exits 0 only when everything recorded matches.

Exit codes: 0 success; 1 the plan or a result differs from the record; 2 the file or the arguments
are unusable.
"""

import argparse
import json
import sys
from pathlib import Path

from ggml_lite.errors import GGMLLiteError
from ggml_lite.graphio import check_plan_file, plan_of, run_plan
from ggml_lite.numerics import verify_numerics



def _load(path: str) -> dict:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None


def cmd_plan(args) -> int:
    doc = _load(args.graph)
    if "steps" in doc and args.step is None:
        with_graph = [i for i, s in enumerate(doc["steps"]) if "graph" in s]
        raise ValueError(f"{args.graph} is a sequence of {len(with_graph)} graphs: pass --step (one of {with_graph})")
    gf, galloc, results = run_plan(doc, args.step)
    plan = plan_of(gf, galloc)
    names = {i: gf.records[i]["name"] for i in gf.tensors}
    if args.json:
        out = {"buffer_size": plan.buffer_size,
               "tensors": {names[i]: {"offset": plan.offsets[i]} for i in sorted(gf.tensors)}}
        print(json.dumps(out, indent=1))
        return 0
    print(f"{'id':>5}  {'name':40s} {'op':10s} {'bytes':>10}  offset")
    for i in sorted(gf.tensors):
        t, off = gf.tensors[i], plan.offsets[i]
        where = off if off is not None else ("(view of external)" if t.view_src is not None and t.data is not None
                                             else "(external)" if t.data is not None else "-")
        print(f"{i:>5}  {names[i][:40]:40s} {t.op.name[:10]:10s} {t.nbytes:>10}  {where}")
    print(f"compute buffer: {plan.buffer_size} bytes ({plan.buffer_size / 1024 / 1024:.2f} MiB); "
          f"{len(gf.graph.nodes)} nodes, {len(gf.graph.leafs)} leafs")
    for call, res in results.items():
        for line in res["log"]:
            print(f"log ({call}): {line}")
    return 0


def cmd_check(args) -> int:
    doc = _load(args.fixture)
    diffs = check_plan_file(doc, limit=args.limit)
    if diffs:
        print(f"{args.fixture}: the plan differs from the recorded one; first differences:")
        for d in diffs:
            print("  " + d)
        return 1
    graphs = doc["steps"] if "steps" in doc else [doc]
    n = sum(len(g["graph"]["tensors"]) for g in graphs if "graph" in g)
    sizes = ", ".join(str(g["buffer_size"]) for g in graphs)
    print(f"{args.fixture}: plan identical to ggml's ({len(graphs)} graph(s), {n} tensors; buffer size {sizes})")
    if doc.get("numeric") or "numerics" in doc:
        if args.no_numerics:
            print("numerics: skipped (--no-numerics)")
            return 0
        return _check_numerics(args.fixture, doc)
    return 0


def _check_numerics(path: str, doc: dict) -> int:
    gf, _, _ = run_plan(doc)
    tol, rows = verify_numerics(doc, gf)
    print(f"numerics: {len(rows)} result(s) computed on the CPU backend, tolerance {tol:g} "
          f"(max |got - want| / max |want|)")
    for name, err, ok in rows:
        print(f"  {'ok  ' if ok else 'FAIL'} {name:40s} worst relative error {err:.3g}")
    bad = sum(1 for *_, ok in rows if not ok)
    if bad:
        print(f"{path}: {bad} result(s) beyond the tolerance")
        return 1
    return 0


def cmd_sched(args) -> int:
    from ggml_lite.scenario import replay, scenario_printout  # chapter 06; imported only for this command

    doc = _load(args.scenario)
    if doc.get("schema") != "ggml-sched-fixture":
        raise ValueError(f"{args.scenario}: not a scheduler scenario (schema {doc.get('schema')!r})")
    if not args.check:
        print(scenario_printout(doc), end="")
        return 0
    diffs = replay(doc)
    if diffs:
        print(f"{args.scenario}: {len(diffs)} difference(s) from the recorded scenario; the first:")
        for d in diffs[:args.limit]:
            print("  " + d)
        return 1
    rounds = sum(1 for s in doc["steps"] if s["call"] == "ggml_backend_sched_graph_compute")
    what = ("the reference's abort reproduced" if not doc["outcome"].get("completed", True) else
            f"reserve and {rounds} round(s) identical: assignments and causes, splits, copies, graph copy and "
            f"offsets, buffer sizes, debug printout and messages, backend calls, logits")
    print(f"{args.scenario}: {what}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ggml_lite", description="ggml's memory planner, in Python.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="plan a fixture-schema graph with the graph allocator (CPU buffer type)")
    p.add_argument("graph", help="a fixture-schema JSON file")
    p.add_argument("--json", action="store_true", help='print {"buffer_size": int, "tensors": {name: {"offset": int|null}}}')
    p.add_argument("--step", type=int, default=None, help="the step of a sequence file")
    p.set_defaults(run=cmd_plan)
    c = sub.add_parser("check", help="plan again and compare with the plan recorded in the file")
    c.add_argument("fixture", help="a ggml-seed fixture file")
    c.add_argument("--no-numerics", action="store_true", help="compare the plan only, not the recorded results")
    c.add_argument("--limit", type=int, default=10, help="how many differences to print (default 10)")
    c.set_defaults(run=cmd_check)
    d = sub.add_parser("sched", help="the scheduler's assignments of a recorded scenario (GGML_SCHED_DEBUG format)")
    d.add_argument("scenario", help="a ggml-seed-sched scenario file")
    d.add_argument("--check", action="store_true", help="replay the whole scenario and compare everything recorded")
    d.add_argument("--limit", type=int, default=10, help="how many differences to print (default 10)")
    d.set_defaults(run=cmd_sched)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except BrokenPipeError:  # the reader (e.g. `| head`) stopped reading: not an error of ours
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (GGMLLiteError, OSError, ValueError, KeyError) as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
