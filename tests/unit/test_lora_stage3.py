"""Issue 57 in one process: what stage 3 makes of a LoRA model (frozen parameters, PEFT's reads, names).

The multi-process behaviour (training against stage 0, the frozen blocks per rank, the comm plan) is
tests/dist/test_lora.py; ``gathered_parameters`` over ranks is tests/dist/test_gathered.py.
"""
import inspect

import numpy as np
import mindspore as ms
import pytest
from mindspore import Parameter, Tensor, mint, nn

import parallel_modules as pm
from lora_models import LoraBase, LoraLinear, build_own_lora
from mindone_zero import gathered_parameters, load_full_checkpoint, prepare_network
from mindone_zero.checkpoint.peft_names import peft_names
from mindone_zero.zero3.frozen import in_place_state
from models import micro_batch


def test_frozen_weights_are_split_and_running_state_is_not():
    """A frozen floating weight follows the split rule ([Note: split rule]); BatchNorm's moving
    statistics, which its forward pass writes, and an integer counter stay whole without a record."""
    net = nn.SequentialCell([nn.Dense(4, 4), nn.BatchNorm1d(4)])
    net[0].weight.requires_grad = False
    net.counter = Parameter(Tensor(np.zeros(4, np.int32)), name="counter", requires_grad=False)
    stats = [net[1].moving_mean, net[1].moving_variance]
    assert in_place_state(tuple(net.cells_and_names())) == {id(p) for p in stats}
    net = pm.shard_network(net)
    assert net[0].weight.zero_spec.split and net[0].weight.zero_param.spec.split
    for p in stats + [net.counter]:
        assert getattr(p, "zero_spec", None) is None, p.name


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE])
def test_peft_reads_through_locals_and_dtype_compute_the_same(mode):
    """``lora_A = self.lora_A[adapter]; x.astype(lora_A.weight.dtype); lora_B(lora_A(x))``: the
    metadata read needs no gather, the calls gather in the replaced layers."""
    previous = ms.get_context("mode")
    ms.set_context(mode=mode)
    try:
        ref, net = build_own_lora(), build_own_lora()
        x = Tensor(micro_batch(0, 0, 1, 0, 1)[0])
        expected = ref(x).asnumpy()
        net = pm.shard_network(net)
        assert isinstance(net.q_proj.lora_A["default"], pm.Linear) and isinstance(net.q_proj.base_layer, pm.Dense)
        np.testing.assert_allclose(net(x).asnumpy(), expected, rtol=1e-6, atol=1e-6)
    finally:
        ms.set_context(mode=previous)


class _ShapeThroughLocal(LoraLinear):
    def construct(self, x):
        layer = self.lora_A[self.active_adapters[0]]
        return x.reshape(layer.weight.shape[0], -1)


class _ValueThroughLocal(LoraLinear):
    def construct(self, x):
        for name in self.active_adapters:
            weight = self.lora_A[name].weight
            x = ops_matmul(x, weight.T)
        return x


def ops_matmul(a, b):
    return mint.matmul(a, b)


def test_shape_through_a_local_is_the_full_shape_and_a_value_read_raises():
    """A ``.shape`` read through a local variable becomes the full shape (no gather); a value read of
    a sharded parameter that way cannot be gathered and raises, naming it, before anything changes."""
    net = pm.shard_network(nn.SequentialCell([_ShapeThroughLocal(nn.Dense(8, 8))]))
    assert "x.reshape((4, 8)[0], -1)" in inspect.getsource(type(net[0]).construct)
    bad = nn.SequentialCell([_ValueThroughLocal(nn.Dense(8, 8))])
    with pytest.raises(ValueError, match=r"reads the sharded parameter\(s\) .*lora_A.default.weight.* through"):
        pm.shard_network(bad)
    assert getattr(bad[0].lora_A["default"].weight, "zero_spec", None) is None


class _Model(nn.Cell):
    def __init__(self, model):
        super().__init__()
        self.model = model


class _PeftLike(nn.Cell):
    """PEFT's names: ``base_model.model.<model>``, tuner layers holding ``base_layer``."""

    def __init__(self, model):
        super().__init__()
        self.base_model = _Model(model)

    def construct(self, ids):
        return self.base_model.model(ids)


