"""viz: the pictures and widgets of the course, drawn from what the computing modules return.

They need plotly and ipywidgets, the `viz` extra (`pip install "ggml_lite[viz]"`; `make setup` installs it);
nothing outside this package imports them, so `import ggml_lite` plans without them.
"""

from importlib.util import find_spec

_MISSING = [name for name in ("plotly", "ipywidgets") if find_spec(name) is None]
if _MISSING:
    raise ImportError(f"ggml_lite.viz draws with {' and '.join(_MISSING)}, not installed here: "
                      f"pip install \"ggml_lite[viz]\" (planning, scheduling and reports need neither)")
