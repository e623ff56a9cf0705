"""Test-session setup shared by every test: import paths, and the groups that pytest-xdist runs
side by side ([Note: test scheduling] in tests/scheduling.py)."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

# [Note: leak guard]: the guard of every test and module, and the fixture that restores MindSpore's context
from leak_guard import (leak_guard, module_leak_guard, pytest_make_collect_report,  # noqa: E402,F401
                        restore_ms_context)
from scheduling import (  # noqa: E402,F401 - after the path setup above; pytest finds the hooks here
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_unconfigure,
    pytest_xdist_make_scheduler,
)


def _in_mode(name: str):
    """Run in MindSpore's mode ``name`` ("GRAPH_MODE", "PYNATIVE_MODE"), restoring the mode after."""
    import mindspore as ms

    mode = ms.get_context("mode")
    ms.set_context(mode=getattr(ms, name))
    yield
    ms.set_context(mode=mode)


@pytest.fixture
def graph_mode():
    """Run the test in GRAPH_MODE, restoring the mode after."""
    yield from _in_mode("GRAPH_MODE")


@pytest.fixture
def pynative_mode():
    """Run the test in PYNATIVE_MODE, restoring the mode after (``pytest.mark.usefixtures("pynative_mode")``)."""
    yield from _in_mode("PYNATIVE_MODE")
