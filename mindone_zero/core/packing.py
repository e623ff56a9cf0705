"""Packed buffers: several tensors sent as one collective (coalesced gathers, gather units, buckets).

[Note: packed layout]
Tensors 0..m-1 are split over N ranks; rank r holds block r of tensor i, s_i elements (a shard:
the padded tensor's dim-0 block, [Note: padding] in ``partition.py``). The buffer of one rank has
S = s_0 + ... + s_{m-1} elements, the blocks one after the other (``PackedLayout.offsets``):

* all-gather: each rank packs its blocks into S elements (``pack``); the all-gather gives N * S,
  viewed (N, S): row r is rank r's buffer, so the columns of tensor i, (N, s_i), are its padded
  full tensor in rank order (``unpack_gathered``);
* reduce-scatter: each rank views every full (padded) tensor as (N, s_i), concatenates the views
  along axis 1 into (N, S) and flattens it (``pack_rank_major``): row r holds block r of every
  tensor, so one reduce-scatter leaves rank r its S elements, block r of each tensor
  (``unpack_shards``). Every element is summed with the partners the per-tensor reduce-scatter
  sums it with, so the shards are bit-identical to those of one collective per tensor.

The layout only moves elements; casts, padding rows and the division by N stay with the caller.
The pieces are cut with slices, never ``ops.split``: GRAPH_MODE (MindSpore 2.10) failed to compile
``ops.split`` inside a custom bprop once a second network had been built in the process ("The func
graph is empty ... split"). A layout built with ``views=True`` (buckets) cuts with ``narrow``, a
view that keeps the whole buffer alive ([Note: a view keeps its base] in ``slicing.py``), for pieces
used at once; the default (coalesced gathers, gather units) cuts with copying slices, for pieces
that are kept (gradient shards held until the optimizer step). ``BucketedComm`` cuts its buckets
itself, outside any bprop, in runs of equal tensors ([Note: runs of pieces] in ``slicing.py``). A
single tensor is never packed (the callers send it as it is): a slice that cuts nothing costs as
much as a copy on CPU ([Note: slices] in ``slicing.py``).
"""
from typing import Sequence

import numpy as np
import mindspore as ms
from mindspore import nn, ops

from .graph_tuples import each
from .slicing import copy_args, copy_each, narrow_args, narrow_each

__all__ = ["ITEMSIZE", "LARGE_TENSOR_BYTES", "itemsize_of", "PackedLayout"]

ITEMSIZE = {ms.float16: 2, ms.bfloat16: 2, ms.float32: 4, ms.float64: 8}
"""Bytes per element of the floating dtypes a ZeRO parameter or its compute copy may have."""

LARGE_TENSOR_BYTES = 1024 * 1024
"""A tensor of this many bytes or more is never packed: it is sent alone ([Note: buckets])."""


def itemsize_of(dtype) -> int:
    """Bytes per element of ``dtype`` (4 for a dtype not in ``ITEMSIZE``)."""
    return ITEMSIZE.get(dtype, 4)


class PackedLayout(nn.Cell):
    """Where each tensor's block lies in a packed buffer ([Note: packed layout]).

    A Cell without parameters, so that ``construct`` and custom ``bprop`` code can call its methods
    in GRAPH_MODE (as ``GroupComm``'s); nothing here communicates.

    Args:
        blocks: elements of each tensor's per-rank block (s_i), in buffer order.
        n: the number of ranks the tensors are split over (N).
        views: unpack with ``narrow`` views (pieces used at once) instead of copying slices
            (pieces that are kept); see [Note: packed layout].
    """

    def __init__(self, blocks: Sequence[int], n: int, views: bool = False):
        super().__init__(auto_prefix=False)
        self.blocks = tuple(int(b) for b in blocks)
        self.n = int(n)
        self.views = views
        self.offsets = tuple(int(x) for x in np.cumsum((0,) + self.blocks[:-1]))
        self.total = sum(self.blocks)  # S
        # static arguments of the per-tensor primitives ([Note: constants in a map] in graph_tuples.py)
        self.flat_shapes = tuple((-1,) for _ in self.blocks)
        self.row_shapes = tuple((self.n, b) for b in self.blocks)
        # (a layout with an empty block is never unpacked: a bucket of another collective's blocks)
        cut = narrow_args if views else copy_args
        whole = all(self.blocks)
        self.column_cuts = cut((self.n, self.total), 1, self.offsets, self.blocks) if whole else None
        self.shard_cuts = cut((self.total,), 0, self.offsets, self.blocks) if whole else None

    def pack(self, shards):
        """This rank's buffer of S elements: ``shards`` (s_i elements each) flattened and concatenated."""
        return ops.concat(each(_RESHAPE, shards, self.flat_shapes), 0)

    def unpack_gathered(self, buf) -> tuple:
        """The (N, s_i) columns of every tensor in the all-gathered buffer of N * S elements."""
        return self._pieces(buf.reshape((self.n, self.total)), self.column_cuts)

    def pack_rank_major(self, fulls):
        """The reduce-scatter buffer of N * S elements: each full tensor (N * s_i elements) viewed
        (N, s_i), the views concatenated along axis 1 and flattened."""
        return ops.concat(each(_RESHAPE, fulls, self.row_shapes), 1).reshape(-1)

    def unpack_shards(self, buf) -> tuple:
        """This rank's block of every tensor (flat, s_i elements) from its reduce-scattered S elements."""
        return self._pieces(buf, self.shard_cuts)

    def _pieces(self, x, cuts):
        """The pieces of ``x`` at ``cuts``: views (``narrow``) or copying slices ([Note: packed layout])."""
        if self.views:
            begins, sizes = cuts
            return narrow_each(x, begins, sizes)
        begins, ends, strides = cuts
        return copy_each(x, begins, ends, strides)


_RESHAPE = ops.Reshape()
