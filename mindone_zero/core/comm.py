"""Collectives: the only module that builds communication primitives.

Every function and method here is a *collective*: it must be called on every rank of the
group it names, in the same order, or the job hangs.

Backends differ in what they support (docs/guides/ascend-gpu.md). On Ascend and GPU all-reduce,
all-gather, broadcast and reduce-scatter are native. On MindSpore's CPU backend (2.10) AllReduce(SUM)
works on every group, AllGather and Broadcast only on the world group, and ReduceScatter not at all;
``GroupComm`` emulates what is missing with AllReduce(SUM):

* reduce-scatter: all-reduce the whole padded tensor, keep this rank's block. Moves the whole
  tensor instead of 1/N of it.
* all-gather on a sub-group: place the block at its rows in a zero tensor of the full padded
  size and all-reduce. Moves N times the native volume.
* broadcast on a sub-group: zero the tensor on every rank but the root, then all-reduce.
* ZeRO++'s quantized reduce-scatter (an all-to-all of int8 blocks natively): all-gather every
  rank's quantized tensor and keep the pieces of this rank's block. Moves N times the native volume.
  Int8 values travel in float16 ([Note: int8 on CPU]).

Ascend differs from GPU and CPU in three more ways ([Note: device targets] in backend.py): qgZ's
all-to-all is native on Ascend only, int8 values travel as int8 on Ascend only, and a bfloat16 tensor
travels as it is on Ascend only (elsewhere it is cast to float32 around every collective).

The emulations give the same numbers as the native ops (additions of exact zeros), but move
more bytes. ``CommPlan`` (comm_plan.py) therefore records what the *native* path would move, which is what
the ZeRO paper's 2Φ / 3Φ volumes refer to.

[Note: Div on CPU]
``x / n`` becomes the Div primitive, whose CPU kernel (MindSpore 2.10) allocates temporary buffers
many times the size of its input on every launch, which the heap allocator keeps once freed, so
dividing gradients by the group size raised every rank's peak memory. ``divide`` uses RealDiv,
which allocates nothing beyond its output, as a multiplication. Both compute the IEEE float32
quotient, so results are bit-identical (tests/unit/test_divide.py; the N=4 parity job's outputs,
every stage and mode, equal those of Div byte for byte), with one exception: a subnormal quotient
follows the flush-to-zero state of the thread that runs the kernel, which a library may have set on
one kernel's thread and not the other's (seen in PYNATIVE_MODE after other tests in one process).
RealDiv takes no bfloat16 scalar on CPU, so a bfloat16 tensor keeps ``/``.
"""
import weakref
from contextlib import contextmanager
from typing import List, Optional, Tuple

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops
from mindspore.communication import GlobalComm, get_group_size, get_rank

from . import backend
from .comm_plan import CommPlan
from .ms_internals import parallel_mode
from .quantize import dequantize_blocks, quantize_blocks
from .slicing import copy_slice, narrow

__all__ = [
    "NATIVE_OP", "NATIVE_SCALE", "NATIVE_SHARE", "NATIVE_ITEMSIZE",
    "GroupComm",
    "eager_mode",
    "is_data_parallel",
    "CommPlan",
    "world_group",
    "init_data_parallel",
    "backend_has_native",
    "group_size_and_rank",
    "group_members",
    "check_hybrid_groups",
    "pad_dim0",
    "divide",
    "cast_if_needed",
]


def init_data_parallel(device_target: str = "CPU") -> Tuple[int, int]:
    """Start a data-parallel job: set the device, initialise communication and
    ``ParallelMode.DATA_PARALLEL``. Collective: every rank calls it once, before building cells.

    Returns:
        (this rank, world size).
    """
    from mindspore.communication import init

    ms.set_device(device_target)
    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    return get_rank(), get_group_size()


def is_data_parallel() -> bool:
    """Whether MindSpore runs in ``ParallelMode.DATA_PARALLEL`` (the only mode ZeRO shards in)."""
    from mindspore.context import ParallelMode

    return parallel_mode() == ParallelMode.DATA_PARALLEL


