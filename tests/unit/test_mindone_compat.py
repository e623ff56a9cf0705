"""MindOne drop-in pieces that one process can check (issue 9): any EMA with MindOne's interface,
the wrapper's MindOne/MindSpore attributes, experimental optimizers, and the split rule's memory
of the user's ``parallel_optimizer = False``. Issue 48: MindOne 0.2.0's names (``op_group``,
``transform_checkpoints``), 0.3.0+'s ``Mint_Conv2d``/``Mint_Conv3d``, and offload with an optimizer
without a host update (a warning, then the step on the device, as MindOne). The multi-process
behaviour is in tests/dist/test_mindone_dropin.py; the signatures of every release in
tests/unit/test_mindone_signatures.py."""
import json
import logging
import os

import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, mint, nn, ops
from mindspore.context import ParallelMode
from mindspore.experimental.optim import AdamW

import parallel_modules as pm
from models import LossNet, TinyNet, init_weights, make_optimizer, micro_batch
from mindone_zero import (EMA, ZeroHelper, convert_checkpoints, prepare_ema, prepare_network, prepare_train_network,
                          transform_checkpoints)
from mindone_zero.checkpoint import atomic_save_checkpoint
from mindone_zero.core.comm import world_group
from mindone_zero.core.partition import is_split_candidate, mark_shard_flag, split_all, user_opted_out
from mindone_zero.memory.measure import measure_model_states
from mindone_zero.train.optimizer_states import find_optimizer_states
from mindone_zero.zero3.layers import ZeroCell

ms.set_device("CPU")

# the tests set the mode they need; it is put back after each ([Note: leak guard] in tests/leak_guard.py)
pytestmark = pytest.mark.usefixtures("restore_ms_context")


class ForeignEMA(nn.Cell):
    """MindOne's EMA interface, none of mindone_zero's code."""

    def __init__(self, network, decay=0.5):
        super().__init__()
        self.net_weight = ParameterTuple(network.trainable_params())
        self.ema_weight = self.net_weight.clone(prefix="ema")
        self.updates = Parameter(Tensor(0.0, ms.float32), name="updates", requires_grad=False)
        self.decay = decay
        self.swaps = []

    def ema_update(self):
        done = ()
        for i in range(len(self.ema_weight)):
            e, w = self.ema_weight[i], self.net_weight[i]
            done += (ops.assign(e, e * self.decay + w * (1.0 - self.decay)),)
        return ops.depend(ops.assign_add(self.updates, Tensor(1.0, ms.float32)), done)

    def swap_before_eval(self):
        self.swaps.append("before")
        return True

    def swap_after_eval(self):
        self.swaps.append("after")
        return True


def _batch():
    ids, labels = micro_batch(0, 0, 1, 0, 1)
    return Tensor(ids), Tensor(labels), Tensor(1.0, ms.float32)


@pytest.fixture
def net():
    return LossNet(init_weights(TinyNet(with_scalar=False)))


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE])
def test_foreign_ema_is_updated_once_per_step(net, mode, tmp_path):
    ms.set_context(mode=mode)
    ema = prepare_ema(ForeignEMA(net))
    before = [e.asnumpy().copy() for e in ema.ema_weight]
    train = prepare_train_network(net, nn.SGD(net.trainable_params(), 0.1), ema=ema, updates=3,
                                  params_split_info=str(tmp_path))
    train(*_batch())
    assert float(ema.updates.asnumpy()) == 4.0  # 'updates' restored, then one update
    expected = [0.5 * b + 0.5 * w.asnumpy() for b, w in zip(before, ema.net_weight)]
    for e, x in zip(ema.ema_weight, expected):
        np.testing.assert_allclose(e.asnumpy(), x, rtol=1e-6)
    # bound at stage 0 too: its class is kept, its swaps are replaced by in-place ones
    assert isinstance(ema, ForeignEMA) and type(ema).__name__ == "ForeignEMA"
    weights = list(net.trainable_params())
    trained = [w.asnumpy().copy() for w in weights]
    ema.swap_before_eval()
    assert all(np.array_equal(w.asnumpy(), e.asnumpy()) for w, e in zip(weights, ema.ema_weight))
    ema.swap_after_eval()
    assert all(np.array_equal(w.asnumpy(), t) for w, t in zip(weights, trained))
    assert [id(w) for w in net.trainable_params()] == [id(w) for w in weights]
    assert ema.swaps == []  # the class's own set_data-style swaps never ran


