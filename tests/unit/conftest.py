"""Fixtures that tests of several modules share; the modules that share one are in one xdist group
(``SHARED_GROUPS`` in tests/scheduling.py, [Note: test scheduling])."""
import pytest

from test_docs_build import ROOT, _build


@pytest.fixture(scope="session")
def docs_build(tmp_path_factory):
    """The documentation site, built once per session (per xdist worker) with ``mkdocs build --strict``
    of this checkout: (the site's folder, the finished build process). Readers only: a test that
    changes the site works on a copy. test_docs_build, test_docs_site_offline and test_docs_width
    check it, each as it did with a build of its own."""
    site = tmp_path_factory.mktemp("site") / "site"
    return site, _build(ROOT / "mkdocs.yml", site, ROOT)
