"""GGUF headers are untrusted input (issue 22): ggml_lite.models.gguf reads them with a bounded reader of its
own, and applies llama.cpp's checks of a LLaMA's metadata and tensors. One test per class of bad header: each
is refused with a `ModelError` naming the file, the field (or the tensor), what was expected and what was
found -- quickly, whatever the header claims. Valid files read as the `gguf` package's own reader reads them."""

import json
import os
import struct
import time

import numpy as np
import pytest

from fuzzing import assert_sound, run_cli
from ggml_lite.errors import ModelError
from ggml_lite.models.gguf import MAX_COUNT, MAX_ITEMS, MAX_KEPT, from_gguf, read_gguf_header
from ggml_lite.models.llama import PRESETS, LlamaParams
from gguf_writer import (
    QT,
    TINY,
    VT,
    gstr,
    header_reader,
    kv_str,
    kv_u32,
    oracle_params,
    raw_gguf,
    set_offset,
    tensor_info,
    tensor_layout,
    write_llama_gguf,
)


def refused(path, *needles):
    """from_gguf(path) raises a ModelError naming the file and every needle; returns the message."""
    with pytest.raises(ModelError) as e:
        from_gguf(path)
    msg = str(e.value)
    assert msg.startswith(str(path)), msg
    for needle in needles:
        assert needle in msg, msg
    return msg


