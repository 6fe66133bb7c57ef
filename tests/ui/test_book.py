"""The book of `make book`, built and then read in a real browser.

The site is built once per run, as `make book` builds it (`tools/book/build.py` into `_build/book/`), with no
warning from Sphinx, and served by a local HTTP server on 127.0.0.1. Then, in headless Chromium:

* every HTML page of the site opens with no console error and no uncaught exception; any request to a host
  other than the local server is aborted and fails the test (the site must work offline); every image loads;
  every figure the page carries (a `div.book-figure` holding a plotly figure's JSON) is drawn by the site's own
  plotly.js (a `.plot-container` with its SVG and every trace), without plotly's button that uploads it;
* Sphinx's search page, asked for C names, lists the page of the module that ports each (and, for
  `ggml_dyn_tallocr_alloc`, chapter 04 too): the search works from the files alone;
* a link check over every page: each link, image and script of the site points to a file of the site, and
  each `#anchor` is an id of its page. Links to other sites are counted, never followed.

It prints the pages, figures, links and searches it checked. Without a Chromium (or the playwright package) the
browser tests skip, unless GGML_LITE_REQUIRE_BROWSER=1 (`.ci/run`), which makes them fail; the build is tested
either way. `make test` runs this file as a part of its own (tools/run_tests.py).
"""

import functools
import html.parser
import http.server
import importlib.util
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlsplit

import plotly
import pytest

from ui.lab import find_chromium

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "_build" / "book"
# (a search, a page it must list): C names, each found on its module's API page
SEARCHES = [
    ("ggml_dyn_tallocr_alloc", "api/ggml_lite.dyn_tallocr.html"),
    ("ggml_dyn_tallocr_alloc", "04_dyn_allocator.html"),
    ("ggml_gallocr_reserve_n", "api/ggml_lite.gallocr.html"),
    ("ggml_backend_sched_split_graph", "api/ggml_lite.sched.html"),
    ("ggml_tallocr_alloc", "api/ggml_lite.tallocr.html"),
    ("ggml_backend_tensor_set", "api/ggml_lite.backend.html"),
]
# every figure drawn: each figure div holds a plotly plot with its SVG and every trace of the figure's JSON
FIGURES_DRAWN = """() => Array.from(document.querySelectorAll('div.book-figure')).every(box => {
    const plot = box.querySelector('.js-plotly-plot'), fig = JSON.parse(box.querySelector('script').textContent);
    return plot && plot.querySelector('.plot-container svg.main-svg') && plot._fullData
        && plot._fullData.length === fig.data.length;
})"""
LINKS = """() => [
    ...Array.from(document.querySelectorAll('a[href]'), a => a.href),
    ...Array.from(document.querySelectorAll('img[src], script[src]'), e => e.src),
    ...Array.from(document.querySelectorAll('link[href]'), e => e.href),
]"""
BROKEN_IMAGES = "() => Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src)"


