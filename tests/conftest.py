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


@pytest.fixture
def pynative_mode():
    """Run the test in PYNATIVE_MODE, restoring the mode after (``pytest.mark.usefixtures("pynative_mode")``)."""
    import mindspore as ms

    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    yield
    ms.set_context(mode=mode)
