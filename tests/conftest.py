"""Test-session setup shared by every test: import paths, and the groups that pytest-xdist runs
side by side ([Note: test scheduling])."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

# [Note: test scheduling]
# setup.cfg runs the suite in two pytest-xdist workers (``-n 2 --dist loadgroup``): while one
# worker's msrun job sleeps (msrun's start-up and shutdown, a worker waiting to register with the
# scheduler: about 25 s a job, measured with /proc/self/schedstat), or waits for its slower rank,
# the other's job or one-process tests use the cores. Every test belongs to one group, which one
# worker runs whole, in order:
# * a module's tests stay together, so that its module-scoped msrun job runs once;
# * the tests that read the session's parity jobs (tests/dist/conftest.py) are grouped by the job's
#   world size, ``parity_N2`` and ``parity_N4``, so that each job runs once, in one worker; a test
#   with no ``world`` parameter names its job with ``@pytest.mark.parity_world(N)``.
# Groups start longest first (HEAVY_GROUPS, measured; the rest in collection order), so that the
# longest jobs do not end up last on one worker. ``--no-loadscope-reorder`` keeps this order.
# With ``-n 0`` the same order runs in one process. Measured on 2 cores (README, "Quick start"): the
# whole suite 17 min 57 s with two workers (33.6 CPU-minutes); the jobs are bound by CPU work, so side
# by side they slow each other, and the gain comes from the shorter jobs' start-up and the
# one-process tests filling the gaps.
#
# Where the CPU goes (2026-12-03, that run: the CPU time of each test module's pytest worker and its
# msrun jobs, from getrusage around every test, summed per module; 1998 CPU-s in all, 2536 the day
# before): the two parity jobs 629 s (850), test_zeropp 232 (255), test_zero3_network 185 (233),
# test_checkpoint_resume 179 (252), test_gather_units 132 (154), test_model_train 95 (146),
# test_mindone_dropin 76 (120), test_profile_collectives 75 (86), and every other module under 65.
# An msrun job that only calls init() costs 7.4 CPU-s at N=2 and 10.4 at N=4. In a case, the train
# step's first call (compiling it) is about 90% of the CPU, and most of the compile is type
# inference, which grows with the graph's nodes ([Note: compile cost] in
# mindone_zero/core/graph_tuples.py); at stage 3 as much again goes to re-inferring the graph after
# the gathers' custom bprops are expanded (16 x Dense(64): type inference 1.6-1.9 s, then 3.1-3.4 s
# optimizing, 1.2-1.5 s of it re-inferring). So what remains is the ZeRO step's per-tensor and
# per-parameter graphs, not launches.
HEAVY_GROUPS = (
    "parity_N4",
    "parity_N2",
    "tests/dist/test_gather_units.py",
    "tests/dist/test_checkpoint_resume.py",
    "tests/dist/test_model_train.py",
    "tests/dist/test_zero3_network.py",
    "tests/dist/test_mindone_dropin.py",
    "tests/dist/test_zeropp.py",
    "tests/dist/test_multinode.py",
    "tests/dist/test_train_tool.py",
    "tests/dist/test_profile_collectives.py",
)


def _group_of(item) -> str:
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
    return Path(str(item.fspath)).resolve().relative_to(ROOT).as_posix()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark every test with its xdist group and order the groups longest first ([Note: test scheduling])."""
    groups = [_group_of(item) for item in items]
    for item, group in zip(items, groups):
        item.add_marker(pytest.mark.xdist_group(group))
    first_seen = {}
    for g in groups:
        first_seen.setdefault(g, len(first_seen))

    def rank(group):
        return (HEAVY_GROUPS.index(group), 0) if group in HEAVY_GROUPS else (len(HEAVY_GROUPS), first_seen[group])

    order = sorted(range(len(items)), key=lambda i: (rank(groups[i]), i))
    items[:] = [items[i] for i in order]