class SetDataEMA(ForeignEMA):
    """Swaps the way MindOne's EMA (offloading=True) does: ``set_data`` of another tensor."""

    def swap_before_eval(self):
        self.cache = [Tensor(w.asnumpy()) for w in self.net_weight]
        for w, e in zip(self.net_weight, self.ema_weight):
            w.set_data(Tensor(e.asnumpy()))
        return True

    def swap_after_eval(self):
        for w, c in zip(self.net_weight, self.cache):
            w.set_data(c)
        return True


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE])
@pytest.mark.parametrize("ema_class", [EMA, SetDataEMA])
def test_training_moves_every_weight_after_a_swap(net, mode, ema_class, tmp_path):
    """[Note: in-place swaps]: with set_data swaps, PYNATIVE's jitted optimizer kept updating the
    old buffers, and every step after the first swap moved no weight."""
    ms.set_context(mode=mode)
    ema = ema_class(net) if ema_class is SetDataEMA else EMA(net, ema_decay=0.5)
    train = prepare_train_network(net, nn.Adam(net.trainable_params(), 0.01), ema=ema,
                                  params_split_info=str(tmp_path))
    weights = list(net.trainable_params())
    for round_ in range(3):
        train(*_batch())
        ema.swap_before_eval()
        ema.swap_after_eval()
        before = [w.asnumpy().copy() for w in weights]
        train(*_batch())
        unchanged = [w.name for w, b in zip(weights, before) if np.array_equal(w.asnumpy(), b)]
        assert unchanged == [], f"round {round_}: no update of {unchanged} after a swap"


def test_swap_after_eval_alone_changes_nothing(net):
    ema = EMA(net, ema_decay=0.5)
    for e in ema.ema_weight:
        e.set_data(Tensor(np.full(e.shape, 0.25, np.float32)))
    trained = [w.asnumpy().copy() for w in ema.net_weight]
    assert ema.swap_after_eval() is True  # MindOne's callback may call it without a swap before
    assert all(np.array_equal(w.asnumpy(), t) for w, t in zip(ema.net_weight, trained))


class _Lacking(ForeignEMA):
    ema_update = None


@pytest.mark.parametrize("ema, exc, words", [
    (lambda n: _Lacking(n), TypeError, ["'ema'", "_Lacking", "ema_update()"]),
    (lambda n: object(), TypeError, ["'ema'", "nn.Cell", "object"]),
])
def test_incompatible_ema_is_refused_naming_what_is_missing(net, ema, exc, words):
    for call in (lambda e: prepare_ema(e), lambda e: prepare_train_network(net, nn.SGD(net.trainable_params()), ema=e)):
        with pytest.raises(exc) as info:
            call(ema(net))
        for word in words:
            assert word in str(info.value)


def test_ema_of_other_length_is_refused(net):
    ema = ForeignEMA(net)
    ema.ema_weight = ParameterTuple(list(ema.ema_weight)[:-1])
    with pytest.raises(ValueError, match="one 'ema_weight' per 'net_weight'"):
        prepare_ema(ema)


