"""Coalesced ZeRO-3 gathers: the split parameters one Cell reads, in one all-gather and one reduce-scatter.

[Note: coalesced gathers]
On the CPU backend each collective costs about 0.3 ms of synchronisation whatever its size, so a
Cell that gathers its weight and bias separately pays twice. ``ZeroGatherGroup`` gathers them in
one collective (DeepSpeed's ``all_gather_coalesced`` per module, FSDP's per unit):

* forward: each padded shard is flattened and the pieces are concatenated into one flat buffer of
  S elements (``pack_shards``); the all-gather gives N * S elements, viewed (N, S): row r is rank
  r's buffer, so the columns of parameter i, (N, s_i), reshape to its padded full tensor; padding
  rows are dropped only where there are some ([Note: slices] in ``mindone_zero/core/comm.py``), with a
  copying slice as the per-parameter gather does ([Note: a view keeps its base]);
* backward: each gradient is padded and viewed (N, s_i), the views are concatenated along axis 1
  into (N, S) and flattened (``pack_grads``); one reduce-scatter gives this rank's S elements,
  split into the shard shapes and divided by the group size. Block r of the buffer holds block r
  of every parameter, so every element is summed with the same partners as by the per-parameter
  reduce-scatter: gradients are bit-identical (tests/dist/test_zero3_network.py checks it).

Which parameters are coalesced: the split ones a ZeRO-3 layer Cell gathers (``layers.py``), when
at least two have identical gather settings (group, parameter dtype, compute dtype) and each
padded tensor is at most ``COALESCE_MAX_BYTES``, the size from which buckets send a tensor alone
too (``mindone_zero.core.packing.LARGE_TENSOR_BYTES``): a large tensor gains nothing from sharing a
launch and would pay a copy into and out of the buffer. ZeRO++ (qwZ, qgZ, hpZ) gathers are not
coalesced: ``apply_zeropp`` switches every group off (``ZeroGatherGroup.enabled``) and the Cell
falls back to its per-parameter wrappers, which carry the quantization and hpZ logic.
"""
from typing import List, Optional, Sequence

import numpy as np
from mindspore import nn, ops

from ..core.comm import GroupComm, divide, pad_dim0
from ..core.comm_plan import CommPlan, PlanContext
from ..core.packing import LARGE_TENSOR_BYTES, itemsize_of

__all__ = ["ZeroGatherGroup", "COALESCE_MAX_BYTES", "pack_shards", "unpack_gathered", "pack_grads",
           "unpack_grad_shards", "build_gather_group", "offsets_of"]

COALESCE_MAX_BYTES = LARGE_TENSOR_BYTES
"""Largest padded parameter (bytes, in the gathered dtype) that ``ZeroGatherGroup`` coalesces."""


def pack_shards(shards: Sequence):
    """The shards flattened and concatenated: one flat buffer ([Note: coalesced gathers])."""
    flat = ()
    for x in shards:
        flat = flat + (x.reshape(-1),)
    return ops.concat(flat, 0)


def offsets_of(numels: Sequence[int]) -> tuple:
    """Where each parameter's piece starts in the flat buffer."""
    return tuple(int(x) for x in np.cumsum((0,) + tuple(numels[:-1])))


# The pieces are cut with copying slices, not ops.split: GRAPH_MODE (2.10) failed to compile
# ops.split inside this custom bprop once a second network had been built in the process
# ("The func graph is empty ... split").
def unpack_gathered(buf, n: int, numels: tuple, offsets: tuple, padded_shapes: tuple, full_rows: tuple,
                    pads: tuple):
    """The full tensors (padding rows dropped) from the all-gathered buffer of N * sum(numels) elements."""
    rows = buf.reshape((n, sum(numels)))
    out = ()
    for i in range(len(numels)):
        x = rows[:, offsets[i]:offsets[i] + numels[i]].reshape(padded_shapes[i])
        if pads[i] > 0:
            x = x[:full_rows[i]]  # a copy: [Note: a view keeps its base]
        out = out + (x,)
    return out


def pack_grads(grads: Sequence, n: int, numels: tuple, pads: tuple):
    """The gradients padded, viewed (N, s_i), concatenated along axis 1 and flattened."""
    cols = ()
    for i in range(len(numels)):
        cols = cols + (pad_dim0(grads[i], pads[i]).reshape((n, numels[i])),)
    return ops.concat(cols, 1).reshape(-1)


def unpack_grad_shards(buf, numels: tuple, offsets: tuple, shard_shapes: tuple):
    """This rank's gradient shards from the reduce-scattered buffer of sum(numels) elements."""
    out = ()
    for i in range(len(numels)):
        out = out + (buf[offsets[i]:offsets[i] + numels[i]].reshape(shard_shapes[i]),)
    return out


