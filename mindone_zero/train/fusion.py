"""Communication fusion: many small tensors sent as one collective per bucket.

[Note: buckets]
Tensors are grouped, in order and per dtype, into buckets of at most ``bucket_size`` bytes
(a tensor larger than that gets a bucket of its own). A tensor of ``LARGE_TENSOR_BYTES`` (1 MiB)
or more is never packed: it is sent alone, because packing copies it (and the unpacking keeps
the whole packed buffer alive) to save one launch that costs little next to its transfer. A
bucket is flattened into one buffer, sent through one collective, and cut back into its tensors;
the buffer holds its tensors by shape (``BucketedComm.placed``) where that makes runs of equal
tensors that are cut out at once ([Note: runs of pieces] in ``mindone_zero/core/slicing.py``).
Reduce-scatter and all-gather buckets use [Note: packed layout] (``mindone_zero/core/packing.py``),
the layout of ZeRO-3's coalesced gathers: rank-major, ``[rank 0's block of every tensor | rank 1's
block | ...]``, so that one reduce-scatter leaves each rank exactly its own blocks; all-gather
undoes the same layout. Their pieces are cut as views (``narrow``): each is used at once.
All-reduce buckets have a layout of their own, [Note: chunk-aligned all-reduce]. A bucket of one
tensor is sent as it is, with no copy, which is also what "fusion off" means.

[Note: chunk-aligned all-reduce]
A ring all-reduce over n ranks cuts its buffer into n chunks and adds the ranks' values of each
element in an order set by the chunk the element falls in. So that a bucket gives every element
the bits it gets when its tensor is sent alone, an all-reduce bucket is laid out rank-major too:
a tensor of ``numel`` elements is cut as the backend cuts it alone, into n chunks whose sizes
differ by at most one, the larger first (as MindSpore's CPU backend does), each chunk padded to
``ceil(numel / n)``; row k of the bucket holds chunk k of every tensor, so the bucket's own
chunks are its rows. With two ranks every sum is a + b and the bits match in any layout, and
HCCL and NCCL choose their own algorithms (a bucket agrees with its tensors sent alone within
rounding whatever its layout), so with two ranks, and on Ascend and GPU, a bucket is packed flat,
the tensors one after the other (``PackedLayout.pack``), and cut back with ``narrow``: no padding
is copied, and the graph is smaller and compiles faster (``backend.ring_aligned_buckets`` decides).

``FusionConfig`` reads MindOne's dict (``{"allreduce": {"openstate": True, "bucket_size": 5e8},
"reduce_scatter": {...}, "allgather": {...}}``); a kind that is missing or has
``openstate: False`` sends one collective per tensor, so ``comm_fusion={}`` turns fusion off.
``comm_fusion=None`` (the default) buckets every kind by ``DEFAULT_BUCKET_SIZE`` bytes (25 MiB,
PyTorch DDP's default ``bucket_cap_mb``): small tensors then share one launch instead of paying
one each.
"""
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from ..core import backend
from ..core.comm import GroupComm, divide
from ..core.comm_records import BucketRecord
from ..core.graph_tuples import hyper_map, take
from ..core.scaling import PackedBuffers, scaled
from ..core.packing import LARGE_TENSOR_BYTES, PackedLayout
from ..core.slicing import cut_args, narrow, narrow_cut, runs_pay

__all__ = ["DEFAULT_BUCKET_SIZE", "LARGE_TENSOR_BYTES", "FusionConfig", "plan_buckets", "bucket_record", "packed_buffers",
           "ring_chunks", "ring_rows", "BucketedComm"]

_KINDS = ("allreduce", "reduce_scatter", "allgather")
DEFAULT_BUCKET_SIZE = 25 * 1024 * 1024
_COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")


