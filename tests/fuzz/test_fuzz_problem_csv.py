"""Fuzz tests of `solve PROBLEM.csv` (issue 27, point 3): problem files in MiniMalloc's CSV format, valid ones
written with every tolerated variation (columns in any order, a byte-order mark, CRLF, blank lines, spaces,
an offset column), then mutated: a field replaced by a hostile value (negative, signed, float, hex,
underscores, exponents, 2^63, 2^64, huge, non-ASCII digits, empty, quoted, a NUL), a row cut or lengthened, a
header column dropped, repeated or renamed, lines duplicated, bytes flipped, random bytes. Each case runs
through `solve` in-process (tests/fuzzing.py) with a short budget and must end with exit 2 and a message naming
the line (and the column, for a field), or with exit 0/1 and a valid plan: the `--out` file holds the input's
rows in order with offsets, no two blocks alive at a common step share a byte (checked pairwise here), and
the printed peak is what the offsets need. Never a traceback, never unbounded time or memory.

Quick run (default): a few hundred cases. `--long` (make test-long): thousands; each test prints its count."""

import random
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzzing import assert_sound, run_cli
from ggml_lite.problem_csv import COLUMNS, read_problem_csv
from placements import conflicts

HOSTILE = ("-1", "+5", "1.0", "1e3", "0x10", "1_000", "9223372036854775808", "18446744073709551616", "9" * 400,
           "\u0661\u0662", "", " ", '"7"', "nan", "inf", "None", "true", "\x00", "12 34", "٣")
HOSTILE_ID = ("", " ", '"7"', "\x00", "12 34", "x" * 129, "caf\u00e9", "a;b", "<0>", "0")  # "0": row 0's id again
LIFESPAN = st.tuples(st.integers(0, 60), st.integers(1, 30)).map(lambda t: (t[0], t[0] + t[1]))
ROWS = st.lists(st.tuples(LIFESPAN, st.integers(0, 5000)), min_size=1, max_size=25)


def _text(columns, rows, *, bom=False, crlf=False, blank=False, spaces=False, offsets=None) -> bytes:
    """A problem file of `rows` ((lower, upper), size) with ids 0.., in the column order `columns`."""
    end = "\r\n" if crlf else "\n"
    pad = " " if spaces else ""
    lines = [f",{pad}".join(columns)]
    for k, ((lo, up), size) in enumerate(rows):
        value = {"id": str(k), "lower": lo, "upper": up, "size": size, "offset": 0 if offsets is None else offsets[k]}
        lines.append(",".join(f"{pad}{value[c]}{pad}" for c in columns))
        if blank and k % 3 == 0:
            lines.append("")
    return (("\ufeff" if bom else "") + end.join(lines) + end).encode()


def _solve(tmp_path, data: bytes, allow=(0, 1, 2)):
    src, out = tmp_path / "p.csv", tmp_path / "o.csv"
    src.write_bytes(data)
    if out.exists():
        out.unlink()
    o = assert_sound(run_cli(["solve", src, "--budget", "0.05", "--out", out]), allow)
    return o, out


def _check_plan(o, out, rows) -> None:
    """exit 0/1: the --out file is the input's rows in order, with offsets that overlap nowhere, and the
    printed peak is what they need."""
    back = read_problem_csv(out)
    assert back.offsets is not None, o.describe()
    assert [r[1:] for r in back.rows] == [(lo, up, size) for (lo, up), size in rows], o.describe()
    assert not conflicts(back.rows, back.offsets), o.describe()
    peak = max(off + r[3] for r, off in zip(back.rows, back.offsets))
    assert re.search(rf"^peak: {peak} bytes", o.out, re.M), o.describe()


