"""Free gathered parameters after forward: ``reshard_after_forward`` (FSDP2's name).

[Note: reshard after forward]
A ZeRO-3 gather (``ZeroParamWrapper``) returns the full tensor; the op that consumes it (the
matmul of a Dense, the normalisation of a LayerNorm) keeps that tensor as an input of its own
backward. Without more, every gathered parameter of the network is alive from its forward use
until its backward: during backward each rank holds the whole model's weights again (2Φ traffic
per step: one all-gather, one reduce-scatter).

With ``reshard_after_forward=True`` (the default, as in DeepSpeed and FSDP2) the gathered tensor is
dropped after forward and gathered again for backward (3Φ: two all-gathers and one reduce-scatter,
as the ZeRO paper counts). As in FSDP2 and DeepSpeed, only the gather runs again, not the layers
that read it: ``shard_network`` marks each gather Cell a reader calls (its per-parameter wrappers,
its coalesced group, a gather unit's ``ZeroUnitGather``) with ``recompute(output_recompute=True)``;
in GRAPH_MODE a wrapper's or a group's collective Cell inside it ([Note: the collective alone is
recomputed]). In GRAPH_MODE MindSpore's recompute pass then gives every backward user of the
gather's output a second copy of the gather, placed just before that user, and frees the forward
copy after its last forward use; the readers' own ops run once, and their saved activations are
used as without ZeRO. (Plain ``recompute()`` would not do: it excludes a Cell's outputs, and the
gather's output is exactly what must not be kept.) tests/dist/test_profile_collectives.py checks
it with MindSpore's profiler: as many MatMul, LayerNorm and GeLU kernels per step as at stage 0,
and the backward re-gathers.

A reader is recomputed whole instead (the fallback: ``Cell.recompute()`` as before, which holds the
re-gathered tensor inside the recomputed region) when re-gathering alone would not free the
tensor, and ``shard_network`` names it in a warning and in ``recomputed_cells(network)``:

* its code transforms a gathered tensor before the op that consumes it ([Note: direct reads] in
  ``direct_reads.py``): backward would keep the transformed copy. Only a reader without other
  readers below it is recomputed whole; one that holds others (a model's top Cell reading
  ``self.pos_embedding[:n]``) is re-gathered only, as recomputing it would recompute every layer
  below it, and is named with the copies its backward may keep;
* in PYNATIVE_MODE, always: recomputing a Cell's output there needs MindSpore's non-reentrant
  recompute, which fails around the gathers' custom bprop in MindSpore 2.10 ("The pointer[top_cell_]
  is null", [Note: non-reentrant recompute] in ``carry.py``). The mode is read when the network is
  sharded.

Which readers, walking from the top Cell:

* a Cell already inside a recomputed region (the user called ``recompute()`` on it or on an
  ancestor) is left as the user set it: its gathers are recomputed already, with its forward;
* the first Cell on each path that gathers a split parameter is the reader (its subtree, a unit's
  included, is covered by it);
* the top Cell itself is never marked: recomputing the whole forward in backward would hold the
  same tensors at the same time. Parameters the top Cell's own ``construct`` reads (a tied output
  layer reading an Embedding's table, a bare ``self.scale``) therefore stay gathered until their
  backward, as with ``reshard_after_forward=False``; put such reads in a child Cell to free them.

Either way the recomputed code is the same code on the same inputs, so losses and gradients are
those of ``reshard_after_forward=False`` (the parity tests check both against stage 0 and one
process).
"""
from typing import List, Tuple

from mindspore import nn

from ..core.ms_internals import RECOMPUTE_WRAPPER, child_cells, has_config_recompute
from .carry import is_recompute_scoped, spread_recompute_scope
from .coalesce import ZeroGatherGroup
from .direct_reads import INDIRECT_ATTR, gather_attrs, source_indirect_reads
from .gather_kinds import gathers_split
from .param_wrapper import ZeroParamWrapper
from .units import ZeroUnitGather

