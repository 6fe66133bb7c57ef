"""Chapter 10's report against real llama.cpp (mid-2024): every recorded start-up of
tests/fixtures/llama-cpp/reference.json (tools/llama_cpp_reference.py, llama-cpp-python 0.2.90, llama.cpp 1d1ccce,
CPU only) that the report models, compared to the printed 0.01 MiB: weights, KV cache, output and compute buffers,
the graph's nodes and splits, the context. Every refusal recorded there is a refusal (exit 2) here.

Every row is compared: dense and mixture-of-experts models, with and without flash attention, f16 and quantized K
and V caches. A refusal must give llama.cpp's reason: its error text, or the GGML_ASSERT that aborted it."""

import json

import pytest

from ggml_lite.__main__ import main
from helpers import FIXTURES
from llama_cpp_reference import write_gguf

MiB = 1024 * 1024
REFERENCE = json.loads((FIXTURES / "llama-cpp" / "reference.json").read_text(encoding="utf-8"))
ROWS = REFERENCE["rows"]


def flags(row, path) -> list:
    p = row["params"]
    return ["llama", "--gguf", str(path), "-c", str(p["n_ctx"]), "-b", str(p["n_batch"]), "-ub", str(p["n_ubatch"]),
            "-ctk", p["type_k"], "-ctv", p["type_v"], "--json"] + (["-fa"] if p["flash_attn"] else [])


def mib(n: int) -> str:
    return f"{n / MiB:.2f}"


STARTED = [r for r in ROWS if r["outcome"] == "ok"]
REFUSED = [r for r in ROWS if r["outcome"] != "ok"]


def test_the_reference_set():
    assert REFERENCE["llama_cpp"]["llama_cpp_commit"] == "1d1ccce" and len(ROWS) >= 40
    fa = sum(r["params"]["flash_attn"] for r in ROWS)
    moe = sum(bool(r["model"]["n_expert"]) for r in ROWS)
    quant_v = sum(r["params"]["type_v"] not in ("f16", "f32", "bf16") for r in STARTED)
    print(f"\n{len(ROWS)} llama.cpp start-ups compared: {len(STARTED)} started, {len(REFUSED)} refused; {fa} with "
          f"flash attention, {moe} with experts, {quant_v} started with a quantized V cache")
    assert fa >= 20 and moe >= 10 and quant_v >= 5


@pytest.mark.parametrize("row", STARTED, ids=[r["id"] for r in STARTED])
def test_a_start_up_is_what_llama_cpp_printed(row, tmp_path, capsys):
    path = tmp_path / row["model"]["gguf"]
    write_gguf(path, row["model"])
    assert main(flags(row, path)) == 0
    doc = json.loads(capsys.readouterr().out)
    printed, cpu = row["printed"], next(d for d in doc["devices"] if d["name"] == "CPU")
    got = dict(weights=mib(cpu["weights"]), kv=mib(cpu["kv"]), output=mib(cpu["output"]),
               compute=mib(cpu["compute"]), nodes=doc["graph"]["nodes"], splits=doc["graph"]["splits"],
               n_ctx=doc["context"]["n_ctx"])
    want = dict(weights=printed["weights"]["CPU"]["text"], kv=printed["kv_self"]["total"]["text"],
                output=printed["output"]["CPU"]["text"], compute=printed["compute"]["CPU"]["text"],
                nodes=printed["graph_nodes"], splits=printed["graph_splits"], n_ctx=printed["n_ctx"])
    assert got == want


def reason(row) -> str:
    """What llama.cpp said when it refused: the text after `llama_new_context_with_model: `, or the failed
    `GGML_ASSERT(...)`."""
    text = row["error"]
    return text[text.index("GGML_ASSERT"):].removesuffix(" failed") if "GGML_ASSERT" in text else text.split(": ", 1)[1]


@pytest.mark.parametrize("row", [r for r in STARTED if r["params"]["type_k"] != r["params"]["type_v"]
                                 or r["params"]["type_k"] != "f16"][:12], ids=lambda r: r["id"])
def test_the_k_and_v_sizes_are_the_lines_llama_cpp_printed(row, tmp_path, capsys):
    path = tmp_path / row["model"]["gguf"]
    write_gguf(path, row["model"])
    assert main([f for f in flags(row, path) if f != "--json"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "KV self size" in x)
    kv = row["printed"]["kv_self"]
    assert line.split("KV self size")[1] == next(x for x in row["printed"]["log"] if "KV self size" in x).split(
        "KV self size")[1], (line, kv)


@pytest.mark.parametrize("row", REFUSED, ids=[r["id"] for r in REFUSED])
def test_a_refusal_is_a_refusal(row, tmp_path, capsys):
    path = tmp_path / row["model"]["gguf"]
    write_gguf(path, row["model"])
    assert main(flags(row, path)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and reason(row) in err, (reason(row), err)
