"""The page a benchmark writes, ``docs/benchmarks/<name>.md``, stamped with its command, the UTC
date, the git commit, MindSpore's and Python's versions, the machine and its load average.

    from tools.bench.report import write_report
    write_report("compile", "Time to first step", table_md, command=sys.argv)

(A minimal version: the tools reorganisation ships the full one with this signature.)
"""
import datetime
import os
import platform
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Optional, Sequence, Union

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "benchmarks"


def _load_average() -> str:
    try:
        return " / ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


LOAD_AT_START = _load_average()  # read when a benchmark imports this module, at its start


def _commit() -> str:
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=30, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude)docs/benchmarks"], capture_output=True, text=True, timeout=30,
                               check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def stamp(command: Union[str, Sequence[str], None] = None) -> str:
    """The stamp's Markdown lines (command, date, commit, versions, machine, load average)."""
    if command is None:
        command = [Path(sys.executable).name, *sys.argv]
    if not isinstance(command, str):
        command = shlex.join(str(c) for c in command)
    cores = os.cpu_count() or 0
    return "\n".join([
        f"- Command: `{command}`",
        f"- Date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- Commit: {_commit()}",
        f"- MindSpore {_version('mindspore')}, Python {platform.python_version()}",
        f"- Machine: {platform.machine()}, {cores} cores; load average (1/5/15 min) at start {LOAD_AT_START}, "
        f"at the end {_load_average()}",
    ])


def write_report(name: str, title: str, body_md: str, command=None, out_dir=None) -> str:
    """Write ``<out_dir>/<name>.md`` (default ``docs/benchmarks/``): ``# title``, the stamp, then
    ``body_md``. Written to a temporary name and renamed into place. Returns the page's path."""
    folder = Path(out_dir) if out_dir is not None else DOCS
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.md"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(f"# {title}\n\n{stamp(command)}\n\n{body_md.rstrip()}\n", encoding="utf-8")
    os.replace(tmp, path)
    return str(path)
