"""[Note: coalesced gathers] in one process: the buffer layout (pack/unpack round trips with padding
and mixed shapes, the reduce-scatter layout against the per-parameter one) and which wrappers coalesce."""
from types import SimpleNamespace

import numpy as np
import mindspore as ms
import pytest
from mindspore import Tensor

from mindone_zero.core.partition import ShardSpec, split_array
from mindone_zero.zero3.coalesce import (COALESCE_MAX_BYTES, build_gather_group, pack_grads, pack_shards,
                                       offsets_of, unpack_gathered, unpack_grad_shards)

SHAPES = [(7, 15), (15, 3), (5,), (8, 2), (1, 4)]


def _layout(n):
    specs = [ShardSpec(f"p{i}", shape, n, 0, True) for i, shape in enumerate(SHAPES)]
    return (tuple(int(np.prod(s.shard_shape)) for s in specs), tuple(tuple(s.padded_shape) for s in specs),
            tuple(s.shape[0] for s in specs), tuple(s.pad for s in specs), tuple(tuple(s.shard_shape) for s in specs))


@pytest.mark.parametrize("n", [2, 3, 4])
def test_all_gathered_buffer_unpacks_to_the_full_tensors(n):
    rng = np.random.default_rng(n)
    fulls = [rng.standard_normal(shape).astype(np.float32) for shape in SHAPES]
    numels, padded, rows, pads, _ = _layout(n)
    # the all-gather: every rank's flat buffer, concatenated in rank order
    bufs = [pack_shards([Tensor(split_array(f, n, r)) for f in fulls]).asnumpy() for r in range(n)]
    assert all(b.shape == (sum(numels),) for b in bufs)
    out = unpack_gathered(Tensor(np.concatenate(bufs)), n, numels, offsets_of(numels), padded, rows, pads)
    for got, want in zip(out, fulls):
        assert got.shape == want.shape
        assert np.array_equal(got.asnumpy(), want)


@pytest.mark.parametrize("n", [2, 4])
def test_reduce_scattered_buffer_holds_each_parameters_block_bitwise(n):
    rng = np.random.default_rng(10 + n)
    numels, _, _, pads, shard_shapes = _layout(n)
    grads = [[rng.standard_normal(shape).astype(np.float32) for shape in SHAPES] for _ in range(n)]
    packed = [pack_grads([Tensor(g) for g in grads[r]], n, numels, pads).asnumpy() for r in range(n)]
    total = packed[0]
    for buf in packed[1:]:
        total = total + buf  # the same summation order as the per-parameter reference below
    size = sum(numels)
    for rank in range(n):
        block = Tensor(total[rank * size:(rank + 1) * size] / n)
        shards = unpack_grad_shards(block, numels, offsets_of(numels), shard_shapes)
        for i, got in enumerate(shards):
            summed = grads[0][i]
            for r in range(1, n):
                summed = summed + grads[r][i]
            want = split_array(summed, n, rank) / n
            assert got.shape == want.shape
            assert np.array_equal(got.asnumpy(), want), (rank, SHAPES[i])


def _wrapper(name="w", shape=(6, 4), gathers=True, dtype=ms.float32, zeropp=None, hpz=False):
    spec = ShardSpec(name, shape, 2, 0, True)
    gather = SimpleNamespace(gathers=gathers, zeropp=zeropp, spec=spec, param_dtype=dtype, compute_dtype=dtype,
                             cast_before_gather=False, group_name=None, group_size=2)
    return SimpleNamespace(gather=gather, hpz=hpz)


@pytest.mark.parametrize("wrappers", [
    [],
    [_wrapper()],  # a single parameter keeps the per-parameter path (no concat, no split)
    [_wrapper(), _wrapper("b", gathers=False)],
    [_wrapper(), _wrapper("b", zeropp=object())],
    [_wrapper(), _wrapper("b", hpz=True)],
    [_wrapper(), _wrapper("b", dtype=ms.float16)],
    [_wrapper(), _wrapper("big", shape=(COALESCE_MAX_BYTES // 4 + 2, 1))],
])
def test_wrappers_that_cannot_share_a_collective_are_not_coalesced(wrappers):
    assert build_gather_group(wrappers) is None
