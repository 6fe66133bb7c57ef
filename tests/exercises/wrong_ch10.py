"""Plausible wrong solutions of chapter 10's implement-exercise (10.2: which layers llama.cpp offloads, and to
which GPU), each with the rule its grader must name when it rejects it."""

import bisect
from functools import partial

import numpy as np


def gpu_layers(n_layer, n_gpu_layers, n_devices, tensor_split=None, front=False, output_at=1, cap=True,
               right=True, need_devices=True, use_split=True):
    """`llm_load_tensors`' layer placement with one of its rules changed by a flag."""
    if n_devices == 0 and need_devices:
        n_gpu_layers = 0
    n_dev = max(n_devices, 1)
    i_gpu_start = max(n_layer - n_gpu_layers, 0)
    splits = (list(tensor_split or []) if use_split else [])[:n_dev]
    splits += [0.0] * (n_dev - len(splits))
    if not any(splits):
        splits = [1.0] * n_dev
    points = np.cumsum(np.asarray(splits, dtype=np.float32), dtype=np.float32)
    points = list(points / points[-1])
    act = min(n_gpu_layers, n_layer + 1) if cap else n_gpu_layers
    find = bisect.bisect_right if right else bisect.bisect_left

    def gpu(k):
        return f"GPU{min(find(points, np.float32(k) / np.float32(act)), n_dev - 1)}"
    if front:
        layers = [gpu(i) if i < min(n_gpu_layers, n_layer) else "CPU" for i in range(n_layer)]
    else:
        layers = ["CPU" if i < i_gpu_start else gpu(i - i_gpu_start) for i in range(n_layer)]
    output = gpu(act - 1) if n_gpu_layers >= n_layer + output_at else "CPU"
    return layers, output


WRONG = {
    "10.2": [
        ("offload the first layers instead of the last", partial(gpu_layers, front=True), "cpu layers"),
        ("offload the output once every layer is offloaded", partial(gpu_layers, output_at=0), "output"),
        ("divide by n_gpu_layers, not min(n_gpu_layers, n_layer + 1)", partial(gpu_layers, cap=False), "act"),
        ("lower bound: a fraction on a split point stays on the GPU before", partial(gpu_layers, right=False),
         "upper bound"),
        ("offload with no GPU", partial(gpu_layers, need_devices=False), "no devices"),
        ("ignore tensor_split: always an even split", partial(gpu_layers, use_split=False), "split points"),
    ],
}