@pytest.mark.parametrize("stage", [0, 3])
def test_ema_of_other_shape_is_refused_before_anything_changes(data_parallel, stage, tmp_path):
    """Review section 9, comment 6: the shape is checked before the network is sharded."""
    net = LossNet(init_weights(TinyNet()))
    ema = ForeignEMA(net)
    bad = ema.ema_weight[0]
    ema.ema_weight = ParameterTuple([Parameter(Tensor(np.zeros((3,) + tuple(bad.shape), np.float32)), name=bad.name)]
                                    + list(ema.ema_weight)[1:])
    cells = {name: type(c) for name, c in net.cells_and_names()}
    shapes = {p.name: tuple(p.shape) for p in net.get_parameters()}
    with pytest.raises(ValueError, match=f"'ema' holds '{bad.name}' of shape \\(3,"):
        prepare_train_network(net, make_optimizer(net.trainable_params()), zero_stage=stage, ema=ema,
                              params_split_info=str(tmp_path / "info"))
    assert {name: type(c) for name, c in net.cells_and_names()} == cells
    assert {p.name: tuple(p.shape) for p in net.get_parameters()} == shapes
    assert not any(hasattr(p, "zero_spec") for p in net.get_parameters())
    assert not (tmp_path / "info").exists()


def test_our_ema_swaps_and_restores_exactly(net):
    ema = EMA(net, ema_decay=0.5)
    for e in ema.ema_weight:
        e.set_data(Tensor(np.full(e.shape, 0.25, np.float32)))
    trained = [w.asnumpy().copy() for w in ema.net_weight]
    assert ema.swap_before_eval() is True
    assert all((w.asnumpy() == 0.25).all() for w in ema.net_weight)
    assert ema.swap_after_eval() is True
    assert all(np.array_equal(w.asnumpy(), t) for w, t in zip(ema.net_weight, trained))


@pytest.mark.parametrize("stage", [0, 3])
def test_a_frozen_parameter_gets_no_ema_weight(data_parallel, stage, tmp_path):
    """MindOne's ``trainable_only=True`` (the default): the EMA holds a weight for each trainable
    parameter and none for a frozen one, so that a fine-tune of a frozen base keeps no second copy of
    it (at stage 3 such a weight would be whole on every rank); ``trainable_only=False`` averages
    every parameter."""
    net = LossNet(init_weights(TinyNet()))
    net.net.embedding.embedding_table.requires_grad = False
    trainable = net.trainable_params()
    ema = EMA(net)
    assert [w.name for w in ema.net_weight] == [p.name for p in trainable]
    assert [e.name for e in ema.ema_weight] == ["ema." + p.name for p in trainable]
    assert len(EMA(net, trainable_only=False).ema_weight) == len(list(net.get_parameters()))
    train = prepare_train_network(net, make_optimizer(trainable), zero_stage=stage, ema=ema,
                                  params_split_info=str(tmp_path / "info"))
    assert measure_model_states(train)["ema"] == sum(p.asnumpy().nbytes for p in trainable)  # a group of one


def test_wrapper_has_mindone_attributes(net, tmp_path):
    ms.set_context(mode=ms.GRAPH_MODE)
    manager = nn.DynamicLossScaleUpdateCell(2.0 ** 8, 2, 100)
    train = prepare_train_network(net, nn.SGD(net.trainable_params(), 0.1), scale_sense=manager,
                                  gradient_accumulation_steps=2, verbose=True, params_split_info=str(tmp_path))
    assert train.loss_scaling_manager is manager
    assert train.zero_stage == 0 and train.verbose is True and train.accum_steps == 2
    assert train.accumulated_grads is train.accum_grads and train.cur_accum_step is train.accum_step
    assert train.reducer_flag is False and train.degree == 1 and train.mean is True
    assert callable(train.grad_reducer) and callable(train.run_optimizer)
    train.set_sense_scale(Tensor([64.0], ms.float32))
    _, _, scale = train(*_batch())
    assert float(scale.asnumpy()) == 64.0
    train.set_sense_scale(32.0)
    assert float(train.scale_sense.asnumpy()) == 32.0


@pytest.mark.parametrize("sens", [-1.0, "x", Tensor(np.ones(2, np.float32))])
def test_set_sense_scale_rejects(net, sens, tmp_path):
    train = prepare_train_network(net, nn.SGD(net.trainable_params()), params_split_info=str(tmp_path))
    with pytest.raises(TypeError, match="'sens' must be a positive float or a one-element Tensor"):
        train.set_sense_scale(sens)


