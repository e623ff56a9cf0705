"""The gather Cells ``shard_network`` attaches, each built once, in its final form.

[Note: gather Cells built once]
How a gather Cell (the ``GatherGroup`` of a wrapper or of a coalesced group) ends up
depends on its place in the finished network: whether backward runs its collective again ([Note:
reshard after forward] in reshard.py), whether it is split for hpZ ([Note: hpZ] in
param_wrapper.py), and which other callers may call it ([Note: shared gather graphs]). So while
``shard_network`` builds, a gathering ``ZeroParamWrapper`` or ``ZeroGatherGroup`` holds only the
plan of its gather (``gather_plan``: a ``ParamGather`` or ``CoalescedPlan``) and registers with the
call's ``GatherBuild``. The build reaches every such constructor through the parameters' ``ZeroParam``
records, which ``shard_network`` stamps before any layer is built: the layer Cells it builds, the
generic rewrite, and a user's MindOne-style class that builds a ``ZeroParamWrapper`` all register,
without an argument for it. ``plan_gathers`` then decides the marks on the finished network and,
through ``GatherBuild.plan``, how each gather Cell is built ([Note: a frozen gather plan] in
reshard.py); ``GatherBuild.apply`` makes each once, marked, with the hpZ Cells of its wrapper,
shared where it can be; the records then forget the build.
Built at once, as before: a gather that does not all-gather (a group of one rank, a parameter kept
whole), a gather unit's element gathered alone (``_UnitSingle``), and every gather built outside
``shard_network``. A layer the user built before ``shard_network`` keeps its gather Cells; given
ZeRO++ options, which they were built without, they are replaced ([Note: ZeRO++ at build]).

[Note: shared gather graphs]
GRAPH_MODE parses, type-infers and differentiates every Cell instance on its own, so the gathers
of n identical layers (the projections of a Transformer block, its LayerNorms, its blocks) cost n
times one to compile. A gather Cell holds no Parameter: its graph reads only its group, dtypes and
shapes (its plan's ``graph_key``), and the shards come in as arguments. So the callers whose plans
have one key, marked alike, call one gather Cell: MindSpore builds one graph and one bprop for them
and infers it once per argument type. Each call still runs its own collectives on its own tensors,
so the values are those of separate Cells, bit for bit (tests/dist/test_gather_units.py trains the
demo LM both ways). Each caller's ``param_name`` (or ``param_names``) and ``gather_record``, what the
CommPlan counts for its calls ([Note: comm records] in core/comm_records.py), stay its own.
Limits:
* ``Cell.recompute`` marks a Cell and its children, so only callers whose gathers are marked alike
  share: the key holds the mark (its collective re-run in backward, recomputed with its caller, or
  neither) and the ``to_float`` flags it gets from its caller.
* Only in GRAPH_MODE, where compiling is what it saves; PYNATIVE runs every call anyway.
* Not shared: hpZ wrappers (their two Cells hold the gather, [Note: hpZ] in ``param_wrapper.py``)
  and what is built at once (above).
"""
from dataclasses import dataclass, replace
from typing import List, Optional

from mindspore import nn

from ..core.to_float import dtype_flags
from .carry import is_recompute_scoped, spread_recompute_scope
from .param_wrapper import ZERO_PARAM_ATTR, zero_param_of

__all__ = ["GatherBuild", "BuildStep", "share_key"]


def share_key(plan, mark: Optional[str], flags: tuple) -> Optional[tuple]:
    """The key under which callers share one gather Cell ([Note: shared gather graphs]): its plan's
    kind and ``graph_key``, its recompute mark and its flags (None: not shared)."""
    return type(plan), plan.graph_key(), mark, flags


@dataclass(frozen=True)
class BuildStep:
    """How one caller's gather Cell is built: its recompute mark (``"collective"``: its collective
    runs again in backward; ``"scope"``: recomputed with its caller; None), its hpZ group (None: no
    hpZ), the ``to_float`` flags it gets from its caller, and the key under which callers share one
    Cell (None: not shared)."""

    caller: nn.Cell
    mark: Optional[str]
    hpz_group: Optional[str]
    flags: tuple
    key: Optional[tuple]


class GatherBuild:
    """The gather Cells of one ``shard_network`` call ([Note: gather Cells built once])."""

    def __init__(self):
        self._deferred: List[nn.Cell] = []
        self._ids = set()

    def defer(self, caller: nn.Cell) -> None:
        """Build ``caller``'s gather Cell (from its ``gather_plan``) in ``build``."""
        self._deferred.append(caller)
        self._ids.add(id(caller))

    def defers(self, caller: nn.Cell) -> bool:
        """Whether ``caller``'s gather Cell is still to be built here."""
        return id(caller) in self._ids

    def plan(self, callers: list, graph_mode: bool, scoped=is_recompute_scoped, regathered=frozenset()) -> tuple:
        """How each deferred gather Cell is built, decided before any is: those of ``callers`` (the
        network's gathering wrappers and groups, in its order) first, then any other that was deferred.
        ``scoped(caller)``: whether the caller will be inside a recomputed region once the plan's marks
        are made ([Note: predicted recompute marks] in recompute_marks.py); ``regathered``: ids of the
        callers whose collective backward runs again ([Note: the collective alone is recomputed] in
        reshard.py). Callers share Cells only where ``graph_mode`` (the mode the shard was planned in).
        Returns ``BuildStep``s. Not collective."""
        order = [c for c in callers if self.defers(c)]
        placed = {id(c) for c in order}
        order += [c for c in self._deferred if id(c) not in placed]
        steps = []
        for caller in order:
            plan = caller.gather_plan
            zeropp = plan.zeropp
            hpz_group = zeropp.hpz_group if zeropp is not None and scoped(caller) else None
            mark = "collective" if id(caller) in regathered else "scope" if scoped(caller) else None
            flags = dtype_flags(caller)
            key = share_key(plan, mark, flags) if graph_mode and hpz_group is None else None
            steps.append(BuildStep(caller, mark, hpz_group, flags, key))
        return tuple(steps)

    def apply(self, steps: tuple) -> int:
        """Build, mark and attach the gather Cell of each step (``plan``), one Cell for the steps with
        one key. Returns how many callers share another's Cell ([Note: shared gather graphs]). Not
        collective."""
        built, shared = {}, 0
        for step in steps:
            caller = step.caller
            gather = built.get(step.key) if step.key is not None else None
            if gather is None:
                gather = _build(caller.gather_plan, step.mark, step.flags)
                if step.key is not None:
                    built[step.key] = gather
            else:
                shared += 1
            if step.hpz_group is None:
                caller.use_gather(gather)
            else:
                caller.use_gather(gather, step.hpz_group)
            spread_recompute_scope(caller)  # recomputed with its caller: the Cells just attached
        self._deferred, self._ids = [], set()
        return shared

    def close(self, params) -> None:
        """Take this build off the records of ``params`` that carry it. Not collective."""
        for param in params:
            record = zero_param_of(param)
            if record is not None and record.build is self:
                setattr(param, ZERO_PARAM_ATTR, replace(record, build=None))


def _build(plan, mark: Optional[str], flags: tuple) -> nn.Cell:
    gather = plan.build()
    if flags:
        gather.add_flags_recursive(**dict(flags))  # as its caller's ``to_float`` gave the Cells below it
    if mark == "collective":  # [Note: the collective alone is recomputed] in reshard.py
        gather.recompute(output_recompute=True)
        gather.waiting.recompute(output_recompute=True)
    return gather
