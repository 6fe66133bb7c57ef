"""What today's chunked allocator changes for chapter 10's LLaMA on a device that allocates at most 1 GiB
at once, like Vulkan (chapter 12, section 9).

    python benchmarks/chunked_llama.py [--all] [--max-size BYTES]

For each configuration (preset, n_ctx, n_ubatch, n_gpu_layers on one GPU): the GPU compute buffer the
2024 scheduler and allocator ask for (refused above the limit), today's chunks, their sum, the tails'
cost (the sum minus today's unbounded plan of the same split graph), the live peak (the most bytes
live at once: no layout uses less), the sum with September 2025's rule (`last_block="first"`) and what
`reuse_factor` saves against it; in MiB with two decimals, as a markdown table, then the time it took.
`--all` plans a wider grid (every preset at six context lengths, two micro-batches and three offloads)
and prints a summary instead of every row.

Every graph is llama.cpp daa9623's builder (chapter 10), not today's llama.cpp's graph. Figures, not
assertions.
"""

import argparse
import logging
import time

from ggml_lite.errors import TensorTooLargeError
from ggml_lite.llama_today import GiB, compare, table
from ggml_lite.models.llama import PRESETS

CONFIGS = [  # (preset, n_ctx, n_ubatch, n_gpu_layers)
    ("llama-2-7b", 4096, 512, 33),
    ("llama-2-7b", 12500, 512, 19),  # PR 16788's example: Vulkan, n-prompt 12500, ngl 19, ub 512
    ("llama-2-7b", 16384, 512, 33),
    ("llama-2-7b", 8192, 1024, 19),
    ("llama-2-7b", 12288, 1024, 33),
    ("llama-2-13b", 12288, 512, 20),
    ("llama-2-70b", 8192, 512, 40),
    ("llama-3-8b", 16384, 512, 19),
]


def wide_grid() -> list:
    out = []
    for name, p in PRESETS.items():
        for n_ctx in (4096, 8192, 12288, 12500, 16384, 32768):
            for n_ubatch in (512, 1024):
                out += [(name, n_ctx, n_ubatch, ngl) for ngl in (0, p.n_layer // 2, p.n_layer + 1)]
    return out


def summary(rows, unloadable: list, max_size: int) -> str:
    refused = [r for r in rows if not r.ok_2024]
    rescued = [r for r in refused if r.ok]
    big = [r for r in refused if not r.ok and r.largest > max_size]
    both = [r for r in rows if len(r.chunks) > 1 and r.ok and r.ok_first]  # chunked, both rules allocated
    saves, costs = [r for r in both if r.saved > 0], [r for r in both if r.saved < 0]
    one = [r for r in rows if r.ok != r.ok_first]

    def mib(x):
        return f"{x / 2**20:.2f} MiB"
    return "\n".join([
        f"{len(rows)} configurations; the 2024 buffer refused in {len(refused)}; today's chunks allocated in "
        f"{len(rescued)} of those, refused in {len(refused) - len(rescued)} ({len(big)} hold a single tensor "
        f"above the limit)",
        f"chunked and allocated by both rules: {len(both)}; tails cost > 0 in {sum(r.tails > 0 for r in both)} "
        f"(most {mib(max((r.tails for r in both), default=0))})",
        f"reuse_factor against September 2025 there: saves in {len(saves)} (most "
        f"{mib(max((r.saved for r in saves), default=0))}), costs in {len(costs)} (most "
        f"{mib(-min((r.saved for r in costs), default=0))}), equal in {len(both) - len(saves) - len(costs)}; "
        f"one rule allocates and the other not in {len(one)}",
        f"left out: {len(unloadable)} whose weights hold a tensor above the limit (the model does not load): "
        + ", ".join(sorted({c[0] for c in unloadable}))])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--all", action="store_true", help="the wide grid, summarised")
    ap.add_argument("--max-size", type=int, default=GiB, help="the device's largest allocation (default 1 GiB)")
    args = ap.parse_args(argv)
    logging.disable(logging.ERROR)  # the refusals log errors, as ggml-vulkan does
    t0 = time.perf_counter()
    rows, unloadable = [], []
    for c in wide_grid() if args.all else CONFIGS:
        name, n_ctx, n_ubatch, ngl = c
        try:
            rows.append(compare(name, n_ctx, n_ubatch, ngl, max_size=args.max_size))
        except TensorTooLargeError:  # a weight above the limit: llama.cpp cannot load the model there
            unloadable.append(c)
    took = time.perf_counter() - t0
    print(summary(rows, unloadable, args.max_size) if args.all else table(rows))
    print(f"\n{len(rows) + len(unloadable)} configurations, each planned four times (llama.cpp daa9623's graph), "
          f"in {took:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
