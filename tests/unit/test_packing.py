"""[Note: packed layout] in one process: pack/unpack round trips with padding and mixed shapes, the
reduce-scatter layout against the per-parameter one, and the buckets of ``BucketedComm`` cut by it."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn, ops

from mindone_zero.core.packing import PackedLayout
from mindone_zero.core.partition import ShardSpec, split_array
from mindone_zero.train.fusion import BucketedComm

# the tests set the mode they need; it is put back after each ([Note: leak guard] in tests/leak_guard.py)
pytestmark = pytest.mark.usefixtures("restore_ms_context")

SHAPES = [(7, 15), (15, 3), (5,), (8, 2), (1, 4)]


def _layout(n):
    specs = [ShardSpec(f"p{i}", shape, n, 0, True) for i, shape in enumerate(SHAPES)]
    return (tuple(int(np.prod(s.shard_shape)) for s in specs), tuple(tuple(s.padded_shape) for s in specs),
            tuple(s.shape[0] for s in specs), tuple(s.pad for s in specs), tuple(tuple(s.shard_shape) for s in specs))


@pytest.mark.parametrize("views", [False, True])
@pytest.mark.parametrize("n", [2, 3, 4])
def test_all_gathered_buffer_unpacks_to_the_full_tensors(n, views):
    rng = np.random.default_rng(n)
    fulls = [rng.standard_normal(shape).astype(np.float32) for shape in SHAPES]
    numels, padded, rows, _, _ = _layout(n)
    layout = PackedLayout(numels, n, views)
    # the all-gather: every rank's flat buffer, concatenated in rank order
    bufs = [layout.pack([Tensor(split_array(f, n, r)) for f in fulls]).asnumpy() for r in range(n)]
    assert all(b.shape == (sum(numels),) for b in bufs)
    cols = layout.unpack_gathered(Tensor(np.concatenate(bufs)))
    for i, want in enumerate(fulls):
        assert cols[i].shape == (n, numels[i])
        got = cols[i].reshape(padded[i]).asnumpy()[:rows[i]]
        assert got.shape == want.shape
        assert np.array_equal(got, want)


@pytest.mark.parametrize("views", [False, True])
@pytest.mark.parametrize("n", [2, 4])
def test_reduce_scattered_buffer_holds_each_parameters_block_bitwise(n, views):
    rng = np.random.default_rng(10 + n)
    numels, _, _, pads, shard_shapes = _layout(n)
    layout = PackedLayout(numels, n, views)
    grads = [[rng.standard_normal(shape).astype(np.float32) for shape in SHAPES] for _ in range(n)]
    packed = [layout.pack_rank_major([Tensor(np.pad(g, [(0, p)] + [(0, 0)] * (g.ndim - 1)))
                                      for g, p in zip(grads[r], pads)]).asnumpy() for r in range(n)]
    total = packed[0]
    for buf in packed[1:]:
        total = total + buf  # the same summation order as the per-parameter reference below
    size = sum(numels)
    for rank in range(n):
        block = Tensor(total[rank * size:(rank + 1) * size] / n)
        shards = layout.unpack_shards(block)
        for i, got in enumerate(shards):
            got = got.reshape(shard_shapes[i])
            summed = grads[0][i]
            for r in range(1, n):
                summed = summed + grads[r][i]
            want = split_array(summed, n, rank) / n
            assert got.shape == want.shape
            assert np.array_equal(got.asnumpy(), want), (rank, SHAPES[i])


class _OneRankComm:
    """Rank ``rank`` of ``size`` whose peers send what it sends: all-gather repeats its input,
    reduce-scatter returns its own block of its input (a sum over one rank)."""

    group = "one"

    def __init__(self, size, rank):
        self.size, self.rank = size, rank

    def all_gather(self, x):
        return ops.concat([x] * self.size, 0)

    def reduce_scatter(self, x):
        rows = x.shape[0] // self.size
        return x[self.rank * rows:(self.rank + 1) * rows]


@pytest.mark.parametrize("n, rank", [(2, 1), (4, 2)])
def test_buckets_use_the_packed_layout(n, rank):
    shapes = [(8, 3), (4,), (12, 2, 2)]  # padded full shapes: dim 0 divides by n
    fulls = tuple(Tensor(np.arange(int(np.prod(s)), dtype=np.float32).reshape(s) + 100 * i)
                  for i, s in enumerate(shapes))
    rs = BucketedComm(_OneRankComm(n, rank), shapes, fulls, bucket_size=1 << 20)
    assert rs.buckets == ((0, 1, 2),)
    for got, full in zip(rs.reduce_scatter(fulls), fulls):
        assert np.array_equal(got.asnumpy(), split_array(full.asnumpy(), n, rank))
    shards = tuple(Tensor(split_array(f.asnumpy(), n, rank)) for f in fulls)
    ag = BucketedComm(_OneRankComm(n, rank), [s.shape for s in shards], shards, bucket_size=1 << 20)
    for got, shard in zip(ag.all_gather(shards), shards):
        assert np.array_equal(got.asnumpy(), np.concatenate([shard.asnumpy()] * n))
    for got, shard in zip(ag.all_gather_rows(shards), shards):  # the (N, shard elements) rows of the buffer
        assert np.array_equal(got.asnumpy(), np.stack([shard.asnumpy().reshape(-1)] * n))


class _OneRankCell(nn.Cell):
    """``_OneRankComm`` as a Cell, callable from a GRAPH_MODE ``construct``."""

    def __init__(self, size, rank):
        super().__init__()
        self.size, self.rank, self.group = size, rank, "one"

    def all_gather(self, x):
        return ops.concat([x] * self.size, 0)

    def reduce_scatter(self, x):
        rows = x.shape[0] // self.size
        return ops.StridedSlice()(x, (self.rank * rows,) + (0,) * (x.ndim - 1), (self.rank * rows + rows,) + x.shape[1:],
                                  (1,) * x.ndim)

    def all_reduce_mean(self, x):
        return x


class _Collectives(nn.Cell):
    def __init__(self, rs, ag, ar):
        super().__init__()
        self.rs, self.ag, self.ar = rs, ag, ar

    def construct(self, fulls, shards):
        return self.rs.reduce_scatter(fulls, True), self.ag.all_gather(shards), self.ar.all_reduce_mean(fulls)


@pytest.mark.parametrize("n, rank", [(2, 1), (4, 2)])
@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE])
def test_results_of_several_buckets_and_of_tensors_sent_alone_come_back_in_order(mode, n, rank):
    # [Note: one map out of the buckets]: buckets (0, 1), (2,) alone, (3, 4), the all-reduce's in ring
    # rows at N=4 on CPU ([Note: chunk-aligned all-reduce]); the reduce-scatter's mean divides each
    # bucket once
    ms.set_context(mode=mode)
    shapes = [(8, 3), (4,), (12, 2, 2), (4,), (8,)]
    fulls = tuple(Tensor(np.arange(int(np.prod(s)), dtype=np.float32).reshape(s) * 3 + 100 * i)
                  for i, s in enumerate(shapes))
    shards = tuple(Tensor(split_array(f.asnumpy(), n, rank)) for f in fulls)
    rs = BucketedComm(_OneRankCell(n, rank), shapes, fulls, bucket_size=120, kind="reduce_scatter")
    ag = BucketedComm(_OneRankCell(n, rank), [s.shape for s in shards], shards, bucket_size=120 // n,
                      kind="all_gather")
    ar = BucketedComm(_OneRankCell(n, rank), shapes, fulls, bucket_size=120)
    assert rs.buckets == ar.buckets == ag.buckets == ((0, 1), (2,), (3, 4))
    assert ar.ring_aligned == (n > 2)
    scattered, gathered, reduced = _Collectives(rs, ag, ar)(fulls, shards)
    for i, full in enumerate(fulls):
        want = split_array(full.asnumpy(), n, rank) / np.float32(n)
        np.testing.assert_array_equal(scattered[i].asnumpy(), want)
        np.testing.assert_array_equal(gathered[i].asnumpy(), np.concatenate([shards[i].asnumpy()] * n))
        np.testing.assert_array_equal(reduced[i].asnumpy(), full.asnumpy())
        assert scattered[i].shape == (shapes[i][0] // n,) + shapes[i][1:]