def test_a_base_checkpoint_loads_into_a_peft_wrapped_network_without_a_name_map(tmp_path):
    base = LoraBase()
    ms.save_checkpoint(base, str(tmp_path / "base.ckpt"))
    model = LoraBase()
    for name in ("q_proj", "v_proj"):
        setattr(model, name, LoraLinear(getattr(model, name)))
    wrapped = _PeftLike(model)
    aliases, adapters = peft_names(wrapped)
    assert aliases["q_proj.weight"] == "base_model.model.q_proj.base_layer.weight"
    assert adapters == {f"base_model.model.{t}.lora_{ab}.default.weight" for t in ("q_proj", "v_proj")
                        for ab in "AB"}
    lora_before = wrapped.base_model.model.q_proj.lora_A["default"].weight.asnumpy().copy()
    network = prepare_network(wrapped, zero_stage=3)
    assert load_full_checkpoint(network, str(tmp_path / "base.ckpt")) == ([], [])
    with gathered_parameters(network.get_parameters()):
        np.testing.assert_array_equal(network.base_model.model.q_proj.base_layer.weight.asnumpy(),
                                      base.q_proj.weight.asnumpy())
        np.testing.assert_array_equal(network.base_model.model.q_proj.lora_A["default"].weight.asnumpy(), lora_before)


def test_gathered_parameters_checks_its_arguments_before_anything_changes():
    net = prepare_network(nn.Dense(4, 2), zero_stage=3)
    before = net.weight.asnumpy().copy()
    with pytest.raises(TypeError, match="'params' must be a Parameter or an iterable of Parameters"):
        gathered_parameters(3)
    with pytest.raises(TypeError, match="'params' must hold only Parameters"):
        gathered_parameters([net.weight, Tensor(np.ones(2, np.float32))])
    with pytest.raises(ValueError, match=r"'modifier_rank' must be None or an integer in \[0, 1\)"):
        gathered_parameters(net.trainable_params(), modifier_rank=1)
    np.testing.assert_array_equal(net.weight.asnumpy(), before)
    with gathered_parameters(net.weight, modifier_rank=0):  # one process: nothing is split over ranks
        assert net.weight.shape == (2, 4)


def test_gather_full_params_of_some_parameters():
    """By name or trainable only; a wrong selection raises before any gather."""
    from mindone_zero import gather_full_params, prepare_train_network

    dense = nn.Dense(4, 2)
    dense.bias.requires_grad = False
    net = nn.WithLossCell(dense, nn.MSELoss())
    train = prepare_train_network(net, nn.SGD(net.trainable_params()), zero_stage=3)
    assert list(gather_full_params(train, trainable_only=True)) == ["weight"]
    assert list(gather_full_params(train, names=["bias"])) == ["bias"]
    with pytest.raises(TypeError, match="'names' must be an iterable of str"):
        gather_full_params(train, names="bias")
    with pytest.raises(ValueError, match=r"'names' holds names that 'train_net' does not have among its trainable "
                                         r"parameters: \['bias'\]"):
        gather_full_params(train, names=["bias"], trainable_only=True)
    with pytest.raises(TypeError, match="'trainable_only' must be a bool"):
        gather_full_params(train, trainable_only=1)


def _inside_a_graph(params):
    @ms.jit
    def step(x):
        with gathered_parameters(params):
            y = x + 1
        return y

    return step(Tensor(np.ones(2, np.float32)))


def test_gathered_parameters_inside_a_compiled_graph_raises_and_changes_nothing():
    """A graph compiles no ``gathered_parameters`` block: MindSpore refuses it when it compiles (the object
    is not a ``jit_class``), and a traced call raises our RuntimeError; no parameter changed."""
    from mindone_zero.core.ms_internals import in_compiled_graph

    net = prepare_network(nn.Dense(4, 2), zero_stage=3)
    before = net.weight.asnumpy().copy()
    with pytest.raises((TypeError, RuntimeError)):
        _inside_a_graph(net.trainable_params())
    np.testing.assert_array_equal(net.weight.asnumpy(), before)
    assert in_compiled_graph() is False
