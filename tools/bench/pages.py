"""For benchmarking: a benchmark's page, figure and raw results, written from one source.

    python tools/bench/pages.py                 # redraw every page from its docs/benchmarks/<name>.json
    python tools/bench/pages.py peak scale      # these pages only
    python tools/bench/pages.py --docs DIR      # the pages of another folder

A benchmark ends with ``publish(PAGE, results)``, where ``PAGE`` (a ``Page``) says how its page is
written and ``results`` are its raw results (JSON-able). ``publish`` takes the run's stamp
(``report.stamp_fields``: command, date, commit, versions, machine, load) once, and writes three
files side by side (by default into ``docs/benchmarks/``):

* ``<name>.json``: the stamp and the raw results;
* ``<name>.svg``: the figure (``PAGE.draw``), its last line the stamp; where matplotlib is not
  installed (the ``plot`` extra) there is none, and the page says how to draw it;
* ``<name>.md``: the page (``report.write_report``): the opening sentences (``PAGE.intro``: what was
  measured, what to expect), the stamp, the figure, the tables (``PAGE.body``).

Redrawing reads the JSON and writes the figure and the page again, with the same stamp and the
page writer's current code: a page's layout, figure or opening can change without running the
benchmark again; its numbers cannot. Nobody types a figure into a page.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.bench import plots  # noqa: E402
from tools.bench.report import DOCS, stamp_fields, write_report, write_text_atomic  # noqa: E402

# every page: its name and the module attribute holding its ``Page`` (imported only when redrawn)
PAGES = {
    "benchmark": "tools.bench.benchmark:PAGE",
    "peak": "tools.bench.benchmark_peak:PAGE",
    "offload": "tools.bench.benchmark_offload:PAGE",
    "offload_chunks": "tools.bench.benchmark_offload:CHUNKS_PAGE",
    "zeropp": "tools.bench.benchmark_zeropp:PAGE",
    "zeropp_blocks": "tools.bench.benchmark_zeropp:BLOCKS_PAGE",
    "compile_cost": "tools.bench.compile_cost:PAGE",
    "combine_memory": "tools.bench.measure_combine_memory:PAGE",
    "scale": "tools.bench.benchmark_scale:PAGE",
    "compile": "tools.bench.benchmark_compile:PAGE",
}


@dataclass(frozen=True)
class Page:
    """How one benchmark page is written from its raw results.

    Attributes:
        name: the file stem (``docs/benchmarks/<name>.md``, ``.json``, ``.svg``).
        title: the page's heading.
        intro: ``results -> sentences``: what was measured, and what a reader should expect.
        body: ``results -> Markdown``: the tables and notes.
        draw: ``(pyplot, results) -> figure``, or None for a page without one.
        caption: what the figure shows, one sentence.
    """

    name: str
    title: str
    intro: Callable[[Any], Sequence[str]]
    body: Callable[[Any], str]
    draw: Optional[Callable[[Any, Any], Any]] = None
    caption: str = ""


def page_of(name: str) -> Page:
    """The ``Page`` registered under ``name`` in ``PAGES``.

    Raises:
        ValueError: ``name`` is not a benchmark page.
    """
    if name not in PAGES:
        raise ValueError(f"For 'page_of', the argument 'name' must be one of {sorted(PAGES)}, but got {name!r}.")
    module, attr = PAGES[name].split(":")
    return getattr(importlib.import_module(module), attr)


def publish(page: Page, results, out_dir=None, command: Optional[Sequence[str]] = None) -> str:
    """Write ``<out_dir>/<page.name>.json`` (the stamp, taken now, of ``command``, by default this
    process's command line; and ``results``), then its figure and page (``render``). ``out_dir``
    defaults to ``docs/benchmarks``. Returns the page's path. Not collective."""
    folder = Path(DOCS if out_dir is None else out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    record = {"page": page.name, "stamp": stamp_fields(command), "results": results}
    write_text_atomic(folder / f"{page.name}.json", json.dumps(record, indent=1) + "\n")
    return render(page, record, folder)


def render(page: Page, record: dict, folder) -> str:
    """Write ``<folder>/<page.name>.svg`` (where matplotlib is installed) and ``.md`` from ``record``
    (``{"stamp", "results"}`` as ``publish`` writes it); returns the page's path."""
    folder = Path(folder)
    results, fields = record["results"], record["stamp"]
    body, figure = page.body(results), None
    plt = plots.pyplot() if page.draw is not None else None
    if plt is not None:
        plots.save_svg(page.draw(plt, results), folder / f"{page.name}.svg", fields, page.title)
        figure = (f"{page.name}.svg", page.caption)
    elif page.draw is not None:
        body = (f"*No figure: matplotlib is not installed. `python -m pip install -e \".[plot]\"`, then "
                f"`python tools/bench/pages.py {page.name}` draws it from `{page.name}.json`.*\n\n" + body)
    return write_report(page.name, page.title, body, out_dir=folder, fields=fields, intro=page.intro(results),
                        figure=figure, results_file=f"{page.name}.json")


def redraw(names: Sequence[str] = (), folder=None) -> list:
    """Render the pages ``names`` (default: every ``<name>.json`` of ``folder`` that is a page) from
    their JSON in ``folder`` (default ``docs/benchmarks``); returns the pages written.

    Raises:
        ValueError: a name is not a benchmark page. OSError: its JSON is missing.
    """
    folder = Path(DOCS if folder is None else folder)
    names = list(names) or [p.stem for p in sorted(folder.glob("*.json")) if p.stem in PAGES]
    pages = [page_of(name) for name in names]  # every name checked before any page is written
    written = []
    for page in pages:
        record = json.loads((folder / f"{page.name}.json").read_text(encoding="utf-8"))
        written.append(render(page, record, folder))
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Redraw benchmark pages (figure and page) from their raw "
                                                 "results, <name>.json, with the same stamp.")
    parser.add_argument("names", nargs="*", help=f"pages to redraw (default: every one with a JSON): {sorted(PAGES)}")
    parser.add_argument("--docs", default=str(DOCS), metavar="DIR", help="the pages' folder (default: docs/benchmarks)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in PAGES]
    if unknown:
        parser.error(f"the argument 'names' must be pages of {sorted(PAGES)}, but got {unknown}")
    for path in redraw(args.names, args.docs):
        print(f"page: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
