"""mindone_zero.checkpoint in one process (ZeRO stage 0, world of 1, no msrun).

The distributed behaviour (stages 1-3, resharding, faults) is in tests/dist/test_checkpoint_*.py;
here: the single-process path, argument errors, ``latest_checkpoint`` and the clean-up of a
failed or interrupted save, which need no second rank.
"""
import json
import os

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor

from models import LossNet, TinyNet, init_weights, make_optimizer, micro_batch
from mindone_zero import EMA, prepare_train_network
from mindone_zero.checkpoint import resume as ckpt  # save_train_state looks its writer up there
from mindone_zero.checkpoint import (gather_full_params, latest_checkpoint, load_train_state, save_full_checkpoint,
                                     save_train_state, step_dir_name)

ms.set_device("CPU")

pytestmark = pytest.mark.usefixtures("pynative_mode")  # restored after each test ([Note: leak guard])


def _train_net(tmp_path, ema=True, accum=2):
    net = init_weights(TinyNet())
    train = prepare_train_network(LossNet(net), make_optimizer(net.trainable_params()), ema=EMA(net, 0.9) if ema else None,
                                  gradient_accumulation_steps=accum, params_split_info=str(tmp_path / "info"))
    train.set_train(True)
    return train


def _step(train, step, micro, accum=2):
    ids, labels = micro_batch(step, 0, 1, micro, accum)
    return float(train(Tensor(ids), Tensor(labels), Tensor(1.0, ms.float32))[0].asnumpy())


def _listing(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def test_round_trip_between_micro_steps_is_bitwise(tmp_path):
    root = tmp_path / "ckpt"
    train, losses = _train_net(tmp_path), []
    for step in range(3):
        for micro in range(2):
            losses.append(_step(train, step, micro))
            if (step, micro) == (1, 0):
                assert save_train_state(train, root, 1) == str(root / step_dir_name(1))
    fresh = _train_net(tmp_path)
    assert load_train_state(fresh, root) == 1
    resumed = [_step(fresh, 1, 1)] + [_step(fresh, 2, m) for m in range(2)]
    assert resumed == losses[3:]
    a, b = gather_full_params(train, include_ema=True), gather_full_params(fresh, include_ema=True)
    assert sorted(a) == sorted(b) and any(k.startswith("ema.") for k in a)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    meta = json.loads((root / step_dir_name(1) / "meta.json").read_text())
    assert (meta["zero_stage"], meta["world_size"], meta["accum_step"], meta["gradient_accumulation_steps"]) == (0, 1, 1, 2)
    assert sorted(meta["files"]["network"] + meta["files"]["optimizer"] + meta["files"]["ema"]) == [
        "ema.ckpt", "network.ckpt", "optimizer.ckpt"]


def test_argument_errors_name_the_argument_and_write_nothing(tmp_path):
    train = _train_net(tmp_path, ema=False, accum=1)
    root = tmp_path / "ckpt"
    cases = [
        (lambda: save_train_state(object(), root, 1), TypeError, "'train_net'"),
        (lambda: save_train_state(train, root, -1), ValueError, "'step'"),
        (lambda: save_train_state(train, root, True), ValueError, "'step'"),
        (lambda: save_train_state(train, root, 1, format="npz"), ValueError, "'format'"),
        (lambda: save_train_state(train, "", 1), TypeError, "'ckpt_dir'"),
        (lambda: load_train_state(train, root, step=-2), ValueError, "'step'"),
        (lambda: load_train_state(train, root), FileNotFoundError, "'ckpt_dir'"),
        (lambda: load_train_state(train, root, step=4), FileNotFoundError, step_dir_name(4)),
        (lambda: gather_full_params(train, include_ema=True), ValueError, "'include_ema'"),
        (lambda: save_full_checkpoint(train, str(tmp_path / "full.npz")), ValueError, "'path'"),
    ]
    for call, kind, word in cases:
        with pytest.raises(kind, match=word.replace("(", r"\(")):
            call()
    assert not root.exists() and not (tmp_path / "full.npz").exists()


def test_latest_checkpoint_skips_incomplete_folders(tmp_path):
    root = tmp_path / "ckpt"
    assert latest_checkpoint(root) is None
    train = _train_net(tmp_path, ema=False, accum=1)
    for step in (2, 10):
        save_train_state(train, root, step)
    assert latest_checkpoint(root) == str(root / step_dir_name(10))
    (root / step_dir_name(12)).mkdir()  # an interrupted save: no meta.json
    (root / "latest").write_text(json.dumps({"step": 12, "dir": step_dir_name(12)}))
    assert latest_checkpoint(root) == str(root / step_dir_name(10))
    (root / "latest").write_text("not json")
    assert latest_checkpoint(root) == str(root / step_dir_name(10))
    os.remove(root / step_dir_name(10) / "meta.json")
    assert latest_checkpoint(root) == str(root / step_dir_name(2))


def test_save_replaces_an_interrupted_folder_and_refuses_a_complete_one(tmp_path):
    root = tmp_path / "ckpt"
    train = _train_net(tmp_path, ema=False, accum=1)
    stale = root / step_dir_name(3)
    stale.mkdir(parents=True)
    (stale / "optimizer_rank7.ckpt").write_bytes(b"left by a crash")
    save_train_state(train, root, 3)
    assert not (stale / "optimizer_rank7.ckpt").exists() and (stale / "meta.json").is_file()
    before = _listing(root)
    with pytest.raises(FileExistsError, match=step_dir_name(3)):
        save_train_state(train, root, 3)
    assert _listing(root) == before


def test_failed_write_removes_the_step_folder_and_keeps_latest(tmp_path, monkeypatch):
    root = tmp_path / "ckpt"
    train = _train_net(tmp_path, ema=False, accum=1)
    save_train_state(train, root, 1)
    before = _listing(root)
    real, calls = ckpt.atomic_save_checkpoint, []

    def fail_second(params, path, format=None):  # noqa: A002
        calls.append(path)
        if len(calls) == 2:
            raise OSError(f"disk full while writing {path}")
        return real(params, path, format)

    monkeypatch.setattr(ckpt, "atomic_save_checkpoint", fail_second)
    with pytest.raises(OSError, match="disk full"):
        save_train_state(train, root, 2)
    assert _listing(root) == before and latest_checkpoint(root) == str(root / step_dir_name(1))
