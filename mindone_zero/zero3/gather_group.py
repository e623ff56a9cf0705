"""``GatherGroup``: the one Cell type that gathers ZeRO-3 parameters, one or several in one collective.

A group is built from the ``ParamGather`` of each member (param_wrapper.py) and the ``GatherRecord``
of its collective ([Note: comm records] in core/comm_records.py): a ``ZeroParamWrapper``'s gather is
a group of one, a ``ZeroGatherGroup``'s (coalesce.py) and a gather unit's part (units.py) a group of
several. What it sends and how is [Note: gather groups]; when it sends is [Note: gather order] in
param_wrapper.py (its ``waiting`` Cell).

[Note: gather groups]
The unit of communication at stage 3 is a group of parameters, as FSDP2's ``FSDPParamGroup`` is: a
lone parameter is a group of one. Two methods of the group's ``waiting`` Cell move it: ``construct``
(forward: every member's full tensor from this rank's shards) and ``reduce_scatter_members``
(backward: this rank's block of the group mean of every member's gradient, or of the group sum
where a train step divides: [Note: the group mean in the step]). A group of one sends
its shard as it is: a tensor in, a tensor out, no buffer. A group of several packs its shards into
one buffer and sends it in one collective ([Note: coalesced gathers] in coalesce.py; [Note: packed
layout] in core/packing.py), and its methods take and return tuples in member order.

How the bytes travel, the group's wire format, is two methods of the group, ``gather_padded`` and
``reduce_padded``: the shards in the wire dtype ([Note: wire dtype] in core/comm_records.py) or
ZeRO++'s qwZ int8 blocks, and the gradients as they are or ZeRO++'s qgZ int8 blocks summed in
float32. Quantized formats serve groups of one only: gathers with ZeRO++ options are never coalesced
([Note: ZeRO++ at build] in param_wrapper.py). The formats are not objects the group holds (FSDP2's
pluggable all-gather): with the wire as Cells (one per direction, one for both, called as Cells or
through methods, with one communicator or one each), MindSpore 2.10 fails to compile a step with
qwZ and qgZ together ("The func graph is empty ... quantize_blocks" in the reduce-scatter's
custom bprop), while the same calls from the group's own methods compile
(tests/dist/test_zeropp.py trains with both).

[Note: the group mean in the step]
A group's backward returns the mean over the group of each member's gradient, MindOne's contract
for a ZeRO-3 network: the reduce-scatter's sum divided by the group size, one RealDiv per group.
The train step then multiplies every gradient by ``1 / loss scale``, one Mul per tensor (its
gradients come out of backward one by one, in no bucket: [Note: unscale and check in the buckets]
in core/scaling.py). ``TrainOneStepWrapper`` folds the first into the second: when it is built over
a network whose reducing groups all share one size N, it sets their ``divides_grads`` to False
(``sum_grads_in_backward``) and multiplies the split parameters' gradients by ``1 / (scale * N)``
instead (``GradSync.reduce_and_check``). Per group of one that is one kernel fewer, one per
parameter on a model of lone tensors. The numbers are the same where N is a power of two (every
group here): dividing by it and multiplying by its inverse only move the exponent, so both ways
round once, at the product, to the same float, unless a value falls among the subnormals. For
other N they may differ in the last bit. After that, a gradient of the network taken outside the
train step (``ms.grad`` of it) is the group's sum, not its mean: the switch belongs to the network
and is read when a graph compiles.
"""
from typing import Optional, Sequence

import numpy as np
from mindspore import nn, ops
from mindspore.ops.composite import zeros_like

from ..core.comm import GroupComm, cast_if_needed, divide, pad_dim0
from ..core.graph_tuples import each
from ..core.packing import PackedLayout
from ..core.run_mode import in_pynative
from ..core.slicing import copy_slice

__all__ = ["GatherGroup", "after_grad", "sum_grads_in_backward"]

_ZEROS_LIKE, _DEPEND = ops.ZerosLike(), ops.Depend()
after_grad = ops.MultitypeFuncGraph("after_grad")
"""The gradient a custom bprop returns for its ``after`` input ([Note: gather order] in
param_wrapper.py): zeros of a tensor (the primitive: no ``zeros_like`` graph); None for None; for
any other input (a construct's first input may be a tuple, a list or a number), MindSpore's
``zeros_like`` of it."""


@after_grad.register("Tensor")
def _after_grad_tensor(after):
    return _ZEROS_LIKE(after)


@after_grad.register("None")
def _after_grad_none(after):
    return after


