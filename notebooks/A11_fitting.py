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
# # A11 · Fitting a model in VRAM — the largest n_gpu_layers, then the longest context
#
# Chapter 10's report answers *does this setup fit?*: `format_report(rep, vram_gib=8)` says, for every GPU,
# whether its weights, KV cache, output and compute buffers stay within 8 GiB. llama.cpp of mid-2024 has no
# more than that: a user starts it with some `-ngl`, reads the buffer sizes it prints, and starts it again.
# (ggml today has a dry run for the purpose, `ggml_gallocr_reserve_n_size`, which chapter 12 shows, for
# llama.cpp's own `--fit`.)
#
# "Does it fit?" has a follow-up: *what is the most I can offload, and then the longest context?* `fit`
# answers it the only exact way — by planning: the largest `n_gpu_layers` whose every GPU total fits in
# `vram_gib`, then, with it, the largest `n_ctx` (a multiple of 32, at most the training context) that still
# fits. The totals grow with layers and with the context, almost linearly, so each search keeps a bracket —
# a value that fits, one that does not — and plans next where the spare bytes, interpolated, reach zero,
# falling back to halving the bracket when the guesses stall: a handful of plans for most models, and a
# bounded number (at most 2·L + 2, L the bit length of the range) for any.
# `python -m ggml_lite llama --vram 8 --fit` prints its answer.
#
# Why plan at all? The compute buffer is whatever the graph allocator's plan of the worst-case graph comes to
# for this split of the graph between the devices: no formula gives it to the byte. Why search? One plan of
# a 7B takes a few tens of milliseconds, so a scan of every layer count and every context takes seconds for
# a 7B and minutes for a model trained on 128K tokens. And why an appendix: the answer is a search *over*
# chapter 10's report, not a part of how llama.cpp plans memory. Nothing in chapters 00 to 12 needs it.
#
# **Learning goals**
#
# 1. The shape of the question: a GPU's total grows with the layers and with the context, almost on a
#    straight line (§1).
# 2. `_largest`: a search that keeps a bracket, plans where the spare bytes reach zero, and stays bounded
#    when its guesses are bad: at most 2·L + 2 plans, L the bit length of the range (§2).
# 3. `fit`: the full offload first, then the layers at the asked context, then the context with those
#    layers; the 7B on 8 GiB in 9 plans (§3).
# 4. What the search assumes, where it does not hold, and what the tests compare it with (§4).
#
# Exported: `ggml_lite.fit`, which `python -m ggml_lite llama --fit` calls. It imports chapter 10's
# `ggml_lite.report` (`memory_report`, `fits`, `check_vram`), as an appendix may.

# %%
# | default_exp fit

# %% [markdown]
# ## 1 · A GPU's total, layer by layer
#
# Llama-2 7B in f16 on one GPU of 8 GiB, at n_ctx 512. `n_gpu_layers` n puts the last n of its 32 layers on
# the GPU, and 33 the output layer too (chapter 10 §5). Predict before planning. A layer's weights are four
# attention matrices of 4096 × 4096, three feed-forward matrices of 4096 × 11008 and two norm vectors of
# 4096: 202,383,360 numbers of 2 bytes, 386.02 MiB. Its KV cache at n_ctx 512 is K and V, 4096 × 512 each,
# in f16: 8 MiB. So each layer adds about 394 MiB, on top of what the GPU holds with no layer at all: its
# compute buffer. The scan below plans every count and finds 320.50 MiB at 0 layers and 394.03 MiB more per
# layer. Then (8192 − 320.50) / 394.03 = 19.98: 19 layers fit, and 20 miss by a few MiB.

# %%
# NBVAL_CHECK_OUTPUT
from ggml_lite.models.llama import PRESETS  # noqa: E402
from ggml_lite.report import MiB, fits, memory_report  # noqa: E402

p7 = PRESETS["llama-2-7b"]


def gpu_total(rep) -> int:
    """The bytes of the fullest GPU of a report (what decides whether it fits)."""
    return max(d["total"] for d in rep.devices if d["name"] != "CPU")


scan = {n: gpu_total(memory_report(p7, 512, n_gpu_layers=n, devices=1, why=False)) for n in range(p7.n_layer + 2)}
print(f"0 layers: {scan[0] / MiB:.2f} MiB; each layer adds {(scan[19] - scan[0]) / 19 / MiB:.2f} MiB")
for n in (18, 19, 20, 32, 33):
    verdict = "fits" if scan[n] <= 8 * 1024 * MiB else "does not fit"
    print(f"{n:2d} layers: {scan[n] / MiB:9.2f} MiB  {verdict} in 8 GiB")
