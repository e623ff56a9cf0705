"""How the suite's tests are shared between pytest-xdist's workers ([Note: test scheduling]).

tests/conftest.py takes this module's four hooks: ``pytest_configure`` and ``pytest_unconfigure``
(the folder one suite run's processes share), ``pytest_collection_modifyitems`` (the order and the
groups, in every worker and in the one process of ``-n 0``) and ``pytest_xdist_make_scheduler``
(``GroupScheduling``, in the controller). ``pytest_configure`` tells tests/msrun_harness.py
where to record the jobs it launches (``claim_job`` there).
"""
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

import msrun_harness

# [Note: test scheduling]
# setup.cfg runs the suite in two pytest-xdist workers: while one worker's msrun job sleeps
# (msrun's start-up and shutdown, a worker waiting to register with the scheduler: about 25 s a
# job, measured with /proc/self/schedstat), or waits for its slower rank, the other's job or
# one-process tests use the cores. Every test belongs to one group, which one worker runs whole,
# in order:
# * a module's tests stay together, so that its module-scoped msrun job runs once;
# * the tests that read the session's parity jobs (tests/dist/conftest.py) are grouped by the job's
#   world size, ``parity_N2`` and ``parity_N4``, so that each job runs once, in one worker; a test
#   with no ``world`` parameter names its job with ``@pytest.mark.parity_world(N)``. Small jobs fold
#   into these as case kinds (``parity_cases.job_cases``), each an msrun start-up fewer:
#   test_comm_graph.py's graphs, test_lora.py, test_gathered.py, and at N=2 test_memory_measure.py,
#   test_offload_parity.py and test_mixed_precision.py;
# * modules that share a session fixture form one group (``SHARED_GROUPS``): the docs site, and
#   tools/train.py's straight run (test_train_tool.py's, which test_compile_cache.py takes as its
#   cold run: one launch of the tool fewer);
# Groups start longest first (``HEAVY_GROUPS``, measured; the rest in collection order), so that
# the longest jobs do not end up last on one worker. ``-n 0`` runs the same order in one process.
#
# The controller does not collect, so it cannot ask a test for its group. xdist's own
# ``--dist loadgroup`` carries the group in the test's node id (it rewrites ``item._nodeid``), which
# pytest 9.2's ``Node.nodeid`` no longer reads: there every test became a group of its own and
# each session job ran once per worker, side by side. So the workers write the groups they
# computed to the run's folder (``run_dir``), and ``GroupScheduling``, which replaces the
# ``loadgroup`` scheduler, deals out those groups, whole and in order. Nothing relies on how
# pytest stores a node id. ``claim_job`` makes a job that runs twice in one suite run fail the
# test that launched it the second time.
HEAVY_GROUPS = (
    "parity_N4",
    "parity_N2",
    # (the four modules of 2026-12-03, each measured alone on the loaded machine: 320, 220, 187 and 120 s)
    "tests/dist/test_sharded_build.py",  # 320 s
    "tests/dist/test_pretrained_parity.py",  # 220 s
    "tests/dist/test_gather_units.py",
    "train_tool",  # test_compile_cache.py (its 187 s alone) and test_train_tool.py, one shared straight run
    "tests/dist/test_checkpoint_resume.py",
    "tests/dist/test_model_train.py",
    "tests/dist/test_zero3_network.py",
    "tests/dist/test_mindone_dropin.py",
    "tests/dist/test_zeropp.py",
    "tests/dist/test_export_job.py",  # 120 s
    "tests/dist/test_multinode.py",
    "tests/dist/test_profile_collectives.py",
    # the quick tier's longest groups (2026-12-05, their tests' --durations summed, nearly idle machine: about
    # 38, 28, 18, 14, 12 and 10 s)
    "tests/unit/test_offload.py",
    "tests/unit/test_mindone_compat.py",
    "tests/unit/test_docs_examples.py",
    "docs_site",
    "tests/unit/test_wheel.py",
    "tests/unit/test_gather_units_options.py",
)

