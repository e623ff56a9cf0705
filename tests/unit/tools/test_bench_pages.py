"""tools/bench/pages.py and plots.py: a benchmark's page, figure and raw results come from one
source and one stamp; a page redrawn from its JSON is the page the run wrote; the committed pages
are what their JSON gives.

The figures need matplotlib, which the ``test`` extra installs (as the ``plot`` extra does): a
benchmark runs and writes its tables without it, and its page then says how to draw the figure.
"""
import json
import re
from pathlib import Path

import pytest

from tools.bench import pages, plots, report
from tools.bench.pages import PAGES, Page, page_of, publish, redraw

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs" / "benchmarks"


def _intro(results):
    return [f"Measured {len(results['values'])} values.", "Expect them to rise."]


def _body(results):
    return "| x | y |\n|---:|---:|\n" + "\n".join(f"| {i} | {v} |" for i, v in enumerate(results["values"]))


def _draw(plt, results):
    fig, ax = plt.subplots(figsize=plots.size(1, 2.0))
    plots.lines(ax, list(range(1, len(results["values"]) + 1)), {"y": results["values"]}, "x", "y")
    return fig


DEMO = Page("demo", "A demo page", _intro, _body, _draw, "y against x.")


def test_publish_writes_results_figure_and_page_from_one_stamp(tmp_path, monkeypatch):
    monkeypatch.setitem(PAGES, "demo", f"{__name__}:DEMO")
    path = publish(DEMO, {"values": [1, 2, 4]}, out_dir=tmp_path, command=["python", "tools/bench/demo.py"])
    assert path == str(tmp_path / "demo.md")
    record = json.loads((tmp_path / "demo.json").read_text())
    assert record["page"] == "demo" and record["results"] == {"values": [1, 2, 4]}
    stamp = record["stamp"]
    text = (tmp_path / "demo.md").read_text()
    assert text.startswith("# A demo page\n\nMeasured 3 values. Expect them to rise.\n\n" + report.CAVEAT)
    assert f"| date (UTC) | {stamp['date']} |" in text and f"| commit | {stamp['commit']} |" in text
    assert "[![y against x.](demo.svg)](demo.svg)" in text and "([`demo.json`](demo.json))" in text
    assert text.rstrip().endswith("| 2 | 4 |")
    svg = (tmp_path / "demo.svg").read_text()
    assert svg.startswith("<?xml") and report.stamp_line(stamp).split("  |  ")[0] in svg  # the stamp, in its text
    assert "<dc:date>" not in svg  # no date of drawing: the same results draw the same file
    # redrawn from the JSON: the same stamp and the same files, however long after the run
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    stamp["date"] = "2000-01-01 00:00"
    (tmp_path / "demo.json").write_text(json.dumps(record))
    assert redraw(["demo"], tmp_path) == [str(tmp_path / "demo.md")]
    assert "| date (UTC) | 2000-01-01 00:00 |" in (tmp_path / "demo.md").read_text()
    stamp["date"] = json.loads(before["demo.json"])["stamp"]["date"]
    (tmp_path / "demo.json").write_bytes(before["demo.json"])
    redraw(["demo"], tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_without_matplotlib_the_page_has_its_tables_and_says_how_to_draw_the_figure(tmp_path, monkeypatch):
    monkeypatch.setattr(plots, "pyplot", lambda: None)
    publish(DEMO, {"values": [3]}, out_dir=tmp_path, command=["x"])
    text = (tmp_path / "demo.md").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.json", "demo.md"]
    assert "No figure: matplotlib is not installed" in text and "python tools/bench/pages.py demo" in text
    assert "| 0 | 3 |" in text and "](demo.svg)" not in text


def test_unknown_pages_are_refused_before_any_page_is_written(tmp_path, capsys):
    (tmp_path / "peak.json").write_text("{}")
    with pytest.raises(ValueError, match=r"For 'page_of', the argument 'name' must be one of \[.*\], but got 'nope'"):
        redraw(["peak", "nope"], tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["peak.json"]
    with pytest.raises(SystemExit) as err:
        pages.main(["nope", "--docs", str(tmp_path)])
    assert err.value.code == 2 and "must be pages of" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(PAGES))
def test_every_registered_page_names_itself(name):
    page = page_of(name)
    assert page.name == name and page.title and page.draw is not None and page.caption


def test_every_benchmark_page_is_what_its_results_give(tmp_path):
    """The committed pages are written by the benchmarks: each page under docs/benchmarks/ (but the
    index) has its raw results beside it, and rendering them again gives the page byte for byte,
    with its figure (the figure's bytes are left out: another matplotlib draws other bytes)."""
    names = sorted(p.stem for p in DOCS.glob("*.md") if p.stem != "index")
    assert names == sorted(PAGES)
    for name in names:
        assert (DOCS / f"{name}.json").is_file(), f"docs/benchmarks/{name}.md has no raw results beside it"
    written = redraw(names, _copy(tmp_path))
    for path in map(Path, written):
        assert path.read_text(encoding="utf-8") == (DOCS / path.name).read_text(encoding="utf-8"), (
            f"docs/benchmarks/{path.name} is not what {path.stem}.json gives: rerun its benchmark, or "
            f"`python tools/bench/pages.py {path.stem}` after changing its page writer")
        assert (DOCS / f"{path.stem}.svg").is_file()
        stamp = json.loads((DOCS / f"{path.stem}.json").read_text())["stamp"]
        assert f"commit {stamp['commit']}" in (DOCS / f"{path.stem}.svg").read_text(encoding="utf-8")


def _copy(tmp_path):
    folder = tmp_path / "benchmarks"
    folder.mkdir()
    for p in DOCS.glob("*.json"):
        (folder / p.name).write_bytes(p.read_bytes())
    return folder


def test_bars_and_lines_draw_what_they_are_given():
    plt = plots.pyplot()
    fig, (a, b) = plt.subplots(1, 2, sharey=True)
    plots.hbars(a, ["one", "two"], {"p": [1, None], "q": [2, 3]}, "x", stacked=True)
    plots.hbars(b, ["one", "two"], {"r": [4, 5]}, "x")
    assert a.yaxis_inverted()  # the first label on top, once for axes sharing y
    widths = sorted(round(p.get_width(), 3) for p in a.patches)
    assert widths == [0.0, 1.0, 2.0, 3.0]
    lefts = sorted(round(p.get_x(), 3) for p in a.patches)
    assert lefts == [0.0, 0.0, 0.0, 1.0]  # q stacked on p (None draws nothing: 0)
    plt.close(fig)
    assert re.fullmatch(r"\(9\.0, 3\.[0-9]+\)", str(plots.size(1, 3.0)))
