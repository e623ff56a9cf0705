"""The documentation site fits a 1400 px window: no code block, table or figure runs off the content column.

The site is built once (``mkdocs build --strict`` into a temporary folder), then:

* ``test_no_page_overflows_in_a_browser`` opens every page in headless Chromium at a 1400x900 window
  (the pages served over HTTP by this process, each page leading the browser to the next) and
  measures every ``pre``, code block, table (and the box Material scrolls it in) and image of the
  content: none may be wider than its box (scrollWidth > clientWidth) or reach past the content
  column. It also measures what the second test assumes (the column's width, the characters of code
  a line holds, each table's narrowest width) and checks the assumptions still hold. It needs
  Chromium (``apt-get install chromium``): CI installs only the Python extras, so there it skips,
  saying so.
* ``test_built_pages_have_no_known_overflow_cause`` always runs, on the built HTML alone: every page
  carries the stylesheet that wraps code blocks and scales images (docs/stylesheets/extra.css), no
  table's narrowest width (its columns' longest words and Material's cell padding and minimum, the
  model the browser test checks) exceeds the column, the benchmark pages (written by
  tools/bench/) have no code line longer than a line of the column and embed only figures that
  exist, with no width of their own.

Run this file as a script (``python tests/unit/test_docs_width.py``) to print the browser's
measurements of every page.
"""
import html.parser
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WINDOW = (1400, 900)

# What the browser measured at 1400x900 (Chromium 156, Debian's fonts standing in for Roboto, which
# is wider: the figures hold for the real fonts too); the browser test checks they still hold.
COLUMN_PX = 850  # the content column (853 measured, a scrollbar's width less than the window allows)
CODE_CHARS = 94  # characters of code a line of a code block holds in that column (96 measured)
# a table's narrowest width, modelled per column from its longest word (fitted to the browser's widths
# of all 100 tables of 2026-12-04: the least widths that never fall short of one of them, 7.4 and 6.6)
TABLE_CHAR_PX = 7.6  # a character of text in a table, at its 0.64rem (12.8 px), bold headers included
TABLE_CODE_CHAR_PX = 6.7  # a character of code in a table (0.85em of 12.8 px, monospace)
TABLE_CODE_PAD_PX = 6.4  # the padding of a piece of code, 0.29em each side
TABLE_CELL_PAD_PX = 32  # 1.25em of padding each side of a cell
TABLE_TH_MIN_PX = 100  # Material's min-width of a header cell, 5rem
TABLE_BORDER_PX = 2  # the table's border, 0.05rem each side
STYLESHEET = "stylesheets/extra.css"

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def _browser():
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def _docs_tools_missing():
    import importlib.util

    missing = []
    for name in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        try:
            if importlib.util.find_spec(name) is None:
                missing.append(name)
        except ModuleNotFoundError:
            missing.append(name)
    return missing


pytestmark = pytest.mark.skipif(bool(_docs_tools_missing()), reason=f"the docs tools are not installed (missing "
                                f"{_docs_tools_missing()}): python -m pip install -e \".[docs]\"")


def build_site(folder: Path) -> Path:
    """``mkdocs build --strict`` of this checkout into ``folder``; returns it."""
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(folder)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return folder


def pages_of(site: Path) -> list:
    """Every page of the built site (its ``index.html`` files, the 404 page left out)."""
    return sorted(p for p in site.rglob("index.html") if "assets" not in p.relative_to(site).parts)


@pytest.fixture(scope="module")
def site(docs_build):
    folder, proc = docs_build  # the same command as build_site, run once for the session
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return folder


# ----------------------------------------------------------------------------- the built HTML
VOID = frozenset(("area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"))


