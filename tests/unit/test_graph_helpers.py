"""The graph helpers of ``mindone_zero.core``: ``narrow`` and ``copy_slice`` (slicing.py) and ``take`` / ``hyper_map``
(graph_tuples.py), in GRAPH_MODE and PYNATIVE_MODE."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn, ops

from mindone_zero.core.graph_tuples import hyper_map, take
from mindone_zero.core import slicing
from mindone_zero.core.slicing import copy_slice, cut_args, narrow, narrow_cut, run_args

ms.set_device("CPU")

# the tests set the mode they need; it is put back after each ([Note: leak guard] in tests/leak_guard.py)
pytestmark = pytest.mark.usefixtures("restore_ms_context")

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


# pieces of a flat (axis 0) or (2, S) (axis 1) buffer: widths per piece, the shape each is reshaped to
_PIECES = [(3, (3,))] + [(6, (2, 3))] * 3 + [(6, (3, 2))] + [(1, (1,))] * 5


class _CutAll(nn.Cell):
    def __init__(self, cuts, axis):
        super().__init__()
        self.cuts, self.axis = cuts, axis

    def construct(self, x):
        return narrow_cut(x, self.cuts, self.axis)


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("max_runs", [16, 2])  # in runs; one Slice each (more runs than the limit)
def test_pieces_cut_in_runs_or_one_slice_each_are_the_numpy_pieces(mode, axis, max_runs, monkeypatch):
    # [Note: runs of pieces]: equal neighbours share a run; a shape or width change starts a new one
    monkeypatch.setattr(slicing, "MAX_RUNS", max_runs)
    ms.set_context(mode=mode)
    widths = [w for w, _ in _PIECES]
    offsets = [int(o) for o in np.cumsum([0] + widths[:-1])]
    rows = 2 if axis == 1 else 1
    shape = (rows, sum(widths)) if axis == 1 else (sum(widths),)
    shapes = [(rows * s[0],) + s[1:] if axis == 1 else s for _, s in _PIECES]
    runs = run_args(shape, axis, offsets, widths, shapes)
    assert [r[2][axis] for r in runs] == [1, 3, 1, 5]  # pieces per run
    cuts = cut_args(shape, axis, offsets, widths, shapes)
    assert (cuts[0] is not None) == (max_runs == 16)  # 4 runs of 10 pieces pay; over the limit they do not
    assert not slicing.runs_pay(8, 5)  # runs of fewer than two pieces on average do not pay
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    got = _CutAll(cuts, axis)(Tensor(x))
    assert len(got) == len(_PIECES)
    for piece, offset, width, want_shape in zip(got, offsets, widths, shapes):
        want = x[..., offset:offset + width] if axis == 1 else x[offset:offset + width]
        np.testing.assert_array_equal(piece.asnumpy(), want.reshape(want_shape))


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE])
def test_pieces_cut_along_axis_1_in_the_shape_of_their_columns_are_the_numpy_columns(mode):
    # [Note: runs of pieces]: a run whose pieces keep their (rows, width) shape needs no reshape after the Unstack
    ms.set_context(mode=mode)
    widths = [w for w, _ in _PIECES]
    offsets = [int(o) for o in np.cumsum([0] + widths[:-1])]
    shape = (2, sum(widths))
    shapes = [(2, w) for w in widths]
    cuts = cut_args(shape, 1, offsets, widths, shapes)
    assert cuts[0] is not None and [r[2][1] for r in cuts[0]] == [1, 4, 5]  # as columns the fifth piece joins the run of width 6
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    got = _CutAll(cuts, 1)(Tensor(x))
    assert len(got) == len(_PIECES)
    for piece, offset, width in zip(got, offsets, widths):
        np.testing.assert_array_equal(piece.asnumpy(), x[:, offset:offset + width])


@pytest.mark.parametrize("axis, named", [(2, "'axis'"), (-1, "'axis'")])
def test_run_args_outside_the_buffer_names_the_argument(axis, named):
    with pytest.raises(ValueError, match=named):
        run_args((4, 6), axis, [0], [6], [(4, 6)])
    with pytest.raises(ValueError, match="'length'"):
        run_args((6,), 0, [0, 3], [3, 4], [(3,), (4,)])