print("the scan's answer, in", len(scan), "plans:", max(n for n, t in scan.items() if t <= 8 * 1024 * MiB))

# %% [markdown]
# The full offload (33) is off the line: it costs 0.02 MiB more than 32 layers, not 394 MiB. Up to 32
# layers the output layer stays on the host, yet the scheduler sends its matrix product to the GPU
# (`offload_op`, chapter 09's pass 1), so the GPU's compute buffer holds a 250.00 MiB copy of
# `output.weight` at its peak: the 320.50 MiB it has even with no layer. With 33, that weight moves to the
# GPU's weights (250.02 MiB) and the copy is gone: the compute buffer is chapter 10's 70.50 MiB. With more
# than one GPU, a full offload also turns on pipeline parallelism, and the totals jump the other way. `fit`
# therefore plans the full offload on its own, first.

# %% [markdown]
# ## 2 · The search: a bracket and a straight line
#
# `_largest(probe, lo, hi, at_lo)` finds the largest n in [lo, hi] that fits. A probe is one plan, and it
# answers (fits, spare): whether every GPU's total is within the budget, and the bytes left on the fullest
# GPU, negative when it is over. The caller knows that lo fits (`at_lo` is its answer), and the search
# assumes that the answer changes once, from fits to does not, as n grows.
#
# It plans hi first, and if hi fits, that is the answer. Otherwise it has a bracket, lo fits and hi does
# not, and it narrows the bracket until the two are neighbours. Bisection would take log2(hi − lo) plans
# whatever the numbers say. But the spare bytes fall almost on a straight line (§1), so the n where the
# line through the bracket's two ends crosses zero is nearly the answer: the method of false position. Its
# known weakness is a curve that bends, where one end stays put while the other creeps towards it a step
# at a time. Two safeguards stop that. When the same end has been kept twice in a row, its spare bytes are
# halved, which pulls the next guess towards it (the Illinois rule). And after L + 1 guesses, L being the
# bit length of hi − lo, the rest is bisected. So a search costs at most 1 + (L + 1) + L = 2·L + 2 plans,
# and a nearly straight one a handful.

# %%
# | export
"""Fitting a model in VRAM (appendix A11): the largest n_gpu_layers whose every GPU total fits, then the
largest context with them, found by planning with chapter 10's `memory_report`."""

from ggml_lite.models.llama import MAX_DEVICES, MAX_N_CTX, LlamaParams, check_int, padded_n_ctx
from ggml_lite.report import MiB, check_vram, fits, memory_report


def _largest(probe, lo: int, hi: int, at_lo: tuple) -> int:
    """The largest n in [lo, hi] whose `probe(n)` = (fits, spare bytes) fits, given that it fits at lo
    (`at_lo`) and turns false only once as n grows. Keeps a bracket (fits, does not fit) and plans next
    where the spare bytes, interpolated linearly, reach zero (the totals grow about linearly); an end kept
    twice in a row has its spare bytes halved (the Illinois rule), and after bit_length(hi - lo) + 1 such
    steps the rest is bisected: at most 2 bit_length(hi - lo) + 2 plans."""
    at_hi = probe(hi)
    if at_hi[0]:
        return hi
    spare_lo, spare_hi, kept, steps = at_lo[1], at_hi[1], 0, (hi - lo).bit_length() + 1
    while hi - lo > 1:
        drop = spare_lo - spare_hi
        guess = lo + round((hi - lo) * spare_lo / drop) if steps > 0 and drop > 0 else (lo + hi) // 2
        mid, steps = min(max(guess, lo + 1), hi - 1), steps - 1
        fits_mid, spare = probe(mid)
        if fits_mid:
            lo, spare_lo = mid, spare
            spare_hi, kept = (spare_hi / 2 if kept == 1 else spare_hi), 1
        else:
            hi, spare_hi = mid, spare
            spare_lo, kept = (spare_lo / 2 if kept == -1 else spare_lo), -1
    return lo


# %% [markdown]
# Two made-up probes over [0, 1000], with the answer k. A straight line of spare bytes, 100 per step, crossing
# zero half-way between k and k + 1: the first guess lands on k + 1 or k, the next one on k. And a probe
# that tells nothing, one spare byte below k and a billion missing above it: interpolation always guesses
# lo + 1, and only the bisection at the end finds k. L is 10 for a range of 1000, so no search may take more
# than 22 plans.

