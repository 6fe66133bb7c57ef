"""Sphinx's configuration for `make book` (tools/book/build.py stages the sources and runs Sphinx with it).

myst-nb reads the staged notebooks and never executes them; myst-parser reads the Markdown pages. The theme
is furo: a sidebar of every page, previous and next at the bottom of each, a search box, no file fetched from
anywhere but the site. Sphinx's own search (`search.html` with `searchindex.js`) works from the files alone.
A page that holds a plotly figure loads the site's copy of plotly.js (the installed plotly package's) and
`book-figures.js`, which draws each figure from the JSON the page carries.
"""

from pathlib import Path

import plotly

HERE = Path(__file__).resolve().parent
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
FIGURE_CLASS = "book-figure"  # the same as build.FIGURE_CLASS (conf.py is read by Sphinx, not imported)

project = "ggml_lite"
author = "the ggml_lite authors"
copyright = "ggml_lite authors (MIT)"
extensions = ["myst_nb"]
exclude_patterns = ["_build"]
root_doc = "index"

# the notebooks: shown as committed, never run; consecutive prints shown as one block, as JupyterLab shows them
nb_execution_mode = "off"
nb_merge_streams = True
nb_ipywidgets_js: dict = {}  # no widget manager from a CDN: the pages carry no live widget
myst_heading_anchors = 3  # `page.md#a-heading` links (the run note links to the home page's "the two commands")
myst_enable_extensions = ["colon_fence"]
suppress_warnings = ["myst.header"]  # notebook sections that skip a heading level are the chapters' own

html_theme = "furo"
html_title = "ggml_lite"
html_favicon = "static/favicon.svg"
html_static_path = ["static", str(PLOTLY_JS)]
html_css_files = ["book.css"]
html_show_sourcelink = False
html_copy_source = False
html_last_updated_fmt = None
pygments_style = "default"
highlight_language = "none"  # an indented block in prose is a printout; code cells and fences name their language


def add_plotly(app, pagename, templatename, context, doctree) -> None:
    """plotly.js and the figure drawer on the pages that have a figure, and only there."""
    if FIGURE_CLASS in context.get("body", ""):
        app.add_js_file("plotly.min.js")
        app.add_js_file("book-figures.js")


def setup(app):
    app.connect("html-page-context", add_plotly)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
