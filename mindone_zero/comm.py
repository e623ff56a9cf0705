"""Collectives: the only module that builds communication primitives.

Every function and method here is a *collective*: it must be called on every rank of the
group it names, in the same order, or the job hangs.

Backends differ in what they support (DESIGN §4). On Ascend and GPU every collective is
native. On MindSpore's CPU backend (2.10) AllReduce(SUM) works on every group, AllGather and
Broadcast only on the world group, and ReduceScatter not at all; ``GroupComm`` emulates what is
missing with AllReduce(SUM):

* reduce-scatter: all-reduce the whole padded tensor, keep this rank's block. Moves the whole
  tensor instead of 1/N of it.
* all-gather on a sub-group: place the block at its rows in a zero tensor of the full padded
  size and all-reduce. Moves N times the native volume.
* broadcast on a sub-group: zero the tensor on every rank but the root, then all-reduce.

The emulations give the same numbers as the native ops (additions of exact zeros), but move
more bytes. ``CommPlan`` therefore records what the *native* path would move, which is what
the ZeRO paper's 2Φ / 3Φ volumes refer to.
"""
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import mindspore as ms
from mindspore import nn, ops
from mindspore.communication import GlobalComm, get_group_size, get_rank

__all__ = [
    "GroupComm",
    "CommPlan",
    "world_group",
    "backend_has_native",
    "group_size_and_rank",
]


def world_group() -> str:
    """Name of the world communication group of the initialised backend."""
    return GlobalComm.WORLD_COMM_GROUP


def backend_has_native(collective: str, group: str) -> bool:
    """Whether the current device target runs ``collective`` natively on ``group``.

    Args:
        collective: one of "all_reduce", "all_gather", "broadcast", "reduce_scatter".
        group: communication group name.
    """
    if ms.get_context("device_target") != "CPU":
        return True
    if collective == "all_reduce":
        return True
    if collective in ("all_gather", "broadcast"):
        return group == world_group()
    return False


def group_size_and_rank(group: Optional[str]) -> Tuple[int, int]:
    """(size, this rank's index) of ``group``; ``(1, 0)`` when communication is not initialised."""
    if not GlobalComm.INITED:
        return 1, 0
    group = group or world_group()
    return get_group_size(group), get_rank(group)


@dataclass
class CommPlan:
    """What one optimizer step communicates, per rank, as the native collectives would.

    Filled at build time (graph-mode code is traced once, so calls cannot be counted at run
    time); each entry is ``(kind, group, bytes)`` where bytes is the size of the tensor each
    rank sends into a native collective of that kind.
    """

    entries: List[Tuple[str, str, int]] = field(default_factory=list)

    def add(self, kind: str, group: str, nbytes: int) -> None:
        self.entries.append((kind, group, int(nbytes)))

    def count(self, kind: Optional[str] = None) -> int:
        """Number of collectives (of ``kind`` if given)."""
        return sum(1 for k, _, _ in self.entries if kind is None or k == kind)

    def bytes(self, kind: Optional[str] = None) -> int:
        """Bytes sent per rank (of ``kind`` if given)."""
        return sum(b for k, _, b in self.entries if kind is None or k == kind)

    def summary(self) -> str:
        kinds = sorted({k for k, _, _ in self.entries})
        parts = [f"{k}: {self.count(k)} calls, {self.bytes(k)} B" for k in kinds]
        return "; ".join(parts) if parts else "no collectives"


class GroupComm(nn.Cell):
    """Collectives over one group, usable from ``construct`` in GRAPH_MODE and PYNATIVE_MODE.

    Built once per group on every rank (building it is not collective; calling it is).
    Tensors to reduce-scatter must have a dim 0 that divides by the group size (pad first,
    see [Note: padding] in partition.py); all-gather concatenates blocks along dim 0.

    Args:
        group: communication group name; None means the world group.
    """

    def __init__(self, group: Optional[str] = None):
        super().__init__(auto_prefix=False)
        self.group = group or world_group()
        self.size, self.rank = group_size_and_rank(self.group)
        self._all_reduce = ops.AllReduce(ops.ReduceOp.SUM, self.group)
        self._native_gather = backend_has_native("all_gather", self.group)
        self._native_rs = backend_has_native("reduce_scatter", self.group)
        self._native_bcast = backend_has_native("broadcast", self.group)
        self._all_gather = ops.AllGather(self.group) if self._native_gather else None
        self._reduce_scatter = ops.ReduceScatter(ops.ReduceOp.SUM, self.group) if self._native_rs else None
        self._broadcast0 = ops.Broadcast(0, self.group) if self._native_bcast else None

    def construct(self, x):
        """Sum of ``x`` over the group (the same as ``all_reduce``)."""
        return self._all_reduce(x)

    def all_reduce(self, x):
        """Sum of ``x`` over the group."""
        return self._all_reduce(x)

    def all_reduce_mean(self, x):
        """Mean of ``x`` over the group."""
        return self._all_reduce(x) / self.size

    def reduce_scatter(self, x):
        """Sum of ``x`` over the group, then this rank's block of ``x.shape[0] // size`` rows."""
        if self._native_rs:
            return self._reduce_scatter(x)
        rows = x.shape[0] // self.size
        total = self._all_reduce(x)
        return total[self.rank * rows:(self.rank + 1) * rows]

    def all_gather(self, x):
        """Blocks ``x`` of every rank concatenated along dim 0 in rank order."""
        if self._native_gather:
            return self._all_gather(x)
        rows = x.shape[0]
        parts = ()
        if self.rank > 0:
            parts += (ops.zeros((self.rank * rows,) + x.shape[1:], x.dtype),)
        parts += (x,)
        if self.rank < self.size - 1:
            parts += (ops.zeros(((self.size - 1 - self.rank) * rows,) + x.shape[1:], x.dtype),)
        return self._all_reduce(ops.concat(parts, 0))

    def broadcast(self, x, root: int = 0):
        """``x`` of the rank with group index ``root``, on every rank."""
        if self._native_bcast and root == 0:
            return self._broadcast0((x,))[0]
        if self.rank == root:
            return self._all_reduce(x)
        return self._all_reduce(ops.zeros_like(x))


def pad_dim0(x, pad: int):
    """``x`` with ``pad`` zero rows appended along dim 0 (graph-mode safe; ``pad`` is static)."""
    if pad == 0:
        return x
    return ops.concat((x, ops.zeros((pad,) + x.shape[1:], x.dtype)), 0)