__all__ = ["finish_gathers", "describe_recomputed"]


def _recompute_marked(cell: nn.Cell) -> bool:
    return has_config_recompute(cell) or is_recompute_scoped(cell)


PYNATIVE_REASON = ("PYNATIVE_MODE: re-gathering a tensor without its reader needs MindSpore's non-reentrant "
                   "recompute, which fails around the gathers' custom bprop in MindSpore 2.10 ([Note: non-reentrant "
                   "recompute] in carry.py)")


GATHER_CELLS = (ZeroParamWrapper, ZeroGatherGroup, ZeroUnitGather)


def _gather_children(cell: nn.Cell) -> List[nn.Cell]:
    """The gather Cells ``cell`` calls that all-gather: wrappers, its coalesced group, a unit's gather."""
    return [c for c in cell.cells() if gathers_split(c) or isinstance(c, (ZeroGatherGroup, ZeroUnitGather))]


def _gathers_directly(cell: nn.Cell) -> bool:
    # a coalesced group exists only over wrappers that all-gather (coalesce.build_gather_group)
    return bool(_gather_children(cell))


def _indirect_reads(cell: nn.Cell) -> List[str]:
    """[Note: direct reads] of a reader: recorded by the rewrite, a layer Cell's own, or read from the source."""
    if hasattr(cell, INDIRECT_ATTR):
        return list(getattr(cell, INDIRECT_ATTR))
    own = getattr(cell, "zero3_indirect_reads_of_code", None)
    if own is not None:
        return own()
    return source_indirect_reads(cell, gather_attrs(cell))


def _holds_readers(cell: nn.Cell) -> bool:
    """Whether a Cell below ``cell`` (not one of its gather Cells) gathers a split parameter itself."""
    return any(c is not cell and not isinstance(c, GATHER_CELLS) and _gathers_directly(c)
               for _, c in cell.cells_and_names())


# [Note: the collective alone is recomputed]
# To re-gather a parameter in backward, GRAPH_MODE marks the Cell that runs the collective, not the
# gather Cell the reader calls: a wrapper's or a coalesced group's ``GatherGroup``,
# and with it its ``waiting`` Cell, which GRAPH_MODE calls ([Note: gather order] in param_wrapper.py).
# Those take tensors and return tensors. The wrapper and the group around them take the shard
# Parameters themselves: their graphs load each shard with the graph's memory state (a Load, then an
# UpdateState); a marked wrapper had those ops copied into the recomputed region, each with a small
# bprop graph of its own. What runs is the same either way: the wrapper returns its gather's output
# unchanged, so that output is what backward reads, and the AllGathers are the same.
# The collective of a gather still to be built is marked when it is built ([Note: gather Cells built
# once] in gather_build.py). Marked as they are: wrappers in a network sharded with ZeRO++ options,
# whose gather may be replaced (a wrapper built before ``shard_network``) or split into two Cells that
# must both be inside the recomputed region (hpZ, [Note: hpZ] in param_wrapper.py); a unit's
# ``ZeroUnitGather``, which reshapes the shards inside the region; PYNATIVE_MODE, which recomputes a
# Cell by re-running its construct.


def _regather_cell(gather: nn.Cell, whole: bool) -> nn.Cell:
    """The Cell to mark so that ``gather`` (a reader's gather Cell) runs again in backward: its
    collective Cell, or ``gather`` itself when ``whole`` ([Note: the collective alone is recomputed])."""
    if whole or not isinstance(gather, (ZeroParamWrapper, ZeroGatherGroup)):
        return gather
    return gather.gather


def _regather_only(cell: nn.Cell, whole: bool, build) -> None:
    for gather in _gather_children(cell):
        if _recompute_marked(gather):
            continue
        if not whole and build.defers(gather):
            build.regather(gather)  # its collective, when it is built
            continue
        target = _regather_cell(gather, whole)
        if not _recompute_marked(target):
            target.recompute(output_recompute=True)
            if target is not gather:  # GRAPH_MODE runs the collective in it ([Note: gather order])
                target.waiting.recompute(output_recompute=True)


