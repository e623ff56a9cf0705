"""Bad input to the entry points raises before any work, naming the argument and the value.

One process, no communication. The checks of "before any work" run in ParallelMode.DATA_PARALLEL
(the ``data_parallel`` fixture: a group of one rank) at stage 3, where a check made too late would
find the network sharded and the split info written; outside it a stage > 0 falls back to 0 and
nothing would be modified anyway (``test_stage_falls_back_to_zero_outside_data_parallel``).
"""
import logging
import os

import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn
from mindspore.context import ParallelMode

from models import (FactoredOptimizer, LossNet, TinyNet, assert_params_untouched, init_weights, make_optimizer,
                    snapshot_params)
from mindone_zero import EMA, ZeroHelper, prepare_ema, prepare_network, prepare_train_network
from mindone_zero.train.optimizer_states import find_optimizer_states
from parallel_modules import Dense

ms.set_device("CPU")


@pytest.fixture
def net():
    return LossNet(init_weights(TinyNet()))


@pytest.fixture
def opt(net):
    return make_optimizer(net.trainable_params())


@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(zero_stage=5), ValueError, ["'zero_stage'", "[0, 1, 2, 3]", "5"]),
    (dict(zero_stage=True), ValueError, ["'zero_stage'", "True"]),
    (dict(clip_norm=0.0, clip_grad=True), ValueError, ["'clip_norm'", "0.0"]),
    (dict(clip_norm=-1.0), ValueError, ["'clip_norm'", "-1.0"]),
    (dict(gradient_accumulation_steps=0), ValueError, ["'gradient_accumulation_steps'", "0"]),
    (dict(gradient_accumulation_steps=1.5), ValueError, ["'gradient_accumulation_steps'", "1.5"]),
    (dict(clip_grad="yes"), TypeError, ["'clip_grad'", "yes"]),
    (dict(scale_sense=-2.0), ValueError, ["'scale_sense'", "-2.0"]),
    (dict(scale_sense=Tensor(np.ones(3, np.float32))), ValueError, ["'scale_sense'", "(3,)"]),
    (dict(ema="ema"), TypeError, ["'ema'", "str"]),
    (dict(pad_uneven_params="yes"), TypeError, ["'pad_uneven_params'", "'yes'"]),
    (dict(shard_ema=1), TypeError, ["'shard_ema'", "1"]),
])
@pytest.mark.parametrize("stage", [3, 0])
@pytest.mark.usefixtures("data_parallel")
def test_prepare_train_network_rejects(net, opt, kwargs, exc, words, stage, tmp_path):
    """At stage 3 a check made after the work began would find the network sharded or the split info
    written; at stage 0 the value is an error too."""
    kwargs = dict(dict(zero_stage=stage, params_split_info=str(tmp_path / "info")), **kwargs)
    before = snapshot_params(net)
    with pytest.raises(exc) as info:
        prepare_train_network(net, opt, **kwargs)
    for word in words:
        assert word in str(info.value)
    assert_params_untouched(net, before)  # raised before any work: nothing sharded
    assert not (tmp_path / "info").exists()  # and no split info written


@pytest.mark.parametrize("call", [
    lambda net, opt, info, **kw: prepare_train_network(net, opt, zero_stage=3, params_split_info=info, **kw),
    lambda net, opt, info, **kw: prepare_network(net, 3, **kw),
    lambda net, opt, info, **kw: prepare_ema(EMA(net), 3, **kw),
    lambda net, opt, info, **kw: ZeroHelper(opt, 1, params_split_info=info, **kw),
    lambda net, opt, info, **kw: Dense(net.net.head, 3, **kw),
], ids=["prepare_train_network", "prepare_network", "prepare_ema", "ZeroHelper", "Dense"])
def test_both_group_keywords_raise_naming_both(net, opt, call, tmp_path):
    """``op_group`` (MindOne 0.2.0) and ``optimizer_parallel_group`` name one argument: one or the other.
    In ParallelMode.DATA_PARALLEL, where stage 3 would shard at once, so the error comes first."""
    before = snapshot_params(net)
    info = str(tmp_path / "info")
    ms.set_auto_parallel_context(parallel_mode=ParallelMode.DATA_PARALLEL)
    try:
        with pytest.raises(TypeError) as error:
            call(net, opt, info, optimizer_parallel_group="shard_a", op_group="shard_b")
    finally:
        ms.reset_auto_parallel_context()
    for words in ("'optimizer_parallel_group'", "'op_group'", "optimizer_parallel_group='shard_a'",
                  "op_group='shard_b'"):
        assert words in str(error.value)
    assert_params_untouched(net, before)
    assert not os.path.exists(info)


def test_optimizer_must_be_an_optimizer(net):
    with pytest.raises(TypeError, match="'optimizer' must be a mindspore.nn.Optimizer or a mindspore.experimental.optim.Optimizer, but got dict"):
        prepare_train_network(net, {"lr": 0.1})
    with pytest.raises(TypeError, match="'optimizer'.*but got list"):
        ZeroHelper([1, 2])


