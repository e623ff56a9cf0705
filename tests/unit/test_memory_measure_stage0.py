"""measure_model_states in one process (stage 0, the only stage without msrun) and its errors."""
from dataclasses import replace

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from models import LossNet, TinyNet, init_weights, make_optimizer
from mindone_zero import EMA, prepare_train_network
from mindone_zero.memory.measure import KINDS, LOCATIONS, measure_model_states

ms.set_device("CPU")


def _full_bytes(net):
    return sum(int(np.prod(p.shape, dtype=np.int64)) * 4 for p in net.trainable_params())


@pytest.mark.parametrize("optimizer,states", [("adam", 2), ("momentum", 1), ("sgd", 2)])  # SGD: accum and stat
def test_stage0_bytes_by_kind(optimizer, states):
    net = init_weights(TinyNet())
    train = prepare_train_network(LossNet(net), make_optimizer(net.trainable_params(), optimizer),
                                  ema=EMA(net, ema_decay=0.9), gradient_accumulation_steps=2)
    full = _full_bytes(net)
    memory = measure_model_states(train)
    assert set(memory) == set(KINDS) | set(LOCATIONS) | {"total"}
    assert memory["host"] == memory["file"] == 0
    assert memory["params"] == full and memory["master_shards"] == 0
    assert memory["optimizer_states"] == states * full
    assert memory["accumulation"] == full and memory["ema"] == full
    assert memory["total"] == sum(memory[k] for k in KINDS)


def test_no_accumulation_no_ema():
    net = init_weights(TinyNet())
    train = prepare_train_network(LossNet(net), make_optimizer(net.trainable_params(), "adam"))
    memory = measure_model_states(train)
    assert memory["accumulation"] == 0 and memory["ema"] == 0
    assert memory["optimizer_states"] == 2 * _full_bytes(net)


def test_shared_parameter_counted_once():
    # An optimizer state that is the network parameter itself must not be counted twice.
    net = init_weights(TinyNet())
    train = prepare_train_network(LossNet(net), make_optimizer(net.trainable_params(), "momentum"))
    before = measure_model_states(train)
    train.optimizer_shards = replace(train.optimizer_shards, opt_states={"moments": tuple(net.trainable_params())})
    after = measure_model_states(train)
    assert after["optimizer_states"] == 0  # already counted as params
    # The real moments are still held, now unclaimed by any kind: they land in "other".
    assert after["other"] == before["other"] + before["optimizer_states"]
    assert after["total"] == before["total"]


def test_rejects_what_is_not_a_train_network():
    with pytest.raises(TypeError, match="'train_net' must be a TrainOneStepWrapper, but got Dense"):
        measure_model_states(nn.Dense(2, 2))
