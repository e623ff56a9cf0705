"""Launch ``msrun`` CPU jobs from pytest and collect each rank's results.

A worker script writes its results under ``--out DIR`` (one file per rank and case, npz or
JSON); the test reads them back. The jobs are launched by ``tools/dev/launch.py`` (the launcher of
the tools too): a free port and a log folder per launch, and a bounded wall time; a hung job is
killed and the failing worker's log tail is shown. Here a failure is an AssertionError.
"""
import json
import os
from pathlib import Path
from typing import Sequence

from tools.dev import launch
from tools.dev.launch import REPO  # noqa: F401 - the tests read REPO

# Under pytest-xdist two jobs share the cores ([Note: test scheduling] in tests/conftest.py), so a
# job may take up to twice as long as alone: its time limit, a bound for a hung job, doubles.
TIMEOUT_FACTOR = 2 if os.environ.get("PYTEST_XDIST_WORKER") else 1


def run_msrun_nodes(script: str, nodes: int, workers_per_node: int, out_dir: Path, args: Sequence[str] = (),
                    timeout: float = 900) -> None:
    """Run ``script`` as ``nodes`` msrun "machines" on loopback, each with its own ``--node_rank``
    and ``workers_per_node`` workers (ranks node * workers_per_node + i), as a multi-node launch
    would. Raises AssertionError with the log tails if any node fails or the job exceeds ``timeout``."""
    try:
        launch.run_msrun_nodes(script, nodes, workers_per_node, out_dir, args, timeout * TIMEOUT_FACTOR)
    except launch.MsrunError as err:
        raise AssertionError(str(err)) from None


def run_msrun(
    script: str,
    nproc: int,
    out_dir: Path,
    args: Sequence[str] = (),
    timeout: float = 900,
    extra_msrun_args: Sequence[str] = (),
    expect_success: bool = True,
    env: dict = None,
):
    """Run ``script`` under msrun with ``nproc`` CPU workers; results go to ``out_dir``.

    The script receives ``--out out_dir`` followed by ``args``; ``env``: the variables the job asks
    for beyond ``tools/dev/launch.py``'s ``msrun_env`` ([Note: job environment]). Returns the
    ``subprocess.CompletedProcess``. Raises AssertionError with the worker log tails if the job
    fails (when ``expect_success``) or exceeds ``timeout`` seconds.
    """
    try:
        return launch.run_msrun(script, nproc, out_dir, args, timeout * TIMEOUT_FACTOR, extra_msrun_args,
                                check=expect_success, env=env)
    except launch.MsrunError as err:
        raise AssertionError(str(err)) from None


def load_json(path: Path) -> dict:
    with open(path) as f:
        return json.load(f)


def worker_args():
    """The worker side of ``run_msrun(script, n, out, ["--cases", json])``: (out folder, list of
    case dicts) from the command line of a worker script."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", required=True)
    args = parser.parse_args()
    return args.out, json.loads(args.cases)