# %%
# NBVAL_CHECK_OUTPUT
def plans_for(k: int, spare_of, hi: int = 1000) -> list:
    """The n that `_largest` plans on [0, hi] when the answer is k, in order."""
    asked = []

    def probe(n):
        asked.append(n)
        return n <= k, spare_of(n, k)

    assert _largest(probe, 0, hi, at_lo=(True, spare_of(0, k))) == k
    return asked


def line(n, k):
    return 100 * (k + 0.5 - n)


def blind(n, k):
    return 1 if n <= k else -1e9


print("a line, k = 637:", plans_for(637, line))
for name, spare_of in (("a line", line), ("a blind probe", blind)):
    print(f"{name}: at most {max(len(plans_for(k, spare_of)) for k in range(1001))} plans over every k in 0..1000")

# %% [markdown]
# On the line the first guess is 1000 × 63,750 / (63,750 + 36,250) = 637.5, which rounds to 638 (Python
# rounds halves to even); 638 does not fit, and the line from 0 to 638 crosses zero at 637.5 again, now
# kept inside the bracket at 637. The blind probe takes all 22.

# %% [markdown]
# ## 3 · `fit`: the layers first, then the context
#
# `fit(params, vram_gib, n_ctx, devices, **kw)` runs three steps, each a plan or a search of plans, every
# plan a `memory_report(..., why=False)` (the totals without chapter 10's trace of the peak):
#
# 1. Every layer and the output (`n_layer + 1`): the common wish, and off the line (§1). One plan.
# 2. If that does not fit, `_largest` over 0 to `n_layer` layers at the asked n_ctx. 0 is not planned: it is
#    taken to fit with the whole budget spare, since with no layer the GPUs compute only what the scheduler
#    sends them, not a layer's share. The answer is 0 when not even one layer fits.
# 3. With those layers, `_largest` over the context in multiples of 32 (llama.cpp's padding of `n_ctx`),
#    from the asked one up to the training context `n_ctx_train`. If even the asked context does not fit
#    (possible only at 0 layers), the context is None.
#
# `**kw` carries the rest of the request (`n_batch`, `n_ubatch`, `tensor_split`, the cache types,
# `offload_kqv`, a GGUF's tensor types, `flash_attn`) into every plan, so the answer is for that very
# setup. `--vram` is checked as chapter 10 checks it (`check_vram`), and `--fit` needs at least one GPU.

# %%
# | export
def fit(params: LlamaParams, vram_gib: float, n_ctx: int = 512, devices: int = 1, **kw) -> tuple:
    """(the largest n_gpu_layers that fits at `n_ctx`, then the largest n_ctx that fits with it).
    Every layer and the output first (full offload also turns on pipeline parallelism, which needs more
    memory), then a search over 1..n_layer layers: a GPU's total grows with its layers. The context grows
    in multiples of 32 up to `n_ctx_train` (the totals grow with n_ctx). (0, ...) when not even one layer
    fits. Both searches are `_largest`: a handful of plans for most models, at most 2 bit_length of the
    range + 2. (With an uneven `tensor_split`, a GPU's share can dip by one layer as layers are added, and
    a compute buffer can shrink by a few MiB as n_ctx grows: the search assumes neither matters; A11 §4
    shows where the second does, and tests check the answer against a scan of every layer count.)"""
    check_vram(vram_gib)
    check_int("devices", devices, 1, MAX_DEVICES, "--devices", " (fit needs a GPU)")
    budget = vram_gib * 1024 * MiB

    def probe(layers, ctx):  # (does it fit, the spare bytes of the fullest GPU)
        rep = memory_report(params, ctx, n_gpu_layers=layers, devices=devices, why=False, **kw)
        return fits(rep, vram_gib), min(budget - d["total"] for d in rep.devices if d["name"] != "CPU")
    if probe(params.n_layer + 1, n_ctx)[0]:
        layers = params.n_layer + 1
    else:  # (0 layers is not planned: the GPUs then compute what the scheduler offloads, not a layer's share)
        layers = _largest(lambda n: probe(n, n_ctx), 0, params.n_layer, at_lo=(True, budget))
    lo, hi = padded_n_ctx(n_ctx) // 32, max(min(params.n_ctx_train, MAX_N_CTX) // 32, padded_n_ctx(n_ctx) // 32)
    first = probe(layers, lo * 32)
    if not first[0]:
        return layers, None
    return layers, _largest(lambda k: probe(layers, k * 32), lo, hi, at_lo=first) * 32  # the largest multiple of 32


