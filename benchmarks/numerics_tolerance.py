"""The numpy tier's tolerance, measured: whole graphs computed by the real ggml and by ggml_lite.

    python benchmarks/numerics_tolerance.py [--mlp 96] [--attention 96] [--seed 22] [--data-seed 1234] [--quiet]

The corpus is `ggml_oracle.numeric_corpus`: MLPs of 1-4 layers with softmax heads and LLaMA-like
attention stacks (rms_norm, rope, Q/K/V mul_mats, soft_max_ext with mask and scale, GQA, a SiLU FFN,
a softmax head), widths 32-512, f32/f16/q8_0/q4_0 weights, f32/f16 K/V and masks, every leaf filled
by the numerics generator of tests/fixtures/README.md (uniform [-1, 1), unscaled). ggml computes each
graph through ggml-python (`ggml_oracle.ggml_results`, forked children in batches); ggml_lite
computes it as `check` does (GAllocr plan, `cpu_init(exact=...)`), with

* `numpy`     the default tier (`cpu_init()`), which converts mul_mat's f32 src1 to the dot type;
* `unconv.`   the same tier without that conversion (an f32 src1 multiplied in f32, as before issue 22);
* `exact`     the bit-exact tier (`cpu_init(exact=True)`, appendix A2);
* `order`     the exact tier with BLAS's dot-product order (`OtherOrder`): what a ggml build that adds
              dot products in another order does (AVX-512, NEON). Its distance from the oracle is the
              graph's own sensitivity to that order.

For every result (the OUTPUT nodes and the last node: the logits and the softmax) the error is
normwise, max |ours - ggml| / max |ggml|, as `check` measures it; a graph's figure is its worst
result. The summary gives, per class (f32 only / f16 or quantized tensors involved, the classes of
`Arithmetic.TOLERANCE_F32` / `TOLERANCE_MIXED`), the worst and median of each tier, how many graphs
were beyond the stated tolerance before the conversion and are now, the largest ratio numpy / order,
and for candidate tolerances T the graphs in scope (`order` <= T/2: two dot-product orders of ggml
agree within half of T), the worst numpy error among them and the margin. A graph out of scope
amplifies rounding so much that no build-independent tolerance holds for it; `check --exact` is its
check. The exact tier is 0 on every graph without an op family that ggml 0.15.3 computes differently
from the reference the kernels follow (normal-mode rope, norm, f32 mul_mat with K % 32 != 0; see
tests/differential/test_compute_differential.py) when the oracle sums in the reproduced order (the AVX2 build
`make setup` installs); those graphs are counted apart.
"""

import argparse
import collections
import math
import sys
import time

import numpy as np

import ggml_lite as gl
import ggml_oracle as O
from ggml_lite.cpu import Arithmetic
from ggml_lite.exact import ExactArithmetic
from ggml_oracle import normwise_error
from ggml_oracle import version_dependent as node_version_dependent

BATCH = 16     # graphs computed by ggml in one forked child


class OtherOrder(ExactArithmetic):
    """ggml's AVX2 arithmetic in every step but mul_mat's summation order, which is BLAS's (after the
    same conversion of src1): what a ggml build with another dot-product order (AVX-512's 16 lanes,
    NEON's 4, llamafile's sgemm) does. Its distance from the oracle measures how much a graph's
    results depend on that order at all."""

    name = "exact-blas-order"
    mul_mat = Arithmetic.mul_mat


TIERS = {"numpy": gl.cpu_init().arith, "unconv.": O.UnconvertedArithmetic(), "exact": gl.cpu_init(exact=True).arith,
         "order": OtherOrder()}


def version_dependent(graph) -> bool:
    """Does the graph hold an op family ggml 0.15.3 computes differently from the reference?"""
    return any(node_version_dependent(n) for n in graph.nodes)


def measure(corpus, data_seed: int, quiet: bool) -> list:
    """One row per graph: (graph, class, version-dependent, {tier: worst normwise error})."""
    rows = []
    for start in range(0, len(corpus), BATCH):
        batch = corpus[start:start + BATCH]
        answers = O.run_batch(O.ggml_results, [(ng, data_seed) for ng in batch])
        for ng, theirs in zip(batch, answers):
            if isinstance(theirs, O.GGMLAbort):
                raise RuntimeError(f"{ng.label}: ggml failed: {theirs}")
            want = [O.result_values(t, raw).astype(np.float64) for t, raw in zip(ng.results(), theirs)]
            got = O.lite_numeric_results(ng, data_seed, TIERS)
            errs = {name: max(normwise_error(g, w) for g, w in zip(got[name], want)) for name in TIERS}
            row = (ng, "mixed" if ng.mixed() else "f32", version_dependent(ng.graph), errs)
            rows.append(row)
            if not quiet:
                print(f"{ng.label:78s} " + "  ".join(f"{k} {v:8.2e}" for k, v in errs.items()), flush=True)
    return rows