@after_grad.register("Tuple")
@after_grad.register("List")
@after_grad.register("Number")
def _after_grad_other(after):
    return zeros_like(after)


class _GroupWaiting(nn.Cell):
    """A ``GatherGroup``'s all-gather once ``after`` exists: ``cell(x, after)``, held as
    ``base.waiting`` of the gather Cell ``base`` (its parent, not its child); its reduce-scatter in
    the custom bprop and zeros for ``after``. The forward is written here and ``GatherGroup.construct``
    calls it: one graph per call, not two. In PYNATIVE_MODE a call runs ``base(x)`` instead ([Note:
    gather order] in param_wrapper.py says why); a graph never runs ``__call__``: it compiles
    ``construct``."""

    def __init__(self, base: nn.Cell):
        super().__init__(auto_prefix=False)
        object.__setattr__(self, "base", base)

    def __call__(self, x, after):
        if in_pynative():
            return self.base(x)
        return super().__call__(x, after)

    def construct(self, xs, after):
        """Every member's full tensor (padding rows dropped, compute dtype) of the group from this
        rank's shards ``xs`` (a tensor for a group of one, else a tuple), sent once ``after`` exists
        ([Note: gather order] in param_wrapper.py). Collective over the group where ``gathers``."""
        g = self.base
        if g.single:
            x = _DEPEND(xs, after)
            if not g.gathers:
                if g.cast_before_gather or g.cast_after_gather:
                    x = x.astype(g.compute_dtype)
                return x
            return self._finish(g.gather_padded(x), 0)
        buf = _DEPEND(g.layout.pack(xs), after)
        cols = g.layout.unpack_gathered(g.gather_padded(buf))
        out = ()
        for i in range(len(cols)):
            out = out + (self._finish(cols[i].reshape(g.padded_shapes[i]), i),)
        return out

    def bprop(self, xs, after, out, dout):
        return self.reduce_scatter_members(dout, xs), after_grad(after)

    def _finish(self, x, i: int):
        """Member ``i``'s gathered padded tensor ``x``: padding rows dropped (a copy: [Note: a view keeps
        its base] in core/slicing.py), cast to the compute dtype."""
        g = self.base
        if g.pads[i] > 0:
            x = copy_slice(x, 0, 0, g.full_rows[i])
        if g.cast_after_gather:
            x = x.astype(g.compute_dtype)
        return x

    def reduce_scatter_members(self, douts, xs):
        """This rank's block of the group mean of every member's gradient ``douts`` (shaped like the
        shards ``xs``: a tensor for a group of one, else a tuple), in the parameters' dtype; the group
        sum where not ``divides_grads`` ([Note: the group mean in the step]). Zeros without a
        collective for frozen members. Collective over the group where ``gathers`` and ``reduces``."""
        g = self.base
        if g.single:
            if not g.reduces:
                return ops.zeros(g.shard_shapes[0], g.param_dtype)
            grad = cast_if_needed(douts, g.param_dtype)
            if g.gathers:
                grad = pad_dim0(grad, g.pads[0])
                grad = g.reduce_padded(grad)
                if g.divides_grads:
                    grad = divide(grad, g.group_size)  # [Note: Div on CPU] in core/comm.py
            return grad
        if not g.reduces:
            return each(_ZEROS_LIKE, xs)
        grads = ()
        for i in range(len(douts)):
            grads = grads + (pad_dim0(cast_if_needed(douts[i], g.param_dtype), g.pads[i]),)
        buf = g.reduce_padded(g.layout.pack_rank_major(grads))
        if g.divides_grads:
            buf = divide(buf, g.group_size)
        blocks = g.layout.unpack_shards(buf)
        shards = ()
        for i in range(len(blocks)):
            shards = shards + (blocks[i].reshape(g.shard_shapes[i]),)
        return shards


