"""Shared test setup: where ../shared is, and the fixture files it holds."""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
FIXTURES = SHARED / "fixtures"
NEEDS_SHARED = pytest.mark.skipif(not FIXTURES.is_dir(), reason=f"{FIXTURES} is absent (fixtures live beside the project)")

# Known at test-collection time, so the parametrized ids stay stable when ../shared is absent.
SEED_FILES = [
    "01_mlp_small", "02_elementwise_inplace", "03_views_layout", "04_outputs_middle", "05_inputs_flagged",
    "06_llama_block", "07_llama4_kvcache", "08_random_dag_chain_s1234", "09_random_dag_wide_s42",
    "10_random_dag_wide_s7", "11_realloc_sequence_grow", "12_realloc_sequence_reserve_first",
    "13_llama7b_ctx512_all_outputs", "14_llama7b_ctx512_one_output",
]
SCHED_FILES = [
    "01_full_offload_all", "02_full_offload_llama", "03_partial_offload", "04_partial_offload_pinned",
    "05_deny_soft_max", "06_deny_rope_partial", "07_op_offload_mul_mat", "08_op_offload_cuda_rule",
    "09_parallel_partial", "10_two_devices", "11_fake_max_size_multibuffer",
    "12_deny_mul_mat_weights_in_fake", "13_abort_deny_cpy_kv_in_fake", "14_two_devices_pinned_norm",
]


def fixture_path(folder: str, name: str) -> Path:
    return FIXTURES / folder / f"{name}.json"


def load_json(path: Path) -> dict:
    return json.loads(path.read_text())


def graph_sections(doc: dict):
    """(step or None, graph section) for every graph a fixture document holds."""
    if "graph" in doc:
        yield None, doc["graph"]
    for i, step in enumerate(doc.get("steps", [])):
        if isinstance(step, dict) and "graph" in step:
            yield i, step["graph"]
