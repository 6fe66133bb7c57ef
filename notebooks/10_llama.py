# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 10 · A LLaMA, end to end — how much memory, and why
#
# Every chapter so far taught one mechanism. The question people bring to this subject is their
# sum: *how much memory does this model need?* llama.cpp answers it only by running: it builds the
# worst-case graph of one micro-batch, lets the scheduler and the graph allocator of chapters 05 and
# 09 plan it, and prints `CPU compute buffer size = … MiB`. This chapter builds that very graph — the
# LLaMA of `llm_build_context::build_llama` at llama.cpp daa9623 — for any size of model, and plans
# it with the machinery of the course, so the numbers are llama.cpp's to the byte.
#
# **Learning goals**
#
# 1. A model's hyperparameters, and what each one sizes: the weights, the KV cache, the graph.
# 2. llama.cpp's LLaMA graph: 32 nodes per layer and 6 around them, built by a handful of
#    `llm_build_*` helpers; the KV cache written through views and read through views.
# 3. The worst case llama.cpp reserves: `n_ubatch` tokens, every one an output, the whole cache.
# 4. Predicting a compute buffer: which tensors are alive at the peak, and why.
# 5. Flash attention (`-fa`: the scores never stored) and mixtures of experts (Mixtral): their graphs and peaks.
#
# Exported: `ggml_lite.models.llama` (appendix A3 replays the recorded scheduler runs with it), `ggml_lite.report`
# and `ggml_lite.viz.report`. Models are read from GGUF files by appendix A4's `ggml_lite.models.gguf`.

# %%
# | default_exp models.llama

# %% [markdown]
# ## 1 · A model's hyperparameters
#
# A LLaMA is described by nine numbers: the vocabulary, the embedding width `n_embd`, the number of
# layers, the attention heads and the key/value heads (fewer than the heads with grouped-query
# attention: each K/V head serves `n_head / n_head_kv` query heads), the feed-forward width `n_ff`,
# the rotary dimensions `n_rot` (the head size), the RMS-norm epsilon and the RoPE base. The head size is
# `n_embd / n_head` unless a file says otherwise (Mistral NeMo: 5120 / 32 heads, yet heads of 128). Weights
# have a type (f16, or a quantized type); the KV cache has its own (f16 by default). The builder works on a
# plain dictionary — the form the recorded fixtures use — so `LlamaParams` turns them into it.

# %%
# | export
"""llama.cpp's LLaMA (`llm_build_context::build_llama` at llama.cpp daa9623, September 2024): the
model's hyperparameters, its weights and KV cache as llama.cpp names and creates them, and its
compute graph, exact to llama.cpp's; with `recorded=True`, the variant the ggml_lite fixtures were
recorded with (an extra RESHAPE of Vcur per layer and other names)."""

import itertools
import math
from dataclasses import dataclass

import numpy as np

from ggml_lite.align import GGML_PAD
from ggml_lite.buffer import BufferUsage, cpu_buffer_type
from ggml_lite.cpu import cpu_init
from ggml_lite.errors import ModelError, UnknownTypeError
from ggml_lite.graph import GGML_DEFAULT_GRAPH_SIZE, Graph, build_forward_expand
from ggml_lite.models.llm_build import LlmBuildContext, llm_build_layer, llm_build_norm
from ggml_lite.ops import cast, get_rows, mul_mat
from ggml_lite.sched import GGML_SCHED_MAX_BACKENDS, BackendSched
from ggml_lite.sim import sim_host_buffer_type, sim_init
from ggml_lite.tallocr import alloc_ctx_tensors_from_buft
from ggml_lite.tensor import F16, F32, I32, Context, Tensor, set_input, set_output, type_by_name

GGML_KQ_MASK_PAD = 32  # the mask's rows are padded to this many (llama.cpp's GGML_KQ_MASK_PAD)
LLAMA_MAX_LAYERS = 512  # llama.cpp's per-layer hyperparameter arrays hold this many layers
LLAMA_MAX_EXPERTS = 160  # llama.cpp 1d1ccce's limit on a mixture's experts (DeepSeek-V2's 160)
UINT32_MAX = 2**32 - 1  # llama_hparams' counts are uint32_t
INT32_MAX = 2**31 - 1  # n_gpu_layers, n_batch, n_ubatch and the graph's n_kv / n_tokens are int32_t
INT64_MAX = 2**63 - 1  # ggml's ne and nb are int64_t / size_t: no tensor may hold more elements or bytes
MAX_N_CTX = INT32_MAX // 32 * 32  # n_ctx, padded to 32, stays an int32 (n_kv in llm_build_context)
MAX_N_CTX_FA = INT32_MAX // 256 * 256  # the same, padded to 256 (flash attention)
MAX_DEVICES = GGML_SCHED_MAX_BACKENDS - 1  # the scheduler takes 16 backends, the CPU being one of them
INT_TYPES = ("i8", "i16", "i32", "i64", "f64")  # no matrix product in ggml takes weights of these types


def check_int(name: str, value, least: int, most: int, flag: str | None = None, why: str = "") -> int:
    """`value` if it is an integer in [least, most], else a `ModelError` naming the parameter (and the
    command line's flag), what was expected and what was found."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not least <= value <= most:
        where = f"{name} ({flag})" if flag else name
        raise ModelError(f"{where}: expected an integer from {least} to {most}{why}, found {value!r}")
    return int(value)


def check_float(name: str, value, least: float, flag: str | None = None, most: float = math.inf,
                strict: bool = True) -> float:
    """`value` if it is a finite number above `least` (at least `least` when not `strict`), at most `most`."""
    ok = isinstance(value, (int, float, np.floating)) and not isinstance(value, bool) and math.isfinite(value) \
        and (value > least if strict else value >= least) and value <= most
    if not ok:
        where = f"{name} ({flag})" if flag else name
        raise ModelError(f"{where}: expected a finite number {'above' if strict else 'at least'} {least:g}"
                         f"{f' and at most {most:g}' if most != math.inf else ''}, found {value!r}")
    return float(value)


def check_experts(n_expert, n_expert_used, n_ff_elements: int) -> None:
    """`llm_load_hparams`' asserts on a mixture of experts (`LLAMA_MAX_EXPERTS`, at most as many used as
    there are, some used when there are experts and none otherwise), as `ModelError`s in llama.cpp's words."""
    check_int("LlamaParams: n_expert", n_expert, 0, LLAMA_MAX_EXPERTS, "--n-expert", " (llama.cpp: GGML_ASSERT("
              "hparams.n_expert <= LLAMA_MAX_EXPERTS))")
    check_int("LlamaParams: n_expert_used", n_expert_used, 0, LLAMA_MAX_EXPERTS, "--n-expert-used")
    if n_expert_used > n_expert:
        raise ModelError(f"LlamaParams: n_expert_used (--n-expert-used) {n_expert_used} is more than n_expert "
                         f"{n_expert} (llama.cpp: GGML_ASSERT(hparams.n_expert_used <= hparams.n_expert) failed)")
    if n_expert and not n_expert_used:
        raise ModelError(f"LlamaParams: n_expert_used (--n-expert-used) 0 with {n_expert} experts (llama.cpp: "
                         f"GGML_ASSERT(hparams.n_expert_used > 0) failed)")
    if n_expert * n_ff_elements > INT64_MAX:
        raise ModelError(f"LlamaParams: n_embd * n_ff * n_expert (ffn_up_exps) = {n_expert * n_ff_elements} "
                         f"elements, more than a ggml tensor holds (2^63 - 1)")


# %% [markdown]
# Every field is checked when a `LlamaParams` is made — from a preset, the command line's flags or a
# GGUF header alike — against the limits llama.cpp and ggml have: at most 512 layers
# (`LLAMA_MAX_LAYERS`, the size of llama.cpp's per-layer arrays), counts that fit the `uint32_t` of
# `llama_hparams`, no weight of more than 2^63 − 1 elements (ggml's `int64_t` sizes), K/V heads that divide
# the heads, a head size of at least 1 (`n_embd / n_head` rounded down, as llama.cpp takes it), RoPE dimensions
# even and at most the head size.

# %%
# | export
@dataclass(frozen=True)
class LlamaParams:
    """A LLaMA's hyperparameters (`llama_hparams`, the LLaMA subset) and the types of its weights. A
    value no llama.cpp model can have is a `ModelError` naming the field."""

    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    # None: the head size n_embd / n_head, set by __post_init__ (an int after it, as the type says)
    n_rot: int = None  # type: ignore[assignment]
    rms_norm_eps: float = 1e-5
    rope_freq_base: float = 10000.0
    n_ctx_train: int = 4096
    wtype: str = "f16"
    n_expert: int = 0  # a mixture of experts: experts per layer, and how many each token uses
    n_expert_used: int = 0
    n_embd_head: int = None  # type: ignore[assignment]  # None: n_embd // n_head (else a GGUF's key_length)

    def __post_init__(self):
        for field in ("n_vocab", "n_embd", "n_head", "n_head_kv", "n_ff"):
            check_int(f"LlamaParams: {field}", getattr(self, field), 1, UINT32_MAX, "--" + field.replace("_", "-"),
                      " (a uint32_t)")
        # (0 is a training context llama.cpp accepts: a context must then be asked for, n_ctx 0 is refused)
        check_int("LlamaParams: n_ctx_train", self.n_ctx_train, 0, UINT32_MAX, None, " (a uint32_t)")
        check_int("LlamaParams: n_layer", self.n_layer, 1, LLAMA_MAX_LAYERS, "--n-layer", " (LLAMA_MAX_LAYERS)")
        check_experts(self.n_expert, self.n_expert_used, self.n_embd * self.n_ff)
        head = self.n_embd // self.n_head if self.n_embd_head is None else self.n_embd_head  # (llama.cpp rounds down)
        check_int("LlamaParams: n_embd_head", head, 1, UINT32_MAX, None, f" (the head size; n_embd / n_head = "
                  f"{self.n_embd} / {self.n_head} rounded down unless given)")
        object.__setattr__(self, "n_embd_head", int(head))
        if self.n_head % self.n_head_kv:
            raise ModelError(f"LlamaParams: n_head_kv (--n-head-kv): expected a divisor of n_head {self.n_head}, "
                             f"found {self.n_head_kv}")
        for name, n in (("n_embd * n_vocab (token_embd)", self.n_embd * self.n_vocab), ("n_embd * n_ff (ffn_up)",
                        self.n_embd * self.n_ff), ("n_embd * n_q (attn_q)", self.n_embd * head * self.n_head)):
            if n > INT64_MAX:
                raise ModelError(f"LlamaParams: {name} = {n} elements, more than a ggml tensor holds (2^63 - 1)")
        if self.n_rot is None:
            object.__setattr__(self, "n_rot", head)
        check_int("LlamaParams: n_rot", self.n_rot, 1, head, None, f" (the head size, {head})")
        if self.n_rot % 2:
            raise ModelError(f"LlamaParams: n_rot {self.n_rot} must be even (RoPE rotates pairs of dimensions; the "
                             f"head size is {head}: --n-embd {self.n_embd} / --n-head {self.n_head}, or key_length)")
        eps = check_float("LlamaParams: rms_norm_eps", self.rms_norm_eps, 0, strict=False)
        object.__setattr__(self, "rms_norm_eps", eps)
        object.__setattr__(self, "rope_freq_base", check_float("LlamaParams: rope_freq_base", self.rope_freq_base, 0))
        try:
            wt = type_by_name(self.wtype) if isinstance(self.wtype, str) else None
        except UnknownTypeError:
            wt = None
        if wt is None:
            raise ModelError(f"LlamaParams: wtype (--wtype): expected a ggml type (f16, q8_0, q4_K, ...), "
                             f"found {self.wtype!r}")
        if wt.name in INT_TYPES:
            raise ModelError(f"LlamaParams: wtype (--wtype): weights cannot be of type {wt.name} (a float or a "
                             f"quantized type)")
        for field, n in (("n_embd", self.n_embd), ("n_ff", self.n_ff), ("n_embd_head * n_head", head * self.n_head)):
            if n % wt.blck_size:  # the rows of the matrices: ne[0] of every weight (ffn_down's, attn_output's too)
                raise ModelError(f"LlamaParams: {field} (--{field.replace('_', '-')}) {n}: the rows of {wt.name} "
                                 f"weights must be a whole number of its blocks ({wt.blck_size} elements each)")
        object.__setattr__(self, "wtype", wt.name)

    def model(self, n_ctx: int, type_k: str = "f16", type_v: str | None = None, flash_attn: bool = False) -> dict:
        """The builder's model dictionary for a context of `n_ctx` cells (the KV cache's size), the
        cache's K and V types (`type_v` defaults to `type_k`) and whether attention is flash attention."""
        return dict(n_vocab=self.n_vocab, n_embd=self.n_embd, n_layer=self.n_layer, n_head=self.n_head,
                    n_head_kv=self.n_head_kv, n_ff=self.n_ff, n_ctx=n_ctx, wtype=self.wtype, kvtype=type_k,
                    type_v=type_v or type_k, flash_attn=bool(flash_attn), n_expert=self.n_expert,
                    n_expert_used=self.n_expert_used, n_embd_head=self.n_embd_head, rms_norm_eps=self.rms_norm_eps,
                    rope=dict(mode=0, n_dims=self.n_rot, n_ctx_orig=self.n_ctx_train, freq_base=self.rope_freq_base,
                              freq_scale=1.0, ext_factor=0.0, attn_factor=1.0, beta_fast=32.0, beta_slow=1.0))


