import json
from pathlib import Path

import pytest

from msrun_harness import run_msrun
from parity_cases import CASES, job_cases, reference_spec_of
from train_tool_job import run_straight
from zero_results import compute_references

_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    """Every test under tests/dist launches msrun jobs: mark it ``dist`` so that
    ``pytest -m "not dist"`` is the quick one-process tier."""
    for item in items:
        if _HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.dist)


@pytest.fixture(scope="session")
def parity_jobs(tmp_path_factory):
    """world size -> (world, output folder) of that world size's training job, run once on first use."""
    done = {}

    def get(world):
        if world not in done:
            out = tmp_path_factory.mktemp(f"parity_N{world}")
            try:
                # and test_comm_graph.py's compiled graphs, test_lora.py's fine-tunes, test_gathered.py's blocks,
                # the folded jobs of test_memory_measure.py, test_offload_parity.py, test_mixed_precision.py
                run_msrun("tests/dist/workers/parity_worker.py", world, out, ["--cases", json.dumps(job_cases(world))],
                          timeout=1500)
                compute_references(out, [reference_spec_of(c) for c in CASES[world]])
                done[world] = out
            except BaseException as e:  # a failed (or interrupted) job fails every test that reads it, not rerun
                done[world] = AssertionError(f"the N={world} parity job failed: {type(e).__name__}: {e}")
                raise
        if isinstance(done[world], AssertionError):
            raise done[world]
        return world, done[world]

    return get


@pytest.fixture(scope="session")
def train_tool_straight(tmp_path_factory):
    """The straight run of tools/train.py (tests/dist/train_tool_job.py), run once: test_train_tool.py's
    straight run and test_compile_cache.py's cold run (one group: [Note: test scheduling])."""
    return run_straight(tmp_path_factory.mktemp("train_tool_straight"))
