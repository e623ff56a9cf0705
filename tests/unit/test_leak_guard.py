"""The leak guard ([Note: leak guard] in tests/leak_guard.py) fails the test that leaks, names what it
changed and puts it back, so that the next test finds the process as it was: a pytest run of its own
(a subprocess) over tests that leak the mode, the compile cache's variables (as
test_compile_cache_key did before issue 59), the working directory and the parallel mode, from a
test, a module-scoped fixture and a module's import."""
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

_CONFTEST = f'''
import sys
sys.path.insert(0, {str(TESTS)!r})
from leak_guard import leak_guard, module_leak_guard, pytest_make_collect_report
'''

_LEAKY = '''
import os

import mindspore as ms
import pytest
from mindspore.context import ParallelMode


def test_sets_graph_mode():
    ms.set_context(mode=ms.GRAPH_MODE)


def test_enables_the_compile_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("MS_COMPILER_CACHE_ENABLE", raising=False)  # unset: nothing for monkeypatch to undo
    os.environ["MS_COMPILER_CACHE_ENABLE"] = "1"


def test_changes_directory_and_parallel_mode(tmp_path):
    os.chdir(tmp_path)
    ms.set_auto_parallel_context(parallel_mode=ParallelMode.DATA_PARALLEL)


def test_restores_what_it_sets(monkeypatch, tmp_path):
    monkeypatch.setenv("MS_COMPILER_CACHE_ENABLE", "1")
    monkeypatch.chdir(tmp_path)


def test_finds_the_process_as_it_was():
    assert ms.get_context("mode") == ms.PYNATIVE_MODE and "MS_COMPILER_CACHE_ENABLE" not in os.environ
    assert ms.get_auto_parallel_context("parallel_mode") == "stand_alone"


@pytest.fixture(scope="module")
def graph_for_the_module():
    ms.set_context(mode=ms.GRAPH_MODE)


def test_last_with_a_module_fixture(graph_for_the_module):
    pass
'''


def test_a_leaking_test_fails_and_the_next_finds_the_process_as_it_was(tmp_path):
    files = {"conftest.py": _CONFTEST, "test_leaky.py": _LEAKY,
             "test_imported.py": "import os\nos.environ['MS_DEV_X'] = '1'\n\n\ndef test_a():\n    pass\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rE", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "--continue-on-collection-errors", "test_leaky.py", "test_imported.py"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert "6 passed, 5 errors" in out, out  # an error at the teardown of each leaking test, and one collecting
    for who, change in [("test_leaky.py::test_sets_graph_mode", "ms.get_context('mode'): 1 -> 0"),
                        ("test_leaky.py::test_enables_the_compile_cache",
                         "os.environ['MS_COMPILER_CACHE_ENABLE']: '<unset>' -> '1'"),
                        ("test_leaky.py::test_changes_directory_and_parallel_mode",
                         "ms.get_auto_parallel_context('parallel_mode'): 'stand_alone' -> 'data_parallel'"),
                        ("test_leaky.py::test_changes_directory_and_parallel_mode",
                         f"os.getcwd(): {str(tmp_path)!r} -> "),
                        ("test_leaky.py (a module-scoped fixture)", "ms.get_context('mode'): 1 -> 0"),
                        ("importing test_imported.py", "os.environ['MS_DEV_X']: '<unset>' -> '1'")]:
        assert f"\n{who} left the process changed" in out or f"\n{who} changed the process" in out, (who, out)
        assert f"\n  {change}" in out, (change, out)
    for clean in ("test_restores_what_it_sets", "test_finds_the_process_as_it_was"):
        assert f"ERROR test_leaky.py::{clean}" not in out and f"FAILED test_leaky.py::{clean}" not in out, out