class _Article(html.parser.HTMLParser):
    """The content of a page (Material's ``article.md-content__inner``): its tables (rows of cells,
    each a list of (text, in code) pieces), its code blocks' text and its images; and the page's
    stylesheets."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.depth = 0  # element depth inside the article (0: outside)
        self.tables, self.pres, self.images, self.stylesheets = [], [], [], []
        self._cell = self._pre = None
        self._code = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "link" and attrs.get("rel") == "stylesheet":
            self.stylesheets.append(attrs.get("href", ""))
        if self.depth == 0:
            if tag == "article" and "md-content__inner" in (attrs.get("class") or ""):
                self.depth = 1
            return
        if tag not in VOID:
            self.depth += 1
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag in ("td", "th") and self.tables and self.tables[-1]:
            self._cell = []
            self.tables[-1][-1].append(self._cell)
        elif tag == "pre":
            self._pre = []
        elif tag == "code":
            self._code += 1
        elif tag == "img":
            self.images.append(attrs)

    def handle_endtag(self, tag):
        if self.depth == 0 or tag in VOID:  # a void element (<img/> written closed too) never opened a level
            return
        self.depth -= 1
        if tag in ("td", "th"):
            self._cell = None
        elif tag == "pre" and self._pre is not None:
            self.pres.append("".join(self._pre))
            self._pre = None
        elif tag == "code":
            self._code -= 1

    def handle_data(self, data):
        if self.depth == 0:
            return
        if self._cell is not None:
            self._cell.append((data, self._code > 0))
        if self._pre is not None:
            self._pre.append(data)


def read_page(path: Path) -> _Article:
    parser = _Article()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


def longest_word(pieces) -> float:
    """Width in px of a cell's longest unbreakable run, from ``(text, in code)`` pieces: text and
    code break at spaces only (Material lets code break anywhere, but mkdocstrings' tables keep
    names whole, and a hyphen or a slash may not break a line either: the model errs wide); a
    character of text is ``TABLE_CHAR_PX`` wide, of code ``TABLE_CODE_CHAR_PX``, and a piece of
    code adds its padding."""
    longest = run = 0.0
    for piece, in_code in pieces:
        run += TABLE_CODE_PAD_PX if in_code and piece.strip() else 0.0
        for char in piece:
            if char.isspace():
                longest, run = max(longest, run), 0.0
            else:
                run += TABLE_CODE_CHAR_PX if in_code else TABLE_CHAR_PX
    return max(longest, run)


def table_min_width(rows) -> float:
    """The narrowest a table can be, in px: per column, its longest word plus the cell's padding,
    at least a header cell's minimum; and the border."""
    columns = max((len(r) for r in rows), default=0)
    width = float(TABLE_BORDER_PX)
    for c in range(columns):
        words = [longest_word(r[c]) for r in rows if c < len(r)]
        width += max(TABLE_TH_MIN_PX, TABLE_CELL_PAD_PX + max(words, default=0))
    return width


def test_built_pages_have_no_known_overflow_cause(site):
    css = (ROOT / "docs" / STYLESHEET).read_text(encoding="utf-8")
    rules = {sel.strip(): body for sel, body in re.findall(r"([^{}/]+)\{([^}]*)\}", re.sub(r"/\*.*?\*/", "", css,
                                                                                          flags=re.S))}
    wrap = rules.get(".md-typeset pre > code", "")
    assert "white-space: pre-wrap" in wrap and "overflow-wrap: anywhere" in wrap, (
        f"{STYLESHEET} must wrap code blocks ('.md-typeset pre > code'), or long lines run off the column")
    assert "max-width: 100%" in rules.get(".md-typeset img", ""), f"{STYLESHEET} must scale images to the column"
    grid = re.search(r"max-width:\s*([\d.]+)rem", rules.get(".md-grid", ""))
    assert grid and float(grid.group(1)) >= 70, (f"{STYLESHEET}: the grid ('.md-grid') must be at least 70rem wide, "
                                                 f"the width COLUMN_PX was measured at")
    problems = []
    for path in pages_of(site):
        page = path.relative_to(site).parent.as_posix() or "home"
        article = read_page(path)
        if not any(href.endswith(STYLESHEET) for href in article.stylesheets):
            problems.append(f"{page}: does not load {STYLESHEET}")
        for i, rows in enumerate(article.tables):
            width = table_min_width(rows)
            if width > COLUMN_PX:
                head = " | ".join("".join(p for p, _ in cell).strip() for cell in rows[0])[:80]
                problems.append(f"{page}: table {i + 1} ({len(rows[0])} columns: {head}) needs {width:.0f} px, the "
                                f"column has {COLUMN_PX}: split it or shorten its longest words")
        if page.startswith("benchmarks"):
            for block in article.pres:
                long = [line for line in block.splitlines() if len(line) > CODE_CHARS]
                if long:
                    problems.append(f"{page}: a code line of {len(long[0])} characters (a line holds {CODE_CHARS}): "
                                    f"{long[0][:60]}...")
            for image in article.images:
                src = image.get("src", "")
                if "width" in image or "width" in image.get("style", ""):
                    problems.append(f"{page}: image {src} sets its own width")
                if not (path.parent / src).is_file():
                    problems.append(f"{page}: image {src} is missing")
    assert not problems, "\n".join(problems)


