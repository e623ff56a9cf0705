"""Communication fusion: many small tensors sent as one collective per bucket.

[Note: buckets]
Tensors are grouped, in order and per dtype, into buckets of at most ``bucket_size`` bytes
(a tensor larger than that gets a bucket of its own). A tensor of ``LARGE_TENSOR_BYTES`` (1 MiB)
or more is never packed: it is sent alone, because packing copies it (and the unpacking keeps
the whole packed buffer alive) to save one launch that costs little next to its transfer.
Measured before this rule (stage 1, 8 x Dense(2048), N=4, each weight packed with its bias):
peak +287 MB per rank against one collective per tensor. A bucket is flattened into one buffer,
sent through one collective, and cut back into its tensors. Reduce-scatter and all-gather buckets
use [Note: packed layout] (``mindone_zero/core/packing.py``), the layout of ZeRO-3's coalesced
gathers: rank-major, ``[rank 0's block of every tensor | rank 1's block | ...]``, so that one
reduce-scatter leaves each rank exactly its own blocks; all-gather undoes the same layout. Their
pieces are cut as views (``ops.narrow``): each is used at once. All-reduce buckets have a layout of
their own, [Note: chunk-aligned all-reduce], kept here: it follows the ring's chunks, not shards.
A bucket of one tensor is sent as it is, with no copy, which is also what "fusion off" means.

[Note: chunk-aligned all-reduce]
A ring all-reduce over n ranks cuts its buffer into n chunks and adds the ranks' values of each
element in an order set by the chunk the element falls in. So that a bucket gives every element
the bits it gets when its tensor is sent alone, an all-reduce bucket is laid out rank-major too:
a tensor of ``numel`` elements is cut as the backend cuts it alone, into n chunks whose sizes
differ by at most one, the larger first (measured on MindSpore's CPU backend, N=4), each chunk
padded to ``ceil(numel / n)``; row k of the bucket holds chunk k of every tensor, so the bucket's
own chunks are its rows. With two ranks every sum is a + b and the bits match in any layout.

``FusionConfig`` reads MindOne's dict (``{"allreduce": {"openstate": True, "bucket_size": 5e8},
"reduce_scatter": {...}, "allgather": {...}}``); a kind that is missing or has
``openstate: False`` sends one collective per tensor, so ``comm_fusion={}`` turns fusion off.
``comm_fusion=None`` (the default) buckets every kind by ``DEFAULT_BUCKET_SIZE`` bytes (25 MiB,
PyTorch DDP's default ``bucket_cap_mb``): small tensors then share one launch instead of paying
one each. Every element is summed over the same ranks either way; with two ranks (a + b) that
is bit for bit the same number. With more ranks the backend's all-reduce may add the ranks'
values in an order that depends on an element's place in the buffer (a ring cuts the buffer
into chunks), which [Note: chunk-aligned all-reduce] keeps the same for every element.
"""
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
from mindspore import nn, ops

from ..core.comm import GroupComm
from ..core.comm_plan import CommPlan, PlanContext
from ..core.packing import LARGE_TENSOR_BYTES, PackedLayout

__all__ = ["DEFAULT_BUCKET_SIZE", "LARGE_TENSOR_BYTES", "FusionConfig", "plan_buckets", "ring_chunks", "BucketedComm"]

_KINDS = ("allreduce", "reduce_scatter", "allgather")
DEFAULT_BUCKET_SIZE = 25 * 1024 * 1024
_PER_STEP = {"all_reduce": False, "reduce_scatter": False, "all_gather": True}  # else once per gradient reduction


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