def world_group() -> str:
    """Name of the world communication group of the initialised backend."""
    return GlobalComm.WORLD_COMM_GROUP


def backend_has_native(collective: str, group: str) -> bool:
    """Whether the current device target runs ``collective`` natively on ``group``.

    Args:
        collective: one of "all_reduce", "all_gather", "broadcast", "reduce_scatter".
        group: communication group name.
    """
    if backend.device_target() != "CPU":
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


# [Note: native tags]
# Every collective primitive ``GroupComm`` builds says, as primitive attributes, what the native path
# sends in its place, so that a compiled graph (whose nodes keep their primitives' attributes, e.g. in
# ``save_graphs``' ``graph_build_*.ir``) can be read back in the plan's terms ([Note: comm plan] in
# comm_plan.py): ``NATIVE_OP`` the native collective, and its bytes, the numel of the node's input
# times ``NATIVE_SCALE`` over ``NATIVE_SHARE`` times ``NATIVE_ITEMSIZE`` (0: the input's own). So a
# native all-gather scales its input by the group size (the plan counts its output), an all-reduce
# emulating a reduce-scatter or a sub-group all-gather is its input, int8 values carried in float16
# are 1 byte each, a bfloat16 tensor carried in float32 is 2, and qgZ's all-to-all emulated by an
# all-gather (an all-reduce on a sub-group: N times the input) is the input of one rank.
NATIVE_OP, NATIVE_SCALE, NATIVE_SHARE, NATIVE_ITEMSIZE = ("zero_native", "zero_native_scale", "zero_native_share",
                                                          "zero_native_itemsize")
# What a gather sends ([Note: native tags]): (native collective, native bytes per element or 0), by role.
_PLAIN, _BF16, _INT8, _A2A_INT8, _A2A_SCALES = range(5)
_GATHER_ROLES = (("all_gather", 0), ("all_gather", 2), ("all_gather", 1), ("all_to_all", 1), ("all_to_all", 0))


def _tagged(prim, native: str, scale: int = 1, share: int = 1, itemsize: int = 0):
    """``prim`` with the attributes of [Note: native tags]."""
    for name, value in ((NATIVE_OP, native), (NATIVE_SCALE, scale), (NATIVE_SHARE, share), (NATIVE_ITEMSIZE, itemsize)):
        prim.add_prim_attr(name, value)
    return prim


class _GroupPrimitives:
    """The primitives ``_group_primitives`` built for one group: ``by_name``, ``{attribute name: tuple}``.
    Every ``GroupComm`` of the group holds it, and the cache entry lives only as long as one does."""

    def __init__(self, by_name: dict):
        self.by_name = by_name


_PRIMITIVES = weakref.WeakValueDictionary()  # key -> _GroupPrimitives, while a GroupComm holds it


