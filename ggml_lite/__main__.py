"""The command line of ggml_lite (DESIGN.md §4); a plain module, not exported from a notebook.

    python -m ggml_lite plan GRAPH.json [--json] [--step K] [--planner ggml|greedy-size|greedy-breadth|exact|best]
                             [--budget SECONDS] [--verify [--max-gib GiB]] [--ggml 2024|2026] [--export-problem P.csv]
    python -m ggml_lite solve PROBLEM.csv [--capacity BYTES] [--budget SECONDS] [--planner best] [--out OUT.csv]
    python -m ggml_lite check FIXTURE.json [--no-numerics] [--exact] [--limit N] [--max-gib GiB] [--ggml 2024|2026]
    python -m ggml_lite sched SCENARIO.json [--check]
    python -m ggml_lite exercises [--json]
    python -m ggml_lite llama (--gguf FILE | --preset NAME | --n-vocab N --n-embd N --n-layer N --n-head N --n-head-kv N
                               --n-ff N [--n-expert N --n-expert-used K]) [--n-ctx 512] [--n-batch 2048]
                               [--n-ubatch 512] [--flash-attn] [--type-k f16] [--type-v f16] [--n-gpu-layers 0]
                               [--devices 0] [--tensor-split a,b] [--no-kv-offload] [--vram GiB [--fit]] [--json]
                               (llama.cpp's short flags too: -c -b -ub -fa -ctk -ctv -ngl -ts -nkvo)

`plan` runs the graph allocator (`GAllocr.reserve`, then `alloc_graph`) on a fixture-schema graph on
the buffer type the file records (ggml's CPU type for every fixture) and prints where every tensor goes.
Both `plan` and `check` validate the file field by field before anything is built
(tests/fixtures/ggml-seed/README.md): a bad field exits 2 naming its JSON path. With `--planner`, an
offline planner of chapter 11 chooses the offsets instead (greedy by size or by breadth, the exact search,
or `best`, the smallest plan of all and ggml's; each within `--budget` seconds), and the graph allocator
places the tensors there. `--json` prints `buffer_size` (the planner's peak + 32, as the CPU buffer reports it), every
tensor's offset, and `planner`, `lower_bound` (the peak of bytes alive at once) and `optimal` (true:
proven, false: a smaller plan is known, null: unknown). Optimal means optimal for the blocks ggml's
allocator needs: its in-place reuse and its lifetimes are kept, only the offsets change. `--verify`
computes the graph in the plan on the CPU backend and compares every result a plan keeps (OUTPUT nodes
and the nodes nothing reads), bit for bit, with the graph computed with every tensor in memory of its
own; a difference or an invalid placement exits 1. A graph the CPU kernels refuse, or one that needs
more than `--max-gib` (default 2) to verify, exits 2: a 7B graph needs about 13.2 GiB.

Which graph allocator plans: the 2024 one (llama.cpp daa9623, chapters 04-05), or today's (ggml 0.15.3,
chapter 12: a compute buffer in up to 16 chunks where the buffer type has a `max_size`) for a file whose
`ggml_version` is 0.10.1 or later; `--ggml 2024|2026` overrides the file (appendix A5, `plancheck.era_of`).
`plan --json` adds `"ggml"`: "2024" or "2026", and for a plan of more than one chunk `"chunks"` (each
chunk's size) and a `"chunk"` per tensor (null outside the compute buffer; `offset` is inside the chunk).
The offline planners and --verify plan one buffer without a limit: a file whose buffer type has a
`max_size` is refused there (exit 2), whatever the era; without one, today's allocator makes one chunk,
the 2024 plan, and they plan the 2024 allocator's blocks (for a chunked plan `--json`'s `optimal` is true
when the chunks add up to the lower bound, else null). `--export-problem P.csv` also writes those blocks as
a problem file for `solve` (block k, nodes start to end: `k,start,end+1,size` in bytes; appendix A6).

`solve` plans a problem file in MiniMalloc's CSV format (appendix A6: `id,lower,upper,size`, lifespans half-open
`[lower, upper)`; every field checked first) and prints the peak, the lower bound, whether `--capacity` is met
and whether the plan is proven optimal; `--out` writes the rows with an `offset` column (exit codes below).

`check` runs the graph allocator and compares with the plan recorded in the file (offsets, buffers,
external offsets, chunks and their sizes, buffer sizes, and the allocator's messages: only its errors for a
file whose `ggml_build` says release, where ggml's debug diagnostics are compiled out; every step of a
sequence file; the first `--limit` differences are printed); when the file records computed results
(tests/fixtures/README.md) it also fills the leafs, computes the graph on the CPU backend and compares
every result within the tolerance it prints (a file needing more than `--max-gib`, default 1, to compute
is refused). It exits 0 only when everything is equal (results: within tolerance). `sched` prints the
scheduler's assignments of a recorded scenario's round-0 graph in GGML_SCHED_DEBUG format; with
`--check` it replays the whole scenario (appendix A3) and exits 0 only when everything recorded matches.
`llama` plans a LLaMA as llama.cpp (mid-2024) would (chapter 10) and prints the memory of every device,
and the lines llama.cpp prints about it; GPUs are simulated devices configured like CUDA. `--n-ctx 0` is the
model's training context, as in llama.cpp (from `--gguf` or `--preset`; refused for a model given by flags).
`--flash-attn` builds attention as one FLASH_ATTN_EXT per layer (the KV cache padded to 256 cells, V stored
untransposed, a V cache of any type); without it a V cache other than f16 is refused, as llama.cpp refuses it.
A mixture of experts comes from a GGUF's `llama.expert_count` or from `--n-expert` and `--n-expert-used`.

`exercises` lists the course's exercises (chapters 02-12, appendix A8) by chapter with their state on this
machine, from the local progress record (`~/.ggml_lite/progress.json`, or `$GGML_LITE_PROGRESS`), and says
where to go next; `--json` prints a list of `{"id", "chapter", "kind", "minutes", "done"}`.

Exit codes: 0 success; 1 the plan or a result differs from the record, a plan failed --verify, or `solve`
did not meet --capacity; 2 the file or the arguments are unusable.
"""

