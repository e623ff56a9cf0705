"""gather_units ([Note: gather units] in mindone_zero/zero3/units.py) in one process: bad values and
code that cannot be threaded raise before anything is modified, naming the argument and the value
(or the Cell and method); in a group of one rank a unit computes what the unsharded network does.
The entry points' checks run in ParallelMode.DATA_PARALLEL (the ``data_parallel`` fixture), where
prepare_network and prepare_train_network shard and write the split info; outside it they modify
nothing at all."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn

from models import LossNet, TinyNet, assert_params_untouched, init_weights, make_optimizer, snapshot_params
from mindone_zero import prepare_network, prepare_train_network
from parallel_modules import Dense, recomputed_cells, shard_network
from tools.lm_model import Block, TransformerLM, build_lm, init_lm_weights, reversal_batch

ms.set_device("CPU")

# the tests set the mode they need; it is put back after each ([Note: leak guard] in tests/leak_guard.py)
pytestmark = pytest.mark.usefixtures("restore_ms_context")

LM = {"vocab_size": 32, "d_model": 16, "n_layers": 2, "d_ff": 24, "max_len": 16, "n_heads": 2}


def _assert_untouched(net, before):
    assert_params_untouched(net, before)
    for _, cell in net.cells_and_names():
        assert "zero3_original_class" not in type(cell).__dict__
        assert not cell._has_config_recompute


def _lm():
    return init_lm_weights(build_lm(LM), 0)


@pytest.mark.parametrize("value", [Block, ("Block",), (Block, 3), (nn.Dense(2, 2),), "Block", "Auto", 1])
@pytest.mark.parametrize("where", ["shard_network", "prepare_network", "prepare_train_network"])
@pytest.mark.usefixtures("data_parallel")
def test_not_a_tuple_of_cell_classes(where, value, tmp_path):
    net = LossNet(init_weights(TinyNet()))
    before = snapshot_params(net)
    with pytest.raises(TypeError) as info:
        if where == "shard_network":
            shard_network(net, gather_units=value)
        elif where == "prepare_network":
            prepare_network(net, 3, gather_units=value)
        else:
            prepare_train_network(net, make_optimizer(net.trainable_params()), zero_stage=3, gather_units=value,
                                  params_split_info=str(tmp_path / "info"))
    assert str(info.value).startswith(f"For '{where}', the argument 'gather_units' must be 'auto', None, () or a "
                                      f"tuple of Cell classes, but got {value!r}")
    _assert_untouched(net, before)
    assert not (tmp_path / "info").exists()


@pytest.mark.parametrize("stage", [0, 1, 2])
@pytest.mark.usefixtures("data_parallel")
def test_stage_below_3(stage, tmp_path):
    net = LossNet(init_weights(TinyNet()))
    with pytest.raises(ValueError, match=rf"For 'prepare_network', the argument 'gather_units' applies to zero_stage "
                                         rf"3 only, but got gather_units=\(<class .*TinyNet'>,\) with "
                                         rf"zero_stage={stage}"):
        prepare_network(net, stage, gather_units=(TinyNet,))
    with pytest.raises(ValueError,
                       match="For 'prepare_train_network', the argument 'gather_units' applies to zero_stage 3"):
        prepare_train_network(net, make_optimizer(net.trainable_params()), zero_stage=stage, gather_units=(TinyNet,),
                              params_split_info=str(tmp_path / "info"))
    assert not (tmp_path / "info").exists()


def test_not_with_zeropp():
    net = LossNet(init_weights(TinyNet()))
    before = snapshot_params(net)
    with pytest.raises(ValueError, match="For 'shard_network', the argument 'gather_units' cannot be combined with "
                                         "ZeRO\\+\\+ options"):
        shard_network(net, zeropp={"quantize_weights": True}, gather_units=(TinyNet,))
    _assert_untouched(net, before)


def test_class_without_instance():
    net = _lm()
    before = snapshot_params(net)
    with pytest.raises(ValueError, match=r"For 'shard_network', the argument 'gather_units' names classes with no "
                                         r"instance in the network: \['TinyNet'\]"):
        shard_network(net, gather_units=(Block, TinyNet))
    _assert_untouched(net, before)


class _Loop(nn.Cell):
    """Calls its Dense layers in a loop over a CellList: the unit's tensors cannot be passed to them."""

    def __init__(self):
        super().__init__()
        self.layers = nn.CellList([nn.Dense(4, 4), nn.Dense(4, 4)])

    def construct(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class _Pair(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(4, 4)
        self.norm = nn.LayerNorm((4,))

    def construct(self, x):
        return self.norm(self.fc(x))


class _Outside(nn.Cell):
    """Calls a Cell of the unit ``pair`` directly, from outside the unit."""

    def __init__(self):
        super().__init__()
        self.pair = _Pair()

    def construct(self, x):
        return self.pair(x) + self.pair.norm(x)


class _Shared(nn.Cell):
    def __init__(self):
        super().__init__()
        self.a = _Pair()
        self.b = _Pair()
        self.b.norm = self.a.norm

    def construct(self, x):
        return self.b(self.a(x))


class _Prebuilt(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = Dense(nn.Dense(4, 4))

    def construct(self, x):
        return self.fc(x)


@pytest.mark.parametrize("make,units,text", [
    (_Loop, (_Loop,), r"Inside gather units \(unit <top> \(_Loop\): Cells \['layers.0', 'layers.1'\]\) a Cell's code "
                      r"runs only when the unit's code calls it as self.<attribute>\(...\)"),
    (_Outside, (_Pair,), r"makes pair.norm \(LayerNorm.construct\) part of the unit pair \(_Pair\), but <top> "
                         r"\(_Outside.construct\) calls it from outside that unit"),
    (_Shared, (_Pair,), r"puts the Cell 'b.norm' in two places"),
    (_Prebuilt, (_Prebuilt,), r"contains the Cell 'fc' \(Dense\) that gathers its own parameters, inside the unit "
                              r"<top> \(_Prebuilt\)"),
])
def test_code_that_cannot_be_threaded(make, units, text):
    net = make()
    before = snapshot_params(net)
    with pytest.raises(ValueError, match=text) as info:
        shard_network(net, gather_units=units)
    assert "gather_units" in str(info.value) or "no construct" in str(info.value)
    _assert_untouched(net, before)


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE])
def test_units_in_a_group_of_one_compute_what_the_network_does(mode):
    """Nested units (the TransformerLM's loop calls unit roots); float16 Dense layers make two
    gather settings in the Block. In one process nothing is gathered (cast-only parts)."""
    ms.set_context(mode=mode)
    ref, net = _lm(), _lm()
    for n in (ref, net):
        for block in n.blocks:
            block.fc1.to_float(ms.float16)
            block.fc2.to_float(ms.float16)
    net = shard_network(net, gather_units=(Block, TransformerLM))
    ids = Tensor(reversal_batch(1, 0, 2, 8, LM["vocab_size"])[0])
    assert np.array_equal(ref(ids).asnumpy(), net(ids).asnumpy())
    assert len(net.blocks[0].zero3_unit_gather.parts) == 2
    # reshard_after_forward ([Note: reshard after forward]): GRAPH_MODE recomputes the units' gathers
    # only, PYNATIVE_MODE the unit roots whole (named); the top Cell is never recomputed
    assert not net._has_config_recompute and all(b.zero3_unit_gather._has_config_recompute for b in net.blocks)
    whole = mode == ms.PYNATIVE_MODE
    assert [b._has_config_recompute for b in net.blocks] == [whole, whole]
    assert ([line.split(" recomputed whole: ")[0] for line in recomputed_cells(net)]
            == (["blocks.0 (Block)", "blocks.1 (Block)"] if whole else []))


def test_cells_the_user_recomputed_stay_recomputed_inside_units():
    """A unit root and a Cell inside another unit marked with recompute() before sharding (MindSpore
    then holds a `_recompute_cell` child, which is not part of the unit)."""
    ms.set_context(mode=ms.GRAPH_MODE)
    ref, net = _lm(), _lm()
    for n in (ref, net):
        n.blocks[0].recompute()
        n.blocks[1].attn.recompute()
    net = shard_network(net, gather_units=(Block,))
    ids = Tensor(reversal_batch(1, 0, 2, 8, LM["vocab_size"])[0])
    assert np.array_equal(ref(ids).asnumpy(), net(ids).asnumpy())
    assert net.blocks[0]._has_config_recompute and net.blocks[1].attn._has_config_recompute


class _Scaled(nn.Cell):
    """Its construct has a default, so it takes the unit's tuple as a keyword-only parameter."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(6, 6)

    def construct(self, x, scale=None):
        y = self.fc(x)
        return y if scale is None else y * scale


class _ArgUnit(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1, self.scaled, self.fc2 = nn.Dense(6, 6), _Scaled(), nn.Dense(6, 4)

    def construct(self, x):
        h = self.fc1(x)
        h = self.scaled(h, 2.0)
        return self.fc2(x=h)


def _kinds(cell):
    import inspect
    return [(name, p.kind.name) for name, p in inspect.signature(type(cell).construct).parameters.items()]


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE])
def test_the_unit_tuple_is_positional_where_every_parameter_is(mode):
    """[Note: unit argument] in mindone_zero/zero3/unit_threading.py: a construct without defaults or
    *args takes the tuple as its last positional parameter, one with a default as a keyword-only one;
    a call passing every parameter positionally passes it positionally, any other call by keyword.
    Both forms compute what the unsharded network does."""
    ms.set_context(mode=mode)
    ref = _ArgUnit()
    net = _ArgUnit()
    for a, b in zip(ref.get_parameters(), net.get_parameters()):
        b.set_data(a.data.copy())
    net = shard_network(net, gather_units=(_ArgUnit,))
    positional = [("self", "POSITIONAL_OR_KEYWORD"), ("x", "POSITIONAL_OR_KEYWORD"),
                  ("zero3_unit", "POSITIONAL_OR_KEYWORD")]
    assert _kinds(net.fc1) == positional and _kinds(net.fc2) == positional
    assert _kinds(net.scaled) == [("self", "POSITIONAL_OR_KEYWORD"), ("x", "POSITIONAL_OR_KEYWORD"),
                                  ("scale", "POSITIONAL_OR_KEYWORD"), ("zero3_unit", "KEYWORD_ONLY")]
    import inspect
    root = inspect.getsource(type(net).construct)
    assert "self.fc1(x, zero3_unit)" in root
    assert "self.scaled(h, 2.0, zero3_unit=zero3_unit)" in root
    assert "self.fc2(x=h, zero3_unit=zero3_unit)" in root
    assert "self.fc(x, zero3_unit)" in inspect.getsource(type(net.scaled).construct)
    x = Tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(2, 6))
    assert np.array_equal(ref(x).asnumpy(), net(x).asnumpy())
