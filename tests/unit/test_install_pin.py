"""The MindSpore requirement in setup.py keeps an installed 2.10.x build, as an Ascend or GPU machine has.

``pip install -e .`` keeps an installed distribution that satisfies a requirement and replaces one that
does not (docs/guides/ascend-gpu.md, "Install"). Device builds of MindSpore are named ``mindspore`` and
carry their release's version (2.10.0, a patch release such as 2.10.1, or a build with a local label
such as 2.10.0+cu118). Two checks, both offline: the requirement's specifier against those versions,
and pip's own resolver (``pip install --dry-run --no-index --report``) with a fake installed
``mindspore`` of each version put first on ``sys.path``: nothing to install means pip keeps it.
"""
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

try:
    from packaging.requirements import Requirement
    from packaging.version import Version
except ImportError:  # pip always carries it
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
KEPT = ("2.10.0", "2.10.1", "2.10.0+cu118")  # the tested release, a patch release, a local build label
REPLACED = ("2.9.0", "2.11.0")               # another minor release: the library is not tested there


def install_requires():
    """The ``install_requires`` list literal of setup.py."""
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "install_requires":
            return [ast.literal_eval(item) for item in node.value.elts]
    raise AssertionError("setup.py has no install_requires")


def mindspore_requirement() -> str:
    found = [r for r in install_requires() if Requirement(r).name == "mindspore"]
    assert len(found) == 1, install_requires()
    return found[0]


def test_the_specifier_accepts_every_2_10_build_and_nothing_else():
    spec = Requirement(mindspore_requirement()).specifier
    assert all(spec.contains(v) for v in KEPT), (spec, KEPT)
    assert not any(spec.contains(v) for v in REPLACED + ("2.11.0rc1", "2.10.0rc1")), spec


def _pip_version():
    import pip

    return Version(pip.__version__)


def _dry_run(installed_version: str, requirement: str, tmp_path: Path):
    """pip's resolution of ``requirement`` with a ``mindspore`` of ``installed_version`` installed:
    (exit code, the report's list of what it would install, stderr)."""
    site = tmp_path / f"site-{installed_version}"
    info = site / f"mindspore-{installed_version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: mindspore\nVersion: {installed_version}\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text("")
    report = tmp_path / f"report-{installed_version}.json"
    env = dict(os.environ, PYTHONPATH=str(site), PIP_NO_INPUT="1")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--quiet",
                           "--disable-pip-version-check", "--report", str(report), requirement],
                          env=env, capture_output=True, text=True, timeout=120)
    installs = json.loads(report.read_text())["install"] if report.is_file() else None
    return proc.returncode, installs, proc.stderr


@pytest.mark.skipif(_pip_version() < Version("22.2"), reason="pip install --dry-run --report needs pip 22.2")
@pytest.mark.parametrize("version", KEPT)
def test_pip_keeps_an_installed_2_10_build(version, tmp_path):
    code, installs, err = _dry_run(version, mindspore_requirement(), tmp_path)
    assert code == 0 and installs == [], (version, installs, err)


@pytest.mark.skipif(_pip_version() < Version("22.2"), reason="pip install --dry-run --report needs pip 22.2")
def test_pip_would_replace_another_minor_release_and_an_exact_pin_a_patch_build(tmp_path):
    """The check can fail: pip wants another MindSpore (and, offline, finds none) when the installed
    one does not satisfy the requirement, as the former exact pin did for a 2.10.1 build."""
    code, _, err = _dry_run(REPLACED[1], mindspore_requirement(), tmp_path)
    assert code != 0 and "No matching distribution found for mindspore" in err, err
    code, _, err = _dry_run("2.10.1", "mindspore==2.10.0", tmp_path / "exact")
    assert code != 0 and "No matching distribution found for mindspore==2.10.0" in err, err