import argparse
import json
import os
import sys

from ggml_lite.errors import AllocationError, GGMLLiteError, GraphFileError, TensorError, UnsupportedOpError
from ggml_lite.numerics import validate_numerics, verify_numerics
from ggml_lite.plancheck import check_plan_file, check_today, era_of, plan_of, run_plan
from ggml_lite.planners import DEFAULT_BUDGET, PLANNER_NAMES, run_planner
from ggml_lite.schema import RecordedBufferType, buffer_type_of, validate_document
from ggml_lite.untrusted import read_json


def _positive(unit: str, most: float = float("inf")):
    """An argparse type: a positive, finite number of `unit`, below `most` (--budget, --max-gib)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not 0 < value < most or value == float("inf"):
            limit = f" below {most:g}" if most != float("inf") else ""
            raise argparse.ArgumentTypeError(f"expected a positive number of {unit}{limit}, got {text!r}")
        return value

    return parse


def _physical_gib() -> float:
    """This machine's physical memory in GiB (os.sysconf; 2^30 where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    except (AttributeError, ValueError, OSError):
        return 2.0**30


def _memory_gib(text: str) -> float:
    """An argparse type for --max-gib: a positive number of GiB, at most the machine's physical memory (more
    would end in running out of memory, not in a refusal: `plan --verify --max-gib 100` on a 7B graph)."""
    value, phys = _positive("GiB", 2.0**30)(text), _physical_gib()
    if value > phys:
        raise argparse.ArgumentTypeError(f"expected a positive number of GiB at most {phys:.1f}, this machine's "
                                         f"physical memory, got {text!r}")
    return value


