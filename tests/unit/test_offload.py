"""Optimizer offload in one process (stage 0): the host update against MindSpore's own optimizers,
host memory and files, accumulation, clipping, EMA, loss scale and overflow; argument errors;
where the states are counted. Stages 1-3 at N=2 are in tests/dist/test_offload_dist.py."""
import errno
import os

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

from models import LossNet, TinyNet, init_weights, make_optimizer, micro_batch
from mindone_zero import EMA, prepare_train_network
from mindone_zero.memory_measure import KINDS, LOCATIONS, measure_model_states
from mindone_zero.offload import OffloadConfig, set_fault_hook

ms.set_device("CPU")
KEEP_ALIVE = []  # MindSpore caches compiled Cells by id: keep every case's Cells alive
RTOL = 1e-6


def _run(optimizer, offload, mode=ms.GRAPH_MODE, steps=4, accum=2, clip=True, ema=False, overflow_step=None):
    ms.set_context(mode=mode)
    net = init_weights(TinyNet(with_scalar=optimizer != "adamw"))
    opt = make_optimizer(net.trainable_params(), optimizer)
    scale = nn.DynamicLossScaleUpdateCell(2.0 ** 10, 2, 1000) if overflow_step is not None else 1.0
    train = prepare_train_network(LossNet(net), opt, scale_sense=scale, ema=EMA(net, ema_decay=0.9) if ema else None,
                                  gradient_accumulation_steps=accum, clip_grad=clip, clip_norm=2.0,
                                  optimizer_offload=offload)
    train.set_train(True)
    KEEP_ALIVE.append(train)
    losses = []
    for step in range(steps):
        for micro in range(accum):
            ids, labels = micro_batch(step, 0, 1, micro, accum)
            factor = np.inf if step == overflow_step and micro == 0 else 1.0
            loss, _, _ = train(Tensor(ids), Tensor(labels), Tensor(factor, ms.float32))
            losses.append(float(loss.asnumpy()))
    params = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
    if ema:
        params.update({p.name: p.asnumpy().copy() for p in train.ema.ema_weight})
    return np.array(losses), params, train


def _assert_same(a, b):
    np.testing.assert_allclose(a[0], b[0], rtol=RTOL, atol=1e-7)
    assert sorted(a[1]) == sorted(b[1])
    for name, value in b[1].items():
        np.testing.assert_allclose(a[1][name], value, rtol=RTOL, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("optimizer", ["adamw", "adam", "momentum", "sgd"])
def test_host_update_equals_device_optimizer(optimizer, tmp_path):
    device = _run(optimizer, False)
    _assert_same(_run(optimizer, True), device)
    files = {"device": "nvme", "path": str(tmp_path / "states"), "chunk_size": 64}  # many chunks per tensor
    result = _run(optimizer, files)
    _assert_same(result, device)
    (folder,) = os.listdir(tmp_path / "states")  # one fresh folder per rank, removed when closed
    assert folder.startswith("rank0_") and os.listdir(tmp_path / "states" / folder)
    result[2].zero_helper.host_offload.close()
    assert os.listdir(tmp_path / "states") == []
