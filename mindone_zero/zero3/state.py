"""``ZeroState``: what building a ZeRO-3 network decided, held by the network's top Cell.

[Note: zero3 state]
``shard_network`` keeps the results of its build in one object, ``ZeroState``, set as the
attribute ``zero3_state`` of the Cell it returns: its options, every gather Cell the network's code
calls (``GatherCall``) and the readers it recomputes whole. Code that needs to know what the build
did reads it (``network_gathers`` for the communication plan, ``options_of``, ``recomputed_cells``,
the compatibility readers below) instead of walking the network for attributes the build left on
its Cells. ``gather_calls`` finds the states under a Cell built around sharded networks (a loss
Cell) in one walk that stops at each state's owner, and reads gather Cells outside any (ZeRO-3
layers a user built by hand) from the Cells as they are now.
"""
from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Optional, Tuple

from mindspore import nn

from ..core.comm_records import GatherRecord
from ..core.ms_internals import RECOMPUTE_WRAPPER, child_cells, has_config_recompute, in_recompute_scope
from .backward_reads import backward_reads
from .coalesce import ZeroGatherGroup
from .layers import ZeroCell
from .options import Stage3Options
from .gather_kinds import gathers_split
from .param_wrapper import ZeroParamWrapper
from .units import ZeroUnitGather

__all__ = ["STATE_ATTR", "ZeroState", "GatherCall", "gather_calls", "zero_states", "gather_call", "options_of",
           "regathered_param_names", "zeropp_wrappers", "coalesced_groups", "unit_gathers"]

STATE_ATTR = "zero3_state"


@dataclass(frozen=True)
class GatherCall:
    """One gather Cell a network's code calls ([Note: zero3 state]).

    Attributes:
        reader (nn.Cell): the Cell whose code calls it.
        attr (str): the attribute of ``reader`` that holds it.
        cell (nn.Cell): a ``ZeroParamWrapper``, ``ZeroGatherGroup`` or ``ZeroUnitGather``.
        marked (bool): backward runs it again when it reads what it gathered ([Note: reshard after
            forward] in reshard.py): it, its collective or its reader is recomputed.
        records (tuple): the ``GatherRecord`` of each collective it runs (those that communicate),
            ``regather`` set when backward runs it again ([Note: dropped re-gathers]).
    """

    reader: nn.Cell
    attr: str
    cell: nn.Cell
    marked: bool
    records: Tuple[GatherRecord, ...]


@dataclass(frozen=True)
class ZeroState:
    """What ``shard_network`` built ([Note: zero3 state]), on the top Cell as ``zero3_state``.

    Attributes:
        options (Stage3Options): the options the network was sharded with, ``gather_units`` as done: the
            unit classes, or None for a gather per Cell ([Note: units by default] in auto_units.py).
        calls (tuple): every ``GatherCall`` of the network, in the network's order.
        recomputed (tuple): ``recomputed_cells``' lines: the readers whose code is not direct.
    """

    options: Stage3Options
    calls: Tuple[GatherCall, ...]
    recomputed: Tuple[str, ...] = ()


def _records_of(cell: nn.Cell) -> Optional[tuple]:
    """The records of the collectives a gather Cell runs (empty below stage 3), None for any other Cell."""
    if isinstance(cell, ZeroParamWrapper):
        return () if cell.gather_record is None else (cell.gather_record,)
    if isinstance(cell, ZeroGatherGroup):
        return (cell.gather_record,)
    if isinstance(cell, ZeroUnitGather):
        return cell.gather_records
    return None


def _marked(cell: nn.Cell) -> bool:
    """Whether backward runs the gather Cell ``cell`` again: it, or the collective inside it, is
    recomputed ([Note: the collective alone is recomputed] in reshard.py)."""
    return in_recompute_scope(cell) or in_recompute_scope(getattr(cell, "gather", cell))


def gather_call(reader: nn.Cell, attr: str, cell: nn.Cell, parsed: Optional[dict] = None) -> GatherCall:
    """The ``GatherCall`` of the gather Cell ``cell`` that ``reader`` holds as ``attr``, read from the
    Cells as they are now (their recompute marks). ``parsed``: see ``backward_reads``. Not collective."""
    records = tuple(r for r in _records_of(cell) if r.gathers)
    marked = bool(records) and _marked(cell)
    whole = has_config_recompute(reader) or in_recompute_scope(reader) or isinstance(cell, ZeroUnitGather)
    # the recomputed forward reads every gathered tensor; a unit's tuple is not analysed
    again = marked and (whole or backward_reads(reader, attr, parsed))
    return GatherCall(reader, attr, cell, marked, tuple(replace(r, regather=again) for r in records))