@dataclass(frozen=True)
class FusionConfig:
    """Bucket size in bytes per collective kind; None sends one collective per tensor."""

    allreduce: Optional[int] = None
    reduce_scatter: Optional[int] = None
    allgather: Optional[int] = None

    @classmethod
    def from_mindone(cls, comm_fusion, where: str) -> "FusionConfig":
        """Parse MindOne's ``comm_fusion`` dict given to the entry point ``where``; None buckets every
        kind by ``DEFAULT_BUCKET_SIZE`` and ``{}`` sends one collective per tensor (see [Note: buckets]).

        Raises:
            TypeError / ValueError: naming ``where``, the offending key and value.
        """
        if comm_fusion is None:
            return cls(DEFAULT_BUCKET_SIZE, DEFAULT_BUCKET_SIZE, DEFAULT_BUCKET_SIZE)
        if not isinstance(comm_fusion, dict):
            raise TypeError(f"For '{where}', the argument 'comm_fusion' must be a dict or None, but got {comm_fusion!r}.")
        unknown = sorted(set(comm_fusion) - set(_KINDS))
        if unknown:
            raise ValueError(
                f"For '{where}', the argument 'comm_fusion' may only have the keys {list(_KINDS)}, but got {unknown}."
            )
        sizes = {}
        for kind, cfg in comm_fusion.items():
            if not isinstance(cfg, dict):
                raise TypeError(f"For '{where}', comm_fusion[{kind!r}] must be a dict, but got {cfg!r}.")
            if not cfg.get("openstate", True):
                continue
            size = cfg.get("bucket_size", 5e8)
            if isinstance(size, bool) or not isinstance(size, (int, float)) or size <= 0:
                raise ValueError(
                    f"For '{where}', comm_fusion[{kind!r}]['bucket_size'] must be a positive number of bytes, "
                    f"but got {size!r}."
                )
            sizes[kind] = int(size)
        return cls(**sizes)


def ring_chunks(numel: int, n: int) -> Tuple[int, int]:
    """(width, full): a tensor of ``numel`` elements cut into ``n`` ring chunks of ``width`` or
    ``width - 1`` elements, the first ``full`` of them ``width`` long ([Note: chunk-aligned all-reduce])."""
    base, extra = divmod(int(numel), int(n))
    return (base + 1, extra) if extra else (max(base, 1), n if base else 0)


