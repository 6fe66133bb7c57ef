"""Record what real llama.cpp (mid-2024) prints about its memory when it starts a LLaMA on the CPU: the
reference set `tests/fixtures/llama-cpp/reference.json` that chapter 10's report (`python -m ggml_lite llama`)
is held against, for configurations the report's earlier checks did not reach (flash attention, quantized K
and V caches, mixture-of-experts models, odd shapes, `n_ctx 0`, and the configurations llama.cpp refused).

Why: the report claims llama.cpp's numbers to the printed 0.01 MiB. Only llama.cpp itself can say what they
are, so this script asks it. For each configuration it writes a LLaMA GGUF file with the `gguf` package's
writer (the header with every tensor's info; the data region left as a hole of its full length, so even a
Mixtral 8x7B costs a few kilobytes of disk: nothing reads the weights before the compute buffer is
reserved), starts llama.cpp on it in a subprocess (one per configuration, with a timeout, so an abort or a
refusal stays isolated) and parses what llama.cpp printed on stderr: the context it used, the weights' CPU
buffer, the KV cache, the output buffer, the compute buffer, the graph's node and split counts, or the
error it gave. Everything goes into one JSON file; nothing else is written (the GGUF files live in a
temporary folder unless `--keep-ggufs DIR` is given).

llama.cpp is the copy vendored by llama-cpp-python 0.2.90 (llama.cpp 1d1ccce, 2024-08-29), built from its
source distribution, CPU only, in a virtual environment of its own outside the project:

    python3 -m venv /work/llcpp-venv
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF \\
      -DGGML_BLAS=OFF -DGGML_OPENMP=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF" \\
      /work/llcpp-venv/bin/pip install --no-cache-dir --no-binary llama-cpp-python llama-cpp-python==0.2.90

Then, from the project's root, with the project's venv (it has `gguf`):

    python tools/llama_cpp_reference.py --llama-python /work/llcpp-venv/bin/python

`--only SUBSTRING` runs the configurations whose id contains it, `--dry-run` writes the GGUF files and lists
the configurations without starting llama.cpp, `--keep-ggufs DIR` keeps the GGUF files, `--out FILE` writes
elsewhere. The build and this script are not part of `make test`: the tests read the recorded file.

Two details of the driver, both recorded in the file's `llama_cpp.driver`:
- llama.cpp is driven through llama-cpp-python's low-level binding (`llama_load_model_from_file`, then
  `llama_new_context_with_model` with `llama_context_default_params()` and the row's values set), exactly
  as llama.cpp's own programs fill those structs. The high-level `llama_cpp.Llama` class is not used: in
  0.2.90 it has no `n_ubatch` parameter (its `**kwargs` swallows one silently, leaving 512) and it sets
  `n_batch = min(n_ctx, n_batch)` before llama.cpp sees the values.
- llama.cpp maps a model file with MAP_POPULATE, which on a sparse file of a real-sized model would fill
  gigabytes of page cache with zeros. An LD_PRELOAD shim (compiled here with `cc`; `--no-shim` turns it
  off) clears that one flag. Nothing llama.cpp computes or prints depends on it.
"""

import argparse
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gguf
import numpy as np

QT = gguf.GGMLQuantizationType
VT = gguf.GGUFValueType

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "llama-cpp" / "reference.json"
DEFAULT_PYTHON = "/work/llcpp-venv/bin/python"
SCHEMA = "llama-cpp-reference/1"
LLAMA_CPP = {"llama_cpp_python": "0.2.90", "llama_cpp_commit": "1d1ccce", "llama_cpp_commit_date": "2024-08-29"}
CMAKE_ARGS = ("-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_BLAS=OFF "
              "-DGGML_OPENMP=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF")
ALIGNMENT = 32  # gguf's writer's default general.alignment

