"""Fetch the C sources chapter 12 cites: ggml 0.15.3's `ggml-alloc.c` and `ggml-backend.cpp`, from the sdist
of ggml-python 0.0.45 (the tests' oracle, which bundles ggml at eced84c) on PyPI, into `.venv/ggml-0.15.3/`.

They are for reading and for the citation test (tests/tools/test_citations.py), like ../shared/reference for
the 2024 chapters; they are never committed. `make setup` runs this; without network it says so and exits 0
(the citation test of chapter 12 then skips).

    python tools/today_sources.py [DEST]
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEST = ROOT / ".venv" / "ggml-0.15.3"
SDIST = "ggml-python==0.0.45"
FILES = ("ggml-alloc.c", "ggml-backend.cpp", "ggml-backend-impl.h")


def have(dest: Path = DEST) -> bool:
    return all((dest / f).is_file() for f in FILES)


def fetch(dest: Path = DEST) -> bool:
    """Download the sdist and extract FILES from its vendor/ggml/src; True when they are in `dest`."""
    if have(dest):
        return True
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                            "--dest", tmp, SDIST], capture_output=True, text=True)
        archives = list(Path(tmp).glob("*.tar.gz"))
        if r.returncode or not archives:
            print(f"today_sources: could not download {SDIST} ({r.stderr.strip()[-200:]}); chapter 12's "
                  "citations will not be checked")
            return False
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archives[0]) as tar:
            for member in tar.getmembers():
                name = Path(member.name)
                if name.name in FILES and name.parent.name == "src" and name.parent.parent.name == "ggml" \
                        and member.isfile():
                    data = tar.extractfile(member)
                    if data is not None:
                        (dest / name.name).write_bytes(data.read())
    return have(dest)


if __name__ == "__main__":
    dest = Path(sys.argv[1]) if len(sys.argv) > 1 else DEST
    ok = fetch(dest)
    print(f"today_sources: {'ggml 0.15.3 sources in ' + str(dest) if ok else 'not fetched'}")
