"""The suite's own scheduling ([Note: test scheduling] in tests/scheduling.py): every group runs whole
on one xdist worker, its shared jobs once, whatever pytest and xdist versions are installed."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import msrun_harness
import scheduling

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent

CONFTEST = f"""
import sys
sys.path[:0] = [{str(ROOT)!r}, {str(TESTS)!r}]
import pytest
from scheduling import (pytest_collection_modifyitems, pytest_configure, pytest_unconfigure,
                        pytest_xdist_make_scheduler)

@pytest.fixture(scope="session")
def parity_jobs(tmp_path_factory):
    with open({{log!r}}, "a") as f:
        f.write("job " + __import__("os").environ.get("PYTEST_XDIST_WORKER", "main") + "\\n")
    return lambda world: world
"""

MODULE = """
import os
import pytest

@pytest.fixture(scope="module")
def job():
    with open({log!r}, "a") as f:
        f.write("module {name} " + os.environ.get("PYTEST_XDIST_WORKER", "main") + "\\n")

@pytest.mark.parametrize("i", range(6))
def test_reads_the_module_job(job, i):
    with open({log!r}, "a") as f:
        f.write("test {name} " + os.environ.get("PYTEST_XDIST_WORKER", "main") + "\\n")

@pytest.mark.parametrize("world", [2, 4])
def test_reads_a_parity_job(parity_jobs, world):
    with open({log!r}, "a") as f:
        f.write(f"parity{{world}} " + os.environ.get("PYTEST_XDIST_WORKER", "main") + "\\n")
"""


def _run_suite(tmp_path, *args):
    log = tmp_path / "log.txt"
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST).replace("{log!r}", repr(str(log))))
    for name in "abc":
        (tmp_path / f"test_{name}.py").write_text(MODULE.format(log=str(log), name=name))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                           "--rootdir", str(tmp_path), *args, str(tmp_path)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [line.split() for line in log.read_text().splitlines()]


@pytest.mark.parametrize("args", [("-n", "2", "--dist", "loadgroup"), ("-n", "0")])
def test_each_group_runs_whole_on_one_worker(tmp_path, args):
    lines = _run_suite(tmp_path, *args)
    workers_of = {}
    for what, *rest in lines:
        key = (what, rest[0]) if what in ("module", "test") else (what,)
        workers_of.setdefault(key, []).append(rest[-1])
    for name in "abc":
        assert len(workers_of[("module", name)]) == 1, f"module {name}'s job ran {workers_of[('module', name)]}"
        assert set(workers_of[("test", name)]) == set(workers_of[("module", name)])
    # the parity tests of one world size run on one worker, and so the session job once per worker at most
    for world in (2, 4):
        assert len(set(workers_of[(f"parity{world}",)])) == 1, workers_of[(f"parity{world}",)]
    assert len(workers_of[("job",)]) == len(set(workers_of[(f"parity{w}",)][0] for w in (2, 4)))
    if args[0:2] == ("-n", "2"):
        assert {w for ws in workers_of.values() for w in ws} == {"gw0", "gw1"}  # both workers had work


def test_a_job_launched_twice_in_one_run_fails_the_second_launch(tmp_path, monkeypatch):
    monkeypatch.setattr(msrun_harness, "JOBS_DIR", tmp_path)
    out = "/tmp/pytest-of-x/pytest-3/popen-gw0/parity_N20"
    msrun_harness.claim_job("tests/dist/workers/parity_worker.py", 2, out, ["--cases", json.dumps([1])])
    msrun_harness.claim_job("tests/dist/workers/parity_worker.py", 4, out, ["--cases", json.dumps([1])])
    msrun_harness.claim_job("tests/dist/workers/parity_worker.py", 2, out, ["--cases", json.dumps([2])])
    with pytest.raises(AssertionError, match=r"parity_worker.py \(N=2.*already ran in this suite run"):
        msrun_harness.claim_job("tests/dist/workers/parity_worker.py", 2, out.replace("gw0", "gw1"),
                             ["--cases", json.dumps([1])])


def test_the_controller_refuses_a_test_no_worker_grouped(tmp_path):
    sched = scheduling.GroupScheduling.__new__(scheduling.GroupScheduling)
    sched._folder, sched._groups = tmp_path, None
    (tmp_path / "groups-gw0.json").write_text(json.dumps({"t.py::a": "t.py"}))
    assert sched._split_scope("t.py::a") == "t.py"
    with pytest.raises(RuntimeError, match="no worker wrote a group for t.py::b"):
        sched._split_scope("t.py::b")
