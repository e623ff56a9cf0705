"""Fixtures that tests of several modules share; the modules that share a session fixture are in one
xdist group (``SHARED_GROUPS`` in tests/scheduling.py, [Note: test scheduling])."""
import mindspore as ms
import pytest
from mindspore.context import ParallelMode

from test_docs_build import ROOT, _build


@pytest.fixture(scope="session")
def docs_build(tmp_path_factory):
    """The documentation site, built once per session (per xdist worker) with ``mkdocs build --strict``
    of this checkout: (the site's folder, the finished build process). Readers only: a test that
    changes the site works on a copy. test_docs_build, test_docs_site_offline and test_docs_width
    check it, each as it did with a build of its own."""
    site = tmp_path_factory.mktemp("site") / "site"
    return site, _build(ROOT / "mkdocs.yml", site, ROOT)


@pytest.fixture
def data_parallel():
    """ParallelMode.DATA_PARALLEL in this one process, reset after the test: a group of one rank, where
    the entry points do their work (stage 3 shards every candidate over one rank, stages 1-3 write the
    split info) and nothing communicates while building. Outside it a stage above 0 falls back to 0
    and nothing is modified, so a test that checks "raised before anything is modified" runs here."""
    ms.set_auto_parallel_context(parallel_mode=ParallelMode.DATA_PARALLEL)
    yield
    ms.reset_auto_parallel_context()