TYPES = {"f32": QT.F32, "f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0, "q4_0": QT.Q4_0, "q4_1": QT.Q4_1,
         "q5_0": QT.Q5_0, "q5_1": QT.Q5_1, "iq4_nl": QT.IQ4_NL, "q6_K": QT.Q6_K}

# ---- models ----


def model(name: str, n_vocab: int, n_embd: int, n_layer: int, n_head: int, n_head_kv: int, n_ff: int,
          n_ctx_train: int = 4096, wtype: str = "f16", output: str | None = None, n_expert: int = 0,
          n_expert_used: int = 0, rope_freq_base: float = 10000.0, rms_norm_eps: float = 1e-5,
          head: int | None = None) -> dict:
    """A LLaMA's hyperparameters and its tensors' GGUF types by role (the same in every layer): matrices of
    `wtype` (token_embd too), norms and the experts' router `ffn_gate_inp` in f32 (as llama.cpp's converter
    writes them), `output.weight` of `output` (default `wtype`; q6_K as llama.cpp's quantize gives Q4_0 files,
    or q8_0, its fallback when n_embd is not a multiple of q6_K's 256). `head`: a head size other than
    n_embd / n_head (written as `llama.attention.key_length` and `value_length`, as Mistral NeMo has it)."""
    matrices = ["token_embd", "attn_q", "attn_k", "attn_v", "attn_output"]
    matrices += ["ffn_gate_exps", "ffn_down_exps", "ffn_up_exps"] if n_expert else ["ffn_gate", "ffn_down", "ffn_up"]
    types = {"output_norm": "f32", "attn_norm": "f32", "ffn_norm": "f32", **{m: wtype for m in matrices},
             "output": output or wtype}
    if n_expert:
        types["ffn_gate_inp"] = "f32"
    return {"name": name, "arch": "llama", "n_vocab": n_vocab, "n_embd": n_embd, "n_layer": n_layer,
            "n_head": n_head, "n_head_kv": n_head_kv, "n_ff": n_ff, "n_rot": head or n_embd // n_head,
            "n_ctx_train": n_ctx_train, "rms_norm_eps": rms_norm_eps, "rope_freq_base": rope_freq_base,
            "n_expert": n_expert, "n_expert_used": n_expert_used, "wtype": wtype, "types": types}


def tensor_shapes(m: dict) -> list[tuple[str, str, list[int]]]:
    """[(name, role, ne)] of the model's tensors in llama.cpp's converter's order, with the shapes llama.cpp
    1d1ccce's `llm_load_tensors` expects for LLM_ARCH_LLAMA (experts merged into 3-D `*_exps` tensors)."""
    e, v, f, x = m["n_embd"], m["n_vocab"], m["n_ff"], m["n_expert"]
    gqa, q = m["n_rot"] * m["n_head_kv"], m["n_rot"] * m["n_head"]  # (n_rot is the head size for a LLaMA)
    out = [("token_embd.weight", "token_embd", [e, v]), ("output_norm.weight", "output_norm", [e]),
           ("output.weight", "output", [e, v])]
    for il in range(m["n_layer"]):
        layer = [("attn_norm", [e]), ("attn_q", [e, q]), ("attn_k", [e, gqa]), ("attn_v", [e, gqa]),
                 ("attn_output", [q, e]), ("ffn_norm", [e])]
        if x:
            layer += [("ffn_gate_inp", [e, x]), ("ffn_gate_exps", [e, f, x]), ("ffn_down_exps", [f, e, x]),
                      ("ffn_up_exps", [e, f, x])]
        else:
            layer += [("ffn_gate", [e, f]), ("ffn_down", [f, e]), ("ffn_up", [e, f])]
        out += [(f"blk.{il}.{role}.weight", role, ne) for role, ne in layer]
    return out


