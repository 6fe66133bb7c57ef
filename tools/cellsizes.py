import sys, jupytext
for f in sys.argv[1:]:
    nb = jupytext.read(f)
    for i, c in enumerate(nb.cells):
        n = c.source.count("\n") + 1
        if c.cell_type == "code" and n > 80:
            print(f"{f}: cell {i}: {n} lines: {c.source.splitlines()[1][:60] if len(c.source.splitlines())>1 else ''}")
