"""tools/train.py end to end: train, checkpoint, combine and verify; resume continues the same curve.

Two msrun jobs (the tool launches msrun itself with ``--world_size 2``), on a one-layer model at
ZeRO stage 3 (the default), 6 steps with checkpoints at steps 3 and 6:

* straight: 6 steps in one run;
* resumed: a copy of the straight run's output without its step-6 checkpoint, continued with
  ``--resume`` from step 3 in a new job that shares nothing with the first but the files, and
  with ``--gather_units Block,TransformerLM``: gather units change no bit of the losses or the
  parameters ([Note: gather units]), so the resumed curve is still the straight run's, bit for bit
  (losses, evaluation loss and the combined step-6 checkpoint), and the checkpoint written without
  units loads into the network with units.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mindone_zero.checkpoint import open_checkpoint
from msrun_harness import TIMEOUT_FACTOR

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--config", str(REPO / "configs" / "train_lm.yaml"), "--world_size", "2", "--steps", "6",
         "--ckpt_interval", "3", "--n_layers", "1", "--d_model", "32", "--global_batch_size", "8",
         "--eval_batch_size", "8"]


def _train(out: Path, *extra, timeout=480 * TIMEOUT_FACTOR) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(REPO / "tools" / "train.py"), *SMALL, "--output_dir", str(out), *extra]
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(cmd, cwd=str(REPO), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        stdout, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, _ = proc.communicate()
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, "")


def _explain(result, out: Path) -> str:
    tails = []
    for log in sorted((out / "msrun_logs").glob("worker_*.log")):
        lines = [t for t in log.read_text(errors="replace").splitlines() if not t.startswith(("[WARNING]", "[INFO]"))]
        tails.append(f"--- {log.name}\n" + "\n".join(lines[-40:]))
    return f"exit {result.returncode}\n{result.stdout[-3000:]}\n" + "\n".join(tails)


def _history(out: Path):
    return [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    out = tmp_path_factory.mktemp("train_tool") / "straight"
    result = _train(out)
    assert result.returncode == 0, _explain(result, out)
    return out, result.stdout


@pytest.fixture(scope="module")
def resumed(straight, tmp_path_factory):
    out = tmp_path_factory.mktemp("train_tool") / "resumed"
    shutil.copytree(straight[0], out, ignore=shutil.ignore_patterns("msrun_logs"))
    shutil.rmtree(out / "ckpt" / "step_00000006")
    result = _train(out, "--resume", "--gather_units", "Block,TransformerLM")
    assert result.returncode == 0, _explain(result, out)
    return out, result.stdout


def test_straight_run_saves_combines_and_verifies(straight):
    out, stdout = straight
    summary = json.loads((out / "summary.json").read_text())
    assert summary["zero_stage"] == 3 and summary["world_size"] == 2
    for step in (3, 6):
        assert (out / "ckpt" / f"step_{step:08d}" / "meta.json").is_file()
    assert summary["checkpoint"].endswith("step_00000006")
    assert (out / "ckpt" / "step_00000006" / "network_rankall_2.ckpt").is_file()
    # The combined model, loaded unsharded in one process, reproduces the distributed evaluation.
    np.testing.assert_allclose(summary["combined_eval_loss"], summary["eval_loss"], rtol=1e-5)
    history = _history(out)
    assert [h["step"] for h in history] == list(range(1, 7))
    assert history[-1]["loss"] < history[0]["loss"]
    # Per-rank model-state bytes are logged at the start: stage 3 holds 1/N of every state.
    memory = summary["memory_rank0"]
    assert memory["params"] * 2 == memory["optimizer_states"] and memory["master_shards"] == 0
    assert "rank 0 model states:" in stdout and "combined checkpoint" in stdout


def test_resume_continues_the_same_loss_curve(straight, resumed):
    out, stdout = resumed
    assert "resumed from step 3" in stdout
    first, second = _history(straight[0]), _history(out)
    assert [h["step"] for h in second] == list(range(1, 7))
    assert [h["loss"] for h in second] == [h["loss"] for h in first]  # no bit changed, units or not
    a = json.loads((straight[0] / "summary.json").read_text())
    b = json.loads((out / "summary.json").read_text())
    assert b["losses_this_run"] == [h["loss"] for h in second[3:]]
    assert b["eval_loss"] == a["eval_loss"]
    combined = [open_checkpoint(str(run / "ckpt" / "step_00000006" / "network_rankall_2.ckpt"))
                for run in (straight[0], out)]
    assert sorted(combined[1].infos) == sorted(combined[0].infos) and combined[0].infos
    for name in combined[0].infos:
        assert np.array_equal(combined[1].read(name), combined[0].read(name)), name