def finish_gathers(network: nn.Cell, options, build) -> Tuple[List[Tuple[str, nn.Cell, List[str], bool]], List[nn.Cell]]:
    """The build's one pass over the gathers it attached, in the network's order, after the Cells are
    replaced and rewritten, the units attached and the user's ``recompute()`` re-applied. It spreads
    each recompute scope to the children added since (gather wrappers, layers); with
    ``reshard_after_forward``, it marks the readers that [Note: reshard after forward] chooses, and
    tells ``build`` (a ``GatherBuild``) which collectives of gathers still to be built to mark. With
    ZeRO++, it turns a layer the user built before ``shard_network`` to per-parameter gathers, then
    gives each wrapper of such a layer its ZeRO++ gather, split for hpZ inside a recomputed region
    ([Note: ZeRO++ at build], [Note: hpZ] in param_wrapper.py). Not collective.

    Returns:
        (readers whose code is not direct: ``(path, Cell, reasons, whole)``, ``whole`` False for one
        that holds other readers and is re-gathered only; the gathering wrappers and groups, in the
        network's order: the order ``build`` builds in).
    """
    zeropp = options.zeropp
    pynative = not options.graph_mode  # the mode the shard was planned in
    whole_gathers = zeropp is not None or pynative
    found, callers, wrappers = [], [], []
    seen, decided = {id(network)}, set()

    def decide(child, where) -> bool:
        """Mark reader ``child``; whether the readers below it are still to be decided."""
        reasons = [PYNATIVE_REASON] if pynative else _indirect_reads(child)
        if not reasons:
            _regather_only(child, whole_gathers, build)
            return False
        if pynative or not _holds_readers(child):
            child.recompute()
            found.append((where, child, reasons, True))
            return False
        _regather_only(child, whole_gathers, build)  # recomputing it whole would recompute every reader below it
        found.append((where, child, reasons, False))
        return True

    def visit(cell, path, free):
        spread_recompute_scope(cell)  # children added after recompute() (wrappers, layers)
        for name, child in child_cells(cell).items():
            if child is None:
                continue
            # a Cell is decided on the first free path that reaches it, visited once otherwise
            child_free = free and name != RECOMPUTE_WRAPPER and not isinstance(child, GATHER_CELLS)
            if id(child) in seen and not (child_free and id(child) not in decided):
                continue
            first = id(child) not in seen
            seen.add(id(child))
            where = f"{path}.{name}" if path else name
            if first:
                if zeropp is not None and getattr(child, "zero_coalesce", False):
                    child.gather_per_parameter()
                _collect(child, callers, wrappers)
            if child_free:
                decided.add(id(child))
                if _recompute_marked(child):
                    child_free = False
                elif _gathers_directly(child):
                    child_free = decide(child, where)
            visit(child, where, child_free)

    visit(network, "", options.reshard_after_forward)
    if zeropp is not None:
        for wrapper in wrappers:
            if not build.defers(wrapper):  # built before shard_network
                wrapper.enable_zeropp(zeropp, zeropp.hpz_group if is_recompute_scoped(wrapper) else None)
                spread_recompute_scope(wrapper)  # the Cells it just built
    return found, callers


def _collect(cell, callers, wrappers) -> None:
    if isinstance(cell, ZeroGatherGroup):
        callers.append(cell)
    elif gathers_split(cell):
        callers.append(cell)
        wrappers.append(cell)


def describe_recomputed(found: List[Tuple[str, nn.Cell, List[str], bool]]) -> List[str]:
    """One line per reader of ``finish_gathers``'s result: path, class, what is done, why."""
    return [f"{path} ({type(cell).__name__}) {'recomputed whole' if whole else 're-gathered only, transformed copies may be kept'}: "
            f"{'; '.join(reasons)}" for path, cell, reasons, whole in found]
