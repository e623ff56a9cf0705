"""One-process tests of what ``shard_network`` keeps from the Cells it replaces or rewrites:
user attributes, flags, buffers, hooks, ``parallel_optimizer = False`` and ``recompute()``
([Note: carried state] in ``mindone_zero/zero3/carry.py``). The numerical proof of recompute over
2 and 4 ranks is in tests/dist/test_zero3_network.py (``*_recompute`` cases).
"""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, Tensor, nn
from mindspore.common.recompute import _RecomputeCell

import test_parallel_modules as base
from test_parallel_modules import GRAPH_AND_PYNATIVE, PYNATIVE, _SumLoss, zm

mode = base.mode  # the fixture the mode markers use

import parallel_modules as pm  # noqa: E402
from mindone_zero.zero3.carry import is_recompute_scoped, recompute_options  # noqa: E402


def _loss_and_grads(net, *inputs):
    loss = _SumLoss(net)
    value, grads = ms.value_and_grad(loss, None, loss.trainable_params())(*inputs)
    return float(value.asnumpy()), [g.asnumpy() for g in grads]


class _Holder(nn.Cell):
    def __init__(self, cell):
        super().__init__()
        self.cell = cell

    def construct(self, x):
        return self.cell(x)


def _wraps_current_construct(cell) -> bool:
    """Whether the PYNATIVE recompute wrapper of ``cell`` runs ``cell``'s construct as it is now."""
    wrapper = cell._recompute_cell
    block = wrapper.wrap_cell.function if isinstance(wrapper, _RecomputeCell) else (
        dict(zip(wrapper.__code__.co_freevars, wrapper.__closure__))["block"].cell_contents)
    return block.__self__ is cell and block.__func__ is type(cell).construct


@PYNATIVE
def test_replaced_layer_keeps_user_state(mode):
    dense = nn.Dense(3, 4)
    dense.bias.parallel_optimizer = False
    dense.note = "kept"
    dense.extra = Parameter(Tensor(np.ones(2, np.float32)), name="extra")
    dense.side = nn.ReLU()
    dense.register_buffer("buf", Tensor(np.zeros(2, np.float32)))
    dense.set_train(True)
    extra_name = _Holder(dense).cell.extra.name
    calls = []
    pre = dense.register_forward_pre_hook(lambda cell, args: calls.append(("pre", type(cell).__name__)))
    dense.register_forward_hook(lambda cell, args, out: calls.append(("fwd", type(cell).__name__)))
    dense.register_backward_hook(lambda cell, gin, gout: calls.append(("bwd", type(cell).__name__)))
    net = pm.shard_network(_Holder(dense))
    new = net.cell
    assert isinstance(new, pm.Dense) and new is not dense
    assert new.note == "kept" and new.extra is dense.extra and new.extra.name == extra_name and new.side is dense.side
    assert new.training and isinstance(new.buf, Tensor)
    assert new.weight.zero_spec.split and not new.bias.zero_spec.split  # opted out: stays whole
    x = Tensor(np.ones((2, 3), np.float32))
    _loss_and_grads(net, x)
    assert calls == [("pre", "Dense"), ("fwd", "Dense"), ("bwd", "Dense")]
    pre.remove()  # the user's handle still acts on the replacement
    calls.clear()
    net(x)
    assert calls == [("fwd", "Dense")]


def test_shard_fn_cannot_be_carried():
    dense = nn.Dense(3, 4)
    object.__setattr__(dense, "_shard_fn", lambda *args: args)  # what Cell.shard() leaves
    net = _Holder(dense)
    with pytest.raises(ValueError, match=r"Cell.shard\(\) set"):
        pm.shard_network(net)
    assert net.cell is dense and not hasattr(dense.weight, "zero_spec")


