"""Launch ``msrun`` CPU jobs from pytest and collect each rank's results.

A worker script writes its results under ``--out DIR`` (one file per rank and case, npz or
JSON); the test reads them back. The jobs are launched by ``tools/dev/launch.py`` (the launcher of
the tools too): a free port and a log folder per launch, and a bounded wall time; a hung job is
killed and the failing worker's log tail is shown. Here a failure is an AssertionError.
"""
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Sequence

from tools.dev import launch
from tools.dev.launch import REPO  # noqa: F401 - the tests read REPO

# Under pytest-xdist two jobs share the cores ([Note: test scheduling] in tests/scheduling.py), so a
# job may take up to twice as long as alone: its time limit, a bound for a hung job, doubles.
TIMEOUT_FACTOR = 2 if os.environ.get("PYTEST_XDIST_WORKER") else 1

# Where this suite run records the msrun jobs it launches (tests/scheduling.py sets it; None outside
# a suite run): ``claim_job``.
JOBS_DIR = None


def _job_key(script, nproc: int, out_dir, args) -> str:
    """One msrun job's identity: its script, size and arguments, with the worker's own temporary
    folder (``popen-gw<k>``) left out, so that the same job run by two workers has one key."""
    text = json.dumps([str(script), nproc, str(out_dir), [str(a) for a in args]])
    return hashlib.sha256(re.sub(r"popen-gw\d+", "popen-gw*", text).encode()).hexdigest()[:24]


def claim_job(script, nproc: int, out_dir, args) -> None:
    """Record that this msrun job runs now; raises AssertionError if it already ran in this suite run
    (the scheduling split a group: [Note: test scheduling]). Outside a suite run nothing is recorded."""
    if JOBS_DIR is None:
        return
    marker = JOBS_DIR / _job_key(script, nproc, out_dir, args)
    me = f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}: {os.environ.get('PYTEST_CURRENT_TEST', '?')}"
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        raise AssertionError(f"the msrun job {script} (N={nproc}, out {out_dir}) already ran in this suite run "
                             f"({marker.read_text()}); now again ({me}): a group was split between the "
                             f"workers ([Note: test scheduling])") from None
    with os.fdopen(fd, "w") as f:
        f.write(me)


def run_msrun_nodes(script: str, nodes: int, workers_per_node: int, out_dir: Path, args: Sequence[str] = (),
                    timeout: float = 900) -> None:
    """Run ``script`` as ``nodes`` msrun "machines" on loopback, each with its own ``--node_rank``
    and ``workers_per_node`` workers (ranks node * workers_per_node + i), as a multi-node launch
    would. Raises AssertionError with the log tails if any node fails or the job exceeds ``timeout``."""
    claim_job(script, nodes * workers_per_node, out_dir, args)
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
    fails (when ``expect_success``) or exceeds ``timeout`` seconds, or if this job (script, size,
    folder and arguments) already ran in this suite run.
    """
    claim_job(script, nproc, out_dir, [*args, *extra_msrun_args])
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