@pytest.mark.parametrize("make", [
    lambda p: __import__("mindspore.experimental.optim", fromlist=["AdamW"]).AdamW(p, lr=0.01),
    lambda p: __import__("mindspore.experimental.optim", fromlist=["SGD"]).SGD(p, lr=0.1),
    lambda p: mint.optim.Adam(p, lr=0.01),
])
def test_experimental_optimizers_are_accepted(net, make, tmp_path):
    ms.set_context(mode=ms.GRAPH_MODE)
    train = prepare_train_network(net, make(net.trainable_params()), params_split_info=str(tmp_path))
    before = [p.asnumpy().copy() for p in net.trainable_params()]
    loss, overflow, _ = train(*_batch())
    assert np.isfinite(loss.asnumpy()) and not bool(overflow.asnumpy())
    assert any(not np.array_equal(b, p.asnumpy()) for b, p in zip(before, net.trainable_params()))


def test_split_rule_remembers_the_users_opt_out():
    opted = Parameter(Tensor(np.ones((4, 2), np.float32)), name="opted")
    opted.parallel_optimizer = False
    plain = Parameter(Tensor(np.ones((4, 2), np.float32)), name="plain")
    scalar = Parameter(Tensor(1.0, ms.float32), name="scalar")
    frozen = Parameter(Tensor(np.ones((4, 2), np.float32)), name="frozen", requires_grad=False)
    assert [is_split_candidate(p) for p in (opted, plain, scalar, frozen)] == [False, True, False, False]
    mark_shard_flag(opted, True)  # the flag now says "holds a shard"; the user's choice is kept
    mark_shard_flag(plain, False)
    assert opted.parallel_optimizer is True and plain.parallel_optimizer is False
    assert not is_split_candidate(opted) and is_split_candidate(plain)


def test_parallel_optimizer_input_and_output_stay_apart():
    """The flag as output (holds a shard) never becomes the input of a later preparation."""
    p = Parameter(Tensor(np.ones((4, 2), np.float32)), name="p")
    mark_shard_flag(p, False)  # e.g. stage 0: not a shard, although the user did not opt out
    mark_shard_flag(p, True)
    assert p.parallel_optimizer is True and not user_opted_out(p) and is_split_candidate(p)
    mark_shard_flag(p, False)
    assert not user_opted_out(p)  # the output written last is not read back as an opt-out
    p.zero_opt_out = True  # the documented way to change the choice after a preparation
    assert user_opted_out(p) and not is_split_candidate(p)


# -- issue 48: every MindOne release's names --------------------------------------------------

@pytest.fixture
def data_parallel():
    """One process in ParallelMode.DATA_PARALLEL: a group of one rank, so stages 1-3 really run."""
    ms.set_auto_parallel_context(parallel_mode=ParallelMode.DATA_PARALLEL)
    yield
    ms.reset_auto_parallel_context()


def _zero3_groups(network):
    """The group every ZeRO-3 Cell and parameter wrapper of ``network`` was built with."""
    return {c.optimizer_parallel_group for _, c in network.cells_and_names()
            if isinstance(c, (ZeroCell, pm.ZeroParamWrapper))}


@pytest.mark.parametrize("entry", ["prepare_network", "prepare_train_network"])
def test_op_group_reaches_every_zero3_cell(data_parallel, entry, tmp_path):
    group = world_group()  # the one group a process without a backend has; given, each Cell records it
    for kwargs, expected in (({}, {None}), ({"op_group": group}, {group}), ({"optimizer_parallel_group": group}, {group})):
        net = LossNet(init_weights(TinyNet()))
        if entry == "prepare_network":
            net = prepare_network(net, 3, **kwargs)
        else:
            net = prepare_train_network(net, make_optimizer(net.trainable_params()), zero_stage=3,
                                        params_split_info=str(tmp_path), **kwargs).network
        assert _zero3_groups(net) == expected, kwargs


