"""Test-session setup shared by every test: import paths, and the groups that pytest-xdist runs
side by side ([Note: test scheduling])."""
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
# With ``-n 0`` the same order runs in one process. The jobs are bound by CPU work, so side by side
# they slow each other (two N=2 parity jobs at once: 289 and 287 CPU-s, 298 s; one alone: 231-282
# CPU-s, 130-157 s), and the gain comes from the shorter jobs' start-up and the one-process tests
# filling the gaps: the suite keeps 1.89 of the 2 cores busy.
#
# Where the CPU goes: ``python tools/dev/compile_census.py`` runs the suite as CI does and logs every
# graph compile of every process. 2026-12-03 (1542 tests, 23 min, 2612 CPU-s at 1.89 cores): 482
# train-step compiles took 1380 CPU-s (mean 2.86 s), the tests' own graphs (reference networks, jit
# functions) 277, everything else 954 (31 msrun launches of about 7-10 CPU-s each, one-process
# tests, PYNATIVE and long runs). By job: the N=4 parity job 505 CPU-s (116 train steps), N=2 352
# (92), test_gather_units 200 (24 steps of the demo LM at stage 3, about 7 s each), test_zeropp's N=2
# job 160 (200 steps x 4 runs: 40 of it compiling), test_zero3_network's N=4 job 148, and every
# other job under 115. Had every train step compiled as fast as MindSpore's own data-parallel step
# (0.45 s, ``--floor_s``), the suite would still need 1449 CPU-s, 12.8 minutes at that run's use of
# the cores. So the compiles of what the suite checks, not launches or scheduling, set its time.
HEAVY_GROUPS = (
    "parity_N4",
    "parity_N2",
    # (the four modules of 2026-12-03, each measured alone on the loaded machine: 320, 220, 187 and 120 s)
    "tests/dist/test_sharded_build.py",  # 320 s
    "tests/dist/test_pretrained_parity.py",  # 220 s
    "tests/dist/test_gather_units.py",
    "tests/dist/test_compile_cache.py",  # 187 s
    "tests/dist/test_checkpoint_resume.py",
    "tests/dist/test_model_train.py",
    "tests/dist/test_zero3_network.py",
    "tests/dist/test_mindone_dropin.py",
    "tests/dist/test_zeropp.py",
    "tests/dist/test_export_job.py",  # 120 s
    "tests/dist/test_multinode.py",
    "tests/dist/test_train_tool.py",
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

# Modules that share a session fixture run in one group, so that it is made once (tests/unit/conftest.py).
SHARED_GROUPS = {
    "tests/unit/test_docs_build.py": "docs_site",  # docs_build: the mkdocs site, built once
    "tests/unit/test_docs_site_offline.py": "docs_site",
    "tests/unit/test_docs_width.py": "docs_site",
}


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
    path = Path(str(item.fspath)).resolve().relative_to(ROOT).as_posix()
    return SHARED_GROUPS.get(path, path)


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


@pytest.fixture
def pynative_mode():
    """Run the test in PYNATIVE_MODE, restoring the mode after (``pytest.mark.usefixtures("pynative_mode")``)."""
    import mindspore as ms

    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    yield
    ms.set_context(mode=mode)