# %% [markdown]
# The models people ask about, as their GGUF headers give them (n_ctx_train is the context they
# were trained for; RoPE bases of 500,000 and 1,000,000 belong to Llama 3 and Mistral's later models).

# %%
# | export
PRESETS = {
    "llama-2-7b": LlamaParams(32000, 4096, 32, 32, 32, 11008, n_ctx_train=4096),
    "llama-2-13b": LlamaParams(32000, 5120, 40, 40, 40, 13824, n_ctx_train=4096),
    "llama-2-70b": LlamaParams(32000, 8192, 80, 64, 8, 28672, n_ctx_train=4096),
    "llama-3-8b": LlamaParams(128256, 4096, 32, 32, 8, 14336, rope_freq_base=500000.0, n_ctx_train=8192),
    "llama-3-70b": LlamaParams(128256, 8192, 80, 64, 8, 28672, rope_freq_base=500000.0, n_ctx_train=8192),
    "llama-3.1-8b": LlamaParams(128256, 4096, 32, 32, 8, 14336, rope_freq_base=500000.0, n_ctx_train=131072),
    "llama-3.1-70b": LlamaParams(128256, 8192, 80, 64, 8, 28672, rope_freq_base=500000.0, n_ctx_train=131072),
    "mistral-7b": LlamaParams(32000, 4096, 32, 32, 8, 14336, n_ctx_train=32768),
    "tinyllama-1.1b": LlamaParams(32000, 2048, 22, 32, 4, 5632, n_ctx_train=2048),
    "mixtral-8x7b": LlamaParams(32000, 4096, 32, 32, 8, 14336, rope_freq_base=1000000.0, n_ctx_train=32768,
                                n_expert=8, n_expert_used=2),
}


def preset(name: str) -> LlamaParams:
    """The preset called `name`, in any case; a `ModelError` listing the presets otherwise."""
    if not isinstance(name, str) or name.lower() not in PRESETS:
        raise ModelError(f"preset (--preset): expected one of {', '.join(PRESETS)} (any case), found {name!r}")
    return PRESETS[name.lower()]


# %% [markdown]
# A real model comes as a GGUF file, and planning needs only its header: appendix A4's `from_gguf(path)`
# reads it without trusting it and gives the `LlamaParams` and each weight's own type (a "Q4_K_M" file
# mixes q4_K and q6_K), which the builder of §2 takes as `tensor_types`. `python -m ggml_lite llama
# --gguf FILE` plans a model from its file.


# %% [markdown]
# ## 2 · Weights and the KV cache, as llama.cpp creates them
#
# `llm_load_tensors` creates the weights in a fixed order — the embeddings, the output head, then layer by
# layer — in one context per buffer type, and `llama_kv_cache_init` makes two 1-d tensors per layer, `cache_k_l<i>`
# and `cache_v_l<i>`, of `n_embd_k_gqa · n_ctx` elements each (all heads of a layer in one row per cell).
# `build_llama` below does both, by a placement that says which backend holds each part, then builds the graph.
#
# A Llama 3.1 file has one more tensor, `rope_freqs.weight`: RoPE's frequency factors, `n_rot / 2` floats
# that both RoPEs of every layer read. `llm_load_tensors` creates it in each layer's context
# (`TENSOR_DUPLICATED` after the first), so a GPU holding layers holds a copy of its own, while the
# host's layers read the one copy in the file, which llama.cpp maps by default. A file without
# `output.weight` ties the output to `token_embd` the same way: a copy on a GPU, the mapped bytes on the host.
# A mixture of experts (Mixtral 8x7B: 8 experts, 2 used per token) has a router `ffn_gate_inp` (`n_embd ×
# n_expert`, f32) and 3-d `ffn_gate_exps`, `ffn_down_exps`, `ffn_up_exps` (`n_embd × n_ff × n_expert`): 87 GiB in f16.

# %%
# | export
# the per-layer weights: their role in `build_graph` -> their name `blk.<il>.<name>.weight`, in the recorder's
# creation order (llama.cpp creates ffn_down before ffn_up: offsets differ, buffer sizes do not)
LAYER_WEIGHTS = {"attn_norm": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output",
                 "ffn_norm": "ffn_norm", "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down"}
# a layer with experts (llama.cpp's order): the router, then the experts' three matrices, each 3-d
EXPERT_WEIGHTS = {**{r: n for r, n in LAYER_WEIGHTS.items() if r not in ("gate", "up", "down")},
                  "gate_inp": "ffn_gate_inp", "gate_exps": "ffn_gate_exps", "down_exps": "ffn_down_exps",
                  "up_exps": "ffn_up_exps"}
CONTEXT_ORDER = ("CPU", "FAKE", "FAKE1")  # weight contexts first, then cache contexts, each in this order


