"""The train records (issue 47: [Note: train records] in mindone_zero/train/train_plan.py) in one process:
they are frozen, every argument is checked once, the host step is its own class, reached by
``TrainOneStepWrapper(...)`` too, and nothing refers back from the host step to the helper.
Stages 1-3 at N=2 run the same code in tests/dist/ (test_zero_parity.py, test_mindone_dropin.py,
test_offload_dist.py)."""
import copy
import dataclasses
from types import MappingProxyType

import mindspore as ms
import pytest
from mindspore import Tensor

from models import LossNet, TinyNet, init_weights, make_optimizer, micro_batch
from mindone_zero import TrainOneStepWrapper, ZeroHelper, prepare_train_network
from mindone_zero.core.stage import StagePolicy
from mindone_zero.offload import host_optimizer
from mindone_zero.train import optimizer_states, train_plan
from mindone_zero.train.fusion import FusionConfig
from mindone_zero.train.train_step import OffloadTrainOneStepWrapper, StepSettings

ms.set_device("CPU")

# the tests set the mode they need; it is put back after each ([Note: leak guard] in tests/leak_guard.py)
pytestmark = pytest.mark.usefixtures("restore_ms_context")
KEEP_ALIVE = []  # MindSpore caches compiled Cells by id: keep every case's Cells alive


def _net():
    return init_weights(TinyNet(with_scalar=False))


def _batch(step=0, micro=0, accum=1):
    ids, labels = micro_batch(step, 0, 1, micro, accum)
    return Tensor(ids), Tensor(labels), Tensor(1.0, ms.float32)


def test_the_records_are_frozen(tmp_path):
    net = _net()
    train = prepare_train_network(LossNet(net), make_optimizer(net.trainable_params(), "adamw"),
                                  optimizer_offload=True, params_split_info=str(tmp_path))
    KEEP_ALIVE.append(train)
    plan, shards = train.zero_plan, train.optimizer_shards
    assert train.zero_helper.zero_plan is plan and train.zero_helper.optimizer_shards is shards
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.specs = ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        shards.opt_states = {}
    assert isinstance(shards.opt_states, MappingProxyType)
    with pytest.raises(TypeError):
        shards.opt_states["moments1"] = ()
    # offloaded: the host's states stand for the optimizer's, whose Parameters are cut to one element
    assert set(shards.opt_states) == {"moments1", "moments2"}
    assert all(getattr(v, "location", None) == "host" for values in shards.opt_states.values() for v in values)
    assert len(shards.placeholders) == 2 * len(shards.params) and all(p.size == 1 for p in shards.placeholders)


class _Calls:
    """Counts the calls of the wrapped callables (``count(owner, name)``, under ``Owner.name``), still
    calling them."""

    def __init__(self, monkeypatch):
        self.monkeypatch, self.counts = monkeypatch, {}

    def count(self, owner, name, classmethod_=False):
        real = getattr(owner, name)
        label = f"{getattr(owner, '__name__', owner).rsplit('.', 1)[-1]}.{name}"
        self.counts[label] = 0

        def counted(*args, **kwargs):
            self.counts[label] += 1
            return real(*args, **kwargs)

        self.monkeypatch.setattr(owner, name, classmethod(lambda cls, *a, **k: counted(*a, **k))
                                 if classmethod_ else counted)


@pytest.fixture
def calls(monkeypatch):
    spy = _Calls(monkeypatch)
    spy.count(train_plan.ZeroOptions, "check", classmethod_=True)
    spy.count(StepSettings, "check", classmethod_=True)
    spy.count(StagePolicy, "of", classmethod_=True)
    spy.count(FusionConfig, "from_mindone", classmethod_=True)
    spy.count(host_optimizer, "_rule_of")  # offload_for's and host_rule_for's look-up of the host update
    spy.count(train_plan, "check_optimizer")
    spy.count(optimizer_states, "find_optimizer_states")
    return spy.counts


ONCE = {"ZeroOptions.check": 1, "StepSettings.check": 1, "StagePolicy.of": 1, "FusionConfig.from_mindone": 1,
        "host_optimizer._rule_of": 1, "train_plan.check_optimizer": 1, "optimizer_states.find_optimizer_states": 1}


def test_prepare_train_network_checks_each_argument_once(calls, tmp_path):
    """What ``prepare_train_network`` checked, building the records and the train step does not check
    again (the review's list: check_optimizer, OffloadConfig.parse through offload_for,
    FusionConfig, StagePolicy.of, the step's arguments, the host rule)."""
    net = _net()
    train = prepare_train_network(LossNet(net), make_optimizer(net.trainable_params(), "adamw"),
                                  gradient_accumulation_steps=2, clip_grad=True, optimizer_offload=True,
                                  params_split_info=str(tmp_path))
    KEEP_ALIVE.append(train)
    assert calls == ONCE


def test_zero_helper_and_train_step_built_directly_check_their_arguments(calls):
    net = _net()
    optimizer = make_optimizer(net.trainable_params(), "adamw")
    helper = ZeroHelper(optimizer, 0, optimizer_offload=True)
    assert calls == dict(ONCE, **{"StepSettings.check": 0})
    KEEP_ALIVE.append(TrainOneStepWrapper(LossNet(net), optimizer, zero_helper=helper))
    assert calls == ONCE
    with pytest.raises(ValueError, match="'gradient_accumulation_steps' must be an integer >= 1, but got 0"):
        TrainOneStepWrapper(LossNet(net), optimizer, gradient_accumulation_steps=0, zero_helper=helper)
    with pytest.raises(TypeError, match="'optimizer' must be a mindspore.nn.Optimizer"):
        ZeroHelper(net, 0)