# %% [markdown]
# The 7B on 8 GiB, step by step: the same plans `fit` makes, recorded as they are asked.

# %%
# NBVAL_CHECK_OUTPUT
budget = 8 * 1024 * MiB
asked = []  # (layers, n_ctx, fits, spare MiB), in the order fit plans them


def probe(layers, ctx):
    rep = memory_report(p7, ctx, n_gpu_layers=layers, devices=1, why=False)
    asked.append((layers, ctx, fits(rep, 8), (budget - gpu_total(rep)) / MiB))
    return fits(rep, 8), budget - gpu_total(rep)


probe(33, 512)  # 1. the full offload
layers = _largest(lambda n: probe(n, 512), 0, 32, at_lo=(True, budget))  # 2. the layers
n_ctx = _largest(lambda k: probe(layers, 32 * k), 16, 128, at_lo=probe(layers, 512)) * 32  # 3. the context
for i, (n, ctx, ok, spare) in enumerate(asked, 1):
    print(f"plan {i}: {n:2d} layers, n_ctx {ctx:4d}: {'fits' if ok else 'over'}, {spare:8.2f} MiB spare")
print("on an 8 GiB GPU: (n_gpu_layers, n_ctx) =", fit(p7, 8, n_ctx=512), "=", (layers, n_ctx))

# %% [markdown]
# The layers: 33 is over by 4,737.52 MiB, and so is 32 by 4,737.50. Interpolating from (0, 8,192 MiB spare)
# to (32, −4,737.50) gives 32 × 8,192 / 12,929.50 = 20.27, so 20, over by 9.12 MiB. The line from 0 to
# 20 crosses zero at 19.98, which rounds to 20, already known not to fit, so the guess is kept inside the
# bracket: 19, which fits with 384.91 MiB to spare. The context: 512 fits with those 384.91 MiB. Each 32
# more cells cost 19 layers × K and V × 4096 × 32 × 2 bytes = 9.50 MiB, so predict 384.91 / 9.50 = 40.5
# steps of 32: n_ctx 512 + 40 × 32 = 1,792. The search plans 4096 (726.60 MiB over), then where the line
# crosses zero, 1,760 (14.41 spare), then 1,792 (4.91 spare), then 1,824 (4.59 over): 9 plans in all,
# where the scan of §1 took 34 and a scan of the contexts would take 113 more. The picture shows both
# scans, the budget and the plans the search made, numbered.

# %%
import plotly.graph_objects as go  # noqa: E402
from plotly.subplots import make_subplots  # noqa: E402

contexts = range(512, p7.n_ctx_train + 1, 32)
by_ctx = [gpu_total(memory_report(p7, c, n_gpu_layers=layers, devices=1, why=False)) / MiB for c in contexts]
fig = make_subplots(rows=1, cols=3, column_widths=[0.4, 0.35, 0.25], horizontal_spacing=0.07, subplot_titles=(
    "against n_gpu_layers (n_ctx 512)", f"against n_ctx ({layers} layers)", "the last plans, close up"))
fig.add_trace(go.Scatter(x=list(scan), y=[t / MiB for t in scan.values()], mode="lines+markers", name="a scan",
                         marker=dict(size=4, color="#999"), line=dict(color="#bbb")), row=1, col=1)
near = [(c, t) for c, t in zip(contexts, by_ctx, strict=True) if 1696 <= c <= 1856]
for col, (xs, ys) in ((2, (list(contexts), by_ctx)), (3, zip(*near, strict=True))):
    fig.add_trace(go.Scatter(x=list(xs), y=list(ys), mode="lines+markers", showlegend=False,
                             marker=dict(size=3 if col == 2 else 6, color="#999"), line=dict(color="#bbb")),
                  row=1, col=col)
for col, picks in ((1, list(enumerate(asked, 1))[:4]), (2, list(enumerate(asked, 1))[4:6]),
                   (3, list(enumerate(asked, 1))[6:])):
    fig.add_trace(go.Scatter(
        x=[a[0] if col == 1 else a[1] for _, a in picks], y=[8192 - a[3] for _, a in picks],
        mode="markers+text", text=[str(i) for i, _ in picks], textposition="top left", name="the plans of fit",
        showlegend=col == 1, marker=dict(size=10, color=["#2ca02c" if a[2] else "#d62728" for _, a in picks])),
        row=1, col=col)
    fig.add_hline(y=8192, line=dict(color="#1f77b4", dash="dash"), row=1, col=col)