def build_llama(model: dict, placement: dict, batch: dict, recorded: bool = False):
    """`llm_load_tensors` (the LLaMA tensors), `llama_kv_cache_init` and `build_llama`: the weights
    in `weights:<backend>` contexts and the KV cache in `kv_cache:<backend>` contexts by `placement`
    (`token_embd`, `output`, `layers` and `kv_cache` name a backend each), then the compute graph of
    `batch`. Returns `(contexts in id order, graph, expand roots)`."""
    n_embd, n_head, n_head_kv = model["n_embd"], model["n_head"], model["n_head_kv"]
    n_ff, n_vocab, n_ctx = model["n_ff"], model["n_vocab"], model["n_ctx"]
    head, n_expert = model.get("n_embd_head") or n_embd // n_head, model.get("n_expert", 0)  # (head: key_length)
    n_gqa, n_q = head * n_head_kv, head * n_head
    wtype, type_k = type_by_name(model["wtype"]), type_by_name(model["kvtype"])
    type_v = type_by_name(model.get("type_v", model["kvtype"]))
    ctxs = {}

    def ctx_of(kind, backend):
        label = f"{kind}:{backend}"
        if label not in ctxs:
            ctxs[label] = Context(label)
        return ctxs[label]

    types = model.get("tensor_types") or {}  # a real file's own type per tensor (models.gguf)

    def weight(backend, name, type, *ne):
        return ctx_of("weights", backend).new_tensor(types.get(name, type), list(ne), name=name)

    out_be = placement["output"]  # created in llama.cpp's order: embeddings, head, then layer by layer
    weight(placement["token_embd"], "token_embd.weight", wtype, n_embd, n_vocab)
    weight(out_be, "output_norm.weight", F32, n_embd)
    tied = bool(types) and "output.weight" not in types  # a file without output.weight: token_embd's matrix
    if not (tied and out_be == "CPU"):  # (tied on the host: the mapped token_embd itself, no copy)
        weight(out_be, "output.weight", types.get("token_embd.weight", wtype) if tied else wtype, n_embd, n_vocab)
    shapes = {"attn_norm": (F32, n_embd), "attn_q": (wtype, n_embd, n_q), "attn_k": (wtype, n_embd, n_gqa),
              "attn_v": (wtype, n_embd, n_gqa), "attn_output": (wtype, n_q, n_embd), "ffn_norm": (F32, n_embd),
              "ffn_gate": (wtype, n_embd, n_ff), "ffn_up": (wtype, n_embd, n_ff), "ffn_down": (wtype, n_ff, n_embd),
              "ffn_gate_inp": (F32, n_embd, n_expert), "ffn_gate_exps": (wtype, n_embd, n_ff, n_expert),
              "ffn_down_exps": (wtype, n_ff, n_embd, n_expert), "ffn_up_exps": (wtype, n_embd, n_ff, n_expert)}
    rope: dict[int, Tensor] = {}  # a Llama 3.1 file's RoPE frequency factors, per layer
    mapped: list[Tensor] = []  # the host's one copy
    for il, be in enumerate(placement["layers"]):
        for name in (EXPERT_WEIGHTS if n_expert else LAYER_WEIGHTS).values():
            weight(be, f"blk.{il}.{name}.weight", *shapes[name])
            if name == "ffn_norm" and "rope_freqs.weight" in types:  # (created after ffn_norm, as llama.cpp does)
                if be != "CPU" or not mapped:
                    t = weight(be, "rope_freqs.weight", F32, model["rope"]["n_dims"] // 2)
                    mapped += [t] if be == "CPU" else []
                rope[il] = mapped[0] if be == "CPU" else t
    for il, be in enumerate(placement["kv_cache"]):
        c = ctx_of("kv_cache", be)
        c.new_tensor_1d(type_k, n_gqa * n_ctx, name=f"cache_k_l{il}")
        c.new_tensor_1d(type_v, n_gqa * n_ctx, name=f"cache_v_l{il}")
    w, layers = model_tensors({t.name: t for c in ctxs.values() for t in c.tensors}, len(placement["layers"]))
    for il, t in rope.items():
        layers[il]["rope_freqs"] = t
    ctx, graph, roots = build_graph(model, w, layers, batch, recorded)

    def rank(label):  # CPU, FAKE, FAKE1 as the recorder ordered them; other backends after, as created
        be = label.split(":")[1]
        return CONTEXT_ORDER.index(be) if be in CONTEXT_ORDER else len(CONTEXT_ORDER)
    ordered = [ctxs[label] for kind in ("weights", "kv_cache")
               for label in sorted((x for x in ctxs if x.startswith(kind + ":")), key=rank)] + [ctx]
    return ordered, graph, roots


# %%
# | export
def model_tensors(tensors_by_name: dict, n_layer: int) -> tuple:
    """`(w, layers)` of `build_graph` from existing tensors (a loaded model's weights and cache); without
    `output.weight`, the output is `token_embd.weight` (tied embeddings); a layer with `ffn_gate_inp` has experts."""
    t = tensors_by_name
    w = {"token_embd": t["token_embd.weight"], "output_norm": t["output_norm.weight"],
         "output": t.get("output.weight", t["token_embd.weight"])}
    roles = [EXPERT_WEIGHTS if f"blk.{il}.ffn_gate_inp.weight" in t else LAYER_WEIGHTS for il in range(n_layer)]
    layers = [{**{r: t[f"blk.{il}.{n}.weight"] for r, n in roles[il].items()},
               "k_l": t[f"cache_k_l{il}"], "v_l": t[f"cache_v_l{il}"]} for il in range(n_layer)]
    return w, layers


# %% [markdown]
# ## 3 · The graph
#
# `build_llama` is a loop over layers of five helpers, each a few ggml calls. The builder state —
# the compute context, the model, the batch and the list of `ggml_build_forward_expand` roots in
# the order llama.cpp expands them — travels in a small record. Names follow llama.cpp's callback:
# `cb(t, "Qcur", il)` names a tensor `Qcur-<il>`.
#
# The recorded variant (`recorded=True`), which built the project's LLaMA fixtures, has one more node per
# layer (a RESHAPE of Vcur) and other names, and the same buffers: appendix A5 rebuilds fixture 13 with it.

# %%
# | export models.llm_build
"""llama.cpp's graph helpers for a LLaMA layer (`llm_build_norm`, `llm_build_kv_store`, `llm_build_kqv`,
`llm_build_ffn`, `llm_build_moe_ffn` at llama.cpp daa9623): attention with or without flash attention, a
feed-forward network dense or with experts; `recorded=True` gives the variant the fixtures were recorded with."""

from dataclasses import dataclass

import numpy as np

from ggml_lite.ops import (
    add,
    cont,
    cont_2d,
    cpy,
    div,
    flash_attn_ext,
    get_rows,
    mul,
    mul_mat,
    mul_mat_id,
    permute,
    reshape_2d,
    reshape_3d,
    rms_norm,
    rope_ext,
    silu,
    soft_max,
    soft_max_ext,
    sum_rows,
    top_k,
    transpose,
    view_1d,
    view_2d,
    view_3d,
)
from ggml_lite.tensor import I32, Context, row_size, set_input

# %% [markdown]
# The helpers share a small record. With flash attention the cache stores V as it stores K, a row per
# cell, with no transpose (`llm_build_kv_store`, `llama.cpp:8745-8747` at daa9623):
#
# ```c
#         v_cache_view = ggml_view_1d(ctx, kv.v_l[il], n_tokens*n_embd_v_gqa,
#                 (kv_head)*ggml_row_size(kv.v_l[il]->type, n_embd_v_gqa));
# ```

# %%
# | export models.llm_build
@dataclass
class LlmBuildContext:
    """What the `llm_build_*` helpers share while building one graph (`llm_build_context`)."""

    ctx: Context
    model: dict
    batch: dict
    recorded: bool
    roots: list

    def name(self, t, name: str, il: int = -1):
        """llama.cpp's `cb(t, name, il)`: `name-il`, or `name` outside the layers."""
        return t.set_name(f"{name}-{il}" if il >= 0 else name)


def llm_build_norm(b: LlmBuildContext, x, weight, il: int, name: str = "norm"):
    """`llm_build_norm` (LLM_NORM_RMS, a weight, no bias): rms_norm, then times the weight."""
    cur = b.name(rms_norm(b.ctx, x, b.model["rms_norm_eps"]), name, il)
    return mul(b.ctx, cur, weight)


def llm_build_kv_store(b: LlmBuildContext, k_cur, v_cur, L: dict, il: int) -> None:
    """`llm_build_kv_store`: copy this batch's K rows into the cache at cell `kv_head` (a 1-d view), and
    V transposed (a 2-d view whose rows are the cache's columns: V is stored one row per dimension) or,
    with flash attention, V as K is stored (a 1-d view: one row per cell)."""
    n_tokens, kv_head = b.batch["n_tokens"], b.batch["kv_head"]
    n_gqa, kvtype = L["k_l"].ne[0] // b.model["n_ctx"], L["k_l"].type
    k_view = b.name(view_1d(b.ctx, L["k_l"], n_tokens * n_gqa, row_size(kvtype, n_gqa) * kv_head), "k_cache_view", il)
    b.roots.append(cpy(b.ctx, k_cur, k_view))
    elt = L["v_l"].type.type_size

    def v_cache_view():
        return view_2d(b.ctx, L["v_l"], n_tokens, n_gqa, b.model["n_ctx"] * elt, kv_head * elt)
    if b.model.get("flash_attn"):  # not transposed
        v_view, v_t = view_1d(b.ctx, L["v_l"], n_tokens * n_gqa, kv_head * row_size(L["v_l"].type, n_gqa)), v_cur
    elif b.recorded:  # the recorder reshaped Vcur, transposed it, then made the view
        v_t = transpose(b.ctx, reshape_2d(b.ctx, v_cur, n_gqa, n_tokens))
        v_view = v_cache_view()
    else:  # llama.cpp makes the view first
        v_view = v_cache_view()
        v_t = transpose(b.ctx, v_cur)
    b.name(v_view, "v_cache_view", il)
    b.roots.append(cpy(b.ctx, v_t, v_view))


# %% [markdown]
# Attention reads the whole cache, `n_kv` cells, through two 3-d views — K as `[head, n_kv, n_head_kv]`,
# V as `[n_kv, head, n_head_kv]` — so that `kq = K·Q` has one `n_kv × n_tokens` matrix per head, and
# `kqv = V·softmax(kq)` the heads' outputs, merged back into `n_embd` rows. With flash attention one op
# does all of it, over a V view laid out as K's (`llm_build_kqv`, `llama.cpp:9111-9131`):
#
# ```c
#         cur = ggml_flash_attn_ext(ctx, q, k, v, kq_mask, kq_scale, hparams.f_max_alibi_bias,
#                                   hparams.attn_soft_cap ? hparams.f_attn_logit_softcapping : 0.0f);
#         cur = ggml_reshape_2d(ctx, cur, n_embd_head_v*n_head, n_tokens);
# ```
#
# `FLASH_ATTN_EXT` (chapter 01) keeps a running softmax per row: the `n_kv × n_tokens × n_head` scores never exist.
# Its mask is f16, cast once (`llama.cpp:9834`). A layer has 4 nodes fewer (the scores, softmax, `kqv`, permute and
# cont become `FLASH_ATTN_EXT` and a reshape; V's store loses its transpose): the 7B's 1,030 − 32 · 4 + 1 = 903.

# %%
# | export models.llm_build
def llm_build_kqv(b: LlmBuildContext, wo, q, kq_mask, L: dict, il: int):
    """`llm_build_kqv`: scores, masked soft_max, weighted values, heads merged, output projection; with
    flash attention one `ggml_flash_attn_ext` over the K and V views instead. `q` is Q permuted to
    heads-major (`q-<il>`)."""
    m, n_tokens, n_kv = b.model, b.batch["n_tokens"], b.batch["n_kv"]
    head = m.get("n_embd_head") or m["n_embd"] // m["n_head"]
    n_gqa, kvtype, elt = head * m["n_head_kv"], L["k_l"].type, L["v_l"].type.type_size
    k = b.name(view_3d(b.ctx, L["k_l"], head, n_kv, m["n_head_kv"], row_size(kvtype, n_gqa), row_size(kvtype, head), 0),
               "k", il)
    scale = 1.0 / head ** 0.5 if b.recorded else float(np.float32(1) / np.sqrt(np.float32(head)))  # 1.0f/sqrtf(head)
    if m.get("flash_attn"):  # V as K is stored: [head, n_kv, n_head_kv]; the KQ matrix is never made
        vt = L["v_l"].type
        v = b.name(view_3d(b.ctx, L["v_l"], head, n_kv, m["n_head_kv"], row_size(vt, n_gqa), row_size(vt, head), 0),
                   "v", il)
        cur = flash_attn_ext(b.ctx, q, k, v, kq_mask, scale, 0.0, 0.0)
        cur = reshape_2d(b.ctx, cur, head * m["n_head"], n_tokens)
    else:
        def v_view():
            nb1 = elt * m["n_ctx"]  # a row per dimension: n_ctx cells
            return b.name(view_3d(b.ctx, L["v_l"], n_kv, head, m["n_head_kv"], nb1, nb1 * head, 0), "v", il)
        v = v_view() if b.recorded else None  # (the recorder made both views before the scores)
        kq = b.name(mul_mat(b.ctx, k, q), "kq", il)
        kq = b.name(soft_max_ext(b.ctx, kq, kq_mask, scale, 0.0), "kq_soft_max_ext", il)
        v = v if v is not None else v_view()
        kqv = b.name(mul_mat(b.ctx, v, kq), "kqv", il)
        merged = b.name(permute(b.ctx, kqv, 0, 2, 1, 3), "kqv_merged", il)
        cur = b.name(cont_2d(b.ctx, merged, head * m["n_head"], n_tokens), "kqv_merged_cont", il)
    b.roots.append(cur)
    return b.name(mul_mat(b.ctx, wo, cur), "kqv_out", il)


def llm_build_ffn(b: LlmBuildContext, x, L: dict, il: int):
    """`llm_build_ffn` (LLM_FFN_SILU, LLM_FFN_PAR, no biases): down(silu(gate·x) ⊙ up·x)."""
    up = b.name(mul_mat(b.ctx, L["up"], x), "ffn_up", il)
    gate = b.name(silu(b.ctx, b.name(mul_mat(b.ctx, L["gate"], x), "ffn_gate", il)), "ffn_silu", il)
    par = b.name(mul(b.ctx, gate, up), "ffn_gate_par", il)
    return b.name(mul_mat(b.ctx, L["down"], par), "ffn_down" if b.recorded else "ffn_out", il)


# %% [markdown]
# With experts, the FFN is `llm_build_moe_ffn` (`llama.cpp:8971-9067`). The router's softmax gives each
# token a probability per expert; `ggml_top_k` (an argsort, then a view of its first `k` columns) picks the
# `n_expert_used` best; `ggml_mul_mat_id` multiplies each token by the matrices of its own experts only:
#
# ```c
#     ggml_tensor * selected_experts = ggml_top_k(ctx, probs, n_expert_used); // [n_expert_used, n_tokens]
#     ggml_tensor * up = llm_build_lora_mm_id(lctx, ctx, up_exps, cur, selected_experts); // [n_ff, n_expert_used, n_tokens]
# ```
#
# Then the experts' outputs are weighted and added, one 2-d view per expert used. 20 nodes instead of the
# dense FFN's 5 for two experts used (a view and an add more per expert; one expert: a `cont`, no add):
# Mixtral's 1,030 + 32 · 15 = 1,510 nodes. Its activations are `n_expert_used` times a dense FFN's.

# %%
# | export models.llm_build
def llm_build_moe_ffn(b: LlmBuildContext, cur, L: dict, il: int):
    """`llm_build_moe_ffn` (LLM_FFN_SILU, weights normalised, not scaled): the router's softmax picks
    `n_expert_used` experts per token (`ggml_top_k`), each runs its own FFN (`ggml_mul_mat_id`), and
    their outputs are summed, weighted by the router's normalised probabilities."""
    ctx, n_expert, n_used = b.ctx, b.model["n_expert"], b.model["n_expert_used"]
    n_embd, n_tokens = cur.ne[0], cur.ne[1]
    logits = b.name(mul_mat(ctx, L["gate_inp"], cur), "ffn_moe_logits", il)  # [n_expert, n_tokens]
    probs = b.name(soft_max(ctx, logits), "ffn_moe_probs", il)
    selected = top_k(ctx, probs, n_used)  # [n_used, n_tokens]: a view of the argsort
    b.name(selected.src[0], "ffn_moe_argsort", il)
    b.name(selected, "ffn_moe_topk", il)
    weights = b.name(get_rows(ctx, reshape_3d(ctx, probs, 1, n_expert, n_tokens), selected), "ffn_moe_weights", il)
    weights = reshape_2d(ctx, weights, n_used, n_tokens)
    weights_sum = b.name(sum_rows(ctx, weights), "ffn_moe_weights_sum", il)
    weights = b.name(div(ctx, weights, weights_sum), "ffn_moe_weights_norm", il)
    weights = reshape_3d(ctx, weights, 1, n_used, n_tokens)
    cur = reshape_3d(ctx, cur, n_embd, 1, n_tokens)
    up = b.name(mul_mat_id(ctx, L["up_exps"], cur, selected), "ffn_moe_up", il)  # [n_ff, n_used, n_tokens]
    gate = b.name(mul_mat_id(ctx, L["gate_exps"], cur, selected), "ffn_moe_gate", il)
    gate = b.name(silu(ctx, gate), "ffn_moe_silu", il)
    par = b.name(mul(ctx, up, gate), "ffn_moe_gate_par", il)
    experts = b.name(mul_mat_id(ctx, L["down_exps"], par, selected), "ffn_moe_down", il)  # [n_embd, n_used, n_tokens]
    experts = mul(ctx, experts, weights)
    moe_out = view_2d(ctx, experts, n_embd, n_tokens, experts.nb[2], 0)  # the experts' outputs, one view each
    for i in range(1, n_used):
        moe_out = add(ctx, moe_out, view_2d(ctx, experts, n_embd, n_tokens, experts.nb[2], i * experts.nb[1]))
    return cont(ctx, moe_out) if n_used == 1 else moe_out  # (one expert: a view, made contiguous)


# %% [markdown]
# One layer: norm, Q/K/V, RoPE on Q and K, the cache written (its two copies expanded right after
# Q, K and V, so they run before attention reads the cache), attention, the residual; in the last
# layer only the output rows go on (`inp_out_ids`); then the feed-forward and its residual.

# %%
# | export models.llm_build
def llm_build_layer(b: LlmBuildContext, inp_l, inp_pos, kq_mask, L: dict, il: int):
    """One iteration of `build_llama`'s layer loop; returns the layer's output `l_out-<il>`."""
    m, n_tokens, ctx = b.model, b.batch["n_tokens"], b.ctx
    head, r = m.get("n_embd_head") or m["n_embd"] // m["n_head"], m["rope"]
    rope_args = (r["n_dims"], r["mode"], r["n_ctx_orig"], r["freq_base"], r["freq_scale"], r["ext_factor"],
                 r["attn_factor"], r["beta_fast"], r["beta_slow"])
    inp_sa = inp_l
    cur = b.name(llm_build_norm(b, inp_l, L["attn_norm"], il), "attn_norm", il)
    q = b.name(mul_mat(ctx, L["wq"], cur), "Qcur", il)
    k = b.name(mul_mat(ctx, L["wk"], cur), "Kcur", il)
    v = b.name(mul_mat(ctx, L["wv"], cur), "Vcur", il)
    factors = L.get("rope_freqs")  # (build_rope_factors: a Llama 3.1 file's, else none)
    q = b.name(rope_ext(ctx, reshape_3d(ctx, q, head, m["n_head"], n_tokens), inp_pos, factors, *rope_args),
               "Qcur_rope" if b.recorded else "Qcur", il)
    k = b.name(rope_ext(ctx, reshape_3d(ctx, k, head, m["n_head_kv"], n_tokens), inp_pos, factors, *rope_args),
               "Kcur_rope" if b.recorded else "Kcur", il)
    b.roots += [q, k, v]  # llm_build_kv expands Q, K and V first
    qp = b.name(permute(ctx, q, 0, 2, 1, 3), "q", il) if b.recorded else None  # (the recorder's order)
    llm_build_kv_store(b, k, v, L, il)
    qp = qp if qp is not None else b.name(permute(ctx, q, 0, 2, 1, 3), "q", il)  # in llm_build_kqv
    cur = llm_build_kqv(b, L["wo"], qp, kq_mask, L, il)
    if il == m["n_layer"] - 1:  # "skip computing output for unused tokens"
        out_ids = b.name(ctx.new_tensor_1d(I32, b.batch["n_outputs"]), "inp_out_ids")
        set_input(out_ids)
        cur = get_rows(ctx, cur, out_ids)
        inp_sa = get_rows(ctx, inp_sa, out_ids)
    ffn_inp = b.name(add(ctx, cur, inp_sa), "ffn_inp", il)
    cur = b.name(llm_build_norm(b, ffn_inp, L["ffn_norm"], il, "norm_ffn" if b.recorded else "norm"), "ffn_norm", il)
    if "gate_inp" in L:  # the MoE branch
        cur = b.name(llm_build_moe_ffn(b, cur, L, il), "ffn_moe_out", il)
    else:
        cur = llm_build_ffn(b, cur, L, il)
    return b.name(add(ctx, cur, ffn_inp), "l_out", il)


# %% [markdown]
# The whole graph: the inputs (token ids, positions, the causal mask padded to 32 rows), the layers,
# the final norm and the output head; then the roots are expanded in llama.cpp's order into a graph
# of `llama_model_max_nodes` slots — max(8192, 5 × the model's tensors).

# %%
# | export
def llama_model_max_nodes(n_layer: int, n_expert: int = 0) -> int:
    """`llama_model_max_nodes`: max(8192, 5 × the number of model tensors)."""
    return max(8192, 5 * (3 + len(EXPERT_WEIGHTS if n_expert else LAYER_WEIGHTS) * n_layer))


def build_graph(model: dict, w: dict, layers: list, batch: dict, recorded: bool = False):
    """`build_llama`: the compute context and graph of one batch (`n_tokens`, `n_kv`, `kv_head`,
    `n_outputs`) over the weights `w` / `layers` (a fresh graph per evaluation, as llama.cpp builds
    one). Returns `(context, graph, expand roots)`."""
    b = LlmBuildContext(Context("compute"), model, batch, recorded, [])
    n_tokens, ctx = batch["n_tokens"], b.ctx
    inp_tokens = b.name(ctx.new_tensor_1d(I32, n_tokens), "inp_tokens")
    set_input(inp_tokens)
    inp_l = b.name(get_rows(ctx, w["token_embd"], inp_tokens), "inp_embd")
    inp_pos = b.name(ctx.new_tensor_1d(I32, n_tokens), "inp_pos")
    set_input(inp_pos)
    kq_mask = b.name(ctx.new_tensor_2d(F32, batch["n_kv"], GGML_PAD(n_tokens, GGML_KQ_MASK_PAD)), "KQ_mask")
    set_input(kq_mask)
    if model.get("flash_attn"):  # build_inp_KQ_mask: flash attention reads the mask as f16
        kq_mask = cast(ctx, kq_mask, F16)
    for il, L in enumerate(layers):
        inp_l = llm_build_layer(b, inp_l, inp_pos, kq_mask, L, il)
    cur = b.name(llm_build_norm(b, inp_l, w["output_norm"], -1, "norm_out" if recorded else "norm"), "result_norm")
    cur = b.name(mul_mat(ctx, w["output"], cur), "result_output")
    if recorded:
        set_output(cur)
    b.roots.append(cur)
    graph = Graph(GGML_DEFAULT_GRAPH_SIZE if recorded else llama_model_max_nodes(len(layers), model.get("n_expert", 0)))
    for r in b.roots:
        build_forward_expand(graph, r)
    return ctx, graph, b.roots


# %% [markdown]
# The inputs of a batch, as the recorded scenarios define them: positions from `kv_head` on, a causal
# mask (0 where a token may look, −∞ elsewhere), token ids from a fixed formula, the last
# `n_outputs` tokens as outputs.

# %%
# | export
def batch_inputs(batch: dict) -> dict:
    """The inputs of a batch (n_tokens, n_kv, kv_head, n_outputs), as the scenario README defines them."""
    n, n_kv, head, n_out = batch["n_tokens"], batch["n_kv"], batch["kv_head"], batch["n_outputs"]
    pos = np.arange(head, head + n, dtype=np.int32)
    mask = np.full((GGML_PAD(n, GGML_KQ_MASK_PAD), n_kv), -np.inf, dtype=np.float32)  # numpy shape: [rows, n_kv]
    for i in range(n):
        mask[i, : head + i + 1] = 0.0
    return {"inp_tokens": ((37 * pos + 11) % 256).astype(np.int32), "inp_pos": pos, "KQ_mask": mask,
            "inp_out_ids": np.arange(n - n_out, n, dtype=np.int32)}


# %% [markdown]
# ## 4 · The worst case llama.cpp reserves
#
# `llama_new_context_with_model` pads `n_ctx` to a multiple of 32 (256 with flash attention), makes a KV cache
# of that many cells, and reserves the compute buffers once, for the largest graph it will ever run: `n_tokens =
# min(n_ctx, n_ubatch)` tokens, all outputs, at the end of the cache, attending to all of it (`n_kv = n_ctx`).

# %%
# | export
KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")  # llama.cpp's --cache-type-k


def padded_n_ctx(n_ctx: int, flash_attn: bool = False) -> int:
    """`llama_new_context_with_model`'s `n_ctx`: padded to `llama_kv_cache_get_padding` (256 with flash
    attention, else 32)."""
    pad = 256 if flash_attn else 32
    check_int("n_ctx", n_ctx, 1, MAX_N_CTX_FA if flash_attn else MAX_N_CTX, "--n-ctx",
              f" (padded to {pad}, an int32 in llama.cpp's graph)")
    return GGML_PAD(n_ctx, pad)


def batch_sizes(n_ctx: int, n_batch: int = 2048, n_ubatch: int = 512) -> tuple:
    """`llama_new_context_with_model`'s (n_batch, n_ubatch) for a padded `n_ctx`: n_batch at most n_ctx
    (causal attention) and at least 32 (the mask's padding); n_ubatch at most n_batch (0: n_batch)."""
    check_int("n_batch", n_batch, 0, INT32_MAX, "--n-batch")
    check_int("n_ubatch", n_ubatch, 0, INT32_MAX, "--n-ubatch")
    if n_batch == 0 and n_ubatch == 0:
        raise ModelError("n_batch (--n-batch) 0, n_ubatch (--n-ubatch) 0: n_batch and n_ubatch cannot both be zero")
    n_batch = max(min(n_ctx, n_batch), GGML_KQ_MASK_PAD)
    return n_batch, min(n_batch, n_ubatch if n_ubatch > 0 else n_batch)


def worst_case_batch(n_ctx: int, n_ubatch: int = 512) -> dict:
    """The batch of llama.cpp's reserve: `min(n_ctx, n_ubatch)` tokens, all outputs, the whole cache."""
    n_tokens = min(n_ctx, n_ubatch)
    return dict(n_tokens=n_tokens, n_kv=n_ctx, kv_head=n_ctx - n_tokens, n_outputs=n_tokens)


# %% [markdown]
# A context is checked before anything is built, against what llama.cpp's types and limits allow:
# `n_ctx` up to 2^31 − 32 (padded to 32 it stays an `int32_t`, the graph's `n_kv`), batch sizes and
# `n_gpu_layers` that are `int32_t`, at most 15 GPUs (the scheduler takes `GGML_SCHED_MAX_BACKENDS` = 16
# backends and the CPU is one of them; CUDA's `GGML_CUDA_MAX_DEVICES` is 16 too), one finite,
# non-negative `tensor_split` weight per GPU, the cache types llama.cpp offers, a head size that is a whole
# number of the K and V types' blocks (`GGML_ASSERT(n_embd_head_k % ggml_blck_size(type_k) == 0)`, then V's),
# and a V cache other than f16 only with flash attention ("V cache quantization requires flash_attn",
# `llama.cpp:18130-18133`: the transposed V is written an element per row, which no block type can take).

# %%
# | export
def check_context(params: LlamaParams, n_ctx: int, n_ubatch: int, n_gpu_layers: int = 0, devices: int = 0,
                  tensor_split=None, type_k: str = "f16", type_v: str | None = None, flash_attn: bool = False) -> None:
    """The checks of `llama_new_context_with_model` and `llm_load_tensors` on a context's parameters, made
    before any planning: a `ModelError` naming the parameter and its flag, what was expected and found."""
    if not isinstance(flash_attn, bool):
        raise ModelError(f"flash_attn (--flash-attn): expected true or false, found {flash_attn!r}")
    padded_n_ctx(n_ctx, flash_attn)
    check_int("n_ubatch", n_ubatch, 1, INT32_MAX, "--n-ubatch")
    check_int("n_gpu_layers", n_gpu_layers, 0, INT32_MAX, "--n-gpu-layers")
    check_int("devices", devices, 0, MAX_DEVICES, "--devices",
              f" (GGML_SCHED_MAX_BACKENDS = {GGML_SCHED_MAX_BACKENDS} backends, the CPU being one)")
    if tensor_split is not None:
        if isinstance(tensor_split, (str, bytes)) or not hasattr(tensor_split, "__len__"):
            raise ModelError(f"tensor_split (--tensor-split): expected a list of numbers, found {tensor_split!r}")
        if len(tensor_split) != devices:
            raise ModelError(f"tensor_split (--tensor-split): expected {devices} weight(s), one per GPU (--devices "
                             f"{devices}), found {len(tensor_split)}: {list(tensor_split)}")
        flt_max = float(np.finfo(np.float32).max)  # llama.cpp's tensor_split is a float array, summed in float
        for i, x in enumerate(tensor_split):
            check_float(f"tensor_split[{i}]", x, 0.0, "--tensor-split", strict=False, most=flt_max)
        if sum(tensor_split) > flt_max:
            raise ModelError(f"tensor_split (--tensor-split): the weights add up to {sum(tensor_split):g}, more than a "
                             f"float holds ({flt_max:g})")
    type_v = "f16" if type_v is None else type_v
    for flag, t in (("type_k", type_k), ("type_v", type_v)):
        if t not in KV_TYPES:
            raise ModelError(f"{flag} (--{flag.replace('_', '-')}): expected one of {', '.join(KV_TYPES)}, found {t!r}")
    if type_v != "f16" and not flash_attn:  # (any type but f16, f32 too: llama.cpp tests type_v != F16)
        raise ModelError(f"type_v (--type-v) {type_v}: V cache quantization requires flash_attn (--flash-attn), "
                         f"as llama_new_context_with_model says")
    head = params.n_embd_head
    for flag, t in (("type_k", type_k), ("type_v", type_v)):  # n_embd_head_k, then n_embd_head_v
        blck = type_by_name(t).blck_size
        if head % blck:
            raise ModelError(f"{flag} (--{flag.replace('_', '-')}) {t}: the head size {head} is not a whole number "
                             f"of its blocks ({blck} elements each; llama.cpp: GGML_ASSERT(hparams.n_embd_head_"
                             f"{flag[-1]} % ggml_blck_size({flag}) == 0) failed)")


# %% [markdown]
# Llama-2 7B on the CPU alone, `n_ctx` 2048, `n_ubatch` 512. Before running it, predict: the KV cache
# is 2 (K and V) × 32 layers × 4096 × 2048 cells × 2 bytes = 1024 MiB; the graph has 32 nodes per
# layer and 6 more, 1,030. llama.cpp printed `CPU compute buffer size = 164.01 MiB` for this setup;
# the plan below is the graph allocator of chapter 05 on this graph.

# %%
# NBVAL_CHECK_OUTPUT
import ggml_lite as gl  # noqa: E402

MiB = 1024 * 1024
p7 = PRESETS["llama-2-7b"]
n_ctx = padded_n_ctx(2048)
model = p7.model(n_ctx)
on_cpu = dict(token_embd="CPU", output="CPU", layers=["CPU"] * p7.n_layer, kv_cache=["CPU"] * p7.n_layer)
ctxs, graph, _ = build_llama(model, on_cpu, worst_case_batch(n_ctx, 512))
for c in ctxs[:-1]:  # weights and cache get their buffers (lazily: no byte is allocated yet)
    gl.alloc_ctx_tensors(c, gl.cpu_buffer_type())
galloc = gl.GAllocr(gl.cpu_buffer_type())
galloc.reserve(graph)
kv_bytes = sum(t.nbytes for c in ctxs if c.name.startswith("kv_cache") for t in c.tensors)  # as llama.cpp sums it
print(f"graph: {len(graph.nodes)} nodes, {len(graph.leafs)} leafs")
print(f"KV self size  = {kv_bytes / MiB:7.2f} MiB")
print(f"CPU compute buffer size = {galloc.get_buffer_size(0) / MiB:.2f} MiB")

# %% [markdown]
# 1,030 nodes, 1024.00 MiB and 164.01 MiB — llama.cpp's three numbers.

# %% [markdown]
# ## 5 · Placement as llama.cpp placed it
#
# `llm_load_tensors` keeps the input layer (`token_embd`) on the host — "there is very little benefit
# to offloading the input layer" — and gives the last `n_gpu_layers` layers to the GPUs, split by
# `tensor_split` (by free memory when none is given: here, evenly); the output layer goes to the last
# GPU only when `n_gpu_layers > n_layer`. The KV cache of a layer lives with its layer (with
# `--no-kv-offload`, on the host). The split points are cumulative fractions compared in float32,
# `upper_bound(splits, float(i - i_gpu_start) / act_gpu_layers)`.

# %%
# | export
def layer_placement(n_layer: int, n_gpu_layers: int = 0, n_devices: int = 0, tensor_split=None,
                    offload_kqv: bool = True) -> dict:
    """`llm_load_tensors`' placement (split mode layer) and `llama_kv_cache_init`'s: a backend name
    ("CPU", "GPU0", "GPU1", ...) for `token_embd`, `output`, each layer and each layer's KV cache."""
    if n_gpu_layers < 0 or n_devices < 0:
        raise ModelError(f"n_gpu_layers ({n_gpu_layers}) and devices ({n_devices}) cannot be negative")
    n_gpu_layers = n_gpu_layers if n_devices else 0
    i_gpu_start = max(n_layer - n_gpu_layers, 0)
    given = list(tensor_split or [])[:max(n_devices, 1)]
    given += [0.0] * (max(n_devices, 1) - len(given))  # a short list: the other devices get nothing
    weights = np.asarray(given, dtype=np.float32)
    if not np.isfinite(weights).all() or (weights < 0).any():
        raise ModelError(f"tensor_split {list(tensor_split)}: the weights must be finite and non-negative")
    if not weights.any():  # all zero (or none given): the default split, by free memory -- here equal
        weights = np.ones(max(n_devices, 1), dtype=np.float32)
    cumulative = np.cumsum(weights, dtype=np.float32)  # summed in order, as the C loop does
    splits = cumulative / cumulative[-1]
    act = min(n_gpu_layers, n_layer + 1)

    def gpu(x):  # std::upper_bound over the split points
        return f"GPU{int(np.searchsorted(splits, np.float32(x) / np.float32(act), side='right'))}"
    layers = ["CPU" if i < i_gpu_start else gpu(i - i_gpu_start) for i in range(n_layer)]
    output = gpu(act - 1) if n_gpu_layers > n_layer else "CPU"
    kv = layers if offload_kqv else ["CPU"] * n_layer
    return dict(token_embd="CPU", output=output, layers=layers, kv_cache=list(kv))


# %% [markdown]
# Then `llama_new_context_with_model` makes one backend per GPU and the CPU last, gives the CPU
# backend's compute buffer a host buffer type, turns on pipeline parallelism (`n_copies` 4) only with
# several GPUs, every layer offloaded and the KV cache with them, and reserves the worst-case graph
# through the scheduler. While building the graph, its callback pins every layer's `norm` to the
# layer's backend when everything is offloaded or the batch has fewer than 32 tokens (else the
# scheduler would run it where the previous layer ran), and, without KV offload, `kqv_merged_cont`
# to the CPU. The GPUs are SIM devices configured like CUDA: alignment 128 and CUDA's offload rule
# (an op whose batch has at least 32 rows, except GET_ROWS).

# %%
# | export
def plan_memory(params: LlamaParams, n_ctx: int = 512, n_ubatch: int = 512, n_gpu_layers: int = 0,
                devices: int = 0, tensor_split=None, type_k: str = "f16", type_v: str | None = None,
                offload_kqv: bool = True, trace: bool = False, tensor_types: dict | None = None,
                gpu_init=None, sched_class=BackendSched, flash_attn: bool = False, tensor_offsets=None) -> dict:
    """What `llama_new_context_with_model` allocates: per backend the weights, the KV cache and the
    compute buffer of the worst-case graph (`ggml_backend_sched_reserve`), with the graph's node and
    split counts and the scheduler's n_copies. Sizes in bytes. With `trace`, also the graph allocator's
    trace of the reserve (`events`: chapter 05's events, for `report.peaks`). `gpu_init(name)` makes a
    GPU's backend (default: a SIM device like CUDA) and `sched_class` the scheduler, for chapter 12's
    devices and scheduler of today; `reserved` is false where a device refused a compute buffer
    (llama.cpp: "failed to allocate compute buffers"). `tensor_offsets`: a GGUF's, for `mapped_size`."""
    check_context(params, n_ctx, n_ubatch, n_gpu_layers, devices, tensor_split, type_k, type_v, flash_attn)
    n_ctx, type_v = padded_n_ctx(n_ctx, flash_attn), type_v or "f16"
    placement = layer_placement(params.n_layer, n_gpu_layers, devices, tensor_split, offload_kqv)
    batch = worst_case_batch(n_ctx, n_ubatch)
    model = {**params.model(n_ctx, type_k, type_v, flash_attn), "tensor_types": tensor_types}
    ctxs, graph, _ = build_llama(model, placement, batch)
    _check_sizes(ctxs, n_ctx, batch["n_tokens"])
    gpus = [(gpu_init or cuda_like)(f"GPU{i}") for i in range(devices)]
    backends = {b.get_name(): b for b in (*gpus, cpu_init())}
    host_buft = sim_host_buffer_type() if devices else cpu_buffer_type()  # llama_default_buffer_type_cpu(true)
    bufts = {name: host_buft if name == "CPU" else b.get_default_buffer_type() for name, b in backends.items()}
    report = {name: dict(weights=0, kv=0, output=0, compute=0) for name in backends}
    for c in ctxs[:-1]:
        kind, name = c.name.split(":")
        buf = alloc_ctx_tensors_from_buft(c, bufts[name])
        buf.set_usage(BufferUsage.WEIGHTS if kind == "weights" else BufferUsage.ANY)
        if kind == "weights":  # the host's weights: the file range llama.cpp maps; a GPU's: its buffer
            report[name]["weights"] += mapped_size(c.tensors, tensor_offsets) if name == "CPU" else buf.get_size()
        report[name]["kv"] += sum(t.nbytes for t in c.tensors) if kind == "kv_cache" else 0  # "KV self size"
    # llama_output_reserve at init: the logits of n_seq_max (1) outputs, f32, in a host buffer
    report["CPU"]["output"] = host_buft.alloc_buffer(params.n_vocab * 4).get_size()
    full_offload = n_gpu_layers > params.n_layer and devices > 0
    parallel = devices > 1 and full_offload and offload_kqv
    sched = sched_class(list(backends.values()), bufts=list(bufts.values()),
                         graph_size=llama_model_max_nodes(params.n_layer, params.n_expert), parallel=parallel)
    _pin_like_llama_cpp(sched, graph, placement, backends, batch["n_tokens"] < 32 or full_offload, offload_kqv)
    events: list = []
    if trace:  # the scheduler's graph allocator and its dynamic allocators report every decision
        sched.galloc.trace = events.append
        for dyn in sched.galloc.buf_tallocs:
            dyn.trace = events.append
    reserved = sched.reserve(graph)
    for name, b in backends.items():
        report[name]["compute"] = sched.get_buffer_size(b)
    return dict(devices=report, nodes=len(graph.nodes), splits=sched.n_splits, n_copies=sched.n_copies,
                placement=placement, graph=graph, sched=sched, events=events, reserved=reserved)


# %%
# | export
def mapped_size(tensors: list, offsets: dict | None = None) -> int:
    """The host's weights as llama.cpp prints them with mmap, its default: no buffer of their own, but the
    range of the model file it maps, from the first tensor's data to the end of the last (`get_mapping_range`):
    gaps included, no 32 spare bytes. Without the file's `offsets`, the converter's layout: one tensor after
    the other, each padded to GGUF's alignment, 32."""
    if offsets is None or any(t.name not in offsets for t in tensors):
        starts = itertools.accumulate((GGML_PAD(t.nbytes, 32) for t in tensors), initial=0)
        offsets = dict(zip((t.name for t in tensors), starts))
    return max((offsets[t.name] + t.nbytes for t in tensors), default=0) - min((offsets[t.name] for t in tensors),
                                                                              default=0)


def cuda_like(name: str):
    """The GPUs of this chapter: SIM devices configured like CUDA (alignment 128, CUDA's offload rule)."""
    return sim_init(name, alignment=128, offload="cuda")


def _check_sizes(ctxs: list, n_ctx: int, n_tokens: int) -> None:
    """The model, its cache and its worst-case graph must fit ggml's sizes: no tensor of more than 2^63 - 1
    elements, and all of them together at most SIZE_MAX / 2 bytes (the dynamic allocator's largest block),
    so that no buffer can fail to plan; a `ModelError` naming the largest tensor otherwise."""
    tensors = [t for c in ctxs for t in c.tensors]
    big = max(tensors, key=lambda t: t.nbytes)
    total = sum(t.nbytes for t in tensors if t.view_src is None)
    if max(t.nelements for t in tensors) > INT64_MAX or total > INT64_MAX:
        raise ModelError(f"n_ctx {n_ctx} with {n_tokens} tokens per micro-batch (--n-ctx, --n-ubatch): the model, "
                         f"its KV cache and its graph need {total} bytes ({big.name}: {big.nbytes}), more than ggml's "
                         f"allocator can hand out (SIZE_MAX / 2 = 2^63 - 1)")


def _pin_like_llama_cpp(sched, graph, placement, backends, pin_norm: bool, offload_kqv: bool) -> None:
    """`llama_build_graph`'s callback: `norm-<il>` to its layer's backend (when `pin_norm`), and
    `kqv_merged_cont-<il>` to the CPU without KV offload."""
    for node in graph.nodes:
        name, _, il = node.name.rpartition("-")
        if pin_norm and name == "norm" and il.isdigit():
            sched.set_tensor_backend(node, backends[placement["layers"][int(il)]])
        elif not offload_kqv and name == "kqv_merged_cont" and il.isdigit():
            sched.set_tensor_backend(node, backends["CPU"])


# %% [markdown]
# Three setups whose llama.cpp logs are public (bug reports of mid-2024). Predict the first from the
# CPU-only run above: the GPU now plans the layers' tensors, the host only the embeddings' rows and
# the mask.

# %%
# NBVAL_CHECK_OUTPUT
cases = {"Llama-2 7B, 1 GPU, 33 layers, n_ctx 512": plan_memory(p7, 512, n_gpu_layers=33, devices=1),
         "Llama-3.1 8B, 1 GPU, 33 layers, n_ctx 8192": plan_memory(PRESETS["llama-3.1-8b"], 8192, n_gpu_layers=33, devices=1),
         "Llama-2 7B, CPU only, n_ctx 2048": plan_memory(p7, 2048)}
for label, r in cases.items():
    per_device = ", ".join(f"{n} compute {d['compute'] / MiB:.2f} MiB, KV {d['kv'] / MiB:.2f} MiB"
                           for n, d in r["devices"].items() if d["compute"] or d["kv"])
    print(f"{label}: {r['nodes']} nodes, {r['splits']} splits; {per_device}")

# %% [markdown]
# llama.cpp printed: 70.50 MiB on the GPU and 9.01 MiB on the host, 256.00 MiB of KV cache, 1,030
# nodes and 2 splits; 560.00 and 24.01 MiB, 1024.00 MiB of KV; 164.01 MiB and 1024.00 MiB on the CPU,
# one split. Every number matches.

# %% [markdown]
# ## 6 · The report
#
# `memory_report` gathers what a user asks: per device the weights, the KV cache, the output buffer
# and the compute buffer, their total, and the graph's node and split counts — the figures of
# `python -m ggml_lite llama`, which also prints them the way llama.cpp logs them, so that a user can
# hold one against the other. `--vram` says per device whether it fits.

# %%
# | export report
"""The memory report of a LLaMA (chapter 10): what llama.cpp allocates on each device for a model and a
context, and the lines llama.cpp prints about it."""

from dataclasses import asdict, dataclass

from ggml_lite.errors import ModelError
from ggml_lite.gallocr import PlaceEvent
from ggml_lite.models.llama import LlamaParams, batch_sizes, check_float, padded_n_ctx, plan_memory
from ggml_lite.tensor import TensorFlag, row_size, type_by_name
from ggml_lite.trace import lifetimes

MiB = 1024 * 1024


@dataclass
class MemoryReport:
    """`model` and `context` (what was asked), `graph` ({nodes, splits, n_copies}), `devices` (one
    {name, weights, kv, output, compute, total} per device, the GPUs then the CPU; bytes) and `peaks`
    (per compute buffer: the node of its peak and the tensors live there, see `peaks`)."""

    model: dict
    context: dict
    graph: dict
    devices: list
    peaks: dict

    def to_json(self) -> dict:
        """The document of `python -m ggml_lite llama --json`."""
        return dict(model=self.model, context=self.context, graph=self.graph, devices=self.devices, peak=self.peaks)


def memory_report(params: LlamaParams, n_ctx: int = 512, n_batch: int = 2048, n_ubatch: int = 512,
                  n_gpu_layers: int = 0, devices: int = 0, tensor_split=None, type_k: str = "f16",
                  type_v: str | None = None, offload_kqv: bool = True, tensor_types: dict | None = None,
                  why: bool = True, flash_attn: bool = False, tensor_offsets: dict | None = None) -> MemoryReport:
    """Plan the model (a `LlamaParams`, or a `GGUFModel` with its tensors' types) as
    `llama_new_context_with_model` would (`plan_memory`) and report it; `why=False`
    skips the trace behind `peaks` (for searches that need only the totals, as A11's `fit`). Every argument is
    checked before planning (`check_context`)."""
    if hasattr(params, "params") and hasattr(params, "tensor_types"):  # a GGUFModel: its hyperparameters and types
        model_types, tensor_offsets, params = params.tensor_types, getattr(params, "offsets", None), params.params
        tensor_types = model_types if tensor_types is None else tensor_types
    if not callable(getattr(params, "model", None)):  # (duck-typed: a notebook may define its own LlamaParams)
        raise ModelError(f"memory_report: expected a LlamaParams model, found {type(params).__name__}")
    if not isinstance(flash_attn, bool):
        raise ModelError(f"flash_attn (--flash-attn): expected true or false, found {flash_attn!r}")
    n_batch, n_ubatch = batch_sizes(padded_n_ctx(n_ctx, flash_attn), n_batch, n_ubatch)
    r = plan_memory(params, n_ctx, n_ubatch, n_gpu_layers, devices, tensor_split, type_k, type_v, offload_kqv,
                    trace=why, tensor_types=tensor_types, flash_attn=flash_attn, tensor_offsets=tensor_offsets)
    rows = [dict(name=name, **d, total=sum(d.values())) for name, d in r["devices"].items()]
    context = dict(n_ctx=padded_n_ctx(n_ctx, flash_attn), n_batch=n_batch, n_ubatch=n_ubatch, type_k=type_k,
                   type_v=type_v or "f16", flash_attn=flash_attn, n_gpu_layers=n_gpu_layers, devices=devices,
                   tensor_split=list(tensor_split) if tensor_split else None, offload_kqv=offload_kqv)
    return MemoryReport(asdict(params), context, dict(nodes=r["nodes"], splits=r["splits"], n_copies=r["n_copies"]),
                        rows, peaks(r) if why else {})


# %%
# | export report
def llama_cpp_lines(rep: MemoryReport) -> list:
    """The lines llama.cpp prints about these buffers (`llm_load_tensors`, `llama_new_context_with_model`),
    with this setup's buffer type names: GPU<i> for a device, CPU or CUDA_Host (the pinned host type of an
    accelerator setup) for the host's compute and output buffers. Weights kept on the host print as
    "CPU", as llama.cpp prints them when it maps the file (its default)."""
    host = "CUDA_Host" if rep.context["devices"] else "CPU"
    lines = [f"llm_load_tensors: {d['name']:>10s} buffer size = {d['weights'] / MiB:8.2f} MiB"
             for d in rep.devices if d["weights"]]
    c, m = rep.context, rep.model
    lines.append(f"llama_new_context_with_model: flash_attn = {int(c.get('flash_attn', False))}")
    cells = m["n_embd_head"] * m["n_head_kv"] * c["n_ctx"]  # one layer's K (or V): n_embd_gqa x n_ctx
    k, v = (m["n_layer"] * row_size(type_by_name(c[t]), cells) for t in ("type_k", "type_v"))
    lines.append(f"llama_new_context_with_model: KV self size  = {(k + v) / MiB:7.2f} MiB, K ({c['type_k']}): "
                 f"{k / MiB:7.2f} MiB, V ({c['type_v']}): {v / MiB:7.2f} MiB")
    lines.append(f"llama_new_context_with_model: {host:>10s}  output buffer size = "
                 f"{sum(d['output'] for d in rep.devices) / MiB:8.2f} MiB")
    if rep.graph["n_copies"] > 1:
        lines.append(f"llama_new_context_with_model: pipeline parallelism enabled (n_copies={rep.graph['n_copies']})")
    lines += [f"llama_new_context_with_model: {d['name'] if d['name'] != 'CPU' else host:>10s} compute buffer size = "
              f"{d['compute'] / MiB:8.2f} MiB" for d in rep.devices if d["compute"] > 1]
    lines += [f"llama_new_context_with_model: graph nodes  = {rep.graph['nodes']}",
              f"llama_new_context_with_model: graph splits = {rep.graph['splits']}"]
    return lines


def format_report(rep: MemoryReport, vram_gib: float | None = None) -> str:
    """The report as a table (MiB), then llama.cpp's lines; with `vram_gib`, whether each GPU fits."""
    if vram_gib is not None:
        check_vram(vram_gib)
    head = f"{'device':8s} {'weights':>10s} {'KV':>10s} {'output':>10s} {'compute':>10s} {'total':>10s}"
    parts = ("weights", "kv", "output", "compute", "total")
    rows = [f"{d['name']:8s} " + " ".join(f"{d[k] / MiB:10.2f}" for k in parts) for d in rep.devices]
    out = [head + "   (MiB)", *rows, f"graph: {rep.graph['nodes']} nodes, {rep.graph['splits']} splits, "
           f"n_copies {rep.graph['n_copies']}"]
    if vram_gib is not None:
        for d in rep.devices:
            if d["name"] != "CPU":
                out.append(f"{d['name']}: {d['total'] / MiB:.2f} MiB of {vram_gib * 1024:.2f} MiB: "
                           f"{'fits' if _fits(d, vram_gib) else 'does NOT fit'}")
    for buft, pk in rep.peaks.items():
        out.append(f"{buft} compute buffer peaks at node {pk['node_index']} ({pk['node']}); live there:")
        out += [f"  {t['bytes'] / MiB:10.2f} MiB  {t['name']}: {t['reason']}" for t in pk["live"][:6]]
        if len(pk["live"]) > 6:
            out.append(f"  ... and {len(pk['live']) - 6} smaller")
    return "\n".join(out + ["", "as llama.cpp prints it:", *llama_cpp_lines(rep)])


# %% [markdown]
# `--vram` is a finite number of GiB, above 0 and at most 2^34 (2^64 bytes). The follow-up question — the
# most layers, then the longest context, that fit (`--fit`) — is appendix A11's.

# %%
# | export report
MAX_VRAM_GIB = 2.0**34  # 2^64 bytes: the whole address space of a size_t


def check_vram(vram_gib) -> float:
    """`vram_gib` if it is a finite number of GiB above 0 and at most 2^34 (2^64 bytes), else a `ModelError`."""
    return check_float("vram", vram_gib, 0.0, "--vram", most=MAX_VRAM_GIB)


def _fits(device: dict, vram_gib: float) -> bool:
    return device["total"] <= vram_gib * 1024 * MiB


def fits(rep: MemoryReport, vram_gib: float) -> bool:
    """Does every GPU's total fit in `vram_gib` GiB?"""
    return all(_fits(d, vram_gib) for d in rep.devices if d["name"] != "CPU")



# %% [markdown]
# ## 7 · Why this peak
#
# A compute buffer is as large as the highest block the graph allocator ever handed out. Replaying the
# reserve with chapter 05's trace finds, for each buffer, the node at which that block was placed,
# and the blocks live at that node — each with the reason it is still there: it is the node's own
# result, a later node still reads it (or a view of it), or it is an output.

# %%
# | export report
def peaks(result: dict) -> dict:
    """{buffer type name: {node, node_index, bytes, live: [{name, bytes, reason}], largest first}} for a
    `plan_memory(..., trace=True)` result: where each compute buffer's highest block was placed."""
    sched, events = result["sched"], result["events"]
    graph = sched.graph  # the scheduler's graph copy: what the graph allocator planned
    top: dict[int, tuple[int, int]] = {}  # buffer id -> (end, node index) of the highest block placed so far
    for ev in events:
        if isinstance(ev, PlaceEvent) and ev.how == "new" and ev.offset + ev.size > top.get(ev.buffer_id, (0,))[0]:
            top[ev.buffer_id] = (ev.offset + ev.size, max(ev.node_index, 0))
    last_use, via_view = {}, {}
    for i, node in enumerate(graph.nodes):
        for src in node.src:
            if src is not None:
                root = src.view_src if src.view_src is not None else src
                last_use[root], via_view[root] = (i, node), (src if src is not root else None)
    blocks = lifetimes(graph, events)
    out = {}
    for b, (end, at) in sorted(top.items()):
        handed = {lt.parent for lt in blocks if lt.parent is not None and lt.start == at}
        live = [lt for lt in blocks if lt.kind == "tensor" and lt.buffer_id == b and lt.start <= at <= lt.end
                and lt.tensor not in handed]
        out[sched.bufts[b].get_name()] = dict(
            node=graph.nodes[at].name, node_index=at, bytes=end,
            live=[dict(name=lt.tensor.name, bytes=lt.size, reason=_reason(lt.tensor, at, graph, last_use, via_view))
                  for lt in sorted(live, key=lambda lt: -lt.size)])
    return out


def _reason(t, at: int, graph, last_use: dict, via_view: dict) -> str:
    if t.flags & TensorFlag.OUTPUT:
        return "an output: kept to the end"
    if graph.nodes[at] is t:
        return "computed at this node"
    j, reader = last_use.get(t, (at, None))
    if j > at:
        view = via_view.get(t)
        through = f" through its view {view.name}" if view is not None else ""
        return f"read later by {reader.name} (node {j}){through}"
    return "read by this node, freed after it"


# %% [markdown]
# Predict the GPU's peak for the 7B on one GPU at n_ctx 512 before the code says it. Attention's
# scores are `n_kv × n_tokens × n_head` floats — 512 · 512 · 32 · 4 bytes = 32 MiB — and a
# feed-forward activation 11008 · 512 · 4 = 21.5 MiB; but the logits are `n_vocab × n_tokens` floats,
# 32000 · 512 · 4 = 62.5 MiB, and every token is an output in the worst case. So the peak is the last
# node: the logits, with the normalized input they are computed from (8 MiB): 70.50 MiB.

# %%
# NBVAL_CHECK_OUTPUT
for buft, pk in peaks(plan_memory(p7, 512, n_gpu_layers=33, devices=1, trace=True)).items():
    print(f"{buft}: peak {pk['bytes'] / MiB:.2f} MiB at node {pk['node_index']} ({pk['node']})")
    for t in pk["live"][:3]:
        print(f"  {t['bytes'] / MiB:7.2f} MiB  {t['name']}: {t['reason']}")

# %% [markdown]
# The GPU's 70.50 MiB are the logits (62.50 MiB) and `result_norm` (8.00 MiB); the host's 9.01 MiB
# are the embeddings' rows (8.00 MiB) and the mask (1.00 MiB) — inputs waiting to be copied to the GPU.
#
# Now the CPU at n_ctx 4096. Without flash attention the peak is the first layer's scores `kq-0`, 4096 · 512 ·
# 32 heads · 4 bytes = 256 MiB, beside the mask, the embeddings and Q (8 MiB each): 296.01 MiB. With `-fa` the
# scores are never made; the peak moves to the FFN, `ffn_up` and `ffn_silu` (11008 · 512 · 4 bytes = 21.5 MiB
# each), `ffn_inp`, `ffn_norm` and the f16 mask (4 MiB, read by every layer: alive from first node to last):
# 71.01 MiB. Mixtral's attention is the 7B's; with `-fa` its peak is its experts' up and gate, 14336 · 2 · 512
# · 4 bytes = 56 MiB each: 140.01 MiB — an MoE layer keeps `n_expert_used` FFN activations per token.

# %%
# NBVAL_CHECK_OUTPUT
mixtral = PRESETS["mixtral-8x7b"]
attention = {}
for label, params, fa in (("7B", p7, False), ("7B -fa", p7, True), ("Mixtral -fa", mixtral, True)):
    r = plan_memory(params, 4096, flash_attn=fa, trace=True)
    pk, attention[label] = peaks(r)["CPU"], (r["nodes"], round(r["devices"]["CPU"]["compute"] / MiB, 2))
    live = ", ".join(f"{t['name']} {t['bytes'] / MiB:.2f}" for t in pk["live"][:5])
    print(f"{label}: {r['nodes']} nodes, {attention[label][1]:.2f} MiB; at {pk['node']}: {live}")

# %% [markdown]
# Llama-2 7B, all 33 layers on one GPU with 16 GiB, n_ctx 4096:

# %%
from ggml_lite.report import format_report, memory_report, peaks  # noqa: E402

print(format_report(memory_report(p7, 4096, n_gpu_layers=33, devices=1), vram_gib=16))

# %% [markdown]
# ## 8 · A picture, and the knobs
#
# Two panels show where the memory goes, a row per device: on the left its whole (weights, KV cache,
# output and compute buffers, stacked), on the right the same devices without their weights, each part a
# bar of its own with its size, since beside tens of GiB of weights a buffer of 80 MiB is a sliver no one
# can read. The widget below moves `n_ctx`, `n_ubatch` and `n_gpu_layers`, its "flash attention" box plans
# as `-fa` would, and it re-plans at every move (a 7B in about 30 ms, a 70B in about 60), with the tensors
# at each compute buffer's peak.

# %%
# | export viz.report
"""Pictures of the memory report (chapter 10): each device's memory in two panels, the whole and the
parts beside the weights, and a widget that re-plans."""

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ggml_lite.report import MiB, memory_report
from ggml_lite.viz.memory import show_static_frame

PARTS = {"weights": "#636efa", "kv": "#00cc96", "output": "#ffa15a", "compute": "#ef553b"}


def _size(mib: float) -> str:
    """A part's label: MiB below 1 GiB, GiB from 1 GiB; nothing for an empty part."""
    return "" if not mib else f"{mib / 1024:.2f} GiB" if mib >= 1024 else f"{mib:.2f} MiB"


def report_figure(rep, title: str | None = None) -> go.Figure:
    """Two panels, a row per device. Left, the whole device: its weights, KV cache, output and compute
    buffers stacked (GiB), the total at the end. Right, the same devices without their weights (MiB), each
    part a bar of its own, so that what the weights dwarf stays legible. Every part is labelled with its
    size where it fits (small weights beside the total); hovering gives the exact MiB."""
    names = [d["name"] for d in rep.devices]
    mib = {part: [d[part] / MiB for d in rep.devices] for part in PARTS}
    totals = [sum(m) for m in zip(*mib.values(), strict=True)]
    fig = make_subplots(1, 2, horizontal_spacing=0.04, subplot_titles=("the whole (GiB)", "without the weights (MiB)"))
    for part, color in PARTS.items():
        common = dict(name=part, y=names, orientation="h", customdata=mib[part], marker_color=color,
                      legendgroup=part, hovertemplate=f"%{{y}} {part}: %{{customdata:,.2f}} MiB<extra></extra>")
        fig.add_trace(go.Bar(x=[m / 1024 for m in mib[part]], text=[_size(m) for m in mib[part]], offsetgroup="all",
                             textposition="inside", insidetextanchor="middle", textangle=0, **common), row=1, col=1)
        if part != "weights":  # one bar per part, its name and size beside it (0 for an empty part)
            fig.add_trace(go.Bar(x=mib[part], text=[f"{part} {_size(m) or 0}" for m in mib[part]], offsetgroup=part,
                                 textposition="outside", constraintext="none", cliponaxis=False, showlegend=False,
                                 **common), row=1, col=2)
    top = max(totals, default=0) or 1.0
    fig.add_trace(go.Scatter(  # the totals, and the weights where their bar is too short for a label
        x=[x / 1024 for x in totals], y=names, mode="text", textposition="middle right", showlegend=False,
        text=[f" {_size(x)}" + (f" (weights {_size(w)})" if 0 < w < 0.15 * top else "")
              for x, w in zip(totals, mib["weights"], strict=True)], hoverinfo="skip", cliponaxis=False), row=1, col=1)
    rest, height = max([m for part in PARTS if part != "weights" for m in mib[part]] + [1.0]), 180 + 80 * len(names)
    return fig.update_layout(
        barmode="stack", title=title or "memory per device", height=height, uniformtext=dict(minsize=9, mode="hide"),
        xaxis=dict(range=[0, top / 1024 * 1.45]), xaxis2=dict(range=[0, rest * 1.3]), yaxis=dict(autorange="reversed"),
        yaxis2=dict(autorange="reversed", showticklabels=False), margin=dict(l=20, r=20, t=80, b=50),
        legend=dict(orientation="h", x=0, y=-30 / (height - 130), yanchor="top"))


# %%
# | export viz.report
def report_widget(params, n_ctx: int = 512, n_ubatch: int = 512, n_gpu_layers: int = 0, devices: int = 1,
                  flash_attn: bool = False):
    """Sliders for n_ctx, n_ubatch and n_gpu_layers and a "flash attention" box (`flash_attn`, llama.cpp's
    `-fa`); each move re-plans (`memory_report`) and redraws the bars and the peak's tensors (its first
    frame shown statically too, as `show_static_frame` says)."""
    import ipywidgets as w
    from IPython.display import display

    ctx = w.IntSlider(value=n_ctx, min=32, max=max(params.n_ctx_train, n_ctx), step=32, description="n_ctx")
    ub = w.IntSlider(value=n_ubatch, min=32, max=2048, step=32, description="n_ubatch")
    gl_ = w.IntSlider(value=n_gpu_layers, min=0, max=params.n_layer + 1, description="n_gpu_layers")
    fa = w.Checkbox(value=flash_attn, description="flash attention")
    out = w.Output()

    def render():
        rep = memory_report(params, ctx.value, n_ubatch=ub.value, n_gpu_layers=gl_.value, devices=devices,
                            flash_attn=fa.value)
        display(report_figure(rep, f"n_ctx {ctx.value}, n_ubatch {ub.value}, {gl_.value} layers offloaded"
                                   + (", flash attention" if fa.value else "")))
        for buft, pk in rep.peaks.items():
            top = ", ".join(f"{t['name']} {t['bytes'] / MiB:.1f}" for t in pk["live"][:3])
            print(f"{buft}: peak {pk['bytes'] / MiB:.2f} MiB at {pk['node']} — {top} (MiB)")

    def show(change=None):
        with out:
            out.clear_output(wait=True)
            render()

    show_static_frame("a widget with sliders for n_ctx, n_ubatch and n_gpu_layers and a flash attention box", render)
    for s in (ctx, ub, gl_, fa):
        s.observe(show, names="value")
    show()
    return w.VBox([w.HBox([ctx, ub, gl_, fa]), out])


# %%
from ggml_lite.viz.report import report_figure, report_widget  # noqa: E402

report_figure(memory_report(PRESETS["llama-3.1-70b"], 8192, n_gpu_layers=81, devices=2),
              "Llama-3.1 70B, n_ctx 8192, 2 GPUs, all 81 layers offloaded")

# %% [markdown]
# On the left, the weights dwarf the rest: 65.35 GiB on GPU0 (41 layers of 1,632 MiB in f16), 64.12 GiB on
# GPU1 (39 layers and the 1.96 GiB output head), 1.96 GiB of token embeddings on the host. On the right, what
# they hide: the KV cache, 2 × 1,024 × 8,192 cells × 2 bytes = 32 MiB per layer (1.28 and 1.22 GiB); each GPU's
# compute buffer, 1.19 GiB, 1 GiB of it one layer's scores `kq` (512 tokens × 8,192 cells × 64 heads × 4 bytes),
# the rest mostly the 16 MiB inputs pipeline parallelism keeps in four copies; the host's 80.02 MiB (the
# embeddings' rows and four masks) and its output buffer, one token's logits, 128,256 × 4 bytes = 0.49 MiB.
# In the widget (7B, 20 layers offloaded), "flash attention" changes no buffer: the GPU's peak (320.50 MiB) is at
# the output head, with its 250 MiB copy of `output.weight`. With all 33 layers it takes the GPU's compute buffer
# from 164.00 to 73.00 MiB: a layer's scores, 2,048 × 512 × 32 heads × 4 bytes = 128 MiB, are never made.

# %% tags=["nbval-ignore-output"]
report_widget(p7, n_ctx=2048, n_gpu_layers=20)

# %% [markdown]
# ## 9 · Check

# %%
assert len(graph.nodes) == 32 * p7.n_layer + 6 and kv_bytes == 1024 * MiB
assert round(galloc.get_buffer_size(0) / MiB, 2) == 164.01
assert attention == {"7B": (1030, 296.01), "7B -fa": (903, 71.01), "Mixtral -fa": (1383, 140.01)}
got = {label: (r["nodes"], r["splits"], *(round(d[k] / MiB, 2) for d in r["devices"].values() for k in ("compute", "kv")))
       for label, r in cases.items()}
assert list(got.values()) == [(1030, 2, 70.50, 256.0, 9.01, 0.0), (1030, 2, 560.0, 1024.0, 24.01, 0.0),
                              (1030, 1, 164.01, 1024.0)]
print("chapter 10: all checks passed")

# %% [markdown]
# ## 10 · Exercises
#
# Three exercises, about 40 minutes. Predictions are answered with `answer(id, value)`: replace the `...`
# and run the cell; it says right or wrong, then why. An implementation is graded with `check(id, fn)`
# against the port on small cases, the chapter's setups and 300 random ones; a failure shows the smallest
# case where your function and llama.cpp disagree and the rule it breaks. `python -m ggml_lite exercises`
# lists what you have done. Solutions are in appendix A10; try first.

# %%
from ggml_lite.exercises import answer, check, done  # noqa: E402

# %% [markdown]
# **10.1 · Predict** (easy, 5 min). Mistral 7B has 32 layers, `n_embd` 4096, 32 attention heads but only 8
# key/value heads. With an f16 cache and `--n-ctx 3000`, how many MiB is its KV cache ("KV self size")?

# %%
answer("10.1", ...)

# %% [markdown]
# **10.2 · Implement** which layers go to which GPU (medium, 20 min). `llm_load_tensors` keeps the first
# `i_gpu_start = max(n_layer - n_gpu_layers, 0)` layers on the host (`llama.cpp:6669`). The split points are
# the running sums of `tensor_split`, divided by their total (when it is missing or all zero, by free
# memory: here, equal shares; a list shorter than the GPUs gives the others 0), all in `float`. Then
# (`llama.cpp:6707-6719` at daa9623):
#
# ```c
#         // assign the repeating layers to the devices according to the splits
#         int act_gpu_layers = std::min(n_gpu_layers, (int)n_layer + 1);
#         for (int i = i_gpu_start; i < n_layer; ++i) {
#             int layer_gpu = std::upper_bound(splits.begin(), splits.begin() + device_count, float(i - i_gpu_start)/act_gpu_layers) - splits.begin();
#             model.buft_layer[i] = llama_default_buffer_type_offload(model, layer_gpu);
#         }
#         // assign the output layer
#         if (n_gpu_layers > n_layer) {
#             int layer_gpu = std::upper_bound(splits.begin(), splits.begin() + device_count, float(act_gpu_layers - 1)/act_gpu_layers) - splits.begin();
#             model.buft_output = llama_default_buffer_type_offload(model, layer_gpu);
#         } else {
#             model.buft_output = llama_default_buffer_type_cpu(true);
#         }
# ```
#
# With no GPU at all (`n_devices` 0), nothing is offloaded. `float` is 32 bits: use `numpy.float32`.

# %%
# exercise 10.2
def gpu_layers(n_layer, n_gpu_layers, n_devices, tensor_split=None):
    """(a list of n_layer names, the output's name): "CPU", or "GPU0", "GPU1", ... for the GPU that holds it.
    All counts are >= 0; `tensor_split` is None or a list of non-negative floats."""
    raise NotImplementedError  # your code here


check("10.2", gpu_layers)

# %% [markdown]
# **10.3 · Explore** (medium, 15 min). Plan the Llama-2 7B at `n_ctx` 512 on one GPU with `n_gpu_layers=32`
# and with 33 (`plan_memory(p7, 512, n_gpu_layers=..., devices=1)`). Every repeating layer is on the GPU in
# both; only the output layer moves. Compare the GPU's weights and compute buffer, and the splits. Which
# would you run, and why? Run `done("10.3")` when you have an answer.
#
# <details><summary>A worked answer</summary>
#
# With 33 the GPU holds 12,603.02 MiB of weights and a 70.50 MiB compute buffer, in 2 splits. With 32 its
# weights drop by the output head, `output.weight` (32000 × 4096 f16, 250 MiB), to 12,353.00 MiB, but its
# compute buffer grows to 320.50 MiB, and the graph has 4 splits. The head's weights now live in the host's
# buffer, yet CUDA's offload rule (a batch of at least 32 rows) makes pass 1 give the head's ops to the GPU
# (`1.off`, chapter 09); each weight of another backend starts a split, and the weights are copied into the
# GPU's compute buffer: the 250 MiB are back, as a copy. The GPU's total is the same to 0.02 MiB, and every
# evaluation of a large batch copies 250 MiB over the bus. So 33: keeping the output on the host saves no
# VRAM here, and costs a copy per batch (with batches under 32 tokens the head would run on the CPU instead).
#
# </details>