@pytest.fixture(scope="module")
def site():
    """The site, built once as `make book` builds it; what the build printed, and its time."""
    t0 = time.perf_counter()
    run = subprocess.run([sys.executable, "tools/book/build.py"], cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    assert run.returncode == 0, f"make book failed:\n{run.stdout}\n{run.stderr}"
    assert "WARNING" not in run.stderr, f"make book warned (a broken link or reference, a bad directive):\n{run.stderr}"
    return SITE, run.stdout.strip(), seconds


@pytest.fixture(scope="module")
def server(site):
    """A local HTTP server of the site on 127.0.0.1; its base URL."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site[0])))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def chromium_browser():
    """Headless Chromium (the system's, as tests/ui drives it)."""
    missing = ("no Chromium (Debian: apt-get install chromium; or set CHROMIUM)" if find_chromium() is None else
               "the playwright package is not installed" if importlib.util.find_spec("playwright") is None else "")
    if missing:
        if os.environ.get("GGML_LITE_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{missing} (GGML_LITE_REQUIRE_BROWSER=1)")
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=find_chromium(), args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def context(chromium_browser, server):
    """A browser context whose every request to another host is aborted, and the list of those requests."""
    outside = []
    ctx = chromium_browser.new_context()

    def route(r):
        if r.request.url.startswith(server) or r.request.url.startswith("data:"):
            r.continue_()
        else:
            outside.append(r.request.url)
            r.abort()

    ctx.route("**/*", route)
    yield ctx, outside
    ctx.close()


def pages(site_dir: Path) -> list[str]:
    return sorted(p.relative_to(site_dir).as_posix() for p in site_dir.rglob("*.html"))


class Ids(html.parser.HTMLParser):
    """The ids (and anchor names) of one HTML file."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        for key, value in attrs:
            if key == "id" or (tag == "a" and key == "name"):
                self.ids.add(value or "")


def test_book_builds(site, capsys) -> None:
    """`make book` builds a page per notebook in reading order, the API pages, the search index, a local plotly.js."""
    site_dir, printed, seconds = site
    notebooks = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    built = pages(site_dir)
    assert [n for n in notebooks if f"{n}.html" not in built] == []
    assert "index.html" in built and "search.html" in built and (site_dir / "searchindex.js").is_file()
    modules = [p for p in built if p.startswith("api/ggml_lite")]
    assert len(modules) >= 40, modules
    plotly_js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    assert (site_dir / "_static" / "plotly.min.js").read_bytes() == plotly_js.read_bytes()
    # the sidebar: chapters 00..12, then the appendices A1..A11 in their numeric order
    home = (site_dir / "index.html").read_text()
    order = [home.find(f'href="{n}.html"') for n in notebooks]
    chapters = [n for n in notebooks if n[:2].isdigit()]
    appendices = sorted((n for n in notebooks if n.startswith("A")), key=lambda n: int(n[1:].split("_")[0]))
    positions = [home.find(f'href="{n}.html"') for n in chapters + appendices]
    assert -1 not in order and positions == sorted(positions), "the sidebar is not in reading order"
    with capsys.disabled():
        print(f"\nbook: {printed}\nbook: `make book` took {seconds:.1f} s here")


def test_every_page_in_chromium(site, server, context, capsys) -> None:
    """Every page: no console error, no request off 127.0.0.1, every figure drawn, every image loaded; then every
    link and anchor of every page resolves within the site."""
    site_dir = site[0]
    problems: list[str] = []
    links: dict[str, set[str]] = {}
    figures = 0
    ctx, outside = context
    page = ctx.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
    for name in pages(site_dir):
        errors.clear()
        page.goto(server + name, wait_until="load")
        try:
            page.wait_for_function(FIGURES_DRAWN, timeout=20000)
        except Exception:
            problems.append(f"{name}: not every figure was drawn")
        figures += page.locator("div.book-figure .plot-container").count()
        if page.locator('div.book-figure .modebar-btn[data-title="Share chart..."]').count():
            problems.append(f"{name}: a figure offers to upload itself to another site")
        broken = page.evaluate(BROKEN_IMAGES)
        problems += [f"{name}: {e}" for e in errors] + [f"{name}: image not loaded: {src}" for src in broken]
        links[name] = set(page.evaluate(LINKS))
    page.close()
    problems += [f"a request left 127.0.0.1: {url}" for url in outside]

    ids: dict[str, set[str]] = {}
    checked = anchors = external = 0
    for name, hrefs in links.items():
        for href in hrefs:
            if not href.startswith(server):
                external += href.startswith(("http:", "https:"))
                continue
            url, fragment = urldefrag(href)
            path = unquote(urlsplit(url).path).lstrip("/") or "index.html"
            target = site_dir / (path + "index.html" if path.endswith("/") else path)
            checked += 1
            if not target.is_file():
                problems.append(f"{name}: broken link {href}")
                continue
            if fragment and target.suffix == ".html":
                anchors += 1
                key = target.relative_to(site_dir).as_posix()
                if key not in ids:
                    ids[key] = Ids(target.read_text()).ids
                if unquote(fragment) not in ids[key]:
                    problems.append(f"{name}: no anchor #{fragment} in {key}")
    assert not problems, f"{len(problems)} problem(s):\n" + "\n".join(sorted(set(problems))[:60])
    with capsys.disabled():
        print(f"\nbook: {len(links)} pages opened in Chromium from 127.0.0.1 (no console error, no request "
              f"elsewhere), {figures} plotly figures drawn; {checked} links to the site checked ({anchors} with an "
              f"anchor), all resolving; {external} links to other sites not followed")


def test_search_finds_the_c_names(server, context, capsys) -> None:
    """Sphinx's search, from searchindex.js on the local server, finds each C name's page."""
    page = context[0].new_page()
    missing = []
    for query, expected in SEARCHES:
        page.goto(f"{server}search.html?q={query}")
        page.wait_for_function("() => /found \\d+ page|did not match/i.test("
                               "document.querySelector('#search-results')?.textContent || '')", timeout=30000)
        found = [h.split("#")[0].split("?")[0] for h in page.eval_on_selector_all(
            "#search-results ul.search li a", "els => els.map(a => a.getAttribute('href'))")]
        if expected not in found:
            missing.append(f"search {query!r}: {expected} not among {found}")
    page.close()
    assert not missing, "\n".join(missing)
    with capsys.disabled():
        print(f"\nbook: {len(SEARCHES)} searches checked ({len({q for q, _ in SEARCHES})} C names), each finding "
              "its page")
