"""The wheel, as a user installs it: built from a copy of the sources, installed into a folder of its
own, then imported and run by a fresh interpreter that sees that folder and not the checkout.

The editable install the other tests use finds every module in the checkout, so a package that
``setup.py`` leaves out (issue 21: ``mindone_zero.offload``) goes unnoticed there. Its import hook
(a ``.pth`` file in site-packages) would even fill such a gap for the installed package, so the
fresh interpreter runs with ``-S`` and gets site-packages (MindSpore, numpy) through PYTHONPATH,
after the install folder, without running any ``.pth`` file.
"""
import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest

from msrun_harness import REPO as ROOT
from mindone_zero.checkpoint import atomic_save_checkpoint, write_split_info
from mindone_zero.core.partition import ShardSpec, split_all

pytestmark = pytest.mark.packaging

TOP_PACKAGES = ("mindone_zero", "parallel_modules")
COMMANDS = ("mindone-zero-convert", "mindone-zero-estimate-memory")
N = 2
TENSORS = {  # name: (full array, split along dim 0); 7 rows: padded at N=2
    "dense.weight": (np.arange(21, dtype=np.float32).reshape(7, 3) - 4.5, True),
    "adam_m.dense.weight": (np.linspace(-1, 1, 21, dtype=np.float32).reshape(7, 3), True),
    "embed.embedding_table": (np.arange(40, dtype=np.float32).reshape(10, 4) / 7, True),
    "norm.gamma": (np.full(5, 1.25, np.float32), False),
    "global_step": (np.array(9, np.int32), False),
}
# Run by the installed interpreter: import every module the wheel holds, report where they came from.
IMPORT_ALL = """
import importlib, json, pkgutil, sys
found = {}
for top in %r:
    package = importlib.import_module(top)
    found[top] = package.__file__
    for info in pkgutil.walk_packages(package.__path__, top + "."):
        found[info.name] = importlib.import_module(info.name).__file__
print(json.dumps({"modules": found, "path": sys.path}))
""" % (TOP_PACKAGES,)


def _source_modules():
    """Dotted names of every module (and package) under the checkout's top-level packages."""
    names = set()
    for top in TOP_PACKAGES:
        for path in (ROOT / top).rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _pip(*args, cwd):
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    res = subprocess.run([sys.executable, "-m", "pip", *args], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr


def _installed_env(target):
    """Environment of a fresh ``python -S`` that sees ``target``, then site-packages, not the checkout."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([str(target), *site.getsitepackages()])
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(target folder, work folder): the wheel of a copy of the sources, installed with ``--target``."""
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    src.mkdir()
    for name in ("setup.py", "setup.cfg", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for top in TOP_PACKAGES:  # a copy, so that the build leaves no build/ or egg-info in the checkout
        shutil.copytree(ROOT / top, src / top, ignore=shutil.ignore_patterns("__pycache__"))
    _pip("wheel", ".", "--no-deps", "--no-build-isolation", "-w", str(base / "wheels"), cwd=src)
    wheels = list((base / "wheels").glob("mindone_zero-*.whl"))
    assert len(wheels) == 1, wheels
    target = base / "installed"
    _pip("install", "--no-deps", "--target", str(target), str(wheels[0]), cwd=base)
    work = base / "work"
    work.mkdir()
    return target, work


def _run(args, target, work):
    """Run ``python -S *args`` from ``work`` with only the install folder and site-packages on the path."""
    return subprocess.run([sys.executable, "-S", *args], cwd=work, env=_installed_env(target), capture_output=True,
                          text=True, timeout=180)


def _command(target, name):
    """The console script pip wrote (run through ``python -S``, as its shebang would run it minus site)."""
    script = target / "bin" / name
    assert script.is_file() and os.access(script, os.X_OK), script
    return str(script)


def test_installed_wheel_imports_every_module_from_the_install(installed):
    target, work = installed
    res = _run(["-c", IMPORT_ALL], target, work)
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout.strip().splitlines()[-1])
    assert str(ROOT) not in [os.path.abspath(p or work) for p in report["path"]]
    modules = report["modules"]
    assert set(modules) == _source_modules()
    assert "mindone_zero.offload" in modules and "mindone_zero.checkpoint" in modules
    for name, file in modules.items():
        assert Path(file).resolve().is_relative_to(target.resolve()), (name, file)


@pytest.mark.parametrize("command", COMMANDS)
def test_console_commands_print_help(installed, command):
    target, work = installed
    res = _run([_command(target, command), "--help"], target, work)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"usage: {command} ")


def _write_tiny_group(folder):
    """Per-rank checkpoints and split-info JSONs of ``TENSORS`` over ``N`` ranks."""
    for r in range(N):
        blocks = {k: split_all(a, N)[r] if split else a for k, (a, split) in TENSORS.items()}
        atomic_save_checkpoint(blocks, str(folder / f"net_{r}.ckpt"))
        write_split_info([ShardSpec(k, a.shape, N, r, split) for k, (a, split) in TENSORS.items()], str(folder), r)
    return str(folder / "net_{}.ckpt"), str(folder / "params_split_info_{}.json")


def test_installed_convert_command_combines_exactly(installed, tmp_path):
    target, work = installed
    src, info = _write_tiny_group(tmp_path)
    padded = ms.load_checkpoint(src.format(1))["dense.weight"].asnumpy()
    assert padded.shape == (4, 3)  # rank 1's block holds the padding row that the combine drops
    res = _run([_command(target, "mindone-zero-convert"), "--src_checkpoint", src,
                "--src_param_split_info_json", info, "--group_size", str(N), "--quiet"], target, work)
    assert res.returncode == 0, res.stderr
    out = tmp_path / f"net_all_{N}.ckpt"
    assert res.stdout.strip() == str(out)
    combined = ms.load_checkpoint(str(out))
    assert sorted(combined) == sorted(TENSORS)
    for name, (full, _) in TENSORS.items():
        value = combined[name].asnumpy()
        assert value.dtype == full.dtype and value.shape == full.shape, name
        assert np.array_equal(value, full), name
