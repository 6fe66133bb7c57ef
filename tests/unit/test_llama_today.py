"""Chapter 12, section 9 (ggml_lite.llama_today): chapter 10's LLaMA on a GPU that allocates at most 1 GiB at
once, like Vulkan. The graphs are llama.cpp daa9623's builder; the figures asserted are the ones measured
(benchmarks/chunked_llama.py prints them all)."""

import logging

import pytest

from ggml_lite.gallocr_today import GAllocr2026
from ggml_lite.llama_today import GiB, LimitedSimBufferType, compare, table, vulkan_like
from ggml_lite.models.llama import PRESETS, cuda_like, plan_memory
from ggml_lite.sched import BackendSched
from ggml_lite.sched_today import BackendSched2026

MiB = 1 << 20


def mib(n) -> str:
    return f"{n / MiB:.2f}"


def sizes(r) -> dict:
    return {name: d["compute"] for name, d in r["devices"].items()}


def test_the_seam_keeps_chapter_10s_numbers():
    """The defaults are chapter 10's GPU and scheduler; a 1 GiB limit the buffer stays below changes nothing."""
    p7 = PRESETS["llama-2-7b"]
    base = plan_memory(p7, 512, n_gpu_layers=33, devices=1)
    same = plan_memory(p7, 512, n_gpu_layers=33, devices=1, gpu_init=cuda_like, sched_class=BackendSched)
    limited = plan_memory(p7, 512, n_gpu_layers=33, devices=1, gpu_init=vulkan_like())
    assert base["reserved"] and same["reserved"] and limited["reserved"]
    assert sizes(base) == sizes(same) == sizes(limited)
    assert mib(base["devices"]["GPU0"]["compute"]) == "70.50"  # what llama.cpp printed (test_llama)
    assert (base["nodes"], base["splits"]) == (limited["nodes"], limited["splits"]) == (1030, 2)


def test_the_limited_buffer_type_refuses_only_above_its_max_size(caplog):
    buft = LimitedSimBufferType("GPU0", 128, 4096)
    assert buft.get_max_size() == 4096 and buft.alloc_buffer(4096).get_size() == 4096
    with caplog.at_level(logging.ERROR, logger="ggml_lite"):
        assert buft.alloc_buffer(4097) is None
    assert "4097" in caplog.text


def test_2024_fails_where_today_chunks(caplog):
    """PR 16788's configuration (Llama-2 7B, 19 layers offloaded, micro-batch 512, n_ctx 12,500): the 2024
    scheduler and allocator ask for one 1049.94 MiB buffer and the reserve fails; today's allocates two
    chunks under the limit whose sum is that buffer."""
    args = dict(n_ctx=12500, n_ubatch=512, n_gpu_layers=19, devices=1, gpu_init=vulkan_like())
    with caplog.at_level(logging.ERROR, logger="ggml_lite"):
        old = plan_memory(PRESETS["llama-2-7b"], **args)
    assert not old["reserved"] and "failed to allocate GPU0 buffer" in caplog.text
    assert mib(old["sched"].galloc.buf_tallocs[0].get_max_size()) == "1049.94"
    new = plan_memory(PRESETS["llama-2-7b"], **args, sched_class=BackendSched2026)
    assert new["reserved"]
    chunks = new["sched"].galloc.chunk_sizes(0)
    assert [mib(c) for c in chunks] == ["267.94", "782.00"] and all(c <= GiB for c in chunks)
    assert new["devices"]["GPU0"]["compute"] == sum(chunks)  # a SIM buffer is exactly the size asked


def test_the_row_of_pr_16788s_configuration():
    """Tails cost nothing here, and September 2025's rule would have asked 684.25 MiB more: the saving
    PR 16788 reported for its own graph (1711.19 -> 1026.94 MiB)."""
    r = compare("llama-2-7b", 12500, 512, 19)
    assert not r.ok_2024 and r.ok and r.ok_first
    assert mib(r.buffer_2024) == mib(r.unbounded) == mib(sum(r.chunks)) == "1049.94" and r.tails == 0
    assert mib(r.live_peak) == "1017.94" and mib(r.largest) == "782.00"
    assert mib(sum(r.chunks_first)) == "1734.19" and mib(r.saved) == "684.25" == f"{1711.19 - 1026.94:.2f}"
    assert sum(r.chunks) <= sum(r.chunks_first)


def test_reuse_factor_can_cost():
    """Micro-batch 1024 at n_ctx 8192: each layer's KQ is exactly the limit. `reuse_factor` puts a small
    tensor at the start of the chunk the last KQ freed (it fits there without growing a chunk), so the
    next KQ opens a third chunk; September 2025's rule grows the first chunk instead."""
    r = compare("llama-2-7b", 8192, 1024, 19)
    assert [mib(c) for c in r.chunks] == ["224.00", "1024.00", "1024.00"] and r.ok
    assert mib(sum(r.chunks_first)) == "1415.00" and mib(r.saved) == "-857.00" and mib(r.tails) == "960.00"


def test_a_tensor_above_the_limit_gets_a_chunk_of_its_own_which_the_device_refuses():
    """n_ctx 32,768: a 2 GiB KQ. Every chunk is at most the limit unless one tensor is larger."""
    r = compare("llama-2-7b", 32768, 512, 33)
    assert not r.ok_2024 and not r.ok and r.largest == 2 * GiB
    assert [mib(c) for c in r.chunks] == ["104.00", "2048.00"]
    assert all(c <= max(GiB, r.largest) for c in r.chunks)


@pytest.mark.parametrize("config", [("llama-2-7b", 16384, 512, 33), ("llama-3-8b", 16384, 512, 19)])
def test_the_scheduler_of_today_gives_the_2024_schedulers_numbers(config):
    """Measured: on these graphs today's scheduler (30 inputs, op_offload) and the 2024 one with today's
    allocator plan the GPU's compute buffer alike; the allocator alone makes the difference."""
    today_alloc = type("SchedTodayAlloc", (BackendSched,), {"galloc_class": GAllocr2026})
    assert compare(*config, sched_class=BackendSched2026) == compare(*config, sched_class=today_alloc)


def test_table_is_in_mib_with_two_decimals():
    text = table([compare("llama-2-7b", 12500, 512, 19)])
    assert "| llama-2-7b | 12500 | 512 | 19 | 1049.94 refused | 267.94 + 782.00 | 1049.94 |" in text