def raw_file(tmp_path, data: bytes, name="raw.gguf"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


# ---- valid files: the same header as gguf's own reader -------------------------------------------------

@pytest.mark.parametrize("params, mtype, tokens", [
    (TINY, None, 0), (TINY, QT.Q8_0, 64), (TINY, QT.Q4_0, 0), (PRESETS["llama-2-7b"], None, 32000),
    (PRESETS["llama-2-70b"], QT.Q4_K, 0), (PRESETS["tinyllama-1.1b"], QT.Q5_K, 0),
])
def test_valid_files_read_as_the_gguf_package_reads_them(tmp_path, params, mtype, tokens):
    path = write_llama_gguf(tmp_path / "m.gguf", params, mtype, sparse=True, tokens=tokens)
    m = from_gguf(path)
    want, types, shapes = oracle_params(path)
    assert m.params == want
    assert m.shapes == shapes and {n: t.code for n, t in m.tensor_types.items()} == types
    h = read_gguf_header(path)
    r = header_reader(path)
    for key, field in r.fields.items():
        if key.startswith("GGUF."):
            continue
        v = h.kv[key]
        got = (v.count if v.item_type == "string" else v.value.tolist()) if v.type == "array" else v.value
        want_v = len(field.contents()) if v.item_type == "string" else field.contents()
        assert got == pytest.approx(want_v), key
    assert h.data_offset == r.data_offset and [t.offset for t in h.tensors] == [info[3] for info in r.infos]


def test_version_2_reads_as_version_3_and_the_api_takes_the_file_s_model(tmp_path):
    """GGUF v2 has the same layout as v3 (v3 added big-endian files, which ggml does not read); memory_report
    takes a GGUFModel (its hyperparameters and its tensors' own types) as DESIGN §4 shows."""
    from ggml_lite.report import memory_report

    data = bytearray(write_llama_gguf(tmp_path / "v3.gguf", TINY, QT.Q8_0).read_bytes())
    data[4:8] = struct.pack("<I", 2)
    m = from_gguf(raw_file(tmp_path, bytes(data), "v2.gguf"))
    assert read_gguf_header(tmp_path / "v2.gguf").version == 2 and m.params == from_gguf(tmp_path / "v3.gguf").params
    rep = memory_report(m, 256, n_gpu_layers=3, devices=1)
    assert rep.devices == memory_report(m.params, 256, n_gpu_layers=3, devices=1, tensor_types=m.tensor_types).devices
    assert m.params.wtype == "q8_0" and m.tensor_types["output_norm.weight"].name == "f32"


def test_a_tokenizer_list_gives_the_vocabulary_when_vocab_size_is_absent(tmp_path):
    path = write_llama_gguf(tmp_path / "m.gguf", kv={"llama.vocab_size": None}, tokens=TINY.n_vocab)
    assert from_gguf(path).params == from_gguf(write_llama_gguf(tmp_path / "n.gguf")).params
    refused(write_llama_gguf(tmp_path / "o.gguf", kv={"llama.vocab_size": None}), 'kv["llama.vocab_size"]: missing')


def test_per_layer_arrays_and_a_tied_output_are_accepted(tmp_path):
    """llama.cpp's get_key_or_arr: an int32 array of one value per layer; without output.weight the output
    reuses token_embd (its type)."""
    arr = {"llama.attention.head_count": ([4, 4], VT.ARRAY, VT.INT32),
           "llama.feed_forward_length": ([96, 96], VT.ARRAY, VT.INT32)}
    assert from_gguf(write_llama_gguf(tmp_path / "a.gguf", kv=arr)).params.n_head == 4
    m = from_gguf(write_llama_gguf(tmp_path / "t.gguf", drop=("output.weight",)))
    assert "output.weight" not in m.tensor_types


# ---- the header's structure --------------------------------------------------------------------------

def test_a_file_claiming_2_to_the_40_array_items_is_refused_at_once(tmp_path):
    """The issue's case: a 1.7 KB file whose tokenizer list claims 2^40 strings. gguf's reader looped for
    minutes on it; this one checks 2^40 x 8 bytes against the bytes left before reading one."""
    data = bytearray(write_llama_gguf(tmp_path / "m.gguf", tokens=16).read_bytes())
    at = data.index(gstr("tokenizer.ggml.tokens")) + len(gstr("tokenizer.ggml.tokens")) + 8  # type, item type
    data[at:at + 8] = struct.pack("<Q", 2**40)
    path = raw_file(tmp_path, bytes(data))
    t0 = time.perf_counter()
    msg = refused(path, 'kv["tokenizer.ggml.tokens"].value', "an array of 1099511627776 string items",
                  "needs 8796093022208 bytes")
    assert time.perf_counter() - t0 < 1.0, msg  # (generous: it takes about a millisecond)
    assert os.path.getsize(path) < 4096


@pytest.mark.parametrize("data, field, message", [
    (b"", "header.magic", "the magic 'GGUF' needs 4 bytes at offset 0, the file has 0 left"),
    (b"GGML\x03\x00\x00\x00", "header.magic", "expected b'GGUF' (a GGUF file), found b'GGML'"),
    (b"GGUF\x03\x00", "header.version", "the version needs 4 bytes at offset 4, the file has 2 left"),
    (b"GGUF" + struct.pack("<I", 1), "header.version", "version 1 is no longer supported"),
    (b"GGUF" + struct.pack("<I", 4), "header.version", "expected 2 or 3, found 4"),
    (b"GGUF" + struct.pack(">I", 3), "header.version", "a big-endian file"),
    (raw_gguf([], n_tensors=2**63), "header.tensor_count",
     f"expected at most {MAX_COUNT} (this reader's cap), found {2**63}"),
    (raw_gguf([], n_kv=2**40), "header.kv_count", "found 1099511627776"),
    (raw_gguf([], n_kv=1000), "header", "1000 key/value pairs (13 bytes each at least) and 0 tensor infos"),
    (raw_gguf([gstr("k") + struct.pack("<I", 13) + b"\0" * 8]), 'kv["k"].type', "expected a value type from 0 to 12"),
    (raw_gguf([gstr("k") + struct.pack("<II", 9, 9) + b"\0" * 8]), 'kv["k"].value.item_type', "no arrays of arrays"),
    (raw_gguf([gstr("k") + struct.pack("<IIQ", 9, 6, 2**62) + b"\0" * 8]), 'kv["k"].value',
     f"an array of {2**62} float32 items (4 bytes each at least) needs {2**64} bytes"),
    (raw_gguf([gstr("k") + struct.pack("<IIQ", 9, 8, 2) + gstr("a") + struct.pack("<Q", 2**63)]),
     'kv["k"].value[1]', f"a string of {2**63} bytes needs"),
    (raw_gguf([gstr("k") + struct.pack("<IB", 7, 2) + b"\0" * 8]), 'kv["k"].value',
     "expected a bool (0 or 1), found 2"),
    (raw_gguf([gstr("k") + struct.pack("<IIQ", 9, 7, 2) + b"\1\5" + b"\0" * 8]), 'kv["k"].value', "expected bools"),
    (raw_gguf([gstr("k" * 70000) + struct.pack("<I", 4) + b"\0" * 4]), "kv[0].key",
     "a string of 70000 bytes, expected at most 65535"),
    (raw_gguf([struct.pack("<Q", 2**64 - 1) + b"\0" * 16]), "kv[0].key", f"a string of {2**64 - 1} bytes"),
    (raw_gguf([gstr(b"\xff\xfe") + struct.pack("<II", 4, 1)]), "kv[0].key", "expected UTF-8 text"),
    (raw_gguf([kv_u32("a", 1), kv_u32("a", 2)]), 'kv["a"]', "the key appears twice"),
    (raw_gguf([kv_u32("general.alignment", 24)]), 'kv["general.alignment"]',
     "expected a uint32 power of two, found a uint32 (24)"),
    (raw_gguf([kv_str("general.alignment", "32")]), 'kv["general.alignment"]', "found a string ('32')"),
    (raw_gguf([kv_u32("general.alignment", 0)]), 'kv["general.alignment"]', "power of two"),
    (raw_gguf([], [tensor_info("x" * 64, [1])]), "tensors[0].name", "a string of 64 bytes, expected at most 63"),
    (raw_gguf([], [tensor_info("a", [1]), tensor_info("a", [1], offset=32)]), "tensors[1].name",
     "duplicated tensor name 'a' (also tensors[0])"),
    (raw_gguf([], [tensor_info("a", [1, 1, 1, 1, 1])]), "tensors[0].n_dims",
     "a: expected at most 4 dimensions (GGML_MAX_DIMS), found 5"),
    (raw_gguf([], [tensor_info("a", [4, 0])]), "tensors[0].ne[1]", "a: expected a dimension of at least 1, found 0"),
    (raw_gguf([], [tensor_info("a", [4, -7])]), "tensors[0].ne[1]", "found -7"),
    (raw_gguf([], [tensor_info("a", [2**62, 4])]), "tensors[0].ne", "more than ggml's int64"),
    (raw_gguf([], [tensor_info("a", [4], type_code=4)]), "tensors[0].type", "a: expected a ggml type code (one of"),
    (raw_gguf([], [tensor_info("a", [4], type_code=2**31)]), "tensors[0].type", "found 2147483648"),
    (raw_gguf([], [tensor_info("a", [48, 2], type_code=QT.Q4_0)]), "tensors[0].ne[0]",
     "a row of 48 elements is not a whole number of q4_0 blocks (32 elements each)"),
    (raw_gguf([], [tensor_info("a", [4], offset=7)]), "tensors[0].offset",
     "expected a multiple of the alignment 32, found 7"),
    (raw_gguf([], [tensor_info("", [4], offset=7)]), "tensors[0].offset", "(empty name): expected a multiple"),
    (raw_gguf([], [tensor_info("a", [4])], n_tensors=3), "header",
     "0 key/value pairs (13 bytes each at least) and 3 tensor infos"),
])
def test_a_malformed_header_names_the_field(tmp_path, data, field, message):
    path = raw_file(tmp_path, data)
    with pytest.raises(ModelError) as e:
        read_gguf_header(path)
    assert str(e.value).startswith(f"{path}: {field}: "), str(e.value)
    assert message in str(e.value)


def test_every_value_type_is_read(tmp_path):
    """All 13 GGUF value types, scalars and arrays, with the values gguf's writer wrote."""
    scalars = {"u8": (200, VT.UINT8), "i8": (-5, VT.INT8), "u16": (60000, VT.UINT16), "i16": (-300, VT.INT16),
               "u32": (2**32 - 1, VT.UINT32), "i32": (-2**31, VT.INT32), "f32": (1.5, VT.FLOAT32), "b": (True, VT.BOOL),
               "s": ("héllo", VT.STRING), "u64": (2**64 - 1, VT.UINT64), "i64": (-2**63, VT.INT64),
               "f64": (0.1, VT.FLOAT64)}
    arrays = {f"a_{k}": ([v, v], VT.ARRAY, t) for k, (v, t) in scalars.items() if t != VT.STRING}
    strings = (["x", "yz", ""], VT.ARRAY, VT.STRING)
    path = write_llama_gguf(tmp_path / "m.gguf", kv={**scalars, **arrays, "a_s": strings})
    kv = read_gguf_header(path).kv
    for key, (v, t) in scalars.items():
        assert kv[key].type == t.name.lower() and kv[key].value == v, key
        assert kv[f"a_{key}"].value.tolist() == [v, v] if key != "s" else kv["a_s"].count == 3


def test_a_truncated_file_names_where_it_ends(tmp_path):
    data = write_llama_gguf(tmp_path / "m.gguf").read_bytes()
    h = read_gguf_header(tmp_path / "m.gguf")
    for cut in (10, 30, 100, len(data) // 2, h.data_offset - 40):
        with pytest.raises(ModelError, match=r"needs \d+ bytes at offset \d+, the file has \d+ left"):
            read_gguf_header(raw_file(tmp_path, data[:cut], f"cut{cut}.gguf"))
    assert from_gguf(raw_file(tmp_path, data[:h.data_offset], "exact.gguf")).params.n_layer == TINY.n_layer


@pytest.mark.parametrize("kind", ["directory", "fifo", "missing", "device"])
def test_what_is_not_a_regular_file_is_refused(tmp_path, kind):
    path = {"directory": tmp_path, "missing": tmp_path / "nothing.gguf", "device": "/dev/zero"}.get(kind)
    if kind == "fifo":
        path = tmp_path / "fifo.gguf"
        os.mkfifo(path)  # opening it for reading would block forever
    with pytest.raises(ModelError, match="not a regular file|cannot read the file"):
        read_gguf_header(path)


def test_caps_bound_time_and_memory(tmp_path):
    """A file that holds MAX_ITEMS + 1 array items (each a 1-byte uint8) is refused by the item cap, not read."""
    n = MAX_ITEMS + 1
    path = raw_file(tmp_path, raw_gguf([gstr("k") + struct.pack("<IIQ", 9, 0, n) + b"\0" * n]))
    with pytest.raises(ModelError, match=f"more than {MAX_ITEMS} items"):
        read_gguf_header(path)


def test_values_kept_in_memory_are_capped(tmp_path):
    """Two string values of MAX_KEPT / 2 + 1 bytes each (a sparse file): the second one is refused, before
    it is read; one of MAX_KEPT + 1 bytes is refused by its length alone."""
    big = MAX_KEPT // 2 + 1
    path = tmp_path / "big.gguf"
    with open(path, "wb") as f:
        f.write(raw_gguf([gstr("a") + struct.pack("<IQ", VT.STRING, big)], n_kv=2))
        f.seek(big, os.SEEK_CUR)
        f.write(gstr("b") + struct.pack("<IQ", VT.STRING, big))
        f.truncate(f.tell() + big)
    message = rf'kv\["b"\].value: the header\'s values would take more than {MAX_KEPT} bytes'
    with pytest.raises(ModelError, match=message):
        read_gguf_header(path)
    path.write_bytes(raw_gguf([gstr("a") + struct.pack("<IQ", VT.STRING, MAX_KEPT + 1)]))
    with pytest.raises(ModelError, match=f"a string of {MAX_KEPT + 1} bytes, expected at most {MAX_KEPT}"):
        read_gguf_header(path)


# ---- where each tensor's data lie (llama_model_loader::llama_tensor_weight) ------------------------------

def _sparse(tmp_path, name="s.gguf"):
    """A valid sparse TINY file: its bytes and its layout (data_offset, size, [(name, at, offset, nbytes)])."""
    path = write_llama_gguf(tmp_path / name, sparse=True)
    return path, bytearray(path.read_bytes()), tensor_layout(path)


def test_a_sparse_file_and_a_header_only_file_plan_the_same_model(tmp_path):
    """The sparse file is exactly as long as its last tensor's end (the writer pads the header to 32, as
    llama.cpp's converter does); the header-only file ends before the data section. Both plan; only the
    second is header only."""
    path, _, (data_offset, size, rows) = _sparse(tmp_path)
    name, _, offset, nbytes = rows[-1]
    assert size == data_offset + offset + nbytes and name == "blk.1.ffn_up.weight"
    header = write_llama_gguf(tmp_path / "h.gguf")
    assert os.path.getsize(header) < data_offset
    full, only = from_gguf(path), from_gguf(header)
    assert (full.header_only, only.header_only) == (False, True) and full.params == only.params
    assert (only.data_offset, only.file_size) == (data_offset, os.path.getsize(header))
    for cut in (os.path.getsize(header) + 1, data_offset):  # the padding, partly or wholly there: still header only
        with open(header, "ab") as f:
            f.truncate(cut)
        assert from_gguf(header).header_only
    os.truncate(path, size + 1)  # a byte after the data: accepted, as llama.cpp accepts it
    assert not from_gguf(path).header_only


@pytest.mark.parametrize("which, offset, message", [
    (-1, 2**63, "12288 bytes at offset 9223372036854775808 of the data section (byte 1696) would end at byte "
                "9223372036854789792, past 2^63 - 1, the largest size a file can have (llama.cpp: tensor "
                "'blk.1.ffn_up.weight' data is not within the file bounds"),
    (-1, 2**64 - 32, "past 2^63 - 1, the largest size a file can have (llama.cpp at daa9623 wraps the sum around to "
                     "byte 1664 and loads the wrong bytes)"),
    (-1, 2**63 - 1696, "would end at byte 9223372036854788096, past 2^63 - 1"),
    (0, 2**64 - 1696, "wraps the sum around to byte 0"),
    (-1, 128288, "12288 bytes at offset 128288 of the data section would lie at bytes 129984 to 142272, past the "
                 "file's end (142240 bytes) (llama.cpp: tensor 'blk.1.ffn_up.weight' data is not within the file "
                 "bounds, model is corrupted or incomplete)"),
    (0, 2**40, "past the file's end (142240 bytes)"),
])
def test_a_tensor_whose_data_lie_past_the_file_or_2_to_the_63_is_refused_by_name(tmp_path, which, offset, message):
    path, data, (_, _, rows) = _sparse(tmp_path)
    i = which % len(rows)
    set_offset(data, rows[i][1], offset)
    msg = refused(raw_file(tmp_path, bytes(data)), f"tensors[{i}].offset: {rows[i][0]}: ", message)
    assert msg.count("tensors[") == 1


def test_offsets_past_2_to_the_63_are_refused_in_a_header_only_file_too(tmp_path):
    """A header-only file skips the end-of-file check, not the 2^63 one: no file holds such data. An aligned
    offset past the end of a header-only file is not checked (it has no data to check it against)."""
    path = write_llama_gguf(tmp_path / "h.gguf")
    data_offset, _, rows = tensor_layout(path)
    data = bytearray(path.read_bytes())
    set_offset(data, rows[3][1], 2**40)
    assert from_gguf(raw_file(tmp_path, bytes(data), "far.gguf")).header_only
    set_offset(data, rows[3][1], 2**63)
    refused(raw_file(tmp_path, bytes(data)), f"tensors[3].offset: {rows[3][0]}: ", "past 2^63 - 1")
    huge = raw_gguf([], [tensor_info("a", [2**61, 2])], n_tensors=1)  # 2^62 f32: 2^64 bytes, in a header-only file
    refused(raw_file(tmp_path, huge, "huge.gguf"), "tensors[0].offset: a: 18446744073709551616 bytes at offset 0",
            "past 2^63 - 1")


def test_a_sparse_file_one_byte_short_names_the_first_tensor_past_its_end(tmp_path):
    """Cut anywhere in the data section, the file is refused naming the first tensor, in the file's order,
    that ends past the cut -- before the hyperparameters are looked at, as in llama.cpp's loader."""
    path, data, (data_offset, size, rows) = _sparse(tmp_path)
    for cut in (size - 1, size - 12288, data_offset + 8192, data_offset + 1):
        want = next(i for i, (_, _, offset, nbytes) in enumerate(rows) if data_offset + offset + nbytes > cut)
        os.truncate(path, cut)
        refused(path, f"tensors[{want}].offset: {rows[want][0]}: ", f"past the file's end ({cut} bytes)")
    bad = write_llama_gguf(tmp_path / "b.gguf", sparse=True, kv={"llama.block_count": (0, VT.UINT32)})
    os.truncate(bad, os.path.getsize(bad) - 1)
    refused(bad, "tensors[20].offset: blk.1.ffn_up.weight: ")  # the data first, then block_count


def test_overlapping_tensor_data_are_accepted_as_llama_cpp_accepts_them(tmp_path):
    """llama.cpp at daa9623 compares no two tensors' ranges: every tensor at offset 0 (all overlapping) or
    two tensors swapped plans the same model."""
    path, data, (_, _, rows) = _sparse(tmp_path)
    want = from_gguf(path)
    for _, at, _, _ in rows:
        set_offset(data, at, 0)
    got = from_gguf(raw_file(tmp_path, bytes(data), "overlap.gguf"))
    assert (got.params, got.tensor_types, got.header_only) == (want.params, want.tensor_types, False)
    assert {t.offset for t in read_gguf_header(tmp_path / "overlap.gguf").tensors} == {0}


def test_the_command_line_notes_a_header_only_file(tmp_path):
    """`llama --gguf` on a header-only file prints the full file's report and a note on stderr saying what it is;
    on a sparse file, no note."""
    header, (path, _, _) = write_llama_gguf(tmp_path / "h.gguf"), _sparse(tmp_path)
    o = assert_sound(run_cli(["llama", "--gguf", header, "--json"]), allow=(0,))
    full = assert_sound(run_cli(["llama", "--gguf", path, "--json"]), allow=(0,))
    assert json.loads(o.out) == json.loads(full.out) and full.err == ""
    assert o.err.startswith(f"note: {header}: header only ({os.path.getsize(header)} bytes, its tensors' data would "
                            f"start at byte 1696): planned from the header; llama.cpp would refuse to load it")


# ---- llama.cpp's checks of the metadata ----------------------------------------------------------------

@pytest.mark.parametrize("kv, message", [
    ({"llama.block_count": ("32", VT.STRING)}, "expected a uint32, found a string ('32')"),
    ({"llama.block_count": ("x" * 10**5, VT.STRING)}, "expected a uint32, found a string ('xxxxxxxx"),
    ({"llama.block_count": (2.0, VT.FLOAT32)}, "expected a uint32, found a float32 (2.0)"),
    ({"llama.block_count": (2, VT.INT32)}, "expected a uint32, found an int32 (2)"),
    ({"llama.block_count": (2, VT.UINT64)}, "found a uint64"),
    ({"llama.block_count": (513, VT.UINT32)}, "expected 1 to 512 layers (LLAMA_MAX_LAYERS), found 513"),
    ({"llama.block_count": (2**32 - 1, VT.UINT32)}, "found 4294967295"),
    ({"llama.block_count": (0, VT.UINT32)}, "found 0"),
    ({"llama.block_count": None}, 'kv["llama.block_count"]: missing'),
    ({"llama.attention.head_count": ([4, 4], VT.ARRAY, VT.FLOAT32)},
     "expected a uint32 or an int32 array, found an array of 2 float32"),
    ({"llama.attention.head_count": ([4, 4, 4], VT.ARRAY, VT.INT32)}, "expected 2 values (one per layer), found 3"),
    ({"llama.attention.head_count": ([4, 8], VT.ARRAY, VT.INT32)}, "the layers' values differ ([4, 8])"),
    ({"llama.attention.head_count": (0, VT.UINT32)},
     'kv["llama.attention.head_count"]: the header\'s hyperparameters make '
     "no model: LlamaParams: n_head (--n-head): expected an integer from 1"),
    # 5 heads of 64 // 5 = 12 (llama.cpp rounds down), but the file's RoPE says 16 (llama.cpp: invalid n_rot)
    ({"llama.attention.head_count": (5, VT.UINT32), "llama.attention.head_count_kv": (5, VT.UINT32)},
     'kv["llama.rope.dimension_count"]: expected the head size (attention.key_length, else n_embd / n_head) = 12'),
    ({"llama.attention.head_count_kv": (3, VT.UINT32)},
     "n_head_kv (--n-head-kv): expected a divisor of n_head 4, found 3"),
    ({"llama.attention.head_count_kv": ([-2, -2], VT.ARRAY, VT.INT32)},
     "n_head_kv (--n-head-kv): expected an integer from 1"),
    ({"llama.embedding_length": (2**32 - 1, VT.UINT32), "llama.attention.head_count": (1, VT.UINT32),
      "llama.attention.head_count_kv": (1, VT.UINT32), "llama.vocab_size": (2**32 - 1, VT.UINT32)}, "n_embd * n_vocab"),
    ({"llama.rope.dimension_count": (32, VT.UINT32)}, "(attention.key_length, else n_embd / n_head) = 16, found 32"),
    ({"llama.rope.dimension_count": (8, VT.UINT32)}, "found 8"),
    ({"llama.attention.key_length": (8, VT.UINT32)}, 'kv["llama.attention.value_length"]: expected the head size'),
    ({"llama.attention.key_length": (8, VT.UINT32), "llama.attention.value_length": (8, VT.UINT32)},
     'kv["llama.rope.dimension_count"]: expected the head size (attention.key_length, else n_embd / n_head) = 8'),
    ({"llama.attention.layer_norm_rms_epsilon": None}, 'kv["llama.attention.layer_norm_rms_epsilon"]: missing'),
    ({"llama.attention.layer_norm_rms_epsilon": (1e-5, VT.FLOAT64)}, "expected a float32, found a float64"),
    ({"llama.attention.layer_norm_rms_epsilon": (float("nan"), VT.FLOAT32)}, "rms_norm_eps: expected a finite number"),
    ({"llama.rope.freq_base": (float("inf"), VT.FLOAT32)}, "rope_freq_base: expected a finite number above 0"),
    # a mixture of experts whose file holds a dense LLaMA's tensors: the router is missing
    ({"llama.expert_count": (8, VT.UINT32), "llama.expert_used_count": (2, VT.UINT32)},
     "missing blk.0.ffn_gate_inp.weight"),
    ({"llama.expert_count": (8, VT.UINT32)}, 'kv["llama.expert_used_count"]: the header\'s hyperparameters make no'),
    ({"llama.expert_count": (161, VT.UINT32), "llama.expert_used_count": (2, VT.UINT32)},
     "GGML_ASSERT(hparams.n_expert <= LLAMA_MAX_EXPERTS)"),
    ({"llama.expert_count": (8, VT.INT32), "llama.expert_used_count": (2, VT.UINT32)},
     'kv["llama.expert_count"]: expected a uint32'),
    ({"general.architecture": (7, VT.UINT32)}, 'kv["general.architecture"]: expected a string, found a uint32 (7)'),
])
def test_metadata_of_the_wrong_type_or_value_is_refused(tmp_path, kv, message):
    assert len(refused(write_llama_gguf(tmp_path / "m.gguf", kv=kv), message)) < 600  # (a value is cut short)


def test_another_architecture_is_refused(tmp_path):
    refused(write_llama_gguf(tmp_path / "m.gguf", arch="gpt2"), "a 'gpt2' model; this report plans llama models only")


# ---- llama.cpp's checks of the tensors -----------------------------------------------------------------

@pytest.mark.parametrize("change, message", [
    (dict(drop=("blk.1.attn_k.weight",)),
     "missing blk.1.attn_k.weight (llama.cpp: tensor 'blk.1.attn_k.weight' not found"),
    (dict(drop=("token_embd.weight",)), "missing token_embd.weight"),
    (dict(drop=("blk.0.attn_q.weight",)), "missing blk.0.attn_q.weight"),
    (dict(shapes={"blk.1.ffn_gate.weight": [64, 128]}), "blk.1.ffn_gate.weight: expected ne [64, 96], found [64, 128]"),
    (dict(shapes={"blk.0.attn_k.weight": [64, 64]}), "blk.0.attn_k.weight: expected ne [64, 32], found [64, 64]"),
    (dict(shapes={"output_norm.weight": [64, 2]}), "output_norm.weight: expected ne [64], found [64, 2]"),
    (dict(shapes={"token_embd.weight": [64, 65]}), "token_embd.weight: expected ne [64, 64], found [64, 65]"),
    (dict(extra={"blk.2.attn_q.weight": [64, 64]}),
     "blk.2.attn_q.weight: a tensor a dense LLaMA of 2 layers does not have"),
    (dict(extra={"rope_freqs.weight": [16]}), "rope_freqs.weight: expected ne [8], found [16]"),
    (dict(extra={"rope_freqs.weight": [8]}, types={"rope_freqs.weight": QT.F16}), "rope_freqs.weight: expected f32"),
    (dict(kv={"llama.block_count": (1, VT.UINT32)}), "wrong number of tensors; expected 12, got 21"),
    (dict(kv={"llama.block_count": (3, VT.UINT32)}), "missing blk.2.attn_norm.weight"),
    (dict(types={"blk.0.ffn_up.weight": QT.I32}), "blk.0.ffn_up.weight: expected a float or quantized type, found i32"),
])
def test_tensors_are_checked_against_the_hyperparameters(tmp_path, change, message):
    refused(write_llama_gguf(tmp_path / "m.gguf", **change), message)


def test_a_llama_3_1_file_with_rope_freqs_plans_as_llama_cpp_printed(tmp_path):
    """A Llama 3.1 8B file has rope_freqs.weight (64 f32 frequency factors). All 33 layers on one GPU at n_ctx
    8192: llama.cpp printed 560.00 MiB of GPU compute buffer and 24.01 MiB on the host for such a file; each
    layer's copy adds 256 bytes (padded to 128) to the GPU's weights, and the host's layers share the mapped
    file's one copy (which the scheduler copies to a GPU when it offloads a host layer's RoPE there, as the
    CUDA offload rule asks for an op of 32 rows or more reading a host weight)."""
    from ggml_lite.report import memory_report

    p = PRESETS["llama-3.1-8b"]
    m = from_gguf(write_llama_gguf(tmp_path / "l31.gguf", p, sparse=True, extra={"rope_freqs.weight": [64]}))
    plain = from_gguf(write_llama_gguf(tmp_path / "l3.gguf", p, sparse=True))
    full = memory_report(m, 8192, n_gpu_layers=33, devices=1)
    gpu, host = full.devices
    assert (f"{gpu['compute'] / 2**20:.2f}", f"{host['compute'] / 2**20:.2f}") == ("560.00", "24.01")
    assert gpu["weights"] - memory_report(plain, 8192, n_gpu_layers=33, devices=1).devices[0]["weights"] == 32 * 256
    cpu_only = memory_report(m, 512).devices[0]["weights"] - memory_report(plain, 512).devices[0]["weights"]
    assert cpu_only == 256  # one copy, as the mapped file has it (padded to 32)
    from ggml_lite.models.llama import plan_memory

    r = plan_memory(m.params, 512, n_gpu_layers=10, devices=2, tensor_types=m.tensor_types)
    factors = [n.src[2] for n in r["graph"].nodes if n.op.name == "ROPE"]
    own = {id(f) for f in factors if f.view_src is None and "#" not in f.name}  # (the scheduler's copies have '#')
    assert len(factors) == 64 and len(own) == 1 + 10  # the host's 22 layers share the file's one copy


def test_a_tied_output_is_a_copy_on_a_gpu_and_the_embeddings_themselves_on_the_host(tmp_path):
    """Without output.weight, llama.cpp creates the output from token_embd (TENSOR_DUPLICATED): on a GPU a
    copy of its own (in q8_0 here, token_embd's type, not the matrices' q4_0); on the host the mapped file's
    token_embd, so the host's weights do not count it twice."""
    from ggml_lite.report import memory_report

    types = {"token_embd.weight": QT.Q8_0}
    tied = from_gguf(write_llama_gguf(tmp_path / "t.gguf", TINY, QT.Q4_0, drop=("output.weight",), types=types))
    untied = from_gguf(write_llama_gguf(tmp_path / "u.gguf", TINY, QT.Q4_0, types={**types, "output.weight": QT.Q8_0}))
    embd = 64 * 64 // 32 * 34  # token_embd, q8_0
    host = [memory_report(m, 256).devices[0]["weights"] for m in (tied, untied)]
    assert host[1] - host[0] == embd
    gpu = [memory_report(m, 256, n_gpu_layers=3, devices=1).devices[0]["weights"] for m in (tied, untied)]
    assert gpu[0] == gpu[1]  # the same q8_0 matrix, a copy on the GPU
    assert memory_report(tied, 256, n_gpu_layers=3, devices=1).graph == memory_report(untied, 256, n_gpu_layers=3,
                                                                                      devices=1).graph


def test_trailing_dimensions_of_one_are_accepted_as_llama_cpp_accepts_them(tmp_path):
    m = from_gguf(write_llama_gguf(tmp_path / "m.gguf", shapes={"output_norm.weight": [64, 1, 1]}))
    assert m.shapes["output_norm.weight"] == [64, 1, 1]


# ---- through the command line -------------------------------------------------------------------------

def test_the_command_line_reports_a_bad_header_with_exit_2(tmp_path):
    path = write_llama_gguf(tmp_path / "m.gguf", shapes={"blk.1.ffn_gate.weight": [64, 128]})
    o = assert_sound(run_cli(["llama", "--gguf", path]), allow=(2,))
    assert "ModelError" in o.err and "blk.1.ffn_gate.weight: expected ne [64, 96], found [64, 128]" in o.err


def test_the_largest_legal_requests_plan_in_bounded_time_and_memory(tmp_path):
    """512 layers (LLAMA_MAX_LAYERS) on 15 GPUs (the scheduler's 16 backends with the CPU), every layer
    offloaded, and the largest n_ctx with 512-token micro-batches: within the harness's time and memory
    bounds; --fit on a 512-layer model too (a bisection: about 20 plans)."""
    p = LlamaParams(32000, 4096, 512, 32, 8, 11008, n_ctx_train=4096)
    path = write_llama_gguf(tmp_path / "big.gguf", p, sparse=True)
    o = assert_sound(run_cli(["llama", "--gguf", path, "--devices", "15", "--n-gpu-layers", "513", "--json"]),
                     allow=(0,))
    doc = json.loads(o.out)
    assert doc["graph"]["nodes"] == 32 * 512 + 6 and len(doc["devices"]) == 16
    o = assert_sound(run_cli(["llama", "--preset", "llama-2-7b", "--n-ctx", str(2**31 - 32), "--devices", "2",
                              "--n-gpu-layers", "33", "--json"]), allow=(0,))
    assert json.loads(o.out)["context"]["n_ctx"] == 2**31 - 32
    o = assert_sound(run_cli(["llama", "--gguf", path, "--devices", "15", "--vram", "24", "--fit", "--json"]),
                     allow=(0,))
    assert json.loads(o.out)["fit"]["n_gpu_layers"] > 0


def test_a_gigantic_context_that_overflows_ggml_sizes_is_refused(tmp_path):
    o = assert_sound(run_cli(["llama", "--n-vocab", str(2**32 - 1), "--n-embd", "65536", "--n-layer", "1",
                              "--n-head", "1", "--n-ff", "8", "--n-ctx", str(2**31 - 32), "--n-ubatch", str(2**31 - 32),
                              "--n-batch", str(2**31 - 32)]), allow=(2,))
    assert "more than ggml's allocator can hand out" in o.err


def test_numpy_scalars_from_a_header_are_plain_ints_in_the_report(tmp_path):
    kv = {"llama.attention.head_count": ([4, 4], VT.ARRAY, VT.INT32)}
    m = from_gguf(write_llama_gguf(tmp_path / "m.gguf", kv=kv))
    assert type(m.params.n_head) is int and json.dumps(m.params.__dict__)
    assert isinstance(np.int64(3), np.integer)
