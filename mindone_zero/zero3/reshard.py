"""Free gathered parameters after forward: ``reshard_after_forward`` (FSDP2's name).

[Note: reshard after forward]
A ZeRO-3 gather (``ZeroParamWrapper``) returns the full tensor; the Cell that consumes it (the
matmul of a Dense, the normalisation of a LayerNorm) keeps that tensor as an input of its own
backward. Without more, every gathered parameter of the network is alive from its forward use
until its backward: during backward each rank holds the whole model's weights again (2Φ traffic
per step: one all-gather, one reduce-scatter).

With ``reshard_after_forward=True`` (the default, as in DeepSpeed and FSDP2) ``shard_network``
marks with ``Cell.recompute()`` every Cell that gathers a split parameter itself (the ZeRO-3 layer
Cells, the Cells the generic path rewrote, a user's MindOne-style class), so that the gathered
tensor is dropped after the Cell's forward and backward recomputes the Cell, gathering the
parameter again (3Φ: two all-gathers and one reduce-scatter, as the ZeRO paper counts). The
consumer must be inside the recomputed region: recomputing the gather alone saves nothing,
because the consumer would still keep its input. The recomputed forward is the same code on the
same inputs, so losses and gradients are those of ``reshard_after_forward=False`` (the parity
tests check both against stage 0 and one process).

Which Cells are marked, walking from the top Cell:

* a Cell already inside a recomputed region (the user called ``recompute()`` on it or on an
  ancestor) is left as the user set it: its gathers are recomputed already;
* the first Cell on each path that gathers a split parameter is marked, and its subtree is then
  covered by that one region (children are not marked again);
* the top Cell itself is never marked: recomputing the whole forward in backward would hold the
  same tensors at the same time. Parameters the top Cell's own ``construct`` reads (a tied output
  layer reading an Embedding's table, a bare ``self.scale``) therefore stay gathered until their
  backward, as with ``reshard_after_forward=False``; put such reads in a child Cell to free them.

Recompute is applied with MindSpore's defaults (``use_reentrant=True``), which also avoids the
PYNATIVE failure described in [Note: non-reentrant recompute] in ``carry.py``. Cost: the marked
Cells' forward compute runs twice.
"""
from typing import List

from mindspore import nn

from .carry import is_recompute_scoped, spread_recompute_scope
from .param_wrapper import ZeroParamWrapper
from .units import ZeroUnitGather, unit_gathers

__all__ = ["mark_reshard_after_forward", "regathered_param_names", "gathers_split",
           "apply_zeropp", "zeropp_wrappers", "coalesced_groups"]


def gathers_split(cell: nn.Cell) -> bool:
    """Whether ``cell`` is a gather wrapper that all-gathers (a split parameter over 2+ ranks)."""
    gather = getattr(cell, "gather", None) if isinstance(cell, ZeroParamWrapper) else None
    return gather is not None and gather.gathers


def _gathers_directly(cell: nn.Cell) -> bool:
    return any(gathers_split(child) or isinstance(child, ZeroUnitGather) for child in cell.cells())


def _recompute_marked(cell: nn.Cell) -> bool:
    return bool(getattr(cell, "_has_config_recompute", False)) or is_recompute_scoped(cell)


def mark_reshard_after_forward(network: nn.Cell) -> List[nn.Cell]:
    """Mark with ``recompute()`` the Cells chosen by [Note: reshard after forward]; return them.

    Call after the network is sharded and before it is compiled. Not collective.
    """
    marked, seen = [], {id(network)}

    def walk(cell):
        for child in cell.cells():
            if child is None or id(child) in seen or isinstance(child, (ZeroParamWrapper, ZeroUnitGather)):
                continue
            seen.add(id(child))
            if _recompute_marked(child):
                continue
            if _gathers_directly(child):
                child.recompute()
                marked.append(child)
                continue
            walk(child)

    walk(network)
    return marked


def regathered_param_names(network: nn.Cell) -> List[str]:
    """Names of the split parameters gathered again in backward: those with a gather wrapper inside
    a recomputed region (marked by ``reshard_after_forward`` or by the user). Not collective."""
    names = []
    for _, cell in network.cells_and_names():
        if gathers_split(cell) and is_recompute_scoped(cell) and cell.gather.param_name not in names:
            names.append(cell.gather.param_name)
        if isinstance(cell, ZeroUnitGather) and is_recompute_scoped(cell):
            names += [name for name in cell.gathered_names() if name not in names]
    return names


def apply_zeropp(network: nn.Cell, zeropp) -> None:
    """Finish the ZeRO++ options ``zeropp`` (a checked ``ZeroPPConfig``) on every gather wrapper that
    all-gathers: with hpZ, the wrappers inside a recomputed region split their gather for the
    secondary group ([Note: hpZ] in ``param_wrapper.py``); wrappers and layer Cells built before
    ``shard_network`` get the options now ([Note: ZeRO++ at build]). Call after
    ``mark_reshard_after_forward``. Not collective."""
    seen = set()
    for _, cell in network.cells_and_names():
        if getattr(cell, "zero_coalesce", False):  # a layer built outside zeropp_scope: gather per parameter
            cell.zero_coalesce = False
        if gathers_split(cell) and id(cell) not in seen:
            seen.add(id(cell))
            cell.enable_zeropp(zeropp, hpz=zeropp.hpz_group is not None and is_recompute_scoped(cell))
    spread_recompute_scope(network)


def zeropp_wrappers(network: nn.Cell) -> dict:
    """``{parameter name: gather wrapper}`` of the parameters gathered with ZeRO++ options. Not collective."""
    found = {}
    for _, cell in network.cells_and_names():
        if gathers_split(cell) and cell.gather.zeropp is not None:
            found.setdefault(cell.gather.param_name, cell)
    return found


def coalesced_groups(network: nn.Cell) -> list:
    """The ``ZeroGatherGroup`` Cells ``network`` calls ([Note: coalesced gathers] in
    ``coalesce.py``), those of gather units included ([Note: gather units] in ``units.py``), each
    once. Not collective."""
    groups, seen = [], set()
    for _, cell in network.cells_and_names():
        group = getattr(cell, "zero_gather_group", None) if getattr(cell, "zero_coalesce", False) else None
        if group is not None and id(group) not in seen:
            seen.add(id(group))
            groups.append(group)
    for unit in unit_gathers(network):  # [Note: gather units]: one group per gather setting
        groups += [g for g in unit.groups() if id(g) not in seen]
        seen.update(id(g) for g in unit.groups())
    return groups
