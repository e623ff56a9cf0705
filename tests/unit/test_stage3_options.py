"""Stage3Options ([Note: stage-3 options] in mindone_zero/zero3/options.py): built and checked once per
entry point, carried by the sharded network, and kept by prepare_train_network on a network that
prepare_network sharded (same or left-out options accepted, other ones raise naming them).

One process in ParallelMode.DATA_PARALLEL: a group of one rank, so stage 3 really shards (every
candidate splits over one rank) and nothing communicates while building."""
import dataclasses
import sys

import pytest
import mindspore as ms
from mindspore.context import ParallelMode

from models import LossNet, TinyNet, init_weights, make_optimizer
from mindone_zero import ZeroPPConfig, prepare_network, prepare_train_network
from mindone_zero.core.partition import zero_spec_of
from mindone_zero.train.fusion import FusionConfig
from mindone_zero.zero3 import options as options_module
from mindone_zero.zero3.options import Stage3Options
from mindone_zero.zero3.state import options_of

ms.set_device("CPU")


@pytest.fixture(autouse=True)
def data_parallel():
    ms.set_auto_parallel_context(parallel_mode=ParallelMode.DATA_PARALLEL)
    yield
    ms.reset_auto_parallel_context()


def _sharded(net):
    return all(zero_spec_of(p) is not None for p in net.trainable_params())


def _train(net, tmp_path, **kwargs):
    return prepare_train_network(net, make_optimizer(net.trainable_params()), zero_stage=3,
                                 params_split_info=str(tmp_path / "info"), **kwargs)


def test_the_options_are_one_frozen_value_built_from_the_keywords():
    built = Stage3Options.build("prepare_network", 3, None, False, {"quantize_weights": True}, None,
                                {TinyNet: TinyNet}, None, True)
    assert built == Stage3Options(False, ZeroPPConfig(quantize_weights=True), None, {TinyNet: TinyNet}, None, True)
    assert Stage3Options.build("shard_network", gather_units=[TinyNet]).gather_units == (TinyNet,)
    assert Stage3Options.build("shard_network", zeropp=ZeroPPConfig()).zeropp is None  # nothing on
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.reshard_after_forward = True
    with pytest.raises(TypeError):
        built.parallel_modules[LossNet] = TinyNet  # a read-only copy: the caller's dict may change later


def test_prepare_network_marks_the_network_with_its_options():
    net = prepare_network(LossNet(init_weights(TinyNet())), 3, reshard_after_forward=False, pad_uneven_params=True)
    assert _sharded(net)
    # gather_units as done: TinyNet has no repeated block ([Note: units by default])
    assert options_of(net) == [Stage3Options(reshard_after_forward=False, gather_units=None, pad_uneven_params=True)]
    below = LossNet(init_weights(TinyNet()))
    assert prepare_network(below, 2) is below and options_of(below) == []  # nothing sharded, nothing marked


@pytest.mark.parametrize("given", [dict(reshard_after_forward=False, pad_uneven_params=True), {}],
                         ids=["same", "left_out"])
def test_prepare_train_network_keeps_the_networks_options(given, tmp_path):
    net = prepare_network(LossNet(init_weights(TinyNet())), 3, reshard_after_forward=False, pad_uneven_params=True)
    train = _train(net, tmp_path, **given)
    assert train.zero_stage == 3
    # reshard_after_forward=False held: no Cell was marked with recompute() by either call
    assert not any(c._has_config_recompute for _, c in train.network.cells_and_names())
    assert options_of(train.network) == [Stage3Options(reshard_after_forward=False, gather_units=None,
                                                       pad_uneven_params=True)]


def test_a_loss_cell_around_the_prepared_network_finds_its_options(tmp_path):
    inner = prepare_network(init_weights(TinyNet()), 3, reshard_after_forward=False)
    with pytest.raises(ValueError, match="'gather_units': got \\(<class 'models.TinyNet'>,\\), the network has None"):
        _train(LossNet(inner), tmp_path, gather_units=(TinyNet,))
    _train(LossNet(inner), tmp_path)