fig.update_xaxes(title_text="n_gpu_layers", row=1, col=1).update_xaxes(title_text="n_ctx", row=1, col=2)
fig.update_xaxes(title_text="n_ctx", row=1, col=3)
fig.update_yaxes(title_text="GPU total, MiB (dashed: 8 GiB)", row=1, col=1)
fig.update_layout(height=420, margin=dict(l=60, r=20, t=95, b=50), legend=dict(x=0.01, y=0.99),
                  title="Llama-2 7B on an 8 GiB GPU: the plans of fit (green fits, red does not), numbered")
fig

# %% [markdown]
# From the command line, `python -m ggml_lite llama --preset llama-2-7b --devices 1 --vram 8 --fit` prints
# chapter 10's report and then `fit in 8.0 GiB per GPU: n_gpu_layers 19, then n_ctx 1792`; with `--json`,
# the document gains `"fit": {"n_gpu_layers": 19, "n_ctx": 1792}`.

# %% [markdown]
# ## 4 · What the search assumes
#
# Both searches assume that once a count does not fit, no larger one does. For the layers, with one GPU or
# an even split, every layer adds its weights and its cache. With an uneven `tensor_split`, a GPU's share is
# set by rounding the layers' positions against the split points in `float` (chapter 10 §5), and the
# docstring warns that it can dip by one layer as layers are added. For the context, the KV cache grows
# with every cell, but the compute buffer is a plan's result and can *shrink* as n_ctx grows. The 7B with 5
# layers on its GPU is one such case:

# %%
# NBVAL_CHECK_OUTPUT
for ctx in (864, 896, 928, 960):
    rep = memory_report(p7, ctx, n_gpu_layers=5, devices=1, why=False)
    print(f"n_ctx {ctx}: KV {rep.devices[0]['kv'] / MiB:5.2f} MiB, compute {rep.devices[0]['compute'] / MiB:6.2f} MiB,"
          f" total {gpu_total(rep) / MiB:.2f} MiB")
vram = 2326 / 1024
print(f"fit in {vram * 1024:.0f} MiB:", fit(p7, vram, n_ctx=512), "but n_ctx 960 fits too:",
      fits(memory_report(p7, 960, n_gpu_layers=5, devices=1, why=False), vram))

# %% [markdown]
# At 928 cells the compute buffer is 8 MiB smaller than at 896, and the total drops by 5.50 MiB. With a
# budget of 2,326 MiB, 5 layers fit and 6 do not. The context search then plans 4096, 896 and 864, all
# over, and 832, which fits, and answers 832, yet 928 and 960 fit as well. Inside such a dip of a few MiB,
# `fit`'s context fits and the next multiple of 32 does not, but a larger one may: a scan finds the
# largest, at the price of one plan per multiple of 32.
#
# What the tests hold `fit` to: `tests/fuzz/test_fuzz_gguf.py` asks `llama --fit` on random small models
# with one to three GPUs, even and uneven splits, and budgets across their totals, and compares the layers
# with a scan of every layer count and the context with the next multiple of 32, and its `test_llama_flags`
# holds the command line's `--fit` to this function. The check below does it once more, scanning every
# context too.

# %% [markdown]
# ## 5 · Check

# %%
from ggml_lite.models.llama import LlamaParams  # noqa: E402

small, split = LlamaParams(2000, 256, 12, 8, 1, 1024), [1.0, 2.0]  # 12 layers, two GPUs sharing 1:2


def fits_small(n, ctx, vram):
    return fits(memory_report(small, ctx, n_gpu_layers=n, devices=2, tensor_split=split, why=False), vram)


for mib in (6, 8, 12):
    vram = mib / 1024
    by_scan = max((n for n in range(1, small.n_layer + 2) if fits_small(n, 256, vram)), default=0)
    by_scan_ctx = max((c for c in range(256, small.n_ctx_train + 1, 32) if fits_small(by_scan, c, vram)), default=None)
    assert fit(small, vram, 256, 2, tensor_split=split) == (by_scan, by_scan_ctx), mib
assert fit(p7, 8, n_ctx=512) == (layers, n_ctx) == (19, 1792) and len(asked) == 9
assert max(n for n, t in scan.items() if t <= budget) == 19 and scan[33] > budget
assert max(len(plans_for(k, blind)) for k in range(1001)) == 2 * (1000).bit_length() + 2 == 22
assert fit(p7, 2326 / 1024, n_ctx=512) == (5, 832)
print("appendix A11: all checks passed")
