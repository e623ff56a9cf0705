"""Which frozen parameters stage 3 shards: every frozen candidate ([Note: split rule] in
core/partition.py) except the state a Cell updates in place.

A frozen Parameter (``requires_grad=False``) is either a frozen weight (a LoRA fine-tune's base
model: read, never written) or running state that the forward pass writes in place (BatchNorm's
moving statistics, ``InstanceNorm``'s). A gathered copy of running state would take the update and
drop it, so such state stays whole on every rank, as it did before frozen weights were sharded. The
Cells listed here are MindSpore's that write their own Parameters in place; a Cell of your own that
does so must opt its state out with ``param.parallel_optimizer = False`` (the generic rewrite
refuses an ``assign`` or ``scatter_*`` on a sharded parameter it can see: [Note: generic rewrite]
in rewrite.py).
"""
from typing import Set

from mindspore import mint, nn

from ..core.ms_internals import own_params

__all__ = ["IN_PLACE_STATE_CELLS", "in_place_state"]

IN_PLACE_STATE_CELLS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.SyncBatchNorm, nn.InstanceNorm1d, nn.InstanceNorm2d,
                        nn.InstanceNorm3d, mint.nn.BatchNorm1d, mint.nn.BatchNorm2d, mint.nn.BatchNorm3d,
                        mint.nn.SyncBatchNorm)
"""Cells whose forward pass updates their frozen Parameters in place (``nn.BatchNorm3d`` holds an
``nn.BatchNorm2d``): those Parameters are never sharded."""


def in_place_state(cells) -> Set[int]:
    """``id()`` of the frozen Parameters that the Cells of ``cells`` (``cells_and_names()``) update in
    place: the non-trainable Parameters of every ``IN_PLACE_STATE_CELLS`` instance. Reads only."""
    return {id(p) for _, cell in cells if isinstance(cell, IN_PLACE_STATE_CELLS)
            for p in own_params(cell).values() if p is not None and not p.requires_grad}