def _group_primitives(group: str, size: int, native_gather: bool, native_rs: bool,
                      native_bcast: bool) -> _GroupPrimitives:
    """The tagged collective primitives of a ``GroupComm`` over ``group``, by attribute name: one per
    role ([Note: native tags]): plain and bfloat16 carried in float32 (``_PLAIN``, ``_BF16``), and for
    gathers the quantized roles too. Built once per group and shared, as a shared gather Cell's are
    ([Note: shared gather graphs] in zero3/gather_build.py): a primitive holds no state of a call,
    and building a dozen per gather Cell costs build time. Shared only while a ``GroupComm`` that
    holds them lives: the cache does not outlive the networks that use it."""
    key = (group, size, native_gather, native_rs, native_bcast)
    held = _PRIMITIVES.get(key)
    if held is not None:
        return held

    def summed(native, share, itemsize):
        return _tagged(ops.AllReduce(ops.ReduceOp.SUM, group), native, 1, share, itemsize)

    prims = {"_sum_ops": tuple(summed("all_reduce", 1, i) for i in (0, 2)),
             "_bcast_sums": tuple(summed("broadcast", 1, i) for i in (0, 2))}  # any root
    if native_gather:
        prims["_native_gather_ops"] = tuple(_tagged(ops.AllGather(group), kind, size if kind == "all_gather" else 1,
                                                    1, i) for kind, i in _GATHER_ROLES)
    else:
        prims["_gather_sums"] = tuple(summed(kind, 1 if kind == "all_gather" else size, i) for kind, i in _GATHER_ROLES)
    if native_rs:
        prims["_native_scatter_ops"] = tuple(_tagged(ops.ReduceScatter(ops.ReduceOp.SUM, group), "reduce_scatter",
                                                     itemsize=i) for i in (0, 2))
    else:
        prims["_scatter_sums"] = tuple(summed("reduce_scatter", 1, i) for i in (0, 2))
    if native_bcast:
        prims["_native_bcast_ops"] = tuple(_tagged(ops.Broadcast(0, group), "broadcast", itemsize=i) for i in (0, 2))
    held = _GroupPrimitives(prims)
    _PRIMITIVES[key] = held
    return held


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
        self._native_gather = backend_has_native("all_gather", self.group)
        self._native_rs = backend_has_native("reduce_scatter", self.group)
        self._native_bcast = backend_has_native("broadcast", self.group)
        held = _group_primitives(self.group, self.size, self._native_gather, self._native_rs, self._native_bcast)
        object.__setattr__(self, "_held_primitives", held)  # keeps the shared entry alive (not a Cell attribute)
        for name, value in held.by_name.items():
            setattr(self, name, value)
        # [Note: same graph on every rank] On the CPU backend, the collectives of one graph run
        # in the graph's topological order, and collectives are matched across ranks by that
        # order alone. A rank-dependent graph (an `if self.rank == root` branch, or zeros that
        # fold into a constant input on some ranks only) sorts differently per rank and pairs
        # one rank's all-reduce with another's: wrong sums or a crash. The emulations therefore
        # build the same ops on every rank and select this rank's part with a one-hot mask.
        onehot = np.zeros((self.size,), np.bool_)
        onehot[self.rank] = True
        self._is_me = Tensor(onehot)
        # [Note: int8 on CPU] MindSpore 2.10's CPU AllGather and AllReduce have no int8 kernel: the
        # int8 values travel there (and on GPU: [Note: device targets] in backend.py) in float16, which
        # holds [-127, 127] exactly (2 bytes instead of 1; CommPlan records the native int8 bytes).
        self.carrier = backend.int8_carrier()
        self._native_a2a = backend.native_all_to_all()
        self._all_to_all = None
        if self._native_a2a and self.size > 1:
            self._all_to_all = _tagged(ops.AlltoAll(self.size, 0, 0, self.group), "all_to_all")
        self.bf16_carrier = backend.bf16_collective_carrier()  # None (Ascend): bfloat16 travels as it is

    def _carried(self, x):
        """Whether ``x`` is cast to ``bf16_carrier`` around the collective (bfloat16 on GPU and CPU;
        the emulations' own ops run on the cast tensor too); a static check."""
        return self.bf16_carrier is not None and x.dtype == ms.bfloat16

    def _sum(self, x):
        if self._carried(x):
            return ops.cast(self._sum_ops[_BF16](ops.cast(x, self.bf16_carrier)), x.dtype)
        return self._sum_ops[_PLAIN](x)

    def construct(self, x):
        """Sum of ``x`` over the group (the same as ``all_reduce``)."""
        return self._sum(x)

    def all_reduce(self, x):
        """Sum of ``x`` over the group."""
        return self._sum(x)

    def all_reduce_mean(self, x):
        """Mean of ``x`` over the group."""
        if self._carried(x):
            return ops.cast(divide(self._sum_ops[_BF16](ops.cast(x, self.bf16_carrier)), self.size), x.dtype)
        return divide(self._sum_ops[_PLAIN](x), self.size)  # [Note: Div on CPU]

    def reduce_scatter(self, x):
        """Sum of ``x`` over the group, then this rank's block of ``x.shape[0] // size`` rows."""
        if self._carried(x):
            return ops.cast(self._reduce_scatter(ops.cast(x, self.bf16_carrier), _BF16), x.dtype)
        return self._reduce_scatter(x, _PLAIN)

    def _reduce_scatter(self, x, role):
        if self._native_rs:
            return self._native_scatter_ops[role](x)
        total = self._scatter_sums[role](x)
        if self.size == 1:
            return total  # [Note: slices] in slicing.py: the block is the whole tensor
        rows = x.shape[0] // self.size
        return copy_slice(total, 0, self.rank * rows, rows)  # a copy: [Note: a view keeps its base] in slicing.py

    def all_gather(self, x):
        """Blocks ``x`` of every rank concatenated along dim 0 in rank order."""
        if self._carried(x):
            return ops.cast(self._all_gather(ops.cast(x, self.bf16_carrier), _BF16), x.dtype)
        return self._all_gather(x, _PLAIN)

    def _all_gather(self, x, role):
        """``all_gather`` with the primitive of ``role`` ([Note: native tags]; a static index)."""
        if self._native_gather:
            return self._native_gather_ops[role](x)
        # Every rank writes its block into its slot of a (size, *x.shape) zero tensor and sums.
        full = ops.broadcast_to(ops.expand_dims(x, 0), (self.size,) + x.shape)
        mine = ops.broadcast_to(self._is_me.reshape((self.size,) + (1,) * x.ndim), full.shape)
        full = ops.select(mine, full, ops.zeros_like(full))
        return self._gather_sums[role](full.reshape((self.size * x.shape[0],) + x.shape[1:]))

    def all_gather_quantized(self, x, block: int, blocks: int):
        """qwZ: all-gather ``x`` (this rank's block) as int8 blocks with float32 scales
        ([Note: block quantization] in quantize.py, ``block_layout(x.size, block_size)``); every rank
        dequantizes. Returns float32 of shape ``(size * x.shape[0], *x.shape[1:])``."""
        q, scales = quantize_blocks(x.reshape(-1), block, blocks, self.carrier)
        q = self._all_gather(q, _INT8).reshape((self.size, blocks * block))
        scales = self._all_gather(scales, _PLAIN).reshape((self.size, blocks))
        full = dequantize_blocks(q, scales, block, x.size)
        return full.reshape((self.size * x.shape[0],) + x.shape[1:])

    def reduce_scatter_quantized(self, x, block: int, blocks: int):
        """qgZ: sum of ``x`` over the group, this rank's block of ``x.shape[0] // size`` rows, with
        every rank's contribution quantized per destination block (``block_layout(block rows' size,
        block_size)``) and summed in float32 after dequantization. One all-to-all of the int8 blocks
        and one of the scales on Ascend, the all-gather emulation elsewhere. Returns float32."""
        rows = x.shape[0] // self.size
        numel = x.size // self.size
        q, scales = quantize_blocks(x.reshape((self.size, numel)), block, blocks, self.carrier)
        if self._all_to_all is not None:
            q, scales = self._all_to_all(q), self._all_to_all(scales)
        elif self.size > 1:
            q = narrow(self._all_gather(q, _A2A_INT8).reshape((self.size, self.size, blocks * block)), 1, self.rank, 1)
            scales = narrow(self._all_gather(scales, _A2A_SCALES).reshape((self.size, self.size, blocks)), 1, self.rank,
                            1)
        q, scales = q.reshape((self.size, blocks * block)), scales.reshape((self.size, blocks))
        total = ops.sum(dequantize_blocks(q, scales, block, numel), 0)
        return total.reshape((rows,) + x.shape[1:])

    def broadcast(self, x, root: int = 0):
        """``x`` of the rank with group index ``root``, on every rank."""
        if self._carried(x):
            return ops.cast(self._broadcast(ops.cast(x, self.bf16_carrier), root, _BF16), x.dtype)
        return self._broadcast(x, root, _PLAIN)

    def _broadcast(self, x, root, role):
        if self._native_bcast and root == 0:
            # The CPU kernel returns float32 for a float16 input in PYNATIVE_MODE.
            return ops.cast(self._native_bcast_ops[role]((x,))[0], x.dtype)
        keep = ops.broadcast_to(self._is_me[root], x.shape)
        return self._bcast_sums[role](ops.select(keep, x, ops.zeros_like(x)))


