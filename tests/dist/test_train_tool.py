"""tools/train.py end to end: train, checkpoint, combine and verify; resume continues the same curve.

Two msrun jobs (the tool launches msrun itself with ``--world_size 2``), on a one-layer model at
ZeRO stage 3 (the default), 6 steps with checkpoints at steps 3 and 6:

* straight: 6 steps in one run, with ``--compile_cache`` (a cold cache: it compiles every graph).
  It is the session's shared run (``train_tool_straight``, tests/dist/train_tool_job.py), which
  tests/dist/test_compile_cache.py takes as its cold run;
* resumed: a copy of the straight run's output without its step-6 checkpoint, continued with
  ``--resume`` from step 3 in a new job that shares nothing with the first but the files, and
  with ``--gather_units Block,TransformerLM``: gather units change no bit of the losses or the
  parameters ([Note: gather units]), so the resumed curve is still the straight run's, bit for bit
  (losses, evaluation loss and the combined step-6 checkpoint), and the checkpoint written without
  units loads into the network with units.
"""
import json
import shutil

import numpy as np
import pytest

from mindone_zero.checkpoint import open_checkpoint
from train_tool_job import explain, read_history, run_train


@pytest.fixture(scope="module")
def straight(train_tool_straight):
    return train_tool_straight["out"], train_tool_straight["stdout"]


@pytest.fixture(scope="module")
def resumed(straight, tmp_path_factory):
    out = tmp_path_factory.mktemp("train_tool") / "resumed"
    shutil.copytree(straight[0], out, ignore=shutil.ignore_patterns("msrun_logs"))
    shutil.rmtree(out / "ckpt" / "step_00000006")
    result = run_train(out, "--resume", "--gather_units", "Block,TransformerLM")
    assert result.returncode == 0, explain(result, out)
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
    history = read_history(out)
    assert [h["step"] for h in history] == list(range(1, 7))
    assert history[-1]["loss"] < history[0]["loss"]
    # Per-rank model-state bytes are logged at the start: stage 3 holds 1/N of every state.
    memory = summary["memory_rank0"]
    assert memory["params"] * 2 == memory["optimizer_states"] and memory["master_shards"] == 0
    assert "rank 0 model states:" in stdout and "combined checkpoint" in stdout


def test_resume_continues_the_same_loss_curve(straight, resumed):
    out, stdout = resumed
    assert "resumed from step 3" in stdout
    first, second = read_history(straight[0]), read_history(out)
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
