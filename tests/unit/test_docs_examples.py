"""The code in the documentation (docs/**/*.md and README.md) runs, or names the test that runs it.

A Python example is marked by an HTML comment on the line before its fence (not shown on the site):

* ``<!-- runnable -->``: a one-process example, complete as written. Each one runs here in a fresh
  Python process, in an empty folder, with the repository on ``PYTHONPATH``, and must exit with 0
  within the timeout (its own ``assert`` lines are its checks).
* ``<!-- example: tests/dist/test_model_train.py -->``: a multi-process example or a fragment (or
  a shell command); the test file it names (which must exist) runs the same calls.

Every ``python`` block carries one of the two. Also checked: the paths of tests and library files
the pages name exist (a tool in ``tools/`` is found by its file name in any folder below it, as
tools move between ``tools/``, ``tools/bench/`` and ``tools/dev/``), and the README's relative
links point at files, and at headings, that exist.
"""
import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
FENCE = re.compile(r"^(`{3,})(\S*)")
MARKER = re.compile(r"^<!--\s*(runnable|example:\s*(\S+))\s*-->\s*$")
TIMEOUT_S = 300


def code_blocks(page: Path):
    """``(line, info, marker, code)`` of each fenced block of ``page``; marker is the comment before it."""
    lines, blocks, i = page.read_text(encoding="utf-8").splitlines(), [], 0
    while i < len(lines):
        fence = FENCE.match(lines[i].strip())
        if not fence:
            i += 1
            continue
        start, ticks, info = i, fence.group(1), fence.group(2)
        i += 1
        while i < len(lines) and lines[i].strip() != ticks:
            i += 1
        before = next((lines[k].strip() for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        marker = MARKER.match(before)
        blocks.append((start + 1, info, marker, "\n".join(lines[start + 1:i]) + "\n"))
        i += 1
    return blocks


def _where(page: Path, line: int) -> str:
    return f"{page.relative_to(ROOT).as_posix()}:{line}"


RUNNABLE = [pytest.param(code, id=_where(page, line))
            for page in PAGES for line, info, marker, code in code_blocks(page)
            if marker is not None and marker.group(1) == "runnable"]


def test_there_are_runnable_examples():
    assert len(RUNNABLE) >= 3, [p.id for p in RUNNABLE]


@pytest.mark.parametrize("code", RUNNABLE)
def test_runnable_example_runs(code, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"


def test_every_python_example_is_runnable_or_names_its_test():
    unmarked, missing = [], []
    for page in PAGES:
        for line, info, marker, _ in code_blocks(page):
            if marker is None and info == "python":
                unmarked.append(_where(page, line))
            elif marker is not None and marker.group(2) and not (ROOT / marker.group(2)).is_file():
                missing.append(f"{_where(page, line)}: {marker.group(2)}")
    assert not unmarked, ("python examples without '<!-- runnable -->' or '<!-- example: tests/... -->' "
                          f"on the line before: {unmarked}")
    assert not missing, f"examples name tests that do not exist: {missing}"


def test_every_marker_precedes_a_code_block():
    """A marker stands on the line before a fence; ``runnable`` only before a ``python`` one."""
    stray = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8").splitlines()
        blocks = {line: (info, marker) for line, info, marker, _ in code_blocks(page)}
        for k, raw in enumerate(text):
            marker = MARKER.match(raw.strip())
            if not marker:
                continue
            after = next((j + 1 for j in range(k + 1, len(text)) if text[j].strip()), None)
            info = blocks.get(after, (None,))[0]
            if info is None or (marker.group(1) == "runnable" and info != "python"):
                stray.append(_where(page, k + 1))
    assert not stray, f"markers not followed by a code block (a ```python one for 'runnable'): {stray}"


PATH = re.compile(r"`((?:tests|mindone_zero|parallel_modules|configs|tools)/[\w./-]+\.(?:py|yaml))`")


def test_named_files_exist():
    tools = {p.name for p in (ROOT / "tools").rglob("*.py")}
    missing = []
    for page in PAGES:
        for path in PATH.findall(page.read_text(encoding="utf-8")):
            found = Path(path).name in tools if path.startswith("tools/") else (ROOT / path).is_file()
            if not found:
                missing.append(f"{page.relative_to(ROOT).as_posix()}: {path}")
    assert not missing, f"pages name files that do not exist: {missing}"


def _slug(heading: str) -> str:
    """Python-Markdown's toc slug (mkdocs' default) of a heading's text (backticks drop out with the
    other punctuation)."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(page: Path):
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*$", page.read_text(encoding="utf-8"), re.M)}


def test_readme_links_point_at_files_and_headings():
    broken = []
    for target, anchor in re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)", (ROOT / "README.md").read_text(encoding="utf-8")):
        if re.match(r"[a-z]+://", target):
            continue
        path = ROOT / target
        if not path.exists():
            broken.append(target)
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{target}#{anchor}")
    assert not broken, f"README.md links to missing files or headings: {broken}"
