"""GGUF files of a LLaMA for the tests (test_llama.py, test_gguf_untrusted.py, test_fuzz_gguf.py), written
with the `gguf` package's writer: the header's metadata and every tensor's info as llama.cpp's converter
writes them, with hooks to break any part of it (a key dropped or retyped, a tensor dropped, reshaped,
retyped or added), and the data region left out (header only) or extended sparsely to its full length.
Also `oracle_params`: a model's hyperparameters and tensor types read with the `gguf` package's reader,
an independent reader to compare ggml_lite's with."""

import os
import struct

import gguf
import numpy as np

from ggml_lite.models.llama import LlamaParams

QT = gguf.GGMLQuantizationType
VT = gguf.GGUFValueType

TINY = LlamaParams(n_vocab=64, n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=96, n_ctx_train=256)


def llama_shapes(p: LlamaParams) -> dict:
    """{name: ne} of a LLaMA's tensors, in llama.cpp's converter's order (written out by hand here,
    independently of ggml_lite.models.gguf): dense, or with experts the router and the merged 3-d expert tensors."""
    gqa, n_q = p.n_embd_head * p.n_head_kv, p.n_embd_head * p.n_head
    shapes = {"token_embd.weight": [p.n_embd, p.n_vocab], "output_norm.weight": [p.n_embd],
              "output.weight": [p.n_embd, p.n_vocab]}
    for il in range(p.n_layer):
        for name, ne in (("attn_norm", [p.n_embd]), ("attn_q", [p.n_embd, n_q]), ("attn_k", [p.n_embd, gqa]),
                         ("attn_v", [p.n_embd, gqa]), ("attn_output", [n_q, p.n_embd]), ("ffn_norm", [p.n_embd]),
                         *((("ffn_gate_inp", [p.n_embd, p.n_expert]), ("ffn_gate_exps", [p.n_embd, p.n_ff, p.n_expert]),
                            ("ffn_down_exps", [p.n_ff, p.n_embd, p.n_expert]),
                            ("ffn_up_exps", [p.n_embd, p.n_ff, p.n_expert])) if p.n_expert else
                           (("ffn_gate", [p.n_embd, p.n_ff]), ("ffn_down", [p.n_ff, p.n_embd]),
                            ("ffn_up", [p.n_embd, p.n_ff])))):
            shapes[f"blk.{il}.{name}.weight"] = ne
    return shapes


def llama_kv(p: LlamaParams) -> dict:
    """{key: (value, GGUF value type)} of a LLaMA's hyperparameters, as llama.cpp's converter types them."""
    return {"llama.vocab_size": (p.n_vocab, VT.UINT32), "llama.context_length": (p.n_ctx_train, VT.UINT32),
            "llama.embedding_length": (p.n_embd, VT.UINT32), "llama.block_count": (p.n_layer, VT.UINT32),
            "llama.feed_forward_length": (p.n_ff, VT.UINT32), "llama.rope.dimension_count": (p.n_rot, VT.UINT32),
            "llama.attention.head_count": (p.n_head, VT.UINT32),
            "llama.attention.head_count_kv": (p.n_head_kv, VT.UINT32),
            "llama.attention.layer_norm_rms_epsilon": (p.rms_norm_eps, VT.FLOAT32),
            "llama.rope.freq_base": (p.rope_freq_base, VT.FLOAT32),
            **({"llama.expert_count": (p.n_expert, VT.UINT32), "llama.expert_used_count": (p.n_expert_used, VT.UINT32)}
               if p.n_expert else {}),
            **({"llama.attention.key_length": (p.n_embd_head, VT.UINT32),  # (a head size of its own: Mistral NeMo)
                "llama.attention.value_length": (p.n_embd_head, VT.UINT32)} if p.n_embd_head != p.n_embd // p.n_head
               else {})}


