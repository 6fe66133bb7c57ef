"""Every C function that ../shared/reference/FUNCTIONS.md lists is named, in backticks, in the docstring
of a ggml_lite function, method or class (DESIGN: names map to C). FUNCTIONS.md groups them under the
chapter names of wave 1 (01_aligned_offsets ... 06_scheduler); the course has been renumbered since, so
the grouping is only reported, not matched against notebook names."""

import importlib
import inspect
import pkgutil
import re

import pytest

import ggml_lite
from helpers import REFERENCE

FUNCTIONS_MD = REFERENCE / "FUNCTIONS.md"


def chapters():
    """{heading: [C names]} from FUNCTIONS.md."""
    out, current = {}, None
    for line in FUNCTIONS_MD.read_text().splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
            out[current] = []
        elif current and line.startswith("- `"):
            out[current].append(line.split("`")[1])
    return out


def docstrings() -> str:
    texts = []
    for mod in pkgutil.walk_packages(ggml_lite.__path__, "ggml_lite."):
        m = importlib.import_module(mod.name)
        for obj in vars(m).values():
            if getattr(obj, "__module__", None) != m.__name__:
                continue
            texts.append(inspect.getdoc(obj) or "")
            if inspect.isclass(obj):
                texts += [inspect.getdoc(v) or "" for v in vars(obj).values() if callable(v) or isinstance(v, property)]
    return "\n".join(texts)


@pytest.mark.skipif(not FUNCTIONS_MD.exists(),
                    reason="the C reference list ../shared/reference/FUNCTIONS.md is not beside the project "
                           "(not a fixture)")
def test_every_listed_c_function_has_a_named_counterpart():
    named = set(re.findall(r"`([A-Za-z_0-9]+)`", docstrings()))
    found = chapters()
    assert sum(map(len, found.values())) > 100, "FUNCTIONS.md lists fewer C functions than expected: not parsed?"
    missing = {ch: [n for n in names if n not in named] for ch, names in found.items()}
    assert not any(missing.values()), missing
