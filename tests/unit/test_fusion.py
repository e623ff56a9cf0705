"""Bucket planning, MindOne's comm_fusion dict (its errors name the entry point called) and the
chunk-aligned all-reduce layout (one process)."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn

from models import LossNet, TinyNet, init_weights, make_optimizer
from mindone_zero import ZeroHelper, prepare_train_network
from mindone_zero.core import backend
from mindone_zero.core.scaling import any_nonfinite, squared_sum, times
from mindone_zero.train.fusion import (DEFAULT_BUCKET_SIZE, LARGE_TENSOR_BYTES, BucketedComm, FusionConfig, packed_buffers,
                                       plan_buckets, ring_chunks, ring_rows)

ms.set_device("CPU")


def test_twenty_tensors_in_three_buckets():
    sizes = [100] * 20
    buckets = plan_buckets(sizes, ["float32"] * 20, bucket_size=700)
    assert buckets == [list(range(0, 7)), list(range(7, 14)), list(range(14, 20))]


def test_no_fusion_is_one_bucket_per_tensor():
    assert plan_buckets([5, 6, 7], ["float32"] * 3, None) == [[0], [1], [2]]


def test_large_tensor_gets_its_own_bucket_and_order_is_kept():
    assert plan_buckets([10, 500, 10, 10], ["float32"] * 4, 100) == [[0], [1], [2, 3]]


def test_a_tensor_of_1_mib_or_more_is_never_packed():
    mib = LARGE_TENSOR_BYTES
    assert mib == 2 ** 20
    sizes = [8, mib, 8, mib - 1, 16 * mib]
    # the small ones still share a bucket around the large ones; just below 1 MiB is packed
    assert plan_buckets(sizes, ["float32"] * 5, DEFAULT_BUCKET_SIZE) == [[0, 2, 3], [1], [4]]
    assert plan_buckets([8, 8], ["float32"] * 2, 100, large=8) == [[0], [1]]


def test_dtypes_never_share_a_bucket():
    buckets = plan_buckets([4, 2, 4, 2], ["float32", "float16", "float32", "float16"], 100)
    assert buckets == [[0, 2], [1, 3]]


def test_mindone_dict_is_parsed():
    cfg = FusionConfig.from_mindone({"allreduce": {"openstate": True, "bucket_size": 5e8},
                                     "reduce_scatter": {"openstate": False, "bucket_size": 10},
                                     "allgather": {"bucket_size": 64}}, "ZeroHelper")
    assert cfg == FusionConfig(allreduce=500_000_000, reduce_scatter=None, allgather=64)


def test_default_buckets_by_25_mib_and_empty_dict_turns_fusion_off():
    assert DEFAULT_BUCKET_SIZE == 25 * 1024 * 1024
    assert FusionConfig.from_mindone(None, "ZeroHelper") == FusionConfig(DEFAULT_BUCKET_SIZE, DEFAULT_BUCKET_SIZE, DEFAULT_BUCKET_SIZE)
    assert FusionConfig.from_mindone({}, "ZeroHelper") == FusionConfig(None, None, None)
    assert FusionConfig.from_mindone({"allreduce": {"openstate": False}}, "ZeroHelper") == FusionConfig(None, None, None)


@pytest.mark.parametrize("value, words", [
    ("fuse", ["'comm_fusion'", "fuse"]),
    ({"broadcast": {}}, ["'comm_fusion'", "broadcast"]),
    ({"allreduce": 5}, ["comm_fusion['allreduce']", "5"]),
    ({"allgather": {"bucket_size": 0}}, ["comm_fusion['allgather']['bucket_size']", "0"]),
])
def test_bad_fusion_dicts_name_key_and_value(value, words):
    with pytest.raises((TypeError, ValueError)) as info:
        FusionConfig.from_mindone(value, "ZeroHelper")
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize("value", ["fuse", {"broadcast": {}}, {"allreduce": 5}, {"allgather": {"bucket_size": 0}}])
def test_bad_fusion_dicts_name_the_entry_point_that_was_called(value, tmp_path):
    net = LossNet(init_weights(TinyNet()))
    with pytest.raises((TypeError, ValueError)) as info:
        prepare_train_network(net, make_optimizer(net.trainable_params()), comm_fusion=value,
                              params_split_info=str(tmp_path / "info"))
    assert str(info.value).startswith("For 'prepare_train_network', ")
    with pytest.raises((TypeError, ValueError)) as info:
        ZeroHelper(make_optimizer(net.trainable_params()), comm_fusion=value)
    assert str(info.value).startswith("For 'ZeroHelper', ")
    assert not (tmp_path / "info").exists()


def test_zero_helper_takes_a_parsed_config_as_it_is():
    config = FusionConfig(allreduce=64)
    helper = ZeroHelper(make_optimizer(TinyNet().trainable_params()), comm_fusion=config)
    assert helper.zero_stage == 0  # one process: nothing to fuse, but the config is accepted unparsed


class _EchoComm:
    """A group of ``size`` ranks whose reductions return their input (no communication)."""

    group = "echo"

    def __init__(self, size):
        self.size = size

    def all_reduce(self, x):
        return x

    def all_reduce_mean(self, x):
        return x


@pytest.mark.parametrize("numel, n, expected", [
    (12, 4, (3, 4)), (13, 4, (4, 1)), (15, 4, (4, 3)), (3, 4, (1, 3)), (1, 4, (1, 1)), (7, 2, (4, 1)),
])
def test_ring_chunks_cut_like_the_backend(numel, n, expected):
    # sizes differ by at most one, the larger first: [4, 3, 3, 3] for 13 over 4
    assert ring_chunks(numel, n) == expected


_BUCKET_SHAPES = [(7, 3), (1,), (5,), (4, 4), (2,)]  # 45 elements; the first, 21, over n ranks


def _bucket_tensors(step):
    """One tensor per ``_BUCKET_SHAPES`` entry: 0, 1, 2, ... plus ``step`` times its index."""
    return tuple(Tensor(np.arange(int(np.prod(s)), dtype=np.float32).reshape(s) + step * i)
                 for i, s in enumerate(_BUCKET_SHAPES))


@pytest.mark.parametrize("n", [2, 3, 4])
def test_chunk_aligned_bucket_round_trips_and_puts_chunk_k_in_row_k(n):
    shapes, tensors = _BUCKET_SHAPES, _bucket_tensors(100)
    comm = BucketedComm(_EchoComm(n), shapes, tensors, bucket_size=1 << 20)
    assert comm.buckets == ((0, 1, 2, 3, 4),)
    for got, want in zip(comm.all_reduce_mean(tensors), tensors):
        np.testing.assert_array_equal(got.asnumpy(), want.asnumpy())
    rows = ring_rows(n, tensors[0], *comm.chunks[0]).asnumpy()  # 21 elements over n ranks
    flat, start = tensors[0].asnumpy().reshape(-1), 0
    for k in range(n):
        size = 21 // n + (1 if k < 21 % n else 0)
        np.testing.assert_array_equal(rows[k, :size], flat[start:start + size])
        start += size


class _RecordingComm(_EchoComm):
    """An ``_EchoComm`` that keeps the shape of every buffer it reduces."""

    def __init__(self, size):
        super().__init__(size)
        self.reduced = []

    def all_reduce_mean(self, x):
        self.reduced.append(tuple(x.shape))
        return x


_FLAT = (45,)  # the bucket's 5 tensors, 45 elements, one after the other


@pytest.mark.parametrize("target, n, buffer", [
    ("CPU", 2, _FLAT), ("CPU", 3, (3 * (7 + 1 + 2 + 6 + 1),)), ("CPU", 4, (4 * (6 + 1 + 2 + 4 + 1),)),
    ("GPU", 4, _FLAT), ("Ascend", 4, _FLAT), ("Ascend", 8, _FLAT),
])
def test_bucket_is_in_ring_rows_on_cpu_with_more_than_two_ranks_else_flat(target, n, buffer, monkeypatch):
    # [Note: chunk-aligned all-reduce]: on CPU with n > 2 ranks, n rows as wide as each tensor's
    # largest ring chunk; with two ranks every sum is a + b, and HCCL/NCCL choose their own
    # algorithms, so there the tensors lie one after the other ([Note: device targets] in backend.py)
    monkeypatch.setattr(backend, "device_target", lambda: target)
    tensors = _bucket_tensors(-7)
    comm = BucketedComm(_RecordingComm(n), _BUCKET_SHAPES, tensors, bucket_size=1 << 20)
    out = comm.all_reduce_mean(tensors)
    assert comm.comm.reduced == [buffer]
    for got, want in zip(out, tensors):
        assert got.shape == want.shape
        np.testing.assert_array_equal(got.asnumpy(), want.asnumpy())


class _ScatterEchoComm(_EchoComm):
    """An ``_EchoComm`` whose reduce-scatter leaves rank 0's dim-0 block of its input."""

    def reduce_scatter(self, x):
        return x[:x.shape[0] // self.size]


def _with_inf(tensors, i, where=-1):
    """``tensors`` with element ``where`` of tensor ``i`` (flat) set to inf."""
    value = tensors[i].asnumpy().copy()
    value.reshape(-1)[where] = np.inf
    return tensors[:i] + (Tensor(value),) + tensors[i + 1:]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("n", [2, 3])  # flat, and ring rows with padding ([Note: chunk-aligned all-reduce])
def test_a_factor_on_the_buckets_gives_every_tensor_its_own_bits_and_the_check_reads_the_buffers(n, dtype):
    # [Note: unscale and check in the buckets] in core/scaling.py
    tensors = tuple(Tensor(t.asnumpy().astype(dtype) / 7) for t in _bucket_tensors(3))
    factor = Tensor(1 / 3, ms.float32)  # inexact: a product that rounds
    comm = BucketedComm(_ScatterEchoComm(n), _BUCKET_SHAPES, tensors, bucket_size=1 << 20)
    alone = BucketedComm(_ScatterEchoComm(n), _BUCKET_SHAPES, tensors, bucket_size=None)
    assert len(comm.buckets) == 1 and len(alone.buckets) == len(tensors)
    for bucketed in (comm, alone):
        out, buffers = bucketed.all_reduce_buffers(tensors, True, factor)
        assert len(buffers) == len(bucketed.buckets)
        for got, t in zip(out, tensors):
            assert got.dtype == t.dtype
            np.testing.assert_array_equal(got.asnumpy(), times(factor, t).asnumpy())
        assert not any_nonfinite(buffers).asnumpy()
        for i in (0, 3):
            assert any_nonfinite(bucketed.all_reduce_buffers(_with_inf(tensors, i), True, factor)[1]).asnumpy()
    fulls = tuple(Tensor(np.tile(t.asnumpy().reshape(1, -1), (n, 1))) for t in tensors)  # dim 0 divides by n
    shapes = [tuple(f.shape) for f in fulls]
    for size in (1 << 20, None):
        scatter = BucketedComm(_ScatterEchoComm(n), shapes, fulls, bucket_size=size, kind="reduce_scatter")
        out, buffers = scatter.reduce_scatter_buffers(fulls, True, factor)
        for got, f in zip(out, fulls):
            want = times(factor, f).asnumpy()[:1] / np.asarray(n, dtype)
            np.testing.assert_array_equal(got.asnumpy(), want)
        assert not any_nonfinite(buffers).asnumpy()
        # this rank checks its own block; the other ranks' blocks are theirs to check (any_rank joins them)
        assert any_nonfinite(scatter.reduce_scatter_buffers(_with_inf(fulls, 2, 0), True, factor)[1]).asnumpy()
        assert not any_nonfinite(scatter.reduce_scatter_buffers(_with_inf(fulls, 2, -1), True, factor)[1]).asnumpy()
    assert not any_nonfinite(()).asnumpy()


class _AnyNonfinite(nn.Cell):
    def construct(self, xs):
        return any_nonfinite(xs)


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE])
def test_any_nonfinite_sees_an_inf_or_nan_anywhere_in_any_tensor(mode):
    """The per-tensor check (one all-finite per tensor, stacked and reduced once): True exactly when
    some element of some tensor is inf, -inf or nan, in tensors of any shape (0-d too) and dtype."""
    before = ms.get_context("mode")
    ms.set_context(mode=mode)
    try:
        # in GRAPH_MODE the tuple goes in as ms.mutable, as a train step's gradients do: a tuple of
        # constant tensors would be folded into a new graph for every value (a compile per check)
        cell = _AnyNonfinite()
        _check_any_nonfinite((lambda xs: cell(ms.mutable(xs))) if mode == ms.GRAPH_MODE else any_nonfinite)
    finally:
        ms.set_context(mode=before)