class _CoalescedGather(nn.Cell):
    """All-gather a tuple of shards in one collective; custom bprop: one reduce-scatter."""

    def __init__(self, gathers: List):
        super().__init__(auto_prefix=False)
        base = gathers[0]
        self.param_names = tuple(g.param_name for g in gathers)
        self.group_size = base.group_size
        self.param_dtype = base.param_dtype
        self.compute_dtype = base.compute_dtype
        self.cast_before_gather = base.cast_before_gather
        self.cast_after_gather = base.cast_after_gather
        self.numels = tuple(int(np.prod(g.spec.shard_shape)) for g in gathers)
        self.offsets = offsets_of(self.numels)
        self.padded_shapes = tuple(tuple(g.spec.padded_shape) for g in gathers)
        self.shard_shapes = tuple(tuple(g.spec.shard_shape) for g in gathers)
        self.full_rows = tuple(g.full_rows for g in gathers)
        self.pads = tuple(g.pad for g in gathers)
        self.comm = GroupComm(base.group_name)

    def construct(self, xs):
        buf = pack_shards(xs)
        if self.cast_before_gather:
            buf = buf.astype(self.compute_dtype)
        full = unpack_gathered(self.comm.all_gather(buf), self.group_size, self.numels, self.offsets,
                               self.padded_shapes, self.full_rows, self.pads)
        if not self.cast_after_gather:
            return full
        out = ()
        for x in full:
            out = out + (x.astype(self.compute_dtype),)
        return out

    def bprop(self, xs, out, dout):
        grads = ()
        for g in dout:
            grads = grads + (g.astype(self.param_dtype),)
        buf = self.comm.reduce_scatter(pack_grads(grads, self.group_size, self.numels, self.pads))
        return (unpack_grad_shards(divide(buf, self.group_size), self.numels, self.offsets, self.shard_shapes),)

    def nbytes(self, itemsize: int) -> int:
        """Bytes of the gathered buffer (N * S elements of ``itemsize``)."""
        return self.group_size * sum(self.numels) * itemsize


class ZeroGatherGroup(nn.Cell):
    """Gather several ZeRO-3 shards of one Cell in one all-gather; their gradients in one reduce-scatter.

    ``group(w, b)`` returns the full tensors ``(W, B)``, what ``w_wrapper(w), b_wrapper(b)`` return,
    bit for bit ([Note: coalesced gathers]). Collective over the parameters' group. Built by
    ``build_gather_group``; ``enabled`` is False once ZeRO++ options are applied, and the owning
    Cell then calls its per-parameter wrappers instead.
    """

    def __init__(self, gathers: List):
        super().__init__(auto_prefix=False)
        self.gather = _CoalescedGather(gathers)
        self.param_names = self.gather.param_names
        self.enabled = True

    def construct(self, *xs):
        # PYNATIVE: a same-shape reshape gives the custom bprop the shard's real shape (see ZeroParamWrapper).
        ys = ()
        for x in xs:
            ys = ys + (x.reshape(x.shape),)
        return self.gather(ys)

    def record_comm(self, plan: CommPlan, ctx: PlanContext) -> None:
        """[Note: comm plan]: this group's collectives of one optimizer step (native bytes): per
        micro-step one all-gather in forward (and again in backward when ``ctx`` names all its
        parameters regathered), one reduce-scatter. Not collective."""
        g = self.gather
        gathered = g.compute_dtype if g.cast_before_gather else g.param_dtype
        times_ag = 2 * ctx.micro_steps if ctx.regathers(self.param_names) else ctx.micro_steps
        plan.add("all_gather", g.comm.group, g.nbytes(itemsize_of(gathered)), g.group_size, times=times_ag)
        plan.add("reduce_scatter", g.comm.group, g.nbytes(itemsize_of(g.param_dtype)), g.group_size,
                 times=ctx.micro_steps)


def _settings(gather) -> tuple:
    return (gather.group_name, gather.group_size, gather.param_dtype, gather.compute_dtype, gather.zeropp)


def gathered_nbytes(gather) -> int:
    """Bytes of one parameter's gathered (padded) tensor, in the dtype it is all-gathered in."""
    dtype = gather.compute_dtype if gather.cast_before_gather else gather.param_dtype
    return int(np.prod(gather.spec.padded_shape)) * itemsize_of(dtype)


def build_gather_group(wrappers: Sequence, max_bytes: int = COALESCE_MAX_BYTES) -> Optional[ZeroGatherGroup]:
    """A ``ZeroGatherGroup`` for ``wrappers`` (``ZeroParamWrapper``), or None when they cannot be
    coalesced as one: fewer than two, one that does not all-gather, settings that differ, a padded
    tensor over ``max_bytes``, or ZeRO++ options ([Note: coalesced gathers]). Not collective."""
    if len(wrappers) < 2:
        return None
    gathers = []
    for w in wrappers:
        gather = getattr(w, "gather", None)
        if gather is None or not gather.gathers or gather.zeropp is not None or w.hpz:
            return None
        if gathered_nbytes(gather) > max_bytes:
            return None
        gathers.append(gather)
    if len({_settings(g) for g in gathers}) != 1:
        return None
    return ZeroGatherGroup(gathers)
