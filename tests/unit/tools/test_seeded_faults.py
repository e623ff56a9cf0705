"""tools/dev/seeded_faults.py: every fault still applies to the current sources (its anchor occurs
exactly once, its bug changes the file and leaves it valid Python) and names tests that exist, so the
list cannot rot unnoticed; the tool tells caught, missed and broken runs apart; and one cheap fault
runs end to end in a copy that imports itself, leaving the copy as it found it."""
import ast
import fcntl
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from tools.dev import seeded_faults
from tools.dev.seeded_faults import FAULTS, Outcome

REPO = Path(__file__).resolve().parents[3]
BY_NAME = {f.name: f for f in FAULTS}


def test_at_least_twelve_faults_each_named_once_with_a_one_line_bug():
    assert len(FAULTS) >= 12 and len(BY_NAME) == len(FAULTS)
    for f in FAULTS:
        assert re.fullmatch(r"[a-z0-9_]+", f.name) and f.bug and "\n" not in f.bug, f.name


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.name)
def test_the_anchor_occurs_once_and_the_bug_leaves_valid_python(fault):
    assert fault.file.startswith(("mindone_zero/", "parallel_modules/")), fault.file  # the library, not its tests
    text = (REPO / fault.file).read_text()
    assert text.count(fault.anchor) == 1, f"{fault.name}: the anchor occurs {text.count(fault.anchor)} times"
    faulted = fault.apply(text)
    assert faulted != text
    ast.parse(faulted, fault.file)  # a bug, not a syntax error that fails every import


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.name)
def test_the_tests_named_exist(fault):
    assert fault.tests
    for node in fault.tests:
        path, _, test = node.partition("::")
        assert path.startswith("tests/") and (REPO / path).is_file(), node
        if test:
            assert re.search(rf"^def {re.escape(test.split('[')[0])}\(", (REPO / path).read_text(), re.M), node
    assert fault.dist == any(t.startswith("tests/dist/") for t in fault.tests)


def test_a_moved_anchor_is_reported_stale_and_nothing_runs(tmp_path, monkeypatch):
    fault = replace(FAULTS[0], anchor="this text is in no file\n")
    with pytest.raises(ValueError, match=f"For fault '{fault.name}', the anchor must occur exactly once"):
        fault.apply((REPO / fault.file).read_text())
    monkeypatch.setattr(seeded_faults, "run_tests", lambda *a: pytest.fail("ran the tests of a stale fault"))
    (tmp_path / fault.file).parent.mkdir(parents=True)
    (tmp_path / fault.file).write_text((REPO / fault.file).read_text())
    assert seeded_faults.run_fault(tmp_path, fault, 60).status == "stale"


@pytest.mark.parametrize("code,failed,status", [(1, ["t.py::a"], "caught"), (0, [], "missed"),
                                                (4, [], "error"), (5, [], "error"), (-1, [], "error")])
def test_pytest_exit_codes_give_the_status(tmp_path, monkeypatch, code, failed, status):
    fault = BY_NAME["latest_checkpoint_is_incomplete"]
    (tmp_path / fault.file).parent.mkdir(parents=True)
    (tmp_path / fault.file).write_text((REPO / fault.file).read_text())
    monkeypatch.setattr(seeded_faults, "run_tests", lambda *a: (code, list(failed), "tail", 1.0))
    outcome = seeded_faults.run_fault(tmp_path, fault, 60)
    assert (outcome.status, outcome.failed) == (status, failed)
    assert (tmp_path / fault.file).read_text() == (REPO / fault.file).read_text()  # put back


def test_the_table_says_which_tests_failed():
    fault = BY_NAME["checkpoint_written_in_place"]
    text = seeded_faults.table([Outcome(fault, "caught", [f"tests/unit/x.py::t[{i}]" for i in range(5)], 3.4),
                                Outcome(BY_NAME["stage1_shards_gradients"], "missed")])
    rows = text.splitlines()
    assert rows[0] == "| fault | file | tests run | result | failed tests | s |" and len(rows) == 4
    assert "| caught | x.py::t[0]<br>x.py::t[1]<br>x.py::t[2]<br>(+2 more) | 3 |" in rows[2]
    assert "`mindone_zero/core/stage.py` | test_memory.py | missed |" in rows[3]


def test_one_fault_end_to_end_in_a_copy_that_imports_itself(tmp_path):
    fault = BY_NAME["latest_checkpoint_is_incomplete"]  # one-process tests of a few seconds
    original = (REPO / fault.file).read_text()
    scratch = seeded_faults.make_scratch(root=str(tmp_path))
    assert (scratch / fault.file).read_text() == (REPO / fault.file).read_text()
    assert not (scratch / ".git").exists()
    seeded_faults.check_imports(scratch)
    outcome = seeded_faults.run_fault(scratch, fault, 600)
    assert outcome.status == "caught", outcome.detail
    assert outcome.failed == ["tests/unit/test_checkpoint_api.py::test_latest_checkpoint_skips_incomplete_folders"]
    assert (scratch / fault.file).read_text() == original  # put back
    assert (REPO / fault.file).read_text() == original  # the checkout itself is never edited


def test_a_copy_that_would_import_another_checkout_is_refused(tmp_path):
    scratch = seeded_faults.make_scratch(root=str(tmp_path))
    shutil.rmtree(scratch / "mindone_zero")  # the tests would import whatever else is installed, or nothing
    with pytest.raises(RuntimeError, match="must import itself"):
        seeded_faults.check_imports(scratch)


def test_the_lock_is_taken_unless_this_process_or_an_ancestor_holds_it(tmp_path):
    lock = str(tmp_path / "dist.lock")
    with seeded_faults.machine_lock(True, lock):  # nobody holds it: taken at once
        assert seeded_faults.held_by_an_ancestor(lock)
    assert not seeded_faults.held_by_an_ancestor(lock)
    with open(lock, "a") as f:  # as `flock LOCK python tools/dev/seeded_faults.py` holds it for the tool
        fcntl.flock(f, fcntl.LOCK_EX)
        assert seeded_faults.held_by_an_ancestor(lock)
        with seeded_faults.machine_lock(True, lock):  # would wait for ever if it took the lock again
            pass
