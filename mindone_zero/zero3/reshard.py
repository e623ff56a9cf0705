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
from dataclasses import dataclass
from typing import List, Optional, Tuple

from mindspore import nn

from ..core.ms_internals import RECOMPUTE_WRAPPER, child_cells, mark_recomputed_child
from .carry import spread_recompute_scope
from .coalesce import ZeroGatherGroup
from .direct_reads import INDIRECT_ATTR, gather_attrs, source_indirect_reads
from .gather_kinds import gathers_split
from .param_wrapper import ZeroParamWrapper
from .recompute_marks import RecomputeMarks
from .units import ZeroUnitGather

__all__ = ["GatherPlan", "plan_gathers", "apply_gathers", "describe_recomputed"]


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


# [Note: a frozen gather plan]
# ``plan_gathers`` decides everything that finishing the gathers does, on the network as rows 6-8 of
# docs/design.md left it, before any of it is done: which readers are recomputed whole or re-gather
# only, which gather Cells or collectives are marked, which Cells get the recompute scope of the
# Cell above them, which wrappers built before ``shard_network`` get their ZeRO++ gather (and
# hpZ), and how each gather Cell still to be built is built (its mark, hpZ, the callers that share
# it). It reads the Cells and changes none: the marks it decides are kept beside the Cells' own
# ([Note: predicted recompute marks] in recompute_marks.py). The ``GatherPlan`` it returns is frozen;
# ``apply_gathers`` makes what it says, in its order, and decides nothing.


@dataclass(frozen=True)
class GatherPlan:
    """What finishing the gathers does ([Note: a frozen gather plan]).

    Attributes:
        marks (tuple): ``(what, Cell)`` in the network's order; ``what`` is ``"child"`` (the recompute
            scope of the Cell above it, which has it: ``mark_recomputed_child``, for a Cell added after
            the user's ``recompute()``), ``"whole"`` (``recompute()``: a reader recomputed whole) or
            ``"output"`` (``recompute(output_recompute=True)``: a gather Cell or collective run again
            in backward).
        readers (tuple): ``(path, Cell, reasons, whole)`` for each reader whose code is not direct,
            ``whole`` False for one that holds other readers and is re-gathered only.
        zeropp (tuple): ``(wrapper, ZeroPPConfig, hpZ group or None)`` for each gathering wrapper
            built before ``shard_network``, given its ZeRO++ gather ([Note: ZeRO++ at build]).
        builds (tuple): the ``GatherBuild``'s steps, one per gather Cell caller still to be built.
    """

    marks: Tuple[Tuple[str, nn.Cell], ...]
    readers: Tuple[Tuple[str, nn.Cell, Tuple[str, ...], bool], ...]
    zeropp: Tuple[Tuple[nn.Cell, object, Optional[str]], ...]
    builds: tuple


def plan_gathers(network: nn.Cell, options, build) -> GatherPlan:
    """Decide, in one walk over the network in its order and without changing it, what finishing
    its gathers does ([Note: a frozen gather plan]): the recompute scope for the Cells added since
    the user's ``recompute()`` (gather wrappers, layers); with ``reshard_after_forward``, the readers
    that [Note: reshard after forward] chooses and what is marked for each; with ZeRO++, the gather of
    each wrapper built before ``shard_network`` (split for hpZ inside a recomputed region, [Note: hpZ]
    in param_wrapper.py); how ``build`` (a ``GatherBuild``) builds each gather Cell it holds. Not
    collective."""
    zeropp = options.zeropp
    pynative = not options.graph_mode  # the mode the shard was planned in
    whole_gathers = zeropp is not None or pynative
    state = RecomputeMarks()
    marks, readers, callers, wrappers, regathered = [], [], [], [], set()
    seen, decided = {id(network)}, set()

    def mark(what, cell):
        marks.append((what, cell))
        state.recompute(cell)

    def regather_only(cell):
        for gather in _gather_children(cell):
            if state.marked(gather):
                continue
            if not whole_gathers and build.defers(gather):
                regathered.add(id(gather))  # its collective, when it is built
                continue
            target = _regather_cell(gather, whole_gathers)
            if not state.marked(target):
                mark("output", target)
                if target is not gather:  # GRAPH_MODE runs the collective in it ([Note: gather order])
                    mark("output", target.waiting)

    def decide(child, where) -> bool:
        """Decide reader ``child``; whether the readers below it are still to be decided."""
        reasons = [PYNATIVE_REASON] if pynative else _indirect_reads(child)
        if not reasons:
            regather_only(child)
            return False
        if pynative or not _holds_readers(child):
            mark("whole", child)
            readers.append((where, child, tuple(reasons), True))
            return False
        regather_only(child)  # recomputing it whole would recompute every reader below it
        readers.append((where, child, tuple(reasons), False))
        return True

    def visit(cell, path, free):
        for child in state.spread(cell):  # added after recompute() (wrappers, layers): the scope
            marks.append(("child", child))
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
                _collect(child, callers, wrappers)
            if child_free:
                decided.add(id(child))
                if state.marked(child):
                    child_free = False
                elif _gathers_directly(child):
                    child_free = decide(child, where)
            visit(child, where, child_free)

    visit(network, "", options.reshard_after_forward)
    prebuilt = ()
    if zeropp is not None:  # a wrapper's hpZ Cells sit inside its reader's recomputed region ([Note: hpZ])
        prebuilt = tuple((w, zeropp, zeropp.hpz_group if state.scoped(w) else None)
                         for w in wrappers if not build.defers(w))
    steps = build.plan(callers, options.graph_mode, state.scoped, frozenset(regathered))
    return GatherPlan(tuple(marks), tuple(readers), prebuilt, steps)


_MARKS = {
    "child": mark_recomputed_child,
    "whole": lambda cell: cell.recompute(),
    "output": lambda cell: cell.recompute(output_recompute=True),
}


def apply_gathers(plan: GatherPlan, build) -> int:
    """Make what ``plan`` says, in its order: the marks, the ZeRO++ gathers of wrappers built before
    ``shard_network``, then every gather Cell ``build`` holds. Returns how many callers share
    another's gather Cell ([Note: shared gather graphs] in gather_build.py). Not collective."""
    for what, cell in plan.marks:
        _MARKS[what](cell)
    for wrapper, zeropp, hpz_group in plan.zeropp:
        wrapper.enable_zeropp(zeropp, hpz_group)
        spread_recompute_scope(wrapper)  # the Cells it just built
    return build.apply(plan.builds)


def _collect(cell, callers, wrappers) -> None:
    if isinstance(cell, ZeroGatherGroup):
        callers.append(cell)
    elif gathers_split(cell):
        callers.append(cell)
        wrappers.append(cell)


def describe_recomputed(found) -> List[str]:
    """One line per reader of ``GatherPlan.readers``: path, class, what is done, why."""
    return [f"{path} ({type(cell).__name__}) {'recomputed whole' if whole else 're-gathered only, transformed copies may be kept'}: "
            f"{'; '.join(reasons)}" for path, cell, reasons, whole in found]