def test_the_table_model_finds_a_wide_table():
    """A table the browser measured overflowing (stages benchmark, 2026-12-03: 12 columns) is found
    by the model; a narrow one is not."""
    wide = [[[(h, False)] for h in ("N", "stage", "model states / rank", "estimate (4+4+8 B)", "measured / estimate",
                                    "median step", "vs stage 0", "collectives / step (library)",
                                    "native bytes / step / rank", "in Φ'", "in Φ' at 1 micro-step", "paper")]]
    narrow = [[[("stage", False)], [("peak growth (MB)", False)]], [[("3 (keep)", False)], [("105", False)]]]
    assert table_min_width(wide) > COLUMN_PX >= table_min_width(narrow)
    code = 23 * TABLE_CODE_CHAR_PX + TABLE_CODE_PAD_PX
    assert longest_word([("a ", False), ("long_identifier_in_code", True), (" and text", False)]) == pytest.approx(code)
    assert longest_word([("wide", False), ("name", True), ("s", False)]) == pytest.approx(
        5 * TABLE_CHAR_PX + 4 * TABLE_CODE_CHAR_PX + TABLE_CODE_PAD_PX)


# ----------------------------------------------------------------------------- in a browser
PROBE = r"""
<script>
window.addEventListener("load", function () { setTimeout(function () {
  var col = document.querySelector("article.md-content__inner");
  var right = col.getBoundingClientRect().right, found = [], tables = [];
  var probe = document.createElement("pre"), code = document.createElement("code");
  code.textContent = "0".repeat(100); code.style.whiteSpace = "pre"; code.style.display = "inline";
  probe.appendChild(code); col.appendChild(probe);
  var charPx = code.getBoundingClientRect().width / 100; probe.remove();
  var block = document.createElement("pre"), inner = document.createElement("code");
  inner.textContent = "x"; block.appendChild(inner); col.appendChild(block);
  var style = getComputedStyle(inner);
  var codeLine = inner.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  block.remove();
  col.querySelectorAll("pre, pre > code, table, .md-typeset__scrollwrap, img").forEach(function (el) {
    var box = el.getBoundingClientRect(), over = el.scrollWidth - el.clientWidth;
    // Material's table wrapper reaches 0.8rem past the column on purpose (a negative margin)
    var past = el.classList.contains("md-typeset__scrollwrap") ? 0 : box.right - right;
    if ((el.clientWidth > 0 && over > 1) || past > 1) {
      found.push({tag: el.tagName.toLowerCase(), over: Math.max(over, past),
                  text: (el.innerText || el.getAttribute("src") || "").slice(0, 70)});
    }
  });
  col.querySelectorAll("table").forEach(function (t) {
    var was = t.style.width; t.style.width = "min-content"; var least = t.offsetWidth; t.style.width = was;
    tables.push({least: least});
  });
  fetch("/__report", {method: "POST", body: JSON.stringify({page: location.pathname, window: window.innerWidth,
    column: col.clientWidth, char_px: charPx, code_chars: Math.floor(codeLine / charPx), overflows: found,
    tables: tables})}).then(function () { location.href = NEXT; });
}, 50); });
</script>
"""