# Modules that share a session fixture run in one group, so that it is made once (tests/unit/conftest.py,
# tests/dist/conftest.py).
SHARED_GROUPS = {
    # train_tool_straight: tools/train.py's straight run, also the compile cache's cold run
    "tests/dist/test_compile_cache.py": "train_tool",
    "tests/dist/test_train_tool.py": "train_tool",
    "tests/unit/test_docs_build.py": "docs_site",  # docs_build: the mkdocs site, built once
    "tests/unit/test_docs_site_offline.py": "docs_site",
    "tests/unit/test_docs_width.py": "docs_site",
}


def group_of(item) -> str:
    """The group ``item`` runs in: its parity job's (``parity_N<world>``), its shared fixture's, or its module's."""
    if "parity_jobs" in item.fixturenames:
        params = getattr(item, "callspec", None)
        world = params.params.get("world") if params is not None else None
        marker = item.get_closest_marker("parity_world")
        if world is None and marker is not None:
            world = marker.args[0]
        if world is None:
            raise pytest.UsageError(f"{item.nodeid} reads parity_jobs but says no world size: give it a 'world' "
                                    f"parameter or @pytest.mark.parity_world(N) ([Note: test scheduling]).")
        return f"parity_N{world}"
    path = item.nodeid.split("::")[0]  # the module, relative to the root folder
    return SHARED_GROUPS.get(path, path)


def order_items(items) -> dict:
    """Sort ``items`` in place, group by group, longest groups first; returns {node id: group}."""
    groups = {item.nodeid: group_of(item) for item in items}
    first_seen = {}
    for g in groups.values():
        first_seen.setdefault(g, len(first_seen))

    def rank(group):
        return (HEAVY_GROUPS.index(group), 0) if group in HEAVY_GROUPS else (len(HEAVY_GROUPS), first_seen[group])

    order = sorted(range(len(items)), key=lambda i: (rank(groups[items[i].nodeid]), i))
    items[:] = [items[i] for i in order]
    return groups


def run_dir(config) -> Path:
    """The folder that every process of this suite run shares (the controller's and its workers'),
    named by xdist's test-run id, which the controller sets (``start_run``) and its workers receive."""
    uid = config.workerinput["testrunuid"] if hasattr(config, "workerinput") else config.option.testrunuid
    return Path(tempfile.gettempdir()) / f"mindone_zero-tests-{uid}"


def pytest_configure(config):
    """The controller (or the one process of ``-n 0``) gives the run an id and makes its folder."""
    if not hasattr(config, "workerinput"):
        if getattr(config.option, "testrunuid", None) is None:
            config.option.testrunuid = os.urandom(8).hex()
        (run_dir(config) / "jobs").mkdir(parents=True, exist_ok=True)
    msrun_harness.JOBS_DIR = run_dir(config) / "jobs"


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):
        shutil.rmtree(run_dir(config), ignore_errors=True)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Order the tests group by group, longest groups first; a worker writes its {node id: group}
    for the controller's ``GroupScheduling``."""
    groups = order_items(items)
    if hasattr(config, "workerinput"):
        path = run_dir(config) / f"groups-{config.workerinput['workerid']}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        os.replace(tmp, path)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` deals out the groups the workers computed."""
    return GroupScheduling(config, log) if config.getvalue("dist") == "loadgroup" else None


class GroupScheduling(LoadScopeScheduling):
    """xdist's scope scheduling over the groups the workers computed: each group goes whole to one
    worker, groups in collection order ([Note: test scheduling])."""

    def __init__(self, config, log=None):
        super().__init__(config, log)
        config.option.loadscopereorder = False  # keep the order ``order_items`` chose
        self._folder = run_dir(config)
        self._groups = None

    def _split_scope(self, nodeid: str) -> str:
        if self._groups is None:
            self._groups = {}
            for path in sorted(self._folder.glob("groups-*.json")):
                for test, group in json.loads(path.read_text()).items():
                    if self._groups.setdefault(test, group) != group:
                        raise RuntimeError(f"the workers put {test} in different groups ([Note: test scheduling])")
        if nodeid not in self._groups:
            raise RuntimeError(f"no worker wrote a group for {nodeid} in {self._folder} ([Note: test scheduling])")
        return self._groups[nodeid]