def _dim0_scaled(shape: Tuple[int, ...], times: int, over: int) -> Tuple[int, ...]:
    """``shape`` with dim 0 times ``times`` over ``over``; a 0-d shape (never split) as it is."""
    return (shape[0] * times // over,) + shape[1:] if shape else shape


def plan_buckets(nbytes: Sequence[int], dtypes: Sequence[str], bucket_size: Optional[int],
                 large: int = LARGE_TENSOR_BYTES) -> List[List[int]]:
    """Indices of the tensors in each bucket, per [Note: buckets]; a tensor of ``large`` bytes or
    more is alone in its bucket. Pure; no communication."""
    if bucket_size is None:
        return [[i] for i in range(len(nbytes))]
    buckets, open_by_dtype = [], {}
    for i, (size, dtype) in enumerate(zip(nbytes, dtypes)):
        if size >= large:
            buckets.append([i])
            continue
        current = open_by_dtype.get(dtype)
        if current is not None and current[1] + size <= bucket_size:
            current[0].append(i)
            current[1] += size
            continue
        bucket = [i]
        buckets.append(bucket)
        open_by_dtype[dtype] = [bucket, size]
    return buckets


def bucket_record(kind: str, group: str, group_size: int, numels: Sequence[int], dtypes,
                  bucket_size: Optional[int]) -> BucketRecord:
    """The buckets ([Note: buckets]) of tensors of ``numels`` elements and ``dtypes`` over ``group``
    (of ``group_size`` ranks), as a ``BucketRecord`` ([Note: comm records] in core/comm_records.py).
    Pure; no communication."""
    nbytes = _nbytes(numels, dtypes)
    names = [str(d) for d in dtypes]
    buckets = tuple(tuple(b) for b in plan_buckets(nbytes, names, bucket_size))
    return BucketRecord(kind, group, group_size, buckets, tuple(sum(nbytes[i] for i in b) for b in buckets),
                        tuple(names[b[0]] for b in buckets))


def _nbytes(numels: Sequence[int], dtypes) -> List[int]:
    return [n * np.dtype(ms.dtype_to_nptype(d)).itemsize for n, d in zip(numels, dtypes)]


def packed_buffers(templates) -> PackedBuffers:
    """``PackedBuffers`` of tensors shaped and typed like ``templates`` (gradients, like the
    parameters or the shards the optimizer updates), in buckets of ``DEFAULT_BUCKET_SIZE`` bytes by
    [Note: buckets] ([Note: unscale and check in the buckets] in core/scaling.py). Not collective."""
    numels = [int(np.prod(t.shape)) for t in templates]
    dtypes = [t.dtype for t in templates]
    return PackedBuffers(plan_buckets(_nbytes(numels, dtypes), [str(d) for d in dtypes], DEFAULT_BUCKET_SIZE),
                         numels)


def _placed(bucket, shapes) -> tuple:
    """``bucket`` by shape if its shapes make runs that pay (``runs_pay``), else as planned."""
    if not runs_pay(len(bucket), len({shapes[i] for i in bucket})):
        return tuple(bucket)
    return tuple(sorted(bucket, key=lambda i: (shapes[i], i)))


def _cuts(layouts, placed, shapes, axis: int) -> tuple:
    """Per bucket, the ``cut_args`` of its result into its tensors: along axis 0 of the flat buffer,
    or axis 1 of an all-gather's (n, S) rows; None for a tensor sent alone. A layout with an empty
    block belongs to a collective its tensors cannot take (a reduce-scatter of a tensor with fewer
    elements than ranks), is never unpacked, and gets no pieces."""
    out = []
    for layout, bucket in zip(layouts, placed):
        if len(bucket) == 1:
            out.append(None)
        elif not all(layout.blocks):
            out.append(((), None))
        else:
            shape = (layout.n, layout.total) if axis == 1 else (layout.total,)
            out.append(cut_args(shape, axis, layout.offsets, layout.blocks, [shapes[i] for i in bucket]))
    return tuple(out)


def _ring_slots(placed, chunks, shapes) -> tuple:
    """Per tensor, for ``_ring_tensor``: (its bucket, whether it is alone in it, its first column in
    the bucket's ring rows, its ring chunk width and full rows, its shape)."""
    where = {i: k for k, b in enumerate(placed) for i in b}
    bucket = tuple(where[i] for i in range(len(shapes)))
    alone = tuple(len(placed[k]) == 1 for k in bucket)
    columns = tuple(sum(chunks[m][0] for m in placed[k][:placed[k].index(i)]) for i, k in enumerate(bucket))
    return bucket, alone, columns, tuple(c[0] for c in chunks), tuple(c[1] for c in chunks), tuple(shapes)


class BucketLayout(nn.Cell):
    """Where each tensor of a ``BucketedComm`` (its arguments) lies in its bucket's buffer, worked out
    once: the packed layouts and the static cuts ([Note: one map out of the buckets]). No collectives."""

    def __init__(self, comm: GroupComm, shapes: Sequence[Tuple[int, ...]], templates=None,
                 bucket_size: Optional[int] = None, kind: str = "all_reduce", *, record: Optional[BucketRecord] = None):
        super().__init__(auto_prefix=False)
        kind = record.kind if record is not None else kind
        if kind not in _COLLECTIVES:
            raise ValueError(f"For 'BucketedComm', the argument 'kind' must be one of {list(_COLLECTIVES)}, but got "
                             f"{kind!r}.")
        self.kind = kind
        self.comm = comm
        self.shapes = tuple(tuple(int(d) for d in s) for s in shapes)
        self.numels = tuple(int(np.prod(s)) for s in self.shapes)
        self.record = record if record is not None else (
            bucket_record(kind, comm.group, comm.size, self.numels, [t.dtype for t in templates], bucket_size))
        self.buckets = self.record.buckets
        # each bucket in its buffer's order ([Note: runs of pieces] in core/slicing.py)
        self.placed = tuple(_placed(b, self.shapes) for b in self.buckets)
        self.chunks = tuple(ring_chunks(k, comm.size) for k in self.numels)
        # [Note: packed layout]: reduce-scatter's blocks are numel / n; all-gather's (also a flat
        # all-reduce bucket's) are each tensor's numel
        n = comm.size
        self.scatter_layouts = nn.CellList([PackedLayout([self.numels[i] // n for i in b], n, True)
                                            for b in self.placed])
        self.gather_layouts = nn.CellList([PackedLayout([self.numels[i] for i in b], n, True) for b in self.placed])
        self.ring_aligned = backend.ring_aligned_buckets(n)  # [Note: chunk-aligned all-reduce]
        self.bucket_chunks = tuple((tuple(self.chunks[i][0] for i in b), tuple(self.chunks[i][1] for i in b))
                                   for b in self.placed)
        placed = self.placed  # [Note: one map out of the buckets]
        self.scatter_cuts = _cuts(self.scatter_layouts, placed, [_dim0_scaled(s, 1, n) for s in self.shapes], 0)
        self.gather_cuts = _cuts(self.gather_layouts, placed, [_dim0_scaled(s, n, 1) for s in self.shapes], 1)
        self.gather_row_cuts = _cuts(self.gather_layouts, placed, [(n, int(np.prod(s))) for s in self.shapes], 1)
        self.reduce_cuts = _cuts(self.gather_layouts, placed, self.shapes, 0)
        flat = [i for b in placed for i in b]
        self.order = tuple(flat.index(i) for i in range(len(self.shapes)))
        self.ring_slots = _ring_slots(placed, self.chunks, self.shapes)


class BucketedComm(BucketLayout):
    """Fused collectives over one group for a fixed list of tensor shapes.

    Built once on every rank (not collective); its methods are collective over the group and
    take or return tuples in the order of ``shapes``. ``record`` (a ``BucketRecord``) is what its
    buckets send, as the ``CommPlan`` counts it ([Note: comm records] in core/comm_records.py).

    Args:
        comm: the group's ``GroupComm``.
        shapes: shape of each tensor as given to ``all_reduce_mean``/``reduce_scatter`` (for
            reduce-scatter, the padded full shape) or, for ``all_gather``, the shard shape.
        templates: Parameters (or Tensors) with the dtype of each tensor; tensors of different
            dtypes never share a bucket.
        bucket_size: bytes per bucket, or None for one collective per tensor.
        kind: the collective it is used for, as the ``CommPlan`` counts it: ``"all_reduce"`` and
            ``"reduce_scatter"`` carry gradients (once per gradient reduction), ``"all_gather"``
            updated shards (once per optimizer step).
        record: the buckets, planned already (``TrainPlan.buckets``); then ``templates``,
            ``bucket_size`` and ``kind`` are read from it, not given.

    ``buckets`` lists the indices of the tensors in each bucket; ``placed`` the same in the order
    the bucket's buffer holds them.

    Raises:
        ValueError: ``kind`` is not one of those three.
    """

    def all_reduce_mean(self, tensors):
        """Mean over the group of every tensor, one all-reduce per bucket."""
        return self.all_reduce_buffers(tensors, True)[0]

    def _reduce(self, x, mean: bool):
        if mean:
            return self.comm.all_reduce_mean(x)
        return self.comm.all_reduce(x)

    def all_reduce_buffers(self, tensors, mean: bool, factor=None):
        """(mean or sum over the group of every tensor, each times the 0-d ``factor`` if it is given,
        the buckets' reduced buffers): the factor multiplies each bucket's buffer before its
        all-reduce ([Note: unscale and check in the buckets] in core/scaling.py)."""
        n = self.comm.size
        sent = ()
        for k in range(len(self.placed)):
            bucket = self.placed[k]
            if len(bucket) == 1:
                sent += (self._reduce(scaled(tensors[bucket[0]], factor), mean),)
            elif not self.ring_aligned:
                sent += (self._reduce(scaled(self.gather_layouts[k].pack(take(tensors, bucket)), factor), mean),)
            else:
                widths, fulls = self.bucket_chunks[k]
                rows = ops.concat(hyper_map(ops.partial(ring_rows, n), take(tensors, bucket), widths, fulls), 1)
                sent += (self._reduce(scaled(rows, factor).reshape(-1), mean).reshape(n, -1),)
        if self.ring_aligned:
            bucket, alone, offset, width, full, shape = self.ring_slots
            return hyper_map(ops.partial(_ring_tensor, sent, n), bucket, alone, offset, width, full, shape), sent
        return self._results(sent, self.reduce_cuts, 0), sent

    def reduce_scatter(self, tensors, mean: bool = False):
        """Sum over the group (``mean``: divided by the group size, once per bucket), then this
        rank's dim-0 block of every (padded) tensor."""
        return self.reduce_scatter_buffers(tensors, mean)[0]

    def reduce_scatter_buffers(self, tensors, mean: bool, factor=None):
        """(``reduce_scatter`` of every tensor times the 0-d ``factor`` if it is given, this rank's
        reduced buffer of each bucket): the factor multiplies each bucket's buffer before its
        reduce-scatter ([Note: unscale and check in the buckets] in core/scaling.py)."""
        sent = ()
        for k in range(len(self.placed)):
            bucket = self.placed[k]
            if len(bucket) == 1:
                blocks = self.comm.reduce_scatter(scaled(tensors[bucket[0]], factor))
            else:
                blocks = self.comm.reduce_scatter(scaled(self.scatter_layouts[k].pack_rank_major(take(tensors, bucket)),
                                                         factor))
            if mean:
                blocks = divide(blocks, self.comm.size)  # [Note: Div on CPU] in core/comm.py
            sent += (blocks,)
        return self._results(sent, self.scatter_cuts, 0), sent

    def all_gather(self, shards):
        """Every rank's shard of every tensor, concatenated along dim 0 in rank order."""
        return self._results(self._all_gathered(shards), self.gather_cuts, 1)

    def all_gather_rows(self, shards):
        """``all_gather``'s results before their last reshape: each tensor's (N, shard elements) rows
        (a tensor sent alone: gathered along dim 0), for a caller whose own map reshapes them
        ([Note: runs of pieces] in core/slicing.py)."""
        return self._results(self._all_gathered(shards), self.gather_row_cuts, 1)

    def _all_gathered(self, shards):
        """Each bucket's all-gathered (N, S) buffer (a tensor sent alone: gathered along dim 0)."""
        sent = ()
        for k in range(len(self.placed)):
            bucket = self.placed[k]
            if len(bucket) == 1:
                sent += (self.comm.all_gather(shards[bucket[0]]),)
            else:
                layout = self.gather_layouts[k]
                sent += (self.comm.all_gather(layout.pack(take(shards, bucket))).reshape((layout.n, layout.total)),)
        return sent

    def _results(self, sent, cuts, axis: int):
        """Every tensor's result, in the order of ``shapes``, cut out of the buckets' results ``sent``
        along ``axis`` ([Note: one map out of the buckets])."""
        pieces = ()
        for k in range(len(self.placed)):
            if cuts[k] is None:
                pieces += (sent[k],)
            else:
                pieces += narrow_cut(sent[k], cuts[k], axis)
        return take(pieces, self.order)


# Per-tensor work of the buckets ([Note: per-tensor maps] in core/graph_tuples.py).
#
# [Note: one map out of the buckets]
# Every tensor's result is cut out of its bucket's result by Slices and Reshapes whose begins, sizes
# and shapes are static tuples computed when the Cell is built, the primitives called directly: one
# Slice per run of equal tensors, one per tensor where the tensors differ ([Note: runs of pieces] in
# core/slicing.py). The pieces of all buckets are then put in the order of ``shapes`` (``take``).
# A MultitypeFuncGraph that took each tensor's offset, width and shape as arguments would be
# specialized once per tensor, three times with its branches, a compile cost the static cuts avoid
# ([Note: constants in a map] in core/graph_tuples.py).


ring_rows = ops.MultitypeFuncGraph("ring_rows")


@ring_rows.register("Number", "Tensor", "Number", "Number")
def ring_rows_tensor(n, x, width, full):
    """``x`` as (n, width) rows, row k its k-th ring chunk: ``full`` chunks of ``width`` elements,
    then chunks of ``width - 1`` padded with a zero ([Note: chunk-aligned all-reduce])."""
    flat = x.reshape(-1)
    if full == n:
        return flat.reshape(n, width)
    head = narrow(flat, 0, 0, full * width).reshape(full, width)
    if width == 1:  # fewer elements than ranks: the short chunks are empty
        return ops.concat((head, ops.zeros((n - full, 1), x.dtype)), 0)
    tail = narrow(flat, 0, full * width, (n - full) * (width - 1)).reshape(n - full, width - 1)
    tail = ops.concat((tail, ops.zeros((n - full, 1), x.dtype)), 1)
    return ops.concat((head, tail), 0)


_ring_tensor = ops.MultitypeFuncGraph("ring_tensor")


@_ring_tensor.register("Tuple", "Number", "Number", "Bool", "Number", "Number", "Number", "Tuple")
def _ring_tensor_tensor(sent, n, bucket, alone, offset, width, full, shape):
    """Inverse of ``ring_rows``: the tensor of ``shape`` whose rows start at column ``offset`` of the
    reduced bucket ``sent[bucket]`` (n rows), or that result itself when the tensor was sent ``alone``."""
    if alone:
        return sent[bucket]
    rows = narrow(sent[bucket], 1, offset, width)
    if full == n:
        return rows.reshape(shape)
    head = narrow(rows, 0, 0, full).reshape(-1)
    if width == 1:
        return head.reshape(shape)
    tail = narrow(narrow(rows, 0, full, n - full), 1, 0, width - 1).reshape(-1)
    return ops.concat((head, tail), 0).reshape(shape)
