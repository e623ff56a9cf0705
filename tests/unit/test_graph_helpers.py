"""The graph helpers of ``mindone_zero.core``: ``narrow`` and ``copy_slice`` (slicing.py) and ``take`` / ``hyper_map``
(graph_tuples.py), in GRAPH_MODE and PYNATIVE_MODE."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn, ops

from mindone_zero.core.graph_tuples import hyper_map, take
from mindone_zero.core.slicing import copy_slice, narrow

ms.set_device("CPU")

CUTS = [((5, 7), 0, 1, 3), ((5, 7), 1, 0, 7), ((5, 7), 1, 6, 1), ((5, 7), -1, 2, 4), ((2, 3, 4), 2, 1, 2),
        ((9,), 0, 4, 5)]


class _Cut(nn.Cell):
    def __init__(self, cut, axis, start, length):
        super().__init__()
        self.cut, self.axis, self.start, self.length = cut, axis, start, length

    def construct(self, x):
        return self.cut(x, self.axis, self.start, self.length)


def _cut(cut, mode, shape, axis, start, length):
    """(``cut`` of an arange tensor of ``shape`` in ``mode``, the tensor, the same cut by numpy indexing)."""
    ms.set_context(mode=mode)
    x = Tensor(np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape))
    index = [slice(None)] * len(shape)
    index[axis] = slice(start, start + length)
    return _Cut(cut, axis, start, length)(x).asnumpy(), x, x.asnumpy()[tuple(index)]


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE])
@pytest.mark.parametrize("shape, axis, start, length", CUTS)
def test_narrow_equals_ops_narrow(mode, shape, axis, start, length):
    got, x, indexed = _cut(narrow, mode, shape, axis, start, length)
    want = _Cut(ops.narrow, axis, start, length)(x).asnumpy()
    assert got.shape == want.shape and np.array_equal(got, want)
    assert np.array_equal(got, indexed)


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE])
@pytest.mark.parametrize("shape, axis, start, length", CUTS)
def test_copy_slice_equals_indexing(mode, shape, axis, start, length):
    got, _, want = _cut(copy_slice, mode, shape, axis, start, length)
    assert got.shape == want.shape and np.array_equal(got, want)


@pytest.mark.parametrize("axis, start, length, named", [(2, 0, 1, "'axis'"), (-3, 0, 1, "'axis'"),
                                                        (1, 5, 3, "'start' 5 and 'length' 3"),
                                                        (0, -1, 2, "'start' -1"), (0, 0, 0, "'length' 0")])
def test_narrow_outside_the_tensor_names_the_argument(axis, start, length, named):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    with pytest.raises(ValueError, match=named):
        narrow(Tensor(np.zeros((5, 7), np.float32)), axis, start, length)


def test_copy_slice_outside_the_tensor_names_the_argument():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    with pytest.raises(ValueError, match="For 'copy_slice', 'start' 5 and 'length' 3"):
        copy_slice(Tensor(np.zeros((5, 7), np.float32)), 1, 5, 3)


_double = ops.MultitypeFuncGraph("double")


@_double.register("Tensor", "Number")
def _double_tensor(x, k):
    return x * 2.0 + k


class _TakeAndMap(nn.Cell):
    def __init__(self, index, ks):
        super().__init__()
        self.index, self.ks = index, ks

    def construct(self, xs):
        picked = take(xs, self.index)
        if not self.index:
            return picked
        return hyper_map(_double, picked, self.ks)


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE])
@pytest.mark.parametrize("index", [(3, 0, 2), (1,), (), (0, 1, 2, 3)])
def test_take_picks_in_index_order_and_hyper_map_maps_each(mode, index):
    ms.set_context(mode=mode)
    xs = tuple(Tensor(np.full((i + 1,), float(i), np.float32)) for i in range(4))
    ks = tuple(10 * j for j in range(len(index)))
    got = _TakeAndMap(index, ks)(xs)
    assert len(got) == len(index)
    for j, (i, y) in enumerate(zip(index, got)):
        assert np.array_equal(y.asnumpy(), xs[i].asnumpy() * 2.0 + ks[j])