class GatherGroup(nn.Cell):
    """All-gather the shards of one or more ZeRO-3 parameters in one collective; custom bprop: one
    reduce-scatter of their gradients ([Note: gather groups]).

    The only code that moves a stage-3 group is its ``waiting`` Cell's: ``construct`` (the all-gather)
    and ``reduce_scatter_members``. They are methods of a Cell, not free functions, because GRAPH_MODE
    parses a free function once and gives its nodes the scope of its first caller, so every gather's
    nodes would be named after one layer.

    A group of one takes and returns a tensor; a group of several a tuple, in member order. Members
    share a group, dtypes and ZeRO++ options (``gather_settings`` in coalesce.py). Collective over the
    group where ``gathers``. Building it is not collective.

    Args:
        record (GatherRecord): the record of its collective ([Note: comm records] in
            core/comm_records.py).
        members (tuple): the ``ParamGather`` of each member, in buffer order.
        plan: what it was built from (a ``ParamGather`` or a ``CoalescedPlan``), for its repr.
    """

    def __init__(self, record, members: tuple, plan=None):
        super().__init__(auto_prefix=False)
        self.record, self.plan = record, plan
        self.single = len(members) == 1
        self.zeropp = members[0].zeropp if self.single else None
        self.param_names = record.members
        self.spec = members[0].spec if self.single else None
        self.param_name = record.members[0] if self.single else None
        self.group_size = record.group_size
        self.gathers = record.gathers
        self.reduces = record.reduces  # a frozen parameter's gradient is zeros, not communicated
        self.divides_grads = True  # [Note: the group mean in the step]
        self.param_dtype = record.param_dtype
        self.compute_dtype = record.compute_dtype
        self.quantize_weights, self.quantize_grads = record.quantize_weights, record.quantize_grads
        self.cast_before_gather, self.cast_after_gather = record.cast_before_gather, record.cast_after_gather
        self.wire_dtype = record.wire_dtype  # [Note: wire dtype] in core/comm_records.py
        self.padded_shapes, self.shard_shapes = record.padded_shapes, record.shard_shapes
        self.full_rows = tuple(m.spec.shape[0] if m.spec.shape else 0 for m in members)
        self.pads = tuple(m.spec.pad for m in members)
        if not self.single:
            self.layout = PackedLayout([int(np.prod(s)) for s in self.shard_shapes], self.group_size)
        self.comm = GroupComm(record.group) if self.gathers else None
        self.block, self.blocks = record.block, record.blocks  # qwZ's and qgZ's block layout
        self.waiting = _GroupWaiting(self)

    def gather_padded(self, x):
        """The padded full tensor (or packed buffer) of shard ``x`` as the wire delivers it: in the
        wire dtype, or in the parameter's dtype after qwZ ([Note: gather groups]). Collective over
        the group."""
        if self.quantize_weights:
            return self.comm.all_gather_quantized(x, self.block, self.blocks)
        if self.cast_before_gather:
            x = x.astype(self.wire_dtype)
        return self.comm.all_gather(x)

    def reduce_padded(self, grad):
        """This rank's block of the sum over the group of the padded gradient (or rank-major buffer)
        ``grad``, in the parameter's dtype: plain or qgZ ([Note: gather groups]). Collective over the
        group."""
        if self.quantize_grads:
            return self.comm.reduce_scatter_quantized(grad, self.block, self.blocks).astype(self.param_dtype)
        return self.comm.reduce_scatter(grad)

    def shard_grad(self, dout):
        """A group of one: this rank's block of the group mean of ``dout`` ([Note: gather groups])."""
        return self.waiting.reduce_scatter_members(dout, None)

    def construct(self, xs):
        return self.waiting.construct(xs, None)  # PYNATIVE_MODE ([Note: gather order] in param_wrapper.py)

    def bprop(self, xs, out, dout):
        return (self.waiting.reduce_scatter_members(dout, xs),)

    def extend_repr(self):
        return self.plan.describe() if self.single and self.plan is not None else ""


def sum_grads_in_backward(network: nn.Cell, records: Sequence, names: Sequence[str]) -> Optional[int]:
    """Hand the division by the group size to the train step ([Note: the group mean in the step]).

    ``records`` are the ``GatherRecord``s of the gathers ``network`` calls (``network_gathers`` in
    train/comm_accounting.py: gather Cells are shared between callers, [Note: shared gather graphs]
    in gather_build.py, so only the records name every member) and ``names`` the split parameters
    whose gradients the step takes. When the records that reduce gradients have every name among
    their members, and they and the ``GatherGroup``s in ``network`` that reduce have one group size N
    between them, set each such group's ``divides_grads`` to False and return N; otherwise change
    nothing and return None. Call it before the network's gradient graph compiles. Not collective."""
    reducing = [r for r in records if r.gathers and r.reduces]
    groups = {id(c): c for _, c in network.cells_and_names() if isinstance(c, GatherGroup) and c.gathers and c.reduces}
    sizes = {r.group_size for r in reducing} | {g.group_size for g in groups.values()}
    if len(sizes) != 1 or not set(names) <= {name for r in reducing for name in r.members}:
        return None
    for g in groups.values():
        g.divides_grads = False
    return sizes.pop()