@pytest.mark.parametrize("prepared, given, named", [
    (dict(), dict(reshard_after_forward=False), ["'reshard_after_forward': got False, the network has True"]),
    (dict(reshard_after_forward=False), dict(pad_uneven_params=True),
     ["'pad_uneven_params': got True, the network has False"]),
    (dict(), dict(reshard_after_forward=False, parallel_modules={TinyNet: TinyNet}),
     ["'reshard_after_forward': got False, the network has True",
      "'parallel_modules': got {<class 'models.TinyNet'>: <class 'models.TinyNet'>}, the network has None"]),
])
def test_other_options_than_the_networks_raise_naming_them(prepared, given, named, tmp_path):
    net = prepare_network(LossNet(init_weights(TinyNet())), 3, **prepared)
    with pytest.raises(ValueError) as info:
        _train(net, tmp_path, **given)
    message = str(info.value)
    assert message.startswith("For 'prepare_train_network', the network was already sharded (by prepare_network or "
                              "shard_network) with other options than the ones given here: ")
    for words in named:
        assert words in message
    assert message.count(", the network has ") == len(named)
    assert not (tmp_path / "info").exists()  # raised before any work


def _count(monkeypatch, owner, name, calls):
    original = getattr(owner, name)

    def counted(*args, **kwargs):
        calls.append((name,) + tuple(a for a in args[:2] if isinstance(a, str)))
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)


def test_each_check_runs_once_per_entry_point(monkeypatch, tmp_path):
    calls = []
    for name in ("_check_reshard", "_zeropp", "_gather_units", "_module_map", "check_split_rule_flag"):
        _count(monkeypatch, options_module, name, calls)
    build, parse = Stage3Options.build, FusionConfig.from_mindone
    monkeypatch.setattr(Stage3Options, "build", staticmethod(
        lambda where, *a, **k: (calls.append(("build", where)), build(where, *a, **k))[1]))
    monkeypatch.setattr(FusionConfig, "from_mindone", staticmethod(
        lambda value, where: (calls.append(("from_mindone", where)), parse(value, where))[1]))
    net = LossNet(init_weights(TinyNet()))
    _train(net, tmp_path, reshard_after_forward=False, gather_units=(TinyNet,), comm_fusion={})
    assert _sharded(net)
    where = "prepare_train_network"
    assert sorted(calls) == sorted([
        ("build", where), ("_check_reshard", where), ("check_split_rule_flag", where, "pad_uneven_params"),
        ("_zeropp", where), ("_gather_units", where), ("_module_map", where, "parallel_modules"),
        ("_module_map", where, "special_cases_parallel_module"), ("from_mindone", where)])

    calls.clear()
    net = prepare_network(LossNet(init_weights(TinyNet())), 3, reshard_after_forward=False)
    _train(net, tmp_path)
    assert [c for c in calls if c[0] == "build"] == [("build", "prepare_network"), ("build", where)]
    assert [c for c in calls if c[0] == "_zeropp"] == [("_zeropp", "prepare_network"), ("_zeropp", where)]


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE], ids=["graph", "pynative"])
def test_sharding_reads_the_mode_once(mode, monkeypatch, tmp_path):
    """Issue 58's frozen plan: the entry point reads MindSpore's mode once, into the options, and the
    build decides from that (recompute marks, shared gather Cells), not from reads of its own."""
    reads, real = [], ms.get_context

    def get_context(key, *args, **kwargs):
        if key == "mode":
            caller = sys._getframe(1).f_code.co_filename
            if "mindone_zero" in caller:
                reads.append(caller)
        return real(key, *args, **kwargs)

    old = ms.get_context("mode")
    ms.set_context(mode=mode)
    monkeypatch.setattr(ms, "get_context", get_context)
    try:
        net = prepare_network(LossNet(init_weights(TinyNet())), 3)
        assert len(reads) == 1, reads
        reads.clear()
        _train(LossNet(init_weights(TinyNet())), tmp_path)
        assert len(reads) == 1, reads
    finally:
        monkeypatch.undo()
        ms.set_context(mode=old)
    assert options_of(net)[0].graph_mode is (mode == ms.GRAPH_MODE)
    assert options_of(net) == [Stage3Options(gather_units=None)]  # the mode is not an option