def test_valid_files_in_every_tolerated_form(tmp_path, long_run, capsys):
    @settings(max_examples=600 if long_run else 60, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(rows=ROWS, order=st.permutations(COLUMNS), offset=st.booleans(), bom=st.booleans(), crlf=st.booleans(),
           blank=st.booleans(), spaces=st.booleans())
    def case(rows, order, offset, bom, crlf, blank, spaces):
        columns = list(order) + (["offset"] if offset else [])
        o, out = _solve(tmp_path, _text(columns, rows, bom=bom, crlf=crlf, blank=blank, spaces=spaces), (0,))
        _check_plan(o, out, rows)

    case()


def test_a_field_replaced_by_a_hostile_value(tmp_path, long_run, capsys):
    """Exit 2 naming the line, the row and the column of the field (a NUL: the line). Rows 2 to 5 (row 1's
    id "0" is one of the hostile ids: a repeat)."""
    rng, n = random.Random(1), 0
    for _ in range(3000 if long_run else 200):
        rows = [((lo, lo + rng.randint(1, 9)), rng.randint(1, 99)) for lo in (rng.randint(0, 20) for _ in range(5))]
        columns = rng.sample(COLUMNS, 4)
        lines = _text(columns, rows).decode().split("\n")
        k, c = rng.randrange(1, 5), rng.randrange(4)
        bad = rng.choice(HOSTILE_ID if columns[c] == "id" else HOSTILE)
        fields = lines[k + 1].split(",")
        fields[c] = bad
        lines[k + 1] = ",".join(fields)
        o, _ = _solve(tmp_path, "\n".join(lines).encode(), (2,))
        if bad == "\x00":
            assert f"line {k + 2}: a NUL byte" in o.err, o.describe()
        elif bad.strip() == "" and columns[c] != "id" or len(lines[k + 1]) > 1024:
            assert f"line {k + 2}" in o.err, o.describe()
        else:
            assert f"line {k + 2} (row {k + 1}), column `{columns[c]}`" in o.err, o.describe()
        n += 1
    print(f"\nproblem files, hostile fields: {n} cases, each refused naming its line and column")


def test_structural_mutations(tmp_path, long_run, capsys):
    """Rows cut or lengthened, header columns dropped, repeated or renamed, lines duplicated (a repeated id),
    lower and upper swapped: exit 2, naming the header or the line."""
    rng = random.Random(2)
    for _ in range(1500 if long_run else 150):
        rows = [((lo, lo + rng.randint(1, 9)), rng.randint(1, 99)) for lo in (rng.randint(0, 20) for _ in range(6))]
        lines = _text(list(COLUMNS), rows).decode().split("\n")
        k = rng.randrange(1, 7)
        what = rng.choice(("cut", "lengthen", "drop", "repeat", "rename", "duplicate", "swap"))
        if what == "cut":
            lines[k] = lines[k].rsplit(",", 1)[0]
        elif what == "lengthen":
            lines[k] += ",7"
        elif what in ("drop", "repeat", "rename"):
            header = lines[0].split(",")
            c = rng.randrange(4)
            header = (header[:c] + header[c + 1:] if what == "drop" else header + [header[c]] if what == "repeat"
                      else header[:c] + ["Size"] + header[c + 1:])
            lines[0] = ",".join(header)
        elif what == "duplicate":
            lines.insert(k + 1, lines[k])
        else:
            i_, lo, up, size = lines[k].split(",")
            lines[k] = ",".join((i_, up, lo, size))
        o, _ = _solve(tmp_path, "\n".join(lines).encode(), (2,))
        where = "line 1 (the header)" if what in ("drop", "repeat", "rename") else \
            f"line {k + 2}" if what == "duplicate" else f"line {k + 1}"
        assert where in o.err, (what, o.describe())


def test_random_bytes_and_flipped_bytes(tmp_path, long_run, capsys):
    """Random bytes, and 1 to 8 bytes of a valid file replaced (a digit often by a digit): exit 2, or 0
    with a valid plan."""
    rng = random.Random(3)
    base = _text(list(COLUMNS), [((0, 5), 40), ((3, 9), 16), ((5, 12), 24), ((9, 15), 8)])
    counts = {0: 0, 1: 0, 2: 0}
    for i in range(4000 if long_run else 300):
        if i % 2:
            data = bytes(rng.randrange(256) for _ in range(rng.randint(0, 200)))
        else:
            data, digits = bytearray(base), [k for k, b in enumerate(base) if k > 20 and chr(b).isdigit()]
            for _ in range(rng.randint(1, 8)):
                if rng.random() < 0.5:  # a digit of a row becomes another digit
                    data[rng.choice(digits)] = rng.randrange(48, 58)
                else:
                    data[rng.randrange(len(data))] = rng.randrange(256)
            data = bytes(data)
        o, out = _solve(tmp_path, data)
        counts[o.code] += 1
        if o.code != 2:
            back = read_problem_csv(out)
            assert back.offsets is not None and not conflicts(back.rows, back.offsets), o.describe()
    print(f"\nproblem files, random and flipped bytes: exit codes {counts}")
    assert counts[2] > 0 and counts[0] > 0
