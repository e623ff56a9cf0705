"""[Note: the group mean in the step] in one process: when a train step takes over a stage-3 group's
division by its size, and that the step's one multiplication gives the bits of the two it replaces.
The train steps that use it are checked against plain data parallelism in tests/dist/test_zero_parity.py."""
import numpy as np
import mindspore as ms
import pytest
from mindspore import Tensor, nn

from mindone_zero.core.partition import ShardSpec
from mindone_zero.core.scaling import unscaled
from mindone_zero.zero3.coalesce import build_gather_group
from mindone_zero.zero3.gather_group import GatherGroup, sum_grads_in_backward
from mindone_zero.zero3.param_wrapper import ParamGather


def _group(names, size=2, frozen=False):
    """A Cell holding the coalesced gather of ``names`` (shape (8, 4) each) over ``size`` ranks."""
    gathers = [ParamGather(ShardSpec(n, (8, 4), size, 0, True), ms.float32, None, None, frozen=frozen) for n in names]
    cell = nn.Cell()
    cell.group = build_gather_group(gathers)
    return cell


def _net(*cells):
    net = nn.Cell()
    net.parts = nn.CellList(list(cells))
    return net


def _records(net):
    return [c.gather_record for _, c in net.cells_and_names() if hasattr(c, "gather_record")]


def _divides(net):
    return [c.divides_grads for _, c in net.cells_and_names() if isinstance(c, GatherGroup)]


def test_the_step_takes_the_division_when_every_split_gradient_comes_from_groups_of_one_size():
    net = _net(_group(["a", "b"]), _group(["c", "d"]))
    assert _divides(net) == [True, True]
    assert sum_grads_in_backward(net, _records(net), ["a", "b", "c", "d"]) == 2
    assert _divides(net) == [False, False]


@pytest.mark.parametrize("why, net, names", [
    ("a split gradient no group reduces", lambda: _net(_group(["a", "b"])), ["a", "b", "e"]),
    ("groups of two sizes", lambda: _net(_group(["a", "b"]), _group(["c", "d"], size=4)), ["a", "b", "c", "d"]),
    ("a frozen group reduces nothing", lambda: _net(_group(["a", "b"], frozen=True)), ["a"]),
])
def test_otherwise_nothing_changes(why, net, names):
    net = net()
    before = _divides(net)
    assert sum_grads_in_backward(net, _records(net), names) is None, why
    assert _divides(net) == before and all(before), why


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_one_multiplication_gives_the_bits_of_the_division_then_the_unscale(n, dtype):
    """The step's ``factor / N`` times a summed gradient equals the gradient divided by N, then times
    ``factor`` (what the group's RealDiv and the step's Mul gave), bit for bit, for N a power of two,
    for split and whole gradients mixed."""
    rng = np.random.default_rng(n)
    grads = tuple(Tensor((rng.standard_normal((5, 3)) * 10.0 ** rng.integers(-3, 4)).astype(dtype)) for _ in range(4))
    factor = Tensor(1.0 / 1024, ms.float32)
    index = (1, 0, 1, 1)  # the second gradient is a whole parameter's, a mean already
    got = unscaled(grads, factor, n, index)
    f = np.array(1.0 / 1024, dtype)
    for g, split, out in zip(grads, index, got):
        expected = ((g.asnumpy() / dtype(n)) if split else g.asnumpy()) * f
        assert out.dtype == g.dtype
        np.testing.assert_array_equal(out.asnumpy(), expected.astype(dtype))
    every = unscaled(grads, factor, n)  # every gradient split
    for g, out in zip(grads, every):
        np.testing.assert_array_equal(out.asnumpy(), ((g.asnumpy() / dtype(n)) * f).astype(dtype))
