"""For benchmarking: the page a benchmark writes, ``docs/benchmarks/<name>.md``, stamped.

    from tools.bench.report import add_docs_flag, write_report
    write_report("peak", "Peak memory per rank", table, command=["python", "tools/bench/benchmark_peak.py"])

A page is its title, its opening sentences (what was measured, what to expect) and a caveat that
these are CPU figures, then a stamp (the command that produced it, the UTC date, the git commit,
MindSpore's and Python's versions, the machine and its 1-minute load average before the run), its
figure, then the benchmark's own Markdown. ``tools/bench/pages.py`` writes a page, its figure and its
raw results from one stamp (``stamp_fields``). The commit and the load average are read when this module is
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


def stamp_fields(command: Sequence[str] | None = None) -> dict:
    """The stamp of a run, as a JSON-able dict: ``command`` (a list), ``date`` (UTC, to the minute),
    ``commit``, ``mindspore``, ``python``, ``machine`` and ``load`` (None where unknown). Taken once
    per run, so that its page, its figure and its raw results carry the same stamp."""
    return {"command": [str(c) for c in (default_command() if command is None else command)],
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            "commit": COMMIT_AT_START, "mindspore": _mindspore_version(), "python": platform.python_version(),
            "machine": machine(), "load": LOAD_AT_START}


def stamp(command_or_fields) -> str:
    """The stamp's Markdown table (command, date, commit, versions, machine, load average) of
    ``stamp_fields`` or of a command (whose fields are taken now). Its header names its columns:
    a header of empty cells renders as a blank first row."""
    fields = command_or_fields if isinstance(command_or_fields, dict) else stamp_fields(command_or_fields)
    load = "n/a (no /proc/loadavg)" if fields["load"] is None else f"{fields['load']:.2f}"
    rows = [("command", f"`{shlex.join(fields['command'])}`"),
            ("date (UTC)", fields["date"]),
            ("commit", fields["commit"]),
            ("MindSpore", fields["mindspore"]),
            ("Python", fields["python"]),
            ("machine", fields["machine"]),
            ("load average (1 min) before the run", load)]
    return "\n".join(["| stamp | this run |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])


def stamp_line(fields: dict) -> str:
    """The stamp in one line, for a figure: command, date, commit and machine."""
    return (f"{shlex.join(fields['command'])}  |  {fields['date']} UTC  |  commit {fields['commit']}  |  "
            f"{fields['machine']}")


CAVEAT = ("These are CPU figures, from models much smaller than those trained on Ascend or GPU, on a shared "
          "machine: read their shapes and ratios, not a device's performance.")


def write_atomic(path, write) -> str:
    """Call ``write(tmp)`` to write a temporary file beside ``path``, then rename it into place: a
    reader never sees half a file, and a failed write leaves the old one. Returns the path as a
    string."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # as a checked-out file (mkstemp makes it private)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return str(path)


def write_text_atomic(path, text: str) -> str:
    """Write ``text`` to ``path`` atomically (``write_atomic``); returns the path as a string."""
    return write_atomic(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def write_report(name: str, title: str, body_md: str, command: Sequence[str] | None = None,
                 out_dir=None, *, fields: dict | None = None, intro: Sequence[str] = (),
                 figure: tuple | None = None, results_file: str | None = None) -> str:
    """Write ``<out_dir>/<name>.md``: ``# title``, the ``intro`` sentences and the caveat (CPU
    figures), the stamp, the figure, then ``body_md``; atomically.

    Args:
        name: the page's file name without ``.md`` (letters, digits, ``_`` and ``-``).
        title: the page's heading.
        body_md: the benchmark's tables and notes, Markdown.
        command: the command that produced the figures (default: this process's command line);
            ignored when ``fields`` is given.
        out_dir: the folder (default: ``docs/benchmarks`` of this checkout); created if missing.
        fields: the run's ``stamp_fields`` (default: taken now, of ``command``).
        intro: the sentences the page opens with: what was measured, what to expect.
        figure: ``(file name beside the page, caption)`` of the image the page embeds, or None.
        results_file: the file beside the page holding the run's raw results, linked from it.

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
    fields = fields if fields is not None else stamp_fields(command)
    opening = " ".join(s.strip() for s in intro if s.strip())
    written = ("Written by the benchmark itself (`tools/bench/report.py`); rerun the command to update it."
               if not results_file else
               f"Written by the benchmark itself (`tools/bench/pages.py`): rerun the command to measure again, or "
               f"`python tools/bench/pages.py {name}` to draw the page again from its results.")
    parts = [f"# {title}", (opening + "\n\n" if opening else "") + CAVEAT, written, stamp(fields)]
    raw = f"[`{results_file}`]({results_file})" if results_file else ""
    if figure is not None:
        image, caption = figure
        parts.append(f"[![{caption}]({image})]({image})\n\n*Figure: {caption}* Drawn from the same run as the "
                     f"tables{' (' + raw + ')' if raw else ''}; its last line is the stamp.")
    elif raw:
        parts.append(f"The run's raw results: {raw}.")
    parts.append(body_md.strip())
    return write_text_atomic(folder / f"{name}.md", "\n\n".join(parts) + "\n")


def add_docs_flag(parser: argparse.ArgumentParser, name: str) -> None:
    """Add ``--docs DIR`` to a benchmark's parser: where its page ``<name>.md`` goes ('' for none)."""
    parser.add_argument(
        "--docs", default=str(DOCS), metavar="DIR",
        help=f"writes DIR/{name}.md (default: docs/benchmarks/{name}.md), the tables stamped with the command, "
             "UTC date, git commit, MindSpore and Python versions, machine and load average; '' writes no page")
