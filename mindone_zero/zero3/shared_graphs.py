"""Identical ZeRO-3 gathers compiled once: one gather Cell called by every wrapper or group alike.

[Note: shared gather graphs]
GRAPH_MODE parses, type-infers and differentiates every Cell instance on its own, so the gathers
of n identical layers (the projections of a Transformer block, its LayerNorms, its blocks) cost n
times one to compile. A gather Cell (``_GatherShard`` per parameter, ``_CoalescedGather`` per
coalesced group) holds no Parameter: its graph reads only its group, dtypes and shapes
(``graph_key``), and the shards come in as arguments. So ``share_gather_graphs`` makes the
wrappers and groups whose gathers have one key call one gather Cell: MindSpore builds one graph and
one bprop for them and infers it once per argument type. Each call still runs its own collectives
on its own tensors, so the values are those of separate Cells, bit for bit
(tests/dist/test_gather_units.py trains the demo LM both ways). Each caller's ``param_name`` (or
``param_names``) and ``gather_record``, what the CommPlan counts for its calls ([Note: comm records]
in core/comm_records.py), stay its own.
Limits:
* ``Cell.recompute`` marks a Cell's children at marking time (their scope), and a shared child has
  one, so gathers are shared only between callers whose gathers are marked alike, after [Note:
  reshard after forward] has marked them: ``shard_network`` calls ``share_gather_graphs`` last.
* Only in GRAPH_MODE, where compiling is what it saves; PYNATIVE runs every call anyway.
* Not shared: hpZ wrappers (their two Cells hold the gather, [Note: hpZ] in ``param_wrapper.py``)
  and the elements a gather unit gathers alone (``_UnitSingle``: the CommPlan counts each of those
  gathers once per gather Cell).
"""
import mindspore as ms
from mindspore import nn

from ..core.ms_internals import RECOMPUTE_WRAPPER, has_config_recompute, recompute_scope
from .coalesce import ZeroGatherGroup
from .param_wrapper import gathers_split

__all__ = ["share_gather_graphs"]


def _recompute_marks(cell: nn.Cell) -> tuple:
    """How ``cell`` and the Cells below it are marked for recomputation (scope, flags)."""
    return tuple((name, has_config_recompute(c), recompute_scope(c), hasattr(c, RECOMPUTE_WRAPPER),
                  repr(sorted(c.get_flags().items()))) for name, c in cell.cells_and_names())


def _callers(network: nn.Cell) -> list:
    """The Cells of ``network`` whose ``gather`` may be shared: gathering wrappers without hpZ, and
    coalesced groups (those of gather units included)."""
    return [cell for _, cell in network.cells_and_names()
            if isinstance(cell, ZeroGatherGroup) or (gathers_split(cell) and not cell.hpz)]


def share_gather_graphs(callers) -> int:
    """In GRAPH_MODE, make the ``callers`` (a network, or the callers ``finish_gathers`` found in it)
    whose gathers read the same settings and are marked alike for recomputation call one gather
    Cell ([Note: shared gather graphs]); returns how many callers were given another's gather (0 in
    PYNATIVE_MODE). Call after the network is sharded and marked, before it is compiled. Not
    collective."""
    if ms.get_context("mode") != ms.GRAPH_MODE:
        return 0
    first, shared = {}, 0
    for caller in _callers(callers) if isinstance(callers, nn.Cell) else callers:
        key = (type(caller.gather), caller.gather.graph_key(), _recompute_marks(caller.gather))
        gather = first.setdefault(key, caller.gather)
        if gather is not caller.gather:
            caller.gather = gather
            shared += 1
    return shared