def summary(rows) -> list:
    """The figures per class: the worst and median errors of each tier, and for candidate tolerances T
    the graphs in scope (two dot-product orders of ggml agree within T/2: `order` <= T/2), the worst
    numpy error among them and how many graphs are out of scope (ill-conditioned)."""
    lines = []
    stated = {"f32": Arithmetic.TOLERANCE_F32, "mixed": Arithmetic.TOLERANCE_MIXED}
    for cls in ("f32", "mixed"):
        sel = [r for r in rows if r[1] == cls]
        if not sel:
            continue
        worst = {k: max(r[3][k] for r in sel) for k in TIERS}
        which = max(sel, key=lambda r: r[3]["numpy"])[0].label
        lines.append(f"{cls}: {len(sel)} graphs; numpy worst {worst['numpy']:.2e} ({which}), median "
                     f"{np.median([r[3]['numpy'] for r in sel]):.2e}; another dot-product order worst "
                     f"{worst['order']:.2e}; exact worst {worst['exact']:.2e}")
        lines.append(f"  before the conversion (unconv.): worst {worst['unconv.']:.2e}, "
                     f"{sum(1 for r in sel if r[3]['unconv.'] > stated[cls])} graphs beyond {stated[cls]:g}; now "
                     f"{sum(1 for r in sel if r[3]['numpy'] > stated[cls])} beyond it")
        ratio = max((r[3]["numpy"] / r[3]["order"] for r in sel if r[3]["order"] > 1e-6), default=0.0)
        lines.append(f"  numpy / another order, where the latter > 1e-6: at most {ratio:.2f}")
        for tol in sorted({1e-5, 1e-4, 1e-3, 2e-3, 5e-3, 1e-2, stated[cls]}):
            scope = [r for r in sel if r[3]["order"] <= tol / 2]
            w = max((r[3]["numpy"] for r in scope), default=0.0)
            mark = "  <- stated" if tol == stated[cls] else ""
            lines.append(f"  T = {tol:<6g}: {len(scope):3d} graphs whose orders agree within T/2, numpy worst "
                         f"{w:.2e} ({'within T' if w <= tol else 'BEYOND T'}, "
                         f"margin {tol / w if w else math.inf:.1f}); "
                         f"{len(sel) - len(scope)} out of scope{mark}")
    clean = [r for r in rows if not r[2]]
    lines.append(f"exact tier: {sum(1 for r in clean if r[3]['exact'] == 0)} of {len(clean)} graphs without "
                 f"version-dependent ops bit-identical; worst of the {len(rows) - len(clean)} with them "
                 f"{max((r[3]['exact'] for r in rows if r[2]), default=0):.2e}")
    by_family: dict[str, float] = collections.defaultdict(float)
    for ng, _cls, _, errs in rows:
        key = f"{ng.label.split()[0]} w={'/'.join(sorted(ng.weight_types))}"
        by_family[key] = max(by_family[key], errs["numpy"])
    lines.append("numpy worst by family and weight type: " +
                 ", ".join(f"{k} {v:.1e}" for k, v in sorted(by_family.items())))
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mlp", type=int, default=96, help="MLP graphs in the corpus (default 96)")
    ap.add_argument("--attention", type=int, default=96, help="attention graphs in the corpus (default 96)")
    ap.add_argument("--seed", type=int, default=22, help="corpus seed (default 22)")
    ap.add_argument("--data-seed", type=int, default=1234, help="leaf data seed (default 1234)")
    ap.add_argument("--quiet", action="store_true", help="only the summary")
    args = ap.parse_args(argv)
    if not O.available():
        print(f"ggml-python is not importable: {O.IMPORT_ERROR}", file=sys.stderr)
        return 2
    print(O.describe_build())
    t0 = time.perf_counter()
    corpus = O.numeric_corpus(args.mlp, args.attention, args.seed)
    rows = measure(corpus, args.data_seed, args.quiet)
    for line in summary(rows):
        print(line)
    print(f"{len(rows)} graphs in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