def test_network_must_be_a_cell(opt):
    with pytest.raises(TypeError, match="'network' must be a Cell, but got function"):
        prepare_train_network(lambda x: x, opt)
    with pytest.raises(TypeError, match="'network' must be a Cell"):
        prepare_network("net", zero_stage=3)


@pytest.mark.usefixtures("data_parallel")
def test_prepare_network_rejects_a_non_bool_split_rule(net):
    before = snapshot_params(net)
    with pytest.raises(TypeError, match="'pad_uneven_params' must be a bool, but got 'no'"):
        prepare_network(net, zero_stage=3, pad_uneven_params="no")
    assert_params_untouched(net, before)


def test_prepare_ema_and_network_check_stage(net):
    with pytest.raises(ValueError, match="'zero_stage' must be one of \\[0, 1, 2, 3\\], but got 4"):
        prepare_ema(EMA(net), zero_stage=4)
    with pytest.raises(ValueError, match="'zero_stage'.*-1"):
        prepare_network(net, zero_stage=-1)
    with pytest.raises(TypeError, match="'ema' must be an nn.Cell with MindOne's EMA interface"):
        prepare_ema(object())


@pytest.mark.parametrize("decay", [0.0, 1.0, 1.5])
def test_ema_decay_range(net, decay):
    with pytest.raises(ValueError, match=f"'ema_decay' must be in \\(0, 1\\), but got {decay}"):
        EMA(net, ema_decay=decay)


@pytest.mark.usefixtures("pynative_mode")  # the mode it trains in, whatever the test before it left
def test_stage_falls_back_to_zero_outside_data_parallel(net, opt, caplog, tmp_path):
    with caplog.at_level(logging.WARNING, logger="mindone_zero.train.zero_helper"):
        train = prepare_train_network(net, opt, zero_stage=2, params_split_info=str(tmp_path / "info"))
    assert train.zero_helper.zero_stage == 0
    assert "falling back to stage 0" in caplog.text
    assert not os.path.exists(tmp_path / "info")  # stage 0 writes no split info
    loss, overflow, scale = train(*_batch())
    assert np.isfinite(loss.asnumpy()) and not overflow.asnumpy() and float(scale.asnumpy()) == 1.0


def test_factored_optimizer_states_are_refused(net):
    opt = FactoredOptimizer(net.trainable_params())
    shapes = [tuple(p.shape) for p in net.trainable_params()]
    with pytest.raises(ValueError) as info:
        find_optimizer_states(opt, shapes)
    assert "row.net.embedding.embedding_table" in str(info.value) and "(11, 1)" in str(info.value)


def test_unknown_optimizer_parameter_is_refused(net):
    opt = make_optimizer(net.trainable_params())
    opt.extra_state = ms.Parameter(Tensor(np.zeros((3, 3), np.float32)), name="extra_state")
    with pytest.raises(ValueError, match="'extra_state' of shape \\(3, 3\\)"):
        find_optimizer_states(opt, [tuple(p.shape) for p in net.trainable_params()])


def test_known_optimizers_states_are_found(net):
    shapes = [tuple(p.shape) for p in net.trainable_params()]
    expected = {"adam": {"moment1", "moment2"}, "momentum": {"moments"}, "sgd": {"accum", "stat"}}
    for name, attrs in expected.items():
        states = find_optimizer_states(make_optimizer(net.trainable_params(), name), shapes)
        assert set(states) == attrs, name
    adamw = nn.AdamWeightDecay(net.trainable_params(), learning_rate=0.1)
    assert set(find_optimizer_states(adamw, shapes)) == {"moments1", "moments2"}


def _batch():
    rng = np.random.default_rng(0)
    ids = Tensor(rng.integers(0, 11, size=(2, 5)).astype(np.int32))
    labels = Tensor(rng.integers(0, 7, size=(2,)).astype(np.int32))
    return ids, labels, Tensor(1.0, ms.float32)


def test_an_optimizer_zero_cannot_shard_raises_before_stage_3_cuts_anything(net, tmp_path):
    """In ParallelMode.DATA_PARALLEL (a group of one rank, so stage 3 really cuts the network), an
    optimizer whose states ZeRO cannot shard raises before any parameter is cut or file written."""
    before = snapshot_params(net)
    info = str(tmp_path / "info")
    ms.set_auto_parallel_context(parallel_mode=ParallelMode.DATA_PARALLEL)
    try:
        with pytest.raises(ValueError, match="'row.net.embedding.embedding_table' of shape \\(11, 1\\)"):
            prepare_train_network(net, FactoredOptimizer(net.trainable_params()), zero_stage=3, params_split_info=info)
    finally:
        ms.reset_auto_parallel_context()
    assert_params_untouched(net, before)
    assert not os.path.exists(info)
