"""Fault tolerance: a worker killed between the files of a save, then a resume.

* Job D (N=2): ZeRO-2 training that saves at steps 3, 6 and 9; rank 1 SIGKILLs itself right
  after writing its first file of the step-6 save, so the step-6 folder is half written and
  rank 0 waits in the save's agreement. msrun must end the job with a non-zero exit: it sees
  the dead worker within a second and kills the others, then its scheduler waits for the dead
  node's heartbeat time-out (``MS_NODE_TIMEOUT``: this job asks for MindSpore's default, 30 s, where
  the launcher's jobs use 120 s, [Note: node time-out] in tools/dev/launch.py) and ~25 s more
  before exiting. ``run_msrun``'s timeout bounds the whole job, so a hang fails the test.
* Job E (N=2): the same training straight for 10 steps, and a resume from D's latest complete
  checkpoint (step 3) that saves again at steps 6 and 9 into the same folder.
"""
import json
import time

import numpy as np
import pytest

from msrun_harness import run_msrun
from mindone_zero.checkpoint import latest_checkpoint, step_dir_name

WORKER = "tests/dist/workers/checkpoint_worker.py"
CONFIG = dict(stage=2, end=10)  # the same training in all three runs
NODE_TIMEOUT_S = 30  # MindSpore's default MS_NODE_TIMEOUT
KILL_TO_EXIT_BOUND_S = 150  # ~30 s node time-out + ~25 s scheduler finalisation, with room for a busy machine


@pytest.fixture(scope="module")
def fault(tmp_path_factory):
    d, e = tmp_path_factory.mktemp("fault_D"), tmp_path_factory.mktemp("fault_E")
    killed = dict(CONFIG, name="fault", ckpt="fault", saves=[3, 6, 9], inject={"kind": "kill", "save": 6, "rank": 1})
    t0 = time.time()
    proc = run_msrun(WORKER, 2, d, ["--cases", json.dumps([killed])], timeout=300, expect_success=False,
                     env={"MS_NODE_TIMEOUT": str(NODE_TIMEOUT_S)})
    exit_time = time.time()
    root = d / "fault"
    after_kill = {
        "returncode": proc.returncode,
        "job_seconds": exit_time - t0,
        "kill": json.loads((d / "killed_rank1.json").read_text()) if (d / "killed_rank1.json").exists() else None,
        "exit_time": exit_time,
        "latest": latest_checkpoint(root),
        "step6_files": sorted(p.name for p in (root / step_dir_name(6)).iterdir()) if (root / step_dir_name(6)).is_dir() else None,
    }
    cases = [dict(CONFIG, name="straight"),
             dict(CONFIG, name="resumed", load=str(root), ckpt=str(root), saves=[6, 9])]
    run_msrun(WORKER, 2, e, ["--cases", json.dumps(cases)], timeout=300)
    return d, e, after_kill


def _events(folder, name, rank):
    return json.loads((folder / f"{name}_rank{rank}.json").read_text())


def test_killed_worker_ends_the_job_nonzero_in_bounded_time(fault):
    _, _, info = fault
    assert info["returncode"] != 0
    assert info["kill"] is not None, "rank 1 never reached the injected kill"
    waited = info["exit_time"] - info["kill"]["time"]
    assert 0 < waited < KILL_TO_EXIT_BOUND_S, f"msrun took {waited:.0f}s after the kill to exit"


def test_interrupted_save_leaves_the_previous_checkpoint_latest(fault):
    d, _, info = fault
    assert info["latest"] == str(d / "fault" / step_dir_name(3))
    assert info["step6_files"] is not None and "meta.json" not in info["step6_files"]
    assert info["kill"]["after"] in info["step6_files"]  # rank 1 did write one file before dying


def test_resume_after_the_kill_continues_the_same_curve(fault):
    d, e, _ = fault
    for r in range(2):
        straight, resumed, killed = (_events(e, "straight", r), _events(e, "resumed", r), _events(d, "fault", r))
        assert resumed["loaded_step"] == 3
        assert resumed["losses"] == [x for x in straight["losses"] if x[0] >= 3]
        before_kill = [x for x in killed["losses"] if x[0] >= 3]
        assert before_kill and before_kill == resumed["losses"][:len(before_kill)]
        a, b = np.load(e / f"straight_rank{r}.npz"), np.load(e / f"resumed_rank{r}.npz")
        assert sorted(a.files) == sorted(b.files)
        assert all(np.array_equal(a[k], b[k]) for k in a.files)
    root = d / "fault"
    assert latest_checkpoint(root) == str(root / step_dir_name(9))
    assert (root / step_dir_name(6) / "meta.json").is_file()  # the stale half-written folder was replaced