def _losses(train, steps=2, accum=2):
    train.set_train(True)
    KEEP_ALIVE.append(train)
    out = []
    for step in range(steps):
        for micro in range(accum):
            out.append(float(train(*_batch(step, micro, accum))[0].asnumpy()))
    return out


@pytest.mark.parametrize("positional", [False, True])
def test_train_step_built_directly_around_an_offload_helper_steps_on_the_host(positional):
    """MindOne's callers build ``TrainOneStepWrapper(...)`` around their helper: with offload it is the
    host step, and it trains as ``prepare_train_network``'s does."""
    ms.set_context(mode=ms.GRAPH_MODE)
    net = _net()
    optimizer = make_optimizer(net.trainable_params(), "adamw")
    helper = ZeroHelper(optimizer, 0, optimizer_offload=True)
    if positional:  # zero_helper is the eleventh of MindOne's positional arguments
        train = TrainOneStepWrapper(LossNet(net), optimizer, 1.0, None, 0, True, 2, False, 1.0, False, helper)
    else:
        train = TrainOneStepWrapper(LossNet(net), optimizer, gradient_accumulation_steps=2, zero_helper=helper)
    assert type(train) is OffloadTrainOneStepWrapper and isinstance(train, TrainOneStepWrapper) and train.offload
    assert train.host_offload is helper.host_offload
    if positional:  # the same class as with keywords, whose training is compared below (each compile costs)
        KEEP_ALIVE.append(train)
        return
    direct = _losses(train)
    net = _net()
    prepared = prepare_train_network(LossNet(net), make_optimizer(net.trainable_params(), "adamw"),
                                     gradient_accumulation_steps=2, optimizer_offload=True)
    assert type(prepared) is OffloadTrainOneStepWrapper
    assert direct == _losses(prepared)


def test_train_step_around_a_device_helper_is_the_device_step():
    net = _net()
    optimizer = make_optimizer(net.trainable_params(), "adamw")
    train = TrainOneStepWrapper(LossNet(net), optimizer, zero_helper=ZeroHelper(optimizer, 0))
    KEEP_ALIVE.append(train)
    assert type(train) is TrainOneStepWrapper and not train.offload and not hasattr(train, "host_offload")
    assert type(TrainOneStepWrapper(LossNet(net), optimizer)) is TrainOneStepWrapper  # its own stage-0 helper


@pytest.mark.parametrize("accum", [1, 2])
def test_each_construct_returns_one_type(accum):
    """The device step's graph returns (loss, overflow, scale) at every micro-step; the host step's
    (loss, overflow, scale, go, grads), at a step boundary and between."""
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        net = _net()
        optimizer = make_optimizer(net.trainable_params(), "adamw")
        device = TrainOneStepWrapper(LossNet(net), optimizer, gradient_accumulation_steps=accum)
        host_net = _net()
        host_opt = make_optimizer(host_net.trainable_params(), "adamw")
        host = TrainOneStepWrapper(LossNet(host_net), host_opt, gradient_accumulation_steps=accum,
                                   zero_helper=ZeroHelper(host_opt, 0, optimizer_offload=True))
        KEEP_ALIVE.extend([device, host])
        n = len(host.optimizer_shards.opt_params)
        for micro in range(accum):
            out = device.construct(*_batch(0, micro, accum))
            assert isinstance(out, tuple) and len(out) == 3
            host._host_call = True
            out = host.construct(*_batch(0, micro, accum))
            host._host_call = False
            assert isinstance(out, tuple) and len(out) == 5 and len(out[4]) == n
            assert bool(out[3].asnumpy()) == (micro == accum - 1)  # the host steps at the boundary only
    finally:
        ms.set_context(mode=mode)


def test_the_host_step_does_not_refer_back_to_the_helper():
    net = _net()
    optimizer = make_optimizer(net.trainable_params(), "adamw")
    helper = ZeroHelper(optimizer, 0, optimizer_offload=True)
    host = helper.host_offload
    assert host.sync is helper.grad_sync
    assert all(value is not helper for value in vars(host).values())
    assert all(value is not host for value in vars(helper.grad_sync).values())


def test_zero_helper_attributes_are_read_only_views_of_the_records():
    net = _net()
    optimizer = make_optimizer(net.trainable_params(), "adamw")
    helper = ZeroHelper(optimizer, 2)
    KEEP_ALIVE.append(helper)
    assert (helper.zero_stage, helper.is_parallel, helper.op_size, helper.op_rank, helper.dp_size) == (0, False, 1, 0, 1)
    assert helper.op_group is None and helper.dp_group is None and not helper.optimizer_offload
    assert helper.optimizer is optimizer and helper.params is helper.optimizer_shards.params
    assert helper.opt_params is helper.optimizer_shards.opt_params
    with pytest.raises(AttributeError):
        helper.op_size = 2


def test_a_train_step_copies_as_before():
    """``copy.copy`` builds the object through ``__new__`` with no arguments (as it did before the
    host step was its own class)."""
    net = _net()
    optimizer = make_optimizer(net.trainable_params(), "adamw")
    for helper in (ZeroHelper(optimizer, 0), ZeroHelper(optimizer, 0, optimizer_offload=True)):
        train = TrainOneStepWrapper(LossNet(net), optimizer, zero_helper=helper)
        KEEP_ALIVE.append(train)
        copied = copy.copy(train)
        assert type(copied) is type(train) and copied.zero_plan is train.zero_plan