@pytest.mark.parametrize("stage", [1, 2])
def test_op_group_is_the_group_zero_helper_shards_over(data_parallel, stage, tmp_path):
    net = LossNet(init_weights(TinyNet()))
    train = prepare_train_network(net, make_optimizer(net.trainable_params()), zero_stage=stage,
                                  op_group=world_group(), params_split_info=str(tmp_path))
    assert train.zero_helper.zero_stage == stage and train.zero_helper.op_group == world_group()
    assert train.grad_sync.op_comm.group == world_group()
    # a group this process does not have fails where the long name fails, so the alias reaches it
    failures = []
    for keyword in ("optimizer_parallel_group", "op_group"):
        with pytest.raises(RuntimeError) as info:
            ZeroHelper(make_optimizer(net.trainable_params()), stage, **{keyword: "no_such_group"})
        failures.append(str(info.value))
    assert failures[0] == failures[1]


def test_op_group_keeps_prepare_ema_working(data_parallel):
    net = LossNet(init_weights(TinyNet()))
    ema = EMA(net)
    assert prepare_ema(ema, 3, op_group=world_group()) is ema


def _mindone_group(folder, n=2):
    """Rank files and MindOne-format split-info files (no ``shape``) of a group of ``n`` ranks."""
    rng = np.random.default_rng(3)
    tensors = {"dense.weight": (rng.standard_normal((4, 3)).astype(np.float32), True),
               "adam_m.dense.weight": (rng.standard_normal((4, 3)).astype(np.float32), True),
               "norm.gamma": (rng.standard_normal(5).astype(np.float32), False),
               "global_step": (np.array([7], np.int32), False)}
    os.makedirs(os.path.join(folder, "info"))
    for r in range(n):
        atomic_save_checkpoint({k: split_all(a, n)[r] if split else a for k, (a, split) in tensors.items()},
                               os.path.join(folder, f"net_{r}.ckpt"))
        info = {k: {"split": split, "group_size": n, "rank_id": r} for k, (_, split) in tensors.items()
                if k in ("dense.weight", "norm.gamma")}
        with open(os.path.join(folder, "info", f"params_split_info_{r}.json"), "w") as f:
            json.dump(info, f)
    return os.path.join(folder, "net_{}.ckpt"), os.path.join(folder, "info", "params_split_info_{}.json"), tensors


@pytest.mark.parametrize("options", [{}, {"output_format": "safetensors", "exclude_optimizer_states": True}])
def test_transform_checkpoints_is_convert_checkpoints(tmp_path, options):
    src, info, tensors = _mindone_group(str(tmp_path))
    out = convert_checkpoints(src, info, 2, **options)
    with open(out, "rb") as f:
        converted = f.read()
    os.remove(out)
    assert transform_checkpoints(src, info, 2, **options) == out  # MindOne 0.2.0's call: same file, same name
    with open(out, "rb") as f:
        assert f.read() == converted
    loaded = {k: v.asnumpy() for k, v in ms.load_checkpoint(out, format=out.rsplit(".", 1)[1]).items()}
    assert sorted(loaded) == sorted(k for k in tensors if not (options and k.startswith(("adam_m", "global"))))
    for name, value in loaded.items():
        np.testing.assert_array_equal(value, tensors[name][0])
    with pytest.raises(ValueError, match="'group_size'") as info_t:
        transform_checkpoints(src, info, 0)
    with pytest.raises(ValueError, match="'group_size'") as info_c:
        convert_checkpoints(src, info, 0)
    assert str(info_t.value) == str(info_c.value)


@pytest.mark.parametrize("cls, original", [(pm.Mint_Conv2d, lambda: mint.nn.Conv2d(2, 4, 3, bias=True)),
                                           (pm.Mint_Conv3d, lambda: mint.nn.Conv3d(2, 4, 3, bias=False))])