class BucketedComm(nn.Cell):
    """Fused collectives over one group for a fixed list of tensor shapes.

    Built once on every rank (not collective); its methods are collective over the group and
    take or return tuples in the order of ``shapes``. ``record_comm`` records the collectives of
    one optimizer step ([Note: comm plan] in core/comm_plan.py).

    Args:
        comm: the group's ``GroupComm``.
        shapes: shape of each tensor as given to ``all_reduce_mean``/``reduce_scatter`` (for
            reduce-scatter, the padded full shape) or, for ``all_gather``, the shard shape.
        templates: Parameters (or Tensors) with the dtype of each tensor; tensors of different
            dtypes never share a bucket.
        bucket_size: bytes per bucket, or None for one collective per tensor.
        kind: the collective it is used for, as ``record_comm`` counts it: ``"all_reduce"`` and
            ``"reduce_scatter"`` carry gradients (once per gradient reduction), ``"all_gather"``
            updated shards (once per optimizer step).

    Raises:
        ValueError: ``kind`` is not one of those three.
    """

    def __init__(self, comm: GroupComm, shapes: Sequence[Tuple[int, ...]], templates, bucket_size: Optional[int],
                 kind: str = "all_reduce"):
        super().__init__(auto_prefix=False)
        if kind not in _PER_STEP:
            raise ValueError(f"For 'BucketedComm', the argument 'kind' must be one of {list(_PER_STEP)}, but got "
                             f"{kind!r}.")
        self.kind = kind
        self.comm = comm
        self.shapes = tuple(tuple(int(d) for d in s) for s in shapes)
        self.numels = tuple(int(np.prod(s)) for s in self.shapes)
        nbytes = [n * t.itemsize for n, t in zip(self.numels, templates)]
        dtypes = [str(t.dtype) for t in templates]
        self.buckets = tuple(tuple(b) for b in plan_buckets(nbytes, dtypes, bucket_size))
        # [Note: chunk-aligned all-reduce]: (row width, rows of full width) of each tensor
        self.chunks = tuple(ring_chunks(k, comm.size) for k in self.numels)
        self.bucket_bytes = tuple(sum(nbytes[i] for i in b) for b in self.buckets)
        # [Note: packed layout] of each bucket: for reduce-scatter (the tensors are full, blocks of
        # numel / n) and for all-gather (the tensors are shards); an instance serves one kind and
        # never calls the other's.
        n = comm.size
        self.scatter_layouts = nn.CellList([PackedLayout([self.numels[i] // n for i in b], n, True)
                                            for b in self.buckets])
        self.gather_layouts = nn.CellList([PackedLayout([self.numels[i] for i in b], n, True) for b in self.buckets])

    def record_comm(self, plan: CommPlan, ctx: PlanContext) -> None:
        """One entry per bucket and call of one optimizer step; an all-gather's entry has the full
        (gathered) bytes. Not collective."""
        scale = self.comm.size if self.kind == "all_gather" else 1
        times = 1 if _PER_STEP[self.kind] else ctx.reductions
        for _ in range(times):
            for size in self.bucket_bytes:
                plan.add(self.kind, self.comm.group, int(size * scale), self.comm.size)

    def all_reduce_mean(self, tensors):
        """Mean over the group of every tensor, one all-reduce per bucket."""
        return self._all_reduce(tensors, True)

    def all_reduce_sum(self, tensors):
        """Sum over the group of every tensor, one all-reduce per bucket."""
        return self._all_reduce(tensors, False)

    def _reduce(self, x, mean: bool):
        if mean:
            return self.comm.all_reduce_mean(x)
        return self.comm.all_reduce(x)

    def _all_reduce(self, tensors, mean: bool):
        n = self.comm.size
        out = list(tensors)
        for bucket in self.buckets:
            if len(bucket) == 1:
                out[bucket[0]] = self._reduce(tensors[bucket[0]], mean)
                continue
            rows = ops.concat([self._to_rows(tensors[i], i) for i in bucket], 1)
            rows = self._reduce(rows.reshape(-1), mean).reshape(n, -1)
            offset = 0
            for i in bucket:
                width = self.chunks[i][0]
                out[i] = self._from_rows(ops.narrow(rows, 1, offset, width), i)
                offset += width
        return tuple(out)

    def _to_rows(self, x, i):
        """Tensor ``i`` as (n, width) rows, row k its k-th ring chunk ([Note: chunk-aligned all-reduce])."""
        n, (width, full) = self.comm.size, self.chunks[i]
        flat = x.reshape(-1)
        if full == n:
            return flat.reshape(n, width)
        head = ops.narrow(flat, 0, 0, full * width).reshape(full, width)
        if width == 1:  # fewer elements than ranks: the short chunks are empty
            return ops.concat((head, ops.zeros((n - full, 1), x.dtype)), 0)
        tail = ops.narrow(flat, 0, full * width, (n - full) * (width - 1)).reshape(n - full, width - 1)
        tail = ops.concat((tail, ops.zeros((n - full, 1), x.dtype)), 1)
        return ops.concat((head, tail), 0)

    def _from_rows(self, rows, i):
        """Inverse of ``_to_rows``: tensor ``i`` in its shape."""
        n, (width, full) = self.comm.size, self.chunks[i]
        if full == n:
            return rows.reshape(self.shapes[i])
        head = ops.narrow(rows, 0, 0, full).reshape(-1)
        if width == 1:
            return head.reshape(self.shapes[i])
        tail = ops.narrow(ops.narrow(rows, 0, full, n - full), 1, 0, width - 1).reshape(-1)
        return ops.concat((head, tail), 0).reshape(self.shapes[i])

    def reduce_scatter(self, tensors):
        """Sum over the group, then this rank's dim-0 block of every (padded) tensor."""
        n = self.comm.size
        out = list(tensors)
        for k, bucket in enumerate(self.buckets):
            if len(bucket) == 1:
                out[bucket[0]] = self.comm.reduce_scatter(tensors[bucket[0]])
                continue
            layout = self.scatter_layouts[k]
            mine = self.comm.reduce_scatter(layout.pack_rank_major([tensors[i] for i in bucket]))
            blocks = layout.unpack_shards(mine)
            for j, i in enumerate(bucket):
                out[i] = blocks[j].reshape((self.shapes[i][0] // n,) + self.shapes[i][1:])
        return tuple(out)

    def all_gather(self, shards):
        """Every rank's shard of every tensor, concatenated along dim 0 in rank order."""
        n = self.comm.size
        out = list(shards)
        for k, bucket in enumerate(self.buckets):
            if len(bucket) == 1:
                out[bucket[0]] = self.comm.all_gather(shards[bucket[0]])
                continue
            layout = self.gather_layouts[k]
            cols = layout.unpack_gathered(self.comm.all_gather(layout.pack([shards[i] for i in bucket])))
            for j, i in enumerate(bucket):
                out[i] = cols[j].reshape((n * self.shapes[i][0],) + self.shapes[i][1:])
        return tuple(out)
