"""For benchmarking: the page a benchmark writes, ``docs/benchmarks/<name>.md``, stamped.

    from tools.bench.report import add_docs_flag, write_report
    write_report("peak", "Peak memory per rank", table, command=["python", "tools/bench/benchmark_peak.py"])

A page is its title, then a stamp (the command that produced it, the UTC date, the git commit,
MindSpore's and Python's versions, the machine and its 1-minute load average before the run),
then the benchmark's own Markdown. The commit and the load average are read when this module is
imported, which a benchmark does at its start: the commit is the code that ran (an edit made while
it runs does not mark the page), and every row of one run shares the machine's state, which the
load figure describes (the machine may be shared). The page is written to a temporary name and
renamed into place, so a reader never sees half a page. Imports nothing of the library or of
MindSpore (its version is read from the installed distribution).
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "benchmarks"


def load_average() -> Optional[float]:
    """The 1-minute load average from ``/proc/loadavg``, or None where there is none."""
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


LOAD_AT_START = load_average()  # read when a benchmark starts (it imports this module first)


def git_commit(repo: Path = REPO) -> str:
    """The short hash of HEAD, with "+dirty" when tracked files differ from it (the pages under
    ``docs/benchmarks/`` left out: writing one must not mark the next); "unknown" outside git."""
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=30, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no", "--", ".",
                                 ":(exclude)docs/benchmarks"], capture_output=True, text=True, timeout=30,
                                check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if status else "")


COMMIT_AT_START = git_commit()  # the code a benchmark runs: read at its start, as LOAD_AT_START


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _memory_gib() -> Optional[float]:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024 / 2 ** 30
    except (OSError, ValueError):
        pass
    return None


def machine() -> str:
    """CPU model, cores (and how many this process may use, when fewer) and memory, in one line."""
    cores = os.cpu_count() or 0
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    text = f"{_cpu_model()}, {cores} cores" + (f" ({usable} usable by this process)" if usable != cores else "")
    memory = _memory_gib()
    return text + (f", {memory:.1f} GiB memory" if memory is not None else "")


def _mindspore_version() -> str:
    try:
        return metadata.version("mindspore")
    except metadata.PackageNotFoundError:
        return "not installed"


def default_command() -> list:
    """This process's command line: ``python`` and the script, relative to the repository when inside it."""
    script = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    if script is None:
        return ["python"]
    try:
        shown = script.relative_to(REPO).as_posix()
    except ValueError:
        shown = str(script)
    return ["python", shown, *sys.argv[1:]]


def stamp(command: Sequence[str]) -> str:
    """The stamp's Markdown table: command, date, commit, versions, machine, load average."""
    load = "n/a (no /proc/loadavg)" if LOAD_AT_START is None else f"{LOAD_AT_START:.2f}"
    rows = [("command", f"`{shlex.join([str(c) for c in command])}`"),
            ("date (UTC)", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")),
            ("commit", COMMIT_AT_START),
            ("MindSpore", _mindspore_version()),
            ("Python", platform.python_version()),
            ("machine", machine()),
            ("load average (1 min) before the run", load)]
    return "\n".join(["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])


def write_report(name: str, title: str, body_md: str, command: Sequence[str] | None = None,
                 out_dir=None) -> str:
    """Write ``<out_dir>/<name>.md``: ``# title``, the stamp, then ``body_md``; atomically.

    Args:
        name: the page's file name without ``.md`` (letters, digits, ``_`` and ``-``).
        title: the page's heading.
        body_md: the benchmark's tables and notes, Markdown.
        command: the command that produced the figures (default: this process's command line).
        out_dir: the folder (default: ``docs/benchmarks`` of this checkout); created if missing.

    Returns:
        The path written, as a string.

    Raises:
        ValueError: ``name`` is empty or is not a plain file name.

    Not collective: call it on one process (rank 0 or the launcher).
    """
    if not name or not all(c.isalnum() or c in "_-" for c in name):
        raise ValueError(f"For 'write_report', the argument 'name' must be a plain file name, but got {name!r}.")
    folder = Path(DOCS if out_dir is None else out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    text = (f"# {title}\n\n"
            f"Written by the benchmark itself (`tools/bench/report.py`); rerun the command to update it.\n\n"
            f"{stamp(default_command() if command is None else command)}\n\n{body_md.strip()}\n")
    path = folder / f"{name}.md"
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return str(path)


def add_docs_flag(parser: argparse.ArgumentParser, name: str) -> None:
    """Add ``--docs DIR`` to a benchmark's parser: where its page ``<name>.md`` goes ('' for none)."""
    parser.add_argument(
        "--docs", default=str(DOCS), metavar="DIR",
        help=f"writes DIR/{name}.md (default: docs/benchmarks/{name}.md), the tables stamped with the command, "
             "UTC date, git commit, MindSpore and Python versions, machine and load average; '' writes no page")