@contextmanager
def eager_mode():
    """Run the enclosed eager collectives in PYNATIVE_MODE: in GRAPH_MODE each call with a new
    input shape would compile a graph of its own. The previous mode is restored."""
    mode = ms.get_context("mode")
    if mode != ms.PYNATIVE_MODE:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        yield
    finally:
        if mode != ms.PYNATIVE_MODE:
            ms.set_context(mode=mode)


def pad_dim0(x, pad: int):
    """``x`` with ``pad`` zero rows appended along dim 0 (graph-mode safe; ``pad`` is static)."""
    if pad == 0:
        return x
    return ops.concat((x, ops.zeros((pad,) + x.shape[1:], x.dtype)), 0)


def cast_if_needed(x, dtype):
    """``x`` in ``dtype``; no Cast node (a copy in PYNATIVE_MODE, a graph to compile in GRAPH_MODE)
    when it already is (graph-mode safe; the dtype check is static)."""
    return x if x.dtype == dtype else ops.cast(x, dtype)


_REAL_DIV = ops.RealDiv()


def divide(x, n):
    """``x / n`` for a Python number ``n``, without Div's temporary buffers ([Note: Div on CPU]);
    graph-mode safe (the dtype check is static)."""
    if x.dtype == ms.bfloat16:
        return x / n
    return _REAL_DIV(x, ops.scalar_to_tensor(n, x.dtype))