@PYNATIVE
def test_recompute_wraps_the_new_construct(mode):
    net = pm.shard_network(zm.build_recompute())
    for name in ("embed", "conv", "proj", "block", "head", "norm"):
        cell = getattr(net, name)
        assert _wraps_current_construct(cell), name
    assert isinstance(net.proj, pm.Dense) and "zero3_original_class" in type(net.block).__dict__
    # The LayerNorm region holds a gather: recomputed reentrant ([Note: non-reentrant recompute]).
    assert isinstance(net.norm._recompute_cell, _RecomputeCell)


def test_recompute_scope_covers_gathers_of_recomputed_cells_only():
    net = pm.shard_network(zm.build_recompute())
    for name in ("embed", "conv", "proj", "block", "head", "norm"):
        cells = [c for _, c in getattr(net, name).cells_and_names()]
        assert all(is_recompute_scoped(c) and c._has_config_recompute for c in cells), name
    gathers = [c for _, c in getattr(net, "head").cells_and_names() if isinstance(c, pm.ZeroParamWrapper)]
    assert len(gathers) == 3  # head.shift (generic), head.out weight and bias (replaced child)
    assert not is_recompute_scoped(net.out_scale_zero_gather) and not is_recompute_scoped(net)


@GRAPH_AND_PYNATIVE
def test_recomputed_network_matches_unsharded(mode):
    ref, net = zm.build_recompute(), pm.shard_network(zm.build_recompute())
    ids, img, _ = zm.make_batch(5, 0)
    ref_loss, ref_grads = _loss_and_grads(ref, ids, img)
    loss, grads = _loss_and_grads(net, ids, img)
    assert abs(loss - ref_loss) <= 1e-5 * max(1.0, abs(ref_loss))
    for a, b in zip(grads, ref_grads):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


class _TwoRegions(nn.Cell):
    """A non-reentrant recompute region followed by a reentrant one: MindSpore 2.10 fails in
    backward when the first holds a custom-bprop Cell (a gather), see carry.py."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm((7,))
        self.norm.recompute(use_reentrant=False, early_stop=False)
        self.out = nn.Dense(7, 7, weight_init="ones", bias_init="ones")
        self.out.recompute()

    def construct(self, x):
        return self.out(self.norm(x))


@PYNATIVE
def test_non_reentrant_region_before_reentrant_region_runs(mode):
    x = Tensor(np.arange(14, dtype=np.float32).reshape(2, 7) / 10)
    ref_loss, ref_grads = _loss_and_grads(_TwoRegions(), x)
    net = pm.shard_network(_TwoRegions())
    loss, grads = _loss_and_grads(net, x)
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    for a, b in zip(grads, ref_grads):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@PYNATIVE
def test_output_recompute_keeps_its_options(mode):
    ref, cell = zm.Scale(3), zm.Scale(3)
    cell.recompute(output_recompute=True, early_stop=False)
    options = recompute_options(cell)
    net = pm.shard_network(_Holder(cell))
    assert recompute_options(net.cell) == options and options["output_recompute"] and not options["use_reentrant"]
    assert _wraps_current_construct(net.cell)
    x = Tensor(np.full((2, 3), 2.0, np.float32))
    assert _loss_and_grads(net, x)[0] == _loss_and_grads(_Holder(ref), x)[0]


@PYNATIVE
def test_user_replacement_gets_hooks_and_recompute(mode):
    shift = zm.Shift(4)
    shift.recompute()
    calls = []
    shift.register_forward_hook(lambda cell, args, out: calls.append(type(cell).__name__))
    net = pm.shard_network(_Holder(shift), parallel_modules={zm.Shift: zm.ShiftZero3})
    assert isinstance(net.cell, zm.ShiftZero3) and _wraps_current_construct(net.cell)
    net(Tensor(np.ones((2, 4), np.float32)))
    assert calls == ["ShiftZero3"]


@PYNATIVE
def test_standalone_layer_cell_reapplies_recompute(mode):
    dense = nn.Dense(3, 2)
    dense.recompute()
    wrapped = pm.Dense(dense, 3)
    assert _wraps_current_construct(wrapped) and is_recompute_scoped(wrapped.weight_zero_gather)
    assert "_recompute_cell" not in wrapped._cells or wrapped._recompute_cell is not dense._recompute_cell
