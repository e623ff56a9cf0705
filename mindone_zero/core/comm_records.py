"""What each communicating object sends, as immutable records: the data its Cells are built from
and the communication plan is counted from.

[Note: comm records]
A collective's bytes are decided once, in the record of the object that sends it, and both sides
read that record: the Cell's constructor builds its casts, buffers and buckets from the record's
fields, and ``train/comm_accounting.py`` derives the ``CommPlan`` ([Note: comm plan] in
comm_plan.py) from the same fields. So the plan cannot count bytes that the Cell does not send.

* ``GatherRecord``: one ZeRO-3 gather, per parameter (``ZeroParamWrapper``), coalesced
  (``ZeroGatherGroup``), a gather unit's part or large element (``ZeroUnitGather``), with its
  ZeRO++ settings (qwZ, qgZ blocks; hpZ's secondary group), whether backward gathers it again
  ([Note: dropped re-gathers] in zero3/backward_reads.py) and whether it reduce-scatters gradients
  (not for frozen parameters).
* ``BucketRecord``: the buckets of one ``BucketedComm`` (train/fusion.py).
* ``TrainCommRecord``: what a ``ZeroHelper`` sends besides the network's gathers: the overflow
  flag, its buckets, the clipping norm, the post-step all-gather and the offload agreement.

[Note: wire dtype]
A gather sends its elements in one dtype (``gather_wire_dtype``): int8 blocks with qwZ (quantized
from the parameter's dtype; cast to the compute dtype after the gather), the compute dtype when it
is narrower than the parameter's (cast before the gather: fewer bytes travel), else the parameter's
dtype (a wider compute dtype is cast after). Gradients travel in the parameter's dtype (int8 blocks
with qgZ). ``GatherGroup`` (zero3/gather_group.py) casts where this rule says, and the plan counts
its bytes.
"""
from dataclasses import dataclass
from typing import Optional, Tuple

import mindspore as ms
import numpy as np

from .packing import itemsize_of

__all__ = ["GatherRecord", "BucketRecord", "TrainCommRecord", "GATHER_KINDS", "FLAG_DTYPE", "gather_wire_dtype"]

GATHER_KINDS = ("layer", "unit")
"""Who calls the gather: a layer (a ``ZeroParamWrapper``'s group of one, a ``ZeroGatherGroup``'s
coalesced group) or a gather unit (one of its parts). Either is one ``GatherGroup`` of one or more
members ([Note: gather groups] in zero3/gather_group.py)."""

FLAG_DTYPE = ms.float32
"""The dtype of the train step's one-element collectives: the overflow flag, the clipping norm and
the offload agreement's per-rank flags."""


def gather_wire_dtype(param_dtype, compute_dtype, quantize_weights: bool = False):
    """The dtype a ZeRO-3 gather sends per element ([Note: wire dtype])."""
    if quantize_weights:
        return ms.int8
    if itemsize_of(compute_dtype) < itemsize_of(param_dtype):
        return compute_dtype
    return param_dtype