def _count(what: str, least: int, most: int | None = None):
    """An argparse type: an integer >= `least` and <= `most` (--step, --limit, --capacity)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < least or most is not None and value > most:
            bound = f" and <= {most}" if most is not None else ""
            raise argparse.ArgumentTypeError(f"expected {what}, an integer >= {least}{bound}, got {text!r}")
        return value

    return parse


def _load(path: str) -> dict:
    """The JSON object in the file at `path`, or `GraphFileError` saying why it cannot be one (not JSON,
    NaN or Infinity, nesting too deep: `untrusted.read_json`)."""
    return read_json(path)


def _load_graph_file(path: str, record: bool = False, ggml: str | None = None) -> dict:
    """A graph file (ggml-seed schema) for `plan` and `check`, validated field by field before anything
    is built (`schema.validate_document`; `record`: with the results `check` compares, and the
    `numerics` block when there is one; the chunk fields for the era `ggml` or the file's:
    `plancheck.check_today`); a scheduler scenario is pointed to `sched`."""
    doc = _load(path)
    if doc.get("schema") == "ggml-sched-fixture":
        raise GraphFileError(f"{path} is a scheduler scenario (schema 'ggml-sched-fixture'): "
                             f"use `python -m ggml_lite sched {path}` (--check to replay it)")
    if "graph" not in doc and "steps" not in doc:
        raise GraphFileError(f"{path}: no `graph` and no `steps`: not a graph file (schema {doc.get('schema')!r})")
    validate_document(doc, record)
    check_today(doc, era_of(doc, ggml))
    return doc


def _planned(doc: dict, args):
    """`plan` with an offline planner (chapter 11), or with --verify: the graph loaded, its blocks from
    ggml's trace, the planner's result placed through the graph allocator (and computed, with --verify).
    Returns (GraphFile, allocator, PlanResult, Verification or None)."""
    from ggml_lite.graphio import allocate_external, read_graph_file
    from ggml_lite.planners import alloc_planned, blocks_of, run_planner
    from ggml_lite.verify import verify_plan

    gf = read_graph_file(doc, args.step, validate=False)  # (validated by _load_graph_file)
    allocate_external(gf)
    problem = blocks_of(gf.graph)
    result = run_planner(problem, args.planner, args.budget)
    check = None
    if args.verify:  # on a twin of the graph: the loaded one stays unplaced
        try:
            check = verify_plan(gf.graph, result, problem, max_bytes=int(args.max_gib * 2**30))
        except (TensorError, UnsupportedOpError) as e:
            raise type(e)(f"--verify: the CPU backend cannot compute this graph: {e}") from None
        except AllocationError as e:
            raise AllocationError(f"--verify: {e} (--max-gib raises it)") from None
    return gf, alloc_planned(gf.graph, result, problem), result, check


def _blocks(doc: dict, args):
    """Chapter 11's blocks of a copy of the graph (the file's buffer type): --json's ggml result, --export-problem."""
    from ggml_lite.graphio import allocate_external, read_graph_file
    from ggml_lite.planners import blocks_of

    gf = read_graph_file(doc, args.step, validate=False)  # (validated by _load_graph_file)
    allocate_external(gf)
    return blocks_of(gf.graph, buffer_type_of(doc))


def _optimal_today(result, plan) -> bool | None:
    """--json's `optimal` for a plan of today's allocator: the 2024 verdict where it made one chunk of the 2024
    plan's size; else true when its chunks add up to the lower bound, null otherwise (no planner plans chunks)."""
    sizes = plan.chunk_sizes or []
    if len(sizes) <= 1 and sum(sizes) == result.peak:
        return result.optimal
    return True if sum(sizes) == result.lower_bound else None