def measure_in_browser(site: Path, browser: str, tabs: int = 2, timeout: float = 240.0) -> list:
    """Open every page of ``site`` (a built copy, changed in place: each page gets the probe) in
    headless ``browser`` at ``WINDOW``, ``tabs`` browsers side by side, each walking its share of
    the pages; returns each page's report, in page order."""
    pages = pages_of(site)
    urls = ["/" + p.parent.relative_to(site).as_posix() + "/" for p in pages]
    urls = ["/" if u == "/./" else u for u in urls]
    chains = [list(range(len(urls)))[k::tabs] for k in range(tabs)]
    for chain in chains:
        for i, index in enumerate(chain):
            nxt = json.dumps(urls[chain[i + 1]] if i + 1 < len(chain) else "/__done")
            text = pages[index].read_text(encoding="utf-8")
            pages[index].write_text(text.replace("</body>", PROBE.replace("NEXT", nxt) + "</body>"), encoding="utf-8")
    reports, done = [], threading.Event()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(site), **kwargs)

        def log_message(self, *args):
            pass

        def do_POST(self):
            reports.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()
            if len(reports) == len(urls):
                done.set()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    profiles, procs = [], []
    for chain in (c for c in chains if c):  # one browser per chain, each with a fresh profile
        profiles.append(tempfile.mkdtemp(prefix="docs_width_chromium_"))
        procs.append(subprocess.Popen(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
             # no host but this one resolves: the site's web fonts fail at once instead of waiting on a network
             "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1", f"--user-data-dir={profiles[-1]}", f"--window-size={WINDOW[0]},{WINDOW[1]}", base + urls[chain[0]]],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
    try:
        finished = done.wait(timeout)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        server.shutdown()
        for profile in profiles:
            shutil.rmtree(profile, ignore_errors=True)
    assert finished, f"the browser reported {len(reports)} of {len(urls)} pages in {timeout:.0f} s"
    return sorted(reports, key=lambda r: urls.index(r["page"]))


@pytest.mark.skipif(_browser() is None, reason=f"no headless browser ({', '.join(BROWSERS)}) on PATH: CI installs "
                    "only the Python extras; `apt-get install chromium` runs this test; without a browser, "
                    "test_built_pages_have_no_known_overflow_cause checks the built HTML for the known causes")
def test_no_page_overflows_in_a_browser(site, tmp_path):
    copy = Path(shutil.copytree(site, tmp_path / "site"))
    reports = measure_in_browser(copy, _browser())
    problems = []
    for report, path in zip(reports, pages_of(copy)):
        page = report["page"]
        assert report["window"] == WINDOW[0], report
        problems += [f"{page}: a {o['tag']} runs {o['over']:.0f} px past its box: {o['text']!r}"
                     for o in report["overflows"]]
        # what the HTML test assumes
        if report["column"] < COLUMN_PX:
            problems.append(f"{page}: the column is {report['column']} px: lower COLUMN_PX")
        if report["code_chars"] < CODE_CHARS:
            problems.append(f"{page}: a code line holds {report['code_chars']} characters: lower CODE_CHARS")
        tables = read_page(path).tables
        assert len(tables) == len(report["tables"]), page
        for i, (measured, rows) in enumerate(zip(report["tables"], tables)):
            if table_min_width(rows) < 0.98 * measured["least"] - 1:  # 2%: another machine's fonts
                problems.append(f"{page}: table {i + 1} is at least {measured['least']} px wide, the model of the "
                                f"HTML test says {table_min_width(rows):.0f}: raise its TABLE_* widths")
    assert not problems, "\n".join(problems)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:
        built = build_site(Path(folder) / "site")
        for r, p in zip(measure_in_browser(built, _browser()), pages_of(built)):
            models = [round(table_min_width(rows)) for rows in read_page(p).tables]
            print(r["page"], f"column {r['column']} px, code line {r['code_chars']} chars "
                  f"({r['char_px']:.2f} px each), tables least/model {[t['least'] for t in r['tables']]} / {models}")
            for o in r["overflows"]:
                print("   overflow:", o)