def _walk(network: nn.Cell, on_state: Callable[[ZeroState], None], on_gather: Callable[[nn.Cell, str, nn.Cell], None]):
    """One walk of ``network`` in its order: ``on_state(state)`` for each ``ZeroState`` (its owner's
    subtree is not walked), ``on_gather(reader, attr, cell)`` for each gather Cell outside them that
    its reader's code calls (a coalescing layer's group, not its per-parameter wrappers), each once."""
    seen = {id(network)}

    def walk(cell):
        state = cell.__dict__.get(STATE_ATTR)
        if state is not None:
            on_state(state)
            return
        called = {id(c) for c in cell.gather_cells()} if isinstance(cell, ZeroCell) else None
        for attr, child in child_cells(cell).items():
            if child is None or attr == RECOMPUTE_WRAPPER or id(child) in seen:
                continue
            if _records_of(child) is None:
                seen.add(id(child))
                walk(child)
            elif called is None or id(child) in called:
                seen.add(id(child))
                on_gather(cell, attr, child)

    walk(network)


def gather_calls(network: nn.Cell) -> List[GatherCall]:
    """Every ``GatherCall`` of ``network``, each gather Cell once, in the network's order: the calls
    of each ``ZeroState`` found (``network``'s own, or those of sharded networks inside it, such as
    under a loss Cell) and those of gather Cells outside any (layers built by hand, read as they are
    now). One walk, which stops at a state's owner. Not collective."""
    found, seen, parsed = [], set(), {}  # parsed: each method's source once in this walk

    def add(calls):
        found.extend(c for c in calls if id(c.cell) not in seen)
        seen.update(id(c.cell) for c in calls)

    _walk(network, lambda state: add(state.calls),
          lambda reader, attr, cell: add([gather_call(reader, attr, cell, parsed)]))
    return found


def zero_states(network: nn.Cell) -> List[ZeroState]:
    """The ``ZeroState`` of ``network`` and of every sharded network inside it (each once). Not collective."""
    states = []
    _walk(network, lambda s: states.append(s) if all(s is not t for t in states) else None, lambda *_: None)
    return states


def options_of(network: nn.Cell) -> List[Stage3Options]:
    """The distinct ``Stage3Options`` the parts of ``network`` were sharded with by ``shard_network``
    (one, usually; a loss Cell around a sharded network finds its child's); [] when none was."""
    found = []
    for state in zero_states(network):
        if state.options not in found:
            found.append(state.options)
    return found


def regathered_param_names(network: nn.Cell) -> List[str]:
    """Names of the split parameters whose gather backward runs again when it reads them: those
    gathered inside a recomputed region (marked by ``reshard_after_forward`` or by the user). Not
    collective."""
    names = []
    for call in gather_calls(network):
        if call.marked:
            names += [n for r in call.records for n in r.members if n not in names]
    return names


def zeropp_wrappers(network: nn.Cell) -> Dict[str, ZeroParamWrapper]:
    """``{parameter name: gather wrapper}`` of the parameters gathered with ZeRO++ options. Not collective."""
    found = {}
    for call in gather_calls(network):
        if gathers_split(call.cell) and call.cell.gather.zeropp is not None:
            found.setdefault(call.cell.param_name, call.cell)
    return found


def coalesced_groups(network: nn.Cell) -> List[ZeroGatherGroup]:
    """The ``ZeroGatherGroup`` Cells ``network`` calls ([Note: coalesced gathers] in
    ``coalesce.py``), those of gather units included ([Note: gather units] in ``units.py``), each
    once. Not collective."""
    groups = []
    for call in gather_calls(network):
        parts = call.cell.groups() if isinstance(call.cell, ZeroUnitGather) else [call.cell]
        groups += [g for g in parts if isinstance(g, ZeroGatherGroup) and all(g is not h for h in groups)]
    return groups


def unit_gathers(network: nn.Cell) -> List[ZeroUnitGather]:
    """The ``ZeroUnitGather`` Cells of ``network``, each once. Not collective."""
    return [c.cell for c in gather_calls(network) if isinstance(c.cell, ZeroUnitGather)]