def cmd_plan(args) -> int:
    doc = _load_graph_file(args.file, ggml=args.ggml)
    era = era_of(doc, args.ggml)
    if "steps" in doc and args.step is None:
        with_graph = [i for i, s in enumerate(doc["steps"]) if "graph" in s]
        raise GraphFileError(f"{args.file} is a sequence of {len(with_graph)} graphs: "
                             f"pass --step (one of {with_graph})")
    if "graph" in doc and args.step is not None:
        raise GraphFileError(f"{args.file} holds one graph, not a sequence: --step {args.step} does not apply")
    limit = (doc.get("buffer_type") or {}).get("max_size")
    if (args.planner != "ggml" or args.verify) and limit is not None:
        raise GraphFileError(f"{args.file}: buffer_type.max_size: --planner and --verify plan one buffer without a "
                             f"limit; this file's buffer type allows at most {limit} bytes per buffer (today's "
                             f"allocator splits the compute buffer into chunks under it: plan without --planner "
                             f"and --verify)")
    if (args.planner != "ggml" or args.verify) and isinstance(buffer_type_of(doc), RecordedBufferType):
        raise GraphFileError(f"{args.file}: buffer_type: --planner and --verify plan on ggml's CPU buffer type "
                             f"(alignment 32); this file records {doc['buffer_type']}")
    if args.export_problem is not None:  # (appendix A6; a note on stderr with --json)
        from ggml_lite.problem_csv import export_problem

        print(export_problem(_blocks(doc, args), args.export_problem), file=sys.stderr if args.json else sys.stdout)
    if args.planner == "ggml" and not args.verify:  # the graph allocator alone, as it always was
        gf, galloc, results = run_plan(doc, args.step, validate=False, ggml=era)  # (validated by _load_graph_file)
        result, check = (run_planner(_blocks(doc, args), "ggml") if args.json else None), None
    else:
        gf, galloc, result, check = _planned(doc, args)
        results = {}
    plan = plan_of(gf, galloc)
    names = {i: gf.records[i]["name"] for i in gf.tensors}
    failed = check is not None and not check.ok
    chunked = plan.chunks is not None and len(plan.chunk_sizes or []) > 1
    if args.json:
        assert result is not None, "--json plans with a planner result (ggml's own when --planner ggml)"
        out = {"buffer_size": plan.buffer_size,
               "tensors": {names[i]: {"offset": plan.offsets[i]} for i in sorted(gf.tensors)},
               "planner": args.planner, "lower_bound": result.lower_bound,
               "optimal": _optimal_today(result, plan) if plan.chunk_sizes is not None else result.optimal,
               "ggml": era}
        if chunked:
            assert plan.chunks is not None  # (for mypy: `chunked` says so)
            out["chunks"] = plan.chunk_sizes
            for i in gf.tensors:
                out["tensors"][names[i]]["chunk"] = plan.chunks[i]
        if check is not None:
            out["verified"] = check.ok
        print(json.dumps(out, indent=1))
        return 1 if failed else 0
    print(f"{'id':>5}  {'name':40s} {'op':10s} {'bytes':>10}  {'chunk:offset' if chunked else 'offset'}")
    for i in sorted(gf.tensors):
        t, off = gf.tensors[i], plan.offsets[i]
        if off is not None and chunked:
            assert plan.chunks is not None
            off = f"{plan.chunks[i]}:{off}"
        where = off if off is not None else ("(view of external)" if t.view_src is not None and t.data is not None
                                             else "(external)" if t.data is not None else "-")
        print(f"{i:>5}  {names[i][:40]:40s} {t.op.name[:10]:10s} {t.nbytes:>10}  {where}")
    sizes = plan.chunk_sizes or []
    pieces = f" in {len(sizes)} chunks of {sizes} bytes (max_size {doc['buffer_type']['max_size']})" if chunked else ""
    print(f"compute buffer: {plan.buffer_size} bytes ({plan.buffer_size / 1024 / 1024:.2f} MiB){pieces}; "
          f"{len(gf.graph.nodes)} nodes, {len(gf.graph.leafs)} leafs; planned as ggml {era} does")
    for call, res in results.items():
        for line in res["log"]:
            print(f"log ({call}): {line}")
    if result is not None:
        print(f"planner {result.describe()}; lower bound {result.lower_bound} bytes")
    if check is not None:
        if check.ok:
            print(f"verify: {len(check.compared)} result(s) computed in this plan on the CPU backend equal, "
                  f"bit for bit, those computed with every tensor in memory of its own")
        else:
            for conflict in check.conflicts[:5]:
                print(f"verify: FAILED: invalid placement: {conflict}")
            if len(check.conflicts) > 5:
                print(f"verify: FAILED: ... and {len(check.conflicts) - 5} more overlaps")
            if check.differing:
                print(f"verify: FAILED: {', '.join(check.differing)} differ(s) from the results computed with "
                      f"every tensor in memory of its own")
            elif check.error:
                print(f"verify: FAILED: computing in this plan failed: {check.error}")
            elif check.compared:
                print(f"verify: the {len(check.compared)} result(s) computed equal the reference's, but the placement "
                      f"above is invalid (these numpy kernels read a node's sources before writing it)")
    return 1 if failed else 0


def cmd_solve(args) -> int:
    from ggml_lite.problem_csv import solve_file  # (appendix A6: the reader, the planners, the writer)

    lines, met = solve_file(args.file, args.planner, args.budget, args.capacity, args.out)
    print("\n".join(lines))
    return 0 if met else 1


def cmd_check(args) -> int:
    doc = _load_graph_file(args.file, record=True, ggml=args.ggml)
    numerics = ("numerics" in doc or doc.get("numeric", False) is not False) and not args.no_numerics
    if numerics:  # validated (and its memory bounded) before anything is planned
        validate_numerics(doc, int(args.max_gib * 2**30))
    diffs = check_plan_file(doc, limit=args.limit, ggml=args.ggml)
    if diffs:
        print(f"{args.file}: the plan differs from the recorded one; first differences:")
        for d in diffs:
            print("  " + d)
        return 1
    graphs = doc["steps"] if "steps" in doc else [doc]
    n = sum(len(g["graph"]["tensors"]) for g in graphs if "graph" in g)
    sizes = ", ".join(str(g["buffer_size"]) for g in graphs)
    chunks = [len(g["chunks"]) for g in graphs if "chunks" in g]
    pieces = f" in {', '.join(map(str, chunks))} chunk(s)" if chunks else ""
    print(f"{args.file}: plan identical to ggml's ({len(graphs)} graph(s), {n} tensors; buffer size {sizes}{pieces}; "
          f"ggml {era_of(doc, args.ggml)}'s allocator)")
    if args.no_numerics and ("numerics" in doc or doc.get("numeric")):
        print("numerics: skipped (--no-numerics)")
    return _check_numerics(args.file, doc, int(args.max_gib * 2**30), args.exact, args.ggml) if numerics else 0


