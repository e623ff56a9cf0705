"""tools/bench/report.py: the stamped page a benchmark writes (title, stamp, body), atomically."""
import argparse
import os
import platform
import re
import shlex
import subprocess
from importlib import metadata

import pytest

from tools.bench import report
from tools.bench.report import add_docs_flag, git_commit, write_report


def test_the_page_is_title_stamp_and_body(tmp_path):
    path = write_report("demo", "A demo table", "| a | b |\n|---|---|\n| 1 | 2 |\n",
                        command=["python", "tools/bench/demo.py", "--n", "2"], out_dir=tmp_path)
    assert path == str(tmp_path / "demo.md")
    text = (tmp_path / "demo.md").read_text()
    assert text.startswith("# A demo table\n")
    assert "| command | `python tools/bench/demo.py --n 2` |" in text
    assert re.search(r"\| date \(UTC\) \| \d{4}-\d{2}-\d{2} \d{2}:\d{2} \|", text)
    assert re.search(r"\| commit \| ([0-9a-f]{4,}(\+dirty)?|unknown) \|", text)
    assert f"| MindSpore | {metadata.version('mindspore')} |" in text
    assert f"| Python | {platform.python_version()} |" in text
    machine = re.search(r"\| machine \| (.+) \|", text).group(1)
    assert f"{os.cpu_count()} cores" in machine and "GiB memory" in machine
    assert re.search(r"\| load average \(1 min\) before the run \| \d+\.\d\d \|", text)
    assert text.rstrip().endswith("| 1 | 2 |")  # the body comes last, as given
    assert text.index("| command |") < text.index("| a | b |")
    # the stamp's header names its columns: a header of empty cells renders as a blank first row
    lines = text.splitlines()
    header = lines[lines.index("|---|---|") - 1]
    assert header == "| stamp | this run |" and all(cell.strip() for cell in header.strip("|").split("|"))
    assert report.CAVEAT in text and text.index(report.CAVEAT) < text.index("| stamp |")


def test_the_page_opens_with_its_sentences_then_the_figure_under_the_stamp(tmp_path):
    fields = report.stamp_fields(["python", "tools/bench/x.py"])
    path = write_report("p", "P", "| a |\n|---|\n| 1 |", out_dir=tmp_path, fields=fields,
                        intro=["What was measured.", "What to expect."], figure=("p.svg", "what it shows."),
                        results_file="p.json")
    text = open(path).read()
    assert text.startswith("# P\n\nWhat was measured. What to expect.\n\n" + report.CAVEAT)
    assert f"| date (UTC) | {fields['date']} |" in text
    figure = "[![what it shows.](p.svg)](p.svg)"
    assert text.index("| load average") < text.index(figure) < text.index("| a |")
    assert "*Figure: what it shows.* Drawn from the same run as the tables ([`p.json`](p.json))" in text
    no_figure = open(write_report("q", "Q", "body", out_dir=tmp_path, fields=fields, results_file="q.json")).read()
    assert "](q.svg)" not in no_figure and "The run's raw results: [`q.json`](q.json)." in no_figure


def test_the_stamp_fields_are_the_stamp_of_the_page_and_of_a_figure():
    fields = report.stamp_fields(["python", "tools/bench/x.py", "--n", "2"])
    assert fields["command"] == ["python", "tools/bench/x.py", "--n", "2"]
    assert report.stamp(fields) == report.stamp(dict(fields))  # a dict is rendered, not taken again
    line = report.stamp_line(fields)
    for part in ("python tools/bench/x.py --n 2", f"{fields['date']} UTC", f"commit {fields['commit']}",
                 fields["machine"]):
        assert part in line


def test_the_command_is_quoted_as_a_shell_would_read_it(tmp_path):
    command = ["python", "tools/bench/x.py", "--sweep_model", '{"d_model": 64}', "--out", "a b"]
    text = open(write_report("q", "Q", "body", command=command, out_dir=tmp_path)).read()
    shown = re.search(r"\| command \| `(.+)` \|", text).group(1)
    assert shlex.split(shown) == command


def test_the_default_command_is_this_process_relative_to_the_checkout(tmp_path, monkeypatch):
    monkeypatch.setattr("sys.argv", [str(report.REPO / "tools" / "bench" / "x.py"), "--world_sizes", "2"])
    text = open(write_report("d", "D", "body", out_dir=tmp_path)).read()
    assert "| command | `python tools/bench/x.py --world_sizes 2` |" in text


def test_a_failed_write_leaves_the_old_page_and_no_temporary_file(tmp_path, monkeypatch):
    write_report("page", "Old", "old body", command=["x"], out_dir=tmp_path)

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(report.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        write_report("page", "New", "new body", command=["x"], out_dir=tmp_path)
    assert "old body" in (tmp_path / "page.md").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["page.md"]


def test_a_rewrite_replaces_the_page_whole(tmp_path):
    write_report("page", "Old", "old body", command=["x"], out_dir=tmp_path / "new" / "folder")
    write_report("page", "New", "new body", command=["x"], out_dir=tmp_path / "new" / "folder")
    text = (tmp_path / "new" / "folder" / "page.md").read_text()
    assert text.startswith("# New\n") and "old body" not in text
    assert sorted(p.name for p in (tmp_path / "new" / "folder").iterdir()) == ["page.md"]


@pytest.mark.parametrize("name", ["", "../x", "a/b", "a.md", "a b"])
def test_a_name_that_is_not_a_plain_file_name_is_refused(name, tmp_path):
    with pytest.raises(ValueError, match=r"For 'write_report', the argument 'name' must be a plain file name"):
        write_report(name, "T", "body", out_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_dirty_is_marked_by_tracked_changes_outside_the_pages(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    git("-c", "user.email=a@b", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "x")
    (tmp_path / "docs" / "benchmarks").mkdir(parents=True)
    (tmp_path / "docs" / "benchmarks" / "p.md").write_text("1")
    (tmp_path / "f.py").write_text("1")
    git("add", "-A")
    git("-c", "user.email=a@b", "-c", "user.name=t", "commit", "-q", "-m", "y")
    assert not git_commit(tmp_path).endswith("+dirty")
    (tmp_path / "docs" / "benchmarks" / "p.md").write_text("2")  # a page rewritten by a run: still clean
    (tmp_path / "untracked.txt").write_text("x")
    assert not git_commit(tmp_path).endswith("+dirty")
    (tmp_path / "f.py").write_text("2")
    assert git_commit(tmp_path).endswith("+dirty")
    assert git_commit(tmp_path / "missing") == "unknown"


def test_the_docs_flag_says_what_it_writes():
    parser = argparse.ArgumentParser()
    add_docs_flag(parser, "peak")
    help_text = " ".join(parser.format_help().split())
    for word in ("docs/benchmarks/peak.md", "command", "date", "commit", "machine"):
        assert word in help_text
    assert parser.parse_args([]).docs == str(report.DOCS)
    assert parser.parse_args(["--docs", ""]).docs == ""