class _PackedCheck(nn.Cell):
    def __init__(self, buffers):
        super().__init__()
        self.packed = buffers

    def construct(self, xs):
        buffers = self.packed(xs)
        return any_nonfinite(buffers), squared_sum(buffers)


_PACKED_BASE = (np.full((), 2.5, np.float32), np.arange(12, dtype=np.float16).reshape(3, 4) / 7,
                np.linspace(-1, 1, 5).astype(np.float32), np.ones((2, 1, 3), np.float32) / 3,
                np.full((LARGE_TENSOR_BYTES // 4, 1), 0.01, np.float32))


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE])
def test_packed_buffers_give_the_check_and_the_squared_norm_of_their_tensors(mode):
    """[Note: unscale and check in the buckets] in core/scaling.py: where the gradients have no buckets
    of their own (stage 3), the check and the clip norm read them packed, one buffer per bucket of one
    dtype, a large tensor alone; the check's answer is the per-tensor one, the norm the same sum."""
    buffers = packed_buffers([Tensor(x) for x in _PACKED_BASE])
    assert buffers.buckets == ((0, 2, 3), (1,), (4,))  # float32 packed, float16 apart, the large tensor alone
    before = ms.get_context("mode")
    ms.set_context(mode=mode)
    try:
        cell = _PackedCheck(buffers)
        run = (lambda xs: cell(ms.mutable(xs))) if mode == ms.GRAPH_MODE else cell
        bad_any, norm = run(tuple(Tensor(x) for x in _PACKED_BASE))
        assert not bad_any.asnumpy()
        # the per-tensor sums (each a float32 ReduceSum, as before the buffers): the same within rounding
        per_tensor = float(squared_sum(tuple(Tensor(x) for x in _PACKED_BASE)).asnumpy())
        want = sum(float((x.astype(np.float64) ** 2).sum()) for x in _PACKED_BASE)
        assert norm.dtype == ms.float32 and abs(float(norm.asnumpy()) - per_tensor) <= 1e-6 * per_tensor
        assert abs(per_tensor - want) <= 1e-2 * want  # a float32 sum of 262144 squares rounds
        assert float(squared_sum(()).asnumpy()) == 0.0
        for i, x in enumerate(_PACKED_BASE):
            for where in (0, x.size - 1):
                for bad in (np.inf, np.nan):
                    value = x.copy()
                    value.reshape(-1)[where] = bad
                    xs = tuple(Tensor(value if j == i else y) for j, y in enumerate(_PACKED_BASE))
                    assert run(xs)[0].asnumpy() and any_nonfinite(xs).asnumpy(), (i, where, bad)
    finally:
        ms.set_context(mode=before)


def _check_any_nonfinite(check):
    base = (np.full((), 2.5, np.float32), np.arange(12, dtype=np.float16).reshape(3, 4) * 1e3,
            np.linspace(-1, 1, 5).astype(np.float32), np.ones((2, 1, 3), np.float32))
    assert not check(tuple(Tensor(x) for x in base)).asnumpy()
    assert not check((Tensor(np.finfo(np.float16).max * np.ones(3, np.float16)),)).asnumpy()
    for i, x in enumerate(base):
        for where in (0, x.size - 1):
            for bad in (np.inf, -np.inf, np.nan):
                value = x.copy()
                value.reshape(-1)[where] = bad
                xs = tuple(Tensor(value if j == i else y) for j, y in enumerate(base))
                assert check(xs).asnumpy(), (i, where, bad)