def group_members(group: str) -> List[int]:
    """World ranks of ``group``, in group-rank order (not collective)."""
    from mindspore.communication import get_world_rank_from_group_rank

    if group == world_group():
        return list(range(get_group_size()))
    return [get_world_rank_from_group_rank(group, i) for i in range(get_group_size(group))]


def check_hybrid_groups(where: str, optimizer_parallel_group: str, dp_group: Optional[str]) -> None:
    """Check that the shard group and the replica group tile the world (not collective).

    Each rank must belong to both groups, the two must meet in this rank alone, and their
    sizes must multiply to the world size, so that every (shard, replica) pair is one rank.

    Raises:
        ValueError: naming the groups and what is wrong.
    """
    world = get_group_size()
    me = get_rank()
    op_members = group_members(optimizer_parallel_group)
    if me not in op_members:
        raise ValueError(
            f"For '{where}', this rank ({me}) must be in 'optimizer_parallel_group' {optimizer_parallel_group!r}, "
            f"but its ranks are {op_members}."
        )
    if dp_group is None:
        if len(op_members) != world:
            raise ValueError(
                f"For '{where}', the argument 'dp_group' must be given when 'optimizer_parallel_group' "
                f"{optimizer_parallel_group!r} holds {len(op_members)} of {world} ranks, but got dp_group=None."
            )
        return
    dp_members = group_members(dp_group)
    if me not in dp_members:
        raise ValueError(
            f"For '{where}', this rank ({me}) must be in 'dp_group' {dp_group!r}, but its ranks are {dp_members}."
        )
    if len(op_members) * len(dp_members) != world or set(op_members) & set(dp_members) != {me}:
        raise ValueError(
            f"For '{where}', 'optimizer_parallel_group' {optimizer_parallel_group!r} (ranks {op_members}) and "
            f"'dp_group' {dp_group!r} (ranks {dp_members}) must tile the {world} ranks: sizes multiplying to {world} "
            f"and meeting only in this rank ({me})."
        )