def _check_numerics(path: str, doc: dict, max_bytes: int, exact: bool = False, ggml: str | None = None) -> int:
    gf, _, _ = run_plan(doc, validate=False, ggml=ggml)  # (validated by cmd_check)
    tol, rows = verify_numerics(doc, gf, exact=exact, max_bytes=max_bytes)
    tier = " with the bit-exact tier (--exact)" if exact else ""
    print(f"numerics: {len(rows)} result(s) computed on the CPU backend{tier}, tolerance {tol:g} "
          f"(max |got - want| / max |want|)")
    for name, err, ok in rows:
        print(f"  {'ok  ' if ok else 'FAIL'} {name:40s} worst relative error {err:.3g}")
    bad = sum(1 for *_, ok in rows if not ok)
    if bad:
        print(f"{path}: {bad} result(s) beyond the tolerance")
        if not exact:  # the numpy tier sums in another order than ggml; some graphs amplify that
            print("  (the numpy tier sums dot products in another order than ggml; a graph that amplifies a "
                  "last-bit difference, e.g. through a later f16 or q8_0 rounding and a softmax of large logits, "
                  "can exceed any fixed tolerance: `check --exact` computes in ggml's own order)")
        return 1
    return 0


def cmd_sched(args) -> int:
    from ggml_lite.scenario_replay import replay, scenario_printout  # appendix A3, only here

    doc = _load(args.file)  # checked by the printout and by the replay, before they build anything
    if args.limit < 1:
        raise GraphFileError(f"--limit {args.limit}: expected a positive number of differences to print")
    if not args.check:
        print(scenario_printout(doc, args.file), end="")
        return 0
    diffs = replay(doc, args.file)
    if diffs:
        print(f"{args.file}: {len(diffs)} difference(s) from the recorded scenario; the first:")
        for d in diffs[:args.limit]:
            print("  " + d)
        return 1
    rounds = sum(1 for s in doc["steps"] if s["call"] == "ggml_backend_sched_graph_compute")
    what = ("the reference's abort reproduced" if not doc["outcome"].get("completed", True) else
            f"reserve and {rounds} round(s) identical: assignments and causes, splits, copies, graph copy and "
            f"offsets, buffer sizes, debug printout and messages, backend calls, logits")
    print(f"{args.file}: {what}")
    return 0


def _causes_legend() -> str:
    """The --help text of `sched`: what the printout's columns and cause codes mean."""
    from ggml_lite.sched import CAUSES

    lines = ["The printout is ggml's GGML_SCHED_DEBUG text: per node `node #i (OP): name (size) [BACKEND cause]:`",
             "then each source the same way. As in ggml, names are cut to 20 characters, ops to 10, backend",
             "names to 5 and causes to 8 (printf's %20.20s ...); sizes are whole KiB or MiB (K, M).", "",
             "cause codes:"]
    lines += [f"  {code:7s} {meaning}" for code, meaning in CAUSES.items()]
    return "\n".join(lines)


def _llama_params(args):
    """The model of `llama`: a preset, or the hyperparameters given one by one."""
    from ggml_lite.errors import ModelError
    from ggml_lite.models.llama import LlamaParams, preset

    dims = {k: getattr(args, k) for k in ("n_vocab", "n_embd", "n_layer", "n_head", "n_head_kv", "n_ff")}
    experts = {k: getattr(args, k) for k in ("n_expert", "n_expert_used")}
    if any(v is not None for v in experts.values()) and (args.gguf is not None or args.preset is not None):
        raise ModelError("--n-expert and --n-expert-used go with hyperparameters given as flags: a GGUF file or a "
                         "preset says its own experts")
    if args.gguf is not None:
        if args.preset is not None or any(v is not None for v in dims.values()):
            raise ModelError("give one model: --gguf FILE, --preset NAME or the hyperparameters")
        from ggml_lite.models.gguf import from_gguf

        model = from_gguf(args.gguf)
        if model.header_only:  # (stderr: the report itself is the full file's)
            print(f"note: {args.gguf}: header only ({model.file_size} bytes, its tensors' data would start at byte "
                  f"{model.data_offset}): planned from the header; llama.cpp would refuse to load it", file=sys.stderr)
        return model.params, model.tensor_types, model.offsets
    if args.preset is not None:
        if any(v is not None for v in dims.values()):
            raise ModelError("give either --preset or the hyperparameters (--n-vocab ...), not both")
        params = preset(args.preset)
        return LlamaParams(**{**params.__dict__, "wtype": args.wtype or params.wtype}), None, None
    missing = [f"--{k.replace('_', '-')}" for k, v in dims.items() if v is None and k != "n_head_kv"]
    if missing:
        raise ModelError(f"no model: give --preset NAME or the hyperparameters; missing {', '.join(missing)}")
    dims["n_head_kv"] = dims["n_head"] if dims["n_head_kv"] is None else dims["n_head_kv"]
    experts = {k: 0 if v is None else v for k, v in experts.items()}
    return LlamaParams(**dims, **experts, wtype=args.wtype or "f16"), None, None