def write_llama_gguf(path, p: LlamaParams = TINY, matrix_type=None, sparse: bool = False, kv: dict | None = None,
                     drop: tuple = (), shapes: dict | None = None, types: dict | None = None,
                     extra: dict | None = None,
                     arch: str = "llama", tokens: int = 0):
    """Write a LLaMA's GGUF header to `path`: a header-only file (it ends before its data section), or with
    `sparse` the data region as a hole, the file as long as the real one. Matrices are of `matrix_type`
    (default f16; a k-quant gives a q6_K output as Q4_K_M files have), norms f32.
    `kv` adds or replaces metadata ({key: (value, VT)}, or {key: None} to drop a key); `drop` leaves
    tensors out, `shapes` / `types` / `extra` ({name: ne} / {name: QT} / {name: ne}) change or add tensors;
    `tokens` writes a tokenizer.ggml.tokens list of that many strings."""
    mtype = matrix_type or QT.F16
    w = gguf.GGUFWriter(str(path), arch)
    meta = {**llama_kv(p), **(kv or {})}
    for key, item in meta.items():
        if item is not None:
            w.add_key_value(key, item[0], item[1], sub_type=item[2] if len(item) > 2 else None)
    if tokens:
        w.add_token_list([f"tok{i}" for i in range(tokens)])
    all_shapes = {**llama_shapes(p), **(shapes or {}), **(extra or {})}
    total = 0
    for name, ne in all_shapes.items():
        if name in drop:
            continue
        k_quant = gguf.GGML_QUANT_SIZES[mtype][0] == 256  # a Q4_K_M-like file: the output in q6_K
        t = (types or {}).get(name) or (QT.F32 if len(ne) == 1 or "ffn_gate_inp" in name  # (the router: f32)
                                        else QT.Q6_K if name == "output.weight" and k_quant else mtype)
        block, size = gguf.GGML_QUANT_SIZES[t]
        nbytes = int(np.prod(ne)) // block * size
        shape = tuple(reversed(ne)) if block == 1 else (*reversed(ne[1:]), ne[0] // block * size)  # quantized: bytes
        w.add_tensor_info(name, shape, np.dtype(np.uint8 if block > 1 else np.float32), nbytes, raw_dtype=t)
        total += -(-nbytes // 32) * 32
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    if sparse:  # the data section starts at the header's end padded to 32 (gguf's writer's alignment)
        os.truncate(path, -(-os.path.getsize(path) // 32) * 32 + total)
    return path


class _HeaderOnly(gguf.GGUFReader):
    """gguf's reader, stopped before the data (so header-only files read too): `infos` holds (name, type
    code, ne, offset) per tensor."""

    tensor_fields: list
    infos: list

    def _build_tensors(self, start_offs, fields) -> None:
        self.tensor_fields = fields
        self.infos = [(bytes(name).decode(), int(raw_type[0]), [int(d) for d in dims], int(offset[0]))
                      for _, name, _, dims, raw_type, offset in (f.parts for f in fields)]


def header_reader(path) -> _HeaderOnly:
    """The `gguf` package's reader on the file at `path`, its header only (`fields`, `infos`, `data_offset`)."""
    return _HeaderOnly(str(path), "r")


def number_slots(path) -> list:
    """[(offset, size, what)] of every number in the file's header -- counts, lengths, value and item types,
    values, n_dims, dims, tensor types and offsets -- as gguf's reader finds them: where to write huge or
    out-of-range values."""
    r = header_reader(path)
    slots = []
    for field in [*r.fields.values(), *r.tensor_fields]:
        at = field.offset
        for i, part in enumerate(field.parts):
            if part.dtype.kind in "uif" and part.dtype.itemsize in (4, 8):
                slots += [(at + k * part.dtype.itemsize, part.dtype.itemsize, f"{field.name}.parts[{i}][{k}]")
                          for k in range(part.size)]
            at += int(part.nbytes)
    return slots


def tensor_layout(path) -> tuple:
    """(data_offset, file size, [(name, where its offset field is, offset, nbytes)] in file order) of the file at
    `path`, as gguf's reader finds them and its own table of block sizes gives each tensor's bytes."""
    r = header_reader(path)
    rows = []
    for field, (name, code, ne, offset) in zip(r.tensor_fields, r.infos):
        at = field.offset + sum(int(part.nbytes) for part in field.parts[:-1])  # the offset is the info's last part
        block, size = gguf.GGML_QUANT_SIZES[QT(code)]
        rows.append((name, at, offset, int(np.prod(ne, dtype=object)) // block * size))
    return r.data_offset, os.path.getsize(path), rows


def set_offset(data: bytearray, at: int, offset: int) -> None:
    """Write a tensor's data offset (a uint64) at `at` in a file's bytes."""
    struct.pack_into("<Q", data, at, offset)


def oracle_params(path):
    """(LlamaParams, {name: type code}, {name: ne}) of a LLaMA GGUF file read with the `gguf` package's own
    reader: an independent reading of the header, for files ggml_lite accepted."""
    r = header_reader(path)

    def get(key, default=None):
        f = r.fields.get(key)
        return f.contents() if f is not None else default

    def per_layer(key, default=None):
        v = get(key, default)
        return v[0] if isinstance(v, list) else v

    types = {name: code for name, code, _, _ in r.infos}
    shapes = {name: ne for name, _, ne, _ in r.infos}
    n_head = per_layer("llama.attention.head_count")
    from ggml_lite.tensor import type_by_code

    params = LlamaParams(
        n_vocab=get("llama.vocab_size") or len(get("tokenizer.ggml.tokens")), n_embd=get("llama.embedding_length"),
        n_layer=get("llama.block_count"), n_head=n_head, n_head_kv=per_layer("llama.attention.head_count_kv", n_head),
        n_ff=per_layer("llama.feed_forward_length"), n_rot=get("llama.rope.dimension_count"),
        rms_norm_eps=get("llama.attention.layer_norm_rms_epsilon"), rope_freq_base=get("llama.rope.freq_base", 10000.0),
        n_ctx_train=get("llama.context_length"), wtype=type_by_code(types["blk.0.attn_q.weight"]).name,
        n_expert=get("llama.expert_count", 0), n_expert_used=get("llama.expert_used_count", 0),
        n_embd_head=get("llama.attention.key_length"))
    return params, types, shapes


# ---- raw bytes, for headers the writer refuses to make ----


def gstr(text) -> bytes:
    """A GGUF string: uint64 length, then the bytes."""
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv_u32(key: str, value: int) -> bytes:
    return gstr(key) + struct.pack("<II", VT.UINT32, value)


def kv_str(key: str, value: str) -> bytes:
    return gstr(key) + struct.pack("<I", VT.STRING) + gstr(value)


def tensor_info(name, ne, type_code: int = 0, offset: int = 0) -> bytes:
    return gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<q", d) for d in ne) + \
        struct.pack("<IQ", type_code, offset)


def raw_gguf(kvs: list, tensors: list | tuple = (), version: int = 3, n_kv: int | None = None,
             n_tensors: int | None = None) -> bytes:
    """A GGUF header from raw pieces: `kvs` and `tensors` are byte strings (kv_u32, tensor_info, ...); the
    counts default to their lengths."""
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)
    return head + b"".join(kvs) + b"".join(tensors)
