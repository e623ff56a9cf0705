"""Coalesced ZeRO-3 gathers: the split parameters one Cell reads, in one all-gather and one reduce-scatter.

[Note: coalesced gathers]
Each collective costs a synchronisation whatever its size, so a Cell that gathers its weight and
bias separately pays twice. ``ZeroGatherGroup`` gathers them in one collective (DeepSpeed's
``all_gather_coalesced`` per module, FSDP's per unit): the padded shards are packed into one
buffer, all-gathered and unpacked into the padded full tensors; in backward the padded gradients
are packed rank-major and reduce-scattered once, then divided by the group size. The buffer layout
is [Note: packed layout] in ``mindone_zero/core/packing.py``; it sums every element with the
partners of the per-parameter reduce-scatter, so gradients are bit-identical
(tests/dist/test_zero3_network.py checks it). Padding rows are dropped only where there are some
([Note: slices] in ``mindone_zero/core/slicing.py``), with a copying slice as the per-parameter
gather does ([Note: a view keeps its base]).

Which parameters are coalesced: the split ones a ZeRO-3 layer Cell gathers (``layers.py``), when
at least two have identical gather settings (group, parameter dtype, compute dtype) and each
padded tensor is at most ``COALESCE_MAX_BYTES``, the size from which buckets send a tensor alone
too: a large tensor gains nothing from sharing a launch and would pay a copy into and out of the
buffer. Gathers with ZeRO++ options are per parameter, never coalesced ([Note: ZeRO++ at build] in
``param_wrapper.py``).
"""
from dataclasses import dataclass, replace
from typing import List, Optional, Sequence, Tuple

from mindspore import nn, ops

from ..core.comm_records import GatherRecord
from ..core.graph_tuples import each
from ..core.packing import LARGE_TENSOR_BYTES
from .gather_group import GatherGroup

__all__ = ["ZeroGatherGroup", "COALESCE_MAX_BYTES", "build_gather_group", "gather_settings", "coalesced_record",
           "CoalescedPlan"]

COALESCE_MAX_BYTES = LARGE_TENSOR_BYTES
"""Largest padded parameter (bytes, in the dtype it is all-gathered in: [Note: wire dtype] in
core/comm_records.py) that ``ZeroGatherGroup`` coalesces."""

_RESHAPE = ops.Reshape()


class ZeroGatherGroup(nn.Cell):
    """Gather several ZeRO-3 shards of one Cell in one all-gather; their gradients in one reduce-scatter.

    ``group(w, b)`` returns the full tensors ``(W, B)``, what ``w_wrapper(w), b_wrapper(b)`` return,
    bit for bit ([Note: coalesced gathers]); ``group.waiting_for(x, w, b)`` the same once ``x``
    exists (the layer's input: [Note: gather order] in param_wrapper.py). Collective over the
    parameters' group. Built by ``build_gather_group``; its gather Cell by ``build`` when given
    ([Note: gather Cells built once] in gather_build.py).
    """

    def __init__(self, gathers: List, kind: str = "layer", build=None):
        super().__init__(auto_prefix=False)
        self.gather_record = coalesced_record(gathers, kind)
        self.gather_plan = CoalescedPlan(self.gather_record, tuple(gathers))
        self.param_names = self.gather_record.members
        if build is None:
            self.gather = self.gather_plan.build()
        else:
            build.defer(self)

    def use_gather(self, gather: GatherGroup) -> None:
        """Call ``gather``, built from ``gather_plan`` (maybe for other groups too: [Note: shared
        gather graphs] in gather_build.py). Not collective."""
        self.gather = gather

    def construct(self, *xs):
        # A same-shape reshape of each shard (the Reshape primitive mapped over static shapes: [Note:
        # constants in a map] in core/graph_tuples.py). PYNATIVE: it gives the custom bprop the shard's
        # real shape (see ZeroParamWrapper). GRAPH_MODE needs it too: [Note: unit shards] in units.py.
        # A gather unit's parts call ``self.gather.waiting`` on shards reshaped already.
        return self.gather(each(_RESHAPE, xs, self.gather.shard_shapes))

    def waiting_for(self, after, *xs):
        """What ``construct(*xs)`` returns, gathered once ``after`` exists ([Note: gather order] in
        param_wrapper.py)."""
        return self.gather.waiting(each(_RESHAPE, xs, self.gather.shard_shapes), after)


@dataclass(frozen=True)
class CoalescedPlan:
    """What a coalesced gather Cell is built from: the record of its collective and the
    ``ParamGather`` of each member, in order. No ZeRO++ options: such gathers are not coalesced."""

    record: GatherRecord
    gathers: Tuple
    zeropp = None

    @property
    def full_rows(self) -> tuple:
        return tuple(g.spec.shape[0] if g.spec.shape else 0 for g in self.gathers)

    @property
    def pads(self) -> tuple:
        return tuple(g.spec.pad for g in self.gathers)

    def build(self) -> GatherGroup:
        """The gather Cell (not collective)."""
        return GatherGroup(self.record, self.gathers, self)

    def graph_key(self) -> tuple:
        """Everything the graph of its gather Cell reads ([Note: shared gather graphs] in gather_build.py)."""
        r = self.record
        return (r.group, r.group_size, r.param_dtype, r.compute_dtype, r.cast_before_gather, r.cast_after_gather,
                r.padded_shapes, r.shard_shapes, self.full_rows, self.pads, r.reduces)


def gather_settings(gather) -> tuple:
    """What parameters must share to be gathered in one collective: group, dtypes, ZeRO++ options, and
    whether their gradients go back (frozen parameters are gathered apart from trainable ones).
    ``gather``: a ``ParamGather`` (or a ``GatherGroup`` of one) of ``param_wrapper.py``."""
    record = gather.record
    return (record.group, record.group_size, record.param_dtype, record.compute_dtype, gather.zeropp, record.reduces)


def coalesced_record(gathers: Sequence, kind: str = "layer") -> GatherRecord:
    """The record of one collective over ``gathers`` (``ParamGather``s of one gather setting), in
    their order ([Note: comm records] in core/comm_records.py)."""
    records = [g.record for g in gathers]
    return replace(records[0], kind=kind, members=tuple(r.members[0] for r in records),
                   padded_shapes=tuple(r.padded_shapes[0] for r in records),
                   shard_shapes=tuple(r.shard_shapes[0] for r in records))


def build_gather_group(gathers: Sequence, build=None) -> Optional[ZeroGatherGroup]:
    """A ``ZeroGatherGroup`` for ``gathers`` (the ``ParamGather``s of a layer's parameters, decided
    before any gather Cell is built), or None when they cannot be coalesced as one: fewer than two,
    one that does not all-gather, settings that differ, a padded tensor over ``COALESCE_MAX_BYTES``,
    or ZeRO++ options ([Note: coalesced gathers]). ``build``: the ``GatherBuild`` that builds its
    gather Cell ([Note: gather Cells built once] in gather_build.py); None: built here. Not collective."""
    if len(gathers) < 2:
        return None
    for gather in gathers:
        if not gather.record.gathers or gather.zeropp is not None or gather.record.gathered_nbytes > COALESCE_MAX_BYTES:
            return None
    if len({gather_settings(g) for g in gathers}) != 1:
        return None
    return ZeroGatherGroup(gathers, build=build)
