"""gather_units="auto", the default ([Note: units by default] in mindone_zero/zero3/auto_units.py): which
classes are a network's repeated blocks, and what shard_network does with them in one process (a group
of one rank, where every candidate is split over one rank and nothing is gathered)."""
import logging

import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn

from mindone_zero import prepare_network, prepare_train_network
from mindone_zero.zero3.auto_units import repeated_blocks
from mindone_zero.zero3.options import Stage3Options
from mindone_zero.zero3.state import options_of
from parallel_modules import Dense, shard_network
from tools.lm_model import Block, LMLoss, build_lm, init_lm_weights, reversal_batch

ms.set_device("CPU")

pytestmark = pytest.mark.usefixtures("restore_ms_context")

LM = {"vocab_size": 32, "d_model": 16, "n_layers": 2, "d_ff": 24, "max_len": 16, "n_heads": 2}


def _every(_):
    return True


class _Two(nn.Cell):
    """Two layers that hold parameters: a block."""

    def __init__(self, n=4):
        super().__init__()
        self.fc = nn.Dense(n, n)
        self.norm = nn.LayerNorm((n,))

    def construct(self, x):
        return self.norm(self.fc(x))


class _Other(_Two):
    pass


class _Stack(nn.Cell):
    def __init__(self, cells, cls=nn.CellList):
        super().__init__()
        self.layers = cls(cells)

    def construct(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class _Experts(nn.Cell):
    """A block holding a list of blocks: only the outer one is a unit."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm((4,))
        self.experts = nn.CellList([_Two(), _Two()])

    def construct(self, x):
        return self.experts[1](self.experts[0](self.norm(x)))


def test_the_lm_blocks_are_found():
    assert repeated_blocks(build_lm(LM), _every) == (Block,)
    assert repeated_blocks(_Stack([_Two(), _Two()], nn.SequentialCell), _every) == (_Two,)


@pytest.mark.parametrize("net", [
    _Stack([_Two()]),                                  # one
    _Stack([_Two(), _Other()]),                        # two classes
    _Stack([nn.Dense(4, 4), nn.Dense(4, 4)]),          # layers, not blocks
    _Stack([nn.Dense(4, 4), nn.ReLU(), nn.Dense(4, 4)], nn.SequentialCell),
    _Two(),                                            # no list
], ids=["one", "two_classes", "layers", "mixed", "no_list"])
def test_what_is_not_a_repeated_block(net):
    assert repeated_blocks(net, _every) == ()


def test_a_block_needs_two_cells_holding_split_parameters():
    net = _Stack([_Two(), _Two()])
    assert repeated_blocks(net, lambda p: "norm" not in p.name) == ()
    assert repeated_blocks(net, lambda p: "gamma" in p.name or "weight" in p.name) == (_Two,)
    assert repeated_blocks(net, lambda p: False) == ()


def test_lists_inside_a_block_are_not_searched_and_the_top_is_never_a_unit():
    assert repeated_blocks(_Stack([_Experts(), _Experts()]), _every) == (_Experts,)
    top = nn.CellList([_Two(), _Two()])
    assert repeated_blocks(top, _every) == ()


def _ids():
    return Tensor(reversal_batch(1, 0, 2, 8, LM["vocab_size"])[0])


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE])
def test_by_default_the_blocks_are_units(mode):
    ms.set_context(mode=mode)
    ref, net = init_lm_weights(build_lm(LM), 0), init_lm_weights(build_lm(LM), 0)
    net = shard_network(net)
    assert np.array_equal(ref(_ids()).asnumpy(), net(_ids()).asnumpy())
    assert all(hasattr(b, "zero3_unit_gather") for b in net.blocks)
    assert not hasattr(net, "zero3_unit_gather")


@pytest.mark.parametrize("given", [dict(gather_units=None), dict(gather_units=()),
                                   dict(zeropp={"quantize_weights": True})], ids=["none", "empty", "zeropp"])
def test_none_and_zeropp_gather_per_cell(given):
    ms.set_context(mode=ms.GRAPH_MODE)
    net = shard_network(init_lm_weights(build_lm(LM), 0), **given)
    assert not any(hasattr(c, "zero3_unit_gather") for _, c in net.cells_and_names())


class _LoopBlock(_Stack):
    """A block whose code loops over its layers: it cannot be a unit."""

    def __init__(self):
        super().__init__([nn.Dense(4, 4), nn.Dense(4, 4)])


def test_blocks_that_cannot_be_units_fall_back_to_a_gather_per_cell(caplog):
    """``gather_units=(_LoopBlock,)`` raises; the default logs why and gathers per Cell."""
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    ref = _Stack([_LoopBlock(), _LoopBlock()])
    net = _Stack([_LoopBlock(), _LoopBlock()])
    for (_, a), (_, b) in zip(ref.parameters_and_names(), net.parameters_and_names()):
        b.set_data(a.data.copy())
    assert repeated_blocks(net, _every) == (_LoopBlock,)
    with pytest.raises(ValueError, match="Inside gather units"):
        shard_network(_Stack([_LoopBlock(), _LoopBlock()]), gather_units=(_LoopBlock,))
    with caplog.at_level(logging.INFO, logger="mindone_zero.zero3.shard"):
        net = shard_network(net)
    assert "the repeated blocks ['_LoopBlock'] gather per reading Cell, not as units" in caplog.text
    assert not any(hasattr(c, "zero3_unit_gather") for _, c in net.cells_and_names())
    x = Tensor(np.arange(8, dtype=np.float32).reshape(2, 4))
    assert np.array_equal(ref(x).asnumpy(), net(x).asnumpy())


@pytest.mark.usefixtures("data_parallel")
def test_the_network_keeps_what_the_default_did(tmp_path):
    """``options_of`` holds the classes the default made units, or None; a later entry point given
    another value raises naming both ([Note: stage-3 options] in mindone_zero/zero3/options.py)."""
    ms.set_context(mode=ms.GRAPH_MODE)
    lm = prepare_network(LMLoss(init_lm_weights(build_lm(LM), 0)), 3)
    assert options_of(lm) == [Stage3Options(gather_units=(Block,))]
    with pytest.raises(ValueError, match=r"'gather_units': got None, the network has \(<class 'tools.lm_model.Block'>,\)"):
        prepare_train_network(lm, nn.Momentum(lm.trainable_params(), 0.1, 0.9), zero_stage=3, gather_units=None,
                              params_split_info=str(tmp_path / "info"))
    train = prepare_train_network(lm, nn.Momentum(lm.trainable_params(), 0.1, 0.9), zero_stage=3,
                                  params_split_info=str(tmp_path / "info"))
    assert options_of(train.network) == [Stage3Options(gather_units=(Block,))]
    stack = prepare_network(_Stack([nn.Dense(4, 4), nn.Dense(4, 4)]), 3)
    assert options_of(stack) == [Stage3Options(gather_units=None)]


@pytest.mark.parametrize("given", [dict(parallel_modules={nn.Dense: Dense}),
                                   dict(special_cases_parallel_module={nn.Dense: Dense})],
                         ids=["parallel_modules", "special_cases"])
def test_a_module_map_given_keeps_the_layers_replaced(given):
    """Cells inside a unit are not replaced: a caller who names layer classes gets them."""
    ms.set_context(mode=ms.GRAPH_MODE)
    net = shard_network(init_lm_weights(build_lm(LM), 0), **given)
    assert not any(hasattr(c, "zero3_unit_gather") for _, c in net.cells_and_names())
    assert isinstance(net.blocks[0].fc1, Dense)