def write_gguf(path: Path, m: dict, sparse: bool = True) -> int:
    """Write model `m` as a GGUF file at `path` with gguf's writer: the `llama.*` hyperparameters (and
    `llama.expert_count` / `llama.expert_used_count` for experts), `tokenizer.ggml.model` = "no_vocab" (so
    llama.cpp loads no tokenizer; the vocabulary's size is `llama.vocab_size`), every tensor's info, and with
    `sparse` the data region as a hole as long as the real one. Returns the file's size."""
    w = gguf.GGUFWriter(str(path), "llama")
    kv = [("llama.vocab_size", m["n_vocab"], VT.UINT32), ("llama.context_length", m["n_ctx_train"], VT.UINT32),
          ("llama.embedding_length", m["n_embd"], VT.UINT32), ("llama.block_count", m["n_layer"], VT.UINT32),
          ("llama.feed_forward_length", m["n_ff"], VT.UINT32), ("llama.rope.dimension_count", m["n_rot"], VT.UINT32),
          ("llama.attention.head_count", m["n_head"], VT.UINT32),
          ("llama.attention.head_count_kv", m["n_head_kv"], VT.UINT32),
          ("llama.attention.layer_norm_rms_epsilon", m["rms_norm_eps"], VT.FLOAT32),
          ("llama.rope.freq_base", m["rope_freq_base"], VT.FLOAT32)]
    if m["n_expert"]:
        kv += [("llama.expert_count", m["n_expert"], VT.UINT32),
               ("llama.expert_used_count", m["n_expert_used"], VT.UINT32)]
    if m["n_rot"] != m["n_embd"] // m["n_head"]:  # a head size of its own
        kv += [("llama.attention.key_length", m["n_rot"], VT.UINT32),
               ("llama.attention.value_length", m["n_rot"], VT.UINT32)]
    kv += [("tokenizer.ggml.model", "no_vocab", VT.STRING)]
    for key, value, vtype in kv:
        w.add_key_value(key, value, vtype)
    total = 0
    for name, role, ne in tensor_shapes(m):
        t = TYPES[m["types"][role]]
        block, size = gguf.GGML_QUANT_SIZES[t]
        if ne[0] % block:
            raise ValueError(f"{m['name']}: {name} has rows of {ne[0]}, not whole {t.name} blocks of {block}")
        nbytes = int(np.prod(ne, dtype=np.int64)) // block * size
        shape = tuple(reversed(ne)) if block == 1 else (*reversed(ne[1:]), ne[0] // block * size)
        w.add_tensor_info(name, shape, np.dtype(np.uint8 if block > 1 else np.float32), nbytes, raw_dtype=t)
        total += -(-nbytes // ALIGNMENT) * ALIGNMENT
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    if sparse:  # the data section starts at the header's end padded to the alignment
        os.truncate(path, -(-os.path.getsize(path) // ALIGNMENT) * ALIGNMENT + total)
    return os.path.getsize(path)


# ---- the configurations ----

MODELS = {m["name"]: m for m in [
    model("tiny-f16", 256, 128, 2, 4, 2, 320, 512),
    model("tiny-q8_0", 256, 128, 2, 4, 2, 320, 512, wtype="q8_0"),
    model("tiny-q4_0", 256, 128, 2, 4, 2, 320, 512, wtype="q4_0", output="q8_0"),
    model("mha-f16", 1000, 256, 4, 8, 8, 704, 2048),
    model("gqa4-q8_0", 3200, 512, 3, 8, 2, 1376, 4096, wtype="q8_0"),
    model("mqa-f16", 512, 256, 2, 4, 1, 512, 1000),
    model("wide320-f16", 1234, 320, 3, 5, 5, 864, 1100),
    model("wide320-q4_0", 1234, 320, 3, 5, 5, 864, 1100, wtype="q4_0"),
    model("hd48-f16", 500, 384, 2, 8, 4, 1024, 2048),
    model("hd128-f16", 2048, 1024, 2, 8, 8, 2816, 4096),
    model("ctx0-f16", 256, 128, 2, 4, 2, 320, 0),
    model("moe8x2-f16", 512, 128, 2, 4, 2, 256, 2048, n_expert=8, n_expert_used=2),
    model("moe8x2-q4_0", 512, 128, 2, 4, 2, 256, 2048, wtype="q4_0", output="q8_0", n_expert=8, n_expert_used=2),
    model("moe4x1-f16", 512, 128, 2, 4, 4, 256, 1000, n_expert=4, n_expert_used=1),
    model("moe4x4-q8_0", 512, 128, 2, 4, 1, 256, 2048, wtype="q8_0", n_expert=4, n_expert_used=4),
    model("moe16x4-f16", 777, 192, 2, 3, 1, 320, 4096, n_expert=16, n_expert_used=4),
    model("moe-used-gt-count", 512, 128, 2, 4, 2, 256, 2048, n_expert=2, n_expert_used=4),
    # the mapped file range at a rounding boundary: 32 bytes more (an allocated buffer's) print 0.01 MiB more
    model("edge-v256-f16", 256, 64, 2, 4, 2, 320, 512),
    model("edge-v500-moe-q8_0", 500, 512, 3, 4, 2, 512, 512, wtype="q8_0", n_expert=8, n_expert_used=2),
    # a head size of its own (attention.key_length), as Mistral NeMo 12B has: 5120 / 32 heads, heads of 128
    model("nemo-like-f16", 512, 320, 2, 4, 2, 512, 1024, head=128),
    model("mistral-nemo-12b-q4_0", 131072, 5120, 40, 32, 8, 14336, 1024000, wtype="q4_0", output="q6_K",
          rope_freq_base=1000000.0, head=128),
    # n_embd not a multiple of n_head: llama.cpp rounds the head size down (130 / 4 heads: 32)
    model("embd130-f16", 256, 130, 2, 4, 2, 256, 512),
    model("llama-2-7b-f16", 32000, 4096, 32, 32, 32, 11008, 4096),
    model("llama-2-7b-q4_0", 32000, 4096, 32, 32, 32, 11008, 4096, wtype="q4_0", output="q6_K"),
    model("llama-3-8b-q8_0", 128256, 4096, 32, 32, 8, 14336, 8192, wtype="q8_0", rope_freq_base=500000.0),
    model("mixtral-8x7b-q4_0", 32000, 4096, 32, 32, 8, 14336, 32768, wtype="q4_0", output="q6_K", n_expert=8,
          n_expert_used=2, rope_freq_base=1000000.0),
    model("mixtral-8x7b-f16", 32000, 4096, 32, 32, 8, 14336, 32768, n_expert=8, n_expert_used=2,
          rope_freq_base=1000000.0),
]}


def config(model_name: str, n_ctx: int = 512, n_batch: int = 2048, n_ubatch: int = 512, fa: bool = False,
           type_k: str = "f16", type_v: str = "f16") -> dict:
    """One start-up: a model and llama.cpp's context parameters as `llama_context_params` takes them."""
    rid = f"{model_name}_c{n_ctx}_b{n_batch}_ub{n_ubatch}_{'fa' if fa else 'nofa'}_k{type_k}_v{type_v}"
    return {"id": rid, "model": model_name,
            "params": {"n_ctx": n_ctx, "n_batch": n_batch, "n_ubatch": n_ubatch, "flash_attn": fa,
                       "type_k": type_k, "type_v": type_v, "n_gpu_layers": 0, "use_mmap": True, "n_seq_max": 1,
                       "offload_kqv": True}}


def configurations() -> list[dict]:
    """The reference set: about half with flash attention; f16, q8_0 and q4_0 K/V caches; experts; odd
    shapes; `n_ctx` 0; and the refusals (a quantized V cache without flash attention, zero batches, zero
    contexts, K/V rows that are not whole quantization blocks, more experts used than exist)."""
    c = []
    for fa in (False, True):
        c += [config("tiny-f16", 512, fa=fa), config("tiny-f16", 100, fa=fa), config("tiny-f16", 300, 64, 7, fa=fa),
              config("tiny-q8_0", 256, 512, 1, fa=fa), config("tiny-q4_0", 512, 2048, 512, fa=fa, type_k="q8_0"),
              config("mha-f16", 2048, 2048, 512, fa=fa), config("mha-f16", 1000, 512, 256, fa=fa, type_k="q4_0"),
              config("gqa4-q8_0", 4096, 2048, 512, fa=fa), config("gqa4-q8_0", 777, 7, 7, fa=fa),
              config("mqa-f16", 0, fa=fa), config("wide320-f16", 1100, 512, 512, fa=fa),
              config("wide320-q4_0", 0, 2048, 33, fa=fa, type_k="q8_0"), config("hd48-f16", 512, fa=fa),
              config("hd128-f16", 4096, 4096, 1024, fa=fa), config("ctx0-f16", 256, fa=fa),
              config("moe8x2-f16", 512, fa=fa), config("moe8x2-f16", 1000, 2048, 1, fa=fa),
              config("moe8x2-q4_0", 2048, 2048, 512, fa=fa), config("moe4x1-f16", 0, 2048, 512, fa=fa),
              config("moe4x4-q8_0", 512, 512, 128, fa=fa, type_k="q8_0"),
              config("moe16x4-f16", 4096, 2048, 512, fa=fa),
              config("llama-2-7b-f16", 4096, fa=fa), config("llama-2-7b-q4_0", 2048, fa=fa, type_k="q8_0"),
              config("mixtral-8x7b-q4_0", 4096, fa=fa)]
    c += [  # quantized V caches (flash attention only) and the other K/V types
        config("tiny-f16", 512, fa=True, type_k="q8_0", type_v="q8_0"),
        config("tiny-f16", 512, fa=True, type_k="q4_0", type_v="q4_0"),
        config("tiny-f16", 512, fa=True, type_k="f16", type_v="q4_0"),
        config("mha-f16", 1000, 512, 512, fa=True, type_k="q8_0", type_v="q8_0"),
        config("gqa4-q8_0", 4096, 2048, 512, fa=True, type_k="q4_0", type_v="q8_0"),
        config("moe8x2-f16", 2048, 2048, 512, fa=True, type_k="q8_0", type_v="q8_0"),
        config("moe16x4-f16", 1100, 2048, 7, fa=True, type_k="q4_0", type_v="q4_0"),
        config("llama-2-7b-q4_0", 8192, fa=True, type_k="q8_0", type_v="q8_0"),
        config("llama-3-8b-q8_0", 0, fa=True, type_k="q4_0", type_v="q4_0"),
        config("llama-3-8b-q8_0", 8192),
        config("mixtral-8x7b-q4_0", 0, fa=True, type_k="q8_0", type_v="q8_0"),
        config("mixtral-8x7b-f16", 2048), config("moe8x2-f16", 0, fa=True, type_k="q4_0", type_v="q4_0"),
        config("mha-f16", 2048, 64, 512), config("mha-f16", 2048, 64, 512, fa=True),
        config("tiny-f16", 512, type_k="f32"), config("tiny-f16", 512, type_k="q5_1"),
        config("tiny-f16", 512, type_k="iq4_nl"), config("tiny-f16", 512, fa=True, type_k="q4_1", type_v="q5_0"),
        config("tiny-f16", 512, fa=True, type_k="bf16", type_v="f32"),
    ]
    c += [config(name, 512, fa=fa) for name in ("edge-v256-f16", "edge-v500-moe-q8_0") for fa in (False, True)]
    c += [config("nemo-like-f16", 1000, fa=False), config("nemo-like-f16", 1000, 2048, 100, fa=True, type_k="q8_0",
                                                            type_v="q8_0"),
          config("mistral-nemo-12b-q4_0", 8192, fa=True, type_k="q8_0", type_v="q8_0"),
          config("mistral-nemo-12b-q4_0", 4096), config("embd130-f16", 512), config("embd130-f16", 512, fa=True)]
    c += [  # refusals
        config("tiny-f16", 512, type_v="q8_0"), config("tiny-f16", 512, type_k="q4_0", type_v="q4_0"),
        config("moe8x2-f16", 512, type_v="q4_0"), config("tiny-f16", 512, 0, 0),
        config("tiny-f16", 512, 0, 0, fa=True), config("ctx0-f16", 0), config("ctx0-f16", 0, fa=True),
        config("hd48-f16", 512, type_k="q8_0"), config("hd48-f16", 512, fa=True, type_v="q4_0"),
        config("moe-used-gt-count", 512),
    ]
    return c


# ---- running llama.cpp ----

CHILD = r"""
import json, sys
import llama_cpp
cfg = json.loads(sys.argv[1])
p = cfg["params"]
llama_cpp.llama_backend_init()
mp = llama_cpp.llama_model_default_params()
mp.n_gpu_layers = p["n_gpu_layers"]
mp.use_mmap = p["use_mmap"]
mp.use_mlock = False
model = llama_cpp.llama_load_model_from_file(cfg["path"].encode(), mp)
if not model:
    print("@@ model: NULL", file=sys.stderr, flush=True)
    sys.exit(3)
cp = llama_cpp.llama_context_default_params()
cp.n_ctx = p["n_ctx"]
cp.n_batch = p["n_batch"]
cp.n_ubatch = p["n_ubatch"]
cp.n_seq_max = p["n_seq_max"]
cp.flash_attn = p["flash_attn"]
cp.type_k = cfg["type_k_code"]
cp.type_v = cfg["type_v_code"]
cp.offload_kqv = p["offload_kqv"]
ctx = llama_cpp.llama_new_context_with_model(model, cp)
if not ctx:
    print("@@ context: NULL", file=sys.stderr, flush=True)
    sys.exit(4)
print("@@ context: OK", file=sys.stderr, flush=True)
print("@@ system_info: " + llama_cpp.llama_print_system_info().decode(), file=sys.stderr, flush=True)
llama_cpp.llama_free(ctx)
llama_cpp.llama_free_model(model)
"""

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sys/mman.h>
#include <sys/types.h>
void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    static void *(*real)(void *, size_t, int, int, int, off_t);
    if (!real) real = (void *(*)(void *, size_t, int, int, int, off_t))dlsym(RTLD_NEXT, "mmap");
    return real(addr, len, prot, flags & ~MAP_POPULATE, fd, off);
}
"""


def build_shim(folder: Path) -> Path | None:
    """Compile the LD_PRELOAD shim that clears MAP_POPULATE (None when no C compiler is found)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    src, lib = folder / "nopopulate.c", folder / "nopopulate.so"
    src.write_text(SHIM)
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(lib), str(src), "-ldl"], check=True)
    return lib


MIB = r"([0-9]+\.[0-9]{2}) MiB"
PATTERNS = {  # what llama.cpp 1d1ccce prints (llama.cpp's LLAMA_LOG_INFO formats), one regex each
    "weights": re.compile(r"^llm_load_tensors:\s+(\S+) buffer size =\s+" + MIB),
    "kv": re.compile(r"^llama_kv_cache_init:\s+(\S+) KV buffer size =\s+" + MIB),
    "kv_self": re.compile(r"^llama_new_context_with_model: KV self size  =\s+" + MIB + r", K \((\w+)\):\s+" + MIB
                          + r", V \((\w+)\):\s+" + MIB),
    "output": re.compile(r"^llama_new_context_with_model:\s+(\S+)\s+output buffer size =\s+" + MIB),
    "compute": re.compile(r"^llama_new_context_with_model:\s+(\S+) compute buffer size =\s+" + MIB),
    "n_ctx": re.compile(r"^llama_new_context_with_model: n_ctx\s+= (\d+)"),
    "n_batch": re.compile(r"^llama_new_context_with_model: n_batch\s+= (\d+)"),
    "n_ubatch": re.compile(r"^llama_new_context_with_model: n_ubatch\s+= (\d+)"),
    "flash_attn": re.compile(r"^llama_new_context_with_model: flash_attn\s+= (\d+)"),
    "graph_nodes": re.compile(r"^llama_new_context_with_model: graph nodes\s+= (\d+)"),
    "graph_splits": re.compile(r"^llama_new_context_with_model: graph splits\s+= (\d+)"),
    "model_size": re.compile(r"^llm_load_print_meta: model size\s+= (.*?)\s*$"),
    "model_params": re.compile(r"^llm_load_print_meta: model params\s+= (.*?)\s*$"),
}
LOGGED = ("llm_load_tensors:", "llama_kv_cache_init:", "llama_new_context_with_model:", "llama_model_load:",
          "llama_load_model_from_file:", "GGML_ASSERT", "error", "@@ ")


def mib(text: str) -> dict:
    """A printed size: the string llama.cpp printed and its value as a number (MiB)."""
    return {"text": text, "mib": float(text)}


def parse(stderr: str) -> dict:
    """What llama.cpp printed: sizes per buffer name (as printed and as numbers), the context's values, the
    graph's counts, and the log lines of the loader and the context (`log`) kept verbatim."""
    out: dict = {"weights": {}, "kv": {}, "output": {}, "compute": {}}
    log = []
    for line in stderr.splitlines():
        if (line.startswith(LOGGED) or "GGML_ASSERT" in line) and not line.startswith("@@ system_info"):
            log.append(re.sub(r"^/\S*?/vendor/llama\.cpp/", "", line.rstrip()))
        for key, rx in PATTERNS.items():
            mt = rx.search(line)
            if not mt:
                continue
            if key in ("weights", "kv", "output", "compute"):
                out[key][mt.group(1)] = mib(mt.group(2))
            elif key == "kv_self":
                out[key] = {"total": mib(mt.group(1)), "k": {"type": mt.group(2), **mib(mt.group(3))},
                            "v": {"type": mt.group(4), **mib(mt.group(5))}}
            elif key in ("model_size", "model_params"):
                out[key] = mt.group(1)
            else:
                out[key] = int(mt.group(1))
    out["log"] = log
    return out


def error_text(stderr: str) -> str | None:
    """The reason llama.cpp gave for a refusal: its error lines (a failed assertion, an exception from the
    loader, a NULL context with the line before it)."""
    lines = [re.sub(r"^/\S*?/vendor/llama\.cpp/", "", ln.rstrip()) for ln in stderr.splitlines()]
    hits = [ln for ln in lines if "GGML_ASSERT" in ln or "error loading model" in ln or "failed" in ln.lower()
            or "requires" in ln or "cannot" in ln]
    return "\n".join(hits) if hits else None


def run_one(cfg: dict, path: Path, python: str, timeout: float, shim: Path | None) -> dict:
    """Start llama.cpp on one configuration in a subprocess and return the row's `outcome` part."""
    p = cfg["params"]
    arg = json.dumps({"path": str(path), "params": p, "type_k_code": int(TYPES[p["type_k"]]),
                      "type_v_code": int(TYPES[p["type_v"]])})
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if shim is not None:
        env["LD_PRELOAD"] = str(shim)
    t0 = time.monotonic()
    try:
        r = subprocess.run([python, "-c", CHILD, arg], capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"outcome": "timeout", "returncode": None, "error": f"no answer in {timeout} s", "printed": {},
                "seconds": round(time.monotonic() - t0, 1)}
    printed = parse(r.stderr)
    res: dict = {"returncode": r.returncode, "seconds": round(time.monotonic() - t0, 1)}
    if r.returncode == 0 and "@@ context: OK" in r.stderr:
        res["outcome"] = "ok"
        info = [ln for ln in r.stderr.splitlines() if ln.startswith("@@ system_info: ")]
        res["system_info"] = info[0].removeprefix("@@ system_info: ").strip() if info else None
    elif "@@ context: NULL" in r.stderr:
        res["outcome"] = "refused"  # llama_new_context_with_model returned NULL
    elif "@@ model: NULL" in r.stderr:
        res["outcome"] = "model_refused"  # llama_load_model_from_file returned NULL
    else:
        res["outcome"] = "abort"  # the process died (a GGML_ASSERT aborts)
    if res["outcome"] != "ok":
        res["error"] = error_text(r.stderr)
    res["printed"] = printed
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--llama-python", default=DEFAULT_PYTHON, help="the python of the venv with llama-cpp-python")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the JSON file to write")
    ap.add_argument("--only", default=None, help="run only the configurations whose id contains this")
    ap.add_argument("--keep-ggufs", type=Path, default=None, help="write the GGUF files here and keep them")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per configuration")
    ap.add_argument("--dry-run", action="store_true", help="write the GGUF files, list the configurations")
    ap.add_argument("--no-shim", action="store_true", help="let llama.cpp map files with MAP_POPULATE")
    args = ap.parse_args(argv)

    configs = [c for c in configurations() if args.only is None or args.only in c["id"]]
    ids = [c["id"] for c in configs]
    if len(set(ids)) != len(ids):
        raise SystemExit("duplicate configuration ids")
    tmp = tempfile.TemporaryDirectory(prefix="llcpp-ref-")
    folder = args.keep_ggufs or Path(tmp.name)
    folder.mkdir(parents=True, exist_ok=True)
    sizes = {}
    for name in dict.fromkeys(c["model"] for c in configs):
        sizes[name] = write_gguf(folder / f"{name}.gguf", MODELS[name])
    if args.dry_run:
        for c in configs:
            print(c["id"])
        print(f"{len(configs)} configurations, {len(sizes)} GGUF files in {folder}", file=sys.stderr)
        tmp.cleanup()
        return 0
    shim = None if args.no_shim else build_shim(Path(tmp.name))
    rows = []
    system_info = None
    for i, c in enumerate(configs):
        res = run_one(c, folder / f"{c['model']}.gguf", args.llama_python, args.timeout, shim)
        system_info = system_info or res.pop("system_info", None)
        res.pop("system_info", None)
        seconds = res.pop("seconds")  # printed, not recorded: the file stays the same from run to run
        m = MODELS[c["model"]]
        rows.append({"id": c["id"], "kind": "moe" if m["n_expert"] else "dense",
                     "model": {**m, "gguf": f"{c['model']}.gguf", "file_size": sizes[c["model"]]},
                     "params": c["params"], **res})
        print(f"[{i + 1}/{len(configs)}] {c['id']}: {res['outcome']} ({seconds} s)", file=sys.stderr)
    doc = {"schema": SCHEMA,
           "generator": "tools/llama_cpp_reference.py",
           "gguf_writer": f"gguf {importlib.metadata.version('gguf')}",
           "command": "python tools/llama_cpp_reference.py" + (f" --only {args.only}" if args.only else ""),
           "llama_cpp": {**LLAMA_CPP, "cmake_args": CMAKE_ARGS, "system_info": system_info,
                         "driver": "llama-cpp-python's low-level binding: llama_load_model_from_file(model_default"
                                   "_params() with n_gpu_layers, use_mmap), llama_new_context_with_model(context_"
                                   "default_params() with n_ctx, n_batch, n_ubatch, n_seq_max, flash_attn, type_k,"
                                   " type_v, offload_kqv)",
                         "map_populate_cleared": shim is not None},
           "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    kinds: dict = {}
    for r in rows:
        kinds[f"{r['kind']}/{r['outcome']}"] = kinds.get(f"{r['kind']}/{r['outcome']}", 0) + 1
    print(f"wrote {args.out}: {len(rows)} rows {kinds}", file=sys.stderr)
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
