"""Every line reference the notebooks give for a C function points at that function in the C sources
of llama.cpp daa9623 (../shared/reference/llama-daa9623/: ggml/src/ggml-alloc.c and ggml-backend.c).

Two forms are cited in the notebooks' prose and C quotes:

* `` `ggml_dyn_tallocr_alloc` (:148-230) ``, `` `ggml_backend_view_init` (ggml-backend.c:2062-2071) `` or
  `` (`ggml_backend_cpu_buffer_get_base`, :557-564) ``, in prose or in a docstring -- a range that must
  hold the whole function and start at most SLACK lines above it, or the one line where it is defined;
* a quoted C signature followed by `// :629` -- the line where that function is defined.

Without a file name, chapters 02-05 cite ggml-alloc.c and the others ggml-backend.c. The test skips
when the reference folder is not beside the project (it is not a fixture: the numbers stay checkable
by anyone who has the sources).

Chapter 12 cites ggml 0.15.3 (`ggml-alloc.c`, `ggml-backend.cpp`; a bare `:L` is ggml-alloc.c) except on
a line that says "2024", which cites daa9623 as above. The 0.15.3 sources come from the oracle's sdist
(`tools/today_sources.py`, run by `make setup`); that part skips without them."""

import re

import pytest

from helpers import REFERENCE, ROOT

SOURCES = REFERENCE / "llama-daa9623"
ALLOC_CHAPTERS = ("02_", "03_", "04_", "05_", "12_")
TODAY_CHAPTERS = ("12_",)
TODAY = ROOT / ".venv" / "ggml-0.15.3"
NAMED = re.compile(r"`(ggml_\w+)`(?: \(|, )(?:(ggml-(?:alloc|backend)\.c(?:pp)?))?:(\d+)(?:-(\d+))?\)")
SLACK = 3  # a range may start a few lines before the definition (a comment above it), no more
QUOTED = re.compile(r"^#\s.*?\b(ggml_\w+)\(.*//\s*\(?:(\d+)\)?\s*$")


def definition_lines(path) -> dict:
    """{function: line of its definition}: a line at column 0 naming it before '(' that is not a prototype."""
    out = {}
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line or line[0].isspace() or line.rstrip().endswith(";") or line.startswith(("#", "//", "/*", "}")):
            continue
        m = re.search(r"\b(ggml_\w+)\s*\(", line)
        if m and m.group(1) not in out:
            out[m.group(1)] = i
    return out


def end_line(path, start: int) -> int:
    """The line of the `}` at column 0 that closes the definition starting at `start`."""
    lines = path.read_text().splitlines()
    return next((i for i in range(start, len(lines) + 1) if lines[i - 1].startswith("}")), start)


def citations(today: bool = False):
    """[(where, function, file, first, last)] over every notebook source: the citations of daa9623, or with
    `today` those of ggml 0.15.3 (chapter 12's lines that do not say "2024")."""
    found = []
    for nb in sorted((ROOT / "notebooks").glob("*.py")):
        default = "ggml-alloc.c" if nb.name.startswith(ALLOC_CHAPTERS) else "ggml-backend.c"
        for n, line in enumerate(nb.read_text().splitlines(), 1):
            if today != (nb.name.startswith(TODAY_CHAPTERS) and "2024" not in line):
                continue
            where = f"{nb.name}:{n}"  # prose, C quotes and code docstrings alike
            for m in NAMED.finditer(line):
                first = int(m.group(3))
                found.append((where, m.group(1), m.group(2) or default, first, int(m.group(4) or first)))
            q = QUOTED.match(line)
            if q:
                found.append((where, q.group(1), default, int(q.group(2)), int(q.group(2))))
    return found


@pytest.mark.skipif(not SOURCES.is_dir(), reason=f"the C sources ({SOURCES}) are not beside the project")
def test_every_cited_line_range_contains_the_named_function():
    check(SOURCES, ("ggml-alloc.c", "ggml-backend.c"), citations(), 20)


@pytest.mark.skipif(not (TODAY / "ggml-alloc.c").is_file(), reason=f"ggml 0.15.3's sources are not in {TODAY} "
                    "(tools/today_sources.py fetches them)")
def test_chapter_12_cites_ggml_0_15_3():
    cited = [(w, fn, "ggml-backend.cpp" if f == "ggml-backend.c" else f, a, b) for w, fn, f, a, b in citations(True)]
    check(TODAY, ("ggml-alloc.c", "ggml-backend.cpp"), cited, 10)


def check(folder, files, cited, at_least) -> None:
    defs = {f: definition_lines(folder / f) for f in files}
    ends = {f: {fn: end_line(folder / f, start) for fn, start in defs[f].items()} for f in defs}
    assert len(cited) >= at_least, "fewer citations than the notebooks have: is the pattern still matching?"
    wrong = []
    for where, fn, file, first, last in cited:
        line = defs[file].get(fn)
        if line is None:
            wrong.append(f"{where}: {fn} is not defined in {file}")
        elif not (first <= line <= last and line - first <= SLACK and (first == last or last >= ends[file][fn])):
            wrong.append(f"{where}: {fn} cited at {file}:{first}{'-' + str(last) if last != first else ''}, "
                         f"defined at :{line}-{ends[file][fn]}")
    assert not wrong, "\n".join(wrong)
