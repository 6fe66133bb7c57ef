"""How long the memory report of a large model takes (chapter 10).

    python benchmarks/report_speed.py [--repeat 5]

1. In process: `memory_report` of Llama-3.1-70B at n_ctx 8192 on 2 devices with 81 layers offloaded
   (graph build of 2,566 nodes + placement + the scheduler's reserve with pipeline parallelism), and
   of Llama-2 7B on one GPU; medians of `--repeat` runs of CPU time (`time.process_time`), in ms.
2. The command `python -m ggml_lite llama --preset llama-3.1-70b --n-ctx 8192 --devices 2
   --n-gpu-layers 81`, start-up included: median wall time of `--repeat` runs, in s.

Figures, not assertions (the goal: 150 ms in process, 1.5 s for the command).
"""

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from ggml_lite.models.llama import PRESETS  # noqa: E402
from ggml_lite.report import memory_report  # noqa: E402


def in_process(repeat: int, preset: str, **kw) -> float:
    samples = []
    for _ in range(repeat):
        t0 = time.process_time()
        memory_report(PRESETS[preset], **kw)
        samples.append(time.process_time() - t0)
    return statistics.median(samples) * 1e3


def command(repeat: int) -> float:
    argv = [sys.executable, "-m", "ggml_lite", "llama", "--preset", "llama-3.1-70b", "--n-ctx", "8192",
            "--devices", "2", "--n-gpu-layers", "81"]
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True, cwd=ROOT)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    memory_report(PRESETS["llama-2-7b"])  # warm up (first imports)
    t7 = in_process(args.repeat, "llama-2-7b", n_ctx=512, n_gpu_layers=33, devices=1)
    t70 = in_process(args.repeat, "llama-3.1-70b", n_ctx=8192, n_gpu_layers=81, devices=2)
    print(f"in process, median of {args.repeat} (CPU time):")
    print(f"  Llama-2 7B, 1 GPU, n_ctx 512           : {t7:7.1f} ms")
    print(f"  Llama-3.1 70B, 2 GPUs, 81 layers, 8192 : {t70:7.1f} ms   (goal <= 150 ms)")
    print(f"command, start-up included, median of {args.repeat} (wall time): {command(args.repeat):.2f} s   "
          "(goal <= 1.5 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
