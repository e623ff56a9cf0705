"""The documentation site builds with ``mkdocs build --strict`` (``mkdocs.yml`` at the repository root).

Strict mode turns every warning into a failure: a link to a missing page or anchor, a page left
out of the nav, a ``::: name`` in the API reference that no longer exists, a docstring that
mkdocstrings cannot parse. Two more builds, of a copy of the site with a defect put in, show that
such defects do fail the build. Skipped only when the docs tools (the ``docs`` extra) are not
installed.
"""
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")


def _missing_tools():
    missing = []
    for name in TOOLS:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # a parent package is missing
            found = False
        if not found:
            missing.append(name)
    return missing


pytestmark = pytest.mark.skipif(
    bool(_missing_tools()),
    reason=f"the docs tools are not installed (missing {_missing_tools()}): python -m pip install -e \".[docs]\"",
)


def _build(config: Path, site: Path, cwd: Path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # mkdocs-material's banner about its successor
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _warnings(proc) -> str:
    return "\n".join(line for line in (proc.stdout + proc.stderr).splitlines() if "WARNING" in line or "ERROR" in line)


def test_site_builds_strictly_without_a_warning(docs_build):
    site, proc = docs_build
    assert proc.returncode == 0 and not _warnings(proc), proc.stdout + proc.stderr
    # use_directory_urls: false, so that the site also works opened from disk (test_docs_site_offline.py)
    for page in ("index.html", "reference/mindone_zero.html", "design.html", "changelog.html"):
        assert (site / page).is_file(), page
    # the changelog page includes CHANGELOG.md (pymdownx.snippets), not a copy of it
    assert "What changed per release" in (site / "changelog.html").read_text(encoding="utf-8")


def _copy_of_site(tmp_path: Path) -> Path:
    """The site's sources in a folder of their own, the packages linked in, to break on purpose."""
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    for name in ("mindone_zero", "parallel_modules", "CHANGELOG.md"):
        os.symlink(ROOT / name, copy / name)
    return copy


def test_broken_links_fail_the_build(tmp_path):
    copy = _copy_of_site(tmp_path)
    page = copy / "docs" / "guides" / "stages.md"
    page.write_text(page.read_text(encoding="utf-8") + "\nSee [gone](no-such-page.md) and [here](memory.md#no-such-anchor).\n",
                    encoding="utf-8")
    proc = _build(copy / "mkdocs.yml", tmp_path / "site", copy)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "no-such-page.md" in out and "no-such-anchor" in out, out


def test_an_api_name_that_no_longer_exists_fails_the_build(tmp_path):
    copy = _copy_of_site(tmp_path)
    page = copy / "docs" / "reference" / "mindone_zero.md"
    page.write_text(page.read_text(encoding="utf-8") + "\n::: mindone_zero.no_such_name\n", encoding="utf-8")
    proc = _build(copy / "mkdocs.yml", tmp_path / "site", copy)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "no_such_name" in out, out