def test_mint_conv_cells_take_mindones_call(cls, original):
    # mint Conv kernels do not exist on CPU (MindSpore 2.10): structure only, as test_mint_layer_cells_build
    layer = original()
    params = dict(layer.parameters_and_names())
    wrapped = cls(layer, 3, None, None)  # MindOne's call: (net, zero_stage, optimizer_parallel_group, cell_type)
    assert isinstance(wrapped, pm.Conv2d if cls is pm.Mint_Conv2d else pm.Conv3d) and wrapped.is_mint
    assert dict(wrapped.parameters_and_names()) == params  # same Parameter objects, same names
    assert all(p.zero_spec.split for p in params.values())  # sharded over the group (here of one rank)
    assert isinstance(wrapped.weight_zero_gather, pm.ZeroParamWrapper)
    assert (wrapped.bias is None) == (cls is pm.Mint_Conv3d)
    assert pm.PARALLEL_MODULES[type(layer)] is cls  # MindOne's mapping: a PARALLEL_MODULES-style dict works
    below = cls(original(), 0)
    assert not below.weight_zero_gather.sharded and not hasattr(below.weight, "zero_spec")


def test_mint_conv_cells_refuse_other_convolutions():
    with pytest.raises(TypeError, match="'net' must be one of \\['mindspore.mint.nn.layer.conv.Conv2d'\\]"):
        pm.Mint_Conv2d(nn.Conv2d(2, 4, 3), 3)
    with pytest.raises(TypeError, match="Mint_Conv3d.*'net' must be one of"):
        pm.Mint_Conv3d(mint.nn.Conv2d(2, 4, 3), 3)


_DEVICE_RUNS = {}  # make -> (losses, parameters) of its run without offload, checked as it was made


@pytest.mark.parametrize("offload", [True, {"device": "cpu"}, "nvme"])
@pytest.mark.parametrize("make", [
    lambda p: nn.Adam(p, learning_rate=0.01, use_amsgrad=True),
    lambda p: AdamW(p, lr=0.01),
], ids=["amsgrad", "experimental_adamw"])
def test_offload_with_an_optimizer_without_host_update_warns_and_runs_on_the_device(make, offload, caplog, tmp_path):
    ms.set_context(mode=ms.GRAPH_MODE)
    folder = tmp_path / "states"
    if offload == "nvme":
        offload = {"device": "nvme", "path": str(folder)}
    runs = []
    for given in (offload, False):
        if not given and make in _DEVICE_RUNS:  # the run without offload is the same for every ``offload``
            runs.append(_DEVICE_RUNS[make])
            continue
        net = init_weights(TinyNet(with_scalar=False))
        opt = make(net.trainable_params())
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="mindone_zero.offload.host_optimizer"):
            train = prepare_train_network(LossNet(net), opt, optimizer_offload=given, params_split_info=str(tmp_path))
        warned = [r.getMessage() for r in caplog.records if "optimizer_offload" in r.getMessage()]
        if given:
            assert len(warned) == 1 and type(opt).__name__ in warned[0]
            assert "runs on the device, without offload" in warned[0]
        else:
            assert warned == []
        assert not train.offload and train.zero_helper.host_offload is None and not train.zero_helper.optimizer_offload
        # the optimizer keeps its states on the device at full size (offload cuts them to one element)
        shapes = [tuple(p.shape) for p in net.trainable_params()]
        states = find_optimizer_states(opt, shapes)
        assert states and all([tuple(v.shape) for v in values] == shapes for values in states.values())
        losses = [float(train(*_batch())[0].asnumpy()) for _ in range(2)]
        runs.append((losses, [p.asnumpy().copy() for p in net.trainable_params()]))
        KEEP_ALIVE.append(train)
        if not given:
            _DEVICE_RUNS[make] = runs[-1]
    assert runs[0][0] == runs[1][0]  # the same steps as without offload
    assert all(np.array_equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))
    assert not folder.exists()  # an nvme path is not created for an offload that does not run


def test_zero_helper_falls_back_the_same_way(caplog):
    net = init_weights(TinyNet(with_scalar=False))
    with caplog.at_level(logging.WARNING, logger="mindone_zero.offload.host_optimizer"):
        helper = ZeroHelper(AdamW(net.trainable_params(), lr=0.01), 0, optimizer_offload=True)
    assert helper.host_offload is None and "For 'ZeroHelper'" in caplog.text and "AdamW" in caplog.text


KEEP_ALIVE = []  # MindSpore caches compiled Cells by id: keep each case's Cells alive