def cmd_llama(args) -> int:
    from ggml_lite.errors import ModelError
    from ggml_lite.fit import fit
    from ggml_lite.report import check_vram, format_report, memory_report

    # the flags alone first (memory_report checks the rest, with the model, before it plans)
    if args.vram is not None:
        check_vram(args.vram)
    if args.fit and (args.vram is None or args.devices < 1):
        raise ModelError("--fit needs --vram GiB and --devices N (at least one GPU)")
    if args.gguf is not None and args.wtype is not None:
        raise ModelError("--wtype does not apply to --gguf: a file's weights have their own types")
    split = None
    if args.tensor_split is not None:
        try:
            split = [float(x) for x in args.tensor_split.split(",")]
        except ValueError:
            raise ModelError(f"tensor_split (--tensor-split): expected numbers separated by commas, found "
                             f"{args.tensor_split!r}") from None
    params, tensor_types, offsets = _llama_params(args)
    if args.n_ctx == 0:  # llama.cpp: a context of 0 is the model's training context (hparams.n_ctx_train)
        if args.gguf is None and args.preset is None:
            raise ModelError("n_ctx (--n-ctx) 0 means the model's training context (a GGUF's llama.context_length), "
                             "which hyperparameters given as flags do not say: give --n-ctx N, --gguf FILE or "
                             "--preset NAME")
        if params.n_ctx_train == 0:  # (llama.cpp's words)
            raise ModelError("n_ctx (--n-ctx) 0: n_ctx and model->hparams.n_ctx_train cannot both be zero (the "
                             "model's llama.context_length is 0)")
        args.n_ctx = params.n_ctx_train
    kw = dict(n_batch=args.n_batch, n_ubatch=args.n_ubatch, tensor_split=split, type_k=args.type_k, type_v=args.type_v,
              offload_kqv=not args.no_kv_offload, tensor_types=tensor_types, flash_attn=args.flash_attn,
              tensor_offsets=offsets)
    rep = memory_report(params, args.n_ctx, n_gpu_layers=args.n_gpu_layers, devices=args.devices, **kw)
    doc = rep.to_json()
    if args.fit:  # (checked before planning: --vram and a GPU are there)
        layers, n_ctx = fit(params, args.vram, args.n_ctx, args.devices, **kw)
        doc["fit"] = {"n_gpu_layers": layers, "n_ctx": n_ctx}
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print(format_report(rep, args.vram))
        if args.fit:
            ctx = n_ctx if n_ctx else f"(none: even n_ctx {args.n_ctx} does not fit)"
            print(f"\nfit in {args.vram} GiB per GPU: n_gpu_layers {layers}, then n_ctx {ctx}")
    return 0


ERA_NAMES = ("2024", "2026")
def cmd_exercises(args) -> int:
    from ggml_lite import exercises as ex

    items, done = ex.catalog(), ex.read_progress()
    if args.json:
        print(json.dumps([{"id": e.id, "chapter": e.chapter, "kind": e.kind, "minutes": e.minutes,
                           "done": e.id in done} for e in items], indent=1))
        return 0
    kinds = {k: [e for e in items if e.kind == k] for k in ex.KINDS}
    n_done = sum(e.id in done for e in items)
    print(f"The course has {len(items)} exercises in {len(ex.CHAPTERS)} chapters, "
          f"{sum(e.minutes for e in items) / 60:.1f} hours in all; {n_done} done here ("
          + ", ".join(f"{k} {sum(e.id in done for e in v)}/{len(v)}" for k, v in kinds.items()) + ").")
    for number in sorted(ex.CHAPTERS):
        chapter = ex.CHAPTERS[number]
        print(f"\n{number} · {chapter.title} (notebooks/{chapter.notebook}.ipynb)")
        for e in (e for e in items if e.chapter == number):
            print(f"  [{'x' if e.id in done else ' '}] {e.id:5} {e.kind:9} {e.minutes:3d} min  {e.level:6}  {e.title}")
    todo = [e for e in items if e.id not in done]
    if todo:
        where = ex.CHAPTERS[todo[0].chapter].notebook
        print(f"\nNext: {todo[0].id} ({todo[0].kind}, {todo[0].title}) in notebooks/{where}.ipynb; `make lab` "
              "opens the notebooks. Solutions: appendices A8 to A10, after trying.")
    else:
        print("\nEvery exercise is done.")
    print(f"Progress is kept in {ex.progress_path()}.")
    return 0


