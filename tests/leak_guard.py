"""A test leaves the process as it found it: the guard that fails the test that leaked
([Note: leak guard]). tests/conftest.py imports these fixtures and hooks.

[Note: leak guard]
pytest-xdist deals the test groups to its workers by timing ([Note: test scheduling]), so whatever
one test leaves behind in its process reaches tests that differ from run to run: a mode set to
GRAPH_MODE, ``MS_COMPILER_CACHE_*`` inherited by every later msrun job (which then loads the k-th
cached graph blindly, [Note: compile cache] in tools/compile_cache.py). The guard snapshots this
process's global state before every test and every module and compares after it: the environment
(all of it), the working directory, the MindSpore context keys tests set (``CONTEXT_KEYS``) and the
auto-parallel context (``AUTO_PARALLEL_KEYS``). A difference fails the test (at its teardown, after
its own fixtures and ``monkeypatch`` have undone what they set), or the module's last test for a
module-scoped fixture, with a message naming each change; the guard then puts the state back, so
that one leak fails one test. A module that changes the state while it is imported (collected)
fails its collection. What a test sets, it restores: ``monkeypatch`` for the environment and the
working directory, a fixture for MindSpore's context (``pynative_mode`` in tests/conftest.py,
``restore_ms_context`` for a test that sets the mode it needs itself).
"""
import os

import mindspore as ms  # imported here, before any test: the import itself sets a few variables
import pytest

__all__ = ["leak_guard", "module_leak_guard", "restore_ms_context", "pytest_make_collect_report", "snapshot",
           "changes"]

# pytest's own, rewritten at every phase of every test
_VOLATILE_ENV = frozenset({"PYTEST_CURRENT_TEST"})
CONTEXT_KEYS = ("mode", "device_target", "device_id", "save_graphs", "save_graphs_path", "jit_config", "jit_level",
                "enable_compile_cache", "compile_cache_path", "deterministic", "max_call_depth",
                "pynative_synchronize", "debug_level", "memory_optimize_level")
_PATH_KEYS = ("save_graphs_path", "compile_cache_path")
AUTO_PARALLEL_KEYS = ("parallel_mode", "gradients_mean", "device_num", "global_rank", "full_batch",
                      "enable_parallel_optimizer", "parameter_broadcast", "comm_fusion", "grad_accumulation_step",
                      "all_reduce_fusion_config", "pipeline_stages", "dataset_strategy", "search_mode")


def snapshot() -> dict:
    """This process's global state that a test may change: ``{(kind, name): value}``."""
    state = {("os.environ", k): v for k, v in os.environ.items() if k not in _VOLATILE_ENV}
    state[("os.getcwd", "")] = os.getcwd()
    state.update({("ms.get_context", k): ms.get_context(k) for k in CONTEXT_KEYS})
    state.update({("ms.get_auto_parallel_context", k): ms.get_auto_parallel_context(k) for k in AUTO_PARALLEL_KEYS})
    return state


def _same(key: tuple, old, new, cwd: str) -> bool:
    if key[0] == "ms.get_context" and key[1] in _PATH_KEYS and old and new:
        # MindSpore keeps the real path of what it is given: the default "." reads back as the cwd once set
        return os.path.realpath(os.path.join(cwd, old)) == os.path.realpath(os.path.join(cwd, new))
    return old == new


def changes(before: dict, after: dict) -> list:
    """One line per entry that differs, ``what: before -> after`` (``<unset>`` where absent)."""
    lines, cwd = [], before[("os.getcwd", "")]
    for kind, name in sorted(before.keys() | after.keys()):
        old, new = before.get((kind, name), "<unset>"), after.get((kind, name), "<unset>")
        if not _same((kind, name), old, new, cwd):
            what = f"{kind}[{name!r}]" if kind == "os.environ" else f"{kind}({repr(name) if name else ''})"
            lines.append(f"{what}: {old!r} -> {new!r}")
    return lines


def _restore_context(before: dict) -> None:
    """Put back MindSpore's context keys (``CONTEXT_KEYS``) of ``before`` (a ``snapshot``)."""
    for key in CONTEXT_KEYS:
        value = before[("ms.get_context", key)]
        if not _same(("ms.get_context", key), value, ms.get_context(key), before[("os.getcwd", "")]):
            ms.set_context(**{key: value})


def _restore(before: dict) -> None:
    """Put back the state of ``before`` (a ``snapshot``), so that a leak fails only its own test."""
    env = {name: value for (kind, name), value in before.items() if kind == "os.environ"}
    for name in [n for n in os.environ if n not in env and n not in _VOLATILE_ENV]:
        del os.environ[name]
    os.environ.update(env)
    os.chdir(before[("os.getcwd", "")])
    _restore_context(before)
    auto = {k: before[("ms.get_auto_parallel_context", k)] for k in AUTO_PARALLEL_KEYS}
    if any(ms.get_auto_parallel_context(k) != v for k, v in auto.items()):
        ms.reset_auto_parallel_context()
        for key, value in auto.items():
            if ms.get_auto_parallel_context(key) != value:
                ms.set_auto_parallel_context(**{key: value})


def _check(before: dict, who: str) -> None:
    lines = changes(before, snapshot())
    if lines:
        try:
            _restore(before)
        finally:
            pytest.fail(f"{who} left the process changed ([Note: leak guard] in tests/leak_guard.py); restore what "
                        f"it sets (monkeypatch, or a fixture that yields and restores):\n  " + "\n  ".join(lines),
                        pytrace=False)


@pytest.fixture(autouse=True)
def leak_guard(request):
    """Fail the test if it leaves the environment, the working directory or MindSpore's context
    changed ([Note: leak guard])."""
    before = snapshot()
    yield
    _check(before, request.node.nodeid)


@pytest.fixture(scope="module", autouse=True)
def module_leak_guard(request):
    """The same for the module's own module-scoped fixtures (reported at its last test's teardown)."""
    before = snapshot()
    yield
    _check(before, f"{request.node.nodeid} (a module-scoped fixture)")


@pytest.fixture
def restore_ms_context():
    """For tests that set MindSpore's context themselves (the mode they need, ``save_graphs``): put the
    keys of ``CONTEXT_KEYS`` back after the test (``pytest.mark.usefixtures("restore_ms_context")``)."""
    before = snapshot()
    yield
    _restore_context(before)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """Fail the collection of a module whose import changes the state ([Note: leak guard])."""
    if not isinstance(collector, pytest.Module):
        yield
        return
    before = snapshot()
    outcome = yield
    lines = changes(before, snapshot())
    if lines:
        _restore(before)
        report = outcome.get_result()
        report.outcome = "failed"
        report.longrepr = (f"importing {collector.nodeid} changed the process ([Note: leak guard] in "
                           f"tests/leak_guard.py); set it in a fixture that restores it:\n  " + "\n  ".join(lines))