@dataclass(frozen=True)
class GatherRecord:
    """One ZeRO-3 gather: an all-gather in forward (again in backward when ``regather``) and a
    reduce-scatter of the gradients, over ``group`` ([Note: comm records]).

    Attributes:
        kind: one of ``GATHER_KINDS``.
        group, group_size: the shard group.
        members: names of the parameters, in buffer order (their names at sharding time).
        padded_shapes, shard_shapes: each member's padded full shape and shard shape.
        param_dtype, compute_dtype: the members' dtype and the dtype the gather returns.
        gathers: whether it communicates (False for a parameter kept whole or a group of one rank).
        quantize_weights, quantize_grads: ZeRO++'s qwZ and qgZ, in int8 blocks of ``block``
            elements, ``blocks`` per shard.
        hpz_group, hpz_size: ZeRO++'s hpZ secondary group (None: no hpZ).
        regather: backward gathers it again (in ``hpz_group`` with hpZ).
        reduces: backward reduce-scatters the gradients (False for frozen parameters: their
            gradient is zeros, made without a collective).
    """

    kind: str
    group: str
    group_size: int
    members: Tuple[str, ...]
    padded_shapes: Tuple[Tuple[int, ...], ...]
    shard_shapes: Tuple[Tuple[int, ...], ...]
    param_dtype: object
    compute_dtype: object
    gathers: bool = True
    quantize_weights: bool = False
    quantize_grads: bool = False
    block: int = 0
    blocks: int = 0
    hpz_group: Optional[str] = None
    hpz_size: int = 1
    regather: bool = False
    reduces: bool = True

    @property
    def wire_dtype(self):
        """The dtype the all-gather sends ([Note: wire dtype])."""
        return gather_wire_dtype(self.param_dtype, self.compute_dtype, self.quantize_weights)

    @property
    def cast_before_gather(self) -> bool:
        """The shards are cast to the compute dtype before the all-gather."""
        return not self.quantize_weights and self.wire_dtype != self.param_dtype

    @property
    def cast_after_gather(self) -> bool:
        """The gathered tensors are cast to the compute dtype after the all-gather: they arrive in
        another dtype (the wire dtype, or float32 from qwZ's dequantization)."""
        arrives = ms.float32 if self.quantize_weights else self.wire_dtype
        return arrives != self.compute_dtype

    @property
    def numel(self) -> int:
        """Elements of the gathered (padded) tensors, all members together."""
        return sum(int(np.prod(s, dtype=np.int64)) for s in self.padded_shapes)

    @property
    def gathered_nbytes(self) -> int:
        """Bytes of the gathered tensors in the wire dtype (without qwZ)."""
        return self.numel * itemsize_of(self.wire_dtype)

    @property
    def grad_nbytes(self) -> int:
        """Bytes of the padded gradients a reduce-scatter takes (without qgZ)."""
        return self.numel * itemsize_of(self.param_dtype)

    @property
    def hpz_gathered_nbytes(self) -> int:
        """Bytes of hpZ's secondary all-gather: the padded tensors in the compute dtype ([Note: hpZ])."""
        return self.numel * itemsize_of(self.compute_dtype)

    @property
    def hpz_shard_nbytes(self) -> int:
        """Bytes of this rank's hpZ secondary shard, kept from forward to backward ([Note: hpZ])."""
        return self.hpz_gathered_nbytes // self.hpz_size


@dataclass(frozen=True)
class BucketRecord:
    """The buckets of one ``BucketedComm``: which tensors each sends together, and its bytes.

    Attributes:
        kind: ``"all_reduce"``, ``"reduce_scatter"`` (gradients, every gradient reduction) or
            ``"all_gather"`` (updated shards, once per optimizer step).
        group, group_size: the group.
        buckets: the tensors' indices in each bucket, in the order of the tensors given.
        bucket_bytes: bytes of each bucket's tensors as given (an all-gather's: the shards).
        dtypes: each bucket's dtype (a bucket holds one), what it sends in.
    """

    kind: str
    group: str
    group_size: int
    buckets: Tuple[Tuple[int, ...], ...]
    bucket_bytes: Tuple[int, ...]
    dtypes: Tuple[str, ...]

    @property
    def full_bytes(self) -> Tuple[int, ...]:
        """Each bucket's full-tensor bytes: an all-gather's output, else its input."""
        scale = self.group_size if self.kind == "all_gather" else 1
        return tuple(b * scale for b in self.bucket_bytes)


@dataclass(frozen=True)
class TrainCommRecord:
    """What a ``ZeroHelper`` sends in data parallelism, besides the network's gathers.

    Attributes:
        world_group, world_size: the overflow flag's all-reduce (one ``FLAG_DTYPE`` element, every
            micro-step) and, with ``offload_agreement``, the host step's agreement (one element per
            rank, every optimizer step).
        op_group, op_size: the shard group, over which the clipping norm is all-reduced when
            ``norm_reduced`` (stages >= 1).
        grad_buckets: the gradient reductions' buckets (reduce-scatter, all-reduce, the replicas').
        param_gather: the post-step all-gather's buckets (stages 1-2; empty otherwise).
    """

    world_group: str
    world_size: int
    op_group: str
    op_size: int
    norm_reduced: bool
    grad_buckets: Tuple[BucketRecord, ...]
    param_gather: BucketRecord
    offload_agreement: bool = False

    @property
    def flag_nbytes(self) -> int:
        return itemsize_of(FLAG_DTYPE)