ERA_HELP = ("the graph allocator: 2024 (llama.cpp daa9623) or 2026 (ggml 0.15.3: chunked compute buffers); default: "
            "the file's ggml_version (0.10.1 or later: 2026), else 2024")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ggml_lite", description="ggml's memory planner, in Python.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="plan a fixture-schema graph with the graph allocator (CPU buffer type)")
    p.add_argument("file", metavar="GRAPH.json", help="a fixture-schema JSON file")
    p.add_argument("--json", action="store_true",
                   help='print {"buffer_size": int, "tensors": {name: {"offset": int|null}}, "planner", "lower_bound", '
                   '"optimal": true|false|null, "ggml": "2024"|"2026"} (and "verified" with --verify; "chunks" and a '
                   'tensor\'s "chunk" for a plan of more than one chunk)')
    p.add_argument("--step", type=_count("a step number", 0), default=None, help="the step of a sequence file")
    p.add_argument("--planner", choices=PLANNER_NAMES, default="ggml",
                   help="who chooses the offsets: ggml's graph allocator (default) or an offline planner "
                   "(chapter 11)")
    p.add_argument("--budget", type=_positive("seconds"), default=DEFAULT_BUDGET, metavar="SECONDS",
                   help=f"seconds the offline planners may take, their starting plans included (default "
                   f"{DEFAULT_BUDGET}); a planner stopped by it places a valid plan and says 'stopped by its "
                   f"budget'")
    p.add_argument("--verify", action="store_true",
                   help="compute the graph in the plan on the CPU backend and compare it bit for bit with the graph "
                   "computed with every tensor in memory of its own (exit 1 on a difference)")
    p.add_argument("--max-gib", type=_memory_gib, default=2.0, metavar="GiB",
                   help="memory --verify may use (default 2; a 7B graph needs about 13.2; at most the physical memory)")
    p.add_argument("--ggml", choices=ERA_NAMES, default=None, help=ERA_HELP)
    p.add_argument("--export-problem", metavar="P.csv", default=None,
                   help="also write the graph's blocks as a problem file for `solve` (id,lower,upper,size)")
    p.set_defaults(run=cmd_plan)
    v = sub.add_parser("solve", help="plan a problem file in MiniMalloc's CSV format (id,lower,upper,size)")
    v.add_argument("file", metavar="PROBLEM.csv", help="a problem file: header id,lower,upper,size, one block a row")
    v.add_argument("--capacity", type=_count("a number of bytes", 1, 2**63 - 1), default=None, metavar="BYTES",
                   help="the bytes the plan must fit in: exit 0 when it does, 1 when it does not within the budget")
    v.add_argument("--budget", type=_positive("seconds"), default=DEFAULT_BUDGET, metavar="SECONDS",
                   help=f"seconds the planner may take (default {DEFAULT_BUDGET}), then it returns its best plan")
    v.add_argument("--planner", choices=[n for n in PLANNER_NAMES if n != "ggml"], default="best",
                   help="who chooses the offsets (chapter 11; default best, the smallest plan of them all)")
    v.add_argument("--out", metavar="OUT.csv", default=None, help="write the rows with an offset column there")
    v.set_defaults(run=cmd_solve)
    c = sub.add_parser("check", help="plan again and compare with the plan recorded in the file")
    c.add_argument("file", metavar="FIXTURE.json", help="a ggml-seed fixture file")
    c.add_argument("--no-numerics", action="store_true", help="compare the plan only, not the recorded results")
    c.add_argument("--exact", action="store_true", help="compute with the bit-exact tier (appendix A2: ggml's AVX2 "
                   "summation order) instead of plain numpy")
    c.add_argument("--limit", type=_count("a number of differences", 1), default=10,
                   help="how many differences to print (default 10)")
    c.add_argument("--max-gib", type=_memory_gib, default=1.0, metavar="GiB",
                   help="memory the numerics check may use (default 1, at most the physical memory); a file that "
                   "needs more is refused")
    c.add_argument("--ggml", choices=ERA_NAMES, default=None, help=ERA_HELP)
    c.set_defaults(run=cmd_check)
    d = sub.add_parser("sched", help="the scheduler's assignments of a recorded scenario (GGML_SCHED_DEBUG format)",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_causes_legend())
    d.add_argument("file", metavar="SCENARIO.json", help="a ggml-seed-sched scenario file")
    d.add_argument("--check", action="store_true", help="replay the whole scenario and compare everything recorded")
    d.add_argument("--limit", type=int, default=10, help="how many differences to print (default 10)")
    d.set_defaults(run=cmd_sched)
    m = sub.add_parser("llama", help="the memory of a LLaMA per device, as llama.cpp (mid-2024) allocates it")
    m.add_argument("--gguf", metavar="FILE",
                   help="a GGUF model file (only its header is read; sparse and header-only files work)")
    m.add_argument("--preset",
                   help="a model by name: llama-2-7b, llama-3.1-70b, mistral-7b, ... (see the error for all)")
    for dim in ("n-vocab", "n-embd", "n-layer", "n-head", "n-head-kv", "n-ff"):
        m.add_argument(f"--{dim}", type=int, default=None)
    m.add_argument("--n-expert", type=int, default=None, help="a mixture of experts: experts per layer (0 to 160)")
    m.add_argument("--n-expert-used", type=int, default=None, help="experts each token uses (1 to --n-expert)")
    m.add_argument("--wtype", default=None, help="the weights' type (default f16)")
    # (llama.cpp's short flags as aliases: -c, -b, -ub, -fa, -ctk, -ctv, -ngl, -ts, -nkvo)
    m.add_argument("--n-ctx", "-c", type=int, default=512, help="the context (1 to 2^31 - 32; padded to 32, to 256 "
                   "with --flash-attn); 0: the model's training context, from --gguf or --preset")
    m.add_argument("--flash-attn", "-fa", action="store_true",
                   help="flash attention (llama.cpp's -fa): FLASH_ATTN_EXT, the cache padded to 256, any V cache type")
    m.add_argument("--n-batch", "-b", type=int, default=2048, help="the logical batch (0 to 2^31 - 1)")
    m.add_argument("--n-ubatch", "-ub", type=int, default=512, help="the micro-batch (0 to 2^31 - 1)")
    m.add_argument("--type-k", "-ctk", default="f16",
                   help="the K cache's type: f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1")
    m.add_argument("--type-v", "-ctv", default="f16", help="the V cache's type, as --type-k; other than f16 only with "
                   "--flash-attn, as in llama.cpp")
    m.add_argument("--n-gpu-layers", "-ngl", type=int, default=0,
                   help="layers on the GPUs (n_layer + 1: the output too)")
    m.add_argument("--devices", type=int, default=0, help="number of GPUs, 0 to 15 (simulated, configured like CUDA; "
                   "the scheduler takes GGML_SCHED_MAX_BACKENDS = 16 backends, the CPU being one)")
    m.add_argument("--tensor-split", "-ts", default=None, help="the layers' share of each GPU, one finite weight >= 0 "
                   "per GPU, e.g. 3,1 (default even)")
    m.add_argument("--no-kv-offload", "-nkvo", action="store_true", help="keep the KV cache on the host")
    m.add_argument("--vram", type=float, default=None, help="GiB per GPU, finite, above 0 and at most 2^34: say "
                   "whether each one fits")
    m.add_argument("--fit", action="store_true",
                   help="with --vram: the largest n_gpu_layers that fits, then the largest n_ctx")
    m.add_argument("--json", action="store_true", help="print the report as JSON (sizes in bytes)")
    m.set_defaults(run=cmd_llama, file="the llama arguments")
    e = sub.add_parser("exercises", help="the course's exercises by chapter, and which are done on this machine")
    e.add_argument("--json", action="store_true",
                   help='print a list of {"id", "chapter", "kind": "predict"|"implement"|"explore", "minutes", '
                   '"done"}')
    e.set_defaults(run=cmd_exercises, file="the exercises")
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except BrokenPipeError:  # the reader (e.g. `| head`) stopped reading: not an error of ours
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (GGMLLiteError, OSError) as e:
        where = "" if str(args.file) in str(e) or args.file in ("the llama arguments", "the exercises") \
            else f"{args.file}: "
        print(f"error: {type(e).__name__}: {where}{e}", file=sys.stderr)
        return 2
    except MemoryError:  # (what --max-gib and the readers' bounds did not foresee: a message, not "internal")
        hint = "; a lower --max-gib refuses such a file before trying" if hasattr(args, "max_gib") else ""
        print(f"error: AllocationError: {args.file}: not enough memory on this machine to process this input "
              f"(MemoryError){hint}", file=sys.stderr)
        return 2
    except Exception as e:  # the last resort: no input may end in a traceback
        # Every reader validates before it builds, so reaching this line is a bug of ggml_lite (the fuzz
        # tests fail on the word "internal"); the user still gets the file and a message, and exit 2.
        print(f"error: {args.file}: internal error while processing this input "
              f"({type(e).__name__}: {str(e)[:300]}); please report it", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
